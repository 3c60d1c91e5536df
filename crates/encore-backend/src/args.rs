//! The argument structs of the composite ops ([`Attention`], [`QkvRope`], [`Sampling`]),
//! shared by the op validation (`crate::ops`) and every backend.

use crate::tensor::Tensor;

/// A norm's kind and its weights, the argument of every norm op
/// ([`crate::backend::Backend::rms_norm`], `norm_add_norm` and the tensor-parallel
/// norms): the kind is a value the kernels take, not a method of its own. Gemma's
/// `x * (1 + w)` is [`Norm::Rms`] of the loaded `1 + w`. Both compute over the last
/// dimension in f32 (the mean and variance too) and round each output to T once.
#[derive(Clone, Copy, Debug)]
pub enum Norm<'a> {
    /// RMSNorm: `out = x / sqrt(mean(x^2) + eps) * w`.
    Rms(&'a Tensor),
    /// LayerNorm with a bias: `out = (x - mean) / sqrt(var + eps) * weight + bias`, var
    /// the population variance `mean((x - mean)^2)` (StableLM's, PyTorch's
    /// `nn.LayerNorm`).
    Layer {
        weight: &'a Tensor,
        bias: &'a Tensor,
    },
}

impl<'a> Norm<'a> {
    /// RMSNorm by `weight`, or LayerNorm by `weight` and `bias` when there is a bias.
    pub fn new(weight: &'a Tensor, bias: Option<&'a Tensor>) -> Self {
        match bias {
            None => Norm::Rms(weight),
            Some(bias) => Norm::Layer { weight, bias },
        }
    }

    pub fn weight(self) -> &'a Tensor {
        match self {
            Norm::Rms(w) | Norm::Layer { weight: w, .. } => w,
        }
    }

    /// LayerNorm's bias (`None`: RMSNorm).
    pub fn bias(self) -> Option<&'a Tensor> {
        match self {
            Norm::Rms(_) => None,
            Norm::Layer { bias, .. } => Some(bias),
        }
    }

    /// `RMSNorm` or `LayerNorm` (for errors that refuse a kind).
    pub fn kind(self) -> &'static str {
        match self {
            Norm::Rms(_) => "RMSNorm",
            Norm::Layer { .. } => "LayerNorm",
        }
    }
}

impl<'a> From<&'a Tensor> for Norm<'a> {
    fn from(w: &'a Tensor) -> Self {
        Norm::Rms(w)
    }
}

/// The gated MLP's activation, `act(gate) * up` ([`crate::backend::Backend::act_mul`]):
/// HF's `hidden_act`. SiLU is the Llama family's; the GELUs are Gemma's (tanh) and BERT's
/// (erf); ReLU² is Primer's `relu(x)^2`; [`Activation::SwigluOai`] is gpt-oss's experts'
/// clamped SwiGLU, which also changes the up side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x / (1 + e^-x)` (HF `silu`, `swish`).
    #[default]
    Silu,
    /// `x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))` (HF `gelu_pytorch_tanh`,
    /// `gelu_new`).
    GeluTanh,
    /// `x / 2 * (1 + erf(x / sqrt(2)))` (HF `gelu`).
    Gelu,
    /// `max(x, 0)^2` (HF `relu2`).
    Relu2,
    /// gpt-oss's clamped SwiGLU (transformers' `GptOssExperts._apply_gate`, limit 7 and
    /// alpha 1.702, fixed there): `g = min(gate, 7)`, `u = clamp(up, -7, 7)`, the output
    /// `(u + 1) * g * sigmoid(1.702 g)`. Not an HF `hidden_act` name (gpt-oss's config
    /// says `silu`, which its experts do not read).
    SwigluOai,
}

/// [`Activation::SwigluOai`]'s clamp (transformers' `GptOssExperts.limit`).
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;
/// [`Activation::SwigluOai`]'s sigmoid slope (`GptOssExperts.alpha`).
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;

impl Activation {
    pub const ALL: [Activation; 5] = [
        Activation::Silu,
        Activation::GeluTanh,
        Activation::Gelu,
        Activation::Relu2,
        Activation::SwigluOai,
    ];

    /// The activation of HF's `hidden_act` name, `None` for one encore does not run.
    pub fn from_hf(name: &str) -> Option<Self> {
        Some(match name {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_new" => Activation::GeluTanh,
            "gelu" => Activation::Gelu,
            "relu2" => Activation::Relu2,
            _ => return None,
        })
    }

    /// Its HF name (gpt-oss's clamped SwiGLU has none: `swiglu_oai`, its name in vLLM).
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
            Activation::Gelu => "gelu",
            Activation::Relu2 => "relu2",
            Activation::SwigluOai => "swiglu_oai",
        }
    }

    /// The HF `hidden_act` names [`Activation::from_hf`] reads, for messages.
    pub fn hf_names() -> String {
        Activation::ALL
            .iter()
            .filter(|a| Activation::from_hf(a.hf_name()).is_some())
            .map(|a| a.hf_name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The CUDA kernels' `act` argument (`act_mul_f32` in common.cuh).
    pub fn code(self) -> i32 {
        self as i32
    }

    /// `act(gate) * up` in f32, as the CPU kernels compute it.
    pub fn gated(self, g: f32, u: f32) -> f32 {
        match self {
            Activation::Silu => g / (1.0 + (-g).exp()) * u,
            Activation::GeluTanh => {
                let inner = 0.797_884_6 * (g + 0.044_715 * g * g * g);
                0.5 * g * (1.0 + inner.tanh()) * u
            }
            Activation::Gelu => {
                0.5 * g * (1.0 + libm::erff(g * std::f32::consts::FRAC_1_SQRT_2)) * u
            }
            Activation::Relu2 => {
                let r = g.max(0.0);
                r * r * u
            }
            Activation::SwigluOai => {
                let g = g.min(SWIGLU_OAI_LIMIT);
                let u = u.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT);
                (u + 1.0) * (g / (1.0 + (-SWIGLU_OAI_ALPHA * g).exp()))
            }
        }
    }

    /// `act(gate) * up` in f64 (the references).
    pub fn gated_f64(self, g: f64, u: f64) -> f64 {
        match self {
            Activation::Silu => g / (1.0 + (-g).exp()) * u,
            Activation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * g * (1.0 + (c * (g + 0.044715 * g.powi(3))).tanh()) * u
            }
            Activation::Gelu => 0.5 * g * (1.0 + libm::erf(g / std::f64::consts::SQRT_2)) * u,
            Activation::Relu2 => g.max(0.0).powi(2) * u,
            Activation::SwigluOai => {
                let (limit, alpha) = (SWIGLU_OAI_LIMIT as f64, SWIGLU_OAI_ALPHA as f64);
                let g = g.min(limit);
                let u = u.clamp(-limit, limit);
                (u + 1.0) * (g / (1.0 + (-alpha * g).exp()))
            }
        }
    }
}

/// Paged attention over a KV cache, for decode (one query row per sequence) and for
/// prefill / chunked prefill (several query rows per sequence, `cu_seqlens_q`).
///
/// Sequence `s` has `seq_lens[s]` tokens in the cache, *including* the tokens of this
/// step (their K/V must already have been written, by [`crate::backend::Backend::qkv_rope_write`]). Token at
/// position `t` of sequence `s` lives in cache block `block_tables[s][t / block_size]`,
/// row `t % block_size`.
///
/// Query rows: with `cu_seqlens_q = None` (decode) row `s` is the one query of sequence
/// `s` at position `seq_lens[s] - 1`. With `Some(cu)` (i32, `num_seqs + 1` entries,
/// non-decreasing, `cu[0] = 0`) rows `cu[s]..cu[s+1]` are sequence `s`'s queries, the
/// last at position `seq_lens[s] - 1` and the ones before it consecutively earlier.
/// A query at position `p` attends causally to positions `0..=p`; with a sliding
/// `window = Some(w)` only to the `w` most recent of them, positions `k` with
/// `p - w < k <= p` (transformers' sliding-window semantics). The window is a model
/// constant per layer (a launch scalar), never a per-step value.
///
/// Rows that attend to nothing write zeros: a sequence with `seq_len == 0` (padding),
/// rows at or beyond `cu[num_seqs]`, rows whose position would be negative. Context
/// longer than the block table can hold is clamped to `table_width * block_size` (the
/// window still counts back from the query's position `p`, so a query whose window lies
/// wholly past the table's capacity writes zeros); a block id outside `0..num_blocks`
/// contributes nothing (never an out-of-bounds read).
///
/// GQA: query head `h` uses KV head `h / (num_heads / num_kv_heads)`.
///
/// Attention sinks (gpt-oss): with `sinks = Some(s)`, head `h`'s softmax has one more
/// logit, `s[h]` (not scaled, not capped), whose probability is dropped: the output is
/// `Σ_k e^(x_k - m) v_k / (Σ_k e^(x_k - m) + e^(s[h] - m))`, `m` the largest of the
/// scaled scores `x_k` and `s[h]` (transformers' `eager_attention_forward` of gpt-oss).
/// A row that attends to nothing still writes zeros.
///
/// An FP8 cache ([`crate::tensor::DType::F8E4M3`]) holds `K / kv_scale.k` and `V /
/// kv_scale.v`: a key is its byte's value times `kv_scale.k` (folded into the softmax
/// scale), the output is multiplied by `kv_scale.v`. A cache of T ignores `kv_scale`.
pub struct Attention<'a> {
    /// `[rows, num_heads, head_dim]`, dtype T.
    pub q: &'a Tensor,
    /// `[num_blocks, block_size, num_kv_heads, head_dim]`, dtype T or F8E4M3.
    pub k_cache: &'a Tensor,
    /// Same shape and dtype as `k_cache`.
    pub v_cache: &'a Tensor,
    /// The scales of an FP8 cache (ignored for a cache of T).
    pub kv_scale: KvScale,
    /// i32 `[num_seqs, table_width]`.
    pub block_tables: &'a Tensor,
    /// i32 `[num_seqs]`.
    pub seq_lens: &'a Tensor,
    /// i32 `[num_seqs + 1]`, or `None` for decode (`rows == num_seqs`).
    pub cu_seqlens_q: Option<&'a Tensor>,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Logit soft-capping (Gemma 2): each scaled score `x` becomes `cap * tanh(x / cap)`
    /// before the softmax (`cap > 0`); `None` for none.
    pub softcap: Option<f32>,
    /// Sliding window in positions (`>= 1`; a window at least as long as the context is
    /// full attention), or `None` for full causal attention.
    pub window: Option<usize>,
    /// Per-head attention sinks, T `[num_heads]` (gpt-oss's `self_attn.sinks`), or
    /// `None` for none.
    pub sinks: Option<&'a Tensor>,
    /// `[rows, num_heads, head_dim]`, dtype T.
    pub out: &'a Tensor,
    /// f32 scratch of at least [`crate::backend::Backend::attention_scratch_len`] elements (the split-K
    /// partial results on CUDA); contents are overwritten.
    pub scratch: &'a Tensor,
}

/// Arguments of [`crate::backend::Backend::qkv_rope_write`]: the attention block's work between the merged
/// q/k/v projection and attention, in one op.
///
/// `qkv` T `[n, (num_heads + 2 * num_kv_heads) * head_dim]` holds each token's q heads,
/// then k heads, then v heads (one `matmul` by the merged weight). Per token `i`:
/// - every q and k head is, when `head_norm` is given (Qwen3), RMS-normalised over its
///   `head_dim` with the q or k weight (T `[head_dim]`) and `eps` and rounded to T, then
///   rotated by `positions[i]` (left as is when the position is outside
///   `0..max_positions`) and rounded to T. Rotary embedding: NeoX / HF "rotate half"
///   layout over the first `rot` dims (`rot` = `cos_sin`'s width), where row `p` of
///   `cos_sin` holds `cos(p·f_0..f_{rot/2-1})` then `sin(..)`; for `j < rot/2`:
///   `x_j' = x_j c_j - x_{j+rot/2} s_j`, `x_{j+rot/2}' = x_{j+rot/2} c_j + x_j s_j`;
/// - the q heads go to `q_out` T `[n, num_heads, head_dim]`;
/// - the k and v heads go to the paged caches at slot `slot_mapping[i]` =
///   block * block_size + row (a slot `< 0`, padding, or beyond the cache is skipped).
///   An FP8 cache ([`crate::tensor::DType::F8E4M3`]) stores each value (as T holds it)
///   times `1 / kv_scale.k` (keys) or `1 / kv_scale.v` (values), the reciprocal rounded
///   to f32 once, rounded to the nearest E4M3 code (ties to even), saturating at ±448
///   ([`crate::quant::f32_to_e4m3`]).
pub struct QkvRope<'a> {
    pub qkv: &'a Tensor,
    /// `(q_norm, k_norm)` weights, T `[head_dim]`.
    pub head_norm: Option<(&'a Tensor, &'a Tensor)>,
    pub eps: f32,
    /// i32 `[n]`.
    pub positions: &'a Tensor,
    /// f32 `[max_positions, rot]`, built by `crate::ops::RopeConfig::cos_sin_table`
    /// (which applies Llama-3 scaling).
    pub cos_sin: &'a Tensor,
    /// i32 `[n]`.
    pub slot_mapping: &'a Tensor,
    pub q_out: &'a Tensor,
    /// T or F8E4M3 `[num_blocks, block_size, num_kv_heads, head_dim]`.
    pub k_cache: &'a Tensor,
    pub v_cache: &'a Tensor,
    /// The scales of an FP8 cache (ignored for a cache of T).
    pub kv_scale: KvScale,
}

/// The per-layer scales of an FP8 KV cache: the cache stores `K / k` and `V / v` in E4M3
/// (whose largest value is 448), as vLLM's `k_scale` / `v_scale`. A checkpoint may ship
/// them (calibrated so its keys and values fit); otherwise 1.0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvScale {
    pub k: f32,
    pub v: f32,
}

impl KvScale {
    /// No scaling.
    pub const ONE: KvScale = KvScale { k: 1.0, v: 1.0 };

    /// The multipliers a cache write applies, `(1 / k, 1 / v)` rounded to f32 (the CPU and
    /// CUDA writes use these same values, so they store the same bytes).
    pub fn inverse(self) -> (f32, f32) {
        (1.0 / self.k, 1.0 / self.v)
    }

    /// Both scales finite and positive.
    pub fn is_valid(self) -> bool {
        [self.k, self.v].iter().all(|s| s.is_finite() && *s > 0.0)
    }
}

impl Default for KvScale {
    fn default() -> Self {
        KvScale::ONE
    }
}

impl QkvRope<'_> {
    /// Every tensor argument with its name (for device checks and errors).
    pub fn tensors(&self) -> Vec<(&'static str, &Tensor)> {
        let mut ts = vec![
            ("qkv", self.qkv),
            ("positions", self.positions),
            ("cos_sin", self.cos_sin),
            ("slot_mapping", self.slot_mapping),
            ("q_out", self.q_out),
            ("k_cache", self.k_cache),
            ("v_cache", self.v_cache),
        ];
        if let Some((qn, kn)) = self.head_norm {
            ts.push(("q_norm", qn));
            ts.push(("k_norm", kn));
        }
        ts
    }
}

impl Attention<'_> {
    /// Every tensor argument with its name (for device checks and errors).
    pub fn tensors(&self) -> Vec<(&'static str, &Tensor)> {
        let mut ts = vec![
            ("q", self.q),
            ("k_cache", self.k_cache),
            ("v_cache", self.v_cache),
            ("block_tables", self.block_tables),
            ("seq_lens", self.seq_lens),
            ("out", self.out),
            ("scratch", self.scratch),
        ];
        if let Some(cu) = self.cu_seqlens_q {
            ts.push(("cu_seqlens_q", cu));
        }
        if let Some(s) = self.sinks {
            ts.push(("sinks", s));
        }
        ts
    }
}

/// Most top log-probabilities [`crate::backend::Backend::sample`] returns per row (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Flag bit of a [`Penalties::counts`] entry: the token occurs in the prompt. The bits
/// below it hold how often it was sampled.
pub const PROMPT_BIT: i32 = 1 << 30;

/// Per-row sampling parameters, all in device tensors so a graph replays with new values.
///
/// Row `r` (logits `l`, vocabulary `V`):
/// 0. penalties (rows with a valid `penalties.slot[r]`, see [`Penalties`]): each `l_i`
///    is replaced by its penalised value; everything below reads the penalised row. The
///    `logits` tensor itself is never written.
/// 1. log-probabilities (rows with `0 <= logprobs.num[r]`, see [`SampleLogprobs`]) of the
///    (penalised) row, before temperature and truncation.
/// 2. `temperature[r] <= 0`: greedy: the index of the largest logit (the smallest index
///    among equal maxima; NaN is never chosen unless the whole row is NaN, then 0).
/// 3. otherwise with `z = l / temperature[r]`, `e_i = exp(z_i - max z)`:
///    1. min-p: if `min_p[r] > 0`, keep tokens with `e_i >= min(min_p[r], 1)` (their
///       probability is at least `min_p` times the largest); else keep all;
///    2. top-k: if `0 < top_k[r] < V`, also require the logit to be `>=` the `top_k`-th
///       largest logit (ties at the threshold are all kept);
///    3. top-p: if `0 < top_p[r] < 1`, with `S` the sum of `e` over kept tokens, find the
///       largest threshold `τ` among kept logits such that the sum of `e_i` over kept
///       tokens with `l_i >= τ` is `>= top_p * S`; keep only those tokens;
///    4. draw `u = uniform(seeds[r])` (see `crate::ops::uniform_from_seed`, identical on
///       every backend), `target = u * Z` with `Z` the kept mass, and return the smallest
///       kept index `i` whose running sum of kept `e` over indices `<= i` exceeds
///       `target` (the last kept index if rounding leaves none).
///
///    Min-p, top-k and top-p each keep every token above a logit threshold, so the kept
///    set is the tokens at or above the largest of the three.
/// 4. rows with a valid penalty slot count the returned token:
///    `counts[slot, token] += 1`.
///
/// The engine writes a fresh seed per row per step (e.g. request seed mixed with step).
pub struct Sampling<'a> {
    /// f32 `[batch]`.
    pub temperature: &'a Tensor,
    /// i32 `[batch]`.
    pub top_k: &'a Tensor,
    /// f32 `[batch]`.
    pub top_p: &'a Tensor,
    /// f32 `[batch]`; `<= 0` (or NaN): off.
    pub min_p: &'a Tensor,
    /// i64 `[batch]`.
    pub seeds: &'a Tensor,
    /// Repetition, frequency and presence penalties; `None`: no row has any.
    pub penalties: Option<Penalties<'a>>,
    /// Where log-probabilities go; `None`: no row asks for them.
    pub logprobs: Option<SampleLogprobs<'a>>,
    /// Allowed-token bitmasks (structured outputs); `None`: no row has one.
    pub mask: Option<TokenMask<'a>>,
}

/// Per-row additive logit biases (OpenAI's `logit_bias`), applied in place to f32 logits
/// `[batch, vocab]` before sampling ([`crate::backend::Backend::logit_bias`]): for each
/// row `r` and `j < count[r]`, `logits[r, ids[r, j]] += vals[r, j]`. An id outside
/// `0..vocab` is skipped; ids are distinct within a row (the caller merges repeats).
/// Rows with `count[r] == 0` are untouched, so one launch serves a batch where few rows
/// have biases (captured in a graph, it costs those rows nothing).
pub struct LogitBias<'a> {
    /// i32 `[batch, K]`.
    pub ids: &'a Tensor,
    /// f32 `[batch, K]`.
    pub vals: &'a Tensor,
    /// i32 `[batch]`, each in `0..=K`.
    pub count: &'a Tensor,
}

/// Allowed tokens of [`Sampling`]: in a row with `on[r] != 0`, every token `i` whose bit
/// `bits[r, i / 32] >> (i % 32) & 1` is 0 reads as a NaN logit after the penalties, so the
/// rules above never pick it (greedy, the truncations and the draw skip NaN) and leave it
/// out of the log-probabilities: the allowed tokens' are normalized among themselves, and
/// a disallowed token's is absent from the top entries. Rows with `on[r] == 0` read no
/// bits. A row that allows no token samples as an all-NaN row does (token 0); callers
/// end such a request before sampling.
pub struct TokenMask<'a> {
    /// i32 `[batch, W]`, `W >= ceil(vocab / 32)`: bit `i % 32` of word `i / 32` allows
    /// token `i`.
    pub bits: &'a Tensor,
    /// i32 `[batch]`: nonzero where the row's mask applies.
    pub on: &'a Tensor,
}

/// Penalties of [`Sampling`], with vLLM's (and Hugging Face's) semantics, applied in this
/// order to the logit `l` of token `i` of a row whose slot is `s` (`0 <= s < slots`; any
/// other slot: the row has no penalties and counts nothing), with `c = counts[s, i]`,
/// `n = c & (PROMPT_BIT - 1)` its output count:
/// - repetition (`c != 0`: the token is in the prompt or the output): `l > 0 ? l / rep :
///   l * rep`;
/// - frequency: `l - frequency * n`;
/// - presence (`n > 0`): `l - presence`.
///
/// Each step in f32 with one rounding (no fused multiply-add), so every backend computes
/// the same value. After sampling, the row's returned token is counted (see
/// [`Sampling`]). Two rows of one call should not share a slot (their counts would
/// race); the result stays defined.
pub struct Penalties<'a> {
    /// i32 `[slots, V]`, read and updated: per slot (a sequence) and token, the
    /// [`PROMPT_BIT`] and the output count.
    pub counts: &'a Tensor,
    /// i32 `[batch]`: the row's slot in `counts`; `-1`: none.
    pub slot: &'a Tensor,
    /// f32 `[batch]`; 1: off.
    pub repetition: &'a Tensor,
    /// f32 `[batch]`; 0: off.
    pub frequency: &'a Tensor,
    /// f32 `[batch]`; 0: off.
    pub presence: &'a Tensor,
}

/// Log-probability outputs of [`Sampling`]. For a row with `0 <= num[r]` (values above
/// `N` count as `N`), with `l` the penalised row, `m` its largest non-NaN logit and
/// `lse = m + ln(sum over non-NaN l_j of exp(l_j - m))`, a token's log-probability is
/// `(l_i - m) - ln(sum)`:
/// - `token[r]`: the returned token's, or `target[r]`'s where `target` is given and
///   `0 <= target[r] < vocab` (a prompt token being scored);
/// - `top_ids[r, ..num]`, `top[r, ..num]`: the `num` largest non-NaN logits' tokens and
///   log-probabilities, largest first, ties by smaller index; entries past the row's
///   non-NaN count hold id -1 and `-inf`.
///
/// Rows with `num[r] < 0` write nothing and cost nothing; entries past `num[r]` are left
/// as they are.
pub struct SampleLogprobs<'a> {
    /// i32 `[batch]`: how many top entries; `-1`: none (not even `token`).
    pub num: &'a Tensor,
    /// f32 `[batch]`.
    pub token: &'a Tensor,
    /// i32 `[batch, N]`, `N <= MAX_TOP_LOGPROBS`.
    pub top_ids: &'a Tensor,
    /// f32 `[batch, N]`.
    pub top: &'a Tensor,
    /// i32 `[batch]`: the token whose log-probability `token[r]` holds instead of the
    /// returned one's (rows with an id outside the vocabulary, e.g. -1, keep the returned
    /// one's; a target the row's mask leaves out has none: NaN); `None`: every row the
    /// returned one's.
    pub target: Option<&'a Tensor>,
}

impl Sampling<'_> {
    /// Every tensor argument with its name (for device checks and errors).
    pub fn tensors(&self) -> Vec<(&'static str, &Tensor)> {
        let mut ts = vec![
            ("temperature", self.temperature),
            ("top_k", self.top_k),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("seeds", self.seeds),
        ];
        if let Some(p) = &self.penalties {
            ts.extend([
                ("counts", p.counts),
                ("slot", p.slot),
                ("repetition", p.repetition),
                ("frequency", p.frequency),
                ("presence", p.presence),
            ]);
        }
        if let Some(l) = &self.logprobs {
            ts.extend([
                ("num_logprobs", l.num),
                ("token_logprob", l.token),
                ("top_ids", l.top_ids),
                ("top_logprobs", l.top),
            ]);
            ts.extend(l.target.map(|t| ("logprob_target", t)));
        }
        if let Some(m) = &self.mask {
            ts.extend([("mask_bits", m.bits), ("mask_on", m.on)]);
        }
        ts
    }
}

/// The residual add and RMSNorm before a projection (`Backend::add_norm_matmul`,
/// [`Mlp::norm`]): `residual = residual + x` (rounded to T and stored back), then the
/// projection's input is `norm(residual)`, rounded to T exactly as `Backend::rms_norm`
/// with the residual computes it.
pub struct PreNorm<'a> {
    /// T `[m, d]`.
    pub residual: &'a Tensor,
    /// The norm: an RMSNorm's weight, or a LayerNorm's weight and bias (T `[d]`; the
    /// fused paths take RMSNorm only, a LayerNorm the unfused ops).
    pub norm: Norm<'a>,
    pub eps: f32,
    /// Scratch, T `[m, d]`: the normed rows, where the backend materialises them (contents
    /// afterwards unspecified).
    pub normed: &'a Tensor,
}

/// A projection after the residual add and its norm (see `Backend::add_norm_matmul`):
/// `out = norm(residual + x) · wᵀ (+ bias)`.
pub struct NormMatmul<'a> {
    /// T `[m, d]`: the block's output, added to the residual.
    pub x: &'a Tensor,
    pub norm: PreNorm<'a>,
    /// A weight, T or quantized `[n, d]`, and its bias T `[n]`.
    pub w: &'a Tensor,
    pub bias: Option<&'a Tensor>,
    /// T `[m, n]`.
    pub out: &'a Tensor,
}

/// A dense gated MLP for `m` token rows (see `Backend::mlp`): `out = act_mul(act, x ·
/// gate_upᵀ) · downᵀ`, x first added to the residual and normed when `norm` is given.
pub struct Mlp<'a> {
    pub act: Activation,
    /// T `[m, hidden]`: the normed hidden rows, or with `norm` the block output before the
    /// residual add.
    pub x: &'a Tensor,
    pub norm: Option<PreNorm<'a>>,
    /// Weights, T or quantized: `[2 * inter, hidden]` (gate rows, then up rows) and
    /// `[n, inter]`.
    pub gate_up: &'a Tensor,
    pub down: &'a Tensor,
    /// Scratch, T `[m, 2 * inter]` and T `[m, inter]`: the gate/up product and the
    /// activation, where the backend materialises them (contents afterwards unspecified).
    pub gate_up_out: &'a Tensor,
    pub act_out: &'a Tensor,
    /// T `[m, n]`; may be `x` (read before it is written).
    pub out: &'a Tensor,
}

/// A sparse MLP layer's experts for `n` token rows (see `Backend::moe`): route each row
/// (softmax of its router logits in f32, the `top_k` most probable experts, ties to the
/// lower index, renormalised to sum to 1 when `renormalize`: the softmax of the top k
/// logits, gpt-oss's router), then sum the chosen experts' gated MLPs (`act`, SiLU for
/// every family but gpt-oss) weighted by their probabilities. With `bias`, each expert's
/// gate and up products and its down product add the expert's biases before they are
/// rounded to T (gpt-oss's experts).
pub struct Moe<'a> {
    /// The experts' activation, `act(gate) * up` ([`Activation::gated`]).
    pub act: Activation,
    /// The experts' biases (`None`: none).
    pub bias: Option<MoeBias<'a>>,
    /// T `[n, hidden]`: the normed hidden rows.
    pub x: &'a Tensor,
    /// T or f32 `[n, num_experts]`: the router's logits.
    pub logits: &'a Tensor,
    pub top_k: usize,
    pub renormalize: bool,
    /// T or quantized `[2 * E * I, hidden]`: every expert's gate rows, then every
    /// expert's up rows (expert `e`'s gate is rows `e I..`, its up rows `E I + e I..`).
    pub gate_up: &'a Tensor,
    /// T or quantized `[E * hidden, I]`: expert `e`'s down projection is rows `e hidden..`.
    pub down: &'a Tensor,
    /// Written: i32 `[n, top_k]`, the chosen experts in order of probability, and f32
    /// `[n, top_k]`, their weights.
    pub ids: &'a Tensor,
    pub weights: &'a Tensor,
    /// T `[n, hidden]`.
    pub out: &'a Tensor,
    /// T `[n * top_k, I]`: scratch for the chosen experts' activations (a backend may
    /// leave it unused).
    pub scratch: &'a Tensor,
    /// Device workspace of at least [`crate::Backend::moe_workspace_bytes`] bytes for
    /// these `n` rows (any dtype; the CUDA backend's grouped GEMM sorts the pairs and
    /// holds their down products there).
    pub workspace: &'a Tensor,
    /// Routed experts served from a device cache of expert slots (weight offload): then
    /// `gate_up` and `down` are in host memory the device reads, and only the slots'
    /// copies are computed with. `None`: `gate_up` and `down` are read where they are.
    pub cache: Option<ExpertCache<'a>>,
}

/// The experts' biases of [`Moe`], laid out as their weights' rows: T `[2 * E * I]` (every
/// expert's gate biases, then every expert's up biases: expert `e`'s gate at `e I`, its up
/// at `E I + e I`) and T `[E * hidden]` (expert `e`'s down bias at `e hidden`).
#[derive(Clone, Copy)]
pub struct MoeBias<'a> {
    pub gate_up: &'a Tensor,
    pub down: &'a Tensor,
}

/// A device cache of expert slots for [`Moe`] (routed experts streamed under a weight
/// budget). Each slot holds one expert of one sparse layer: its gate rows then its up rows
/// (`gate_up_slots` row `s`), and its down rows (`down_slots` row `s`), in the layer's
/// formats. After routing, the backend, on the device and with no host round trip:
/// 1. counts each expert's pairs (`need`), and updates the layer's scores:
///    `score = score * decay + need` (f32, one fused multiply-add);
/// 2. looks up each needed expert (`slot_of`): a hit, or a miss;
/// 3. for each miss in ascending expert order, takes the slot of least score (an empty slot
///    scores -1; ties to the lower slot) among those not holding an expert this call needs,
///    evicts its expert (`slot_of` = -1), and records the fill (`fills`);
/// 4. copies the filled experts' rows from host memory into their slots, then runs the
///    experts from the slots.
///
/// So the policy is frequency over a decaying window, deterministic, and the same on every
/// backend; correctness never depends on it (a slot holds a bit-exact copy).
pub struct ExpertCache<'a> {
    /// This layer's row of `slot_of` and `score`.
    pub layer: usize,
    /// i32 `[layers, experts]`: the slot holding each expert, -1 where none does.
    pub slot_of: &'a Tensor,
    /// i32 `[slots]`: the `layer * experts + expert` each slot holds, -1 when empty.
    pub owner: &'a Tensor,
    /// f32 `[layers, experts]`: the replacement policy's scores.
    pub score: &'a Tensor,
    /// i32 `[1 + 2 * experts]`, written: this call's fills (their count, then (expert,
    /// slot) pairs).
    pub fills: &'a Tensor,
    /// i64 `[5]`, accumulated: distinct experts needed, hits, misses (fills), bytes filled
    /// (prefetches included), experts prefetched.
    pub stats: &'a Tensor,
    /// The slots' bytes (any dtype): `[slots, gate/up slot bytes]` and `[slots, down slot
    /// bytes]` as rows of whole elements; each slot at least the layer's expert's bytes and
    /// a multiple of 16 bytes.
    pub gate_up_slots: &'a Tensor,
    pub down_slots: &'a Tensor,
    /// The scores' decay per call of the layer, in [0, 1].
    pub decay: f32,
    /// A later layer's experts fetched ahead, while this call's experts run.
    pub prefetch: Option<ExpertPrefetch<'a>>,
}

/// A later sparse layer's experts fetched ahead (Pre-gated MoE): right after this call's
/// plan, the backend routes `logits` (that layer's router applied early, to this layer's
/// input: the prediction) into `ids`, plans the predicted experts as a call of `layer`
/// would, with three differences (the slots this call needs stay pinned, the scores are
/// left alone, and it stops when no unpinned slot is left), and copies them into their
/// slots on a second stream, beside this call's experts and what follows them (the
/// copies of successive prefetches run one after another there). The call of the next
/// layer with a cache waits for them before its own copies and experts (so a layer's call
/// names the prefetch of the next sparse layer, if any), as does
/// [`crate::Backend::join_expert_prefetch`]. A wrong prediction costs bytes, never
/// correctness: `layer`'s own call looks its experts up again.
pub struct ExpertPrefetch<'a> {
    /// The later layer (its row of `slot_of` and `score`).
    pub layer: usize,
    /// T or f32 `[n, experts]`: the predicted logits.
    pub logits: &'a Tensor,
    /// Written: i32 `[n, top_k]` and f32 `[n, top_k]`, the predicted experts and weights.
    pub ids: &'a Tensor,
    pub weights: &'a Tensor,
    /// That layer's experts in host memory (as [`Moe::gate_up`] and [`Moe::down`]).
    pub gate_up: &'a Tensor,
    pub down: &'a Tensor,
    /// i32 `[1 + 2 * experts]`, written: the prefetch's fills (not this call's `fills`,
    /// which its own copies read). A prefetch's copies read them until the call of its
    /// layer, after the next prefetch is planned: successive prefetches alternate between
    /// two rows ([`crate::backend::ExpertSlots::prefetch_fills`]).
    pub fills: &'a Tensor,
}

impl Moe<'_> {
    /// Every tensor argument with its name (for device checks and errors).
    pub fn tensors(&self) -> Vec<(&'static str, &Tensor)> {
        let mut ts = vec![
            ("x", self.x),
            ("logits", self.logits),
            ("gate_up", self.gate_up),
            ("down", self.down),
            ("ids", self.ids),
            ("weights", self.weights),
            ("out", self.out),
            ("scratch", self.scratch),
            ("workspace", self.workspace),
        ];
        if let Some(b) = &self.bias {
            ts.extend([("gate_up_bias", b.gate_up), ("down_bias", b.down)]);
        }
        if let Some(c) = &self.cache {
            ts.extend([
                ("slot_of", c.slot_of),
                ("owner", c.owner),
                ("score", c.score),
                ("fills", c.fills),
                ("stats", c.stats),
                ("gate_up_slots", c.gate_up_slots),
                ("down_slots", c.down_slots),
            ]);
            if let Some(p) = &c.prefetch {
                ts.extend([
                    ("prefetch.logits", p.logits),
                    ("prefetch.ids", p.ids),
                    ("prefetch.weights", p.weights),
                    ("prefetch.gate_up", p.gate_up),
                    ("prefetch.down", p.down),
                    ("prefetch.fills", p.fills),
                ]);
            }
        }
        ts
    }
}
