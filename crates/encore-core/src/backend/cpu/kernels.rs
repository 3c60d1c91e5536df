//! CPU kernels: the reference implementations of every op (semantics on `Backend`).
//! Each runs when called (eagerly or from a tape) and reads its buffers at that moment.

use crate::ops::{
    AttentionDims, EmbeddingDims, KvWriteDims, MatmulDims, RopeDims, RowDims, SampleDims,
};
use crate::tensor::Tensor;

pub(super) struct AttentionArgs {
    pub q: Tensor,
    pub k_cache: Tensor,
    pub v_cache: Tensor,
    pub block_tables: Tensor,
    pub seq_lens: Tensor,
    pub cu_seqlens_q: Option<Tensor>,
    pub scale: f32,
    pub out: Tensor,
    pub dims: AttentionDims,
}

pub(super) struct SampleArgs {
    pub logits: Tensor,
    pub temperature: Tensor,
    pub top_k: Tensor,
    pub top_p: Tensor,
    pub seeds: Tensor,
    pub out: Tensor,
    pub dims: SampleDims,
}

pub(super) fn embedding(_ids: &Tensor, _table: &Tensor, _out: &Tensor, _d: &EmbeddingDims) {
    todo!()
}
pub(super) fn rms_norm(
    _x: &Tensor,
    _residual: Option<&Tensor>,
    _w: &Tensor,
    _eps: f32,
    _out: &Tensor,
    _d: &RowDims,
) {
    todo!()
}
pub(super) fn rope(_q: &Tensor, _k: &Tensor, _pos: &Tensor, _cs: &Tensor, _d: &RopeDims) {
    todo!()
}
pub(super) fn silu_mul(_gu: &Tensor, _out: &Tensor, _d: &RowDims) {
    todo!()
}
pub(super) fn matmul(
    _x: &Tensor,
    _w: &Tensor,
    _b: Option<&Tensor>,
    _out: &Tensor,
    _d: &MatmulDims,
) {
    todo!()
}
pub(super) fn kv_write(
    _k: &Tensor,
    _v: &Tensor,
    _kc: &Tensor,
    _vc: &Tensor,
    _sm: &Tensor,
    _d: &KvWriteDims,
) {
    todo!()
}
pub(super) fn attention(_a: &AttentionArgs) {
    todo!()
}
pub(super) fn argmax(_l: &Tensor, _out: &Tensor, _d: &SampleDims) {
    todo!()
}
pub(super) fn sample(_a: &SampleArgs) {
    todo!()
}
