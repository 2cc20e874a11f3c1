//! The HTTP API as axum routers. Each concept has its own `router()`; the
//! Lambda functions run one each, `reeve serve` merges them all with [`app`],
//! and tests drive the same routers in-process with `oneshot`.
//!
//! A module router is a utoipa-axum [`OpenApiRouter`]: every route is added
//! with `routes!(handler)`, whose `#[utoipa::path]` documents it, so
//! [`openapi`] (`GET /v1/openapi.json`) lists exactly what is routed.

// Error descriptions several operations share, as macros so that an
// operation can `concat!` its own codes to them. Defined before the modules
// that use them.
macro_rules! doc_400_json {
    () => {
        "`invalid_json`: the body is not JSON (the message names the line and column); \
         `invalid_request`: JSON of the wrong shape (a missing, unknown or mistyped field); \
         `invalid_body`: the body could not be read."
    };
}
macro_rules! doc_401_token {
    () => {
        "`missing_token`: no `Authorization: Bearer` header; `invalid_token`: the token is \
         malformed, tampered with, expired, or ended by `DELETE /v1/sessions/current` or by a \
         rotation of the Space ID (`POST /v1/space/rotate`) (open a new session with \
         `POST /v1/sessions`); `token_in_url`: a session token in the query string \
         (send it as the header)."
    };
}
macro_rules! doc_413 {
    () => {
        "`body_too_large`: the body is over 64 KiB."
    };
}
macro_rules! doc_415 {
    () => {
        "`unsupported_media_type`: the request did not send `Content-Type: application/json`."
    };
}
macro_rules! doc_500 {
    () => {
        "`internal`: an unexpected failure, logged under the request id."
    };
}
macro_rules! doc_422_webhook {
    () => {
        "`invalid_webhook`: the webhook's `url` is not an absolute `https://` URL of at most 2048 \
         characters without credentials, or its `events` are empty or not among `completed`, \
         `failed`, `canceled`, `progress`; `webhook_secret_required`: the Space has no webhook secret to sign \
         with yet (`POST /v1/space/webhook-secret`)."
    };
}
macro_rules! doc_503_db {
    () => {
        "`database_unavailable`: the database is out of reach; try again."
    };
}

#[cfg(feature = "api-catalog")]
pub mod catalog;
#[cfg(feature = "relay")]
pub mod console;
mod context;
#[cfg(feature = "relay")]
pub(crate) mod cors;
pub(crate) mod error;
#[cfg(feature = "api-tasks")]
pub mod executor_reports;
pub(crate) mod extract;
mod no_token_in_url;
// The relay answers its own `/healthz` with the API's `Health`.
#[cfg(any(feature = "api", feature = "relay"))]
pub(crate) mod health;
#[cfg(feature = "api-auth")]
pub(crate) mod limit;
#[cfg(feature = "api-auth")]
pub mod login;
#[cfg(feature = "api-catalog")]
mod openapi;
#[cfg(feature = "api-tasks")]
pub mod pay_links;
#[cfg(feature = "api-task-status")]
mod receipts;
#[cfg(feature = "api-tasks")]
pub mod refunds;
#[cfg(feature = "relay")]
mod relay_context;
#[cfg(feature = "api-task-status")]
mod share;
#[cfg(feature = "api-task-status")]
pub(crate) mod space_view;
#[cfg(feature = "relay")]
pub mod stream;
#[cfg(feature = "api-task-status")]
pub mod tasks;
#[cfg(feature = "api-task-status")]
mod ticket;
#[cfg(feature = "api-uploads")]
pub mod uploads;
#[cfg(feature = "api-task-status")]
mod webhooks;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use utoipa_axum::router::OpenApiRouter;

pub use crate::infra::client_addr::{
    EDGE_SECRET_HEADER, EdgeSecret, VIEWER_ADDRESS_HEADER, client_behind, client_ip, client_key, client_of,
};
#[cfg(feature = "api-catalog")]
pub use context::CatalogContext;
#[cfg(feature = "api-tasks")]
pub use context::TaskCreateContext;
#[cfg(feature = "api-task-status")]
pub use context::TaskStatusContext;
#[cfg(feature = "api-uploads")]
pub use context::UploadsContext;
#[cfg(feature = "api")]
pub use context::{ApiContext, Ctx, HealthContext};
pub use context::{ApiSettings, SessionKey};
#[cfg(feature = "api-auth")]
pub use context::{AuthContext, AuthSettings};
#[cfg(feature = "relay")]
pub use cors::{CorsOrigins, with_cors};
pub use error::{ApiError, ErrorEnvelope, REQUEST_ID_HEADER, envelope};
#[cfg(feature = "api")]
pub use openapi::generated as generated_openapi;
#[cfg(feature = "api-catalog")]
pub use openapi::{BEARER, PAY_LINK, SHARE, STREAM_PATH, TICKET, openapi};
#[cfg(feature = "relay")]
pub use relay_context::{DEFAULT_KEEPALIVE, RelayContext, RelayCtx, RelayLimits};

/// The header an idempotent task create sends (the route and the document).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Requests carry small JSON documents; files go straight to S3.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

#[cfg(any(feature = "api-auth", feature = "api-catalog", feature = "api-uploads", feature = "api-task-status"))]
/// A module's routes on their context. The router's part of the OpenAPI
/// document is dropped: [`openapi`] is the whole API's, and only the
/// catalog function serves it.
fn routed<S: Clone + Send + Sync + 'static>(router: OpenApiRouter<S>, ctx: S) -> Router {
    let (router, _doc) = router.split_for_parts();
    router.with_state(ctx)
}

/// Wraps routes with what every route shares: the error envelope with a
/// request id, the body limit and the JSON 404 for unknown paths.
fn finish(routes: Router) -> Router {
    routes
        .fallback(error::no_route)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(no_token_in_url::refuse))
        .layer(axum::middleware::from_fn(error::envelope))
}

#[cfg(feature = "api-auth")]
/// The `auth` function: `POST /v1/spaces`, `POST /v1/sessions`,
/// `DELETE /v1/sessions/current`.
pub fn auth_app(ctx: Arc<AuthContext>) -> Router {
    finish(routed(login::router(), ctx))
}

#[cfg(feature = "api-catalog")]
/// The `catalog` function: `GET /v1/catalog`, `GET /v1/openapi.json`.
pub fn catalog_app(ctx: Arc<CatalogContext>) -> Router {
    finish(routed(catalog::router(), ctx))
}

#[cfg(feature = "api-uploads")]
/// The `presign` function: `POST /v1/uploads`.
pub fn presign_app(ctx: Arc<UploadsContext>) -> Router {
    finish(routed(uploads::router(), ctx))
}

#[cfg(feature = "api-tasks")]
/// The `task-create` function: `POST /v1/tasks/{kind}`, the executor
/// report route (`POST /v1/executor/reports`, see [`executor_reports`] for
/// why it lives here), the pay page's `GET`/`POST /v1/pay-link`
/// ([`pay_links`]: paying a link creates a task, with what a create needs)
/// and a batch-settlement channel's cooperative refund
/// (`GET /v1/refund/{kind}`, [`refunds`]: the kind's offer, as a create has
/// it).
pub fn task_create_app(ctx: Arc<TaskCreateContext>) -> Router {
    finish(routed(task_create_routes(), ctx))
}

#[cfg(feature = "api-tasks")]
fn task_create_routes() -> OpenApiRouter<Arc<TaskCreateContext>> {
    tasks::create_router().merge(executor_reports::router()).merge(pay_links::router()).merge(refunds::router())
}

#[cfg(feature = "api-task-status")]
/// The `task-status` function: a task, the list, cancel and `GET /v1/space`.
pub fn task_status_app(ctx: Arc<TaskStatusContext>) -> Router {
    finish(routed(tasks::status_router(), ctx))
}

#[cfg(feature = "api")]
/// Every API route on one router: what `reeve serve` listens with, each
/// module's routes on their part of `ctx`.
pub fn app(ctx: Ctx) -> Router {
    finish(
        routed(health::router(), ctx.health.clone())
            .merge(routed(catalog::router(), ctx.catalog_ctx.clone()))
            .merge(routed(login::router(), ctx.auth.clone()))
            .merge(routed(uploads::router(), ctx.uploads.clone()))
            .merge(routed(task_create_routes(), ctx.task_create.clone()))
            .merge(routed(tasks::status_router(), ctx.task_status.clone())),
    )
}

#[cfg(feature = "api")]
/// Each API Gateway function's HTTP routes, `(METHOD, path)`, under the
/// name of the function of this crate its `main` serves (`http::auth_app`):
/// what `template.yaml` must route to that function, no more and no less
/// (the MCP endpoint, another adapter, is `mcp::PATH`). A route added to a
/// router and not to the template works under `reeve serve` and is missing in AWS; a test compares the two.
pub fn lambda_routes() -> Vec<(&'static str, Vec<(String, String)>)> {
    fn of<S: Clone + Send + Sync + 'static>(router: OpenApiRouter<S>) -> Vec<(String, String)> {
        let doc = serde_json::to_value(router.into_openapi()).expect("documents serialise");
        let mut routes = Vec::new();
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            for method in ["get", "put", "post", "delete", "patch", "head", "options"] {
                if item.get(method).is_some() {
                    routes.push((method.to_uppercase(), path.clone()));
                }
            }
        }
        routes
    }
    vec![
        ("http::auth_app", of(login::router())),
        ("http::catalog_app", of(catalog::router())),
        ("http::presign_app", of(uploads::router())),
        ("http::task_create_app", of(task_create_routes())),
        ("http::task_status_app", of(tasks::status_router())),
    ]
}

#[cfg(feature = "api")]
/// Every module's part of the OpenAPI document, merged.
fn documented() -> utoipa::openapi::OpenApi {
    let mut doc = health::router().into_openapi();
    doc.merge(catalog::router().into_openapi());
    doc.merge(login::router().into_openapi());
    doc.merge(uploads::router().into_openapi());
    doc.merge(task_create_routes().into_openapi());
    doc.merge(tasks::status_router().into_openapi());
    doc
}

#[cfg(feature = "relay")]
/// The relay as its own service: the event stream, the watch page and
/// `/healthz` for the load balancer.
pub fn relay_app(ctx: RelayCtx) -> Router {
    stream::router(ctx)
}

#[cfg(feature = "relay")]
/// The relay's routes without `/healthz`, to merge into `reeve serve`'s app.
pub fn relay_routes(ctx: RelayCtx) -> Router {
    stream::routes(ctx)
}
