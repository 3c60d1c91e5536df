//! The forward pass against a naive f64 implementation of the same architecture written
//! here from the HF definitions, for every architecture variant (plain Llama, Llama-3 rope
//! scaling, Qwen2 qkv bias + tied embeddings, Qwen3 q/k norm, sliding-window attention),
//! over steps that mix prefill, chunked prefill and decode in one batch, with sequences
//! crossing KV blocks.

use encore_core::backend::cpu::CpuBackend;
use encore_core::kv::{KvCache, KvCacheConfig};
use encore_core::memory::Arena;
use encore_core::model::config::{ModelConfig, SlidingWindow};
use encore_core::model::llama::{Model, StepInputs};
use encore_core::model::weights::{self, ModelWeights, WeightSource};
use encore_core::{Backend, DType};

const BLOCK: usize = 8;
const MAX_BLOCKS_PER_SEQ: usize = 6;

/// Host copy of the weights in f64, plus the config.
struct RefModel {
    cfg: ModelConfig,
    embed: Vec<f64>,
    layers: Vec<RefLayer>,
    norm: Vec<f64>,
    lm_head: Vec<f64>,
}

struct RefLayer {
    /// `None`: the block reads the residual stream itself (OLMo 2).
    input_norm: Option<Vec<f64>>,
    qkv: Vec<f64>,
    qkv_bias: Option<Vec<f64>>,
    q_norm: Option<Vec<f64>>,
    k_norm: Option<Vec<f64>>,
    o_proj: Vec<f64>,
    post_norm: Option<Vec<f64>>,
    /// Post norms: the attention's and the MLP's outputs normed before the residual add.
    attn_out_norm: Option<Vec<f64>>,
    mlp_out_norm: Option<Vec<f64>>,
    gate_up: Vec<f64>,
    down: Vec<f64>,
    /// A sparse layer's router (then gate_up and down are the experts' stacks).
    router: Option<Vec<f64>>,
    /// Qwen2-MoE's shared expert: gate/up, gate, down.
    shared: Option<[Vec<f64>; 3]>,
}

fn host(be: &dyn Backend, t: &encore_core::Tensor) -> Vec<f64> {
    be.download_f32(t)
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

impl RefModel {
    fn new(be: &dyn Backend, cfg: &ModelConfig, w: &ModelWeights) -> Self {
        RefModel {
            cfg: cfg.clone(),
            embed: host(be, &w.embed),
            layers: w
                .layers
                .iter()
                .map(|l| RefLayer {
                    input_norm: l.input_norm().map(|t| host(be, t)),
                    qkv: host(be, l.qkv()),
                    qkv_bias: l.qkv_bias().map(|t| host(be, t)),
                    q_norm: l.q_norm().map(|t| host(be, t)),
                    k_norm: l.k_norm().map(|t| host(be, t)),
                    o_proj: host(be, l.o_proj()),
                    post_norm: l.post_norm().map(|t| host(be, t)),
                    attn_out_norm: l.attn_out_norm().map(|t| host(be, t)),
                    mlp_out_norm: l.mlp_out_norm().map(|t| host(be, t)),
                    gate_up: host(be, l.gate_up()),
                    down: host(be, l.down()),
                    router: l.router().map(|t| host(be, t)),
                    shared: l
                        .shared()
                        .map(|s| [host(be, &s.gate_up), host(be, &s.gate), host(be, &s.down)]),
                })
                .collect(),
            norm: host(be, &w.norm),
            lm_head: host(be, &w.lm_head),
        }
    }

    /// Logits of the last token of `tokens`, computing the whole sequence from scratch.
    fn last_logits(&self, tokens: &[u32]) -> Vec<f64> {
        let c = &self.cfg;
        let h = c.hidden_size;
        // Gemma scales the embedding by sqrt(hidden).
        let scale = if c.embed_scale {
            (h as f64).sqrt()
        } else {
            1.0
        };
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                self.embed[t as usize * h..(t as usize + 1) * h]
                    .iter()
                    .map(|v| v * scale)
                    .collect()
            })
            .collect();
        for (li, lw) in self.layers.iter().enumerate() {
            let qkv: Vec<[Vec<f64>; 3]> = x
                .iter()
                .enumerate()
                .map(|(p, xp)| self.qkv(li, lw, xp, p))
                .collect();
            for (p, xp) in x.iter_mut().enumerate() {
                let attn = self.attention(li, &qkv, p);
                let mut o = linear(&attn, &lw.o_proj, 0, h, c.num_heads * c.head_dim);
                if let Some(w) = &lw.attn_out_norm {
                    o = self.norm(&o, w);
                }
                xp.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                let mut d = self.mlp(lw, xp);
                if let Some(w) = &lw.mlp_out_norm {
                    d = self.norm(&d, w);
                }
                xp.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
            }
        }
        let last = self.norm(&x[tokens.len() - 1], &self.norm);
        let logits = linear(&last, &self.lm_head, 0, c.vocab_size, h);
        match c.final_softcap {
            Some(cap) => logits.iter().map(|&l| softcap(l, cap)).collect(),
            None => logits,
        }
    }

    /// RMS norm of `x` with weight `w`, or `x` itself without one.
    fn maybe_norm(&self, x: &[f64], w: Option<&[f64]>) -> Vec<f64> {
        w.map_or_else(|| x.to_vec(), |w| self.norm(x, w))
    }

    /// RMS norm of `x` with weight `w`.
    fn norm(&self, x: &[f64], w: &[f64]) -> Vec<f64> {
        let eps = self.cfg.rms_norm_eps as f64;
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter().zip(w).map(|(v, g)| v * r * g).collect()
    }

    /// Rotary embedding of one head `v` of layer `li` at position `pos`.
    /// LongRoPE runs here with an original context of 0 (every sequence holds more: the
    /// long factors throughout) or one past every sequence (the short ones throughout).
    fn rope(&self, li: usize, v: &mut [f64], pos: usize) {
        let rope = self.cfg.layer_rope(li);
        let half = rope.rot_dim / 2;
        let m = rope.attention_factor();
        for (i, f) in rope
            .inv_freq_of(rope.long_rope() == Some(0))
            .iter()
            .enumerate()
        {
            let ang = pos as f64 * f;
            let (s, co) = ang.sin_cos();
            let (s, co) = (s * m, co * m);
            let (a, b) = (v[i], v[i + half]);
            v[i] = a * co - b * s;
            v[i + half] = b * co + a * s;
        }
    }

    /// The query, key and value of the token at position `p` with hidden state `xp`
    /// (bias, q/k norm and, where the layer `rotates`, rope applied).
    fn qkv(&self, li: usize, lw: &RefLayer, xp: &[f64], p: usize) -> [Vec<f64>; 3] {
        let rotates = !self.cfg.no_rope_layers.contains(&li);
        let c = &self.cfg;
        let (h, nh, kvh, hd) = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim);
        let hn = self.maybe_norm(xp, lw.input_norm.as_deref());
        let mut q = linear(&hn, &lw.qkv, 0, nh * hd, h);
        let mut k = linear(&hn, &lw.qkv, nh * hd, kvh * hd, h);
        let mut v = linear(&hn, &lw.qkv, (nh + kvh) * hd, kvh * hd, h);
        if let Some(b) = &lw.qkv_bias {
            q.iter_mut().zip(&b[..nh * hd]).for_each(|(a, b)| *a += b);
            k.iter_mut()
                .zip(&b[nh * hd..(nh + kvh) * hd])
                .for_each(|(a, b)| *a += b);
            v.iter_mut()
                .zip(&b[(nh + kvh) * hd..])
                .for_each(|(a, b)| *a += b);
        }
        // OLMo 2's q and k norms span all their heads.
        let whole = c.qk_norm_whole();
        for (x, norm) in [(&mut q, &lw.q_norm), (&mut k, &lw.k_norm)] {
            if let (true, Some(w)) = (whole, norm) {
                *x = self.norm(x, w);
            }
            let head_norm = norm.as_ref().filter(|_| !whole);
            for head in x.chunks_mut(hd) {
                if let Some(w) = head_norm {
                    let n = self.norm(head, w);
                    head.copy_from_slice(&n);
                }
                if rotates {
                    self.rope(li, head, p);
                }
            }
        }
        [q, k, v]
    }

    /// Causal attention output of position `p` in layer `li` over the keys and values of
    /// `qkv` (within the layer's window).
    fn attention(&self, li: usize, qkv: &[[Vec<f64>; 3]], p: usize) -> Vec<f64> {
        let c = &self.cfg;
        let (nh, kvh, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        // Gemma's query scalar: in q's norm weight where it has one, else here.
        let query = if c.qk_norm { 1.0 } else { c.query_scale as f64 };
        let scale = query / (hd as f64).sqrt();
        let mut attn = vec![0.0; nh * hd];
        for head in 0..nh {
            let g = head / (nh / kvh);
            let q = &qkv[p][0][head * hd..(head + 1) * hd];
            // The window: keys t with p - w < t <= p (transformers' semantics).
            let first = c.layer_window(li).map_or(0, |w| (p + 1).saturating_sub(w));
            let scores: Vec<f64> = (first..=p)
                .map(|t| (0..hd).map(|d| q[d] * qkv[t][1][g * hd + d]).sum::<f64>() * scale)
                .map(|s| c.attn_softcap.map_or(s, |cap| softcap(s, cap)))
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for (t, et) in (first..).zip(&e) {
                for d in 0..hd {
                    attn[head * hd + d] += et / z * qkv[t][2][g * hd + d];
                }
            }
        }
        attn
    }

    /// The SwiGLU MLP of hidden state `xp` (post-attention norm applied); in a sparse
    /// layer, the top-k experts' (softmax of the router, ties to the lower index,
    /// renormalised where the config says) weighted sum.
    fn mlp(&self, lw: &RefLayer, xp: &[f64]) -> Vec<f64> {
        let (h, inter) = (self.cfg.hidden_size, self.cfg.intermediate_size);
        let hn = self.maybe_norm(xp, lw.post_norm.as_deref());
        if let (Some(router), Some(moe)) = (&lw.router, &self.cfg.moe) {
            let (e, ei) = (moe.num_experts, moe.expert_intermediate);
            let logits = linear(&hn, router, 0, e, h);
            let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = logits.iter().map(|l| (l - mx).exp()).collect();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let top = &order[..moe.top_k];
            let total: f64 = if moe.norm_topk_prob {
                top.iter().map(|&x| p[x]).sum()
            } else {
                p.iter().sum()
            };
            let mut out = vec![0.0; h];
            for &x in top {
                let g = linear(&hn, &lw.gate_up, x * ei, ei, h);
                let u = linear(&hn, &lw.gate_up, (e + x) * ei, ei, h);
                let act: Vec<f64> = (0..ei)
                    .map(|j| g[j] / (1.0 + (-g[j]).exp()) * u[j])
                    .collect();
                let y = linear(&act, &lw.down, x * h, h, ei);
                for (o, y) in out.iter_mut().zip(y) {
                    *o += p[x] / total * y;
                }
            }
            if let (Some([gu, gate, down]), Some(s)) = (&lw.shared, moe.shared_expert_intermediate)
            {
                let gu = linear(&hn, gu, 0, 2 * s, h);
                let act: Vec<f64> = (0..s)
                    .map(|j| gu[j] / (1.0 + (-gu[j]).exp()) * gu[s + j])
                    .collect();
                let y = linear(&act, down, 0, h, s);
                let g = linear(&hn, gate, 0, 1, h)[0];
                let sig = 1.0 / (1.0 + (-g).exp());
                for (o, y) in out.iter_mut().zip(y) {
                    *o += sig * y;
                }
            }
            return out;
        }
        let gu = linear(&hn, &lw.gate_up, 0, 2 * inter, h);
        let name = self.cfg.hidden_act.hf_name();
        let act: Vec<f64> = (0..inter)
            .map(|j| activation(name, gu[j]) * gu[inter + j])
            .collect();
        linear(&act, &lw.down, 0, h, inter)
    }
}

/// HF's `ACT2FN[name](x)`, written out in f64.
/// Gemma 2's soft-capping: `cap * tanh(x / cap)`.
fn softcap(x: f64, cap: f32) -> f64 {
    let cap = cap as f64;
    cap * (x / cap).tanh()
}

fn activation(name: &str, x: f64) -> f64 {
    match name {
        "silu" => x / (1.0 + (-x).exp()),
        "gelu_pytorch_tanh" => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        // erf by its series (|x| here is small: normed activations times small weights).
        "gelu" => {
            let z = x / std::f64::consts::SQRT_2;
            let (mut term, mut sum) = (z, z);
            for n in 1..60 {
                term *= -z * z / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            0.5 * x * (1.0 + 2.0 / std::f64::consts::PI.sqrt() * sum)
        }
        "relu2" => x.max(0.0).powi(2),
        other => panic!("no reference for {other}"),
    }
}

/// `y[j] = sum_i x[i] * w[row0 + j][i]` for `rows` rows of `k` columns.
fn linear(x: &[f64], w: &[f64], row0: usize, rows: usize, k: usize) -> Vec<f64> {
    (0..rows)
        .map(|j| (0..k).map(|i| x[i] * w[(row0 + j) * k + i]).sum())
        .collect()
}

/// One sequence of the test: its tokens so far and the blocks it owns.
struct Seq {
    tokens: Vec<u32>,
    in_cache: usize,
    blocks: Vec<i32>,
}

/// Build and run one step in which sequence `i` adds `new[i]` tokens (0: not in the batch).
fn step(
    be: &dyn Backend,
    model: &Model,
    arena: &mut Arena,
    kv: &KvCache,
    seqs: &mut [Seq],
    new: &[&[u32]],
    decode_only: bool,
) -> Vec<Vec<f32>> {
    let mut ids = Vec::new();
    let mut pos = Vec::new();
    let mut slots = Vec::new();
    let mut tables = Vec::new();
    let mut lens = Vec::new();
    let mut cu = vec![0i32];
    let mut last = Vec::new();
    for (s, toks) in seqs.iter_mut().zip(new) {
        if toks.is_empty() {
            continue;
        }
        // LongRoPE: the runner's rule (`Packer::pack`).
        let shift = match model.long_rope() {
            Some((orig, rows)) if s.in_cache + toks.len() > orig => rows,
            _ => 0,
        };
        for (j, &t) in toks.iter().enumerate() {
            let p = s.in_cache + j;
            ids.push(t as i32);
            pos.push((shift + p) as i32);
            slots.push(s.blocks[p / BLOCK] * BLOCK as i32 + (p % BLOCK) as i32);
        }
        s.tokens.extend_from_slice(toks);
        s.in_cache += toks.len();
        let mut row = s.blocks.clone();
        row.resize(MAX_BLOCKS_PER_SEQ, 0);
        tables.extend(row);
        lens.push(s.in_cache as i32);
        cu.push(ids.len() as i32);
        last.push(ids.len() as i32 - 1);
    }
    let (n, b) = (ids.len(), lens.len());
    let t_ids = be.upload(&ids, &[n]).unwrap();
    let t_pos = be.upload(&pos, &[n]).unwrap();
    let t_slots = be.upload(&slots, &[n]).unwrap();
    let t_tables = be.upload(&tables, &[b, MAX_BLOCKS_PER_SEQ]).unwrap();
    let t_lens = be.upload(&lens, &[b]).unwrap();
    let t_cu = be.upload(&cu, &[b + 1]).unwrap();
    let t_last = be.upload(&last, &[b]).unwrap();
    arena.reset();
    let logits = model
        .forward(
            be,
            arena,
            kv,
            &StepInputs {
                token_ids: &t_ids,
                positions: &t_pos,
                slot_mapping: &t_slots,
                block_tables: &t_tables,
                seq_lens: &t_lens,
                cu_seqlens_q: if decode_only { None } else { Some(&t_cu) },
                logits_indices: &t_last,
                split: None,
            },
        )
        .unwrap();
    let v = be.download::<f32>(&logits).unwrap();
    v.chunks(model.cfg.vocab_size).map(|r| r.to_vec()).collect()
}

fn rel_err(a: &[f32], r: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(r).map(|(&x, y)| (x as f64 - y).powi(2)).sum();
    let den: f64 = r.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

fn check_arch(name: &str, dtype: DType, tol: f64) {
    check_config(name, ModelConfig::dummy(name).unwrap(), dtype, tol)
}

/// One step of [`check_config`]: the new tokens of each sequence, decode only, the
/// sequences whose logits are checked, and what the step is.
type Step<'a> = ([&'a [u32]; 4], bool, &'a [usize], &'a str);

fn check_config(name: &str, cfg: ModelConfig, dtype: DType, tol: f64) {
    let cpu = CpuBackend::new();
    let be: &dyn Backend = &cpu;
    let w = weights::load(
        be,
        &cfg,
        WeightSource::Dummy { seed: 7 },
        dtype,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    let reference = RefModel::new(be, &cfg, &w);
    let model = Model::new(be, cfg.clone(), w, 64).unwrap();
    let kv_cfg = KvCacheConfig {
        num_layers: cfg.num_layers,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        block_size: BLOCK,
        dtype,
    };
    let num_blocks = 1 + 4 * MAX_BLOCKS_PER_SEQ;
    let kv = KvCache::new(be, kv_cfg, num_blocks).unwrap();
    let mut arena =
        Arena::new(be, model.arena_bytes(be, 32, 4, MAX_BLOCKS_PER_SEQ, BLOCK)).unwrap();
    let mut seqs: Vec<Seq> = (0..4)
        .map(|s| Seq {
            tokens: Vec::new(),
            in_cache: 0,
            // Interleaved, non-contiguous block ids; block 0 stays unused (padding).
            blocks: (0..MAX_BLOCKS_PER_SEQ)
                .map(|j| (1 + j * 4 + s) as i32)
                .collect(),
        })
        .collect();
    let v = cfg.vocab_size as u32;
    let toks =
        |k: u32, len: u32| -> Vec<u32> { (0..len).map(|i| (k * 31 + i * 17 + 3) % v).collect() };
    let (a, b, c, d) = (toks(1, 5), toks(2, 17), toks(3, 1), toks(4, 12));
    let check = |out: Vec<Vec<f32>>, which: &[usize], seqs: &[Seq], what: &str| {
        for (row, &s) in out.iter().zip(which) {
            let r = reference.last_logits(&seqs[s].tokens);
            let e = rel_err(row, &r);
            assert!(
                e < tol,
                "{name} {dtype} {what}: seq {s} error {e:.2e} > {tol:.0e}"
            );
        }
    };
    // (new tokens per sequence, decode only, the sequences in the batch, what the step is).
    let (d1, d2) = (&d[..7], &d[7..]);
    let steps: [Step<'_>; 5] = [
        // Three prompts of different lengths prefilled in one batch (b crosses blocks).
        ([&a, &b, &c, &[]], false, &[0, 1, 2], "prefill"),
        // Pure decode (no cu_seqlens), crossing a block boundary for seq 1.
        ([&[1], &[2], &[3], &[]], true, &[0, 1, 2], "decode"),
        ([&[2], &[3], &[4], &[]], true, &[0, 1, 2], "decode"),
        // Mixed: decode for 0 and 2, first chunk of a new prompt for 3.
        ([&[9], &[], &[8], d1], false, &[0, 2, 3], "mixed"),
        // The second chunk of seq 3's prompt attends to the first chunk in the cache.
        ([&[], &[5], &[], d2], false, &[1, 3], "chunked prefill"),
    ];
    for (new, decode_only, which, what) in steps {
        let out = step(be, &model, &mut arena, &kv, &mut seqs, &new, decode_only);
        check(out, which, &seqs, what);
    }
}

#[test]
fn llama_matches_f64_reference() {
    check_arch("tiny", DType::F32, 1e-4);
}

#[test]
fn llama3_rope_scaling_matches_f64_reference() {
    check_arch("tiny-llama3", DType::F32, 1e-4);
}

#[test]
fn qwen2_bias_and_tied_embeddings_match_f64_reference() {
    check_arch("tiny-qwen2", DType::F32, 1e-4);
}

#[test]
fn qwen3_qk_norm_matches_f64_reference() {
    check_arch("tiny-qwen3", DType::F32, 1e-4);
}

#[test]
fn qwen3_moe_with_a_dense_layer_matches_f64_reference() {
    check_arch("tiny-qwen3-moe", DType::F32, 1e-4);
}

#[test]
fn qwen2_moe_shared_expert_matches_f64_reference() {
    check_arch("tiny-qwen2-moe", DType::F32, 1e-4);
}

#[test]
fn smollm3_nope_layers_match_f64_reference() {
    check_arch("tiny-smollm3", DType::F32, 1e-4);
}

#[test]
fn phi3_fused_projections_partial_rotary_and_window_match_f64_reference() {
    check_arch("tiny-phi3", DType::F32, 1e-4);
}

/// The gated MLP's other activations (Gemma's tanh GELU, the erf GELU, ReLU^2), on the
/// CPU against the f64 reference: each runs as a matmul and `act_mul`.
#[test]
fn other_activations_match_f64_reference() {
    use encore_core::backend::Activation;
    for act in [Activation::GeluTanh, Activation::Gelu, Activation::Relu2] {
        let cfg = ModelConfig {
            hidden_act: act,
            ..ModelConfig::dummy("tiny").unwrap()
        };
        check_config(act.hf_name(), cfg, DType::F32, 1e-4);
    }
}

/// Linear and YaRN rope scaling (the frequencies, and YaRN's factor on cos and sin) on
/// the CPU against the f64 reference.
#[test]
fn linear_and_yarn_rope_scaling_match_f64_reference() {
    use encore_core::ops::{RopeScaling, YarnScaling};
    let tiny = ModelConfig::dummy("tiny").unwrap();
    for (name, scaling) in [
        ("linear", RopeScaling::Linear { factor: 4.0 }),
        (
            "yarn",
            RopeScaling::Yarn(YarnScaling {
                factor: 4.0,
                original_max_position_embeddings: 16,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 1.1386,
                truncate: true,
            }),
        ),
    ] {
        let mut cfg = tiny.clone();
        cfg.rope.scaling = Some(scaling);
        check_config(name, cfg, DType::F32, 1e-4);
    }
}

/// LongRoPE (Phi-3.5, Phi-4-mini): the short factors for sequences within the original
/// context, the long ones (from the table's second half) past it, and the attention
/// factor on cos and sin, on tiny-phi3's partial rotary against the f64 reference.
#[test]
fn longrope_matches_f64_reference() {
    use encore_core::ops::{LongRopeScaling, RopeScaling, LONGROPE_MAX_FREQS};
    let phi3 = ModelConfig::dummy("tiny-phi3").unwrap();
    let half = phi3.rope.rot_dim / 2;
    let mut short = [1.0f32; LONGROPE_MAX_FREQS];
    let mut long = [1.0f32; LONGROPE_MAX_FREQS];
    for i in 0..half {
        short[i] = 1.0 + 0.05 * i as f32;
        long[i] = 1.0 + 0.9 * i as f32;
    }
    for (name, original) in [("longrope short", 1 << 20), ("longrope long", 0)] {
        let mut cfg = phi3.clone();
        cfg.rope.scaling = Some(RopeScaling::LongRope(LongRopeScaling {
            short,
            long,
            original_max_position_embeddings: original,
            attention_factor: 1.19,
        }));
        check_config(name, cfg, DType::F32, 1e-4);
    }
}

/// A window on alternate layers (`layer_types`: gpt-oss's pattern) against the f64
/// reference, windows short enough that the prompts cross them.
#[test]
fn alternating_windows_match_f64_reference() {
    use encore_core::model::config::SlidingWindow;
    let cfg = ModelConfig {
        sliding_window: Some(SlidingWindow {
            size: 5,
            first_layer: 0,
        }),
        full_attention_layers: vec![1, 3],
        ..ModelConfig::dummy("tiny").unwrap()
    };
    check_config("alternating windows", cfg, DType::F32, 1e-4);
}

/// Gemma's layer recipe on tiny: post norms (the attention's and the MLP's outputs
/// normed before the residual add) and the embedding times sqrt(hidden), on the CPU
/// against the f64 reference.
#[test]
fn post_norms_and_embedding_scale_match_f64_reference() {
    let cfg = ModelConfig {
        post_norms: true,
        embed_scale: true,
        ..ModelConfig::dummy("tiny").unwrap()
    };
    check_config("post norms", cfg, DType::F32, 1e-4);
}

/// Gemma 3's rotary: the windowed layers rotate with their own base (10,000) and the full
/// ones with the global base and its scaling, against the f64 reference.
#[test]
fn local_rotary_of_windowed_layers_matches_f64_reference() {
    use encore_core::model::config::SlidingWindow;
    use encore_core::ops::{RopeConfig, RopeScaling};
    let tiny = ModelConfig::dummy("tiny").unwrap();
    let cfg = ModelConfig {
        sliding_window: Some(SlidingWindow {
            size: 6,
            first_layer: 0,
        }),
        full_attention_layers: vec![3],
        rope: RopeConfig {
            theta: 1_000_000.0,
            scaling: Some(RopeScaling::Linear { factor: 8.0 }),
            ..tiny.rope
        },
        rope_local: Some(tiny.rope),
        ..tiny.clone()
    };
    check_config("local rotary", cfg, DType::F32, 1e-4);
}

#[test]
fn gemma3_matches_f64_reference() {
    check_arch("tiny-gemma3", DType::F32, 1e-4);
}

/// OLMo 2: norms after attention and the MLP only, q and k normed across their heads.
#[test]
fn olmo2_matches_f64_reference() {
    check_arch("tiny-olmo2", DType::F32, 1e-4);
}

/// Gemma 2: its query scalar in the softmax scale, attention and final logit
/// soft-capping, windows on every other layer.
#[test]
fn gemma2_matches_f64_reference() {
    check_arch("tiny-gemma2", DType::F32, 1e-4);
}

/// Gemma's checkpoint norms are offsets from 1: the loader stores `1 + w` (q's norm times
/// the query scale) and leaves every other tensor as it is.
#[test]
fn gemma_norms_load_as_one_plus_w() {
    let cpu = CpuBackend::new();
    let be: &dyn Backend = &cpu;
    let gemma = ModelConfig::dummy("tiny-gemma3").unwrap();
    let plain = ModelConfig {
        norm_plus_one: false,
        norm_kind: encore_core::model::config::NormKind::Rms,
        query_scale: 1.0,
        ..gemma.clone()
    };
    let load = |cfg: &ModelConfig| {
        weights::load(
            be,
            cfg,
            WeightSource::Dummy { seed: 3 },
            DType::F32,
            &encore_core::progress::NoProgress,
        )
        .unwrap()
    };
    let (g, p) = (load(&gemma), load(&plain));
    let (gl, pl) = (&g.layers[1], &p.layers[1]);
    let pairs = [
        (gl.input_norm().unwrap(), pl.input_norm().unwrap(), 1.0),
        (gl.post_norm().unwrap(), pl.post_norm().unwrap(), 1.0),
        (
            gl.attn_out_norm().unwrap(),
            pl.attn_out_norm().unwrap(),
            1.0,
        ),
        (gl.mlp_out_norm().unwrap(), pl.mlp_out_norm().unwrap(), 1.0),
        (gl.k_norm().unwrap(), pl.k_norm().unwrap(), 1.0),
        (
            gl.q_norm().unwrap(),
            pl.q_norm().unwrap(),
            gemma.query_scale,
        ),
        (&g.norm, &p.norm, 1.0),
    ];
    for (i, (a, b, s)) in pairs.into_iter().enumerate() {
        let (a, b) = (be.download_f32(a).unwrap(), be.download_f32(b).unwrap());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(*x, (1.0 + y) * s, "norm {i}");
        }
    }
    assert_eq!(
        be.download_f32(g.layers[0].qkv()).unwrap(),
        be.download_f32(p.layers[0].qkv()).unwrap()
    );
}

#[test]
fn mixtral_matches_f64_reference() {
    check_arch("tiny-mixtral", DType::F32, 1e-4);
}

#[test]
fn moe_bf16_run_stays_close_to_f64_reference() {
    check_arch("tiny-qwen3-moe", DType::BF16, 5e-2);
}

#[test]
fn bf16_run_stays_close_to_f64_reference() {
    check_arch("tiny", DType::BF16, 5e-2);
}

/// Tiny Qwen2 with a 5-position sliding window from layer 1 on (layer 0 attends fully),
/// as a `use_sliding_window` config with `max_window_layers = 1` parses.
fn windowed_qwen2() -> ModelConfig {
    ModelConfig {
        sliding_window: Some(SlidingWindow {
            size: 5,
            first_layer: 1,
        }),
        weights: Default::default(),
        ..ModelConfig::dummy("tiny-qwen2").unwrap()
    }
}

#[test]
fn qwen2_sliding_window_matches_f64_reference() {
    check_config("tiny-qwen2 window 5", windowed_qwen2(), DType::F32, 1e-4);
}

/// Last-token logits of each prompt, all prefilled in one step.
fn prefill_logits(cfg: &ModelConfig, prompts: &[&[u32]]) -> Vec<Vec<f32>> {
    prefill_logits_routed(cfg, prompts, None)
}

/// [`prefill_logits`] with the sparse layers routed by a synthetic table.
fn prefill_logits_routed(
    cfg: &ModelConfig,
    prompts: &[&[u32]],
    skew: Option<encore_core::model::routing::RouterSkew>,
) -> Vec<Vec<f32>> {
    let cpu = CpuBackend::new();
    let be: &dyn Backend = &cpu;
    let w = weights::load(
        be,
        cfg,
        WeightSource::Dummy { seed: 7 },
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    let mut model = Model::new(be, cfg.clone(), w, 64).unwrap();
    model.set_router_skew(be, skew, 48).unwrap();
    let kv_cfg = KvCacheConfig {
        num_layers: cfg.num_layers,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        block_size: BLOCK,
        dtype: DType::F32,
    };
    let kv = KvCache::new(be, kv_cfg, 1 + prompts.len() * MAX_BLOCKS_PER_SEQ).unwrap();
    let mut arena = Arena::new(
        be,
        model.arena_bytes(be, 48, prompts.len(), MAX_BLOCKS_PER_SEQ, BLOCK),
    )
    .unwrap();
    let mut seqs: Vec<Seq> = (0..prompts.len())
        .map(|s| Seq {
            tokens: Vec::new(),
            in_cache: 0,
            blocks: (0..MAX_BLOCKS_PER_SEQ)
                .map(|j| (1 + s * MAX_BLOCKS_PER_SEQ + j) as i32)
                .collect(),
        })
        .collect();
    step(be, &model, &mut arena, &kv, &mut seqs, prompts, false)
}

#[test]
fn sliding_window_changes_logits_only_past_the_window() {
    let windowed = windowed_qwen2();
    let full = ModelConfig {
        sliding_window: None,
        weights: Default::default(),
        ..windowed.clone()
    };
    let prompt: Vec<u32> = (0..17).map(|i| (i * 37 + 5) % 512).collect();
    let prompts: [&[u32]; 3] = [&prompt[..5], &prompt[..6], &prompt];
    let (a, b) = (
        prefill_logits(&windowed, &prompts),
        prefill_logits(&full, &prompts),
    );
    // 5 tokens: every query's window holds its whole context, bit for bit the same run.
    assert_eq!(a[0], b[0]);
    // 6 and 17 tokens: the last queries no longer see position 0 (and more) in layers 1..
    for s in [1, 2] {
        let r: Vec<f64> = b[s].iter().map(|&v| v as f64).collect();
        let e = rel_err(&a[s], &r);
        assert!(
            e > 1e-3,
            "seq {s}: windowed and full logits differ by only {e:.1e}"
        );
    }
}

/// `--router-skew` replaces the routers' choice: the logits change, the same skew gives the
/// same logits again, another skew other logits; a dense model refuses it, naming the
/// option.
#[test]
fn a_router_skew_routes_by_its_table() {
    use encore_core::model::routing::RouterSkew;
    let cfg = ModelConfig::dummy("tiny-qwen3-moe").unwrap();
    let prompts: [&[u32]; 2] = [&[3, 9, 27, 81, 5], &[7, 1, 4]];
    let routers = prefill_logits(&cfg, &prompts);
    let uniform = prefill_logits_routed(&cfg, &prompts, Some(RouterSkew::new(0.0).unwrap()));
    let again = prefill_logits_routed(&cfg, &prompts, Some(RouterSkew::new(0.0).unwrap()));
    let skewed = prefill_logits_routed(&cfg, &prompts, Some(RouterSkew::new(2.0).unwrap()));
    assert_eq!(uniform, again);
    assert_ne!(uniform, routers);
    assert_ne!(uniform, skewed);
    assert!(uniform.iter().flatten().all(|v| v.is_finite()));
    let dense = ModelConfig::dummy("tiny").unwrap();
    let be = CpuBackend::new();
    let w = weights::load(
        &be,
        &dense,
        WeightSource::Dummy { seed: 7 },
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    let mut model = Model::new(&be, dense, w, 64).unwrap();
    let err = model
        .set_router_skew(&be, Some(RouterSkew::new(1.0).unwrap()), 8)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--router-skew") && err.contains("no experts"),
        "{err}"
    );
}
