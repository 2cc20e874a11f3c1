//! A kind sold by a service of its own through the executor protocol
//! (docs/executors.md): a loopback service checks each job's signature with
//! the `standardwebhooks` crate, answers as the test tells it, and the test
//! reports back through the API's report route as the service would.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine;
use reeve_shared::json_schema::JsonSchema;
use reeve_shared::settings::{self, Config};
use reeve_shared::worker::{Outcome, WorkerContext, process};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::common::{self, QueuedApi as Api, send};

/// The service's signing secret, as its variable holds it.
fn secret() -> String {
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([7u8; 32]))
}

const SECRET_VAR: &str = "SVC_TEST_SECRET";

/// What the service answers the next job with, and every job it received
/// (its body, and whether its signature checked out).
#[derive(Clone)]
struct Service {
    answer: Arc<Mutex<(u16, Option<&'static str>)>>,
    jobs: Arc<Mutex<Vec<(Value, bool)>>>,
}

impl Service {
    async fn start() -> (Service, String) {
        let service = Service { answer: Arc::new(Mutex::new((202, None))), jobs: Arc::default() };
        let app = Router::new().route("/job", post(job)).with_state(service.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (service, format!("http://{addr}/job"))
    }

    fn answer(&self, status: u16, retry_after: Option<&'static str>) {
        *self.answer.lock().unwrap() = (status, retry_after);
    }

    fn jobs(&self) -> Vec<(Value, bool)> {
        self.jobs.lock().unwrap().clone()
    }

    /// The report token of the `n`-th job it received.
    fn token(&self, n: usize) -> String {
        self.jobs()[n].0["report"]["token"].as_str().unwrap().to_owned()
    }
}

/// The loopback service sold as `svc`: it, the API (on a queue of its
/// own) and a worker holding a run's lease `lease_seconds`.
async fn sold(pool: &PgPool, lease_seconds: u32) -> (Service, Api, WorkerContext) {
    sold_with(pool, lease_seconds, &[]).await
}

/// [`sold`], the API given `api_vars` too.
async fn sold_with(pool: &PgPool, lease_seconds: u32, api_vars: &[(&str, &str)]) -> (Service, Api, WorkerContext) {
    let (service, endpoint) = Service::start().await;
    let catalog = catalog(&endpoint);
    let api = Api::with_vars(pool, &catalog, api_vars).await;
    let worker = worker(pool, &catalog, lease_seconds).await;
    (service, api, worker)
}

async fn job(State(service): State<Service>, headers: HeaderMap, body: Bytes) -> Response {
    let webhook = standardwebhooks::Webhook::new(&secret()).unwrap();
    let signed = webhook.verify(&body, &headers).is_ok();
    service.jobs.lock().unwrap().push((serde_json::from_slice(&body).unwrap(), signed));
    let (status, retry_after) = *service.answer.lock().unwrap();
    let status = StatusCode::from_u16(status).unwrap();
    match (status.as_u16(), retry_after) {
        (200, _) => (status, axum::Json(json!({ "answered": "at once" }))).into_response(),
        (_, Some(after)) => (status, [("retry-after", after)]).into_response(),
        _ => status.into_response(),
    }
}

fn catalog(endpoint: &str) -> String {
    common::catalog_text_with(&format!(
        r#"
        [tasks.svc]
        title = "A service"
        description = "An operator's own service, speaking the executor protocol."
        executor = "http"
        endpoint = "{endpoint}"
        protocol = 1
        secret = "{SECRET_VAR}"
        timeout_seconds = 3600
        input_schema = {{ type = "object" }}
        "#
    ))
}

/// A worker serving `catalog` that may call the loopback service, with its
/// secret and the report URL set, as start-up builds it.
async fn worker(pool: &PgPool, catalog: &str, lease_seconds: u32) -> WorkerContext {
    common::worker(&worker_config(pool, catalog, lease_seconds)).await
}

fn worker_config(pool: &PgPool, catalog: &str, lease_seconds: u32) -> Config {
    common::loopback_outbound(common::with_catalog(common::worker_config(pool), catalog))
        .with(SECRET_VAR, secret())
        .with(settings::REPORT_URL, "http://127.0.0.1:9/v1/executor/reports")
        .with(settings::LEASE, lease_seconds.to_string())
}

/// Runs the one message the queue holds through the worker.
async fn run_next(api: &Api, worker: &WorkerContext) -> Outcome {
    let messages = api.queue.drain().await;
    assert_eq!(messages.len(), 1, "one message: {messages:?}");
    process(worker, &messages[0].to_string(), 1).await
}

/// A report sent as the service would, with the job's token.
async fn report(api: &Api, token: &str, body: Value) -> common::Reply {
    let request = axum::http::Request::post("/v1/executor/reports")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {token}"))
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    send(&api.app, request).await
}

async fn status(pool: &PgPool, id: reeve_shared::ids::Id) -> (String, i32) {
    sqlx::query_as("SELECT status, attempts FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

async fn events(pool: &PgPool, id: reeve_shared::ids::Id, kind: &str) -> Vec<Value> {
    sqlx::query_scalar::<_, sqlx::types::Json<Value>>(
        "SELECT data FROM task_events WHERE task_id = $1 AND type = $2 ORDER BY seq",
    )
    .bind(id)
    .bind(kind)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|d| d.0)
    .collect()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_signed_job_accepted_then_reported_to_its_end(pool: PgPool) {
    let (service, api, worker) = sold(&pool, 20).await;
    let id = api.create("svc", json!({ "text": "hello" })).await;

    assert_eq!(run_next(&api, &worker).await, Outcome::Done, "the worker is done once the service accepts");
    assert_eq!(status(&pool, id).await, ("running".into(), 1), "the attempt runs on at the service");
    let jobs = service.jobs();
    let (job, signed) = &jobs[0];
    assert!(signed, "the job's Standard Webhooks signature checks out");
    assert_eq!(job["type"], "job");
    assert_eq!(job["protocol"], 1);
    assert_eq!(job["task"]["id"], id.to_string());
    assert_eq!(job["task"]["kind"], "svc");
    assert_eq!(job["task"]["attempt"], 1);
    assert_eq!(job["input"], json!({ "text": "hello" }));
    assert_eq!(job["files"], json!([]));
    assert_eq!(job["report"]["url"], "http://127.0.0.1:9/v1/executor/reports");
    assert_eq!(job["report"]["expires_at"], job["task"]["deadline"]);
    assert!(job.get("metered").is_none(), "a free kind");
    let delegated: (Option<i32>, bool) = sqlx::query_as(
        "SELECT delegated_attempt, delegated_until > now() + interval '59 minutes' FROM tasks WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(delegated, (Some(1), true), "recorded as delegated until its deadline");
    let token = job["report"]["token"].as_str().unwrap().to_owned();

    // Progress, sent twice under one id: the same answer, one event.
    let progress = json!({ "id": "p-1", "type": "progress", "fraction": 0.5, "message": "half way" });
    let first = report(&api, &token, progress.clone()).await;
    assert_eq!((first.status, &first.body), (StatusCode::OK, &json!({ "recorded": true })));
    let again = report(&api, &token, progress).await;
    assert_eq!((again.status, &again.body), (StatusCode::OK, &first.body), "a replay answers the same");
    assert_eq!(events(&pool, id, "progress").await, [json!({ "fraction": 0.5, "message": "half way" })]);
    let log = report(&api, &token, json!({ "id": "l-1", "type": "log", "line": "read 3 lines" })).await;
    assert_eq!(log.status, StatusCode::OK, "{}", log.body);
    assert_eq!(events(&pool, id, "log").await.last(), Some(&json!({ "line": "read 3 lines" })));
    let beat = report(&api, &token, json!({ "id": "h-1", "type": "heartbeat" })).await;
    assert_eq!(beat.status, StatusCode::OK, "{}", beat.body);

    // Refused: no token, a forged one, a malformed report.
    // Its last character changed (to another: a token ending in `A`, one
    // in sixteen, would otherwise be "forged" into itself).
    let last = if token.ends_with('A') { 'E' } else { 'A' };
    let forged = format!("{}{last}", &token[..token.len() - 1]);
    for bad in ["", forged.as_str(), "nonsense"] {
        let refused = report(&api, bad, json!({ "id": "x", "type": "heartbeat" })).await;
        assert_eq!((refused.status, refused.code()), (StatusCode::UNAUTHORIZED, "invalid_report_token"), "{bad:?}");
    }
    let malformed = report(&api, &token, json!({ "id": "m", "type": "progress", "fraction": 3 })).await;
    assert_eq!((malformed.status, malformed.code()), (StatusCode::BAD_REQUEST, "invalid_report"));

    let done = report(&api, &token, json!({ "id": "r-1", "type": "result", "result": { "words": 2 } })).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(status(&pool, id).await, ("completed".into(), 1));
    assert_eq!(events(&pool, id, "result").await, [json!({ "words": 2 })]);
    let read = send(&api.app, common::get_authed(&format!("/v1/tasks/{id}"), &api.token)).await;
    assert_eq!((read.body["status"].as_str(), &read.body["result"]), (Some("completed"), &json!({ "words": 2 })));

    // After the end: the result again answers the same; anything new is `ended`.
    let replayed = report(&api, &token, json!({ "id": "r-1", "type": "result", "result": { "words": 2 } })).await;
    assert_eq!((replayed.status, &replayed.body), (StatusCode::OK, &done.body));
    let late = report(&api, &token, json!({ "id": "p-2", "type": "progress", "fraction": 0.9 })).await;
    assert_eq!((late.status, late.code()), (StatusCode::CONFLICT, "ended"));
    assert_eq!(events(&pool, id, "result").await.len(), 1, "one result");
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_services_answers_fail_retry_or_complete_as_the_contract_says(pool: PgPool) {
    let (service, api, worker) = sold(&pool, 20).await;

    // 4xx: refused for good, in words that name no endpoint.
    service.answer(422, None);
    let id = api.create("svc", json!({})).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Failed("executor_rejected"));
    let error = &events(&pool, id, "error").await[0];
    assert_eq!(error["code"], "executor_rejected");
    assert!(!error["message"].as_str().unwrap().contains("127.0.0.1"), "{error}");

    // 5xx and 429 (and 408): try again, after what the service asked.
    for (status_code, after) in [(503, Some("7")), (429, Some("3")), (408, None)] {
        service.answer(status_code, after);
        let id = api.create("svc", json!({})).await;
        let outcome = run_next(&api, &worker).await;
        assert!(outcome.is_retry(), "{status_code}: {outcome:?}");
        if let (Outcome::Retry(retry), Some(after)) = (&outcome, after) {
            assert_eq!(retry.after, Some(Duration::from_secs(after.parse().unwrap())), "{status_code}");
        }
        assert_eq!(status(&pool, id).await, ("queued".into(), 1), "{status_code}");
    }

    // 200: the answer is the result, as before the protocol.
    service.answer(200, None);
    let id = api.create("svc", json!({})).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    assert_eq!(status(&pool, id).await, ("completed".into(), 1));
    assert_eq!(events(&pool, id, "result").await, [json!({ "answered": "at once" })]);
    assert!(service.jobs().iter().all(|(_, signed)| *signed), "every job is signed");
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_failure_ends_the_attempt_for_good_or_for_another(pool: PgPool) {
    let (service, api, worker) = sold(&pool, 20).await;

    let id = api.create("svc", json!({})).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    let token = service.token(0);
    let failed = report(
        &api,
        &token,
        json!({ "id": "f", "type": "failure", "retryable": false, "message": "the text is not English" }),
    )
    .await;
    assert_eq!(failed.status, StatusCode::OK, "{}", failed.body);
    assert_eq!(status(&pool, id).await, ("failed".into(), 1));
    assert_eq!(
        events(&pool, id, "error").await,
        [json!({ "code": "executor_failed", "message": "the text is not English" })]
    );

    let id = api.create("svc", json!({})).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    let token = service.token(1);
    let retry = json!({ "id": "f", "type": "failure", "retryable": true, "retry_after_seconds": 1 });
    let answered = report(&api, &token, retry).await;
    assert_eq!(answered.status, StatusCode::OK, "{}", answered.body);
    assert_eq!(status(&pool, id).await, ("queued".into(), 1), "back in the queue for attempt 2");
    // Queued again after its delay; the next attempt is a new job, a new token.
    let mut next = Vec::new();
    for _ in 0..10 {
        next = api.queue.drain().await;
        if !next.is_empty() {
            break;
        }
    }
    assert_eq!(next.len(), 1, "queued after its delay");
    assert_eq!(process(&worker, &next[0].to_string(), 1).await, Outcome::Done);
    let second = &service.jobs()[2].0;
    assert_eq!(second["task"]["attempt"], 2);
    assert_ne!(second["report"]["token"].as_str().unwrap(), token);
    let old = report(&api, &token, json!({ "id": "late", "type": "heartbeat" })).await;
    assert_eq!((old.status, old.code()), (StatusCode::CONFLICT, "superseded"));
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_silent_service_is_retried_by_the_sweeper_and_its_old_token_is_superseded(pool: PgPool) {
    let (service, api, worker) = sold(&pool, 2).await;

    let id = api.create("svc", json!({})).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    let first = service.token(0);
    // No renewal lengthens the lease past what the worker gave it.
    let lease: f64 =
        sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM lease_until - now())::float8 FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(lease <= 2.0, "a lease of the worker's 2 s, got {lease}");

    // Silence: the lease lapses, and the sweeper sends the task again.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let config = common::config(&pool).with(settings::QUEUE_URL, &api.queue.url);
    let sweeper = reeve_shared::startup::sweeper(&config, &reeve_shared::startup::sdk().await).await.unwrap();
    let mut swept = Default::default();
    sweeper.sweep_lapsed(&mut swept).await.unwrap();
    assert_eq!(run_next(&api, &worker).await, Outcome::Done, "the next attempt is sent and accepted");
    assert_eq!(status(&pool, id).await, ("running".into(), 2));
    assert_eq!(events(&pool, id, "lease_lost").await.len(), 1, "taken over like a dead worker's run");
    let second = service.jobs()[1].0.clone();
    assert_eq!(second["task"]["attempt"], 2);

    let old = report(&api, &first, json!({ "id": "p", "type": "progress", "fraction": 0.1 })).await;
    assert_eq!((old.status, old.code()), (StatusCode::CONFLICT, "superseded"));
    let token = second["report"]["token"].as_str().unwrap();
    let done = report(&api, token, json!({ "id": "r", "type": "result", "result": {} })).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(status(&pool, id).await, ("completed".into(), 2));
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_cancel_while_the_service_works_answers_its_next_report_409_canceled(pool: PgPool) {
    let (service, api, worker) = sold(&pool, 20).await;

    let id = api.create("svc", json!({})).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    let token = service.token(0);
    let asked =
        send(&api.app, common::post_json(&format!("/v1/tasks/{id}/cancel"), Some(&api.token), &json!({}))).await;
    assert_eq!(asked.status, StatusCode::ACCEPTED, "{}", asked.body);

    let refused = report(&api, &token, json!({ "id": "p", "type": "progress", "fraction": 0.2 })).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::CONFLICT, "canceled"));
    assert_eq!(status(&pool, id).await, ("canceled".into(), 1));
    let again = report(&api, &token, json!({ "id": "r", "type": "result", "result": {} })).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "canceled"));
    api.queue.delete().await;
}

/// A metered kind `kind` sold by the loopback service, paid with x402
/// `upto` at `rate` per `unit` up to `ceiling`, and a payer holding `funds`
/// who approved Permit2: what the metered tests share.
struct Shop {
    kind: &'static str,
    service: Service,
    pay_to: String,
    payer: common::chain::Payer,
    queue: common::TestQueue,
    config: Config,
    app: Router,
    session: String,
    _chain: common::chain::ChainLock,
}

impl Shop {
    async fn open(pool: &PgPool, kind: &'static str, unit: &str, rate: u128, ceiling: u128, funds: u128) -> Shop {
        let chain = common::chain::ChainLock::shared().await;
        let (service, endpoint) = Service::start().await;
        let pay_to = common::chain::fresh_address();
        let facilitator = std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into());
        let tasks = format!(
            r#"
            [tasks.{kind}]
            title = "A metered service"
            description = "An operator's own service, paid per {unit} it reports."
            executor = "http"
            endpoint = "{endpoint}"
            protocol = 1
            secret = "{SECRET_VAR}"
            timeout_seconds = 60
            input_schema = {{ type = "object" }}
            [[tasks.{kind}.accepts]]
            asset = "local"
            scheme = "upto"
            unit = "{unit}"
            rate = "{rate}"
            amount = "{ceiling}"
            "#
        );
        let catalog = common::paid_catalog_text(&pay_to, &facilitator, 300, &tasks);
        let queue = common::TestQueue::new().await;
        let config = common::with_catalog(common::config(pool), &catalog)
            .with(settings::QUEUE_URL, &queue.url)
            .with(reeve_shared::payments::CHAIN_RPC_URLS, common::chain::chain_rpc_urls());
        let app = reeve_shared::http::app(common::api(&config).await);
        let session = common::new_session(&app).await.1;
        let payer = common::chain::Payer::new(&chain, funds).await;
        payer.approve_permit2(&chain, u128::MAX).await;
        Shop { kind, service, pay_to, payer, queue, config, app, session, _chain: chain }
    }

    /// A task created as a paying buyer does it: the `402`'s body, then
    /// the task paid with the payer's `upto` authorization, queued.
    async fn create_paid(&self) -> (Value, reeve_shared::ids::Id) {
        let create = |payment: Option<String>| {
            let uri = format!("/v1/tasks/{}", self.kind);
            let mut request = common::post_json(&uri, Some(&self.session), &json!({ "input": {} }));
            if let Some(p) = payment {
                request.headers_mut().insert("payment-signature", p.parse().unwrap());
            }
            send(&self.app, request)
        };
        let challenge = create(None).await;
        assert_eq!(challenge.status, StatusCode::PAYMENT_REQUIRED, "{}", challenge.body);
        let signature = self.payer.sign(challenge.headers["payment-required"].to_str().unwrap()).await;
        let created = create(Some(signature)).await;
        assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
        assert_eq!(self.queue.drain().await.len(), 1);
        (challenge.body, created.body["id"].as_str().unwrap().parse().unwrap())
    }

    /// A worker that may call the service, and the job it sent it for `id`.
    async fn send_job(&self, id: reeve_shared::ids::Id) -> (WorkerContext, Value) {
        let worker_config = common::loopback_outbound(self.config.clone().without(settings::QUEUE_URL))
            .with(SECRET_VAR, secret())
            .with(settings::REPORT_URL, "http://127.0.0.1:9/v1/executor/reports");
        let worker = common::worker(&worker_config).await;
        let message = json!({ "task_id": id, "kind": self.kind }).to_string();
        assert_eq!(process(&worker, &message, 1).await, Outcome::Done);
        let job = self.service.jobs()[0].0.clone();
        (worker, job)
    }

    /// A report sent as the service would, with `job`'s token.
    async fn report(&self, job: &Value, body: Value) -> common::Reply {
        let token = job["report"]["token"].as_str().unwrap();
        let request = axum::http::Request::post("/v1/executor/reports")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        send(&self.app, request).await
    }

    /// The worker resumes the capture the result left open: the task's one
    /// queued message, run.
    async fn capture(&self, worker: &WorkerContext) {
        let next = self.queue.drain().await;
        assert_eq!(next.len(), 1, "queued for its capture");
        assert_eq!(process(worker, &next[0].to_string(), 1).await, Outcome::Done);
    }
}

/// A metered kind sold by a service: paid with x402 `upto` per second the
/// service says it used, charged the reported usage × rate once its result
/// is captured, which a worker does (never the report route).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_metered_service_is_charged_its_reported_usage_once_captured(pool: PgPool) {
    use common::chain::balance;
    const RATE: u128 = 7;
    const CEILING: u128 = 1_000;
    const FUNDS: u128 = 1_000_000;

    let shop = Shop::open(&pool, "msvc", "second", RATE, CEILING, FUNDS).await;
    let (_, id) = shop.create_paid().await;
    let (worker, job) = shop.send_job(id).await;
    assert_eq!(job["metered"], json!({ "unit": "second", "ceiling": CEILING / RATE }));
    let report = |body: Value| shop.report(&job, body);

    // Before the charge: how far it got, nothing of what it found.
    let progress = report(json!({ "id": "p", "type": "progress", "fraction": 0.5, "message": "found 3 words" })).await;
    assert_eq!(progress.status, StatusCode::OK, "{}", progress.body);
    assert_eq!(events(&pool, id, "progress").await, [json!({ "fraction": 0.5 })]);
    let log = report(json!({ "id": "l", "type": "log", "line": "the most frequent word is reeve" })).await;
    assert_eq!(log.status, StatusCode::OK, "{}", log.body);
    assert!(events(&pool, id, "log").await.iter().all(|l| !l["line"].as_str().unwrap().contains("reeve")), "held");
    let usage = report(json!({ "id": "u", "type": "usage", "used": 5 })).await;
    assert_eq!(usage.status, StatusCode::OK, "{}", usage.body);
    let result = report(json!({ "id": "r", "type": "result", "result": { "top": "reeve" } })).await;
    assert_eq!((result.status, &result.body["used"]), (StatusCode::OK, &json!(5)), "{}", result.body);
    assert_eq!(balance(&shop.payer.address).await, FUNDS, "nothing captured by the report route");
    let late = report(json!({ "id": "p2", "type": "progress", "fraction": 0.9 })).await;
    assert_eq!((late.status, late.code()), (StatusCode::CONFLICT, "ended"));

    // A worker resumes the held capture and delivers the result.
    shop.capture(&worker).await;
    let (status, _) = status(&pool, id).await;
    assert_eq!(status, "completed");
    assert_eq!(balance(&shop.payer.address).await, FUNDS - 5 * RATE, "charged the reported 5 seconds × the rate");
    assert_eq!(balance(&shop.pay_to).await, 5 * RATE);
    assert_eq!(events(&pool, id, "result").await, [json!({ "top": "reeve" })]);
    assert!(
        events(&pool, id, "log").await.iter().any(|l| l["line"] == "the most frequent word is reeve"),
        "the held line is shown once charged"
    );
    assert_eq!(shop.service.jobs().len(), 1, "the service is not sent the job again");
    shop.queue.delete().await;
}

/// A PUT as a service sends it: the answer's method, URL and headers, its
/// `Content-Length` the body's own (reqwest sets it from the body).
async fn put_output(answer: &Value, body: Vec<u8>) -> u16 {
    assert_eq!(answer["method"], "PUT", "{answer}");
    let mut request = reqwest::Client::new().put(answer["url"].as_str().unwrap()).body(body);
    for (name, value) in answer["headers"].as_object().unwrap().iter().filter(|(n, _)| *n != "content-length") {
        request = request.header(name, value.as_str().unwrap());
    }
    request.send().await.expect("S3 answers").status().as_u16()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_output_report_answers_a_bounded_put_and_the_result_links_the_file(pool: PgPool) {
    // The bucket keeps outputs 2 days: each file says until when.
    let (service, api, worker) = sold_with(&pool, 20, &[(settings::OUTPUT_RETENTION_DAYS, "2")]).await;
    let id = api.create("svc", json!({})).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    let job = service.jobs()[0].0.clone();
    let token = job["report"]["token"].as_str().unwrap().to_owned();
    let csv = b"word,count\nhello,2\n".to_vec();
    let sha256 = |bytes: &[u8]| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes));

    let declared = json!({ "id": "o-1", "type": "output", "name": "top.csv", "size": csv.len(),
                           "content_type": "text/csv", "sha256": sha256(&csv) });
    let answer = report(&api, &token, declared.clone()).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let url = answer.body["url"].as_str().unwrap();
    assert!(url.contains("/outputs/") && url.contains(&format!("/{id}/files/top.csv")), "{url}");
    assert_eq!(answer.body["headers"]["content-type"], "text/csv");
    assert_eq!(answer.body["headers"]["content-length"], csv.len().to_string());
    let expires = time::OffsetDateTime::parse(
        answer.body["expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let left = expires - time::OffsetDateTime::now_utc();
    assert!(left <= time::Duration::minutes(15) && left > time::Duration::minutes(14), "15 min, before the deadline");
    // The PUT is bound to the declared size: a longer body is refused; and
    // to the declared SHA-256: a body of that size with other bytes too.
    assert_eq!(put_output(&answer.body, b"word,count\nhello,2\nextra\n".to_vec()).await / 100, 4);
    assert!(answer.body["headers"]["x-amz-checksum-sha256"].is_string(), "{}", answer.body);
    assert_eq!(put_output(&answer.body, b"word,count\nhello,3\n".to_vec()).await / 100, 4, "other bytes");
    assert_eq!(put_output(&answer.body, csv.clone()).await, 200);
    // The same report again: a PUT of the same object.
    let again = report(&api, &token, declared).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["headers"], answer.body["headers"]);
    // Declared again under another digest once written: what the result
    // (and a receipt) says is the digest of the bytes stored, not the claim.
    let claimed = json!({ "id": "o-5", "type": "output", "name": "top.csv", "size": csv.len(),
                          "content_type": "text/csv", "sha256": sha256(b"something else") });
    assert_eq!(report(&api, &token, claimed).await.status, StatusCode::OK);

    // Refused: over the uploads' size limit, a name that is not one key component.
    let huge = report(
        &api,
        &token,
        json!({ "id": "o-2", "type": "output", "name": "big.bin",
                                            "size": 104_857_601u64, "content_type": "application/octet-stream",
                                            "sha256": sha256(b"") }),
    )
    .await;
    assert_eq!((huge.status, huge.code()), (StatusCode::PAYLOAD_TOO_LARGE, "too_large"), "{}", huge.body);
    for name in ["..", ".", "a/b.csv", "", "ü.csv"] {
        let bad = report(
            &api,
            &token,
            json!({ "id": "o-3", "type": "output", "name": name, "size": 1,
                                               "content_type": "text/plain", "sha256": sha256(b"x") }),
        )
        .await;
        assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_report"), "{name:?}");
    }
    // No digest, or one that is not 64 hex digits: nothing to bind the PUT to.
    for digest in [json!(null), json!("abc"), json!("z".repeat(64))] {
        let mut declared = json!({ "id": "o-6", "type": "output", "name": "x.txt", "size": 1,
                                   "content_type": "text/plain" });
        if !digest.is_null() {
            declared["sha256"] = digest.clone();
        }
        let bad = report(&api, &token, declared).await;
        assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "invalid_report"), "{digest}");
        assert!(bad.body["error"]["message"].as_str().unwrap().contains("sha256"), "{}", bad.body);
    }
    // Declared and never written: not listed.
    let never = report(
        &api,
        &token,
        json!({ "id": "o-4", "type": "output", "name": "never.txt", "size": 3,
                                             "content_type": "text/plain", "sha256": sha256(b"abc") }),
    )
    .await;
    assert_eq!(never.status, StatusCode::OK, "{}", never.body);

    // The service's own `outputs` is replaced by what it wrote.
    let result =
        json!({ "id": "r", "type": "result", "result": { "words": 1, "outputs": [{ "name": "x", "key": "y" }] } });
    let done = report(&api, &token, result).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    let read = send(&api.app, common::get_authed(&format!("/v1/tasks/{id}"), &api.token)).await;
    assert_eq!(read.body["status"], "completed", "{}", read.body);
    let outputs = read.body["result"]["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    let file = &outputs[0];
    assert_eq!(
        (&file["name"], &file["size"], &file["content_type"], &file["sha256"]),
        (&json!("top.csv"), &json!(csv.len()), &json!("text/csv"), &json!(sha256(&csv))),
        "the digest the bucket verified, not the later claim"
    );
    let link = file["url"].as_str().expect("a download link");
    assert!(file["url_expires_at"].is_string());
    let kept_until = time::OffsetDateTime::parse(
        file["object_expires_at"].as_str().unwrap_or_else(|| panic!("the file's expiry: {file}")),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let kept = kept_until - time::OffsetDateTime::now_utc();
    assert!(kept > time::Duration::days(2) && kept <= time::Duration::days(3), "2 days, to the next midnight: {file}");
    let documented = JsonSchema::compile(&reeve_shared::executors::outputs_schema()).unwrap();
    assert!(documented.is_valid(&read.body["result"]["outputs"]), "{}", read.body);
    let downloaded = reqwest::get(link).await.unwrap();
    assert_eq!(downloaded.status(), 200);
    assert_eq!(downloaded.bytes().await.unwrap().to_vec(), csv, "the link downloads what the service wrote");
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_job_links_each_input_upload_and_the_link_downloads_its_bytes(pool: PgPool) {
    let (service, api, worker) = sold(&pool, 20).await;
    let mut ids = Vec::new();
    let texts: [&[u8]; 2] = [b"the quick brown fox\n", b"jumps over the lazy dog\nand again\n"];
    for bytes in texts {
        let body = json!({ "filename": "words.txt", "content_type": "text/plain", "size": bytes.len() });
        let reply = send(&api.app, common::post_json("/v1/uploads", Some(&api.token), &body)).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        let mut put = reqwest::Client::new().put(reply.body["url"].as_str().unwrap()).body(bytes.to_vec());
        for (name, value) in reply.body["headers"].as_object().unwrap().iter().filter(|(n, _)| *n != "content-length") {
            put = put.header(name, value.as_str().unwrap());
        }
        assert!(put.send().await.unwrap().status().is_success());
        ids.push(reply.body["upload_id"].as_str().unwrap().to_owned());
    }
    let id = api.create("svc", json!({ "upload_id": ids[0], "upload_ids": [ids[1]] })).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    let job = service.jobs()[0].0.clone();
    let files = job["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{job}");
    for ((file, upload), bytes) in files.iter().zip(&ids).zip(texts) {
        assert_eq!(file["upload_id"], json!(upload));
        assert_eq!((&file["size"], &file["content_type"]), (&json!(bytes.len()), &json!("text/plain")));
        let expires = time::OffsetDateTime::parse(
            file["expires_at"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        let left = expires - time::OffsetDateTime::now_utc();
        // The bucket refuses a signature older than 15 minutes: no link
        // says it lives longer, though the deadline is an hour away.
        assert!(left <= time::Duration::minutes(15) && left > time::Duration::minutes(14), "{left}");
        let got = reqwest::get(file["url"].as_str().unwrap()).await.unwrap();
        assert_eq!(got.status(), 200, "the job's link reads the upload");
        assert_eq!(got.bytes().await.unwrap().as_ref(), bytes, "the uploaded bytes");
    }
    assert_eq!(status(&pool, id).await, ("running".into(), 1));
    api.queue.delete().await;
}

/// A metered kind in a unit its service names (`unit = "line"`): the
/// catalog and the 402 say "per line", the job's ceiling is in lines, and
/// usage reported above the ceiling is capped in what is recorded and
/// charged.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_service_unit_is_shown_per_unit_and_usage_above_the_ceiling_is_capped(pool: PgPool) {
    use common::chain::balance;
    const RATE: u128 = 7;
    const CEILING: u128 = 1_000;
    const FUNDS: u128 = 1_000_000;
    const LINES: u128 = CEILING / RATE; // 142 lines: 994 atomic units

    let shop = Shop::open(&pool, "lines", "line", RATE, CEILING, FUNDS).await;
    let view = send(&shop.app, common::get("/v1/catalog")).await;
    let kind = view.body["tasks"].as_array().unwrap().iter().find(|t| t["kind"] == "lines").unwrap().clone();
    let price = &kind["prices"][0];
    assert_eq!(price["unit"], "line", "{kind}");
    assert!(price["summary"].as_str().unwrap().contains(" per line used"), "{price}");

    let (challenge, id) = shop.create_paid().await;
    assert!(challenge.to_string().contains("per line"), "the 402 says per line: {challenge}");
    let (worker, job) = shop.send_job(id).await;
    assert_eq!(job["metered"], json!({ "unit": "line", "ceiling": LINES }));

    // Over the ceiling: recorded as the ceiling.
    let usage = shop.report(&job, json!({ "id": "u", "type": "usage", "used": 10_000 })).await;
    assert_eq!((usage.status, &usage.body["used"]), (StatusCode::OK, &json!(LINES)), "{}", usage.body);
    let result = shop.report(&job, json!({ "id": "r", "type": "result", "result": { "lines": 10_000 } })).await;
    assert_eq!((result.status, &result.body["used"]), (StatusCode::OK, &json!(LINES)), "{}", result.body);

    shop.capture(&worker).await;
    assert_eq!(status(&pool, id).await.0, "completed");
    assert_eq!(balance(&shop.payer.address).await, FUNDS - LINES * RATE, "charged the ceiling's lines × the rate");
    assert_eq!(balance(&shop.pay_to).await, LINES * RATE);
    shop.queue.delete().await;
}
