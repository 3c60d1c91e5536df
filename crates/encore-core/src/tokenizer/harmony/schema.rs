//! Tools in harmony's TypeScript-like namespace: a port of `openai-harmony` 0.0.8's
//! `json_schema_to_typescript` and `template_tools_section` (encoding.rs), kept to its
//! quirks (indentation, where descriptions and defaults go), since the model was trained
//! on exactly what they write. Checked against the official renderer's output
//! (`tests/fixtures/harmony.json`).

use serde_json::Value;

fn is_enum(schema: &Value) -> bool {
    schema
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// A `default` as a comment's words: `default: "x"` for a string (unless an enum, then
/// bare), the JSON otherwise.
fn default_words(owner: &Value, default: &Value) -> String {
    match default.as_str() {
        Some(s) if !is_enum(owner) => format!("default: \"{s}\""),
        Some(s) => format!("default: {s}"),
        None => format!("default: {default}"),
    }
}

fn nullable(variant: &Value, ty: String) -> String {
    if variant.get("nullable").and_then(Value::as_bool) == Some(true) && !ty.contains("null") {
        format!("{ty} | null")
    } else {
        ty
    }
}

/// The TypeScript type of a JSON schema, its lines indented by `indent`.
pub(crate) fn to_typescript(schema: &Value, indent: &str) -> String {
    if let Some(arr) = schema.get("oneOf").and_then(Value::as_array) {
        let mut out = String::new();
        for (i, variant) in arr.iter().enumerate() {
            if i > 0 {
                out.push('\n');
                out.push_str(&format!("{indent} | "));
            } else {
                out.push_str(&format!("\n{indent} | "));
            }
            out.push_str(&nullable(
                variant,
                to_typescript(variant, &format!("{indent}   ")),
            ));
            let mut comments = Vec::new();
            if let Some(d) = str_of(variant, "description") {
                comments.push(d.to_string());
            }
            if let Some(default) = variant.get("default") {
                comments.push(default_words(variant, default));
            }
            if !comments.is_empty() {
                out.push_str(&format!(" // {}", comments.join(" ")));
            }
        }
        return out;
    }
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let names: Vec<&str> = types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| if t == "integer" { "number" } else { t })
            .collect();
        if !names.is_empty() {
            return names.join(" | ");
        }
    }
    let Some(ty) = str_of(schema, "type") else {
        return "any".to_string();
    };
    match ty {
        "object" => object(schema, indent),
        "string" => {
            let enums: Vec<String> = schema
                .get("enum")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(|s| format!("\"{s}\""))
                        .collect()
                })
                .unwrap_or_default();
            if enums.is_empty() {
                "string".to_string()
            } else {
                enums.join(" | ")
            }
        }
        "number" | "integer" => "number".to_string(),
        "boolean" => "boolean".to_string(),
        "array" => match schema.get("items") {
            Some(items) => format!("{}[]", to_typescript(items, indent)),
            None => "Array<any>".to_string(),
        },
        _ => "any".to_string(),
    }
}

fn object(schema: &Value, indent: &str) -> String {
    let mut out = String::new();
    if let Some(d) = str_of(schema, "description") {
        out.push_str(&format!("{indent}// {d}\n"));
    }
    out.push_str("{\n");
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let props = schema.get("properties").and_then(Value::as_object);
    for (key, val) in props.into_iter().flatten() {
        let opt = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        if let Some(title) = str_of(val, "title") {
            out.push_str(&format!("{indent}// {title}\n{indent}//\n"));
        }
        let one_of = val.get("oneOf");
        if one_of.is_none() {
            if let Some(d) = str_of(val, "description") {
                out.push_str(&format!("{indent}// {d}\n"));
            }
        }
        if let Some(examples) = val.get("examples").and_then(Value::as_array) {
            if !examples.is_empty() {
                out.push_str(&format!("{indent}// Examples:\n"));
                for ex in examples.iter().filter_map(Value::as_str) {
                    out.push_str(&format!("{indent}// - \"{ex}\"\n"));
                }
            }
        }
        if let Some(arr) = one_of.and_then(Value::as_array) {
            one_of_property(&mut out, key, opt, val, arr, indent);
            continue;
        }
        out.push_str(&format!("{indent}{key}{opt}: "));
        out.push_str(&nullable(val, to_typescript(val, &format!("{indent}    "))));
        out.push(',');
        if let Some(default) = val.get("default") {
            out.push_str(&format!(" // {}", default_words(val, default)));
        }
        out.push('\n');
    }
    out.push_str(&format!("{indent}}}"));
    out
}

/// A property whose schema is a `oneOf`: its variants one per line.
fn one_of_property(
    out: &mut String,
    key: &str,
    opt: &str,
    val: &Value,
    arr: &[Value],
    indent: &str,
) {
    let property_desc = str_of(val, "description");
    let skip_desc = property_desc.is_some()
        && arr.first().and_then(|v| str_of(v, "description")) == property_desc;
    let mut desc_above = false;
    if let (false, Some(d)) = (skip_desc, property_desc) {
        out.push_str(&format!("{indent}// {d}\n"));
        desc_above = true;
    }
    if let Some(default) = val.get("default") {
        out.push_str(&format!("{indent}// {}\n", default_words(val, default)));
    }
    out.push_str(&format!("{indent}{key}{opt}:\n"));
    for (i, variant) in arr.iter().enumerate() {
        out.push_str(&format!("{indent} | "));
        out.push_str(&nullable(
            variant,
            to_typescript(variant, &format!("{indent}   ")),
        ));
        let mut comments = Vec::new();
        if !(i == 0 && desc_above) {
            if let Some(d) = str_of(variant, "description") {
                if Some(d) != property_desc {
                    comments.push(d.to_string());
                }
            }
        }
        if let Some(default) = variant.get("default") {
            comments.push(default_words(variant, default));
        }
        if !comments.is_empty() {
            out.push_str(&format!(" // {}", comments.join(" ")));
        }
        out.push('\n');
    }
    out.push_str(&format!("{indent},\n"));
}

/// One function of a tools namespace: its name, description and parameters schema.
pub(crate) struct ToolDef<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub parameters: Option<&'a Value>,
}

/// The `# Tools` section of a developer message with the `functions` namespace.
pub(crate) fn tools_section(tools: &[ToolDef<'_>]) -> String {
    let mut lines = vec!["## functions\n".to_string()];
    lines.push("namespace functions {\n".to_string());
    for t in tools {
        for line in t.description.lines() {
            lines.push(format!("// {line}"));
        }
        match t.parameters {
            Some(p) => lines.push(format!(
                "type {} = (_: {}) => any;\n",
                t.name,
                to_typescript(p, "")
            )),
            None => lines.push(format!("type {} = () => any;\n", t.name)),
        }
    }
    lines.push("} // namespace functions".to_string());
    ["# Tools".to_string(), lines.join("\n")].join("\n\n")
}
