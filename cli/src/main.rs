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
use reeve_shared::http::{ApiContext, Connect, app};
use reeve_shared::aws::AwsClients;
use reeve_shared::settings::{DATABASE_URL, DEFAULT_CATALOG, Env, QUEUE_URL};
use reeve_shared::worker::{Poller, WorkerContext};
use reeve_shared::{db, telemetry};

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
    /// Apply the database migrations (safe to run again).
    Migrate,
    /// Serve every route in one process.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: SocketAddr,
        /// The catalog file.
        #[arg(long, env = "REEVE_CATALOG", default_value = DEFAULT_CATALOG)]
        catalog: PathBuf,
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
    },
    /// Run the worker: long-poll the SQS queue and run its tasks.
    Work {
        /// The catalog file.
        #[arg(long, env = "REEVE_CATALOG", default_value = DEFAULT_CATALOG)]
        catalog: PathBuf,
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
        Command::Migrate => runtime().block_on(migrate()),
        Command::Serve { bind, catalog } => runtime().block_on(serve(bind, &catalog)),
        Command::Task { command: TaskCommand::Watch { id, endpoint, token } } => {
            return match runtime().block_on(watch::watch(&endpoint, &token, id)) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(3)
                }
            };
        }
        Command::Relay { bind } => runtime().block_on(relay(bind)),
        Command::Work { catalog } => runtime().block_on(work(&catalog)),
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

async fn migrate() -> anyhow::Result<()> {
    telemetry::init();
    let mut env = Env::process();
    let url = env.required(DATABASE_URL);
    env.finish()?;
    let pool = db::connect(&url).await?;
    db::migrate(&pool).await?;
    println!("migrations applied: {}", db::MIGRATOR.iter().count());
    Ok(())
}

async fn serve(bind: SocketAddr, catalog: &Path) -> anyhow::Result<()> {
    telemetry::init();
    let ctx = ApiContext::from_env(catalog, Connect::Now).await?;
    let relay = RelayContext::from_env()?;
    // The relay's routes have no fallback of their own, so they merge into
    // the API's: one listener for everything, as a local stand-in for the
    // API Gateway plus the Fargate service.
    let routes = events::routes(relay).merge(app(ctx));
    let routes = reeve_shared::http::with_cors(routes, &reeve_shared::http::CorsOrigins::from_env()?);
    let listener = tokio::net::TcpListener::bind(bind).await.with_context(|| format!("cannot listen on {bind}"))?;
    tracing::info!(%bind, "reeve serving");
    axum::serve(listener, routes).with_graceful_shutdown(shutdown_signal()).await?;
    Ok(())
}

async fn relay(bind: SocketAddr) -> anyhow::Result<()> {
    telemetry::init();
    let ctx = RelayContext::from_env()?;
    let listener = tokio::net::TcpListener::bind(bind).await.with_context(|| format!("cannot listen on {bind}"))?;
    tracing::info!(%bind, "relay serving");
    let routes = reeve_shared::http::with_cors(events::router(ctx), &reeve_shared::http::CorsOrigins::from_env()?);
    axum::serve(listener, routes).with_graceful_shutdown(shutdown_signal()).await?;
    Ok(())
}

/// Polls until Ctrl-C or SIGTERM, then finishes the messages in flight.
async fn work(catalog: &Path) -> anyhow::Result<()> {
    telemetry::init();
    let ctx = WorkerContext::from_env(catalog, Connect::Now).await?;
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
