//! Tensor parallelism's split of a model config: a rank's heads, KV heads, MLP and expert
//! widths and vocabulary shard ([`ModelConfig::shard`]), in units the declaration's
//! weight formats allow.

use crate::error::{Error, Result};
use crate::model::config::{ModelConfig, MoeConfig, TpShard};
use crate::model::decl::{Role, WeightFormat};

impl ModelConfig {
    /// Rank `rank`'s config of this model split over `size` ranks (Megatron's split):
    /// its share of the attention heads (KV heads split too, or replicated when there
    /// are fewer KV heads than ranks) and of the MLP width, and a vocabulary shard of
    /// `ceil(vocab_size / size)` rows of the embedding and LM head (padded with zero rows
    /// past the vocabulary, as vLLM pads it). A size the model's heads do not divide is
    /// refused naming both numbers. Size 1 is the model.
    pub fn shard(&self, rank: usize, size: usize) -> Result<ModelConfig> {
        if size <= 1 {
            return Ok(self.clone());
        }
        if self.tp.is_some() {
            return Err(Error::invalid(
                "tensor parallel",
                "the config is already a shard",
            ));
        }
        if rank >= size {
            return Err(Error::invalid(
                "tensor parallel",
                format!("rank {rank} of {size}"),
            ));
        }
        let refuse = |what: String| {
            Err(Error::Config {
                path: "tensor parallel".into(),
                what,
            })
        };
        if self.qk_norm_whole() {
            return refuse(format!(
                "{} norms q and k across all heads, which tensor parallelism splits \
                 (not supported yet; run it on one device)",
                self.arch.model_type()
            ));
        }
        let kv = self.num_kv_heads;
        if !self.num_heads.is_multiple_of(size) {
            return refuse(format!(
                "the model's {} attention heads do not divide by --tensor-parallel-size {size}",
                self.num_heads
            ));
        }
        if !(kv.is_multiple_of(size) || size.is_multiple_of(kv)) {
            return refuse(format!(
                "the model's {kv} KV heads neither divide by --tensor-parallel-size {size} \
                 nor divide it (to be replicated)"
            ));
        }
        // Every MLP (a dense layer's, each expert, the shared expert) splits its gate/up
        // rows and its down columns over the ranks in units of a block of its down
        // projection's format (1 when dense), so every share of a down row is whole
        // blocks; where the units do not divide, shares differ by one unit.
        let decl = self.decl();
        let unit = |role: Role| {
            decl.tensors()
                .iter()
                .filter(|t| t.role == role)
                .map(|t| match t.format {
                    WeightFormat::Quant(f) => (f.block_elems(), Some(f)),
                    WeightFormat::Dense | WeightFormat::Index => (1, None),
                })
                .max_by_key(|&(u, _)| u)
                .unwrap_or((1, None))
        };
        let (expert_width, shared_width) = self.moe.as_ref().map_or((0, None), |m| {
            (m.expert_intermediate, m.shared_expert_intermediate)
        });
        let dense = (0..self.num_layers).any(|l| self.moe.as_ref().is_none_or(|m| !m.is_sparse(l)));
        let (mlp, experts, shared) = (
            unit(Role::Down),
            unit(Role::ExpertsDown),
            unit(Role::SharedDown),
        );
        let mut widths = Vec::new();
        if dense {
            widths.push(("intermediate_size", self.intermediate_size, mlp));
        }
        if self.moe.is_some() {
            widths.push(("expert MLP width", expert_width, experts));
        }
        if let Some(s) = shared_width {
            widths.push(("shared_expert_intermediate_size", s, shared));
        }
        for (what, n, (u, format)) in widths {
            let blocks = match format {
                Some(f) if !n.is_multiple_of(u) => {
                    return refuse(format!(
                        "the model's {what} {n} is not whole blocks of {u} values ({f})"
                    ))
                }
                Some(f) => format!(" ({} blocks of {u} values in {f})", n / u),
                None => String::new(),
            };
            if n / u < size {
                return refuse(format!(
                    "the model's {what} {n}{blocks} cannot give each of \
                     --tensor-parallel-size {size} ranks a share"
                ));
            }
        }
        let (mlp_unit, expert_unit, shared_unit) = (mlp.0, experts.0, shared.0);
        let mine = |n: usize, unit: usize| crate::model::decl::share(rank, size, n, unit).1;
        let shard = ModelConfig {
            num_heads: self.num_heads / size,
            num_kv_heads: kv.div_ceil(size),
            intermediate_size: mine(self.intermediate_size, mlp_unit),
            moe: self.moe.as_ref().map(|m| MoeConfig {
                expert_intermediate: mine(m.expert_intermediate, expert_unit),
                shared_expert_intermediate: m
                    .shared_expert_intermediate
                    .map(|s| mine(s, shared_unit)),
                ..m.clone()
            }),
            tp: Some(TpShard {
                rank,
                size,
                num_heads: self.num_heads,
                num_kv_heads: kv,
                intermediate_size: self.intermediate_size,
                expert_intermediate: expert_width,
                shared_expert_intermediate: shared_width,
                mlp_unit,
                expert_unit,
                shared_unit,
            }),
            ..self.clone()
        };
        // A quantized tensor split by heads (o_proj's columns) must still be whole blocks:
        // refused here, before any rank starts, as the load would.
        shard.check_formats()?;
        Ok(shard)
    }
}
