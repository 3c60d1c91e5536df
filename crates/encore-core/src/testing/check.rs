//! The checks, for any backend: every op against the CPU backend, the CPU backend
//! against the f64 reference, a captured chain of ops replayed against eager runs, and
//! the operations a capture must refuse.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::backend::cpu::CpuBackend;
use crate::backend::{Attention, Backend, Sampling};
use crate::error::{Error, Result};
use crate::memory::Arena;
use crate::ops::RopeConfig;
use crate::tensor::{DType, Tensor};

use super::cases::{cases, compare, reference, run};
use super::compare::{
    allowed_sample_mismatches, normalized_error, tolerance, CheckResult, OpClass,
};
use super::host::{download_f64, poison, write_f32};
use super::inputs::{normal, rng};

/// Every op on fresh random inputs from `seed`, run on `backend` and on a fresh
/// [`CpuBackend`] with poisoned outputs, compared within [`tolerance`] (exactly when
/// `backend` is itself a CPU backend). Sampled ids may differ in 1 row per 100 (draws at
/// float-rounding distance from a CDF boundary); greedy rows must match exactly. An op
/// that returns an error on `backend` gives a failed result carrying the message.
pub fn check_backend_against_cpu(backend: &dyn Backend, seed: u64) -> Result<Vec<CheckResult>> {
    let cpu = CpuBackend::new();
    let exact = backend.device_name() == cpu.device_name();
    let mut results = Vec::new();
    for case in cases(seed) {
        // An op that fails on `backend` is a failed check, not the end of the report.
        let got = match run(backend, &case) {
            Ok(got) => got,
            Err(err) => {
                results.push(CheckResult::errored(
                    &case.name,
                    &case.shape,
                    case.dtype,
                    &err,
                ));
                continue;
            }
        };
        let want = run(&cpu, &case)?;
        results.extend(compare(&case, &got, &want, exact));
    }
    Ok(results)
}

/// Every op on fresh random inputs from `seed`, run on the CPU backend and compared with
/// the naive f64 reference ([`super::reference`]).
pub fn check_cpu_against_reference(seed: u64) -> Result<Vec<CheckResult>> {
    let cpu = CpuBackend::new();
    let mut results = Vec::new();
    for case in cases(seed) {
        let got = run(&cpu, &case)?;
        results.extend(compare(&case, &got, &reference(&case), false));
    }
    Ok(results)
}

/// Capture a decode-step-like chain of ops once (embedding → rms_norm+residual → q/k/v
/// matmuls → rope → kv_write → decode attention → o-proj → in-place rms_norm →
/// gate_up → silu_mul → lm-head matmul → argmax and sample) over fixed buffers, then for
/// several rounds write new step inputs (ids, positions, seq lens with padding rows,
/// slot mapping, block tables, sampling params, residual and caches), run the chain
/// eagerly and by replay, and compare. Intermediates come from a [`crate::memory::Arena`]
/// reset before the capture and before every eager run, as the engine does.
///
/// On the CPU the two runs must be bit-identical; elsewhere floats agree within
/// [`tolerance`] and tokens exactly when the logits are bit-identical.
pub fn check_capture_replay(backend: &dyn Backend, seed: u64) -> Result<Vec<CheckResult>> {
    let exact = backend.device_name() == "cpu";
    let mut rng = rng(seed);
    let mut results = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let chain = Chain::new(backend, &mut rng, dtype)?;
        let mut arena = Arena::new(backend, 1 << 20)?;
        // Inputs at capture time differ from every round's, so a baked value shows.
        chain.write_step(backend, &Step::random(&mut rng, &chain.dims, 4))?;
        arena.reset();
        backend.begin_capture()?;
        let recorded = chain.forward(backend, &mut arena);
        let graph = backend.end_capture();
        recorded?;
        let graph = graph?;
        for (round, active) in [4, 3, 1].into_iter().enumerate() {
            let step = Step::random(&mut rng, &chain.dims, active);
            chain.write_step(backend, &step)?;
            chain.poison(backend, &mut arena)?;
            arena.reset();
            chain.forward(backend, &mut arena)?;
            let eager = chain.read(backend)?;

            chain.write_step(backend, &step)?;
            chain.poison(backend, &mut arena)?;
            graph.replay()?;
            let replayed = chain.read(backend)?;

            let shape = format!("b={} active={active}", chain.dims.batch);
            let label = |what: &str| format!("capture replay #{round}: {what}");
            let identical_logits = replayed.logits == eager.logits;
            let float_checks = [
                (
                    "logits",
                    &replayed.logits,
                    &eager.logits,
                    OpClass::Reduction,
                ),
                (
                    "residual",
                    &replayed.residual,
                    &eager.residual,
                    OpClass::Pointwise,
                ),
                ("k_cache", &replayed.k_cache, &eager.k_cache, OpClass::Copy),
                ("v_cache", &replayed.v_cache, &eager.v_cache, OpClass::Copy),
            ];
            for (what, got, want, class) in float_checks {
                let tol = if exact { 0.0 } else { tolerance(class, dtype) };
                let err = normalized_error(got, want);
                results.push(CheckResult::new(
                    label(what),
                    shape.clone(),
                    dtype,
                    err,
                    tol,
                ));
            }
            let allowed = if exact || identical_logits {
                0
            } else {
                allowed_sample_mismatches(chain.dims.batch)
            };
            for (what, got, want) in [
                ("argmax", &replayed.greedy, &eager.greedy),
                ("sample", &replayed.sampled, &eager.sampled),
            ] {
                let differ = got.iter().zip(want.iter()).filter(|(a, b)| a != b).count();
                results.push(CheckResult::new(
                    label(what),
                    shape.clone(),
                    dtype,
                    differ as f64,
                    allowed as f64,
                ));
            }
        }
    }
    Ok(results)
}

/// `alloc`, `write_bytes`, `read_bytes` and `synchronize` during a capture must each fail
/// with [`Error::CaptureViolation`] naming the operation; ops recorded around them still
/// replay, and after `end_capture` the backend works normally.
pub fn check_capture_forbidden(backend: &dyn Backend) -> Result<()> {
    const OP: &str = "check_capture_forbidden";
    let input = [-2.0f32, -0.5, 0.0, 1.0, 3.0, 0.5, 2.0, -1.0];
    let expected: Vec<f32> = (0..4)
        .map(|j| {
            let g = input[j] as f64;
            (g / (1.0 + (-g).exp()) * input[4 + j] as f64) as f32
        })
        .collect();
    let gate_up = backend.upload(&input, &[1, 8])?;
    let out = backend.alloc(DType::F32, &[1, 4])?;
    let bytes = backend.alloc(DType::F32, &[4])?;
    let mut staging = backend.alloc_staging(16)?;

    backend.begin_capture()?;
    let capturing = backend.is_capturing();
    let recorded_before = backend.silu_mul(&gate_up, &out);
    let attempts: [(&str, Result<()>); 6] = [
        ("alloc", backend.alloc(DType::F32, &[4]).map(drop)),
        ("write_bytes", backend.write_bytes(&bytes, &[0u8; 16])),
        ("read_bytes", backend.read_bytes(&bytes, &mut [0u8; 16])),
        ("synchronize", backend.synchronize()),
        ("alloc_staging", backend.alloc_staging(16).map(drop)),
        (
            "upload_staging",
            backend.upload_staging(&mut staging, &bytes),
        ),
    ];
    let recorded_after = backend.silu_mul(&gate_up, &out);
    let graph = backend.end_capture();

    if !capturing {
        return Err(Error::invalid(
            OP,
            "is_capturing() was false after begin_capture",
        ));
    }
    if backend.is_capturing() {
        return Err(Error::invalid(
            OP,
            "is_capturing() still true after end_capture",
        ));
    }
    for (name, result) in attempts {
        match result {
            Err(Error::CaptureViolation { op }) if op.contains(name) => {}
            other => {
                return Err(Error::invalid(
                    OP,
                    format!(
                    "`{name}` during capture gave {other:?}, expected CaptureViolation naming it"
                ),
                ))
            }
        }
    }
    recorded_before?;
    recorded_after?;
    let graph = graph?;

    // The recorded ops replay; the backend copies, allocates and synchronises again.
    poison(backend, &out)?;
    graph.replay()?;
    check_close(
        OP,
        "replayed silu_mul",
        &backend.download::<f32>(&out)?,
        &expected,
    )?;
    let fresh = backend.alloc(DType::F32, &[1, 4])?;
    poison(backend, &fresh)?;
    backend.silu_mul(&gate_up, &fresh)?;
    backend.synchronize()?;
    check_close(
        OP,
        "eager silu_mul after capture",
        &backend.download::<f32>(&fresh)?,
        &expected,
    )?;
    Ok(())
}

fn check_close(op: &'static str, what: &str, got: &[f32], want: &[f32]) -> Result<()> {
    let ok = got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= 1e-5 * (1.0 + w.abs()));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("{what}: got {got:?}, expected {want:?}"),
        ))
    }
}

/// The capture chain's sizes: a toy decode step.
struct Dims {
    batch: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
    block_size: usize,
    table_width: usize,
    num_blocks: usize,
    max_positions: usize,
}

const DIMS: Dims = Dims {
    batch: 4,
    hidden: 64,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    inter: 96,
    vocab: 100,
    block_size: 8,
    table_width: 4,
    num_blocks: 20,
    max_positions: 64,
};

/// One step's inputs (what the engine writes into persistent buffers before a replay).
struct Step {
    ids: Vec<i32>,
    positions: Vec<i32>,
    seq_lens: Vec<i32>,
    slot_mapping: Vec<i32>,
    block_tables: Vec<i32>,
    temperature: Vec<f32>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    seeds: Vec<i64>,
    residual: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
}

impl Step {
    /// `active` real sequences, the rest padding (seq_len 0, slot -1).
    fn random(rng: &mut StdRng, d: &Dims, active: usize) -> Step {
        let capacity = d.block_size * d.table_width;
        let mut pool: Vec<i32> = (0..d.num_blocks as i32).collect();
        pool.shuffle(rng);
        let block_tables = pool[..d.batch * d.table_width].to_vec();
        let seq_lens: Vec<i32> = (0..d.batch)
            .map(|s| {
                if s < active {
                    rng.random_range(1..=capacity) as i32
                } else {
                    0
                }
            })
            .collect();
        let positions = seq_lens.iter().map(|&l| (l - 1).max(0)).collect();
        let slot_mapping = seq_lens
            .iter()
            .enumerate()
            .map(|(s, &len)| {
                if len == 0 {
                    return -1;
                }
                let t = len as usize - 1;
                block_tables[s * d.table_width + t / d.block_size] * d.block_size as i32
                    + (t % d.block_size) as i32
            })
            .collect();
        let cache = d.num_blocks * d.block_size * d.kv_heads * d.head_dim;
        Step {
            ids: (0..d.batch)
                .map(|_| rng.random_range(0..d.vocab as i32))
                .collect(),
            positions,
            seq_lens,
            slot_mapping,
            block_tables,
            temperature: (0..d.batch)
                .map(|_| [0.0, 0.8, 1.0][rng.random_range(0..3)])
                .collect(),
            top_k: (0..d.batch)
                .map(|_| [0, 5, 20][rng.random_range(0..3)])
                .collect(),
            top_p: (0..d.batch)
                .map(|_| [1.0, 0.9][rng.random_range(0..2)])
                .collect(),
            seeds: (0..d.batch).map(|_| rng.random()).collect(),
            residual: normal(rng, d.batch * d.hidden, 1.0),
            k_cache: normal(rng, cache, 1.0),
            v_cache: normal(rng, cache, 1.0),
        }
    }
}

/// What a chain run leaves behind.
struct ChainOutputs {
    logits: Vec<f64>,
    residual: Vec<f64>,
    k_cache: Vec<f64>,
    v_cache: Vec<f64>,
    greedy: Vec<i32>,
    sampled: Vec<i32>,
}

/// The capture chain's fixed buffers: weights, persistent inputs, state and outputs.
struct Chain {
    dims: Dims,
    embed: Tensor,
    norm1: Tensor,
    norm2: Tensor,
    wq: Tensor,
    bq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    w_gate_up: Tensor,
    w_lm: Tensor,
    cos_sin: Tensor,
    ids: Tensor,
    positions: Tensor,
    seq_lens: Tensor,
    slot_mapping: Tensor,
    block_tables: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seeds: Tensor,
    residual: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    scratch: Tensor,
    logits: Tensor,
    greedy: Tensor,
    sampled: Tensor,
}

impl Chain {
    fn new(b: &dyn Backend, rng: &mut StdRng, dtype: DType) -> Result<Chain> {
        let d = DIMS;
        let qd = d.heads * d.head_dim;
        let kvd = d.kv_heads * d.head_dim;
        let mut weight = |rows: usize, cols: usize| {
            let w = normal(rng, rows * cols, 1.0 / (cols as f32).sqrt());
            b.upload_f32_as(&w, &[rows, cols], dtype)
        };
        let (wq, wk, wv) = (
            weight(qd, d.hidden)?,
            weight(kvd, d.hidden)?,
            weight(kvd, d.hidden)?,
        );
        let (wo, w_gate_up) = (weight(d.hidden, qd)?, weight(2 * d.inter, d.hidden)?);
        let w_lm = weight(d.vocab, d.inter)?;
        let embed = b.upload_f32_as(
            &normal(rng, d.vocab * d.hidden, 1.0),
            &[d.vocab, d.hidden],
            dtype,
        )?;
        let ones = |n: usize| b.upload_f32_as(&vec![1.0; n], &[n], dtype);
        let (norm1, norm2) = (ones(d.hidden)?, ones(d.hidden)?);
        let bq = b.upload_f32_as(&normal(rng, qd, 0.5), &[qd], dtype)?;
        let rope = RopeConfig {
            rot_dim: d.head_dim,
            theta: 10_000.0,
            llama3: None,
        };
        let cos_sin = b.upload(
            &rope.cos_sin_table(d.max_positions),
            &[d.max_positions, d.head_dim],
        )?;
        let i32s = |shape: &[usize]| b.alloc(DType::I32, shape);
        let batch = [d.batch];
        let cache = [d.num_blocks, d.block_size, d.kv_heads, d.head_dim];
        let scratch_len =
            b.attention_scratch_len(d.batch, d.heads, d.head_dim, d.table_width, d.block_size);
        Ok(Chain {
            embed,
            norm1,
            norm2,
            wq,
            bq,
            wk,
            wv,
            wo,
            w_gate_up,
            w_lm,
            cos_sin,
            ids: i32s(&batch)?,
            positions: i32s(&batch)?,
            seq_lens: i32s(&batch)?,
            slot_mapping: i32s(&batch)?,
            block_tables: i32s(&[d.batch, d.table_width])?,
            temperature: b.alloc(DType::F32, &batch)?,
            top_k: i32s(&batch)?,
            top_p: b.alloc(DType::F32, &batch)?,
            seeds: b.alloc(DType::I64, &batch)?,
            residual: b.alloc(dtype, &[d.batch, d.hidden])?,
            k_cache: b.alloc(dtype, &cache)?,
            v_cache: b.alloc(dtype, &cache)?,
            scratch: b.alloc(DType::F32, &[scratch_len.max(1)])?,
            logits: b.alloc(DType::F32, &[d.batch, d.vocab])?,
            greedy: i32s(&batch)?,
            sampled: i32s(&batch)?,
            dims: d,
        })
    }

    fn write_step(&self, b: &dyn Backend, s: &Step) -> Result<()> {
        b.write(&self.ids, &s.ids)?;
        b.write(&self.positions, &s.positions)?;
        b.write(&self.seq_lens, &s.seq_lens)?;
        b.write(&self.slot_mapping, &s.slot_mapping)?;
        b.write(&self.block_tables, &s.block_tables)?;
        b.write(&self.temperature, &s.temperature)?;
        b.write(&self.top_k, &s.top_k)?;
        b.write(&self.top_p, &s.top_p)?;
        b.write(&self.seeds, &s.seeds)?;
        write_f32(b, &self.residual, &s.residual)?;
        write_f32(b, &self.k_cache, &s.k_cache)?;
        write_f32(b, &self.v_cache, &s.v_cache)
    }

    /// Poison every intermediate (the whole arena) and every output.
    fn poison(&self, b: &dyn Backend, arena: &mut Arena) -> Result<()> {
        arena.reset();
        let all = arena.alloc(DType::BF16, &[arena.capacity() / 2])?;
        poison(b, &all)?;
        arena.reset();
        for t in [&self.logits, &self.greedy, &self.sampled, &self.scratch] {
            poison(b, t)?;
        }
        Ok(())
    }

    /// Issue the chain (run it, or record it when `b` is capturing).
    fn forward(&self, b: &dyn Backend, arena: &mut Arena) -> Result<()> {
        let d = &self.dims;
        let dt = self.embed.dtype();
        let (n, qd, kvd) = (d.batch, d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let h = arena.alloc(dt, &[n, d.hidden])?;
        b.embedding(&self.ids, &self.embed, &h)?;
        let normed = arena.alloc(dt, &[n, d.hidden])?;
        b.rms_norm(&h, Some(&self.residual), &self.norm1, 1e-5, &normed)?;
        let (q, k, v) = (
            arena.alloc(dt, &[n, qd])?,
            arena.alloc(dt, &[n, kvd])?,
            arena.alloc(dt, &[n, kvd])?,
        );
        b.matmul(&normed, &self.wq, Some(&self.bq), &q)?;
        b.matmul(&normed, &self.wk, None, &k)?;
        b.matmul(&normed, &self.wv, None, &v)?;
        let q = q.reshape(&[n, d.heads, d.head_dim])?;
        let k = k.reshape(&[n, d.kv_heads, d.head_dim])?;
        let v = v.reshape(&[n, d.kv_heads, d.head_dim])?;
        b.rope(&q, &k, &self.positions, &self.cos_sin)?;
        b.kv_write(&k, &v, &self.k_cache, &self.v_cache, &self.slot_mapping)?;
        let attn = arena.alloc(dt, &[n, d.heads, d.head_dim])?;
        b.attention(&Attention {
            q: &q,
            k_cache: &self.k_cache,
            v_cache: &self.v_cache,
            block_tables: &self.block_tables,
            seq_lens: &self.seq_lens,
            cu_seqlens_q: None,
            scale: 1.0 / (d.head_dim as f32).sqrt(),
            window: None,
            out: &attn,
            scratch: &self.scratch,
        })?;
        let o = arena.alloc(dt, &[n, d.hidden])?;
        b.matmul(&attn.reshape(&[n, qd])?, &self.wo, None, &o)?;
        b.rms_norm(&o, Some(&self.residual), &self.norm2, 1e-5, &o)?;
        let gate_up = arena.alloc(dt, &[n, 2 * d.inter])?;
        b.matmul(&o, &self.w_gate_up, None, &gate_up)?;
        let act = arena.alloc(dt, &[n, d.inter])?;
        b.silu_mul(&gate_up, &act)?;
        b.matmul(&act, &self.w_lm, None, &self.logits)?;
        b.argmax(&self.logits, &self.greedy)?;
        let params = Sampling {
            temperature: &self.temperature,
            top_k: &self.top_k,
            top_p: &self.top_p,
            seeds: &self.seeds,
        };
        b.sample(&self.logits, &params, &self.sampled)
    }

    fn read(&self, b: &dyn Backend) -> Result<ChainOutputs> {
        Ok(ChainOutputs {
            logits: download_f64(b, &self.logits)?,
            residual: download_f64(b, &self.residual)?,
            k_cache: download_f64(b, &self.k_cache)?,
            v_cache: download_f64(b, &self.v_cache)?,
            greedy: b.download(&self.greedy)?,
            sampled: b.download(&self.sampled)?,
        })
    }
}
