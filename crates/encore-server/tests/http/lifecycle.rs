//! A request's life around the engine: a client leaving mid-stream frees its KV blocks,
//! graceful shutdown (requests in flight finish; past the grace period they are cut off),
//! the latency histograms and graph replays in `/metrics`, and a model under a weight
//! budget answering as when resident.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use encore_core::engine::EngineConfig;
use encore_core::DType;
use serde_json::{json, Value};

use crate::harness::*;

#[test]
fn a_client_leaving_mid_stream_frees_its_blocks() {
    let s = start(None);
    let body = json!({"model": MODEL, "prompt": "a long story", "max_tokens": 200, "ignore_eos": true, "stream": true});
    let mut c = TcpStream::connect(s.addr).unwrap();
    let b = body.to_string();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut seen = 0;
    let mut line = String::new();
    while seen < 3 {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line.starts_with("data: ") {
            seen += 1;
        }
    }
    drop(r);
    drop(c);
    let m = &s.engine.metrics;
    let t = Instant::now();
    while m
        .requests_aborted_total
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no abort after the client left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, text) = http(s.addr, "GET", "/metrics", None, &[]);
    assert!(text.contains("encore_kv_blocks_used 0"), "{text}");
    assert!(text.contains("encore_requests_aborted_total 1"), "{text}");
}

#[test]
fn a_served_model_under_a_weight_budget_answers_as_resident_and_reports_its_budget() {
    use encore_core::offload::{OffloadConfig, Policy, WeightBudget};
    let body = json!({"model": MODEL, "prompt": "hello there", "max_tokens": 8,
        "temperature": 0})
    .to_string();
    let text = |cfg: EngineConfig| {
        let (s, _) = start_full(None, None, cfg, std::future::pending(), Duration::ZERO);
        let (st, out) = http(s.addr, "POST", "/v1/completions", Some(&body), &[]);
        assert_eq!(st, 200, "{out}");
        let out: Value = serde_json::from_str(&out).unwrap();
        let (_, metrics) = http(s.addr, "GET", "/metrics", None, &[]);
        (
            out["choices"][0]["text"].as_str().unwrap().to_string(),
            metrics,
        )
    };
    let (want, _) = text(engine_config());
    let (got, metrics) = text(EngineConfig {
        offload: Some(OffloadConfig {
            budget: WeightBudget::Percent(50.0),
            policy: Policy::Planned,
            expert_prefetch: false,
        }),
        ..engine_config()
    });
    assert_eq!(got, want);
    let gauge = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {metrics}"));
        line[name.len() + 1..].parse().unwrap()
    };
    let total = encore_core::model::open_model(MODEL)
        .unwrap()
        .config
        .weight_bytes(DType::F32) as u64;
    assert_eq!(gauge("encore_weight_budget_bytes"), total / 2);
    let resident = gauge("encore_weights_resident_bytes");
    assert!(resident > 0 && resident < total / 2, "{metrics}");
    assert!(
        gauge("encore_weights_streamed_bytes_per_step") > 0,
        "{metrics}"
    );
}

#[test]
fn shutdown_lets_requests_in_flight_finish_and_refuses_new_connections() {
    let (s, done, go_tx) = start_long_with_shutdown(Duration::from_secs(120));
    let n = 1000;
    let streams: Vec<_> = (0..3)
        .map(|i| {
            open_stream(
                s.addr,
                json!({"model": MODEL, "prompt": format!("long story {i}"), "max_tokens": n,
                       "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}),
            )
        })
        .collect();
    let running = s
        .engine
        .metrics
        .requests_running
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(running > 0, "the requests ended before the shutdown");
    go_tx.send(()).unwrap();
    // The listener closes: a new connection is refused.
    let t = Instant::now();
    while TcpStream::connect(s.addr).is_ok() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still accepting after shutdown"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Every stream still ends with all its tokens, then the server returns.
    for (i, h) in streams.into_iter().enumerate() {
        let events = h.join().unwrap();
        assert_eq!(events.last().unwrap(), "[DONE]", "stream {i}");
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], n, "stream {i}");
    }
    done.recv_timeout(Duration::from_secs(30))
        .expect("serve did not return")
        .unwrap();
}

#[test]
fn shutdown_past_the_grace_period_cuts_requests_off() {
    let (s, done, go_tx) = start_long_with_shutdown(Duration::ZERO);
    let n = 2000;
    let body = move |stream: bool| {
        json!({"model": MODEL, "prompt": "a very long story", "max_tokens": n,
               "ignore_eos": true, "stream": stream})
    };
    let streams: Vec<_> = (0..2).map(|_| open_stream(s.addr, body(true))).collect();
    let addr = s.addr;
    let whole = std::thread::spawn(move || post(addr, "/v1/completions", body(false)));
    // Wait until the whole request runs in the engine (3 running).
    let t = Instant::now();
    while s
        .engine
        .metrics
        .requests_running
        .load(std::sync::atomic::Ordering::Relaxed)
        < 3
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "requests not running"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    go_tx.send(()).unwrap();
    for (i, h) in streams.into_iter().enumerate() {
        let events = h.join().unwrap();
        assert_eq!(events.last().unwrap(), "[DONE]", "stream {i}");
        let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("shutting down")),
            "stream {i}: {err}"
        );
        // Fewer than all the tokens came.
        assert!(events.len() < n + 2, "stream {i} was not cut off");
    }
    let (st, v) = whole.join().unwrap();
    assert_eq!(st, 503, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("shutting down"));
    done.recv_timeout(Duration::from_secs(30))
        .expect("serve did not return")
        .unwrap();
    // The engine aborted them: their KV blocks are free.
    wait_for_no_kv_blocks(&s);
    let aborted = s
        .engine
        .metrics
        .requests_aborted_total
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(aborted, 3);
}

#[test]
fn latency_histograms_and_graph_replays_in_metrics() {
    let s = start(None);
    // Two streamed requests of 5 and 7 tokens: 2 first tokens, 4 + 6 gaps between tokens.
    for n in [5, 7] {
        let body = json!({"model": MODEL, "prompt": "timing", "max_tokens": n, "ignore_eos": true,
                          "stream": true});
        let raw = post_raw(s.addr, "/v1/completions", &body);
        assert_eq!(streamed_text(&raw).1, "length");
    }
    let (st, text) = http(s.addr, "GET", "/metrics", None, &[]);
    assert_eq!(st, 200);
    for (name, count) in [
        ("encore_time_to_first_token_seconds", 2.0),
        ("encore_inter_token_latency_seconds", 10.0),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} histogram\n")),
            "{text}"
        );
        assert_eq!(metric(&text, &format!("{name}_count")), count, "{name}");
        assert_eq!(
            metric(&text, &format!("{name}_bucket{{le=\"+Inf\"}}")),
            count,
            "{name}"
        );
        assert!(metric(&text, &format!("{name}_sum")) > 0.0, "{name}");
        // Cumulative buckets, non-decreasing, with vLLM-like bounds.
        let buckets: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_bucket{{le=")))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(buckets.len() > 10, "{name}: {buckets:?}");
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "{name}: {buckets:?}"
        );
        assert!(
            text.contains(&format!("{name}_bucket{{le=\"0.01\"}}")),
            "{text}"
        );
    }
    assert!(
        text.contains("encore_graph_replays_total{phase=\"decode\"} "),
        "{text}"
    );
    assert!(
        text.contains("encore_graph_replays_total{phase=\"mixed\"} "),
        "{text}"
    );
}
