//! gpt-oss over CPU ranks: each rank holds its heads' sinks, its columns of q/k/v and
//! their biases, its rows of every expert's gate/up and their biases and its columns of
//! every expert's down (in whole MXFP4 blocks), the router and its bias replicated; the
//! row-parallel biases (o_proj's, the experts' down) are rank 0's, zeros on the others,
//! so the sum over the ranks adds them once. Greedy tokens over 2 and 4 ranks equal one
//! rank's (dense and MXFP4 experts, eagerly and in graphs, also under the expert cache),
//! the logits to f32 rounding, and a split MXFP4 cannot hold is refused by name.

use super::*;
use common::gpt_oss::splittable;
use encore_core::model::decl::Role;
use encore_core::model::weights::WeightSource;

fn files(mxfp4: bool) -> ModelFiles {
    ModelFiles {
        config: splittable(5, mxfp4),
        source: WeightSource::Dummy { seed: 11 },
    }
}

#[test]
fn gpt_oss_over_2_and_4_ranks_gives_one_ranks_tokens() {
    files_give_one_ranks_tokens("gpt-oss", || files(false));
    files_give_one_ranks_tokens("gpt-oss, MXFP4 experts", || files(true));
}

/// The last-token logits of a 20-token prompt (crossing the windows of 6) over `size`
/// ranks.
fn logits(files: ModelFiles, size: usize) -> Vec<f32> {
    let (be, tp) = group(size);
    let cfg = EngineConfig {
        tp,
        ..config(false)
    };
    let Engine { mut runner, .. } = Engine::new(be.as_ref(), files, &cfg, &NoProgress).unwrap();
    let mut seqs = Seqs::for_runner(&runner).unwrap();
    let p = &prompts()[2];
    seqs.blocks.allocate(SeqId(0), p.len()).unwrap();
    let step = SeqStep {
        seq: SeqId(0),
        tokens: p,
        sampling: SamplingParams::default(),
        masked: false,
        score: None,
        verify: false,
        logit_bias: &[],
    };
    let mut out = runner.step_with_logits(&mut seqs, &[step]).unwrap().1;
    out.swap_remove(0)
}

/// The sum over the ranks adds each row-parallel bias once: over 2 and 4 ranks the logits
/// are one rank's to f32 rounding (a bias added per rank moves them by ~1e-2).
#[test]
fn gpt_oss_logits_over_ranks_match_one_rank() {
    for mxfp4 in [false, true] {
        let one = logits(files(mxfp4), 1);
        assert_eq!(one.len(), 512);
        for size in [2, 4] {
            let got = logits(files(mxfp4), size);
            let diff = one
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                diff < 1e-4,
                "mxfp4 {mxfp4}, {size} ranks: max |diff| {diff}"
            );
        }
    }
}

/// What each rank declares: its heads' sinks, o_proj's and the experts' down biases on
/// rank 0 alone (zeros elsewhere), the router's bias whole, its share of the gate/up
/// biases.
#[test]
fn each_rank_declares_its_share_of_gpt_oss_biases_and_sinks() {
    let whole = splittable(5, true);
    for (rank, size) in [(0, 2), (1, 2), (3, 4)] {
        let shard = whole.shard(rank, size).unwrap();
        let decl = shard.decl();
        let t = |r: Role| {
            decl.tensors()
                .iter()
                .find(|t| t.role == r && t.layer == Some(0))
                .unwrap()
                .clone()
        };
        let heads = 4 / size;
        let sinks = t(Role::Sinks);
        assert_eq!(sinks.shape, vec![heads]);
        let s = sinks.parts[0].slice.unwrap();
        assert_eq!((s.row, s.rows, s.pad), (rank * heads, heads, 0));
        for r in [Role::OProjBias, Role::ExpertsDownBias] {
            let b = t(r);
            assert_eq!(b.shape[0], b.parts.len() * 128, "{r:?}");
            for p in &b.parts {
                let s = p.slice.unwrap();
                let want = if rank == 0 { (128, 0) } else { (0, 128) };
                assert_eq!((s.rows, s.pad), want, "{r:?}, rank {rank}");
            }
        }
        assert!(t(Role::RouterBias).parts[0].slice.is_none());
        assert_eq!(t(Role::RouterBias).shape, vec![5]);
        // Gate and up biases of each of the 5 experts: this rank's 128 / size rows.
        assert_eq!(t(Role::ExpertsGateUpBias).shape, vec![2 * 5 * 128 / size]);
    }
}

/// MXFP4's blocks of 32 are never split: an expert width of 96 (3 blocks) goes over 2
/// ranks as 32 + 64 and is refused over 4; a width that is not whole blocks is refused.
#[test]
fn mxfp4_experts_split_in_whole_blocks_or_are_refused() {
    let mut c = splittable(5, true);
    c.moe.as_mut().unwrap().expert_intermediate = 96;
    let widths: Vec<usize> = (0..2)
        .map(|r| c.shard(r, 2).unwrap().moe.unwrap().expert_intermediate)
        .collect();
    assert_eq!(widths, [32, 64]);
    let e = c.shard(0, 4).unwrap_err().to_string();
    assert!(
        e.contains("expert MLP width 96 (3 blocks of 32 values in mxfp4)")
            && e.contains("--tensor-parallel-size 4"),
        "{e}"
    );
    c.moe.as_mut().unwrap().expert_intermediate = 80;
    let e = c.shard(0, 2).unwrap_err().to_string();
    assert!(
        e.contains("expert MLP width 80 is not whole blocks of 32 values (mxfp4)"),
        "{e}"
    );
}

/// The expert cache on each rank, its share of the MXFP4 experts streamed under its own
/// budget inside the graphs: one rank's tokens without a budget.
#[test]
fn gpt_oss_ranks_stream_their_mxfp4_experts_through_the_expert_cache() {
    let one = greedy_files(|| files(true), 1, true);
    for size in [1, 2] {
        let (be, tp) = group(size);
        let cfg = EngineConfig {
            tp,
            offload: Some(OffloadConfig {
                budget: WeightBudget::Percent(70.0),
                policy: Policy::Experts,
                expert_prefetch: false,
            }),
            ..config(true)
        };
        let Engine { mut runner, report } =
            Engine::new(be.as_ref(), files(true), &cfg, &NoProgress).unwrap();
        assert_eq!(report.offload.unwrap().policy, Some(Policy::Experts));
        let opts = GenerateOptions {
            max_tokens: 12,
            sampling: SamplingParams::default(),
            ignore_eos: true,
        };
        let out = generate(&mut runner, &prompts(), &[], &opts, &NoProgress, |_, _| {
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
        let got: Vec<Vec<u32>> = out.into_iter().map(|g| g.output_ids).collect();
        assert_eq!(got, one, "{size} ranks");
        let s = runner.expert_stats().unwrap().expect("the expert cache");
        assert!(s.misses > 0, "{size} ranks: {s:?}");
    }
}

/// gpt-oss over 2 CUDA devices: one GPU's greedy tokens, f32, dense and MXFP4 experts,
/// eagerly and in graphs (NCCL's all-reduce after o_proj with rank 0's bias).
#[test]
#[ignore = "needs 2 CUDA devices"]
fn cuda_gpt_oss_over_two_gpus_gives_one_gpus_tokens() {
    use encore_core::backend::cuda::CudaBackend;
    let run = |mxfp4: bool, size: usize, graphs: bool| {
        let ranks: Vec<BackendRef> = CudaBackend::group(0, size)
            .unwrap()
            .into_iter()
            .map(|b| Arc::new(b) as BackendRef)
            .collect();
        let be = ranks[0].clone();
        let cfg = EngineConfig {
            tp: encore_core::engine::TpBackends(if size > 1 { ranks } else { vec![] }),
            ..config(graphs)
        };
        greedy_of(files(mxfp4), be, cfg, size, 16)
    };
    for mxfp4 in [false, true] {
        for graphs in [false, true] {
            assert_eq!(
                run(mxfp4, 2, graphs),
                run(mxfp4, 1, graphs),
                "mxfp4 {mxfp4}, graphs {graphs}"
            );
        }
    }
}
