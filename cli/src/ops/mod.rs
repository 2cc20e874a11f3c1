//! The operations, as `reeve --help` groups them: checking the catalog,
//! migrating, serving, working, relaying, sweeping, bulk cancel and re-run,
//! batch-settlement channels, and the bucket's policy.
//! Each reads its variables through `reeve_shared::startup`, as the Lambda
//! functions and the Fargate service do; the flags stand in for variables.

pub mod migrate;
pub mod payments;
pub mod storage;
pub mod sweep;
pub mod tasks;

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use reeve_shared::db::Connect;
use reeve_shared::http::{app, relay_routes};
use reeve_shared::settings::{self, Config, QUEUE_URL};
use reeve_shared::webhooks::sender::POLL;
use reeve_shared::worker::Poller;
use reeve_shared::{aws, startup, telemetry};

/// `reeve config check`: every problem with its TOML path, every network
/// priced without a chain endpoint (`REEVE_CHAIN_RPC_URLS`) and every
/// protocol kind whose signing secret is not set or not readable, then
/// (with `--facilitator`) whether the facilitator settles every price.
pub async fn config_check(file: &Path, ask_facilitator: bool) -> ExitCode {
    // Checked as every start-up checks it: against the worker's time limit
    // (REEVE_WORKER_TIMEOUT_SECONDS) too.
    let config = Config::from_env().with(settings::CATALOG, file.display().to_string());
    let mut problems = Vec::new();
    let catalog = startup::compiled_catalog_file(&config, &mut problems);
    // Every network it prices in needs a chain endpoint to prove payments
    // (REEVE_CHAIN_RPC_URLS), as every paying process's start-up insists.
    if let Some(catalog) = &catalog {
        startup::chain_endpoints(&config, Some(catalog), &mut problems);
        // Each protocol kind's signing secret, read as the worker's start-up
        // reads it (from its variable, or Secrets Manager by its ARN), so a
        // secret the worker would refuse is found before the deploy.
        startup::executor_secrets(&config, startup::sdk, catalog, &mut problems).await;
        // The seller's key, where the environment gives one: its address
        // must be the catalog's receipt_signer.
        startup::receipt_key_check(&config, catalog, &mut problems).await;
    }
    let catalog = match catalog {
        Some(catalog) if problems.is_empty() => catalog,
        _ => {
            for problem in problems {
                eprintln!("{problem}");
            }
            return ExitCode::FAILURE;
        }
    };
    // Legal but probably a mistake (a testnet price in a catalog for
    // mainnet): said, but the catalog is still usable.
    for warning in catalog.warnings() {
        eprintln!("warning: {}: {warning}", file.display());
    }
    let ok = || println!("{}: ok, {}", file.display(), catalog.summary());
    if !ask_facilitator {
        ok();
        return ExitCode::SUCCESS;
    }
    let facilitator = match startup::facilitator_for(&config, &catalog) {
        Ok(facilitator) => facilitator,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    match startup::check_facilitator(&catalog, facilitator.as_ref()).await {
        startup::FacilitatorCheck::Unpriced => {
            ok();
            println!("{}: nothing is priced, so no facilitator is asked", file.display());
            ExitCode::SUCCESS
        }
        startup::FacilitatorCheck::Settles { url, networks } => {
            ok();
            println!("{}: the facilitator {url} settles every price ({})", file.display(), networks.join(", "));
            ExitCode::SUCCESS
        }
        startup::FacilitatorCheck::Refuses(problems) => {
            for problem in problems {
                eprintln!("{}: {problem}", file.display());
            }
            ExitCode::FAILURE
        }
        startup::FacilitatorCheck::Unknown { url, error } => {
            eprintln!("{}: cannot ask {url}/supported: {error}", file.display());
            ExitCode::FAILURE
        }
    }
}

/// How long open event streams may go on once the worker has stopped.
const STREAM_GRACE: std::time::Duration = std::time::Duration::from_secs(3);
/// How long `reeve serve`'s worker long-polls the queue for.
const SERVE_POLL_SECONDS: i32 = 5;

/// Every route, the relay and (unless `worker` is `None`) a worker polling
/// the queue and sweeping as `reeve work` does, in one process. On Ctrl-C or
/// SIGTERM the listener stops taking connections, open requests and the
/// messages in flight finish, a receive in flight gives its messages back
/// and the sweeps stop; then the process exits.
pub async fn serve(
    bind: SocketAddr,
    catalog: &Path,
    worker: Option<sweep::WorkerSweepArgs>,
    metrics_bind: Option<SocketAddr>,
) -> anyhow::Result<()> {
    telemetry::init();
    let config = Config::from_env().with(settings::CATALOG, catalog.display().to_string());
    let sdk = startup::sdk().await;
    // Every context's problems at once, on one Postgres pool.
    let startup::Serve { api, relay, cors, worker: worker_ctx, mcp } =
        startup::serve(&config, &sdk, worker.is_some()).await?;
    // One signal, seen by the listener, the poller and the sweeps.
    let stopped = stop_on_signal();
    let poller = match (worker, worker_ctx) {
        (Some(sweep), Some(worker)) => {
            let queue_url = api.settings.queue_url.clone();
            let sqs = api.aws.sqs.clone();
            let sweeping = startup::sweeper_beside(&worker, &config, &sdk, sqs.clone(), queue_url.clone())
                .await?
                .spawn_every(sweep.every(), sweep.older_than(), when(stopped.clone()));
            // Completion webhooks, from their outbox, every second.
            let sending = startup::webhooks_beside(&worker, &config)?.spawn_every(POLL, when(stopped.clone()));
            let mut poller = Poller::connect(Arc::new(worker), sqs, queue_url).await?;
            // Shutdown waits for a long poll in flight, so a local server polls
            // in short rounds to stop quickly on Ctrl-C.
            poller.wait_time_seconds = SERVE_POLL_SECONDS;
            Some((poller, sweeping, sending))
        }
        _ => None,
    };
    // The relay's routes have no fallback of their own, so they merge into
    // the API's: one listener for everything, as a local stand-in for the
    // API Gateway plus the Fargate service.
    let routes = relay_routes(relay).merge(app(api));
    // The envelope gives every error its request id.
    let routes = routes.layer(axum::middleware::from_fn(reeve_shared::http::envelope));
    let listener = tokio::net::TcpListener::bind(bind).await.with_context(|| format!("cannot listen on {bind}"))?;
    // `POST /mcp` outside the envelope: its errors are JSON-RPC's, not the
    // API's. It knows where it listens, so on loopback a page of its own
    // origin may call it.
    let routes = routes.merge(reeve_shared::mcp::router_at(mcp, listener.local_addr()?));
    let routes = reeve_shared::http::with_cors(routes, &cors);
    let routes = reeve_shared::metrics::mount(routes, metrics_bind).await?;
    tracing::info!(%bind, worker = poller.is_some(), "reeve serving");

    let (done, worker_done) = tokio::sync::watch::channel(poller.is_none());
    let work = tokio::spawn({
        let stopped = stopped.clone();
        async move {
            if let Some((poller, sweeping, sending)) = poller {
                poller.run(when(stopped)).await;
                let _ = sweeping.await;
                let _ = sending.await;
            }
            let _ = done.send(true);
        }
    });
    // The peer address is what the login limits count by.
    let service = routes.into_make_service_with_connect_info::<SocketAddr>();
    let server = axum::serve(listener, service).with_graceful_shutdown(when(stopped.clone())).into_future();
    // An event stream stays open until its task ends, and a queued task's
    // never does once the worker has stopped: after the worker's last
    // events have had time to reach their watchers, stop waiting.
    let streams_closed = async {
        when(stopped).await;
        when(worker_done).await;
        tokio::time::sleep(STREAM_GRACE).await;
    };
    tokio::select! {
        served = server => served?,
        () = streams_closed => tracing::info!("closing the event streams still open"),
    }
    work.await?;
    Ok(())
}

/// The relay alone, started as the Fargate service starts it; the flags
/// stand in for its variables.
pub async fn relay(bind: SocketAddr, metrics_bind: SocketAddr) -> anyhow::Result<()> {
    telemetry::init();
    let config = Config::from_env()
        .with(settings::RELAY_BIND, bind.to_string())
        .with(settings::METRICS_BIND, metrics_bind.to_string());
    startup::run_relay(startup::relay(&config)?, shutdown_signal()).await?;
    Ok(())
}

/// Polls and sweeps until Ctrl-C or SIGTERM, then finishes the messages in
/// flight.
pub async fn work(
    catalog: &Path,
    metrics_bind: Option<SocketAddr>,
    sweep: &sweep::WorkerSweepArgs,
) -> anyhow::Result<()> {
    telemetry::init();
    if let Some(bind) = metrics_bind {
        reeve_shared::metrics::serve(bind, reeve_shared::metrics::install_prometheus()?).await?;
    }
    let config = Config::from_env().with(settings::CATALOG, catalog.display().to_string());
    // The SDK's configuration is loaded once, for the worker's S3 and the
    // poller's SQS alike.
    let sdk = startup::sdk().await;
    let ctx = startup::worker(&config, &sdk, Connect::Now).await?;
    let Some(queue_url) = ctx.settings.queue_url.clone() else {
        anyhow::bail!("bad environment: {QUEUE_URL} is not set");
    };
    let sqs = aws::sqs(&sdk);
    let stopped = stop_on_signal();
    // The sweeps find the tasks whose message was lost.
    let sweeping = startup::sweeper_beside(&ctx, &config, &sdk, sqs.clone(), queue_url.clone()).await?.spawn_every(
        sweep.every(),
        sweep.older_than(),
        when(stopped.clone()),
    );
    // Completion webhooks, from their outbox, every second.
    let sending = startup::webhooks_beside(&ctx, &config)?.spawn_every(POLL, when(stopped.clone()));
    let poller = Poller::connect(Arc::new(ctx), sqs, queue_url).await?;
    poller.run(when(stopped)).await;
    let _ = sweeping.await;
    let _ = sending.await;
    Ok(())
}

/// A stop flag set on the first Ctrl-C or SIGTERM, for every part of the
/// process to see (see [`when`]).
fn stop_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop.send(true);
    });
    stopped
}

/// Resolves once the stop flag is set.
async fn when(mut stopped: tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|set| *set).await;
}

pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
}
