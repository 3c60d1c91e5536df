//! The step itself: one forward over the runner's inputs as [`Pieces`] for the executor
//! (the only place the ops of a step are sequenced), and the runner's step entry, which
//! plans, packs, runs eagerly or replays, and reads the samples back.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::{Key, Layout, Phase, Pieces, StepHooks};
use crate::kv::KvCache;
use crate::memory::Arena;
use crate::model::llama::{Model, StepBuffers, StepInputs};
use crate::tensor::{DType, Tensor};

use super::group::{Cmd, Exec};
use super::pack::{Packer, StepViews};
use super::policy::Plan;
use super::sampling::{SampleBuffers, Sampled, StepSampling};
use super::TokenRows;
use super::{FillMasks, Parts, Runner, Score, SeqStep, Seqs};
use crate::request::TokenLogprobs;

/// How a step's ops are grouped into pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// One piece: the whole forward, LM head and sampling (eager steps, decode graphs).
    Whole,
    /// A piece before each attention and one after the last; attention, the LM head and
    /// sampling are the seams (prefill and mixed graphs).
    Split,
    /// Only the LM head and sampling (warm-up).
    HeadOnly,
}

/// What a step runs over its layout: `seqs` sequences (attention rows), pure decode or
/// not, the leading decode rows of a mixed step (0: one attention launch), how its ops
/// are grouped, whether it samples at its end, and its sampling rows (`seqs`, or more
/// with scored prompt tokens).
#[derive(Clone, Copy, Debug)]
pub(super) struct StepShape {
    shape: Shape,
    decode: bool,
    seqs: usize,
    decode_rows: usize,
    sample: bool,
    rows: usize,
}

impl StepShape {
    /// A step run as one piece (eager, or a decode graph).
    pub fn whole(seqs: usize, decode: bool, decode_rows: usize) -> Self {
        StepShape {
            shape: Shape::Whole,
            decode,
            seqs,
            decode_rows,
            sample: true,
            rows: seqs,
        }
    }

    /// A prefill or mixed step split into pieces at its attention calls.
    pub fn split(seqs: usize, decode_rows: usize) -> Self {
        StepShape {
            shape: Shape::Split,
            decode: false,
            seqs,
            decode_rows,
            sample: true,
            rows: seqs,
        }
    }

    /// A verify graph's step: `seqs` sequences (the bucket) through the prefill path of
    /// attention, run as one piece, with `rows` sampling rows.
    pub fn verify(seqs: usize, rows: usize) -> Self {
        StepShape::whole(seqs, false, 0).with_rows(rows)
    }

    /// The LM head and sampling alone, over `rows` rows (warm-up).
    pub fn head_only(rows: usize) -> Self {
        StepShape {
            shape: Shape::HeadOnly,
            decode: true,
            seqs: rows,
            decode_rows: 0,
            sample: true,
            rows,
        }
    }

    /// The same step (run whole) with `rows >= seqs` sampling rows: the sequences' and,
    /// after them, one per scored prompt token.
    pub fn with_rows(self, rows: usize) -> Self {
        StepShape {
            rows: rows.max(self.seqs),
            ..self
        }
    }

    /// The same step stopping at the logits (its sampling runs after it, eagerly).
    pub fn logits_only(self) -> Self {
        StepShape {
            sample: false,
            ..self
        }
    }
}

/// One forward step over the runner's inputs, as [`Pieces`] for the executor.
pub(super) struct ForwardStep<'a> {
    be: &'a dyn Backend,
    model: &'a Model,
    kv: &'a KvCache,
    /// The inputs: token fields at the layout's capacity, sequence fields cut to `seqs`;
    /// and, when scored prompt tokens add sampling rows, cut to those rows for sampling.
    v: StepViews,
    vs: Option<StepViews>,
    /// The layout's capacity.
    tokens: usize,
    seq_rows: usize,
    head_rows: usize,
    shape: StepShape,
    sampling: StepSampling<'a>,
    table_width: usize,
    sample: bool,
    /// Asynchronous scheduling: the samples of the step before, which rows with a
    /// [`StepViews::prev_row`] take their token ids from before the embedding.
    prev: Option<&'a Tensor>,
}

impl<'a> ForwardStep<'a> {
    /// A step over `inputs` in `layout`, shaped per `shape`; `sample`: sample at its
    /// end where `shape` does (a tensor-parallel follower's steps stop at the logits).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        be: &'a dyn Backend,
        model: &'a Model,
        kv: &'a KvCache,
        inputs: &'a Packer<'_>,
        sampling: &'a SampleBuffers,
        layout: &Layout,
        mut shape: StepShape,
        sample: bool,
    ) -> Result<Self> {
        let seqs = shape.seqs;
        if shape.decode_rows >= seqs {
            shape.decode_rows = 0;
        }
        // The LM head's rows: padded to a power of two within the layout for pieces, so its
        // GEMM shapes are few (and planned at capture).
        let head_rows = match shape.shape {
            Shape::Split => seqs.next_power_of_two().min(layout.seqs),
            _ => shape.rows,
        };
        Ok(ForwardStep {
            be,
            model,
            kv,
            v: StepViews::cut(&inputs.table, layout, seqs, shape.decode_rows)?,
            vs: match shape.rows > seqs {
                true => Some(StepViews::cut(&inputs.table, layout, shape.rows, 0)?),
                false => None,
            },
            tokens: layout.tokens,
            seq_rows: layout.seqs,
            head_rows,
            shape,
            sampling: sampling.step(shape.rows)?,
            table_width: inputs.table_width,
            sample: sample && shape.sample,
            prev: None,
        })
    }

    /// Take the token ids of rows with a [`StepViews::prev_row`] from `prev` first.
    fn with_prev(self, prev: Option<&'a Tensor>) -> Self {
        ForwardStep { prev, ..self }
    }

    /// The token ids of rows that follow the step before, from its samples.
    fn fill_prev(&self) -> Result<()> {
        match self.prev {
            Some(prev) => self.be.fill_rows(prev, &self.v.prev_row, &self.v.token_ids),
            None => Ok(()),
        }
    }

    fn inputs(&self) -> StepInputs<'_> {
        let d = self.shape.decode_rows;
        StepInputs {
            token_ids: &self.v.token_ids,
            positions: &self.v.positions,
            slot_mapping: &self.v.slot_mapping,
            block_tables: &self.v.block_tables,
            seq_lens: &self.v.seq_lens,
            cu_seqlens_q: (!self.shape.decode).then_some(&self.v.cu_seqlens_q),
            logits_indices: &self.v.logits_indices,
            split: (d > 0).then_some((d, &self.v.cu_rest)),
        }
    }

    fn head_and_sample(&self, buf: &StepBuffers) -> Result<()> {
        let logits = self
            .model
            .head(self.be, &self.inputs(), buf, self.head_rows)?;
        if !self.sample {
            return Ok(());
        }
        self.sampling.sample(
            self.be,
            &logits.prefix(self.shape.rows)?,
            self.vs.as_ref().unwrap_or(&self.v),
        )
    }
}

impl Pieces for ForwardStep<'_> {
    type State = StepBuffers;

    fn alloc(&self, arena: &mut Arena) -> Result<StepBuffers> {
        self.model.alloc_step(
            self.be,
            arena,
            self.tokens,
            self.seq_rows,
            self.table_width,
            self.kv.config().block_size,
        )
    }

    fn count(&self) -> usize {
        match self.shape.shape {
            Shape::Split => self.model.num_pieces(),
            Shape::Whole | Shape::HeadOnly => 1,
        }
    }

    fn piece(&self, buf: &StepBuffers, i: usize) -> Result<()> {
        let inp = self.inputs();
        match self.shape.shape {
            Shape::Split => {
                if i == 0 {
                    self.fill_prev()?;
                }
                self.model.piece(self.be, self.kv, &inp, buf, i)
            }
            Shape::HeadOnly => self.head_and_sample(buf),
            Shape::Whole => {
                self.fill_prev()?;
                self.model.layers(self.be, self.kv, &inp, buf)?;
                self.head_and_sample(buf)
            }
        }
    }

    fn seam(&self, buf: &StepBuffers, i: usize) -> Result<()> {
        if self.shape.shape != Shape::Split {
            return Ok(());
        }
        if i + 1 < self.model.num_pieces() {
            self.model
                .attention(self.be, self.kv, &self.inputs(), buf, i)
        } else {
            self.head_and_sample(buf)
        }
    }

    fn hooks(&self) -> Option<&dyn StepHooks> {
        self.model.hooks()
    }
}

/// What [`Runner::run`] returns: tokens, logits when asked, log-probabilities and a
/// scored chunk's prompt log-probabilities per row.
#[derive(Default)]
pub(super) struct StepOut {
    pub tokens: Vec<u32>,
    pub logits: Option<Vec<f32>>,
    pub logprobs: Vec<Option<TokenLogprobs>>,
    pub prompt: Vec<Vec<TokenLogprobs>>,
    /// A verify step's samples after each token but the last, per row, and their
    /// log-probabilities where the sequence's sampling asks for them.
    pub verified: Vec<Vec<u32>>,
    pub verified_logprobs: Vec<Vec<Option<TokenLogprobs>>>,
}

impl StepOut {
    /// Each row's token with its log-probabilities.
    pub fn sampled(self) -> Vec<Sampled> {
        let b = self.tokens.len();
        let (mut verified, mut verified_lp) = (self.verified, self.verified_logprobs);
        verified.resize(b, Vec::new());
        verified_lp.resize(b, Vec::new());
        self.tokens
            .into_iter()
            .zip(self.logprobs)
            .zip(self.prompt)
            .zip(verified.into_iter().zip(verified_lp))
            .map(
                |(((token, logprobs), prompt), (verified, verified_logprobs))| Sampled {
                    token,
                    logprobs,
                    prompt,
                    verified,
                    verified_logprobs,
                },
            )
            .collect()
    }
}

impl Parts<'_> {
    /// The sampling of a step whose forward stopped at the logits in `buf` (`batch` in
    /// the step's row order, `rows` sampling rows, extra rows from `first_extra`): the
    /// masks written by `fill` (host work while the device still runs the forward),
    /// uploaded, then the rows sampled.
    #[allow(clippy::too_many_arguments)]
    fn sample_after(
        &mut self,
        batch: &[SeqStep<'_>],
        layout: &Layout,
        rows: usize,
        first_extra: usize,
        buf: &StepBuffers,
        fill: &mut FillMasks<'_>,
    ) -> Result<()> {
        self.sampling
            .write_masks(self.be, batch, first_extra, fill)?;
        let v = StepViews::cut(&self.inputs.table, layout, rows, 0)?;
        self.sampling
            .step(rows)?
            .sample(self.be, &buf.logits(rows)?, &v)
    }

    /// A step over the runner's inputs in `layout`, shaped per `shape`.
    pub fn forward(&self, layout: &Layout, shape: StepShape) -> Result<ForwardStep<'_>> {
        ForwardStep::new(
            self.be,
            &self.model,
            &self.kv,
            &self.inputs,
            &self.sampling,
            layout,
            shape,
            self.sample,
        )
        .map(|f| f.with_prev(self.overlap.then(|| self.sampling.prev())))
    }
}

impl Runner<'_> {
    /// One step over `batch`; `fill` writes the masks of its masked rows (an error when
    /// a row is masked and there is none).
    pub(super) fn run(
        &mut self,
        seqs: &mut Seqs,
        batch: &[SeqStep<'_>],
        keep_logits: bool,
        fill: Option<&mut FillMasks<'_>>,
    ) -> Result<StepOut> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let b = batch.len();
        if b == 0 {
            return Ok(StepOut::default());
        }
        if n > self.cfg.max_tokens_per_step || b > self.cfg.max_seqs {
            return Err(Error::invalid(
                "runner.step",
                format!(
                    "{n} tokens / {b} sequences exceed the configured {} / {}",
                    self.cfg.max_tokens_per_step, self.cfg.max_seqs
                ),
            ));
        }
        if fill.is_none() {
            if let Some(s) = batch.iter().find(|s| s.masked) {
                return Err(Error::invalid(
                    "runner.step",
                    format!(
                        "sequence {}: a masked row needs a step that writes masks (Runner::step_constrained)",
                        s.seq
                    ),
                ));
            }
        }
        // `--router-skew`: this step routes by fresh rows of the table.
        self.routed = self.parts.model.advance_routing(self.parts.be, n)?;
        let decode_only = batch.iter().all(|s| s.tokens.len() == 1);
        // A mixed step runs its decode rows first, so attention can take them through the
        // decode path and the rest through the prefill path (two launches); results go
        // back in the caller's order.
        let d = if decode_only {
            0
        } else {
            batch.iter().filter(|s| s.tokens.len() == 1).count()
        };
        let order: Vec<usize> = match d {
            0 => (0..b).collect(),
            _ => (0..b)
                .filter(|&i| batch[i].tokens.len() == 1)
                .chain((0..b).filter(|&i| batch[i].tokens.len() != 1))
                .collect(),
        };
        // A launched step ([`Runner::launch`]): its sample rows' order, and its rows that
        // follow the step before in the packing order.
        if let Some((o, _)) = self.deferred.as_mut() {
            o.clone_from(&order);
            if d > 0 {
                let prev = std::mem::take(&mut self.parts.inputs.prev_rows);
                self.parts.inputs.prev_rows = order
                    .iter()
                    .map(|&i| prev.get(i).copied().unwrap_or(-1))
                    .collect();
            }
        }
        // Where each sequence's tokens go in the step's token rows (read with the hidden
        // states an EAGLE head's target captures; none without).
        self.last_rows.clear();
        let mut rows = Vec::new();
        if self.parts.model.captures_aux() {
            let mut row = 0;
            for &i in &order {
                let s = &batch[i];
                let len = s.tokens.len();
                let position = seqs.blocks.num_tokens(s.seq)?.saturating_sub(len);
                rows.push(TokenRows {
                    seq: s.seq,
                    position,
                    row,
                    len,
                });
                row += len;
            }
        }
        if d == 0 {
            let out = self.run_sorted(seqs, batch, keep_logits, decode_only, 0, fill)?;
            self.last_rows = rows;
            self.join_forks(seqs, batch, &out)?;
            return Ok(out);
        }
        let sorted: Vec<SeqStep<'_>> = order.iter().map(|&i| batch[i]).collect();
        // The mask writer sees the caller's batch indices.
        let ord = &order;
        let mut remapped = fill.map(|fill| {
            move |rows: &mut [(usize, &mut [u32])]| {
                for (i, _) in rows.iter_mut() {
                    *i = ord[*i];
                }
                fill(rows)
            }
        });
        let StepOut {
            tokens,
            logits,
            mut logprobs,
            mut prompt,
            mut verified,
            mut verified_logprobs,
        } = self.run_sorted(
            seqs,
            &sorted,
            keep_logits,
            false,
            d,
            remapped.as_mut().map(|f| f as &mut FillMasks<'_>),
        )?;
        if self.deferred.is_some() {
            return Ok(StepOut::default());
        }
        self.last_rows = rows;
        let vocab = self.parts.model.cfg.vocab_size;
        let mut out = StepOut {
            tokens: vec![0u32; b],
            logits: logits.as_ref().map(|l| vec![0f32; l.len()]),
            logprobs: vec![None; b],
            prompt: vec![Vec::new(); b],
            verified: vec![Vec::new(); b],
            verified_logprobs: vec![Vec::new(); b],
        };
        verified.resize(b, Vec::new());
        verified_logprobs.resize(b, Vec::new());
        for (k, &i) in order.iter().enumerate() {
            out.tokens[i] = tokens[k];
            out.logprobs[i] = logprobs[k].take();
            out.prompt[i] = std::mem::take(&mut prompt[k]);
            out.verified[i] = std::mem::take(&mut verified[k]);
            out.verified_logprobs[i] = std::mem::take(&mut verified_logprobs[k]);
            if let (Some(src), Some(dst)) = (&logits, out.logits.as_mut()) {
                dst[i * vocab..(i + 1) * vocab].copy_from_slice(&src[k * vocab..(k + 1) * vocab]);
            }
        }
        self.join_forks(seqs, batch, &out)?;
        Ok(out)
    }

    /// After a step with verify chunks under penalties ([`Seqs::penalty_fork`]): each
    /// sequence keeps its samples up to the first that differs from its draft there (and
    /// that one), so the scratch row of its last kept sample, which counted every kept
    /// token, becomes its row.
    fn join_forks(&mut self, seqs: &mut Seqs, batch: &[SeqStep<'_>], out: &StepOut) -> Result<()> {
        let forks = std::mem::take(&mut self.parts.inputs.forks);
        for f in forks {
            let Some(i) = batch.iter().position(|s| s.seq == f.seq) else {
                continue;
            };
            let verified = out.verified.get(i).map_or(&[][..], Vec::as_slice);
            let kept = 1 + verified
                .iter()
                .zip(&f.drafts)
                .take_while(|(v, d)| v == d)
                .count();
            if let Some((from, to)) = seqs.penalty_join(f.seq, kept) {
                self.parts
                    .sampling
                    .copy_penalty_row(self.parts.be, from, to)?;
            }
        }
        Ok(())
    }

    /// Prepare the penalty rows of the step just packed ([`Seqs::penalty_fork`]) before
    /// its sampling runs.
    fn prepare_forks(&self) -> Result<()> {
        self.parts
            .sampling
            .fork_penalties(self.parts.be, &self.parts.inputs.forks)
    }

    /// [`Runner::run`] over a batch whose first `d` sequences are the decode rows of a
    /// mixed step (0: no split). With masked rows, the step stops at the logits; `fill`
    /// writes the masks while the device runs it, and the sampling follows.
    fn run_sorted(
        &mut self,
        seqs: &mut Seqs,
        batch: &[SeqStep<'_>],
        keep_logits: bool,
        decode_only: bool,
        d: usize,
        fill: Option<&mut FillMasks<'_>>,
    ) -> Result<StepOut> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let b = batch.len();
        let fill = fill.filter(|_| batch.iter().any(|s| s.masked));
        // Scored prompt tokens take sampling rows of their own: such a step runs eagerly.
        let rows = Packer::rows(batch);
        if rows > self.cfg.max_seqs {
            return Err(Error::invalid(
                "runner.step",
                format!(
                    "{b} sequences and {} scored prompt tokens exceed the {} sampling rows (max_seqs)",
                    rows - b,
                    self.cfg.max_seqs
                ),
            ));
        }
        // Verify chunks, and chunks of at most k + 1 tokens (a draft model's catch-up, a
        // prompt's last few tokens), replay a verify graph whole; other steps with extra
        // sampling rows run eagerly.
        let verify = match decode_only && rows == b {
            true => None,
            false => self
                .policy
                .plan_verify(&self.parts.inputs, batch, fill.is_some()),
        };
        let (plan, layout) = match verify {
            Some((key, layout)) => (Plan::Graph(key), layout),
            None if rows > b => (Plan::Eager, self.parts.inputs.layout(n, rows)),
            None => self.policy.plan(&self.parts.inputs, n, b, decode_only),
        };
        let be = self.parts.be;
        let Plan::Graph(mut key) = plan else {
            self.parts
                .inputs
                .pack(seqs, batch, &layout, rows, d, true, b)?;
            self.prepare_forks()?;
            self.parts.sampling.write_bias(be, batch, b)?;
            let mut shape = StepShape::whole(b, decode_only, d).with_rows(rows);
            if fill.is_some() {
                shape = shape.logits_only();
            }
            let cmd = self.run_cmd(&layout, b, Exec::Eager(shape))?;
            return self.mirrored(
                || cmd.expect("built with followers"),
                |r| {
                    let step = r.parts.forward(&layout, shape)?;
                    let buf = r.exec.eager(be, &step)?;
                    drop(step);
                    if let Some(fill) = fill {
                        r.parts.sample_after(batch, &layout, rows, b, &buf, fill)?;
                    }
                    let mut out = r.finish_out(batch, None, b)?;
                    if keep_logits {
                        out.logits = Some(be.download::<f32>(&buf.logits(b)?)?);
                    }
                    Ok(out)
                },
            );
        };
        if fill.is_some() && key.phase == Phase::Decode {
            key.phase = Phase::DecodeLogits;
        }
        // A miss captures first, on all-padding inputs: capturing runs the step eagerly
        // once, and the real step must sample (and count penalties) once.
        if !self.exec.contains(key) {
            let routing = self.routed;
            self.mirrored(
                || Cmd::Capture {
                    key,
                    ahead: true,
                    routing,
                },
                |r| r.capture_key_from_padding(key, true),
            )?;
        }
        let read = match key.phase {
            Phase::Decode | Phase::DecodeLogits => key.bucket,
            Phase::Mixed => b,
            Phase::Verify | Phase::VerifyLogits => layout.seqs,
        };
        // A verify graph's drafts' rows follow its bucket's sequence rows.
        let first_extra = match key.phase {
            Phase::Verify | Phase::VerifyLogits => key.bucket,
            _ => b,
        };
        self.parts
            .inputs
            .pack(seqs, batch, &layout, read, d, true, first_extra)?;
        self.prepare_forks()?;
        self.parts.sampling.write_bias(be, batch, first_extra)?;
        let (mut shape, real) = match key.phase {
            Phase::Decode | Phase::DecodeLogits => (StepShape::whole(key.bucket, true, d), b),
            Phase::Mixed => (StepShape::split(b, d), n),
            Phase::Verify | Phase::VerifyLogits => (StepShape::verify(key.bucket, layout.seqs), b),
        };
        if fill.is_some() {
            shape = shape.logits_only();
        }
        let cmd = self.run_cmd(&layout, read, Exec::Replay { key, real, shape })?;
        let out = self.mirrored(
            || cmd.expect("built with followers"),
            |r| {
                let step = r.parts.forward(&layout, shape)?;
                let buf = r.exec.replay(be, key, real, &step)?;
                drop(step);
                if let Some(fill) = fill {
                    let rows = match key.phase {
                        Phase::VerifyLogits => layout.seqs,
                        _ => b,
                    };
                    r.parts
                        .sample_after(batch, &layout, rows, first_extra, buf, fill)?;
                }
                let replayed = if keep_logits || r.policy.verify {
                    Some(be.download::<f32>(&buf.logits(b)?)?)
                } else {
                    None
                };
                r.finish_out(batch, replayed, first_extra)
            },
        )?;
        if !self.policy.verify {
            return Ok(out);
        }
        self.verify_replay(seqs, batch, key, d, decode_only, out)
    }

    /// [`Runner::read_out`], or for a launched step ([`Runner::launch`]) its samples
    /// kept on the device and queued for the host.
    fn finish_out(
        &mut self,
        batch: &[SeqStep<'_>],
        logits: Option<Vec<f32>>,
        first_extra: usize,
    ) -> Result<StepOut> {
        if self.deferred.is_none() {
            return self.read_out(batch, logits, first_extra);
        }
        let logprobs = batch.iter().any(|s| s.sampling.logprobs.is_some());
        let slot = self
            .parts
            .sampling
            .defer(self.parts.be, batch.len(), logprobs)?;
        if let Some(d) = self.deferred.as_mut() {
            d.1 = slot;
        }
        Ok(StepOut::default())
    }

    /// The step's samples (and log-probabilities where asked, and the scores of scored
    /// chunks) read back, with `logits`; extra sampling rows start at row `first_extra`.
    fn read_out(
        &self,
        batch: &[SeqStep<'_>],
        logits: Option<Vec<f32>>,
        first_extra: usize,
    ) -> Result<StepOut> {
        let (be, sampling) = (self.parts.be, &self.parts.sampling);
        let t0 = std::time::Instant::now();
        let b = batch.len();
        let gap = first_extra.max(b) - b;
        let verifying = batch.iter().any(|s| s.verify);
        // A verify step reads its extra rows' samples too (scored rows' are skipped).
        let read = if verifying {
            Packer::rows(batch) + gap
        } else {
            b
        };
        let all = sampling.download_tokens(be, read);
        self.device_wait.set(self.device_wait.get() + t0.elapsed());
        let mut tokens = all?;
        let mut verified = vec![Vec::new(); b];
        if verifying {
            let mut extra = tokens.split_off(b + gap).into_iter();
            tokens.truncate(b);
            for (s, v) in batch.iter().zip(verified.iter_mut()) {
                let taken: Vec<u32> = extra.by_ref().take(Packer::extra_rows(s)).collect();
                if s.verify {
                    *v = taken;
                }
            }
        }
        if batch
            .iter()
            .all(|s| s.sampling.logprobs.is_none() && s.score.is_none())
        {
            return Ok(StepOut {
                tokens,
                logits,
                logprobs: vec![None; b],
                prompt: vec![Vec::new(); b],
                verified,
                verified_logprobs: vec![Vec::new(); b],
            });
        }
        // Per sampling row, its top entries: a sequence's own row, then the scored tokens'.
        let mut nums: Vec<Option<usize>> = batch
            .iter()
            .map(|s| match s.score {
                Some(Score { num, next: Some(_) }) => Some(num),
                _ => s.sampling.logprobs,
            })
            .collect();
        nums.resize(b + gap, None);
        for s in batch {
            if let Some(score) = s.score {
                nums.extend((1..s.tokens.len()).map(|_| Some(score.num)));
            } else if s.verify {
                nums.extend((1..s.tokens.len()).map(|_| s.sampling.logprobs));
            }
        }
        let mut lps = sampling.download_logprobs(be, &nums)?.into_iter();
        let mut logprobs: Vec<Option<TokenLogprobs>> = lps.by_ref().take(b).collect();
        lps.by_ref().take(gap).for_each(drop);
        let mut verified_logprobs = vec![Vec::new(); b];
        let prompt = batch
            .iter()
            .zip(logprobs.iter_mut())
            .zip(verified_logprobs.iter_mut())
            .map(|((s, own), vlp)| {
                let Some(score) = s.score else {
                    if s.verify {
                        *vlp = lps
                            .by_ref()
                            .take(s.tokens.len().saturating_sub(1))
                            .collect();
                    }
                    return Vec::new();
                };
                let mut p: Vec<TokenLogprobs> = lps
                    .by_ref()
                    .take(s.tokens.len().saturating_sub(1))
                    .flatten()
                    .collect();
                if score.next.is_some() {
                    p.extend(own.take());
                }
                p
            })
            .collect();
        Ok(StepOut {
            tokens,
            logits,
            logprobs,
            prompt,
            verified,
            verified_logprobs,
        })
    }

    /// Debug check after a replay of `key`: the same step eagerly and unpadded (its
    /// samples are dropped, so it counts no penalties), its logits compared with the
    /// replay's; returns the replay's tokens with the eager logits.
    fn verify_replay(
        &mut self,
        seqs: &mut Seqs,
        batch: &[SeqStep<'_>],
        key: Key,
        d: usize,
        decode_only: bool,
        replayed: StepOut,
    ) -> Result<StepOut> {
        let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let b = batch.len();
        let rows = Packer::rows(batch);
        let be = self.parts.be;
        let eager_layout = self.parts.inputs.layout(n, rows);
        // The replayed step's penalty forks stay for its join; this pack counts nothing.
        let forks = std::mem::take(&mut self.parts.inputs.forks);
        let packed = self
            .parts
            .inputs
            .pack(seqs, batch, &eager_layout, rows, d, false, b);
        self.parts.inputs.forks = forks;
        packed?;
        let shape = StepShape::whole(b, decode_only, d).with_rows(rows);
        let cmd = self.run_cmd(&eager_layout, b, Exec::Eager(shape))?;
        let eager = self.mirrored(
            || cmd.expect("built with followers"),
            |r| {
                let step = r.parts.forward(&eager_layout, shape)?;
                let buf = r.exec.eager(be, &step)?;
                be.download::<f32>(&buf.logits(b)?)
            },
        )?;
        let model = &self.parts.model;
        let tol = if model.weights.dtype == DType::F32 {
            1e-4
        } else {
            3e-2
        };
        let vocab = model.cfg.vocab_size;
        let got = replayed.logits.as_deref().unwrap_or(&[]);
        self.exec.verify(key, got, &eager, vocab, tol)?;
        Ok(StepOut {
            logits: Some(eager),
            ..replayed
        })
    }
}
