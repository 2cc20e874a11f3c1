//! `reeve`: operations (config check, migrate, serve, work) and, later, a client.
//! Glue only: every command is a few calls into `reeve_shared`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use reeve_shared::catalog::Catalog;
use reeve_shared::ids::Id;
use reeve_shared::http::events::{self, RelayContext};
use reeve_shared::http::app;
use reeve_shared::http::limit::{self, LoginLimits};
use reeve_shared::aws::AwsClients;
use reeve_shared::db::Connect;
use reeve_shared::settings::{DEFAULT_CATALOG, Needs, QUEUE_URL};
use reeve_shared::worker::Poller;
use reeve_shared::{startup, telemetry};

mod migrate;
mod storage;
mod watch;

#[derive(Parser)]
#[command(name = "reeve", version, about = "Reeve: zero-account, pay-per-task jobs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check the task catalog (reeve.toml).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Apply the database migrations (safe to run again); `--dry-run` lists
    /// them, `status` compares the database with this binary.
    Migrate(migrate::MigrateArgs),
    /// Serve every route in one process.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: SocketAddr,
        /// The catalog file.
        #[arg(long, env = "REEVE_CATALOG", default_value = DEFAULT_CATALOG)]
        catalog: PathBuf,
        /// Serve Prometheus `/metrics` here instead of on `--bind`.
        #[arg(long)]
        metrics_bind: Option<SocketAddr>,
    },
    /// Tasks, as a client: follow one to its end.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// Run the SSE relay alone (what the Fargate service runs).
    Relay {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8081")]
        bind: SocketAddr,
        /// Serve Prometheus `/metrics` here instead of on `--bind`.
        #[arg(long)]
        metrics_bind: Option<SocketAddr>,
    },
    /// Run the worker: long-poll the SQS queue and run its tasks.
    Work {
        /// The catalog file.
        #[arg(long, env = "REEVE_CATALOG", default_value = DEFAULT_CATALOG)]
        catalog: PathBuf,
        /// Serve Prometheus `/metrics` on this address (none by default).
        #[arg(long)]
        metrics_bind: Option<SocketAddr>,
    },
    /// The S3 bucket: its policy (`reeve storage policy [--apply]`).
    Storage {
        #[command(subcommand)]
        command: storage::StorageCommand,
    },
}

#[derive(Subcommand)]
enum TaskCommand {
    /// Follow a task's events with a progress bar; exits 0 when it completes,
    /// 1 when it fails, 2 when it is canceled.
    Watch {
        /// The task id (26-character ULID).
        id: Id,
        /// The deployment (its relay, or `reeve serve`).
        #[arg(long, env = "REEVE_ENDPOINT", default_value = "http://127.0.0.1:8080")]
        endpoint: String,
        /// A session token from `POST /v1/sessions`.
        #[arg(long, env = "REEVE_TOKEN", hide_env_values = true)]
        token: String,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate the catalog; prints every problem with its TOML path.
    Check {
        #[arg(long, env = "REEVE_CATALOG", default_value = DEFAULT_CATALOG)]
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    // A development `.env` (scripts/stack.sh writes one) fills in what the
    // environment lacks; real deployments set variables and have no file.
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Config { command: ConfigCommand::Check { file } } => return config_check(&file),
        Command::Migrate(args) => return migrate::run(args),
        Command::Serve { bind, catalog, metrics_bind } => runtime().block_on(serve(bind, &catalog, metrics_bind)),
        Command::Task { command: TaskCommand::Watch { id, endpoint, token } } => {
            return match runtime().block_on(watch::watch(&endpoint, &token, id)) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(3)
                }
            };
        }
        Command::Relay { bind, metrics_bind } => runtime().block_on(relay(bind, metrics_bind)),
        Command::Work { catalog, metrics_bind } => runtime().block_on(work(&catalog, metrics_bind)),
        Command::Storage { command } => runtime().block_on(storage::run(command)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("the OS gives us threads")
}

fn config_check(file: &Path) -> ExitCode {
    match Catalog::load(file) {
        Ok(catalog) => {
            println!("{}: ok, {}", file.display(), catalog.summary());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(bind: SocketAddr, catalog: &Path, metrics_bind: Option<SocketAddr>) -> anyhow::Result<()> {
    telemetry::init();
    // Both contexts' problems at once.
    let (ctx, relay) = startup::both(startup::api(Needs::ALL, catalog, Connect::Now).await, RelayContext::from_env())?;
    // The relay's routes have no fallback of their own, so they merge into
    // the API's: one listener for everything, as a local stand-in for the
    // API Gateway plus the Fargate service.
    let routes = events::routes(relay).merge(app(ctx));
    // Per-client login limits (the envelope outside gives a 429 its request id).
    let routes = routes
        .layer(axum::middleware::from_fn_with_state(Arc::new(LoginLimits::default()), limit::limit))
        .layer(axum::middleware::from_fn(reeve_shared::error::envelope));
    let routes = reeve_shared::metrics::mount(routes, metrics_bind).await?;
    let listener = tokio::net::TcpListener::bind(bind).await.with_context(|| format!("cannot listen on {bind}"))?;
    tracing::info!(%bind, "reeve serving");
    // The peer address is what the login limits count by.
    let service = routes.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service).with_graceful_shutdown(shutdown_signal()).await?;
    Ok(())
}

async fn relay(bind: SocketAddr, metrics_bind: Option<SocketAddr>) -> anyhow::Result<()> {
    telemetry::init();
    let ctx = RelayContext::from_env()?;
    let listener = tokio::net::TcpListener::bind(bind).await.with_context(|| format!("cannot listen on {bind}"))?;
    tracing::info!(%bind, "relay serving");
    let routes = reeve_shared::metrics::mount(events::router(ctx), metrics_bind).await?;
    axum::serve(listener, routes).with_graceful_shutdown(shutdown_signal()).await?;
    Ok(())
}

/// Polls until Ctrl-C or SIGTERM, then finishes the messages in flight.
async fn work(catalog: &Path, metrics_bind: Option<SocketAddr>) -> anyhow::Result<()> {
    telemetry::init();
    if let Some(bind) = metrics_bind {
        reeve_shared::metrics::serve(bind, reeve_shared::metrics::install_prometheus()?).await?;
    }
    let ctx = startup::worker(catalog, Connect::Now).await?;
    let Some(queue_url) = ctx.settings.queue_url.clone() else {
        anyhow::bail!("bad environment: {QUEUE_URL} is not set");
    };
    let sqs = AwsClients::from_env().await.sqs;
    let poller = Poller::connect(Arc::new(ctx), sqs, queue_url).await?;
    poller.run(shutdown_signal()).await;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
}
