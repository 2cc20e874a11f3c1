//! How soon a task runs again, against the real stack (Postgres, Redis,
//! moto SQS, SeaweedFS): a retryable failure waits its backoff on the
//! queue (the message's visibility), not the queue's visibility timeout;
//! a record with too little time left is given back unclaimed; a worker
//! that dies or loses Postgres leaves its task to the next run once its
//! short lease lapses.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::SqsEvent;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use common::QueuedApi as Api;
use reeve_shared::catalog::Catalog;
use reeve_shared::ids::Id;
use reeve_shared::outbound::OutboundPolicy;
use reeve_shared::tasks::{Event, EventType, events_after};
use reeve_shared::worker::{Backoff, Poller, Visibility, WorkerContext, handle_batch};
use serde_json::{Value, json};
use sqlx::PgPool;

/// The shipped catalog plus `flaky`, an `http` task on `endpoint`.
fn catalog(endpoint: &str) -> Catalog {
    common::catalog_with(&format!(
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

/// A worker that may call loopback endpoints and sets visibility on `queue`.
async fn worker(pool: &PgPool, catalog: Catalog, queue: &str) -> WorkerContext {
    let aws = common::aws().await;
    let policy = OutboundPolicy { allow_http: true, allow: vec!["127.0.0.1".into()], ..OutboundPolicy::default() };
    let settings = common::worker_settings(&common::redis_url());
    let ctx = common::worker_context_with_policy(catalog, pool, aws.s3, settings, policy);
    WorkerContext { visibility: Some(Visibility::new(aws.sqs, queue)), ..ctx }
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
    let api = Api::new(&pool, catalog(&endpoint.url)).await;
    let id = api.create("flaky", json!({})).await;
    let ctx = worker(&pool, catalog(&endpoint.url), &api.queue.url).await;

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
    let api = Api::new(&pool, catalog(&endpoint.url)).await;
    let created = Instant::now();
    let id = api.create("flaky", json!({})).await;
    let mut ctx = worker(&pool, catalog(&endpoint.url), &api.queue.url).await;
    ctx.settings.backoff = Backoff { first: Duration::from_secs(5), max: Duration::from_secs(10) };
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
    let api = Api::new(&pool, catalog(&endpoint.url)).await;
    let id = api.create("flaky", json!({})).await;
    let ctx = worker(&pool, catalog(&endpoint.url), &api.queue.url).await;
    let message = receive(&api.queue.url, Duration::from_secs(1)).await.expect("task create sent it");

    // `flaky` may run 5 s and the worker stops 10 s before the deadline:
    // 12 s left is not enough.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    let response = reeve_shared::worker::handle_batch_until(&ctx, event_of(&message), Some(deadline)).await;
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
    let response = reeve_shared::worker::handle_batch_until(&ctx, event_of(&again), Some(fresh)).await;
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
