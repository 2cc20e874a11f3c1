//! Service kinds through Reeve, end to end: a buyer uploads a text file and
//! creates a task; the worker sends the job (docs/executors.md) to a real
//! service, which reads the file through its presigned link and reports
//! back over HTTP to the API's report route, served here on loopback.
//!
//! - `wordfreq` (reeve.dev.toml): examples/wordfreq, a Lambda function,
//!   invoked by the `lambda` executor through the Invoke API `cargo lambda
//!   watch` serves (the test starts its own, on a free port);
//! - the Python service written from docs/executors.md alone
//!   (tests/executors/service.py), as an `http` kind with `protocol = 1`;
//! - `wordfreq-metered` (reeve.dev.toml) paid with the x402 Python SDK's
//!   `upto` client on the local chain: charged the lines it read × the
//!   rate, capped at the ceiling, and nothing when it fails;
//! - what Invoke answers besides: a missing function, a throttled one, a
//!   crashed one and a synchronous one, from a stand-in Invoke endpoint
//!   (`cargo lambda watch` cannot be made to throttle, and would need a
//!   second example function to crash).

#[path = "../../../tests/executors/harness.rs"]
mod harness;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine;
use reeve_shared::ids::Id;
use reeve_shared::json_schema::JsonSchema;
use reeve_shared::settings::{self, Config};
use reeve_shared::worker::{Outcome, WorkerContext, process};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::common::chain::{ChainLock, Payer, balance, charges_to, fresh_address};
use crate::common::{self, QueuedApi as Api, TestQueue, get_authed, new_session, post_json, send};
use harness::{PythonService, Watch};

/// Lines between the services' progress reports, small so a short text
/// reports several times.
const EVERY: u64 = 4;

/// A short text: 12 lines, "the" the most frequent word.
fn text() -> String {
    let mut text = String::new();
    for n in 0..12 {
        text.push_str(&format!("The cat sat on the mat, line {n}; the end.\n"));
    }
    text
}

/// The API serving `catalog`, reachable over loopback as a service reaches
/// it: its report URL.
async fn served(pool: &PgPool, catalog: &str) -> (Api, String) {
    served_with(pool, catalog, &[]).await
}

/// [`served`] with `extra` variables in the API's configuration.
async fn served_with(pool: &PgPool, catalog: &str, extra: &[(&str, &str)]) -> (Api, String) {
    let queue = TestQueue::new().await;
    let mut config = common::with_catalog(common::config(pool), catalog).with(settings::QUEUE_URL, &queue.url);
    for (name, value) in extra {
        config = config.with(name, *value);
    }
    let app = reeve_shared::http::app(common::api(&config).await);
    let (_, token) = new_session(&app).await;
    let api = Api { app, token, queue };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = api.app.clone().into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (api, format!("http://{addr}/v1/executor/reports"))
}

/// A worker on `catalog` that reports to `report_url`, with `extra`
/// variables, as start-up builds it; its Invoke client, if `invoke` names
/// an endpoint, calls that one.
async fn worker(
    pool: &PgPool,
    catalog: &str,
    report_url: &str,
    extra: &[(&str, &str)],
    invoke: Option<&str>,
) -> WorkerContext {
    let mut config: Config = common::loopback_outbound(common::with_catalog(common::worker_config(pool), catalog))
        .with(settings::REPORT_URL, report_url);
    for (name, value) in extra {
        config = config.with(name, *value);
    }
    let mut worker = common::worker(&config).await;
    if let Some(url) = invoke {
        let sdk = reeve_shared::startup::sdk().await;
        let lambda = aws_sdk_lambda::config::Builder::from(&sdk).endpoint_url(url).build();
        worker.exec.lambda = Some(aws_sdk_lambda::Client::from_conf(lambda));
    }
    worker
}

/// `text` uploaded through the API as a buyer would, and seen by the
/// upload guard (which S3 events run in a deployment): its upload id.
async fn upload(api: &Api, pool: &PgPool, text: &str) -> String {
    upload_of(api, pool, text, true).await
}

/// [`upload`], or with `write` false one the database holds as uploaded
/// whose object was never written: the service's link to it answers 404.
async fn upload_of(api: &Api, pool: &PgPool, text: &str, write: bool) -> String {
    let body = json!({ "filename": "words.txt", "content_type": "text/plain", "size": text.len() });
    let reply = send(&api.app, post_json("/v1/uploads", Some(&api.token), &body)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let id = reply.body["upload_id"].as_str().unwrap().to_owned();
    if write {
        put_upload(&reply.body, text).await;
    }
    sqlx::query("UPDATE uploads SET status = 'uploaded' WHERE id = $1")
        .bind(id.parse::<Id>().unwrap())
        .execute(pool)
        .await
        .unwrap();
    id
}

/// The PUT of `text` to a presigned upload, with the headers it was given.
async fn put_upload(presigned: &Value, text: &str) {
    let mut put = reqwest::Client::new().put(presigned["url"].as_str().unwrap()).body(text.to_owned());
    for (name, value) in presigned["headers"].as_object().unwrap() {
        if name != "content-length" {
            put = put.header(name, value.as_str().unwrap());
        }
    }
    let put = put.send().await.unwrap();
    assert!(put.status().is_success(), "PUT: {}", put.status());
}

/// Runs the one message the queue holds through the worker.
async fn run_next(api: &Api, worker: &WorkerContext) -> Outcome {
    let messages = api.queue.drain().await;
    assert_eq!(messages.len(), 1, "one message: {messages:?}");
    process(worker, &messages[0].to_string(), 1).await
}

async fn task(pool: &PgPool, id: Id) -> (String, i32, Option<Value>) {
    let (status, attempts, error): (String, i32, Option<sqlx::types::Json<Value>>) =
        sqlx::query_as("SELECT status, attempts, error FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    (status, attempts, error.map(|e| e.0))
}

/// Every event of the task: `(type, data)`, in order.
async fn events(pool: &PgPool, id: Id) -> Vec<(String, Value)> {
    sqlx::query_as::<_, (String, sqlx::types::Json<Value>)>(
        "SELECT type, data FROM task_events WHERE task_id = $1 ORDER BY seq",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(t, d)| (t, d.0))
    .collect()
}

/// Waits until the service's attempt has ended: the task is no longer
/// `running` (it completed, failed, or was queued for another attempt).
async fn wait_for_end(pool: &PgPool, id: Id, within: Duration) {
    common::wait_until("the service's attempt ends", within, || async {
        task(pool, id).await.0 != "running" && task(pool, id).await.1 >= 1
    })
    .await;
}

/// What a service reading `text()` reported, as the buyer's events show:
/// running, then progress as it read, every progress with its line count.
fn assert_reported_progress(events: &[(String, Value)]) {
    let statuses: Vec<&str> =
        events.iter().filter(|(t, _)| t == "status").filter_map(|(_, d)| d["status"].as_str()).collect();
    assert!(statuses.starts_with(&["queued", "running"]), "{statuses:?}");
    let progress: Vec<&Value> = events.iter().filter(|(t, _)| t == "progress").map(|(_, d)| d).collect();
    // Every EVERY lines (3 of 12), and the end of reading.
    assert!(progress.len() >= 4, "{progress:?}");
    let fractions: Vec<f64> = progress.iter().filter_map(|d| d["fraction"].as_f64()).collect();
    assert!(fractions.windows(2).all(|w| w[0] <= w[1]), "progress only goes forward: {fractions:?}");
    assert_eq!(fractions.last(), Some(&1.0), "{progress:?}");
    let messages: Vec<&str> = progress.iter().filter_map(|d| d["message"].as_str()).collect();
    assert!(messages.contains(&"4 lines read"), "{messages:?}");
    assert!(messages.iter().any(|m| m.starts_with("12 lines read")), "{messages:?}");
}

/// How the attempt ended: completed with the summary, and the CSV the
/// service uploaded through its `output` report listed in the buyer's
/// result with a download link that gives the 100 words.
async fn assert_ended(api: &Api, id: Id) {
    let reply = send(&api.app, get_authed(&format!("/v1/tasks/{id}"), &api.token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let task = &reply.body;
    assert_eq!(task["status"], "completed", "{task}");
    let summary = &task["result"];
    assert_eq!(summary["lines"], 12, "{summary}");
    assert_eq!(summary["top"][0], json!({ "word": "the", "count": 36 }), "{summary}");
    assert_eq!(summary["output"], "top-100.csv", "{summary}");
    let outputs = summary["outputs"].as_array().unwrap_or_else(|| panic!("the result lists its files: {summary}"));
    assert_eq!(outputs.len(), 1, "{summary}");
    let documented = JsonSchema::compile(&reeve_shared::executors::outputs_schema()).unwrap();
    assert!(documented.is_valid(&summary["outputs"]), "as docs/executor-schemas/outputs.json says: {summary}");
    assert_eq!(outputs[0]["name"], "top-100.csv", "{summary}");
    let url = outputs[0]["url"].as_str().unwrap_or_else(|| panic!("a download link: {summary}"));
    let csv = reqwest::get(url).await.unwrap();
    assert!(csv.status().is_success(), "the link downloads: {}", csv.status());
    let csv = csv.text().await.unwrap();
    assert_eq!(outputs[0]["size"], csv.len(), "{summary}");
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.get(1), Some(&"the,36"), "the most frequent word first: {csv}");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn wordfreq_is_invoked_under_cargo_lambda_watch_and_reports_to_reeve(pool: PgPool) {
    let watch = Watch::start(EVERY).await;
    let catalog = common::catalog_text_with("");
    let (api, report_url) = served(&pool, &catalog).await;
    let worker = worker(&pool, &catalog, &report_url, &[], Some(&watch.url)).await;
    let upload_id = upload(&api, &pool, &text()).await;
    let id = api.create("wordfreq", json!({ "upload_id": upload_id })).await;

    // cargo lambda watch answers the Event invoke only once the function
    // ends (AWS answers 202 at once): the worker then finds the attempt
    // already ended by the function's own reports.
    run_next(&api, &worker).await;
    wait_for_end(&pool, id, Duration::from_secs(120)).await;
    assert_reported_progress(&events(&pool, id).await);
    assert_ended(&api, id).await;
    assert_files_linked_over_mcp(&pool, &catalog, &api.token, id).await;
    api.queue.delete().await;
}

/// An agent sees the CSV too: `get_result`, and `tasks/get` of the tasks
/// extension, answer it in `structuredContent` and as a `resource_link`
/// content block whose link downloads it (through the `mcp` Lambda's
/// handler, with the `events/` samples).
async fn assert_files_linked_over_mcp(pool: &PgPool, catalog: &str, token: &str, id: Id) {
    use crate::lambda_events::through_lambda;
    use crate::mcp::sample_event;
    let config = common::with_catalog(common::config(pool), catalog).with(settings::MCP_ALLOWED_HOSTS, "*");
    let sdk = reeve_shared::startup::sdk().await;
    let router =
        reeve_shared::mcp::router(reeve_shared::startup::mcp(&config, &sdk).await.unwrap_or_else(|e| panic!("{e}")));
    let get_result = sample_event("mcp-tools-call-task", Some(token), |params| {
        params["name"] = json!("get_result");
        params["arguments"] = json!({ "task_id": id.to_string() });
    });
    let tasks_get = sample_event("mcp-tasks-get", Some(token), |params| params["taskId"] = json!(id.to_string()));
    let answered = through_lambda(router.clone(), &get_result).await.body;
    let got = through_lambda(router, &tasks_get).await.body;
    for (what, result) in [("get_result", &answered["result"]), ("tasks/get", &got["result"]["result"])] {
        assert_ne!(result["isError"], true, "{what}: {result}");
        let listed = &result["structuredContent"]["result"]["outputs"][0];
        assert_eq!(listed["name"], "top-100.csv", "{what}: {result}");
        let content = result["content"].as_array().unwrap();
        assert_eq!(content[0]["type"], "text", "{what}: the structured content's JSON first: {result}");
        let links: Vec<&Value> = content.iter().filter(|c| c["type"] == "resource_link").collect();
        assert_eq!(links.len(), 1, "{what}: one link per file: {result}");
        let link = links[0];
        assert_eq!(
            (&link["name"], &link["mimeType"], &link["size"]),
            (&listed["name"], &json!("text/csv"), &listed["size"])
        );
        let csv = reqwest::get(link["uri"].as_str().unwrap()).await.unwrap();
        assert!(csv.status().is_success(), "{what}: the link downloads: {}", csv.status());
        assert!(csv.text().await.unwrap().starts_with("word,count\nthe,36\n"), "{what}");
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_python_service_is_sold_as_an_http_protocol_kind(pool: PgPool) {
    let secret = python_secret();
    let service = PythonService::start(&secret, &["--report-every", &EVERY.to_string()]).await;
    let catalog = python_catalog(&service.endpoint);
    let (api, report_url) = served(&pool, &catalog).await;
    let worker = worker(&pool, &catalog, &report_url, &[("WORDFREQ_SECRET", &secret)], None).await;
    let upload_id = upload(&api, &pool, &text()).await;
    let id = api.create("wordfreq-py", json!({ "upload_id": upload_id })).await;

    // The service answers 202 and works on: the worker is done with it.
    run_next(&api, &worker).await;
    wait_for_end(&pool, id, Duration::from_secs(60)).await;
    assert_reported_progress(&events(&pool, id).await);
    assert_ended(&api, id).await;
    drop(service);
    api.queue.delete().await;
}

fn python_secret() -> String {
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([9u8; 32]))
}

/// The Python service at `endpoint`, sold as `wordfreq-py`.
fn python_catalog(endpoint: &str) -> String {
    common::catalog_text_with(&format!(
        r#"
        [tasks.wordfreq-py]
        title = "Word frequencies (Python)"
        description = "tests/executors/service.py, an http protocol kind."
        executor = "http"
        endpoint = "{endpoint}"
        protocol = 1
        secret = "WORDFREQ_SECRET"
        timeout_seconds = 300
        input_schema = {{ type = "object", required = ["upload_id"] }}
        "#
    ))
}

/// The sweeper as its Lambda builds it, on this database and the API's queue.
async fn sweeper(pool: &PgPool, api: &Api, catalog: &str) -> reeve_shared::sweeper::Sweeper {
    let config = common::with_catalog(common::config(pool), catalog).with(settings::QUEUE_URL, &api.queue.url);
    reeve_shared::startup::sweeper(&config, &reeve_shared::startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"))
}

/// The buyer cancels while the service works on alone (it answered 202):
/// a sweep finds the cancel owed and sends the task's message, the worker
/// that gets it sends the service its signed cancel, and the service stops
/// at its next line, its heartbeat answered `409 canceled`: the task ends
/// `canceled` in seconds, long before its text is read, with no result.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_buyer_s_cancel_reaches_the_python_service_signed_and_stops_its_job(pool: PgPool) {
    let secret = python_secret();
    // A second a line (12 s in all), and no report between "reading" and
    // the end: only the signed cancel can stop it early.
    let service = PythonService::start(&secret, &["--report-every", "1000", "--line-delay", "1"]).await;
    let catalog = python_catalog(&service.endpoint);
    let (api, report_url) = served(&pool, &catalog).await;
    let worker = worker(&pool, &catalog, &report_url, &[("WORDFREQ_SECRET", &secret)], None).await;
    let sweeper = sweeper(&pool, &api, &catalog).await;
    let upload_id = upload(&api, &pool, &text()).await;
    let id = api.create("wordfreq-py", json!({ "upload_id": upload_id })).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done, "accepted: the service works on alone");
    common::wait_until("the service starts reading", Duration::from_secs(20), || async {
        events(&pool, id).await.iter().any(|(t, d)| t == "progress" && d["message"] == "reading")
    })
    .await;

    let canceled_at = Instant::now();
    let reply =
        send(&api.app, common::post_json(&format!("/v1/tasks/{id}/cancel"), Some(&api.token), &json!({}))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "asked: its service holds it: {}", reply.body);
    let mut report = reeve_shared::sweeper::SweepReport::default();
    sweeper.sweep_lapsed(&mut report).await.unwrap();
    assert_eq!(report.cancels, 1, "{report:?}");
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    common::wait_until("the task ends canceled", Duration::from_secs(15), || async {
        task(&pool, id).await.0 == "canceled"
    })
    .await;
    assert!(canceled_at.elapsed() < Duration::from_secs(9), "stopped mid-way: {:?}", canceled_at.elapsed());
    common::wait_until("the service says it stopped", Duration::from_secs(5), || async {
        service.said().contains(&format!("canceled {id} 1"))
    })
    .await;
    let events = events(&pool, id).await;
    assert!(!events.iter().any(|(t, _)| t == "result"), "no result: {events:?}");
    assert!(!events.iter().any(|(_, d)| d["fraction"] == 1.0), "never read to the end: {events:?}");

    // Told once: the next sweep owes it nothing.
    let mut again = reeve_shared::sweeper::SweepReport::default();
    sweeper.sweep_lapsed(&mut again).await.unwrap();
    assert_eq!(again.cancels, 0, "{again:?}");
    drop(service);
    api.queue.delete().await;
}

/// The payer's funds: 1 test USDC.
const FUNDS: u128 = 1_000_000;
/// A ceiling of 5 lines at wordfreq-metered's rate, for `wordfreq-capped`.
const CAPPED_LINES: u128 = 5;

/// `wordfreq-metered` as reeve.dev.toml sells it (x402 `upto`, per line),
/// paid by the x402 Python SDK's `upto` client on the local chain, through
/// the Invoke API of `cargo lambda watch` and the report route: a run is
/// charged exactly the lines the function reported × the rate, captured
/// once it ends; the same function sold with a ceiling below what it reads
/// is charged the ceiling; and a run that fails (its input was never
/// written, so the function cannot read it) is charged nothing. Every
/// transfer on the chain is one task's charge.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn wordfreq_metered_is_charged_the_lines_it_read_and_nothing_when_it_fails(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let watch = Watch::start(EVERY).await;
    let pay_to = fresh_address();
    let facilitator = std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into());
    // The development catalog as it ships, paying a fresh address (so every
    // transfer to it is this test's), and the same kind with a low ceiling.
    let shipped = common::catalog_text_with(&format!(
        r#"
        [tasks.wordfreq-capped]
        title = "Word frequencies, at most {CAPPED_LINES} lines paid"
        description = "examples/wordfreq, metered with a ceiling below what it reads."
        executor = "lambda"
        function = "wordfreq"
        asynchronous = true
        timeout_seconds = 300
        input_schema = {{ type = "object", required = ["upload_id"] }}
        [[tasks.wordfreq-capped.accepts]]
        asset = "usdc-base-sepolia"
        scheme = "upto"
        unit = "line"
        rate_usd = "0.00001"
        amount_usd = "0.00005"
        "#
    ));
    let dev_pay_to = shipped.lines().find(|l| l.starts_with("pay_to = ")).unwrap().to_owned();
    let dev_facilitator = shipped.lines().find(|l| l.starts_with("facilitator_url = ")).unwrap().to_owned();
    let catalog = shipped.replacen(&dev_pay_to, &format!("pay_to = \"{pay_to}\""), 1).replacen(
        &dev_facilitator,
        &format!("facilitator_url = \"{facilitator}\""),
        1,
    );
    let rpc = common::chain::chain_rpc_urls();
    let chain_rpc = [(reeve_shared::payments::CHAIN_RPC_URLS, rpc.as_str())];
    let (api, report_url) = served_with(&pool, &catalog, &chain_rpc).await;
    let worker = worker(&pool, &catalog, &report_url, &chain_rpc, Some(&watch.url)).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;

    // The catalog's price: 0.00001 USD a line is 10 atomic units of the
    // 6-decimal token, up to 0.05 USD (5,000 lines).
    let listed = send(&api.app, common::get("/v1/catalog")).await.body;
    let price = |kind: &str| {
        listed["tasks"].as_array().unwrap().iter().find(|t| t["kind"] == kind).unwrap()["prices"][0].clone()
    };
    let metered = price("wordfreq-metered");
    assert_eq!((&metered["scheme"], &metered["unit"]), (&json!("upto"), &json!("line")), "{metered}");
    let rate: u128 = metered["rate"].as_str().unwrap().parse().unwrap();
    assert_eq!(rate, 10, "{metered}");
    assert_eq!(price("wordfreq-capped")["amount"], (CAPPED_LINES * rate).to_string());

    let lines = text().lines().count() as u128;
    let mut charged = 0;
    for (kind, expected) in [("wordfreq-metered", lines * rate), ("wordfreq-capped", CAPPED_LINES * rate)] {
        let upload_id = upload(&api, &pool, &text()).await;
        let id = paid_create(&api, &payer, kind, &upload_id).await;
        run_paid(&api, &worker, &pool, id).await;
        let task = send(&api.app, get_authed(&format!("/v1/tasks/{id}"), &api.token)).await.body;
        assert_eq!(task["status"], "completed", "{kind}: {task}");
        assert_eq!(task["result"]["lines"], 12, "{kind}: {task}");
        assert_eq!(task["result"]["outputs"][0]["name"], "top-100.csv", "{kind}: {task}");
        let payment = &task["payment"];
        assert_eq!(payment["status"], "charged", "{kind}: {task}");
        assert_eq!(payment["charged"], expected.to_string(), "{kind}: the lines read × the rate, at most the ceiling");
        assert_eq!(payment["used"], (expected / rate) as u64, "{kind}: {task}");
        charged += expected;
        assert_eq!(balance(&payer.address).await, FUNDS - charged, "{kind}: the payer paid exactly that");
        assert_eq!(balance(&pay_to).await, charged, "{kind}: payTo got the same");
    }
    assert_eq!(charges_to(&pay_to).await.len(), 2, "one transfer per task");

    // Its input is gone from storage: the function cannot read it and fails
    // the task for good; the authorization is released, nothing moves.
    // (Create checks the object is there: it goes between create and run.)
    let gone = upload(&api, &pool, &text()).await;
    let id = paid_create(&api, &payer, "wordfreq-metered", &gone).await;
    let key: String = sqlx::query_scalar("SELECT key FROM uploads WHERE id = $1")
        .bind(gone.parse::<Id>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    common::s3().await.delete_object().bucket(common::bucket()).key(&key).send().await.unwrap();
    run_paid(&api, &worker, &pool, id).await;
    let task = send(&api.app, get_authed(&format!("/v1/tasks/{id}"), &api.token)).await.body;
    assert_eq!(task["status"], "failed", "{task}");
    assert_eq!(task["payment"]["status"], "released", "{task}");
    assert_eq!(task["payment"]["charged"], "0", "{task}");
    assert_eq!(balance(&payer.address).await, FUNDS - charged, "a failure costs nothing");
    assert_eq!(charges_to(&pay_to).await.len(), 2, "no transfer for the failure");
    crate::metered::assert_books_balance(&pool, &pay_to).await;
    api.queue.delete().await;
}

/// Creates a `kind` task on `upload_id`, paying its 402 with the payer's
/// x402 Python SDK `upto` client: authorized up to the ceiling, nothing
/// moved yet. Its id.
async fn paid_create(api: &Api, payer: &Payer, kind: &str, upload_id: &str) -> Id {
    let body = json!({ "input": { "upload_id": upload_id } });
    let path = format!("/v1/tasks/{kind}");
    let unpaid = send(&api.app, post_json(&path, Some(&api.token), &body)).await;
    assert_eq!(unpaid.status, StatusCode::PAYMENT_REQUIRED, "{}", unpaid.body);
    let challenge = unpaid.headers["payment-required"].to_str().unwrap();
    let signature = payer.sign(challenge).await;
    let mut request = post_json(&path, Some(&api.token), &body);
    request.headers_mut().insert("payment-signature", signature.parse().unwrap());
    let reply = send(&api.app, request).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_eq!(reply.body["payment"]["status"], "authorized", "{}", reply.body);
    reply.body["id"].as_str().unwrap().parse().unwrap()
}

/// Runs a paid service task to its end: the job to the function, then, for
/// a result, the worker's capture the report route queued (the task stays
/// `running` while its result is held for it).
async fn run_paid(api: &Api, worker: &WorkerContext, pool: &PgPool, id: Id) {
    run_next(api, worker).await;
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, _, _) = task(pool, id).await;
        if status != "running" && status != "queued" {
            return;
        }
        for message in api.queue.drain().await {
            let _ = process(worker, &message.to_string(), 1).await;
        }
        assert!(Instant::now() < until, "task {id} is still {status} after 120 s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An answer of the stand-in: its status, headers and JSON body.
type Answer = (u16, Vec<(&'static str, &'static str)>, Value);
/// A call it received: the function, `X-Amz-Invocation-Type`, the event.
type Call = (String, Option<String>, Value);

/// What the stand-in Invoke endpoint answers, and the events it received.
#[derive(Clone, Default)]
struct Invoke {
    answer: Arc<Mutex<Option<Answer>>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Invoke {
    async fn start() -> (Invoke, String) {
        let invoke = Invoke::default();
        let app = Router::new()
            .route("/2015-03-31/functions/{function}/invocations", post(invoked))
            .with_state(invoke.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (invoke, format!("http://{addr}"))
    }

    fn answer(&self, status: u16, headers: &[(&'static str, &'static str)], body: Value) {
        *self.answer.lock().unwrap() = Some((status, headers.to_vec(), body));
    }
}

async fn invoked(
    axum::extract::State(invoke): axum::extract::State<Invoke>,
    axum::extract::Path(function): axum::extract::Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let kind = headers.get("x-amz-invocation-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
    invoke.calls.lock().unwrap().push((function, kind, serde_json::from_slice(&body).unwrap_or(Value::Null)));
    let (status, headers, body) = invoke.answer.lock().unwrap().clone().expect("an answer is set");
    let mut response = (StatusCode::from_u16(status).unwrap(), body.to_string()).into_response();
    for (name, value) in headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

fn lambda_catalog(kinds: &[(&str, &str, bool)]) -> String {
    let mut extra = String::new();
    for (kind, function, asynchronous) in kinds {
        extra.push_str(&format!(
            r#"
            [tasks.{kind}]
            title = "A function"
            description = "An operator's Lambda function."
            executor = "lambda"
            function = "{function}"
            asynchronous = {asynchronous}
            timeout_seconds = 60
            input_schema = {{ type = "object" }}
            "#
        ));
    }
    common::catalog_text_with(&extra)
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn invoke_answers_complete_retry_or_fail_as_documented(pool: PgPool) {
    let (invoke, url) = Invoke::start().await;
    let catalog = lambda_catalog(&[("sync", "secret-sync-fn", false), ("event", "secret-event-fn", true)]);
    let (api, report_url) = served(&pool, &catalog).await;
    let worker = worker(&pool, &catalog, &report_url, &[], Some(&url)).await;
    let not_found = [("x-amzn-errortype", "ResourceNotFoundException")];
    let throttled = [("x-amzn-errortype", "TooManyRequestsException"), ("retry-after", "3")];
    let crashed = [("x-amz-function-error", "Unhandled")];

    // Synchronous: the payload is the result, the job the event.
    invoke.answer(200, &[], json!({ "answer": 42 }));
    let id = api.create("sync", json!({ "n": 1 })).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    assert_eq!(task(&pool, id).await.0, "completed");
    let result = sqlx::query_scalar::<_, sqlx::types::Json<Value>>("SELECT result FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(result.0, json!({ "answer": 42 }));
    let (function, kind, job) = invoke.calls.lock().unwrap().last().cloned().unwrap();
    assert_eq!((function.as_str(), kind.as_deref()), ("secret-sync-fn", Some("RequestResponse")));
    assert_eq!(job["type"], "job");
    assert_eq!(job["protocol"], 1);
    assert_eq!(job["task"]["id"], id.to_string());
    assert_eq!(job["input"], json!({ "n": 1 }));
    assert_eq!(job["report"]["url"], report_url);

    // Asynchronous: 202 delegates the attempt; it stays running under its lease.
    invoke.answer(202, &[], Value::Null);
    let id = api.create("event", json!({})).await;
    run_next(&api, &worker).await;
    let (_, kind, _) = invoke.calls.lock().unwrap().last().cloned().unwrap();
    assert_eq!(kind.as_deref(), Some("Event"));
    assert_eq!(task(&pool, id).await.0, "running", "accepted: the function reports on its own");

    // Its buyer cancels: a sweep sends its message, and the worker that
    // gets it invokes the function with the cancel, as an Event, once.
    let reply =
        send(&api.app, common::post_json(&format!("/v1/tasks/{id}/cancel"), Some(&api.token), &json!({}))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let sweeper = sweeper(&pool, &api, &catalog).await;
    let mut report = reeve_shared::sweeper::SweepReport::default();
    sweeper.sweep_lapsed(&mut report).await.unwrap();
    assert_eq!(report.cancels, 1, "{report:?}");
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    let (function, kind, cancel) = invoke.calls.lock().unwrap().last().cloned().unwrap();
    assert_eq!((function.as_str(), kind.as_deref()), ("secret-event-fn", Some("Event")));
    assert_eq!(cancel["type"], "cancel", "{cancel}");
    assert_eq!(cancel["protocol"], 1, "{cancel}");
    assert_eq!((&cancel["task"]["id"], &cancel["task"]["kind"]), (&json!(id.to_string()), &json!("event")));
    assert_eq!(cancel["task"]["attempt"], 1, "{cancel}");
    assert!(cancel["task"]["deadline"].is_string(), "{cancel}");
    assert_eq!(task(&pool, id).await.0, "running", "the function's next report ends it (409 canceled)");
    sweeper.sweep_lapsed(&mut report).await.unwrap();
    assert_eq!(report.cancels, 1, "told once: {report:?}");

    // A crash and a throttle are tried again (a throttle after the wait
    // Lambda asks); neither fails the task.
    let cases = [
        ("sync", 200, &crashed[..], json!({ "errorMessage": "boom", "errorType": "Panic" }), None),
        ("event", 429, &throttled[..], json!({ "Type": "User", "message": "Rate exceeded" }), Some(3)),
    ];
    for (kind, status_code, headers, body, after) in cases {
        invoke.answer(status_code, headers, body);
        let id = api.create(kind, json!({})).await;
        let outcome = run_next(&api, &worker).await;
        assert!(outcome.is_retry(), "{kind} {status_code}: {outcome:?}");
        if let (Outcome::Retry(retry), Some(after)) = (&outcome, after) {
            assert_eq!(retry.after, Some(Duration::from_secs(after)), "{kind}");
        }
        let (status, attempts, _) = task(&pool, id).await;
        assert_eq!((status.as_str(), attempts), ("queued", 1), "{kind} {status_code}");
    }

    // A missing function fails the task for good, naming no function.
    invoke.answer(404, &not_found, json!({ "Type": "User", "message": "Function not found: secret-event-fn" }));
    let id = api.create("event", json!({})).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Failed("executor_unavailable"));
    let (status, _, error) = task(&pool, id).await;
    assert_eq!(status, "failed");
    let error = error.unwrap();
    assert_eq!(error["code"], "executor_unavailable", "{error}");
    let shown = serde_json::to_string(&events(&pool, id).await).unwrap();
    assert!(!shown.contains("secret-"), "the buyer's events name no function: {shown}");
    api.queue.delete().await;
}

/// `reeve serve` runs a `lambda` kind with its own worker: start-up gives
/// that worker the Invoke client, on the endpoint the SDK's configuration
/// names for Lambda (`AWS_ENDPOINT_URL_LAMBDA`; here the stand-in's).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn reeve_serve_s_worker_invokes_a_lambda_kind(pool: PgPool) {
    let (invoke, url) = Invoke::start().await;
    invoke.answer(200, &[], json!({ "answer": 7 }));
    let catalog = lambda_catalog(&[("sync", "served-fn", false)]);
    let api = Api::new(&pool, &catalog).await;
    let config = common::with_catalog(common::config(&pool), &catalog)
        .with(settings::QUEUE_URL, &api.queue.url)
        .with(settings::REPORT_URL, "http://127.0.0.1:9/v1/executor/reports");
    let sdk = reeve_shared::startup::sdk().await.into_builder().service_config(LambdaAt(url)).build();
    let served = reeve_shared::startup::serve(&config, &sdk, true).await.unwrap_or_else(|e| panic!("{e}"));
    let worker = served.worker.expect("reeve serve runs a worker");

    let id = api.create("sync", json!({ "n": 7 })).await;
    assert_eq!(run_next(&api, &worker).await, Outcome::Done);
    assert_eq!(task(&pool, id).await.0, "completed");
    let (function, kind, job) = invoke.calls.lock().unwrap().last().cloned().expect("the function was invoked");
    assert_eq!((function.as_str(), kind.as_deref()), ("served-fn", Some("RequestResponse")));
    assert_eq!(job["input"], json!({ "n": 7 }));
    api.queue.delete().await;
}

/// The SDK's service configuration as the environment gives it
/// (`AWS_ENDPOINT_URL_<SERVICE>`: the stack's S3 and SQS), with Lambda's
/// endpoint at `.0`.
#[derive(Debug)]
struct LambdaAt(String);

impl aws_types::service_config::LoadServiceConfig for LambdaAt {
    fn load_config(&self, key: aws_types::service_config::ServiceConfigKey<'_>) -> Option<String> {
        if key.service_id() == "Lambda" && key.profile() == "endpoint_url" {
            return Some(self.0.clone());
        }
        std::env::var(format!("{}_{}", key.env(), key.service_id().to_uppercase().replace(' ', "_"))).ok()
    }
}
