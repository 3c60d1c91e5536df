//! The renderer and the parser against what OpenAI's `openai-harmony` (0.0.8) wrote for
//! the same conversations and completions (`scripts/harmony_fixtures.py`).

use serde_json::Value;

use super::*;

fn fixtures() -> Value {
    serde_json::from_str(include_str!("../../../tests/fixtures/harmony.json")).unwrap()
}

/// The chat messages of a fixture's request, tool-call arguments parsed to JSON as the
/// server passes them.
fn messages(req: &Value) -> Vec<ChatMessage> {
    let mut msgs = req["messages"].clone();
    for m in msgs.as_array_mut().unwrap() {
        for c in m["tool_calls"].as_array_mut().into_iter().flatten() {
            let args = c["function"]["arguments"].as_str().unwrap();
            c["function"]["arguments"] = serde_json::from_str(args).unwrap();
        }
        if m["tool_calls"].is_null() {
            m.as_object_mut().unwrap().remove("tool_calls");
        }
    }
    serde_json::from_value(msgs).unwrap()
}

#[test]
fn harmony_renders_as_openai_harmony() {
    let f = fixtures();
    let renders = f["renders"].as_array().unwrap();
    assert!(renders.len() >= 7);
    for r in renders {
        let req = &r["request"];
        let opts = HarmonyOptions {
            effort: Effort::from_name(req["reasoning_effort"].as_str().unwrap_or("medium"))
                .unwrap(),
            date: req["date"].as_str().map(String::from),
        };
        let tools = req["tools"].as_array().map(Vec::as_slice);
        let text = render(&messages(req), tools, &opts).unwrap();
        let want = r["text"].as_str().unwrap();
        if text != want {
            let at = text
                .bytes()
                .zip(want.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(text.len().min(want.len()));
            panic!(
                "{}: differs at byte {at}:\nours:     {:?}\nofficial: {:?}",
                r["name"],
                &text[at.saturating_sub(40)..(at + 80).min(text.len())],
                &want[at.saturating_sub(40)..(at + 80).min(want.len())],
            );
        }
        // So the tokens are the official ones too.
        assert_eq!(r["text_encodes_back"], true, "{}", r["name"]);
    }
}

#[test]
fn harmony_render_refuses_what_it_cannot_place() {
    let mut tool = ChatMessage::new("tool", "22 C");
    tool.tool_call_id = Some("call_9".into());
    let e = render(
        &[ChatMessage::new("user", "hi"), tool],
        None,
        &HarmonyOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("messages[1]") && e.contains("call_9"), "{e}");
    let e = render(
        &[ChatMessage::new("robot", "x")],
        None,
        &HarmonyOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("messages[0]") && e.contains("robot"), "{e}");
}

fn pick(m: &HarmonyMessage) -> Value {
    serde_json::json!({"channel": m.channel, "recipient": m.recipient,
                       "content_type": m.content_type, "content": m.content})
}

#[test]
fn harmony_parses_as_openai_harmony() {
    let f = fixtures();
    let parses = f["parses"].as_array().unwrap();
    assert!(parses.len() >= 5);
    for p in parses {
        let text = p["text"].as_str().unwrap();
        let want: Vec<Value> = p["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let mut m = m.clone();
                m.as_object_mut().unwrap().remove("role");
                m
            })
            .collect();
        let got: Vec<Value> = parse_completion(text, true).iter().map(pick).collect();
        assert_eq!(got, want, "{}", p["name"]);
        // Without the stop token the engine leaves out, the same.
        let cut = text
            .strip_suffix(RETURN)
            .or_else(|| text.strip_suffix(CALL))
            .unwrap_or(text);
        let got: Vec<Value> = parse_completion(cut, true).iter().map(pick).collect();
        assert_eq!(got, want, "{} without its stop token", p["name"]);
        // Each prefix's parse is a prefix of the next one's.
        let mut prev: Vec<HarmonyMessage> = Vec::new();
        for (at, _) in cut.char_indices().chain([(cut.len(), ' ')]) {
            let now = parse_completion(&cut[..at], false);
            assert!(now.len() >= prev.len(), "{} at {at}", p["name"]);
            for (a, b) in prev.iter().zip(&now) {
                assert_eq!(
                    (&a.channel, &a.recipient, &a.content_type),
                    (&b.channel, &b.recipient, &b.content_type),
                    "{} at {at}",
                    p["name"]
                );
                assert!(b.content.starts_with(&a.content), "{} at {at}", p["name"]);
            }
            prev = now;
        }
    }
}

#[test]
fn harmony_text_outside_the_format_is_content() {
    let m = parse_completion("Just text <b>", true);
    assert_eq!(
        (m.len(), m[0].content.as_str(), m[0].channel.clone()),
        (1, "Just text <b>", None)
    );
    assert!(parse_completion("Just text", false).is_empty());
    // A marker being written is held back.
    let m = parse_completion("<|channel|>final<|message|>Hi <|en", false);
    assert_eq!(m[0].content, "Hi ");
    let m = parse_completion("<|channel|>final<|message|>a <| b", false);
    assert_eq!(m[0].content, "a <| b");
    let m = parse_completion("<|channel|>final<|message|>4.<", false);
    assert_eq!(m[0].content, "4.");
}
