//! Tool calling's request side: `tools`, `tool_choice` and `parallel_tool_calls` read and
//! checked at the edge, the tools the chat template renders, and the grammar
//! `tool_choice` `required` or a named function puts on the output (format-independent,
//! as vLLM's: `required` is a JSON list of `{"name", "parameters"}` objects, one per call,
//! each tool's `$defs` carried into the combined schema; a named function's output is its
//! arguments).

use encore_core::request::Constraint;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::field::Field;
use crate::request_tools::{no_extra, typed, ChatTool, ChatToolChoice, ChoiceWord};

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// No call: the tools are not rendered and the output is all content.
    None,
    /// The model decides; its calls are read from its own format.
    Auto,
    /// At least one call, forced by a grammar.
    Required,
    /// A call of this function, forced by a grammar.
    Named(String),
}

/// A request's tools.
#[derive(Clone, Debug)]
pub(crate) struct Tools {
    /// As given (`{"type": "function", "function": {...}}` each), for the template.
    pub defs: Vec<Value>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: more than one call allowed (default `true`).
    pub parallel: bool,
}

/// The longest function name (OpenAI's limit).
const MAX_NAME: usize = 64;

impl Tools {
    /// Read `tools`, `tool_choice` and `parallel_tool_calls`. `None` when there are no
    /// tools and the choice is absent or `none`.
    pub fn read(
        tools: Field<Vec<Value>>,
        choice: Field<ChatToolChoice>,
        parallel: Field<bool>,
    ) -> Result<Option<Tools>, ApiError> {
        let parallel = parallel
            .get("parallel_tool_calls", || {
                "`parallel_tool_calls` must be a boolean".into()
            })?
            .unwrap_or(true);
        let defs = tools
            .get("tools", || {
                "`tools` must be a list of `{\"type\": \"function\", \"function\": {...}}`".into()
            })?
            .unwrap_or_default();
        let mut names = Vec::new();
        for (i, t) in defs.iter().enumerate() {
            // The tool as given stays for the template; its typed reading is checked.
            let typed = serde_json::from_value(t.clone()).unwrap_or(Field::Wrong);
            let name = tool(i, typed)?;
            if names.contains(&name) {
                return Err(ApiError::bad(
                    format!("tools[{i}].function.name"),
                    format!("two tools are named `{name}`"),
                ));
            }
            names.push(name);
        }
        let choice = tool_choice(choice)?;
        Tools::assemble(defs, choice, parallel, "tool_choice")
    }

    /// Tools already checked, in chat's shape (`{"type": "function", "function": {...}}`
    /// each, names unique), with the choice given (`None`: absent, `auto` when there are
    /// tools) and named `choice_param` in the request. `None` when there are no tools and
    /// the choice is absent or `none`.
    pub fn assemble(
        defs: Vec<Value>,
        choice: Option<ToolChoice>,
        parallel: bool,
        choice_param: &'static str,
    ) -> Result<Option<Tools>, ApiError> {
        let choice = match choice {
            None if defs.is_empty() => ToolChoice::None,
            None => ToolChoice::Auto,
            Some(c) => c,
        };
        if defs.is_empty() {
            return match choice {
                ToolChoice::None => Ok(None),
                _ => Err(ApiError::bad(
                    choice_param,
                    format!("`{choice_param}` other than `none` needs `tools`"),
                )),
            };
        }
        let t = Tools {
            defs,
            choice,
            parallel,
        };
        if let ToolChoice::Named(name) = &t.choice {
            if t.function(name).is_none() {
                return Err(ApiError::bad(
                    choice_param,
                    format!(
                        "`{choice_param}` names the function `{name}`, which is not in `tools`"
                    ),
                ));
            }
        }
        Ok(Some(t))
    }

    /// The function definition named `name`.
    fn function(&self, name: &str) -> Option<&Map<String, Value>> {
        self.defs
            .iter()
            .filter_map(|t| t["function"].as_object())
            .find(|f| f["name"] == name)
    }

    /// The grammar `tool_choice` puts on the output, if any. When there is one it wins
    /// over a structured-output format the request also gives (`response_format`,
    /// `text.format`, `output_config.format`), as OpenAI has it: the output is then a
    /// call, constrained by its tool's schema, and the format would only apply to a text
    /// answer, which a forced call leaves no room for (instructor's responses mode and
    /// the openai client's `parse` with tools send both).
    pub fn constraint(&self) -> Option<Constraint> {
        // A function without parameters takes none: `{}`.
        let params = |f: &Map<String, Value>| {
            f.get("parameters")
                .filter(|p| !p.is_null())
                .cloned()
                .unwrap_or_else(
                    || json!({"type": "object", "properties": {}, "additionalProperties": false}),
                )
        };
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => None,
            ToolChoice::Named(name) => {
                let f = self.function(name)?;
                Some(Constraint::JsonSchema(params(f).to_string()))
            }
            ToolChoice::Required => {
                // Each tool's schema goes under the combined one: its definitions and the
                // references to them move with it (`hoist`).
                let mut defs = Map::new();
                let calls: Vec<Value> = self
                    .defs
                    .iter()
                    .filter_map(|t| t["function"].as_object())
                    .enumerate()
                    .map(|(i, f)| {
                        json!({
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "enum": [f["name"]]},
                                "parameters": hoist(i, params(f), &mut defs),
                            },
                            "required": ["name", "parameters"],
                            "additionalProperties": false,
                        })
                    })
                    .collect();
                let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
                if !self.parallel {
                    schema["maxItems"] = json!(1);
                }
                if !defs.is_empty() {
                    schema["$defs"] = Value::Object(defs);
                }
                Some(Constraint::JsonSchema(schema.to_string()))
            }
        }
    }
}

/// Tool `i`'s parameter schema as a part of the combined schema of `tool_choice`
/// `required`, whose root is not its root: a schema without local references stays as
/// it is; one with them (pydantic's nested models and enums: `"$ref": "#/$defs/Color"`)
/// moves into the combined schema's `$defs` as `tool{i}`, with its own `$defs` and
/// `definitions` beside it (`tool{i}-defs-Color`), every local reference rewritten to
/// match (`#` to `#/$defs/tool{i}`, `#/$defs/Color` to `#/$defs/tool{i}-defs-Color`,
/// any other pointer into the tool's schema under `#/$defs/tool{i}`); what takes its
/// place is a reference to it. Keys keep their pointer escapes (`~0`, `~1`) as written.
fn hoist(i: usize, mut schema: Value, defs: &mut Map<String, Value>) -> Value {
    if !has_local_ref(&schema) {
        return schema;
    }
    let me = format!("tool{i}");
    if let Value::Object(o) = &mut schema {
        // A root keyword that would change how the moved schema resolves.
        o.remove("$schema");
        o.remove("$id");
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(d)) = o.remove(key) {
                for (name, mut def) in d {
                    rewrite_refs(&mut def, &me);
                    defs.insert(format!("{me}-{}-{name}", tag(key)), def);
                }
            }
        }
    }
    rewrite_refs(&mut schema, &me);
    defs.insert(me.clone(), schema);
    json!({ "$ref": format!("#/$defs/{me}") })
}

/// The short name of a definitions keyword in a hoisted definition's name.
fn tag(key: &str) -> &'static str {
    if key == "$defs" {
        "defs"
    } else {
        "definitions"
    }
}

/// Whether `v` holds a `$ref` into its own document (`#...`).
fn has_local_ref(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.iter().any(|(k, x)| {
            (k == "$ref" && x.as_str().is_some_and(|r| r.starts_with('#'))) || has_local_ref(x)
        }),
        Value::Array(a) => a.iter().any(has_local_ref),
        _ => false,
    }
}

/// Rewrite the local references of a schema hoisted as `#/$defs/{me}` (see [`hoist`]).
fn rewrite_refs(v: &mut Value, me: &str) {
    match v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                match x {
                    Value::String(r) if k == "$ref" => {
                        let moved = if r == "#" || r == "#/" {
                            Some(format!("#/$defs/{me}"))
                        } else if let Some(rest) = r.strip_prefix("#/$defs/") {
                            Some(format!("#/$defs/{me}-defs-{rest}"))
                        } else if let Some(rest) = r.strip_prefix("#/definitions/") {
                            Some(format!("#/$defs/{me}-definitions-{rest}"))
                        } else {
                            r.strip_prefix("#/")
                                .map(|rest| format!("#/$defs/{me}/{rest}"))
                        };
                        if let Some(m) = moved {
                            *r = m;
                        }
                    }
                    _ => rewrite_refs(x, me),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rewrite_refs(x, me)),
        _ => {}
    }
}

/// Tools given in another API's shape (`shape` says which, for the error), each read as
/// a `T` and by `read` (with its path, `tools[i]`) into a function definition and its
/// name as given; the name is checked here (valid, unique). The tools in chat's shape.
pub(crate) fn read_list<T: DeserializeOwned>(
    v: &Field<Vec<Value>>,
    shape: &str,
    read: impl Fn(T, &str) -> Result<(Map<String, Value>, Field<String>), ApiError>,
) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        Field::Absent => return Ok(Vec::new()),
        Field::Given(list) => list,
        Field::Wrong => {
            return Err(ApiError::bad(
                "tools",
                format!("`tools` must be a list of `{shape}`"),
            ))
        }
    };
    let mut defs: Vec<Value> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Field::Given(t) = serde_json::from_value(t.clone()).unwrap_or(Field::Wrong) else {
            return Err(ApiError::bad(
                at.clone(),
                format!("`{at}` must be `{shape}`"),
            ));
        };
        let (mut f, name) = read(t, &at)?;
        let name = match name {
            Field::Given(n) if valid_name(&n) => n,
            _ => {
                return Err(ApiError::bad(
                    format!("{at}.name"),
                    format!("`{at}.name` must be {NAME_RULE}"),
                ))
            }
        };
        if defs.iter().any(|d| d["function"]["name"] == name.as_str()) {
            return Err(ApiError::bad(
                format!("{at}.name"),
                format!("two tools are named `{name}`"),
            ));
        }
        f.insert("name".into(), json!(name));
        defs.push(json!({"type": "function", "function": f}));
    }
    Ok(defs)
}

/// Whether `name` is a valid function name: 1 to 64 letters, digits, `_`, `-` or `.`.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The rule of [`valid_name`], for messages.
pub(crate) const NAME_RULE: &str = "1 to 64 letters, digits, `_`, `-` or `.`";

/// Check tool `i` (`{"type": "function", "function": {"name", "description",
/// "parameters", "strict"}}`); its name.
fn tool(i: usize, t: Field<ChatTool>) -> Result<String, ApiError> {
    let at = format!("tools[{i}]");
    let shape = || {
        ApiError::bad(
            at.clone(),
            format!("`{at}` must be `{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}`"),
        )
    };
    let Field::Given(t) = t else {
        return Err(shape());
    };
    no_extra(&t.extra, &at, |k| format!("unknown field `{k}` of a tool"))?;
    match t.kind {
        Field::Given(k) if k == "function" => {}
        Field::Given(other) => {
            return Err(ApiError::bad(
                format!("{at}.type"),
                format!("tool type `{other}` is not supported: only `function`"),
            ))
        }
        _ => return Err(shape()),
    }
    let Field::Given(f) = t.function else {
        return Err(shape());
    };
    let fat = format!("{at}.function");
    no_extra(&f.extra, &fat, |k| {
        format!("unknown field `{k}` of a function")
    })?;
    let name = match f.name {
        Field::Given(n) if valid_name(&n) => n,
        _ => {
            return Err(ApiError::bad(
                format!("{fat}.name"),
                format!("`{fat}.name` must be {NAME_RULE}"),
            ))
        }
    };
    typed(f.description, &format!("{fat}.description"), "a string")?;
    typed(
        f.parameters,
        &format!("{fat}.parameters"),
        "a JSON schema object",
    )?;
    typed(f.strict, &format!("{fat}.strict"), "a boolean")?;
    Ok(name)
}

/// `tool_choice`: `none`, `auto`, `required`, or `{"type": "function", "function":
/// {"name": ...}}` (whether `tools` has it is [`Tools::assemble`]'s to check).
fn tool_choice(c: Field<ChatToolChoice>) -> Result<Option<ToolChoice>, ApiError> {
    const P: &str = "tool_choice";
    let shape = || {
        ApiError::bad(
            P,
            "`tool_choice` must be `none`, `auto`, `required` or \
             `{\"type\": \"function\", \"function\": {\"name\": ...}}`",
        )
    };
    let c = match c {
        Field::Absent => return Ok(None),
        Field::Wrong => return Err(shape()),
        Field::Given(ChatToolChoice::Word(w)) => return Ok(Some(w.into())),
        Field::Given(ChatToolChoice::Function(c)) => c,
    };
    if !matches!(&c.kind, Field::Given(k) if k == "function") {
        return Err(shape());
    }
    let Field::Given(f) = c.function else {
        return Err(shape());
    };
    let Field::Given(name) = f.name else {
        return Err(shape());
    };
    let unknown = |k: &str| format!("unknown field `{k}` in `tool_choice`");
    no_extra(&c.extra, P, unknown)?;
    no_extra(&f.extra, P, unknown)?;
    Ok(Some(ToolChoice::Named(name)))
}

impl From<ChoiceWord> for ToolChoice {
    fn from(w: ChoiceWord) -> Self {
        match w {
            ChoiceWord::None => ToolChoice::None,
            ChoiceWord::Auto => ToolChoice::Auto,
            ChoiceWord::Required => ToolChoice::Required,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Tools::read`] of the fields as JSON (`None`: absent).
    fn read_json(
        tools: Option<Value>,
        choice: Option<Value>,
        parallel: Option<Value>,
    ) -> Result<Option<Tools>, ApiError> {
        let f = |v: Option<Value>| v.unwrap_or(Value::Null);
        Tools::read(
            serde_json::from_value(f(tools)).unwrap(),
            serde_json::from_value(f(choice)).unwrap(),
            serde_json::from_value(f(parallel)).unwrap(),
        )
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}})
    }

    fn param(r: Result<Option<Tools>, ApiError>) -> String {
        r.err()
            .and_then(|e| e.param)
            .unwrap_or_default()
            .into_owned()
    }

    #[test]
    fn tools_and_choices() {
        let t = read_json(Some(json!([weather()])), None, None)
            .unwrap()
            .unwrap();
        assert_eq!((t.choice.clone(), t.parallel), (ToolChoice::Auto, true));
        assert_eq!(t.constraint(), None);
        assert!(read_json(None, Some(json!("none")), None)
            .unwrap()
            .is_none());
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let t = read_json(Some(json!([weather()])), Some(named), None)
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, ToolChoice::Named("get_weather".into()));
        let Some(Constraint::JsonSchema(s)) = t.constraint() else {
            panic!("named")
        };
        assert_eq!(
            serde_json::from_str::<Value>(&s).unwrap(),
            weather()["function"]["parameters"]
        );
        let t = read_json(
            Some(json!([weather()])),
            Some(json!("required")),
            Some(json!(false)),
        )
        .unwrap()
        .unwrap();
        let Some(Constraint::JsonSchema(s)) = t.constraint() else {
            panic!("required")
        };
        let s: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(
            (s["minItems"].as_u64(), s["maxItems"].as_u64()),
            (Some(1), Some(1))
        );
    }

    /// Every `$ref` in `v`, as written.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => o.iter().for_each(|(k, x)| match x {
                Value::String(r) if k == "$ref" => out.push(r.clone()),
                _ => refs(x, out),
            }),
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    #[test]
    fn required_carries_each_tools_definitions() {
        // pydantic's schema of a nested model with an enum, as pydantic-ai sends it, and
        // one of the older `definitions` spelling with a recursive root reference.
        let person = json!({
            "$defs": {
                "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"},
                "Address": {"properties": {"city": {"type": "string"},
                                           "color": {"$ref": "#/$defs/Color"}},
                            "required": ["city"], "type": "object"},
            },
            "properties": {"name": {"type": "string"},
                           "address": {"$ref": "#/$defs/Address"},
                           "nick": {"$ref": "#/properties/name"}},
            "required": ["name", "address"], "type": "object",
        });
        let tree = json!({
            "definitions": {"Color": {"enum": ["blue"]}},
            "properties": {"color": {"$ref": "#/definitions/Color"},
                           "children": {"type": "array", "items": {"$ref": "#"}}},
            "type": "object",
        });
        let tool = |name: &str, p: &Value| json!({"type": "function", "function": {"name": name, "parameters": p}});
        let t = read_json(
            Some(json!([
                tool("person", &person),
                tool("tree", &tree),
                weather()
            ])),
            Some(json!("required")),
            None,
        )
        .unwrap()
        .unwrap();
        let Some(Constraint::JsonSchema(s)) = t.constraint() else {
            panic!("required")
        };
        let s: Value = serde_json::from_str(&s).unwrap();
        let mut all = Vec::new();
        refs(&s, &mut all);
        assert_eq!(all.len(), 7, "{all:?}");
        for r in &all {
            assert!(s.pointer(&r[1..]).is_some(), "{r} does not resolve in {s}");
        }
        let calls = &s["items"]["anyOf"];
        assert_eq!(
            calls[0]["properties"]["parameters"]["$ref"],
            "#/$defs/tool0"
        );
        assert_eq!(
            s["$defs"]["tool0"]["properties"]["address"]["$ref"],
            "#/$defs/tool0-defs-Address"
        );
        assert_eq!(
            s["$defs"]["tool0-defs-Address"]["properties"]["color"]["$ref"],
            "#/$defs/tool0-defs-Color"
        );
        assert_eq!(
            s["$defs"]["tool1"]["properties"]["children"]["items"]["$ref"],
            "#/$defs/tool1"
        );
        assert_eq!(
            s["$defs"]["tool1-definitions-Color"],
            json!({"enum": ["blue"]})
        );
        // A tool without references stays in place.
        assert_eq!(
            calls[2]["properties"]["parameters"],
            weather()["function"]["parameters"]
        );
    }

    #[test]
    fn bad_tools_are_refused_naming_the_field() {
        let one = |t: Value| read_json(Some(json!([t])), None, None);
        assert_eq!(param(read_json(Some(json!({})), None, None)), "tools");
        assert_eq!(param(one(json!(5))), "tools[0]");
        assert_eq!(
            param(one(json!({"type": "retrieval", "function": {"name": "a"}}))),
            "tools[0].type"
        );
        assert_eq!(
            param(one(
                json!({"type": "function", "function": {"name": "a b"}})
            )),
            "tools[0].function.name"
        );
        assert_eq!(
            param(one(
                json!({"type": "function", "function": {"name": "a", "parameters": "x"}})
            )),
            "tools[0].function.parameters"
        );
        assert_eq!(
            param(one(
                json!({"type": "function", "function": {"name": "a", "returns": {}}})
            )),
            "tools[0].function.returns"
        );
        assert_eq!(
            param(read_json(Some(json!([weather(), weather()])), None, None)),
            "tools[1].function.name"
        );
        let unknown = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(
            param(read_json(Some(json!([weather()])), Some(unknown), None)),
            "tool_choice"
        );
        assert_eq!(
            param(read_json(
                Some(json!([weather()])),
                Some(json!("always")),
                None
            )),
            "tool_choice"
        );
        assert_eq!(
            param(read_json(None, Some(json!("required")), None)),
            "tool_choice"
        );
        assert_eq!(
            param(read_json(Some(json!([weather()])), None, Some(json!(1)))),
            "parallel_tool_calls"
        );
    }
}
