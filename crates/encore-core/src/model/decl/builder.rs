//! [`Builder`]: the declaration written op by op, each tensor's HF parts, shard and format
//! (`Decl::new` and the experts of a sparse layer).

use super::*;

/// Builds a [`Decl`] op by op.
pub(super) struct Builder<'a> {
    pub(super) decl: Decl,
    pub(super) num_layers: usize,
    pub(super) formats: &'a WeightFormats,
    /// `(rank, size)` of the tensor-parallel group the tensors are declared for.
    pub(super) tp: (usize, usize),
}

impl<'a> Builder<'a> {
    pub(super) fn new(num_layers: usize, formats: &'a WeightFormats, tp: (usize, usize)) -> Self {
        Builder {
            decl: Decl {
                tensors: Vec::new(),
                ops: Vec::new(),
            },
            num_layers,
            formats,
            tp,
        }
    }

    /// Start op `op`: the tensors declared next are read by it.
    pub(super) fn op(&mut self, op: OpId) {
        debug_assert_eq!(self.decl.ops.len(), op.index(self.num_layers), "{op:?}");
        self.decl.ops.push(OpDecl {
            op,
            reads: Vec::new(),
        });
    }

    /// A sparse layer's ops: the router, the experts' gate/up and down (and the shared
    /// expert's gate/up and gate) under `GateUp`, the shared expert's down under `Down`
    /// (which reads nothing without one), with the architecture's HF names (Mixtral's `block_sparse_moe.*`,
    /// `w1` gate, `w3` up, `w2` down). `(i, shared)` are the whole model's expert and
    /// shared expert widths, `(eu, su)` the units they split in (a block of their down
    /// projection's format). Over several ranks every expert (and the shared expert) is
    /// split as a dense MLP is: its gate and up rows column-parallel, its down columns
    /// row-parallel, so the layer's output is a partial sum the next norm's all-reduce
    /// completes; the router and the shared expert's gate are replicated (every rank
    /// routes every token alike).
    pub(super) fn experts(
        &mut self,
        arch: Arch,
        moe: &MoeConfig,
        (i, shared): (usize, Option<usize>),
        (eu, su): (usize, usize),
        l: usize,
        h: usize,
    ) {
        let (e, layer) = (moe.num_experts, Some(l));
        let at = |op| OpId::Layer(l, op);
        let rep = Shard::Replicated;
        let (col, row) = (Shard::Column { unit: eu }, Shard::Row { unit: eu });
        let (shared_col, shared_row) = (Shard::Column { unit: su }, Shard::Row { unit: su });
        let rules = arch.family().experts;
        let (base, gate, up, down) =
            rules.map_or(("mlp", "gate_proj", "up_proj", "down_proj"), |e| e.names);
        let (router_name, biases) = rules.map_or(("gate", false), |e| (e.router, e.biases));
        // Each expert's tensor `w`'s weight or bias (gpt-oss's fused tensors are read
        // under these names: `model/weights/fused_experts.rs`).
        let expert = |x: usize, w: &str, kind: &str| format!("{base}.experts.{x}.{w}.{kind}");
        self.op(at(LayerOp::GateUp));
        let router = [(format!("{base}.{router_name}.weight"), e)];
        self.tensor_from(Role::Router, layer, &router, Some(h), rep);
        if biases {
            let bias = [(format!("{base}.{router_name}.bias"), e)];
            self.tensor_from(Role::RouterBias, layer, &bias, None, rep);
        }
        let gate_up = |kind: &'static str| -> Vec<(String, usize)> {
            [gate, up]
                .iter()
                .flat_map(|w| (0..e).map(move |x| (expert(x, w, kind), i)))
                .collect()
        };
        self.tensor_from(Role::ExpertsGateUp, layer, &gate_up("weight"), Some(h), col);
        if biases {
            self.tensor_from(Role::ExpertsGateUpBias, layer, &gate_up("bias"), None, col);
        }
        // The experts' down stack is read by the same op: one backend call runs the whole
        // routed MLP, so under a budget both stacks must be resident together (entering
        // `Down` would let the executor reuse the gate/up slot before that call runs).
        let downs =
            |kind| -> Vec<(String, usize)> { (0..e).map(|x| (expert(x, down, kind), h)).collect() };
        self.tensor_from(Role::ExpertsDown, layer, &downs("weight"), Some(i), row);
        if biases {
            // Added to each expert's partial down sum: once over the ranks.
            let once = Shard::FirstRank;
            self.tensor_from(Role::ExpertsDownBias, layer, &downs("bias"), None, once);
        }
        if let Some(s) = shared {
            let parts =
                ["gate_proj", "up_proj"].map(|w| (format!("mlp.shared_expert.{w}.weight"), s));
            self.tensor_from(Role::SharedGateUp, layer, &parts, Some(h), shared_col);
            let gate = [("mlp.shared_expert_gate.weight".to_string(), 1)];
            self.tensor_from(Role::SharedGate, layer, &gate, Some(h), rep);
        }
        self.op(at(LayerOp::Down));
        if let Some(s) = shared {
            let parts = [("mlp.shared_expert.down_proj.weight".to_string(), h)];
            self.tensor_from(Role::SharedDown, layer, &parts, Some(s), shared_row);
        }
    }

    /// Declare a tensor of `role` read by the current op, stacked from the role's sources
    /// with `rows` rows each (of `cols` columns, or 1-D), split over the group's ranks
    /// by `shard` (each part its block of the checkpoint's tensor); a projection is in
    /// the format the config's [`WeightFormats`] gives it, everything else dense.
    pub(super) fn tensor(
        &mut self,
        role: Role,
        layer: Option<usize>,
        rows: &[usize],
        cols: Option<usize>,
        shard: Shard,
    ) -> usize {
        let sources = role.sources();
        debug_assert_eq!(sources.len(), rows.len(), "{role:?}");
        let parts: Vec<(String, usize)> = sources
            .iter()
            .zip(rows)
            .map(|(s, &r)| (s.hf.to_string(), r))
            .collect();
        self.tensor_from(role, layer, &parts, cols, shard)
    }

    /// [`Builder::tensor`] from HF names (without the layer prefix) and rows.
    /// [`Builder::tensor_from`] for one checkpoint tensor `hf` that holds several parts'
    /// rows one after the other (`rows`: Phi-3's fused `qkv_proj`, `gate_up_proj`): whole
    /// on one device, or, over a tensor-parallel group, each part's share cut out of it
    /// (slices of the whole tensor, rows offset by the part's start), so a rank holds its
    /// q, k and v (or gate and up) shares in the unfused order.
    pub(super) fn tensor_fused(
        &mut self,
        role: Role,
        layer: Option<usize>,
        hf: &str,
        rows: &[usize],
        cols: Option<usize>,
        shard: Shard,
    ) -> usize {
        let (rank, size) = self.tp;
        if size == 1 || shard == Shard::Replicated {
            let whole = [(hf.to_string(), rows.iter().sum())];
            return self.tensor_from(role, layer, &whole, cols, shard);
        }
        let name = format!("{}{hf}", layer_prefix(layer));
        let shape = shape_of(rows.iter().sum(), cols);
        let mut start = 0;
        let parts = rows
            .iter()
            .map(|&r| {
                let mut s = shard.slice(rank, size, r, cols.unwrap_or(1));
                s.row += start;
                start += r;
                TensorSpec {
                    name: name.clone(),
                    shape: shape.clone(),
                    slice: Some(s),
                }
            })
            .collect();
        self.push(role, layer, parts, shard)
    }

    pub(super) fn tensor_from(
        &mut self,
        role: Role,
        layer: Option<usize>,
        parts: &[(String, usize)],
        cols: Option<usize>,
        shard: Shard,
    ) -> usize {
        let prefix = layer_prefix(layer);
        let (rank, size) = self.tp;
        let shard = if size > 1 { shard } else { Shard::Replicated };
        let parts: Vec<TensorSpec> = parts
            .iter()
            .map(|(hf, r)| (hf, *r))
            .map(|(hf, r)| TensorSpec {
                name: format!("{prefix}{hf}"),
                shape: shape_of(r, cols),
                slice: (shard != Shard::Replicated)
                    .then(|| shard.slice(rank, size, r, cols.unwrap_or(1))),
            })
            .collect();
        self.push(role, layer, parts, shard)
    }

    /// Declare a tensor of `parts` (this rank's blocks) read by the current op.
    fn push(
        &mut self,
        role: Role,
        layer: Option<usize>,
        parts: Vec<TensorSpec>,
        shard: Shard,
    ) -> usize {
        let local_rows: usize = parts.iter().map(|p| p.local_shape()[0]).sum();
        let local_cols = parts.first().and_then(|p| p.local_shape().get(1).copied());
        let op = self.decl.ops.last().expect("an op is started first").op;
        let name = match layer {
            Some(l) => format!("model.layers.{l}.{}", role.module()),
            None => role.module().to_string(),
        };
        let format = match role.is_projection() {
            true => self.formats.projection(&name).filter(|f| {
                let whole = local_cols.is_none_or(|k| f.row_bytes(k).is_some());
                whole || !self.formats.dense_partial_blocks
            }),
            false => None,
        }
        .map(WeightFormat::Quant);
        self.decl.tensors.push(TensorDecl {
            role,
            layer,
            shape: match local_cols {
                Some(c) => vec![local_rows, c],
                None => vec![local_rows],
            },
            parts,
            format: format.unwrap_or_default(),
            shard,
            op,
        });
        let index = self.decl.tensors.len() - 1;
        self.read_again(index);
        index
    }

    /// A permutation of `len` input columns ([`Role::QkvPerm`] ..) of layer `layer`, read
    /// by the current op: i32, made by the loader from the projection's g_idx (no HF
    /// tensor of its own), every rank its own (o's and down's within its share).
    pub(super) fn perm(&mut self, role: Role, layer: usize, len: usize) {
        let op = self.decl.ops.last().expect("an op is started first").op;
        self.decl.tensors.push(TensorDecl {
            role,
            layer: Some(layer),
            shape: vec![len],
            parts: Vec::new(),
            format: WeightFormat::Index,
            shard: Shard::Replicated,
            op,
        });
        self.read_again(self.decl.tensors.len() - 1);
    }

    /// The columns this rank holds of layer `layer`'s tensor of `role`, declared before.
    pub(super) fn cols_of(&self, role: Role, layer: usize) -> usize {
        self.decl
            .tensors
            .iter()
            .rev()
            .find(|t| t.role == role && t.layer == Some(layer))
            .and_then(|t| t.shape.get(1).copied())
            .unwrap_or(0)
    }

    /// The current op reads tensor `index` (declared by an earlier op, or just now).
    pub(super) fn read_again(&mut self, index: usize) {
        let op = self.decl.ops.last_mut().expect("an op is started first");
        op.reads.push(index);
    }
}

/// The HF name prefix of a layer's tensors (none for the top-level ones).
fn layer_prefix(layer: Option<usize>) -> String {
    layer.map_or(String::new(), |l| format!("model.layers.{l}."))
}

/// A checkpoint tensor's shape: `rows` of `cols`, or `rows` values.
fn shape_of(rows: usize, cols: Option<usize>) -> Vec<usize> {
    match cols {
        Some(c) => vec![rows, c],
        None => vec![rows],
    }
}
