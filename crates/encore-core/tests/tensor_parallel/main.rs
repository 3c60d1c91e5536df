//! Tensor parallelism on the CPU twin: N CPU ranks in threads, each with its shard of the
//! model (heads, KV heads, MLP width and vocabulary split as Megatron splits them), the
//! collectives in shared memory. Greedy generation over 2 and 4 ranks gives the tokens of
//! one rank, eagerly and with graphs (decode graphs and piecewise prefill), with chunked
//! prefill and mixed steps, for dense models and mixtures of experts (each expert split
//! as the dense MLP is, also under the expert cache); the logits agree to f32 rounding; a
//! model the group cannot split is refused naming both numbers; a rank that fails to start,
//! or fails or panics in a step, ends the start-up or the step with an error naming it,
//! never a hang.

use std::sync::Arc;

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::{Backend, BackendRef, Norm};
use encore_core::engine::{Engine, EngineConfig, KvSizing, TpBackends};
use encore_core::generate::{generate, GenerateOptions};
use encore_core::graph::BucketPolicy;
use encore_core::kv::SeqId;
use encore_core::model::config::ModelConfig;
use encore_core::model::{open_model, ModelFiles};
use encore_core::offload::{OffloadConfig, Policy, WeightBudget};
use encore_core::progress::NoProgress;
use encore_core::quant::QuantFormat;
use encore_core::request::SamplingParams;
use encore_core::runner::{GraphConfig, SeqStep, Seqs};
use encore_core::DType;

#[path = "../common/mod.rs"]
mod common;

mod collectives;
mod cuda;
mod faults;
mod gpt_oss;

use common::hooked::{FailArmed, Hooked};

fn config(graphs: bool) -> EngineConfig {
    EngineConfig {
        graphs: graphs.then_some(GraphConfig {
            decode: BucketPolicy::PowersOfTwo { max: 4 },
            mixed: BucketPolicy::PowersOfTwo { max: 32 },
            verify: 0,
        }),
        capture_all: graphs,
        run_name: "tp test".into(),
        ..EngineConfig::new(DType::F32, 16, 32, 4, 128, KvSizing::Blocks(1 + 4 * 8))
    }
}

use common::cpu_group as group;

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..45).map(|i| (i * 37 + 11) % 250).collect(),
        (0..7).map(|i| (i * 13 + 3) % 250).collect(),
        (0..20).map(|i| (i * 5 + 90) % 250).collect(),
    ]
}

fn greedy(model: &str, size: usize, graphs: bool) -> Vec<Vec<u32>> {
    greedy_with(model, size, graphs, None)
}

fn greedy_with(
    model: &str,
    size: usize,
    graphs: bool,
    offload: Option<OffloadConfig>,
) -> Vec<Vec<u32>> {
    let (be, tp) = group(size);
    let cfg = EngineConfig {
        tp,
        offload,
        ..config(graphs)
    };
    greedy_over(model, be, cfg, size, 12)
}

/// Greedy tokens (`max_tokens` each) for `prompts()` from an engine of `cfg` led by `be`
/// over `size` ranks.
fn greedy_over(
    model: &str,
    be: BackendRef,
    cfg: EngineConfig,
    size: usize,
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    greedy_of(open_model(model).unwrap(), be, cfg, size, max_tokens)
}

/// [`greedy_over`] of opened model files.
fn greedy_of(
    files: ModelFiles,
    be: BackendRef,
    cfg: EngineConfig,
    size: usize,
    max_tokens: usize,
) -> Vec<Vec<u32>> {
    let Engine { mut runner, .. } = Engine::new(be.as_ref(), files, &cfg, &NoProgress).unwrap();
    assert_eq!(runner.tp_size(), size);
    let opts = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
    };
    let out = generate(&mut runner, &prompts(), &[], &opts, &NoProgress, |_, _| {
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    out.into_iter().map(|g| g.output_ids).collect()
}

#[test]
fn greedy_tokens_over_2_and_4_ranks_equal_one_rank() {
    // tiny: 4 heads, 2 KV heads (split over 2 ranks, replicated over 4), MLP 352, vocab
    // 512; tiny-qwen3 adds q/k head norms and an explicit head_dim, tiny-qwen2 q/k/v
    // biases and tied embeddings.
    ranks_give_one_ranks_tokens(&["dummy:tiny", "dummy:tiny-qwen3", "dummy:tiny-qwen2"]);
}

/// Phi-3's fused qkv_proj and gate_up_proj: each rank cuts its q, k, v (gate, up) shares
/// out of the one checkpoint tensor, and 2 and 4 ranks give one rank's tokens (KV heads
/// replicated over 4), with its partial rotary and window.
#[test]
fn phi3_fused_projections_over_2_and_4_ranks_equal_one_rank() {
    ranks_give_one_ranks_tokens(&["dummy:tiny-phi3"]);
}

/// StableLM over ranks: its LayerNorms with a bias after each row-parallel projection's
/// sum over the ranks (`all_reduce_rms_norm` and `matmul_all_reduce_rms_norm` with a
/// LayerNorm), partial rotary, q/k/v biases cut per rank (KV heads replicated over 4).
#[test]
fn stablelm_layer_norms_over_2_and_4_ranks_equal_one_rank() {
    ranks_give_one_ranks_tokens(&["dummy:tiny-stablelm"]);
}

/// Gemma 3 and Gemma 2 over ranks: the post norms norm each row-parallel projection's
/// whole output (its sum over the ranks first), q/k head norms per rank's heads, the
/// embedding scale after the embedding's sum, each rank's logit columns soft-capped
/// (Gemma 2); 2 and 4 ranks give one rank's tokens (KV heads replicated over 4).
#[test]
fn gemma_post_norms_over_2_and_4_ranks_equal_one_rank() {
    ranks_give_one_ranks_tokens(&["dummy:tiny-gemma3", "dummy:tiny-gemma2"]);
}

/// A vocabulary the group does not divide (301 tokens over 2 and 4 ranks) is padded, as
/// vLLM pads it: each rank holds `ceil(301 / size)` rows of the embedding and LM head, zeros
/// past the vocabulary, and the gathered logits drop the padding; greedy tokens equal one
/// rank's, eagerly and replaying graphs, with an LM head of its own and with one tied to
/// the embedding.
#[test]
fn a_vocabulary_the_ranks_do_not_divide_is_padded_and_gives_one_ranks_tokens() {
    for (model, tied) in [("dummy:tiny", false), ("dummy:tiny-qwen2", true)] {
        let files = || {
            let mut f = open_model(model).unwrap();
            f.config.vocab_size = 301;
            assert_eq!(f.config.tie_word_embeddings, tied, "{model}");
            f
        };
        let shard = files().config.shard(3, 4).unwrap();
        assert_eq!(shard.vocab_rows(), 76, "{model}: 4 x 76 rows hold 301");
        for graphs in [false, true] {
            let run = |size: usize| {
                let (be, tp) = group(size);
                let cfg = EngineConfig {
                    tp,
                    ..config(graphs)
                };
                greedy_of(files(), be, cfg, size, 12)
            };
            let one = run(1);
            for size in [2, 4] {
                assert_eq!(run(size), one, "{model} over {size} ranks, graphs {graphs}");
            }
        }
    }
}

/// An FP8 KV cache splits with its heads: each rank's cache holds its KV heads in E4M3
/// (the same bytes one rank's cache holds for them), so 2 ranks give one rank's tokens,
/// eagerly and replaying graphs.
#[test]
fn greedy_tokens_over_an_fp8_kv_cache_over_2_ranks_equal_one_rank() {
    for graphs in [false, true] {
        let run = |size: usize| {
            let (be, tp) = group(size);
            let cfg = EngineConfig {
                tp,
                kv_cache_dtype: Some(DType::F8E4M3),
                ..config(graphs)
            };
            greedy_over("dummy:tiny", be, cfg, size, 12)
        };
        let one = run(1);
        assert_eq!(run(2), one, "graphs: {graphs}");
        assert_ne!(
            one,
            greedy("dummy:tiny", 1, graphs),
            "the FP8 cache changes nothing?"
        );
    }
}

#[test]
fn greedy_tokens_of_mixtures_of_experts_over_2_and_4_ranks_equal_one_rank() {
    // Every expert split as a dense MLP is (gate/up rows, down columns): tiny-qwen3-moe
    // (8 experts of 64, top 2, layer 0 dense), tiny-mixtral (4 experts of 352) and
    // tiny-qwen2-moe (6 experts of 64 and a gated shared expert of 96).
    ranks_give_one_ranks_tokens(&[
        "dummy:tiny-qwen3-moe",
        "dummy:tiny-mixtral",
        "dummy:tiny-qwen2-moe",
    ]);
}

/// Each model's greedy tokens over 2 and 4 ranks equal one rank's, eagerly and in graphs.
fn ranks_give_one_ranks_tokens(models: &[&str]) {
    for model in models {
        files_give_one_ranks_tokens(model, || open_model(model).unwrap());
    }
}

/// [`ranks_give_one_ranks_tokens`] of the model `files()` opens (`name` in messages).
fn files_give_one_ranks_tokens(name: &str, files: impl Fn() -> ModelFiles + Copy) {
    for graphs in [false, true] {
        let one = greedy_files(files, 1, graphs);
        for size in [2, 4] {
            assert_eq!(
                greedy_files(files, size, graphs),
                one,
                "{name}, {size} ranks, graphs {graphs}"
            );
        }
    }
}

#[test]
fn every_rank_routes_by_the_leaders_window_of_a_routing_table() {
    // `--router-skew`: each step routes by fresh rows of a seeded table; a follower takes
    // the rows the leader's step took, so the ranks' partial sums are of the same experts.
    let skew = encore_core::model::routing::RouterSkew::new(1.0).unwrap();
    for graphs in [false, true] {
        let run = |size: usize| {
            let (be, tp) = group(size);
            let cfg = EngineConfig {
                tp,
                router_skew: Some(skew),
                ..config(graphs)
            };
            greedy_over("dummy:tiny-mixtral", be, cfg, size, 12)
        };
        let one = run(1);
        assert_ne!(
            one,
            greedy("dummy:tiny-mixtral", 1, graphs),
            "the table routes"
        );
        for size in [2, 4] {
            assert_eq!(run(size), one, "{size} ranks, graphs {graphs}");
        }
    }
}

/// Greedy tokens of `model` over 1 and 2 ranks, each under `percent`% of its shard with
/// `policy`, equal one rank's with every weight resident (graphs).
fn budgeted_ranks_give_one_ranks_tokens(model: &str, percent: f64, policy: Policy) {
    let budget = || {
        Some(OffloadConfig {
            budget: WeightBudget::Percent(percent),
            policy,
            expert_prefetch: false,
        })
    };
    let one = greedy(model, 1, true);
    for size in [1, 2] {
        assert_eq!(
            greedy_with(model, size, true, budget()),
            one,
            "{model}, {size} ranks"
        );
    }
}

#[test]
fn each_rank_caches_its_share_of_the_experts_under_its_own_budget() {
    // The expert cache: every rank keeps its dense weights and the router resident and
    // fills its slots with its blocks of the chosen experts, inside the graphs.
    budgeted_ranks_give_one_ranks_tokens("dummy:tiny-qwen3-moe", 80.0, Policy::Experts);
}

/// `dummy:tiny` with an MLP width of 353: 176 + 177 over 2 ranks, so the last rank's
/// shard is the larger.
fn tiny_of_width_353() -> ModelFiles {
    let mut f = open_model("dummy:tiny").unwrap();
    f.config.intermediate_size = 353;
    f
}

/// A byte budget that holds rank 0's shard and not the last rank's, over 2 ranks in f32.
fn budget_between_the_shards() -> Option<OffloadConfig> {
    let c = tiny_of_width_353().config;
    let (small, large) = (c.shard(0, 2).unwrap(), c.shard(1, 2).unwrap());
    let bytes = small.weight_bytes(DType::F32);
    assert!(bytes < large.weight_bytes(DType::F32));
    Some(OffloadConfig {
        budget: WeightBudget::Bytes(bytes),
        policy: Policy::Planned,
        expert_prefetch: false,
    })
}

#[test]
fn a_rank_that_streams_nothing_leaves_the_fused_projections_when_a_peer_streams() {
    // Rank 0's shard fits the budget, the last rank's does not: rank 0 streams nothing but
    // must run its row-parallel projections as the streaming rank does (outside the fused
    // all-reduce; on CUDA the two paths wait for different signals and the group hung).
    let (be, tp) = group(2);
    let cfg = EngineConfig {
        tp,
        offload: budget_between_the_shards(),
        ..config(true)
    };
    let engine = Engine::new(be.as_ref(), tiny_of_width_353(), &cfg, &NoProgress).unwrap();
    assert!(engine.runner.model().offload().is_none());
    assert!(engine.runner.model().group_offloads());
    drop(engine);
    let (be, tp) = group(2);
    let cfg = EngineConfig {
        tp,
        offload: budget_between_the_shards(),
        ..config(true)
    };
    let (one, _) = group(1);
    assert_eq!(
        greedy_of(tiny_of_width_353(), be, cfg, 2, 12),
        greedy_of(tiny_of_width_353(), one, config(true), 1, 12)
    );
    // Alone, or with every rank resident, the projections stay fused.
    let (be, tp) = group(2);
    let cfg = EngineConfig { tp, ..config(true) };
    let engine = Engine::new(be.as_ref(), tiny_of_width_353(), &cfg, &NoProgress).unwrap();
    assert!(!engine.runner.model().group_offloads());
}

/// Greedy tokens of `files()` over `size` CPU ranks.
fn greedy_files(files: impl Fn() -> ModelFiles, size: usize, graphs: bool) -> Vec<Vec<u32>> {
    let (be, tp) = group(size);
    let cfg = EngineConfig {
        tp,
        ..config(graphs)
    };
    greedy_of(files(), be, cfg, size, 12)
}

#[test]
fn quantized_weights_split_in_whole_blocks_over_ranks_give_one_ranks_tokens() {
    // Every projection q8_0 (blocks of 32): each rank quantizes its block of every
    // weight as one device would and cuts its share, in whole blocks of the down
    // projection's rows: the dense layer's 352 (11 blocks) splits 160 + 192 over 2 ranks,
    // each expert's 64 (2 blocks) 32 + 32; over 4 ranks an expert has too few blocks.
    let files = || {
        let mut f = open_model("dummy:tiny-qwen3-moe").unwrap();
        f.config.weights.projections = Some(QuantFormat::Q8_0);
        f
    };
    for graphs in [false, true] {
        assert_eq!(
            greedy_files(files, 2, graphs),
            greedy_files(files, 1, graphs),
            "graphs {graphs}"
        );
    }
    let e = files().config.shard(0, 4).unwrap_err().to_string();
    assert!(
        e.contains("expert MLP width 64 (2 blocks of 32 values in q8_0)")
            && e.contains("--tensor-parallel-size 4"),
        "{e}"
    );
    // o_proj splits by heads: a share of them that is not whole blocks is refused when
    // the group is planned, naming the tensor (Qwen3-0.6B's shape: 16 heads of 128 in
    // Q4_K, blocks of 256; over 16 ranks a rank's 128 columns are half a block).
    let mut c = open_model("dummy:tiny").unwrap().config;
    c.weights.projections = Some(QuantFormat::Q4K);
    (c.num_heads, c.num_kv_heads, c.head_dim) = (16, 16, 128);
    (c.hidden_size, c.intermediate_size) = (2048, 16 * 256);
    assert!(c.shard(0, 8).is_ok());
    let e = c.shard(0, 16).unwrap_err().to_string();
    assert!(
        e.contains("o_proj") && e.contains("128 values") && e.contains("16 tensor-parallel"),
        "{e}"
    );
    // A dense width the ranks do not divide: shares one element apart (176 + 177).
    let uneven = tiny_of_width_353;
    let (a, b) = (uneven().config.shard(0, 2), uneven().config.shard(1, 2));
    assert_eq!(
        (a.unwrap().intermediate_size, b.unwrap().intermediate_size),
        (176, 177)
    );
    files_give_one_ranks_tokens("tiny of width 353", uneven);
}

#[test]
fn packed_integer_checkpoints_over_2_ranks_give_one_ranks_tokens() {
    // GPTQ (4 bits: Q4_0 blocks), AWQ (zero points: Q4_1) and compressed-tensors (8 bits:
    // Q8_0, the LM head packed too): each rank cuts its share of the kept blocks, in whole
    // blocks of 32 (o_proj's 256 columns as 128 + 128, down's 384 as 192 + 192).
    use common::checkpoint::model_dir;
    use common::packed::{checkpoints, Scheme};
    let json = |extra: &str| {
        format!(
            r#"{{"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 256,
  "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2,
  "torch_dtype": "bfloat16"{extra}}}"#
        )
    };
    let cfg = ModelConfig::from_json(&json(""), "twin").unwrap();
    let gptq = r#", "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": true, "desc_act": false}"#;
    let ct = r#", "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128}}}, "ignore": []}"#;
    let awq = r#", "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}"#;
    for (name, quant, bits, scheme) in [
        (
            "gptq",
            gptq,
            4,
            Scheme::Gptq {
                v2: false,
                asym: false,
            },
        ),
        ("awq", awq, 4, Scheme::Awq),
        (
            "pack-quantized",
            ct,
            8,
            Scheme::PackQuantized { asym: false },
        ),
    ] {
        let (packed, _) = checkpoints(&cfg, bits, scheme);
        let dir = model_dir(name, &json(quant), &packed);
        let path = dir.path().to_str().unwrap().to_string();
        let files = || open_model(&path).unwrap();
        for graphs in [false, true] {
            assert_eq!(
                greedy_files(files, 2, graphs),
                greedy_files(files, 1, graphs),
                "{name}, graphs {graphs}"
            );
        }
    }
}

#[test]
fn an_mlp_width_smaller_than_the_group_is_refused_naming_both_numbers() {
    let mut cfg = ModelConfig::dummy("tiny-qwen2-moe").unwrap();
    let moe = cfg.moe.as_mut().unwrap();
    moe.expert_intermediate = 3;
    let e = cfg.shard(0, 4).unwrap_err().to_string();
    assert!(
        e.contains("expert MLP width 3") && e.contains("--tensor-parallel-size 4"),
        "{e}"
    );
    // The dense MLP's width binds only a model with a dense layer.
    let mut mixtral = ModelConfig::dummy("tiny-mixtral").unwrap();
    mixtral.intermediate_size = 3;
    assert!(mixtral.shard(0, 4).is_ok());
    let mut qwen3 = ModelConfig::dummy("tiny-qwen3-moe").unwrap();
    qwen3.intermediate_size = 3;
    let e = qwen3.shard(0, 4).unwrap_err().to_string();
    assert!(e.contains("intermediate_size 3"), "{e}");
    // A rank's experts are its block of every expert.
    let moe = cfg.moe.as_mut().unwrap();
    moe.expert_intermediate = 66;
    moe.shared_expert_intermediate = Some(95);
    let two = cfg.shard(1, 2).unwrap();
    let m = two.moe.as_ref().unwrap();
    assert_eq!(
        (m.expert_intermediate, m.shared_expert_intermediate),
        (33, Some(48))
    );
    assert_eq!(two.whole_expert_widths(), Some((66, Some(95))));
}

#[test]
fn each_rank_streams_its_shard_under_its_own_weight_budget() {
    // Every rank keeps 60% of its shard resident and streams the rest inside the graphs.
    budgeted_ranks_give_one_ranks_tokens("dummy:tiny", 60.0, Policy::Planned);
}

#[test]
fn logits_over_two_ranks_match_one_rank() {
    let logits = |size: usize| {
        let (be, tp) = group(size);
        let cfg = EngineConfig {
            tp,
            ..config(false)
        };
        let Engine { mut runner, .. } = Engine::new(
            be.as_ref(),
            open_model("dummy:tiny").unwrap(),
            &cfg,
            &NoProgress,
        )
        .unwrap();
        let mut seqs = Seqs::for_runner(&runner).unwrap();
        let p = &prompts()[2];
        seqs.blocks.allocate(SeqId(0), p.len()).unwrap();
        let step = SeqStep {
            seq: SeqId(0),
            tokens: p,
            sampling: SamplingParams::default(),
            masked: false,
            score: None,
            verify: false,
            logit_bias: &[],
        };
        runner.step_with_logits(&mut seqs, &[step]).unwrap().1
    };
    let (one, two) = (logits(1), logits(2));
    assert_eq!(one[0].len(), 512);
    let diff = one[0]
        .iter()
        .zip(&two[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-4, "max |diff| {diff}");
}

#[test]
fn a_model_the_group_cannot_split_is_refused_naming_both_numbers() {
    let (be, tp) = group(3);
    let cfg = EngineConfig {
        tp,
        ..config(false)
    };
    let e = Engine::new(
        be.as_ref(),
        open_model("dummy:tiny").unwrap(),
        &cfg,
        &NoProgress,
    )
    .err()
    .expect("4 heads over 3 ranks")
    .to_string();
    assert!(
        e.contains("4 attention heads") && e.contains("--tensor-parallel-size 3"),
        "{e}"
    );
    // A backend that is not rank 0 of the group cannot lead it.
    let ranks = CpuBackend::group(2);
    let lone = CpuBackend::new();
    let tp = TpBackends(
        ranks
            .into_iter()
            .map(|b| Arc::new(b) as BackendRef)
            .collect(),
    );
    let cfg = EngineConfig {
        tp,
        ..config(false)
    };
    let e = Engine::new(&lone, open_model("dummy:tiny").unwrap(), &cfg, &NoProgress)
        .err()
        .expect("not rank 0")
        .to_string();
    assert!(e.contains("not rank 0"), "{e}");
    assert_eq!(lone.group(), (0, 1));
}

/// GPTQ act order (`desc_act`, groups of 64) over 2 ranks: q/k/v and gate/up (column
/// parallel) in any order, o and down (row parallel) in an order that stays within each
/// rank's columns (each sorted within its share) give one rank's tokens, eagerly and in
/// graphs; an order of o / down that crosses the shards is refused naming the g_idx.
#[test]
fn gptq_act_order_over_2_ranks_gives_one_ranks_tokens() {
    use common::checkpoint::model_dir;
    use common::packed::{checkpoints_ordered, exact_scale, Scheme};
    let json = |extra: &str| {
        format!(
            r#"{{"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 256,
  "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2,
  "torch_dtype": "bfloat16"{extra}}}"#
        )
    };
    let cfg = ModelConfig::from_json(&json(""), "twin").unwrap();
    let gptq = r#", "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": true, "desc_act": true}"#;
    // A seeded shuffle of `lo..hi`, each position in group lo / 64 + its rank / 64.
    fn shuffle_groups(g: &mut [usize], lo: usize, hi: usize, seed: u64) {
        let mut order: Vec<usize> = (lo..hi).collect();
        let mut s = seed | 1;
        for j in (1..order.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            order.swap(j, (s % (j as u64 + 1)) as usize);
        }
        for (i, &c) in order.iter().enumerate() {
            g[c] = lo / 64 + i / 64;
        }
    }
    // o / down shuffled within each half (a rank's share), the rest across all columns.
    fn within(name: &str, cols: usize, _: usize) -> Vec<usize> {
        let mut g = vec![0; cols];
        let s = name.len() as u64 * 7919 + name.contains("layers.1") as u64;
        let input = name.replace("k_proj", "q_proj").replace("v_proj", "q_proj");
        let input = input.replace("up_proj", "gate_proj");
        let s2 = input.len() as u64 * 31 + name.contains("layers.1") as u64;
        if name.contains("o_proj") || name.contains("down_proj") {
            shuffle_groups(&mut g, 0, cols / 2, s);
            shuffle_groups(&mut g, cols / 2, cols, s + 1);
        } else {
            shuffle_groups(&mut g, 0, cols, s2);
        }
        g
    }
    fn across(name: &str, cols: usize, group: usize) -> Vec<usize> {
        let mut g = within(name, cols, group);
        if name.contains("down_proj") {
            shuffle_groups(&mut g, 0, cols, 99);
        }
        g
    }
    let scheme = Scheme::Gptq {
        v2: false,
        asym: false,
    };
    let (packed, _) = checkpoints_ordered(&cfg, 4, scheme, exact_scale, Some(64), Some(within));
    let dir = model_dir("gptq-act-order-tp", &json(gptq), &packed);
    let path = dir.path().to_str().unwrap().to_string();
    let files = || open_model(&path).unwrap();
    for graphs in [false, true] {
        assert_eq!(
            greedy_files(files, 2, graphs),
            greedy_files(files, 1, graphs),
            "graphs {graphs}"
        );
    }
    // down's order across the shards: one rank, fine; two, refused by name.
    let (packed, _) = checkpoints_ordered(&cfg, 4, scheme, exact_scale, Some(64), Some(across));
    let dir = model_dir("gptq-act-order-tp-across", &json(gptq), &packed);
    let path = dir.path().to_str().unwrap().to_string();
    let files = open_model(&path).unwrap();
    let shard = files.config.shard(0, 2).unwrap();
    let e = encore_core::model::weights::load(
        &CpuBackend::new(),
        &shard,
        files.source,
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .err()
    .expect("an order across the shards is refused")
    .to_string();
    assert!(
        e.contains("mlp.down_proj.g_idx") && e.contains("crosses the tensor-parallel shards"),
        "{e}"
    );
}
