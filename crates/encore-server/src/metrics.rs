//! `/metrics`: the engine's live figures, the server's request count, the weight-offload
//! gauges and the latency histograms, in the Prometheus text format.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use encore_core::histogram::HistogramSnapshot;

use crate::AppState;

/// The engine's counters and gauges, and the server's request count: name, type, help,
/// value.
fn rows(s: &AppState) -> [(&'static str, &'static str, &'static str, u64); 23] {
    let m = &s.engine.metrics;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    [
        (
            "encore_requests_running",
            "gauge",
            "Requests in the running batch.",
            g(&m.requests_running),
        ),
        (
            "encore_requests_waiting",
            "gauge",
            "Requests queued.",
            g(&m.requests_waiting),
        ),
        (
            "encore_kv_blocks_used",
            "gauge",
            "KV-cache blocks held by requests.",
            g(&m.kv_blocks_used),
        ),
        (
            "encore_kv_blocks_total",
            "gauge",
            "Usable KV-cache blocks.",
            g(&m.kv_blocks_total),
        ),
        (
            "encore_preemptions_total",
            "counter",
            "Requests preempted for KV blocks.",
            g(&m.preemptions_total),
        ),
        (
            "encore_steps_total",
            "counter",
            "Engine steps run.",
            g(&m.steps_total),
        ),
        (
            "encore_steps_overlapped_total",
            "counter",
            "Engine steps launched while the step before still ran (--async-scheduling).",
            g(&m.steps_overlapped_total),
        ),
        (
            "encore_requests_finished_total",
            "counter",
            "Requests finished.",
            g(&m.requests_finished_total),
        ),
        (
            "encore_requests_aborted_total",
            "counter",
            "Requests aborted.",
            g(&m.requests_aborted_total),
        ),
        (
            "encore_http_requests_total",
            "counter",
            "Generation requests received.",
            g(&s.requests_total),
        ),
        (
            "encore_tokens_computed_total",
            "counter",
            "Tokens run through the model.",
            g(&m.tokens_computed_total),
        ),
        (
            "encore_prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            g(&m.prefix_cache_queries_total),
        ),
        (
            "encore_prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache (not computed).",
            g(&m.prefix_cache_hits_total),
        ),
        (
            "encore_expert_cache_needed_total",
            "counter",
            "Distinct routed experts the sparse layers' steps needed, summed (the expert cache).",
            g(&m.expert_needed_total),
        ),
        (
            "encore_expert_cache_hits_total",
            "counter",
            "Needed experts found in the expert cache's device slots.",
            g(&m.expert_hits_total),
        ),
        (
            "encore_expert_cache_misses_total",
            "counter",
            "Needed experts copied into a slot from host memory.",
            g(&m.expert_misses_total),
        ),
        (
            "encore_expert_cache_streamed_bytes_total",
            "counter",
            "Bytes of experts copied from host memory into the expert cache (prefetches included).",
            g(&m.expert_bytes_streamed_total),
        ),
        (
            "encore_expert_cache_prefetched_total",
            "counter",
            "Experts copied into a slot ahead of their layer, as the layer before predicted them.",
            g(&m.expert_prefetched_total),
        ),
        (
            "encore_spec_decode_num_draft_tokens_total",
            "counter",
            "Speculative decoding: draft tokens verified (--speculative-method).",
            g(&m.spec_drafts_total),
        ),
        (
            "encore_spec_decode_num_accepted_tokens_total",
            "counter",
            "Speculative decoding: draft tokens the target kept.",
            g(&m.spec_accepted_total),
        ),
        (
            "encore_spec_decode_num_verifications_total",
            "counter",
            "Speculative decoding: verify chunks run (one sequence's drafts in one step).",
            g(&m.spec_verifications_total),
        ),
        (
            "encore_spec_decode_num_pauses_total",
            "counter",
            "Speculative decoding: times a sequence stopped speculating for a while because too few of its drafts were kept.",
            g(&m.spec_pauses_total),
        ),
        (
            "encore_spec_decode_draft_steps_total",
            "counter",
            "Speculative decoding: steps of the draft model or EAGLE-3 head (catch-up and rounds).",
            g(&m.spec_draft_steps_total),
        ),
    ]
}

pub(crate) async fn metrics(State(s): State<Arc<AppState>>) -> impl IntoResponse {
    let m = &s.engine.metrics;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut text = String::new();
    for (name, kind, help, v) in rows(&s) {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
        ));
    }
    text.push_str(&format!(
        "# HELP encore_spec_decode_draft_seconds_total Speculative decoding: wall time proposing drafts with the draft model or EAGLE-3 head.\n# TYPE encore_spec_decode_draft_seconds_total counter\nencore_spec_decode_draft_seconds_total {}\n",
        g(&m.spec_draft_micros_total) as f64 / 1e6
    ));
    text.push_str(&format!(
        "# HELP encore_prefix_cache_hit_ratio Prompt tokens found in the prefix cache per token looked up.\n# TYPE encore_prefix_cache_hit_ratio gauge\nencore_prefix_cache_hit_ratio {}\n",
        m.prefix_cache_hit_ratio()
    ));
    offload_gauges(&s, &mut text);
    text.push_str("# HELP encore_graph_replays_total Graph replays by phase.\n# TYPE encore_graph_replays_total counter\n");
    text.push_str(&format!(
        "encore_graph_replays_total{{phase=\"decode\"}} {}\nencore_graph_replays_total{{phase=\"mixed\"}} {}\nencore_graph_replays_total{{phase=\"verify\"}} {}\n",
        g(&m.graph_replays_decode),
        g(&m.graph_replays_mixed),
        g(&m.graph_replays_verify)
    ));
    histogram_text(
        &mut text,
        "encore_time_to_first_token_seconds",
        "Time from a request's arrival to its first token.",
        &m.time_to_first_token.snapshot(),
    );
    histogram_text(
        &mut text,
        "encore_inter_token_latency_seconds",
        "Time between consecutive tokens of a request.",
        &m.inter_token_latency.snapshot(),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// The weight-offload gauges (all 0 when every weight is resident).
fn offload_gauges(s: &AppState, text: &mut String) {
    let o = s.engine.boot.offload.clone().unwrap_or_default();
    for (name, help, v) in [
        (
            "encore_weight_budget_bytes",
            "Device bytes the weights may take (--weight-budget; 0: no budget).",
            o.budget_bytes,
        ),
        (
            "encore_weights_resident_bytes",
            "Bytes of weights kept on the device under the budget.",
            o.resident_bytes,
        ),
        (
            "encore_weights_streamed_bytes_per_step",
            "Bytes of weights copied from host memory per step (the plan's, or LRU's estimate).",
            o.streamed_bytes_per_step,
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
        ));
    }
}

/// A Prometheus histogram: cumulative `_bucket{le=...}` lines, `_sum` and `_count`.
fn histogram_text(text: &mut String, name: &str, help: &str, h: &HistogramSnapshot) {
    text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
    for (le, c) in h.bounds.iter().zip(&h.cumulative) {
        text.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {c}\n"));
    }
    text.push_str(&format!(
        "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}\n",
        count = h.count(),
        sum = h.sum_secs
    ));
}
