//! `reeve`: operations (config check, migrate, serve, work) and a client of
//! any deployment (space, login, catalog, upload, task). Glue only: the
//! operations are calls into `reeve_shared`, the client lives in [`client`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use reeve_shared::db::Connect;
use reeve_shared::http::{app, relay_routes};
use reeve_shared::settings::{self, Config, DEFAULT_CATALOG, QUEUE_URL};
use reeve_shared::worker::Poller;
use reeve_shared::{aws, startup, telemetry};

mod client;
mod follow;
mod migrate;
mod pay;
mod space_view;
mod storage;
mod sweep;
mod watch;

use client::ClientOpts;
use client::commands::{self, LoginArgs, SpaceCommand, UploadArgs};
use client::task::{self, TaskCommand};

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
    /// Serve every route, the relay and a worker in one process.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: SocketAddr,
        /// The catalog file.
        #[arg(long, env = settings::CATALOG, default_value = DEFAULT_CATALOG)]
        catalog: PathBuf,
        /// Serve the routes only; run no worker in this process.
        #[arg(long)]
        no_worker: bool,
        /// Serve Prometheus `/metrics` here instead of on `--bind`.
        #[arg(long)]
        metrics_bind: Option<SocketAddr>,
        #[command(flatten)]
        sweep: sweep::WorkerSweepArgs,
    },
    /// Create a Space, or show its payments, credits and free-task quotas (client).
    // The client commands each take the client's flags (`--endpoint`,
    // `--json`, ...), which mean nothing to the operations above and below.
    Space {
        #[command(subcommand)]
        command: Option<SpaceCommand>,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Open a session on the profile's Space and cache its token (client).
    Login {
        #[command(flatten)]
        args: LoginArgs,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// The task kinds on offer and their prices (client).
    Catalog {
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Upload a file for a task's input; prints its upload id (client).
    Upload {
        #[command(flatten)]
        args: UploadArgs,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Create, list, read, cancel and follow tasks (client).
    Task {
        #[command(subcommand)]
        command: TaskCommand,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Run the SSE relay alone: what the Fargate service runs, started the
    /// same way.
    Relay {
        /// Address to listen on.
        #[arg(long, env = settings::RELAY_BIND, default_value = "127.0.0.1:8081")]
        bind: SocketAddr,
        /// Where Prometheus `/metrics` is served: never the relay's port,
        /// which a load balancer forwards whole.
        #[arg(long, env = settings::METRICS_BIND, default_value = "127.0.0.1:9090")]
        metrics_bind: SocketAddr,
    },
    /// Run the worker: long-poll the SQS queue and run its tasks.
    Work {
        /// The catalog file.
        #[arg(long, env = settings::CATALOG, default_value = DEFAULT_CATALOG)]
        catalog: PathBuf,
        /// Serve Prometheus `/metrics` on this address (none by default).
        #[arg(long)]
        metrics_bind: Option<SocketAddr>,
        #[command(flatten)]
        sweep: sweep::WorkerSweepArgs,
    },
    /// The S3 bucket: its policy (`reeve storage policy [--apply]`).
    Storage {
        #[command(subcommand)]
        command: storage::StorageCommand,
    },
    /// Send lost or expired tasks to the queue again; fail exhausted ones.
    Sweep(sweep::SweepArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate the catalog; prints every problem with its TOML path.
    Check {
        #[arg(long, env = settings::CATALOG, default_value = DEFAULT_CATALOG)]
        file: PathBuf,
        /// Also ask the facilitator (`facilitator_url`, or
        /// `REEVE_FACILITATOR_URL`) whether it settles every price.
        #[arg(long)]
        facilitator: bool,
    },
}

fn main() -> ExitCode {
    // A development `.env` (scripts/stack.sh writes one) fills in what the
    // environment lacks; real deployments set variables and have no file.
    let _ = dotenvy::dotenv();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Help and version are answers, not mistakes.
            return if e.use_stderr() { ExitCode::from(client::EXIT_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    let result = match cli.command {
        Command::Config { command: ConfigCommand::Check { file, facilitator } } => {
            return config_check(&file, facilitator);
        }
        Command::Migrate(args) => return migrate::run(args),
        Command::Serve { bind, catalog, no_worker, metrics_bind, sweep } => {
            runtime().block_on(serve(bind, &catalog, (!no_worker).then_some(sweep), metrics_bind))
        }
        Command::Space { command, client } => {
            return run_client(client, |c, o| Box::pin(commands::space(c, o, command.unwrap_or(SpaceCommand::Show))));
        }
        Command::Login { args, client } => return run_client(client, |c, o| Box::pin(commands::login(c, o, args))),
        Command::Catalog { client } => return run_client(client, |c, o| Box::pin(commands::catalog(c, o))),
        Command::Upload { args, client } => return run_client(client, |c, o| Box::pin(commands::upload(c, o, args))),
        Command::Task { command, client } => return run_client(client, |c, o| Box::pin(task::task(c, o, command))),
        Command::Relay { bind, metrics_bind } => runtime().block_on(relay(bind, metrics_bind)),
        Command::Work { catalog, metrics_bind, sweep } => runtime().block_on(work(&catalog, metrics_bind, &sweep)),
        Command::Storage { command } => runtime().block_on(storage::run(command)),
        Command::Sweep(args) => runtime().block_on(sweep::run(args, shutdown_signal())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

type ClientFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<ExitCode, client::ClientError>> + 'a>>;

/// Runs a client command and turns its error into the documented exit code,
/// printing the server's code and message (or JSON with `--json`).
fn run_client(
    opts: ClientOpts,
    command: impl for<'a> FnOnce(&'a mut client::Client, &'a ClientOpts) -> ClientFuture<'a>,
) -> ExitCode {
    runtime().block_on(async {
        let mut client = match client::Client::open(&opts) {
            Ok(client) => client,
            Err(e) => {
                commands::report(None, &opts, &e).await;
                return e.exit_code();
            }
        };
        match command(&mut client, &opts).await {
            Ok(code) => code,
            Err(e) => {
                commands::report(Some(&client), &opts, &e).await;
                e.exit_code()
            }
        }
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("the OS gives us threads")
}

fn config_check(file: &Path, ask_facilitator: bool) -> ExitCode {
    // Checked as every start-up checks it: against the worker's time limit
    // (REEVE_WORKER_TIMEOUT_SECONDS) too.
    let config = Config::from_env().with(settings::CATALOG, file.display().to_string());
    let mut problems = Vec::new();
    let catalog = startup::catalog_file(&config, &mut problems);
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
    match runtime().block_on(startup::check_facilitator(&catalog, facilitator.as_ref())) {
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
async fn serve(
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
            let sweeping = startup::sweeper_beside(&worker, sqs.clone(), queue_url.clone()).spawn_every(
                sweep.every(),
                sweep.older_than(),
                when(stopped.clone()),
            );
            let mut poller = Poller::connect(Arc::new(worker), sqs, queue_url).await?;
            // Shutdown waits for a long poll in flight, so a local server polls
            // in short rounds to stop quickly on Ctrl-C.
            poller.wait_time_seconds = SERVE_POLL_SECONDS;
            Some((poller, sweeping))
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
            if let Some((poller, sweeping)) = poller {
                poller.run(when(stopped)).await;
                let _ = sweeping.await;
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
async fn relay(bind: SocketAddr, metrics_bind: SocketAddr) -> anyhow::Result<()> {
    telemetry::init();
    let config = Config::from_env()
        .with(settings::RELAY_BIND, bind.to_string())
        .with(settings::METRICS_BIND, metrics_bind.to_string());
    startup::run_relay(startup::relay(&config)?, shutdown_signal()).await?;
    Ok(())
}

/// Polls and sweeps until Ctrl-C or SIGTERM, then finishes the messages in
/// flight.
async fn work(catalog: &Path, metrics_bind: Option<SocketAddr>, sweep: &sweep::WorkerSweepArgs) -> anyhow::Result<()> {
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
    let sweeping = startup::sweeper_beside(&ctx, sqs.clone(), queue_url.clone()).spawn_every(
        sweep.every(),
        sweep.older_than(),
        when(stopped.clone()),
    );
    let poller = Poller::connect(Arc::new(ctx), sqs, queue_url).await?;
    poller.run(when(stopped)).await;
    let _ = sweeping.await;
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

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
}
