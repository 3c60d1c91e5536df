//! The graph policy: which key a step runs in (a decode graph, a token bucket's pieces,
//! or eager), which keys a configuration captures, and their capture and warm-up ahead
//! of use.

use crate::error::{Error, Result};
use crate::graph::{BucketPolicy, GraphStats, Key, Layout, Phase};
use crate::memory::ArenaStats;

use super::group::Cmd;
use super::pack::Packer;
use super::step::StepShape;
use super::{Runner, SeqStep};

/// Which graphs the runner captures: decode batch-size buckets and token-count buckets
/// for prefill and mixed steps ([`BucketPolicy::None`] for either keeps it eager), and
/// speculative decoding's verify graphs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphConfig {
    pub decode: BucketPolicy,
    pub mixed: BucketPolicy,
    /// Drafts per sequence of the verify graphs (0: none): a verify graph per decode
    /// bucket `B` whose `B * (verify + 1)` token rows fit `max_seqs` sampling rows and
    /// `max_tokens_per_step`, serving verify steps of up to `B` sequences, each
    /// verifying up to `verify` drafts or decoding one token ([`Phase::Verify`]).
    pub verify: usize,
}

/// How a step runs, fixed by its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    Eager,
    Graph(Key),
}

/// The graph configuration and the step sizes it is bounded by.
pub(super) struct GraphPolicy {
    pub graphs: Option<GraphConfig>,
    /// Run every step eagerly, keeping the captured graphs (for comparisons).
    pub force_eager: bool,
    /// Check every replay against an eager run of the same step.
    pub verify: bool,
    pub max_tokens: usize,
    pub max_seqs: usize,
}

impl GraphPolicy {
    /// The plan and input layout of a step of `n` tokens from `b` sequences.
    pub fn plan(
        &self,
        inputs: &Packer<'_>,
        n: usize,
        b: usize,
        decode_only: bool,
    ) -> (Plan, Layout) {
        let Some(g) = self.graphs.as_ref().filter(|_| !self.force_eager) else {
            return (Plan::Eager, inputs.layout(n, b));
        };
        if decode_only {
            if let Some(r) = g.decode.bucket_for(b).filter(|&r| r <= self.max_seqs) {
                let key = Key {
                    phase: Phase::Decode,
                    bucket: r,
                };
                return (Plan::Graph(key), self.layout_of(inputs, key));
            }
        }
        self.mixed(inputs, g, n, b)
    }

    /// A token bucket's pieces for a step of `n` tokens from `b` sequences, or eager.
    fn mixed(&self, inputs: &Packer<'_>, g: &GraphConfig, n: usize, b: usize) -> (Plan, Layout) {
        match g.mixed.bucket_for(n).filter(|&t| t <= self.max_tokens) {
            Some(t) => {
                let key = Key {
                    phase: Phase::Mixed,
                    bucket: t,
                };
                (Plan::Graph(key), self.layout_of(inputs, key))
            }
            None => (Plan::Eager, inputs.layout(n, b)),
        }
    }

    /// The verify graph a step over `batch` runs in, with its layout: every sequence's
    /// chunk has at most the graphs' drafts + 1 tokens (a verify chunk, a decode token, a
    /// short chunk of a prompt or of a draft model's catch-up), none is scored, and its
    /// decode bucket has a verify graph; with masked rows (`masked`) the graph stopping at
    /// the logits. `None`: none serves it.
    pub fn plan_verify(
        &self,
        inputs: &Packer<'_>,
        batch: &[SeqStep<'_>],
        masked: bool,
    ) -> Option<(Key, Layout)> {
        let g = self.graphs.as_ref().filter(|_| !self.force_eager)?;
        let k = g.verify;
        let fits = |s: &SeqStep<'_>| s.score.is_none() && s.tokens.len() <= k + 1;
        if k == 0 || !batch.iter().all(fits) {
            return None;
        }
        let bucket = g.decode.bucket_for(batch.len())?;
        let key = Key {
            phase: if masked {
                Phase::VerifyLogits
            } else {
                Phase::Verify
            },
            bucket,
        };
        self.verify_fits(g, bucket)
            .then(|| (key, self.layout_of(inputs, key)))
    }

    /// Whether decode bucket `bucket` has a verify graph: its token and sampling rows fit.
    fn verify_fits(&self, g: &GraphConfig, bucket: usize) -> bool {
        g.verify > 0 && bucket.saturating_mul(g.verify + 1) <= self.max_seqs.min(self.max_tokens)
    }

    /// The fixed input layout of a captured key: decode buckets have one token per
    /// sequence row; a token bucket has room for as many sequences as it can hold; a
    /// verify graph of bucket `B` has `B * (k + 1)` token and sampling rows (its
    /// sequences' own rows first, their drafts' rows from row `B`).
    pub fn layout_of(&self, inputs: &Packer<'_>, key: Key) -> Layout {
        match key.phase {
            Phase::Decode | Phase::DecodeLogits => inputs.layout(key.bucket, key.bucket),
            Phase::Mixed => inputs.layout(key.bucket, key.bucket.min(self.max_seqs)),
            Phase::Verify | Phase::VerifyLogits => {
                let k = self.graphs.as_ref().map_or(0, |g| g.verify);
                let rows = key.bucket * (k + 1);
                inputs.layout(rows, rows)
            }
        }
    }

    /// Every key the configuration captures (decode buckets up to `max_seqs`, token
    /// buckets up to `max_tokens`), largest first within each phase.
    pub fn keys(&self) -> Vec<Key> {
        let Some(g) = &self.graphs else {
            return Vec::new();
        };
        let keys = |policy: &BucketPolicy, phase: Phase, max: usize| {
            let buckets = policy.buckets().into_iter().filter(move |&r| r <= max);
            buckets.rev().map(move |bucket| Key { phase, bucket })
        };
        let verify = g
            .decode
            .buckets()
            .into_iter()
            .rev()
            .filter(|&b| self.verify_fits(g, b))
            .map(|bucket| Key {
                phase: Phase::Verify,
                bucket,
            });
        keys(&g.decode, Phase::Decode, self.max_seqs)
            .chain(keys(&g.mixed, Phase::Mixed, self.max_tokens))
            .chain(verify)
            .collect()
    }

    /// An error unless `key` is one of [`GraphPolicy::keys`] (or the logits-only graph
    /// of one of its decode buckets).
    fn check(&self, key: Key) -> Result<()> {
        let listed = Key {
            phase: match key.phase {
                Phase::DecodeLogits => Phase::Decode,
                Phase::VerifyLogits => Phase::Verify,
                p => p,
            },
            ..key
        };
        if self.keys().contains(&listed) {
            return Ok(());
        }
        Err(Error::invalid(
            "capture",
            format!(
                "{key} is not a bucket of the graph configuration (graph mode {}; decode buckets up to max_seqs {}, token buckets up to max_tokens_per_step {})",
                if self.graphs.is_some() { "on" } else { "off" },
                self.max_seqs,
                self.max_tokens
            ),
        ))
    }
}

impl Runner<'_> {
    /// Turn graph mode on with decode buckets only (prefill and mixed steps eager), or
    /// off (`None`). Drops the captured graphs.
    pub fn set_graph_mode(&mut self, policy: Option<BucketPolicy>) {
        self.set_graphs(policy.map(|decode| GraphConfig {
            decode,
            mixed: BucketPolicy::None,
            verify: 0,
        }));
    }

    /// Turn graph mode on with decode and token buckets, or off (`None`: every step
    /// eager). Drops the captured graphs and their statistics.
    pub fn set_graphs(&mut self, graphs: Option<GraphConfig>) {
        let cmd = graphs.clone();
        // Clearing captured graphs issues no collective; it cannot fail.
        let _ = self.mirrored(
            || Cmd::SetGraphs(cmd),
            |r| {
                r.set_graphs_local(graphs);
                Ok(())
            },
        );
    }

    pub(super) fn set_graphs_local(&mut self, graphs: Option<GraphConfig>) {
        self.exec.clear();
        self.policy.graphs = graphs;
    }

    /// Run every step eagerly while `on`, keeping the captured graphs and the graph
    /// configuration (to compare both modes in one process).
    pub fn set_force_eager(&mut self, on: bool) {
        let _ = self.mirrored(
            || Cmd::SetForceEager(on),
            |r| {
                r.policy.force_eager = on;
                Ok(())
            },
        );
    }

    /// Debug check: after every graph replay, run the same step eagerly (unpadded) and
    /// fail if any row's logits differ by more than the dtype's tolerance (normalised
    /// error; f32 1e-4, bf16/f16 3e-2). The tokens returned are the replay's, the logits
    /// the eager run's. Costs an extra eager step per replay.
    pub fn set_verify_graphs(&mut self, on: bool) {
        let _ = self.mirrored(
            || Cmd::SetVerify(on),
            |r| {
                r.policy.verify = on;
                Ok(())
            },
        );
    }

    /// The key a step of `n` tokens from `b` sequences runs in, or `None` (eager).
    pub fn key_for(&self, n: usize, b: usize, decode_only: bool) -> Option<Key> {
        match self.policy.plan(&self.parts.inputs, n, b, decode_only).0 {
            Plan::Graph(k) => Some(k),
            Plan::Eager => None,
        }
    }

    /// Every key the graph configuration captures (decode buckets up to `max_seqs`,
    /// token buckets up to `max_tokens_per_step`), largest first within each phase.
    pub fn graph_keys(&self) -> Vec<Key> {
        self.policy.keys()
    }

    /// Capture every key now (all rows padding), largest first, then plan the LM head's
    /// GEMM for every row count a piecewise step may use; `progress(done, total)` after
    /// each capture.
    pub fn capture_all(&mut self, progress: &mut dyn FnMut(usize, usize)) -> Result<()> {
        self.mirrored(|| Cmd::CaptureAll, |r| r.capture_all_local(progress))
    }

    /// [`Runner::capture_all`] on this rank alone.
    pub(super) fn capture_all_local(
        &mut self,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<()> {
        let keys = self.graph_keys();
        for (i, &key) in keys.iter().enumerate() {
            self.capture_key_from_padding(key, false)?;
            progress(i + 1, keys.len());
        }
        if keys.iter().any(|k| k.phase == Phase::Mixed) {
            self.warm_head()?;
        }
        Ok(())
    }

    /// Capture the decode graph of bucket `rows` now; see [`Runner::capture_key`].
    pub fn capture_bucket(&mut self, rows: usize) -> Result<()> {
        self.capture_key(Key {
            phase: Phase::Decode,
            bucket: rows,
        })
    }

    /// Capture `key` now (all rows padding), unless it is captured already. It must be
    /// one of [`Runner::graph_keys`].
    pub fn capture_key(&mut self, key: Key) -> Result<()> {
        self.mirrored(
            || Cmd::Capture {
                key,
                ahead: false,
                routing: None,
            },
            |r| r.capture_key_from_padding(key, false),
        )
    }

    /// [`Runner::capture_key`]; `ahead`: for the step about to replay it (which then
    /// counts as the key's miss).
    pub(super) fn capture_key_from_padding(&mut self, key: Key, ahead: bool) -> Result<()> {
        self.policy.check(key)?;
        if self.exec.contains(key) {
            return Ok(());
        }
        let be = self.parts.be;
        let layout = self.policy.layout_of(&self.parts.inputs, key);
        let shape = match key.phase {
            Phase::Decode => {
                self.parts.inputs.pad_only(&layout, layout.seqs)?;
                StepShape::whole(layout.seqs, true, 0)
            }
            Phase::DecodeLogits => {
                self.parts.inputs.pad_only(&layout, layout.seqs)?;
                StepShape::whole(layout.seqs, true, 0).logits_only()
            }
            Phase::Mixed => {
                // One empty sequence: every token row is padding.
                self.parts.inputs.pad_only(&layout, 1)?;
                StepShape::split(1, 0)
            }
            Phase::Verify => {
                self.parts.inputs.pad_only(&layout, key.bucket)?;
                StepShape::verify(key.bucket, layout.seqs)
            }
            Phase::VerifyLogits => {
                self.parts.inputs.pad_only(&layout, key.bucket)?;
                StepShape::verify(key.bucket, layout.seqs).logits_only()
            }
        };
        let step = self.parts.forward(&layout, shape)?;
        if ahead {
            self.exec.capture_ahead(be, key, &step)
        } else {
            self.exec.capture(be, key, &step)
        }
    }

    /// Run the LM head (and sampling) eagerly once for every row count a piecewise step's
    /// head may have (a power of two, capped at a token bucket's sequence rows), so no
    /// GEMM is planned during a request.
    fn warm_head(&mut self) -> Result<()> {
        let mut rows = std::collections::BTreeSet::new();
        for k in self.graph_keys() {
            if k.phase != Phase::Mixed {
                continue;
            }
            let cap = self.policy.layout_of(&self.parts.inputs, k).seqs;
            let mut p = 1usize;
            while p < 2 * cap {
                rows.insert(p.min(cap));
                p *= 2;
            }
        }
        let be = self.parts.be;
        for rows in rows {
            let layout = self.parts.inputs.layout(rows, rows);
            self.parts.inputs.pad_only(&layout, rows)?;
            let step = self.parts.forward(&layout, StepShape::head_only(rows))?;
            self.exec.eager(be, &step)?;
        }
        Ok(())
    }

    /// Graph statistics summed over every key, when graph mode is on.
    pub fn graph_stats(&self) -> Option<GraphStats> {
        self.policy.graphs.as_ref().map(|_| self.exec.total(None))
    }

    /// Graph statistics of one phase, when graph mode is on.
    pub fn phase_stats(&self, phase: Phase) -> Option<GraphStats> {
        self.policy
            .graphs
            .as_ref()
            .map(|_| self.exec.total(Some(phase)))
    }

    /// Physical and virtual bytes of the graph memory (the arena's pool, including what
    /// only captured graphs hold), and the time spent mapping.
    pub fn graph_memory_stats(&self) -> ArenaStats {
        self.exec.memory_stats()
    }

    /// Each captured (phase, bucket) with its capture's arena need in bytes, ascending.
    pub fn captured(&self) -> Vec<(Key, usize)> {
        self.exec.captured()
    }

    /// Each captured decode bucket with its capture's arena need in bytes, ascending.
    pub fn captured_buckets(&self) -> Vec<(usize, usize)> {
        self.exec
            .captured()
            .into_iter()
            .filter(|(k, _)| k.phase == Phase::Decode)
            .map(|(k, b)| (k.bucket, b))
            .collect()
    }
}
