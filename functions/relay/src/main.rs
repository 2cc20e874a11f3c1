//! The relay service (DESIGN §8): one long-lived process per Fargate task,
//! one Redis Pub/Sub connection shared by all its SSE clients.
//! Glue only: the routes are `reeve_shared::http::events`'s.

use std::net::SocketAddr;

use reeve_shared::http::events::{RelayContext, router};
use reeve_shared::http::{CorsOrigins, with_cors};
use reeve_shared::telemetry;

#[tokio::main]
async fn main() {
    telemetry::init();
    let (ctx, cors) = match RelayContext::from_env().and_then(|ctx| Ok((ctx, CorsOrigins::from_env()?))) {
        Ok(ctx) => ctx,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            std::process::exit(1);
        }
    };
    // In a container the relay must listen beyond loopback; REEVE_RELAY_BIND
    // narrows it elsewhere.
    let bind: SocketAddr = std::env::var("REEVE_RELAY_BIND")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8080)));
    let listener = match tokio::net::TcpListener::bind(bind).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!("cannot listen on {bind}: {e}");
            std::process::exit(1);
        }
    };
    tracing::info!(%bind, "relay serving");
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
        tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
    };
    if let Err(e) = axum::serve(listener, with_cors(router(ctx), &cors)).with_graceful_shutdown(shutdown).await {
        tracing::error!("relay stopped: {e}");
        std::process::exit(1);
    }
}
