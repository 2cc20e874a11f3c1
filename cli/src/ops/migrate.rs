//! `reeve migrate`: apply, preview (`--dry-run`) or compare (`status`) the
//! migrations this binary carries against the database's record of them.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use reeve_shared::db::{self, MIGRATOR, MigrationEntry, MigrationReport, MigrationState};
use reeve_shared::settings::Config;
use reeve_shared::{startup, telemetry};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MigrateArgs {
    /// List the migrations that would be applied, and apply nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(subcommand)]
    command: Option<MigrateCommand>,
}

#[derive(Subcommand)]
enum MigrateCommand {
    /// Show applied and pending migrations with their checksums. Exits 1
    /// when the database is ahead of this binary, a checksum differs or a
    /// migration failed half-way.
    Status,
}

enum Mode {
    Apply,
    DryRun,
    Status,
}

pub fn run(args: MigrateArgs) -> ExitCode {
    let mode = match (args.command, args.dry_run) {
        (Some(MigrateCommand::Status), _) => Mode::Status,
        (None, true) => Mode::DryRun,
        (None, false) => Mode::Apply,
    };
    let runtime = tokio::runtime::Runtime::new().expect("the OS gives us threads");
    match runtime.block_on(migrate(mode)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `Ok(false)` when the database and this binary disagree.
async fn migrate(mode: Mode) -> anyhow::Result<bool> {
    telemetry::init();
    let url = startup::database_url(&Config::from_env(), &startup::sdk().await).await?;
    let pool = db::connect(url.expose_str()).await?;
    let report = db::migration_status(&pool, &MIGRATOR).await?;
    match mode {
        Mode::Apply => {
            // sqlx would refuse too, but with a less helpful message.
            if !report.is_consistent() {
                print_problems(&report);
                return Ok(false);
            }
            let pending = report.pending().count();
            db::migrate(&pool).await?;
            println!("migrations applied: {pending} new, {} in total", MIGRATOR.iter().count());
            Ok(true)
        }
        Mode::DryRun => {
            let pending: Vec<&MigrationEntry> = report.pending().collect();
            if pending.is_empty() {
                println!("nothing to apply: the database is up to date");
            } else {
                println!("would apply {} migration(s):", pending.len());
                for e in pending {
                    println!("  {}", line(e));
                }
            }
            print_problems(&report);
            Ok(report.is_consistent())
        }
        Mode::Status => {
            for e in &report.entries {
                println!("{}", line(e));
            }
            let pending = report.pending().count();
            let applied = report.entries.iter().filter(|e| e.state == MigrationState::Applied).count();
            println!("{applied} applied, {pending} pending");
            print_problems(&report);
            Ok(report.is_consistent())
        }
    }
}

fn label(state: &MigrationState) -> &'static str {
    match state {
        MigrationState::Applied => "applied",
        MigrationState::Pending => "pending",
        MigrationState::ChecksumMismatch { .. } => "CHECKSUM MISMATCH",
        MigrationState::Failed => "FAILED",
        MigrationState::Unknown => "UNKNOWN TO THIS BINARY",
    }
}

/// `0001  applied  3f2a…  init`: the first 16 hex digits of the SHA-384 are
/// enough to tell versions apart; a mismatch prints both in full.
fn line(e: &MigrationEntry) -> String {
    format!("{:04}  {:<22}  {}  {}", e.version, label(&e.state), &e.checksum[..16.min(e.checksum.len())], e.description)
}

fn print_problems(report: &MigrationReport) {
    for e in report.problems() {
        let why = match &e.state {
            MigrationState::ChecksumMismatch { applied } => format!(
                "was applied from different SQL than this binary carries\n  binary:   {}\n  database: {applied}",
                e.checksum
            ),
            MigrationState::Failed => "is recorded as failed; the schema may be half-changed".to_string(),
            MigrationState::Unknown => {
                "is in the database but not in this binary: the database is ahead; deploy the newer binary".to_string()
            }
            MigrationState::Applied | MigrationState::Pending => continue,
        };
        eprintln!("error: migration {:04} ({}) {why}", e.version, e.description);
    }
}
