//! Structured outputs as a request gives them, typed: OpenAI's `response_format`, the
//! responses API's `text` (its `format`), vLLM's `structured_outputs` and its older
//! `guided_*` spellings, read into the one [`Constraint`] the engine compiles at
//! admission. Shapes are checked here; what a schema, regex or grammar says, at
//! admission. A schema given by the client stays a JSON value (or its text).

use encore_core::request::Constraint;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::field::Field;
use crate::request_tools::{no_extra, typed, Extra};

/// A JSON schema: an object, or its text.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum Schema {
    Object(Map<String, Value>),
    Text(String),
}

impl utoipa::PartialSchema for Schema {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::Object))
            .item(ObjectBuilder::new().schema_type(Type::String))
            .description(Some("A JSON schema, or its text."))
            .into()
    }
}

impl ToSchema for Schema {}

impl Schema {
    fn constraint(self) -> Constraint {
        match self {
            Schema::Object(o) => Constraint::JsonSchema(Value::Object(o).to_string()),
            Schema::Text(s) => Constraint::JsonSchema(s),
        }
    }
}

/// A format's `type`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "snake_case")]
pub(crate) enum FormatType {
    Text,
    JsonObject,
    JsonSchema,
}

/// OpenAI's `response_format`: `{"type": "text" | "json_object"}` or `{"type":
/// "json_schema", "json_schema": {...}}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct ResponseFormat {
    #[serde(rename = "type")]
    #[schema(value_type = FormatType, required)]
    kind: Field<String>,
    /// With `type` `json_schema`.
    #[schema(value_type = Option<JsonSchemaFormat>)]
    json_schema: Field<JsonSchemaFormat>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// `response_format.json_schema`: the `schema` (`name`, `description` and `strict` are
/// accepted; the output always follows the schema).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct JsonSchemaFormat {
    #[schema(value_type = Option<String>)]
    name: Field<String>,
    #[schema(value_type = Option<String>)]
    description: Field<String>,
    #[schema(value_type = Schema, required)]
    schema: Field<Schema>,
    #[schema(value_type = Option<bool>)]
    strict: Field<bool>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// The responses API's `text`: its `format` (and `verbosity`, only `medium`).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct TextParam {
    #[schema(value_type = Option<TextFormat>)]
    format: Field<TextFormat>,
    /// Only `medium`.
    #[schema(value_type = Option<String>)]
    verbosity: Field<Value>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// `text.format`: `{"type": "text" | "json_object"}` or `{"type": "json_schema", "name",
/// "schema", "description", "strict"}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct TextFormat {
    #[serde(rename = "type")]
    #[schema(value_type = FormatType, required)]
    kind: Field<String>,
    #[schema(value_type = Option<String>)]
    name: Field<String>,
    /// With `type` `json_schema`.
    #[schema(value_type = Option<Schema>)]
    schema: Field<Schema>,
    #[schema(value_type = Option<String>)]
    description: Field<String>,
    #[schema(value_type = Option<bool>)]
    strict: Field<bool>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// vLLM's `structured_outputs`: one of `json` (a schema), `json_object: true`, `regex`,
/// `choice`, `grammar` (Lark).
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct StructuredOutputs {
    #[schema(value_type = Option<Schema>)]
    json: Field<Schema>,
    #[schema(value_type = Option<bool>)]
    json_object: Field<bool>,
    #[schema(value_type = Option<String>)]
    regex: Field<String>,
    #[schema(value_type = Option<Vec<String>>)]
    choice: Field<Vec<String>>,
    #[schema(value_type = Option<String>)]
    grammar: Field<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    extra: Extra,
}

/// The objects of this module, whose schemas `/openapi.json` closes.
pub(crate) const CLOSED: [&str; 5] = [
    "ResponseFormat",
    "JsonSchemaFormat",
    "TextParam",
    "TextFormat",
    "StructuredOutputs",
];

/// One structured-output field as read: `None` when absent, else its constraint (`None`:
/// none, e.g. `response_format` `text`) or its refusal.
pub(crate) type Read = Option<Result<Option<Constraint>, ApiError>>;

/// Read field `f` with `read`; `wrong` refuses a value of the wrong type.
pub(crate) fn read_field<T>(
    f: Field<T>,
    wrong: impl FnOnce() -> ApiError,
    read: impl FnOnce(T) -> Result<Option<Constraint>, ApiError>,
) -> Read {
    match f {
        Field::Absent => None,
        Field::Wrong => Some(Err(wrong())),
        Field::Given(x) => Some(read(x)),
    }
}

/// The output's constraint from whichever structured-output field the body gave (at
/// most one; each read in order), and that field's name (for admission's refusal of a
/// schema, regex or grammar it cannot compile).
pub(crate) fn constraint(
    fields: [(&'static str, Read); 6],
) -> Result<(Option<Constraint>, &'static str), ApiError> {
    let mut found: Option<(Constraint, &'static str)> = None;
    for (name, r) in fields {
        let Some(r) = r else { continue };
        let Some(c) = r? else { continue };
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

/// The first of `given` (field names, whether given) that is, refused as an unknown
/// field of `at`.
fn none_of(given: &[(&str, bool)], at: &str) -> Result<(), ApiError> {
    match given.iter().find(|(_, g)| *g) {
        Some((k, _)) => Err(ApiError::bad(
            format!("{at}.{k}"),
            format!("unknown field `{k}` in `{at}`"),
        )),
        None => Ok(()),
    }
}

/// `response_format`.
pub(crate) fn response_format(f: Field<ResponseFormat>) -> Read {
    const P: &str = "response_format";
    read_field(
        f,
        || ApiError::bad(P, "`response_format` must be an object with a `type`"),
        |o| {
            let unknown = |k: &str| format!("unknown field `{k}` in `{P}`");
            let kind = match o.kind {
                Field::Given(k) => k,
                _ => return Err(ApiError::bad(P, "`response_format` needs a string `type`")),
            };
            let plain = |c| {
                no_extra(&o.extra, P, unknown)?;
                none_of(&[("json_schema", o.json_schema.is_given())], P)?;
                Ok(c)
            };
            match kind.as_str() {
                "text" => plain(None),
                "json_object" => plain(Some(Constraint::JsonObject)),
                "json_schema" => {
                    no_extra(&o.extra, P, unknown)?;
                    const S: &str = "response_format.json_schema";
                    let Field::Given(js) = o.json_schema else {
                        return Err(ApiError::bad(
                            S,
                            "`json_schema` must be an object with a `schema`",
                        ));
                    };
                    no_extra(&js.extra, S, |k| format!("unknown field `{k}` in `{S}`"))?;
                    typed(js.name, "response_format.json_schema.name", "a string")?;
                    typed(
                        js.description,
                        "response_format.json_schema.description",
                        "a string",
                    )?;
                    typed(js.strict, "response_format.json_schema.strict", "a boolean")?;
                    let s = "response_format.json_schema.schema";
                    match js.schema {
                        Field::Absent => Err(ApiError::bad(S, "`json_schema` needs a `schema`")),
                        Field::Wrong => Err(not_a_schema(s)),
                        Field::Given(x) => Ok(Some(x.constraint())),
                    }
                }
                t => Err(ApiError::bad(
                    "response_format.type",
                    format!(
                        "`response_format` type `{t}` is not one of text, json_object, json_schema"
                    ),
                )),
            }
        },
    )
}

/// The refusal of a schema of the wrong type.
fn not_a_schema(name: &str) -> ApiError {
    ApiError::bad(
        name.to_string(),
        format!("`{name}` must be a JSON schema object"),
    )
}

/// The responses API's `text` (given as `v`): what the response repeats, and the
/// output's constraint.
pub(crate) fn text(v: Option<Value>) -> Result<(Value, Option<Constraint>), ApiError> {
    let plain = serde_json::json!({"format": {"type": "text"}});
    let Some(v) = v else { return Ok((plain, None)) };
    // The format as given is repeated; its typed reading is checked.
    let format = v.get("format").filter(|f| !f.is_null()).cloned();
    let t: Field<TextParam> = serde_json::from_value(v).unwrap_or(Field::Wrong);
    let Field::Given(t) = t else {
        return Err(ApiError::bad(
            "text",
            "`text` must be an object with a `format`",
        ));
    };
    no_extra(&t.extra, "text", |k| {
        format!("unknown field `{k}` in `text`")
    })?;
    if let Field::Given(x) = &t.verbosity {
        if x != "medium" {
            let m = "`text.verbosity` other than `medium` is not supported";
            return Err(ApiError::bad("text.verbosity", m));
        }
    }
    const P: &str = "text.format";
    let fo = match t.format {
        Field::Absent => return Ok((plain, None)),
        Field::Wrong => {
            return Err(ApiError::bad(
                P,
                "`text.format` must be an object with a `type`",
            ))
        }
        Field::Given(fo) => fo,
    };
    let unknown = |k: &str| format!("unknown field `{k}` in `{P}`");
    let kind = match fo.kind {
        Field::Given(k) => k,
        _ => return Err(ApiError::bad(P, "`text.format` needs a string `type`")),
    };
    let others = [
        ("name", fo.name.is_given()),
        ("schema", fo.schema.is_given()),
        ("description", fo.description.is_given()),
        ("strict", fo.strict.is_given()),
    ];
    let constraint = match kind.as_str() {
        "text" | "json_object" => {
            no_extra(&fo.extra, P, unknown)?;
            none_of(&others, P)?;
            (kind == "json_object").then_some(Constraint::JsonObject)
        }
        "json_schema" => {
            no_extra(&fo.extra, P, unknown)?;
            typed(fo.name, "text.format.name", "a string")?;
            typed(fo.description, "text.format.description", "a string")?;
            typed(fo.strict, "text.format.strict", "a boolean")?;
            match fo.schema {
                Field::Absent => {
                    return Err(ApiError::bad(
                        "text.format.schema",
                        "`json_schema` needs a `schema`",
                    ))
                }
                Field::Wrong => return Err(not_a_schema("text.format.schema")),
                Field::Given(s) => Some(s.constraint()),
            }
        }
        t => {
            return Err(ApiError::bad(
                "text.format.type",
                format!("`text.format` type `{t}` is not one of text, json_object, json_schema"),
            ))
        }
    };
    Ok((serde_json::json!({ "format": format }), constraint))
}

/// `structured_outputs`.
pub(crate) fn structured_outputs(f: Field<StructuredOutputs>) -> Read {
    const P: &str = "structured_outputs";
    read_field(
        f,
        || ApiError::bad(P, "`structured_outputs` must be an object"),
        |o| {
            no_extra(&o.extra, P, |k| format!("unknown field `{k}` in `{P}`"))?;
            let found = [
                schema(o.json, "structured_outputs.json"),
                match o.json_object {
                    Field::Absent | Field::Given(false) => None,
                    Field::Given(true) => Some(Ok(Some(Constraint::JsonObject))),
                    Field::Wrong => Some(Err(ApiError::bad(
                        "structured_outputs.json_object",
                        "`json_object` must be a boolean",
                    ))),
                },
                regex(o.regex, "structured_outputs.regex"),
                choice(o.choice, "structured_outputs.choice"),
                grammar(o.grammar, "structured_outputs.grammar"),
            ];
            let mut out = Vec::new();
            for r in found.into_iter().flatten() {
                out.extend(r?);
            }
            match out.len() {
                0 => Ok(None),
                1 => Ok(out.pop()),
                _ => Err(ApiError::bad(
                    P,
                    "give one of `json`, `json_object`, `regex`, `choice`, `grammar`",
                )),
            }
        },
    )
}

/// A JSON schema field (`guided_json`, `structured_outputs.json`).
pub(crate) fn schema(f: Field<Schema>, name: &'static str) -> Read {
    read_field(f, || not_a_schema(name), |s| Ok(Some(s.constraint())))
}

/// A string field's refusal.
fn not_a_string(name: &'static str) -> ApiError {
    ApiError::bad(name, format!("`{name}` must be a string"))
}

/// A regex field (`guided_regex`, `structured_outputs.regex`).
pub(crate) fn regex(f: Field<String>, name: &'static str) -> Read {
    read_field(f, || not_a_string(name), |r| Ok(Some(Constraint::Regex(r))))
}

/// A Lark grammar field (`guided_grammar`, `structured_outputs.grammar`).
pub(crate) fn grammar(f: Field<String>, name: &'static str) -> Read {
    read_field(f, || not_a_string(name), |g| Ok(Some(Constraint::Lark(g))))
}

/// A choice field (`guided_choice`, `structured_outputs.choice`): a non-empty list of
/// strings.
pub(crate) fn choice(f: Field<Vec<String>>, name: &'static str) -> Read {
    let rule = move || {
        ApiError::bad(
            name,
            format!("`{name}` must be a non-empty list of strings"),
        )
    };
    read_field(f, rule, |c| {
        if c.is_empty() {
            return Err(rule());
        }
        Ok(Some(Constraint::Choice(c)))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn param(r: Read) -> String {
        match r {
            Some(Err(e)) => e.param.unwrap_or_default().into_owned(),
            _ => String::new(),
        }
    }

    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn formats_read_and_refuse_naming_the_field() {
        let rf = |v: Value| response_format(typed(v));
        assert!(matches!(rf(json!({"type": "text"})), Some(Ok(None))));
        assert!(matches!(
            rf(json!({"type": "json_schema", "json_schema": {"name": "p", "schema": "{}"}})),
            Some(Ok(Some(Constraint::JsonSchema(s)))) if s == "{}"
        ));
        for (v, want) in [
            (json!(5), "response_format"),
            (json!({}), "response_format"),
            (json!({"type": "xml"}), "response_format.type"),
            (json!({"type": "text", "x": 1}), "response_format.x"),
            (
                json!({"type": "text", "json_schema": {}}),
                "response_format.json_schema",
            ),
            (
                json!({"type": "json_schema"}),
                "response_format.json_schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": {}, "x": 1}}),
                "response_format.json_schema.x",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": 5}}),
                "response_format.json_schema.schema",
            ),
        ] {
            assert_eq!(param(rf(v.clone())), want, "{v}");
        }
        let so = |v: Value| structured_outputs(typed(v));
        assert!(matches!(
            so(json!({"choice": ["a"], "json_object": false})),
            Some(Ok(Some(Constraint::Choice(_))))
        ));
        for (v, want) in [
            (json!([]), "structured_outputs"),
            (json!({"x": 1}), "structured_outputs.x"),
            (json!({"regex": 1}), "structured_outputs.regex"),
            (json!({"choice": []}), "structured_outputs.choice"),
            (json!({"json_object": 1}), "structured_outputs.json_object"),
            (json!({"json": 1}), "structured_outputs.json"),
            (json!({"grammar": "g", "regex": "r"}), "structured_outputs"),
        ] {
            assert_eq!(param(so(v.clone())), want, "{v}");
        }
        let text_param = |v: Value| text(Some(v)).err().and_then(|e| e.param);
        for (v, want) in [
            (json!(5), "text"),
            (json!({"x": 1}), "text.x"),
            (json!({"verbosity": "low"}), "text.verbosity"),
            (json!({"format": 5}), "text.format"),
            (
                json!({"format": {"type": "text", "name": "n"}}),
                "text.format.name",
            ),
            (
                json!({"format": {"type": "json_schema"}}),
                "text.format.schema",
            ),
            (json!({"format": {"type": "yaml"}}), "text.format.type"),
        ] {
            assert_eq!(text_param(v.clone()).as_deref(), Some(want), "{v}");
        }
        let (echo, c) = text(Some(json!({"format": {"type": "json_object"}}))).unwrap();
        assert_eq!(echo, json!({"format": {"type": "json_object"}}));
        assert_eq!(c, Some(Constraint::JsonObject));
    }
}
