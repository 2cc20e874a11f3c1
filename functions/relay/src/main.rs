//! The relay service (docs/architecture.md#task-events-and-the-sse-relay): one long-lived process per Fargate task,
//! one Redis Pub/Sub connection shared by all its SSE clients.
//! Glue only: the routes are `reeve_shared::http::events`'s; the context and
//! the bind address come from the one start-up path, which reports every
//! problem of both at once and exits 1.

use reeve_shared::http::events::{RelayContext, router};
use reeve_shared::http::{CorsOrigins, with_cors};
use reeve_shared::{startup, telemetry};

#[tokio::main]
async fn main() {
    telemetry::init();
    let ((ctx, bind), cors) = startup::or_exit(startup::both(
        startup::both(RelayContext::from_env(), startup::relay_bind()),
        CorsOrigins::from_env(),
    ));
    let listener = match tokio::net::TcpListener::bind(bind).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!("cannot listen on {bind}: {e}");
            std::process::exit(1);
        }
    };
    tracing::info!(%bind, "relay serving");
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
        tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
    };
    if let Err(e) = axum::serve(listener, with_cors(router(ctx), &cors)).with_graceful_shutdown(shutdown).await {
        tracing::error!("relay stopped: {e}");
        std::process::exit(1);
    }
}
