//! The mixed-input GEMM on repacked weights (`ENCORE_QUANT_GEMM=marlin`: every row count)
//! against the CPU, and its repacked copy's capture behaviour.

use super::*;

/// Every format the repack takes x rows from one 16-row block to several 128-row ones x
/// (x, out, bias) in bf16/f16, n and k padded (n not a multiple of 128, k of 64 where the
/// blocks allow), k long enough to split; the weight must get its repacked copy.
#[test]
#[ignore = "needs a CUDA device"]
fn marlin_matches_cpu() {
    let _serial = serial();
    let gpu = backend(QuantGemm::Marlin);
    let gpu: &dyn Backend = gpu.as_ref();
    let cpu = CpuBackend::new();
    let formats = [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q4K,
        QuantFormat::Q8_0,
    ];
    let mut count = 0;
    for (f, fmt) in formats.into_iter().enumerate() {
        for (i, &m) in [1usize, 2, 3, 16, 17, 33, 64, 100, 129, 256, 512]
            .iter()
            .enumerate()
        {
            for (j, &(dt, out, bias)) in KINDS[..6].iter().enumerate() {
                let n = [40, 129, 1000, 256][(i + j + f) % 4];
                let blocks = [1, 3, 16, 40][(i + 2 * j + f) % 4];
                let k = blocks * fmt.block_elems();
                let case = Case {
                    fmt,
                    m,
                    n,
                    k,
                    dt,
                    out,
                    bias,
                    seed: (7000 + 100 * f + 10 * i + j) as u64,
                    row_scale: false,
                };
                let bytes = weight_bytes(fmt, n, k, case.seed);
                let w = upload_q(gpu, fmt, n, k, &bytes);
                let w = gpu.prepare_weight(w).unwrap();
                assert!(w.packed().is_some(), "{}: no repacked copy", case.name());
                let x = gpu
                    .upload_f32_as(&values(m * k, case.seed + 1), &[m, k], dt)
                    .unwrap();
                let b = bias.then(|| {
                    gpu.upload_f32_as(&values(n, case.seed + 2), &[n], dt)
                        .unwrap()
                });
                let o = gpu.alloc(out, &[m, n]).unwrap();
                gpu.matmul(&x, &w, b.as_ref(), &o)
                    .unwrap_or_else(|e| panic!("{}: {e}", case.name()));
                let got = gpu.download_f32(&o).unwrap();
                let want = case.run(&cpu, &bytes);
                assert_close(&case.name(), &got, &want, dt);
                count += 1;
            }
        }
    }
    assert_eq!(count, 4 * 11 * 6);
}

/// A graph captured over the GEMM replays its result (nothing allocated or copied in the
/// launch path), and a view of fewer rows drops the repacked copy.
#[test]
#[ignore = "needs a CUDA device"]
fn marlin_captures_and_views_drop_the_copy() {
    let _serial = serial();
    let gpu = backend(QuantGemm::Marlin);
    let gpu: &dyn Backend = gpu.as_ref();
    let (fmt, m, n, k) = (QuantFormat::Q4K, 64, 384, 2048);
    let bytes = weight_bytes(fmt, n, k, 5);
    let w = gpu
        .prepare_weight(upload_q(gpu, fmt, n, k, &bytes))
        .unwrap();
    assert!(w.packed().is_some());
    assert!(w.narrow(0, n).unwrap().packed().is_some());
    assert!(w.narrow(0, n - 128).unwrap().packed().is_none());
    let x = gpu
        .upload_f32_as(&values(m * k, 6), &[m, k], DType::BF16)
        .unwrap();
    let eager = gpu.alloc(DType::BF16, &[m, n]).unwrap();
    gpu.matmul(&x, &w, None, &eager).unwrap();
    let replayed = gpu.alloc(DType::BF16, &[m, n]).unwrap();
    gpu.begin_capture().unwrap();
    let r = gpu.matmul(&x, &w, None, &replayed);
    let graph = gpu.end_capture().unwrap();
    r.unwrap();
    graph.replay().unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(
        gpu.download_f32(&eager).unwrap(),
        gpu.download_f32(&replayed).unwrap()
    );
}
