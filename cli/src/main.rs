//! `reeve`: a client of any deployment (space, login, catalog, upload, task:
//! [`client`]) and the operations that run Reeve (config check, migrate,
//! serve, work, relay, sweep, tasks, payments, storage: [`ops`]). Glue only: the commands,
//! their flags, and the dispatch to each group's module.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use reeve_shared::settings::{self, DEFAULT_CATALOG};

mod client;
mod follow;
mod help;
mod ops;
mod pay;
mod space_view;
mod watch;

use client::ClientOpts;
use client::receipt::{self, ReceiptCommand};
use client::space::{self, LoginArgs, SpaceCommand};
use client::task::{self, TaskCommand};
use client::upload::{self, UploadArgs};
use ops::{migrate, payments, storage, sweep, tasks};

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
    /// Create a Space, or show its payments, credits and free-task quotas.
    // The client commands each take the client's flags (`--endpoint`,
    // `--json`, ...), which mean nothing to the operations above and below.
    Space {
        #[command(subcommand)]
        command: Option<SpaceCommand>,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Open a session on the profile's Space and cache its token.
    Login {
        #[command(flatten)]
        args: LoginArgs,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// End the cached session at once and forget its token (the Space ID stays).
    Logout {
        #[command(flatten)]
        client: ClientOpts,
    },
    /// The task kinds on offer and their prices.
    Catalog {
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Upload a file for a task's input; prints its upload id.
    Upload {
        #[command(flatten)]
        args: UploadArgs,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// Create, list, read, cancel and follow tasks.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
        #[command(flatten)]
        client: ClientOpts,
    },
    /// A paid task's signed receipt: fetch it, or check one offline.
    Receipt {
        #[command(subcommand)]
        command: ReceiptCommand,
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
    /// Cancel or run again many tasks by filter (a dry run unless --yes).
    Tasks {
        #[command(subcommand)]
        command: tasks::TasksCommand,
    },
    /// Batch-settlement channels: what is charged, claimed and due; a
    /// payer's refund.
    Payments {
        #[command(subcommand)]
        command: payments::PaymentsCommand,
    },
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
    let parsed = help::grouped(Cli::command()).try_get_matches().and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // Help and version are answers, not mistakes.
            return if e.use_stderr() { ExitCode::from(client::EXIT_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    let result = match cli.command {
        Command::Config { command: ConfigCommand::Check { file, facilitator } } => {
            return runtime().block_on(ops::config_check(&file, facilitator));
        }
        Command::Migrate(args) => return migrate::run(args),
        Command::Serve { bind, catalog, no_worker, metrics_bind, sweep } => {
            runtime().block_on(ops::serve(bind, &catalog, (!no_worker).then_some(sweep), metrics_bind))
        }
        Command::Space { command, client } => {
            return run_client(client, |c, o| Box::pin(space::space(c, o, command.unwrap_or(SpaceCommand::Show))));
        }
        Command::Login { args, client } => return run_client(client, |c, o| Box::pin(space::login(c, o, args))),
        Command::Logout { client } => return run_client(client, |c, o| Box::pin(space::logout(c, o))),
        Command::Catalog { client } => return run_client(client, |c, o| Box::pin(space::catalog(c, o))),
        Command::Upload { args, client } => return run_client(client, |c, o| Box::pin(upload::upload(c, o, args))),
        Command::Task { command, client } => return run_client(client, |c, o| Box::pin(task::task(c, o, command))),
        Command::Receipt { command, client } => {
            return run_client(client, |c, o| Box::pin(receipt::receipt(c, o, command)));
        }
        Command::Relay { bind, metrics_bind } => runtime().block_on(ops::relay(bind, metrics_bind)),
        Command::Work { catalog, metrics_bind, sweep } => runtime().block_on(ops::work(&catalog, metrics_bind, &sweep)),
        Command::Storage { command } => runtime().block_on(storage::run(command)),
        Command::Sweep(args) => runtime().block_on(sweep::run(args, ops::shutdown_signal())),
        Command::Tasks { command } => runtime().block_on(tasks::run(command)),
        Command::Payments { command: payments::PaymentsCommand::Channels(args) } => {
            runtime().block_on(payments::channels(args))
        }
        Command::Payments { command: payments::PaymentsCommand::Refund(args) } => {
            return run_client(args.client.clone(), |c, o| Box::pin(client::refund::refund(c, o, *args)));
        }
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
                client::report(None, &opts, &e).await;
                return e.exit_code();
            }
        };
        match command(&mut client, &opts).await {
            Ok(code) => code,
            Err(e) => {
                client::report(Some(&client), &opts, &e).await;
                e.exit_code()
            }
        }
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("the OS gives us threads")
}
