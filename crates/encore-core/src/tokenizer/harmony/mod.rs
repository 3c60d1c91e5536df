//! Harmony, gpt-oss's chat format: the prompt of a conversation rendered as OpenAI's
//! `openai-harmony` 0.0.8 renders it (`render_conversation_for_completion` with the next
//! turn the assistant's, and its default of dropping the analysis before the first final
//! answer once the last assistant message is final), and the model's completion read back
//! into messages by channel (`parse`). The renderer is checked text for text (and so
//! token for token: the fixtures record that their text encodes back to their tokens)
//! against fixtures the official implementation wrote (`scripts/harmony_fixtures.py`,
//! `tests/fixtures/harmony.json`).
//!
//! A chat conversation maps onto harmony as vLLM and gpt-oss's own template map it: a
//! system message (model identity, knowledge cut-off, the current date, `Reasoning:
//! low|medium|high`, the valid channels); the leading `system`/`developer` messages as the
//! developer message's `# Instructions`, with the function tools as the TypeScript-like
//! `functions` namespace (`schema`); user turns; an assistant turn as its reasoning on
//! `analysis`, its text on `final` (on `commentary`, as a preamble, when it also calls
//! tools) and each call on `commentary` to `functions.NAME` with `<|constrain|>json`,
//! ended by `<|call|>`; a tool result as a message from `functions.NAME` to the assistant
//! on `commentary` (the name found from the call its `tool_call_id` answers).

mod parse;
mod schema;

use serde_json::Value as Json;

use super::ChatMessage;
use crate::error::{Error, Result};

pub use parse::{parse_completion, HarmonyMessage};

/// Harmony's special tokens as the o200k_harmony vocabulary writes them.
pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
pub const END: &str = "<|end|>";
/// Ends the assistant's turn with its final answer (a stop token).
pub const RETURN: &str = "<|return|>";
/// Ends a message that calls a tool (a stop token).
pub const CALL: &str = "<|call|>";
pub const CONSTRAIN: &str = "<|constrain|>";

/// What the prompt of a completion ends with: the assistant's turn is next.
pub const GENERATION_PROMPT: &str = "<|start|>assistant";

const MODEL_IDENTITY: &str = "You are ChatGPT, a large language model trained by OpenAI.";
const KNOWLEDGE_CUTOFF: &str = "2024-06";

/// How much the model reasons (the system message's `Reasoning:` line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Effort {
    Low,
    #[default]
    Medium,
    High,
}

impl Effort {
    /// `low`, `medium` or `high`; `None` for another word.
    pub fn from_name(s: &str) -> Option<Effort> {
        match s {
            "low" => Some(Effort::Low),
            "medium" => Some(Effort::Medium),
            "high" => Some(Effort::High),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
        }
    }
}

/// What the system message says besides the defaults.
#[derive(Clone, Debug, Default)]
pub struct HarmonyOptions {
    pub effort: Effort,
    /// `Current date: ...` (vLLM writes today's, `%Y-%m-%d`); `None`: no such line.
    pub date: Option<String>,
}

/// One harmony message to render.
struct Msg {
    /// The role, or a tool's name for a tool's message.
    author: String,
    assistant: bool,
    recipient: Option<String>,
    channel: Option<&'static str>,
    content_type: Option<&'static str>,
    content: String,
}

impl Msg {
    fn new(author: &str, content: String) -> Msg {
        Msg {
            author: author.to_string(),
            assistant: author == "assistant",
            recipient: None,
            channel: None,
            content_type: None,
            content,
        }
    }

    fn on(mut self, channel: &'static str) -> Msg {
        self.channel = Some(channel);
        self
    }

    fn render(&self, out: &mut String) {
        out.push_str(START);
        out.push_str(&self.author);
        if let Some(r) = self.recipient.as_deref().filter(|&r| r != "all") {
            out.push_str(" to=");
            out.push_str(r);
        }
        if let Some(c) = self.channel {
            out.push_str(CHANNEL);
            out.push_str(c);
        }
        if let Some(t) = self.content_type {
            out.push(' ');
            out.push_str(t);
        }
        out.push_str(MESSAGE);
        out.push_str(&self.content);
        out.push_str(if self.assistant && self.recipient.is_some() {
            CALL
        } else {
            END
        });
    }
}

/// The text of a message's content (an absent one is empty).
fn text(m: &ChatMessage) -> String {
    m.content.clone().unwrap_or_default()
}

/// The prompt of `messages` with the function `tools` (`{"type": "function", "function":
/// {"name", "description", "parameters"}}` each), ending with the assistant's turn's
/// start ([`GENERATION_PROMPT`]). A tool result that answers no earlier call (and has no
/// `name`) or a role harmony has no place for is an error naming the message.
pub fn render(
    messages: &[ChatMessage],
    tools: Option<&[Json]>,
    opts: &HarmonyOptions,
) -> Result<String> {
    let tools = tools.unwrap_or_default();
    let defs: Vec<schema::ToolDef<'_>> = tools
        .iter()
        .filter_map(|t| t.get("function"))
        .filter_map(|f| {
            Some(schema::ToolDef {
                name: f.get("name")?.as_str()?,
                description: f.get("description").and_then(Json::as_str).unwrap_or(""),
                parameters: f.get("parameters").filter(|p| !p.is_null()),
            })
        })
        .collect();
    let mut msgs = vec![Msg::new("system", system_text(opts, !defs.is_empty()))];
    let lead = messages
        .iter()
        .take_while(|m| matches!(m.role.as_str(), "system" | "developer"))
        .count();
    let instructions: Vec<String> = messages[..lead].iter().map(text).collect();
    if !instructions.is_empty() || !defs.is_empty() {
        msgs.push(Msg::new("developer", developer_text(&instructions, &defs)));
    }
    let mut names: Vec<(&str, &str)> = Vec::new();
    for (i, m) in messages.iter().enumerate().skip(lead) {
        match m.role.as_str() {
            "system" | "developer" => {
                msgs.push(Msg::new("developer", developer_text(&[text(m)], &[])));
            }
            "user" => msgs.push(Msg::new("user", text(m))),
            "assistant" => {
                if let Some(r) = m.reasoning_content.as_deref().filter(|r| !r.is_empty()) {
                    msgs.push(Msg::new("assistant", r.to_string()).on("analysis"));
                }
                if let Some(c) = m.content.as_deref().filter(|c| !c.is_empty()) {
                    let channel = if m.tool_calls.is_empty() {
                        "final"
                    } else {
                        "commentary"
                    };
                    msgs.push(Msg::new("assistant", c.to_string()).on(channel));
                }
                for call in &m.tool_calls {
                    names.push((call.id.as_str(), call.function.name.as_str()));
                    let args = match &call.function.arguments {
                        Json::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let mut msg = Msg::new("assistant", args).on("commentary");
                    msg.recipient = Some(format!("functions.{}", call.function.name));
                    msg.content_type = Some("<|constrain|>json");
                    msgs.push(msg);
                }
            }
            "tool" => {
                let id = m.tool_call_id.as_deref();
                let name = names
                    .iter()
                    .rev()
                    .find(|(c, _)| Some(*c) == id)
                    .map(|(_, n)| *n)
                    .or(m.name.as_deref())
                    .ok_or_else(|| {
                        Error::Tokenizer(format!(
                            "messages[{i}]: a tool result must answer an earlier call: its \
                             `tool_call_id` ({}) is not the id of one",
                            id.unwrap_or("absent")
                        ))
                    })?;
                let mut msg = Msg::new(&format!("functions.{name}"), text(m)).on("commentary");
                msg.recipient = Some("assistant".to_string());
                msgs.push(msg);
            }
            other => {
                return Err(Error::Tokenizer(format!(
                    "messages[{i}]: the role `{other}` has no place in gpt-oss's chat format \
                     (system, developer, user, assistant, tool)"
                )))
            }
        }
    }
    // The wheel's default: once the last assistant message is final, the analysis
    // before the first final answer is left out.
    let last_final = msgs
        .iter()
        .rev()
        .find(|m| m.assistant)
        .is_some_and(|m| m.channel == Some("final"));
    let first_final = msgs.iter().position(|m| m.channel == Some("final"));
    let mut out = String::new();
    for (i, m) in msgs.iter().enumerate() {
        let dropped =
            last_final && first_final.is_some_and(|f| i < f) && m.channel == Some("analysis");
        if !dropped {
            m.render(&mut out);
        }
    }
    out.push_str(GENERATION_PROMPT);
    Ok(out)
}

fn system_text(opts: &HarmonyOptions, function_tools: bool) -> String {
    let mut top = vec![
        MODEL_IDENTITY.to_string(),
        format!("Knowledge cutoff: {KNOWLEDGE_CUTOFF}"),
    ];
    if let Some(d) = &opts.date {
        top.push(format!("Current date: {d}"));
    }
    let mut channels = "# Valid channels: analysis, commentary, final. Channel must be \
                        included for every message."
        .to_string();
    if function_tools {
        channels.push_str("\nCalls to these tools must go to the commentary channel: 'functions'.");
    }
    [
        top.join("\n"),
        format!("Reasoning: {}", opts.effort.name()),
        channels,
    ]
    .join("\n\n")
}

fn developer_text(instructions: &[String], tools: &[schema::ToolDef<'_>]) -> String {
    let mut sections = Vec::new();
    if !instructions.is_empty() {
        sections.push("# Instructions".to_string());
        sections.push(instructions.join("\n\n"));
    }
    if !tools.is_empty() {
        sections.push(schema::tools_section(tools));
    }
    sections.join("\n\n")
}

#[cfg(test)]
mod tests;
