//! Speculative decoding's host-side parts (issue #24): the n-gram proposer ([`ngram`]),
//! which the scheduler runs (`SchedulerConfig::speculative`), and the acceptance rules'
//! references ([`accept`]), which a device-side acceptance (draft models, EAGLE) will be
//! checked against.

pub mod accept;
pub mod ngram;
