//! The figures of `encore bench serve`, the same for both modes: what happened to each
//! request ([`Record`]) and the report made of them ([`report`]).

use std::time::Instant;

use serde_json::{json, Map, Value};

use super::workload::Workload;

/// What happened to one request, as the client saw it.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// When it was sent (after any wait for --max-concurrency).
    pub sent: Option<Instant>,
    /// When each piece of output arrived: every token in process, every streamed chunk
    /// over HTTP.
    pub times: Vec<Instant>,
    /// Output tokens (the usage count over HTTP).
    pub output_tokens: usize,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// mean, p50, p90, p99 (ms) of `v`.
fn summary(v: &mut [f64]) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| v[((q * v.len() as f64) as usize).min(v.len() - 1)];
    json!({
        "mean": v.iter().sum::<f64>() / v.len() as f64,
        "p50": p(0.5), "p90": p(0.9), "p99": p(0.99),
    })
}

/// The figures both modes report, from every request's record: completed and failed
/// counts (with up to five distinct error messages), request and token throughput over
/// `duration_s`, and TTFT, TPOT and ITL summaries of the completed requests. TPOT is
/// (last output - first output) / (output tokens - 1), ITL every gap between outputs.
/// Over HTTP an output is a streamed chunk: `output_chunks` below `output_tokens` means
/// the server sent some tokens together (or withheld chunks with no text), and TTFT and
/// ITL are then per chunk, as in vLLM's benchmark.
pub fn report(w: &Workload, records: &[Record], duration_s: f64) -> Map<String, Value> {
    let (mut ttft, mut tpot, mut itl) = (Vec::new(), Vec::new(), Vec::new());
    let (mut completed, mut in_tokens, mut out_tokens, mut chunks) = (0usize, 0, 0, 0);
    let mut errors: Vec<(String, usize)> = Vec::new();
    for (item, r) in w.items.iter().zip(records) {
        if let Some(e) = &r.error {
            match errors.iter_mut().find(|(m, _)| m == e) {
                Some((_, n)) => *n += 1,
                None => errors.push((e.clone(), 1)),
            }
            continue;
        }
        let (Some(sent), Some(first), Some(last)) = (r.sent, r.times.first(), r.times.last())
        else {
            continue;
        };
        completed += 1;
        in_tokens += item.prompt.len();
        out_tokens += r.output_tokens;
        chunks += r.times.len();
        ttft.push((*first - sent).as_secs_f64() * 1e3);
        if r.output_tokens > 1 {
            tpot.push((*last - *first).as_secs_f64() * 1e3 / (r.output_tokens - 1) as f64);
        }
        itl.extend(
            r.times
                .windows(2)
                .map(|p| (p[1] - p[0]).as_secs_f64() * 1e3),
        );
    }
    let failed = records.len() - completed;
    let d = duration_s.max(f64::MIN_POSITIVE);
    let mut m = Map::new();
    m.insert("duration_s".into(), json!(duration_s));
    m.insert("completed".into(), json!(completed));
    m.insert("failed".into(), json!(failed));
    m.insert(
        "errors".into(),
        json!(errors
            .iter()
            .take(5)
            .map(|(msg, n)| json!({"message": msg, "count": n}))
            .collect::<Vec<_>>()),
    );
    m.insert("request_throughput".into(), json!(completed as f64 / d));
    m.insert("output_throughput".into(), json!(out_tokens as f64 / d));
    m.insert(
        "total_token_throughput".into(),
        json!((in_tokens + out_tokens) as f64 / d),
    );
    m.insert("input_tokens".into(), json!(in_tokens));
    m.insert("output_tokens".into(), json!(out_tokens));
    m.insert("output_chunks".into(), json!(chunks));
    m.insert("ttft_ms".into(), summary(&mut ttft));
    m.insert("tpot_ms".into(), summary(&mut tpot));
    m.insert("itl_ms".into(), summary(&mut itl));
    m
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::workload::WorkItem;
    use super::*;

    fn rec(sent: Instant, at_ms: &[u64], tokens: usize) -> Record {
        Record {
            sent: Some(sent),
            times: at_ms
                .iter()
                .map(|&ms| sent + Duration::from_millis(ms))
                .collect(),
            output_tokens: tokens,
            error: None,
        }
    }

    #[test]
    fn report_counts_only_completed_requests_and_measures_their_gaps() {
        let t = Instant::now();
        let w = Workload {
            items: (0..3)
                .map(|i| WorkItem {
                    prompt: vec![0; 10 + i],
                    output_len: 4,
                })
                .collect(),
            arrivals: vec![0.0; 3],
            rate_label: json!("inf"),
        };
        let failed = Record {
            sent: Some(t),
            error: Some("HTTP 400: too long".into()),
            ..Default::default()
        };
        // Four tokens in three chunks (one chunk carried two tokens).
        let records = [
            rec(t, &[100, 110, 130, 160], 4),
            failed,
            rec(t, &[50, 80, 110], 4),
        ];
        let m = report(&w, &records, 2.0);
        assert_eq!(m["completed"], 2);
        assert_eq!(m["failed"], 1);
        assert_eq!(m["errors"][0]["message"], "HTTP 400: too long");
        assert_eq!(m["input_tokens"], 10 + 12);
        assert_eq!(m["output_tokens"], 8);
        assert_eq!(m["output_chunks"], 7);
        assert_eq!(m["request_throughput"], 1.0);
        let f = |k: &str, q: &str| m[k][q].as_f64().unwrap();
        assert!((f("ttft_ms", "mean") - 75.0).abs() < 1e-6);
        // TPOT: (160 - 100) / 3 and (110 - 50) / 3.
        assert!((f("tpot_ms", "mean") - 20.0).abs() < 1e-6);
        // ITL: 10, 20, 30, 30, 30.
        assert!((f("itl_ms", "mean") - 24.0).abs() < 1e-6);
        assert!((f("itl_ms", "p50") - 30.0).abs() < 1e-6);
        assert!((f("itl_ms", "p99") - 30.0).abs() < 1e-6);
    }
}
