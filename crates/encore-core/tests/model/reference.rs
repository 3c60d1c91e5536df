//! The f64 reference model: the architecture written naively from the HF definitions over
//! a host copy of the loaded weights.

use encore_core::model::config::{ModelConfig, NormKind};
use encore_core::model::decl::Role;
use encore_core::model::weights::ModelWeights;
use encore_core::Backend;

/// Host copy of the weights in f64, plus the config.
pub struct RefModel {
    cfg: ModelConfig,
    embed: Vec<f64>,
    layers: Vec<RefLayer>,
    norm: Vec<f64>,
    /// LayerNorms (StableLM): the final norm's bias.
    norm_bias: Option<Vec<f64>>,
    lm_head: Vec<f64>,
}

struct RefLayer {
    /// `None`: the block reads the residual stream itself (OLMo 2).
    input_norm: Option<Vec<f64>>,
    /// LayerNorms: the input and post-attention norms' biases.
    input_bias: Option<Vec<f64>>,
    post_bias: Option<Vec<f64>>,
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
    pub fn new(be: &dyn Backend, cfg: &ModelConfig, w: &ModelWeights) -> Self {
        RefModel {
            cfg: cfg.clone(),
            embed: host(be, &w.embed),
            layers: w
                .layers
                .iter()
                .map(|l| RefLayer {
                    input_norm: l.input_norm().map(|t| host(be, t)),
                    input_bias: l.get(Role::AttnNormBias).map(|t| host(be, t)),
                    post_bias: l.get(Role::MlpNormBias).map(|t| host(be, t)),
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
            norm_bias: w.norm_bias.as_ref().map(|t| host(be, t)),
            lm_head: host(be, &w.lm_head),
        }
    }

    /// Logits of the last token of `tokens`, computing the whole sequence from scratch.
    pub fn last_logits(&self, tokens: &[u32]) -> Vec<f64> {
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
        let last = self.maybe_norm(
            &x[tokens.len() - 1],
            Some(&self.norm),
            self.norm_bias.as_deref(),
        );
        let logits = linear(&last, &self.lm_head, 0, c.vocab_size, h);
        match c.final_softcap {
            Some(cap) => logits.iter().map(|&l| softcap(l, cap)).collect(),
            None => logits,
        }
    }

    /// A block norm of `x` with weight `w` (RMSNorm, or the config's LayerNorm with bias
    /// `b`), or `x` itself without one.
    fn maybe_norm(&self, x: &[f64], w: Option<&[f64]>, b: Option<&[f64]>) -> Vec<f64> {
        match (w, b, self.cfg.norm_kind) {
            (None, ..) => x.to_vec(),
            (Some(w), None, NormKind::Rms) => self.norm(x, w),
            (Some(w), Some(b), NormKind::LayerBias) => {
                let eps = self.cfg.rms_norm_eps as f64;
                let n = x.len() as f64;
                let mean = x.iter().sum::<f64>() / n;
                let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
                let r = 1.0 / (var + eps).sqrt();
                let wb = w.iter().zip(b);
                x.iter()
                    .zip(wb)
                    .map(|(v, (g, b))| (v - mean) * r * g + b)
                    .collect()
            }
            (_, b, kind) => panic!("a {kind:?} norm with a bias: {}", b.is_some()),
        }
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
        let hn = self.maybe_norm(xp, lw.input_norm.as_deref(), lw.input_bias.as_deref());
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
        let hn = self.maybe_norm(xp, lw.post_norm.as_deref(), lw.post_bias.as_deref());
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
