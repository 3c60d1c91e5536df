//! `--weight-budget` and `--offload-policy`, shared by the commands that build an engine,
//! and the one-line summary of what a budget gave at start-up.

use clap::Args;
use encore_core::offload::{OffloadConfig, OffloadReport, Policy, WeightBudget};
use encore_core::Error;

/// The weight offload flags.
#[derive(Args, Clone, Debug)]
pub struct OffloadArg {
    /// Device memory for the weights: bytes with an optional KiB/MiB/GiB suffix (e.g.
    /// 6GiB) or a percentage of the weights (e.g. 50%); the rest stay in page-locked host
    /// memory and stream to the device every step. A budget below the model's floor is
    /// refused with the minimum. Default: every weight on the device.
    #[arg(long, value_name = "BYTES|P%", value_parser = weight_budget)]
    pub weight_budget: Option<WeightBudget>,
    /// How weights over the budget move: planned (a fixed resident set and a ring of
    /// prefetch slots filled ahead of use; works in graphs), experts (a mixture of
    /// experts: every weight but the routed experts resident, the experts in a device
    /// cache of slots filled on the device after routing; works in graphs), lru (on-demand
    /// copies, the baseline; needs --eager), or auto (experts for a model with routed
    /// experts, else planned). Needs --weight-budget. [default: auto]
    #[arg(
        long,
        value_name = "auto|planned|experts|lru",
        value_parser = policy,
        requires = "weight_budget"
    )]
    pub offload_policy: Option<Policy>,
    /// The expert cache: each sparse layer also fetches the next sparse layer's experts
    /// ahead, as that layer's router applied to this layer's input predicts them, on a
    /// second stream beside the compute (Pre-gated MoE). Pays only with an accurate
    /// prediction: on the H100 it gained 9-13% with every expert predicted and lost
    /// 16-18% with 80% (BENCHMARKS.md). Needs --weight-budget.
    #[arg(long, requires = "weight_budget")]
    pub expert_prefetch: bool,
}

impl OffloadArg {
    /// The engine's offload configuration; `None` without `--weight-budget`.
    pub fn config(&self) -> Option<OffloadConfig> {
        self.weight_budget.map(|budget| OffloadConfig {
            budget,
            policy: self.offload_policy.unwrap_or_default(),
            expert_prefetch: self.expert_prefetch,
        })
    }
}

/// The message of a core parse error without its `--flag:` prefix (clap names the flag).
fn message(e: Error) -> String {
    match e {
        Error::Invalid { what, .. } => what,
        e => e.to_string(),
    }
}

/// `--weight-budget`: see [`WeightBudget::parse`].
pub fn weight_budget(s: &str) -> Result<WeightBudget, String> {
    WeightBudget::parse(s).map_err(message)
}

/// `--offload-policy`: planned | lru.
pub fn policy(s: &str) -> Result<Policy, String> {
    Policy::parse(s).map_err(message)
}

/// Bytes in the largest binary unit that keeps the figure at least 1 (B, KiB, MiB, GiB).
pub fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if bytes >= 1 << 20 {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

/// One line on what a budget gave (`report`: `BootReport::offload`, `None` when the
/// budget holds every weight); `None` without a budget.
pub fn summary(
    config: Option<&OffloadConfig>,
    report: Option<&OffloadReport>,
    weight_bytes: usize,
) -> Option<String> {
    let config = config?;
    Some(match report {
        Some(r) if r.policy == Some(Policy::Experts) => format!(
            "weight budget {} of {} (experts): {} resident, {} expert slots in {}, the rest \
             of the routed experts in host memory (floor {})",
            human(r.budget_bytes),
            human(r.total_bytes),
            human(r.resident_bytes),
            r.expert_slots,
            human(r.streaming_bytes),
            human(r.floor_bytes),
        ),
        Some(r) => {
            let policy = r.policy.unwrap_or(config.policy);
            format!(
                "weight budget {} of {} ({}): {} resident, {} {}, {} streamed per step (floor {})",
                human(r.budget_bytes),
                human(r.total_bytes),
                policy.name(),
                human(r.resident_bytes),
                human(r.streaming_bytes),
                if policy == Policy::Lru {
                    "LRU pool"
                } else {
                    "prefetch ring"
                },
                human(r.streamed_bytes_per_step),
                human(r.floor_bytes),
            )
        }
        None => format!(
            "weight budget {} holds every weight ({}): nothing is offloaded",
            human(config.budget.bytes(weight_bytes)),
            human(weight_bytes)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_and_summary() {
        assert_eq!(weight_budget("50%"), Ok(WeightBudget::Percent(50.0)));
        assert_eq!(weight_budget("2MiB"), Ok(WeightBudget::Bytes(2 << 20)));
        let e = weight_budget("12XB").unwrap_err();
        assert!(e.contains("`12XB`") && e.contains("unknown unit"), "{e}");
        assert!(!e.starts_with("--weight-budget"), "{e}");
        assert!(weight_budget("0").unwrap_err().contains("zero"));
        assert!(weight_budget("101%").unwrap_err().contains("(0, 100]"));
        assert_eq!(policy("lru"), Ok(Policy::Lru));
        assert_eq!(policy("experts"), Ok(Policy::Experts));
        assert_eq!(policy("auto"), Ok(Policy::Auto));
        let e = policy("fifo").unwrap_err();
        assert!(e.contains("`fifo`") && e.contains("`experts`"), "{e}");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 20), "3.00 MiB");
        let cfg = OffloadConfig {
            budget: WeightBudget::Percent(100.0),
            policy: Policy::Planned,
            expert_prefetch: false,
        };
        assert_eq!(summary(None, None, 10), None);
        let line = summary(Some(&cfg), None, 4096).unwrap();
        assert!(line.contains("holds every weight (4.0 KiB)"), "{line}");
    }
}
