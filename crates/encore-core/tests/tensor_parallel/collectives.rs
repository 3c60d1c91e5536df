//! The collectives (all-reduce, all-gather, the all-reduce fused with the residual norm
//! and with the matmul before it) against sums computed here, over CPU ranks and 2 GPUs.

use super::*;

/// Every rank's all-reduce and all-gather against the sums and concatenations computed
/// here, eagerly and replayed from a graph with new contents, at sizes around the
/// one-shot kernel's blocks and past its cap (NCCL on CUDA).
fn check_collectives(ranks: &[BackendRef]) {
    let n = ranks.len();
    let values = |rank: usize, len: usize, round: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7 + rank * 13 + round * 29) % 61) as f32 / 8.0 - 3.0)
            .collect()
    };
    for len in [8usize, 4096, 4096 * 64 + 8, 3 << 20] {
        std::thread::scope(|s| {
            for (rank, be) in ranks.iter().enumerate() {
                s.spawn(move || {
                    let x = be
                        .upload_f32_as(&values(rank, len, 0), &[len], DType::BF16)
                        .unwrap();
                    be.all_reduce(&x).unwrap();
                    let g_src = be
                        .upload_f32_as(&values(rank, 24, 0), &[24], DType::F32)
                        .unwrap();
                    let g_dst = be.alloc(DType::F32, &[n, 24]).unwrap();
                    be.all_gather(&g_src, &g_dst).unwrap();
                    let want = |round: usize| -> Vec<f32> {
                        let all: Vec<Vec<f32>> = (0..n).map(|r| values(r, len, round)).collect();
                        (0..len)
                            .map(|i| all.iter().map(|v| v[i]).sum::<f32>())
                            .collect()
                    };
                    assert_eq!(be.download_f32(&x).unwrap(), want(0), "len {len} eager");
                    let gathered: Vec<f32> = (0..n).flat_map(|r| values(r, 24, 0)).collect();
                    assert_eq!(be.download_f32(&g_dst).unwrap(), gathered);
                    // A graph of the all-reduce, replayed over new contents.
                    be.begin_capture().unwrap();
                    be.all_reduce(&x).unwrap();
                    let graph = be.end_capture().unwrap();
                    for round in 1..3 {
                        let v = be.upload_f32_as(&values(rank, len, round), &[len], DType::BF16);
                        be.copy(&v.unwrap(), &x).unwrap();
                        graph.replay().unwrap();
                        assert_eq!(
                            be.download_f32(&x).unwrap(),
                            want(round),
                            "len {len} replay"
                        );
                    }
                });
            }
        });
    }
}

/// The all-reduce fused with the residual RMSNorm against the sum computed here and the
/// CPU backend's norm of it, within bf16 rounding (the one-shot kernel on CUDA for up to
/// 2 MiB, the two ops past it); and with a LayerNorm (the two ops on CUDA).
fn check_all_reduce_rms_norm(ranks: &[BackendRef]) {
    let n = ranks.len();
    let values = |seed: usize, len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7 + seed * 13) % 61) as f32 / 16.0 - 1.5)
            .collect()
    };
    let shapes = [(1usize, 4096usize), (3, 128), (64, 4096), (300, 4096)];
    let kinds = shapes
        .map(|s| (s, false))
        .into_iter()
        .chain([((3, 128), true), ((64, 4096), true)]);
    for ((rows, dim), layer) in kinds {
        let len = rows * dim;
        // What every rank must get: the CPU's rms_norm of the rounded sum.
        let cpu_be = CpuBackend::new();
        let cpu: &dyn Backend = &cpu_be;
        let bf = |v: &[f32], shape: &[usize]| cpu.upload_f32_as(v, shape, DType::BF16).unwrap();
        let parts: Vec<Vec<f32>> = (0..n).map(|r| values(r, len)).collect();
        let sum: Vec<f32> = (0..len)
            .map(|i| parts.iter().map(|p| p[i]).sum::<f32>())
            .collect();
        let (x, res, w) = (
            bf(&sum, &[rows, dim]),
            bf(&values(99, len), &[rows, dim]),
            bf(&values(77, dim), &[dim]),
        );
        let out = cpu.alloc(DType::BF16, &[rows, dim]).unwrap();
        let b = bf(&values(55, dim), &[dim]);
        cpu.rms_norm(
            &x,
            Some(&res),
            Norm::new(&w, layer.then_some(&b)),
            1e-5,
            &out,
        )
        .unwrap();
        let want = (
            cpu.download_f32(&out).unwrap(),
            cpu.download_f32(&res).unwrap(),
        );
        std::thread::scope(|s| {
            for (rank, be) in ranks.iter().enumerate() {
                let want = &want;
                s.spawn(move || {
                    let up = |v: &[f32], shape: &[usize]| {
                        be.upload_f32_as(v, shape, DType::BF16).unwrap()
                    };
                    let x = up(&values(rank, len), &[rows, dim]);
                    let res = up(&values(99, len), &[rows, dim]);
                    let (w, b) = (up(&values(77, dim), &[dim]), up(&values(55, dim), &[dim]));
                    let out = be.alloc(DType::BF16, &[rows, dim]).unwrap();
                    let norm = Norm::new(&w, layer.then_some(&b));
                    be.all_reduce_rms_norm(&x, &res, norm, 1e-5, &out).unwrap();
                    let close = |got: Vec<f32>, want: &[f32], what: &str| {
                        for (i, (g, w)) in got.iter().zip(want).enumerate() {
                            assert!(
                                (g - w).abs() <= 1e-2 * w.abs().max(1.0),
                                "{rows}x{dim} layer {layer} {what}[{i}]: {g} vs {w}"
                            );
                        }
                    };
                    close(be.download_f32(&out).unwrap(), &want.0, "out");
                    close(be.download_f32(&res).unwrap(), &want.1, "residual");
                });
            }
        });
    }
}

/// The row-parallel projection + all-reduce + residual RMSNorm op against the CPU
/// backend's matmul of each rank's shard, summed here, then its norm, within bf16
/// rounding (the sum, the residual and the norm): one eager call, then three replays of
/// one graph over new x (so each of the CUDA pushed all-reduce's three staging buffers is
/// used), with a plain all-reduce + norm between calls; the last shapes with a LayerNorm
/// (the two ops on CUDA). On CUDA the pushed kernels take the gemv's row counts (the ranks here
/// run the gemv up to 8 rows), the other shapes the two ops.
fn check_matmul_all_reduce_rms_norm(ranks: &[BackendRef]) {
    let n_ranks = ranks.len();
    let values = |seed: usize, len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7 + seed * 13) % 61) as f32 / 32.0 - 0.9)
            .collect()
    };
    for (m, n, k, layer) in [
        (1usize, 4096usize, 2048usize, false),
        (1, 1000, 256, false),
        (3, 512, 512, false),
        (8, 2048, 1024, false),
        (16, 256, 128, false),
        (1, 4096, 2048, true),
        (3, 512, 512, true),
    ] {
        let cpu_be = CpuBackend::new();
        let cpu: &dyn Backend = &cpu_be;
        let bf = |v: &[f32], shape: &[usize]| cpu.upload_f32_as(v, shape, DType::BF16).unwrap();
        let x_of = |rank: usize, round: usize| values(rank * 5 + round * 11 + 1, m * k);
        let w_of = |rank: usize| values(rank * 3 + 40, n * k);
        // What every rank must get after a call on round `round`'s x: the residual and
        // the norm, starting from `res0`.
        let want = |round: usize, res0: &[f32]| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let mut sum = vec![0f32; m * n];
            for r in 0..n_ranks {
                let part = cpu.alloc(DType::BF16, &[m, n]).unwrap();
                cpu.matmul(
                    &bf(&x_of(r, round), &[m, k]),
                    &bf(&w_of(r), &[n, k]),
                    None,
                    &part,
                )
                .unwrap();
                for (s, p) in sum.iter_mut().zip(cpu.download_f32(&part).unwrap()) {
                    *s += p;
                }
            }
            let (h, res) = (bf(&sum, &[m, n]), bf(res0, &[m, n]));
            let out = cpu.alloc(DType::BF16, &[m, n]).unwrap();
            let (g, b) = (bf(&values(77, n), &[n]), bf(&values(55, n), &[n]));
            cpu.rms_norm(
                &h,
                Some(&res),
                Norm::new(&g, layer.then_some(&b)),
                1e-5,
                &out,
            )
            .unwrap();
            (
                cpu.download_f32(&out).unwrap(),
                cpu.download_f32(&res).unwrap(),
                cpu.download_f32(&h).unwrap(),
            )
        };
        std::thread::scope(|s| {
            for (rank, be) in ranks.iter().enumerate() {
                let (want, x_of, w_of) = (&want, &x_of, &w_of);
                s.spawn(move || {
                    let up = |v: &[f32], shape: &[usize]| {
                        be.upload_f32_as(v, shape, DType::BF16).unwrap()
                    };
                    let x = up(&x_of(rank, 0), &[m, k]);
                    let w = up(&w_of(rank), &[n, k]);
                    let res = up(&values(99, m * n), &[m, n]);
                    let (g, b) = (up(&values(77, n), &[n]), up(&values(55, n), &[n]));
                    let norm = Norm::new(&g, layer.then_some(&b));
                    let hidden = be.alloc(DType::BF16, &[m, n]).unwrap();
                    let out = be.alloc(DType::BF16, &[m, n]).unwrap();
                    let close = |got: Vec<f32>, want: &[f32], what: &str| {
                        for (i, (g, w)) in got.iter().zip(want).enumerate() {
                            assert!(
                                (g - w).abs() <= 2e-2 * w.abs().max(1.0),
                                "{m}x{n}x{k} layer {layer} {what}[{i}]: {g} vs {w}"
                            );
                        }
                    };
                    let call =
                        || be.matmul_all_reduce_rms_norm(&x, &w, &hidden, &res, norm, 1e-5, &out);
                    let res0 = be.download_f32(&res).unwrap();
                    call().unwrap();
                    let (o, r, h) = want(0, &res0);
                    close(be.download_f32(&out).unwrap(), &o, "eager out");
                    close(be.download_f32(&res).unwrap(), &r, "eager residual");
                    close(be.download_f32(&hidden).unwrap(), &h, "eager sum");
                    be.begin_capture().unwrap();
                    call().unwrap();
                    let graph = be.end_capture().unwrap();
                    let plain = up(&values(rank + 3, 4096), &[1, 4096]);
                    let (pres, pw, pout) = (
                        up(&values(5, 4096), &[1, 4096]),
                        up(&values(6, 4096), &[4096]),
                        be.alloc(DType::BF16, &[1, 4096]).unwrap(),
                    );
                    for round in 1..4 {
                        be.copy(&up(&x_of(rank, round), &[m, k]), &x).unwrap();
                        let res0 = be.download_f32(&res).unwrap();
                        graph.replay().unwrap();
                        let (o, r, h) = want(round, &res0);
                        close(be.download_f32(&out).unwrap(), &o, "replayed out");
                        close(be.download_f32(&res).unwrap(), &r, "replayed residual");
                        close(be.download_f32(&hidden).unwrap(), &h, "replayed sum");
                        be.all_reduce_rms_norm(&plain, &pres, (&pw).into(), 1e-5, &pout)
                            .unwrap();
                    }
                });
            }
        });
    }
}

#[test]
fn collectives_sum_and_gather_over_cpu_ranks() {
    for size in [2, 3] {
        let (_, tp) = group(size);
        check_collectives(&tp.0);
        check_all_reduce_rms_norm(&tp.0);
        check_matmul_all_reduce_rms_norm(&tp.0);
    }
}

#[test]
#[ignore = "needs 2 CUDA devices"]
fn cuda_collectives_sum_and_gather_over_two_gpus() {
    use encore_core::backend::cuda::CudaBackend;
    for one_shot in [true, false] {
        let ranks: Vec<Arc<CudaBackend>> = CudaBackend::group(0, 2)
            .unwrap()
            .into_iter()
            .map(|mut b| {
                // The gemv (and so the pushed all-reduce) up to 8 rows.
                b.set_gemv_max_rows(8);
                Arc::new(b)
            })
            .collect();
        assert!(ranks.iter().all(|r| r.has_one_shot_allreduce()));
        ranks
            .iter()
            .for_each(|r| r.set_one_shot_allreduce(one_shot));
        let refs: Vec<BackendRef> = ranks.iter().map(|r| r.clone() as BackendRef).collect();
        check_collectives(&refs);
        check_all_reduce_rms_norm(&refs);
        check_matmul_all_reduce_rms_norm(&refs);
    }
}
