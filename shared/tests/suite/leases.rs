//! How soon a task runs again, against the real stack (Postgres, Redis,
//! moto SQS, SeaweedFS): a retryable failure waits its backoff on the
//! queue (the message's visibility), not the queue's visibility timeout;
//! a record with too little time left is given back unclaimed; a worker
//! that dies or loses Postgres leaves its task to the next run once its
//! short lease lapses.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::SqsEvent;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use common::QueuedApi as Api;
use reeve_shared::executors::{ExecDeps, Job};
use reeve_shared::ids::Id;
use reeve_shared::settings::{self, Config};
use reeve_shared::startup;
use reeve_shared::tasks::{Event, EventType, events_after};
use reeve_shared::worker::{Poller, RunFuture, Runner, WorkerContext, deadline_of, handle_batch, handle_batch_until};
use serde_json::{Value, json};
use sqlx::PgPool;

/// The shipped catalog plus `flaky`, an `http` task on `endpoint`.
fn catalog(endpoint: &str) -> String {
    common::catalog_text_with(&format!(
        r#"
        [tasks.flaky]
        title = "Flaky"
        description = "An operator's endpoint that is sometimes down."
        executor = "http"
        endpoint = "{endpoint}"
        timeout_seconds = 5
        input_schema = {{ type = "object" }}
        "#
    ))
}

/// The configuration of a worker serving `catalog` (TOML) that may call
/// loopback endpoints and sets visibility on `queue`.
fn worker_config(pool: &PgPool, catalog: &str, queue: &str) -> Config {
    let config = common::with_catalog(common::config(pool), catalog).with(settings::QUEUE_URL, queue);
    common::loopback_outbound(config)
}

/// That worker, as start-up builds it.
async fn worker(pool: &PgPool, catalog: &str, queue: &str) -> WorkerContext {
    common::worker(&worker_config(pool, catalog, queue)).await
}

/// One message received from `queue` (waiting up to `wait`), with its
/// receive count.
async fn receive(queue: &str, wait: Duration) -> Option<Message> {
    let sqs = common::aws().await.sqs;
    let got = sqs
        .receive_message()
        .queue_url(queue)
        .wait_time_seconds(wait.as_secs() as i32)
        .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
        .send()
        .await
        .unwrap();
    got.messages.unwrap_or_default().into_iter().next()
}

/// The Lambda's event for one real message, as the event source mapping
/// hands it over (its receipt handle works on the queue).
fn event_of(message: &Message) -> SqsEvent {
    let count = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .cloned()
        .unwrap_or_else(|| "1".into());
    serde_json::from_value(json!({"Records": [{
        "messageId": message.message_id(),
        "receiptHandle": message.receipt_handle(),
        "body": message.body(),
        "attributes": {"ApproximateReceiveCount": count},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:eu-west-1:123456789012:reeve-tasks",
        "awsRegion": "eu-west-1"
    }]}))
    .unwrap()
}

async fn events_of(pool: &PgPool, id: Id) -> Vec<Event> {
    events_after(&mut pool.acquire().await.unwrap(), id, 0).await.unwrap()
}

fn assert_gap_free(events: &[Event]) {
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as i64).collect::<Vec<_>>(), "gap-free");
}

async fn status_and_attempts(pool: &PgPool, id: Id) -> (String, i32) {
    sqlx::query_as("SELECT status, attempts FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

/// An operator's endpoint that answers each call with the next of
/// `answers` (status, `Retry-After`), then 200 with `{"ok": true}`, and
/// notes when each call came.
struct Endpoint {
    url: String,
    calls: Arc<Mutex<Vec<Instant>>>,
}

impl Endpoint {
    async fn start(answers: Vec<(u16, Option<&'static str>)>) -> Endpoint {
        let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let seen = calls.clone();
        let answers = Arc::new(answers);
        let router = axum::Router::new().route(
            "/work",
            axum::routing::post(move || {
                let (seen, answers) = (seen.clone(), answers.clone());
                async move {
                    let n = {
                        let mut seen = seen.lock().unwrap();
                        seen.push(Instant::now());
                        seen.len() - 1
                    };
                    let mut response = axum::response::Response::builder();
                    let (status, retry_after) = answers.get(n).copied().unwrap_or((200, None));
                    response = response.status(status).header("content-type", "application/json");
                    if let Some(after) = retry_after {
                        response = response.header("retry-after", after);
                    }
                    response.body(axum::body::Body::from(json!({"ok": status == 200}).to_string())).unwrap()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/work", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Endpoint { url, calls }
    }

    fn calls(&self) -> Vec<Instant> {
        self.calls.lock().unwrap().clone()
    }
}

// ------------------------------------------------------------------ backoff

/// In the Lambda handler: the record of a retryable failure is hidden for
/// the first backoff (5 s) before it is reported failed, so SQS hands it
/// out again then, not after the queue's visibility timeout (30 s here).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_retried_record_comes_back_after_its_backoff_not_the_visibility_timeout(pool: PgPool) {
    let endpoint = Endpoint::start(vec![(503, None)]).await;
    let api = Api::new(&pool, &catalog(&endpoint.url)).await;
    let id = api.create("flaky", json!({})).await;
    let ctx = worker(&pool, &catalog(&endpoint.url), &api.queue.url).await;

    let message = receive(&api.queue.url, Duration::from_secs(1)).await.expect("task create sent it");
    let response = handle_batch(&ctx, event_of(&message)).await;
    let handed_back = Instant::now();
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    assert_eq!(failed, [message.message_id().unwrap()], "a batch item failure");
    assert_eq!(status_and_attempts(&pool, id).await, ("queued".into(), 1));

    // Hidden for the backoff…
    assert!(receive(&api.queue.url, Duration::from_secs(3)).await.is_none(), "shown before its backoff");
    // …then shown again, long before the queue's 30 s.
    let again = receive(&api.queue.url, Duration::from_secs(10)).await.expect("back after the backoff");
    let waited = handed_back.elapsed();
    assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(12), "back after {waited:?}");
    assert_eq!(again.message_id(), message.message_id());

    // The second delivery completes it.
    let response = handle_batch(&ctx, event_of(&again)).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(status_and_attempts(&pool, id).await, ("completed".into(), 2));
    api.queue.delete().await;
}

/// `reeve work`'s poller: an endpoint that answers 503 twice, the second
/// time asking for an hour (`Retry-After: 3600`), then 200. The first wait
/// is the backoff's 5 s, the second the cap (10 s here) rather than the
/// hour, and the third attempt completes the task well within a minute;
/// the task's events said each time when the next attempt was due.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_endpoint_down_twice_is_retried_after_the_backoff_and_its_cap_and_completes(pool: PgPool) {
    let endpoint = Endpoint::start(vec![(503, None), (503, Some("3600"))]).await;
    let api = Api::new(&pool, &catalog(&endpoint.url)).await;
    let created = Instant::now();
    let id = api.create("flaky", json!({})).await;
    let config = worker_config(&pool, &catalog(&endpoint.url), &api.queue.url)
        .with(settings::RETRY_BACKOFF, "5")
        .with(settings::RETRY_BACKOFF_MAX, "10");
    let ctx = common::worker(&config).await;
    let sqs = common::aws().await.sqs;
    let mut poller = Poller::connect(Arc::new(ctx), sqs, &api.queue.url).await.unwrap();
    poller.wait_time_seconds = 1;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let polling = tokio::spawn(async move { poller.run(async { stopped.await.unwrap() }).await });
    loop {
        let (status, attempts) = status_and_attempts(&pool, id).await;
        if status == "completed" {
            break;
        }
        assert_ne!(status, "failed", "failed after {attempts} attempts");
        assert!(created.elapsed() < Duration::from_secs(60), "still {status} after {attempts} attempts");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = created.elapsed();
    stop.send(()).unwrap();
    polling.await.unwrap();

    let calls = endpoint.calls();
    assert_eq!(calls.len(), 3, "three attempts, the third completes");
    let (first, second) = (calls[1] - calls[0], calls[2] - calls[1]);
    assert!(first >= Duration::from_millis(4500) && first < Duration::from_secs(10), "first wait {first:?}");
    assert!(second >= Duration::from_millis(9500) && second < Duration::from_secs(20), "capped wait {second:?}");
    assert_eq!(status_and_attempts(&pool, id).await, ("completed".into(), 3));

    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    let requeued: Vec<&Event> =
        events.iter().filter(|e| e.kind == EventType::Status && e.data["status"] == "queued").skip(1).collect();
    let waits: Vec<i64> = requeued
        .iter()
        .map(|e| {
            let due = e.data["next_attempt_at"].as_str().expect("next_attempt_at");
            let due = time::OffsetDateTime::parse(due, &time::format_description::well_known::Rfc3339).unwrap();
            (due - e.at).as_seconds_f64().round() as i64
        })
        .collect();
    assert_eq!(waits, [5, 10], "each requeue says when the next attempt is due");
    let lines: Vec<&str> =
        events.iter().filter(|e| e.kind == EventType::Log).filter_map(|e| e.data["line"].as_str()).collect();
    assert!(lines.iter().any(|l| l.contains("attempt 3 is due in 10 s")), "{lines:?}");
    println!(
        "503, 503 (Retry-After: 3600), 200: completed {:.1}s after create; waits {:.1}s and {:.1}s (cap 10 s)",
        took.as_secs_f64(),
        first.as_secs_f64(),
        second.as_secs_f64()
    );
    let result: Value = sqlx::query_scalar::<_, sqlx::types::Json<Value>>("SELECT result FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap()
        .0;
    assert_eq!(result, json!({"ok": true}));
    api.queue.delete().await;
}

// ------------------------------------------------------------------ the deadline

/// A record that reaches the Lambda with less time left than its kind's
/// timeout (plus the worker's deadline margin) is not claimed: no attempt is
/// counted, the executor never starts, and the message is shown again at
/// once for an invocation with the time to run it.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_record_near_the_deadline_is_given_back_unclaimed_with_its_attempts_unchanged(pool: PgPool) {
    let endpoint = Endpoint::start(vec![]).await;
    let api = Api::new(&pool, &catalog(&endpoint.url)).await;
    let id = api.create("flaky", json!({})).await;
    let ctx = worker(&pool, &catalog(&endpoint.url), &api.queue.url).await;
    let message = receive(&api.queue.url, Duration::from_secs(1)).await.expect("task create sent it");

    // `flaky` may run 5 s and the worker stops 10 s before the deadline:
    // 12 s left is not enough.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    let response = handle_batch_until(&ctx, event_of(&message), Some(deadline)).await;
    let failed: Vec<&str> = response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    assert_eq!(failed, [message.message_id().unwrap()], "handed back");
    assert_eq!(status_and_attempts(&pool, id).await, ("queued".into(), 0), "no attempt counted");
    assert!(endpoint.calls().is_empty(), "the executor never started");
    let statuses: Vec<Value> = events_of(&pool, id).await.iter().map(|e| e.data["status"].clone()).collect();
    assert_eq!(statuses, [json!("queued")], "nothing written");

    // Shown again at once (not after the queue's 30 s), to the next invocation.
    let again = receive(&api.queue.url, Duration::from_secs(2)).await.expect("visible again at once");
    assert_eq!(again.message_id(), message.message_id());
    let fresh = tokio::time::Instant::now() + Duration::from_secs(360);
    let response = handle_batch_until(&ctx, event_of(&again), Some(fresh)).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(status_and_attempts(&pool, id).await, ("completed".into(), 1), "its one attempt");
    api.queue.delete().await;
}

/// Every process that loads the catalog refuses a kind whose timeout, plus
/// the worker's 30 s margin, does not fit in the worker's time limit
/// (`REEVE_WORKER_TIMEOUT_SECONDS`, 360 s by default): the catalog
/// function, the worker and the sweeper alike, each naming the TOML path.
#[tokio::test]
async fn every_start_up_refuses_a_task_timeout_the_worker_cannot_fit() {
    use reeve_shared::settings::{CATALOG, Config, WORKER_TIMEOUT};
    use reeve_shared::startup;

    let dir = std::env::temp_dir().join(format!("reeve-leases-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("reeve.toml");
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../reeve.dev.toml")).unwrap();
    std::fs::write(&file, shipped.replacen("\ntimeout_seconds = 300", "\ntimeout_seconds = 600", 1)).unwrap();
    let config = Config::from_env().with(CATALOG, file.display().to_string());
    let sdk = startup::sdk().await;
    let expected = "tasks.digest.timeout_seconds: 600 s plus the worker's 30 s margin is more than the worker's \
                    time limit (360 s, its function's Timeout): at most 330";

    let problems = [
        ("catalog", startup::catalog(&config).err().map(|e| e.problems())),
        ("worker", startup::worker(&config, &sdk, reeve_shared::db::Connect::Lazily).await.err().map(|e| e.problems())),
        ("sweeper", startup::sweeper(&config, &sdk).await.err().map(|e| e.problems())),
    ];
    for (function, problems) in problems {
        let problems = problems.unwrap_or_else(|| panic!("{function} started"));
        assert!(problems.iter().any(|p| p.contains(expected)), "{function}: {problems:?}");
    }
    // Told the worker's Timeout is Lambda's longest, they start.
    let longer = config.with(WORKER_TIMEOUT, "900");
    assert!(startup::catalog(&longer).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

// ------------------------------------------------------------------ dead workers

/// The shipped catalog plus `long` (up to 120 s) and `short` (3 s), whose
/// runs the test's runner decides.
fn long_catalog() -> String {
    common::catalog_text_with(
        r#"
        [tasks.long]
        title = "Long"
        description = "Whatever the test's runner does."
        executor = "digest"
        timeout_seconds = 120
        input_schema = { type = "object" }

        [tasks.short]
        title = "Short"
        description = "Whatever the test's runner does, in 3 s."
        executor = "digest"
        timeout_seconds = 3
        input_schema = { type = "object" }
        "#,
    )
}

/// The sweeper as the `sweeper` Lambda builds it, on this database and queue.
async fn sweeper_of(pool: &PgPool, queue: &str) -> reeve_shared::sweeper::Sweeper {
    let config = common::with_catalog(common::config(pool), &long_catalog()).with(settings::QUEUE_URL, queue);
    startup::sweeper(&config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"))
}

/// A worker serving [`long_catalog`] on `pool`, as start-up builds it,
/// with the test's runner.
async fn long_worker(config: Config, runner: Arc<dyn Runner>) -> WorkerContext {
    common::with_runner(common::worker(&common::with_catalog(config, &long_catalog())).await, runner)
}

/// Run 1 is a long task that reports progress every 200 ms (stuck for good
/// in the middle, blocking its thread, when `stuck` holds a receiver); any
/// later run finishes at once.
struct Long {
    runs: AtomicUsize,
    stuck: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Long {
    fn new(stuck: Option<std::sync::mpsc::Receiver<()>>) -> Arc<Long> {
        Arc::new(Long { runs: AtomicUsize::new(0), stuck: Mutex::new(stuck) })
    }
}

impl Runner for Long {
    fn run<'a>(&'a self, _deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a> {
        Box::pin(async move {
            let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            if run == 1 {
                for tick in 0..600 {
                    job.progress(tick as f32 / 600.0, json!({"tick": tick})).await;
                    if tick == 3
                        && let Some(stuck) = self.stuck.lock().unwrap().take()
                    {
                        // Blocking code that never yields: nothing else of
                        // this invocation runs, its lease is not renewed,
                        // its timeout cannot fire. Lambda kills it at its
                        // deadline.
                        let _ = stuck.recv();
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Ok(json!({ "run": run }))
        })
    }
}

/// What the task's log says once the next run took over: gap-free, one
/// `lease_lost` naming attempt 1 before attempt 2's `running`, one result.
async fn assert_taken_over_once(pool: &PgPool, id: Id) -> Vec<Event> {
    let events = events_of(pool, id).await;
    assert_gap_free(&events);
    let lost: Vec<&Event> = events.iter().filter(|e| e.kind == EventType::LeaseLost).collect();
    assert_eq!(lost.len(), 1, "one lease_lost: {events:?}");
    assert_eq!(lost[0].data["attempt"], 1);
    let statuses: Vec<String> = events
        .iter()
        .filter(|e| e.kind == EventType::Status)
        .map(|e| {
            format!(
                "{}{}",
                e.data["status"].as_str().unwrap(),
                e.data.get("attempt").map_or(String::new(), |a| format!(" {a}"))
            )
        })
        .collect();
    assert_eq!(statuses, ["queued", "running 1", "running 2", "completed"]);
    let after_lost = events.iter().skip_while(|e| e.kind != EventType::LeaseLost).nth(1).unwrap();
    assert_eq!(after_lost.data, json!({"status": "running", "attempt": 2}), "the new attempt right after it");
    assert_eq!(events.iter().filter(|e| e.kind == EventType::Result).count(), 1, "one result");
    let (status, attempts) = status_and_attempts(pool, id).await;
    assert_eq!((status.as_str(), attempts), ("completed", 2));
    let result: Value = sqlx::query_scalar::<_, sqlx::types::Json<Value>>("SELECT result FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
        .0;
    assert_eq!(result, json!({"run": 2}), "the second run's result");
    events
}

/// A Lambda worker killed at its deadline (its executor stuck in blocking
/// code, so neither its timeout nor its deadline stop can fire, as happens
/// when Lambda ends an invocation) leaves its task `running` under a lease
/// nobody renews. The queue hides its message for the shipped 2160 s, so
/// it is the sweeper Lambda's scheduled invocation that sends the task
/// again once the lease lapses, and the next worker invocation runs it:
/// within a minute of the kill, on the shipped lease and sweep.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_worker_lambda_killed_at_its_deadline_leaves_its_task_to_the_next_invocation_within_a_minute(pool: PgPool) {
    let api = Api::new(&pool, &long_catalog()).await;
    let sqs = common::aws().await.sqs;
    sqs.set_queue_attributes()
        .queue_url(&api.queue.url)
        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "2160")
        .send()
        .await
        .unwrap();
    let id = api.create("short", json!({})).await;
    let (release, stuck) = std::sync::mpsc::channel();
    let runner = Long::new(Some(stuck));

    // The first invocation, in a process of its own (a thread and a
    // runtime, both blocked by the stuck executor), with a Lambda context
    // whose deadline is 15 s away: time for `short`'s 3 s and the worker's
    // 10 s margin, so the record is claimed.
    let message = receive(&api.queue.url, Duration::from_secs(1)).await.expect("task create sent it");
    let mut invocation = lambda_http::Context::default();
    let deadline = std::time::SystemTime::now() + Duration::from_secs(15);
    invocation.deadline = deadline.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let options = (*pool.connect_options()).clone();
    let first = {
        let (runner, event) = (runner.clone(), event_of(&message));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let pool = sqlx::postgres::PgPoolOptions::new().connect_with(options).await.unwrap();
                let ctx = long_worker(common::worker_config(&pool), runner).await;
                handle_batch_until(&ctx, event, Some(deadline_of(invocation.deadline()))).await
            })
        })
    };
    let started = Instant::now();
    while events_of(&pool, id).await.iter().filter(|e| e.kind == EventType::Progress).count() < 3 {
        assert!(started.elapsed() < Duration::from_secs(30), "the first run never got going");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status_and_attempts(&pool, id).await, ("running".into(), 1));
    // Lambda kills it at its deadline: from then on nothing of it runs.
    let left = deadline.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(left).await;
    let killed = Instant::now();
    assert_eq!(status_and_attempts(&pool, id).await, ("running".into(), 1), "left running by the kill");

    // The deployment's other half: the sweeper's scheduled invocation (a
    // minute long, as the schedule starts one a minute) and the worker
    // Lambda's event source, handing each message to a fresh invocation.
    let sweeper = sweeper_of(&pool, &api.queue.url).await;
    let scheduled = tokio::spawn(async move {
        let minute = std::time::SystemTime::now() + Duration::from_secs(60);
        sweeper.handle_invocation(json!({}), Some(minute)).await.unwrap()
    });
    let ctx = long_worker(common::worker_config(&pool), runner.clone()).await;
    loop {
        if status_and_attempts(&pool, id).await.0 == "completed" {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(60), "not run again within a minute of the kill");
        if let Some(message) = receive(&api.queue.url, Duration::from_secs(1)).await {
            let fresh = deadline_of(std::time::SystemTime::now() + Duration::from_secs(360));
            handle_batch_until(&ctx, event_of(&message), Some(fresh)).await;
        }
    }
    let recovered = killed.elapsed();
    let events = assert_taken_over_once(&pool, id).await;

    // Should the stuck invocation ever wake, its fenced writes find
    // attempt 2 there and nothing of attempt 1 is written.
    release.send(()).unwrap();
    let response = first.join().unwrap();
    assert!(response.batch_item_failures.len() <= 1);
    assert_eq!(events_of(&pool, id).await, events, "the woken first run wrote nothing");
    assert_eq!(runner.runs.load(Ordering::SeqCst), 2);
    scheduled.abort();
    println!("worker Lambda killed mid-run: run again and completed {:.1}s later", recovered.as_secs_f64());
    api.queue.delete().await;
}

/// A TCP proxy to the stack's Postgres that can stop passing bytes (a
/// network partition: the sockets stay open, what is sent meanwhile is held
/// and arrives once it heals). Only the worker whose pool goes through it
/// loses Postgres; the shared Postgres goes on for everyone else.
struct Partition {
    port: u16,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Partition {
    async fn to(host: String, port: u16) -> Partition {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (cut, healed) = tokio::sync::watch::channel(false);
        let local = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect((host.as_str(), port)).await else { continue };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(Self::pump(client_read, server_write, healed.clone()));
                tokio::spawn(Self::pump(server_read, client_write, healed.clone()));
            }
        });
        Partition { port: local, cut }
    }

    /// Copies one direction, holding what it read while cut.
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut cut: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buffer = vec![0; 16 * 1024];
        loop {
            let Ok(n) = from.read(&mut buffer).await else { return };
            if n == 0 || cut.wait_for(|cut| !*cut).await.is_err() || to.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }

    fn heal(&self) {
        self.cut.send_replace(false);
    }
}

/// A worker that loses Postgres mid-run for longer than its lease (4 s
/// here) stops by its own clock, without a word from Postgres, before any
/// other run may take over. The sweeper sends the task again once the lease
/// lapsed, and another worker (`reeve work`'s poller) runs it to the end.
/// When Postgres comes back to the first worker, what it had sent before it
/// stopped arrives, and is refused by the fence: nothing of it is written.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_worker_that_loses_postgres_longer_than_its_lease_stops_and_writes_nothing_when_it_returns(pool: PgPool) {
    let api = Api::new(&pool, &long_catalog()).await;
    let id = api.create("long", json!({})).await;
    let runner = Long::new(None);
    let options = (*pool.connect_options()).clone();
    let partition = Partition::to(options.get_host().to_owned(), options.get_port()).await;
    let through = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.host("127.0.0.1").port(partition.port))
        .await
        .unwrap();
    // Fault: the first worker's pool reaches Postgres through the partition
    // the test cuts (its DATABASE_URL names the same database).
    let first = long_worker(common::worker_config(&through).with(settings::LEASE, "4"), runner.clone()).await;
    // The first worker takes the message, as task create sent it.
    let message = receive(&api.queue.url, Duration::from_secs(1)).await.expect("task create sent it");
    let body = message.body().unwrap().to_owned();
    let run = tokio::spawn(async move { reeve_shared::worker::process(&first, &body, 1).await });
    let started = Instant::now();
    while events_of(&pool, id).await.iter().filter(|e| e.kind == EventType::Progress).count() < 3 {
        assert!(started.elapsed() < Duration::from_secs(30), "the first run never got going");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    partition.cut();
    let cut = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(15), run)
        .await
        .expect("the first worker stops while Postgres is away")
        .unwrap();
    let stopped = cut.elapsed();
    assert!(outcome.is_retry(), "{outcome:?}");
    assert!(stopped < Duration::from_secs(6), "stopped within its 4 s lease of the cut: {stopped:?}");
    assert_eq!(status_and_attempts(&pool, id).await, ("running".into(), 1), "nothing else moved it yet");

    // The rest of the deployment: the sweeper and another worker, both on
    // the Postgres the first one lost.
    let sweeper = sweeper_of(&pool, &api.queue.url).await;
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let sweeping = {
        let mut stopping = stopping.clone();
        sweeper.spawn_every(Duration::from_secs(1), reeve_shared::sweeper::DEFAULT_OLDER_THAN, async move {
            let _ = stopping.wait_for(|s| *s).await;
        })
    };
    let second = long_worker(common::worker_config(&pool), runner.clone()).await;
    let mut poller = Poller::connect(Arc::new(second), common::aws().await.sqs, &api.queue.url).await.unwrap();
    poller.wait_time_seconds = 1;
    let polling = {
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            poller
                .run(async move {
                    let _ = stopping.wait_for(|s| *s).await;
                })
                .await
        })
    };
    while status_and_attempts(&pool, id).await.0 != "completed" {
        assert!(cut.elapsed() < Duration::from_secs(60), "not completed by another worker within a minute");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let recovered = cut.elapsed();
    let events = assert_taken_over_once(&pool, id).await;

    // Postgres comes back to the first worker, lost for longer than its
    // 4 s lease: what it had sent arrives.
    tokio::time::sleep_until((cut + Duration::from_secs(6)).into()).await;
    let lost_for = cut.elapsed();
    partition.heal();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(events_of(&pool, id).await, events, "the first worker wrote nothing once Postgres was back");
    assert_eq!(status_and_attempts(&pool, id).await, ("completed".into(), 2));
    stop.send_replace(true);
    polling.await.unwrap();
    sweeping.await.unwrap();
    println!(
        "Postgres lost for {:.1}s: the first worker stopped after {:.1}s; completed by another {:.1}s after the cut",
        lost_for.as_secs_f64(),
        stopped.as_secs_f64(),
        recovered.as_secs_f64()
    );
    api.queue.delete().await;
}
