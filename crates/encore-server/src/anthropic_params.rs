//! Anthropic's `thinking` and `output_config` as typed objects, read into the template
//! variables they set and the output's constraint. Every field is a [`Field`] and every
//! object keeps the keys it does not have in `extra`, so each 400 names the field; the
//! format's schema stays a JSON value.

use encore_core::request::Constraint;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::field::Field;
use crate::generate::thinking_switch;
use crate::request_tools::{no_extra, Extra};
use crate::AppState;

/// `thinking.type`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
pub(crate) enum ThinkingType {
    Enabled,
    Adaptive,
    Disabled,
}

/// `thinking.display`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
pub(crate) enum ThinkingDisplay {
    Summarized,
    Omitted,
}

/// `thinking`: `{"type": "enabled", "budget_tokens", "display"}`, `{"type": "adaptive",
/// "display"}` or `{"type": "disabled"}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct Thinking {
    #[serde(rename = "type")]
    #[schema(value_type = ThinkingType, required)]
    kind: Field<String>,
    /// With `type` `enabled`: at least 1024, below `max_tokens`.
    #[schema(value_type = Option<u64>)]
    budget_tokens: Field<u64>,
    #[schema(value_type = Option<ThinkingDisplay>)]
    display: Field<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// `output_config.effort`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
pub(crate) enum Effort {
    Low,
    Medium,
    High,
    Xhigh,
    Max,
}

/// `output_config`: `format` and `effort`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct OutputConfig {
    #[schema(value_type = Option<Effort>)]
    effort: Field<String>,
    #[schema(value_type = Option<OutputFormat>)]
    format: Field<OutputFormat>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// A `type` that is `json_schema`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) enum JsonSchemaType {
    #[schema(rename = "json_schema")]
    JsonSchema,
}

/// `output_config.format`: `{"type": "json_schema", "schema"}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct OutputFormat {
    #[serde(rename = "type")]
    #[schema(value_type = JsonSchemaType, required)]
    kind: Field<String>,
    #[schema(value_type = Object, required)]
    schema: Field<Map<String, Value>>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// The objects of this module, whose schemas `/openapi.json` closes.
pub(crate) const CLOSED: [&str; 3] = ["Thinking", "OutputConfig", "OutputFormat"];

/// `output_config`: `format`, the output's constraint; `effort`, the template's
/// `reasoning_effort` where it reads one.
pub(crate) fn output_config(
    f: Field<OutputConfig>,
    s: &AppState,
    kwargs: &mut Map<String, Value>,
) -> Result<Option<Constraint>, ApiError> {
    const P: &str = "output_config";
    let o = match f {
        Field::Absent => return Ok(None),
        Field::Wrong => return Err(ApiError::bad(P, "`output_config` must be an object")),
        Field::Given(o) => o,
    };
    no_extra(&o.extra, P, |k| format!("unknown field `{k}` in `{P}`"))?;
    match o.effort {
        Field::Absent => {}
        Field::Given(e) if matches!(e.as_str(), "low" | "medium" | "high" | "xhigh" | "max") => {
            if !s.chat.template_reads_effort {
                let m = "this model's chat template takes no effort level (`reasoning_effort`)";
                return Err(ApiError::bad("output_config.effort", m));
            }
            if s.chat.harmony {
                crate::harmony::effort(&e, "output_config.effort")?;
            }
            kwargs.insert("reasoning_effort".into(), json!(e));
        }
        _ => {
            return Err(ApiError::bad(
                "output_config.effort",
                "`output_config.effort` must be one of low, medium, high, xhigh, max",
            ))
        }
    }
    const F: &str = "output_config.format";
    let fo = match o.format {
        Field::Absent => return Ok(None),
        Field::Given(fo) if matches!(&fo.kind, Field::Given(k) if k == "json_schema") => fo,
        _ => {
            return Err(ApiError::bad(
                F,
                "`output_config.format` must be `{\"type\": \"json_schema\", \"schema\": ...}`",
            ))
        }
    };
    no_extra(&fo.extra, F, |k| format!("unknown field `{k}` in `{F}`"))?;
    match fo.schema {
        Field::Given(schema) => Ok(Some(Constraint::JsonSchema(
            Value::Object(schema).to_string(),
        ))),
        _ => Err(ApiError::bad(
            "output_config.format.schema",
            "`output_config.format.schema` must be a JSON schema object",
        )),
    }
}

/// `thinking`: whether the thinking is left out of the answer (`display: "omitted"`).
/// The budget is checked as Anthropic does (at least 1024, below `max_tokens`); the
/// thinking ends when the model ends it, within `max_tokens`.
pub(crate) fn thinking(
    f: Field<Thinking>,
    s: &AppState,
    max_tokens: Option<usize>,
    kwargs: &mut Map<String, Value>,
) -> Result<bool, ApiError> {
    const P: &str = "thinking";
    let t = match f {
        Field::Absent => return Ok(false),
        Field::Wrong => {
            return Err(ApiError::bad(
                P,
                "`thinking` must be an object with a `type`",
            ))
        }
        Field::Given(t) => t,
    };
    let omit = match &t.display {
        Field::Absent => false,
        Field::Given(x) if x == "summarized" => false,
        Field::Given(x) if x == "omitted" => true,
        _ => {
            return Err(ApiError::bad(
                "thinking.display",
                "`thinking.display` must be `summarized` or `omitted`",
            ))
        }
    };
    let unknown = |k: &str| format!("unknown field `{k}` in `{P}`");
    // A key its type does not have.
    let not = |k: &str, given: bool| match given {
        true => Err(ApiError::bad(format!("{P}.{k}"), unknown(k))),
        false => Ok(()),
    };
    let kind = match &t.kind {
        Field::Given(k) => k.as_str(),
        _ => "",
    };
    match kind {
        "adaptive" => {
            no_extra(&t.extra, P, unknown)?;
            not("budget_tokens", t.budget_tokens.is_given())?;
            Ok(omit)
        }
        "enabled" => {
            no_extra(&t.extra, P, unknown)?;
            let b = match t.budget_tokens {
                Field::Given(b) if b >= 1024 => b,
                _ => {
                    let m = "`thinking.budget_tokens` is required: an integer of at least 1024";
                    return Err(ApiError::bad("thinking.budget_tokens", m));
                }
            };
            if let Some(max) = max_tokens {
                if b as usize >= max {
                    let m = format!(
                        "`thinking.budget_tokens` ({b}) must be below `max_tokens` ({max})"
                    );
                    return Err(ApiError::bad("thinking.budget_tokens", m));
                }
            }
            thinking_switch(s, true, P, kwargs)?;
            Ok(omit)
        }
        "disabled" => {
            no_extra(&t.extra, P, unknown)?;
            not("budget_tokens", t.budget_tokens.is_given())?;
            not("display", t.display.is_given())?;
            thinking_switch(s, false, P, kwargs)?;
            Ok(false)
        }
        _ => Err(ApiError::bad(
            "thinking.type",
            "`thinking.type` must be `enabled`, `adaptive` or `disabled`",
        )),
    }
}
