//! Paying for tasks against the real local payment stack (`scripts/payments.sh
//! up`): anvil with the EIP-3009 test token, and the @x402 facilitator. Every
//! payment is signed by coinbase's official x402 Python SDK
//! (`scripts/payments/pay.py`), and every balance is read from the chain.
//!
//! Each test pays from a fresh key (minted tokens by the test) to a fresh
//! `payTo`, so tests running in parallel on one chain never see each other's
//! transfers, and each ends by joining the chain's `Transfer`s to its
//! `payTo` with the payments table ([`assert_books_balance`]): every charge
//! has exactly one task or one credit, every paid task exactly one charge.
//!
//! The faults are real: a settlement held pending by pausing the chain's
//! mining (under the harness's exclusive lock), a facilitator of the test's
//! own stopped after it broadcast, an authorization left to expire, a
//! Lambda deadline shorter than the settle.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use base64::Engine;
use common::chain::{
    ChainLock, OWN_FACILITATOR_ACCOUNT, OwnFacilitator, Payer, TOKEN, balance, chain_time, charges_to, fresh_address,
    rpc, wait_pending_from,
};
use common::{Reply, TestQueue, get_authed, new_session, post_json, send};
use reeve_shared::catalog::Catalog;
use reeve_shared::http::app;
use reeve_shared::ids::Id;
use reeve_shared::payments::{CHAIN_CONFIRMATIONS, CHAIN_RPC_URLS};
use reeve_shared::settings::{self, Config};
use reeve_shared::startup;
use reeve_shared::sweeper::{SweepReport, Sweeper};
use reeve_shared::tasks::{EventType, events_after};
use reeve_shared::worker::{Outcome, WorkerContext, process};
use serde_json::{Value, json};
use sqlx::PgPool;

/// 0.01 of a 6-decimal token.
const PRICE: u128 = 10_000;

fn facilitator_url() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

fn decode(header: &str) -> Value {
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap()
}

fn encode(v: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(v.to_string())
}

// ------------------------------------------------------------------ Reeve

/// Two priced kinds of the same price (`fetch` and `fetch2`), a priced
/// `digest` of an upload, and a free one. The mainnet price comes first, so
/// the SDK must choose the local one.
fn catalog(pay_to: &str, facilitator: &str, max_timeout: u32) -> String {
    let priced = |kind: &str| {
        format!(
            r#"
            [tasks.{kind}]
            title = "Fetch"
            description = "Fetch a URL"
            executor = "fetch"
            [tasks.{kind}.input_schema]
            type = "object"
            required = ["url"]
            [tasks.{kind}.input_schema.properties.url]
            type = "string"
            {}
            "#,
            common::cent_on_mainnet_then_local(kind)
        )
    };
    let slow = r#"
            [tasks.slow]
            title = "Slow fetch"
            description = "Fetch a URL within one second"
            executor = "fetch"
            timeout_seconds = 1
            [tasks.slow.input_schema]
            type = "object"
            [[tasks.slow.accepts]]
            asset = "local"
            amount_usd = "0.01"
            [tasks.free]
            title = "Free fetch"
            description = "Fetch a URL for nothing"
            executor = "fetch"
            [tasks.free.input_schema]
            type = "object"
        "#;
    let digest = format!(
        r#"
            [uploads]
            max_bytes = 1048576
            content_types = ["text/plain"]
            [tasks.paid_digest]
            title = "Digest"
            description = "SHA-256 of an uploaded file"
            executor = "digest"
            [tasks.paid_digest.input_schema]
            type = "object"
            required = ["upload_id"]
            [tasks.paid_digest.input_schema.properties.upload_id]
            type = "string"
            {}
        "#,
        common::cent_on_mainnet_then_local("paid_digest")
    );
    let tasks = format!("{digest}\n{}\n{}\n{slow}", priced("fetch"), priced("fetch2"));
    common::paid_catalog_text(pay_to, facilitator, max_timeout, &tasks)
}

struct Shop {
    app: Router,
    token: String,
    pay_to: String,
    queue: TestQueue,
    pool: PgPool,
    /// What every function of this shop starts from: its catalog, its
    /// queue, the local chain.
    config: Config,
}

impl Shop {
    async fn new(pool: &PgPool) -> Shop {
        Self::with(pool, &facilitator_url(), 300).await
    }

    async fn with(pool: &PgPool, facilitator: &str, max_timeout: u32) -> Shop {
        Self::build(pool, fresh_address(), facilitator, max_timeout, None).await
    }

    /// This shop's space and `payTo`, through another facilitator.
    async fn through(self, facilitator: &str) -> Shop {
        let (pool, pay_to, token) = (self.pool.clone(), self.pay_to.clone(), self.token.clone());
        self.done().await;
        Self::build(&pool, pay_to, facilitator, 300, Some(token)).await
    }

    async fn build(pool: &PgPool, pay_to: String, facilitator: &str, max_timeout: u32, token: Option<String>) -> Shop {
        let queue = TestQueue::new().await;
        let config = common::with_catalog(common::config(pool), &catalog(&pay_to, facilitator, max_timeout))
            .with(settings::QUEUE_URL, &queue.url)
            .with(CHAIN_RPC_URLS, common::chain::chain_rpc_urls())
            .with(settings::SWEEP_OLDER_THAN, "300");
        let app = app(common::api(&config).await);
        let token = match token {
            Some(token) => token,
            None => new_session(&app).await.1,
        };
        Shop { app, token, pay_to, queue, pool: pool.clone(), config }
    }

    /// One sweep, as the sweeper Lambda or `reeve sweep` runs it: the
    /// reconciler first, on the local chain.
    async fn sweep(&self) -> SweepReport {
        let sweeper = self.sweeper(&self.config).await;
        sweeper.sweep(Duration::from_secs(300)).await.unwrap()
    }

    /// A worker on this shop's catalog, one run at once, whose fetches may
    /// reach plain-http loopback servers.
    async fn worker(&self) -> WorkerContext {
        common::worker(&self.worker_config()).await
    }

    fn worker_config(&self) -> Config {
        let config = self.config.clone().without(settings::QUEUE_URL).with(settings::WORKER_CONCURRENCY, "1");
        common::loopback_outbound(config)
    }

    /// The attempts recorded, as `(status, reason)`.
    async fn attempts(&self) -> Vec<(String, Option<String>)> {
        sqlx::query_as("SELECT status, reason FROM payment_attempts ORDER BY created_at")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    fn request(&self, kind: &str, input: &Value, payment: Option<&str>) -> Request<Body> {
        let mut r = post_json(&format!("/v1/tasks/{kind}"), Some(&self.token), &json!({ "input": input }));
        if let Some(p) = payment {
            r.headers_mut().insert("payment-signature", HeaderValue::from_str(p).unwrap());
        }
        r
    }

    async fn create(&self, kind: &str, input: &Value, payment: Option<&str>) -> Reply {
        send(&self.app, self.request(kind, input, payment)).await
    }

    /// The challenge header of a 402 for `kind`.
    async fn challenge(&self, kind: &str) -> String {
        let reply = self.create(kind, &json!({"url": "http://127.0.0.1:1/"}), None).await;
        assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
        reply.headers["payment-required"].to_str().unwrap().to_owned()
    }

    async fn tasks(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&self.pool).await.unwrap()
    }

    async fn space(&self) -> Value {
        let reply = send(&self.app, get_authed("/v1/space", &self.token)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.body
    }

    /// Leaves the Space one credit of the `fetch` price: `payer` pays a
    /// task, which is canceled before it runs. Answers the challenge it paid.
    async fn earn_a_credit(&self, payer: &Payer) -> String {
        let challenge = self.challenge("fetch").await;
        let reply =
            self.create("fetch", &json!({"url": "http://127.0.0.1:1/a"}), Some(&payer.sign(&challenge).await)).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        let cancel = post_json(&format!("/v1/tasks/{}/cancel", id_of(&reply)), Some(&self.token), &json!({}));
        let canceled = send(&self.app, cancel).await;
        assert_eq!(canceled.status, StatusCode::OK, "{}", canceled.body);
        assert_eq!(self.space().await["credits"].as_array().unwrap().len(), 1);
        challenge
    }

    async fn done(self) {
        self.queue.delete().await;
    }
}

fn id_of(reply: &Reply) -> Id {
    reply.body["id"].as_str().unwrap_or_else(|| panic!("no id in {}", reply.body)).parse().unwrap()
}

/// Serves `router` on a loopback port of its own.
async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

async fn status_of(pool: &PgPool, id: Id) -> (String, Option<Value>) {
    sqlx::query_as::<_, (String, Option<sqlx::types::Json<Value>>)>("SELECT status, error FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .map(|(s, e)| (s, e.map(|j| j.0)))
        .unwrap()
}

// ------------------------------------------------------------------ tests

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_paid_task_settles_on_chain_then_runs_to_completion(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let site = serve(Router::new().route("/page", axum::routing::get(|| async { "paid for" }))).await;
    let input = json!({"url": format!("http://{site}/page")});

    let challenge = shop.challenge("fetch").await;
    let c = decode(&challenge);
    // The catalog lists Base mainnet too, which the local facilitator does
    // not settle (its /supported): only the local chain's price is offered.
    assert_eq!(c["accepts"].as_array().unwrap().len(), 1);
    assert!(c["extensions"]["payment-identifier"].is_object() && c["extensions"]["bazaar"].is_object());
    let signature = payer.sign(&challenge).await;
    assert_eq!(decode(&signature)["accepted"]["network"], "eip155:84532", "the SDK chose the local requirement");

    let before = (balance(&payer.address).await, balance(&shop.pay_to).await);
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    let response = decode(reply.headers["payment-response"].to_str().unwrap());
    assert_eq!(response["success"], true);
    assert_eq!(response["network"], "eip155:84532");
    assert_eq!(response["payer"], payer.address.to_ascii_lowercase());
    let transaction = response["transaction"].as_str().unwrap().to_owned();
    assert!(transaction.starts_with("0x") && transaction.len() == 66, "{transaction}");
    let receipt = rpc("eth_getTransactionReceipt", json!([transaction])).await;
    assert_eq!(receipt["status"], "0x1");

    // Exactly the price moved, from the payer to payTo.
    assert_eq!(balance(&payer.address).await, before.0 - PRICE);
    assert_eq!(balance(&shop.pay_to).await, before.1 + PRICE);

    // Queued, then run by a worker to completion.
    let queued = shop.queue.drain().await;
    assert_eq!(queued, [json!({"task_id": id.to_string(), "kind": "fetch"})]);
    let worker = shop.worker().await;
    assert_eq!(process(&worker, &json!({"task_id": id, "kind": "fetch"}).to_string(), 1).await, Outcome::Done);
    assert_eq!(status_of(&pool, id).await.0, "completed");

    // The Space lists the payment.
    let space = shop.space().await;
    assert_eq!(space["payments"].as_array().unwrap().len(), 1, "{space}");
    assert_eq!(space["payments"][0]["transaction"], transaction.as_str());
    assert_eq!(space["payments"][0]["amount"], "10000");
    assert_eq!(space["payments"][0]["task_id"], id.to_string());
    assert_eq!(space["credits"], json!([]));
    shop.done().await;
}

/// A payment counts only once its transfer has its network's confirmations
/// after it (`REEVE_CHAIN_CONFIRMATIONS`): with 0 (the default), a paid
/// create answers as soon as the transfer is mined; with 3, only once 3
/// more blocks followed the one that holds it. Either way: one task, one
/// charge, books that balance.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payment_is_proven_only_once_its_network_s_confirmations_followed_it(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let site = serve(Router::new().route("/page", axum::routing::get(|| async { "paid for" }))).await;
    for confirmations in [0u64, 3] {
        let config = shop.config.clone().with(CHAIN_CONFIRMATIONS, format!("eip155:84532={confirmations}"));
        let confirming = app(common::api(&config).await);
        let payer = Payer::new(&chain, 1_000_000).await;
        let signature = payer.sign(&shop.challenge("fetch").await).await;
        let input = json!({"url": format!("http://{site}/page?confirmations={confirmations}")});
        let reply = send(&confirming, shop.request("fetch", &input, Some(&signature))).await;
        let answered_at =
            u64::from_str_radix(rpc("eth_blockNumber", json!([])).await.as_str().unwrap()[2..].as_ref(), 16).unwrap();
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{confirmations}: {}", reply.body);
        let transaction = decode(reply.headers["payment-response"].to_str().unwrap())["transaction"].clone();
        let receipt = rpc("eth_getTransactionReceipt", json!([transaction])).await;
        let mined = u64::from_str_radix(&receipt["blockNumber"].as_str().unwrap()[2..], 16).unwrap();
        assert!(
            answered_at >= mined + confirmations,
            "{confirmations} confirmations: answered at block {answered_at}, the transfer is in {mined}"
        );
    }
    assert_eq!(shop.tasks().await, 2, "one task per payment");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// A payment buys one task. Sent again by the Space that paid, for the same
/// request (a client whose connection dropped after the charge), it answers
/// that task with the receipt stored when it was paid: never a second
/// charge, never an error that would make an x402 client sign again. For
/// anything else (another kind, another input, another Space) it is a replay.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payment_buys_one_task_and_sent_again_answers_that_task_and_its_receipt(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let first = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let receipt = decode(first.headers["payment-response"].to_str().unwrap());
    let after_first = balance(&payer.address).await;

    for _ in 0..2 {
        let again = shop.create("fetch", &input, Some(&signature)).await;
        assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
        assert_eq!(id_of(&again), id_of(&first));
        assert_eq!(again.headers["idempotent-replayed"], "true");
        assert_eq!(decode(again.headers["payment-response"].to_str().unwrap()), receipt, "the stored receipt");
    }

    let (_, other_token) = new_session(&shop.app).await;
    let mut other_space = shop.request("fetch", &input, Some(&signature));
    other_space.headers_mut().insert("authorization", format!("Bearer {other_token}").parse().unwrap());
    for (name, request) in [
        ("another kind", shop.request("fetch2", &input, Some(&signature))),
        ("another input", shop.request("fetch", &json!({"url": "http://127.0.0.1:2/"}), Some(&signature))),
        ("another space", other_space),
    ] {
        let reply = send(&shop.app, request).await;
        assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{name}: {}", reply.body);
        assert_eq!(reply.code(), "payment_replayed", "{name}");
        let challenge = decode(reply.headers["payment-required"].to_str().unwrap());
        assert_eq!(challenge["error"], "payment_replayed", "{name}");
    }
    assert_eq!(shop.tasks().await, 1, "one payment, one task");
    assert_eq!(balance(&payer.address).await, after_first, "sending it again moves nothing");
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1, "one transfer on the chain");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn refused_payments_charge_nothing_and_create_no_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let challenge = shop.challenge("fetch").await;
    let signature = payer.sign(&challenge).await;
    let start = balance(&payer.address).await;

    // Not a payment at all.
    let reply = shop.create("fetch", &input, Some("not base64!")).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::BAD_REQUEST, "invalid_payment"));

    // `accepted` edited to a price this kind does not offer.
    let mut edited = decode(&signature);
    edited["accepted"]["amount"] = json!("1");
    let reply = shop.create("fetch", &input, Some(&encode(&edited))).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::PAYMENT_REQUIRED, "payment_mismatch"), "{}", reply.body);
    assert!(reply.headers.contains_key("payment-required"));

    // A payer with no tokens: the facilitator refuses it.
    let broke = Payer::new(&chain, 0).await;
    let reply = shop.create("fetch", &input, Some(&broke.sign(&challenge).await)).await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
    assert!(["payment_invalid", "payment_failed"].contains(&reply.code()), "{}", reply.body);
    // The facilitator's own reason is passed on (it simulates the transfer).
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("insufficient_balance") || message.contains("simulation_failed"), "{message}");

    // The facilitator stopped (nothing listens there).
    let down = Shop::with(&pool, "http://127.0.0.1:1", 300).await;
    let reply = down.create("fetch", &input, Some(&payer.sign(&down.challenge("fetch").await).await)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::SERVICE_UNAVAILABLE, "facilitator_unavailable"));

    assert_eq!(shop.tasks().await, 0);
    assert_eq!(balance(&payer.address).await, start, "nothing was charged");
    assert_eq!(balance(&broke.address).await, 0);

    // The good signature still works afterwards: the refusals spent nothing.
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_eq!(balance(&payer.address).await, start - PRICE);
    down.done().await;
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_expired_authorization_is_refused_without_a_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    // A one-second window: the SDK signs validBefore = now + 1.
    let shop = Shop::with(&pool, &facilitator_url(), 1).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reply = shop.create("fetch", &json!({"url": "http://127.0.0.1:1/"}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
    assert_eq!(reply.code(), "payment_invalid", "{}", reply.body);
    assert!(reply.body["error"]["message"].as_str().unwrap().contains("valid_before"), "{}", reply.body);
    assert_eq!(shop.tasks().await, 0);
    assert_eq!(balance(&payer.address).await, 1_000_000);
    shop.done().await;
}

/// Sends a facilitator call on to the stack's real facilitator, as the
/// test facilitators below do for what they do not change.
async fn forward(path: &str, body: axum::body::Bytes) -> (StatusCode, String) {
    let answer = reqwest::Client::new()
        .post(format!("{}/{path}", facilitator_url()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (StatusCode::from_u16(answer.status().as_u16()).unwrap(), answer.text().await.unwrap())
}

/// Forwards to the real facilitator, but answers the first `/settle` with a
/// 502 after the real one has settled: the outcome a client sees as unknown.
async fn lossy_facilitator() -> SocketAddr {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let lost = Arc::new(AtomicBool::new(false));
    let router = Router::new()
        .route("/verify", axum::routing::post(|body: axum::body::Bytes| async move { forward("verify", body).await }))
        .route(
            "/settle",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                let answer = forward("settle", body).await;
                if lost.swap(true, Ordering::SeqCst) { answer } else { (StatusCode::BAD_GATEWAY, "lost".to_owned()) }
            }),
        );
    serve(router).await
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_settle_whose_answer_is_lost_is_pending_and_a_retry_learns_its_one_task_from_the_chain(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let lossy = lossy_facilitator().await;
    let shop = Shop::with(&pool, &format!("http://{lossy}"), 300).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;

    // The settle went through; its answer did not: pending, never "nothing
    // was charged".
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", reply.body);
    assert_eq!(reply.headers["retry-after"], "5");
    assert!(reply.body["error"]["message"].as_str().unwrap().contains("same PAYMENT-SIGNATURE"));
    assert_eq!(shop.tasks().await, 0);
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "the settle went through");

    // The retry reads the authorization's state on chain: used, so the
    // task it paid for.
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    assert_eq!(shop.tasks().await, 1);
    let mut conn = pool.acquire().await.unwrap();
    let events = events_after(&mut conn, id, 0).await.unwrap();
    assert!(events.iter().any(|e| e.kind == EventType::PaymentSettledLate), "{events:?}");
    // It was told its payment was pending, so the same signature keeps
    // answering that one task, and settles nothing more.
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_eq!(id_of(&reply), id);
    assert_eq!(shop.tasks().await, 1);
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "charged once");
    let space = shop.space().await;
    assert_eq!(space["payments"][0]["task_id"], id.to_string());
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_payment_identifier_makes_a_paid_retry_answer_the_same_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let challenge = shop.challenge("fetch").await;
    let with_id = |signature: &str| {
        let mut p = decode(signature);
        p["extensions"] = json!({"payment-identifier": {"info": {"required": false, "id": "pay_0123456789abcdef"}}});
        encode(&p)
    };
    let signature = with_id(&payer.sign(&challenge).await);
    let first = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let again = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    assert_eq!(id_of(&again), id_of(&first));
    assert_eq!(again.headers["idempotent-replayed"], "true");

    // The same id with another payment is a conflict, and charges nothing.
    let other = with_id(&payer.sign(&challenge).await);
    let before = balance(&payer.address).await;
    let reply = shop.create("fetch", &input, Some(&other)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_identifier_conflict"));
    assert_eq!(balance(&payer.address).await, before);
    assert_eq!(shop.tasks().await, 1);
    shop.done().await;
}

/// Every number of a payment has one spelling (issue 37): the signed
/// payment with one of its numbers written any other way (a leading zero, a
/// sign, whitespace, hex, past 2^256 − 1) is `400 invalid_payment` naming
/// the field, before anything is recorded or settled; as signed, it pays
/// once.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payment_number_spelled_any_other_way_is_refused_naming_its_field(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signed = decode(&payer.sign(&shop.challenge("fetch").await).await);
    let at = |pointer: &str| signed.pointer(pointer).and_then(Value::as_str).unwrap().to_owned();
    let valid_before = at("/payload/authorization/validBefore");
    let past_u256 = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
    let cases = [
        ("/accepted/amount", "accepted.amount", format!("0{PRICE}")),
        ("/payload/authorization/value", "authorization.value", format!("0{PRICE}")),
        ("/payload/authorization/value", "authorization.value", format!("+{PRICE}")),
        ("/payload/authorization/value", "authorization.value", format!("{PRICE:#x}")),
        ("/payload/authorization/validBefore", "authorization.validBefore", format!(" {valid_before}")),
        ("/payload/authorization/validBefore", "authorization.validBefore", format!("{valid_before}\n")),
        ("/payload/authorization/validBefore", "authorization.validBefore", format!("-{valid_before}")),
        ("/payload/authorization/validAfter", "authorization.validAfter", "00".to_owned()),
        ("/payload/authorization/validAfter", "authorization.validAfter", past_u256.to_owned()),
        ("/payload/authorization/nonce", "authorization.nonce", format!("{}0", at("/payload/authorization/nonce"))),
    ];
    for (pointer, field, text) in cases {
        let mut payment = signed.clone();
        *payment.pointer_mut(pointer).unwrap() = json!(text);
        let reply = shop.create("fetch", &input, Some(&encode(&payment))).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::BAD_REQUEST, "invalid_payment"), "{field} {text:?}");
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{field} {text:?}: {message}");
    }
    assert!(shop.attempts().await.is_empty(), "refused before anything was recorded");
    assert_eq!(balance(&payer.address).await, 1_000_000, "nothing charged");

    let reply = shop.create("fetch", &input, Some(&encode(&signed))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "as signed, it pays once");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// `exact`'s nonce is 32 bytes, whatever the case of its hex: written in
/// upper case, a paid payment is the same authorization, a replay from the
/// Space that paid and from any other, and buys nothing more.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_exact_nonce_in_upper_case_replays_the_lower_case_one_and_buys_nothing(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let first = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);

    let mut upper = decode(&signature);
    let nonce = upper["payload"]["authorization"]["nonce"].as_str().unwrap().to_owned();
    assert_eq!(nonce, nonce.to_ascii_lowercase(), "the SDK signs it lowercase");
    upper["payload"]["authorization"]["nonce"] = json!(format!("0x{}", nonce[2..].to_ascii_uppercase()));
    let upper = encode(&upper);
    let (_, other_token) = new_session(&shop.app).await;
    let mut other_space = shop.request("fetch", &input, Some(&upper));
    other_space.headers_mut().insert("authorization", format!("Bearer {other_token}").parse().unwrap());
    for (name, request) in
        [("the same Space", shop.request("fetch", &input, Some(&upper))), ("another Space", other_space)]
    {
        let reply = send(&shop.app, request).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::PAYMENT_REQUIRED, "payment_replayed"), "{name}");
    }
    assert_eq!(shop.attempts().await.len(), 1, "one authorization, one attempt");
    assert_eq!(shop.tasks().await, 1);
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "charged once");
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_paid_task_that_fails_leaves_a_credit_that_pays_the_next_one(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let site = serve(Router::new().route("/page", axum::routing::get(|| async { "fetched" }))).await;
    let input = json!({"url": format!("http://{site}/page")});
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let failed = id_of(&reply);
    shop.queue.drain().await;

    // Reeve's own failure: its storage is down (nothing listens on port 1),
    // on every delivery, until the last.
    let config = reeve_shared::startup::sdk().await;
    let dead_s3 =
        aws_sdk_s3::config::Builder::from(&config).endpoint_url("http://127.0.0.1:1").force_path_style(true).build();
    let mut worker = shop.worker().await;
    // Fault: S3 out of reach (the SDK takes its endpoint from the process).
    worker.exec.s3 = aws_sdk_s3::Client::from_conf(dead_s3);
    let body = json!({"task_id": failed, "kind": "fetch"}).to_string();
    assert_eq!(process(&worker, &body, 5).await, Outcome::Failed("retries_exhausted"));
    let space = shop.space().await;
    let credits = space["credits"].as_array().unwrap();
    assert_eq!(credits.len(), 1, "{space}");
    assert_eq!(credits[0]["source_task"], failed.to_string());
    assert_eq!(credits[0]["reason"], "retries_exhausted");
    assert_eq!(credits[0]["amount"], "10000");
    assert_eq!(credits[0]["network"], "eip155:84532");
    assert_eq!(credits[0]["spent_by"], Value::Null);

    // The next task of that price, in another kind, needs no payment.
    let before = balance(&payer.address).await;
    let reply = shop.create("fetch2", &input, None).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert!(reply.headers.get("payment-response").is_none());
    let paid_by_credit = id_of(&reply);
    let mut conn = pool.acquire().await.unwrap();
    let events = events_after(&mut conn, paid_by_credit, 0).await.unwrap();
    let used = events.iter().find(|e| e.kind == EventType::CreditUsed).expect("a credit_used event");
    assert_eq!(used.data["source_task"], failed.to_string());
    assert_eq!(balance(&payer.address).await, before, "no payment");
    let space = shop.space().await;
    assert_eq!(space["credits"][0]["spent_by"], paid_by_credit.to_string());

    // Spent: the one after that is asked to pay again.
    let reply = shop.create("fetch2", &input, None).await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);

    // A task failed by its input earns nothing.
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let reply = shop.create("fetch", &json!({"url": "not a url"}), Some(&signature)).await;
    let bad = id_of(&reply);
    let body = json!({"task_id": bad, "kind": "fetch"}).to_string();
    assert!(matches!(process(&worker, &body, 1).await, Outcome::Failed(_)));
    let (_, error) = status_of(&pool, bad).await;
    assert_ne!(error.unwrap()["code"], "retries_exhausted");
    assert_eq!(shop.space().await["credits"].as_array().unwrap().len(), 1, "no credit for an input error");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// `reeve tasks rerun` over a filter that matches a paid task failed by
/// Reeve's fault, one failed by its input, and one whose credit already paid
/// for another task. Only the first runs again, and its re-run spends the
/// credit its failure left: paid once, it is run or credited, never both.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_rerun_runs_a_paid_task_failed_by_reeve_once_more_and_spends_its_credit(pool: PgPool) {
    use reeve_shared::tasks::bulk::{Action, Filter, Operator};
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let site = serve(Router::new().route("/page", axum::routing::get(|| async { "fetched" }))).await;
    let input = json!({"url": format!("http://{site}/page")});
    let paid = |input: Value| {
        let (shop, payer) = (&shop, &payer);
        async move {
            let signature = payer.sign(&shop.challenge("fetch").await).await;
            let reply = shop.create("fetch", &input, Some(&signature)).await;
            assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
            id_of(&reply)
        }
    };
    let by_reeve = paid(input.clone()).await;
    let spent_elsewhere = paid(input.clone()).await;
    let by_input = paid(json!({"url": "not a url"})).await;
    shop.queue.drain().await;

    // Reeve's own failure (its storage out of reach, on every delivery) for
    // two of them; the third fails by its input.
    let config = reeve_shared::startup::sdk().await;
    let dead_s3 =
        aws_sdk_s3::config::Builder::from(&config).endpoint_url("http://127.0.0.1:1").force_path_style(true).build();
    let mut broken = shop.worker().await;
    broken.exec.s3 = aws_sdk_s3::Client::from_conf(dead_s3);
    for id in [by_reeve, spent_elsewhere] {
        let body = json!({"task_id": id, "kind": "fetch"}).to_string();
        assert_eq!(process(&broken, &body, 5).await, Outcome::Failed("retries_exhausted"));
    }
    let worker = shop.worker().await;
    let body = json!({"task_id": by_input, "kind": "fetch"}).to_string();
    assert!(matches!(process(&worker, &body, 1).await, Outcome::Failed(_)));
    assert_eq!(shop.space().await["credits"].as_array().unwrap().len(), 2, "one credit per failure by Reeve");
    // One of the two credits pays for another task: its source was paid
    // for once, by that task.
    let used = shop.create("fetch2", &input, None).await;
    assert_eq!(used.status, StatusCode::ACCEPTED, "{}", used.body);
    shop.queue.drain().await;
    let spent: Option<Id> = sqlx::query_scalar("SELECT source_task FROM credits WHERE spent_by = $1")
        .bind(id_of(&used))
        .fetch_one(&pool)
        .await
        .unwrap();
    // The credits are spent oldest first: `by_reeve`'s, unless it is the
    // other's. Name them by what happened.
    let (rerun, credit_gone) =
        if spent == Some(by_reeve) { (spent_elsewhere, by_reeve) } else { (by_reeve, spent_elsewhere) };

    // The operator's filter: every failed `fetch`.
    let filter = Filter {
        kind: Some("fetch".into()),
        statuses: Some(vec![reeve_shared::tasks::TaskStatus::Failed]),
        ..Filter::default()
    };
    let counted = filter.count(&pool).await.unwrap();
    assert_eq!((counted.matched, counted.rerunnable), (3, 2), "{counted:?}: the input failure is never a candidate");
    let sweeper = shop.sweeper(&shop.config).await;
    let sqs = common::aws().await.sqs;
    let operator = Operator { db: &pool, events: &sweeper.events, sqs: &sqs, queue_url: &shop.queue.url, by: "test" };
    let tally = operator.apply(&filter, Action::Rerun, 10, |_| {}).await.unwrap();
    assert_eq!((tally.seen, tally.done, tally.skipped, tally.unsent), (2, 1, 1, 0), "{tally:?}");
    assert_eq!(status_of(&pool, credit_gone).await.0, "failed", "its credit paid for another task: not run again");
    assert_eq!(status_of(&pool, by_input).await.0, "failed", "failed by its input: never run again");
    let (status, error) = status_of(&pool, rerun).await;
    assert_eq!((status.as_str(), error), ("queued", None));
    let space = shop.space().await;
    let mine = space["credits"].as_array().unwrap().iter().find(|c| c["source_task"] == rerun.to_string()).unwrap();
    assert_eq!(mine["spent_by"], rerun.to_string(), "the re-run spent the credit: {space}");

    // The re-run is a new attempt of the same task, through the queue.
    let sent = shop.queue.drain().await;
    assert_eq!(sent, vec![json!({"task_id": rerun, "kind": "fetch"})]);
    assert_eq!(process(&worker, &sent[0].to_string(), 1).await, Outcome::Done);
    let task = send(&shop.app, get_authed(&format!("/v1/tasks/{rerun}"), &shop.token)).await.body;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["attempts"], 2, "its failed attempt, then the re-run's: {task}");
    let mut conn = pool.acquire().await.unwrap();
    let events = events_after(&mut conn, rerun, 0).await.unwrap();
    assert!(events.iter().any(|e| e.data["rerun"] == true), "a status event says it was run again");

    // No credit is left to pay a task with: the payment bought the re-run.
    let reply = shop.create("fetch2", &input, None).await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
    // And nothing is left to run again.
    assert_eq!(filter.count(&pool).await.unwrap().rerunnable, 1, "only the one whose credit is gone, which is skipped");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_space_route_needs_a_session_and_is_in_the_openapi_document(pool: PgPool) {
    let shop = Shop::new(&pool).await;
    let reply = send(&shop.app, Request::get("/v1/space").body(Body::empty()).unwrap()).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::UNAUTHORIZED, "missing_token"));
    // A new Space has paid nothing, and has used none of its free kind's quota.
    assert_eq!(
        shop.space().await,
        json!({"payments": [], "credits": [], "quotas": [
            {"kind": "free", "per_hour": {"limit": 100, "used": 0}, "at_once": {"limit": 10, "used": 0}}
        ]})
    );
    let doc = send(&shop.app, Request::get("/v1/openapi.json").body(Body::empty()).unwrap()).await;
    assert!(doc.body["paths"]["/v1/space"]["get"].is_object(), "{}", doc.body["paths"]);
    shop.done().await;
}

#[test]
fn usd_prices_convert_exactly_rounding_down_and_zero_is_an_error() {
    let with = |decimals: u8, usd: &str| {
        Catalog::parse(&format!(
            r#"
            [payments]
            pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
            facilitator_url = "https://x402.org/facilitator"
            [assets.a]
            network = "eip155:84532"
            contract = "{TOKEN}"
            decimals = {decimals}
            usd_peg = true
            name = "USDC"
            version = "2"
            [tasks.t]
            title = "t"
            description = "d"
            executor = "digest"
            input_schema = {{ type = "object" }}
            [[tasks.t.accepts]]
            asset = "a"
            amount_usd = "{usd}"
            "#
        ))
        .map(|c| c.task("t").unwrap().accepts[0].amount)
        .map_err(|e| e.to_string())
    };
    let cases: &[(u8, &str, Result<u128, &str>)] = &[
        (6, "0.01", Ok(10_000)),
        (18, "0.01", Ok(10_000_000_000_000_000)),
        (6, "0.0123456789", Ok(12_345)),
        (6, "1.9999999", Ok(1_999_999)),
        (0, "2.99", Ok(2)),
        (6, "0.0000001", Err("0")),
        (6, "0", Err("0")),
    ];
    for (decimals, usd, want) in cases {
        match (with(*decimals, usd), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, *want, "{usd} at {decimals} decimals"),
            (Err(e), Err(part)) => assert!(e.contains("amount_usd") && e.contains(part), "{usd}: {e}"),
            (got, want) => panic!("{usd} at {decimals} decimals: got {got:?}, want {want:?}"),
        }
    }
}

#[tokio::test]
async fn a_test_that_pauses_the_chain_holds_it_alone_and_mining_resumes_even_if_it_panics() {
    let paused = tokio::spawn(async {
        let chain = ChainLock::exclusive().await;
        chain.pause().await;
        assert_eq!(rpc("anvil_getIntervalMining", json!([])).await, json!(0));
        let before = rpc("eth_blockNumber", json!([])).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(rpc("eth_blockNumber", json!([])).await, before, "no block while paused");
        chain.mine().await;
        assert_ne!(rpc("eth_blockNumber", json!([])).await, before, "evm_mine mines one");
        panic!("the test fails while the chain is paused");
    })
    .await;
    assert!(paused.unwrap_err().is_panic());
    assert_eq!(rpc("anvil_getIntervalMining", json!([])).await, json!(1), "the guard restored mining");
    // And a paying test may hold it again at once.
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 5).await;
    assert_eq!(balance(&payer.address).await, 5);
}

// ------------------------------------------------------------------ the books

/// "No charge without a task, no task without a charge", from the chain's
/// side: every `Transfer` to `pay_to` used one authorization, whose attempt
/// is settled with exactly one task (and its payments row) or one credit;
/// and every payment recorded for `pay_to` is exactly one of those charges.
async fn assert_books_balance(pool: &PgPool, pay_to: &str) {
    let charges = charges_to(pay_to).await;
    for charge in &charges {
        let (payer, nonce) = charge.authorization.clone().unwrap_or_else(|| panic!("{charge:?}: no authorization"));
        let attempts: Vec<(Id, String, Option<Id>)> =
            sqlx::query_as("SELECT id, status, task_id FROM payment_attempts WHERE payer = $1 AND nonce = $2")
                .bind(&payer)
                .bind(&nonce)
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(attempts.len(), 1, "{charge:?}: one attempt per authorization");
        let (attempt, status, task) = &attempts[0];
        assert_eq!(status, "settled", "{charge:?}: charged, so settled");
        let paid_tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM payments WHERE task_id = $1")
            .bind(task)
            .fetch_one(pool)
            .await
            .unwrap();
        let credits: i64 = sqlx::query_scalar("SELECT count(*) FROM credits WHERE source_attempt = $1")
            .bind(attempt)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(paid_tasks + credits, 1, "{charge:?}: exactly one task or one credit");
        assert_eq!(charge.value, PRICE, "{charge:?}");
        if paid_tasks == 1 {
            let stored: Option<String> = sqlx::query_scalar("SELECT transaction FROM payments WHERE task_id = $1")
                .bind(task)
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(stored.as_deref(), Some(charge.transaction.as_str()), "the payment names its transfer");
        }
    }
    // An attempt that paid nothing wrote nothing: no task, payment or credit.
    let unpaid: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM payment_attempts a
          WHERE a.status <> 'settled'
            AND (a.task_id IS NOT NULL OR EXISTS (SELECT 1 FROM credits c WHERE c.source_attempt = a.id))",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(unpaid, 0, "no task or credit for an attempt that was not paid");
    let paid: Vec<(String, String)> = sqlx::query_as(
        "SELECT a.payer, a.nonce FROM payments p JOIN payment_attempts a ON a.task_id = p.task_id
          WHERE lower(p.pay_to) = lower($1)",
    )
    .bind(pay_to)
    .fetch_all(pool)
    .await
    .unwrap();
    for (payer, nonce) in &paid {
        let matching = charges.iter().filter(|c| c.authorization.as_ref() == Some(&(payer.clone(), nonce.clone())));
        assert_eq!(matching.count(), 1, "the paid task of {payer}/{nonce} has exactly one charge");
    }
    let settled: i64 = sqlx::query_scalar("SELECT count(*) FROM payment_attempts WHERE status = 'settled'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(settled as usize, charges.len(), "every settled attempt is one charge on chain");
}

/// The one event of `kind` in the task's log.
async fn has_event(pool: &PgPool, id: Id, kind: EventType) -> bool {
    let mut conn = pool.acquire().await.unwrap();
    events_after(&mut conn, id, 0).await.unwrap().iter().any(|e| e.kind == kind)
}

/// The one task there is now.
async fn only_task(pool: &PgPool) -> Id {
    let ids: Vec<Id> = sqlx::query_scalar("SELECT id FROM tasks").fetch_all(pool).await.unwrap();
    assert_eq!(ids.len(), 1, "{ids:?}");
    ids[0]
}

// ------------------------------------------------------------------ faults

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_settlement_held_pending_is_answered_at_once_and_one_sweep_makes_its_one_task(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    // It waits a second for the receipt, then answers `settlement_pending`
    // with the hash it broadcast, as @x402/evm does on a slow chain.
    let facilitator = OwnFacilitator::start(Duration::from_secs(1)).await;
    let shop = Shop::with(&pool, &facilitator.url, 300).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;

    chain.pause().await;
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", reply.body);
    assert!(reply.headers.contains_key("retry-after"));
    assert_eq!(shop.tasks().await, 0);
    assert_eq!(shop.attempts().await[0].0, "settling", "kept open, with its request");
    // Still pending: the retry says so again, and settles nothing new.
    let again = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(again.code(), "payment_pending", "{}", again.body);

    chain.mine().await;
    chain.resume().await;
    let report = shop.sweep().await;
    assert_eq!(report.payments.settled_late, 1, "{report:?}");
    let id = only_task(&pool).await;
    assert!(has_event(&pool, id, EventType::PaymentSettledLate).await);
    assert_eq!(shop.queue.drain().await, [json!({"task_id": id.to_string(), "kind": "fetch"})], "queued by the sweep");
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "charged exactly once");

    // The client's retry of the same signature answers that task.
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_eq!(id_of(&reply), id);
    let space = shop.space().await;
    assert!(space["payments"][0]["transaction"].as_str().is_some_and(|t| t.starts_with("0x")), "{space}");
    assert_books_balance(&pool, &shop.pay_to).await;
    drop(facilitator);
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_facilitator_stopped_after_broadcasting_is_reconciled_to_one_task_and_no_second_charge(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let mut facilitator = OwnFacilitator::start(Duration::from_secs(120)).await;
    let shop = Shop::with(&pool, &facilitator.url, 300).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;

    chain.pause().await;
    let create = tokio::spawn({
        let request = shop.request("fetch", &input, Some(&signature));
        let app = shop.app.clone();
        async move { send(&app, request).await }
    });
    // Broadcast, not mined: the facilitator dies waiting for the receipt.
    wait_pending_from(OWN_FACILITATOR_ACCOUNT).await;
    facilitator.stop();
    let reply = create.await.unwrap();
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", reply.body);
    assert_eq!(shop.tasks().await, 0);

    chain.mine().await;
    chain.resume().await;
    assert_eq!(shop.sweep().await.payments.settled_late, 1);
    let id = only_task(&pool).await;
    assert!(has_event(&pool, id, EventType::PaymentSettledLate).await);
    // A second sweep finds nothing left to do, and charges nothing.
    assert_eq!(shop.sweep().await.payments, Default::default());
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "one charge");
    assert_eq!(shop.tasks().await, 1);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// Forwards `/verify` to the real facilitator, and answers every `/settle`
/// with a 502 without sending it anywhere: an unknown outcome whose
/// authorization is in truth never used.
async fn blackhole_facilitator() -> SocketAddr {
    let router = Router::new()
        .route("/verify", axum::routing::post(|body: axum::body::Bytes| async move { forward("verify", body).await }))
        .route("/settle", axum::routing::post(|| async { (StatusCode::BAD_GATEWAY, "lost") }));
    serve(router).await
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_unknown_outcome_whose_authorization_expires_unused_fails_with_nothing_charged(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let blackhole = blackhole_facilitator().await;
    // validBefore = now + 10: the facilitator verifies only with 6 s left.
    let shop = Shop::with(&pool, &format!("http://{blackhole}"), 10).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let valid_before: u64 =
        decode(&signature)["payload"]["authorization"]["validBefore"].as_str().unwrap().parse().unwrap();

    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.code(), "payment_pending", "{}", reply.body);
    // Still valid: it could land, so it stays open.
    let report = shop.sweep().await;
    assert_eq!((report.payments.open, report.payments.not_settled), (1, 0), "{report:?}");

    while chain_time().await < valid_before {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let report = shop.sweep().await;
    assert_eq!(report.payments.not_settled, 1, "{report:?}");
    assert_eq!(shop.attempts().await, [("failed".to_owned(), Some("not_settled".to_owned()))]);
    assert_eq!(shop.tasks().await, 0);
    assert_eq!(balance(&payer.address).await, 1_000_000, "nothing was charged");

    // The same signature again: it never landed, and now never can.
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::PAYMENT_REQUIRED, "payment_not_settled"), "{}", reply.body);
    assert!(reply.headers.contains_key("payment-required"), "a new payment can be signed at once");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn two_identical_paid_requests_at_once_buy_one_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;

    let (a, b) = tokio::join!(
        send(&shop.app, shop.request("fetch", &input, Some(&signature))),
        send(&shop.app, shop.request("fetch", &input, Some(&signature))),
    );
    let (won, lost) = if a.status == StatusCode::ACCEPTED { (a, b) } else { (b, a) };
    assert_eq!(won.status, StatusCode::ACCEPTED, "{}", won.body);
    // The other waited for it (in flight) or came after it (a replay).
    assert!(["payment_in_progress", "payment_replayed"].contains(&lost.code()), "{} {}", lost.status, lost.body);
    assert_eq!(shop.tasks().await, 1, "one task");
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "one charge");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn two_fresh_signatures_with_one_idempotency_key_buy_one_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let challenge = shop.challenge("fetch").await;
    let (first, second) = (payer.sign(&challenge).await, payer.sign(&challenge).await);
    let keyed = |signature: &str| {
        let mut r = shop.request("fetch", &input, Some(signature));
        r.headers_mut().insert("idempotency-key", HeaderValue::from_static("one-key"));
        r
    };

    let (a, b) = tokio::join!(send(&shop.app, keyed(&first)), send(&shop.app, keyed(&second)));
    let (won, lost) = if a.status == StatusCode::ACCEPTED { (a, b) } else { (b, a) };
    assert_eq!(won.status, StatusCode::ACCEPTED, "{}", won.body);
    // The loser either waited for the key (in flight) or, if it came
    // second, was answered the same task; it never settled its own.
    match lost.status {
        StatusCode::CONFLICT => assert_eq!(lost.code(), "request_in_progress", "{}", lost.body),
        StatusCode::ACCEPTED => assert_eq!(id_of(&lost), id_of(&won)),
        other => panic!("{other}: {}", lost.body),
    }
    // Afterwards, the second signature with the key is that same task.
    let again = send(&shop.app, keyed(&second)).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    assert_eq!(id_of(&again), id_of(&won));
    assert_eq!(shop.tasks().await, 1, "one task");
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "one charge");

    // The key with another request is a conflict, and charges nothing.
    let mut other = shop.request("fetch", &json!({"url": "http://127.0.0.1:2/"}), Some(&second));
    other.headers_mut().insert("idempotency-key", HeaderValue::from_static("one-key"));
    assert_eq!(send(&shop.app, other).await.code(), "idempotency_conflict");
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_lambda_deadline_shorter_than_the_settle_ends_pending_and_is_reconciled(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    // It would wait two minutes for the receipt.
    let facilitator = OwnFacilitator::start(Duration::from_secs(120)).await;
    let shop = Shop::with(&pool, &facilitator.url, 300).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;

    // The task-create function's app, as its `main` runs it, with the
    // invocation's context that lambda_http puts in the request: six
    // seconds beyond the margin kept for storing and queueing.
    let ctx = startup::task_create(&shop.config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"));
    let lambda = reeve_shared::http::task_create_app(ctx);
    let mut invocation = lambda_http::Context::default();
    let deadline = std::time::SystemTime::now() + reeve_shared::payments::STORE_MARGIN + Duration::from_secs(6);
    invocation.deadline = deadline.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut request = shop.request("fetch", &input, Some(&signature));
    request.extensions_mut().insert(invocation);

    chain.pause().await;
    let started = std::time::Instant::now();
    let reply = send(&lambda, request).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", reply.body);
    assert!(
        std::time::SystemTime::now() < deadline,
        "answered before the invocation's deadline, after {:?}",
        started.elapsed()
    );
    assert_eq!(shop.tasks().await, 0);

    chain.mine().await;
    chain.resume().await;
    assert_eq!(shop.sweep().await.payments.settled_late, 1);
    only_task(&pool).await;
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE);
    assert_books_balance(&pool, &shop.pay_to).await;
    drop(facilitator);
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_nul_in_the_input_is_refused_with_its_pointer_before_any_payment(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let nested = json!({"url": "http://127.0.0.1:1/", "meta": {"tags": ["ok", "a\u{0}b"]}});
    for (kind, payment) in [("fetch", Some(signature.as_str())), ("free", None)] {
        let reply = shop.create(kind, &nested, payment).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::BAD_REQUEST, "invalid_input"), "{kind}: {}", reply.body);
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("input/meta/tags/1"), "{kind}: {message}");
    }
    assert_eq!(shop.attempts().await, [], "no attempt recorded");
    assert_eq!(shop.tasks().await, 0);
    assert_eq!(balance(&payer.address).await, 1_000_000, "nothing charged");
    // The list's kind filter, which reaches SQL too.
    let reply = send(&shop.app, get_authed("/v1/tasks?kind=fe%00tch", &shop.token)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::BAD_REQUEST, "invalid_query"), "{}", reply.body);
    // The signature is still good for a clean input.
    let reply = shop.create("fetch", &json!({"url": "http://127.0.0.1:1/"}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// Credits are for Reeve's own failures only. A `fetch` is its owner's URL:
/// a 503 is a completed fetch with that status, and a name that does not
/// resolve is the owner's error, failed at once; neither earns a credit or
/// a second attempt. A run cut off by the worker's timeout does.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn only_reeves_own_failures_earn_a_credit(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let site = serve(
        Router::new()
            .route("/busy", axum::routing::get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "try later") }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "too late"
                }),
            ),
    )
    .await;
    let worker = shop.worker().await;
    let challenge = shop.challenge("fetch").await;
    let paid = |kind: &'static str, url: String| {
        let (shop, payer, challenge) = (&shop, &payer, &challenge);
        async move {
            let signature = payer.sign(challenge).await;
            let reply = shop.create(kind, &json!({ "url": url }), Some(&signature)).await;
            assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
            id_of(&reply)
        }
    };
    let run = |id: Id, kind: &'static str| {
        let worker = &worker;
        async move { process(worker, &json!({"task_id": id, "kind": kind}).to_string(), 1).await }
    };

    let busy = paid("fetch", format!("http://{site}/busy")).await;
    assert_eq!(run(busy, "fetch").await, Outcome::Done);
    let snapshot = send(&shop.app, get_authed(&format!("/v1/tasks/{busy}"), &shop.token)).await.body;
    assert_eq!((snapshot["status"].as_str(), snapshot["result"]["status"].as_u64()), (Some("completed"), Some(503)));

    let nowhere = paid("fetch", "http://no-such-host.invalid/".into()).await;
    assert_eq!(run(nowhere, "fetch").await, Outcome::Failed("fetch_unreachable"));
    let snapshot = send(&shop.app, get_authed(&format!("/v1/tasks/{nowhere}"), &shop.token)).await.body;
    assert_eq!(snapshot["attempts"], 1, "not retried: {snapshot}");

    // `slow` allows one second; the site takes five. One delivery allowed.
    let slow_challenge = shop.challenge("slow").await;
    let signature = payer.sign(&slow_challenge).await;
    let reply = shop.create("slow", &json!({ "url": format!("http://{site}/slow") }), Some(&signature)).await;
    let slow = id_of(&reply);
    let one_try = common::worker(&shop.worker_config().with(settings::MAX_RECEIVES, "1")).await;
    let outcome = process(&one_try, &json!({"task_id": slow, "kind": "slow"}).to_string(), 1).await;
    assert_eq!(outcome, Outcome::Failed("retries_exhausted"));

    let credits = shop.space().await["credits"].as_array().unwrap().clone();
    assert_eq!(credits.len(), 1, "{credits:?}");
    assert_eq!(credits[0]["source_task"], slow.to_string(), "only the timeout earned one");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// Forwards to the real facilitator, but before each `/settle` the payer
/// spends its whole balance elsewhere (anvil impersonates it): the payment
/// verified, and the real facilitator then refuses to settle it.
async fn spent_before_settle_facilitator() -> SocketAddr {
    let router = Router::new()
        .route("/verify", axum::routing::post(|body: axum::body::Bytes| async move { forward("verify", body).await }))
        .route(
            "/settle",
            axum::routing::post(|body: axum::body::Bytes| async move {
                let request: Value = serde_json::from_slice(&body).unwrap();
                let payer = request["paymentPayload"]["payload"]["authorization"]["from"].as_str().unwrap().to_owned();
                let held = balance(&payer).await;
                rpc("anvil_setBalance", json!([payer, "0xDE0B6B3A7640000"])).await;
                rpc("anvil_impersonateAccount", json!([payer])).await;
                let data = format!("0xa9059cbb{}{:064x}", common::chain::word(&fresh_address()), held);
                let hash = rpc("eth_sendTransaction", json!([{"from": payer, "to": TOKEN, "data": data}])).await;
                common::chain::wait_mined(&hash).await;
                rpc("anvil_stopImpersonatingAccount", json!([payer])).await;
                forward("settle", body).await
            }),
        );
    serve(router).await
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_settle_refusal_sends_payment_response_with_its_reason_and_the_identifier_may_be_reused(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let spender = spent_before_settle_facilitator().await;
    let shop = Shop::with(&pool, &format!("http://{spender}"), 300).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let challenge = shop.challenge("fetch").await;
    let named = |signature: &str| {
        let mut p = decode(signature);
        p["extensions"] =
            json!({"payment-identifier": {"info": {"required": false, "id": "pay_reused_after_a_refusal"}}});
        encode(&p)
    };
    let payer = Payer::new(&chain, 1_000_000).await;
    let refused = shop.create("fetch", &input, Some(&named(&payer.sign(&challenge).await))).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::PAYMENT_REQUIRED, "payment_failed"), "{}", refused.body);
    let response = decode(refused.headers["payment-response"].to_str().unwrap());
    assert_eq!(response["success"], false, "{response}");
    assert!(response["errorReason"].as_str().is_some_and(|r| !r.is_empty()), "{response}");
    assert_eq!(response["network"], "eip155:84532");
    assert_eq!(shop.attempts().await[0].0, "failed");
    assert_eq!(shop.tasks().await, 0);

    // Nothing was charged by that one: its payment-identifier may name a
    // new payment, through a facilitator that settles it.
    let shop = shop.through(&facilitator_url()).await;
    let funded = Payer::new(&chain, 1_000_000).await;
    let reply = shop.create("fetch", &input, Some(&named(&funded.sign(&challenge).await))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

// ------------------------------------------------------------------ proof of payment

/// The authorization's nonce, as signed.
fn nonce_of(signature: &str) -> String {
    decode(signature)["payload"]["authorization"]["nonce"].as_str().unwrap().to_owned()
}

/// Nothing was written for a payment that paid nothing: no task, no
/// payment, no credit.
async fn assert_nothing_written(pool: &PgPool) {
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM payments), (SELECT count(*) FROM credits)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(counts, (0, 0, 0), "tasks, payments, credits");
}

/// A used nonce is not a payment. The settle's outcome is unknown (the
/// facilitator's answer is a 502 and it never settled); the payer, who holds
/// its key, spends the same nonce itself, one unit to another address. Before,
/// the sweep took `authorizationState` = used for a payment, created the task
/// and the resend answered `202`: a task for gas.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payer_that_spends_its_own_nonce_while_the_settle_is_unknown_buys_nothing(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let blackhole = blackhole_facilitator().await;
    let shop = Shop::with(&pool, &format!("http://{blackhole}"), 300).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;

    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", reply.body);
    let elsewhere = fresh_address();
    let own = payer.spend_nonce(&chain, &nonce_of(&signature), &elsewhere, 1, false).await;
    common::chain::wait_mined(&json!(own)).await;
    assert_eq!(balance(&elsewhere).await, 1, "the payer's own transfer went through");

    let report = shop.sweep().await;
    assert_eq!((report.payments.not_settled, report.payments.settled_late), (1, 0), "{report:?}");
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::PAYMENT_REQUIRED, "payment_not_settled"), "{}", reply.body);
    assert!(reply.headers.contains_key("payment-required"), "a new payment can be signed at once");
    assert_nothing_written(&pool).await;
    assert_eq!(shop.attempts().await, [("failed".to_owned(), Some("not_settled".to_owned()))]);
    assert_eq!(balance(&shop.pay_to).await, 0, "the seller received nothing");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// The front-run: the facilitator's settlement waits in the pool (mining
/// held), the payer outbids it with its own transfer of the same nonce to
/// another address, and one block mines both, the payer's first. The
/// facilitator's transaction reverts; the seller received nothing, and so
/// nothing is bought.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payer_that_front_runs_the_facilitator_with_its_own_transfer_buys_nothing(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let facilitator = OwnFacilitator::start(Duration::from_secs(30)).await;
    let shop = Shop::with(&pool, &facilitator.url, 300).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;

    chain.pause().await;
    let create = tokio::spawn({
        let (app, request) = (shop.app.clone(), shop.request("fetch", &input, Some(&signature)));
        async move { send(&app, request).await }
    });
    let settlement = wait_pending_from(OWN_FACILITATOR_ACCOUNT).await;
    let elsewhere = fresh_address();
    let own = payer.spend_nonce(&chain, &nonce_of(&signature), &elsewhere, 1, true).await;
    chain.mine().await;
    chain.resume().await;
    let settled = rpc("eth_getTransactionReceipt", json!([settlement])).await;
    assert_eq!(settled["status"], "0x0", "the facilitator's settlement reverted: {settled}");
    assert_eq!(rpc("eth_getTransactionReceipt", json!([own])).await["status"], "0x1");
    assert_eq!(settled["blockNumber"], rpc("eth_getTransactionReceipt", json!([own])).await["blockNumber"]);

    // Told at once from the chain, or pending until a sweep reads it.
    let reply = create.await.unwrap();
    if reply.code() == "payment_pending" {
        assert_eq!(shop.sweep().await.payments.not_settled, 1);
    } else {
        assert_eq!(
            (reply.status, reply.code()),
            (StatusCode::PAYMENT_REQUIRED, "payment_not_settled"),
            "{}",
            reply.body
        );
    }
    let again = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!((again.status, again.code()), (StatusCode::PAYMENT_REQUIRED, "payment_not_settled"), "{}", again.body);
    assert_nothing_written(&pool).await;
    assert_eq!(balance(&shop.pay_to).await, 0, "the seller received nothing");
    assert_eq!(balance(&payer.address).await, 1_000_000 - 1, "the payer paid only its own transfer");
    assert_books_balance(&pool, &shop.pay_to).await;
    drop(facilitator);
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_valid_before_further_than_max_timeout_is_refused_before_anything_is_recorded(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let mut for_a_year = decode(&signature);
    for_a_year["payload"]["authorization"]["validBefore"] = json!((chain_time().await + 365 * 86_400).to_string());
    let reply = shop.create("fetch", &input, Some(&encode(&for_a_year))).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::PAYMENT_REQUIRED, "payment_invalid"), "{}", reply.body);
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("valid_before_too_far") && message.contains("300 s"), "{message}");
    assert!(reply.headers.contains_key("payment-required"));
    assert_eq!(shop.attempts().await, [], "nothing recorded, nothing verified");
    // As the SDK signs it (validBefore = now + maxTimeoutSeconds), it is taken.
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// A credit never pays under an `Idempotency-Key` whose payment is pending:
/// a standard x402 client probes without a signature when it retries, and
/// that probe used to spend the credit, then the late payment stored a
/// second task: two charges for one request.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_credit_is_not_spent_under_a_key_whose_payment_is_pending(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let shop = Shop::new(&pool).await;
    let challenge = shop.earn_a_credit(&payer).await;

    // The next payment settles on chain, its answer is lost.
    let lossy = lossy_facilitator().await;
    let shop = shop.through(&format!("http://{lossy}")).await;
    let input = json!({"url": "http://127.0.0.1:1/b"});
    let keyed = |payment: Option<&str>| {
        let mut r = shop.request("fetch", &input, payment);
        r.headers_mut().insert("idempotency-key", HeaderValue::from_static("retry-me"));
        r
    };
    let signature = payer.sign(&challenge).await;
    let reply = send(&shop.app, keyed(Some(&signature))).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", reply.body);
    // The client's probe without a signature: the key's payment is pending.
    let probe = send(&shop.app, keyed(None)).await;
    assert_eq!((probe.status, probe.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", probe.body);
    assert!(probe.headers.contains_key("retry-after"));
    assert_eq!(shop.space().await["credits"][0]["spent_by"], Value::Null, "the credit is not spent");

    assert_eq!(shop.sweep().await.payments.settled_late, 1);
    let late = send(&shop.app, keyed(None)).await;
    assert_eq!(late.status, StatusCode::ACCEPTED, "{}", late.body);
    assert_eq!(late.headers["idempotent-replayed"], "true");
    let receipt = decode(late.headers["payment-response"].to_str().unwrap());
    assert_eq!(receipt["success"], true, "the key's task answers with its payment's receipt");
    let keyed_tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE idempotency_key = 'retry-me'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(keyed_tasks, 1, "one task for the key");
    assert_eq!(shop.tasks().await, 2, "the canceled one, and the late one");
    assert_eq!(shop.space().await["credits"][0]["spent_by"], Value::Null, "the credit is still there");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// A payment refused once may be tried again under its key, unless another
/// payment holds the key meanwhile: that one's answer, never a 500 from the
/// key's unique index.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_refused_payment_sent_again_under_a_key_another_holds_is_a_409(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let blackhole = blackhole_facilitator().await;
    let shop = Shop::with(&pool, &format!("http://{blackhole}"), 300).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let challenge = shop.challenge("fetch").await;
    let (broke, funded) = (Payer::new(&chain, 0).await, Payer::new(&chain, 1_000_000).await);
    let (refused, pending) = (broke.sign(&challenge).await, funded.sign(&challenge).await);
    let keyed = |signature: &str| {
        let mut r = shop.request("fetch", &input, Some(signature));
        r.headers_mut().insert("idempotency-key", HeaderValue::from_static("one-key"));
        r
    };
    let reply = send(&shop.app, keyed(&refused)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::PAYMENT_REQUIRED, "payment_invalid"), "{}", reply.body);
    let reply = send(&shop.app, keyed(&pending)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", reply.body);
    let reply = send(&shop.app, keyed(&refused)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", reply.body);
    assert_nothing_written(&pool).await;
    shop.done().await;
}

impl Shop {
    /// A text file uploaded to the Space (presigned PUT), checked: its id
    /// and object key.
    async fn upload(&self, text: &str) -> (String, String) {
        let body = json!({"filename": "in.txt", "content_type": "text/plain", "size": text.len()});
        let upload = send(&self.app, post_json("/v1/uploads", Some(&self.token), &body)).await;
        assert_eq!(upload.status, StatusCode::CREATED, "{}", upload.body);
        let mut put = reqwest::Client::new().put(upload.body["url"].as_str().unwrap()).body(text.to_owned());
        for (name, value) in upload.body["headers"].as_object().unwrap() {
            if name != "content-length" {
                put = put.header(name, value.as_str().unwrap());
            }
        }
        assert_eq!(put.send().await.unwrap().status(), reqwest::StatusCode::OK);
        let id = upload.body["upload_id"].as_str().unwrap().to_owned();
        let key = sqlx::query_scalar("SELECT key FROM uploads WHERE id = $1")
            .bind(id.parse::<Id>().unwrap())
            .fetch_one(&self.pool)
            .await
            .unwrap();
        (id, key)
    }

    /// Deletes an object as the bucket's lifecycle rule would.
    async fn expire(&self, key: &str) {
        let bucket = common::bucket();
        common::s3().await.delete_object().bucket(bucket).key(key).send().await.unwrap();
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_upload_gone_before_a_priced_create_charges_nothing_and_gone_before_the_run_leaves_a_credit(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let (id, key) = shop.upload("hello\n").await;
    let input = json!({ "upload_id": id });
    let unpaid = shop.create("paid_digest", &input, None).await;
    assert_eq!(unpaid.status, StatusCode::PAYMENT_REQUIRED, "{}", unpaid.body);
    let signature = payer.sign(unpaid.headers["payment-required"].to_str().unwrap()).await;

    // Gone before the create: refused before any payment.
    shop.expire(&key).await;
    let reply = shop.create("paid_digest", &input, Some(&signature)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::UNPROCESSABLE_ENTITY, "upload_missing"), "{}", reply.body);
    assert!(reply.body["error"]["message"].as_str().unwrap().contains("Nothing was charged"), "{}", reply.body);
    assert_eq!(shop.attempts().await, []);
    assert_eq!(balance(&payer.address).await, 1_000_000, "nothing charged");

    // Gone after the create, before the run: the expiry is Reeve's, so a credit.
    let (id, key) = shop.upload("hello again\n").await;
    let input = json!({ "upload_id": id });
    let unpaid = shop.create("paid_digest", &input, None).await;
    let signature = payer.sign(unpaid.headers["payment-required"].to_str().unwrap()).await;
    let reply = shop.create("paid_digest", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let task = id_of(&reply);
    shop.expire(&key).await;
    let worker = shop.worker().await;
    let outcome = process(&worker, &json!({"task_id": task, "kind": "paid_digest"}).to_string(), 1).await;
    assert_eq!(outcome, Outcome::Failed("upload_missing"));
    let credits = shop.space().await["credits"].as_array().unwrap().clone();
    assert_eq!(credits.len(), 1, "{credits:?}");
    assert_eq!(
        (credits[0]["source_task"].as_str(), credits[0]["reason"].as_str()),
        (Some(task.to_string().as_str()), Some("upload_missing"))
    );
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "charged once, for the task that got its credit");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

impl Shop {
    /// The sweeper, as its Lambda and `reeve sweep` build it, from `config`
    /// (this shop's, or with another chain endpoint).
    async fn sweeper(&self, config: &Config) -> Sweeper {
        startup::sweeper(config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A chain endpoint that accepts connections and never answers.
async fn stalled_endpoint() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    addr
}

/// A sweep re-sends lost tasks first, and reconciles payments in what is
/// left of its invocation: a chain endpoint that stalls cannot starve the
/// re-send, nor make the sweep outlive its Lambda.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_stalled_chain_endpoint_does_not_keep_a_sweep_from_resending_a_lost_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let blackhole = blackhole_facilitator().await;
    let shop = Shop::with(&pool, &format!("http://{blackhole}"), 300).await;
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let reply = shop.create("fetch", &json!({"url": "http://127.0.0.1:1/"}), Some(&signature)).await;
    assert_eq!(reply.code(), "payment_pending", "{}", reply.body);
    // A lost task: created, its message gone.
    let lost = shop.create("free", &json!({}), None).await;
    assert_eq!(lost.status, StatusCode::ACCEPTED, "{}", lost.body);
    shop.queue.drain().await;

    let stalled = stalled_endpoint().await;
    let sweeper = shop
        .sweeper(
            &shop.config.clone().with(CHAIN_RPC_URLS, common::chain::chain_rpc_urls_at(&format!("http://{stalled}"))),
        )
        .await;
    // The scheduled invocation, as the sweeper Lambda runs it, 12 s before
    // its deadline.
    let started = std::time::Instant::now();
    // 24 s: room for the settle and its proof on a loaded machine (at 12 s,
    // CI's parallel suite ran past the settle's share and answered
    // payment_pending), and still short of the 3 s settle plus the full 25 s
    // wait, so the cut is what makes it answer in time.
    let deadline = std::time::SystemTime::now() + Duration::from_secs(24);
    let report = sweeper.handle_invocation(json!({"older_than_seconds": 0}), Some(deadline)).await.unwrap();
    let took = started.elapsed();
    assert!(std::time::SystemTime::now() < deadline, "the sweep outlived its invocation: {took:?}");
    assert_eq!(report["resent_queued"], 1, "{report}");
    assert_eq!(shop.queue.drain().await, [json!({"task_id": id_of(&lost).to_string(), "kind": "free"})]);
    let payments = &report["payments"];
    assert_eq!((payments["settled_late"].as_u64(), payments["not_settled"].as_u64()), (Some(0), Some(0)), "{report}");
    let undecided = payments["chain_errors"].as_u64().unwrap() + payments["deferred"].as_u64().unwrap();
    assert_eq!(undecided, 1, "{report}");
    // Left open and released: the next sweep (with a working endpoint) looks again.
    let open: Vec<(String, bool)> =
        sqlx::query_as("SELECT status, claimed_until IS NOT NULL AND claimed_until > now() FROM payment_attempts")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(open, [("settling".to_owned(), false)]);
    println!("sweep with a stalled chain endpoint: {took:?}, {report}");
    shop.done().await;
}

/// Forwards to the real facilitator, but a settle takes `delay` more.
async fn slow_settle_facilitator(delay: Duration) -> SocketAddr {
    let router = Router::new()
        .route("/verify", axum::routing::post(|body: axum::body::Bytes| async move { forward("verify", body).await }))
        .route(
            "/settle",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                tokio::time::sleep(delay).await;
                forward("settle", body).await
            }),
        );
    serve(router).await
}

/// One `tools/call` of `tool` with `arguments` and `meta` as its `_meta`,
/// through the `mcp` function's router; its `result`.
async fn mcp_call(router: &Router, token: &str, tool: &str, arguments: Value, meta: Value) -> Value {
    use tower::ServiceExt;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments, "_meta": meta,
    }});
    let request = Request::post(reeve_shared::mcp::PATH)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::from(call.to_string()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let body: Value =
        serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap()).unwrap();
    body["result"].clone()
}

/// The payment `signature` carrying x402's `payment-identifier` id `id`.
fn identified(signature: &str, id: &str) -> Value {
    let mut payment = decode(signature);
    payment["extensions"] = json!({"payment-identifier": {"info": {"required": false, "id": id}}});
    payment
}

/// MCP has no `Idempotency-Key`: a paid call's `payment-identifier` id is
/// its key. Sent again, with the same payment or with a fresh signature
/// under the same id (x402's clients sign afresh whenever they are asked to
/// pay), the call answers the task it bought and its stored receipt, with
/// one charge; the id with another input is a conflict that charges nothing.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_mcp_call_sent_again_under_its_payment_identifier_is_the_same_task_and_one_charge(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let shop = Shop::new(&pool).await;
    let ctx = startup::mcp(&shop.config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"));
    let router = reeve_shared::mcp::router(ctx);
    let challenge = shop.challenge("fetch").await;
    let id = "pay_mcp_resent_0123456789";
    let url = json!({"url": "http://127.0.0.1:1/"});
    let payment = identified(&payer.sign(&challenge).await, id);

    let first = mcp_call(&router, &shop.token, "fetch", url.clone(), json!({"x402/payment": payment})).await;
    assert_ne!(first["isError"], true, "{first}");
    let task = first["structuredContent"]["id"].as_str().unwrap_or_else(|| panic!("{first}")).to_owned();
    let receipt = first["_meta"]["x402/payment-response"].clone();
    assert_eq!(receipt["success"], true, "{first}");

    let fresh = identified(&payer.sign(&challenge).await, id);
    for (name, payment) in [("the same payment", &payment), ("a fresh signature under the same id", &fresh)] {
        let again = mcp_call(&router, &shop.token, "fetch", url.clone(), json!({"x402/payment": payment})).await;
        assert_eq!(again["structuredContent"]["id"], task.as_str(), "{name}: {again}");
        assert_eq!(again["_meta"]["x402/payment-response"], receipt, "{name}: the stored receipt");
    }
    let other = identified(&payer.sign(&challenge).await, id);
    let conflict =
        mcp_call(&router, &shop.token, "fetch", json!({"url": "http://127.0.0.1:2/"}), json!({"x402/payment": other}))
            .await;
    assert_eq!(conflict["isError"], true, "{conflict}");
    assert_eq!(conflict["structuredContent"]["error"]["code"], "idempotency_conflict", "{conflict}");

    assert_eq!(shop.tasks().await, 1, "one task");
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "one charge");
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// While the payment of an MCP call is pending, the call sent again under
/// its `payment-identifier` id, with a fresh signature or with no payment
/// and the id in `_meta["reeve/payment-identifier"]`, is `payment_pending`
/// (a fresh signature was `payment_identifier_conflict`, which has a client
/// sign under a new id: a second charge), settles nothing, and the Space's
/// credit does not pay for it; once the payment is resolved, each answers
/// its one task.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_mcp_call_resent_under_its_identifier_while_its_payment_is_pending_waits_and_charges_once(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let shop = Shop::new(&pool).await;
    let challenge = shop.earn_a_credit(&payer).await;

    // The call's settle goes through; its answer is lost.
    let lossy = lossy_facilitator().await;
    let shop = shop.through(&format!("http://{lossy}")).await;
    let ctx = startup::mcp(&shop.config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"));
    let router = reeve_shared::mcp::router(ctx);
    let id = "pay_mcp_pending_0123456789";
    let url = json!({"url": "http://127.0.0.1:1/b"});
    let (payment, fresh) =
        (identified(&payer.sign(&challenge).await, id), identified(&payer.sign(&challenge).await, id));
    let paid = |payment: &Value| json!({"x402/payment": payment});
    let named = json!({"reeve/payment-identifier": id});

    let first = mcp_call(&router, &shop.token, "fetch", url.clone(), paid(&payment)).await;
    assert_eq!(first["structuredContent"]["error"]["code"], "payment_pending", "{first}");
    assert_eq!(balance(&payer.address).await, 1_000_000 - 2 * PRICE, "the settle went through");
    for (name, meta) in [("a fresh signature", paid(&fresh)), ("no payment, naming the id", named.clone())] {
        let resent = mcp_call(&router, &shop.token, "fetch", url.clone(), meta).await;
        assert_eq!(resent["structuredContent"]["error"]["code"], "payment_pending", "{name}: {resent}");
    }
    assert_eq!(shop.attempts().await.len(), 2, "the fresh signature was never settled");
    assert_eq!(shop.space().await["credits"][0]["spent_by"], Value::Null, "the credit is not spent");

    // The same payment again resolves it from the chain: its one task,
    // which the call under the id answers too, paid afresh or not at all.
    let resolved = mcp_call(&router, &shop.token, "fetch", url.clone(), paid(&payment)).await;
    let task = resolved["structuredContent"]["id"].as_str().unwrap_or_else(|| panic!("{resolved}")).to_owned();
    for (name, meta) in [("a fresh signature", paid(&fresh)), ("no payment, naming the id", named)] {
        let again = mcp_call(&router, &shop.token, "fetch", url.clone(), meta).await;
        assert_eq!(again["structuredContent"]["id"], task.as_str(), "{name}: {again}");
        assert_eq!(again["_meta"]["x402/payment-response"]["success"], true, "{name}: its receipt");
    }
    assert_eq!(shop.tasks().await, 2, "the canceled one, and this call's");
    assert_eq!(balance(&payer.address).await, 1_000_000 - 2 * PRICE, "one charge for the call");
    assert_eq!(shop.space().await["credits"][0]["spent_by"], Value::Null, "the credit is still there");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// An MCP paid call asking to wait 25 s, through the Lambda handler with a
/// 24 s deadline in its context, and a settle that takes 3 s: the wait is
/// cut to what is left after the settle, so the agent gets its task and
/// receipt before the invocation ends (before, settle plus the full wait
/// passed it, the agent got nothing, and its retry was `payment_replayed`).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_paid_mcp_call_that_waits_answers_before_the_lambda_deadline(pool: PgPool) {
    use reeve_shared::mcp;
    use tower::ServiceExt;
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let slow = slow_settle_facilitator(Duration::from_secs(3)).await;
    let shop = Shop::with(&pool, &format!("http://{slow}"), 300).await;
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    // The MCP function as its Lambda builds it: loopback hosts, no progress.
    let ctx = startup::mcp(&shop.config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"));
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "fetch",
        "arguments": {"url": "http://127.0.0.1:1/", "wait_seconds": 25},
        "_meta": {"x402/payment": decode(&signature)},
    }});
    let mut invocation = lambda_http::Context::default();
    // 24 s: room for the settle and its proof on a loaded machine (at 12 s,
    // CI's parallel suite ran past the settle's share and answered
    // payment_pending), and still short of the 3 s settle plus the full 25 s
    // wait, so the cut is what makes it answer in time.
    let deadline = std::time::SystemTime::now() + Duration::from_secs(24);
    invocation.deadline = deadline.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut request = Request::post(mcp::PATH)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {}", shop.token))
        .body(Body::from(call.to_string()))
        .unwrap();
    request.extensions_mut().insert(invocation);

    let started = std::time::Instant::now();
    let response = mcp::router(ctx).oneshot(request).await.unwrap();
    let took = started.elapsed();
    assert!(std::time::SystemTime::now() < deadline, "answered after the invocation's deadline ({took:?})");
    assert!(took >= Duration::from_secs(3), "the settle took its 3 s: {took:?}");
    let body: Value =
        serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap()).unwrap();
    let result = &body["result"];
    assert_eq!(result["_meta"]["x402/payment-response"]["success"], true, "{body}");
    assert_eq!(result["structuredContent"]["status"], "queued", "no worker runs it: {body}");
    println!("paid MCP call, wait_seconds 25, deadline 24 s: answered in {took:?}");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}
