//! Progress of long work (weight loading, prefill, graph capture), reported to whoever
//! shows it: the CLI draws bars, a server logs, tests ignore it. Core draws nothing.

/// What the units of a piece of work are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Tokens,
    Graphs,
}

/// Receives the progress of one piece of long work at a time.
pub trait Progress: Sync {
    /// Work named `what` starts, `total` units long.
    fn start(&self, what: &str, total: u64, unit: Unit);
    /// `done` of the `total` units are finished.
    fn set(&self, done: u64);
    /// The work ended (finished or failed).
    fn finish(&self);
}

/// Progress nobody watches.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: &str, _: u64, _: Unit) {}
    fn set(&self, _: u64) {}
    fn finish(&self) {}
}

/// Ends the work when dropped, so an early return (an error) still finishes it.
pub(crate) struct Guard<'a>(pub &'a dyn Progress);

impl<'a> Guard<'a> {
    pub fn start(p: &'a dyn Progress, what: &str, total: u64, unit: Unit) -> Self {
        p.start(what, total, unit);
        Guard(p)
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}
