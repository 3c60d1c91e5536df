//! The request fields that are maps: `logit_bias` (token ids to biases, typed as read,
//! in the client's order) and `chat_template_kwargs` (template variables, whose values
//! are the template's to read: any JSON value).

use std::fmt;

use encore_core::tokenizer::RESERVED_TEMPLATE_VARS;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::field::Field;

/// `logit_bias` as given: token ids (as strings) to biases, in the client's order (a
/// bias of the wrong type is refused naming the field).
#[derive(Default)]
pub(crate) struct LogitBias(Vec<(String, Field<f64>)>);

impl<'de> Deserialize<'de> for LogitBias {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = LogitBias;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of token ids to biases")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<LogitBias, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = m.next_entry::<String, Field<f64>>()? {
                    out.push(entry);
                }
                Ok(LogitBias(out))
            }
        }
        d.deserialize_map(Entries)
    }
}

impl Serialize for LogitBias {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// `logit_bias`: token ids (as strings) to biases in [-100, 100], added to the logits
/// before sampling (an id given twice, e.g. `"7"` and `"07"`, adds both). Whether the ids
/// are in the vocabulary is admission's to check.
pub(crate) fn logit_bias(f: Field<LogitBias>) -> Result<Vec<(u32, f32)>, ApiError> {
    const P: &str = "logit_bias";
    let rule = || "`logit_bias` must map token ids to numbers in [-100, 100]".to_string();
    let Some(LogitBias(map)) = f.get(P, rule)? else {
        return Ok(Vec::new());
    };
    let mut out: Vec<(u32, f32)> = Vec::with_capacity(map.len());
    for (k, v) in map {
        let Ok(id) = k.trim().parse::<u32>() else {
            return Err(ApiError::bad(
                P,
                format!("`logit_bias` key `{k}` is not a token id"),
            ));
        };
        let b = match v {
            Field::Given(b) if (-100.0..=100.0).contains(&b) => b,
            _ => return Err(ApiError::bad(P, rule())),
        };
        match out.iter_mut().find(|(t, _)| *t == id) {
            Some((_, sum)) => *sum += b as f32,
            None => out.push((id, b as f32)),
        }
    }
    Ok(out)
}

/// `chat_template_kwargs`: an object of template variables, none of those the renderer
/// sets.
pub(crate) fn template_kwargs(
    f: Field<Map<String, Value>>,
) -> Result<Map<String, Value>, ApiError> {
    const P: &str = "chat_template_kwargs";
    let o = f
        .get(P, || "`chat_template_kwargs` must be an object".into())?
        .unwrap_or_default();
    if let Some(k) = o
        .keys()
        .find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str()))
    {
        return Err(ApiError::bad(
            format!("{P}.{k}"),
            format!("`{P}.{k}` is set by the server, not by the request"),
        ));
    }
    Ok(o)
}
