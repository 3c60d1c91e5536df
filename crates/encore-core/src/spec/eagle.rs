//! The EAGLE-3 proposer (`--speculative-method eagle3 --draft-model HEAD`): a one-layer
//! draft head ([`crate::model::config::EagleConfig`]) that reads the target's own hidden
//! states, run by a runner of its own (its KV cache, its decode graphs) inside
//! [`Drafter`].
//!
//! The head's KV at position `i` of a sequence is computed from the pair `(h_i, x_{i+1})`:
//! the target's residual stream at position `i` (at the input of three of its layers,
//! concatenated and projected by the head's `fc`) and the embedding of the token after
//! it. Its output there is the hidden state that predicts `x_{i+2}`. So, per scheduler
//! step, for each sequence (the target's last step left its hidden states in the
//! target's capture, [`crate::model::llama::Model::aux_hidden`], at the rows
//! [`crate::runner::Runner::last_rows`] gives):
//! - **sync**: the head's KV keeps the positions whose next token is still the
//!   sequence's (the drafts the target rejected, and the positions fed by draft rounds,
//!   are cut off); a sequence that drafts always feeds its second-to-last position again,
//!   for the sample after it;
//! - **catch-up**: every position the target's last step covered that the head has not
//!   seen, up to the second-to-last token, with the target's hidden states (positions
//!   the last step did not cover, e.g. a prompt prefix served from the prefix cache, get
//!   a zero hidden state: drafts there are weaker, never wrong). This runs for every
//!   sequence the scheduler asks about, drafting or not, so a prompt's chunks are seen as
//!   they are prefilled. The sample after the second-to-last position is the first draft;
//! - **rounds**: each further draft is one decode step of the head, fed the previous
//!   draft and, as hidden state, the head's own pre-norm output at the previous draft
//!   ([`crate::model::llama::Model::eagle_rows`]), replayed from the head's decode graphs.
//!
//! Drafts are the head's argmax over its draft vocabulary, mapped to the target's by
//! `d2t` (`target = d + d2t[d]`). Acceptance is the scheduler's, as for any proposer: the
//! output is the one decoding token by token gives, whatever the drafts.

use std::collections::HashMap;
use std::path::Path;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kv::SeqId;
use crate::runner::{Runner, SeqStep, TokenRows};
use crate::tensor::{DType, Tensor};

use super::draft::{DraftRequest, Drafter};

/// An EAGLE-3 head's own state beside its runner: its `fc`, the draft-to-target
/// vocabulary map and the scratch of the hidden states it gathers.
pub struct Eagle {
    /// `target = d + d2t[d]` for draft token `d`; empty: the same ids.
    d2t: Vec<i64>,
    target_vocab: usize,
    /// The target's hidden size, and the most token rows a head step has.
    target_hidden: usize,
    rows: usize,
    fc: Tensor,
    /// `[3 * rows * target_hidden]`: the three layers' gathered rows, one block each.
    gathered: Tensor,
    /// `[rows * 3 * target_hidden]`: the same side by side, `fc`'s input.
    cat: Tensor,
    /// i32 `[rows]`: the rows a gather reads (-1: a zero row).
    ids: Tensor,
    /// `[seqs, hidden]`: the head's output at each first draft of a propose call, held
    /// across its catch-up steps (each overwrites the head's output rows) for the first
    /// round.
    held: Tensor,
}

impl Eagle {
    /// The state of the head `runner` runs, with vocabulary map `d2t` (empty: the
    /// identity); errors name `--draft-model`.
    pub fn new(runner: &Runner<'_>, d2t: Vec<i64>) -> Result<Self> {
        const WHAT: &str = "--draft-model";
        let cfg = &runner.model().cfg;
        let e = cfg
            .eagle
            .as_ref()
            .ok_or_else(|| Error::invalid(WHAT, "the draft model is not an EAGLE-3 head"))?;
        let fc = runner
            .model()
            .weights
            .eagle_fc
            .clone()
            .ok_or_else(|| Error::invalid(WHAT, "the EAGLE-3 head has no fc weight"))?;
        if !d2t.is_empty() && d2t.len() != cfg.vocab_size {
            return Err(Error::invalid(
                WHAT,
                format!(
                    "the head's d2t maps {} draft tokens, its draft_vocab_size is {}",
                    d2t.len(),
                    cfg.vocab_size
                ),
            ));
        }
        for (d, &off) in d2t.iter().enumerate() {
            let t = d as i64 + off;
            if t < 0 || t >= e.target_vocab as i64 {
                return Err(Error::invalid(
                    WHAT,
                    format!(
                        "the head's d2t maps draft token {d} to {t}, outside the target's {} tokens",
                        e.target_vocab
                    ),
                ));
            }
        }
        let be = runner.backend();
        let (rows, th) = (runner.config().token_rows(), e.target_hidden);
        let dtype = runner.model().weights.dtype;
        let seqs = runner.config().max_seqs;
        Ok(Eagle {
            d2t,
            target_vocab: e.target_vocab,
            target_hidden: th,
            rows,
            fc,
            gathered: be.alloc(dtype, &[3 * rows * th])?,
            cat: be.alloc(dtype, &[rows * 3 * th])?,
            ids: be.alloc(DType::I32, &[rows])?,
            held: be.alloc(dtype, &[seqs, cfg.hidden_size])?,
        })
    }

    /// Draft token `d` as a target token (`None` outside the target's vocabulary).
    pub fn to_target(&self, d: u32) -> Option<u32> {
        let t = match self.d2t.get(d as usize) {
            Some(&off) => d as i64 + off,
            None if self.d2t.is_empty() => d as i64,
            None => return None,
        };
        u32::try_from(t)
            .ok()
            .filter(|&t| (t as usize) < self.target_vocab)
    }

    /// Upload the gather's row ids.
    fn write_ids(&self, be: &dyn Backend, ids: &[i32]) -> Result<Tensor> {
        let t = self.ids.prefix(ids.len())?;
        be.write_bytes(&t, bytemuck::cast_slice(ids))?;
        Ok(t)
    }

    /// `input[r] = fc(concat(aux[0][rows[r]], aux[1][rows[r]], aux[2][rows[r]]))`, a zero
    /// row where `rows[r]` is -1: the head's hidden state from the target's.
    fn fill_from_target(
        &self,
        be: &dyn Backend,
        aux: &[Tensor; 3],
        rows: &[i32],
        input: &Tensor,
    ) -> Result<()> {
        let (n, th) = (rows.len(), self.target_hidden);
        if n > self.rows {
            return Err(Error::invalid(
                "eagle",
                format!("{n} rows exceed {}", self.rows),
            ));
        }
        let ids = self.write_ids(be, rows)?;
        let gathered = self.gathered.narrow(0, 3 * n * th)?.reshape(&[3, n, th])?;
        for (k, layer) in aux.iter().enumerate() {
            let out = gathered.narrow(k, 1)?.reshape(&[n, th])?;
            be.embedding(&ids, layer, &out)?;
        }
        let cat = self.cat.narrow(0, n * 3 * th)?.reshape(&[n, 3 * th])?;
        be.unshard_columns(&gathered, &cat)?;
        be.matmul(&cat, &self.fc, None, input)
    }
}

/// An EAGLE-3 head's `d2t` from its checkpoint directory (or file); empty when it has
/// none (a head over the target's whole vocabulary).
pub fn read_d2t(path: &Path) -> Result<Vec<i64>> {
    Ok(crate::model::weights::read_i64_tensor(path, "d2t")?.unwrap_or_default())
}

impl Drafter<'_> {
    /// [`Drafter::propose`] of an EAGLE-3 head: see the module docs. `target` is the
    /// runner whose last step the sequences' newest tokens came from.
    pub(super) fn propose_eagle(
        &mut self,
        reqs: &[DraftRequest<'_>],
        target: &Runner<'_>,
    ) -> Result<Vec<Vec<u32>>> {
        let eagle = self.eagle.as_ref().expect("an EAGLE drafter");
        let be = self.runner.backend();
        let aux = target.model().aux_hidden().ok_or_else(|| {
            Error::invalid(
                "--draft-model",
                "the target does not capture the hidden states an EAGLE-3 head reads",
            )
        })?;
        let last: HashMap<SeqId, &TokenRows> =
            target.last_rows().iter().map(|t| (t.seq, t)).collect();
        let cover = |seq| last.get(&seq).copied();
        let row_of = |seq, pos: usize| -> i32 {
            match cover(seq) {
                Some(t) if pos >= t.position && pos < t.position + t.len => {
                    (t.row + pos - t.position) as i32
                }
                _ => -1,
            }
        };
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); reqs.len()];
        // Sync: what each sequence feeds, positions `from..end`.
        let mut todo: Vec<(usize, usize)> = Vec::new(); // (request, end)
        let mut drafting = vec![false; reqs.len()];
        for (i, r) in reqs.iter().enumerate() {
            let len = r.tokens.len();
            if len < 2 {
                continue;
            }
            let fed = self.fed.entry(r.seq).or_default();
            if !self.seqs.blocks.contains(r.seq) {
                fed.clear();
                self.seqs.blocks.allocate(r.seq, 0)?;
            }
            // Position `p` was fed token `p + 1`.
            let same = fed
                .iter()
                .zip(&r.tokens[1..])
                .take_while(|(a, b)| a == b)
                .count();
            let covered = cover(r.seq).map(|t| (t.position, t.position + t.len));
            drafting[i] =
                r.max_drafts > 0 && covered.is_some_and(|(s, e)| s <= len - 2 && len - 2 < e);
            let keep = if drafting[i] {
                same.min(len - 2)
            } else {
                same.min(len - 1)
            };
            if keep < self.seqs.blocks.num_tokens(r.seq)? {
                self.seqs.blocks.truncate(r.seq, keep)?;
            }
            fed.truncate(keep);
            let end = covered.map_or(keep, |(_, e)| e.min(len - 1));
            if end > keep {
                todo.push((i, end));
            }
        }
        // Catch-up, in chunks of the head's budget; single positions first in a step, so
        // its token rows are in the order given (the runner puts decode rows first).
        let budget = self.runner.config().max_tokens_per_step;
        let max_seqs = self.runner.config().max_seqs;
        let (input, next_rows) = self
            .runner
            .model()
            .eagle_rows()
            .map(|(i, n)| (i.clone(), n.clone()))
            .expect("an EAGLE head has its rows");
        // Per request with a first draft: its row of `held` (the head's output there).
        let mut prev: HashMap<usize, usize> = HashMap::new();
        let mut held = 0usize;
        let mut pending: Vec<(usize, usize)> = todo.clone();
        while !pending.is_empty() {
            // (request, from, take, end)
            let mut plan: Vec<(usize, usize, usize, usize)> = Vec::new();
            let mut left = budget;
            let mut next = Vec::new();
            for &(i, end) in &pending {
                let r = &reqs[i];
                let from = self.fed[&r.seq].len();
                let take = (end - from).min(left);
                if take == 0 || plan.len() == max_seqs {
                    next.push((i, end));
                    continue;
                }
                if !self.seqs.blocks.can_append(r.seq, take) {
                    drafting[i] = false;
                    continue;
                }
                self.seqs.blocks.append(r.seq, take)?;
                left -= take;
                plan.push((i, from, take, end));
            }
            if plan.is_empty() {
                break;
            }
            plan.sort_by_key(|&(_, _, take, _)| take != 1);
            let mut rows = Vec::new();
            for &(i, from, take, _) in &plan {
                rows.extend((from..from + take).map(|p| row_of(reqs[i].seq, p)));
            }
            eagle.fill_from_target(be, &aux, &rows, &input.prefix(rows.len())?)?;
            let steps: Vec<SeqStep<'_>> = plan
                .iter()
                .map(|&(i, from, take, _)| {
                    super::draft::greedy(reqs[i].seq, &reqs[i].tokens[from + 1..from + take + 1])
                })
                .collect();
            let sampled = self.runner.step(&mut self.seqs, &steps)?;
            self.stats.steps += 1;
            // This step's first drafts: their output rows, moved to `held`.
            let mut hold: Vec<i32> = Vec::new();
            for (b, (&(i, from, take, end), token)) in plan.iter().zip(sampled).enumerate() {
                let r = &reqs[i];
                self.stats.tokens += take as u64;
                self.fed
                    .get_mut(&r.seq)
                    .expect("synced above")
                    .extend_from_slice(&r.tokens[from + 1..from + take + 1]);
                if from + take < end {
                    next.push((i, end));
                } else if from + take == r.tokens.len() - 1 && drafting[i] {
                    if let Some(t) = eagle.to_target(token) {
                        drafts[i].push(t);
                        if held + hold.len() < eagle.held.dim(0) {
                            prev.insert(i, held + hold.len());
                            hold.push(b as i32);
                        }
                    }
                }
            }
            if !hold.is_empty() {
                let ids = eagle.write_ids(be, &hold)?;
                be.embedding(&ids, &next_rows, &eagle.held.narrow(held, hold.len())?)?;
                held += hold.len();
            }
            pending = next;
        }
        // Rounds: each further draft, one decode step of the sequences whose last draft
        // the previous head step sampled; the first reads the held outputs, the others
        // the previous round's.
        let mut source = &eagle.held;
        loop {
            let mut round: Vec<usize> = Vec::new();
            let mut ids: Vec<i32> = Vec::new();
            for &(i, _) in &todo {
                if round.len() == max_seqs {
                    break;
                }
                let Some(&b) = prev.get(&i) else { continue };
                if drafts[i].len() < reqs[i].max_drafts
                    && self.seqs.blocks.can_append(reqs[i].seq, 1)
                {
                    self.seqs.blocks.append(reqs[i].seq, 1)?;
                    round.push(i);
                    ids.push(b as i32);
                }
            }
            if round.is_empty() {
                break;
            }
            // The head's own output at the previous draft is this one's hidden state.
            let idx = eagle.write_ids(be, &ids)?;
            be.embedding(&idx, source, &input.prefix(round.len())?)?;
            source = &next_rows;
            let last: Vec<[u32; 1]> = round
                .iter()
                .map(|&i| [*drafts[i].last().expect("drafting")])
                .collect();
            let steps: Vec<SeqStep<'_>> = round
                .iter()
                .zip(&last)
                .map(|(&i, t)| super::draft::greedy(reqs[i].seq, t))
                .collect();
            let sampled = self.runner.step(&mut self.seqs, &steps)?;
            self.stats.steps += 1;
            self.stats.tokens += round.len() as u64;
            prev.clear();
            for (b, (&i, token)) in round.iter().zip(sampled).enumerate() {
                if let Some(t) = eagle.to_target(token) {
                    drafts[i].push(t);
                    prev.insert(i, b);
                }
            }
        }
        self.stats.drafts += drafts.iter().map(|d| d.len() as u64).sum::<u64>();
        Ok(drafts)
    }
}
