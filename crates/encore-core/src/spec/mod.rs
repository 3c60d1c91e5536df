//! Speculative decoding's host-side parts (issue #24): the proposers the scheduler runs
//! (`SchedulerConfig::speculative`): n-gram lookup over a sequence's own tokens
//! ([`ngram`]) and a draft model ([`draft`]); and the acceptance rules' references
//! ([`accept`]).

pub mod accept;
pub mod draft;
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
}
