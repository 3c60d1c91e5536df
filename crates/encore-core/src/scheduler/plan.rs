//! A step's plan and its run: which sequences get how many tokens (with KV room made for
//! each, preempting the newest when none is free), then the runner step, the tokens' and
//! drafts' bookkeeping and the outputs.

use super::*;

impl Scheduler {
    /// Plan one step: `(index into running, new tokens)` per scheduled sequence, with KV
    /// room made for each; `drafter`: the draft model of [`Proposer::Draft`]. `ahead`: a
    /// step planned while the one before runs ([`super::overlap`]): no sequence its
    /// length ends there, no preemption (planning stops at a full cache and marks the
    /// scheduler `tight`), and only plain requests join.
    pub(super) fn schedule(
        &mut self,
        runner: &Runner<'_>,
        drafter: Option<&mut Drafter<'_>>,
        ahead: bool,
    ) -> Result<Vec<(usize, usize)>> {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut plan: Vec<(usize, usize)> = Vec::new();
        // Sampling rows: one a sequence, one a token of a scored prompt chunk or a verify
        // chunk; `max_num_seqs` of them, or with speculation all the runner has (the
        // engine gives it rows for drafts beyond the sequences).
        let mut rows = 0;
        let max_rows = match self.cfg.speculative {
            Some(_) => runner.config().max_seqs.max(self.cfg.max_num_seqs),
            None => self.cfg.max_num_seqs,
        };
        let mut i = 0;
        let max_seq_len = runner.config().max_seq_len;
        let limit = self.cfg.speculative_max_batch;
        let speculative = self
            .cfg
            .speculative
            .filter(|_| limit == 0 || self.running.len() <= limit);
        // A speculating sequence with penalties takes a scratch penalty slot per draft
        // for its step (`Seqs::penalty_fork`): reserved here, taken when it is packed.
        let mut reserved = 0usize;
        // Above the batch limit nothing drafts, and an EAGLE head does not catch up
        // either (a step of its own for every running sequence would cost a large batch
        // several percent): the positions computed meanwhile get zero hidden states.
        let mut drafted = match (speculative, drafter) {
            (Some(Proposer::Draft { k }), Some(d)) => {
                self.run_drafter(d, runner, k, max_rows, max_seq_len)?
            }
            _ => HashMap::new(),
        };
        while i < self.running.len() && budget > 0 && rows < max_rows {
            if let Some(p) = speculative {
                let spare = self.seqs.free_penalty_slots().saturating_sub(reserved);
                let s = &mut self.running[i];
                let mut cap = s.draft_cap(p.k(), budget, max_rows - rows, max_seq_len);
                let penalties = s.req.params.sampling.has_penalties();
                if penalties {
                    cap = cap.min(spare);
                }
                if cap > 0 {
                    let drafts = match p {
                        Proposer::Ngram(cfg) => {
                            let index = s.ngram.get_or_insert_with(|| NgramIndex::new(cfg));
                            index.propose(&s.tokens)
                        }
                        Proposer::Draft { .. } => drafted.remove(&s.seq).unwrap_or_default(),
                    };
                    s.add_drafts(drafts, cap);
                }
            }
            // Drafts of an earlier plan with penalties: as many as scratch slots are free.
            let spare = self.seqs.free_penalty_slots().saturating_sub(reserved);
            let s = &mut self.running[i];
            if s.drafts > spare && s.req.params.sampling.has_penalties() {
                let n = s.tokens.len() - (s.drafts - spare);
                s.tokens.truncate(n);
                s.drafts = spare;
            }
            let s = &self.running[i];
            let take = (s.tokens.len() - s.computed)
                .min(budget)
                .min(s.max_take(max_rows - rows));
            if take == 0 || (ahead && s.ends_by_length(max_seq_len)) {
                i += 1;
                continue;
            }
            // Room for `take` more tokens; preempt the newest others while there is none.
            let blocks = &self.seqs.blocks;
            let held = blocks.num_tokens(s.seq)?;
            let extra = (s.computed + take).saturating_sub(held);
            if !blocks.can_append(s.seq, extra) {
                if ahead {
                    self.tight = true;
                    return Ok(plan);
                }
                if i + 1 < self.running.len() {
                    self.preempt_newest()?;
                    continue;
                }
                // This is the newest: it yields itself.
                self.preempt_newest()?;
                break;
            }
            self.seqs.blocks.append(s.seq, extra)?;
            rows += s.rows(take);
            if s.drafts > 0 && s.req.params.sampling.has_penalties() {
                reserved += s.drafts;
            }
            plan.push((i, take));
            budget -= take;
            i += 1;
        }
        // Waiting requests, first come first served (a preempted one is first again).
        while budget > 0 && rows < max_rows && self.running.len() < self.cfg.max_num_seqs {
            let Some(s) = self.waiting.front() else { break };
            if ahead && !s.plain() {
                break;
            }
            // A request that shares its prompt with one still computing it waits for
            // those blocks to be cached (the prompt is computed once for `n` samples).
            if self.cfg.prefix_cache && s.req.params.share_prompt.is_some() {
                let group = s.req.params.share_prompt;
                let sibling_prefilling = self
                    .running
                    .iter()
                    .any(|r| r.req.params.share_prompt == group && r.computed < r.req.prompt.len());
                if sibling_prefilling {
                    break;
                }
            }
            // A scored prompt is computed whole: its cached blocks would skip its scores.
            let hit = if self.cfg.prefix_cache && !s.scoring() {
                self.seqs.blocks.lookup(&s.tokens)
            } else {
                PrefixHit::none()
            };
            let cached = hit.num_tokens();
            let take = (s.tokens.len() - cached)
                .min(budget)
                .min(s.max_take(max_rows - rows));
            let penalties = s.req.params.sampling.has_penalties();
            if !self
                .seqs
                .blocks
                .can_allocate_with_prefix(&hit, cached + take)
                || (penalties && self.seqs.free_penalty_slots() <= reserved)
            {
                break;
            }
            let mut s = self.waiting.pop_front().expect("front exists");
            // Whatever fails here leaves the request waiting and holding nothing.
            if penalties {
                // The prompt flagged, tokens produced before a preemption counted.
                let (prompt, output) = s.tokens.split_at(s.req.prompt.len());
                if let Err(e) = self.seqs.begin_penalties(runner, s.seq, prompt, output) {
                    self.waiting.push_front(s);
                    return Err(e);
                }
            }
            if let Err(e) = self
                .seqs
                .blocks
                .allocate_with_prefix(s.seq, &hit, cached + take)
            {
                self.seqs.end_penalties(s.seq);
                self.waiting.push_front(s);
                return Err(e);
            }
            s.computed = cached;
            if !s.admitted && self.cfg.prefix_cache {
                self.stats.prefix_queried_tokens += s.req.prompt.len() as u64;
                self.stats.prefix_hit_tokens += cached as u64;
            }
            s.admitted = true;
            rows += s.rows(take);
            self.running.push(s);
            plan.push((self.running.len() - 1, take));
            budget -= take;
        }
        Ok(plan)
    }

    /// Run the planned step and collect its outputs. The constraints of the rows whose
    /// sample is kept advance by their last token and write those rows' masks while the
    /// device runs the step's forward, in parallel (a large vocabulary's mask takes
    /// microseconds to a few hundred); a constraint that fails there ends its request
    /// after the step, its sample dropped. (A sampled token always passes its mask, so
    /// advancing by it fails only on a fault in the grammar engine.)
    pub(super) fn run_plan(
        &mut self,
        runner: &mut Runner<'_>,
        plan: &[(usize, usize)],
    ) -> Result<Vec<Output>> {
        let mut held: Vec<Held> = Vec::new();
        for (row, &(i, take)) in plan.iter().enumerate() {
            let s = &mut self.running[i];
            if s.computed + take == s.tokens.len() {
                if let Some(constraint) = s.constraint.take() {
                    held.push(Held {
                        row,
                        constraint,
                        pending: std::mem::take(&mut s.pending),
                        drafts: s.tokens[s.tokens.len() - s.drafts..].to_vec(),
                    });
                }
            }
        }
        let steps: Vec<SeqStep<'_>> = plan
            .iter()
            .enumerate()
            .map(|(k, &(i, take))| {
                let s = &self.running[i];
                let end = s.computed + take;
                SeqStep {
                    seq: s.seq,
                    tokens: &s.tokens[s.computed..end],
                    sampling: s.req.params.sampling,
                    masked: held.binary_search_by_key(&k, |h| h.row).is_ok(),
                    logit_bias: &s.req.params.logit_bias,
                    score: s.prompt_lp.as_ref().map(|_| Score {
                        num: s.req.params.sampling.prompt_logprobs.unwrap_or(0),
                        next: s.tokens.get(end).copied(),
                    }),
                    verify: s.drafts > 0,
                }
            })
            .collect();
        let mut mask_failed: Vec<(usize, String)> = Vec::new();
        let sampled = if held.is_empty() {
            runner.step_sampled(&mut self.seqs, &steps)
        } else {
            let mut fill = |rows: &mut [(usize, &mut [u32])]| {
                // Stable: a verify chunk's rows stay in their tokens' order.
                rows.sort_by_key(|r| r.0);
                let mut groups: Vec<&mut [(usize, &mut [u32])]> =
                    rows.chunk_by_mut(|a, b| a.0 == b.0).collect();
                debug_assert!(groups.iter().map(|g| g[0].0).eq(held.iter().map(|h| h.row)));
                debug_assert!(groups
                    .iter()
                    .zip(&held)
                    .all(|(g, h)| g.len() == 1 + h.drafts.len()));
                // Advance by the pending tokens, write the first row's mask, then each
                // next row's after one more draft; roll the drafts back.
                let fill_one = |(group, h): (&mut &mut [(usize, &mut [u32])], &mut Held)| {
                    let c = &mut h.constraint;
                    let k = group[0].0;
                    let filled = (|| {
                        h.pending.drain(..).try_for_each(|t| c.commit(t))?;
                        let (first, rest) = group.split_first_mut().expect("a row");
                        c.fill_mask(first.1)?;
                        for ((_, row), &d) in rest.iter_mut().zip(&h.drafts) {
                            c.commit(d)?;
                            c.fill_mask(row)?;
                        }
                        if !rest.is_empty() {
                            c.rollback(rest.len())?;
                        }
                        Ok(())
                    })();
                    filled.err().map(|e: String| {
                        for (_, row) in group.iter_mut() {
                            row.fill(u32::MAX); // any token: the sample is dropped
                        }
                        (k, e)
                    })
                };
                mask_failed = if groups.len() > 1 {
                    groups
                        .par_iter_mut()
                        .zip(held.par_iter_mut())
                        .filter_map(fill_one)
                        .collect()
                } else {
                    groups
                        .iter_mut()
                        .zip(held.iter_mut())
                        .filter_map(fill_one)
                        .collect()
                };
            };
            runner.step_constrained(&mut self.seqs, &steps, &mut fill)
        };
        drop(steps);
        for h in held {
            let s = &mut self.running[plan[h.row].0];
            s.constraint = Some(h.constraint);
            s.pending = h.pending;
        }
        let sampled = sampled?;
        self.stats.steps += 1;
        let mut failed: Vec<Option<String>> = Vec::new();
        if !mask_failed.is_empty() {
            failed.resize(plan.len(), None);
            for (k, e) in mask_failed {
                failed[k] = Some(e);
            }
        }
        let max_seq_len = runner.config().max_seq_len;
        let mut outputs = Vec::new();
        let mut done = Vec::new();
        let mut broken = Vec::new();
        for (k, (&(i, take), out)) in plan.iter().zip(sampled).enumerate() {
            self.stats.tokens_computed += take as u64;
            let s = &mut self.running[i];
            s.computed += take;
            // A verify step: the drafts equal to the target's samples are kept, then the
            // target's sample after the last kept one; the KV of the rest is dropped.
            // A verify step's per-token log-probabilities, in emission order.
            let mut emitted_lp: Vec<Option<TokenLogprobs>> = Vec::new();
            let emitted = if s.drafts > 0 {
                let d = s.drafts;
                s.drafts = 0;
                let base = s.tokens.len() - d;
                let kept = s.tokens[base..]
                    .iter()
                    .zip(&out.verified)
                    .take_while(|(a, b)| a == b)
                    .count();
                let mut emitted = s.tokens[base..base + kept].to_vec();
                emitted.push(out.verified.get(kept).copied().unwrap_or(out.token));
                let mut lps = out.verified_logprobs.into_iter();
                emitted_lp = lps.by_ref().take(kept + 1).collect();
                if kept == d {
                    emitted_lp.push(out.logprobs.clone());
                }
                // The drafts leave `tokens` and come back below as emitted tokens, each
                // checked for a finish; their KV (the kept ones') stays.
                s.tokens.truncate(base);
                s.computed = base + kept;
                self.seqs.blocks.truncate(s.seq, s.computed)?;
                self.stats.drafts_proposed += d as u64;
                self.stats.drafts_accepted += kept as u64;
                self.stats.verifications += 1;
                if let Some(p) = self.cfg.speculative {
                    if s.backoff.verified(kept, d, p.min_acceptance()) {
                        self.stats.spec_pauses += 1;
                    }
                }
                emitted
            } else {
                if s.computed == s.tokens.len() {
                    s.backoff.decoded();
                }
                vec![out.token]
            };
            if let Some(lp) = &mut s.prompt_lp {
                lp.extend(out.prompt);
            }
            if self.cfg.prefix_cache {
                // (After a verify step the kept drafts are committed with a later step.)
                let known = s.computed.min(s.tokens.len());
                self.seqs.blocks.commit(s.seq, &s.tokens, known)?;
            }
            if s.computed < s.tokens.len() {
                continue; // a prompt chunk short of the end
            }
            if let Some(e) = failed.get_mut(k).and_then(Option::take) {
                s.tokens.push(emitted[0]);
                broken.push((i, e));
                continue;
            }
            let mut logprobs = out.logprobs;
            let mut emitted_lp = emitted_lp.into_iter();
            for token in emitted {
                if let Some(lp) = emitted_lp.next() {
                    logprobs = lp;
                }
                s.tokens.push(token);
                if s.constraint.is_some() {
                    s.pending.push(token);
                }
                let finish = s.finish_at(token, s.tokens.len(), max_seq_len);
                outputs.push(Output {
                    id: s.req.id,
                    token,
                    logprobs: logprobs.take(),
                    prompt_logprobs: s.prompt_lp.take(),
                    finish,
                });
                if finish.is_some() {
                    done.push(i);
                    break;
                }
            }
        }
        // Remove from the back: finished and broken sequences, in descending index order.
        let mut ends: Vec<(usize, Option<String>)> = done.into_iter().map(|i| (i, None)).collect();
        ends.extend(broken.into_iter().map(|(i, e)| (i, Some(e))));
        ends.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, e) in ends {
            match e {
                None => {
                    let s = self.running.remove(i);
                    self.seqs.release(s.seq)?;
                    self.stats.finished += 1;
                }
                Some(e) => self.fail_running(i, e)?,
            }
        }
        Ok(outputs)
    }
}
