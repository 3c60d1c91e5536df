//! `GET /openapi.json`: the server's OpenAPI 3.1 document, generated with utoipa from the
//! wire types (`wire`, `wire_anthropic`, `wire_responses`) and the typed request bodies,
//! with every route. A request body's schema is its endpoint's table of fields
//! (`fields`): an honored field has the type its typed body reads (its sub-objects too:
//! tools, formats, content blocks, input items, ... each closed, `additionalProperties:
//! false`; a client's JSON schema is any JSON value), a logged field its JSON type, a
//! refused field only the values that change nothing; any other field is refused
//! (`additionalProperties: false`), and `null` reads as absent everywhere. So do the
//! objects with their own table inside bodies (a chat message, `stream_options`). The
//! tests below check each table against its typed body.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use utoipa::OpenApi;

use crate::anthropic_blocks::{self, AnthropicMessage, AnthropicRole, Block, BlockType, Content};
use crate::anthropic_params::{
    self, Effort, JsonSchemaType, OutputConfig, OutputFormat, Thinking, ThinkingDisplay,
    ThinkingType,
};
use crate::api_tools::{
    self, AnthropicChoiceType, AnthropicTool, AnthropicToolChoice, CustomType,
    ResponsesFunctionChoice, ResponsesTool, ResponsesToolChoice,
};
use crate::body::{ChatBody, CompletionBody, StreamOptionsBody};
use crate::chat_messages::MessageBody;
use crate::fields::{self, Handling, NoOp, Rule, Shape};
use crate::messages::{CountBody, MessagesBody};
use crate::request_tools::{
    self, ChatFunction, ChatTool, ChatToolChoice, ChoiceWord, FunctionChoice, FunctionName,
    FunctionType,
};
use crate::responses::ResponsesBody;
use crate::responses_input::{self, Input, InputItem, InputItemType, Part, Parts};
use crate::responses_params::{self, IncludeValue, Reasoning, ReasoningEffort, ReasoningSummary};
use crate::structured::{
    self, FormatType, JsonSchemaFormat, ResponseFormat, Schema, StructuredOutputs, TextFormat,
    TextParam,
};
use crate::tokenize::{DetokenizeBody, TokenizeBody};
use crate::wire::{
    AnthropicErrorBody, ChatCompletionChunk, ChatCompletionResponse, CompletionChunk,
    CompletionResponse, DetokenizeResponse, ErrorBody, Model, ModelList, TokenizeResponse,
};
use crate::wire_anthropic::{CountTokensResponse, Message, MessageEvent};
use crate::wire_responses::{ResponseEventKind, ResponseObject};

/// The document as served (built once).
pub(crate) async fn openapi_json() -> Response {
    static DOC: OnceLock<String> = OnceLock::new();
    let text = DOC.get_or_init(|| document().to_string());
    ([(header::CONTENT_TYPE, "application/json")], text.as_str()).into_response()
}

/// Each POST route's request body: its schema's name, its table, and the schema of its
/// typed body.
fn request_bodies() -> Vec<(&'static str, &'static str, &'static [Rule], &'static str)> {
    vec![
        (
            "/v1/completions",
            "CompletionRequest",
            fields::COMPLETIONS,
            "CompletionBody",
        ),
        (
            "/v1/chat/completions",
            "ChatCompletionRequest",
            fields::CHAT,
            "ChatBody",
        ),
        (
            "/v1/responses",
            "ResponsesRequest",
            fields::RESPONSES,
            "ResponsesBody",
        ),
        (
            "/v1/messages",
            "MessagesRequest",
            fields::MESSAGES,
            "MessagesBody",
        ),
        (
            "/v1/messages/count_tokens",
            "CountTokensRequest",
            fields::COUNT_TOKENS,
            "CountBody",
        ),
        (
            "/tokenize",
            "TokenizeRequest",
            fields::TOKENIZE,
            "TokenizeBody",
        ),
        (
            "/detokenize",
            "DetokenizeRequest",
            fields::DETOKENIZE,
            "DetokenizeBody",
        ),
    ]
}

/// An object inside request bodies that has its own table.
struct Nested {
    /// Its schema's name.
    name: &'static str,
    table: &'static [Rule],
    /// The schema of the typed object.
    typed: &'static str,
    /// The fields (of which request bodies' schemas) that are lists of it.
    lists: &'static [(&'static str, &'static str)],
    /// The fields that are one of it.
    ones: &'static [(&'static str, &'static str)],
}

/// The objects inside request bodies that have their own table.
fn nested() -> Vec<Nested> {
    vec![
        Nested {
            name: "ChatMessageRequest",
            table: fields::MESSAGE,
            typed: "MessageBody",
            lists: &[
                ("ChatCompletionRequest", "messages"),
                ("TokenizeRequest", "messages"),
            ],
            ones: &[],
        },
        Nested {
            name: "StreamOptionsRequest",
            table: fields::STREAM_OPTION_KEYS,
            typed: "StreamOptionsBody",
            lists: &[],
            ones: &[
                ("CompletionRequest", "stream_options"),
                ("ChatCompletionRequest", "stream_options"),
            ],
        },
    ]
}

/// The typed bodies whose schemas the request schemas are built from (not served).
const TYPED_BODIES: [&str; 12] = [
    "StreamOptionsBody",
    "MessageBody",
    "CompletionBody",
    "ChatBody",
    "CommonBody",
    "SamplingBody",
    "ResponsesBody",
    "MessagesBody",
    "CountBody",
    "Conversation",
    "TokenizeBody",
    "DetokenizeBody",
];

/// The OpenAPI document: utoipa's, each request body's schema built from its table.
pub(crate) fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    let schemas = doc["components"]["schemas"].clone();
    for (path, name, table, typed) in request_bodies() {
        let typed = properties(&schemas, &json!({"$ref": reference(typed)}));
        doc["components"]["schemas"][name] = request_schema(table, &typed);
        doc["paths"][path]["post"]["requestBody"] = json!({
            "required": true,
            "content": {"application/json": {"schema": {"$ref": reference(name)}}},
        });
    }
    for n in nested() {
        let typed = properties(&schemas, &json!({"$ref": reference(n.typed)}));
        doc["components"]["schemas"][n.name] = request_schema(n.table, &typed);
        for (body, field) in n.lists {
            let p = &mut doc["components"]["schemas"][body]["properties"][field];
            p["type"] = json!(["array", "null"]);
            p["items"] = json!({"$ref": reference(n.name)});
        }
        for (body, field) in n.ones {
            let p = &mut doc["components"]["schemas"][body]["properties"][field];
            let description = p["description"].take();
            *p = json!({
                "anyOf": [{"$ref": reference(n.name)}, {"type": "null"}],
                "description": description,
            });
        }
    }
    for name in closed() {
        let s = &mut doc["components"]["schemas"][name];
        s["additionalProperties"] = json!(false);
        // A typed object's defaults are its absent fields' (`null`), not the server's.
        if let Some(props) = s["properties"].as_object_mut() {
            for p in props.values_mut().filter_map(Value::as_object_mut) {
                p.remove("default");
            }
        }
    }
    if let Some(s) = doc["components"]["schemas"].as_object_mut() {
        for t in TYPED_BODIES {
            s.remove(t);
        }
    }
    doc
}

/// The typed objects inside request bodies that refuse other keys.
fn closed() -> Vec<&'static str> {
    [
        &request_tools::CLOSED[..],
        &api_tools::CLOSED,
        &structured::CLOSED,
        &anthropic_params::CLOSED,
        &anthropic_blocks::CLOSED,
        &responses_params::CLOSED,
        &responses_input::CLOSED,
    ]
    .concat()
}

fn reference(name: &str) -> String {
    format!("#/components/schemas/{name}")
}

/// The properties of `schema`, through `$ref`s, `allOf`s and a one-item `oneOf` (a
/// flattened struct's).
pub(crate) fn properties(schemas: &Value, schema: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or_default();
        return properties(schemas, &schemas[name]);
    }
    for part in schema["allOf"].as_array().into_iter().flatten() {
        out.extend(properties(schemas, part));
    }
    // A flattened struct with defaults is written as a `oneOf` of its one reference.
    if let Some([one]) = schema["oneOf"].as_array().map(Vec::as_slice) {
        out.extend(properties(schemas, one));
    }
    if let Some(p) = schema["properties"].as_object() {
        out.extend(p.clone());
    }
    out
}

/// The schema of a body whose fields `table` lists; `typed`: the typed body's properties.
fn request_schema(table: &[Rule], typed: &Map<String, Value>) -> Value {
    let mut props = Map::new();
    let mut required = Vec::new();
    for r in table {
        let mut p = match r.handling {
            Handling::Honored => typed.get(r.name).cloned().unwrap_or_else(|| json!({})),
            Handling::Logged(Shape::String) => json!({"type": ["string", "null"]}),
            Handling::Logged(Shape::Object) => json!({"type": ["object", "null"]}),
            Handling::Refused(ok) => json!({"enum": no_op_values(ok)}),
        };
        if let Value::Object(o) = &mut p {
            // A typed body's defaults are its absent fields' (`null`), not the server's.
            o.remove("default");
            o.insert("description".into(), r.note.into());
        }
        if matches!(r.handling, Handling::Honored) && r.note.starts_with("required") {
            required.push(r.name);
        }
        props.insert(r.name.into(), p);
    }
    json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    })
}

/// The values of a refused field that change nothing (`null` always).
fn no_op_values(ok: NoOp) -> Vec<Value> {
    let mut v = match ok {
        NoOp::Nothing => vec![],
        NoOp::False => vec![json!(false)],
        NoOp::One => vec![json!(1)],
        NoOp::Empty => vec![json!(""), json!([]), json!({})],
        NoOp::Is(text) => serde_json::from_str(text).into_iter().collect(),
        NoOp::AnyOf(list) => list.iter().map(|s| json!(s)).collect(),
    };
    v.push(Value::Null);
    v
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "encore",
        description = "encore's OpenAI-compatible (and Anthropic messages) HTTP API"
    ),
    paths(
        completions,
        chat_completions,
        responses,
        messages,
        count_tokens,
        tokenize,
        detokenize,
        models,
        model,
        health,
        metrics,
        openapi
    ),
    components(schemas(
        MessageBody,
        StreamOptionsBody,
        CompletionBody,
        ChatBody,
        ResponsesBody,
        MessagesBody,
        CountBody,
        TokenizeBody,
        DetokenizeBody,
        ChatTool,
        ChatFunction,
        ChatToolChoice,
        ChoiceWord,
        FunctionChoice,
        FunctionName,
        FunctionType,
        ResponsesTool,
        ResponsesToolChoice,
        ResponsesFunctionChoice,
        AnthropicTool,
        AnthropicToolChoice,
        AnthropicChoiceType,
        CustomType,
        Schema,
        FormatType,
        ResponseFormat,
        JsonSchemaFormat,
        TextParam,
        TextFormat,
        StructuredOutputs,
        Thinking,
        ThinkingType,
        ThinkingDisplay,
        OutputConfig,
        OutputFormat,
        Effort,
        JsonSchemaType,
        AnthropicMessage,
        AnthropicRole,
        Block,
        BlockType,
        Content,
        Reasoning,
        ReasoningEffort,
        ReasoningSummary,
        IncludeValue,
        Input,
        InputItem,
        InputItemType,
        Parts,
        Part
    ))
)]
struct ApiDoc;

/// `POST /v1/completions`.
#[utoipa::path(post, path = "/v1/completions", responses(
    (status = 200, description = "the completion, or with `stream` its chunks as server-sent events (then `[DONE]`)", content(
        (CompletionResponse = "application/json"),
        (CompletionChunk = "text/event-stream"),
    )),
    (status = 400, description = "a field refused, named in `param`", body = ErrorBody),
    (status = 401, description = "a missing or wrong API key", body = ErrorBody),
    (status = 404, description = "another model", body = ErrorBody),
    (status = 413, description = "a body over the limit", body = ErrorBody),
    (status = 503, description = "a full queue, or shutting down", body = ErrorBody),
))]
#[allow(dead_code)]
fn completions() {}

/// `POST /v1/chat/completions`.
#[utoipa::path(post, path = "/v1/chat/completions", responses(
    (status = 200, description = "the chat completion, or with `stream` its chunks as server-sent events (then `[DONE]`)", content(
        (ChatCompletionResponse = "application/json"),
        (ChatCompletionChunk = "text/event-stream"),
    )),
    (status = 400, description = "a field refused, named in `param`", body = ErrorBody),
    (status = 401, description = "a missing or wrong API key", body = ErrorBody),
    (status = 404, description = "another model", body = ErrorBody),
    (status = 413, description = "a body over the limit", body = ErrorBody),
    (status = 503, description = "a full queue, or shutting down", body = ErrorBody),
))]
#[allow(dead_code)]
fn chat_completions() {}

/// `POST /v1/responses` (stateless).
#[utoipa::path(post, path = "/v1/responses", responses(
    (status = 200, description = "the response object, or with `stream` its typed events (each SSE event named by its `type`, each with its `sequence_number`)", content(
        (ResponseObject = "application/json"),
        (ResponseEventKind = "text/event-stream"),
    )),
    (status = 400, description = "a field refused, named in `param`", body = ErrorBody),
    (status = 401, description = "a missing or wrong API key", body = ErrorBody),
    (status = 404, description = "another model", body = ErrorBody),
    (status = 413, description = "a body over the limit", body = ErrorBody),
    (status = 503, description = "a full queue, or shutting down", body = ErrorBody),
))]
#[allow(dead_code)]
fn responses() {}

/// `POST /v1/messages` (Anthropic's).
#[utoipa::path(post, path = "/v1/messages", responses(
    (status = 200, description = "the message, or with `stream` its events (each SSE event named by its `type`)", content(
        (Message = "application/json"),
        (MessageEvent = "text/event-stream"),
    )),
    (status = 400, description = "a field refused, named at the start of the message", body = AnthropicErrorBody),
    (status = 401, description = "a missing or wrong API key", body = AnthropicErrorBody),
    (status = 404, description = "another model", body = AnthropicErrorBody),
    (status = 413, description = "a body over the limit", body = AnthropicErrorBody),
    (status = 503, description = "a full queue, or shutting down", body = AnthropicErrorBody),
))]
#[allow(dead_code)]
fn messages() {}

/// `POST /v1/messages/count_tokens` (Anthropic's).
#[utoipa::path(post, path = "/v1/messages/count_tokens", responses(
    (status = 200, description = "the prompt's tokens", body = CountTokensResponse),
    (status = 400, description = "a field refused, named at the start of the message", body = AnthropicErrorBody),
    (status = 401, description = "a missing or wrong API key", body = AnthropicErrorBody),
    (status = 404, description = "another model", body = AnthropicErrorBody),
    (status = 413, description = "a body over the limit", body = AnthropicErrorBody),
))]
#[allow(dead_code)]
fn count_tokens() {}

/// `POST /tokenize` (vLLM's).
#[utoipa::path(post, path = "/tokenize", responses(
    (status = 200, description = "the prompt's token ids", body = TokenizeResponse),
    (status = 400, description = "a field refused, named in `param`", body = ErrorBody),
    (status = 401, description = "a missing or wrong API key", body = ErrorBody),
    (status = 404, description = "another model", body = ErrorBody),
    (status = 413, description = "a body over the limit", body = ErrorBody),
))]
#[allow(dead_code)]
fn tokenize() {}

/// `POST /detokenize` (vLLM's).
#[utoipa::path(post, path = "/detokenize", responses(
    (status = 200, description = "the tokens' text", body = DetokenizeResponse),
    (status = 400, description = "a field refused, named in `param`", body = ErrorBody),
    (status = 401, description = "a missing or wrong API key", body = ErrorBody),
    (status = 404, description = "another model", body = ErrorBody),
    (status = 413, description = "a body over the limit", body = ErrorBody),
))]
#[allow(dead_code)]
fn detokenize() {}

/// `GET /v1/models`.
#[utoipa::path(get, path = "/v1/models", responses(
    (status = 200, description = "the served model", body = ModelList),
    (status = 401, description = "a missing or wrong API key", body = ErrorBody),
))]
#[allow(dead_code)]
fn models() {}

/// `GET /v1/models/{model}` (a name with `/` is one path).
#[utoipa::path(get, path = "/v1/models/{model}", params(("model" = String, Path, description = "the model's name")), responses(
    (status = 200, description = "the served model", body = Model),
    (status = 401, description = "a missing or wrong API key", body = ErrorBody),
    (status = 404, description = "another model", body = ErrorBody),
))]
#[allow(dead_code)]
fn model() {}

/// `GET /health`.
#[utoipa::path(get, path = "/health", responses(
    (status = 200, description = "`ok`", body = String, content_type = "text/plain"),
    (status = 503, description = "why the engine serves no more requests", body = String, content_type = "text/plain"),
))]
#[allow(dead_code)]
fn health() {}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", responses(
    (status = 200, description = "Prometheus text", body = String, content_type = "text/plain"),
))]
#[allow(dead_code)]
fn metrics() {}

/// `GET /openapi.json`.
#[utoipa::path(get, path = "/openapi.json", responses(
    (status = 200, description = "this document", body = serde_json::Value),
))]
#[allow(dead_code)]
fn openapi() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields a typed body reads are the fields its table honors (or logs): the table
    /// (and the README's tables made from it) cannot drift from the types.
    #[test]
    fn the_tables_honor_the_fields_of_the_typed_bodies() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let nested = nested()
            .into_iter()
            .map(|n| (n.name, n.name, n.table, n.typed));
        for (path, _, table, typed) in request_bodies().into_iter().chain(nested) {
            let read = properties(schemas, &json!({"$ref": reference(typed)}));
            for r in table {
                if matches!(r.handling, Handling::Honored) {
                    assert!(
                        read.contains_key(r.name),
                        "{path}: `{}` honored, not read",
                        r.name
                    );
                }
            }
            // A logged field may be read too (a response repeats its `metadata`).
            for name in read.keys() {
                let rule = table.iter().find(|r| r.name == name);
                let listed = rule.is_some_and(|r| !matches!(r.handling, Handling::Refused(_)));
                assert!(
                    listed,
                    "{path}: `{name}` read, not honored or logged by the table"
                );
            }
        }
    }

    /// Every `$ref` in `v`.
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

    /// Every reference in the document names a schema it has, and every typed object is
    /// closed and referenced.
    #[test]
    fn every_reference_resolves() {
        let doc = document();
        let mut all = Vec::new();
        refs(&doc, &mut all);
        for r in &all {
            assert!(doc.pointer(&r[1..]).is_some(), "{r} does not resolve");
        }
        for name in closed() {
            assert!(all.contains(&reference(name)), "{name} is not referenced");
            let s = doc["components"]["schemas"][name].to_string();
            assert!(!s.contains("\"default\""), "{name}: {s}");
        }
    }

    #[test]
    fn every_post_route_has_its_request_schema() {
        let doc = document();
        for (path, name, table, _) in request_bodies() {
            let body = &doc["paths"][path]["post"]["requestBody"];
            assert_eq!(
                body["content"]["application/json"]["schema"]["$ref"],
                reference(name),
                "{path}"
            );
            let s = &doc["components"]["schemas"][name];
            assert_eq!(s["additionalProperties"], false, "{path}");
            let props = s["properties"].as_object().unwrap();
            assert_eq!(props.len(), table.len(), "{path}");
        }
        let temperature =
            &doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["temperature"];
        assert_eq!(temperature["type"], json!(["number", "null"]));
        let best_of = &doc["components"]["schemas"]["CompletionRequest"]["properties"]["best_of"];
        assert_eq!(best_of["enum"], json!([1, null]));
        for t in TYPED_BODIES {
            assert!(doc["components"]["schemas"].get(t).is_none(), "{t}");
        }
        let messages =
            &doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["messages"];
        assert_eq!(messages["items"]["$ref"], reference("ChatMessageRequest"));
        // Tools and tool choices have their shapes, closed.
        for (body, tools, choice) in [
            ("ChatCompletionRequest", "ChatTool", "ChatToolChoice"),
            ("ResponsesRequest", "ResponsesTool", "ResponsesToolChoice"),
            ("MessagesRequest", "AnthropicTool", "AnthropicToolChoice"),
        ] {
            let props = &doc["components"]["schemas"][body]["properties"];
            assert_eq!(props["tools"]["items"]["$ref"], reference(tools), "{body}");
            let any = props["tool_choice"].to_string();
            assert!(any.contains(&reference(choice)), "{body}: {any}");
        }
        for name in closed() {
            let s = &doc["components"]["schemas"][name];
            assert_eq!(s["additionalProperties"], false, "{name}");
        }
        // So do the other typed objects.
        for (body, field, schema) in [
            ("ChatCompletionRequest", "response_format", "ResponseFormat"),
            (
                "ChatCompletionRequest",
                "structured_outputs",
                "StructuredOutputs",
            ),
            ("ResponsesRequest", "text", "TextParam"),
            ("ResponsesRequest", "reasoning", "Reasoning"),
            ("ResponsesRequest", "include", "IncludeValue"),
            ("ResponsesRequest", "input", "Input"),
            ("MessagesRequest", "thinking", "Thinking"),
            ("MessagesRequest", "output_config", "OutputConfig"),
            ("MessagesRequest", "system", "Content"),
            ("MessagesRequest", "messages", "AnthropicMessage"),
        ] {
            let p = doc["components"]["schemas"][body]["properties"][field].to_string();
            assert!(p.contains(&reference(schema)), "{body}.{field}: {p}");
        }
        let bias =
            &doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["logit_bias"];
        assert_eq!(bias["additionalProperties"]["type"], "number", "{bias}");
        let function = &doc["components"]["schemas"]["ChatFunction"];
        assert_eq!(function["required"], json!(["name"]));
        let message = &doc["components"]["schemas"]["ChatMessageRequest"];
        assert_eq!(message["additionalProperties"], false);
        assert_eq!(
            message["properties"]["role"]["type"],
            json!(["string", "null"])
        );
    }
}
