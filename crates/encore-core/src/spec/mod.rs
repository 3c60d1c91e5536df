//! Speculative decoding's host-side parts (issue #24): the proposers the scheduler runs
//! (`SchedulerConfig::speculative`): n-gram lookup over a sequence's own tokens
//! ([`ngram`]), a draft model ([`draft`]) and an EAGLE-3 head ([`eagle`]); and the acceptance rules' references
//! ([`accept`]).

pub mod accept;
pub mod draft;
pub mod eagle;
pub mod ngram;

/// Where a speculating sequence's drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proposer {
    /// Prompt lookup over the sequence's own tokens ([`ngram::NgramIndex`]).
    Ngram(ngram::NgramConfig),
    /// A draft model's greedy tokens ([`draft::Drafter`], which the scheduler's caller
    /// passes to each step), up to `k` a sequence.
    Draft { k: usize },
}

impl Proposer {
    /// The most drafts a sequence verifies in one step.
    pub fn k(&self) -> usize {
        match self {
            Proposer::Ngram(c) => c.k,
            Proposer::Draft { k } => *k,
        }
    }

    /// The share of drafts a sequence must keep (a moving average) to go on speculating:
    /// below it, its verify steps cost more than they save, and it decodes plainly for a
    /// while. n-gram drafts cost nothing to propose and a verify step little more than a
    /// decode step (1.09x at 8B batch 1 with 4 drafts on the H100); a draft model's cost
    /// k of its own steps a round (4 steps of a 1B model beside an 8B target: about as
    /// much as the verify step), so it must keep more.
    pub fn min_acceptance(&self) -> f32 {
        match self {
            Proposer::Ngram(_) => 0.1,
            Proposer::Draft { .. } => 0.3,
        }
    }
}
