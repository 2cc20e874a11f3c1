//! The relay service (docs/architecture.md#task-events-and-the-sse-relay): one long-lived process per Fargate task,
//! one Redis Pub/Sub connection shared by all its SSE clients.
//! Glue only: the context, both listen addresses and the run loop come from
//! the one start-up path (`reeve relay` runs the same), which reports every
//! problem of them at once and exits 1.

use reeve_shared::settings::Config;
use reeve_shared::{startup, telemetry};

#[tokio::main]
async fn main() {
    telemetry::init();
    let relay = startup::or_exit(startup::relay(&Config::from_env()));
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
        tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
    };
    if let Err(e) = startup::run_relay(relay, shutdown).await {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}
