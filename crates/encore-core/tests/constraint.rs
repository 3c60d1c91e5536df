//! Constrained decoding (structured outputs) through the scheduler on the CPU backend,
//! with the byte tokenizer over the tiny model: JSON-schema, regex, choice and
//! allowed-token outputs match their constraint, greedy and sampled, also through
//! preemption; unconstrained requests in the same batch produce what they produce alone;
//! bad constraints are refused at admission naming the parameter.

use std::collections::HashMap;
use std::sync::Arc;

use encore_core::backend::cpu::CpuBackend;
use encore_core::constraint::ConstraintCompiler;
use encore_core::request::{Constraint, FinishReason, Param, Request, SamplingParams};
use encore_core::runner::Runner;
use encore_core::scheduler::{Scheduler, SchedulerConfig};
use encore_core::tokenizer::{Tokenizer, BYTES_EOS};

mod common;

fn compiler(r: &Runner<'_>) -> Arc<ConstraintCompiler> {
    let vocab = r.model().cfg.vocab_size;
    Arc::new(ConstraintCompiler::new(&Tokenizer::bytes(), vocab).unwrap())
}

/// A request for a short prompt, sampled (seed `id`) or greedy, ending at the byte
/// tokenizer's EOS.
fn request(id: u64, temperature: f32, max_tokens: usize, c: Option<Constraint>) -> Request {
    let prompt = (0..6).map(|j| ((id * 29 + j * 7) % 200) as u32).collect();
    let sampling = SamplingParams {
        temperature,
        seed: id,
        ..Default::default()
    };
    let mut req = common::request(id, prompt, sampling, max_tokens);
    req.params.stop_token_ids = vec![BYTES_EOS];
    req.params.constraint = c;
    req
}

/// Run every request to the end; per request its tokens and finish reason, and the
/// scheduler's preemption count.
fn run(
    r: &mut Runner<'_>,
    cfg: SchedulerConfig,
    reqs: &[Request],
) -> (HashMap<u64, (Vec<u32>, FinishReason)>, u64) {
    let mut s = Scheduler::new(cfg, r).unwrap();
    s.set_constraint_compiler(compiler(r));
    for q in reqs {
        s.add(q.clone(), r).unwrap();
    }
    let mut out = HashMap::new();
    let mut steps = 0;
    while s.has_work() {
        for o in s.step(r).unwrap() {
            let e = out
                .entry(o.id)
                .or_insert((Vec::new(), FinishReason::Stopped));
            e.0.push(o.token);
            if let Some(f) = o.finish {
                e.1 = f;
            }
        }
        assert_eq!(s.take_failed(), Vec::new());
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    assert_eq!(s.blocks().num_used_blocks(), 0);
    (out, s.stats().preemptions)
}

/// The text of byte tokens (the EOS that ends it dropped).
fn text(tokens: &[u32]) -> String {
    let bytes: Vec<u8> = tokens
        .iter()
        .filter(|&&t| t != BYTES_EOS)
        .map(|&t| u8::try_from(t).expect("a byte token"))
        .collect();
    String::from_utf8(bytes).expect("constrained output is UTF-8")
}

const SCHEMA: &str = r#"{
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "ok": {"type": "boolean"}
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": false
}"#;

#[test]
fn json_schema_outputs_parse_and_match_the_schema() {
    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let reqs: Vec<Request> = (0..8)
        .map(|i| {
            let t = if i % 4 == 0 { 0.0 } else { 1.0 };
            request(i, t, 100, Some(Constraint::JsonSchema(SCHEMA.into())))
        })
        .collect();
    let (out, _) = run(&mut r, SchedulerConfig::new(64, 8), &reqs);
    for q in &reqs {
        let (tokens, finish) = &out[&q.id];
        assert_eq!(*finish, FinishReason::Eos, "request {}: {tokens:?}", q.id);
        let t = text(tokens);
        let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{t}: {e}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 4, "{t}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{t}");
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{t}");
        let tags = o["tags"].as_array().unwrap();
        assert!(
            tags.len() <= 2 && tags.iter().all(|x| x == "a" || x == "b"),
            "{t}"
        );
        assert!(o["ok"].is_boolean(), "{t}");
        // The layout: one space after ':' and ','.
        assert!(t.starts_with("{\"name\": \""), "{t}");
    }
}

#[test]
fn regex_choice_and_allowed_tokens() {
    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let choices = ["yes", "no", "maybe so"];
    let allowed = vec![b'x' as u32, b'y' as u32, BYTES_EOS];
    let mut reqs = Vec::new();
    for i in 0..4 {
        let t = if i == 0 { 0.0 } else { 1.0 };
        reqs.push(request(
            i,
            t,
            40,
            Some(Constraint::Regex("[0-9]{3}-[a-z]{2,4}".into())),
        ));
        reqs.push(request(
            10 + i,
            t,
            40,
            Some(Constraint::Choice(choices.map(String::from).to_vec())),
        ));
        reqs.push(request(
            20 + i,
            t,
            12,
            Some(Constraint::AllowedTokens(allowed.clone())),
        ));
    }
    let (out, _) = run(&mut r, SchedulerConfig::new(64, 12), &reqs);
    for i in 0..4 {
        let (tokens, finish) = &out[&i];
        let t = text(tokens);
        let b = t.as_bytes();
        assert_eq!(*finish, FinishReason::Eos, "{t}");
        assert!(
            b.len() >= 6
                && b.len() <= 8
                && b[..3].iter().all(u8::is_ascii_digit)
                && b[3] == b'-'
                && b[4..].iter().all(u8::is_ascii_lowercase),
            "{t:?}"
        );
        let (tokens, finish) = &out[&(10 + i)];
        assert_eq!(*finish, FinishReason::Eos);
        assert!(choices.contains(&text(tokens).as_str()), "{tokens:?}");
        let (tokens, _) = &out[&(20 + i)];
        assert!(tokens.iter().all(|t| allowed.contains(t)), "{tokens:?}");
    }
}

#[test]
fn unconstrained_requests_are_unchanged_by_constrained_neighbours() {
    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let plain: Vec<Request> = (0..4)
        .map(|i| request(100 + i, if i % 2 == 0 { 0.0 } else { 0.8 }, 20, None))
        .collect();
    let (alone, _) = run(&mut r, SchedulerConfig::new(64, 8), &plain);
    let mut mixed = plain.clone();
    mixed.extend((0..4).map(|i| request(i, 1.0, 60, Some(Constraint::JsonObject))));
    let (together, _) = run(&mut r, SchedulerConfig::new(64, 8), &mixed);
    for q in &plain {
        assert_eq!(together[&q.id], alone[&q.id], "request {}", q.id);
    }
    for i in 0..4 {
        let (tokens, finish) = &together[&i];
        if *finish == FinishReason::Eos {
            let v: serde_json::Value = serde_json::from_str(&text(tokens)).unwrap();
            assert!(v.is_object());
        }
    }
}

/// A KV cache too small for the batch preempts constrained requests; each recomputes
/// and continues its constraint where it was: the same tokens as with room.
#[test]
fn constrained_requests_survive_preemption() {
    let cpu = CpuBackend::new();
    let reqs: Vec<Request> = (0..8)
        .map(|i| request(i, 1.0, 60, Some(Constraint::JsonSchema(SCHEMA.into()))))
        .collect();
    let mut roomy = common::tiny_runner(&cpu);
    let (reference, none) = run(&mut roomy, SchedulerConfig::new(64, 8), &reqs);
    assert_eq!(none, 0);
    let mut tight = common::tiny_runner_with_blocks(&cpu, 40);
    let (out, preemptions) = run(&mut tight, SchedulerConfig::new(64, 8), &reqs);
    assert!(preemptions > 0);
    assert_eq!(out, reference);
}

#[test]
fn bad_constraints_are_refused_at_admission() {
    let cpu = CpuBackend::new();
    let r = common::tiny_runner(&cpu);
    let mut s = Scheduler::new(SchedulerConfig::new(64, 8), &r).unwrap();
    // Without a compiler, any constraint is refused.
    let e = s
        .add(request(1, 0.0, 8, Some(Constraint::JsonObject)), &r)
        .unwrap_err();
    assert_eq!(e.param, Param::Constraint);
    s.set_constraint_compiler(compiler(&r));
    let vocab = r.model().cfg.vocab_size as u32;
    for (c, says) in [
        (Constraint::JsonSchema("{not json".into()), "not JSON"),
        (Constraint::JsonSchema("[1, 2]".into()), "must be an object"),
        (
            Constraint::JsonSchema(r#"{"type": "wizard"}"#.into()),
            "wizard",
        ),
        (Constraint::Regex("(unclosed".into()), ""),
        (Constraint::Lark("start: undefined_rule".into()), ""),
        (Constraint::Choice(Vec::new()), "empty"),
        (
            Constraint::AllowedTokens(vec![3, vocab]),
            "outside the vocabulary",
        ),
    ] {
        let e = s
            .add(request(2, 0.0, 8, Some(c.clone())), &r)
            .expect_err(&format!("{c:?} is refused"));
        assert_eq!(e.param, Param::Constraint, "{c:?}");
        assert!(e.message.contains(says), "{c:?}: {}", e.message);
        assert!(!s.has_work(), "nothing is queued");
    }
}

/// A constraint the vocabulary cannot satisfy (a regex of letters the tokenizer has no
/// token for) allows no token at the first step: the request ends with an error and frees
/// its blocks, and a request beside it is unaffected.
#[test]
fn a_constraint_that_allows_nothing_fails_its_request() {
    let dir = std::env::temp_dir().join(format!("encore-constraint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A word-level tokenizer of four tokens: "a", "b", " " and the end token.
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": 3, "content": "</s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, " ": 2, "</s>": 3},
                  "unk_token": "</s>"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "</s>"}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        tok.token_bytes()[..3],
        [b"a".to_vec(), b"b".to_vec(), b" ".to_vec()]
    );

    let cpu = CpuBackend::new();
    let mut r = common::tiny_runner(&cpu);
    let compiler = ConstraintCompiler::new(&tok, r.model().cfg.vocab_size).unwrap();
    let mut s = Scheduler::new(SchedulerConfig::new(64, 4), &r).unwrap();
    s.set_constraint_compiler(Arc::new(compiler));
    s.add(request(1, 0.0, 8, Some(Constraint::Regex("c+".into()))), &r)
        .unwrap();
    s.add(
        request(2, 0.0, 8, Some(Constraint::Regex("(a|b)+".into()))),
        &r,
    )
    .unwrap();
    let (mut failed, mut produced) = (Vec::new(), Vec::new());
    while s.has_work() {
        produced.extend(s.step(&mut r).unwrap().into_iter().map(|o| (o.id, o.token)));
        failed.extend(s.take_failed());
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, 1);
    assert!(failed[0].1.contains("allows no token"), "{}", failed[0].1);
    assert!(produced.iter().all(|&(id, _)| id == 2), "{produced:?}");
    assert!(
        produced.iter().all(|&(_, t)| t <= 1 || t == 3),
        "{produced:?}"
    );
    assert_eq!(s.blocks().num_used_blocks(), 0);
}

#[test]
fn logit_bias_forces_and_bans_tokens_eager_and_in_graphs() {
    common::check_logit_bias(&CpuBackend::new());
}

/// Constrained steps in graph mode stop at the logits (a decode bucket's logits-only
/// graph, a token bucket's pieces) and sample after the masks arrive: the same tokens as
/// eager, for constrained and unconstrained requests side by side, and the plain decode
/// graphs still serve the steps without masks.
#[test]
fn constrained_steps_in_graphs_equal_eager() {
    use encore_core::graph::{BucketPolicy, Phase};
    use encore_core::runner::GraphConfig;
    let cpu = CpuBackend::new();
    let mut reqs: Vec<Request> = (0..3)
        .map(|i| request(100 + i, if i == 0 { 0.0 } else { 0.9 }, 100, None))
        .collect();
    reqs.extend((0..3).map(|i| request(i, 1.0, 40, Some(Constraint::JsonSchema(SCHEMA.into())))));
    reqs.push(request(
        9,
        0.7,
        12,
        Some(Constraint::Regex("[a-f]+".into())),
    ));
    let mut eager = common::tiny_runner(&cpu);
    let (reference, _) = run(&mut eager, SchedulerConfig::new(64, 8), &reqs);
    let mut r = common::tiny_runner(&cpu);
    r.set_graphs(Some(GraphConfig {
        decode: common::buckets(),
        mixed: BucketPolicy::SglangLike { max: 256 },
        verify: 0,
    }));
    let (out, _) = run(&mut r, SchedulerConfig::new(64, 8), &reqs);
    assert_eq!(out, reference);
    let logits_only = r.phase_stats(Phase::DecodeLogits).unwrap();
    assert!(logits_only.hits > 5, "{logits_only:?}");
    assert!(r.phase_stats(Phase::Decode).unwrap().hits > 5);
    let mixed = r.phase_stats(Phase::Mixed).unwrap();
    assert!(mixed.hits + mixed.misses > 0, "{mixed:?}");
    // Every constrained output is what its constraint allows.
    for i in 0..3 {
        let (tokens, finish) = &out[&i];
        if *finish == FinishReason::Eos {
            let v: serde_json::Value = serde_json::from_str(&text(tokens)).unwrap();
            assert_eq!(v.as_object().unwrap().len(), 4);
        }
    }
    let t = text(&out[&9].0);
    assert!(t.bytes().all(|c| (b'a'..=b'f').contains(&c)), "{t:?}");
}

/// Speculative decoding under constraints: drafts are the tokens the grammar forces (a
/// JSON key) or the n-gram proposals it allows, cut before the first it rejects; the
/// verify step's rows each get the mask after the drafts before them. The tokens equal
/// those of decoding one at a time (greedy and sampled; JSON schema, regex, choice and
/// allowed tokens, beside unconstrained requests, and through preemption), and drafts
/// are kept.
#[test]
fn speculation_under_constraints_gives_the_tokens_of_decoding_one_at_a_time() {
    use encore_core::graph::{BucketPolicy, Phase};
    use encore_core::runner::{GraphConfig, RunnerConfig};
    use encore_core::spec::ngram::NgramConfig;
    use encore_core::spec::Proposer;
    let cpu = CpuBackend::new();
    let mut reqs = Vec::new();
    for i in 0..3u64 {
        let t = if i == 0 { 0.0 } else { 0.9 };
        reqs.push(request(
            i,
            t,
            80,
            Some(Constraint::JsonSchema(SCHEMA.into())),
        ));
        reqs.push(request(
            10 + i,
            t,
            40,
            Some(Constraint::Regex("([0-9]{3}-[a-z]{2,4} ){2,5}".into())),
        ));
        reqs.push(request(
            20 + i,
            t,
            40,
            Some(Constraint::Choice(vec![
                "maybe so".into(),
                "maybe not".into(),
            ])),
        ));
        reqs.push(request(
            30 + i,
            t,
            16,
            Some(Constraint::AllowedTokens(vec![b'x' as u32, b'y' as u32])),
        ));
        reqs.push(request(40 + i, t, 30, None));
    }
    let spec = SchedulerConfig {
        speculative: Some(Proposer::Ngram(NgramConfig::new(1, 4, 4).unwrap())),
        ..SchedulerConfig::new(64, 8)
    };
    let roomy = 1 + 16 * (128 / common::BLOCK);
    for (blocks, graphs) in [(roomy, false), (40, false), (roomy, true)] {
        let mut r = common::tiny_runner_with_blocks(&cpu, blocks);
        let (plain, _) = run(&mut r, SchedulerConfig::new(64, 8), &reqs);
        if graphs {
            // Room for 8 sequences' drafts: verify graphs of buckets 1 to 8, masked
            // steps replaying the ones that stop at the logits.
            let cfg = RunnerConfig {
                max_seqs: 40,
                ..common::tiny_config(blocks)
            };
            r = Runner::new(&cpu, common::tiny_model(&cpu), cfg).unwrap();
            r.set_graphs(Some(GraphConfig {
                decode: common::buckets(),
                mixed: BucketPolicy::SglangLike { max: 256 },
                verify: 4,
            }));
        }
        let mut s = Scheduler::new(spec, &r).unwrap();
        s.set_constraint_compiler(compiler(&r));
        for q in &reqs {
            s.add(q.clone(), &r).unwrap();
        }
        let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
        while s.has_work() {
            for o in s.step(&mut r).unwrap() {
                out.entry(o.id).or_default().push(o.token);
            }
            assert_eq!(s.take_failed(), Vec::new());
        }
        for q in &reqs {
            assert_eq!(
                out[&q.id], plain[&q.id].0,
                "blocks {blocks}: request {}",
                q.id
            );
        }
        // The constrained requests alone keep about 70 drafts (JSON keys, choices).
        let st = s.stats();
        assert!(st.drafts_accepted > 50, "{st:?}");
        if blocks == 40 {
            assert!(st.preemptions > 0, "{st:?}");
        }
        let t = text(&out[&0]);
        assert!(serde_json::from_str::<serde_json::Value>(&t).is_ok(), "{t}");
        if graphs {
            let v = r.phase_stats(Phase::VerifyLogits).unwrap();
            assert!(v.hits > 5, "{v:?}");
        }
    }
}
