//! Kernel micro-benchmarks behind `encore bench kernels`: GEMM throughput, paged decode
//! attention bandwidth, device copy bandwidth (the ceiling attention is compared with) and
//! per-kernel launch cost eager vs inside a graph; and the host-to-device bandwidth of the
//! weight offload copy queue (`encore bench offload`'s PCIe bound). Timings are host
//! clocks around batches of launches ended by a synchronise, warm-up excluded, median of
//! several repeats.

use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::args::Activation;
use crate::backend::{Attention, Backend, Graph};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};

/// One measured figure.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    /// Median seconds of one iteration.
    pub seconds: f64,
    pub detail: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The ops `f` enqueues, captured into one graph (the capture ends even where `f` fails).
pub fn capture(be: &dyn Backend, f: impl FnOnce() -> Result<()>) -> Result<Box<dyn Graph>> {
    be.begin_capture()?;
    let enqueued = f();
    let graph = be.end_capture();
    enqueued?;
    graph
}

/// Median seconds per call of `f`, timed in `repeats` batches of `iters` calls after
/// `iters` warm-up calls.
pub fn time_per_call(
    be: &dyn Backend,
    iters: usize,
    repeats: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..iters {
        f()?;
    }
    be.synchronize()?;
    let mut samples = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        be.synchronize()?;
        samples.push(t.elapsed().as_secs_f64() / iters as f64);
    }
    Ok(median(samples))
}

fn random_tensor(
    be: &dyn Backend,
    rng: &mut StdRng,
    shape: &[usize],
    dtype: DType,
    scale: f32,
) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
    be.upload_f32_as(&data, shape, dtype)
}

/// `out = x·wᵀ` at `m×n×k` in `dtype`, the weight in `dtype` or quantized to `format`
/// (as a checkpoint's is kept, e.g. FP8 on Hopper's FP8 GEMM): TFLOP/s. `by_block`: FP8
/// scaled per 128 values (a block-scaled checkpoint) instead of one scale a row (FP8
/// quantized at load, or a per-tensor or per-channel checkpoint: the row-wise GEMM).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    be: &dyn Backend,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    format: Option<crate::quant::QuantFormat>,
    by_block: bool,
    iters: usize,
) -> Result<BenchRow> {
    let mut rng = StdRng::seed_from_u64(1);
    let x = random_tensor(be, &mut rng, &[m, k], dtype, 1.0)?;
    let w = match format {
        None => random_tensor(be, &mut rng, &[n, k], dtype, 1.0)?,
        Some(f) => quantized_weight(be, &mut rng, m, n, k, dtype, f, by_block)?,
    };
    let out = be.alloc(dtype, &[m, n])?;
    let s = time_per_call(be, iters, 5, || be.matmul(&x, &w, None, &out))?;
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let wname = format.map_or(String::new(), |f| {
        let scales = match f {
            crate::quant::QuantFormat::F8E4M3 if by_block => "/128",
            crate::quant::QuantFormat::F8E4M3 => "/row",
            _ => "",
        };
        format!(" w={}{scales}", DType::Q(f))
    });
    Ok(BenchRow {
        name: format!("gemm {m}x{n}x{k} {dtype}{wname}"),
        value: flops / s / 1e12,
        unit: "TFLOP/s",
        seconds: s,
        detail: format!("{:.3} ms", s * 1e3),
    })
}

/// A random `[n, k]` weight quantized to `f` (`by_block`: FP8 per 128 values), marked one
/// scale a row as the model loader marks it, and the scratch a model reserves for its
/// largest weight (the dense copy, or the FP8 GEMM's quantized x and scales). Not given
/// its repacked copy (`prepare_weight`).
#[allow(clippy::too_many_arguments)]
fn quantized_weight(
    be: &dyn Backend,
    rng: &mut StdRng,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    f: crate::quant::QuantFormat,
    by_block: bool,
) -> Result<Tensor> {
    let v: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let wdt = DType::Q(f);
    let mut b = vec![0u8; wdt.bytes(&[n, k]).unwrap_or(0)];
    if by_block {
        crate::quant::quantize_rows_by_block(f, &v, k, &mut b);
    } else {
        crate::quant::quantize_rows(f, &v, k, &mut b);
    }
    let mut w = be.alloc(wdt, &[n, k])?;
    be.write_bytes(&w, &b)?;
    if crate::quant::rows_share_one_scale(f, k, &b) {
        w = w.with_row_scale();
    }
    be.reserve_dequant_scratch((n * k * dtype.size()).max(2 * m * k))?;
    Ok(w)
}

/// A quantized weight's GEMM `out = x·wᵀ` at `m×n×k` for each m of `ms`, both ways: with
/// the repacked copy the model loader makes (`prepare_weight`; on CUDA the mixed-input
/// `marlin` GEMM), then on the block layout alone (on CUDA under `ENCORE_QUANT_GEMM=auto`:
/// `qmma` up to 128 rows, decode-then-cuBLASLt above; `=mma`: `qmma` at every row, and no
/// copy is made, so both rows time it). TFLOP/s, two rows an m; one weight for all.
pub fn quant_gemm(
    be: &dyn Backend,
    ms: &[usize],
    n: usize,
    k: usize,
    dtype: DType,
    f: crate::quant::QuantFormat,
    iters: usize,
) -> Result<Vec<BenchRow>> {
    let mut rng = StdRng::seed_from_u64(1);
    let most = ms.iter().copied().max().unwrap_or(1);
    let x_all = random_tensor(be, &mut rng, &[most, k], dtype, 1.0)?;
    let block = quantized_weight(be, &mut rng, most, n, k, dtype, f, false)?;
    let repacked = be.prepare_weight(block.clone())?;
    let out_all = be.alloc(dtype, &[most, n])?;
    let mut rows = Vec::new();
    for &m in ms {
        let (x, out) = (x_all.prefix(m)?, out_all.prefix(m)?);
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        for (w, how) in [(&repacked, "repacked"), (&block, "block")] {
            let s = time_per_call(be, iters, 5, || be.matmul(&x, w, None, &out))?;
            let none = how == "repacked" && w.packed().is_none();
            rows.push(BenchRow {
                name: format!("gemm {m}x{n}x{k} {dtype} w={} {how}", DType::Q(f)),
                value: flops / s / 1e12,
                unit: "TFLOP/s",
                seconds: s,
                detail: format!(
                    "{:.3} ms{}",
                    s * 1e3,
                    if none { " (no copy made)" } else { "" }
                ),
            });
        }
    }
    Ok(rows)
}

/// Device-to-device copy of `bytes`: GB/s counting bytes read plus bytes written.
pub fn copy_bandwidth(be: &dyn Backend, bytes: usize, iters: usize) -> Result<BenchRow> {
    let a = be.alloc(DType::I32, &[bytes / 4])?;
    let b = be.alloc(DType::I32, &[bytes / 4])?;
    let s = time_per_call(be, iters, 5, || be.copy(&a, &b))?;
    Ok(BenchRow {
        name: format!("device copy {} MiB", bytes >> 20),
        value: 2.0 * bytes as f64 / s / 1e9,
        unit: "GB/s",
        seconds: s,
        detail: "read + write".into(),
    })
}

/// Host-to-device copy bandwidth in GB/s, as the weight offloader sees it: `bytes` of
/// host memory from [`Backend::alloc_host`] (page-locked on CUDA) copied into a device
/// buffer on a [`Backend::copy_queue`] (fork, copy, join), the best of 9 batches of 4
/// copies each ended by a synchronise, after 4 warm-up copies: the link's rate, which a
/// bound should use (a median let one slow process report 40 GB/s on the H100's 55 GB/s
/// link). On the CPU backend it measures the copy worker's `memcpy`.
pub fn h2d_bandwidth(be: &dyn Backend, bytes: usize) -> Result<f64> {
    if bytes < 4 {
        return Err(Error::invalid(
            "h2d_bandwidth",
            format!("{bytes} bytes; measure at least 4"),
        ));
    }
    let bytes = bytes - bytes % 4;
    let host = Arc::new(be.alloc_host(bytes)?);
    let dst = be.alloc(DType::I32, &[bytes / 4])?;
    let queue = be.copy_queue(1)?;
    let copy = || -> Result<()> {
        queue.fork()?;
        queue.copy(&host, 0, &dst)?;
        queue.join()
    };
    for _ in 0..4 {
        copy()?;
    }
    be.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..9 {
        let t = Instant::now();
        for _ in 0..4 {
            copy()?;
        }
        be.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64() / 4.0);
    }
    Ok(bytes as f64 / best / 1e9)
}

/// [`h2d_bandwidth`] with the copies captured into a graph (4 fork/copy/join triples, as
/// an offloaded step's graph holds them) and the graph replayed: the best of 9 replays.
/// Beside [`h2d_bandwidth`] it shows what a captured copy costs against a queued one.
pub fn h2d_bandwidth_captured(be: &dyn Backend, bytes: usize) -> Result<f64> {
    if bytes < 4 {
        return Err(Error::invalid(
            "h2d_bandwidth_captured",
            format!("{bytes} bytes; measure at least 4"),
        ));
    }
    let bytes = bytes - bytes % 4;
    let host = Arc::new(be.alloc_host(bytes)?);
    let dst = be.alloc(DType::I32, &[bytes / 4])?;
    let queue = be.copy_queue(1)?;
    let graph = capture(be, || {
        (0..4).try_for_each(|_| {
            queue.fork()?;
            queue.copy(&host, 0, &dst)?;
            queue.join()
        })
    })?;
    graph.replay()?;
    be.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..9 {
        let t = Instant::now();
        graph.replay()?;
        be.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64() / 4.0);
    }
    Ok(bytes as f64 / best / 1e9)
}

/// Shape of a decode-attention benchmark.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub batch: usize,
    pub context: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// An FP8 KV cache (scales 1) instead of one of the run dtype.
    pub fp8_cache: bool,
}

/// Paged decode attention, every sequence at `context` tokens: GB/s of K/V read (an FP8
/// cache's bytes: half of bf16's for the same tokens), launched eagerly back to back and
/// replayed from one graph of `iters` calls.
pub fn decode_attention(
    be: &dyn Backend,
    s: AttentionShape,
    dtype: DType,
    iters: usize,
) -> Result<(BenchRow, BenchRow)> {
    let mut rng = StdRng::seed_from_u64(2);
    let cache = PagedCache::random(be, &mut rng, &s, dtype)?;
    let q = random_tensor(
        be,
        &mut rng,
        &[s.batch, s.num_heads, s.head_dim],
        dtype,
        1.0,
    )?;
    let out = be.alloc(dtype, &[s.batch, s.num_heads, s.head_dim])?;
    let scratch_len = be.attention_scratch_len(
        s.batch,
        s.num_heads,
        s.head_dim,
        cache.blocks_per_seq,
        s.block_size,
    );
    let scratch = be.alloc(DType::F32, &[scratch_len.max(1)])?;
    let args = cache.args(&q, None, 1.0 / (s.head_dim as f32).sqrt(), &out, &scratch);
    let eager = time_per_call(be, iters, 5, || be.attention(&args))?;
    // The same calls replayed from one graph: what a decode step pays, without launch gaps.
    let graph = capture(be, || (0..iters).try_for_each(|_| be.attention(&args)))?;
    let replayed = time_per_call(be, 1, 5, || graph.replay())? / iters as f64;
    let kv_bytes = 2 * s.batch * s.context * s.num_kv_heads * s.head_dim * cache.kv_dtype.size();
    let kv = if s.fp8_cache { " kv=fp8" } else { "" };
    let name = format!(
        "decode attention b={} ctx={} h={}/{} d={} {dtype}{kv}",
        s.batch, s.context, s.num_heads, s.num_kv_heads, s.head_dim
    );
    let row = |how: &str, secs: f64| BenchRow {
        name: format!("{name} {how}"),
        value: kv_bytes as f64 / secs / 1e9,
        unit: "GB/s",
        seconds: secs,
        detail: format!(
            "{:.1} us, {:.1} MiB K/V",
            secs * 1e6,
            kv_bytes as f64 / (1 << 20) as f64
        ),
    };
    Ok((row("eager", eager), row("graph", replayed)))
}

/// Causal prefill attention: `s.batch` prompts of `s.context` tokens each, every token a
/// query over its own prompt's cached keys (as a prefill step runs it, after the cache
/// write), launched eagerly back to back. TFLOP/s of the causal product (QKᵀ and PV over
/// the keys each row sees: 4 · d flops a (row, key, head)).
pub fn prefill_attention(
    be: &dyn Backend,
    s: AttentionShape,
    dtype: DType,
    iters: usize,
) -> Result<BenchRow> {
    let mut rng = StdRng::seed_from_u64(4);
    let cache = PagedCache::random(be, &mut rng, &s, dtype)?;
    let rows = s.batch * s.context;
    let q = random_tensor(be, &mut rng, &[rows, s.num_heads, s.head_dim], dtype, 1.0)?;
    let out = be.alloc(dtype, &[rows, s.num_heads, s.head_dim])?;
    let cu: Vec<i32> = (0..=s.batch).map(|i| (i * s.context) as i32).collect();
    let cu = be.upload(&cu, &[s.batch + 1])?;
    let scratch = be.alloc(DType::F32, &[1])?;
    let args = cache.args(
        &q,
        Some(&cu),
        1.0 / (s.head_dim as f32).sqrt(),
        &out,
        &scratch,
    );
    let secs = time_per_call(be, iters, 5, || be.attention(&args))?;
    let pairs = s.batch as f64 * s.context as f64 * (s.context as f64 + 1.0) / 2.0;
    let flops = 4.0 * pairs * (s.num_heads * s.head_dim) as f64;
    let kv = if s.fp8_cache { " kv=fp8" } else { "" };
    Ok(BenchRow {
        name: format!(
            "prefill attention {}x{} causal h={}/{} d={} {dtype}{kv}",
            s.batch, s.context, s.num_heads, s.num_kv_heads, s.head_dim
        ),
        value: flops / secs / 1e12,
        unit: "TFLOP/s",
        seconds: secs,
        detail: format!("{:.1} us", secs * 1e6),
    })
}

/// A paged K/V cache of random values for `s.batch` sequences of `s.context` tokens, each
/// owning a random permutation of blocks (as a real cache would look).
struct PagedCache {
    k: Tensor,
    v: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    blocks_per_seq: usize,
    kv_dtype: DType,
}

impl PagedCache {
    fn random(
        be: &dyn Backend,
        rng: &mut StdRng,
        s: &AttentionShape,
        dtype: DType,
    ) -> Result<Self> {
        let blocks_per_seq = s.context.div_ceil(s.block_size);
        let num_blocks = s.batch * blocks_per_seq;
        let cache_shape = [num_blocks, s.block_size, s.num_kv_heads, s.head_dim];
        let kv_dtype = if s.fp8_cache { DType::F8E4M3 } else { dtype };
        let mut cache = || -> Result<Tensor> {
            if !s.fp8_cache {
                return random_tensor(be, rng, &cache_shape, dtype, 1.0);
            }
            let t = be.alloc(DType::F8E4M3, &cache_shape)?;
            let bytes: Vec<u8> = (0..t.numel())
                .map(|_| crate::quant::f32_to_e4m3(rng.random_range(-1.0..1.0)))
                .collect();
            be.write_bytes(&t, &bytes)?;
            Ok(t)
        };
        let (k, v) = (cache()?, cache()?);
        let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.random_range(0..=i));
        }
        Ok(Self {
            k,
            v,
            block_tables: be.upload(&ids, &[s.batch, blocks_per_seq])?,
            seq_lens: be.upload(&vec![s.context as i32; s.batch], &[s.batch])?,
            blocks_per_seq,
            kv_dtype,
        })
    }

    fn args<'a>(
        &'a self,
        q: &'a Tensor,
        cu_seqlens_q: Option<&'a Tensor>,
        scale: f32,
        out: &'a Tensor,
        scratch: &'a Tensor,
    ) -> Attention<'a> {
        Attention {
            q,
            k_cache: &self.k,
            v_cache: &self.v,
            kv_scale: crate::args::KvScale::ONE,
            block_tables: &self.block_tables,
            seq_lens: &self.seq_lens,
            cu_seqlens_q,
            scale,
            softcap: None,
            window: None,
            sinks: None,
            out,
            scratch,
        }
    }
}

/// A decode projection's weight streaming: `x[1, k] · wᵀ` over distinct `[n, k]` weights
/// (as many as take at least `min_bytes`, more than the L2 holds, so every call reads its
/// weight from memory), all captured in one graph as a step would run them; with `act`,
/// the MLP's fused gate/up projection (`matmul_act_mul`, SiLU: `w` holds `n / 2` gate rows
/// then as many up rows). GB/s of weight bytes read; the detail gives the time per call.
pub fn gemv_stream(
    be: &dyn Backend,
    n: usize,
    k: usize,
    dtype: DType,
    act: bool,
    min_bytes: usize,
) -> Result<BenchRow> {
    let mut rng = StdRng::seed_from_u64(3);
    let w_bytes = n * k * dtype.size();
    let copies = min_bytes.div_ceil(w_bytes.max(1)).max(2);
    let x = random_tensor(be, &mut rng, &[1, k], dtype, 1.0)?;
    let out = be.alloc(dtype, &[1, n])?;
    let half = be.alloc(dtype, &[1, n / 2])?;
    let ws = (0..copies)
        .map(|_| random_tensor(be, &mut rng, &[n, k], dtype, 0.05))
        .collect::<Result<Vec<_>>>()?;
    let run = || {
        ws.iter().try_for_each(|w| match act {
            true => be.matmul_act_mul(Activation::Silu, &x, w, &out, &half),
            false => be.matmul(&x, w, None, &out),
        })
    };
    run()?;
    let graph = capture(be, run)?;
    let s = time_per_call(be, 3, 7, || graph.replay())? / copies as f64;
    let what = if act { "gemv+act" } else { "gemv" };
    Ok(BenchRow {
        name: format!("{what} 1x{n}x{k} {dtype}, {copies} weights in a graph"),
        value: w_bytes as f64 / s / 1e9,
        unit: "GB/s",
        seconds: s,
        detail: format!(
            "{:.2} us a call, {:.1} MiB",
            s * 1e6,
            w_bytes as f64 / (1 << 20) as f64
        ),
    })
}

/// A mixture-of-experts layer's shape for [`moe_streaming`].
#[derive(Clone, Copy, Debug)]
pub struct MoeShape {
    pub rows: usize,
    pub hidden: usize,
    pub inter: usize,
    pub experts: usize,
    pub top_k: usize,
    /// The experts' format (`None`: x's dtype).
    pub format: Option<crate::quant::QuantFormat>,
}

/// How fast a step can use experts that live in host memory (the expert cache's choice,
/// args::ExpertCache): each call routes its rows to one of four disjoint sets of experts in
/// turn (more bytes than the L2 holds), and runs the layer
/// - `direct`: the experts read in place over the bus by the expert kernels (no cache);
/// - `cache miss`: through an expert cache of the fewest slots, so every call copies its
///   experts into slots (plan, fill kernel reading mapped host memory) and runs them there;
/// - `cache hit`: the same cache with one set, every expert already in its slot.
///
/// GB/s of the chosen experts' bytes per call.
pub fn moe_streaming(
    be: &dyn Backend,
    s: MoeShape,
    dtype: DType,
    iters: usize,
) -> Result<Vec<BenchRow>> {
    use crate::args::Moe;
    use crate::backend::ExpertSlots;
    let mut rng = StdRng::seed_from_u64(3);
    let (n, h, i, e, k) = (s.rows, s.hidden, s.inter, s.experts, s.top_k);
    let sets = 4;
    if sets * n * k > e {
        return Err(Error::invalid(
            "moe_streaming",
            format!("{sets} sets of {n} x {k} experts need more than {e}"),
        ));
    }
    let wdt = s.format.map_or(dtype, DType::Q);
    let host_weight = |rows: usize, cols: usize, rng: &mut StdRng| -> Result<Tensor> {
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-1.0f32..1.0) / (cols as f32).sqrt())
            .collect();
        let bytes = match s.format {
            Some(f) => {
                let mut b = vec![0u8; wdt.bytes(&[rows, cols]).unwrap_or(0)];
                crate::quant::quantize_rows(f, &v, cols, &mut b);
                b
            }
            None => {
                let t = be.upload_f32_as(&v, &[rows, cols], dtype)?;
                let mut b = vec![0u8; t.size_bytes()];
                be.read_bytes(&t, &mut b)?;
                b
            }
        };
        let mut mem = be.alloc_host(bytes.len())?;
        mem.bytes_mut()
            .ok_or_else(|| Error::invalid("moe_streaming", "host memory not writable"))?
            .copy_from_slice(&bytes);
        be.host_view(&Arc::new(mem), 0, &[rows, cols], wdt)
    };
    let gate_up = host_weight(2 * e * i, h, &mut rng)?;
    let down = host_weight(e * h, i, &mut rng)?;
    let x = random_tensor(be, &mut rng, &[n, h], dtype, 1.0)?;
    // Set c routes row r to experts c n k + r k .. + k (descending logits).
    let logits: Vec<Tensor> = (0..sets)
        .map(|c| {
            let mut l = vec![0f32; n * e];
            for r in 0..n {
                for j in 0..k {
                    l[r * e + c * n * k + r * k + j] = 8.0 - j as f32 * 0.1;
                }
            }
            be.upload(&l, &[n, e])
        })
        .collect::<Result<_>>()?;
    let ids = be.alloc(DType::I32, &[n, k])?;
    let wts = be.alloc(DType::F32, &[n, k])?;
    let out = be.alloc(dtype, &[n, h])?;
    let scratch = be.alloc(dtype, &[n * k, i])?;
    let work_len = be.moe_workspace_bytes(n, h, e, k, dtype).div_ceil(4).max(1);
    let work = be.alloc(DType::I32, &[work_len])?;
    // 256-byte slots of the fewest a call may need.
    let slot_bytes = |t: &Tensor| (t.size_bytes() / e).next_multiple_of(256);
    let cache = ExpertSlots::new(be, 1, e, n * k, slot_bytes(&gate_up), slot_bytes(&down))?;
    let call = |set: usize, cached: bool| {
        be.moe(&Moe {
            act: crate::args::Activation::Silu,
            bias: None,
            x: &x,
            logits: &logits[set],
            top_k: k,
            renormalize: true,
            gate_up: &gate_up,
            down: &down,
            ids: &ids,
            weights: &wts,
            out: &out,
            scratch: &scratch,
            workspace: &work,
            cache: cached.then(|| cache.args(0, 0.5)),
        })
    };
    let mut c = 0usize;
    let mut next = || {
        c += 1;
        c % sets
    };
    let direct = time_per_call(be, iters, 5, || call(next(), false))?;
    let miss = time_per_call(be, iters, 5, || call(next(), true))?;
    let hit = time_per_call(be, iters, 5, || call(0, true))?;
    let per_call = n * k * (gate_up.size_bytes() + down.size_bytes()) / e;
    let name = format!(
        "moe {n} rows, {e} experts {h}x{i} top {k}, {} experts in host memory",
        s.format.map_or(dtype.to_string(), |f| f.to_string())
    );
    let row = |how: &str, secs: f64| BenchRow {
        name: format!("{name}: {how}"),
        value: per_call as f64 / secs / 1e9,
        unit: "GB/s",
        seconds: secs,
        detail: format!(
            "{:.1} us a call, {:.1} MiB of experts",
            secs * 1e6,
            per_call as f64 / (1 << 20) as f64
        ),
    };
    Ok(vec![
        row("direct read", direct),
        row("cache miss", miss),
        row("cache hit", hit),
    ])
}

/// Per-launch cost of a tiny kernel, eager and inside a graph: microseconds each.
pub fn launch_cost(be: &dyn Backend, launches: usize) -> Result<(BenchRow, BenchRow)> {
    let x = be.upload_f32_as(&[0.5, 1.5], &[1, 2], DType::F32)?;
    let y = be.alloc(DType::F32, &[1, 1])?;
    let eager = time_per_call(be, 5, 5, || {
        for _ in 0..launches {
            be.silu_mul(&x, &y)?;
        }
        Ok(())
    })? / launches as f64;
    let graph = capture(be, || (0..launches).try_for_each(|_| be.silu_mul(&x, &y)))?;
    let replay = time_per_call(be, 5, 5, || graph.replay())? / launches as f64;
    let row = |name: &str, s: f64| BenchRow {
        name: format!("{name} ({launches} tiny kernels)"),
        value: s * 1e6,
        unit: "us/kernel",
        seconds: s,
        detail: String::new(),
    };
    Ok((row("launch eager", eager), row("launch in graph", replay)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn h2d_bandwidth_measures_the_copy_queue() {
        let be = CpuBackend::new();
        let gbs = h2d_bandwidth(&be, 1 << 20).unwrap();
        assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
        // A copy delay of 2 ms per 1 MiB copy caps the bandwidth at 0.52 GB/s.
        let slow = CpuBackend::with_copy_delay(std::time::Duration::from_millis(2));
        let capped = h2d_bandwidth(&slow, 1 << 20).unwrap();
        assert!(capped < 0.53, "{capped}");
        let err = h2d_bandwidth(&be, 3).unwrap_err().to_string();
        assert!(
            err.contains("h2d_bandwidth") && err.contains("3 bytes"),
            "{err}"
        );
    }
}
