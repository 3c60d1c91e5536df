//! GPU tests: every CUDA kernel against the CPU reference on fresh random inputs, CUDA
//! graph capture/replay against eager, capture-safety errors, and the CUDA-specific
//! mechanics (kernel cache, GEMM plans, device checks). Run on the GPU machine with
//! `--include-ignored` (scripts/gpu-check.sh).

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::cuda::CudaBackend;
use encore_core::{testing, Attention, Backend, DType, Error, KvScale};

#[path = "../common/mod.rs"]
mod common;
mod layer_norm;

/// The tests of this binary run one at a time: a backend has one stream, and a capture
/// on it must not see another test's launches (the engine drives a backend from one
/// thread; tests must too).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// One backend for the whole binary: opening compiles/loads every kernel.
fn cuda() -> Arc<CudaBackend> {
    static BE: OnceLock<Arc<CudaBackend>> = OnceLock::new();
    BE.get_or_init(|| Arc::new(CudaBackend::new(0).unwrap_or_else(|e| panic!("{e}"))))
        .clone()
}

/// A seed of the clock, printed (a failed test shows it: `encore info --device cuda --seed
/// N` runs the kernel checks again on it, with `ENCORE_GEMV_MAX_ROWS=8` as
/// `gemv_kernels_match_cpu_for_every_row_count` does).
fn fresh_seed() -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("fresh seed {seed}");
    seed
}

fn assert_all_pass(results: &[testing::CheckResult]) {
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.pass)
        .map(|r| format!("{r:?}"))
        .collect();
    assert!(!results.is_empty());
    assert!(
        failed.is_empty(),
        "{} of {} checks failed:\n{}",
        failed.len(),
        results.len(),
        failed.join("\n")
    );
}

/// Prompt log-probabilities (`echo` with `logprobs`, `prompt_logprobs`) on the GPU: the
/// scored rows' kernel path (a target token per row) against teacher forcing, in chunks,
/// beside plain requests, through preemption.
#[test]
#[ignore = "needs a CUDA device"]
fn prompt_logprobs_on_the_gpu() {
    let _g = serial();
    let be = cuda();
    common::check_prompt_logprobs(be.as_ref(), 5e-3);
}

/// Logit biases on the GPU, eager and in graphs (the same checks as on the CPU), and
/// the kernel against the reference on random rows.
#[test]
#[ignore = "needs a CUDA device"]
fn logit_bias_on_the_gpu() {
    let _g = serial();
    let be = cuda();
    common::check_logit_bias(be.as_ref());
    let (rows, vocab, k) = (5, 1000, 7);
    let mut rng = fresh_seed();
    let mut next = || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) as u32
    };
    let logits: Vec<f32> = (0..rows * vocab)
        .map(|_| (next() % 2000) as f32 / 100.0 - 10.0)
        .collect();
    let count: Vec<i32> = (0..rows).map(|r| (r as i32 * 2).min(k as i32)).collect();
    let mut ids = vec![0i32; rows * k];
    let mut vals = vec![0f32; rows * k];
    for r in 0..rows {
        for j in 0..k {
            // Distinct ids per row; one past the vocabulary, skipped.
            ids[r * k + j] = if j == 3 {
                vocab as i32
            } else {
                (j * 131 + r) as i32 % vocab as i32
            };
            vals[r * k + j] = (next() % 400) as f32 / 2.0 - 100.0;
        }
    }
    let up = |dtype, shape: &[usize], bytes: &[u8]| {
        let t = be.alloc(dtype, shape).unwrap();
        be.write_bytes(&t, bytes).unwrap();
        t
    };
    let lt = up(DType::F32, &[rows, vocab], bytemuck::cast_slice(&logits));
    let it = up(DType::I32, &[rows, k], bytemuck::cast_slice(&ids));
    let vt = up(DType::F32, &[rows, k], bytemuck::cast_slice(&vals));
    let ct = up(DType::I32, &[rows], bytemuck::cast_slice(&count));
    be.logit_bias(
        &lt,
        &encore_core::LogitBias {
            ids: &it,
            vals: &vt,
            count: &ct,
        },
    )
    .unwrap();
    let got = (be.as_ref() as &dyn Backend).download::<f32>(&lt).unwrap();
    let mut want = logits.clone();
    encore_core::ops::logit_bias_ref(&mut want, vocab, &ids, &vals, &count);
    assert_eq!(got, want);
}

#[test]
#[ignore = "needs a CUDA device"]
fn kernels_match_cpu() {
    let _serial = serial();
    let be = cuda();
    for seed in [1, fresh_seed()] {
        eprintln!("seed {seed}");
        assert_all_pass(&testing::check_backend_against_cpu(be.as_ref(), seed).unwrap());
    }
}

/// Page-locked staging: the upload is asynchronous, and rewriting the staging right after
/// it waits for the copy, so the device holds exactly what was staged at upload time.
#[test]
#[ignore = "needs a CUDA device"]
fn pinned_staging_uploads_asynchronously_and_is_never_overwritten_in_flight() {
    let _serial = serial();
    let be = cuda();
    let be: &dyn Backend = be.as_ref();
    let n = 1 << 22; // 16 MiB: long enough for a rewrite to race an unguarded copy
    let mut st = be.alloc_staging(4 * n).unwrap();
    assert!(st.is_pinned());
    let dst = be.alloc(DType::I32, &[n]).unwrap();
    for round in 0..3i32 {
        let fill = |b: &mut [u8], v: i32| {
            for (i, c) in b.chunks_exact_mut(4).enumerate() {
                c.copy_from_slice(&(v * 7919 + i as i32).to_le_bytes());
            }
        };
        fill(st.bytes_mut().unwrap(), round);
        be.upload_staging(&mut st, &dst).unwrap();
        // Rewrite at once: bytes_mut must wait for the copy above.
        fill(st.bytes_mut().unwrap(), -1 - round);
        let got = be.download::<i32>(&dst).unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &v)| v == round * 7919 + i as i32),
            "round {round}"
        );
    }
    let small = be.alloc(DType::I32, &[2 * n]).unwrap();
    assert!(be.upload_staging(&mut st, &small).is_err());
}

/// Every matmul of 1..=8 rows through the gemv kernels (the default sends only 1-row
/// matmuls there), against the CPU.
#[test]
#[ignore = "needs a CUDA device"]
fn gemv_kernels_match_cpu_for_every_row_count() {
    let _serial = serial();
    let mut be = CudaBackend::new(0).unwrap();
    be.set_gemv_max_rows(8);
    let results = testing::check_backend_against_cpu(&be, fresh_seed()).unwrap();
    assert_all_pass(&results);
    assert!(results
        .iter()
        .any(|r| r.op.starts_with("matmul") && r.shape.starts_with("m=8 ")));
}

#[test]
#[ignore = "needs a CUDA device"]
fn capture_replay_matches_eager() {
    let _serial = serial();
    let be = cuda();
    for seed in [3, fresh_seed()] {
        assert_all_pass(&testing::check_capture_replay(be.as_ref(), seed).unwrap());
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn capture_forbidden_ops_are_errors() {
    let _serial = serial();
    // A backend of its own: a failed capture must not disturb other tests' work.
    let be = CudaBackend::new(0).unwrap();
    testing::check_capture_forbidden(&be).unwrap();
}

#[test]
#[ignore = "needs a CUDA device"]
fn graph_matmul_is_bit_identical_to_eager() {
    let _serial = serial();
    let be = cuda();
    let be: &dyn Backend = be.as_ref();
    let (m, n, k) = (7, 300, 130);
    let x = be
        .upload_f32_as(
            &(0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect::<Vec<_>>(),
            &[m, k],
            DType::BF16,
        )
        .unwrap();
    let w = be
        .upload_f32_as(
            &(0..n * k)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 64.0)
                .collect::<Vec<_>>(),
            &[n, k],
            DType::BF16,
        )
        .unwrap();
    let bias = be
        .upload_f32_as(
            &(0..n).map(|i| i as f32 / n as f32).collect::<Vec<_>>(),
            &[n],
            DType::BF16,
        )
        .unwrap();
    let eager = be.alloc(DType::BF16, &[m, n]).unwrap();
    let replayed = be.alloc(DType::BF16, &[m, n]).unwrap();
    be.matmul(&x, &w, Some(&bias), &eager).unwrap();
    be.begin_capture().unwrap();
    be.matmul(&x, &w, Some(&bias), &replayed).unwrap();
    let g = be.end_capture().unwrap();
    be.write::<half::bf16>(&replayed, &vec![half::bf16::NAN; m * n])
        .unwrap();
    g.replay().unwrap();
    let a = be.download::<half::bf16>(&eager).unwrap();
    let b = be.download::<half::bf16>(&replayed).unwrap();
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
#[ignore = "needs a CUDA device"]
fn gemm_plans_are_chosen_once_per_shape() {
    let _serial = serial();
    let be = CudaBackend::new(0).unwrap();
    // 17 rows: past the gemv kernels, so cuBLASLt plans it.
    let x = be.alloc(DType::BF16, &[17, 64]).unwrap();
    let w = be.alloc(DType::BF16, &[32, 64]).unwrap();
    let out = be.alloc(DType::F32, &[17, 32]).unwrap();
    assert_eq!(be.num_gemm_plans(), 0);
    for _ in 0..3 {
        be.matmul(&x, &w, None, &out).unwrap();
    }
    assert_eq!(be.num_gemm_plans(), 1);
    let out2 = be.alloc(DType::BF16, &[17, 32]).unwrap();
    be.matmul(&x, &w, None, &out2).unwrap();
    assert_eq!(be.num_gemm_plans(), 2);
    // One row takes the gemv kernels: no plan.
    let (x1, out1) = (x.narrow(0, 1).unwrap(), out.narrow(0, 1).unwrap());
    be.matmul(&x1, &w, None, &out1).unwrap();
    assert_eq!(be.num_gemm_plans(), 2);
}

#[test]
#[ignore = "needs a CUDA device"]
fn second_start_loads_kernels_from_the_cache() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("encore-cache-test-{}", std::process::id()));
    std::env::set_var("ENCORE_CACHE_DIR", &dir);
    let cold = CudaBackend::new(0).unwrap();
    let warm = CudaBackend::new(0).unwrap();
    let (c, w) = (cold.compile_report(), warm.compile_report());
    assert_eq!(c.cache_hits, 0, "{c:?}");
    assert_eq!(w.cache_hits, w.files, "{w:?}");
    assert!(w.seconds < c.seconds, "cached {w:?} vs cold {c:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "needs a CUDA device"]
fn cpu_tensor_on_cuda_op_names_the_tensor() {
    let _serial = serial();
    let be = cuda();
    let cpu = CpuBackend::new();
    let ids = cpu.alloc(DType::I32, &[2]).unwrap();
    let table = be.alloc(DType::BF16, &[10, 8]).unwrap();
    let out = be.alloc(DType::BF16, &[2, 8]).unwrap();
    let err = be.embedding(&ids, &table, &out).unwrap_err();
    assert!(
        matches!(err, Error::WrongDevice { name: "ids", .. }),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn buffers_are_released() {
    let _serial = serial();
    let be = CudaBackend::new(0).unwrap();
    let (free0, _) = be.mem_info().unwrap();
    for _ in 0..4 {
        let t = be.alloc(DType::F32, &[256 << 20]).unwrap();
        let (free1, _) = be.mem_info().unwrap();
        assert!(
            free1 + (1 << 30) <= free0 + (64 << 20),
            "1 GiB allocation not visible"
        );
        drop(t);
    }
    let (free2, _) = be.mem_info().unwrap();
    assert!(free2 + (64 << 20) >= free0, "leak: {free0} -> {free2}");
}

/// The device tensors of one attention launch of [`testing::inputs::AttentionInputs`].
struct AttentionOnDevice {
    q: encore_core::Tensor,
    k_cache: encore_core::Tensor,
    v_cache: encore_core::Tensor,
    tables: encore_core::Tensor,
    lens: encore_core::Tensor,
    cu: Option<encore_core::Tensor>,
    out: encore_core::Tensor,
    scratch: encore_core::Tensor,
    scale: f32,
    window: Option<usize>,
}

impl AttentionOnDevice {
    fn upload(be: &dyn Backend, i: &testing::inputs::AttentionInputs, dtype: DType) -> Self {
        let s = i.shape;
        let qs = [i.rows, s.num_heads, s.head_dim];
        let cache = [i.num_blocks, s.block_size, s.num_kv_heads, s.head_dim];
        let len =
            be.attention_scratch_len(i.rows, s.num_heads, s.head_dim, s.table_width, s.block_size);
        AttentionOnDevice {
            q: be.upload_f32_as(&i.q, &qs, dtype).unwrap(),
            k_cache: be.upload_f32_as(&i.k_cache, &cache, dtype).unwrap(),
            v_cache: be.upload_f32_as(&i.v_cache, &cache, dtype).unwrap(),
            tables: be
                .upload(&i.block_tables, &[s.num_seqs, s.table_width])
                .unwrap(),
            lens: be.upload(&i.seq_lens, &[s.num_seqs]).unwrap(),
            cu: i
                .cu_seqlens_q
                .as_ref()
                .map(|cu| be.upload(cu, &[cu.len()]).unwrap()),
            out: be.alloc(dtype, &qs).unwrap(),
            scratch: be.alloc(DType::F32, &[len.max(1)]).unwrap(),
            scale: i.scale,
            window: s.window,
        }
    }

    fn run(&self, be: &dyn Backend) {
        be.attention(&Attention {
            q: &self.q,
            k_cache: &self.k_cache,
            v_cache: &self.v_cache,
            kv_scale: KvScale::ONE,
            block_tables: &self.tables,
            seq_lens: &self.lens,
            cu_seqlens_q: self.cu.as_ref(),
            scale: self.scale,
            softcap: None,
            window: self.window,
            out: &self.out,
            scratch: &self.scratch,
        })
        .unwrap()
    }

    fn out(&self, be: &dyn Backend) -> Vec<f64> {
        be.download_f32(&self.out)
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect()
    }
}

/// Run one attention launch of `inputs` on `be`; the output as f64.
fn run_attention(be: &dyn Backend, i: &testing::inputs::AttentionInputs, dtype: DType) -> Vec<f64> {
    let a = AttentionOnDevice::upload(be, i, dtype);
    a.run(be);
    a.out(be)
}

/// The attention output of `inputs` on `be` and on the CPU agree within the reduction
/// tolerance of `dtype` (`what` names the case); returns `be`'s output.
fn assert_attention_matches_cpu(
    be: &dyn Backend,
    inputs: &testing::inputs::AttentionInputs,
    dtype: DType,
    what: std::fmt::Arguments<'_>,
) -> Vec<f64> {
    use testing::compare::{max_row_error, tolerance, OpClass};
    let got = run_attention(be, inputs, dtype);
    let want = run_attention(&CpuBackend::new(), inputs, dtype);
    let e = max_row_error(&got, &want, inputs.shape.head_dim);
    let tol = tolerance(OpClass::Reduction, dtype);
    assert!(e <= tol, "{what}: error {e:.2e} > {tol:.1e}");
    got
}

/// Eight sequences of 8 heads over 2 KV heads in blocks of 16.
fn attention_shape(
    head_dim: usize,
    table_width: usize,
    prefill: bool,
    max_q_len: usize,
    window: Option<usize>,
) -> testing::inputs::AttentionShape {
    testing::inputs::AttentionShape {
        num_seqs: 8,
        num_heads: 8,
        num_kv_heads: 2,
        head_dim,
        block_size: 16,
        table_width,
        prefill,
        max_q_len,
        window,
        softcap: None,
    }
}

/// Decode attention split over many CTAs per row (split-K, then the combine launch):
/// eager launches back to back, then one graph replayed on new queries and shorter
/// contexts (per-step data read on the device), each against the CPU kernel on the same
/// inputs. Shapes with one CTA per GQA group, groups cut into several CTAs, head_dim 64
/// to 256.
#[test]
#[ignore = "needs a CUDA device"]
fn split_attention_replays_on_new_queries_and_lengths() {
    use rand::Rng;
    use testing::inputs::{normal, rng, AttentionInputs, AttentionShape};
    let _serial = serial();
    let cuda = cuda();
    let be: &dyn Backend = cuda.as_ref();
    let cpu = CpuBackend::new();
    let mut r = rng(fresh_seed());
    for dtype in [DType::BF16, DType::F32] {
        for (num_seqs, num_heads, num_kv_heads, head_dim) in [
            (1, 8, 2, 128),
            (3, 32, 8, 64),
            (2, 16, 1, 256),
            (5, 4, 4, 128),
        ] {
            let shape = AttentionShape {
                num_seqs,
                num_heads,
                num_kv_heads,
                head_dim,
                block_size: 16,
                table_width: 256,
                prefill: false,
                max_q_len: 1,
                window: None,
                softcap: None,
            };
            let mut inputs = AttentionInputs::random(&mut r, shape);
            let full = inputs.seq_lens.clone();
            assert!(
                be.attention_scratch_len(inputs.rows, num_heads, head_dim, 256, 16) > 0,
                "the shape splits"
            );
            let a = AttentionOnDevice::upload(be, &inputs, dtype);
            let mut graph = None;
            for round in 0..6 {
                if round > 0 {
                    // New queries; each context at most its first length (the tables
                    // cover it), at least one token where it had one.
                    inputs.q = normal(&mut r, inputs.q.len(), 1.0);
                    for (l, &f) in inputs.seq_lens.iter_mut().zip(&full) {
                        *l = r.random_range(f.min(1)..=f);
                    }
                    let q = be.upload_f32_as(&inputs.q, a.q.shape(), dtype).unwrap();
                    be.copy(&q, &a.q).unwrap();
                    be.write(&a.lens, &inputs.seq_lens).unwrap();
                }
                match round {
                    0 | 1 => a.run(be),
                    2 => {
                        be.begin_capture().unwrap();
                        a.run(be);
                        graph = Some(be.end_capture().unwrap());
                        graph.as_ref().unwrap().replay().unwrap();
                    }
                    _ => graph.as_ref().unwrap().replay().unwrap(),
                }
                let got = a.out(be);
                let want = run_attention(&cpu, &inputs, dtype);
                use testing::compare::{max_row_error, tolerance, OpClass};
                let e = max_row_error(&got, &want, head_dim);
                let tol = tolerance(OpClass::Reduction, dtype);
                assert!(
                    e <= tol,
                    "{dtype} {num_seqs} seqs h={num_heads}/{num_kv_heads} hd={head_dim} \
                     round {round} (lens {:?}): error {e:.2e} > {tol:.1e}",
                    inputs.seq_lens
                );
            }
        }
    }
}

/// Sliding windows over contexts up to 8192 + 3 tokens (split-K decode, prefill rows):
/// CUDA, which streams only the window's blocks and plans its splits by the window, agrees
/// with the CPU kernel per (row, head).
#[test]
#[ignore = "needs a CUDA device"]
fn windowed_attention_over_long_contexts_matches_cpu() {
    use testing::inputs::{rng, AttentionInputs};
    let _serial = serial();
    let be = cuda();
    let mut r = rng(fresh_seed());
    for dtype in [DType::BF16, DType::F32] {
        for prefill in [false, true] {
            for window in [None, Some(1), Some(64), Some(1000), Some(4096), Some(9000)] {
                let shape = attention_shape(128, 512, prefill, 40, window);
                let inputs = AttentionInputs::random(&mut r, shape);
                assert_attention_matches_cpu(
                    be.as_ref(),
                    &inputs,
                    dtype,
                    format_args!("{dtype} prefill={prefill} window={window:?}"),
                );
            }
        }
    }
}

/// The whole forward with a sliding window (tiny Qwen2, window 5 from layer 1): prefill,
/// chunked prefill and decode past the window on CUDA agree with the CPU backend.
#[test]
#[ignore = "needs a CUDA device"]
fn windowed_model_matches_cpu() {
    use encore_core::kv::SeqId;
    use encore_core::model::config::{ModelConfig, SlidingWindow};
    use encore_core::request::SamplingParams;
    use encore_core::runner::{Runner, RunnerConfig, SeqStep, Seqs};
    let _serial = serial();
    let cuda = cuda();
    let cpu = CpuBackend::new();
    let cfg = ModelConfig {
        sliding_window: Some(SlidingWindow {
            size: 5,
            first_layer: 1,
        }),
        weights: Default::default(),
        ..ModelConfig::dummy("tiny-qwen2").unwrap()
    };
    let run = |be: &dyn Backend| -> Vec<Vec<f32>> {
        let model = common::dummy_model(be, cfg.clone(), 64);
        let mut r = Runner::new(
            be,
            model,
            RunnerConfig {
                block_size: 4,
                num_blocks: 33,
                max_tokens_per_step: 32,
                max_seqs: 2,
                max_seq_len: 64,
                penalty_slots: 0,
                kv_dtype: None,
            },
        )
        .unwrap();
        let mut seqs = Seqs::for_runner(&r).unwrap();
        let prompt: Vec<u32> = (0..19).map(|i| (i * 37 + 5) % 512).collect();
        let mut logits = Vec::new();
        let (a, b) = (SeqId(0), SeqId(1));
        let greedy = SamplingParams::default();
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
                    sampling: greedy,
                    masked: false,
                    score: None,
                    verify: false,
                    logit_bias: &[],
                })
                .collect();
            let (_, l) = r.step_with_logits(&mut seqs, &steps).unwrap();
            logits.extend(l);
        };
        // Prefill 11 tokens of a and 7 of b, then b's next 12 in a second chunk while a
        // decodes, then both decode.
        step(&mut r, &[(a, &prompt[..11]), (b, &prompt[..7])]);
        step(&mut r, &[(a, &[7]), (b, &prompt[7..])]);
        for t in 0..3u32 {
            step(&mut r, &[(a, &[t + 1]), (b, &[t + 2])]);
        }
        logits
    };
    let (got, want) = (run(cuda.as_ref()), run(&cpu));
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let num: f64 = g.iter().zip(w).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let den: f64 = w.iter().map(|y| (*y as f64).powi(2)).sum();
        let e = (num / den).sqrt();
        assert!(e < 1e-4, "logits row {i}: relative error {e:.2e}");
    }
}

/// Attention inputs with explicit sequences: `(query rows, tokens already cached before
/// them)` each, then `pad_rows` padding rows past `cu[num_seqs]`. Block tables hold
/// shuffled distinct block ids (one table row of spare width: -1 past each sequence's
/// blocks); with `bad_block`, the second block of the first sequence long enough has an id
/// outside the cache (it contributes nothing).
#[allow(clippy::too_many_arguments)]
fn prefill_inputs(
    r: &mut rand::rngs::StdRng,
    seqs: &[(usize, usize)],
    pad_rows: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    window: Option<usize>,
    bad_block: bool,
) -> testing::inputs::AttentionInputs {
    use rand::seq::SliceRandom;
    use testing::inputs::{normal, AttentionInputs, AttentionShape};
    let num_seqs = seqs.len();
    let seq_lens: Vec<i32> = seqs.iter().map(|&(q, c)| (q + c) as i32).collect();
    let table_width = seqs
        .iter()
        .map(|&(q, c)| (q + c).div_ceil(block_size))
        .max()
        .unwrap_or(0)
        + 1;
    let num_blocks = num_seqs * table_width + 2;
    let mut pool: Vec<i32> = (0..num_blocks as i32).collect();
    pool.shuffle(r);
    let mut block_tables = vec![-1; num_seqs * table_width];
    for (s, &len) in seq_lens.iter().enumerate() {
        for j in 0..(len as usize).div_ceil(block_size) {
            block_tables[s * table_width + j] = pool[s * table_width + j];
        }
    }
    if bad_block {
        if let Some(s) = (0..num_seqs).find(|&s| seq_lens[s] as usize > 2 * block_size) {
            block_tables[s * table_width + 1] = num_blocks as i32 + 7;
        }
    }
    let mut cu = vec![0i32];
    for (s, &(q, _)) in seqs.iter().enumerate() {
        cu.push(cu[s] + q as i32);
    }
    let rows = cu[num_seqs] as usize + pad_rows;
    let row = num_kv_heads * head_dim;
    AttentionInputs {
        shape: AttentionShape {
            num_seqs,
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            table_width,
            prefill: true,
            max_q_len: seqs.iter().map(|s| s.0).max().unwrap_or(0),
            window,
            softcap: None,
        },
        q: normal(r, rows * num_heads * head_dim, 1.0),
        k_cache: normal(r, num_blocks * block_size * row, 1.0),
        v_cache: normal(r, num_blocks * block_size * row, 1.0),
        kv8: None,
        block_tables,
        seq_lens,
        cu_seqlens_q: Some(cu),
        scale: 1.0 / (head_dim as f32).sqrt(),
        rows,
        num_blocks,
    }
}

/// The tensor-core prefill kernel (bf16 / f16, head_dim 64 / 128, steps with
/// `cu_seqlens_q`) against the CPU kernel: GQA groups 1 / 4 / 8, block sizes 16 and 8,
/// windows None / 1 / 64 / 1000, prompts of 1, 63, 64, 65, 300 and 1000 rows with and
/// without a cached prefix, mixed steps (1-row sequences over long cached contexts next to
/// prompts), a sequence with no rows, an out-of-range block id, and padding rows.
#[test]
#[ignore = "needs a CUDA device"]
fn prefill_attention_tensor_core_matches_cpu() {
    let _serial = serial();
    let be = cuda();
    let mut r = testing::inputs::rng(fresh_seed());
    // (query rows, cached tokens) per sequence, padding rows.
    let prefill_only: (&[(usize, usize)], usize) =
        (&[(1, 0), (63, 0), (64, 0), (65, 0), (300, 0), (1000, 0)], 0);
    let with_prefix: (&[(usize, usize)], usize) = (
        &[(65, 100), (300, 37), (64, 64), (1, 500), (0, 20), (130, 1)],
        3,
    );
    let mixed: (&[(usize, usize)], usize) = (
        &[
            (1, 1500),
            (300, 0),
            (1, 700),
            (1, 64),
            (63, 200),
            (1, 1),
            (1000, 24),
            (1, 2047),
        ],
        5,
    );
    let groups = [(4, 4), (8, 2), (16, 2)]; // GQA groups 1, 4, 8
    let mut case = 0usize;
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in [64, 128] {
            for window in [None, Some(1), Some(64), Some(1000)] {
                for (k, (seqs, pad)) in [prefill_only, with_prefix, mixed].iter().enumerate() {
                    let (nh, nkv) = groups[(case + k) % groups.len()];
                    let block_size = if (case + k).is_multiple_of(2) { 16 } else { 8 };
                    case += 1;
                    let inputs = prefill_inputs(
                        &mut r,
                        seqs,
                        *pad,
                        nh,
                        nkv,
                        head_dim,
                        block_size,
                        window,
                        k == 1,
                    );
                    let got = assert_attention_matches_cpu(
                        be.as_ref(),
                        &inputs,
                        dtype,
                        format_args!(
                            "{dtype} hd={head_dim} heads={nh}/{nkv} bs={block_size} \
                             window={window:?} seqs={seqs:?} pad={pad}"
                        ),
                    );
                    // Padding rows are zeros.
                    let row_elems = nh * head_dim;
                    let used = inputs.cu_seqlens_q.as_ref().unwrap()[seqs.len()] as usize;
                    assert!(got[used * row_elems..].iter().all(|&v| v == 0.0));
                }
            }
        }
    }
}

/// The random attention cases of the self-check (special sequence lengths, garbage block
/// ids, clamped contexts, rows at negative positions, padding) in prefill form, with
/// head_dim 64 and 128 in bf16 and f16 and more than 64 rows per sequence: the
/// tensor-core path agrees with the CPU kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn prefill_attention_tensor_core_random_cases_match_cpu() {
    use testing::inputs::{rng, AttentionInputs};
    let _serial = serial();
    let be = cuda();
    let mut r = rng(fresh_seed());
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in [64, 128] {
            for window in [None, Some(1), Some(64), Some(1000)] {
                let shape = attention_shape(head_dim, 40, true, 200, window);
                let inputs = AttentionInputs::random(&mut r, shape);
                assert_attention_matches_cpu(
                    be.as_ref(),
                    &inputs,
                    dtype,
                    format_args!("{dtype} hd={head_dim} window={window:?}"),
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn sampling_knobs_match_cpu() {
    // min-p, penalties (applied on the fly) and log-probabilities, alone and together,
    // against the CPU kernel on fresh random inputs (the cases of `testing::cases`).
    let _g = serial();
    let be = cuda();
    let results = testing::check_backend_against_cpu(be.as_ref(), fresh_seed()).unwrap();
    let sampling: Vec<_> = results
        .into_iter()
        .filter(|r| r.op.starts_with("sample("))
        .collect();
    for op in [
        "sample(min_p) (random rows)",
        "sample(penalties) (greedy rows)",
        "sample(logprobs): top_logprobs ids",
        "sample(logprobs): top_logprobs",
        "sample(min_p, penalties, logprobs): token logprob (greedy rows)",
    ] {
        assert!(sampling.iter().any(|r| r.op == op), "no check named `{op}`");
    }
    assert_all_pass(&sampling);
}

#[test]
#[ignore = "needs a CUDA device"]
fn sampling_counts_penalised_tokens_like_cpu() {
    // Greedy rows (so both backends pick the same tokens): the count table after one
    // sample call is the CPU's, rows without a valid slot count nothing.
    use encore_core::testing::inputs::{rng, SampleInputs};
    let _g = serial();
    let be = cuda();
    let cpu = CpuBackend::new();
    for (batch, vocab) in [(40, 1003), (6, 32_000)] {
        let mut r = rng(fresh_seed());
        let mut i = SampleInputs::random(&mut r, batch, vocab).with_penalties(&mut r);
        i.temperature.iter_mut().for_each(|t| *t = 0.0);
        let run = |b: &dyn Backend| -> (Vec<i32>, Vec<i32>) {
            let bs = [batch];
            let up = |v: &[f32]| b.upload(v, &bs).unwrap();
            let p = i.penalties.as_ref().unwrap();
            let counts = b.upload(&p.counts, &[p.slots, vocab]).unwrap();
            let slot = b.upload(&p.slot, &bs).unwrap();
            let (rep, freq, pres) = (up(&p.repetition), up(&p.frequency), up(&p.presence));
            let (t, tp, mp) = (up(&i.temperature), up(&i.top_p), up(&i.min_p));
            let k = b.upload(&i.top_k, &bs).unwrap();
            let seeds = b.upload(&i.seeds, &bs).unwrap();
            let logits = b.upload(&i.logits, &[batch, vocab]).unwrap();
            let out = b.alloc(DType::I32, &bs).unwrap();
            let params = encore_core::Sampling {
                temperature: &t,
                top_k: &k,
                top_p: &tp,
                min_p: &mp,
                seeds: &seeds,
                penalties: Some(encore_core::Penalties {
                    counts: &counts,
                    slot: &slot,
                    repetition: &rep,
                    frequency: &freq,
                    presence: &pres,
                }),
                logprobs: None,
                mask: None,
            };
            b.sample(&logits, &params, &out).unwrap();
            (b.download(&out).unwrap(), b.download(&counts).unwrap())
        };
        let (want_ids, want_counts) = run(&cpu);
        let (ids, counts) = run(be.as_ref());
        assert_eq!(ids, want_ids, "b={batch} vocab={vocab}");
        assert!(
            counts == want_counts,
            "b={batch} vocab={vocab}: count tables differ"
        );
        assert_ne!(counts, i.penalties.as_ref().unwrap().counts);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn h2d_bandwidth_is_a_page_locked_dma_rate() {
    let _serial = serial();
    let be = cuda();
    // Page-locked copies on the H100 host ran at 55 GB/s, pageable ones at 9 GB/s
    // (DESIGN.md); 15 GB/s separates them on any PCIe 4 or 5 host.
    let gbs = encore_core::bench::h2d_bandwidth(be.as_ref(), 256 << 20).unwrap();
    eprintln!("host-to-device {gbs:.1} GB/s");
    assert!(gbs.is_finite() && gbs > 15.0, "{gbs} GB/s");
}

/// `n` seeded samples (normal, std 0.5: the shared test inputs' generator).
fn uniform(n: usize, seed: u64) -> Vec<f32> {
    encore_core::testing::inputs::normal(&mut encore_core::testing::inputs::rng(seed), n, 0.5)
}

/// The mixture-of-experts op on CUDA against the CPU kernel on fresh random inputs (every
/// dtype, odd sizes, one and several chosen experts, renormalised or not): the same
/// experts chosen, the weights to f32 rounding, the output within the matmul tolerance;
/// then captured in a graph and replayed on new routing, equal to eager.
#[test]
#[ignore = "needs a CUDA device"]
fn moe_matches_cpu_and_replays() {
    let _serial = serial();
    let cpu = CpuBackend::new();
    let seed = fresh_seed();
    // (dtype, tokens, hidden, experts, expert width, top_k, renormalise)
    let cases = [
        (DType::F32, 5, 96, 6, 40, 2, true),
        (DType::BF16, 1, 128, 8, 64, 2, true),
        (DType::BF16, 33, 72, 60, 24, 4, false),
        (DType::F16, 3, 64, 4, 33, 1, true),
        (DType::BF16, 7, 64, 128, 16, 8, true),
        // The grouped GEMM's shapes: 32-row tiles, and 64-row tiles (over 32 pairs an
        // expert), some tiles partly padding.
        (DType::BF16, 40, 64, 8, 32, 2, true),
        (DType::F16, 300, 128, 4, 96, 2, false),
        (DType::BF16, 70, 96, 128, 64, 8, true),
    ];
    // The same layers on the pair kernels alone and on the grouped GEMM from one token on
    // (shapes it does not take stay on the pair kernels).
    let pairs = CudaBackend::new(0)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_moe_gemm_min_tokens(usize::MAX);
    let grouped = CudaBackend::new(0)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_moe_gemm_min_tokens(1);
    for (c, &(dt, n, h, e, i, k, renorm)) in cases.iter().enumerate() {
        let s = seed.wrapping_add(100 * c as u64);
        let x = uniform(n * h, s);
        // Logits spread out (no near ties between the CPU's and the GPU's sums).
        let logits: Vec<f32> = (0..n * e)
            .map(|j| ((j * 7919 + c) % e) as f32 * 0.21 + 0.01 * uniform(1, s + j as u64)[0])
            .collect();
        let scale = |v: Vec<f32>, fan_in: usize| -> Vec<f32> {
            v.iter().map(|x| x / (fan_in as f32).sqrt()).collect()
        };
        let gu = scale(uniform(2 * e * i * h, s + 1), h);
        let dn = scale(uniform(e * h * i, s + 2), i);
        let run = |be: &dyn Backend| {
            let xt = be.upload_f32_as(&x, &[n, h], dt).unwrap();
            let lt = be.upload_f32_as(&logits, &[n, e], dt).unwrap();
            let gt = be.upload_f32_as(&gu, &[2 * e * i, h], dt).unwrap();
            let dnt = be.upload_f32_as(&dn, &[e * h, i], dt).unwrap();
            let ids = be.alloc(DType::I32, &[n, k]).unwrap();
            let wts = be.alloc(DType::F32, &[n, k]).unwrap();
            let out = be.alloc(dt, &[n, h]).unwrap();
            let scratch = be.alloc(dt, &[n * k, i]).unwrap();
            let work_len = be.moe_workspace_bytes(n, h, e, k, dt).div_ceil(4).max(1);
            let work = be.alloc(DType::I32, &[work_len]).unwrap();
            be.moe(&encore_core::backend::Moe {
                x: &xt,
                logits: &lt,
                top_k: k,
                renormalize: renorm,
                gate_up: &gt,
                down: &dnt,
                ids: &ids,
                weights: &wts,
                out: &out,
                scratch: &scratch,
                workspace: &work,
                cache: None,
            })
            .unwrap();
            (
                be.download::<i32>(&ids).unwrap(),
                be.download::<f32>(&wts).unwrap(),
                be.download_f32(&out).unwrap(),
            )
        };
        let (ci, cw, co) = run(&cpu);
        for (path, be) in [("pairs", &pairs as &dyn Backend), ("grouped", &grouped)] {
            let (gi, gw, go) = run(be);
            let name =
                format!("case {c} ({dt}, n={n} h={h} e={e} i={i} k={k}, {path}) seed {seed}");
            assert_eq!(gi, ci, "{name}: chosen experts");
            for (g, w) in gw.iter().zip(&cw) {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{name}: weight {g} vs {w}"
                );
            }
            let err = testing::compare::normalized_error(
                &go.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                &co.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            );
            let tol = testing::compare::tolerance(testing::compare::OpClass::Reduction, dt);
            assert!(err <= tol, "{name}: normalised error {err:.3e} > {tol:.1e}");
        }
    }

    // Captured once, replayed on other logits: the graph reads the routing on the device
    // (the pair kernels at 4 tokens, the grouped GEMM's sort and tiles at 40).
    for (be, n, dt) in [
        (&pairs as &dyn Backend, 4, DType::F32),
        (&grouped, 40, DType::BF16),
    ] {
        replays_on_new_routing(be, n, dt, seed);
    }
}

/// One MoE layer of `n` tokens in `dt` captured once and replayed on three other
/// routings: the routing and the output equal to an eager run of each.
fn replays_on_new_routing(be: &dyn Backend, n: usize, dt: DType, seed: u64) {
    let (h, e, i, k) = (64, 8, 32, 2);
    let xt = be
        .upload_f32_as(&uniform(n * h, seed + 7), &[n, h], dt)
        .unwrap();
    let lt = be.alloc(DType::F32, &[n, e]).unwrap();
    let gt = be
        .upload_f32_as(&uniform(2 * e * i * h, seed + 8), &[2 * e * i, h], dt)
        .unwrap();
    let dnt = be
        .upload_f32_as(&uniform(e * h * i, seed + 9), &[e * h, i], dt)
        .unwrap();
    let ids = be.alloc(DType::I32, &[n, k]).unwrap();
    let wts = be.alloc(DType::F32, &[n, k]).unwrap();
    let out = be.alloc(dt, &[n, h]).unwrap();
    let scratch = be.alloc(dt, &[n * k, i]).unwrap();
    let work_len = be.moe_workspace_bytes(n, h, e, k, dt).div_ceil(4).max(1);
    let work = be.alloc(DType::I32, &[work_len]).unwrap();
    let moe = || {
        be.moe(&encore_core::backend::Moe {
            x: &xt,
            logits: &lt,
            top_k: k,
            renormalize: true,
            gate_up: &gt,
            down: &dnt,
            ids: &ids,
            weights: &wts,
            out: &out,
            scratch: &scratch,
            workspace: &work,
            cache: None,
        })
        .unwrap()
    };
    let routing = |r: u64| -> Vec<f32> {
        (0..n * e)
            .map(|j| ((j as u64 * 31 + r * 17) % e as u64) as f32 * 0.3)
            .collect()
    };
    be.write(&lt, &routing(0)).unwrap();
    be.begin_capture().unwrap();
    moe();
    let graph = be.end_capture().unwrap();
    for r in 1..4 {
        be.write(&lt, &routing(r)).unwrap();
        graph.replay().unwrap();
        let (replayed_ids, replayed) = (
            be.download::<i32>(&ids).unwrap(),
            be.download_f32(&out).unwrap(),
        );
        moe();
        assert_eq!(
            be.download::<i32>(&ids).unwrap(),
            replayed_ids,
            "{n} tokens, routing {r}"
        );
        assert_eq!(
            be.download_f32(&out).unwrap(),
            replayed,
            "{n} tokens, routing {r}: replay equals eager"
        );
    }
}
