//! A request body's field as the client sent it ([`Field`]: a value of the wrong type
//! does not fail the body's deserialization, its `validate` refuses it naming the field),
//! reading a body against its table of fields ([`read`]), and the checks of one field
//! every body shares (numbers in a range, flags, the model's name).

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::Json;
use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::error::{json_body, ApiError};
use crate::fields::{self, Rule};

/// Read `body` as a `T`: a JSON object whose keys `table` knows and accepts (a field of
/// the wrong type is `validate`'s to refuse).
pub(crate) fn read<T: DeserializeOwned>(
    body: Result<Json<Value>, JsonRejection>,
    table: &[Rule],
) -> Result<T, ApiError> {
    let body = json_body(body)?;
    let Value::Object(map) = &body else {
        return Err(ApiError::bad(
            "body",
            "the request body must be a JSON object",
        ));
    };
    fields::check(table, map, "")?;
    serde_json::from_value(body).map_err(|e| ApiError::bad("body", format!("invalid body: {e}")))
}

/// A field as the client sent it. A value of the wrong type does not fail the body's
/// deserialization: `validate` refuses it with a message naming the field. `null` reads
/// as absent.
#[derive(Default)]
pub(crate) enum Field<T> {
    #[default]
    Absent,
    Given(T),
    Wrong,
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Null => Field::Absent,
            v => serde_json::from_value(v).map_or(Field::Wrong, Field::Given),
        })
    }
}

/// A field serializes as its value (`null` when absent or wrong): the bodies' schemas
/// (utoipa) write their defaults with it.
impl<T: Serialize> Serialize for Field<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Field::Given(x) => x.serialize(s),
            _ => s.serialize_none(),
        }
    }
}

impl<T> Field<T> {
    /// Whether the client gave a value (of any type; `null` is absent).
    pub fn is_given(&self) -> bool {
        !matches!(self, Field::Absent)
    }

    /// The value (`None` when absent), or a 400 for field `name` saying `rule`.
    pub fn get(
        self,
        name: &'static str,
        rule: impl FnOnce() -> String,
    ) -> Result<Option<T>, ApiError> {
        match self {
            Field::Absent => Ok(None),
            Field::Given(x) => Ok(Some(x)),
            Field::Wrong => Err(ApiError::bad(name, rule())),
        }
    }
}

/// A number field in `[lo, hi]`, `default` when absent.
pub(crate) fn number(
    f: Field<f64>,
    name: &'static str,
    lo: f64,
    hi: f64,
    default: f64,
) -> Result<f64, ApiError> {
    let rule = || format!("`{name}` must be a number in [{lo}, {hi}]");
    match f.get(name, rule)? {
        None => Ok(default),
        Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(x),
        Some(_) => Err(ApiError::bad(name, rule())),
    }
}

/// An integer field in `[lo, hi]`.
pub(crate) fn integer(
    f: Field<i64>,
    name: &'static str,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ApiError> {
    let rule = || format!("`{name}` must be an integer in [{lo}, {hi}]");
    match f.get(name, rule)? {
        Some(x) if x < lo || x > hi => Err(ApiError::bad(name, rule())),
        x => Ok(x),
    }
}

/// A non-negative integer field (its upper bound is admission's to check).
pub(crate) fn count(f: Field<u64>, name: &'static str) -> Result<Option<usize>, ApiError> {
    let n = f.get(name, || format!("`{name}` must be a non-negative integer"))?;
    Ok(n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
}

/// A boolean field, `false` when absent.
pub(crate) fn flag(f: Field<bool>, name: &'static str) -> Result<bool, ApiError> {
    Ok(f.get(name, || format!("`{name}` must be a boolean"))?
        .unwrap_or(false))
}

/// `model`: the model this server serves (`served`; a 404 otherwise), `required` or
/// not.
pub(crate) fn check_model(
    model: Field<String>,
    served: &str,
    required: bool,
) -> Result<(), ApiError> {
    match model.get("model", || "`model` must be a string".into())? {
        None if required => Err(ApiError::bad("model", "`model` is required")),
        None => Ok(()),
        Some(m) if m != served => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{m}` does not exist; this server serves `{served}`"),
            kind: "invalid_request_error",
            param: Some("model".into()),
        }),
        Some(_) => Ok(()),
    }
}

/// A `Field<Value>` as an option (`null` is absent).
pub(crate) fn given(f: Field<Value>) -> Option<Value> {
    match f {
        Field::Given(v) => Some(v),
        _ => None,
    }
}
