//! Capture and replay on the CPU backend: the runner's captured decode graphs replay
//! exactly like eager steps, forbidden operations are refused by name, replay keeps the
//! launch arguments of the capture, and the checks catch broken backends.

use std::sync::atomic::{AtomicBool, Ordering};

use encore_core::backend::cpu::CpuBackend;
use encore_core::testing;
use encore_core::{
    Attention, Backend, DType, Error, Graph, LogitBias, QkvRope, Result, Sampling, Tensor,
};

fn cpu() -> Box<dyn Backend> {
    Box::new(CpuBackend::new())
}

#[test]
fn captured_decode_steps_replay_exactly_like_eager() {
    let be = cpu();
    for seed in [1, 2] {
        let results = testing::check_capture_replay(be.as_ref(), seed).unwrap();
        if let Err(report) = testing::all_passed(&results) {
            panic!("{report}");
        }
        // 2 dtypes x (prefill logits, 6 decode steps x (logits, greedy and sampled
        // tokens), graph steps).
        assert_eq!(results.len(), 40);
        assert!(results.iter().all(|r| r.error == 0.0 && r.tolerance == 0.0));
    }
    assert!(!be.is_capturing());
}

#[test]
fn forbidden_operations_during_capture_are_named_errors() {
    let be = cpu();
    testing::check_capture_forbidden(be.as_ref()).unwrap();
    // And again: a capture after a refused one still works.
    testing::check_capture_forbidden(be.as_ref()).unwrap();
}

#[test]
fn replay_keeps_capture_time_launch_arguments_and_reads_contents_at_replay() {
    let be = cpu();
    let rows: Vec<f32> = (0..4).flat_map(|r| [r as f32; 3]).collect();
    let x = be.upload(&rows, &[4, 3]).unwrap();
    let via_view = be.alloc(DType::F32, &[1, 3]).unwrap();
    let via_ids = be.alloc(DType::F32, &[1, 3]).unwrap();
    let ids = be.upload(&[1i32], &[1]).unwrap();

    // The host decides which row with `step`: a view computed at capture time is a
    // launch argument, baked into the graph. The device buffer `ids` is data.
    let mut step = 1;
    be.begin_capture().unwrap();
    be.copy(&x.narrow(step, 1).unwrap(), &via_view).unwrap();
    be.embedding(&ids, &x, &via_ids).unwrap();
    let graph = be.end_capture().unwrap();
    assert_eq!(graph.num_ops(), 2);
    // Nothing ran during capture.
    be.write(&via_view, &[-1.0f32; 3]).unwrap();
    be.write(&via_ids, &[-1.0f32; 3]).unwrap();

    step = 3;
    be.write(&ids, &[step as i32]).unwrap();
    graph.replay().unwrap();
    assert_eq!(
        be.download::<f32>(&via_view).unwrap(),
        vec![1.0; 3],
        "the baked row"
    );
    assert_eq!(
        be.download::<f32>(&via_ids).unwrap(),
        vec![3.0; 3],
        "the row of this step"
    );

    // Contents are read at replay time: new data in row 1 shows up through the view.
    be.write(&x, &[[9.0f32; 3], [8.0; 3], [7.0; 3], [6.0; 3]].concat())
        .unwrap();
    graph.replay().unwrap();
    assert_eq!(be.download::<f32>(&via_view).unwrap(), vec![8.0; 3]);
    assert_eq!(be.download::<f32>(&via_ids).unwrap(), vec![6.0; 3]);
}

#[test]
fn capture_misuse_is_an_error() {
    let be = cpu();
    assert!(matches!(be.end_capture(), Err(Error::Capture(_))));
    be.begin_capture().unwrap();
    assert!(matches!(be.begin_capture(), Err(Error::Capture(_))));
    assert_eq!(be.end_capture().unwrap().num_ops(), 0);
}

/// A deliberately broken backend, to show the checks catch what they are meant to.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// "Capture" runs ops eagerly and replay does nothing.
    ReplayIsNoop,
    /// `alloc` during capture succeeds.
    AllocDuringCapture,
    /// `matmul` with an f32 output is unsupported.
    NoF32Matmul,
}

struct Faulty {
    inner: CpuBackend,
    spare: CpuBackend,
    fault: Fault,
    capturing: AtomicBool,
}

struct NoopGraph;

impl Graph for NoopGraph {
    fn replay(&self) -> Result<()> {
        Ok(())
    }
    fn num_ops(&self) -> usize {
        0
    }
}

impl Faulty {
    fn new(fault: Fault) -> Faulty {
        Faulty {
            inner: CpuBackend::new(),
            spare: CpuBackend::new(),
            fault,
            capturing: AtomicBool::new(false),
        }
    }
}

impl Backend for Faulty {
    fn device_name(&self) -> String {
        self.inner.device_name()
    }
    fn memory_info(&self) -> Option<(usize, usize)> {
        self.inner.memory_info()
    }
    fn vmm(&self) -> Result<std::sync::Arc<dyn encore_core::memory::vmm::Vmm>> {
        self.inner.vmm()
    }
    fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        if self.fault == Fault::AllocDuringCapture && self.inner.is_capturing() {
            return self.spare.alloc(dtype, shape);
        }
        self.inner.alloc(dtype, shape)
    }
    fn write_bytes(&self, dst: &Tensor, src: &[u8]) -> Result<()> {
        self.inner.write_bytes(dst, src)
    }
    fn read_bytes(&self, src: &Tensor, dst: &mut [u8]) -> Result<()> {
        self.inner.read_bytes(src, dst)
    }
    fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.inner.copy(src, dst)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn embedding_rows(
        &self,
        ids: &Tensor,
        table: &Tensor,
        first: usize,
        out: &Tensor,
    ) -> Result<()> {
        self.inner.embedding_rows(ids, table, first, out)
    }
    fn all_reduce(&self, x: &Tensor) -> Result<()> {
        self.inner.all_reduce(x)
    }
    fn all_gather(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.inner.all_gather(src, dst)
    }
    fn unshard_columns(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        self.inner.unshard_columns(src, dst)
    }
    fn rms_norm(
        &self,
        x: &Tensor,
        r: Option<&Tensor>,
        w: &Tensor,
        eps: f32,
        out: &Tensor,
    ) -> Result<()> {
        self.inner.rms_norm(x, r, w, eps, out)
    }
    fn silu_mul(&self, gate_up: &Tensor, out: &Tensor) -> Result<()> {
        self.inner.silu_mul(gate_up, out)
    }
    fn matmul(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<()> {
        if self.fault == Fault::NoF32Matmul && out.dtype() == DType::F32 {
            return Err(Error::Invalid {
                op: "matmul",
                what: "no kernel for f32 output".into(),
            });
        }
        self.inner.matmul(x, w, bias, out)
    }
    fn qkv_rope_write(&self, args: &QkvRope<'_>) -> Result<()> {
        self.inner.qkv_rope_write(args)
    }
    fn attention(&self, args: &Attention<'_>) -> Result<()> {
        self.inner.attention(args)
    }
    fn attention_scratch_len(
        &self,
        rows: usize,
        heads: usize,
        hd: usize,
        width: usize,
        bs: usize,
    ) -> usize {
        self.inner.attention_scratch_len(rows, heads, hd, width, bs)
    }
    fn sample(&self, logits: &Tensor, params: &Sampling<'_>, out: &Tensor) -> Result<()> {
        self.inner.sample(logits, params, out)
    }
    fn logit_bias(&self, logits: &Tensor, bias: &LogitBias<'_>) -> Result<()> {
        self.inner.logit_bias(logits, bias)
    }
    fn penalty_count(&self, counts: &Tensor, slots: &Tensor, tokens: &Tensor) -> Result<()> {
        self.inner.penalty_count(counts, slots, tokens)
    }
    fn begin_capture(&self) -> Result<()> {
        match self.fault {
            Fault::ReplayIsNoop => {
                self.capturing.store(true, Ordering::Release);
                Ok(())
            }
            _ => self.inner.begin_capture(),
        }
    }
    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        match self.fault {
            Fault::ReplayIsNoop => {
                self.capturing.store(false, Ordering::Release);
                Ok(Box::new(NoopGraph))
            }
            _ => self.inner.end_capture(),
        }
    }
    fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire) || self.inner.is_capturing()
    }
    fn copy_queue(&self, events: usize) -> Result<Box<dyn encore_core::backend::CopyQueue>> {
        self.inner.copy_queue(events)
    }
    fn host_view(
        &self,
        mem: &std::sync::Arc<encore_core::backend::HostMemory>,
        offset: usize,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        self.inner.host_view(mem, offset, shape, dtype)
    }
}

#[test]
fn the_checks_catch_broken_backends() {
    let noop = Faulty::new(Fault::ReplayIsNoop);
    let results = testing::check_capture_replay(&noop, 5).unwrap();
    let failed: Vec<_> = results.iter().filter(|r| !r.pass).collect();
    // A step that misses captures on all-padding inputs first, then replays: with replay
    // a no-op, no decode step computes anything (its logits are stale) and none writes
    // KV, so every decode step is wrong, in both dtypes.
    let wrong: Vec<&str> = failed
        .iter()
        .filter(|r| r.op.ends_with("logits"))
        .map(|r| r.op.as_str())
        .collect();
    let expected: Vec<String> = (0..=5)
        .map(|i| format!("capture replay #{i}: logits"))
        .collect();
    assert_eq!(wrong, [expected.clone(), expected].concat(), "{failed:#?}");
    assert!(failed.iter().any(|r| r.op.ends_with("tokens")));

    // An op that errors is a failed row carrying the message; the other ops still report.
    let partial = Faulty::new(Fault::NoF32Matmul);
    let results = testing::check_backend_against_cpu(&partial, 5).unwrap();
    let failed: Vec<_> = results.iter().filter(|r| !r.pass).collect();
    // 9 matmul shapes x (bf16, f16 with an f32 output and no bias; f32 with and without
    // bias), and the 4 f32 matmul_silu_mul shapes (their product is an f32 matmul); for
    // each quantized format, 10 of its matmul cases (f32 out, 7 without a bias, 3 with)
    // and its 2 f32 matmul_silu_mul cases.
    let quantized = 12 * encore_core::quant::QuantFormat::ALL.len();
    assert_eq!(failed.len(), 40 + quantized, "{failed:#?}");
    for r in &failed {
        assert!(
            (r.op.starts_with("matmul(") && r.op.contains("out f32"))
                || (r.op.starts_with("matmul_silu_mul") && r.dtype == DType::F32),
            "{r}"
        );
        assert!(r.to_string().contains("no kernel for f32 output"), "{r}");
    }
    assert!(results
        .iter()
        .any(|r| r.op.starts_with("attention") && r.pass));

    let leaky = Faulty::new(Fault::AllocDuringCapture);
    let err = testing::check_capture_forbidden(&leaky).unwrap_err();
    assert!(err.to_string().contains("`alloc` during capture"), "{err}");
    assert!(!leaky.is_capturing());
}
