//! Metered tasks (x402 `upto`) against the real local payment stack:
//! Permit2 and x402's upto proxy on anvil, the @x402 facilitator, and the
//! official Python SDK's upto client as the payer (the TypeScript one too,
//! once). A metered task is authorized up to its ceiling at create, charged
//! what it used when it ends, and charged nothing when it fails; every
//! balance is read from the chain.
//!
//! Each test pays from a fresh key to a fresh `payTo`, and ends with
//! [`assert_books_balance`]: every transfer to `payTo` is one metered task's
//! capture, of exactly what that task was charged.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use base64::Engine;
use common::chain::{
    ChainLock, Client, OwnFacilitator, PERMIT2, Payer, allowance, balance, charges_to, eth_balance, fresh_address,
};
use common::{Reply, TestQueue, get_authed, new_session, post_json, send};
use reeve_shared::http::app;
use reeve_shared::ids::Id;
use reeve_shared::payments::CHAIN_RPC_URLS;
use reeve_shared::settings::{self, Config};
use reeve_shared::tasks::events_after;
use reeve_shared::worker::{Outcome, WorkerContext, process};
use serde_json::{Value, json};
use sqlx::PgPool;

/// 7 atomic units (0.000007 test USDC) per KiB downloaded.
pub(crate) const RATE: u128 = 7;
/// At most 0.001 test USDC per task: 142 KiB and a bit.
pub(crate) const CEILING: u128 = 1_000;
pub(crate) const FUNDS: u128 = 1_000_000;

/// The queue window of the tests that wait for a signed deadline to pass:
/// short, so they wait little, but 6 s above the 10 s the create requires,
/// so a payer signing on a busy machine (a Python process per signature)
/// is not refused `deadline_too_short` first (2 s above was, under CI load).
pub(crate) const SHORT_QUEUE: u32 = 16;

pub(crate) fn decode(header: &str) -> Value {
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap()
}

pub(crate) fn encode(v: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(v.to_string())
}

/// `metered`: a fetch charged per KiB with a ceiling; `brief` and `short`:
/// the same with a timeout of one and eight seconds, whose authorizations
/// are asked to last `queue_seconds` of queue more than they need;
/// `hashed`: an upload's SHA-256 (`digest`), charged per KiB.
pub(crate) fn catalog(pay_to: &str, queue_seconds: u32, facilitator: &str) -> String {
    let kind = |kind: &str, timeout: u32| {
        format!(
            r#"
            [tasks.{kind}]
            title = "Metered fetch"
            description = "Fetch a URL, paid per KiB"
            executor = "fetch"
            timeout_seconds = {timeout}
            [tasks.{kind}.input_schema]
            type = "object"
            required = ["url"]
            [tasks.{kind}.input_schema.properties.url]
            type = "string"
            [[tasks.{kind}.accepts]]
            asset = "local"
            scheme = "upto"
            unit = "KiB"
            rate = "{RATE}"
            amount = "{CEILING}"
            "#
        )
    };
    let hashed = format!(
        r#"
        [tasks.hashed]
        title = "Metered digest"
        description = "SHA-256 of an upload, paid per KiB"
        executor = "digest"
        timeout_seconds = 30
        [tasks.hashed.input_schema]
        type = "object"
        required = ["upload_id"]
        [tasks.hashed.input_schema.properties.upload_id]
        type = "string"
        [[tasks.hashed.accepts]]
        asset = "local"
        scheme = "upto"
        unit = "KiB"
        rate = "{RATE}"
        amount = "{CEILING}"
        "#
    );
    let tasks = format!("{}\n{}\n{}\n{hashed}", kind("metered", 60), kind("brief", 1), kind("short", 8));
    common::paid_catalog_text(pay_to, facilitator, 300, &tasks).replace(
        "max_timeout_seconds = 300",
        &format!("max_timeout_seconds = 300\nmetered_queue_seconds = {queue_seconds}"),
    )
}

pub(crate) struct Shop {
    pub(crate) app: Router,
    pub(crate) token: String,
    pub(crate) pay_to: String,
    pub(crate) queue: TestQueue,
    pub(crate) pool: PgPool,
    pub(crate) config: Config,
}

impl Shop {
    pub(crate) async fn new(pool: &PgPool) -> Shop {
        Self::queueing(pool, 600).await
    }

    pub(crate) async fn queueing(pool: &PgPool, queue_seconds: u32) -> Shop {
        let facilitator = std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into());
        Self::settling_through(pool, queue_seconds, &facilitator).await
    }

    pub(crate) async fn settling_through(pool: &PgPool, queue_seconds: u32, facilitator: &str) -> Shop {
        let pay_to = fresh_address();
        let queue = TestQueue::new().await;
        let config = common::with_catalog(common::config(pool), &catalog(&pay_to, queue_seconds, facilitator))
            .with(settings::QUEUE_URL, &queue.url)
            .with(CHAIN_RPC_URLS, common::chain::chain_rpc_urls());
        let app = app(common::api(&config).await);
        let token = new_session(&app).await.1;
        Shop { app, token, pay_to, queue, pool: pool.clone(), config }
    }

    pub(crate) async fn worker(&self) -> WorkerContext {
        let config = self.config.clone().without(settings::QUEUE_URL).with(settings::WORKER_CONCURRENCY, "1");
        common::worker(&common::loopback_outbound(config)).await
    }

    pub(crate) async fn create(&self, kind: &str, input: &Value, payment: Option<&str>) -> Reply {
        let mut request = post_json(&format!("/v1/tasks/{kind}"), Some(&self.token), &json!({ "input": input }));
        if let Some(p) = payment {
            request.headers_mut().insert("payment-signature", p.parse().unwrap());
        }
        send(&self.app, request).await
    }

    /// The challenge header of a 402 for `kind`.
    pub(crate) async fn challenge(&self, kind: &str) -> String {
        let reply = self.create(kind, &json!({"url": "http://127.0.0.1:1/"}), None).await;
        assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
        reply.headers["payment-required"].to_str().unwrap().to_owned()
    }

    pub(crate) async fn task(&self, id: Id) -> Value {
        let reply = send(&self.app, get_authed(&format!("/v1/tasks/{id}"), &self.token)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.body
    }

    pub(crate) async fn run(&self, worker: &WorkerContext, id: Id) -> Outcome {
        self.delivery(worker, id, 1).await
    }

    /// The queue's `receive_count`th delivery of the task's message.
    pub(crate) async fn delivery(&self, worker: &WorkerContext, id: Id, receive_count: u32) -> Outcome {
        process(worker, &json!({"task_id": id, "kind": "metered"}).to_string(), receive_count).await
    }

    pub(crate) async fn tasks(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&self.pool).await.unwrap()
    }

    pub(crate) async fn attempt(&self, id: Id) -> (String, Option<String>) {
        sqlx::query_as("SELECT status, reason FROM payment_attempts WHERE task_id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub(crate) async fn done(self) {
        self.queue.delete().await;
    }
}

pub(crate) async fn events(pool: &PgPool, id: Id) -> Vec<reeve_shared::tasks::Event> {
    events_after(&mut pool.acquire().await.unwrap(), id, 0).await.unwrap()
}

pub(crate) fn id_of(reply: &Reply) -> Id {
    reply.body["id"].as_str().unwrap_or_else(|| panic!("no id in {}", reply.body)).parse().unwrap()
}

/// Serves `bytes` bytes at `/file` on a loopback port of its own.
pub(crate) async fn file_of(bytes: usize) -> SocketAddr {
    counted_file_of(bytes).await.0
}

/// [`file_of`], and how many times the file was asked for.
pub(crate) async fn counted_file_of(bytes: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let body = vec![b'r'; bytes];
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let router = Router::new().route(
        "/file",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            async move { body }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, asked)
}

/// Where `fetch` stores task `id`'s output.
pub(crate) async fn output_of(pool: &PgPool, id: Id) -> String {
    let space: Vec<u8> =
        sqlx::query_scalar("SELECT space_idx FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap();
    reeve_shared::tasks::output_key(&reeve_shared::auth::SpaceIndex::from_slice(&space).unwrap(), id)
}

pub(crate) async fn stored(worker: &WorkerContext, key: &str) -> bool {
    worker.exec.s3.head_object().bucket(&worker.exec.bucket).key(key).send().await.is_ok()
}

/// Every transfer to `pay_to` is one metered task's capture: one payment
/// row naming it, of the same amount, whose task shows it charged.
pub(crate) async fn assert_books_balance(pool: &PgPool, pay_to: &str) {
    let charges = charges_to(pay_to).await;
    for charge in &charges {
        let rows: Vec<(Id, String)> =
            sqlx::query_as("SELECT task_id, amount FROM payments WHERE lower(transaction) = $1 AND lower(pay_to) = $2")
                .bind(&charge.transaction)
                .bind(pay_to.to_ascii_lowercase())
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(rows.len(), 1, "{charge:?}: exactly one task");
        let (task, amount) = &rows[0];
        assert_eq!(amount, &charge.value.to_string(), "{charge:?}");
        let shown: sqlx::types::Json<Value> =
            sqlx::query_scalar("SELECT payment FROM tasks WHERE id = $1").bind(task).fetch_one(pool).await.unwrap();
        assert_eq!(shown["status"], "charged", "{charge:?}: {}", shown.0);
        assert_eq!(shown["charged"], charge.value.to_string(), "{charge:?}: the amount that task used");
        assert_eq!(shown["transaction"], charge.transaction.as_str());
    }
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM payments WHERE lower(pay_to) = $1")
        .bind(pay_to.to_ascii_lowercase())
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(recorded, charges.len() as i64, "no payment recorded without its transfer");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_metered_fetch_is_charged_exactly_what_it_downloaded_once_it_ends(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = file_of(5 * 1024).await;

    let challenge = shop.challenge("metered").await;
    let offered = decode(&challenge);
    let accepts = offered["accepts"].as_array().unwrap();
    assert_eq!(accepts.len(), 1, "{offered}");
    assert_eq!(accepts[0]["scheme"], "upto");
    assert_eq!(accepts[0]["amount"], CEILING.to_string(), "the ceiling is asked for");
    assert_eq!(accepts[0]["maxTimeoutSeconds"], 600 + 60 + 30, "queue, timeout and settle");
    assert!(accepts[0]["extra"]["facilitatorAddress"].as_str().is_some_and(|a| a.len() == 42), "{offered}");
    assert!(offered["extensions"]["eip2612GasSponsoring"].is_object(), "{offered}");
    assert!(offered["resource"]["description"].as_str().unwrap().contains("up to"), "{offered}");
    let catalog = send(&shop.app, common::get("/v1/catalog")).await.body;
    let price = &catalog["tasks"].as_array().unwrap().iter().find(|t| t["kind"] == "metered").unwrap()["prices"][0];
    assert_eq!((&price["scheme"], &price["unit"], &price["rate"]), (&json!("upto"), &json!("KiB"), &json!("7")));
    assert!(price["summary"].as_str().unwrap().starts_with("up to 1000 atomic units"), "{price}");

    let signature = payer.sign(&challenge).await;
    assert_eq!(decode(&signature)["accepted"]["scheme"], "upto");
    let reply = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert!(!reply.headers.contains_key("payment-response"), "nothing was settled at create");
    let id = id_of(&reply);
    assert_eq!(reply.body["payment"]["status"], "authorized", "{}", reply.body);
    assert_eq!(reply.body["payment"]["authorized"], CEILING.to_string());
    assert_eq!(balance(&payer.address).await, FUNDS, "nothing moves at create");
    assert_eq!(shop.queue.drain().await.len(), 1, "queued");

    let worker = shop.worker().await;
    assert_eq!(shop.run(&worker, id).await, Outcome::Done);
    let task = shop.task(id).await;
    assert_eq!(task["status"], "completed", "{task}");
    let used = 5 * RATE;
    assert_eq!(balance(&payer.address).await, FUNDS - used, "the payer paid exactly size × rate");
    assert_eq!(balance(&shop.pay_to).await, used, "payTo got the same");
    let charges = charges_to(&shop.pay_to).await;
    assert_eq!(charges.len(), 1, "one Transfer");
    let payment = &task["payment"];
    assert_eq!(payment["status"], "charged", "{task}");
    assert_eq!(payment["charged"], used.to_string());
    assert_eq!(payment["used"], 5 * 1024);
    assert_eq!(payment["transaction"], charges[0].transaction.as_str());
    assert!(task["result"]["url"].is_string(), "delivered once captured: {task}");

    // The final event carries the receipt; the Space lists the payment.
    let events = events(&pool, id).await;
    let last = events.last().unwrap();
    assert_eq!((&last.data["status"], &last.data["payment"]["status"]), (&json!("completed"), &json!("charged")));
    let space = send(&shop.app, get_authed("/v1/space", &shop.token)).await.body;
    assert_eq!(space["payments"][0]["amount"], used.to_string(), "{space}");
    assert_eq!(space["credits"], json!([]));
    assert_eq!(shop.attempt(id).await.0, "settled");

    // The same signature again: the same task, never a second charge; for
    // another input, a replay.
    let again = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!((again.status, id_of(&again)), (StatusCode::ACCEPTED, id), "{}", again.body);
    let other = shop.create("metered", &json!({"url": format!("http://{site}/other")}), Some(&signature)).await;
    assert_eq!((other.status, other.code()), (StatusCode::PAYMENT_REQUIRED, "payment_replayed"), "{}", other.body);
    assert_eq!(shop.tasks().await, 1);
    assert_eq!(balance(&payer.address).await, FUNDS - used, "sending it again moves nothing");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// A Permit2 nonce is a uint256: `"0123"` and `"123"` are one nonce to the
/// chain. A signature that bought a task, resent with its nonce written
/// `"0…"`, once bought a second task in the same Space (issue 37); now it is
/// `400 invalid_payment` naming the nonce, from that Space and any other,
/// and so is every other number of the payment spelled any other way. The
/// one task runs and is charged once.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_permit2_nonce_with_a_leading_zero_buys_no_second_task_in_any_space(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = file_of(2 * 1024).await;
    let input = json!({"url": format!("http://{site}/file")});
    let signature = payer.sign(&shop.challenge("metered").await).await;
    let first = shop.create("metered", &input, Some(&signature)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let id = id_of(&first);

    let signed = decode(&signature);
    let at = |pointer: &str| signed.pointer(pointer).and_then(Value::as_str).unwrap().to_owned();
    let (nonce, deadline) = (at("/payload/permit2Authorization/nonce"), at("/payload/permit2Authorization/deadline"));
    let past_u256 = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
    let (_, other_token) = new_session(&shop.app).await;
    let spaces = [("the same Space", shop.token.as_str()), ("another Space", other_token.as_str())];
    let cases = [
        ("/payload/permit2Authorization/nonce", "permit2Authorization.nonce", format!("0{nonce}")),
        ("/payload/permit2Authorization/nonce", "permit2Authorization.nonce", format!("00{nonce}")),
        ("/payload/permit2Authorization/nonce", "permit2Authorization.nonce", format!("+{nonce}")),
        (
            "/payload/permit2Authorization/permitted/amount",
            "permit2Authorization.permitted.amount",
            format!("{CEILING:#x}"),
        ),
        ("/payload/permit2Authorization/deadline", "permit2Authorization.deadline", format!(" {deadline}")),
        (
            "/payload/permit2Authorization/witness/validAfter",
            "permit2Authorization.witness.validAfter",
            past_u256.into(),
        ),
        ("/accepted/amount", "accepted.amount", format!("0{CEILING}")),
    ];
    for (pointer, field, text) in cases {
        let mut payment = signed.clone();
        *payment.pointer_mut(pointer).unwrap() = json!(text);
        for (space, token) in spaces {
            let mut request = post_json("/v1/tasks/metered", Some(token), &json!({ "input": input }));
            request.headers_mut().insert("payment-signature", encode(&payment).parse().unwrap());
            let reply = send(&shop.app, request).await;
            assert_eq!(
                (reply.status, reply.code()),
                (StatusCode::BAD_REQUEST, "invalid_payment"),
                "{field} {text:?}, {space}"
            );
            let message = reply.body["error"]["message"].as_str().unwrap();
            assert!(message.starts_with(field), "{field} {text:?}, {space}: {message}");
        }
    }
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM payment_attempts").fetch_one(&pool).await.unwrap();
    assert_eq!((shop.tasks().await, attempts), (1, 1), "one signature, one attempt, one task");

    assert_eq!(shop.run(&shop.worker().await, id).await, Outcome::Done);
    assert_eq!(shop.task(id).await["payment"]["status"], "charged");
    assert_eq!(balance(&payer.address).await, FUNDS - 2 * RATE, "charged once, what the one task used");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// A task that uses more than its ceiling completes, and is charged exactly
/// the ceiling: it is not cut off.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn over_the_ceiling_a_task_completes_and_is_charged_exactly_the_ceiling(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = file_of(300 * 1024).await;
    let signature = payer.sign(&shop.challenge("metered").await).await;
    let reply = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    assert_eq!(shop.run(&shop.worker().await, id).await, Outcome::Done);
    let task = shop.task(id).await;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["result"]["size"], 300 * 1024, "the whole file, not cut off");
    assert_eq!(task["payment"]["charged"], CEILING.to_string(), "300 KiB × 7 is over the ceiling: {task}");
    assert_eq!(balance(&payer.address).await, FUNDS - CEILING);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// Failed, canceled before it ran: nothing moves, no credit, and the
/// authorization is recorded as released.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_failed_or_canceled_metered_task_costs_nothing_and_releases_its_authorization(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let worker = shop.worker().await;

    // Fails: nothing listens at the URL.
    let signature = payer.sign(&shop.challenge("metered").await).await;
    let failing = shop.create("metered", &json!({"url": "http://127.0.0.1:1/"}), Some(&signature)).await;
    assert_eq!(failing.status, StatusCode::ACCEPTED, "{}", failing.body);
    let failing = id_of(&failing);
    assert_eq!(shop.run(&worker, failing).await, Outcome::Failed("fetch_unreachable"));

    // Canceled while queued: never run.
    let signature = payer.sign(&shop.challenge("metered").await).await;
    let canceled = shop.create("metered", &json!({"url": "http://127.0.0.1:1/"}), Some(&signature)).await;
    let canceled = id_of(&canceled);
    let reply =
        send(&shop.app, post_json(&format!("/v1/tasks/{canceled}/cancel"), Some(&shop.token), &json!({}))).await;
    assert!(reply.status.is_success(), "{}", reply.body);

    for (id, status) in [(failing, "failed"), (canceled, "canceled")] {
        let task = shop.task(id).await;
        assert_eq!(task["status"], status, "{task}");
        assert_eq!(task["payment"]["status"], "released", "{task}");
        assert_eq!(task["payment"]["charged"], "0");
        assert_eq!(shop.attempt(id).await.0, "released");
        let events = events(&pool, id).await;
        assert_eq!(events.last().unwrap().data["payment"]["status"], "released", "the final event says so");
    }
    assert_eq!(balance(&payer.address).await, FUNDS, "nothing moved");
    assert!(charges_to(&shop.pay_to).await.is_empty(), "no transfer");
    let credits: i64 = sqlx::query_scalar("SELECT count(*) FROM credits").fetch_one(&pool).await.unwrap();
    assert_eq!(credits, 0, "no credit: nothing was paid");
    shop.done().await;
}

/// A task still queued when its authorization could no longer be settled
/// after a run is not started: `authorization_expired`, nothing charged.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_task_held_in_the_queue_past_its_authorization_fails_authorization_expired(pool: PgPool) {
    let chain = ChainLock::shared().await;
    // The payer signs now + SHORT_QUEUE of queue + 1 s of run + 30 s to
    // settle; the task waits past the queue window.
    let shop = Shop::queueing(&pool, SHORT_QUEUE).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = file_of(1024).await;
    let signature = payer.sign(&shop.challenge("brief").await).await;
    let reply = shop.create("brief", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    tokio::time::sleep(Duration::from_secs(u64::from(SHORT_QUEUE) + 2)).await;
    let worker = shop.worker().await;
    let outcome = process(&worker, &json!({"task_id": id, "kind": "brief"}).to_string(), 1).await;
    assert_eq!(outcome, Outcome::Failed("authorization_expired"));
    let task = shop.task(id).await;
    assert_eq!(
        (&task["error"]["code"], &task["payment"]["status"]),
        (&json!("authorization_expired"), &json!("released"))
    );
    assert_eq!(task["attempts"], 1, "claimed, and not run: {task}");
    assert_eq!(balance(&payer.address).await, FUNDS, "nothing charged");
    shop.done().await;
}

/// The facilitator cannot be reached when the run ends: the capture's
/// outcome is open, and the capture holds the task. It waits in the queue
/// with its run's result held, is not run again, and is not ended by the
/// retry limit, the sweeper or a cancel; once the facilitator is back, the
/// next delivery charges it once and delivers the held result.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_open_capture_holds_its_task_until_it_is_charged_once_without_running_it_again(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut facilitator = OwnFacilitator::start_on(port, Duration::from_secs(30)).await;
    let shop = Shop::settling_through(&pool, 600, &facilitator.url).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let (site, asked) = counted_file_of(5 * 1024).await;
    let signature = payer.sign(&shop.challenge("metered").await).await;
    let reply = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    let used = 5 * RATE;

    facilitator.stop();
    // Two deliveries at most: the second is the queue's last.
    let config = shop.config.clone().without(settings::QUEUE_URL).with(settings::MAX_RECEIVES, "2");
    let worker = common::worker(&common::loopback_outbound(config)).await;
    for delivery in [1, 2] {
        let outcome = shop.delivery(&worker, id, delivery).await;
        assert!(matches!(outcome, Outcome::Retry(_)), "delivery {delivery}: {outcome:?}");
        let task = shop.task(id).await;
        assert_eq!(task["status"], "queued", "delivery {delivery}, not retries_exhausted: {task}");
        assert_eq!(task["payment"]["status"], "capturing", "{task}");
        assert_eq!(task["payment"]["charged"], used.to_string(), "the amount is fixed: {task}");
        assert!(task["result"].is_null(), "nothing delivered before the capture: {task}");
        assert_eq!(shop.attempt(id).await.0, "capturing");
        assert_eq!(asked.load(Ordering::SeqCst), 1, "delivery {delivery}: the run is held, not run again");
    }

    // Its owner asks to cancel: too late, the payer may be charged already.
    let reply = send(&shop.app, post_json(&format!("/v1/tasks/{id}/cancel"), Some(&shop.token), &json!({}))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "a request, not a cancel: {}", reply.body);
    // Its message is lost. The sweeper sends it again, past the limit,
    // rather than failing it, and soon: not `older_than` (300 s) later, which
    // its authorization may not last.
    let sweeper = reeve_shared::startup::sweeper(
        &shop.config.clone().with(settings::SWEEP_OLDER_THAN, "300"),
        &reeve_shared::startup::sdk().await,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let report = sweeper.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!((report.exhausted, report.resent_queued), (0, 0), "just requeued, its message on its way: {report:?}");
    let silence = reeve_shared::sweeper::CAPTURE_SILENCE.as_secs_f64() + 1.0;
    sqlx::query("UPDATE tasks SET updated_at = now() - make_interval(secs => $2) WHERE id = $1")
        .bind(id)
        .bind(silence)
        .execute(&pool)
        .await
        .unwrap();
    // Even a sweep for lapsed leases only, which runs every few seconds.
    let mut report = Default::default();
    sweeper.sweep_lapsed(&mut report).await.unwrap();
    assert_eq!((report.exhausted, report.resent_queued), (0, 1), "{report:?}");
    assert_eq!(shop.queue.drain().await.len(), 2, "queued at create, and sent again by the sweep");
    assert_eq!(shop.task(id).await["status"], "queued");

    let _facilitator = OwnFacilitator::start_on(port, Duration::from_secs(30)).await;
    assert_eq!(shop.delivery(&worker, id, 1).await, Outcome::Done);
    let task = shop.task(id).await;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["result"]["size"], 5 * 1024, "the held result: {task}");
    assert!(task["result"]["url"].is_string(), "{task}");
    assert_eq!(task["payment"]["status"], "charged", "{task}");
    assert_eq!(task["payment"]["charged"], used.to_string());
    assert_eq!(asked.load(Ordering::SeqCst), 1, "fetched once in all");
    assert_eq!(balance(&payer.address).await, FUNDS - used, "charged once, exactly what was used");
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1);
    let events = events(&pool, id).await;
    assert!(
        events.iter().any(|e| e.data["line"].as_str().is_some_and(|l| l.contains("payment is being settled"))),
        "the log says why it waited: {events:?}"
    );
    assert_eq!(events.last().unwrap().data["payment"]["status"], "charged", "the final event has the receipt");
    // Another delivery changes nothing.
    assert_eq!(shop.delivery(&worker, id, 1).await, Outcome::Done);
    assert_eq!(balance(&payer.address).await, FUNDS - used);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// A capture that can never land (the facilitator never comes back) ends
/// once the chain is past the signed deadline (by the margin after which
/// the nonce decides): `payment_not_captured`,
/// nothing charged, the held output deleted. No capture waits for ever.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_capture_that_never_lands_ends_with_nothing_charged_once_its_deadline_passed(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let mut facilitator = OwnFacilitator::start(Duration::from_secs(30)).await;
    // A short authorization: SHORT_QUEUE of queue, 1 s of run, 30 s to
    // settle.
    let shop = Shop::settling_through(&pool, SHORT_QUEUE, &facilitator.url).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = file_of(2048).await;
    let signature = payer.sign(&shop.challenge("brief").await).await;
    let deadline: u64 = decode(&signature)["payload"]["permit2Authorization"]["deadline"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("a deadline in {}", decode(&signature)));
    let reply = shop.create("brief", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    facilitator.stop();

    let worker = shop.worker().await;
    let brief = json!({"task_id": id, "kind": "brief"}).to_string();
    assert!(matches!(process(&worker, &brief, 1).await, Outcome::Retry(_)));
    assert_eq!(shop.task(id).await["payment"]["status"], "capturing");
    assert!(stored(&worker, &output_of(&pool, id).await).await, "the run's output is stored, held");
    while common::chain::chain_time().await <= deadline + reeve_shared::payments::RESOLVE_MARGIN.as_secs() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(process(&worker, &brief, 2).await, Outcome::Failed("payment_not_captured"));
    let task = shop.task(id).await;
    assert_eq!(task["status"], "failed", "{task}");
    assert!(task["error"]["message"].as_str().unwrap().contains("expired"), "{task}");
    assert_eq!(
        (&task["payment"]["status"], &task["payment"]["reason"]),
        (&json!("not_captured"), &json!("authorization_expired")),
        "{task}"
    );
    let key = output_of(&pool, id).await;
    assert!(!stored(&worker, &key).await, "the output of an unpaid task is deleted: {key}");
    assert_eq!(balance(&payer.address).await, FUNDS, "nothing moved");
    assert!(charges_to(&shop.pay_to).await.is_empty());
    assert_eq!(shop.attempt(id).await, ("failed".into(), Some("authorization_expired".into())));
    shop.done().await;
}

/// A payer that never approved Permit2 and holds no gas pays through the
/// token's EIP-2612 permit the 402 offers.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payer_without_approval_pays_through_the_offered_permit(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    assert_eq!(eth_balance(&payer.address).await, 0);
    let site = file_of(3 * 1024).await;
    let signature = payer.sign(&shop.challenge("metered").await).await;
    assert!(decode(&signature)["extensions"]["eip2612GasSponsoring"]["info"]["signature"].is_string());
    let reply = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    assert_eq!(shop.run(&shop.worker().await, id).await, Outcome::Done);
    assert_eq!(balance(&payer.address).await, FUNDS - 3 * RATE);
    assert_eq!(allowance(&payer.address, PERMIT2).await, CEILING - 3 * RATE, "the permit approved the ceiling");
    assert_eq!(eth_balance(&payer.address).await, 0, "the payer spent no gas");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// Each bad metered payment is refused with its own code, and nothing is
/// stored.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn bad_metered_payments_are_refused_each_with_its_own_code(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let challenge = shop.challenge("metered").await;

    // Not approved, and sponsoring not taken up: the client signs Permit2
    // alone (the 402 as a client that ignores the extension sees it).
    let mut bare = decode(&challenge);
    bare["extensions"].as_object_mut().unwrap().remove("eip2612GasSponsoring");
    let unsponsored = payer.sign(&encode(&bare)).await;
    let reply = shop.create("metered", &input, Some(&unsponsored)).await;
    assert_eq!(
        (reply.status, reply.code()),
        (StatusCode::PAYMENT_REQUIRED, "permit2_approval_required"),
        "{}",
        reply.body
    );
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("approve(Permit2, max)") && message.contains("permit"), "says how: {message}");
    assert!(reply.headers.contains_key("payment-required"), "the challenge comes again");

    payer.approve_permit2(&chain, u128::MAX).await;
    let good = decode(&payer.sign(&challenge).await);
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        encode(&v)
    };
    let authorization = "/payload/permit2Authorization";
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let cases = [
        ("ceiling_too_low", edit(&|v| v.pointer_mut(authorization).unwrap()["permitted"]["amount"] = json!("999"))),
        (
            "deadline_too_short",
            edit(&|v| v.pointer_mut(authorization).unwrap()["deadline"] = json!((now + 20).to_string())),
        ),
        (
            "wrong_facilitator",
            edit(&|v| v.pointer_mut(authorization).unwrap()["witness"]["facilitator"] = json!(fresh_address())),
        ),
        ("wrong_spender", edit(&|v| v.pointer_mut(authorization).unwrap()["spender"] = json!(PERMIT2))),
        ("wrong_pay_to", edit(&|v| v.pointer_mut(authorization).unwrap()["witness"]["to"] = json!(fresh_address()))),
    ];
    for (code, payment) in cases {
        let reply = shop.create("metered", &input, Some(&payment)).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::PAYMENT_REQUIRED, code), "{}", reply.body);
        assert!(reply.body["error"]["message"].as_str().unwrap().contains("Nothing was charged"), "{}", reply.body);
    }
    // An unknown scheme matches nothing offered.
    let reply = shop.create("metered", &input, Some(&edit(&|v| v["accepted"]["scheme"] = json!("exact")))).await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
    assert!(["payment_mismatch", "invalid_payment"].contains(&reply.code()), "{}", reply.body);

    assert_eq!(shop.tasks().await, 0, "nothing stored");
    assert_eq!(balance(&payer.address).await, FUNDS);
    // The good payment still buys its task.
    let reply = shop.create("metered", &input, Some(&encode(&good))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    shop.done().await;
}

/// The official TypeScript client pays a metered task too.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_typescript_upto_client_pays_a_metered_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = file_of(10 * 1024).await;
    let signature = payer.sign_with(Client::TypeScript, &shop.challenge("metered").await).await;
    let reply = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    assert_eq!(shop.run(&shop.worker().await, id).await, Outcome::Done);
    assert_eq!(shop.task(id).await["payment"]["charged"], (10 * RATE).to_string());
    assert_eq!(balance(&payer.address).await, FUNDS - 10 * RATE);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// What a payer may do between create and run to take back what it
/// authorized: revoke Permit2's approval, move its funds away, or
/// invalidate the Permit2 nonce it signed. The worker reads the chain before
/// the run (one Multicall3 read) and the task never runs: it fails with the
/// code that says which, its authorization released, nothing charged. With
/// nothing taken back, the same check lets the task run and be charged.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_authorization_withdrawn_between_create_and_run_never_runs_and_charges_nothing(pool: PgPool) {
    #[derive(Debug, Clone, Copy)]
    enum Withdrawn {
        Nothing,
        Approval,
        Funds,
        Nonce,
    }
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let worker = shop.worker().await;
    let cases = [
        (Withdrawn::Nothing, None),
        (Withdrawn::Approval, Some("payment_revoked")),
        (Withdrawn::Funds, Some("insufficient_funds")),
        (Withdrawn::Nonce, Some("payment_revoked")),
    ];
    for (withdrawn, code) in cases {
        let payer = Payer::new(&chain, FUNDS).await;
        payer.approve_permit2(&chain, u128::MAX).await;
        let (site, asked) = counted_file_of(2 * 1024).await;
        let signature = payer.sign(&shop.challenge("metered").await).await;
        let nonce = decode(&signature)["payload"]["permit2Authorization"]["nonce"].as_str().unwrap().to_owned();
        let reply = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{withdrawn:?}: {}", reply.body);
        let id = id_of(&reply);
        match withdrawn {
            Withdrawn::Nothing => {}
            Withdrawn::Approval => payer.approve_permit2(&chain, 0).await,
            Withdrawn::Funds => payer.transfer(&chain, &fresh_address(), FUNDS - CEILING + 1).await,
            Withdrawn::Nonce => payer.invalidate_permit2_nonce(&chain, &nonce).await,
        }
        let before = balance(&payer.address).await;

        let outcome = shop.run(&worker, id).await;
        let task = shop.task(id).await;
        let Some(code) = code else {
            assert_eq!(outcome, Outcome::Done, "{task}");
            assert_eq!((&task["status"], &task["payment"]["status"]), (&json!("completed"), &json!("charged")));
            assert_eq!(asked.load(Ordering::SeqCst), 1, "it ran");
            assert_eq!(balance(&payer.address).await, before - 2 * RATE, "charged what it used");
            continue;
        };
        assert_eq!(outcome, Outcome::Failed(code), "{withdrawn:?}: {task}");
        assert_eq!((&task["status"], &task["error"]["code"]), (&json!("failed"), &json!(code)), "{task}");
        let message = task["error"]["message"].as_str().unwrap();
        assert!(message.contains("not started") && message.contains("nothing was charged"), "{message}");
        assert_eq!(asked.load(Ordering::SeqCst), 0, "{withdrawn:?}: the executor never started");
        assert!(task["result"].is_null(), "{task}");
        assert_eq!((&task["payment"]["status"], &task["payment"]["charged"]), (&json!("released"), &json!("0")));
        assert_eq!(shop.attempt(id).await, ("released".into(), Some(code.into())), "{withdrawn:?}");
        let events = events(&pool, id).await;
        assert_eq!(events.last().unwrap().data["payment"]["status"], "released", "the final event says so");
        assert_eq!(balance(&payer.address).await, before, "{withdrawn:?}: nothing moved");
    }
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1, "only the task whose authorization stood was charged");
    let credits: i64 = sqlx::query_scalar("SELECT count(*) FROM credits").fetch_one(&pool).await.unwrap();
    assert_eq!(credits, 0, "no credit: nothing was paid");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// A chain that cannot be read before the run decides nothing: the task
/// is neither run nor failed, it waits in the queue with its authorization
/// intact, and the next delivery, the chain readable, runs it and charges it.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_run_whose_authorization_cannot_be_checked_waits_until_the_chain_answers(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let (site, asked) = counted_file_of(3 * 1024).await;
    let signature = payer.sign(&shop.challenge("metered").await).await;
    let reply = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let unreachable = common::chain::chain_rpc_urls_at(&format!("http://{closed}"));
    let config = shop.config.clone().without(settings::QUEUE_URL).with(CHAIN_RPC_URLS, unreachable);
    let blind = common::worker(&common::loopback_outbound(config)).await;
    let outcome = shop.run(&blind, id).await;
    assert!(matches!(outcome, Outcome::Retry(_)), "{outcome:?}");
    let task = shop.task(id).await;
    assert_eq!((&task["status"], &task["payment"]["status"]), (&json!("queued"), &json!("authorized")), "{task}");
    assert_eq!(asked.load(Ordering::SeqCst), 0, "not run on an authorization nobody could check");

    assert_eq!(shop.delivery(&shop.worker().await, id, 2).await, Outcome::Done);
    let task = shop.task(id).await;
    assert_eq!(task["payment"]["charged"], (3 * RATE).to_string(), "{task}");
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(balance(&payer.address).await, FUNDS - 3 * RATE);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}
