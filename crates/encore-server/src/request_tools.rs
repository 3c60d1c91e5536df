//! The typed request shapes of tools and tool choices (chat's, the responses API's and
//! Anthropic's), read by `tools`, `responses` and `messages`. Every field is a [`Field`]
//! (a value of the wrong type is refused naming it) and every object keeps the keys it
//! does not have in `extra` (refused naming the first), so each 400 names the field as
//! before; a function's `parameters` (a JSON schema) stays a JSON value. Their schemas
//! are those of `/openapi.json` (`openapi` closes them: `additionalProperties: false`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::field::Field;

/// The keys an object was given that it does not have.
pub(crate) type Extra = Map<String, Value>;

/// A 400 naming the first key of `extra`, as `{at}.{key}`, with `message(key)`.
pub(crate) fn no_extra(
    extra: &Extra,
    at: &str,
    message: impl FnOnce(&str) -> String,
) -> Result<(), ApiError> {
    match extra.keys().next() {
        Some(k) => Err(ApiError::bad(format!("{at}.{k}"), message(k))),
        None => Ok(()),
    }
}

/// A `type` that is `function`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) enum FunctionType {
    #[schema(rename = "function")]
    Function,
}

/// A chat tool: `{"type": "function", "function": {...}}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct ChatTool {
    #[serde(rename = "type")]
    #[schema(value_type = FunctionType, required)]
    pub kind: Field<String>,
    #[schema(value_type = ChatFunction, required)]
    pub function: Field<ChatFunction>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// A chat tool's function.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct ChatFunction {
    #[schema(value_type = String, required)]
    pub name: Field<String>,
    #[schema(value_type = Option<String>)]
    pub description: Field<String>,
    /// A JSON schema of the arguments.
    #[schema(value_type = Option<Object>)]
    pub parameters: Field<Map<String, Value>>,
    #[schema(value_type = Option<bool>)]
    pub strict: Field<bool>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// `tool_choice` as a word.
#[derive(Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ChoiceWord {
    None,
    Auto,
    Required,
}

/// Chat's `tool_choice`: a word or a named function.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum ChatToolChoice {
    Word(ChoiceWord),
    Function(FunctionChoice),
}

/// Chat's `tool_choice` naming a function: `{"type": "function", "function": {"name"}}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct FunctionChoice {
    #[serde(rename = "type")]
    #[schema(value_type = FunctionType, required)]
    pub kind: Field<String>,
    #[schema(value_type = FunctionName, required)]
    pub function: Field<FunctionName>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// `{"name": ...}`.
#[derive(Default, Deserialize, Serialize, ToSchema)]
#[serde(default)]
pub(crate) struct FunctionName {
    #[schema(value_type = String, required)]
    pub name: Field<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub extra: Extra,
}

/// The objects of this module, whose schemas `/openapi.json` closes.
pub(crate) const CLOSED: [&str; 4] = ["ChatTool", "ChatFunction", "FunctionChoice", "FunctionName"];

/// A field of an object inside a body, named `at`: its value (`None` when absent), or a
/// 400 saying it must be `what`.
pub(crate) fn typed<T>(f: Field<T>, at: &str, what: &str) -> Result<Option<T>, ApiError> {
    match f {
        Field::Absent => Ok(None),
        Field::Given(x) => Ok(Some(x)),
        Field::Wrong => Err(ApiError::bad(
            at.to_string(),
            format!("`{at}` must be {what}"),
        )),
    }
}
