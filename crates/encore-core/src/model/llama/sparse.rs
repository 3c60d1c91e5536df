//! A sparse (mixture-of-experts) layer's MLP: the router, the chosen experts (streamed
//! through a device cache under weight offload, with the next sparse layer's experts
//! prefetched), and Qwen2-MoE's gated shared expert.

use super::{Model, StepBuffers};
use crate::backend::{Activation, Backend, ExpertPrefetch, Moe, MoeBias};
use crate::error::Result;
use crate::model::config::MoeConfig;
use crate::model::decl::{LayerOp, OpId, Role};
use crate::tensor::Tensor;

impl Model {
    /// Layer `layer`'s sparse MLP from `buf.normed` into `buf.hidden` (before any sum over
    /// tensor-parallel ranks).
    pub(super) fn sparse_mlp(
        &self,
        be: &dyn Backend,
        buf: &StepBuffers,
        layer: usize,
        router: &Tensor,
        moe: &MoeConfig,
    ) -> Result<()> {
        let layers = &self.weights.layers;
        let (l, at) = (&layers[layer], |op| OpId::Layer(layer, op));
        // A sparse layer: the router, then the chosen experts. `GateUp` reads,
        // in declaration order, the router, the experts' gate/up and down, then
        // the shared expert's gate/up and gate; `Down` the shared expert's down
        // (so everything a backend call reads is resident during it).
        // gpt-oss's router and expert biases, each read after its weight.
        let (rb, gub, db) = (
            l.get(Role::RouterBias),
            l.get(Role::ExpertsGateUpBias),
            l.get(Role::ExpertsDownBias),
        );
        let (router, gate_up, down, shared_gu, biases) = match self.enter(at(LayerOp::GateUp))? {
            None => (
                router.clone(),
                l.gate_up().clone(),
                l.down().clone(),
                l.shared().map(|s| (s.gate_up, s.gate)),
                [rb.cloned(), gub.cloned(), db.cloned()],
            ),
            Some(v) => {
                let mut it = v.into_iter();
                let router = it.next().expect("the router is read first");
                let rb = rb.and_then(|_| it.next());
                let gate_up = it.next().expect("then the experts' gate/up");
                let gub = gub.and_then(|_| it.next());
                let down = it.next().expect("then the experts' down");
                let db = db.and_then(|_| it.next());
                let shared = l.shared().map(|_| {
                    let gu = it.next().expect("then the shared expert's gate/up");
                    (gu, it.next().expect("and its gate"))
                });
                (router, gate_up, down, shared, [rb, gub, db])
            }
        };
        let [router_bias, gate_up_bias, down_bias] = biases;
        let n = buf.normed.dim(0);
        let logits = buf.router_logits.prefix(n)?;
        be.matmul(&buf.normed, &router, router_bias.as_ref(), &logits)?;
        if let Some(r) = &self.router_table {
            be.copy(&r.window.narrow(layer, n)?, &logits)?;
        }
        let mut cache = self.offload.as_ref().and_then(|o| o.expert_cache(layer));
        let (pf_logits, pf_ids, pf_weights) = (
            buf.prefetch_logits.prefix(n)?,
            buf.prefetch_ids.prefix(n)?,
            buf.prefetch_weights.prefix(n)?,
        );
        let next_sparse = (layer + 1..layers.len()).find(|&j| layers[j].router().is_some());
        // Successive prefetches alternate between two rows of fills.
        let fills = match (&self.offload, next_sparse) {
            (Some(o), Some(j)) => {
                let nth = layers[..j].iter().filter(|l| l.router().is_some()).count();
                o.expert_prefetch_fills(nth).transpose()?
            }
            _ => None,
        };
        if let (Some(c), Some(fills), Some(j)) = (cache.as_mut(), fills.as_ref(), next_sparse) {
            // Pre-gated: layer j's router applied to this layer's input
            // predicts j's experts, fetched while this layer's run.
            let next = &layers[j];
            match self
                .router_table
                .as_ref()
                .and_then(|r| r.predicted.as_ref())
            {
                Some((_, p)) => be.copy(&p.narrow(j, n)?, &pf_logits)?,
                None => {
                    let router = next.router().expect("a sparse layer");
                    let bias = next.get(Role::RouterBias);
                    be.matmul(&buf.normed, router, bias, &pf_logits)?
                }
            }
            c.prefetch = Some(ExpertPrefetch {
                layer: j,
                logits: &pf_logits,
                ids: &pf_ids,
                weights: &pf_weights,
                gate_up: next.gate_up(),
                down: next.down(),
                fills,
            });
        }
        let rules = self.cfg.arch.family().experts;
        be.moe(&Moe {
            act: rules.map_or(Activation::Silu, |e| e.act),
            bias: gate_up_bias
                .as_ref()
                .zip(down_bias.as_ref())
                .map(|(gate_up, down)| MoeBias { gate_up, down }),
            x: &buf.normed,
            logits: &logits,
            top_k: moe.top_k,
            renormalize: moe.norm_topk_prob,
            gate_up: &gate_up,
            down: &down,
            ids: &buf.moe_ids.prefix(n)?,
            weights: &buf.moe_weights.prefix(n)?,
            out: &buf.hidden,
            scratch: &buf.moe_act.prefix(n * moe.top_k)?,
            workspace: &buf.moe_work,
            cache,
        })?;
        // The shared expert (Qwen2-MoE): its MLP, scaled by the sigmoid of its
        // gate, added to the routed experts' sum.
        let shared = match shared_gu {
            Some((gu, gate)) => {
                let (sgu, sact) = (buf.shared_gate_up.prefix(n)?, buf.shared_act.prefix(n)?);
                be.matmul_act_mul(Activation::Silu, &buf.normed, &gu, &sgu, &sact)?;
                let g = buf.shared_gate.prefix(n)?;
                be.matmul(&buf.normed, &gate, None, &g)?;
                Some((sact, g))
            }
            None => None,
        };
        let shared_down = match self.enter(at(LayerOp::Down))? {
            None => l.shared().map(|s| s.down),
            Some(v) => v.into_iter().next(),
        };
        if let (Some((sact, g)), Some(sd)) = (shared, shared_down) {
            let sout = buf.shared_out.prefix(n)?;
            be.matmul(&sact, &sd, None, &sout)?;
            be.sigmoid_gate_add(&buf.hidden, &g, &sout)?;
        }
        Ok(())
    }
}
