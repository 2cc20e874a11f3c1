//! `reeve sweep`: sends lost or expired tasks to the queue again and fails
//! the ones out of attempts (see `reeve_shared::sweeper`).

use std::time::Duration;

use clap::Args;
use reeve_shared::settings::Config;
use reeve_shared::sweeper;
use reeve_shared::{startup, telemetry};

#[derive(Args)]
pub struct SweepArgs {
    /// Sweep only tasks left alone for at least this long (default
    /// REEVE_SWEEP_OLDER_THAN_SECONDS, else 300); 0 sweeps every stranded task.
    #[arg(long, value_name = "SECONDS")]
    older_than: Option<u64>,
    /// Sweep once and exit, instead of every 15 s until stopped.
    #[arg(long)]
    once: bool,
    /// The catalog: a payment that landed late buys a task only of a kind
    /// it still offers (else a credit). Default REEVE_CATALOG, else reeve.toml.
    #[arg(long, value_name = "PATH")]
    catalog: Option<std::path::PathBuf>,
}

pub async fn run(args: SweepArgs, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    telemetry::init();
    let mut config = Config::from_env();
    if let Some(catalog) = &args.catalog {
        config = config.with(reeve_shared::settings::CATALOG, catalog.display().to_string());
    }
    let sweeper = startup::sweeper(&config, &startup::sdk().await).await?;
    let older_than = args.older_than.map_or(sweeper.older_than, Duration::from_secs);
    if !args.once {
        sweeper.run_every(sweeper::EVERY, older_than, shutdown).await;
        return Ok(());
    }
    let report = sweeper.sweep(older_than).await?;
    println!(
        "swept: {} queued and {} expired tasks sent again, {} failed as retries_exhausted, {} sends failed",
        report.resent_queued, report.resent_expired, report.exhausted, report.send_errors
    );
    let p = &report.payments;
    println!(
        "payments: {} landed late (task created), {} credited, {} never landed, {} still open, {} chain errors",
        p.settled_late, p.credited, p.not_settled, p.open, p.chain_errors
    );
    if report.send_errors > 0 {
        anyhow::bail!("{} tasks could not be sent to the queue", report.send_errors);
    }
    Ok(())
}

/// The sweep a long-running worker (`reeve work`, `reeve serve`) runs beside
/// its poller.
#[derive(Args)]
pub struct WorkerSweepArgs {
    /// How often the worker sweeps for lost or expired tasks, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = sweeper::EVERY.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    sweep_every: u64,
    /// What the worker's sweep counts as stranded: tasks left alone for at
    /// least this many seconds.
    #[arg(long, value_name = "SECONDS", env = reeve_shared::settings::SWEEP_OLDER_THAN,
          default_value_t = sweeper::DEFAULT_OLDER_THAN.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=14 * 86_400))]
    sweep_older_than: u64,
}

impl WorkerSweepArgs {
    pub fn every(&self) -> Duration {
        Duration::from_secs(self.sweep_every)
    }

    pub fn older_than(&self) -> Duration {
        Duration::from_secs(self.sweep_older_than)
    }
}
