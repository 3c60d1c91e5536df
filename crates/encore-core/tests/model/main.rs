//! The forward pass against a naive f64 implementation of the same architecture written
//! here from the HF definitions, for every architecture variant (plain Llama, Llama-3 rope
//! scaling, Qwen2 qkv bias + tied embeddings, Qwen3 q/k norm, sliding-window attention,
//! StableLM's LayerNorms with a bias, ...; the reference in `reference.rs`),
//! over steps that mix prefill, chunked prefill and decode in one batch, with sequences
//! crossing KV blocks.

use encore_core::backend::cpu::CpuBackend;
use encore_core::kv::{KvCache, KvCacheConfig};
use encore_core::memory::Arena;
use encore_core::model::config::{ModelConfig, SlidingWindow};
use encore_core::model::llama::{Model, StepInputs};
use encore_core::model::weights::{self, WeightSource};
use encore_core::{Backend, DType};

mod reference;
use reference::RefModel;

const BLOCK: usize = 8;
const MAX_BLOCKS_PER_SEQ: usize = 6;

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

/// StableLM: LayerNorms with a bias before attention, before the MLP and at the end, a
/// quarter of each head rotating, q/k/v biases, heads of 24 in a hidden of 96; bf16 too.
#[test]
fn stablelm_matches_f64_reference() {
    check_arch("tiny-stablelm", DType::F32, 1e-4);
    check_arch("tiny-stablelm", DType::BF16, 3e-2);
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
