//! GPU tests: every CUDA kernel against the CPU reference on fresh random inputs, CUDA
//! graph capture/replay against eager, capture-safety errors, and the CUDA-specific
//! mechanics (kernel cache, GEMM plans, device checks). Run on the GPU machine with
//! `--include-ignored` (scripts/gpu-check.sh).

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use encore_core::backend::cpu::CpuBackend;
use encore_core::backend::cuda::CudaBackend;
use encore_core::{testing, Backend, DType, Error};

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

fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
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
