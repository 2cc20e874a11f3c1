//! The HTTP API as axum routers. Each concept has its own `router()`; the
//! Lambda functions run one each, `reeve serve` merges them all with [`app`],
//! and tests drive the same routers in-process with `oneshot`.

pub mod catalog;
mod context;
pub mod extract;
pub mod health;
pub mod spaces;
pub mod tasks;
pub mod uploads;

use axum::Router;
use axum::extract::DefaultBodyLimit;

pub use context::{ApiContext, Connect, Ctx, StartupError};

use crate::error;

/// Requests carry small JSON documents; files go straight to S3.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Wraps a router with what every route shares: the error envelope with a
/// request id, the body limit and the JSON 404 for unknown paths.
pub fn finish(router: Router<Ctx>, ctx: Ctx) -> Router {
    router
        .fallback(error::no_route)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(error::envelope))
        .with_state(ctx)
}

/// Every route on one router: what `reeve serve` listens with.
pub fn app(ctx: Ctx) -> Router {
    let routes = Router::new().merge(health::router()).merge(catalog::router()).merge(spaces::router())
        .merge(uploads::router())
        .merge(tasks::create_router())
        .merge(tasks::status_router());
    finish(routes, ctx)
}
