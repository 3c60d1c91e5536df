//! The weight offload executor end to end on the CPU twin (a worker thread copying into a
//! device pool in host memory, with a delay per copy so an ordering mistake reads stale
//! weights every time), and on CUDA (`#[ignore = "needs a CUDA device"]`):
//! - greedy tokens under budgets equal fully resident ones, eager and in graphs (decode
//!   graphs and piecewise prefill), planned and LRU, with tied embeddings, a qkv bias and
//!   q/k norms, through chunked prefill and preemption under KV pressure;
//! - captured offload replays equal eager offload (the runner's own replay check, and
//!   step logits compared directly);
//! - real safetensors checkpoints: read in place from the mapping when stored in the run
//!   dtype, converted into a host copy otherwise;
//! - the floor is exact; planned copies less than LRU;
//! - the failure table, each a load-time error naming the thing: a budget below the
//!   floor, a missing weight, a shape or dtype mismatch, registration refused, the device
//!   pool refused (and the memory check before it);
//! - the copy queue itself: copy, record, wait and join order, eagerly and captured.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::Backend;
use encore_core::engine::{BootReport, Engine, EngineConfig, KvSizing};
use encore_core::generate::{generate, GenerateOptions};
use encore_core::graph::BucketPolicy;
use encore_core::kv::SeqId;
use encore_core::model::config::ModelConfig;
use encore_core::model::weights::{self, WeightSource};
use encore_core::model::{open_model, ModelFiles};
use encore_core::offload::{
    self, AccessOrder, OffloadConfig, Policy, Prepared, WeightBudget, SLOT_ALIGN,
};
use encore_core::progress::NoProgress;
use encore_core::request::SamplingParams;
use encore_core::request::{Request, RequestParams};
use encore_core::runner::{GraphConfig, Runner, SeqStep, Seqs};
use encore_core::scheduler::{Scheduler, SchedulerConfig};
use encore_core::{DType, Error};
use half::bf16;
use safetensors::tensor::{Dtype, TensorView};

#[path = "common/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;

const MODEL: &str = "dummy:tiny-qwen3";

fn config(graphs: bool, offload: Option<OffloadConfig>) -> EngineConfig {
    EngineConfig {
        graphs: graphs.then_some(GraphConfig {
            decode: BucketPolicy::PowersOfTwo { max: 4 },
            mixed: BucketPolicy::SglangLike { max: 64 },
        }),
        capture_all: graphs,
        offload,
        ..EngineConfig::new(DType::F32, 16, 64, 4, 256, KvSizing::Blocks(64))
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..45).map(|i| (i * 7 + 3) % 250).collect(),
        (0..9).map(|i| (i * 13 + 1) % 250).collect(),
        (0..70).map(|i| (i * 5 + 11) % 250).collect(),
    ]
}

/// Greedy tokens of [`prompts`] (chunked prefill: 64 tokens a step) under `cfg`.
fn run(be: &dyn Backend, cfg: &EngineConfig) -> Result<Vec<Vec<u32>>, Error> {
    run_files(be, &open_model(MODEL)?, cfg).map(|(tokens, _)| tokens)
}

/// [`run`] for the model `files`, with the start-up report.
fn run_files(
    be: &dyn Backend,
    files: &ModelFiles,
    cfg: &EngineConfig,
) -> Result<(Vec<Vec<u32>>, BootReport), Error> {
    let Engine { mut runner, report } = Engine::new(be, files.clone(), cfg, &NoProgress)?;
    Ok((greedy(&mut runner, &prompts())?, report))
}

/// Greedy tokens (12 per prompt, EOS ignored) of `prompts` through `generate`.
fn greedy(runner: &mut Runner<'_>, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, Error> {
    let opts = GenerateOptions {
        max_tokens: 12,
        ignore_eos: true,
        sampling: Default::default(),
    };
    let out = generate(runner, prompts, &[], &opts, &NoProgress, |_, _| {
        ControlFlow::Continue(())
    })?;
    Ok(out.into_iter().map(|g| g.output_ids).collect())
}

fn budget(p: f64, policy: Policy) -> Option<OffloadConfig> {
    Some(OffloadConfig {
        budget: WeightBudget::Percent(p),
        policy,
    })
}

fn slow_cpu() -> CpuBackend {
    CpuBackend::with_copy_delay(Duration::from_micros(300))
}

#[test]
fn planned_budgets_give_the_resident_tokens_eager_and_in_graphs() {
    let cpu = slow_cpu();
    let want = run(&cpu, &config(false, None)).unwrap();
    assert_eq!(run(&cpu, &config(true, None)).unwrap(), want);
    for p in [75.0, 50.0, 30.0] {
        for graphs in [false, true] {
            let got = run(&cpu, &config(graphs, budget(p, Policy::Planned))).unwrap();
            assert_eq!(got, want, "planned, {p}% budget, graphs {graphs}");
        }
    }
}

#[test]
fn lru_budgets_give_the_resident_tokens_and_refuse_graphs() {
    let cpu = slow_cpu();
    let want = run(&cpu, &config(false, None)).unwrap();
    for p in [75.0, 50.0, 30.0] {
        let got = run(&cpu, &config(false, budget(p, Policy::Lru))).unwrap();
        assert_eq!(got, want, "LRU, {p}% budget");
    }
    let err = run(&cpu, &config(true, budget(50.0, Policy::Lru))).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("cannot run inside graphs; add --eager"),
        "{msg}"
    );
}

fn order(cfg: &ModelConfig) -> AccessOrder {
    offload::executor_order(cfg, DType::F32).unwrap()
}

#[test]
fn a_budget_one_byte_under_the_floor_fails_and_at_the_floor_runs() {
    let cpu = slow_cpu();
    // Tied embeddings (a device weight) and untied ones (read in place from host memory,
    // so the floor is set by the LM head and its neighbours).
    for model in [MODEL, "dummy:tiny-llama3"] {
        let files = open_model(model).unwrap();
        let floor = order(&files.config).floor().bytes;
        let at = |bytes: usize| {
            config(
                true,
                Some(OffloadConfig {
                    budget: WeightBudget::Bytes(bytes),
                    policy: Policy::Planned,
                }),
            )
        };
        let err = run_files(&cpu, &files, &at(floor - 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("minimum of {floor} bytes")),
            "{model}: {err}"
        );
        let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
        let (got, _) = run_files(&cpu, &files, &at(floor)).unwrap();
        assert_eq!(got, want, "{model}");
    }
}

#[test]
fn planned_streams_less_than_lru_below_the_whole_model() {
    let cfg = open_model(MODEL).unwrap().config;
    for p in [90.0, 75.0, 50.0, 30.0] {
        let planned = offload::device_bytes(&cfg, DType::F32, &budget(p, Policy::Planned).unwrap())
            .unwrap()
            .unwrap();
        let lru = offload::device_bytes(&cfg, DType::F32, &budget(p, Policy::Lru).unwrap())
            .unwrap()
            .unwrap();
        assert!(
            planned.streamed_bytes_per_step < lru.streamed_bytes_per_step,
            "{p}%: planned {} vs LRU {}",
            planned.streamed_bytes_per_step,
            lru.streamed_bytes_per_step
        );
        assert!(planned.resident_bytes + planned.streaming_bytes <= planned.budget_bytes);
    }
}

// ---------------------------------------------------------------------------------------
// Real safetensors checkpoints.

/// An HF Llama `config.json` of these sizes (head_dim = hidden / heads, untied).
fn llama_json(vocab: usize, hidden: usize, inter: usize, layers: usize, heads: usize) -> String {
    format!(
        r#"{{
  "architectures": ["LlamaForCausalLM"],
  "vocab_size": {vocab}, "hidden_size": {hidden}, "intermediate_size": {inter},
  "num_hidden_layers": {layers}, "num_attention_heads": {heads}, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
  "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"
}}"#
    )
}

/// One checkpoint tensor (`values` are written in `dtype`).
struct Ck {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    values: Vec<f32>,
}

/// splitmix64 values in [-1, 1).
fn uniform(seed: u64, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = seed
                .wrapping_mul(0x2545_F491_4F6C_DD1D)
                .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Every HF tensor `cfg` implies, in `dtype`, with seeded values of sensible scale (norms
/// near 1, matrices of std ~ 1/sqrt(fan_in)), so the logits are far from ties.
fn checkpoint(cfg: &ModelConfig, dtype: Dtype) -> Vec<Ck> {
    weights::hf_tensors(cfg)
        .into_iter()
        .enumerate()
        .map(|(k, t)| {
            let u = uniform(k as u64 + 1, t.numel());
            let values = if t.name.ends_with("norm.weight") {
                u.iter().map(|x| 1.0 + 0.05 * x).collect()
            } else {
                let scale = 1.7 / (*t.shape.last().unwrap() as f32).sqrt();
                u.iter().map(|x| x * scale).collect()
            };
            Ck {
                name: t.name,
                dtype,
                shape: t.shape,
                values,
            }
        })
        .collect()
}

fn bytes_of(t: &Ck) -> Vec<u8> {
    match t.dtype {
        Dtype::F32 => t.values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::BF16 => t
            .values
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::I32 => t
            .values
            .iter()
            .flat_map(|&x| ((x * 100.0) as i32).to_le_bytes())
            .collect(),
        other => panic!("this test writes no {other:?}"),
    }
}

/// `config.json` and `tensors` as one `model.safetensors` in a fresh dir.
fn model_dir(tag: &str, json: &str, tensors: &[Ck]) -> TempDir {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("config.json"), json).unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), tensors);
    dir
}

fn write_safetensors(path: &Path, tensors: &[Ck]) {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(bytes_of).collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The CPU checkpoint model: 4 layers, head_dim 32.
fn cpu_json() -> String {
    llama_json(256, 128, 224, 4, 4)
}

fn dir_files(dir: &Path) -> ModelFiles {
    ModelFiles {
        config: ModelConfig::from_file(&dir.join("config.json")).unwrap(),
        source: WeightSource::Dir(PathBuf::from(dir)),
    }
}

#[test]
fn a_checkpoint_in_the_run_dtype_is_read_in_place_and_a_converted_one_copied() {
    let cpu = slow_cpu();
    let json = cpu_json();
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let f32_dir = model_dir("offload-f32", &json, &checkpoint(&cfg, Dtype::F32));
    let files = dir_files(f32_dir.path());
    let (want, resident) = run_files(&cpu, &files, &config(false, None)).unwrap();
    assert!(resident.offload.is_none());
    for graphs in [false, true] {
        let (got, boot) =
            run_files(&cpu, &files, &config(graphs, budget(50.0, Policy::Planned))).unwrap();
        assert_eq!(got, want, "f32 checkpoint in place, graphs {graphs}");
        let r = boot.offload.expect("a 50% budget offloads");
        assert!(r.registered_bytes > 0, "{r:?}");
        assert_eq!(r.copied_bytes, 0, "{r:?}");
        // Every streamed byte is read from the mapping.
        assert_eq!(
            r.registered_bytes,
            r.total_bytes - r.resident_bytes,
            "{r:?}"
        );
    }
    // Split over two files, every other tensor in each (q/k/v and gate/up parts of one
    // device weight in different files): each mapping is registered, the same tokens.
    let sharded = TempDir::new("offload-shards");
    std::fs::write(sharded.path().join("config.json"), &json).unwrap();
    let (even, odd): (Vec<_>, Vec<_>) = checkpoint(&cfg, Dtype::F32)
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    for (name, part) in [("a", even), ("b", odd)] {
        let part: Vec<Ck> = part.into_iter().map(|(_, t)| t).collect();
        write_safetensors(&sharded.path().join(format!("{name}.safetensors")), &part);
    }
    let (got, boot) = run_files(
        &cpu,
        &dir_files(sharded.path()),
        &config(true, budget(30.0, Policy::Planned)),
    )
    .unwrap();
    assert_eq!(got, want, "two files in place");
    let r = boot.offload.unwrap();
    assert_eq!(
        r.registered_bytes,
        r.total_bytes - r.resident_bytes,
        "{r:?}"
    );

    // The same values stored in bf16 (exact there), run in f32: converted into a copy.
    let rounded: Vec<Ck> = checkpoint(&cfg, Dtype::F32)
        .into_iter()
        .map(|t| Ck {
            dtype: Dtype::BF16,
            values: t
                .values
                .iter()
                .map(|&x| bf16::from_f32(x).to_f32())
                .collect(),
            ..t
        })
        .collect();
    let bf16_dir = model_dir("offload-bf16", &json, &rounded);
    let files = dir_files(bf16_dir.path());
    let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
    let (got, boot) =
        run_files(&cpu, &files, &config(false, budget(50.0, Policy::Planned))).unwrap();
    assert_eq!(got, want, "bf16 checkpoint run in f32");
    let r = boot.offload.unwrap();
    assert!(r.copied_bytes > 0 && r.registered_bytes == 0, "{r:?}");
    let (got, _) = run_files(&cpu, &files, &config(false, budget(50.0, Policy::Lru))).unwrap();
    assert_eq!(got, want, "bf16 checkpoint run in f32, LRU");
}

// ---------------------------------------------------------------------------------------
// The failure table.

/// The HF name of a weight the planned policy streams at `budget` for `cfg` (one HF
/// tensor per device tensor: not a merged q/k/v or gate/up).
fn a_streamed_hf_tensor(cfg: &ModelConfig, p: f64) -> String {
    let order = order(cfg);
    let bytes = WeightBudget::Percent(p).bytes(cfg.weight_bytes(DType::F32));
    let plan = offload::plan(&order, bytes).unwrap();
    plan.streams
        .iter()
        .map(|s| &order.weights()[s.weight].name)
        .find(|n| n.ends_with("down_proj"))
        .map(|n| format!("{n}.weight"))
        .expect("a down projection is streamed")
}

#[test]
fn a_broken_checkpoint_under_a_budget_fails_at_load_naming_the_tensor() {
    let cpu = CpuBackend::new();
    let json = cpu_json();
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let name = a_streamed_hf_tensor(&cfg, 50.0);
    type Edit = Box<dyn Fn(&mut Vec<Ck>, &str)>;
    let cases: [(&str, Edit, &[&str]); 3] = [
        (
            "missing",
            Box::new(|ts, n| ts.retain(|t| t.name != n)),
            &["missing"],
        ),
        (
            "shape",
            Box::new(|ts, n| ts.iter_mut().find(|t| t.name == n).unwrap().shape.reverse()),
            &["[224, 128]", "expected [128, 224]"],
        ),
        (
            "dtype",
            Box::new(|ts, n| ts.iter_mut().find(|t| t.name == n).unwrap().dtype = Dtype::I32),
            &["I32"],
        ),
    ];
    for (what, edit, says) in cases {
        let mut ts = checkpoint(&cfg, Dtype::F32);
        edit(&mut ts, &name);
        let dir = model_dir(&format!("offload-{what}"), &json, &ts);
        for policy in [Policy::Planned, Policy::Lru] {
            let err = run_files(
                &cpu,
                &dir_files(dir.path()),
                &config(false, budget(50.0, policy)),
            )
            .err()
            .unwrap_or_else(|| panic!("{what}: a broken checkpoint loaded"));
            let msg = err.to_string();
            assert!(matches!(err, Error::Weights { .. }), "{what}: {msg}");
            assert!(msg.contains(&format!("`{name}`")), "{what}: {msg}");
            for s in says {
                assert!(msg.contains(s), "{what}: {msg}");
            }
        }
    }
}

/// `tiny` with other sizes (heads of 128, 8 KV heads), for budgets no machine holds.
fn huge(hidden: usize, inter: usize, layers: usize) -> ModelConfig {
    let tiny = ModelConfig::dummy("tiny").unwrap();
    ModelConfig {
        hidden_size: hidden,
        intermediate_size: inter,
        num_layers: layers,
        num_heads: hidden / 128,
        num_kv_heads: 8,
        head_dim: 128,
        rope: encore_core::ops::RopeConfig {
            rot_dim: 128,
            ..tiny.rope
        },
        ..tiny
    }
}

#[test]
fn a_ring_or_pool_the_device_cannot_allocate_is_a_clear_error() {
    // Weights of 2^50 bytes: the ring (or pool) is beyond any address space, so the
    // allocation fails however the host overcommits.
    let cpu = CpuBackend::new();
    let cfg = huge(1 << 17, 1 << 30, 2);
    let floor = order(&cfg).floor().bytes;
    assert!(floor < cfg.weight_bytes(DType::F32), "the floor streams");
    for (policy, what) in [(Policy::Planned, "ring"), (Policy::Lru, "LRU pool")] {
        let oc = OffloadConfig {
            budget: WeightBudget::Bytes(floor),
            policy,
        };
        let err = Prepared::new(&cpu, &cfg, DType::F32, &oc)
            .err()
            .expect("a PiB ring is refused");
        let msg = err.to_string();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{msg}");
        assert!(
            msg.contains(&format!("the weight offload {what}"))
                && msg.contains("device pool was refused"),
            "{msg}"
        );
    }
}

#[test]
fn a_budget_beyond_host_memory_fails_the_memory_check_before_loading() {
    // 8 layers of 1.5 TiB each: half of it is more than any CI host has.
    let Some(_) = encore_core::memory::host_memory() else {
        eprintln!("no /proc/meminfo: the CPU backend has no memory limit to check");
        return;
    };
    let cpu = CpuBackend::new();
    let cfg = huge(1 << 17, 1 << 20, 8);
    let files = ModelFiles {
        config: cfg.clone(),
        source: WeightSource::Dummy { seed: 0 },
    };
    let oc = budget(50.0, Policy::Planned).unwrap();
    let r = offload::device_bytes(&cfg, DType::F32, &oc)
        .unwrap()
        .unwrap();
    let t = Instant::now();
    let err = Engine::new(&cpu, files, &config(false, Some(oc)), &NoProgress)
        .err()
        .expect("a budget of TiBs is refused");
    assert!(t.elapsed() < Duration::from_secs(10), "it allocated first");
    let msg = err.to_string();
    assert!(matches!(err, Error::MemoryBudget { .. }), "{msg}");
    // The weights are the budget's resident set and ring, plus, on the CPU twin whose
    // "device" is host memory, the streamed weights' host copies.
    let gib = |b: usize| format!("weights {:.2} GiB", b as f64 / (1u64 << 30) as f64);
    let host_copies = r.total_bytes - r.resident_bytes;
    assert!(
        msg.contains(&gib(r.resident_bytes + r.streaming_bytes + host_copies)),
        "{msg}"
    );
    assert!(msg.contains("host memory"), "{msg}");
}

// ---------------------------------------------------------------------------------------
// Graph replay against eager under offload.

/// The dummies with tied embeddings and a qkv bias (tiny-qwen2), tied embeddings and q/k
/// norms (tiny-qwen3), and untied Llama 3 rope (tiny-llama3).
const MODELS: [&str; 3] = ["dummy:tiny-qwen2", "dummy:tiny-qwen3", "dummy:tiny-llama3"];

#[test]
fn verified_graph_replays_under_offload_give_the_resident_tokens() {
    let cpu = slow_cpu();
    for spec in MODELS {
        let files = open_model(spec).unwrap();
        let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
        // Graphs captured on first use (the other tests capture all at start-up).
        let cfg = EngineConfig {
            verify_graphs: true,
            capture_all: false,
            ..config(true, budget(50.0, Policy::Planned))
        };
        let Engine { mut runner, report } =
            Engine::new(&cpu, files.clone(), &cfg, &NoProgress).unwrap();
        assert!(report.offload.is_some());
        let got = greedy(&mut runner, &prompts()).unwrap();
        assert_eq!(got, want, "{spec}");
        let s = runner.graph_stats().unwrap();
        assert!(s.hits > 0, "{spec}: no step replayed a graph: {s:?}");
    }
}

/// Run the same steps on every runner (prompts prefilled in chunks beside decodes, then
/// decodes of all three), feeding each the first runner's greedy tokens; returns each
/// runner's logits per step.
fn lockstep(runners: &mut [Runner<'_>]) -> Vec<Vec<Vec<Vec<f32>>>> {
    let prompts = prompts();
    // Prompt chunks (sequence, tokens) per step, beside the decodes of finished prompts.
    let chunks: [&[(usize, usize)]; 3] = [&[(0, 45), (1, 9)], &[(2, 40)], &[(2, 30)]];
    let mut fed = [0usize; 3];
    let mut last: Vec<Option<u32>> = vec![None; 3];
    let mut out = vec![Vec::new(); runners.len()];
    let mut seqs: Vec<Seqs> = runners
        .iter()
        .map(|r| Seqs::for_runner(r).unwrap())
        .collect();
    for k in 0..8 {
        let mut batch: Vec<(usize, Vec<u32>)> = (0..3)
            .filter_map(|s| last[s].map(|t| (s, vec![t])))
            .collect();
        for &(s, n) in chunks.get(k).copied().unwrap_or_default() {
            batch.push((s, prompts[s][fed[s]..fed[s] + n].to_vec()));
            fed[s] += n;
        }
        let mut tokens = Vec::new();
        for (i, (r, seqs)) in runners.iter_mut().zip(&mut seqs).enumerate() {
            for (s, toks) in &batch {
                let id = SeqId(*s as u64);
                if seqs.blocks.contains(id) {
                    seqs.blocks.append(id, toks.len()).unwrap();
                } else {
                    seqs.blocks.allocate(id, toks.len()).unwrap();
                }
            }
            let steps: Vec<SeqStep<'_>> = batch
                .iter()
                .map(|(s, toks)| SeqStep {
                    seq: SeqId(*s as u64),
                    tokens: toks,
                    sampling: SamplingParams::default(),
                })
                .collect();
            let (t, logits) = r.step_with_logits(seqs, &steps).unwrap();
            if i == 0 {
                tokens = t;
            } else {
                assert_eq!(t, tokens, "runner {i}, step {k}: sampled tokens");
            }
            out[i].push(logits);
        }
        // A sequence decodes once its whole prompt is in.
        for ((s, _), &t) in batch.iter().zip(&tokens) {
            if fed[*s] == prompts[*s].len() {
                last[*s] = Some(t);
            }
        }
    }
    out
}

#[test]
fn graph_step_logits_equal_eager_ones_under_offload() {
    let cpu = slow_cpu();
    for spec in MODELS {
        let files = open_model(spec).unwrap();
        let mut runners = Vec::new();
        for cfg in [
            config(false, budget(50.0, Policy::Planned)),
            config(true, budget(50.0, Policy::Planned)),
            config(true, budget(30.0, Policy::Planned)),
            config(false, None),
        ] {
            runners.push(
                Engine::new(&cpu, files.clone(), &cfg, &NoProgress)
                    .unwrap()
                    .runner,
            );
        }
        let logits = lockstep(&mut runners);
        // The CPU runs the same kernels per row in graphs and eagerly: bit for bit.
        for (i, name) in [(1, "graphs 50%"), (2, "graphs 30%"), (3, "resident eager")] {
            assert_eq!(logits[i], logits[0], "{spec}: {name} against eager 50%");
        }
        let s = runners[1].graph_stats().unwrap();
        assert!(s.hits >= 8, "{spec}: every step replays: {s:?}");
    }
}

// ---------------------------------------------------------------------------------------
// KV pressure and chunked prefill.

/// Greedy tokens of `prompts` through the scheduler (as `generate` runs it), and the
/// number of preemptions it made.
fn scheduled(runner: &mut Runner<'_>, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, u64) {
    let cfg = *runner.config();
    let mut sched = Scheduler::new(
        SchedulerConfig::new(cfg.max_tokens_per_step, cfg.max_seqs),
        runner,
    )
    .unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let params = RequestParams {
            sampling: SamplingParams::default(),
            max_tokens: 12,
            stop_token_ids: Vec::new(),
            ignore_eos: true,
            fit_context: false,
        };
        let req = Request {
            id: i as u64,
            prompt: p.clone(),
            params,
        };
        sched.add(req, runner).unwrap();
    }
    let mut out = vec![Vec::new(); prompts.len()];
    while sched.has_work() {
        for o in sched.step(runner).unwrap() {
            out[o.id as usize].push(o.token);
        }
    }
    (out, sched.stats().preemptions)
}

#[test]
fn preemption_and_chunked_prefill_under_offload_give_the_resident_tokens() {
    let cpu = slow_cpu();
    // 32 tokens a step (prompts of 45 and 70 are chunked) and 8 blocks of 16 for 3
    // sequences that need 12: the newest is preempted and recomputed.
    let small = |graphs: bool, offload| EngineConfig {
        max_tokens_per_step: 32,
        kv: KvSizing::Blocks(8),
        graphs: graphs.then_some(GraphConfig {
            decode: BucketPolicy::PowersOfTwo { max: 4 },
            mixed: BucketPolicy::SglangLike { max: 32 },
        }),
        ..config(graphs, offload)
    };
    let want = run(&cpu, &config(false, None)).unwrap();
    let files = open_model(MODEL).unwrap();
    for (graphs, oc, what) in [
        (false, budget(50.0, Policy::Planned), "planned eager"),
        (true, budget(30.0, Policy::Planned), "planned graphs"),
        (false, budget(50.0, Policy::Lru), "LRU eager"),
    ] {
        let Engine { mut runner, .. } =
            Engine::new(&cpu, files.clone(), &small(graphs, oc), &NoProgress).unwrap();
        let (got, preemptions) = scheduled(&mut runner, &prompts());
        assert_eq!(got, want, "{what}");
        assert!(preemptions > 0, "{what}: no preemption");
        if graphs {
            // And through `generate` itself, on the same engine.
            assert_eq!(greedy(&mut runner, &prompts()).unwrap(), want, "{what}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The copy queue.

fn f32s(be: &dyn Backend, t: &encore_core::Tensor) -> Vec<f32> {
    be.download::<f32>(t).unwrap()
}

/// Copy, record, wait and join on `be`'s copy queue, eagerly and inside a capture. The
/// host memory holds three arrays `a`, `b`, `c` of `n` f32 each. `delay` is the least
/// time a copy takes (the CPU twin's knob; zero elsewhere).
fn check_copy_queue(be: &dyn Backend, delay: Duration) {
    let n = 4096;
    let arr = |k: usize| -> Vec<f32> { (0..n).map(|i| (k * n + i) as f32 + 0.5).collect() };
    let (a, b, c) = (arr(0), arr(1), arr(2));
    let mut host = be.alloc_host(3 * n * 4).unwrap();
    let bytes = host.bytes_mut().expect("allocated host memory is writable");
    for (k, v) in [&a, &b, &c].into_iter().enumerate() {
        bytes[k * n * 4..(k + 1) * n * 4].copy_from_slice(bytemuck::cast_slice(v));
    }
    let host = Arc::new(host);
    let zeros = vec![0f32; n];
    let dst = be.upload(&zeros, &[n]).unwrap();
    let dst2 = be.upload(&zeros, &[n]).unwrap();
    let q = be.copy_queue(2).unwrap();

    // Wait sees the copy recorded before it, not necessarily the ones after.
    let t0 = Instant::now();
    q.fork().unwrap();
    q.copy(&host, 0, &dst).unwrap();
    q.record(0).unwrap();
    q.copy(&host, n * 4, &dst2).unwrap();
    q.wait(0).unwrap();
    assert_eq!(f32s(be, &dst), a, "the copy recorded before the wait");
    assert!(
        t0.elapsed() >= delay,
        "the wait returned before the copy ran"
    );
    q.join().unwrap();
    assert_eq!(f32s(be, &dst2), b, "join waits for every copy");

    // Copies run in queue order: the last one into a tensor wins.
    q.fork().unwrap();
    q.copy(&host, 0, &dst).unwrap();
    q.copy(&host, 2 * n * 4, &dst).unwrap();
    q.join().unwrap();
    assert_eq!(f32s(be, &dst), c, "copies in queue order");

    // Captured: the copy, its event and the compute op waiting on it replay together.
    be.write(&dst, &zeros).unwrap();
    be.write(&dst2, &zeros).unwrap();
    be.begin_capture().unwrap();
    q.fork().unwrap();
    q.copy(&host, n * 4, &dst).unwrap();
    q.record(1).unwrap();
    q.wait(1).unwrap();
    be.copy(&dst, &dst2).unwrap();
    q.join().unwrap();
    let graph = be.end_capture().unwrap();
    be.synchronize().unwrap();
    assert_eq!(f32s(be, &dst), zeros, "a capture runs nothing");
    for replay in 0..2 {
        graph.replay().unwrap();
        be.synchronize().unwrap();
        assert_eq!(f32s(be, &dst), b, "replay {replay}: the copy");
        assert_eq!(f32s(be, &dst2), b, "replay {replay}: the op after the wait");
        be.write(&dst, &zeros).unwrap();
        be.write(&dst2, &zeros).unwrap();
    }

    // Misuse is an error naming it.
    let msg = q.record(2).unwrap_err().to_string();
    assert!(msg.contains("event 2"), "{msg}");
    let msg = q.copy(&host, 3 * n * 4 - 4, &dst).unwrap_err().to_string();
    assert!(msg.contains("outside"), "{msg}");
}

#[test]
fn the_cpu_copy_queue_orders_copies_waits_and_joins_eagerly_and_captured() {
    let delay = Duration::from_millis(20);
    let cpu = CpuBackend::with_copy_delay(delay);
    check_copy_queue(&cpu, delay);
    // A queue is made before a capture, not inside one.
    cpu.begin_capture().unwrap();
    let refused = cpu.copy_queue(1).err();
    cpu.end_capture().unwrap();
    assert!(
        matches!(refused, Some(Error::CaptureViolation { .. })),
        "{refused:?}"
    );
}

// ---------------------------------------------------------------------------------------
// CUDA.

mod cuda {
    use std::sync::{Mutex, MutexGuard, OnceLock};

    use encore_core::backend::cuda::CudaBackend;

    use super::*;

    /// One test at a time on one backend (a capture must not see another test's work).
    fn cuda() -> (MutexGuard<'static, ()>, &'static CudaBackend) {
        static LOCK: Mutex<()> = Mutex::new(());
        static BE: OnceLock<CudaBackend> = OnceLock::new();
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let be = BE.get_or_init(|| CudaBackend::new(0).unwrap_or_else(|e| panic!("{e}")));
        (guard, be)
    }

    fn bf16_config(graphs: bool, offload: Option<OffloadConfig>) -> EngineConfig {
        EngineConfig {
            dtype: DType::BF16,
            ..config(graphs, offload)
        }
    }

    /// 138M parameters (276 MB in bf16): 8 layers of hidden 1024, heads of 64, untied; a
    /// 30% budget streams most of every layer.
    fn model() -> ModelFiles {
        let tiny = ModelConfig::dummy("tiny").unwrap();
        let config = ModelConfig {
            vocab_size: 8192,
            hidden_size: 1024,
            intermediate_size: 4096,
            num_layers: 8,
            num_heads: 16,
            num_kv_heads: 4,
            head_dim: 64,
            rope: encore_core::ops::RopeConfig {
                rot_dim: 64,
                ..tiny.rope
            },
            ..tiny
        };
        ModelFiles {
            config,
            source: WeightSource::Dummy { seed: 5 },
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_budgets_give_the_resident_tokens_eager_and_in_graphs() {
        let (_g, be) = cuda();
        let files = model();
        for graphs in [false, true] {
            let (want, _) = run_files(be, &files, &bf16_config(graphs, None)).unwrap();
            for p in [75.0, 50.0, 30.0] {
                let (got, boot) =
                    run_files(be, &files, &bf16_config(graphs, budget(p, Policy::Planned)))
                        .unwrap();
                assert_eq!(got, want, "planned, {p}%, graphs {graphs}");
                let r = boot.offload.unwrap();
                assert!(r.streamed_bytes_per_step > 0 && r.copied_bytes > 0, "{r:?}");
                if !graphs {
                    let (got, _) =
                        run_files(be, &files, &bf16_config(false, budget(p, Policy::Lru))).unwrap();
                    assert_eq!(got, want, "LRU, {p}%");
                }
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_a_budget_one_byte_under_the_floor_fails_and_at_the_floor_runs() {
        let (_g, be) = cuda();
        let files = model();
        let floor = offload::executor_order(&files.config, DType::BF16)
            .unwrap()
            .floor()
            .bytes;
        let at = |bytes: usize, graphs: bool| {
            bf16_config(
                graphs,
                Some(OffloadConfig {
                    budget: WeightBudget::Bytes(bytes),
                    policy: Policy::Planned,
                }),
            )
        };
        let err = run_files(be, &files, &at(floor - 1, true))
            .expect_err("below the floor")
            .to_string();
        assert!(err.contains(&format!("minimum of {floor} bytes")), "{err}");
        for graphs in [false, true] {
            let (want, _) = run_files(be, &files, &bf16_config(graphs, None)).unwrap();
            let (got, _) = run_files(be, &files, &at(floor, graphs)).unwrap();
            assert_eq!(got, want, "at the floor, graphs {graphs}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_a_bf16_checkpoint_is_registered_in_place() {
        let (_g, be) = cuda();
        // head_dim 64, 4 layers; stored in bf16 and run in bf16.
        let json = llama_json(512, 256, 704, 4, 4);
        let cfg = ModelConfig::from_json(&json, "test").unwrap();
        let dir = model_dir("offload-cuda-bf16", &json, &checkpoint(&cfg, Dtype::BF16));
        let files = dir_files(dir.path());
        for graphs in [false, true] {
            let (want, _) = run_files(be, &files, &bf16_config(graphs, None)).unwrap();
            let (got, boot) = run_files(
                be,
                &files,
                &bf16_config(graphs, budget(50.0, Policy::Planned)),
            )
            .unwrap();
            assert_eq!(got, want, "graphs {graphs}");
            let r = boot.offload.unwrap();
            assert!(r.registered_bytes > 0 && r.copied_bytes == 0, "{r:?}");
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_registering_a_range_twice_is_refused_with_the_cause() {
        let (_g, be) = cuda();
        let mem: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![7u8; 1 << 20]);
        let first = be.register_host(mem.clone()).unwrap();
        assert!(first.is_page_locked());
        let err = be
            .register_host(mem.clone())
            .err()
            .expect("the driver refuses a registered range");
        let msg = err.to_string();
        assert!(
            msg.contains("cuMemHostRegister") && msg.contains("ALREADY_REGISTERED"),
            "{msg}"
        );
        drop(first);
        // Unregistered on drop: the range can be registered again.
        assert!(be.register_host(mem).is_ok());
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_a_pool_beyond_the_device_is_refused() {
        let (_g, be) = cuda();
        let (_, total) = be.memory_info().unwrap();
        // Layers of 7.6 GB in bf16, twice the device in all; an LRU pool 8 GiB over the
        // device is above the floor and below the model.
        let layer = huge(16384, 65536, 1).weight_bytes(DType::BF16);
        let cfg = huge(16384, 65536, (2 * total).div_ceil(layer));
        let pool = total + (8 << 30);
        let order = AccessOrder::llama(&cfg, DType::BF16)
            .unwrap()
            .aligned(SLOT_ALIGN);
        assert!(order.floor().bytes < pool && pool < cfg.weight_bytes(DType::BF16));
        let lru = OffloadConfig {
            budget: WeightBudget::Bytes(pool),
            policy: Policy::Lru,
        };
        let err = Prepared::new(be, &cfg, DType::BF16, &lru)
            .err()
            .expect("a pool larger than the device");
        let msg = err.to_string();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{msg}");
        assert!(
            msg.contains("the weight offload LRU pool") && msg.contains("device pool was refused"),
            "{msg}"
        );
        // Through the engine the memory check refuses it first, before any allocation.
        let files = ModelFiles {
            config: cfg.clone(),
            source: WeightSource::Dummy { seed: 0 },
        };
        let err = Engine::new(be, files, &bf16_config(false, Some(lru)), &NoProgress)
            .err()
            .expect("over the device");
        let msg = err.to_string();
        assert!(matches!(err, Error::MemoryBudget { .. }), "{msg}");
        assert!(msg.contains("free memory of cuda"), "{msg}");
        // A planned ring beyond the device: one gate/up projection of 256 GiB.
        let cfg = huge(1 << 16, 1 << 20, 2);
        let floor = AccessOrder::llama(&cfg, DType::BF16)
            .unwrap()
            .aligned(SLOT_ALIGN)
            .floor()
            .bytes;
        let planned = OffloadConfig {
            budget: WeightBudget::Bytes(floor),
            policy: Policy::Planned,
        };
        let ring = offload::device_bytes(&cfg, DType::BF16, &planned)
            .unwrap()
            .unwrap()
            .streaming_bytes;
        assert!(ring > total, "a ring of {ring} bytes fits the device");
        let err = Prepared::new(be, &cfg, DType::BF16, &planned)
            .err()
            .expect("a ring larger than the device");
        let msg = err.to_string();
        assert!(
            matches!(err, Error::OutOfMemory { .. })
                && msg.contains("the weight offload ring")
                && msg.contains("device pool was refused"),
            "{msg}"
        );
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn cuda_copy_queue_orders_copies_waits_and_joins_eagerly_and_captured() {
        let (_g, be) = cuda();
        check_copy_queue(be, Duration::ZERO);
    }
}
