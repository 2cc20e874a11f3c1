//! Completion webhooks end to end: the API in-process, tasks ended through
//! the one transition, the sender as start-up builds it (with a short
//! schedule, through its settings), and a receiver on loopback that checks
//! every delivery with the `standardwebhooks` crate, the Standard Webhooks
//! project's Rust library, not Reeve's code; across a rotation the
//! project's Python package checks them too (tests/webhooks/verify.py).

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use common::{QueuedApi, get_authed, post_json, send, wait_until};
use reeve_shared::ids::Id;
use reeve_shared::settings;
use reeve_shared::startup;
use reeve_shared::tasks::{self, Change, EventType, Fence, TaskStatus};
use reeve_shared::webhooks::WebhookSettings;
use reeve_shared::webhooks::sender::Sender;
use serde_json::{Value, json};
use sqlx::PgPool;

const CATALOG: &str = r#"
    [tasks.echo]
    title = "Echo"
    description = "A free task whose run the test plays itself."
    executor = "digest"
    input_schema = { type = "object" }
"#;

/// A short schedule: three retries, 100 ms apart, no jitter; 300 ms per attempt.
fn short() -> WebhookSettings {
    WebhookSettings {
        schedule: vec![Duration::from_millis(100); 3],
        jitter: 0.0,
        timeout: Duration::from_millis(300),
        ..WebhookSettings::default()
    }
}

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Received {
    /// Whether `secret` verifies it, as a receiver's Standard Webhooks library would.
    fn verifies_with(&self, secret: &str) -> bool {
        let webhook = standardwebhooks::Webhook::new(secret).expect("a whsec_ secret");
        webhook.verify(&self.body, &self.headers).is_ok()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON payload")
    }

    fn header(&self, name: &str) -> &str {
        self.headers[name].to_str().unwrap()
    }
}

/// Which of `secrets` verify each delivery, as the official Python package
/// `standardwebhooks` says (tests/webhooks/verify.py): one row per
/// delivery, one column per secret.
fn python_verifies(deliveries: &[&Received], secrets: &[&str]) -> Vec<Vec<bool>> {
    use std::io::Write;
    let deliveries: Vec<Value> = deliveries
        .iter()
        .map(|d| {
            let headers: serde_json::Map<String, Value> =
                d.headers.iter().map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap()))).collect();
            json!({ "headers": headers, "body": String::from_utf8(d.body.to_vec()).unwrap() })
        })
        .collect();
    let given = json!({ "secrets": secrets, "deliveries": deliveries }).to_string();
    let python = common::chain::python();
    let mut child = std::process::Command::new(&python)
        .arg(common::chain::root().join("tests/webhooks/verify.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    child.stdin.take().unwrap().write_all(given.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "verify.py failed: {}", String::from_utf8_lossy(&out.stdout));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An endpoint on loopback: `/ok` answers 200, `/flaky` 500 then 200,
/// `/slow` after a second, `/redirect` 302 to `/ok`, `/gone` 410,
/// `/busy` 503 with `Retry-After: 1`. It keeps every request.
struct Receiver {
    base: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let got: Arc<Mutex<Vec<Received>>> = Arc::default();
        let calls: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let kept = got.clone();
        let router = Router::new().fallback(move |request: Request<axum::body::Body>| {
            let kept = kept.clone();
            let calls = calls.clone();
            async move {
                let path = request.uri().path().to_owned();
                let headers = request.headers().clone();
                let body = axum::body::to_bytes(request.into_body(), 1 << 20).await.unwrap();
                kept.lock().unwrap().push(Received { path: path.clone(), headers, body });
                let n = {
                    let mut calls = calls.lock().unwrap();
                    let n = calls.entry(path.clone()).or_default();
                    *n += 1;
                    *n
                };
                let answer: Response = match path.as_str() {
                    "/flaky" if n == 1 => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    "/slow" => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        StatusCode::OK.into_response()
                    }
                    "/redirect" => (StatusCode::FOUND, [("location", "/ok")]).into_response(),
                    "/gone" => StatusCode::GONE.into_response(),
                    "/busy" => (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")]).into_response(),
                    _ => StatusCode::OK.into_response(),
                };
                answer
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Receiver { base, got }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn at(&self, path: &str) -> Vec<Received> {
        self.got.lock().unwrap().iter().filter(|r| r.path == path).cloned().collect()
    }
}

/// The API, a session, the sender (as `reeve work` builds it, with `settings`)
/// and the receiver.
struct Hooks {
    api: QueuedApi,
    sender: Sender,
    receiver: Receiver,
    pool: PgPool,
}

impl Hooks {
    async fn new(pool: &PgPool, settings: WebhookSettings) -> Hooks {
        let api = QueuedApi::new(pool, CATALOG).await;
        let config = common::loopback_outbound(common::worker_config(pool));
        let worker = common::worker(&config).await;
        let mut sender = startup::webhooks_beside(&worker, &config).unwrap_or_else(|e| panic!("{e}"));
        sender.settings = settings;
        Hooks { api, sender, receiver: Receiver::start().await, pool: pool.clone() }
    }

    /// `POST /v1/space/webhook-secret`: the secret, shown once.
    async fn rotate(&self) -> String {
        let reply = send(&self.api.app, post_json("/v1/space/webhook-secret", Some(&self.api.token), &json!({}))).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        reply.body["secret"].as_str().unwrap().to_owned()
    }

    /// Creates a task with `webhook` (a URL or `{url, events}`): the reply.
    async fn create(&self, webhook: Value) -> common::Reply {
        let body = json!({ "input": {}, "webhook": webhook });
        send(&self.api.app, post_json("/v1/tasks/echo", Some(&self.api.token), &body)).await
    }

    async fn created(&self, webhook: Value) -> Id {
        let reply = self.create(webhook).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        reply.body["id"].as_str().unwrap().parse().unwrap()
    }

    /// Ends a queued task as a worker would: through the one transition.
    async fn complete(&self, id: Id) {
        let done = Change::Complete { result: &json!({"digest": "abc"}), payment: None, held: &[] };
        let events = tasks::transition(&self.pool, id, Fence::From(&[TaskStatus::Queued]), done).await.unwrap();
        assert!(events.is_some(), "the task was queued");
    }

    async fn fail(&self, id: Id) {
        let error = tasks::task_error("fetch_unreachable", "nobody home");
        let events =
            tasks::transition(&self.pool, id, Fence::From(&[TaskStatus::Queued]), Change::Fail { error: &error })
                .await
                .unwrap();
        assert!(events.is_some(), "the task was queued");
    }

    /// One round of the sender.
    async fn deliver(&self) -> usize {
        self.sender.deliver_due(tokio::time::Instant::now() + Duration::from_secs(10)).await
    }

    /// `GET /v1/tasks/{id}/webhooks`: its one delivery.
    async fn delivery(&self, id: Id) -> Value {
        let reply = send(&self.api.app, get_authed(&format!("/v1/tasks/{id}/webhooks"), &self.api.token)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let deliveries = reply.body["deliveries"].as_array().unwrap();
        assert_eq!(deliveries.len(), 1, "{}", reply.body);
        deliveries[0].clone()
    }

    async fn deliveries(&self, id: Id) -> usize {
        let reply = send(&self.api.app, get_authed(&format!("/v1/tasks/{id}/webhooks"), &self.api.token)).await;
        reply.body["deliveries"].as_array().unwrap().len()
    }

    /// Runs the sender until task `id`'s delivery is no longer pending: the delivery.
    async fn settle(&self, id: Id) -> Value {
        wait_until("the delivery to settle", Duration::from_secs(20), || async {
            self.deliver().await;
            self.delivery(id).await["status"] != "pending"
        })
        .await;
        self.delivery(id).await
    }

    async fn done(self) {
        self.api.queue.delete().await;
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_completed_task_is_posted_once_signed_and_a_standard_library_verifies_it(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    let secret = hooks.rotate().await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    let id = hooks.created(json!(hooks.receiver.url("/ok"))).await;
    assert_eq!(hooks.deliveries(id).await, 0, "nothing before the task ends");

    hooks.complete(id).await;
    // The row was written with the end: it is there before any sender ran.
    let pending = hooks.delivery(id).await;
    assert_eq!((pending["status"].as_str(), pending["event"].as_str()), (Some("pending"), Some("completed")));
    let delivered = hooks.settle(id).await;
    assert_eq!(delivered["status"], "delivered", "{delivered}");
    assert_eq!(delivered["attempts"].as_array().unwrap().len(), 1, "{delivered}");
    assert_eq!(delivered["attempts"][0]["status_code"], 200);

    let got = hooks.receiver.at("/ok");
    assert_eq!(got.len(), 1, "delivered once");
    let message = &got[0];
    assert!(message.verifies_with(&secret), "the standardwebhooks crate verifies it");
    assert!(!message.verifies_with("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "and not with another secret");
    assert_eq!(message.header("webhook-id"), delivered["id"].as_str().unwrap());
    assert_eq!(message.header("content-type"), "application/json");
    let payload = message.json();
    assert_eq!(payload["type"], "task.completed");
    assert!(payload["timestamp"].is_string());
    assert_eq!(payload["data"]["id"], id.to_string());
    assert_eq!(payload["data"]["status"], "completed");
    assert!(payload["data"].get("result").is_none(), "links, not bodies: {payload}");
    assert_eq!(payload["data"]["links"]["task"], format!("/v1/tasks/{id}"));

    // Nothing more to send.
    assert_eq!(hooks.deliver().await, 0);
    assert_eq!(hooks.receiver.at("/ok").len(), 1);
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_rotation_signs_with_both_secrets_through_its_grace_then_with_the_new_one(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    let old = hooks.rotate().await;
    let first = hooks.created(json!(hooks.receiver.url("/ok"))).await;
    hooks.complete(first).await;
    // Rotated while the delivery is pending.
    let reply = send(&hooks.api.app, post_json("/v1/space/webhook-secret", Some(&hooks.api.token), &json!({}))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let new = reply.body["secret"].as_str().unwrap().to_owned();
    let ends = time::OffsetDateTime::parse(
        reply.body["previous_expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let grace = ends - time::OffsetDateTime::now_utc();
    assert!(grace > time::Duration::hours(23) && grace <= time::Duration::hours(24), "{grace}");
    assert_ne!(old, new);

    assert_eq!(hooks.settle(first).await["status"], "delivered");
    let during = hooks.receiver.at("/ok").pop().unwrap();
    assert_eq!(during.header("webhook-signature").split(' ').count(), 2, "both signatures, space-separated");
    assert!(during.verifies_with(&old), "a receiver still on the old secret accepts it");
    assert!(during.verifies_with(&new), "and one on the new secret");

    // The grace period is over.
    sqlx::query("UPDATE webhook_secrets SET expires_at = now() - interval '1 second' WHERE expires_at IS NOT NULL")
        .execute(&pool)
        .await
        .unwrap();
    let second = hooks.created(json!(hooks.receiver.url("/ok"))).await;
    hooks.complete(second).await;
    assert_eq!(hooks.settle(second).await["status"], "delivered");
    let after = hooks.receiver.at("/ok").pop().unwrap();
    assert_eq!(after.header("webhook-signature").split(' ').count(), 1);
    assert!(after.verifies_with(&new));
    assert!(!after.verifies_with(&old), "the old secret signs no more");

    // The official Python package agrees on both, and refuses a stranger.
    let stranger = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let seen = python_verifies(&[&during, &after], &[&old, &new, stranger]);
    assert_eq!(seen, [[true, true, false], [false, true, false]], "during the grace, then after it");
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_500_then_a_200_is_retried_and_delivered_once(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    let secret = hooks.rotate().await;
    let id = hooks.created(json!(hooks.receiver.url("/flaky"))).await;
    hooks.complete(id).await;
    let delivery = hooks.settle(id).await;
    assert_eq!(delivery["status"], "delivered", "{delivery}");
    let attempts = delivery["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{delivery}");
    assert_eq!((attempts[0]["n"].as_i64(), attempts[0]["status_code"].as_i64()), (Some(1), Some(500)));
    assert_eq!(attempts[0]["error"], "answered 500");
    assert!(attempts[0]["next_attempt_at"].is_string(), "a retry says when");
    assert_eq!((attempts[1]["n"].as_i64(), attempts[1]["status_code"].as_i64()), (Some(2), Some(200)));

    let got = hooks.receiver.at("/flaky");
    assert_eq!(got.len(), 2);
    // One message, sent twice: the same id, each signed afresh.
    assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"));
    assert!(got.iter().all(|r| r.verifies_with(&secret)));
    assert_eq!(hooks.deliver().await, 0, "delivered: never sent again");
    assert_eq!(hooks.receiver.at("/flaky").len(), 2);
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_slow_endpoint_times_out_and_is_retried_until_the_schedule_is_used_up(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    hooks.rotate().await;
    let id = hooks.created(json!(hooks.receiver.url("/slow"))).await;
    hooks.complete(id).await;
    let delivery = hooks.settle(id).await;
    assert_eq!(delivery["status"], "failed", "{delivery}");
    let attempts = delivery["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4, "the first and three retries: {delivery}");
    for attempt in attempts {
        assert!(attempt["status_code"].is_null(), "{attempt}");
        assert!(attempt["error"].as_str().unwrap().starts_with("no answer within"), "{attempt}");
        assert!(attempt["duration_ms"].as_i64().unwrap() < 1000, "cut at the timeout: {attempt}");
    }
    assert!(attempts[3]["next_attempt_at"].is_null(), "no retry after the last");
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_redirect_is_recorded_not_followed(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    hooks.rotate().await;
    let id = hooks.created(json!(hooks.receiver.url("/redirect"))).await;
    hooks.complete(id).await;
    hooks.deliver().await;
    let delivery = hooks.delivery(id).await;
    let first = &delivery["attempts"][0];
    assert_eq!(first["status_code"], 302, "{delivery}");
    assert_eq!(first["error"], "redirect to /ok not followed");
    assert_eq!(delivery["status"], "pending", "retried like any answer that is not 2xx");
    let delivery = hooks.settle(id).await;
    assert_eq!(delivery["status"], "failed");
    assert_eq!(hooks.receiver.at("/redirect").len(), 4);
    assert!(hooks.receiver.at("/ok").is_empty(), "its target was never called");
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_private_address_is_refused_and_never_retried(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    hooks.rotate().await;
    // The test's allow-list lets 127.0.0.1 through; nothing else private.
    for url in ["http://10.0.0.7/hook", "http://169.254.169.254/latest/meta-data", "http://[::1]:9/hook"] {
        let id = hooks.created(json!(url)).await;
        hooks.complete(id).await;
        let delivery = hooks.settle(id).await;
        assert_eq!(delivery["status"], "failed", "{url}: {delivery}");
        let attempts = delivery["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{url}: {delivery}");
        assert!(attempts[0]["error"].as_str().unwrap().starts_with("refused"), "{url}: {delivery}");
        assert!(attempts[0]["status_code"].is_null());
    }
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_410_disables_the_endpoint_for_the_space_until_it_is_set_again(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    hooks.rotate().await;
    let gone = hooks.receiver.url("/gone");
    let first = hooks.created(json!(gone)).await;
    hooks.complete(first).await;
    let delivery = hooks.settle(first).await;
    assert_eq!(delivery["status"], "disabled", "{delivery}");
    assert_eq!(delivery["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(delivery["attempts"][0]["status_code"], 410);

    // The next task's end to it is not sent at all.
    let second = hooks.created(json!(gone)).await;
    hooks.complete(second).await;
    let delivery = hooks.settle(second).await;
    assert_eq!(delivery["status"], "disabled");
    assert!(delivery["attempts"].as_array().unwrap().is_empty(), "{delivery}");
    assert_eq!(hooks.receiver.at("/gone").len(), 1);
    let space = send(&hooks.api.app, get_authed("/v1/space/webhook", &hooks.api.token)).await;
    assert_eq!(space.body["disabled"], json!([gone]), "{}", space.body);

    // Set as the Space's default, it is enabled again.
    let put = axum::http::Request::put("/v1/space/webhook")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {}", hooks.api.token))
        .body(axum::body::Body::from(json!({ "url": gone }).to_string()))
        .unwrap();
    let reply = send(&hooks.api.app, put).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["disabled"], json!([]));
    assert_eq!(reply.body["default"]["url"], gone);
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn retry_after_is_honoured(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    hooks.rotate().await;
    let id = hooks.created(json!(hooks.receiver.url("/busy"))).await;
    hooks.complete(id).await;
    hooks.deliver().await;
    let delivery = hooks.delivery(id).await;
    let first = &delivery["attempts"][0];
    assert_eq!(first["status_code"], 503);
    let at = |v: &Value| {
        time::OffsetDateTime::parse(v.as_str().unwrap(), &time::format_description::well_known::Rfc3339).unwrap()
    };
    let wait = at(&first["next_attempt_at"]) - at(&first["at"]);
    assert!(wait >= time::Duration::milliseconds(900), "Retry-After: 1 beats the 100 ms schedule: {wait}");
    // Not due yet.
    assert_eq!(hooks.deliver().await, 0);
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn events_choose_which_ends_are_sent_and_a_space_default_covers_tasks_naming_none(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    let secret = hooks.rotate().await;
    let only_failed = json!({ "url": hooks.receiver.url("/ok"), "events": ["failed"] });
    let completed = hooks.created(only_failed.clone()).await;
    hooks.complete(completed).await;
    assert_eq!(hooks.deliveries(completed).await, 0, "not an event it asked for");
    let failed = hooks.created(only_failed).await;
    hooks.fail(failed).await;
    assert_eq!(hooks.settle(failed).await["event"], "failed");

    // A default for the tasks that name none; canceled through the API.
    let put = axum::http::Request::put("/v1/space/webhook")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {}", hooks.api.token))
        .body(axum::body::Body::from(json!({ "url": hooks.receiver.url("/default") }).to_string()))
        .unwrap();
    assert_eq!(send(&hooks.api.app, put).await.status, StatusCode::OK);
    let plain = send(&hooks.api.app, post_json("/v1/tasks/echo", Some(&hooks.api.token), &json!({"input": {}}))).await;
    let plain: Id = plain.body["id"].as_str().unwrap().parse().unwrap();
    let canceled =
        send(&hooks.api.app, post_json(&format!("/v1/tasks/{plain}/cancel"), Some(&hooks.api.token), &json!({}))).await;
    assert!(canceled.status.is_success(), "{}", canceled.body);
    assert_eq!(hooks.settle(plain).await["status"], "delivered");
    let got = hooks.receiver.at("/default");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].json()["type"], "task.canceled");
    assert!(got[0].verifies_with(&secret));
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_webhook_needs_a_secret_and_a_usable_url_and_its_attempts_are_the_owners_only(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    let reply = hooks.create(json!("https://example.com/hook")).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::UNPROCESSABLE_ENTITY, "webhook_secret_required"));
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(count, 0, "nothing stored");
    hooks.rotate().await;
    for bad in [
        json!("example.com/hook"),
        json!("ftp://example.com/"),
        json!({"url": "https://example.com/", "events": []}),
        json!({"url": "https://example.com/", "events": ["started"]}),
    ] {
        let reply = hooks.create(bad.clone()).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_webhook"), "{bad}");
    }

    let id = hooks.created(json!(hooks.receiver.url("/ok"))).await;
    // Another Space sees no such task.
    let (_, other) = common::new_session(&hooks.api.app).await;
    let reply = send(&hooks.api.app, get_authed(&format!("/v1/tasks/{id}/webhooks"), &other)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::NOT_FOUND, "task_not_found"));
    let reply = send(&hooks.api.app, get_authed("/v1/tasks/nonsense/webhooks", &hooks.api.token)).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    hooks.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn in_aws_the_sweepers_schedule_sends_them(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    let secret = hooks.rotate().await;
    let id = hooks.created(json!(hooks.receiver.url("/ok"))).await;
    hooks.complete(id).await;
    let config = common::loopback_outbound(common::config(&pool))
        .with(settings::QUEUE_URL, &hooks.api.queue.url)
        .with(settings::SWEEP_OLDER_THAN, "300");
    let sweeper = startup::sweeper(&config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"));
    sweeper.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!(hooks.delivery(id).await["status"], "delivered");
    let got = hooks.receiver.at("/ok");
    assert_eq!(got.len(), 1);
    assert!(got[0].verifies_with(&secret));
    hooks.done().await;
}

impl Hooks {
    /// Every delivery of task `id`, oldest first.
    async fn all_deliveries(&self, id: Id) -> Vec<Value> {
        let reply = send(&self.api.app, get_authed(&format!("/v1/tasks/{id}/webhooks"), &self.api.token)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.body["deliveries"].as_array().unwrap().clone()
    }

    /// Claims queued task `id` as a worker's first attempt would.
    async fn start(&self, id: Id) {
        let claimed =
            sqlx::query("UPDATE tasks SET status = 'running', attempts = 1 WHERE id = $1 AND status = 'queued'")
                .bind(id)
                .execute(&self.pool)
                .await
                .unwrap();
        assert_eq!(claimed.rows_affected(), 1);
    }

    /// A progress report of attempt 1, through the one statement that records it.
    async fn progress(&self, id: Id, fraction: f32) {
        let data = json!({ "progress": fraction, "message": "reading" });
        let event = tasks::running_event(&self.pool, id, 1, Some(fraction), EventType::Progress, &data).await.unwrap();
        assert!(event.is_some(), "the task is running");
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn progress_is_delivered_when_asked_coalesced_and_superseded_by_the_end(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    let secret = hooks.rotate().await;
    let url = hooks.receiver.url("/ok");
    // The ends only, unless asked: a task naming just its URL gets no progress.
    let plain = hooks.created(json!(url)).await;
    hooks.start(plain).await;
    hooks.progress(plain, 0.5).await;
    assert!(hooks.all_deliveries(plain).await.is_empty(), "progress was not asked for");

    let id = hooks.created(json!({ "url": url, "events": ["progress", "completed"] })).await;
    hooks.start(id).await;
    // Three reports before the sender runs: one delivery, of the latest.
    for fraction in [0.1, 0.2, 0.3] {
        hooks.progress(id, fraction).await;
    }
    let pending = hooks.all_deliveries(id).await;
    assert_eq!(pending.len(), 1, "coalesced while pending: {pending:?}");
    assert_eq!((pending[0]["event"].as_str(), pending[0]["status"].as_str()), (Some("progress"), Some("pending")));
    hooks.deliver().await;
    let got = hooks.receiver.at("/ok");
    assert_eq!(got.len(), 1);
    assert!(got[0].verifies_with(&secret), "signed like an end");
    let payload = got[0].json();
    assert_eq!(payload["type"], "task.progress");
    assert_eq!(payload["data"]["status"], "running");
    assert!((payload["data"]["progress"].as_f64().unwrap() - 0.3).abs() < 1e-6, "the latest: {payload}");

    // Once sent, the next report makes the next delivery; the task ends
    // before it is sent, so it is superseded by the end's, never sent.
    hooks.progress(id, 0.9).await;
    let done = Change::Complete { result: &json!({"digest": "abc"}), payment: None, held: &[] };
    tasks::transition(&pool, id, Fence::Run(1), done).await.unwrap().expect("the run held it");
    wait_until("every delivery to settle", Duration::from_secs(20), || async {
        hooks.deliver().await;
        hooks.all_deliveries(id).await.iter().all(|d| d["status"] != "pending")
    })
    .await;
    let deliveries = hooks.all_deliveries(id).await;
    let summary: Vec<(&str, &str, usize)> = deliveries
        .iter()
        .map(|d| (d["event"].as_str().unwrap(), d["status"].as_str().unwrap(), d["attempts"].as_array().unwrap().len()))
        .collect();
    assert_eq!(
        summary,
        [("progress", "delivered", 1), ("progress", "superseded", 0), ("completed", "delivered", 1)],
        "{deliveries:?}"
    );
    let types: Vec<String> =
        hooks.receiver.at("/ok").iter().map(|r| r.json()["type"].as_str().unwrap().to_owned()).collect();
    assert_eq!(types, ["task.progress", "task.completed"], "no progress after the end");

    // A Space's default may ask for progress too.
    let put = axum::http::Request::put("/v1/space/webhook")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {}", hooks.api.token))
        .body(axum::body::Body::from(
            json!({ "url": hooks.receiver.url("/default"), "events": ["progress"] }).to_string(),
        ))
        .unwrap();
    assert_eq!(send(&hooks.api.app, put).await.status, StatusCode::OK);
    let defaulted =
        send(&hooks.api.app, post_json("/v1/tasks/echo", Some(&hooks.api.token), &json!({"input": {}}))).await;
    let defaulted: Id = defaulted.body["id"].as_str().unwrap().parse().unwrap();
    hooks.start(defaulted).await;
    hooks.progress(defaulted, 0.4).await;
    hooks.deliver().await;
    let got = hooks.receiver.at("/default");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].json()["type"], "task.progress");
    hooks.done().await;
}

/// An MCP kind tool takes the REST create's `webhook`, refused the same way
/// before anything is stored, and its task's end is delivered.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_mcp_kind_tool_takes_a_webhook(pool: PgPool) {
    use crate::lambda_events::through_lambda;
    use crate::mcp::sample_event;
    let hooks = Hooks::new(&pool, short()).await;
    let config = common::with_catalog(common::config(&pool), CATALOG)
        .with(settings::QUEUE_URL, &hooks.api.queue.url)
        .with(settings::MCP_ALLOWED_HOSTS, "*");
    let router =
        reeve_shared::mcp::router(startup::mcp(&config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}")));
    let call = |webhook: Value| {
        let event = sample_event("mcp-tools-call-task", Some(&hooks.api.token), |params| {
            params["name"] = json!("echo");
            params["arguments"] = json!({ "webhook": webhook });
            // No tasks extension: the tool answers the task itself.
            params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
        });
        let router = router.clone();
        async move {
            let answer = through_lambda(router, &event).await.body;
            answer.get("result").cloned().unwrap_or_else(|| panic!("not a tool result: {answer}"))
        }
    };
    let listed = call(json!(null)).await;
    assert_ne!(listed["isError"], true, "no webhook is no webhook: {listed}");

    let refused = call(json!("https://example.com/hook")).await;
    let refused = (&refused["isError"], &refused["structuredContent"]["error"]["code"]);
    assert_eq!(refused, (&json!(true), &json!("webhook_secret_required")), "no secret yet");
    let secret = hooks.rotate().await;
    for bad in [json!("example.com/hook"), json!({"url": "https://example.com/", "events": ["started"]}), json!(7)] {
        let answer = call(bad.clone()).await;
        assert_eq!(answer["structuredContent"]["error"]["code"], "invalid_webhook", "{bad}: {answer}");
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(count, 1, "only the call without a webhook stored a task");

    let answer = call(json!({ "url": hooks.receiver.url("/ok"), "events": ["completed"] })).await;
    assert_ne!(answer["isError"], true, "{answer}");
    let id: Id = answer["structuredContent"]["id"].as_str().unwrap().parse().unwrap();
    hooks.complete(id).await;
    assert_eq!(hooks.settle(id).await["status"], "delivered");
    let got = hooks.receiver.at("/ok");
    assert_eq!(got.len(), 1);
    assert!(got[0].verifies_with(&secret));
    assert_eq!(got[0].json()["data"]["id"], id.to_string());
    hooks.done().await;
}

impl Hooks {
    /// Ends queued task `id` failed by Reeve's fault, which an operator may run again.
    async fn fail_by_reeve(&self, id: Id) {
        let error = tasks::task_error("internal", "the worker broke");
        let events =
            tasks::transition(&self.pool, id, Fence::From(&[TaskStatus::Queued]), Change::Fail { error: &error })
                .await
                .unwrap();
        assert!(events.is_some(), "the task was queued");
    }

    /// An operator's re-run (`reeve tasks rerun`) of task `id`.
    async fn rerun(&self, id: Id) {
        let rerun = tasks::bulk::rerun(&self.pool, id).await.unwrap().expect("the task exists");
        assert!(matches!(rerun, tasks::bulk::Rerun::Queued { .. }), "{rerun:?}");
    }

    /// Sends until none of task `id`'s deliveries is pending: them all, as
    /// `[event, status, rerun, attempts]`.
    async fn settle_all(&self, id: Id) -> Vec<Value> {
        wait_until("every delivery to settle", Duration::from_secs(20), || async {
            self.deliver().await;
            self.all_deliveries(id).await.iter().all(|d| d["status"] != "pending")
        })
        .await;
        let deliveries = self.all_deliveries(id).await;
        deliveries
            .iter()
            .map(|d| json!([d["event"], d["status"], d["rerun"], d["attempts"].as_array().unwrap().len()]))
            .collect()
    }
}

/// A task an operator runs again ends again, and a subscriber hears of that
/// end too: its own delivery (its own `webhook-id`), once, beside the first
/// end's. A first end still undelivered when the task is re-run is
/// superseded: sent late, it would describe a run that is no longer the
/// task's.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_rerun_s_end_is_delivered_as_its_own_message(pool: PgPool) {
    let hooks = Hooks::new(&pool, short()).await;
    let secret = hooks.rotate().await;
    let url = hooks.receiver.url("/ok");
    // Failed before any run (attempts 0), so its re-run starts from 0 attempts too.
    let id = hooks.created(json!(url)).await;
    hooks.fail_by_reeve(id).await;
    assert_eq!(hooks.settle(id).await["status"], "delivered");
    hooks.rerun(id).await;
    hooks.complete(id).await;
    let settled = hooks.settle_all(id).await;
    assert_eq!(
        settled,
        [json!(["failed", "delivered", 0, 1]), json!(["completed", "delivered", 1, 1])],
        "each end its delivery"
    );
    let got = hooks.receiver.at("/ok");
    assert_eq!(got.len(), 2, "each end delivered once");
    assert!(got.iter().all(|m| m.verifies_with(&secret)), "both signed");
    let seen: Vec<Value> =
        got.iter().map(Received::json).map(|p| json!([p["type"], p["data"]["status"], p["data"]["rerun"]])).collect();
    assert_eq!(seen, [json!(["task.failed", "failed", 0]), json!(["task.completed", "completed", 1])]);
    let deliveries = hooks.all_deliveries(id).await;
    assert_ne!(got[0].header("webhook-id"), got[1].header("webhook-id"), "a new message, not a retry");
    assert_eq!(got[1].header("webhook-id"), deliveries[1]["id"].as_str().unwrap());
    assert_eq!(hooks.deliver().await, 0, "nothing more to send");

    // Re-run before its failure was delivered, and failed again: the first
    // failure is superseded, unsent; the second is delivered.
    let late = hooks.created(json!(url)).await;
    hooks.fail_by_reeve(late).await;
    hooks.rerun(late).await;
    hooks.fail_by_reeve(late).await;
    let settled = hooks.settle_all(late).await;
    assert_eq!(settled, [json!(["failed", "superseded", 0, 0]), json!(["failed", "delivered", 1, 1])]);
    let got: Vec<Value> =
        hooks.receiver.at("/ok").iter().map(Received::json).filter(|p| p["data"]["id"] == late.to_string()).collect();
    assert_eq!(got.len(), 1, "only the re-run's end: {got:?}");
    assert_eq!((&got[0]["type"], &got[0]["data"]["rerun"]), (&json!("task.failed"), &json!(1)));
    hooks.done().await;
}
