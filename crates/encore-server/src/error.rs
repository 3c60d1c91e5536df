//! OpenAI-style error responses: `{"error": {message, type, param, code}}` with the
//! status code, for a bad field (400, naming it), an admission refusal (400, naming the
//! parameter it concerns), an unknown model (404), a missing key (401), a body over the
//! limit (413), a full queue or a shutdown (503) and an engine failure (500). Every
//! refusal (a 4xx) is logged at `info` ([`log_refusals`]), naming the field, not the
//! body.

use std::borrow::Cow;

use std::net::SocketAddr;

use axum::extract::rejection::JsonRejection;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use encore_core::request::{Param, Refusal};
use serde_json::Value;

use crate::wire::{ErrorBody, ErrorObject};

/// An OpenAI-style error response.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    /// The field concerned, as the body spells it (`messages[2].role`).
    pub param: Option<Cow<'static, str>>,
}

/// How a request body spells the parameters whose name depends on the endpoint or on the
/// field the client used, for naming them in refusals.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ParamNames {
    /// `max_tokens` or `max_completion_tokens`.
    pub max_tokens: &'static str,
    /// Completions' `logprobs` or chat's `top_logprobs`.
    pub logprobs: &'static str,
    /// The field that gave the output's constraint (`response_format`,
    /// `structured_outputs`, `guided_json`, ...).
    pub constraint: &'static str,
}

impl ParamNames {
    /// The name of `param` in the request body.
    pub fn of(self, param: Param) -> &'static str {
        match param {
            Param::MaxTokens => self.max_tokens,
            Param::Logprobs => self.logprobs,
            Param::Constraint => self.constraint,
            p => p.name(),
        }
    }
}

impl ApiError {
    /// A 400 for the request's field `param`.
    pub fn bad(param: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
        }
    }

    /// A 400 for the parameter admission refused, named as the body spells it.
    pub fn refused(r: &Refusal, names: ParamNames) -> Self {
        let name = names.of(r.param);
        ApiError::bad(name, r.message_naming(name))
    }

    /// A failure of the server (`status` 5xx) that is not the request's fault.
    pub fn server(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: "server_error",
            param: None,
        }
    }

    /// The error a request cut off at shutdown (or arriving during it) ends with.
    pub fn shutting_down() -> Self {
        ApiError::server(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )
    }

    /// The error object of the body (also sent as an SSE event by a stream that ends
    /// with an error).
    pub fn body(&self) -> ErrorBody {
        let code = match self.status {
            StatusCode::NOT_FOUND if self.param.as_deref() == Some("model") => {
                Some("model_not_found")
            }
            StatusCode::UNAUTHORIZED => Some("invalid_api_key"),
            _ => None,
        };
        ErrorBody {
            error: ErrorObject {
                message: self.message.clone(),
                kind: self.kind,
                param: self.param.as_deref().map(str::to_string),
                code,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        r.extensions_mut().insert(self.refusal());
        r
    }
}

/// What the log says of a refused request: the field at fault (never the body's
/// values), carried from the error to [`log_refusals`] as a response extension.
#[derive(Clone, Debug)]
pub(crate) struct Refused {
    pub param: Option<Cow<'static, str>>,
    pub kind: &'static str,
}

impl ApiError {
    /// The refusal the log tells of.
    pub fn refusal(&self) -> Refused {
        Refused {
            param: self.param.clone(),
            kind: self.kind,
        }
    }
}

/// Log every refused request (a 4xx) at `info`: its method and path, the status, the
/// field at fault when there is one, and the client's address; never its body.
pub(crate) async fn log_refusals(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_string(), |c| c.0.to_string());
    let r = next.run(req).await;
    if r.status().is_client_error() {
        let refusal = r.extensions().get::<Refused>();
        let field = refusal.and_then(|f| f.param.as_deref()).unwrap_or("-");
        let kind = refusal.map_or("-", |f| f.kind);
        tracing::info!(
            "refused {method} {path} from {client}: {} {kind}, field {field}",
            r.status().as_u16()
        );
    }
    r
}

/// The request body, or the rejection as an OpenAI-style error (413 for a body over the
/// limit, 400 for anything that is not JSON).
pub(crate) fn json_body(body: Result<Json<Value>, JsonRejection>) -> Result<Value, ApiError> {
    body.map(|Json(b)| b).map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                status,
                message: "the request body is larger than the server accepts (--max-body-bytes)"
                    .into(),
                kind: "invalid_request_error",
                param: Some("body".into()),
            }
        } else {
            ApiError::bad("body", format!("invalid JSON body: {e}"))
        }
    })
}
