//! EAGLE-3 heads against a PyTorch reference of the published head (there is no
//! transformers class for one): `python3 scripts/eagle_reference.py DIR` (torch and
//! transformers) writes a random 7-layer Llama target, a random `LlamaForCausalLMEagle3`
//! head for it (`d2t` over a draft vocabulary of 97 of the target's 211 tokens, reading
//! layers 2, 3 and 4), and for 4 prompts the target's greedy token after the prompt and
//! the head's 5 greedy drafts after it, computed from the target's hidden states. Its
//! output (1.3 MB) is kept in `tests/data/eagle`, so the CPU test runs in CI;
//! `ENCORE_EAGLE_REF=DIR` reads another.
//!
//! These tests load both from the same float32 safetensors, run the 4 prompts as one
//! prefill step of the target (which captures the three layers' hidden states), and ask
//! the drafter ([`Drafter::eagle`]) for 5 drafts of each at once: its catch-up over the 4
//! prompts (one head step, or several of 16 tokens) and its 4 rounds must give the
//! reference's drafts (a draft whose
//! reference top-2 margin is under 1e-3 ends the comparison of that prompt). Eagerly on
//! the CPU and on CUDA, and on CUDA with the head's rounds replayed from decode graphs.
//!
//! The CUDA test runs with `--include-ignored`.

use std::path::{Path, PathBuf};

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::cuda::CudaBackend;
use encore_core::kv::SeqId;
use encore_core::model::config::ModelConfig;
use encore_core::model::llama::Model;
use encore_core::model::weights::{self, WeightSource};
use encore_core::request::SamplingParams;
use encore_core::runner::{GraphConfig, Runner, RunnerConfig, SeqStep, Seqs};
use encore_core::spec::draft::{DraftRequest, Drafter};
use encore_core::spec::eagle::read_d2t;
use encore_core::{Backend, DType};
use safetensors::SafeTensors;

const MAX_SEQ_LEN: usize = 128;
const BLOCK_SIZE: usize = 16;
const K: usize = 5;

struct Case {
    prompt: Vec<u32>,
    next: u32,
    drafts: Vec<u32>,
    margins: Vec<f32>,
    /// The reference's controls: drafts with every round fed the catch-up's output, and
    /// drafts from the wrong layers; the test must tell each from the right drafts.
    controls: [Vec<u32>; 2],
}

fn reference_dir() -> PathBuf {
    match std::env::var_os("ENCORE_EAGLE_REF") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/eagle"),
    }
}

fn read_cases(dir: &Path) -> Vec<Case> {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ints = |name: &str| -> Vec<u32> {
        let t = st.tensor(name).unwrap();
        t.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    };
    let floats = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).unwrap();
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    (0..)
        .take_while(|i| st.tensor(&format!("prompt.{i}")).is_ok())
        .map(|i| Case {
            prompt: ints(&format!("prompt.{i}")),
            next: ints(&format!("next.{i}"))[0],
            drafts: ints(&format!("drafts.{i}")),
            margins: floats(&format!("margin.{i}")),
            controls: [ints(&format!("stale.{i}")), ints(&format!("shifted.{i}"))],
        })
        .collect()
}

fn runner_config(seqs: usize, tokens: usize) -> RunnerConfig {
    RunnerConfig {
        block_size: BLOCK_SIZE,
        num_blocks: 1 + 2 * seqs * MAX_SEQ_LEN.div_ceil(BLOCK_SIZE),
        max_tokens_per_step: tokens,
        max_seqs: seqs,
        max_seq_len: MAX_SEQ_LEN,
        penalty_slots: 0,
        kv_dtype: None,
    }
}

fn load(be: &dyn Backend, dir: &Path, dtype: DType) -> (ModelConfig, weights::ModelWeights) {
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let w = weights::load(
        be,
        &cfg,
        WeightSource::Dir(dir.to_path_buf()),
        dtype,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    (cfg, w)
}

/// The drafts of every case, as the drafter gives them after one prefill step of all, with
/// a head of `head_tokens` tokens a step.
fn run(be: &dyn Backend, graphs: bool, head_tokens: usize) -> (Vec<Case>, Vec<u32>, Vec<Vec<u32>>) {
    let dir = reference_dir();
    let cases = read_cases(&dir);
    let n = cases.len();
    let (tcfg, tw) = load(be, &dir.join("target"), DType::F32);
    let (hcfg, hw) = load(be, &dir.join("head"), DType::F32);
    let layers = hcfg
        .eagle
        .as_ref()
        .expect("an EAGLE-3 head")
        .aux_layers_for(tcfg.num_layers)
        .unwrap();
    let rc = runner_config(n, 128);
    let hc = runner_config(n, head_tokens);
    let mut target = Model::new(be, tcfg, tw, MAX_SEQ_LEN).unwrap();
    target.capture_aux(be, layers, rc.token_rows()).unwrap();
    let embed = target.weights.embed.clone();
    let target = Runner::new(be, target, rc).unwrap();
    let mut head = Model::new(be, hcfg, hw, MAX_SEQ_LEN).unwrap();
    head.enable_eagle(be, &embed, hc.token_rows(), hc.max_seqs)
        .unwrap();
    let mut head = Runner::new(be, head, hc).unwrap();
    if graphs {
        head.set_graphs(Some(GraphConfig {
            decode: encore_core::graph::BucketPolicy::Explicit(vec![1, 2, 4]),
            mixed: encore_core::graph::BucketPolicy::SglangLike { max: 128 },
            verify: 1,
        }));
    }
    let d2t = read_d2t(&dir.join("head")).unwrap();
    assert_eq!(d2t.len(), 97, "the reference's draft vocabulary");
    let mut target = target;
    let mut drafter = Drafter::eagle(head, &target, d2t).unwrap();
    let mut seqs = Seqs::for_runner(&target).unwrap();
    for (i, c) in cases.iter().enumerate() {
        seqs.blocks
            .allocate(SeqId(i as u64), c.prompt.len())
            .unwrap();
    }
    let steps: Vec<SeqStep<'_>> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| SeqStep {
            seq: SeqId(i as u64),
            tokens: &c.prompt,
            sampling: SamplingParams::default(),
            masked: false,
            logit_bias: &[],
            score: None,
            verify: false,
        })
        .collect();
    let next = target.step(&mut seqs, &steps).unwrap();
    let tokens: Vec<Vec<u32>> = cases
        .iter()
        .zip(&next)
        .map(|(c, &t)| [c.prompt.as_slice(), &[t]].concat())
        .collect();
    let reqs: Vec<DraftRequest<'_>> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| DraftRequest {
            seq: SeqId(i as u64),
            tokens: t,
            max_drafts: K,
        })
        .collect();
    let drafts = drafter.propose(&reqs, &target).unwrap();
    (cases, next, drafts)
}

fn check(be: &dyn Backend, graphs: bool, head_tokens: usize) {
    let (cases, next, drafts) = run(be, graphs, head_tokens);
    let mut compared = 0;
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(next[i], c.next, "prompt {i}: the target's greedy token");
        assert_eq!(drafts[i].len(), K, "prompt {i}: {:?}", drafts[i]);
        for j in 0..K {
            if c.margins[j] < 1e-3 {
                break; // a near-tie: either token is right
            }
            assert_eq!(
                drafts[i][j], c.drafts[j],
                "prompt {i} draft {j}: encore {:?}, reference {:?}",
                drafts[i], c.drafts
            );
            compared += 1;
        }
    }
    assert!(compared >= 12, "only {compared} drafts compared");
    // The comparison can fail: each control differs from the right drafts somewhere.
    for k in 0..2 {
        assert!(
            cases.iter().any(|c| c.controls[k] != c.drafts),
            "control {k} gives the right drafts"
        );
    }
    println!(
        "{}{}, head steps of {head_tokens} tokens: {compared} drafts of {} equal the reference's",
        be.device_name(),
        if graphs { " (graphs)" } else { "" },
        cases.len() * K
    );
}

#[test]
fn eagle_head_matches_the_reference_on_the_cpu() {
    check(&CpuBackend::new(), false, 128);
    // A catch-up over several head steps: every sequence still gets all its drafts.
    check(&CpuBackend::new(), false, 16);
}

#[test]
#[ignore = "needs a CUDA device"]
fn eagle_head_matches_the_reference_on_cuda() {
    let be = CudaBackend::new(0).unwrap();
    check(&be, false, 128);
    check(&be, true, 128);
    check(&be, true, 16);
}
