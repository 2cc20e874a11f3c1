//! `reeve-bench`: the harness behind `BENCHMARKS.md`. Each subcommand runs
//! one benchmark against the local stack (loopback only, with its own
//! database and its own `redis-server`) and prints a Markdown section;
//! `scripts/bench.sh` builds everything in release and stitches the sections
//! together. The machine is shared and noisy: every figure that matters is a
//! median or a ratio measured side by side in one run.

mod auth;
mod baseline;
mod coldstart;
mod fairness;
mod fanout;
mod paid;
mod service;
mod stack;
mod taskcreate;
mod worker;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Reeve's benchmarks (see scripts/bench.sh)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Relay fan-out: the relay binary against the one-connection-per-client
    /// baseline, then the ceiling.
    Fanout(fanout::Args),
    /// The baseline relay itself (started by `fanout`): the seed's design,
    /// one Redis Pub/Sub connection and one pump task per client.
    BaselineRelay(baseline::Args),
    /// Session creation at 1k/100k/1M spaces, one Argon2id verify, a token check.
    Auth(auth::Args),
    /// Task create through the API's router against a bare INSERT + SendMessage loop.
    Taskcreate(taskcreate::Args),
    /// Task start latency and worker throughput, each beside the local
    /// queue's own floor.
    Worker(worker::Args),
    /// Executor protocol v1: a no-op asynchronous service through Reeve
    /// against calling it directly, and reports per second against a bare
    /// INSERT + PUBLISH.
    Service(service::Args),
    /// Create to running for a free, an `exact`-paid and a
    /// batch-settlement-paid task, and transactions per 100 paid tasks.
    Paid(paid::Args),
    /// Another Space's task start with one Space's backlog of 1,000 queued,
    /// beside the same on an idle deployment.
    Fairness(fairness::Args),
    /// Exec to first runtime-API request, per function binary.
    Coldstart(coldstart::Args),
    /// One line about this machine, for the report's header.
    Machine,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    stack::raise_fd_limit(1 << 18);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Fanout(args) => fanout::run(args).await,
            Command::BaselineRelay(args) => baseline::serve(args).await,
            Command::Auth(args) => auth::run(args).await,
            Command::Coldstart(args) => coldstart::run(args).await,
            Command::Taskcreate(args) => taskcreate::run(args).await,
            Command::Worker(args) => worker::run(args).await,
            Command::Service(args) => service::run(args).await,
            Command::Paid(args) => paid::run(args).await,
            Command::Fairness(args) => fairness::run(args).await,
            Command::Machine => {
                println!("{}", stack::machine());
                Ok(())
            }
        }
    })
}

/// The `q`-quantile (0..=1) of sorted samples.
pub fn quantile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    quantile(&samples, 0.5)
}
