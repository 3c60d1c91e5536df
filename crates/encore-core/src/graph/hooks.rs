//! The capture protocol, made explicit: what a step's features (weight offload today)
//! need to hear from the executor, and when. The executor calls these hooks; a forward
//! never has to remember them.

use crate::backend::Backend;
use crate::error::Result;

/// Callbacks the executor makes around a step's pieces. Every method defaults to doing
/// nothing, so a feature implements only what it needs.
pub trait StepHooks {
    /// Before a step runs, eagerly or as a replay; never inside a capture (a replay does
    /// not announce its ops to the host, so this is where a feature puts its state where
    /// the step expects it).
    fn begin_step(&self, _be: &dyn Backend) -> Result<()> {
        Ok(())
    }

    /// After each captured piece (inside its capture) and after each eager piece and
    /// seam: work queued on other streams since the last segment joins the compute stream
    /// here (a capture must join what it forked before it ends).
    fn end_segment(&self, _be: &dyn Backend) -> Result<()> {
        Ok(())
    }

    /// Before the pieces of a step are captured.
    fn begin_capture(&self) {}

    /// After the pieces of a step were captured (also when a capture failed).
    fn end_capture(&self) {}
}
