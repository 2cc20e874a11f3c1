//! The relay service (docs/architecture.md#task-events-and-the-sse-relay): one long-lived process per Fargate task,
//! one Redis Pub/Sub connection shared by all its SSE clients.
//! Glue only: the routes are `reeve_shared::http::stream`'s; the context and
//! both listen addresses come from the one start-up path, which reports
//! every problem of them at once and exits 1.
//!
//! Prometheus `/metrics` is served on a listener of its own
//! (`REEVE_METRICS_BIND`), never on the relay's port: the load balancer
//! forwards every path of that port to the internet.

use reeve_shared::http::stream::{RelayContext, router};
use reeve_shared::http::{CorsOrigins, with_cors};
use reeve_shared::{metrics, startup, telemetry};

#[tokio::main]
async fn main() {
    telemetry::init();
    let ((ctx, listen), cors) = startup::or_exit(startup::both(
        startup::both(RelayContext::from_env(), startup::relay_listeners()),
        CorsOrigins::from_env(),
    ));
    let metrics_listener = match metrics::install_prometheus() {
        Ok(handle) => {
            metrics::serve(listen.metrics, handle).await.map_err(|e| metrics::MountError::Bind(listen.metrics, e))
        }
        Err(e) => Err(e.into()),
    };
    if let Err(e) = metrics_listener {
        tracing::error!("{e}");
        std::process::exit(1);
    }
    let listener = match tokio::net::TcpListener::bind(listen.relay).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!("cannot listen on {}: {e}", listen.relay);
            std::process::exit(1);
        }
    };
    tracing::info!(bind = %listen.relay, "relay serving");
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
