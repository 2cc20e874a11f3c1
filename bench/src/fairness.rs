//! Fairness between Spaces: how long another Space's single task takes to
//! start while one Space has a backlog of 1,000 queued, beside how long it
//! takes on an idle deployment, in one run.
//!
//! Reeve is the release `reeve` as in the worker bench: `serve --no-worker`
//! takes the creates, `reeve work` runs the tasks at its default
//! concurrency, on a database, an SQS queue (moto: no fair delivery of its
//! own, so the worker's limit does the whole job) and a `redis-server` of
//! the harness's own. The catalog sets `running_per_space` below the
//! worker's concurrency, so the busy Space holds some of the slots and not
//! all. The task is a free `http` kind against a loopback endpoint that
//! answers after the `sleep_ms` its input asks: the backlog's tasks take
//! [`BACKLOG_TASK_MS`] each, the measured task none.
//!
//! - **Idle**: the quiet Space creates a task, waits for it to end, and
//!   creates the next; create's `202` to its `running` event (as it reaches
//!   Redis).
//! - **With the backlog**: the busy Space queues [`Args::backlog`] tasks
//!   through the API; then the quiet Space does exactly the same as idle,
//!   while the backlog waits. The busy Space's tasks still queued when the
//!   last sample is taken are counted, to show the backlog was there.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use aws_sdk_sqs::types::QueueAttributeName;
use futures_util::{StreamExt, stream};
use reeve_shared::auth::{self, Secret, SpaceIndex};
use reeve_shared::ids::Id;
use reeve_shared::worker::WorkerSettings;
use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::stack::{BenchDb, OwnMoto, OwnRedis, free_port};
use crate::worker::{Api, Env, KIND, TASK_LIMIT, Tracker, follow_events, ms, verdict};

#[derive(clap::Args)]
pub struct Args {
    /// The release `reeve` binary.
    #[arg(long)]
    reeve: PathBuf,
    /// The busy Space's backlog.
    #[arg(long, default_value_t = 1000)]
    backlog: usize,
    /// Tasks the quiet Space creates, one after another, on each side.
    #[arg(long, default_value_t = 40)]
    samples: usize,
    /// The catalog's `running_per_space`: below the worker's concurrency.
    #[arg(long, default_value_t = 2)]
    running_per_space: u32,
}

/// How long each of the backlog's tasks runs: long enough that the busy
/// Space stays at its limit for the whole measurement.
const BACKLOG_TASK_MS: u64 = 250;
/// Clients that queue the backlog through the API.
const SEED_CLIENTS: usize = 4;
/// The goal: another Space's start p50 with the backlog ≤ this × idle.
const GOAL: f64 = 2.0;

fn catalog(endpoint: &str, running_per_space: u32) -> String {
    let shipped = include_str!("../../reeve.dev.toml");
    format!(
        "{shipped}\n[limits]\nrunning_per_space = {running_per_space}\n\
         [tasks.{KIND}]\ntitle = \"Bench\"\nexecutor = \"http\"\nendpoint = \"{endpoint}\"\n\
         timeout_seconds = 30\ninput_schema = {{ type = \"object\" }}\n\
         [tasks.{KIND}.quota]\nper_hour = 1000000\nat_once = 10000\n"
    )
}

/// The `http` executor's endpoint: answers `{}` after the input's `sleep_ms`.
async fn endpoint() -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let app = axum::Router::new().route(
        "/",
        axum::routing::post(|axum::Json(input): axum::Json<Value>| async move {
            if let Some(ms) = input["sleep_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            axum::Json(json!({}))
        }),
    );
    Ok((url, tokio::spawn(async move { axum::serve(listener, app).await.expect("the endpoint serves") })))
}

/// A Space of the harness's own and an API client with its session.
async fn space(db: &BenchDb, key: &Secret, base: &str) -> anyhow::Result<(SpaceIndex, Api)> {
    let space = SpaceIndex::from_array(Id::new().to_bytes());
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'bench')").bind(space.as_bytes()).execute(&db.pool).await?;
    let (token, _) = auth::issue_token(key, &space, OffsetDateTime::now_utc());
    Ok((space, Api { http: reqwest::Client::new(), base: base.to_owned(), token: token.into() }))
}

/// `n` tasks of the quiet Space, one after another: µs from each create's
/// `202` to its `running` event, sorted.
async fn starts(api: &Api, tracker: &Tracker, n: usize) -> anyhow::Result<Vec<u64>> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let key = api.create(json!({ "quiet": i })).await?;
        let created = Instant::now();
        let seen = tracker.ended(&key, TASK_LIMIT).await?;
        let started = seen.running.context("a running event")?;
        samples.push(started.saturating_duration_since(created).as_micros() as u64);
    }
    samples.sort_unstable();
    Ok(samples)
}

struct Measured {
    idle: Vec<u64>,
    busy: Vec<u64>,
    /// The busy Space's tasks queued (and running) when the last sample was
    /// taken.
    still_queued: i64,
    still_running: i64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    ensure!(args.backlog >= 1000, "the backlog is at least 1,000 tasks");
    ensure!(
        (args.running_per_space as usize) < WorkerSettings::DEFAULT_CONCURRENCY,
        "running_per_space must leave the quiet Space a slot of the worker's {}",
        WorkerSettings::DEFAULT_CONCURRENCY
    );
    let db = BenchDb::create("fairness").await?;
    let redis = OwnRedis::start().await?;
    let moto = OwnMoto::start().await?;
    let sqs = moto.sqs().await;
    let queue = sqs
        .create_queue()
        .queue_name(format!("reeve-bench-fairness-{}", std::process::id()))
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .send()
        .await
        .context("creating the harness's SQS queue")?
        .queue_url()
        .context("a queue url")?
        .to_owned();
    let result = measure(&args, &db, &redis, &moto, &queue).await;
    moto.stop().await;
    redis.stop().await;
    db.drop_now().await?;
    print!("{}", report(&args, &result?));
    Ok(())
}

async fn measure(args: &Args, db: &BenchDb, redis: &OwnRedis, moto: &OwnMoto, queue: &str) -> anyhow::Result<Measured> {
    let (endpoint_url, endpoint_server) = endpoint().await?;
    let env = Env::harness("fairness", db, redis, moto, queue, &catalog(&endpoint_url, args.running_per_space))?;
    let logs = env.logs.clone();
    let port = free_port();
    let tracker = Arc::new(Tracker::default());
    let events = follow_events(&redis.url(), tracker.clone()).await?;
    let key =
        Secret::new("REEVE_TOKEN_KEY", std::env::var("REEVE_TOKEN_KEY").context("REEVE_TOKEN_KEY")?.into_bytes())?;
    let base = format!("http://127.0.0.1:{port}");
    let (busy_space, busy) = space(db, &key, &base).await?;
    let (_, quiet) = space(db, &key, &base).await?;

    let mut serve =
        env.spawn(&args.reeve, "serve", &["serve", "--no-worker", "--bind", &format!("127.0.0.1:{port}")]).await?;
    quiet.healthy(&mut serve).await?;
    let mut work = env.spawn(&args.reeve, "work", &["work"]).await?;
    let outcome = async {
        // Warm (connections, prepared statements, the SDK's pool).
        starts(&quiet, &tracker, 5).await?;
        let idle = starts(&quiet, &tracker, args.samples).await?;
        eprintln!("fairness bench: idle starts measured");

        let seeded = Instant::now();
        let keys: Vec<String> = stream::iter(0..args.backlog)
            .map(|n| {
                let busy = busy.clone();
                async move { busy.create(json!({ "backlog": n, "sleep_ms": BACKLOG_TASK_MS })).await }
            })
            .buffer_unordered(SEED_CLIENTS)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<anyhow::Result<_>>()?;
        eprintln!("fairness bench: {} backlog tasks queued in {:.1}s", keys.len(), seeded.elapsed().as_secs_f64());
        let busy_starts = starts(&quiet, &tracker, args.samples).await?;
        let (still_queued, still_running): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'running')
               FROM tasks WHERE space_idx = $1",
        )
        .bind(busy_space.as_bytes())
        .fetch_one(&db.pool)
        .await?;
        eprintln!("fairness bench: starts with the backlog measured; {still_queued} of it still queued");
        anyhow::Ok(Measured { idle, busy: busy_starts, still_queued, still_running })
    }
    .await
    .map_err(|e| e.context(work.exited().unwrap_or_default()));
    work.stop().await;
    serve.stop().await;
    events.abort();
    endpoint_server.abort();
    if outcome.is_ok() && std::env::var("REEVE_BENCH_KEEP_LOGS").is_err() {
        let _ = std::fs::remove_dir_all(&logs);
    } else {
        eprintln!("fairness bench: reeve's logs are in {}", logs.display());
    }
    outcome
}

fn report(args: &Args, m: &Measured) -> String {
    let ratio = ms(&m.busy, 0.5) / ms(&m.idle, 0.5).max(0.001);
    format!(
        "## Fairness between Spaces\n\n\
         Reeve as in the worker bench (`reeve serve --no-worker` and `reeve work` at its default concurrency, \
         {concurrency}), on the local SQS (moto, which has no fair delivery of its own), with `running_per_space = \
         {limit}`. One Space queues a backlog of {backlog} tasks of {task_ms} ms each through the API; another \
         Space then creates {samples} tasks of none, one after another, each waiting for the last to end. Start \
         is from the create's `202` to the task's `running` event as it reaches Redis, beside the same measured \
         first on the idle deployment, in the same run. Goal: the p50 with the backlog ≤ {GOAL}× idle.\n\n\
         | samples | idle p50 ms | idle p99 ms | with the backlog p50 ms | with the backlog p99 ms | **backlog p50 ÷ \
         idle p50** | goal | busy Space at the last sample |\n|---|---|---|---|---|---|---|---|\n\
         | {samples} | {:.1} | {:.1} | {:.1} | {:.1} | **{ratio:.2}** | ≤ {GOAL} {} | {} running, {} queued |\n\n",
        ms(&m.idle, 0.5),
        ms(&m.idle, 0.99),
        ms(&m.busy, 0.5),
        ms(&m.busy, 0.99),
        verdict(ratio <= GOAL),
        m.still_running,
        m.still_queued,
        concurrency = WorkerSettings::DEFAULT_CONCURRENCY,
        limit = args.running_per_space,
        backlog = args.backlog,
        task_ms = BACKLOG_TASK_MS,
        samples = args.samples,
    )
}
