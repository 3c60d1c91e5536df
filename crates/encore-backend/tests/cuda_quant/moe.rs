//! The quantized mixture-of-experts kernels (`qmoe_*`, the grouped GEMM, the expert cache)
//! against the CPU backend.

use super::*;
use encore_backend::backend::{Moe, MoeBias};

/// A mixture-of-experts layer with quantized experts (`qmoe_*`, `qmoe_mma_*` for x in bf16,
/// and the grouped GEMM) against the CPU backend:
/// every format, x in bf16 / f16 / f32, gate/up and down in different formats (a Q4_K_M
/// file's Q4_K gate/up with Q6_K down), rows of 1..=16 blocks (lane groups of 1 to 32
/// lanes), 1, 3 and 40 tokens, every token on one expert; the routing exactly; captured once
/// and replayed on other routing.
#[test]
#[ignore = "needs a CUDA device"]
fn quantized_moe_matches_cpu() {
    let _serial = serial();
    let paths = moe_paths();
    let cpu = CpuBackend::new();
    // (gate/up format, down format, x dtype, tokens, hidden, experts, expert width, top k,
    // all tokens on expert 0)
    type MoeCase = (
        QuantFormat,
        QuantFormat,
        DType,
        usize,
        usize,
        usize,
        usize,
        usize,
        bool,
    );
    let mut cases: Vec<MoeCase> = QuantFormat::ALL
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let dt = [DType::BF16, DType::F16, DType::F32][i % 3];
            let n = [1, 3, 40][i % 3];
            (f, f, dt, n, 512, 8, 256, 2, false)
        })
        .collect();
    cases.extend([
        (
            QuantFormat::Q4K,
            QuantFormat::Q6K,
            DType::BF16,
            1,
            768,
            16,
            768,
            8,
            false,
        ),
        (
            QuantFormat::Q4K,
            QuantFormat::Q6K,
            DType::BF16,
            5,
            256,
            4,
            4096,
            2,
            true,
        ),
        (
            QuantFormat::Q8_0,
            QuantFormat::Q4_0,
            DType::F16,
            2,
            32,
            6,
            64,
            3,
            false,
        ),
    ]);
    // Every format with x in bf16 (the tensor-core pair kernels), 2 tokens, top 3: group
    // counts that leave lanes of the last chunk idle where the block allows (160 values: 5
    // groups), 8-output tiles past the width (96).
    cases.extend(QuantFormat::ALL.iter().map(|&f| {
        let (h, i) = match f.block_elems() {
            256 => (768, 256),
            128 => (384, 128),
            _ => (160, 96),
        };
        (f, f, DType::BF16, 2, h, 5, i, 3, false)
    }));
    // 64-row tiles of the grouped GEMM (over 32 pairs an expert).
    cases.push((
        QuantFormat::Q4K,
        QuantFormat::Q6K,
        DType::BF16,
        300,
        256,
        4,
        256,
        2,
        false,
    ));
    cases.push((
        QuantFormat::Q5_1,
        QuantFormat::F8E4M3,
        DType::F16,
        90,
        256,
        4,
        128,
        2,
        true,
    ));
    for (c, &(gf, df, dt, n, h, e, i, k, one)) in cases.iter().enumerate() {
        let seed = 1000 + 31 * c as u64;
        let x = values(n * h, seed);
        let logits: Vec<f32> = (0..n * e)
            .map(|j| {
                let ex = j % e;
                if one {
                    if ex == 0 {
                        4.0
                    } else {
                        ex as f32 * 0.1
                    }
                } else {
                    ((j * 7919 + c) % e) as f32 * 0.23
                }
            })
            .collect();
        let gu = weight_bytes(gf, 2 * e * i, h, seed + 1);
        let dn = weight_bytes(df, e * h, i, seed + 2);
        let name = format!("case {c} ({gf}/{df}, {dt}, n={n} h={h} e={e} i={i} k={k})");
        QuantMoe {
            act: Activation::Silu,
            dt,
            shape: (n, h, e, i, k),
            x: &x,
            logits: &logits,
            gate_up: (gf, &gu),
            down: (df, &dn),
            bias: None,
        }
        .check(&name, &cpu, &paths);
    }
}

/// One quantized mixture-of-experts call: x and the router logits in f32, the experts'
/// bytes in their formats, optional gate/up and down biases; `shape` is (tokens, hidden,
/// experts, expert width, top k), x and the output in `dt`.
pub(super) struct QuantMoe<'a> {
    pub act: Activation,
    pub dt: DType,
    pub shape: (usize, usize, usize, usize, usize),
    pub x: &'a [f32],
    pub logits: &'a [f32],
    pub gate_up: (QuantFormat, &'a [u8]),
    pub down: (QuantFormat, &'a [u8]),
    pub bias: Option<(&'a [f32], &'a [f32])>,
}

impl QuantMoe<'_> {
    /// The chosen experts and the output on `be`, its operands uploaded afresh: eager, or
    /// (`replay`) captured on reversed logits and replayed on the real ones.
    fn run(&self, be: &dyn Backend, replay: bool) -> (Vec<i32>, Vec<f32>) {
        let (n, h, e, i, k) = self.shape;
        let dt = self.dt;
        let xt = be.upload_f32_as(self.x, &[n, h], dt).unwrap();
        let lt = be.upload_f32_as(self.logits, &[n, e], DType::F32).unwrap();
        let gt = upload_q(be, self.gate_up.0, 2 * e * i, h, self.gate_up.1);
        let dnt = upload_q(be, self.down.0, e * h, i, self.down.1);
        let biases = self.bias.map(|(gu, dn)| {
            (
                be.upload_f32_as(gu, &[2 * e * i], dt).unwrap(),
                be.upload_f32_as(dn, &[e * h], dt).unwrap(),
            )
        });
        let ids = be.alloc(DType::I32, &[n, k]).unwrap();
        let wts = be.alloc(DType::F32, &[n, k]).unwrap();
        let out = be.alloc(dt, &[n, h]).unwrap();
        let scratch = be.alloc(dt, &[n * k, i]).unwrap();
        let work_len = be.moe_workspace_bytes(n, h, e, k, dt).div_ceil(4).max(1);
        let work = be.alloc(DType::I32, &[work_len]).unwrap();
        let moe = || {
            be.moe(&Moe {
                act: self.act,
                bias: biases
                    .as_ref()
                    .map(|(gate_up, down)| MoeBias { gate_up, down }),
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
        if replay {
            let rev: Vec<f32> = self.logits.iter().rev().copied().collect();
            be.write(&lt, &rev).unwrap();
            be.begin_capture().unwrap();
            moe();
            let graph = be.end_capture().unwrap();
            be.write(&lt, self.logits).unwrap();
            graph.replay().unwrap();
        } else {
            moe();
        }
        (
            be.download::<i32>(&ids).unwrap(),
            be.download_f32(&out).unwrap(),
        )
    }

    /// On every path against `cpu`: the routing exactly, the output within the dtype's
    /// tolerance, and a replay from a graph captured on other routing equal to eager.
    pub(super) fn check(&self, name: &str, cpu: &dyn Backend, paths: &[(&str, CudaBackend)]) {
        let (ci, co) = self.run(cpu, false);
        for (path, gpu) in paths {
            let name = format!("{name}, {path}");
            let (gi, go) = self.run(gpu, false);
            assert_eq!(gi, ci, "{name}: chosen experts");
            assert_close(&name, &go, &co, self.dt);
            let (ri, ro) = self.run(gpu, true);
            assert_eq!(ri, gi, "{name}: replayed routing");
            assert_eq!(ro, go, "{name}: replay against eager");
        }
    }
}

/// The expert cache on CUDA against the CPU's: the same decisions call after call (the
/// slot table, the owners, the fills and the totals equal), the outputs within tolerance,
/// and equal bit for bit to the same kernels reading the resident stacks; replayed from
/// captured graphs (one per layer, the decisions made inside them) the same as eager. Dense
/// and quantized experts, the pair kernels and the grouped GEMM, the fewest slots a call
/// may need (so most calls evict). With a prefetch of the other layer's experts (predicted
/// by other random logits) on the side stream, the same again, its fills included.
#[test]
#[ignore = "needs a CUDA device"]
fn expert_cache_matches_cpu_and_replays() {
    let _serial = serial();
    let grouped = CudaBackend::new(0).unwrap().with_moe_gemm_min_tokens(1);
    let pairs = CudaBackend::new(0)
        .unwrap()
        .with_moe_gemm_min_tokens(usize::MAX);
    let cpu = CpuBackend::new();
    // (gate/up format, down format (None: bf16), tokens)
    let cases: [(Option<QuantFormat>, Option<QuantFormat>, usize); 4] = [
        (None, None, 1),
        (None, None, 40),
        (Some(QuantFormat::Q4K), Some(QuantFormat::Q6K), 3),
        (Some(QuantFormat::Q4K), Some(QuantFormat::Q6K), 40),
    ];
    let (h, e, i, k, layers, calls) = (256, 8, 256, 2, 2, 8);
    let dt = DType::BF16;
    for (c, &(gf, df, n)) in cases.iter().enumerate() {
        let seed = 5000 + 17 * c as u64;
        let bytes = |f: Option<QuantFormat>, rows: usize, cols: usize, s: u64| match f {
            Some(f) => weight_bytes(f, rows, cols, s),
            None => values(rows * cols, s)
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v / 16.0).to_le_bytes())
                .collect(),
        };
        let gu = bytes(gf, 2 * e * i, h, seed);
        let dn = bytes(df, e * h, i, seed + 1);
        let x = values(n * h, seed + 2);
        let logits: Vec<Vec<f32>> = (0..calls)
            .map(|s| values(n * e, seed + 10 + s as u64))
            .collect();
        let predicted: Vec<Vec<f32>> = (0..calls)
            .map(|s| values(n * e, seed + 50 + s as u64))
            .collect();
        for prefetch in [false, true] {
            // The fewest slots a call may need; with a prefetch, room for one more call's
            // experts where there are experts enough (else the call's pinned slots leave
            // the prefetch none).
            let slots = e.min(n * k * (1 + prefetch as usize));
            let name =
                format!("case {c} ({gf:?}/{df:?}, n={n}, {slots} slots, prefetch {prefetch})");
            type Call = (
                Vec<i32>,
                Vec<f32>,
                Vec<i32>,
                Vec<i32>,
                Vec<i32>,
                Vec<i64>,
                Vec<i32>,
            );
            // Each call's chosen experts, output and tables (slot_of, owner, fills, stats,
            // prefetch fills); `cached`: through the cache (else the resident stacks);
            // `replay`: from graphs.
            let run = |be: &dyn Backend, cached: bool, replay: bool| -> Vec<Call> {
                let host = |b: &[u8], shape: &[usize], f: Option<QuantFormat>| {
                    let dtype = f.map_or(dt, DType::Q);
                    if !cached {
                        let t = be.alloc(dtype, shape).unwrap();
                        be.write_bytes(&t, b).unwrap();
                        return t;
                    }
                    let mut mem = be.alloc_host(b.len()).unwrap();
                    mem.bytes_mut().unwrap().copy_from_slice(b);
                    be.host_view(&Arc::new(mem), 0, shape, dtype).unwrap()
                };
                let gt = host(&gu, &[2 * e * i, h], gf);
                let dnt = host(&dn, &[e * h, i], df);
                let slot = |t: &Tensor| (t.size_bytes() / e).next_multiple_of(16);
                let cache = ExpertSlots::new(be, layers, e, slots, slot(&gt), slot(&dnt)).unwrap();
                let xt = be.upload_f32_as(&x, &[n, h], dt).unwrap();
                let lt = be.upload_f32_as(&logits[0], &[n, e], DType::F32).unwrap();
                let pt = be
                    .upload_f32_as(&predicted[0], &[n, e], DType::F32)
                    .unwrap();
                let ids = be.alloc(DType::I32, &[n, k]).unwrap();
                let wts = be.alloc(DType::F32, &[n, k]).unwrap();
                let (pids, pwts) = (
                    be.alloc(DType::I32, &[n, k]).unwrap(),
                    be.alloc(DType::F32, &[n, k]).unwrap(),
                );
                let out = be.alloc(dt, &[n, h]).unwrap();
                let scratch = be.alloc(dt, &[n * k, i]).unwrap();
                let work_len = be.moe_workspace_bytes(n, h, e, k, dt).div_ceil(4).max(1);
                let work = be.alloc(DType::I32, &[work_len]).unwrap();
                // Successive prefetches alternate rows of fills (the layers alternate).
                let pf_rows = [0, 1].map(|i| cache.prefetch_fills(i).unwrap());
                let moe = |layer: usize| {
                    be.moe(&encore_backend::backend::Moe {
                        act: encore_backend::backend::Activation::Silu,
                        bias: None,
                        x: &xt,
                        logits: &lt,
                        top_k: k,
                        renormalize: false,
                        gate_up: &gt,
                        down: &dnt,
                        ids: &ids,
                        weights: &wts,
                        out: &out,
                        scratch: &scratch,
                        workspace: &work,
                        cache: cached.then(|| {
                            let mut c = cache.args(layer, 0.75);
                            c.prefetch = prefetch.then(|| encore_backend::ExpertPrefetch {
                                layer: (layer + 1) % layers,
                                logits: &pt,
                                ids: &pids,
                                weights: &pwts,
                                gate_up: &gt,
                                down: &dnt,
                                fills: &pf_rows[layer % 2],
                            });
                            c
                        }),
                    })
                    .unwrap();
                    // Where a segment ends: the side stream joins.
                    be.join_expert_prefetch().unwrap();
                };
                let graphs: Vec<_> = (0..layers)
                    .filter(|_| replay)
                    .map(|l| {
                        be.begin_capture().unwrap();
                        moe(l);
                        be.end_capture().unwrap()
                    })
                    .collect();
                (0..calls)
                    .map(|s| {
                        be.write(&lt, &logits[s]).unwrap();
                        be.write(&pt, &predicted[s]).unwrap();
                        match graphs.get(s % layers) {
                            Some(g) => g.replay().unwrap(),
                            None => moe(s % layers),
                        }
                        (
                            be.download::<i32>(&ids).unwrap(),
                            be.download_f32(&out).unwrap(),
                            be.download::<i32>(&cache.slot_of).unwrap(),
                            be.download::<i32>(&cache.owner).unwrap(),
                            be.download::<i32>(&cache.fills).unwrap(),
                            be.download::<i64>(&cache.stats).unwrap(),
                            be.download::<i32>(&cache.prefetch_fills).unwrap(),
                        )
                    })
                    .collect()
            };
            let want = run(&cpu, true, false);
            assert!(
                want.last().unwrap().5[2] > slots as i64,
                "{name}: the calls should evict"
            );
            // A call of 40 tokens needs every expert: no slot is left to prefetch into.
            assert_eq!(
                want.last().unwrap().5[4] > 0,
                prefetch && n * k < e,
                "{name}: experts prefetched"
            );
            for (path, gpu) in [("pairs", &pairs as &dyn Backend), ("grouped", &grouped)] {
                let name = format!("{name}, {path}");
                let got = run(gpu, true, false);
                let resident = run(gpu, false, false);
                for (s, ((g, w), r)) in got.iter().zip(&want).zip(&resident).enumerate() {
                    assert_eq!(g.0, w.0, "{name} call {s}: chosen experts");
                    assert_close(&format!("{name} call {s}"), &g.1, &w.1, dt);
                    assert_eq!(g.1, r.1, "{name} call {s}: cached against resident");
                    assert_eq!(
                        (&g.2, &g.3, &g.4, &g.5, &g.6),
                        (&w.2, &w.3, &w.4, &w.5, &w.6),
                        "{name} call {s}: the cache's decisions"
                    );
                }
                let replayed = run(gpu, true, true);
                for (s, (r, g)) in replayed.iter().zip(&got).enumerate() {
                    assert_eq!(r, g, "{name} call {s}: replayed against eager");
                }
            }
        }
    }
}
