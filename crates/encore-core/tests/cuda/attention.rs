//! The CUDA attention kernels against the CPU: split-K decode replayed on new queries and
//! lengths, sliding windows over long contexts and in a model, the tensor-core prefill.

use super::*;

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
            sinks: None,
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
        sinks: false,
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
                sinks: false,
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
            sinks: false,
        },
        q: normal(r, rows * num_heads * head_dim, 1.0),
        k_cache: normal(r, num_blocks * block_size * row, 1.0),
        v_cache: normal(r, num_blocks * block_size * row, 1.0),
        kv8: None,
        sinks: None,
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
