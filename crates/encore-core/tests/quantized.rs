//! Held-out quality of quantized models: a model whose projections are quantized (every
//! format, in situ at load) runs teacher-forced beside its dequantized twin (the same
//! weights decoded to the run dtype, through the dense path). On the CPU the twin's
//! arithmetic is the same, so the logits are equal; on CUDA the kernels differ (the
//! quantized GEMV, the tensor-core kernel that decodes weight tiles in shared memory,
//! decode-then-GEMM and the FP8 GEMM against cuBLAS), so logits agree to a tolerance and
//! greedy tokens agree except at near-ties. The FP8 GEMM also quantizes the activations
//! (E4M3 per row and 128 values, as vLLM's block-FP8 path does): its tolerance is its own.

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::cuda::{CudaBackend, QuantGemm};
use encore_core::kv::SeqId;
use encore_core::model::config::ModelConfig;
use encore_core::model::formats::WeightFormats;
use encore_core::model::llama::Model;
use encore_core::model::weights::{self, WeightSource};
use encore_core::quant::QuantFormat;
use encore_core::request::SamplingParams;
use encore_core::runner::{Runner, RunnerConfig, SeqStep, Seqs};
use encore_core::{Backend, DType};

mod common;

/// A Llama whose every matrix width is a multiple of 256 (the K-quant block).
fn config(fmt: QuantFormat) -> ModelConfig {
    let mut cfg = ModelConfig::dummy("tiny-llama3").unwrap();
    cfg.hidden_size = 256;
    cfg.intermediate_size = 512;
    cfg.num_heads = 4;
    cfg.num_kv_heads = 2;
    cfg.head_dim = 64;
    cfg.rope.rot_dim = 64;
    cfg.num_layers = 2;
    cfg.tie_word_embeddings = false;
    cfg.weights = WeightFormats {
        projections: Some(fmt),
        ..Default::default()
    };
    cfg
}

/// The f32 logits of a fixed teacher-forced schedule: two prompts prefilled together (19
/// and 11 rows: the large-m matmul path), then four decode steps of both (the GEMV path).
fn logits(be: &dyn Backend, model: Model) -> Vec<Vec<f32>> {
    let rc = RunnerConfig {
        block_size: 4,
        num_blocks: 33,
        max_tokens_per_step: 32,
        max_seqs: 2,
        max_seq_len: 64,
        penalty_slots: 0,
        kv_dtype: None,
    };
    let vocab = model.cfg.vocab_size as u32;
    let mut r = Runner::new(be, model, rc).unwrap();
    let mut seqs = Seqs::for_runner(&r).unwrap();
    let prompt: Vec<u32> = (0..19).map(|i| (i * 37 + 5) % vocab).collect();
    let (a, b) = (SeqId(0), SeqId(1));
    let mut out = Vec::new();
    let mut step = |r: &mut Runner<'_>, batch: &[(SeqId, &[u32])]| {
        for &(s, toks) in batch {
            if seqs.blocks.block_table(s).is_ok() {
                seqs.blocks.append(s, toks.len()).unwrap();
            } else {
                seqs.blocks.allocate(s, toks.len()).unwrap();
            }
        }
        let steps: Vec<SeqStep<'_>> = batch
            .iter()
            .map(|&(seq, tokens)| SeqStep {
                seq,
                tokens,
                sampling: SamplingParams::default(),
                masked: false,
                score: None,
                verify: false,
                logit_bias: &[],
            })
            .collect();
        let (_, l) = r.step_with_logits(&mut seqs, &steps).unwrap();
        out.extend(l);
    };
    step(&mut r, &[(a, &prompt), (b, &prompt[..11])]);
    for t in 0..4u32 {
        step(&mut r, &[(a, &[t * 11 + 1]), (b, &[t * 7 + 2])]);
    }
    out
}

/// The quantized model of `cfg` in `dtype` and its dequantized twin, on `be`.
fn pair(be: &dyn Backend, cfg: &ModelConfig, dtype: DType) -> (Model, Model) {
    let w = weights::load(
        be,
        cfg,
        WeightSource::Dummy { seed: 7 },
        dtype,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    let twin_w = weights::dequantized(be, &w).unwrap();
    let mut twin_cfg = cfg.clone();
    twin_cfg.weights = WeightFormats::default();
    let q = Model::new(be, cfg.clone(), w, 64).unwrap();
    let twin = Model::new(be, twin_cfg, twin_w, 64).unwrap();
    (q, twin)
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

/// Logits within `tol` (relative, per row) and the same argmax unless the twin's top two
/// are within `tie` of each other.
fn assert_close(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], tol: f64, tie: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let num: f64 = g.iter().zip(w).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let den: f64 = w.iter().map(|y| (*y as f64).powi(2)).sum();
        let e = (num / den.max(1e-30)).sqrt();
        if i == 0 {
            eprintln!("{what}: first logits row relative error {e:.2e}");
        }
        assert!(e < tol, "{what}: logits row {i}: relative error {e:.2e}");
        let (ga, wa) = (argmax(g), argmax(w));
        assert!(
            ga == wa || (w[wa] - w[ga]).abs() <= tie,
            "{what}: row {i}: token {ga} vs the twin's {wa} ({} vs {})",
            w[ga],
            w[wa]
        );
    }
}

#[test]
fn quantized_models_match_their_dequantized_twin_on_the_cpu() {
    let be = CpuBackend::new();
    for fmt in QuantFormat::ALL {
        let (q, twin) = pair(&be, &config(fmt), DType::F32);
        let (got, want) = (logits(&be, q), logits(&be, twin));
        // The CPU matmul decodes the weights and then runs the dense arithmetic.
        assert_eq!(got, want, "{fmt}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn quantized_models_match_their_dequantized_twin_on_cuda() {
    for mode in [QuantGemm::Auto, QuantGemm::Mma, QuantGemm::Dequant] {
        let be = CudaBackend::new(0).unwrap().with_quant_gemm(mode);
        for fmt in QuantFormat::ALL {
            let (q, twin) = pair(&be, &config(fmt), DType::F32);
            let (got, want) = (logits(&be, q), logits(&be, twin));
            assert_close(&format!("{mode:?} {fmt} f32"), &got, &want, 1e-4, 1e-3);
            // bf16: the twin holds the decoded weights rounded to bf16, the kernels decode
            // exactly, so they differ by about one bf16 rounding of the weights. The FP8
            // GEMM's E4M3 activations (Auto) cost about 2^-4 relative per value.
            let (q, twin) = pair(&be, &config(fmt), DType::BF16);
            let (got, want) = (logits(&be, q), logits(&be, twin));
            let fp8_gemm = mode == QuantGemm::Auto && fmt == QuantFormat::F8E4M3;
            let (tol, tie) = if fp8_gemm { (1e-1, 2e-1) } else { (3e-2, 5e-2) };
            assert_close(&format!("{mode:?} {fmt} bf16"), &got, &want, tol, tie);
        }
    }
}
