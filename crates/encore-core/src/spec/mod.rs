//! Speculative decoding's host-side parts (issue #24), the first pieces of it: the n-gram
//! proposer ([`ngram`]) and the acceptance rules' references ([`accept`]), which the
//! verify step's device kernels will be checked against. Not wired into the engine yet.

pub mod accept;
pub mod ngram;
