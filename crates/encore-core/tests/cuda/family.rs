//! A dummy model of one family on CUDA, eager and replayed from decode graphs, against
//! the CPU backend's eager run: the check every family's CUDA test makes.

use encore_core::kv::SeqId;
use encore_core::model::config::ModelConfig;
use encore_core::request::SamplingParams;
use encore_core::runner::{Runner, SeqStep, Seqs};

use super::*;

/// `cfg`'s dummy model on CUDA (eager, then decode graphs) against the CPU's eager run.
pub(crate) fn runs_on_cuda_as_on_cpu(cfg: ModelConfig) {
    let _serial = serial();
    let cuda = cuda();
    let cpu = CpuBackend::new();
    let run = |be: &dyn Backend, graph: bool| -> Vec<Vec<f32>> {
        let model = common::dummy_model(be, cfg.clone(), 128);
        let mut r = Runner::new(be, model, common::tiny_config(64)).unwrap();
        if graph {
            r.set_graph_mode(Some(common::buckets()));
        }
        let mut seqs = Seqs::for_runner(&r).unwrap();
        let greedy = SamplingParams::default();
        let prompts: Vec<Vec<u32>> = (0..3u32)
            .map(|i| (0..3 + 7 * i).map(|j| (i * 31 + j * 7 + 5) % 512).collect())
            .collect();
        for (i, p) in prompts.iter().enumerate() {
            seqs.blocks.allocate(SeqId(i as u64), p.len()).unwrap();
        }
        fn step(seq: u64, tokens: &[u32], sampling: SamplingParams) -> SeqStep<'_> {
            SeqStep {
                seq: SeqId(seq),
                tokens,
                sampling,
                masked: false,
                score: None,
                verify: false,
                logit_bias: &[],
            }
        }
        let batch: Vec<SeqStep<'_>> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| step(i as u64, p, greedy))
            .collect();
        let (mut last, mut logits) = r.step_with_logits(&mut seqs, &batch).unwrap();
        for _ in 0..6 {
            let toks: Vec<[u32; 1]> = last.iter().map(|&t| [t]).collect();
            for i in 0..toks.len() {
                seqs.blocks.append(SeqId(i as u64), 1).unwrap();
            }
            let batch: Vec<SeqStep<'_>> = toks
                .iter()
                .enumerate()
                .map(|(i, t)| step(i as u64, t, greedy))
                .collect();
            let (t, l) = r.step_with_logits(&mut seqs, &batch).unwrap();
            logits.extend(l);
            last = t;
        }
        if graph {
            assert!(r.graph_stats().unwrap().captures > 0, "no decode graph ran");
        }
        logits
    };
    let want = run(&cpu, false);
    for graph in [false, true] {
        let got = run(cuda.as_ref(), graph);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let num: f64 = g.iter().zip(w).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = w.iter().map(|y| (*y as f64).powi(2)).sum();
            let e = (num / den).sqrt();
            assert!(
                e < 1e-4,
                "graph {graph}: logits row {i}: relative error {e:.2e}"
            );
        }
    }
}
