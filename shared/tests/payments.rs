//! Paying for tasks against the real local payment stack (`scripts/payments.sh
//! up`): anvil with the EIP-3009 test token, and the @x402 facilitator. Every
//! payment is signed by coinbase's official x402 Python SDK
//! (`scripts/payments/pay.py`), and every balance is read from the chain.
//!
//! Each test pays from a fresh key (minted tokens by the test) to a fresh
//! `payTo`, so tests running in parallel on one chain never see each other's
//! transfers.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use base64::Engine;
use common::chain::{ChainLock, Payer, TOKEN, balance, fresh_address, rpc};
use common::{Reply, TestQueue, get_authed, new_session, post_json, send};
use reeve_shared::catalog::Catalog;
use reeve_shared::executors::ExecDeps;
use reeve_shared::http::{ApiContext, app};
use reeve_shared::ids::Id;
use reeve_shared::outbound::{Outbound, OutboundPolicy};
use reeve_shared::redis_client::RedisClient;
use reeve_shared::settings::WorkerSettings;
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

/// Two priced kinds of the same price (`fetch` and `fetch2`) and a free one.
/// The mainnet price comes first, so the SDK must choose the local one.
fn catalog(pay_to: &str, facilitator: &str, max_timeout: u32) -> Catalog {
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
            [[tasks.{kind}.accepts]]
            asset = "usdc-base"
            amount_usd = "0.01"
            [[tasks.{kind}.accepts]]
            asset = "local"
            amount_usd = "0.01"
            "#
        )
    };
    let text = format!(
        r#"
        [payments]
        pay_to = "{pay_to}"
        facilitator_url = "{facilitator}"
        max_timeout_seconds = {max_timeout}

        [assets.usdc-base]
        network = "eip155:8453"
        contract = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
        decimals = 6
        usd_peg = true
        name = "USD Coin"
        version = "2"

        [assets.local]
        network = "eip155:84532"
        contract = "{TOKEN}"
        decimals = 6
        usd_peg = true
        name = "USDC"
        version = "2"
        {}
        {}
        "#,
        priced("fetch"),
        priced("fetch2"),
    );
    Catalog::parse(&text).unwrap_or_else(|e| panic!("{e}"))
}

struct Shop {
    app: Router,
    token: String,
    pay_to: String,
    queue: TestQueue,
    pool: PgPool,
    catalog: Catalog,
}

impl Shop {
    async fn new(pool: &PgPool) -> Shop {
        Self::with(pool, &facilitator_url(), 300).await
    }

    async fn with(pool: &PgPool, facilitator: &str, max_timeout: u32) -> Shop {
        let pay_to = fresh_address();
        let catalog = catalog(&pay_to, facilitator, max_timeout);
        let queue = TestQueue::new().await;
        let redis_url = common::redis_url();
        let mut settings = common::test_settings(&redis_url);
        settings.queue_url = queue.url.clone();
        let aws = common::aws().await;
        let ctx = ApiContext::new(catalog.clone(), pool.clone(), RedisClient::new(&redis_url).unwrap(), aws, settings);
        let app = app(ctx);
        let (_, token) = new_session(&app).await;
        Shop { app, token, pay_to, queue, pool: pool.clone(), catalog }
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

    async fn done(self) {
        self.queue.delete().await;
    }
}

fn id_of(reply: &Reply) -> Id {
    reply.body["id"].as_str().unwrap_or_else(|| panic!("no id in {}", reply.body)).parse().unwrap()
}

/// A worker whose fetches may reach plain-http loopback servers.
fn worker(pool: &PgPool, catalog: Catalog, s3: aws_sdk_s3::Client) -> WorkerContext {
    let settings = WorkerSettings {
        database_url: reeve_shared::auth::Secret::text("DATABASE_URL", String::new()),
        redis_url: common::redis_url(),
        bucket: std::env::var("REEVE_BUCKET").unwrap(),
        queue_url: None,
        concurrency: 1,
        max_receives: 5,
        fetch_max_bytes: 1024 * 1024,
        output_retention_days: None,
    };
    let policy = OutboundPolicy { allow_http: true, allow: vec!["127.0.0.1".into()], ..OutboundPolicy::default() };
    let exec = ExecDeps {
        db: pool.clone(),
        s3,
        bucket: settings.bucket.clone(),
        outbound: Outbound::new(policy.clone()).unwrap(),
        operators: Outbound::new(policy).unwrap(),
        fetch_max_bytes: settings.fetch_max_bytes,
        output_retention_days: settings.output_retention_days,
    };
    WorkerContext::new(catalog, pool.clone(), RedisClient::new(&common::redis_url()).unwrap(), exec, settings)
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
    let worker = worker(&pool, shop.catalog.clone(), common::aws().await.s3);
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

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payment_is_used_once_whatever_the_kind_or_space(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let first = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let after_first = balance(&payer.address).await;

    let (_, other_token) = new_session(&shop.app).await;
    let mut other_space = shop.request("fetch", &input, Some(&signature));
    other_space.headers_mut().insert("authorization", format!("Bearer {other_token}").parse().unwrap());
    for (name, request) in [
        ("the same request", shop.request("fetch", &input, Some(&signature))),
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
    assert_eq!(balance(&payer.address).await, after_first, "a replay moves nothing");
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

/// Forwards to the real facilitator, but answers the first `/settle` with a
/// 502 after the real one has settled: the outcome a client sees as unknown.
async fn lossy_facilitator() -> SocketAddr {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
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
async fn a_settle_with_an_unknown_outcome_resolves_on_retry_to_exactly_one_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let lossy = lossy_facilitator().await;
    let shop = Shop::with(&pool, &format!("http://{lossy}"), 300).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;

    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::SERVICE_UNAVAILABLE, "facilitator_unavailable"));
    assert!(reply.body["error"]["message"].as_str().unwrap().contains("same PAYMENT-SIGNATURE"));
    assert_eq!(shop.tasks().await, 0);
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "the settle went through");

    // The retry learns the authorisation is spent: the task it paid for.
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    assert_eq!(shop.tasks().await, 1);
    // And from then on it is a replay like any other.
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.code(), "payment_replayed");
    assert_eq!(shop.tasks().await, 1);
    assert_eq!(balance(&payer.address).await, 1_000_000 - PRICE, "charged once");
    let space = shop.space().await;
    assert_eq!(space["payments"][0]["task_id"], id.to_string());
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

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_paid_task_that_fails_leaves_a_credit_that_pays_the_next_one(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    // Nothing listens on port 1: every attempt fails, retryably.
    let input = json!({"url": "http://127.0.0.1:1/"});
    let signature = payer.sign(&shop.challenge("fetch").await).await;
    let reply = shop.create("fetch", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let failed = id_of(&reply);
    shop.queue.drain().await;

    let worker = worker(&pool, shop.catalog.clone(), common::aws().await.s3);
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
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_space_route_needs_a_session_and_is_in_the_openapi_document(pool: PgPool) {
    let shop = Shop::new(&pool).await;
    let reply = send(&shop.app, Request::get("/v1/space").body(Body::empty()).unwrap()).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::UNAUTHORIZED, "missing_token"));
    assert_eq!(shop.space().await, json!({"payments": [], "credits": []}));
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
