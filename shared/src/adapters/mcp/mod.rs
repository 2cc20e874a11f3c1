//! Agents' way in: one stateless MCP endpoint, `POST /mcp` (Streamable
//! HTTP, from the official Rust SDK `rmcp`). Every catalog kind is a tool,
//! beside the tools an agent needs around it: `create_space`, `login`,
//! `create_upload`, `get_task`, `list_tasks`, `cancel_task`, `get_result`.
//! The same code runs in the `mcp` Lambda and in `reeve serve`.
//!
//! Like the HTTP routes, every tool is one call into the domain
//! ([`crate::domain::tasks::submit`], [`crate::domain::spaces`], [`crate::domain::uploads`]); it
//! never calls a route. This module imports no other adapter.
//!
//! Module map:
//! - [`context`]: what the tools need, and the endpoint's settings.
//! - [`tool`]: what a tool that is not a kind declares ([`tool::FixedTool`]):
//!   name, description, schemas, who may call it, its handler.
//! - [`tools`]: those tools, one file each, and the registry that lists
//!   them and builds the tool list once, with the kinds'.
//! - [`kind`]: a catalog kind's tool: its listing, and its call (one submit).
//! - [`task`]: a task as the task tools answer it.
//! - [`schema`]: the schemas the listings share.
//! - [`server`]: rmcp's `ServerHandler`: dispatch, identity, the tasks extension.
//! - [`payment`]: x402's MCP binding around the one payment path.
//! - [`elicit`]: payment by URL elicitation, for a client without x402: a
//!   pay link to the console's pay page, and the retried call's task.
//! - [`wait`]: following a task until it ends, with progress notifications.
//! - [`failure`]: the boundary's errors, each a stable `code`.
//!
//! **Stateless.** No session store: each POST is served on its own (rmcp's
//! stateless mode), so any Lambda instance answers any request. (The
//! `Mcp-Session-Id` a client declaring URL elicitation is given is no
//! session: its declaration, sealed; see [`elicit`].) A reply is
//! plain JSON unless the tool sends a notification first (progress), when
//! rmcp switches that one reply to an event stream.
//!
//! **What rmcp cannot say (yet).** x402's extension binding answers an unpaid
//! call of a client that advertises `org.x402/payment` with `{resultType:
//! "payment_required", paymentRequired}`. rmcp 3.11 (the newest release)
//! cannot send it. Its `ServerResult::CustomResult` is reached only from
//! `on_custom_request`, for methods rmcp does not know; `tools/call` goes to
//! `call_tool`, whose `CallToolResponse` is a complete result, an
//! input-required result or a task handle, each with fixed fields, none of
//! which is `paymentRequired` (`CallToolResult`'s open `resultType` could
//! name the type but not carry the object). And its HTTP service serves only
//! a `ServerHandler`, so a `Service` answering `tools/call` itself cannot be
//! plugged in; rewriting rmcp's JSON on its way out would be a JSON-RPC layer
//! of our own. So the endpoint does not advertise `org.x402/payment`, and
//! every client gets the tool-result binding (`isError: true` with the
//! `PaymentRequired`), which the spec requires of a server that does not
//! support the extension.

mod context;
mod elicit;
pub(crate) mod failure;
mod kind;
mod payment;
mod schema;
mod server;
mod task;
mod tool;
mod tools;
mod wait;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;

pub use context::{McpContext, McpSettings, McpStores};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
pub use wait::MAX_WAIT_SECONDS;

/// The endpoint's path.
pub const PATH: &str = "/mcp";

/// The largest inline upload (`create_upload` with `content_base64`),
/// decoded: larger files take the presigned PUT. A request body carries it
/// as base64 inside JSON-RPC, within [`MAX_BODY_BYTES`]. The endpoint's two
/// limits sit here together; the tool list shows this one, the tool checks it.
pub const MAX_INLINE_BYTES: usize = 1024 * 1024;

/// The largest request body, refused before a byte of it is parsed: an
/// inline upload of [`MAX_INLINE_BYTES`] in base64 (4/3 of it) plus room for
/// the JSON-RPC envelope. Anything larger is no tool call Reeve serves.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// `POST /mcp` on its own router, as the `mcp` Lambda runs it: behind API
/// Gateway (or `cargo lambda watch`) it cannot know the address it is
/// reached at, so only the configured origins are let in.
pub fn router(ctx: Arc<McpContext>) -> Router {
    routed(ctx, None)
}

/// `POST /mcp` for a process that listens at `listening` itself (`reeve
/// serve` merges it with the API's routes): on loopback, its own origin is
/// let in too ([`McpSettings::allowed_origins_at`]).
pub fn router_at(ctx: Arc<McpContext>, listening: SocketAddr) -> Router {
    routed(ctx, Some(listening))
}

fn routed(ctx: Arc<McpContext>, listening: Option<SocketAddr>) -> Router {
    let config = StreamableHttpServerConfig::default()
        // No sessions: every request stands alone, whichever instance gets it.
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        // DNS rebinding: a Host outside the list is refused, and so is a
        // browser Origin outside the list.
        .with_allowed_hosts(ctx.settings.allowed_hosts.clone())
        .with_allowed_origins(ctx.settings.allowed_origins_at(listening))
        // An empty list refuses every browser Origin rather than allowing all.
        .enforce_origin_validation();
    // The tool list is built here, once; each request gets a clone.
    let server = server::ReeveMcp::new(ctx.clone());
    let service =
        StreamableHttpService::new(move || Ok(server.clone()), Arc::new(NeverSessionManager::default()), config);
    Router::new().route_service(PATH, service).layer(axum::middleware::from_fn_with_state(ctx, as_json_rpc))
}

/// What reaches a client outside a JSON-RPC reply: a body over the limit
/// (refused on its `Content-Length` before it is read), and rmcp's own HTTP
/// refusals (a host or origin not allowed, a wrong `Accept`), which it sends
/// as plain text. Each becomes a JSON-RPC error with a stable `data.code`,
/// at the same HTTP status. And an `initialize` that declares URL
/// elicitation is answered with that declaration sealed in its
/// `Mcp-Session-Id` ([`elicit`]: a stateless server's way to know it later).
async fn as_json_rpc(State(ctx): State<Arc<McpContext>>, request: Request<Body>, next: Next) -> Response {
    let declared =
        request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return refusal(StatusCode::PAYLOAD_TOO_LARGE, &too_large());
    }
    let (request, sealed) = elicit::initialize_declared(request, &ctx.token_key).await;
    let mut response = next.run(request).await;
    if let Some(sealed) = sealed.filter(|_| response.status().is_success())
        && let Ok(value) = HeaderValue::from_str(&sealed)
    {
        response.headers_mut().insert(elicit::SESSION_HEADER, value);
    }
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/event-stream"));
    if !status.is_client_error() || is_json {
        return response;
    }
    // rmcp's refusals are one short line; read no more than that.
    let text = match axum::body::to_bytes(response.into_body(), 4096).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let message = if status == StatusCode::PAYLOAD_TOO_LARGE { too_large() } else { text };
    refusal(status, &message)
}

/// A time in a tool's answer: RFC 3339, as the REST API writes it.
pub(crate) fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).expect("a UTC time formats")
}

fn too_large() -> String {
    format!("the request body is over {MAX_BODY_BYTES} bytes; inline uploads take at most {MAX_INLINE_BYTES} bytes")
}

fn refusal(status: StatusCode, message: &str) -> Response {
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::FORBIDDEN if message.contains("Origin") => "origin_not_allowed",
        StatusCode::FORBIDDEN => "host_not_allowed",
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        _ => "invalid_request",
    };
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": rmcp::model::ErrorCode::INVALID_REQUEST.0, "message": message, "data": { "code": code } },
    });
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
