//! Metrics as an operator reads them, after a real task ran on the real
//! stack (Postgres, Redis, SeaweedFS S3, moto SQS):
//! - Prometheus: `GET /metrics` on the same router `reeve serve` runs shows
//!   the request, task, queue, SQS and relay metrics;
//! - Lambda: the EMF lines a request and a worker batch write to stdout.
//!
//! The recorder is global to a process, so the EMF case runs in a child
//! process of this test binary, as a Lambda would (`AWS_LAMBDA_FUNCTION_NAME`
//! set), and the parent reads the child's stdout.

#[allow(dead_code)] // the suite uses all of the harness, this binary a part
mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::SqsEvent;
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::chain::{ChainLock, Payer, TOKEN};
use common::{TestQueue, new_session, post_json, send};
use reeve_shared::http::app;
use reeve_shared::http::stream;
use reeve_shared::settings;
use reeve_shared::worker::{Poller, WorkerContext, handle_batch};
use serde_json::{Value, json};
use sqlx::PgPool;
use tower::ServiceExt;

/// The worker on the development catalog, two runs at once, as start-up
/// builds it.
async fn worker(pool: &PgPool) -> WorkerContext {
    common::worker(&common::worker_config(pool).with(settings::WORKER_CONCURRENCY, "2")).await
}

/// The API (with the relay's routes, as `reeve serve` merges them) on a
/// queue of the test's own, and a session on a fresh space.
async fn api(pool: &PgPool) -> (Router, String, TestQueue) {
    let queue = TestQueue::new().await;
    let config = common::config(pool).with(settings::QUEUE_URL, &queue.url);
    let ctx = common::api(&config).await;
    let app = stream::routes(common::relay(&config)).merge(app(ctx));
    let (_, token) = new_session(&app).await;
    (app, token, queue)
}

/// Uploads some bytes and queues a digest of them: the task id.
async fn queue_digest(app: &Router, token: &str) -> String {
    let bytes = b"metrics, please\n".repeat(100);
    let upload = send(
        app,
        post_json(
            "/v1/uploads",
            Some(token),
            &json!({"filename": "m.txt", "content_type": "text/plain", "size": bytes.len()}),
        ),
    )
    .await;
    assert_eq!(upload.status, StatusCode::CREATED, "{}", upload.body);
    let mut put = reqwest::Client::new().put(upload.body["url"].as_str().unwrap()).body(bytes);
    for (name, value) in upload.body["headers"].as_object().unwrap() {
        if name != "content-length" {
            put = put.header(name, value.as_str().unwrap());
        }
    }
    assert_eq!(put.send().await.unwrap().status(), reqwest::StatusCode::OK);
    let created = send(
        app,
        post_json("/v1/tasks/digest", Some(token), &json!({"input": {"upload_id": upload.body["upload_id"]}})),
    )
    .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
    created.body["id"].as_str().unwrap().to_owned()
}

async fn status_of(pool: &PgPool, id: &str) -> String {
    let id: reeve_shared::ids::Id = id.parse().unwrap();
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

/// Reads a whole response body as text.
async fn text(app: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

/// The value of the sample whose line starts with `series` (name and labels
/// exactly as rendered), if any.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn prometheus_shows_the_request_task_queue_and_relay_metrics_after_a_task_runs(pool: PgPool) {
    let handle = reeve_shared::metrics::install_prometheus().unwrap();
    let (app, token, queue) = api(&pool).await;
    let app = reeve_shared::metrics::mount(app, None).await.unwrap();

    let id = queue_digest(&app, &token).await;
    let sqs = common::aws().await.sqs;
    let mut poller = Poller::connect(Arc::new(worker(&pool).await), sqs, &queue.url).await.unwrap();
    poller.wait_time_seconds = 1;
    assert_eq!(poller.poll_once().await.unwrap().done, 1);
    assert_eq!(status_of(&pool, &id).await, "completed");

    // A watcher replays the finished task and leaves.
    let watch = Request::get(format!("/v1/tasks/{id}/events")).header("authorization", format!("Bearer {token}"));
    let (status, stream) = text(&app, watch.body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(stream.contains("\"completed\""), "{stream}");

    let (status, page) = text(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    drop(handle);
    for (series, at_least) in [
        (r#"reeve_http_requests_total{method="POST",route="/v1/spaces",status="201"}"#, 1.0),
        (r#"reeve_http_requests_total{method="POST",route="/v1/tasks/{task}",status="202"}"#, 1.0),
        (r#"reeve_http_requests_total{method="GET",route="/v1/tasks/{task}/events",status="200"}"#, 1.0),
        (r#"reeve_tasks_created_total{kind="digest"}"#, 1.0),
        (r#"reeve_tasks_completed_total{kind="digest"}"#, 1.0),
        (r#"reeve_tasks_finished_total{status="completed"}"#, 1.0),
        (r#"reeve_task_run_seconds_count{kind="digest"}"#, 1.0),
        (r#"reeve_task_queue_wait_seconds_count{kind="digest"}"#, 1.0),
        ("reeve_sqs_messages_received_total", 1.0),
        ("reeve_sqs_messages_deleted_total", 1.0),
        ("reeve_argon2_verifies_in_flight", 0.0),
        ("reeve_relay_subscribed_tasks", 0.0),
        ("reeve_relay_watchers", 0.0),
    ] {
        let value = sample(&page, series).unwrap_or_else(|| panic!("no {series} in:\n{page}"));
        assert!(value >= at_least, "{series} = {value}");
    }
    // Gauges are back to rest once the watcher left and the verifies ended.
    assert_eq!(sample(&page, "reeve_relay_watchers"), Some(0.0));
    assert_eq!(sample(&page, "reeve_argon2_verifies_in_flight"), Some(0.0));
    // Route templates, never raw paths: a task id is not a series.
    assert!(!page.contains(&id), "{page}");
    queue.delete().await;
}

// ------------------------------------------------------------ payments
//
// The local payment stack (anvil with the EIP-3009 test token, the x402
// facilitator), through the harness's `common::chain`.

/// One priced kind, payable on the local chain, to a `payTo` of its own.
fn paid_catalog() -> String {
    let pay_to = format!("0x{}", &hex::encode(reeve_shared::ids::Id::new().to_bytes()).repeat(2)[..40]);
    let facilitator = std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into());
    format!(
        r#"
        [payments]
        pay_to = "{pay_to}"
        facilitator_url = "{facilitator}"
        max_timeout_seconds = 300

        [assets.local]
        network = "eip155:84532"
        contract = "{TOKEN}"
        decimals = 6
        usd_peg = true
        name = "USDC"
        version = "2"

        [tasks.fetch]
        title = "Fetch"
        description = "Fetch a URL"
        executor = "fetch"
        [tasks.fetch.input_schema]
        type = "object"
        required = ["url"]
        [tasks.fetch.input_schema.properties.url]
        type = "string"
        [[tasks.fetch.accepts]]
        asset = "local"
        amount_usd = "0.01"
        "#
    )
}

/// The value of the series `name` whose labels include every one of
/// `labels` (whatever their order in the page), if there is one.
fn series(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.rsplit_once("} ")?;
        let found = labels.iter().all(|(k, v)| set.split(',').any(|pair| pair == format!("{k}=\"{v}\"")));
        if found { value.trim().parse().ok() } else { None }
    })
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn prometheus_counts_sweeps_payments_refusals_and_credits(pool: PgPool) {
    let chain = ChainLock::shared().await;
    reeve_shared::metrics::install_prometheus().unwrap();
    let queue = TestQueue::new().await;
    let config = common::with_catalog(common::config(&pool), &paid_catalog()).with(settings::QUEUE_URL, &queue.url);
    let ctx = common::api(&config).await;
    let app = reeve_shared::metrics::mount(app(ctx), None).await.unwrap();
    let (_, token) = new_session(&app).await;
    let input = json!({"input": {"url": "http://127.0.0.1:1/"}});
    let create = |signature: Option<String>| {
        let mut request = post_json("/v1/tasks/fetch", Some(&token), &input);
        if let Some(signature) = signature {
            request.headers_mut().insert("payment-signature", signature.parse().unwrap());
        }
        send(&app, request)
    };

    let asked = create(None).await;
    assert_eq!(asked.status, StatusCode::PAYMENT_REQUIRED, "{}", asked.body);
    let challenge = asked.headers["payment-required"].to_str().unwrap().to_owned();

    // Settled on chain.
    let paid = create(Some(Payer::new(&chain, 1_000_000).await.sign(&challenge).await)).await;
    assert_eq!(paid.status, StatusCode::ACCEPTED, "{}", paid.body);
    let paid: reeve_shared::ids::Id = paid.body["id"].as_str().unwrap().parse().unwrap();

    // Refused: the payer holds no tokens, and the facilitator says why.
    let refused = create(Some(Payer::new(&chain, 0).await.sign(&challenge).await)).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED, "{}", refused.body);
    let why = refused.body["error"]["message"].as_str().unwrap().to_owned();
    // Refused before the facilitator is asked: not a payment at all.
    let garbled = create(Some("bm90IGEgcGF5bWVudA==".into())).await;
    assert_eq!((garbled.status, garbled.code()), (StatusCode::BAD_REQUEST, "invalid_payment"), "{}", garbled.body);

    // The paid task is stranded with every attempt used: the sweep fails
    // it, and its space is left a credit.
    sqlx::query("UPDATE tasks SET attempts = 5, updated_at = now() - interval '1 hour' WHERE id = $1")
        .bind(paid)
        .execute(&pool)
        .await
        .unwrap();
    let config = common::config(&pool).with(settings::QUEUE_URL, &queue.url).with(settings::SWEEP_OLDER_THAN, "60");
    let sweeper = reeve_shared::startup::sweeper(&config, &reeve_shared::startup::sdk().await)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sweeper.sweep(Duration::from_secs(60)).await.unwrap().exhausted, 1);

    // The credit pays the next task; a later sweep sends its (lost) message again.
    let on_credit = create(None).await;
    assert_eq!(on_credit.status, StatusCode::ACCEPTED, "{}", on_credit.body);
    sqlx::query("UPDATE tasks SET updated_at = now() - interval '1 hour' WHERE id <> $1")
        .bind(paid)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(sweeper.sweep(Duration::from_secs(60)).await.unwrap().resent_queued, 1);

    let (status, page) = text(&app, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let local = [("network", "eip155:84532"), ("asset", TOKEN)];
    for (name, labels) in [
        ("reeve_payments_settled_total", &local[..]),
        ("reeve_credits_issued_total", &[("asset", TOKEN), ("reason", "retries_exhausted")][..]),
        ("reeve_credits_spent_total", &[("asset", TOKEN)][..]),
        ("reeve_sweeper_actions_total", &[("action", "failed_exhausted")][..]),
        ("reeve_sweeper_actions_total", &[("action", "resent_queued")][..]),
        ("reeve_payments_failed_total", &[("reason", "invalid_payment")][..]),
    ] {
        let value = series(&page, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{page}"));
        assert!(value >= 1.0, "{name} {labels:?} = {value}");
    }
    // The refusal is counted by the facilitator's reason, the one the
    // client was shown.
    let reasons: Vec<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("reeve_payments_failed_total{reason=\"")?.split('"').next())
        .collect();
    assert!(reasons.iter().any(|r| why.contains(r)), "no refusal counted by a reason in {why:?}: {reasons:?}\n{page}");
    queue.delete().await;
}

const CHILD: &str = "REEVE_METRICS_EMF_CHILD";

/// The Lambda half, run only as a child of the test below.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
#[ignore = "run by emf_lines_reach_stdout_for_a_request_and_for_a_worker_batch"]
async fn emf_child(pool: PgPool) {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    reeve_shared::telemetry::init();
    // What every Lambda's start-up does: install the EMF exporter.
    reeve_shared::startup::lambda_config();
    let (app, token, queue) = api(&pool).await;
    let id = queue_digest(&app, &token).await;
    println!("--- batch ---");
    let body = json!({"task_id": id, "kind": "digest"}).to_string();
    let event: SqsEvent = serde_json::from_value(json!({"Records": [{
        "messageId": "m-1", "body": body, "attributes": {"ApproximateReceiveCount": "1"}, "eventSource": "aws:sqs"
    }]}))
    .unwrap();
    let response = handle_batch(&worker(&pool).await, event).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(status_of(&pool, &id).await, "completed");
    queue.delete().await;
}

#[test]
fn emf_lines_reach_stdout_for_a_request_and_for_a_worker_batch() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "emf_child", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("AWS_LAMBDA_FUNCTION_NAME", "reeve-test")
        .env(reeve_shared::settings::METRICS_NAMESPACE, "Reeve/test")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let (requests, batch) = stdout.split_once("--- batch ---").expect("the child reached the batch");
    let emf = |part: &str| -> Vec<Value> {
        part.lines().filter(|l| l.starts_with("{\"_aws\"")).map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let (requests, batch) = (emf(requests), emf(batch));

    // One document per request and label set, in the stage's namespace, with
    // the route template and status as dimensions.
    let created = requests
        .iter()
        .find(|d| d["route"] == "/v1/tasks/{task}" && d["method"] == "POST" && d["status"] == "202")
        .unwrap_or_else(|| panic!("no EMF line for the create request in {requests:#?}"));
    assert_eq!(created["reeve_http_requests_total"], 1, "{created}");
    let directive = &created["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(directive["Namespace"], "Reeve/test", "the namespace the template gives the stage");
    let dims: Vec<&str> = directive["Dimensions"][0].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert_eq!(dims, ["method", "route", "status"]);
    assert!(requests.iter().any(|d| d["reeve_tasks_created_total"] == 1 && d["kind"] == "digest"), "{requests:#?}");

    // The batch flushed what the worker recorded, once, at its end.
    assert!(batch.iter().any(|d| d["reeve_tasks_completed_total"] == 1 && d["kind"] == "digest"), "{batch:#?}");
    assert!(batch.iter().any(|d| d["reeve_tasks_finished_total"] == 1 && d["status"] == "completed"), "{batch:#?}");
    assert!(batch.iter().any(|d| d.get("reeve_task_run_seconds").is_some()), "{batch:#?}");
    assert!(batch.iter().any(|d| d.get("reeve_task_queue_wait_seconds").is_some()), "{batch:#?}");
}
