//! The responses API's and Anthropic's `tools` and `tool_choice` as typed objects
//! (`request_tools` has their shared pieces), read into chat's tools: a function
//! definition each, in chat's shape, and a [`ToolChoice`].

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::field::Field;
use crate::request_tools::{no_extra, typed, ChoiceWord, Extra, FunctionType};
use crate::tools::{read_list, ToolChoice};

/// A responses API tool: `{"type": "function", "name", "description", "parameters",
/// "strict"}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct ResponsesTool {
    #[serde(rename = "type")]
    #[schema(value_type = FunctionType, required)]
    kind: Field<String>,
    #[schema(value_type = String, required)]
    name: Field<String>,
    #[schema(value_type = Option<String>)]
    description: Field<String>,
    /// A JSON schema of the arguments.
    #[schema(value_type = Option<Object>)]
    parameters: Field<Map<String, Value>>,
    #[schema(value_type = Option<bool>)]
    strict: Field<bool>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// The responses API's `tool_choice`: a word or a named function.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum ResponsesToolChoice {
    Word(ChoiceWord),
    Function(ResponsesFunctionChoice),
}

/// `{"type": "function", "name": ...}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct ResponsesFunctionChoice {
    #[serde(rename = "type")]
    #[schema(value_type = FunctionType, required)]
    kind: Field<String>,
    #[schema(value_type = String, required)]
    name: Field<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// The responses API's `tools` in chat's shape.
pub(crate) fn responses_tools(v: &Field<Vec<Value>>) -> Result<Vec<Value>, ApiError> {
    read_list(
        v,
        "{\"type\": \"function\", \"name\": ...}",
        |t: ResponsesTool, at| {
            match t.kind {
                Field::Given(k) if k == "function" => {}
                Field::Given(other) => {
                    return Err(ApiError::bad(
                        format!("{at}.type"),
                        format!("tool type `{other}` is not supported: only `function`"),
                    ))
                }
                _ => {
                    return Err(ApiError::bad(
                        format!("{at}.type"),
                        format!("`{at}.type` is required (`function`)"),
                    ))
                }
            }
            no_extra(&t.extra, at, |k| format!("unknown field `{k}` in `{at}`"))?;
            let mut f = Map::new();
            if let Some(d) = typed(t.description, &format!("{at}.description"), "a string")? {
                f.insert("description".into(), json!(d));
            }
            let p = typed(
                t.parameters,
                &format!("{at}.parameters"),
                "a JSON schema object",
            )?;
            if let Some(p) = p {
                f.insert("parameters".into(), Value::Object(p));
            }
            if let Some(s) = typed(t.strict, &format!("{at}.strict"), "a boolean")? {
                f.insert("strict".into(), json!(s));
            }
            Ok((f, t.name))
        },
    )
}

/// The responses API's `tool_choice`: `none`, `auto`, `required` or `{"type":
/// "function", "name": ...}`.
pub(crate) fn responses_tool_choice(
    c: Field<ResponsesToolChoice>,
) -> Result<Option<ToolChoice>, ApiError> {
    const P: &str = "tool_choice";
    let shape = || {
        ApiError::bad(
            P,
            "`tool_choice` must be `none`, `auto`, `required` or \
             `{\"type\": \"function\", \"name\": ...}`",
        )
    };
    let c = match c {
        Field::Absent => return Ok(None),
        Field::Wrong => return Err(shape()),
        Field::Given(ResponsesToolChoice::Word(w)) => return Ok(Some(w.into())),
        Field::Given(ResponsesToolChoice::Function(c)) => c,
    };
    match c.kind {
        Field::Given(k) if k == "function" => {}
        Field::Given(t) => {
            return Err(ApiError::bad(
                "tool_choice.type",
                format!("`tool_choice` type `{t}` is not supported: only `function`"),
            ))
        }
        _ => return Err(shape()),
    }
    no_extra(&c.extra, P, |k| {
        format!("unknown field `{k}` in `tool_choice`")
    })?;
    match c.name {
        Field::Given(name) => Ok(Some(ToolChoice::Named(name))),
        _ => Err(shape()),
    }
}

/// An Anthropic tool `type`: a client tool.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) enum CustomType {
    #[schema(rename = "custom")]
    Custom,
}

/// An Anthropic (client) tool: `{"name", "description", "input_schema"}`; `strict`,
/// `eager_input_streaming`, `defer_loading: false`, no `input_examples` and
/// `cache_control` are accepted as no-ops.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct AnthropicTool {
    #[serde(rename = "type")]
    #[schema(value_type = Option<CustomType>)]
    kind: Field<Value>,
    #[schema(value_type = String, required)]
    name: Field<String>,
    #[schema(value_type = Option<String>)]
    description: Field<String>,
    /// A JSON schema of `type` `object`.
    #[schema(value_type = Object, required)]
    input_schema: Field<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    cache_control: Field<Value>,
    #[schema(value_type = Option<bool>)]
    strict: Field<bool>,
    #[schema(value_type = Option<bool>)]
    eager_input_streaming: Field<bool>,
    /// Only `false`.
    #[schema(value_type = Option<bool>)]
    defer_loading: Field<bool>,
    /// Only empty.
    #[schema(value_type = Option<Vec<Object>>)]
    input_examples: Field<Vec<Value>>,
    /// Refused.
    #[schema(value_type = Option<Vec<String>>)]
    allowed_callers: Field<Value>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// How an Anthropic `tool_choice` chooses.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
pub(crate) enum AnthropicChoiceType {
    Auto,
    Any,
    Tool,
    None,
}

/// Anthropic's `tool_choice`: `{"type": "auto" | "any" | "tool" | "none", "name",
/// "disable_parallel_tool_use"}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct AnthropicToolChoice {
    #[serde(rename = "type")]
    #[schema(value_type = AnthropicChoiceType, required)]
    kind: Field<String>,
    /// The tool of `type` `tool`.
    #[schema(value_type = Option<String>)]
    name: Field<String>,
    #[schema(value_type = Option<bool>)]
    disable_parallel_tool_use: Field<bool>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// Anthropic's `tools` (client tools) in chat's shape.
pub(crate) fn anthropic_tools(v: &Field<Vec<Value>>) -> Result<Vec<Value>, ApiError> {
    read_list(
        v,
        "{\"name\", \"description\", \"input_schema\"}",
        |t: AnthropicTool, at| {
            match &t.kind {
                Field::Given(x) if x == "custom" => {}
                Field::Given(x) => {
                    return Err(ApiError::bad(
                        format!("{at}.type"),
                        format!("tool type {x} is not supported: only client tools (`custom`)"),
                    ))
                }
                _ => {}
            }
            no_extra(&t.extra, at, |k| format!("unknown field `{k}` in `{at}`"))?;
            // Accepted as no-ops: `strict` (a forced call follows the schema; others are
            // read as written), `eager_input_streaming` (a call's input always streams as
            // it is written), `defer_loading: false`, no `input_examples`; refused
            // otherwise.
            for (k, ok) in [
                ("strict", !matches!(t.strict, Field::Wrong)),
                (
                    "eager_input_streaming",
                    !matches!(t.eager_input_streaming, Field::Wrong),
                ),
                (
                    "defer_loading",
                    matches!(t.defer_loading, Field::Absent | Field::Given(false)),
                ),
                (
                    "input_examples",
                    match &t.input_examples {
                        Field::Absent => true,
                        Field::Given(v) => v.is_empty(),
                        Field::Wrong => false,
                    },
                ),
                ("allowed_callers", !t.allowed_callers.is_given()),
            ] {
                if !ok {
                    return Err(ApiError::bad(
                        format!("{at}.{k}"),
                        format!("`{at}.{k}` is not supported with this value"),
                    ));
                }
            }
            let schema = match t.input_schema {
                Field::Given(s) if s.get("type").and_then(Value::as_str) == Some("object") => s,
                _ => {
                    return Err(ApiError::bad(
                        format!("{at}.input_schema"),
                        format!(
                        "`{at}.input_schema` is required: a JSON schema object of `type` `object`"
                    ),
                    ))
                }
            };
            let mut f = Map::new();
            if let Some(d) = typed(t.description, &format!("{at}.description"), "a string")? {
                f.insert("description".into(), json!(d));
            }
            f.insert("parameters".into(), Value::Object(schema));
            Ok((f, t.name))
        },
    )
}

/// Anthropic's `tool_choice`: the choice and whether calls may be parallel.
pub(crate) fn anthropic_tool_choice(
    c: Field<AnthropicToolChoice>,
) -> Result<(Option<ToolChoice>, bool), ApiError> {
    const P: &str = "tool_choice";
    let c = match c {
        Field::Absent => return Ok((None, true)),
        Field::Wrong => {
            return Err(ApiError::bad(
                P,
                "`tool_choice` must be an object with a `type`",
            ))
        }
        Field::Given(c) => c,
    };
    let parallel = match c.disable_parallel_tool_use {
        Field::Absent => true,
        Field::Given(b) => !b,
        Field::Wrong => {
            return Err(ApiError::bad(
                "tool_choice.disable_parallel_tool_use",
                "`tool_choice.disable_parallel_tool_use` must be a boolean",
            ))
        }
    };
    let unknown = |k: &str| format!("unknown field `{k}` in `tool_choice`");
    let kind = match &c.kind {
        Field::Given(k) => k.as_str(),
        _ => "",
    };
    // The keys each type has besides `type`.
    let (choice, name, parallel_key) = match kind {
        "auto" => (ToolChoice::Auto, false, true),
        "any" => (ToolChoice::Required, false, true),
        "none" => (ToolChoice::None, false, false),
        "tool" => (ToolChoice::Named(String::new()), true, true),
        _ => {
            return Err(ApiError::bad(
                "tool_choice.type",
                "`tool_choice.type` must be `auto`, `any`, `tool` or `none`",
            ))
        }
    };
    no_extra(&c.extra, P, unknown)?;
    if !name && c.name.is_given() {
        return Err(ApiError::bad("tool_choice.name", unknown("name")));
    }
    if !parallel_key && c.disable_parallel_tool_use.is_given() {
        let k = "disable_parallel_tool_use";
        return Err(ApiError::bad(format!("{P}.{k}"), unknown(k)));
    }
    let choice = match choice {
        ToolChoice::Named(_) => match c.name {
            Field::Given(n) => ToolChoice::Named(n),
            _ => {
                return Err(ApiError::bad(
                    "tool_choice.name",
                    "`tool_choice` `tool` needs a `name`",
                ))
            }
        },
        other => other,
    };
    Ok((Some(choice), parallel))
}

/// The objects of this module, whose schemas `/openapi.json` closes.
pub(crate) const CLOSED: [&str; 4] = [
    "ResponsesTool",
    "ResponsesFunctionChoice",
    "AnthropicTool",
    "AnthropicToolChoice",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn param<T>(r: Result<T, ApiError>) -> String {
        r.err()
            .and_then(|e| e.param)
            .unwrap_or_default()
            .into_owned()
    }

    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn responses_tools_and_choices() {
        let tools = |v: Value| responses_tools(&typed(v));
        let f = json!({"type": "function", "name": "f", "description": "d",
                       "parameters": {"type": "object"}, "strict": true});
        let defs = tools(json!([f])).unwrap();
        assert_eq!(
            defs[0],
            json!({"type": "function", "function": {"description": "d",
                   "parameters": {"type": "object"}, "strict": true, "name": "f"}})
        );
        for (v, want) in [
            (json!({}), "tools"),
            (json!([5]), "tools[0]"),
            (json!([{"name": "f"}]), "tools[0].type"),
            (json!([{"type": "web_search"}]), "tools[0].type"),
            (
                json!([{"type": "function", "name": "f", "x": 1}]),
                "tools[0].x",
            ),
            (
                json!([{"type": "function", "name": "f", "parameters": 1}]),
                "tools[0].parameters",
            ),
            (
                json!([{"type": "function", "name": "a b"}]),
                "tools[0].name",
            ),
            (json!([{"type": "function"}]), "tools[0].name"),
        ] {
            assert_eq!(param(tools(v.clone())), want, "{v}");
        }
        let choice = |v: Value| responses_tool_choice(typed(v));
        assert_eq!(
            choice(json!("required")).unwrap(),
            Some(ToolChoice::Required)
        );
        assert_eq!(
            choice(json!({"type": "function", "name": "f"})).unwrap(),
            Some(ToolChoice::Named("f".into()))
        );
        assert_eq!(choice(json!(null)).unwrap(), None);
        assert_eq!(param(choice(json!("always"))), "tool_choice");
        assert_eq!(param(choice(json!({"type": "mcp"}))), "tool_choice.type");
        assert_eq!(param(choice(json!({"type": "function"}))), "tool_choice");
        assert_eq!(
            param(choice(json!({"type": "function", "name": "f", "x": 1}))),
            "tool_choice.x"
        );
    }

    #[test]
    fn anthropic_tools_and_choices() {
        let tools = |v: Value| anthropic_tools(&typed(v));
        let t = json!({"name": "f", "input_schema": {"type": "object"}, "cache_control": {},
                       "strict": true, "defer_loading": false, "input_examples": []});
        let defs = tools(json!([t])).unwrap();
        assert_eq!(
            defs[0],
            json!({"type": "function", "function": {"parameters": {"type": "object"}, "name": "f"}})
        );
        let schema = json!({"type": "object"});
        for (v, want) in [
            (
                json!([{"name": "f", "input_schema": schema, "type": "bash"}]),
                "tools[0].type",
            ),
            (
                json!([{"name": "f", "input_schema": schema, "x": 1}]),
                "tools[0].x",
            ),
            (
                json!([{"name": "f", "input_schema": schema, "strict": 1}]),
                "tools[0].strict",
            ),
            (
                json!([{"name": "f", "input_schema": schema, "defer_loading": true}]),
                "tools[0].defer_loading",
            ),
            (
                json!([{"name": "f", "input_schema": schema, "input_examples": [{}]}]),
                "tools[0].input_examples",
            ),
            (
                json!([{"name": "f", "input_schema": schema, "allowed_callers": []}]),
                "tools[0].allowed_callers",
            ),
            (
                json!([{"name": "f", "input_schema": {}}]),
                "tools[0].input_schema",
            ),
            (
                json!([{"name": "f", "input_schema": schema, "description": 1}]),
                "tools[0].description",
            ),
            (json!([{"input_schema": schema}]), "tools[0].name"),
        ] {
            assert_eq!(param(tools(v.clone())), want, "{v}");
        }
        let choice = |v: Value| anthropic_tool_choice(typed(v));
        assert_eq!(
            choice(json!({"type": "any", "disable_parallel_tool_use": true})).unwrap(),
            (Some(ToolChoice::Required), false)
        );
        assert_eq!(
            choice(json!({"type": "tool", "name": "f"})).unwrap(),
            (Some(ToolChoice::Named("f".into())), true)
        );
        for (v, want) in [
            (json!("auto"), "tool_choice"),
            (json!({"type": "some"}), "tool_choice.type"),
            (json!({"type": "tool"}), "tool_choice.name"),
            (json!({"type": "auto", "name": "f"}), "tool_choice.name"),
            (
                json!({"type": "none", "disable_parallel_tool_use": true}),
                "tool_choice.disable_parallel_tool_use",
            ),
            (
                json!({"type": "auto", "disable_parallel_tool_use": 1}),
                "tool_choice.disable_parallel_tool_use",
            ),
            (json!({"type": "auto", "x": 1}), "tool_choice.x"),
        ] {
            assert_eq!(param(choice(v.clone())), want, "{v}");
        }
    }
}
