//! A harmony completion (gpt-oss) split into reasoning, content and tool calls: its
//! messages (`encore_core::tokenizer::harmony::parse_completion`) by channel and
//! recipient. `analysis` is reasoning; a message to `functions.NAME` (on `commentary`,
//! `<|constrain|>json`) is a call of NAME with the message as its arguments; `final`, and
//! a `commentary` preamble to the user, are content. Messages of one kind are joined by a
//! line break. What the parser holds back (a header not yet whole, a marker being
//! written) keeps each parse an extension of the last, as [`super::ChatParser`] needs.

use encore_core::tokenizer::harmony::parse_completion;

use super::{Call, Parsed};

/// The split of `text`, the whole output so far; `done`: it ended.
pub(crate) fn parse(text: &str, done: bool) -> Parsed {
    let mut out = Parsed::default();
    let join = |s: &mut String, piece: &str, started: &mut bool| {
        if *started {
            s.push('\n');
        }
        *started = true;
        s.push_str(piece);
    };
    let (mut reasoning, mut content) = (false, false);
    for m in parse_completion(text, done) {
        let to_tool = m
            .recipient
            .as_deref()
            .filter(|r| !matches!(*r, "all" | "user" | "assistant"));
        if let Some(r) = to_tool {
            out.calls.push(Call {
                name: Some(r.strip_prefix("functions.").unwrap_or(r).to_string()),
                arguments: m.content,
            });
        } else if m.channel.as_deref() == Some("analysis") {
            join(&mut out.reasoning, &m.content, &mut reasoning);
        } else {
            join(&mut out.content, &m.content, &mut content);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harmony_channels_split() {
        let t = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        let p = parse(t, true);
        assert_eq!(p.reasoning, "Need weather.");
        assert_eq!(p.content, "Checking.");
        assert_eq!(
            p.calls,
            [Call {
                name: Some("get_weather".into()),
                arguments: "{\"city\":\"Paris\"}".into()
            }]
        );
        let p = parse(
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b",
            false,
        );
        assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("a", "b"));
    }
}
