//! Speculative decoding with a gpt-oss target of odd shapes (6 heads over 3 KV heads, 7
//! experts, top 3, windows of 5 that the prompts and outputs cross, a sink in every
//! softmax, the verify step's included): n-gram drafts, a draft model's and an EAGLE-3
//! head's give the greedy tokens of decoding one at a time, eagerly and through verify
//! graphs, on the CPU and on CUDA (`#[ignore = "needs a CUDA device"]`). A published
//! gpt-oss EAGLE-3 head's config loads for the target it was made for and is refused by
//! name for another.

use super::*;
use common::gpt_oss::odd;
use encore_core::model::config::ModelConfig;
use encore_core::runner::{GraphConfig, RunnerConfig};
use encore_core::spec::draft::{check_pair, Drafter};
use encore_core::spec::ngram::NgramConfig;
use encore_core::spec::Proposer;
use encore_core::DType;

/// Drafts a step proposes.
const K: usize = 3;

/// Greedy requests over [`odd`]'s 64 tokens (a small vocabulary makes random weights fall
/// into loops, which n-grams predict): two of prompts that repeat themselves and two plain
/// ones, added over the first steps.
fn greedy_reqs() -> Vec<(Request, u64)> {
    let greedy = |id: u64, prompt: Vec<u32>, max_tokens: usize| {
        let mut r = request(id, 0, max_tokens, 0.0);
        r.prompt = prompt;
        r
    };
    vec![
        (
            greedy(0, (0..33).map(|j| (j * 11 + 5) % 64).collect(), 20),
            0,
        ),
        (
            greedy(2, (0..12).map(|j| (j * 7 + 3) % 64).collect(), 30),
            1,
        ),
        (greedy(10, [3, 1, 4, 1, 5, 9].repeat(4), 40), 0),
        (greedy(11, [8, 6, 4, 2, 8, 3].repeat(4), 40), 2),
    ]
}

fn runner_config() -> RunnerConfig {
    RunnerConfig {
        max_seqs: 16 + 8 * K,
        ..common::tiny_config(1 + 16 * (128 / common::BLOCK))
    }
}

fn graphs() -> GraphConfig {
    GraphConfig {
        decode: common::buckets(),
        mixed: encore_core::graph::BucketPolicy::SglangLike { max: 256 },
        verify: K,
    }
}

/// The gpt-oss target on `be` (f32, seed 3), with its graphs when `with_graphs`.
fn target(be: &dyn encore_core::Backend, with_graphs: bool) -> Runner<'_> {
    let mut r = Runner::new(be, common::dummy_model(be, odd(), 128), runner_config()).unwrap();
    if with_graphs {
        r.set_graphs(Some(graphs()));
    }
    r
}

/// The tokens of decoding the requests one token at a time on `be`, with decode graphs.
fn reference(be: &dyn encore_core::Backend) -> HashMap<u64, (Vec<u32>, FinishReason)> {
    run(
        &mut target(be, true),
        SchedulerConfig::new(48, 8),
        &greedy_reqs(),
    )
    .0
}

fn assert_tokens(
    name: &str,
    out: &HashMap<u64, Vec<u32>>,
    want: &HashMap<u64, (Vec<u32>, FinishReason)>,
) {
    for (req, _) in greedy_reqs() {
        assert_eq!(out[&req.id], want[&req.id].0, "{name}: request {}", req.id);
    }
}

/// n-gram speculation, eagerly and through verify graphs.
fn check_ngram(be: &dyn encore_core::Backend) {
    let want = reference(be);
    for with_graphs in [false, true] {
        let mut r = target(be, with_graphs);
        let cfg = SchedulerConfig {
            speculative: Some(Proposer::Ngram(NgramConfig::new(1, 4, K).unwrap())),
            ..SchedulerConfig::new(48, 8)
        };
        let (out, s) = run_drafted(&mut r, cfg, None, &greedy_reqs());
        let name = format!("n-gram, graphs {with_graphs}");
        assert_tokens(&name, &out, &want);
        let st = s.stats();
        assert!(st.drafts_accepted > 5, "{name}: {st:?}");
        if with_graphs {
            let v = r.phase_stats(encore_core::graph::Phase::Verify).unwrap();
            assert!(v.hits + v.misses > 3, "{name}: {v:?}");
        }
    }
}

/// Draft-model speculation: the target itself in bf16 (most drafts kept) and a Qwen2 of
/// the same vocabulary (few), eagerly and through verify graphs.
fn check_draft(be: &dyn encore_core::Backend) {
    let want = reference(be);
    for (name, draft_cfg, dtype, with_graphs) in [
        ("itself in bf16", odd(), DType::BF16, true),
        ("itself in bf16, eager", odd(), DType::BF16, false),
        (
            "tiny-qwen2",
            ModelConfig {
                vocab_size: 64,
                ..ModelConfig::dummy("tiny-qwen2").unwrap()
            },
            DType::F32,
            true,
        ),
    ] {
        let mut t = target(be, with_graphs);
        let model = common::dummy_model_in(be, draft_cfg, 128, dtype);
        let mut draft = Runner::new(be, model, runner_config()).unwrap();
        if with_graphs {
            draft.set_graphs(Some(GraphConfig {
                verify: 1,
                ..graphs()
            }));
        }
        let mut drafter = Drafter::new(draft, &t).unwrap();
        let cfg = SchedulerConfig {
            speculative: Some(Proposer::Draft { k: K }),
            ..SchedulerConfig::new(48, 8)
        };
        let (out, s) = run_drafted(&mut t, cfg, Some(&mut drafter), &greedy_reqs());
        assert_tokens(name, &out, &want);
        let st = s.stats();
        assert!(st.drafts_proposed > 20, "{name}: {st:?}");
        if name.starts_with("itself") {
            assert!(
                st.drafts_accepted * 4 > st.drafts_proposed,
                "{name}: {st:?}"
            );
        }
    }
}

/// EAGLE-3 speculation with a random head shaped for the gpt-oss target (reading its
/// layers 0, 1 and 2), eagerly and in graphs.
fn check_eagle(be: &dyn encore_core::Backend) {
    let want = reference(be);
    for with_graphs in [false, true] {
        let mut model = common::dummy_model(be, odd(), 128);
        let head_cfg = ModelConfig::eagle_head_for(&model.cfg, 300);
        check_pair(&model.cfg, &head_cfg).unwrap();
        let layers = head_cfg.eagle.as_ref().unwrap().aux_layers_for(3).unwrap();
        assert_eq!(layers, [0, 1, 2]);
        let rows = runner_config().token_rows();
        model.capture_aux(be, layers, rows).unwrap();
        let embed = model.weights.embed.clone();
        let mut t = Runner::new(be, model, runner_config()).unwrap();
        let mut head = common::dummy_model(be, head_cfg, 128);
        head.enable_eagle(be, &embed, rows, runner_config().max_seqs)
            .unwrap();
        let mut head = Runner::new(be, head, runner_config()).unwrap();
        if with_graphs {
            t.set_graphs(Some(graphs()));
            head.set_graphs(Some(GraphConfig {
                verify: 1,
                ..graphs()
            }));
        }
        let mut drafter = Drafter::eagle(head, &t, Vec::new()).unwrap();
        let cfg = SchedulerConfig {
            speculative: Some(Proposer::Draft { k: K }),
            ..SchedulerConfig::new(48, 8)
        };
        let (out, s) = run_drafted(&mut t, cfg, Some(&mut drafter), &greedy_reqs());
        let name = format!("EAGLE-3, graphs {with_graphs}");
        assert_tokens(&name, &out, &want);
        assert!(s.stats().drafts_proposed > 20, "{name}: {:?}", s.stats());
    }
}

#[test]
fn ngram_speculation_on_gpt_oss_gives_the_tokens_of_decoding_one_at_a_time() {
    check_ngram(&CpuBackend::new());
}

#[test]
fn draft_model_speculation_on_gpt_oss_gives_the_tokens_of_decoding_one_at_a_time() {
    check_draft(&CpuBackend::new());
}

#[test]
fn eagle_speculation_on_gpt_oss_gives_the_tokens_of_decoding_one_at_a_time() {
    check_eagle(&CpuBackend::new());
}

/// The three on CUDA, f32 (greedy tokens: a verify step's rounding differs from a decode
/// step's only in the last bits).
#[test]
#[ignore = "needs a CUDA device"]
fn cuda_speculation_on_gpt_oss_gives_the_tokens_of_decoding_one_at_a_time() {
    let _serial = cuda_serial();
    let be = encore_core::backend::cuda::CudaBackend::new(0).unwrap();
    check_ngram(&be);
    check_draft(&be);
    check_eagle(&be);
}

/// SpecForge's EAGLE-3 head for gpt-oss-120b (its `config.json`): a Llama layer of 2,880
/// (64 heads of 64 over 8 KV heads), a 32,000-token draft vocabulary, reading the outputs
/// of layers 1, 17 and 33 (the inputs of 2, 18 and 34).
fn gpt_oss_120b_head() -> ModelConfig {
    let json = r#"{
        "architectures": ["LlamaForCausalLMEagle3"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 33]},
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initializer_range": 0.02, "intermediate_size": 17280,
        "max_position_embeddings": 4096, "model_type": "llama",
        "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 1,
        "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 201088,
        "draft_vocab_size": 32000
    }"#;
    ModelConfig::from_json(json, "config.json").unwrap()
}

#[test]
fn a_gpt_oss_eagle3_head_loads_for_its_target_and_is_refused_for_another() {
    let head = gpt_oss_120b_head();
    let e = head.eagle.as_ref().unwrap();
    assert_eq!((e.target_hidden, e.target_vocab), (2880, 201_088));
    assert_eq!(head.vocab_size, 32_000);
    let big = ModelConfig::dummy("gpt-oss-120b").unwrap();
    check_pair(&big, &head).unwrap();
    assert_eq!(e.aux_layers_for(big.num_layers).unwrap(), [2, 18, 34]);
    // gpt-oss-20b has 24 layers: the head's layer 34 is not there.
    let small = ModelConfig::dummy("gpt-oss-20b").unwrap();
    let err = check_pair(&small, &head).unwrap_err().to_string();
    assert!(
        err.contains("--draft-model") && err.contains("layer 34"),
        "{err}"
    );
    // A random head for gpt-oss (`--draft-model dummy:eagle3`) is a plain Llama layer:
    // none of the target's o_proj bias or sinks.
    let dummy = ModelConfig::eagle_head_for(&big, 32_000);
    assert!(!dummy.o_bias && !dummy.qkv_bias && dummy.moe.is_none());
    check_pair(&big, &dummy).unwrap();
    let roles: Vec<_> = dummy.decl().tensors().iter().map(|t| t.role).collect();
    use encore_core::model::decl::Role;
    assert!(!roles.contains(&Role::OProjBias) && !roles.contains(&Role::Sinks));
}
