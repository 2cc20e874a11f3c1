//! Task start latency and worker throughput, each beside the floor of the
//! queue it runs on.
//!
//! Reeve's side is the release `reeve` binary as deployed, split the same
//! way: `reeve serve --no-worker` takes the creates (the API) and `reeve
//! work` runs the tasks (the worker, at its default concurrency), on a
//! database, a queue and a `redis-server` of the harness's own. The task is
//! a free kind whose `http` executor POSTs to an endpoint the harness serves
//! on loopback, which answers `{}` at once: a task with next to no work of
//! its own, so what is measured is Reeve's path around it. When a task
//! started and ended is read from its `status` events as they reach Redis
//! (one pattern subscription), which is when the relay can put them on a
//! watcher's stream.
//!
//! The floor is the local queue alone, driven the way the worker drives it:
//! `SendMessage`, then a consumer with the same SDK client and settings
//! (batches of up to [`MAX_BATCH`], a [`WAIT_TIME_SECONDS`] long poll, the
//! worker's default concurrency) that makes one Postgres write per message
//! and deletes it. Nothing Reeve does can take less than that.
//!
//! - **Start latency**: each client creates a task, waits until it has
//!   completed, and creates the next; from the create's `202` to the
//!   `running` event and to `completed`. The floor's client sends a message
//!   and waits for its Postgres write: the floor's round trip.
//! - **Throughput**: a backlog of tasks is queued with no worker running;
//!   then `reeve work` starts, and the rate is tasks completed per second
//!   from the first `running` event to the last `completed`. The floor
//!   drains as many messages the same way.
//!
//! - **Run-start check**: a metered task's one chain read before its run
//!   (`payments::run_check`: a Multicall3 `aggregate3` `eth_call` of the
//!   payer's balance, Permit2 allowance, Permit2 nonce word and permit
//!   nonce), timed one after another on the local chain, beside one plain
//!   JSON-RPC round trip to the same endpoint: what a metered task's start
//!   adds to a free one's.
//!
//! Sides alternate within each measurement, so the shared machine's noise
//! falls on both. A task that fails, a request that errs or a side that
//! completes nothing fails the run: a broken run never prints a ratio.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName, SendMessageBatchRequestEntry};
use futures_util::{StreamExt, stream};
use reeve_shared::auth::{self, Secret, SpaceIndex};
use reeve_shared::ids::Id;
use reeve_shared::worker::WorkerSettings;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio::process::{Child, Command};
use tokio::sync::Notify;

use crate::stack::{BenchDb, OwnMoto, OwnRedis, free_port};
use crate::{median, quantile};

#[derive(clap::Args)]
pub struct Args {
    /// The release `reeve` binary.
    #[arg(long)]
    reeve: PathBuf,
    /// Clients creating tasks at once, one level after another.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    clients: Vec<usize>,
    /// Tasks per side at each level, spread over `rounds` alternating rounds.
    #[arg(long, default_value_t = 200)]
    tasks: usize,
    /// Rounds per side at each level of start latency.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// The backlog each throughput round drains (at least 1,000).
    #[arg(long, default_value_t = 1000)]
    backlog: usize,
    /// Throughput rounds per side, alternating.
    #[arg(long, default_value_t = 2)]
    throughput_rounds: usize,
    /// The chain whose Multicall3 the run-start check reads (the local
    /// stack's anvil, where scripts/payments.sh places it).
    #[arg(long, env = "REEVE_CHAIN_RPC_URL", default_value = "http://127.0.0.1:8545")]
    chain_rpc: String,
    /// Run-start checks timed, one after another; 0 leaves them out.
    #[arg(long, default_value_t = 200)]
    checks: usize,
}

/// SQS's largest batch and longest long poll: what `reeve work`'s poller
/// asks for.
const MAX_BATCH: i32 = 10;
const WAIT_TIME_SECONDS: i32 = 20;
/// The queues' visibility timeout, as the stack's queue has it.
const VISIBILITY_TIMEOUT: &str = "60";
/// How long one task may take before the run is called broken.
pub(crate) const TASK_LIMIT: Duration = Duration::from_secs(60);
/// Clients that queue the throughput backlog through the API.
const SEED_CLIENTS: usize = 4;

/// The bench's task kind: free, with the largest quota (a free kind's
/// default would refuse the backlog), run by the `http` executor against
/// the harness's own endpoint.
pub(crate) const KIND: &str = "bench";
fn catalog(endpoint: &str) -> String {
    let shipped = include_str!("../../reeve.dev.toml");
    format!(
        "{shipped}\n[tasks.{KIND}]\ntitle = \"Bench\"\nexecutor = \"http\"\nendpoint = \"{endpoint}\"\n\
         timeout_seconds = 30\ninput_schema = {{ type = \"object\" }}\n\
         [tasks.{KIND}.quota]\nper_hour = 1000000\nat_once = 10000\n"
    )
}

/// When each task (or floor message) was seen to start and to end.
#[derive(Default, Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) running: Option<Instant>,
    /// The terminal status, and whether it was `completed`.
    pub(crate) done: Option<(Instant, bool)>,
}

#[derive(Default)]
pub(crate) struct Tracker {
    seen: Mutex<HashMap<String, Seen>>,
    changed: Notify,
}

impl Tracker {
    pub(crate) fn record(&self, key: &str, status: &str, at: Instant) {
        {
            let mut seen = self.seen.lock().expect("tracker lock");
            let entry = seen.entry(key.to_owned()).or_default();
            match status {
                "running" => {
                    entry.running.get_or_insert(at);
                }
                // The first end counts: a second delivery of a floor
                // message ends it again.
                "completed" => {
                    entry.done.get_or_insert((at, true));
                }
                "failed" | "canceled" => {
                    entry.done.get_or_insert((at, false));
                }
                _ => return,
            }
        }
        self.changed.notify_waiters();
    }

    fn get(&self, key: &str) -> Seen {
        self.seen.lock().expect("tracker lock").get(key).copied().unwrap_or_default()
    }

    /// Waits until `key` has ended; its times.
    pub(crate) async fn ended(&self, key: &str, limit: Duration) -> anyhow::Result<Seen> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let seen = self.get(key);
            if let Some((_, completed)) = seen.done {
                ensure!(completed, "{key} did not complete");
                return Ok(seen);
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                bail!("{key} had not ended after {limit:?}");
            }
        }
    }

    /// Waits until every key has ended; the first start and the last end.
    async fn all_ended(&self, keys: &[String], limit: Duration) -> anyhow::Result<(Instant, Instant)> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (mut first, mut last, mut ended) = (None::<Instant>, None::<Instant>, 0);
            {
                let seen = self.seen.lock().expect("tracker lock");
                for key in keys {
                    let Some(s) = seen.get(key) else { continue };
                    if let Some((at, completed)) = s.done {
                        ensure!(completed, "{key} did not complete");
                        ended += 1;
                        last = Some(last.map_or(at, |l| l.max(at)));
                    }
                    if let Some(at) = s.running.or(s.done.map(|d| d.0)) {
                        first = Some(first.map_or(at, |f| f.min(at)));
                    }
                }
            }
            if ended == keys.len() {
                return Ok((first.context("no start seen")?, last.context("no end seen")?));
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                bail!("{ended} of {} ended within {limit:?}", keys.len());
            }
        }
    }
}

/// Follows every task's `status` events on the harness's Redis.
pub(crate) async fn follow_events(
    redis_url: &str,
    tracker: Arc<Tracker>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut pubsub = redis::Client::open(redis_url)?.get_async_pubsub().await?;
    pubsub.psubscribe("task:*:events").await?;
    Ok(tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            let at = Instant::now();
            let channel = message.get_channel_name();
            let Some(task) = channel.strip_prefix("task:").and_then(|c| c.strip_suffix(":events")) else {
                continue;
            };
            let Ok(event) = serde_json::from_slice::<Value>(message.get_payload_bytes()) else { continue };
            if event["type"] == "status"
                && let Some(status) = event["data"]["status"].as_str()
            {
                tracker.record(task, status, at);
            }
        }
    }))
}

/// A `reeve` process of the harness's, with its log.
pub(crate) struct Reeve {
    child: Child,
    pub(crate) log: PathBuf,
}

impl Reeve {
    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                Some(format!("reeve exited ({status}); its log, {}:\n{}", self.log.display(), tail(&self.log)))
            }
            _ => None,
        }
    }
}

pub(crate) fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Everything a `reeve` process of the run is started with.
pub(crate) struct Env {
    pub(crate) vars: Vec<(&'static str, String)>,
    pub(crate) logs: PathBuf,
}

impl Env {
    /// A run's `reeve` processes on the harness's own database, Redis and
    /// queue, selling `catalog` (written into `logs`, a directory of the
    /// run's, named after `run`), whose endpoints are the harness's own, on
    /// loopback over plain http.
    pub(crate) fn harness(
        run: &str,
        db: &BenchDb,
        redis: &OwnRedis,
        moto: &OwnMoto,
        queue_url: &str,
        catalog: &str,
    ) -> anyhow::Result<Env> {
        let logs = std::env::temp_dir().join(format!("reeve-bench-{run}-{}", std::process::id()));
        std::fs::create_dir_all(&logs)?;
        let catalog_file = logs.join("catalog.toml");
        std::fs::write(&catalog_file, catalog)?;
        let vars = vec![
            ("DATABASE_URL", db.url.clone()),
            ("REDIS_URL", redis.url()),
            ("REEVE_QUEUE_URL", queue_url.to_owned()),
            ("AWS_ENDPOINT_URL_SQS", moto.url.clone()),
            ("REEVE_CATALOG", catalog_file.display().to_string()),
            ("REEVE_OPERATOR_ALLOW", "127.0.0.1".into()),
            ("REEVE_OUTBOUND_ALLOW_HTTP", "1".into()),
        ];
        Ok(Env { vars, logs })
    }

    /// The catalog file the run's processes read.
    pub(crate) fn catalog(&self) -> PathBuf {
        self.logs.join("catalog.toml")
    }

    pub(crate) async fn spawn(&self, bin: &Path, name: &str, args: &[&str]) -> anyhow::Result<Reeve> {
        let log = self.logs.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .args(args)
            // The rest comes from the harness's environment, which
            // scripts/bench.sh loads from .env.
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Reeve { child, log })
    }
}

/// The `http` executor's endpoint: answers every POST with `{}`.
pub(crate) async fn endpoint() -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let app = axum::Router::new().route("/", axum::routing::post(|| async { axum::Json(json!({})) }));
    Ok((url, tokio::spawn(async move { axum::serve(listener, app).await.expect("the endpoint serves") })))
}

/// The API side of the harness: creates tasks through `reeve serve`.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
    pub(crate) token: Arc<str>,
}

impl Api {
    /// Creates one task; its id once the `202` is in.
    pub(crate) async fn create(&self, input: Value) -> anyhow::Result<String> {
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

    pub(crate) async fn healthy(&self, reeve: &mut Reeve) -> anyhow::Result<()> {
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

/// The floor's queue and its consumer.
#[derive(Clone)]
struct Floor {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    db: sqlx::PgPool,
    tracker: Arc<Tracker>,
    concurrency: usize,
}

impl Floor {
    /// Receives, writes and deletes until aborted: the worker's loop with
    /// nothing of Reeve's in it.
    async fn consume(self) {
        loop {
            let received = self
                .sqs
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(MAX_BATCH)
                .wait_time_seconds(WAIT_TIME_SECONDS)
                .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
                .send()
                .await;
            let messages = match received {
                Ok(received) => received.messages.unwrap_or_default(),
                Err(e) => {
                    eprintln!("worker bench: the floor's receive failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let received_at = Instant::now();
            stream::iter(messages)
                .for_each_concurrent(self.concurrency, |message| {
                    let floor = self.clone();
                    async move {
                        let key = message.body().unwrap_or_default().to_owned();
                        floor.tracker.record(&key, "running", received_at);
                        // SQS delivers at least once; a second delivery
                        // writes nothing new, as a task's second claim does.
                        let written = sqlx::query(
                            "INSERT INTO bench_floor (key, at) VALUES ($1, now()) ON CONFLICT (key) DO NOTHING",
                        )
                        .bind(&key)
                        .execute(&floor.db)
                        .await;
                        let at = Instant::now();
                        let deleted = floor
                            .sqs
                            .delete_message()
                            .queue_url(&floor.queue_url)
                            .receipt_handle(message.receipt_handle().unwrap_or_default())
                            .send()
                            .await;
                        match (written, deleted) {
                            (Ok(_), Ok(_)) => floor.tracker.record(&key, "completed", at),
                            (written, deleted) => {
                                eprintln!("worker bench: the floor failed {key}: {written:?} {deleted:?}");
                                floor.tracker.record(&key, "failed", at);
                            }
                        }
                    }
                })
                .await;
        }
    }

    async fn send(&self, key: &str) -> anyhow::Result<()> {
        self.sqs.send_message().queue_url(&self.queue_url).message_body(key).send().await?;
        Ok(())
    }
}

/// One latency sample: µs from the create (or send) to start and to end.
type Sample = (u64, u64);

/// `clients` clients, each creating `per_client` tasks one after another.
async fn latency_round<F, Fut>(
    clients: usize,
    per_client: usize,
    tracker: &Arc<Tracker>,
    create: F,
) -> anyhow::Result<Vec<Sample>>
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<String>> + Send,
{
    let mut handles = Vec::new();
    for c in 0..clients {
        let (create, tracker) = (create.clone(), tracker.clone());
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_client);
            for n in 0..per_client {
                let key = create(c, n).await?;
                let created = Instant::now();
                let seen = tracker.ended(&key, TASK_LIMIT).await?;
                let (done, _) = seen.done.expect("ended");
                let started = seen.running.unwrap_or(done);
                let us = |at: Instant| at.saturating_duration_since(created).as_micros() as u64;
                samples.push((us(started), us(done)));
            }
            anyhow::Ok(samples)
        }));
    }
    let mut samples = Vec::new();
    for handle in handles {
        samples.extend(handle.await??);
    }
    ensure!(!samples.is_empty(), "no task completed");
    Ok(samples)
}

struct Latency {
    clients: usize,
    reeve: Vec<Sample>,
    floor: Vec<Sample>,
}

pub(crate) fn ms(sorted: &[u64], q: f64) -> f64 {
    quantile(sorted, q) as f64 / 1000.0
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    ensure!(args.backlog >= 1000, "the backlog is at least 1,000 tasks");
    let checks = match args.checks {
        0 => None,
        n => Some(run_check_cost(&args.chain_rpc, n).await.context("timing the run-start check")?),
    };
    let db = BenchDb::create("worker").await?;
    sqlx::query("CREATE TABLE bench_floor (key TEXT PRIMARY KEY, at TIMESTAMPTZ NOT NULL)").execute(&db.pool).await?;
    let redis = OwnRedis::start().await?;
    let moto = OwnMoto::start().await?;
    let sqs = moto.sqs().await;
    let mut queues = Vec::new();
    for side in ["worker", "floor"] {
        let url = sqs
            .create_queue()
            .queue_name(format!("reeve-bench-{side}-{}", std::process::id()))
            .attributes(QueueAttributeName::VisibilityTimeout, VISIBILITY_TIMEOUT)
            .send()
            .await
            .context("creating the harness's SQS queues")?
            .queue_url()
            .context("a queue url")?
            .to_owned();
        queues.push(url);
    }
    let result = measure(&args, &db, &redis, &moto, &sqs, &queues).await;
    moto.stop().await;
    redis.stop().await;
    db.drop_now().await?;
    let (latency, throughput) = result?;
    print!("{}", report(&args, &latency, &throughput));
    if let Some((check, floor)) = checks {
        print!("{}", check_report(&args, &check, &floor));
    }
    Ok(())
}

/// A metered task's run-start check, its one chain read timed `n` times one
/// after another, beside one JSON-RPC round trip to the same endpoint (the
/// latest block), alternating: (the check's µs, the round trip's µs), each
/// sorted.
async fn run_check_cost(rpc: &str, n: usize) -> anyhow::Result<(Vec<u64>, Vec<u64>)> {
    use reeve_shared::payments::{Chains, read_run_check};
    let chains = Chains::parse(&format!("eip155:84532={rpc}")).map_err(|p| anyhow::anyhow!(p.join("; ")))?;
    let chain = chains.get("eip155:84532")?;
    // The local chain's token, and anvil's account 1 as the payer.
    let (token, payer) = ("0x036CbD53842c5426634e7929541eC2318f3dCF7e", "0x70997970C51812dc3A010C7d01b50e0d17dc79C8");
    let (mut check, mut floor) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let started = Instant::now();
        chain.head().await?;
        floor.push(started.elapsed().as_micros() as u64);
        let started = Instant::now();
        read_run_check(chain, token, payer, &i.to_string(), true).await.map_err(anyhow::Error::msg)?;
        check.push(started.elapsed().as_micros() as u64);
    }
    check.sort_unstable();
    floor.sort_unstable();
    Ok((check, floor))
}

fn check_report(args: &Args, check: &[u64], floor: &[u64]) -> String {
    format!(
        "**Run-start check**: before a metered task runs, the worker reads its authorization on chain in one \
         Multicall3 `aggregate3` `eth_call` (the payer's balance, its Permit2 allowance, Permit2's nonce word and \
         the token's permit nonce). {} reads one after another on the local anvil, beside one plain JSON-RPC \
         round trip to it (`eth_getBlockByNumber`), alternating. A free task pays none of it.\n\n\
         | reads | round trip p50 ms | round trip p99 ms | check p50 ms | check p99 ms | check p50 ÷ round trip \
         p50 |\n|---|---|---|---|---|---|\n| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n\n",
        check.len(),
        args.checks,
        ms(floor, 0.5),
        ms(floor, 0.99),
        ms(check, 0.5),
        ms(check, 0.99),
        ms(check, 0.5) / ms(floor, 0.5).max(0.001),
    )
}

/// (Reeve's tasks/s, the floor's), one pair per round.
type Throughput = Vec<(f64, f64)>;

async fn measure(
    args: &Args,
    db: &BenchDb,
    redis: &OwnRedis,
    moto: &OwnMoto,
    sqs: &aws_sdk_sqs::Client,
    queues: &[String],
) -> anyhow::Result<(Vec<Latency>, Throughput)> {
    let (endpoint_url, endpoint_server) = endpoint().await?;
    let env = Env::harness("worker", db, redis, moto, &queues[0], &catalog(&endpoint_url))?;
    let logs = env.logs.clone();
    let port = free_port();

    let tracker = Arc::new(Tracker::default());
    let events = follow_events(&redis.url(), tracker.clone()).await?;
    let key =
        Secret::new("REEVE_TOKEN_KEY", std::env::var("REEVE_TOKEN_KEY").context("REEVE_TOKEN_KEY")?.into_bytes())?;
    let space = SpaceIndex::from_array(Id::new().to_bytes());
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'bench')").bind(space.as_bytes()).execute(&db.pool).await?;
    let (token, _) = auth::issue_token(&key, &space, OffsetDateTime::now_utc());
    let api = Api { http: reqwest::Client::new(), base: format!("http://127.0.0.1:{port}"), token: token.into() };
    let concurrency = WorkerSettings::DEFAULT_CONCURRENCY;
    let floor = Floor {
        sqs: sqs.clone(),
        queue_url: queues[1].clone(),
        db: db.pool.clone(),
        tracker: tracker.clone(),
        concurrency,
    };

    let mut serve =
        env.spawn(&args.reeve, "serve", &["serve", "--no-worker", "--bind", &format!("127.0.0.1:{port}")]).await?;
    api.healthy(&mut serve).await?;

    let outcome = async {
        // Start latency: the API, a running `reeve work` and the floor's
        // consumer, all idle between rounds.
        let mut work = env.spawn(&args.reeve, "work", &["work"]).await?;
        let consumer = tokio::spawn(floor.clone().consume());
        // Warm both sides (connections, prepared statements, the SDK's pool).
        let warm = latency_round(2, 3, &tracker, reeve_create(api.clone())).await;
        let warm = warm.and(latency_round(2, 3, &tracker, floor_create(floor.clone())).await);
        if let Err(e) = warm {
            return Err(e.context(work.exited().unwrap_or_default()));
        }
        let mut latency = Vec::new();
        for &clients in &args.clients {
            let per_round = (args.tasks / args.rounds / clients).max(1);
            let (mut reeve, mut floor_samples) = (Vec::new(), Vec::new());
            for _ in 0..args.rounds {
                floor_samples.extend(latency_round(clients, per_round, &tracker, floor_create(floor.clone())).await?);
                let round = latency_round(clients, per_round, &tracker, reeve_create(api.clone())).await;
                reeve.extend(round.map_err(|e| e.context(work.exited().unwrap_or_default()))?);
            }
            eprintln!("worker bench: start latency at {clients} clients measured");
            latency.push(Latency { clients, reeve, floor: floor_samples });
        }
        consumer.abort();
        work.stop().await;

        // Throughput: a backlog queued with no worker, then drained.
        let mut throughput = Vec::new();
        for round in 0..args.throughput_rounds {
            let floor_rate = floor_throughput(&floor, args.backlog, round).await?;
            let reeve_rate = reeve_throughput(&env, &args.reeve, &api, &tracker, args.backlog).await?;
            eprintln!("worker bench: throughput round {round}: reeve {reeve_rate:.1}/s floor {floor_rate:.1}/s");
            throughput.push((reeve_rate, floor_rate));
        }
        anyhow::Ok((latency, throughput))
    }
    .await;
    serve.stop().await;
    events.abort();
    endpoint_server.abort();
    // Kept when the run failed, or when asked (REEVE_BENCH_KEEP_LOGS=1: to
    // read what the worker did, with RUST_LOG=debug for every query).
    if outcome.is_ok() && std::env::var("REEVE_BENCH_KEEP_LOGS").is_err() {
        let _ = std::fs::remove_dir_all(&logs);
    } else {
        eprintln!("worker bench: reeve's logs are in {}", logs.display());
    }
    outcome
}

fn reeve_create(
    api: Api,
) -> impl Fn(usize, usize) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<String>> + Send>> + Clone + Send + 'static
{
    move |c, n| {
        let api = api.clone();
        Box::pin(async move { api.create(json!({ "client": c, "n": n })).await })
    }
}

fn floor_create(
    floor: Floor,
) -> impl Fn(usize, usize) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<String>> + Send>> + Clone + Send + 'static
{
    move |_, _| {
        let floor = floor.clone();
        Box::pin(async move {
            let key = Id::new().to_string();
            floor.send(&key).await?;
            Ok(key)
        })
    }
}

/// Queues `backlog` tasks through the API with no worker running, then
/// starts `reeve work`: tasks completed per second.
async fn reeve_throughput(
    env: &Env,
    bin: &Path,
    api: &Api,
    tracker: &Arc<Tracker>,
    backlog: usize,
) -> anyhow::Result<f64> {
    let keys: Vec<String> = stream::iter(0..backlog)
        .map(|n| {
            let api = api.clone();
            async move { api.create(json!({ "backlog": n })).await }
        })
        .buffer_unordered(SEED_CLIENTS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let mut work = env.spawn(bin, "work-throughput", &["work"]).await?;
    let drained = tracker.all_ended(&keys, Duration::from_secs(600)).await;
    let exited = work.exited();
    work.stop().await;
    let (first, last) = drained.map_err(|e| e.context(exited.unwrap_or_default()))?;
    Ok(keys.len() as f64 / last.duration_since(first).as_secs_f64())
}

/// Queues `backlog` messages, then drains them with the floor's consumer:
/// messages per second.
async fn floor_throughput(floor: &Floor, backlog: usize, round: usize) -> anyhow::Result<f64> {
    let keys: Vec<String> = (0..backlog).map(|n| format!("throughput-{round}-{n}")).collect();
    for chunk in keys.chunks(MAX_BATCH as usize) {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, key)| SendMessageBatchRequestEntry::builder().id(i.to_string()).message_body(key).build())
            .collect::<Result<Vec<_>, _>>()?;
        let sent = floor.sqs.send_message_batch().queue_url(&floor.queue_url).set_entries(Some(entries)).send().await?;
        ensure!(sent.failed().is_empty(), "sending the floor's backlog: {:?}", sent.failed());
    }
    let consumer = tokio::spawn(floor.clone().consume());
    let drained = floor.tracker.all_ended(&keys, Duration::from_secs(600)).await;
    consumer.abort();
    let (first, last) = drained?;
    Ok(keys.len() as f64 / last.duration_since(first).as_secs_f64())
}

pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

/// Goals: start latency's p50 at most this many times the floor's round trip…
const START_GOAL: f64 = 1.5;
/// …and throughput at least this share of the floor's.
const THROUGHPUT_GOAL: f64 = 0.8;

fn report(args: &Args, latency: &[Latency], throughput: &Throughput) -> String {
    let mut out = String::from("## Task start and worker throughput\n\n");
    out.push_str(&format!(
        "Reeve is the release `reeve`: `serve --no-worker` takes the creates over HTTP, `work` runs the tasks at \
         its default concurrency ({}), on a database, an SQS queue and a `redis-server` of the harness's own. The \
         task is a free kind whose `http` executor POSTs to a loopback endpoint answering `{{}}`. Start and end \
         are the task's `running` and `completed` events as they reach Redis. The floor is the same local SQS \
         alone, with the same SDK client and the worker's settings (batches of up to {MAX_BATCH}, a \
         {WAIT_TIME_SECONDS} s long poll, {} at once), and one Postgres `INSERT` per message before its \
         `DeleteMessage`.\n\n",
        WorkerSettings::DEFAULT_CONCURRENCY,
        WorkerSettings::DEFAULT_CONCURRENCY
    ));
    out.push_str(&format!(
        "**Start latency**: each client creates a task (the floor: sends a message), waits for it to end, and \
         creates the next; {} tasks per side and level in {} alternating rounds. Reeve's is from the create's \
         `202` to `running` and to `completed`; the floor's round trip is from `SendMessage`'s answer to the \
         message's Postgres write. Goal: Reeve's p50 to `running` ≤ {START_GOAL}× the floor's p50.\n\n",
        args.tasks, args.rounds
    ));
    out.push_str(
        "| clients | floor p50 ms | floor p99 ms | to running p50 ms | to running p99 ms | to completed p50 ms \
         | to completed p99 ms | **running p50 ÷ floor p50** | completed p50 ÷ floor p50 | goal |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for level in latency {
        let sorted = |samples: &[Sample], pick: fn(&Sample) -> u64| {
            let mut v: Vec<u64> = samples.iter().map(pick).collect();
            v.sort_unstable();
            v
        };
        let floor = sorted(&level.floor, |s| s.1);
        let running = sorted(&level.reeve, |s| s.0);
        let completed = sorted(&level.reeve, |s| s.1);
        let ratio = ms(&running, 0.5) / ms(&floor, 0.5).max(0.001);
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | **{ratio:.2}** | {:.2} | ≤ {START_GOAL} {} |\n",
            level.clients,
            ms(&floor, 0.5),
            ms(&floor, 0.99),
            ms(&running, 0.5),
            ms(&running, 0.99),
            ms(&completed, 0.5),
            ms(&completed, 0.99),
            ms(&completed, 0.5) / ms(&floor, 0.5).max(0.001),
            verdict(ratio <= START_GOAL),
        ));
    }
    let reeve = median(throughput.iter().map(|t| t.0).collect());
    let floor = median(throughput.iter().map(|t| t.1).collect());
    let ratio = reeve / floor.max(0.001);
    out.push_str(&format!(
        "\n**Throughput**: a backlog of {} queued with nothing consuming it (Reeve's through the API), then one \
         consumer started: `reeve work`, or the floor's loop. Tasks completed per second from the first start to \
         the last end; median of {} rounds per side, alternating. Goal: ≥ {THROUGHPUT_GOAL}× the floor's.\n\n\
         | backlog | floor tasks/s | Reeve tasks/s | **Reeve ÷ floor** | goal | rounds (Reeve / floor) |\n\
         |---|---|---|---|---|---|\n| {} | {floor:.0} | {reeve:.0} | **{ratio:.2}** | ≥ {THROUGHPUT_GOAL} {} | {} |\n\n",
        args.backlog,
        throughput.len(),
        args.backlog,
        verdict(ratio >= THROUGHPUT_GOAL),
        throughput.iter().map(|t| format!("{:.0} / {:.0}", t.0, t.1)).collect::<Vec<_>>().join(", "),
    ));
    out
}
