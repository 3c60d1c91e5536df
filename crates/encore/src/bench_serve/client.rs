//! The HTTP side of `encore bench serve --url`: an asynchronous load generator for an
//! OpenAI-compatible server. Every request is a streamed `POST /v1/completions` with
//! token-id prompts (`prompt: [ids]`, so no tokenizer is needed), `max_tokens` set and
//! `ignore_eos: true` (what vLLM's benchmark sends for random data sets), and
//! `stream_options.include_usage`, so the server's token count comes back in the last
//! chunk. Server-sent events are parsed incrementally as bytes arrive; each chunk's
//! arrival time is taken when its bytes come off the socket. One tokio runtime and one
//! hyper client (pooled keep-alive connections, `TCP_NODELAY`) serve every request.
//! A refusal (any status but 200, an error event, a broken stream) fails that request
//! with the server's message; the run goes on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::report::Record;
use super::workload::{WorkItem, Workload};

/// `--url`: `http://HOST:PORT` with an optional base path (no query); returned without a
/// trailing `/`.
pub fn url(s: &str) -> Result<String, String> {
    let s = s.trim();
    let uri: hyper::Uri = s
        .parse()
        .map_err(|e| format!("`{s}` is not a URL ({e}); expected http://HOST:PORT"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err("https is not supported (the client speaks plain HTTP)".into());
        }
        _ => return Err(format!("`{s}` is not an http:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{s}` has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("`{s}` has a query; give the server's base URL"));
    }
    Ok(s.trim_end_matches('/').to_string())
}

/// The longest error body kept from a refused request.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A server at a base URL.
#[derive(Clone)]
pub struct Client {
    base: String,
    auth: Option<header::HeaderValue>,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

impl Client {
    /// `base` as [`url`] returns it; `api_key` goes in `Authorization: Bearer`.
    pub fn new(base: &str, api_key: Option<&str>) -> Client {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(Duration::from_secs(10)));
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(conn);
        Client {
            base: base.to_string(),
            auth: api_key.and_then(|k| header::HeaderValue::from_str(&format!("Bearer {k}")).ok()),
            http,
        }
    }

    fn request(&self, method: Method, path: &str, body: Bytes) -> Result<Request<Full<Bytes>>> {
        let mut r = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if !body.is_empty() {
            r = r.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(a) = &self.auth {
            r = r.header(header::AUTHORIZATION, a.clone());
        }
        Ok(r.body(Full::new(body))?)
    }

    async fn get(&self, path: &str) -> Result<(StatusCode, Bytes)> {
        let req = self.request(Method::GET, path, Bytes::new())?;
        let resp = match tokio::time::timeout(Duration::from_secs(30), self.http.request(req)).await
        {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => bail!(
                "cannot reach the server at {}: {} (start one with `encore serve`, or use --in-process)",
                self.base,
                chain(&e)
            ),
            Err(_) => bail!(
                "the server at {} did not answer GET {path} within 30 s",
                self.base
            ),
        };
        let status = resp.status();
        Ok((status, read_body(resp).await?))
    }

    /// The served models: (id, max_model_len when given).
    pub async fn models(&self) -> Result<Vec<(String, Option<usize>)>> {
        let (status, body) = self.get("/v1/models").await?;
        if status != StatusCode::OK {
            bail!(
                "the server at {} refused GET /v1/models: {}{}",
                self.base,
                refusal(status, &body),
                if status == StatusCode::UNAUTHORIZED {
                    " (give its key with --api-key)"
                } else {
                    ""
                }
            );
        }
        let v: Value = serde_json::from_slice(&body).map_err(|e| {
            anyhow::anyhow!(
                "GET {}/v1/models did not return JSON ({e}): is it an OpenAI-compatible server?",
                self.base
            )
        })?;
        let Some(data) = v.get("data").and_then(Value::as_array) else {
            bail!(
                "GET {}/v1/models has no `data` list: is it an OpenAI-compatible server?",
                self.base
            );
        };
        Ok(data
            .iter()
            .filter_map(|m| {
                let id = m.get("id")?.as_str()?.to_string();
                let len = m
                    .get("max_model_len")
                    .and_then(Value::as_u64)
                    .map(|l| l as usize);
                Some((id, len))
            })
            .collect())
    }

    /// The server's Prometheus metrics (`name` or `name{labels}` -> value), or `None`
    /// when it has none.
    pub async fn metrics(&self) -> Option<HashMap<String, f64>> {
        let (status, body) = self.get("/metrics").await.ok()?;
        if status != StatusCode::OK {
            return None;
        }
        let text = std::str::from_utf8(&body).ok()?;
        Some(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (name, value) = l.trim().rsplit_once(' ')?;
                    Some((name.trim().to_string(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// Send one streamed completion and record what came back.
    async fn complete(&self, body: Bytes) -> Record {
        let mut r = Record::default();
        let req = match self.request(Method::POST, "/v1/completions", body) {
            Ok(req) => req,
            Err(e) => {
                r.error = Some(format!("building the request: {e}"));
                return r;
            }
        };
        r.sent = Some(Instant::now());
        let resp = match self.http.request(req).await {
            Ok(resp) => resp,
            Err(e) => {
                r.error = Some(format!("request failed: {}", chain(&e)));
                return r;
            }
        };
        let status = resp.status();
        if status != StatusCode::OK {
            let body = read_body(resp).await.unwrap_or_default();
            r.error = Some(refusal(status, &body));
            return r;
        }
        let mut body = resp.into_body();
        let mut sse = Sse::default();
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => {
                    r.error = Some(format!("the stream broke: {}", chain(&e)));
                    return r;
                }
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            sse.feed(&data, Instant::now(), &mut r);
            if r.error.is_some() || sse.done {
                break;
            }
        }
        if r.error.is_none() {
            if !sse.done {
                r.error = Some("the stream ended before `data: [DONE]`".into());
            } else if r.times.is_empty() {
                r.error = Some("the stream held no output".into());
            } else if !sse.usage {
                // No usage chunk (a server that ignores stream_options): count chunks.
                r.output_tokens = r.times.len();
            }
        }
        r
    }
}

/// An incremental parser of server-sent events: complete `data:` lines are handled as
/// they arrive, a partial line waits for the rest of its bytes.
#[derive(Default)]
struct Sse {
    buf: Vec<u8>,
    done: bool,
    usage: bool,
}

impl Sse {
    fn feed(&mut self, data: &[u8], at: Instant, r: &mut Record) {
        let scan_from = self.buf.len();
        self.buf.extend_from_slice(data);
        if !data.contains(&b'\n') {
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        let mut start = 0;
        let mut i = scan_from;
        while let Some(p) = buf[i..].iter().position(|&b| b == b'\n') {
            let end = i + p;
            let line = &buf[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(payload) = line.strip_prefix(b"data:") {
                self.event(payload.trim_ascii(), at, r);
                if r.error.is_some() || self.done {
                    break;
                }
            }
            start = end + 1;
            i = start;
        }
        self.buf = buf;
        self.buf.drain(..start);
    }

    fn event(&mut self, payload: &[u8], at: Instant, r: &mut Record) {
        if payload == b"[DONE]" {
            self.done = true;
            return;
        }
        let v: Value = match serde_json::from_slice(payload) {
            Ok(v) => v,
            Err(e) => {
                r.error = Some(format!(
                    "a stream event is not JSON ({e}): {}",
                    String::from_utf8_lossy(&payload[..payload.len().min(200)])
                ));
                return;
            }
        };
        if let Some(e) = v.get("error") {
            r.error = Some(format!("error event: {}", message_of(e)));
            return;
        }
        if v.get("choices")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty())
        {
            r.times.push(at);
        }
        if let Some(n) = v
            .get("usage")
            .and_then(|u| u.get("completion_tokens"))
            .and_then(Value::as_u64)
        {
            r.output_tokens = n as usize;
            self.usage = true;
        }
    }
}

/// The result of sending a workload.
pub struct Run {
    /// One per request, in workload order.
    pub records: Vec<Record>,
    /// From the first request sent to the last one's end.
    pub duration_s: f64,
    /// The largest `encore_requests_running` seen on /metrics while the run went on
    /// (sampled every 100 ms; null when the server has no such metric).
    pub max_running: Value,
}

/// The body of one request.
fn completion_body(model: &str, item: &WorkItem) -> Bytes {
    Bytes::from(
        json!({
            "model": model,
            "prompt": item.prompt,
            "max_tokens": item.output_len,
            "ignore_eos": true,
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string(),
    )
}

/// Send every request at its arrival time (and no more than `max_concurrency` at once,
/// 0 = no limit), each on its own task, and collect their records.
pub async fn drive(client: &Client, model: &str, w: &Workload, max_concurrency: usize) -> Run {
    // Bodies are built before the clock starts.
    let bodies: Vec<Bytes> = w.items.iter().map(|i| completion_body(model, i)).collect();
    let permits = if max_concurrency == 0 {
        Semaphore::MAX_PERMITS
    } else {
        max_concurrency
    };
    let sem = Arc::new(Semaphore::new(permits));
    let running = Arc::new(AtomicU64::new(0));
    let has_metric = client
        .metrics()
        .await
        .is_some_and(|m| m.contains_key("encore_requests_running"));
    let poller = has_metric.then(|| {
        let (c, running) = (client.clone(), Arc::clone(&running));
        tokio::spawn(async move {
            loop {
                if let Some(v) = c
                    .metrics()
                    .await
                    .and_then(|m| m.get("encore_requests_running").copied())
                {
                    running.fetch_max(v as u64, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });
    let mut records = vec![Record::default(); w.items.len()];
    let start = tokio::time::Instant::now();
    let mut tasks = JoinSet::new();
    for (i, body) in bodies.into_iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(w.arrivals[i])).await;
        let Ok(permit) = Arc::clone(&sem).acquire_owned().await else {
            break; // never closed
        };
        let c = client.clone();
        tasks.spawn(async move {
            let r = c.complete(body).await;
            drop(permit);
            (i, r)
        });
    }
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((i, r)) => records[i] = r,
            Err(e) => tracing::error!("a request task ended abnormally: {e}"),
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    if let Some(p) = poller {
        p.abort();
    }
    Run {
        records,
        duration_s,
        max_running: if has_metric {
            json!(running.load(Ordering::Relaxed))
        } else {
            Value::Null
        },
    }
}

async fn read_body(resp: Response<Incoming>) -> Result<Bytes> {
    match Limited::new(resp.into_body(), MAX_ERROR_BODY)
        .collect()
        .await
    {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => bail!("reading the response: {e}"),
    }
}

/// `HTTP 400: message` from a refused request's status and body (an OpenAI-style
/// `{"error": {"message": ...}}` or the text itself).
fn refusal(status: StatusCode, body: &[u8]) -> String {
    let msg = match serde_json::from_slice::<Value>(body) {
        Ok(v) => match v.get("error") {
            Some(e) => message_of(e),
            None => v.to_string(),
        },
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(500)])
            .trim()
            .to_string(),
    };
    format!("HTTP {}: {msg}", status.as_u16())
}

fn message_of(e: &Value) -> String {
    e.get("message")
        .and_then(Value::as_str)
        .map(String::from)
        .unwrap_or_else(|| e.to_string())
}

/// An error and its causes, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert_eq!(
            url("http://127.0.0.1:8000/").unwrap(),
            "http://127.0.0.1:8000"
        );
        assert_eq!(url("http://h:1/base").unwrap(), "http://h:1/base");
        for (bad, want) in [
            ("127.0.0.1:8000", "not an http:// URL"),
            ("https://h:1", "https is not supported"),
            ("http://h:1/?a=b", "has a query"),
            ("http://", "not a URL"),
            ("ftp://h", "not an http:// URL"),
        ] {
            let e = url(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn events_split_anywhere_parse_the_same() {
        let stream = concat!(
            "data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
            "data: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}]}\r\n\r\n",
            "data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n",
            "data: [DONE]\n\n"
        )
        .as_bytes();
        for cut in 0..stream.len() {
            let (mut sse, mut r, t) = (Sse::default(), Record::default(), Instant::now());
            sse.feed(&stream[..cut], t, &mut r);
            sse.feed(&stream[cut..], t, &mut r);
            assert!(sse.done && sse.usage && r.error.is_none(), "cut {cut}");
            assert_eq!((r.times.len(), r.output_tokens), (2, 3), "cut {cut}");
        }
        let (mut sse, mut r) = (Sse::default(), Record::default());
        sse.feed(
            b"data: {\"error\": {\"message\": \"engine step failed\"}}\n\n",
            Instant::now(),
            &mut r,
        );
        assert_eq!(r.error.as_deref(), Some("error event: engine step failed"));
    }

    #[test]
    fn refusals_carry_the_servers_message() {
        let body =
            br#"{"error": {"message": "max_tokens too large", "type": "invalid_request_error"}}"#;
        assert_eq!(
            refusal(StatusCode::BAD_REQUEST, body),
            "HTTP 400: max_tokens too large"
        );
        assert_eq!(
            refusal(StatusCode::SERVICE_UNAVAILABLE, b"busy\n"),
            "HTTP 503: busy"
        );
    }
}
