//! `reeve tasks cancel|rerun`: an operator's bulk cancel and re-run, over
//! `DATABASE_URL`, the queue and Redis, as `reeve sweep` reaches them (see
//! `reeve_shared::tasks::bulk`). A dry run first by default: the count and
//! a sample; `--yes` acts, in batches, with a progress line per batch.

use clap::{Args, Subcommand};
use reeve_shared::auth::SpaceIndex;
use reeve_shared::ids::Id;
use reeve_shared::settings::{self, Config};
use reeve_shared::tasks::TaskStatus;
use reeve_shared::tasks::bulk::{Action, Filter, Operator};
use reeve_shared::{startup, telemetry};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

#[derive(Subcommand)]
pub enum TasksCommand {
    /// Cancel the matching tasks: queued ones at once, running ones asked to
    /// stop; ended ones are left as they are. A dry run unless --yes.
    Cancel(BulkArgs),
    /// Run the matching tasks that failed by Reeve's fault again, as a new
    /// attempt; a task failed by its input never is. A paid task's re-run
    /// spends the credit its failure left. A dry run unless --yes.
    Rerun(BulkArgs),
}

#[derive(Args)]
pub struct BulkArgs {
    /// Only tasks of this kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only tasks in this status. Repeatable.
    #[arg(long = "status", value_name = "STATUS", value_parser = parse_status)]
    statuses: Vec<TaskStatus>,
    /// Only failed tasks with this error code (`retries_exhausted`, ...).
    /// Repeatable.
    #[arg(long = "code", value_name = "CODE")]
    codes: Vec<String>,
    /// Only tasks created at or after this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    since: Option<OffsetDateTime>,
    /// Only tasks created before this time (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    until: Option<OffsetDateTime>,
    /// Only this Space's tasks: its index, 32 hex digits, as the logs and
    /// the S3 keys name it.
    #[arg(long, value_name = "SPACE_INDEX", value_parser = parse_space)]
    space: Option<SpaceIndex>,
    /// Only these tasks. Repeatable.
    #[arg(long = "id", value_name = "TASK_ID")]
    ids: Vec<Id>,
    /// Only count and show a sample (the default).
    #[arg(long, conflicts_with = "yes")]
    dry_run: bool,
    /// Act: change the matching tasks.
    #[arg(long, visible_alias = "apply")]
    yes: bool,
    /// Tasks changed per batch.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch: u32,
    /// How many matching tasks a dry run shows.
    #[arg(long, default_value_t = 10)]
    sample: usize,
    /// The catalog, as `reeve sweep` reads it (default REEVE_CATALOG, else
    /// reeve.toml).
    #[arg(long, value_name = "PATH")]
    catalog: Option<std::path::PathBuf>,
}

fn parse_status(s: &str) -> Result<TaskStatus, String> {
    TaskStatus::parse(s).ok_or_else(|| "expected queued, running, completed, failed or canceled".to_owned())
}

fn parse_time(s: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(s, &Rfc3339)
        .map_err(|e| format!("expected an RFC 3339 time such as 2026-12-01T00:00:00Z: {e}"))
}

fn parse_space(s: &str) -> Result<SpaceIndex, String> {
    let bytes = hex::decode(s).map_err(|_| "expected 32 hex digits".to_owned())?;
    SpaceIndex::from_slice(&bytes).ok_or_else(|| "expected 32 hex digits (16 bytes)".to_owned())
}

pub async fn run(command: TasksCommand) -> anyhow::Result<()> {
    telemetry::init();
    let (action, args) = match command {
        TasksCommand::Cancel(args) => (Action::Cancel, args),
        TasksCommand::Rerun(args) => (Action::Rerun, args),
    };
    let filter = Filter {
        space: args.space,
        ids: (!args.ids.is_empty()).then_some(args.ids),
        kind: args.kind,
        statuses: (!args.statuses.is_empty()).then_some(args.statuses),
        codes: (!args.codes.is_empty()).then_some(args.codes),
        created_after: args.since,
        created_before: args.until,
    };
    // A Space alone is a filter for an operator, never nothing at all.
    let named = filter.space.is_some()
        || filter.ids.is_some()
        || filter.kind.is_some()
        || filter.statuses.is_some()
        || filter.codes.is_some()
        || filter.created_after.is_some()
        || filter.created_before.is_some();
    if !named {
        anyhow::bail!("name at least one of --id, --kind, --status, --code, --since, --until or --space");
    }
    filter.check_values().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut config = Config::from_env();
    if let Some(catalog) = &args.catalog {
        config = config.with(settings::CATALOG, catalog.display().to_string());
    }
    let sweeper = startup::sweeper(&config, &startup::sdk().await).await?;
    let counted = filter.count(&sweeper.db).await?;
    let (verb, acting) = match action {
        Action::Cancel => ("cancel", counted.open),
        Action::Rerun => ("run again", counted.rerunnable),
    };
    println!(
        "{} tasks match: {acting} to {verb}, {} already ended{}",
        counted.matched,
        counted.ended,
        match action {
            Action::Cancel => String::new(),
            Action::Rerun => format!(
                " ({} failed by their input or not failed: never run again)",
                counted.matched - counted.rerunnable
            ),
        }
    );
    if !args.yes {
        let sample = filter.page(&sweeper.db, action.candidates(), None, args.sample).await?;
        for task in &sample {
            let code = task.code.as_deref().unwrap_or("-");
            println!("  {}  {}  {}  {}  space {}", task.id, task.kind, task.status.as_str(), code, task.space.0);
        }
        let them = match action {
            Action::Cancel => "cancel them",
            Action::Rerun => "run them again",
        };
        println!("dry run: nothing changed; add --yes to {them}");
        return Ok(());
    }
    let by = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let operator = Operator {
        db: &sweeper.db,
        events: &sweeper.events,
        sqs: &sweeper.sqs,
        queue_url: &sweeper.queue_url,
        by: &by,
    };
    let tally = operator
        .apply(&filter, action, args.batch as usize, |tally| {
            println!(
                "{}: {}/{acting} done ({} changed, {} asked to stop, {} skipped)",
                action.name(),
                tally.seen,
                tally.done,
                tally.requested,
                tally.skipped
            );
        })
        .await?;
    match action {
        Action::Cancel => {
            println!("canceled {}, asked {} running to stop, skipped {}", tally.done, tally.requested, tally.skipped)
        }
        Action::Rerun => println!(
            "queued again {}, skipped {} (metered, or their credit paid for another task), {} not sent yet (the sweeper sends them)",
            tally.done, tally.skipped, tally.unsent
        ),
    }
    Ok(())
}
