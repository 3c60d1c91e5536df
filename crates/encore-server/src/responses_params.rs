//! The responses API's `reasoning` and `include` as typed objects, read into the
//! template variables they set, what the response repeats, and what it adds.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::field::Field;
use crate::generate::thinking_switch;
use crate::request_tools::{no_extra, Extra};
use crate::AppState;

/// `reasoning.effort`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
pub(crate) enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

/// `reasoning.summary` (and its older `generate_summary`).
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
pub(crate) enum ReasoningSummary {
    Auto,
    Concise,
    Detailed,
}

/// `reasoning`: `{"effort", "summary"}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct Reasoning {
    #[schema(value_type = Option<ReasoningEffort>)]
    effort: Field<String>,
    /// Accepted; the reasoning comes back whole.
    #[schema(value_type = Option<ReasoningSummary>)]
    summary: Field<String>,
    #[schema(value_type = Option<ReasoningSummary>)]
    generate_summary: Field<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// What `include` may ask for.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) enum IncludeValue {
    #[schema(rename = "message.output_text.logprobs")]
    Logprobs,
    #[schema(rename = "reasoning.encrypted_content")]
    EncryptedReasoning,
}

/// The objects of this module, whose schemas `/openapi.json` closes.
pub(crate) const CLOSED: [&str; 1] = ["Reasoning"];

/// What `include` asks to add.
#[derive(Default)]
pub(crate) struct Include {
    pub logprobs: bool,
    pub encrypted_reasoning: bool,
}

/// `include`: a list of strings.
pub(crate) fn include(f: Field<Vec<Field<String>>>) -> Result<Include, ApiError> {
    let mut out = Include::default();
    let list = f
        .get("include", || "`include` must be a list of strings".into())?
        .unwrap_or_default();
    for (i, x) in list.into_iter().enumerate() {
        match x {
            Field::Given(x) if x == "message.output_text.logprobs" => out.logprobs = true,
            Field::Given(x) if x == "reasoning.encrypted_content" => out.encrypted_reasoning = true,
            Field::Given(other) => {
                return Err(ApiError::bad(
                    format!("include[{i}]"),
                    format!(
                        "`include` value `{other}` is not supported: only \
                         `message.output_text.logprobs` and `reasoning.encrypted_content`"
                    ),
                ))
            }
            _ => {
                return Err(ApiError::bad(
                    format!("include[{i}]"),
                    "`include` must be a list of strings",
                ))
            }
        }
    }
    Ok(out)
}

/// `reasoning`: what the response repeats, and the template variables it sets. An
/// effort of `none` turns thinking off through the template's `enable_thinking` switch;
/// any other turns it on, and is passed as `reasoning_effort` to a template that reads
/// it. The reasoning comes back whole (a `reasoning_text` part); there is no summarizer,
/// so `summary` stays empty.
pub(crate) fn reasoning(
    f: Field<Reasoning>,
    s: &AppState,
) -> Result<(Value, Map<String, Value>), ApiError> {
    let mut kwargs = Map::new();
    const P: &str = "reasoning";
    let o = match f {
        Field::Absent => return Ok((json!({"effort": null, "summary": null}), kwargs)),
        Field::Wrong => return Err(ApiError::bad(P, "`reasoning` must be an object")),
        Field::Given(o) => o,
    };
    no_extra(&o.extra, P, |k| format!("unknown field `{k}` in `{P}`"))?;
    for (k, f) in [
        ("summary", &o.summary),
        ("generate_summary", &o.generate_summary),
    ] {
        match f {
            Field::Absent => {}
            Field::Given(x) if matches!(x.as_str(), "auto" | "concise" | "detailed") => {}
            _ => {
                return Err(ApiError::bad(
                    format!("{P}.{k}"),
                    format!("`{P}.{k}` must be `auto`, `concise` or `detailed`"),
                ))
            }
        }
    }
    let effort = match o.effort {
        Field::Absent => None,
        Field::Given(e)
            if matches!(
                e.as_str(),
                "none" | "minimal" | "low" | "medium" | "high" | "xhigh"
            ) =>
        {
            Some(e)
        }
        _ => {
            return Err(ApiError::bad(
                "reasoning.effort",
                "`reasoning.effort` must be one of none, minimal, low, medium, high, xhigh",
            ))
        }
    };
    if let Some(e) = &effort {
        thinking_switch(s, e != "none", "reasoning.effort", &mut kwargs)?;
        if e != "none" && s.chat.harmony {
            crate::harmony::effort(e, "reasoning.effort")?;
        }
        if e != "none" && s.chat.template_reads_effort {
            kwargs.insert("reasoning_effort".into(), json!(e));
        }
    }
    let summary = match o.summary {
        Field::Given(x) => json!(x),
        _ => Value::Null,
    };
    Ok((json!({"effort": effort, "summary": summary}), kwargs))
}
