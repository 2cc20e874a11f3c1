//! The one error shape every route answers with (docs/architecture.md#errors-and-observability):
//! `{"error":{"code","message","request_id"}}` plus an `x-request-id` header.
//!
//! Handlers return [`ApiError`]; it renders without a request id, because a
//! handler doesn't know it. [`envelope`] is the middleware that fills the id
//! in, and that also wraps the plain-text errors axum produces by itself
//! (405, body-limit 413, ...), so no response escapes the envelope.
//!
//! A domain error becomes an [`ApiError`] through [`ApiError::refused`]:
//! its code and message come from the one vocabulary of refusals
//! (`domain/error.rs`), and this file only picks the status of its kind.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use utoipa::ToSchema;

use crate::domain::error::{ErrorKind, Refusal, TaskRefusal, Wording};

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// A client-facing error. `code` is stable and documented; `message` is for
/// people. Neither ever carries an internal cause: those are logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// A missing task, another Space's task and a string that is not a task
    /// id all answer this, word for word, so ids cannot be probed.
    pub fn task_not_found() -> Self {
        Self::refused(&TaskRefusal::NotFound)
    }

    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }

    /// A domain refusal: the status of its kind, its code and message. A
    /// fault or an outage logs the error (its cause included); the client
    /// sees only the message.
    pub fn refused<E: Refusal>(e: &E) -> Self {
        let kind = e.kind();
        if matches!(kind, ErrorKind::Internal | ErrorKind::Unavailable) {
            tracing::error!(error = %e, code = e.code(), "request refused");
        }
        Self::new(status_of(kind), e.code(), e.message(&WORDING))
    }

    /// A domain refusal in this transport's own words: the status of its
    /// kind and its code, with `message` in place of the vocabulary's (a
    /// session token's, which tells where a token comes from here).
    pub fn refused_saying<E: Refusal>(e: &E, message: impl Into<String>) -> Self {
        Self::new(status_of(e.kind()), e.code(), message)
    }

    /// Logs the cause and answers a bare 500: the cause may name hosts,
    /// queries or secrets, none of which a client should see.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
    }
}

/// A response extension saying "this error response is already in its final
/// form": the x402 `402`, whose body is the payment challenge, not an envelope.
#[derive(Debug, Clone, Copy)]
pub struct Rendered;

// The OpenAPI document describes every error with this one schema and
// `render` builds every error body from it, so the two cannot drift. Doc
// comments here are the schema's descriptions: they are written for clients.

/// The body of every error response. It is sent with an `x-request-id`
/// header carrying `error.request_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"error": {
    "code": "invalid_token",
    "message": "the token is invalid or expired; open a new session",
    "request_id": "01HZX3Y4P5Q6R7S8T9V0W1X2Y3"
}}))]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Stable and `snake_case`: what a program should branch on. Each
    /// operation's responses list the codes it can answer with.
    pub code: String,
    /// For people; it may change between releases.
    pub message: String,
    /// The same value as the `x-request-id` response header.
    pub request_id: String,
}

fn render(status: StatusCode, code: &str, message: &str, request_id: &str) -> Response {
    let envelope = ErrorEnvelope {
        error: ErrorBody { code: code.to_owned(), message: message.to_owned(), request_id: request_id.to_owned() },
    };
    let body = serde_json::to_vec(&envelope).expect("the envelope is plain strings");
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = render(self.status, self.code, &self.message, "");
        response.extensions_mut().insert(self);
        response
    }
}

/// A request id we trust: our own ULID unless the caller sent a short,
/// printable one (an API gateway's id, say), which we keep for correlation.
fn request_id_of(request: &Request) -> String {
    request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(|| ulid::Ulid::new().to_string())
}

/// A request extension: an outer [`envelope`] has this request, so an inner
/// one (`reeve serve` wraps the routers, which carry their own, with one
/// more for its rate limiter) passes it through instead of rendering and
/// counting it a second time.
#[derive(Debug, Clone, Copy)]
struct Enveloped;

/// Middleware: gives every request an id, echoes it in `x-request-id`, and
/// makes every error response the JSON envelope carrying that id.
pub async fn envelope(mut request: Request, next: Next) -> Response {
    if request.extensions().get::<Enveloped>().is_some() {
        return next.run(request).await;
    }
    request.extensions_mut().insert(Enveloped);
    let request_id = request_id_of(&request);
    let route = request.extensions().get::<axum::extract::MatchedPath>().map_or("unmatched", |p| p.as_str()).to_owned();
    let (method, started) = (request.method().clone(), std::time::Instant::now());
    let header_value = HeaderValue::from_str(&request_id).expect("checked printable ASCII");
    request.headers_mut().insert(REQUEST_ID_HEADER, header_value.clone());

    let span = tracing::info_span!("request", request_id = %request_id, method = %request.method(), path = %request.uri().path());
    let mut response = next.run(request).instrument(span.clone()).await;

    let status = response.status();
    if let Some(error) = response.extensions_mut().remove::<ApiError>() {
        // `Retry-After` (a 429's) survives the re-rendering, and a refused
        // payment repeats the x402 challenge in a header of its own.
        let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
        let challenge = response.headers_mut().remove("payment-required");
        // A refused settle says why in x402's own header too.
        let settlement = response.headers_mut().remove("payment-response");
        response = render(error.status, error.code, &error.message, &request_id);
        if let Some(retry_after) = retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, retry_after);
        }
        if let Some(challenge) = challenge {
            response.headers_mut().insert("payment-required", challenge);
        }
        if let Some(settlement) = settlement {
            response.headers_mut().insert("payment-response", settlement);
        }
        span.in_scope(|| tracing::info!(status = status.as_u16(), code = error.code, "request failed"));
    } else if (status.is_client_error() || status.is_server_error())
        && response.extensions().get::<Rendered>().is_none()
    {
        // A response axum or a layer made on its own (405, 413 from the body
        // limit, ...): keep the status, give it the envelope.
        let (code, message) = fallback_code(status);
        let headers = std::mem::take(response.headers_mut());
        response = render(status, code, message, &request_id);
        if let Some(allow) = headers.get(header::ALLOW) {
            response.headers_mut().insert(header::ALLOW, allow.clone());
        }
    }
    response.headers_mut().insert(REQUEST_ID_HEADER, header_value);
    crate::infra::metrics::http_request(method.as_str(), &route, response.status().as_u16(), started.elapsed());
    crate::infra::metrics::flush();
    response
}

fn fallback_code(status: StatusCode) -> (&'static str, &'static str) {
    match status {
        StatusCode::NOT_FOUND => ("not_found", "no such route"),
        StatusCode::METHOD_NOT_ALLOWED => ("method_not_allowed", "method not allowed on this route"),
        StatusCode::PAYLOAD_TOO_LARGE => ("body_too_large", "request body too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported_media_type", "expected Content-Type: application/json"),
        StatusCode::REQUEST_TIMEOUT => ("timeout", "request timed out"),
        s if s.is_server_error() => ("internal", "internal error"),
        _ => ("bad_request", "bad request"),
    }
}

/// Fallback for unrouted paths, so a 404 also carries the envelope.
pub async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// A database failure: `503 database_unavailable` when Postgres is out of
/// reach (retrying may work), `500` for anything else. The cause is logged,
/// never returned.
pub fn db_error(e: sqlx::Error) -> ApiError {
    ApiError::refused(&e)
}

/// How messages name what a client sends over HTTP.
pub const WORDING: Wording = Wording {
    input: "`input`",
    idempotency_key: "Idempotency-Key",
    payment: "PAYMENT-SIGNATURE",
    retry_after: "Retry-After",
    catalog: "GET /v1/catalog",
    new_space: "POST /v1/spaces",
};

/// The status of each kind of refusal.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Input => StatusCode::BAD_REQUEST,
        ErrorKind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Auth => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Payment => StatusCode::PAYMENT_REQUIRED,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Limit => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
