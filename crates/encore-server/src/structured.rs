//! Structured outputs as a request gives them: OpenAI's `response_format`, vLLM's
//! `structured_outputs` and its older `guided_*` spellings, read into the one
//! [`Constraint`] the engine compiles at admission. Shapes are checked here; what a
//! schema, regex or grammar says, at admission.

use encore_core::request::Constraint;
use serde_json::Value;

use crate::body::{known_keys, Field};
use crate::error::ApiError;

/// How one structured-output field reads: its value to the constraint it asks for
/// (`None`: none, e.g. `response_format` `text`).
pub(crate) type ReadConstraint = fn(&'static str, &Value) -> Result<Option<Constraint>, ApiError>;

/// The output's constraint from whichever structured-output field the body gave (at
/// most one), and that field's name (for admission's refusal of a schema, regex or
/// grammar it cannot compile). Shapes are checked here; what they say, at admission.
pub(crate) fn constraint(
    fields: [(&'static str, Field<Value>, ReadConstraint); 6],
) -> Result<(Option<Constraint>, &'static str), ApiError> {
    let mut found: Option<(Constraint, &'static str)> = None;
    for (name, f, read) in fields {
        let Field::Given(v) = f else { continue };
        let c = read(name, &v)?;
        let Some(c) = c else { continue };
        if let Some((_, first)) = &found {
            let m = format!(
                "give one structured-output field: `{first}` and `{name}` both constrain the output"
            );
            return Err(ApiError::bad(name, m));
        }
        found = Some((c, name));
    }
    Ok(match found {
        Some((c, name)) => (Some(c), name),
        None => (None, "response_format"),
    })
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object`, or `json_schema`
/// with its `schema` (`name`, `description` and `strict` are accepted; the output
/// always follows the schema).
pub(crate) fn response_format(v: &Value) -> Result<Option<Constraint>, ApiError> {
    const P: &str = "response_format";
    let o = v
        .as_object()
        .ok_or_else(|| ApiError::bad(P, "`response_format` must be an object with a `type`"))?;
    match o.get("type").and_then(Value::as_str) {
        Some("text") => known_keys(o, &["type"], P).map(|_| None),
        Some("json_object") => known_keys(o, &["type"], P).map(|_| Some(Constraint::JsonObject)),
        Some("json_schema") => {
            known_keys(o, &["type", "json_schema"], P)?;
            const S: &str = "response_format.json_schema";
            let js = o
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    ApiError::bad(S, "`json_schema` must be an object with a `schema`")
                })?;
            known_keys(js, &["name", "description", "schema", "strict"], S)?;
            let schema = js
                .get("schema")
                .filter(|s| !s.is_null())
                .ok_or_else(|| ApiError::bad(S, "`json_schema` needs a `schema`"))?;
            Ok(Some(json_schema(
                "response_format.json_schema.schema",
                schema,
            )?))
        }
        Some(t) => Err(ApiError::bad(
            "response_format.type",
            format!("`response_format` type `{t}` is not one of text, json_object, json_schema"),
        )),
        None => Err(ApiError::bad(P, "`response_format` needs a string `type`")),
    }
}

/// vLLM's `structured_outputs`: one of `json` (a schema), `json_object: true`, `regex`,
/// `choice`, `grammar` (Lark).
pub(crate) fn structured_outputs(v: &Value) -> Result<Option<Constraint>, ApiError> {
    const P: &str = "structured_outputs";
    let o = v
        .as_object()
        .ok_or_else(|| ApiError::bad(P, "`structured_outputs` must be an object"))?;
    known_keys(o, &["json", "json_object", "regex", "choice", "grammar"], P)?;
    let mut found = Vec::new();
    for (k, x) in o.iter().filter(|(_, x)| !x.is_null()) {
        found.push(match k.as_str() {
            "json" => json_schema("structured_outputs.json", x)?,
            "regex" => Constraint::Regex(string("structured_outputs.regex", x)?),
            "choice" => choice("structured_outputs.choice", x)?,
            "grammar" => Constraint::Lark(string("structured_outputs.grammar", x)?),
            _ => match x {
                Value::Bool(true) => Constraint::JsonObject,
                Value::Bool(false) => continue,
                _ => {
                    let m = "`json_object` must be a boolean";
                    return Err(ApiError::bad("structured_outputs.json_object", m));
                }
            },
        });
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(ApiError::bad(
            P,
            "give one of `json`, `json_object`, `regex`, `choice`, `grammar`",
        )),
    }
}

/// A JSON schema given as an object or as its text.
pub(crate) fn json_schema(name: &'static str, v: &Value) -> Result<Constraint, ApiError> {
    match v {
        Value::Object(_) => Ok(Constraint::JsonSchema(v.to_string())),
        Value::String(s) => Ok(Constraint::JsonSchema(s.clone())),
        _ => Err(ApiError::bad(
            name,
            format!("`{name}` must be a JSON schema object"),
        )),
    }
}

pub(crate) fn string(name: &'static str, v: &Value) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad(name, format!("`{name}` must be a string")))
}

pub(crate) fn choice(name: &'static str, v: &Value) -> Result<Constraint, ApiError> {
    let rule = || {
        ApiError::bad(
            name,
            format!("`{name}` must be a non-empty list of strings"),
        )
    };
    let list = v.as_array().filter(|a| !a.is_empty()).ok_or_else(rule)?;
    list.iter()
        .map(|x| x.as_str().map(str::to_string).ok_or_else(rule))
        .collect::<Result<Vec<_>, _>>()
        .map(Constraint::Choice)
}
