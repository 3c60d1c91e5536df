//! Graph-mode flags shared by the commands: bucket policies and start-up capture with a
//! progress bar.

use anyhow::Result;
use encore_core::graph::BucketPolicy;
use encore_core::runner::{GraphConfig, Runner};
use encore_core::Backend;

/// The graph configuration of `--buckets` (decode batch sizes up to `max_seqs`) and
/// `--prefill-buckets` (token counts up to `max_tokens`). `auto` prefill buckets are
/// SGLang's sizes on a GPU and none on the CPU (where a replayed piece costs what the
/// eager op does, and capturing 40 buckets up front would cost seconds).
pub fn config(
    be: &dyn Backend,
    buckets: &str,
    max_seqs: usize,
    prefill_buckets: &str,
    max_tokens: usize,
) -> Result<GraphConfig> {
    let decode = BucketPolicy::parse(
        "--buckets",
        buckets,
        max_seqs,
        BucketPolicy::VllmLike { max: max_seqs },
    )?;
    let auto = if be.memory_info().is_some() {
        BucketPolicy::SglangLike { max: max_tokens }
    } else {
        BucketPolicy::None
    };
    let prefill = if prefill_buckets.trim() == "auto" {
        auto
    } else {
        BucketPolicy::parse("--prefill-buckets", prefill_buckets, max_tokens, auto)?
    };
    Ok(GraphConfig {
        decode,
        mixed: prefill,
        verify: 0,
    })
}

/// Capture every bucket now, with a progress bar when `show`.
pub fn capture_all(runner: &mut Runner<'_>, show: bool) -> Result<()> {
    let pb = if show {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    pb.set_style(
        indicatif::ProgressStyle::with_template("capturing graphs {bar:30} {pos}/{len} {elapsed}")
            .expect("valid template"),
    );
    runner.capture_all(&mut |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })?;
    pb.finish_and_clear();
    Ok(())
}
