//! Capture and replay on the CPU backend: the runner's captured decode graphs replay
//! exactly like eager steps, forbidden operations are refused by name, replay keeps the
//! launch arguments of the capture, and the checks catch broken backends.

use std::sync::atomic::{AtomicBool, Ordering};

use encore_core::backend::cpu::CpuBackend;
use encore_core::testing;
use encore_core::{Backend, DType, Error, Graph, Result, Tensor};

mod common;

use common::hooked::{Hooked, Hooks};

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
        // 3 runs (f32, bf16, bf16 over an FP8 cache) x (prefill logits, 6 decode steps x
        // (logits, greedy and sampled tokens), graph steps).
        assert_eq!(results.len(), 60);
        assert_eq!(
            results
                .iter()
                .filter(|r| r.shape.starts_with("kv=fp8 "))
                .count(),
            20
        );
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

/// A [`Hooked`] CPU backend broken by `fault`.
struct Broken {
    spare: CpuBackend,
    fault: Fault,
    capturing: AtomicBool,
}

type Faulty = Hooked<Broken>;

struct NoopGraph;

impl Graph for NoopGraph {
    fn replay(&self) -> Result<()> {
        Ok(())
    }
    fn num_ops(&self) -> usize {
        0
    }
}

fn faulty(fault: Fault) -> Faulty {
    Hooked {
        inner: CpuBackend::new(),
        hooks: Broken {
            spare: CpuBackend::new(),
            fault,
            capturing: AtomicBool::new(false),
        },
    }
}

impl Hooks for Broken {
    fn alloc(&self, inner: &CpuBackend, dtype: DType, shape: &[usize]) -> Option<Result<Tensor>> {
        (self.fault == Fault::AllocDuringCapture && inner.is_capturing())
            .then(|| self.spare.alloc(dtype, shape))
    }
    fn matmul(&self, _: &CpuBackend, out: &Tensor) -> Option<Result<()>> {
        (self.fault == Fault::NoF32Matmul && out.dtype() == DType::F32).then(|| {
            Err(Error::Invalid {
                op: "matmul",
                what: "no kernel for f32 output".into(),
            })
        })
    }
    fn begin_capture(&self, _: &CpuBackend) -> Option<Result<()>> {
        (self.fault == Fault::ReplayIsNoop).then(|| {
            self.capturing.store(true, Ordering::Release);
            Ok(())
        })
    }
    fn end_capture(&self, _: &CpuBackend) -> Option<Result<Box<dyn Graph>>> {
        (self.fault == Fault::ReplayIsNoop).then(|| {
            self.capturing.store(false, Ordering::Release);
            Ok(Box::new(NoopGraph) as Box<dyn Graph>)
        })
    }
    fn is_capturing(&self, inner: &CpuBackend) -> Option<bool> {
        Some(self.capturing.load(Ordering::Acquire) || inner.is_capturing())
    }
}

#[test]
fn the_checks_catch_broken_backends() {
    let noop = faulty(Fault::ReplayIsNoop);
    let results = testing::check_capture_replay(&noop, 5).unwrap();
    let failed: Vec<_> = results.iter().filter(|r| !r.pass).collect();
    // A step that misses captures on all-padding inputs first, then replays: with replay
    // a no-op, no decode step computes anything (its logits are stale) and none writes
    // KV, so every decode step is wrong, in both dtypes and over the FP8 cache.
    let wrong: Vec<&str> = failed
        .iter()
        .filter(|r| r.op.ends_with("logits"))
        .map(|r| r.op.as_str())
        .collect();
    let expected: Vec<String> = (0..=5)
        .map(|i| format!("capture replay #{i}: logits"))
        .collect();
    let thrice: Vec<String> = (0..3).flat_map(|_| expected.clone()).collect();
    assert_eq!(wrong, thrice, "{failed:#?}");
    assert!(failed.iter().any(|r| r.op.ends_with("tokens")));

    // An op that errors is a failed row carrying the message; the other ops still report.
    let partial = faulty(Fault::NoF32Matmul);
    let results = testing::check_backend_against_cpu(&partial, 5).unwrap();
    let failed: Vec<_> = results.iter().filter(|r| !r.pass).collect();
    // 10 matmul shapes x (bf16, f16 with an f32 output and no bias; f32 with and without
    // bias), and the 10 f32 matmul_act_mul cases (their product is an f32 matmul); for
    // each quantized format, 10 of its matmul cases (f32 out, 7 without a bias, 3 with)
    // and its 3 f32 matmul_act_mul cases.
    // And the mixed-input GEMM's 12 cases with an f32 output (`matmul marlin(...)`: Q4_0
    // and Q4_1 4 each, Q4_K and Q8_0 2 each).
    let quantized = 13 * encore_core::quant::QuantFormat::ALL.len();
    assert_eq!(failed.len(), 50 + quantized + 12, "{failed:#?}");
    for r in &failed {
        assert!(
            ((r.op.starts_with("matmul(") || r.op.starts_with("matmul marlin("))
                && r.op.contains("out f32"))
                || (r.op.starts_with("matmul_act_mul") && r.dtype == DType::F32),
            "{r}"
        );
        assert!(r.to_string().contains("no kernel for f32 output"), "{r}");
    }
    assert!(results
        .iter()
        .any(|r| r.op.starts_with("attention") && r.pass));

    let leaky = faulty(Fault::AllocDuringCapture);
    let err = testing::check_capture_forbidden(&leaky).unwrap_err();
    assert!(err.to_string().contains("`alloc` during capture"), "{err}");
    assert!(!leaky.is_capturing());
}
