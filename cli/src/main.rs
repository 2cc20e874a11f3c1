//! `reeve`: operations (config check, migrate, serve) and, later, a client.
//! Glue only: every command is a few calls into `reeve_shared`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use reeve_shared::catalog::Catalog;
use reeve_shared::http::{ApiContext, Connect, app};
use reeve_shared::settings::{DATABASE_URL, DEFAULT_CATALOG, Env};
use reeve_shared::{db, telemetry};

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
    let listener = tokio::net::TcpListener::bind(bind).await.with_context(|| format!("cannot listen on {bind}"))?;
    tracing::info!(%bind, "reeve serving");
    axum::serve(listener, app(ctx)).with_graceful_shutdown(shutdown_signal()).await?;
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
