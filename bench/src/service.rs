//! Executor protocol v1 (issue 38, "Measured"): what Reeve costs around a
//! service that sells its work through it, beside calling the service
//! directly.
//!
//! The service is a no-op asynchronous one, built on `reeve-executor` as a
//! service author would build it, served by the harness on loopback: it
//! verifies each job's signature, answers `202`, and reports the end at
//! once (`{}`) through the job's report target. A job whose input says
//! `"hold": true` is answered `202` and kept: its [`Reporter`] is handed to
//! the harness, which reports through it.
//!
//! Reeve's side is the release `reeve` binary as the worker bench runs it:
//! `reeve serve --no-worker` takes the creates and the reports
//! (`POST /v1/executor/reports`), `reeve work` sends the jobs, on a
//! database, an SQS queue and a `redis-server` of the harness's own; start
//! and end are the task's `running` and `completed` events as they reach
//! Redis.
//!
//! - **Round trip.** Each client creates a task (a free `http` kind with
//!   `protocol = 1` whose endpoint is the service) and waits for it to
//!   complete, then creates the next: from the create's request to
//!   `running` and to `completed`. Directly: the harness signs a job as
//!   Reeve would and POSTs it to the same service, whose end report goes to
//!   a sink of the harness's: from the POST to the `202` and to the end
//!   report's arrival. The figure is the p50 ratio.
//! - **Reports per second.** `reporters` held tasks, each with one client
//!   sending progress reports through its [`Reporter`] one after another
//!   (as a service reports on one attempt), every report one
//!   `POST /v1/executor/reports`. The floor: as many clients, each making
//!   one bare `INSERT` of an event row and one `PUBLISH` of it on the same
//!   Postgres and `redis-server`, one after another.
//!
//! Sides alternate within each measurement, so the shared machine's noise
//! falls on both. A report refused, a task that fails or a side that
//! completes nothing fails the run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use aws_sdk_sqs::types::QueueAttributeName;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use futures_util::future::try_join_all;
use reeve_executor::{Job, Message, ReportBody, Reporter, Secret, SignedHeaders, TaskRef};
use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::ids::Id;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio::sync::{Mutex, mpsc};

use crate::stack::{BenchDb, OwnMoto, OwnRedis, free_port};
use crate::worker::{Env, Reeve, Tracker, follow_events, tail};
use crate::{median, quantile};

#[derive(clap::Args)]
pub struct Args {
    /// The release `reeve` binary.
    #[arg(long)]
    reeve: PathBuf,
    /// Clients at once for the round trip.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Round trips per side, over `rounds` alternating rounds.
    #[arg(long, default_value_t = 200)]
    tasks: usize,
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Services reporting at once, each on a task of its own.
    #[arg(long, default_value_t = 8)]
    reporters: usize,
    /// Reports per side and round, spread over the reporters.
    #[arg(long, default_value_t = 2000)]
    reports: usize,
    /// Report-rate rounds per side, alternating.
    #[arg(long, default_value_t = 3)]
    report_rounds: usize,
}

/// The bench's kind: free, with the largest quota, sold by the service.
const KIND: &str = "noop";
/// The environment variable that holds the service's secret.
const SECRET_VAR: &str = "REEVE_BENCH_SERVICE_SECRET";
/// How long one task may take before the run is called broken.
const TASK_LIMIT: Duration = Duration::from_secs(60);

fn catalog(endpoint: &str) -> String {
    let shipped = include_str!("../../reeve.dev.toml");
    format!(
        "{shipped}\n[tasks.{KIND}]\ntitle = \"No-op service\"\nexecutor = \"http\"\nendpoint = \"{endpoint}\"\n\
         protocol = 1\nsecret = \"{SECRET_VAR}\"\ntimeout_seconds = 300\ninput_schema = {{ type = \"object\" }}\n\
         [tasks.{KIND}.quota]\nper_hour = 1000000\nat_once = 10000\n"
    )
}

/// The no-op service: `reeve-executor` on axum.
#[derive(Clone)]
struct Service {
    secret: Arc<Secret>,
    client: reqwest::Client,
    held: mpsc::UnboundedSender<Reporter>,
}

async fn job(State(service): State<Service>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let lookup = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Ok(signed) = SignedHeaders::from_lookup(lookup) else { return StatusCode::UNAUTHORIZED };
    match reeve_executor::verify_message(&service.secret, &signed, &body) {
        Ok(Message::Job(job)) => {
            // One try: a refused report fails the run instead of hiding in a retry.
            let reporter = Reporter::with_client(&job, service.client.clone()).retrying(1, Duration::ZERO);
            if job.input["hold"] == true {
                let _ = service.held.send(reporter);
            } else {
                tokio::spawn(async move {
                    if let Err(e) = reporter.result(json!({}), None).await {
                        eprintln!("service bench: the service's end report failed: {e}");
                    }
                });
            }
            StatusCode::ACCEPTED
        }
        Ok(Message::Cancel(_)) => StatusCode::OK,
        Err(e) => {
            eprintln!("service bench: a job was refused: {e}");
            StatusCode::UNAUTHORIZED
        }
    }
}

/// The direct side's report sink: an end report's bearer token is the key
/// of the job it ends.
async fn sink(State(tracker): State<Arc<Tracker>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let at = Instant::now();
    let key = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let report: Option<reeve_executor::Report> = serde_json::from_slice(&body).ok();
    match (key, report) {
        (Some(key), Some(report)) => {
            let status = if matches!(report.body, ReportBody::Result { .. }) { "completed" } else { "failed" };
            tracker.record(key, status, at);
            StatusCode::OK
        }
        _ => StatusCode::BAD_REQUEST,
    }
}

async fn serve(app: axum::Router) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    Ok((base, tokio::spawn(async move { axum::serve(listener, app).await.expect("the harness serves") })))
}

/// Calls the service as Reeve does, without Reeve: a signed job whose end
/// is reported to the harness's sink.
#[derive(Clone)]
struct Direct {
    http: reqwest::Client,
    service: String,
    sink: String,
    secret: Arc<Secret>,
    tracker: Arc<Tracker>,
}

impl Direct {
    /// Sends one job; its key once the `202` is in (recorded as `running`).
    async fn call(&self) -> anyhow::Result<String> {
        let key = Id::new().to_string();
        let deadline = OffsetDateTime::now_utc() + time::Duration::minutes(5);
        let job = Message::Job(Job {
            protocol: reeve_executor::messages::PROTOCOL,
            task: TaskRef { id: key.clone(), kind: KIND.into(), attempt: 1, deadline },
            input: json!({}),
            files: Vec::new(),
            report: reeve_executor::messages::ReportTarget {
                url: self.sink.clone(),
                token: key.clone(),
                expires_at: deadline,
            },
            metered: None,
        });
        let body = serde_json::to_vec(&job)?;
        let id = format!("msg_{key}");
        let timestamp = OffsetDateTime::now_utc().unix_timestamp();
        let response = self
            .http
            .post(&self.service)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", self.secret.sign(&id, timestamp, &body))
            .body(body)
            .send()
            .await?;
        ensure!(response.status() == reqwest::StatusCode::ACCEPTED, "the service answered {}", response.status());
        self.tracker.record(&key, "running", Instant::now());
        Ok(key)
    }
}

/// Reeve's API, as a buyer calls it.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
    token: Arc<str>,
}

impl Api {
    async fn create(&self, input: Value) -> anyhow::Result<String> {
        let response = self
            .http
            .post(format!("{}/v1/tasks/{KIND}", self.base))
            .bearer_auth(&*self.token)
            .json(&json!({ "input": input }))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        ensure!(status == reqwest::StatusCode::ACCEPTED, "create answered {status}: {body}");
        Ok(body["id"].as_str().context("the 202 has the task's id")?.to_owned())
    }

    async fn healthy(&self, reeve: &mut Reeve) -> anyhow::Result<()> {
        for _ in 0..400 {
            if let Some(exited) = reeve.exited() {
                bail!(exited);
            }
            if self.http.get(format!("{}/healthz", self.base)).send().await.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("reeve serve did not become healthy; its log, {}:\n{}", reeve.log.display(), tail(&reeve.log))
    }
}

/// One round trip: µs from the call to start (`running`, or the `202`)
/// and to the end.
type Sample = (u64, u64);

/// `clients` clients, each making `per_client` calls one after another.
async fn round_trips<F, Fut>(
    clients: usize,
    per_client: usize,
    tracker: &Arc<Tracker>,
    call: F,
) -> anyhow::Result<Vec<Sample>>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<String>> + Send,
{
    let mut handles = Vec::new();
    for _ in 0..clients {
        let (call, tracker) = (call.clone(), tracker.clone());
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                let called = Instant::now();
                let key = call().await?;
                let seen = tracker.ended(&key, TASK_LIMIT).await?;
                let (done, _) = seen.done.expect("ended");
                let started = seen.running.unwrap_or(done);
                let us = |at: Instant| at.saturating_duration_since(called).as_micros() as u64;
                samples.push((us(started), us(done)));
            }
            anyhow::Ok(samples)
        }));
    }
    let mut samples = Vec::new();
    for handle in handles {
        samples.extend(handle.await??);
    }
    ensure!(!samples.is_empty(), "nothing completed");
    Ok(samples)
}

/// Reeve's report rate: `reporters` held tasks, each reported on by one
/// client, `reports` in all; reports per second.
async fn reeve_reports(
    api: &Api,
    held: &Mutex<mpsc::UnboundedReceiver<Reporter>>,
    tracker: &Arc<Tracker>,
    reporters: usize,
    reports: usize,
) -> anyhow::Result<f64> {
    let mut keys = Vec::with_capacity(reporters);
    for _ in 0..reporters {
        keys.push(api.create(json!({ "hold": true })).await?);
    }
    let mut held = held.lock().await;
    let mut taken = Vec::with_capacity(reporters);
    for _ in 0..reporters {
        let reporter = tokio::time::timeout(TASK_LIMIT, held.recv()).await.context("a held job never came")?;
        taken.push(reporter.context("the service stopped")?);
    }
    drop(held);
    let per = (reports / reporters).max(1);
    let started = Instant::now();
    try_join_all(taken.iter().map(|reporter| async move {
        for n in 0..per {
            reporter.progress(n as f64 / per as f64, None).await.context("a progress report")?;
        }
        anyhow::Ok(())
    }))
    .await?;
    let rate = (per * reporters) as f64 / started.elapsed().as_secs_f64();
    // Each held task ends, so the next round starts from none running.
    try_join_all(taken.iter().map(|reporter| reporter.result(json!({}), None))).await.context("ending a held task")?;
    for key in &keys {
        tracker.ended(key, TASK_LIMIT).await?;
    }
    Ok(rate)
}

/// The floor's report rate: as many clients, each an `INSERT` and a
/// `PUBLISH` per report, one after another; reports per second.
async fn floor_reports(
    db: &sqlx::PgPool,
    redis: &redis::aio::MultiplexedConnection,
    reporters: usize,
    reports: usize,
    round: usize,
) -> anyhow::Result<f64> {
    let per = (reports / reporters).max(1);
    let started = Instant::now();
    try_join_all((0..reporters).map(|client| {
        let mut redis = redis.clone();
        async move {
            let task = format!("floor-{round}-{client}");
            for n in 0..per {
                let data = json!({ "fraction": n as f64 / per as f64 });
                let at: OffsetDateTime = sqlx::query_scalar(
                    "INSERT INTO bench_reports (task, seq, type, data) VALUES ($1, $2, 'progress', $3) RETURNING at",
                )
                .bind(&task)
                .bind(n as i64 + 1)
                .bind(sqlx::types::Json(&data))
                .fetch_one(db)
                .await?;
                let event = json!({ "seq": n + 1, "type": "progress", "data": data, "at": at.unix_timestamp() });
                redis::cmd("PUBLISH")
                    .arg(format!("task:{task}:events"))
                    .arg(event.to_string())
                    .query_async::<usize>(&mut redis)
                    .await?;
            }
            anyhow::Ok(())
        }
    }))
    .await?;
    Ok((per * reporters) as f64 / started.elapsed().as_secs_f64())
}

struct Measured {
    reeve: Vec<Sample>,
    direct: Vec<Sample>,
    /// (Reeve's reports/s, the floor's), one pair per round.
    rates: Vec<(f64, f64)>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    ensure!(args.reporters > 0 && args.clients > 0 && args.rounds > 0, "clients, rounds and reporters are at least 1");
    let db = BenchDb::create("service").await?;
    sqlx::query(
        "CREATE TABLE bench_reports (task TEXT NOT NULL, seq INT8 NOT NULL, type TEXT NOT NULL, data JSONB NOT NULL,
                                     at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (task, seq))",
    )
    .execute(&db.pool)
    .await?;
    let redis = OwnRedis::start().await?;
    let moto = OwnMoto::start().await?;
    let result = measure(&args, &db, &redis, &moto).await;
    moto.stop().await;
    redis.stop().await;
    db.drop_now().await?;
    print!("{}", report(&args, &result?));
    Ok(())
}

async fn measure(args: &Args, db: &BenchDb, redis: &OwnRedis, moto: &OwnMoto) -> anyhow::Result<Measured> {
    let sqs = moto.sqs().await;
    let queue_url = sqs
        .create_queue()
        .queue_name(format!("reeve-bench-service-{}", std::process::id()))
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .send()
        .await
        .context("creating the harness's SQS queue")?
        .queue_url()
        .context("a queue url")?
        .to_owned();

    let secret_text = Secret::generate();
    let secret = Arc::new(Secret::parse(&secret_text)?);
    let tracker = Arc::new(Tracker::default());
    let (held_tx, held_rx) = mpsc::unbounded_channel();
    let service = Service { secret: secret.clone(), client: reqwest::Client::new(), held: held_tx };
    let (service_base, service_server) =
        serve(axum::Router::new().route("/job", axum::routing::post(job)).with_state(service)).await?;
    let (sink_base, sink_server) =
        serve(axum::Router::new().route("/reports", axum::routing::post(sink)).with_state(tracker.clone())).await?;
    let direct = Direct {
        http: reqwest::Client::new(),
        service: format!("{service_base}/job"),
        sink: format!("{sink_base}/reports"),
        secret,
        tracker: tracker.clone(),
    };

    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut env = Env::harness("service", db, redis, moto, &queue_url, &catalog(&format!("{service_base}/job")))?;
    env.vars.extend([("REEVE_REPORT_URL", format!("{base}/v1/executor/reports")), (SECRET_VAR, secret_text)]);
    let logs = env.logs.clone();
    let events = follow_events(&redis.url(), tracker.clone()).await?;
    let key = auth::Secret::new(
        "REEVE_TOKEN_KEY",
        std::env::var("REEVE_TOKEN_KEY").context("REEVE_TOKEN_KEY")?.into_bytes(),
    )?;
    let space = SpaceIndex::from_array(Id::new().to_bytes());
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'bench')").bind(space.as_bytes()).execute(&db.pool).await?;
    let (token, _) = auth::issue_token(&key, &space, OffsetDateTime::now_utc());
    let api = Api { http: reqwest::Client::new(), base, token: token.into() };
    let mut redis_conn = redis::Client::open(redis.url())?.get_multiplexed_async_connection().await?;
    redis::cmd("CLIENT").arg("SETNAME").arg("bench").query_async::<()>(&mut redis_conn).await?;

    let mut serve =
        env.spawn(&args.reeve, "serve", &["serve", "--no-worker", "--bind", &format!("127.0.0.1:{port}")]).await?;
    let outcome = async {
        api.healthy(&mut serve).await?;
        let mut work = env.spawn(&args.reeve, "work", &["work"]).await?;
        let held = Mutex::new(held_rx);
        let reeve_call = {
            let api = api.clone();
            move || {
                let api = api.clone();
                async move { api.create(json!({})).await }
            }
        };
        let direct_call = {
            let direct = direct.clone();
            move || {
                let direct = direct.clone();
                async move { direct.call().await }
            }
        };
        // Warm both sides (connections, prepared statements, the SDK's pool).
        let warm = round_trips(1, 3, &tracker, reeve_call.clone()).await;
        if let Err(e) = warm.and(round_trips(1, 3, &tracker, direct_call.clone()).await) {
            return Err(e.context(work.exited().unwrap_or_default()));
        }
        let per_round = (args.tasks / args.rounds / args.clients).max(1);
        let (mut reeve, mut direct_samples) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds {
            direct_samples.extend(round_trips(args.clients, per_round, &tracker, direct_call.clone()).await?);
            let round = round_trips(args.clients, per_round, &tracker, reeve_call.clone()).await;
            reeve.extend(round.map_err(|e| e.context(work.exited().unwrap_or_default()))?);
        }
        eprintln!("service bench: round trips measured");
        let mut rates = Vec::new();
        for round in 0..args.report_rounds {
            let floor = floor_reports(&db.pool, &redis_conn, args.reporters, args.reports, round).await?;
            let through = reeve_reports(&api, &held, &tracker, args.reporters, args.reports).await;
            let through = through.map_err(|e| e.context(work.exited().unwrap_or_default()))?;
            eprintln!("service bench: reports round {round}: reeve {through:.0}/s floor {floor:.0}/s");
            rates.push((through, floor));
        }
        work.stop().await;
        anyhow::Ok(Measured { reeve, direct: direct_samples, rates })
    }
    .await;
    serve.stop().await;
    events.abort();
    service_server.abort();
    sink_server.abort();
    if outcome.is_ok() && std::env::var("REEVE_BENCH_KEEP_LOGS").is_err() {
        let _ = std::fs::remove_dir_all(&logs);
    } else {
        eprintln!("service bench: reeve's logs are in {}", logs.display());
    }
    outcome
}

fn ms(sorted: &[u64], q: f64) -> f64 {
    quantile(sorted, q) as f64 / 1000.0
}

fn sorted(samples: &[Sample], pick: fn(&Sample) -> u64) -> Vec<u64> {
    let mut v: Vec<u64> = samples.iter().map(pick).collect();
    v.sort_unstable();
    v
}

fn report(args: &Args, measured: &Measured) -> String {
    let mut out = String::from("## Executor protocol: a no-op asynchronous service\n\n");
    out.push_str(
        "The service is a no-op asynchronous one built on `reeve-executor`, served by the harness on loopback: it \
         verifies each job's Standard Webhooks signature, answers `202` and reports the end (`{}`) at once. Reeve \
         is the release `reeve` as in the worker bench (`serve --no-worker` takes the creates and the reports, \
         `work` sends the jobs), on a database, an SQS queue and a `redis-server` of the harness's own; the kind \
         is a free `http` kind with `protocol = 1`.\n\n",
    );
    let direct = sorted(&measured.direct, |s| s.1);
    let accepted = sorted(&measured.direct, |s| s.0);
    let running = sorted(&measured.reeve, |s| s.0);
    let completed = sorted(&measured.reeve, |s| s.1);
    out.push_str(&format!(
        "**Round trip**: {} client(s), each calling and waiting for the end before the next call; {} per side in \
         {} alternating rounds. Through Reeve: from the create's request to the task's `running` and `completed` \
         events on Redis. Directly: the harness signs the job as Reeve does and POSTs it to the same service, whose \
         end report goes to a sink of the harness's: from the POST to its `202` and to the end report's arrival.\n\n\
         | direct: 202 p50 ms | direct: end p50 ms | direct: end p99 ms | Reeve: running p50 ms | Reeve: completed \
         p50 ms | Reeve: completed p99 ms | **completed p50 ÷ direct end p50** |\n|---|---|---|---|---|---|---|\n\
         | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | **{:.2}** |\n\n",
        args.clients,
        measured.direct.len(),
        args.rounds,
        ms(&accepted, 0.5),
        ms(&direct, 0.5),
        ms(&direct, 0.99),
        ms(&running, 0.5),
        ms(&completed, 0.5),
        ms(&completed, 0.99),
        ms(&completed, 0.5) / ms(&direct, 0.5).max(0.001),
    ));
    let reeve = median(measured.rates.iter().map(|r| r.0).collect());
    let floor = median(measured.rates.iter().map(|r| r.1).collect());
    out.push_str(&format!(
        "**Reports per second**: {} services at once, each on a held task of its own, sending progress reports one \
         after another through `reeve-executor`'s `Reporter` (`POST /v1/executor/reports`: the report token \
         checked, the report's row and its event written in one transaction fenced on the attempt, then the event \
         published); {} reports per side and round. The floor: as many clients, each a bare `INSERT` of an event \
         row and a `PUBLISH` of it per report, on the same Postgres and `redis-server`. Median of {} rounds per \
         side, alternating.\n\n\
         | reporters | floor reports/s | Reeve reports/s | **Reeve ÷ floor** | rounds (Reeve / floor) |\n\
         |---|---|---|---|---|\n| {} | {floor:.0} | {reeve:.0} | **{:.2}** | {} |\n\n",
        args.reporters,
        args.reports,
        measured.rates.len(),
        args.reporters,
        reeve / floor.max(0.001),
        measured.rates.iter().map(|r| format!("{:.0} / {:.0}", r.0, r.1)).collect::<Vec<_>>().join(", "),
    ));
    out
}
