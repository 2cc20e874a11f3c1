//! The worker against the real stack: Postgres, Redis, moto SQS and
//! SeaweedFS. Tasks are created through the API (upload, PUT to S3, create),
//! then run by the Lambda handler (`handle_batch`, fed with the sample
//! events in `events/sqs-*.json`), by `process` directly, or by the poller
//! on a queue of the test's own.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_sdk_sqs::types::QueueAttributeName;
use axum::http::StatusCode;
use common::QueuedApi as Api;
use common::{post_json, send};
use futures_util::StreamExt;
use reeve_shared::executors::{ExecDeps, ExecError, Job};
use reeve_shared::ids::Id;
use reeve_shared::settings::{self, Config};
use reeve_shared::tasks::events_after;
use reeve_shared::tasks::{Event, EventType, channel};
use reeve_shared::worker::{
    Outcome, Poller, RunFuture, Runner, WorkerContext, handle_batch, handle_batch_until, process,
};
use serde_json::{Value, json};
use sha2::Digest as _;
use sqlx::PgPool;

/// The task id in the sample events, replaced by a real one at run time.
const SAMPLE_TASK_ID: &str = "01JNVX5C7D9F1H3K5M7P9R1T3V";

/// `digest` as shipped, plus `slow`: a short timeout for the scripted runners.
fn test_catalog() -> String {
    common::catalog_text_with(
        r#"
        [tasks.slow]
        title = "Slow"
        description = "Runs whatever runner the test plugs in."
        executor = "digest"
        timeout_seconds = 3
        input_schema = { type = "object" }
    "#,
    )
}

/// The worker's configuration on the stack, serving [`test_catalog`].
fn worker_config(pool: &PgPool) -> Config {
    common::with_catalog(common::worker_config(pool), &test_catalog())
}

/// A worker on the stack, as start-up builds it.
async fn worker(pool: &PgPool) -> WorkerContext {
    common::worker(&worker_config(pool)).await
}

/// [`worker`] whose S3 client cannot connect. Fault: S3 out of reach (the
/// SDK takes its endpoint from the process, not from a `Config`).
async fn worker_without_s3(pool: &PgPool) -> WorkerContext {
    let mut ctx = worker(pool).await;
    ctx.exec.s3 = unreachable_s3().await;
    let sdk = reeve_shared::startup::sdk().await;
    ctx.exec.objects = reeve_shared::s3_objects::S3Objects::new(&sdk, Some("http://127.0.0.1:1".into()));
    ctx
}

/// An S3 client that cannot connect (nothing listens on port 1), without
/// the SDK's retries so that the test stays quick.
async fn unreachable_s3() -> aws_sdk_s3::Client {
    let config = reeve_shared::startup::sdk().await;
    let conf = aws_sdk_s3::config::Builder::from(&config)
        .endpoint_url("http://127.0.0.1:1")
        .force_path_style(true)
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

impl Api {
    /// Uploads `bytes` (presign, then PUT to S3): the upload id.
    async fn upload(&self, bytes: &[u8]) -> String {
        let upload = send(
            &self.app,
            post_json(
                "/v1/uploads",
                Some(&self.token),
                &json!({"filename": "data.bin", "content_type": "application/octet-stream", "size": bytes.len()}),
            ),
        )
        .await;
        assert_eq!(upload.status, StatusCode::CREATED, "{}", upload.body);
        let mut request = reqwest::Client::new().put(upload.body["url"].as_str().unwrap()).body(bytes.to_vec());
        for (name, value) in upload.body["headers"].as_object().unwrap() {
            if name != "content-length" {
                request = request.header(name, value.as_str().unwrap());
            }
        }
        let put = request.send().await.unwrap();
        assert_eq!(put.status(), reqwest::StatusCode::OK, "{:?}", put.text().await);
        upload.body["upload_id"].as_str().unwrap().to_owned()
    }

    /// A queued digest of `bytes`.
    async fn digest(&self, bytes: &[u8]) -> Id {
        let upload_id = self.upload(bytes).await;
        self.create("digest", json!({ "upload_id": upload_id })).await
    }

    async fn done(self) {
        self.queue.delete().await;
    }
}

/// Some bytes over 2 MiB, so that the digest reports progress a few times.
fn payload() -> Vec<u8> {
    (0..(2 * 1024 * 1024 + 12345)).map(|i: u32| (i.wrapping_mul(2654435761) >> 24) as u8).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A sample event from `events/`, with `task_id` in place of the sample's.
fn sample_event(file: &str, task_id: Id) -> SqsEvent {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../events").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(SAMPLE_TASK_ID), "{file} names the sample task");
    serde_json::from_str(&text.replace(SAMPLE_TASK_ID, &task_id.to_string())).unwrap()
}

/// An event of one record per body, numbered message ids, all delivered
/// for the `receive_count`-th time.
fn event_of(bodies: &[String], receive_count: u32) -> SqsEvent {
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            json!({
                "messageId": format!("msg-{i}"),
                "receiptHandle": format!("receipt-{i}"),
                "body": body,
                "attributes": {"ApproximateReceiveCount": receive_count.to_string()},
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:eu-west-1:123456789012:reeve-tasks",
                "awsRegion": "eu-west-1"
            })
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

fn body_of(task_id: Id, kind: &str) -> String {
    json!({"task_id": task_id, "kind": kind}).to_string()
}

fn failures(response: &SqsBatchResponse) -> Vec<String> {
    response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect()
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    status: String,
    progress: f32,
    result: Option<Value>,
    error: Option<Value>,
    attempts: i32,
    lease_until: Option<time::OffsetDateTime>,
}

async fn row(pool: &PgPool, id: Id) -> Row {
    sqlx::query_as("SELECT status, progress, result, error, attempts, lease_until FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn events_of(pool: &PgPool, id: Id) -> Vec<Event> {
    let mut conn = pool.acquire().await.unwrap();
    events_after(&mut conn, id, 0).await.unwrap()
}

fn statuses(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == EventType::Status)
        .map(|e| e.data["status"].as_str().unwrap().to_owned())
        .collect()
}

fn assert_gap_free(events: &[Event]) {
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<i64> = (1..=events.len() as i64).collect();
    assert_eq!(seqs, expected, "seq runs 1..n with no gaps");
}

/// A subscriber to a task's channel on a connection of its own.
struct Listener {
    messages: std::pin::Pin<Box<dyn futures_util::Stream<Item = redis::Msg> + Send>>,
}

impl Listener {
    async fn new(task_id: Id) -> Listener {
        let client = redis::Client::open(common::redis_url()).unwrap();
        let mut pubsub = client.get_async_pubsub().await.unwrap();
        pubsub.subscribe(channel(task_id)).await.unwrap();
        Listener { messages: Box::pin(pubsub.into_on_message()) }
    }

    /// Every event published until none came for half a second.
    async fn collect(&mut self) -> Vec<Value> {
        let mut got = Vec::new();
        while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(500), self.messages.next()).await {
            let payload: String = msg.get_payload().unwrap();
            got.push(serde_json::from_str(&payload).unwrap());
        }
        got
    }
}

// ------------------------------------------------------------------ the happy path

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_sample_event_runs_a_digest_to_completion_and_every_event_is_published(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let bytes = payload();
    let id = api.digest(&bytes).await;
    let ctx = worker(&pool).await;
    let mut listener = Listener::new(id).await;

    let response = handle_batch(&ctx, sample_event("sqs-digest.json", id)).await;
    assert_eq!(failures(&response), Vec::<String>::new());

    let task = row(&pool, id).await;
    assert_eq!(task.status, "completed", "{task:?}");
    assert_eq!(task.attempts, 1);
    assert_eq!(task.progress, 1.0);
    assert_eq!(task.lease_until, None);
    let result = task.result.unwrap();
    assert_eq!(result["sha256"], sha256_hex(&bytes));
    assert_eq!(result["size"], bytes.len());
    assert_eq!(task.error, None);

    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    assert_eq!(events[0].data, json!({"status": "queued"}));
    assert_eq!(events[1].data, json!({"status": "running", "attempt": 1}));
    let n = events.len();
    assert_eq!(events[n - 2].kind, EventType::Result);
    assert_eq!(events[n - 2].data, result);
    assert_eq!(events[n - 1].data, json!({"status": "completed"}));
    assert_eq!(statuses(&events), ["queued", "running", "completed"]);
    let progress: Vec<f64> =
        events.iter().filter(|e| e.kind == EventType::Progress).map(|e| e.data["fraction"].as_f64().unwrap()).collect();
    assert!(progress.len() >= 2, "progress per MiB: {events:?}");
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    assert!(events.iter().any(|e| e.kind == EventType::Progress && e.data["total"] == bytes.len()));
    assert!(events.iter().any(|e| e.kind == EventType::Log), "the digest logs its steps: {events:?}");

    // Everything after `queued` (which task create wrote) was published, in
    // order, exactly as stored.
    let published = listener.collect().await;
    let stored: Vec<Value> = events[1..].iter().map(|e| serde_json::to_value(e).unwrap()).collect();
    assert_eq!(published, stored);
    api.done().await;
}

// ------------------------------------------------------------------ duplicates

async fn running_events(pool: &PgPool, id: Id) -> usize {
    statuses(&events_of(pool, id).await).iter().filter(|s| *s == "running").count()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_message_delivered_twice_in_a_row_runs_the_executor_once(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.digest(b"twice").await;
    let ctx = worker(&pool).await;

    let first = handle_batch(&ctx, sample_event("sqs-digest.json", id)).await;
    let second = handle_batch(&ctx, sample_event("sqs-digest.json", id)).await;
    assert!(first.batch_item_failures.is_empty() && second.batch_item_failures.is_empty());
    assert_eq!(process(&ctx, &body_of(id, "digest"), 3).await, Outcome::Done);

    let task = row(&pool, id).await;
    assert_eq!((task.status.as_str(), task.attempts), ("completed", 1));
    assert_eq!(running_events(&pool, id).await, 1);
    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    assert_eq!(events.iter().filter(|e| e.kind == EventType::Result).count(), 1);
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_duplicate_in_one_batch_runs_once_and_neither_record_fails(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.digest(&payload()).await;
    let other = api.digest(b"another task in the same batch").await;
    let ctx = worker(&pool).await;

    let body = body_of(id, "digest");
    let response = handle_batch(&ctx, event_of(&[body.clone(), body_of(other, "digest"), body], 1)).await;
    assert_eq!(failures(&response), Vec::<String>::new());
    for task in [id, other] {
        let row = row(&pool, task).await;
        assert_eq!((row.status.as_str(), row.attempts), ("completed", 1));
        assert_eq!(running_events(&pool, task).await, 1);
    }
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn concurrent_deliveries_to_two_workers_run_once(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.digest(&payload()).await;
    // Two Lambda instances, each with the message.
    let (a, b) = (worker(&pool).await, worker(&pool).await);
    let (ra, rb) = tokio::join!(
        handle_batch(&a, sample_event("sqs-digest.json", id)),
        handle_batch(&b, sample_event("sqs-digest.json", id)),
    );
    let task = row(&pool, id).await;
    assert_eq!((task.status.as_str(), task.attempts), ("completed", 1));
    assert_eq!(running_events(&pool, id).await, 1);
    // The loser either saw the task finished, or held by a live lease and
    // asked for a redelivery, which then finds it finished.
    let retried = ra.batch_item_failures.len() + rb.batch_item_failures.len();
    assert!(retried <= 1, "{ra:?} {rb:?}");
    let again = handle_batch(&a, sample_event("sqs-digest.json", id)).await;
    assert!(again.batch_item_failures.is_empty());
    assert_eq!(row(&pool, id).await.attempts, 1);
    api.done().await;
}

// ------------------------------------------------------------------ malformed

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_malformed_body_is_dropped_as_a_permanent_failure_while_the_good_record_completes(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let bytes = b"the good record".to_vec();
    let id = api.digest(&bytes).await;
    let ctx = worker(&pool).await;

    let event = sample_event("sqs-malformed.json", id);
    assert_eq!(event.records.len(), 2);
    let response = handle_batch(&ctx, event).await;
    assert_eq!(failures(&response), Vec::<String>::new(), "a malformed body is not redelivered");
    let task = row(&pool, id).await;
    assert_eq!(task.status, "completed");
    assert_eq!(task.result.unwrap()["sha256"], sha256_hex(&bytes));

    for body in [
        "",
        "null",
        "[]",
        "{\"task\":\"not-a-ulid\"",
        "{\"task_id\":\"not-a-ulid\",\"kind\":\"digest\"}",
        "{\"task_id\":\"01jnvx5c7d9f1h3k5m7p9r1t3v\",\"kind\":\"digest\"}",
        "{\"task_id\":42,\"kind\":\"digest\"}",
        "\u{0}\u{1}binary",
    ] {
        assert_eq!(process(&ctx, body, 1).await, Outcome::Failed("malformed_message"), "{body:?}");
    }
    // A well-formed message for a task that does not exist is simply done.
    assert_eq!(process(&ctx, &body_of(Id::new(), "digest"), 1).await, Outcome::Done);
    api.done().await;
}

// ------------------------------------------------------------------ retryable and permanent

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn s3_out_of_reach_is_retried_and_on_the_last_delivery_fails_as_retries_exhausted(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let bytes = b"S3 is down".to_vec();
    let id = api.digest(&bytes).await;
    let broken = worker_without_s3(&pool).await;

    let response = handle_batch(&broken, sample_event("sqs-digest.json", id)).await;
    assert_eq!(failures(&response), ["2e1424d4-f796-459a-8184-9c92662be6da"]);
    let task = row(&pool, id).await;
    assert_eq!(task.status, "queued", "back in the queue, not failed: {task:?}");
    assert_eq!((task.error, task.lease_until, task.attempts), (None, None, 1));
    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    assert_eq!(statuses(&events), ["queued", "running", "queued"]);
    let log = events.iter().rev().find(|e| e.kind == EventType::Log).unwrap();
    let line = log.data["line"].as_str().unwrap();
    assert!(line.starts_with("attempt 1 did not finish (a temporary problem); attempt 2 is due in 5 s, at "), "{line}");
    assert!(!line.contains("127.0.0.1"), "no internal detail reaches the owner: {line}");

    // A second delivery, still short of the limit: retried again.
    assert!(matches!(process(&broken, &body_of(id, "digest"), 4).await, Outcome::Retry(_)));
    assert_eq!(row(&pool, id).await.status, "queued");

    // The queue's last delivery: failed for good, not a batch item failure.
    let last = event_of(&[body_of(id, "digest")], 5);
    let response = handle_batch(&broken, last).await;
    assert_eq!(failures(&response), Vec::<String>::new());
    let task = row(&pool, id).await;
    assert_eq!(task.status, "failed");
    assert_eq!(task.attempts, 3);
    assert_eq!(task.error.as_ref().unwrap()["code"], "retries_exhausted");
    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    let n = events.len();
    assert_eq!(events[n - 2].kind, EventType::Error);
    assert_eq!(events[n - 2].data["code"], "retries_exhausted");
    assert_eq!(events[n - 1].data["status"], "failed");

    // With S3 back, a stray redelivery finds the task terminal.
    assert_eq!(process(&worker(&pool).await, &body_of(id, "digest"), 1).await, Outcome::Done);
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_upload_replaced_with_another_size_fails_the_task_as_upload_mismatch(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.digest(b"what was declared").await;
    let key: String = sqlx::query_scalar("SELECT key FROM uploads").fetch_one(&pool).await.unwrap();
    let s3 = common::s3().await;
    s3.put_object()
        .bucket(std::env::var("REEVE_BUCKET").unwrap())
        .key(&key)
        .content_type("application/octet-stream")
        .body(b"something else, and longer than declared".to_vec().into())
        .send()
        .await
        .unwrap();
    let ctx = worker(&pool).await;
    let mut listener = Listener::new(id).await;

    let response = handle_batch(&ctx, sample_event("sqs-digest.json", id)).await;
    assert_eq!(failures(&response), Vec::<String>::new(), "a permanent failure is not redelivered");
    let task = row(&pool, id).await;
    assert_eq!(task.status, "failed");
    assert_eq!(task.error.as_ref().unwrap()["code"], "upload_mismatch");
    assert_eq!(task.result, None);
    assert_eq!(task.lease_until, None);

    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    let n = events.len();
    assert_eq!(events[n - 2].kind, EventType::Error);
    assert_eq!(events[n - 2].data, task.error.clone().unwrap());
    assert_eq!(events[n - 1].data, json!({"status": "failed", "error": task.error.unwrap()}));
    let published = listener.collect().await;
    assert_eq!(published.last().unwrap()["data"]["status"], "failed");
    assert_eq!(published.len(), n - 1);

    assert_eq!(process(&ctx, &body_of(id, "digest"), 1).await, Outcome::Done, "terminal: skipped");
    api.done().await;
}

// ------------------------------------------------------------------ leases

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_expired_lease_is_reclaimed_and_a_live_one_is_not(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let bytes = b"a worker died holding this".to_vec();
    let id = api.digest(&bytes).await;
    let ctx = worker(&pool).await;

    // A live lease of another worker: hands off.
    sqlx::query(
        "UPDATE tasks SET status = 'running', attempts = 1, lease_until = now() + interval '10 minutes' WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let outcome = process(&ctx, &body_of(id, "digest"), 2).await;
    assert!(matches!(outcome, Outcome::Retry(_)), "{outcome:?}");
    let task = row(&pool, id).await;
    assert_eq!((task.status.as_str(), task.attempts), ("running", 1));
    let response = handle_batch(&ctx, sample_event("sqs-digest.json", id)).await;
    assert_eq!(failures(&response).len(), 1, "a live lease elsewhere is a retry");

    // Even on the last delivery, another worker's live lease is left alone.
    assert!(process(&ctx, &body_of(id, "digest"), 5).await.is_retry());
    assert_eq!(row(&pool, id).await.status, "running");

    // That worker died: its lease ran out.
    sqlx::query("UPDATE tasks SET lease_until = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(process(&ctx, &body_of(id, "digest"), 3).await, Outcome::Done);
    let task = row(&pool, id).await;
    assert_eq!((task.status.as_str(), task.attempts), ("completed", 2));
    assert_eq!(task.result.unwrap()["sha256"], sha256_hex(&bytes));
    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    // The takeover says whose run it ends, and since when, before its own.
    assert_eq!(events[1].kind, EventType::LeaseLost);
    assert_eq!(events[1].data["attempt"], 1);
    let lapsed_at = events[1].data["lapsed_at"].as_str().unwrap();
    time::OffsetDateTime::parse(lapsed_at, &time::format_description::well_known::Rfc3339).unwrap();
    assert_eq!(events[2].data, json!({"status": "running", "attempt": 2}));
    assert_eq!(statuses(&events), ["queued", "running", "completed"]);
    api.done().await;
}

// ------------------------------------------------------------------ scripted runners

/// Counts its runs; reports, then sleeps, then answers.
struct Scripted {
    runs: AtomicUsize,
    sleep: Duration,
    reports: usize,
}

impl Scripted {
    fn new(sleep: Duration, reports: usize) -> Arc<Scripted> {
        Arc::new(Scripted { runs: AtomicUsize::new(0), sleep, reports })
    }
}

impl Runner for Scripted {
    fn run<'a>(&'a self, _deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a> {
        Box::pin(async move {
            let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            for i in 1..=self.reports {
                job.progress(i as f32 / self.reports as f32, json!({"step": i})).await;
            }
            job.log(format!("run {run}")).await;
            tokio::time::sleep(self.sleep).await;
            if job.input.get("fail").is_some() {
                return Err(ExecError::permanent("invalid_input", "asked to fail"));
            }
            Ok(json!({"run": run}))
        })
    }
}

/// Polls until the task has `status` (for at most 10 s).
async fn wait_for_status(pool: &PgPool, id: Id, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while row(pool, id).await.status != status {
        assert!(Instant::now() < deadline, "the task never became {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn reports_become_events_and_the_task_progress_is_kept(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.create("slow", json!({})).await;
    let runner = Scripted::new(Duration::from_millis(10), 200);
    let ctx = common::with_runner(worker(&pool).await, runner.clone());

    assert_eq!(process(&ctx, &body_of(id, "slow"), 1).await, Outcome::Done);
    assert_eq!(runner.runs.load(Ordering::SeqCst), 1);
    let task = row(&pool, id).await;
    assert_eq!(task.status, "completed");
    assert_eq!(task.result, Some(json!({"run": 1})));
    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    let progress: Vec<&Event> = events.iter().filter(|e| e.kind == EventType::Progress).collect();
    assert!(!progress.is_empty() && progress.len() <= 200, "{}", progress.len());
    // Coalescing may skip intermediate steps, never the last one.
    let last = progress.last().unwrap();
    assert_eq!(last.data, json!({"fraction": 1.0, "step": 200}));
    let log = events.iter().find(|e| e.kind == EventType::Log).unwrap();
    assert_eq!(log.data, json!({"line": "run 1"}));

    // A permanent error from the runner fails the task with its code.
    let failing = api.create("slow", json!({"fail": true})).await;
    assert_eq!(process(&ctx, &body_of(failing, "slow"), 1).await, Outcome::Failed("invalid_input"));
    let task = row(&pool, failing).await;
    assert_eq!(task.status, "failed");
    assert_eq!(task.error, Some(json!({"code": "invalid_input", "message": "asked to fail"})));
    assert!(task.progress > 0.99, "progress reports were kept: {}", task.progress);
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_run_past_its_timeout_is_retried_and_then_fails_for_good(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.create("slow", json!({})).await;
    // `slow` has timeout_seconds = 3.
    let runner = Scripted::new(Duration::from_secs(30), 1);
    let ctx = common::with_runner(worker(&pool).await, runner.clone());

    let started = Instant::now();
    let outcome = process(&ctx, &body_of(id, "slow"), 1).await;
    assert!(matches!(&outcome, Outcome::Retry(r) if r.reason.contains("timed out")), "{outcome:?}");
    assert_eq!(outcome, Outcome::retry_in("timed out after 3s", Duration::from_secs(5)), "the first backoff");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let task = row(&pool, id).await;
    assert_eq!((task.status.as_str(), task.progress, task.lease_until), ("queued", 0.0, None));
    let events = events_of(&pool, id).await;
    let log = events.iter().rev().find(|e| e.kind == EventType::Log).unwrap();
    let line = log.data["line"].as_str().unwrap();
    assert!(line.starts_with("attempt 1 did not finish (timed out after 3s); attempt 2 is due in 5 s, at "), "{line}");
    // The status says when too, for a client to show.
    let queued = events.last().unwrap();
    let due = queued.data["next_attempt_at"].as_str().expect("next_attempt_at");
    let due = time::OffsetDateTime::parse(due, &time::format_description::well_known::Rfc3339).unwrap();
    let wait = (due - queued.at).as_seconds_f64();
    assert!((4.0..=6.0).contains(&wait), "due {wait} s after the requeue");

    let outcome = process(&ctx, &body_of(id, "slow"), 5).await;
    assert_eq!(outcome, Outcome::Failed("retries_exhausted"));
    let task = row(&pool, id).await;
    assert_eq!(task.status, "failed");
    assert_eq!(task.attempts, 2);
    let error = task.error.unwrap();
    assert_eq!(error["code"], "retries_exhausted");
    assert!(error["message"].as_str().unwrap().contains("timed out after 3s"), "{error}");
    assert_eq!(runner.runs.load(Ordering::SeqCst), 2);
    api.done().await;
}

/// A renewal is fenced: the run that finds its lease taken stops at its
/// next renewal, long before its executor would have ended, and writes
/// nothing more.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_run_that_finds_its_lease_taken_stops_and_writes_nothing(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.create("slow", json!({})).await;
    // The executor would run for 30 s (its timeout is 3 s); renewals every 0.5 s.
    let config = worker_config(&pool).with(settings::LEASE, "2");
    let ctx = common::with_runner(common::worker(&config).await, Scripted::new(Duration::from_secs(30), 1));

    let body = body_of(id, "slow");
    let run = async {
        let outcome = process(&ctx, &body, 1).await;
        (outcome, Instant::now())
    };
    let takeover = async {
        // While it runs, another run takes the task over (as after a lapsed
        // lease): a new fencing token.
        wait_for_status(&pool, id, "running").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query("UPDATE tasks SET attempts = attempts + 1 WHERE id = $1").bind(id).execute(&pool).await.unwrap();
        let written = events_of(&pool, id).await.len();
        (Instant::now(), written)
    };
    let ((outcome, stopped), (taken, written)) = tokio::join!(run, takeover);
    assert_eq!(outcome, Outcome::Done);
    assert!(stopped.duration_since(taken) < Duration::from_secs(2), "stopped at the next renewal");
    let task = row(&pool, id).await;
    assert_eq!((task.status.as_str(), task.attempts, task.result), ("running", 2, None));
    assert_eq!(events_of(&pool, id).await.len(), written, "nothing written after the takeover");
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_lease_is_extended_while_the_executor_runs(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.create("slow", json!({})).await;
    // A run of 2.5 s against a 3 s timeout, on leases of 1 s: renewed
    // every quarter second, the run outlives its first lease twice over.
    let mut ctx = common::with_runner(worker(&pool).await, Scripted::new(Duration::from_millis(2500), 1));
    // Fault: a 1 s lease, below the 2 s that REEVE_LEASE_SECONDS allows.
    ctx.settings.lease = Duration::from_secs(1);

    let lease = |pool: PgPool| async move {
        let until: Option<time::OffsetDateTime> =
            sqlx::query_scalar("SELECT lease_until FROM tasks WHERE id = $1").bind(id).fetch_one(&pool).await.unwrap();
        until
    };
    let watch = async {
        wait_for_status(&pool, id, "running").await;
        let first = lease(pool.clone()).await.expect("leased");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let later = lease(pool.clone()).await.expect("still leased");
        (first, later)
    };
    let body = body_of(id, "slow");
    let (outcome, (first, later)) = tokio::join!(process(&ctx, &body, 1), watch);
    assert_eq!(outcome, Outcome::Done);
    assert!(later > first, "extended: {first} → {later}");
    assert_eq!(row(&pool, id).await.lease_until, None, "cleared on completion");
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn without_redis_the_task_still_completes_and_every_event_is_stored(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.create("slow", json!({})).await;
    let ctx = common::worker(&worker_config(&pool).with(settings::REDIS_URL, "redis://127.0.0.1:1")).await;
    let ctx = common::with_runner(ctx, Scripted::new(Duration::ZERO, 50));

    let started = Instant::now();
    assert_eq!(process(&ctx, &body_of(id, "slow"), 1).await, Outcome::Done);
    assert!(started.elapsed() < Duration::from_secs(8), "publishing does not stall the run: {:?}", started.elapsed());
    assert_eq!(row(&pool, id).await.status, "completed");
    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    assert_eq!(statuses(&events), ["queued", "running", "completed"]);
    api.done().await;
}

// ------------------------------------------------------------------ the poller

async fn queue_counts(sqs: &aws_sdk_sqs::Client, url: &str) -> (u32, u32) {
    let got = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap();
    let attributes = got.attributes().unwrap();
    let count = |name| attributes.get(&name).unwrap().parse().unwrap();
    (
        count(QueueAttributeName::ApproximateNumberOfMessages),
        count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_poller_runs_real_messages_and_deletes_them_once_done(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let bytes = payload();
    let id = api.digest(&bytes).await;
    let sqs = common::aws().await.sqs;
    assert_eq!(queue_counts(&sqs, &api.queue.url).await, (1, 0), "task create sent it");

    let mut poller = Poller::connect(Arc::new(worker(&pool).await), sqs.clone(), &api.queue.url).await.unwrap();
    poller.wait_time_seconds = 1;
    let report = poller.poll_once().await.unwrap();
    assert_eq!((report.received, report.done, report.failed, report.retried), (1, 1, 0, 0));
    let task = row(&pool, id).await;
    assert_eq!(task.status, "completed");
    assert_eq!(task.result.unwrap()["sha256"], sha256_hex(&bytes));
    assert_eq!(queue_counts(&sqs, &api.queue.url).await, (0, 0), "deleted, not just hidden");
    assert_eq!(poller.poll_once().await.unwrap().received, 0);
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_poller_leaves_a_retry_in_the_queue_and_deletes_a_malformed_message(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.digest(b"retry me").await;
    let sqs = common::aws().await.sqs;
    sqs.send_message().queue_url(&api.queue.url).message_body("{not json").send().await.unwrap();

    let broken = worker_without_s3(&pool).await;
    let mut poller = Poller::connect(Arc::new(broken), sqs.clone(), &api.queue.url).await.unwrap();
    poller.wait_time_seconds = 1;
    let mut report = poller.poll_once().await.unwrap();
    if report.received < 2 {
        // moto may hand out fewer than asked for: take the rest.
        let more = poller.poll_once().await.unwrap();
        report.received += more.received;
        report.failed += more.failed;
        report.retried += more.retried;
    }
    assert_eq!((report.received, report.failed, report.retried), (2, 1, 1));
    assert_eq!(row(&pool, id).await.status, "queued");
    assert_eq!(queue_counts(&sqs, &api.queue.url).await, (0, 1), "the retry waits out its visibility timeout");
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_poller_keeps_a_long_task_invisible_while_it_runs(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.create("slow", json!({})).await;
    let sqs = common::aws().await.sqs;
    sqs.set_queue_attributes()
        .queue_url(&api.queue.url)
        .attributes(QueueAttributeName::VisibilityTimeout, "2")
        .send()
        .await
        .unwrap();
    let ctx = common::with_runner(worker(&pool).await, Scripted::new(Duration::from_millis(2500), 1));
    let mut poller = Poller::connect(Arc::new(ctx), sqs.clone(), &api.queue.url).await.unwrap();
    assert_eq!(poller.visibility_timeout, Duration::from_secs(2));
    poller.wait_time_seconds = 1;

    let peek = async {
        // Past the 2 s visibility timeout, the message must still be hidden.
        tokio::time::sleep(Duration::from_millis(2200)).await;
        let got = sqs.receive_message().queue_url(&api.queue.url).wait_time_seconds(0).send().await.unwrap();
        got.messages.unwrap_or_default().len()
    };
    let (report, seen) = tokio::join!(poller.poll_once(), peek);
    assert_eq!(seen, 0, "a second worker would have got the running message");
    assert_eq!(report.unwrap().done, 1);
    assert_eq!(row(&pool, id).await.status, "completed");
    assert_eq!(queue_counts(&sqs, &api.queue.url).await, (0, 0));
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_poller_run_loop_stops_on_shutdown_after_finishing_in_flight_work(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.create("slow", json!({})).await;
    let sqs = common::aws().await.sqs;
    let ctx = common::with_runner(worker(&pool).await, Scripted::new(Duration::from_millis(1500), 1));
    let mut poller = Poller::connect(Arc::new(ctx), sqs.clone(), &api.queue.url).await.unwrap();
    poller.wait_time_seconds = 1;

    // Shut down while the task is running.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async {
        wait_for_status(&pool, id, "running").await;
        tx.send(()).unwrap();
    };
    let run = tokio::time::timeout(Duration::from_secs(20), poller.run(async { rx.await.unwrap() }));
    let (stopped, ()) = tokio::join!(run, stop);
    stopped.expect("the loop ends after shutdown");
    assert_eq!(row(&pool, id).await.status, "completed", "the in-flight message was finished");
    assert_eq!(queue_counts(&sqs, &api.queue.url).await, (0, 0));
    api.done().await;
}

/// `reeve work` holds a second message received while its one slot is
/// busy, so the slot never waits on a receive. Shut down meanwhile, the
/// held message is given back unstarted: its task is still queued with no
/// attempt spent, and the next worker can take it at once.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_message_held_for_a_slot_at_shutdown_is_given_back_unstarted(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let ids = [api.create("slow", json!({})).await, api.create("slow", json!({})).await];
    let sqs = common::aws().await.sqs;
    let mut ctx = common::with_runner(worker(&pool).await, Scripted::new(Duration::from_millis(1500), 1));
    ctx.settings.concurrency = 1;
    let mut poller = Poller::connect(Arc::new(ctx), sqs.clone(), &api.queue.url).await.unwrap();
    poller.wait_time_seconds = 1;

    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async {
        // Both received (none visible) while one runs: then shut down. A
        // shutdown before the slot's claim would give both back.
        let deadline = Instant::now() + Duration::from_secs(10);
        let running = || async {
            let mut statuses = Vec::new();
            for id in ids {
                statuses.push(row(&pool, id).await.status);
            }
            statuses.iter().any(|s| s == "running")
        };
        while queue_counts(&sqs, &api.queue.url).await != (0, 2) || !running().await {
            assert!(Instant::now() < deadline, "the poller never held both messages");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tx.send(()).unwrap();
    };
    let run = tokio::time::timeout(Duration::from_secs(20), poller.run(async { rx.await.unwrap() }));
    let (stopped, ()) = tokio::join!(run, stop);
    stopped.expect("the loop ends after shutdown");

    let mut rows = Vec::new();
    for id in ids {
        let task = row(&pool, id).await;
        rows.push((task.status, task.attempts));
    }
    rows.sort();
    assert_eq!(rows, vec![("completed".to_owned(), 1), ("queued".to_owned(), 0)], "one ran, one was never claimed");
    assert_eq!(queue_counts(&sqs, &api.queue.url).await, (1, 0), "the held message is receivable at once");
    api.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_message_that_arrives_during_the_shutdown_long_poll_is_given_back_at_once(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let sqs = common::aws().await.sqs;
    let mut poller = Poller::connect(Arc::new(worker(&pool).await), sqs.clone(), &api.queue.url).await.unwrap();
    // The queue hides a received message for 30 s; a long poll of 3 s.
    poller.wait_time_seconds = 3;

    // Shut down while the (empty) queue is being long-polled, then send a
    // message: the receive already at SQS picks it up.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let body = body_of(Id::new(), "digest");
    let stop = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqs.send_message().queue_url(&api.queue.url).message_body(&body).send().await.unwrap();
    };
    let run = tokio::time::timeout(Duration::from_secs(15), poller.run(async { rx.await.unwrap() }));
    let (stopped, ()) = tokio::join!(run, stop);
    stopped.expect("the loop ends after shutdown");

    // Right after shutdown, the message is there for the next worker.
    let got = sqs.receive_message().queue_url(&api.queue.url).wait_time_seconds(1).send().await.unwrap();
    let bodies: Vec<_> = got.messages().iter().map(|m| m.body().unwrap().to_owned()).collect();
    assert_eq!(bodies, vec![body], "the message is receivable at once, not hidden for the visibility timeout");
}

// ------------------------------------------------------------------ the invocation's deadline

/// Lambda kills the worker at its deadline, whatever the task's own timeout
/// says. A record is claimed only with its timeout left before the stop, so
/// the timeout comes first; but a claim can be slow (here a lock on the
/// task row holds it 2 s), and a run that started late is still stopped
/// before the deadline and its task handed back (`queued`, the record a
/// batch item failure, shown again at once), not left `running`.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_run_that_started_late_is_stopped_before_the_invocation_deadline_and_handed_back(pool: PgPool) {
    let api = Api::new(&pool, &test_catalog()).await;
    let id = api.create("slow", json!({})).await;
    let runner = Scripted::new(Duration::from_secs(120), 1);
    let mut ctx = common::with_runner(worker(&pool).await, runner.clone());
    // Fault: a 1 s margin before the invocation's deadline (no setting moves it).
    ctx.deadline_margin = Duration::from_secs(1);

    // `slow` runs for at most 3 s; the stop is 4 s away: claimed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE").bind(id).execute(&mut *lock).await.unwrap();
    let release = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        lock.commit().await.unwrap();
    };
    let event = event_of(&[body_of(id, "slow")], 1);
    // What Lambda does at the deadline: the invocation is gone.
    let handled = tokio::time::timeout_at(deadline, handle_batch_until(&ctx, event, Some(deadline)));
    let (response, ()) = tokio::join!(handled, release);
    let response = response.expect("the batch answers before Lambda's deadline");
    assert_eq!(failures(&response), vec!["msg-0".to_owned()], "the record is redelivered");
    assert_eq!(runner.runs.load(Ordering::SeqCst), 1);
    let task = row(&pool, id).await;
    assert_eq!((task.status.as_str(), task.attempts, task.lease_until), ("queued", 1, None));
    let events = events_of(&pool, id).await;
    assert_gap_free(&events);
    assert_eq!(statuses(&events), ["queued", "running", "queued"]);
    let log = events.iter().rev().find(|e| e.kind == EventType::Log).unwrap();
    assert!(
        log.data["line"]
            .as_str()
            .unwrap()
            .starts_with("attempt 1 did not finish (the worker ran out of time); attempt 2 is due in 0 s"),
        "{}",
        log.data
    );
    api.done().await;
}
