//! Tool calling on a model whose chat template does not render tools: a generic tool
//! prompt, as llama.cpp's generic format does, so that nothing of a conversation's tools
//! is silently dropped. The tools are described in the system turn, with how to call
//! them: a JSON list `[{"name": ..., "parameters": {...}}]`, the very shape the grammar of
//! `tool_choice` `required` forces (`tools::Tools::constraint`), so a forced call reads
//! as usual. An assistant's earlier calls are written into its text in that shape, and
//! the results of a turn's calls go back as one user message. Under `tool_choice` `auto`
//! the model answers freely, and an answer that starts with such a list is read as its
//! calls (`parse::CallMode::Generic`).

use encore_core::tokenizer::ChatMessage;
use serde_json::{json, Value};

use crate::AppState;

/// The conversation and tools as the model's template takes them: as they are when it
/// renders tools; else rewritten by [`render`] (when there are tools, calls or results),
/// with no tools left for the template.
pub(crate) fn for_template(
    s: &AppState,
    messages: Vec<ChatMessage>,
    defs: Option<Vec<Value>>,
) -> (Vec<ChatMessage>, Option<Vec<Value>>) {
    let in_history = |m: &ChatMessage| !m.tool_calls.is_empty() || m.role == "tool";
    if s.chat.template_takes_tools || (defs.is_none() && !messages.iter().any(in_history)) {
        return (messages, defs);
    }
    (render(messages, defs.as_deref()), None)
}

/// `messages` rewritten for a template that renders neither tools nor calls: the tools
/// (`defs`, chat's `{"type": "function", "function": {...}}` each; none: the history
/// only) in the system turn, calls in the assistant's text, results as user turns.
pub(crate) fn render(messages: Vec<ChatMessage>, defs: Option<&[Value]>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if let Some(defs) = defs.filter(|d| !d.is_empty()) {
        out.push(ChatMessage::new("system", tools_text(defs)));
    }
    // The function of each call, for the results that answer it by id alone.
    let mut called = std::collections::HashMap::new();
    for m in messages {
        for c in &m.tool_calls {
            called.insert(c.id.clone(), c.function.name.clone());
        }
        match m.role.as_str() {
            "system" if out.len() == 1 && out[0].role == "system" && defs.is_some() => {
                // The client's system turn first, then the tools.
                let tools = out[0].content.take().unwrap_or_default();
                let own = m.content.unwrap_or_default();
                out[0].content = Some(format!("{own}\n\n{tools}"));
            }
            "assistant" if !m.tool_calls.is_empty() => {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| json!({"name": c.function.name, "parameters": c.function.arguments}))
                    .collect();
                let calls = Value::Array(calls).to_string();
                let text = match m.content.as_deref() {
                    None | Some("") => calls,
                    Some(t) => format!("{t}\n{calls}"),
                };
                out.push(ChatMessage {
                    content: Some(text),
                    tool_calls: Vec::new(),
                    ..m
                });
            }
            "tool" => {
                let result = format!(
                    "Result of the call {} ({}):\n{}",
                    m.tool_call_id.as_deref().unwrap_or("?"),
                    m.name
                        .as_deref()
                        .or_else(|| m
                            .tool_call_id
                            .as_ref()
                            .and_then(|id| called.get(id))
                            .map(String::as_str))
                        .unwrap_or("a tool"),
                    m.content.as_deref().unwrap_or("")
                );
                // A turn's results go back together, as one user message.
                match out.last_mut() {
                    Some(prev) if prev.role == "user" && prev.tool_call_id.is_some() => {
                        let text = prev.content.get_or_insert_with(String::new);
                        text.push_str("\n\n");
                        text.push_str(&result);
                    }
                    _ => {
                        let mut u = ChatMessage::new("user", result);
                        // Marks a user turn of results (the template never sees it on a
                        // user message it renders as text).
                        u.tool_call_id = m.tool_call_id;
                        out.push(u);
                    }
                }
            }
            _ => out.push(m),
        }
    }
    // The marker of result turns is not the template's to see.
    for m in &mut out {
        if m.role == "user" {
            m.tool_call_id = None;
        }
    }
    out
}

/// The system text that describes `defs` and how to call them.
fn tools_text(defs: &[Value]) -> String {
    let mut t = String::from(
        "# Tools\n\nYou may call one or more of these functions (each given as its JSON \
         schema):\n",
    );
    for d in defs {
        t.push_str(&d.get("function").unwrap_or(d).to_string());
        t.push('\n');
    }
    t.push_str(
        "\nTo call functions, answer with only a JSON list of the calls: \
         [{\"name\": <function name>, \"parameters\": <arguments object>}]. \
         Each call's result comes back in the next user message. Otherwise answer in \
         plain text.",
    );
    t
}

#[cfg(test)]
mod tests {
    use encore_core::tokenizer::{FunctionCall, ToolCall};

    use super::*;

    #[test]
    fn calls_and_results_are_written_out_and_tools_described() {
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![ToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"}),
            },
        }];
        let result = |id: &str, text: &str| ChatMessage {
            tool_call_id: Some(id.into()),
            name: Some("get_weather".into()),
            ..ChatMessage::new("tool", text)
        };
        let messages = vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Weather?"),
            call,
            result("c1", "22C"),
            result("c2", "18C"),
        ];
        let defs = [json!({"type": "function", "function": {"name": "get_weather"}})];
        let out = render(messages.clone(), Some(&defs));
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        let sys = out[0].content.as_deref().unwrap();
        assert!(sys.starts_with("Be brief.\n\n# Tools"), "{sys}");
        assert!(sys.contains(r#"{"name":"get_weather"}"#), "{sys}");
        assert_eq!(
            out[2].content.as_deref(),
            Some(r#"[{"name":"get_weather","parameters":{"city":"Paris"}}]"#)
        );
        assert!(out[2].tool_calls.is_empty());
        let results = out[3].content.as_deref().unwrap();
        assert!(
            results.contains("c1 (get_weather):\n22C")
                && results.contains("c2 (get_weather):\n18C"),
            "{results}"
        );
        assert!(out[3].tool_call_id.is_none());
        // Without tools, the history alone: no system turn is added.
        let out = render(messages, None);
        assert_eq!(out[0].content.as_deref(), Some("Be brief."));
        assert_eq!(out.len(), 4);
    }
}
