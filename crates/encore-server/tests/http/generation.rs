//! Generation over HTTP: completions and chat, whole and streamed (with the usage
//! chunk), greedy output equal to `generate`, 64 concurrent streaming clients, stop
//! strings, and log-probabilities in the OpenAI shapes.

use serde_json::{json, Value};

use crate::harness::*;

#[test]
fn completions_whole_and_streamed_match_generate() {
    let s = start(None);
    let (st, v) = post(
        s.addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(st, 200, "{v}");
    let ids: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
    assert_eq!(ids, greedy_ids_from_generate(&[5, 6, 7, 8, 9], 12));
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17})
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["object"], "text_completion");
    // Streamed: the text pieces concatenate to the whole text; usage last, then [DONE].
    let whole = v["choices"][0]["text"].as_str().unwrap().to_string();
    let body = json!({"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "temperature": 0,
                      "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let raw = post_raw(s.addr, "/v1/completions", &body);
    let events = sse(&raw);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    assert_eq!(usage["choices"], json!([]));
    let text: String = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, whole);
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn chat_completions_whole_and_streamed() {
    let s = start(None);
    let req = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello there"}],
                     "max_tokens": 6, "temperature": 0, "ignore_eos": true});
    let (st, v) = post(s.addr, "/v1/chat/completions", req.clone());
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let raw = post_raw(s.addr, "/v1/chat/completions", &streamed);
    let events = sse(&raw);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            let v: Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(
        text,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[test]
fn concurrent_streaming_clients_all_complete() {
    let s = start(None);
    let addr = s.addr;
    let clients: Vec<_> = (0..64)
        .map(|i| {
            std::thread::spawn(move || {
                let n = 4 + i % 9;
                let body = json!({"model": MODEL, "prompt": format!("client {i} says hello"),
                                  "max_tokens": n, "ignore_eos": true, "seed": i, "stream": true,
                                  "stream_options": {"include_usage": true}});
                let raw = post_raw(addr, "/v1/completions", &body);
                let events = sse(&raw);
                let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
                assert_eq!(usage["usage"]["completion_tokens"], n, "client {i}");
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let (st, m) = http(addr, "GET", "/metrics", None, &[]);
    assert_eq!(st, 200);
    assert!(m.contains("encore_requests_finished_total 64"), "{m}");
    assert!(m.contains("encore_kv_blocks_used 0"), "{m}");
    // 64 prompts looked up; no lookup before them, so the ratio is theirs.
    let hits = s
        .engine
        .metrics
        .prefix_cache_hits_total
        .load(std::sync::atomic::Ordering::Relaxed);
    let queries = s
        .engine
        .metrics
        .prefix_cache_queries_total
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(queries > 0, "{m}");
    assert!(
        m.contains(&format!(
            "encore_prefix_cache_hit_ratio {}\n",
            hits as f64 / queries as f64
        )),
        "{m}"
    );
}

#[test]
fn stop_strings_end_the_text_before_them_whole_and_streamed() {
    let s = start(None);
    let req = |extra: Value| {
        let mut b = json!({"model": MODEL, "prompt": "stop strings, please", "max_tokens": 40,
                           "temperature": 0, "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (st, v) = post(s.addr, "/v1/completions", req(json!({})));
    assert_eq!(st, 200, "{v}");
    let full = v["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string that occurs in the greedy text: the two characters (no replacement
    // character, so real text) whose first occurrence is latest, so text precedes it.
    let chars: Vec<char> = full.chars().collect();
    let (at, stop) = chars
        .windows(2)
        .map(|w| w.iter().collect::<String>())
        .filter(|w| !w.contains('\u{FFFD}'))
        .map(|w| (full.find(&w).unwrap(), w))
        .max()
        .unwrap_or_else(|| panic!("no usable stop string in {full:?}"));
    assert!(at > 0, "{full:?}");
    let expected = &full[..at];
    let total_tokens = v["usage"]["completion_tokens"].as_u64().unwrap();

    for stop_field in [json!(stop), json!(["never-in-the-output", stop])] {
        // Whole: the text before the stop, finish "stop", fewer tokens than without it.
        let (st, v) = post(s.addr, "/v1/completions", req(json!({"stop": stop_field})));
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v["choices"][0]["text"], expected,
            "stop {stop:?} in {full:?}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        let n = v["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(
            n < total_tokens,
            "{n} tokens: the request did not end at the stop"
        );
        // Streamed: the pieces concatenate to the same text, the last says "stop", and
        // the usage chunk counts the tokens generated until the stop.
        let body = req(json!({"stop": stop_field, "stream": true,
                              "stream_options": {"include_usage": true}}));
        let raw = post_raw(s.addr, "/v1/completions", &body);
        let (text, finish) = streamed_text(&raw);
        assert_eq!(text, expected);
        assert_eq!(finish, "stop");
        let events = sse(&raw);
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], n);
    }
    // Chat takes the same field.
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 3, "stop": ["a", "b"]});
    assert_eq!(post(s.addr, "/v1/chat/completions", chat).0, 200);
    // Requests ended by a stop string ended in the engine as finished, not aborted: no
    // block stays held.
    wait_for_no_kv_blocks(&s);
    let aborted = s
        .engine
        .metrics
        .requests_aborted_total
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(aborted, 0, "stop-string ends count as finished");
    // Bad values name `stop`.
    for bad in [
        json!(""),
        json!(["a", ""]),
        json!(["a", "b", "c", "d", "e"]),
        json!(7),
        json!([1]),
        json!({"x": "y"}),
    ] {
        let (st, v) = post(s.addr, "/v1/completions", req(json!({"stop": bad})));
        assert_eq!(st, 400, "stop {bad}: {v}");
        assert_eq!(v["error"]["param"], "stop", "stop {bad}: {v}");
    }
}

#[test]
fn logprobs_come_back_in_the_openai_shapes() {
    let s = start(None);
    // Completions, greedy: the sampled token is the most likely one.
    let (st, v) = post(
        s.addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "Hello", "max_tokens": 6, "temperature": 0,
               "ignore_eos": true, "logprobs": 3, "min_p": 0.1,
               "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2}),
    );
    assert_eq!(st, 200, "{v}");
    let choice = &v["choices"][0];
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6, "{lp}");
    let token_lps = lp["token_logprobs"].as_array().unwrap();
    let tops = lp["top_logprobs"].as_array().unwrap();
    let offsets = lp["text_offset"].as_array().unwrap();
    assert_eq!((token_lps.len(), tops.len(), offsets.len()), (6, 6, 6));
    for (i, top) in tops.iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{top:?}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let lp = token_lps[i].as_f64().unwrap();
        assert!(
            lp <= 0.0 && (lp - best).abs() < 1e-6,
            "greedy takes the top: {lp} vs {top:?}"
        );
    }
    assert_eq!(offsets[0], 0);

    // Chat, greedy: content[i].top_logprobs[0] is the sampled token.
    let (st, v) = post(
        s.addr,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 5, "temperature": 0, "ignore_eos": true,
               "logprobs": true, "top_logprobs": 2}),
    );
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    for e in content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2, "{e}");
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert_eq!(top[0]["logprob"], e["logprob"], "{e}");
        assert!(
            top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64(),
            "{e}"
        );
        assert!(e["bytes"].is_array());
    }
    // Without logprobs: null.
    let (_, v) = post(
        s.addr,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");

    // Streamed: every token's entry arrives, in the chunks.
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 7, "temperature": 0, "ignore_eos": true,
                      "stream": true, "logprobs": true});
    let (st, b) = http(
        s.addr,
        "POST",
        "/v1/chat/completions",
        Some(&body.to_string()),
        &[],
    );
    assert_eq!(st, 200);
    let entries: usize = sse(&b)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["logprobs"]["content"]
                .as_array()
                .map_or(0, |c| c.len())
        })
        .sum();
    assert_eq!(entries, 7, "{b}");
}

/// `n` samples: choice `i` is the single request with seed + i, whole and streamed; the
/// prompt's full KV blocks are computed once (the other samples find them cached, as
/// /metrics counts); usage counts the prompt once and every choice's tokens.
#[test]
fn n_samples_share_one_prefill() {
    let s = start_parsers(None, None);
    // 100 prompt tokens: 6 full blocks of 16.
    let prompt: Vec<u32> = (0..100).map(|i| 32 + (i * 7) % 90).collect();
    let body = |n: usize, seed: u64, stream: bool| {
        json!({"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 1.0,
               "seed": seed, "n": n, "ignore_eos": true, "stream": stream,
               "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }})
    };
    let metrics = || http(s.addr, "GET", "/metrics", None, &[]).1;
    let before = metrics();
    let (st, v) = post(s.addr, "/v1/completions", body(4, 40, false));
    assert_eq!(st, 200, "{v}");
    let after = metrics();
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    assert_eq!(delta("encore_prefix_cache_queries_total"), 400.0);
    assert_eq!(delta("encore_prefix_cache_hits_total"), 3.0 * 96.0);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 100, "completion_tokens": 40, "total_tokens": 140})
    );
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["finish_reason"], "length");
        // The same as one sample with seed + i.
        let (_, one) = post(s.addr, "/v1/completions", body(1, 40 + i as u64, false));
        assert_eq!(one["choices"][0]["text"], c["text"], "choice {i}");
    }
    assert!(texts.iter().any(|t| *t != texts[0]), "{texts:?}");
    // Streamed: chunks of every choice interleave; each choice's pieces add up to its text.
    let raw = post_raw(s.addr, "/v1/completions", &body(4, 40, true));
    let events = sse(&raw);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut got = vec![String::new(); 4];
    let mut finished = 0;
    for e in &events[..events.len() - 2] {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        got[c["index"].as_u64().unwrap() as usize].push_str(c["text"].as_str().unwrap());
        finished += usize::from(!c["finish_reason"].is_null());
    }
    assert_eq!(
        (got, finished),
        (texts.iter().map(|t| t.to_string()).collect(), 4)
    );
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 40);
}

/// `logit_bias`: +100 forces a token, -100 bans one, on both endpoints, whole and
/// streamed.
#[test]
fn logit_bias_forces_and_bans_tokens() {
    let s = start(None);
    for (path, base) in [
        ("/v1/completions", json!({"prompt": "hi"})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
    ] {
        let mut b = base.clone();
        b["model"] = json!(MODEL);
        b["max_tokens"] = json!(6);
        b["temperature"] = json!(0);
        b["ignore_eos"] = json!(true);
        b["logit_bias"] = json!({"65": 100, "66": -3.5});
        let (st, v) = post(s.addr, path, b.clone());
        assert_eq!(st, 200, "{v}");
        let c = &v["choices"][0];
        let text = c["text"]
            .as_str()
            .or(c["message"]["content"].as_str())
            .unwrap();
        assert_eq!(text, "AAAAAA", "{path}");
        // Ban what greedy decoding writes first.
        b["logit_bias"] = json!({});
        let (_, v) = post(s.addr, path, b.clone());
        let ids: Vec<u32> = serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
        b["logit_bias"] = json!({ ids[0].to_string(): -100 });
        let (_, v) = post(s.addr, path, b.clone());
        let banned: Vec<u32> =
            serde_json::from_value(v["choices"][0]["token_ids"].clone()).unwrap();
        assert!(!banned.contains(&ids[0]), "{path}: {banned:?}");
    }
}

/// Completions' `echo`: every choice's text starts with the prompt (as given, or its ids
/// written out), whole and streamed.
#[test]
fn echo_starts_the_text_with_the_prompt() {
    let s = start(None);
    for (prompt, echoed) in [(json!("Once upon"), "Once upon"), (json!([72, 105]), "Hi")] {
        let b = json!({"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0,
                       "ignore_eos": true, "echo": true, "n": 2});
        let (st, v) = post(s.addr, "/v1/completions", b.clone());
        assert_eq!(st, 200, "{v}");
        let mut plain = b.clone();
        plain["echo"] = json!(false);
        let (_, p) = post(s.addr, "/v1/completions", plain);
        for i in 0..2 {
            let want = format!("{echoed}{}", p["choices"][i]["text"].as_str().unwrap());
            assert_eq!(v["choices"][i]["text"], want.as_str());
        }
        let mut streamed = b.clone();
        streamed["stream"] = json!(true);
        streamed["n"] = json!(1);
        let (text, _) = streamed_text(&post_raw(s.addr, "/v1/completions", &streamed));
        assert_eq!(text, v["choices"][0]["text"].as_str().unwrap());
    }
}

/// Completions' `echo` with `logprobs`: the prompt's tokens lead the log-probabilities
/// (the first with `null`), whole and streamed, for every choice; a prompt token scores
/// what the same token scored when it was sampled after the same text.
#[test]
fn echo_with_logprobs_scores_the_prompt() {
    let s = start(None);
    let prompt: Vec<u32> = "Once upon a".bytes().map(u32::from).collect();
    let plain = json!({"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                       "ignore_eos": true, "logprobs": 2});
    let (st, p) = post(s.addr, "/v1/completions", plain);
    assert_eq!(st, 200, "{p}");
    let t = p["choices"][0]["token_ids"][0].as_u64().unwrap() as u32;
    let sampled = p["choices"][0]["logprobs"]["token_logprobs"][0]
        .as_f64()
        .unwrap();
    let mut longer = prompt.clone();
    longer.push(t);
    let b = json!({"model": MODEL, "prompt": longer, "max_tokens": 3, "temperature": 0,
                   "ignore_eos": true, "logprobs": 2, "echo": true, "n": 2});
    let (st, v) = post(s.addr, "/v1/completions", b.clone());
    assert_eq!(st, 200, "{v}");
    let n = longer.len();
    for i in 0..2 {
        let lp = &v["choices"][i]["logprobs"];
        let tokens = lp["tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), n + 3, "{lp}");
        assert_eq!(lp["token_logprobs"][0], Value::Null);
        assert_eq!(lp["top_logprobs"][0], Value::Null);
        for k in 1..n + 3 {
            let l = lp["token_logprobs"][k].as_f64().unwrap();
            assert!(l <= 0.0, "{l}");
            let top = lp["top_logprobs"][k].as_object().unwrap();
            assert!(!top.is_empty() && top.len() <= 2, "{top:?}");
        }
        let scored = lp["token_logprobs"][n - 1].as_f64().unwrap();
        assert!((scored - sampled).abs() < 1e-3, "{scored} vs {sampled}");
        let arr = |v: &Value| v.as_array().unwrap()[..n].to_vec();
        assert_eq!(
            arr(&lp["tokens"]),
            arr(&v["choices"][0]["logprobs"]["tokens"])
        );
        let offsets = lp["text_offset"].as_array().unwrap();
        assert_eq!(offsets[0], 0);
    }
    let mut streamed = b.clone();
    streamed["stream"] = json!(true);
    streamed["n"] = json!(1);
    let events = sse(&post_raw(s.addr, "/v1/completions", &streamed));
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    let lp = &first["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n + 1, "{first}");
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    let arr = |v: &Value| v.as_array().unwrap()[..n].to_vec();
    assert_eq!(
        arr(&lp["token_logprobs"]),
        arr(&v["choices"][0]["logprobs"]["token_logprobs"])
    );
}
