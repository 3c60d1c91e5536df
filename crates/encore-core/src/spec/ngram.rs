//! The n-gram proposer (prompt lookup): drafts for a sequence from its own tokens. If the
//! last `n` tokens appeared earlier (the longest such `n` in `min_n..=max_n`), the tokens
//! that followed their most recent earlier occurrence are proposed, at most `k` of them.
//! Strong where outputs copy their inputs (editing, RAG, agents reading tool output); free
//! of weights, and cheap enough to run on the host while the device runs the step.
//!
//! [`NgramIndex`] keeps, per sequence and per `n`, the last position each n-gram ended at,
//! updated as tokens arrive, so a proposal costs `max_n - min_n + 1` lookups instead of a
//! scan of the whole sequence. [`propose_scan`] is the plain scan it must agree with.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// The most draft tokens a step may verify per sequence.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// The longest n-gram matched.
pub const MAX_NGRAM: usize = 64;

/// `k` tokens proposed from a match of `min_n..=max_n` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    pub min_n: usize,
    pub max_n: usize,
    pub k: usize,
}

impl NgramConfig {
    /// Checked: `1 <= min_n <= max_n <= MAX_NGRAM`, `1 <= k <= MAX_SPECULATIVE_TOKENS`;
    /// errors name the flags.
    pub fn new(min_n: usize, max_n: usize, k: usize) -> Result<NgramConfig> {
        if k == 0 || k > MAX_SPECULATIVE_TOKENS {
            return Err(Error::invalid(
                "--num-speculative-tokens",
                format!("{k}: expected 1 to {MAX_SPECULATIVE_TOKENS}"),
            ));
        }
        if min_n == 0 || min_n > max_n || max_n > MAX_NGRAM {
            return Err(Error::invalid(
                "--ngram-min / --ngram-max",
                format!("{min_n} / {max_n}: expected 1 <= min <= max <= {MAX_NGRAM}"),
            ));
        }
        Ok(NgramConfig { min_n, max_n, k })
    }
}

/// The drafts for `tokens` by a plain scan: for `n` from `max_n` down to `min_n`, the most
/// recent earlier end `e < len` with `tokens[e - n..e] == tokens[len - n..]`; the tokens
/// `tokens[e..]`, at most `k`. Empty when nothing matches.
pub fn propose_scan(cfg: &NgramConfig, tokens: &[u32]) -> Vec<u32> {
    let len = tokens.len();
    for n in (cfg.min_n..=cfg.max_n.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        if let Some(e) = (n..len).rev().find(|&e| &tokens[e - n..e] == suffix) {
            return tokens[e..len.min(e + cfg.k)].to_vec();
        }
    }
    Vec::new()
}

/// One sequence's n-gram index: for each `n` of the config, the last end position of each
/// n-gram seen (keyed by a hash, each hit verified against the tokens). Feed it the same
/// growing token list each step ([`NgramIndex::propose`]); a list that is not the one fed
/// before (a preempted sequence recomputed differently) is re-indexed from the start.
#[derive(Debug)]
pub struct NgramIndex {
    cfg: NgramConfig,
    /// `(n, hash of the n-gram)` -> its last end position.
    last_end: HashMap<(usize, u64), usize>,
    /// Ends indexed: every `e < indexed` (for each `n <= e`).
    indexed: usize,
    /// A hash of the tokens indexed, to notice a list that changed under us.
    fingerprint: (usize, u32),
}

fn hash(gram: &[u32]) -> u64 {
    // FNV-1a over the token ids.
    gram.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl NgramIndex {
    pub fn new(cfg: NgramConfig) -> NgramIndex {
        NgramIndex {
            cfg,
            last_end: HashMap::new(),
            indexed: 0,
            fingerprint: (0, 0),
        }
    }

    pub fn config(&self) -> &NgramConfig {
        &self.cfg
    }

    /// The drafts for `tokens` (the sequence so far: prompt and output), equal to
    /// [`propose_scan`]'s; indexes the ends it has not seen.
    pub fn propose(&mut self, tokens: &[u32]) -> Vec<u32> {
        let len = tokens.len();
        let (seen, last) = self.fingerprint;
        if seen > len || (seen > 0 && tokens[seen - 1] != last) {
            self.last_end.clear();
            self.indexed = 0;
        }
        // Index every end before `len` (the suffix itself must not match itself).
        for e in self.indexed.max(1)..len {
            for n in self.cfg.min_n..=self.cfg.max_n.min(e) {
                self.last_end.insert((n, hash(&tokens[e - n..e])), e);
            }
        }
        self.indexed = self.indexed.max(len);
        self.fingerprint = (len, tokens.last().copied().unwrap_or(0));
        for n in (self.cfg.min_n..=self.cfg.max_n.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            let found = match self.last_end.get(&(n, hash(suffix))) {
                Some(&e) if &tokens[e - n..e] == suffix => Some(e),
                // A hash collision: the plain scan for this n.
                Some(_) => (n..len).rev().find(|&e| &tokens[e - n..e] == suffix),
                None => None,
            };
            if let Some(e) = found {
                return tokens[e..len.min(e + self.cfg.k)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_longest_recent_match() {
        let cfg = NgramConfig::new(1, 3, 4).unwrap();
        // "the cat sat on the mat . the cat" -> "sat on the mat".
        let t = [1, 2, 3, 4, 1, 5, 6, 1, 2];
        assert_eq!(propose_scan(&cfg, &t), vec![3, 4, 1, 5]);
        // The longest n wins over a more recent shorter match: the suffix [7, 1, 2]
        // matched at 3 tokens beats [1, 2] alone.
        let t = [7, 1, 2, 9, 9, 1, 2, 8, 7, 1, 2];
        assert_eq!(propose_scan(&cfg, &t), vec![9, 9, 1, 2]);
        // The most recent occurrence of the longest match, cut at the sequence's end.
        let t = [5, 6, 1, 5, 6, 2, 5, 6];
        assert_eq!(propose_scan(&cfg, &t), vec![2, 5, 6]);
        // A run of one token: its continuation is the run itself.
        assert_eq!(propose_scan(&cfg, &[4, 4, 4, 4]), vec![4]);
        // Nothing to match.
        assert!(propose_scan(&cfg, &[1, 2, 3]).is_empty());
        assert!(propose_scan(&cfg, &[1]).is_empty());
        assert!(propose_scan(&cfg, &[]).is_empty());
        // min_n above every match: nothing.
        let long = NgramConfig::new(3, 3, 4).unwrap();
        assert!(propose_scan(&long, &[1, 2, 3, 4, 1, 2]).is_empty());
    }

    #[test]
    fn the_index_agrees_with_the_scan_as_tokens_arrive() {
        let mut state = 7u64;
        let mut next = |m: u64| {
            state = crate::ops::splitmix64(state);
            (state % m) as u32
        };
        for (vocab, min_n, max_n, k) in [(3, 1, 3, 5), (5, 2, 4, 3), (50, 1, 2, 8), (2, 3, 6, 1)] {
            let cfg = NgramConfig::new(min_n, max_n, k).unwrap();
            let mut index = NgramIndex::new(cfg);
            let mut tokens = Vec::new();
            for step in 0..400 {
                // One to three tokens a step (accepted drafts arrive several at a time).
                for _ in 0..1 + next(3) {
                    tokens.push(next(vocab));
                }
                assert_eq!(
                    index.propose(&tokens),
                    propose_scan(&cfg, &tokens),
                    "vocab {vocab} step {step}"
                );
            }
            // Another sequence in the same index (a preempted one recomputed): re-indexed.
            let other: Vec<u32> = (0..50).map(|_| next(vocab)).collect();
            assert_eq!(index.propose(&other), propose_scan(&cfg, &other));
        }
    }

    #[test]
    fn bad_configs_name_the_flags() {
        let e = NgramConfig::new(1, 3, 0).unwrap_err().to_string();
        assert!(e.contains("--num-speculative-tokens"), "{e}");
        let e = NgramConfig::new(1, 3, 17).unwrap_err().to_string();
        assert!(e.contains("--num-speculative-tokens"), "{e}");
        let e = NgramConfig::new(4, 3, 2).unwrap_err().to_string();
        assert!(e.contains("--ngram-min"), "{e}");
        let e = NgramConfig::new(0, 3, 2).unwrap_err().to_string();
        assert!(e.contains("--ngram-min"), "{e}");
    }
}
