//! Test harness shared by the integration tests: a context on a fresh
//! database (sqlx::test makes one per test) and the stack's real Redis, and a
//! way to send a request through a router in-process.

pub mod chain;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use reeve_shared::auth::Secret;
use reeve_shared::aws::AwsClients;
use reeve_shared::catalog::Catalog;
use reeve_shared::executors::ExecDeps;
use reeve_shared::http::{ApiContext, Ctx};
use reeve_shared::ids::Id;
use reeve_shared::outbound::{Outbound, OutboundPolicy};
use reeve_shared::redis_client::RedisClient;
use reeve_shared::settings::{ApiSettings, WorkerSettings};
use reeve_shared::worker::{Runner, WorkerContext};
use serde_json::{Value, json};
use sqlx::PgPool;
use tower::ServiceExt;

/// The messages of an SSE response until its body ends, decoded as the CLI
/// decodes them (sse-stream); comments and bare `retry:` hints carry no data
/// and are left out.
pub async fn sse_messages(response: reqwest::Response) -> Vec<sse_stream::Sse> {
    use futures_util::StreamExt;
    sse_stream::SseStream::from_bytes_stream(response.bytes_stream())
        .map(|message| message.expect("the relay writes valid SSE"))
        .filter(|message| std::future::ready(message.data.is_some()))
        .collect()
        .await
}

/// The development catalog, `reeve.dev.toml`: the shipped tasks, priced on
/// the local chain, which the stack's facilitator settles. (`reeve.toml`,
/// what deployments ship, prices on mainnet: tests/suite/catalog.rs reads it.)
pub const DEV_CATALOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../reeve.dev.toml");

pub fn shipped_catalog() -> Catalog {
    Catalog::load(Path::new(DEV_CATALOG)).expect("reeve.dev.toml is valid")
}

/// The development catalog plus the test's own kinds (`[tasks.*]` tables),
/// which a test's own runner stands in for.
pub fn catalog_with(extra: &str) -> Catalog {
    let shipped = std::fs::read_to_string(DEV_CATALOG).unwrap();
    Catalog::parse(&format!("{shipped}\n{extra}")).unwrap_or_else(|e| panic!("{e}"))
}

/// Base mainnet's USDC as a catalog asset, `usdc-base`: a price no local
/// client can pay, beside one on the local chain.
pub const USDC_BASE: &str = r#"
[assets.usdc-base]
network = "eip155:8453"
contract = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
decimals = 6
usd_peg = true
name = "USD Coin"
version = "2"
"#;

/// A catalog of the test's own that pays `pay_to` through `facilitator`:
/// two USD-pegged assets, Base mainnet's USDC (`usdc-base`) and the local
/// chain's test token (`local`), then `tasks` (TOML tables).
pub fn paid_catalog(pay_to: &str, facilitator: &str, max_timeout_seconds: u32, tasks: &str) -> Catalog {
    let token = chain::TOKEN;
    let text = format!(
        r#"
        [payments]
        pay_to = "{pay_to}"
        facilitator_url = "{facilitator}"
        max_timeout_seconds = {max_timeout_seconds}

        {USDC_BASE}

        [assets.local]
        network = "eip155:84532"
        contract = "{token}"
        decimals = 6
        usd_peg = true
        name = "USDC"
        version = "2"
        {tasks}
        "#
    );
    Catalog::parse(&text).unwrap_or_else(|e| panic!("{e}"))
}

/// `kind`'s prices in a [`paid_catalog`]: a cent on Base mainnet first, then
/// a cent on the local chain, so a client has to choose the local one.
pub fn cent_on_mainnet_then_local(kind: &str) -> String {
    format!(
        r#"
        [[tasks.{kind}.accepts]]
        asset = "usdc-base"
        amount_usd = "0.01"
        [[tasks.{kind}.accepts]]
        asset = "local"
        amount_usd = "0.01"
        "#
    )
}

/// Worker settings on the stack's bucket and the given Redis: 4 runs at
/// once, 5 deliveries, a 1 MiB fetch cap.
pub fn worker_settings(redis_url: &str) -> WorkerSettings {
    WorkerSettings {
        database_url: Secret::text("DATABASE_URL", String::new()),
        redis_url: redis_url.to_owned(),
        bucket: env("REEVE_BUCKET"),
        queue_url: None,
        concurrency: 4,
        max_receives: 5,
        fetch_max_bytes: 1024 * 1024,
        output_retention_days: None,
        lease: WorkerSettings::DEFAULT_LEASE,
        backoff: reeve_shared::worker::Backoff::default(),
    }
}

/// A worker running the catalog's executors on `pool` (its claims and its
/// executors both), with this S3 client and the settings' Redis. Tests
/// plug their own `runner` in afterwards.
pub fn worker_context(
    catalog: Catalog,
    pool: &PgPool,
    s3: aws_sdk_s3::Client,
    settings: WorkerSettings,
) -> WorkerContext {
    worker_context_with_policy(catalog, pool, s3, settings, OutboundPolicy::default())
}

/// [`worker_context`] whose fetches and operator calls go by `policy`
/// (to reach a test's loopback servers, say).
pub fn worker_context_with_policy(
    catalog: Catalog,
    pool: &PgPool,
    s3: aws_sdk_s3::Client,
    settings: WorkerSettings,
    policy: OutboundPolicy,
) -> WorkerContext {
    let outbound = || Outbound::new(policy.clone()).unwrap();
    let exec = ExecDeps {
        db: pool.clone(),
        s3,
        bucket: settings.bucket.clone(),
        outbound: outbound(),
        operators: outbound(),
        fetch_max_bytes: settings.fetch_max_bytes,
        output_retention_days: settings.output_retention_days,
    };
    let redis = RedisClient::new(&settings.redis_url).unwrap();
    WorkerContext::new(catalog, pool.clone(), redis, exec, settings)
}

/// `ctx` with the test's `runner` in place of the catalog's executors.
pub fn with_runner(ctx: WorkerContext, runner: Arc<dyn Runner>) -> WorkerContext {
    WorkerContext { runner, ..ctx }
}

/// The stack's S3 and SQS, configured as every binary is (`startup`).
pub async fn aws() -> AwsClients {
    reeve_shared::startup::aws_clients(&reeve_shared::settings::Config::from_env()).await
}

pub fn redis_url() -> String {
    env("REDIS_URL")
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests with scripts/test.sh"))
}

/// The stack's bucket and queue; secrets of the tests' own.
pub fn test_settings(redis_url: &str) -> ApiSettings {
    ApiSettings {
        pepper: Secret::new("REEVE_PEPPER", b"test-pepper-test-pepper-test-pepper!".to_vec()).unwrap(),
        token_key: Secret::new("REEVE_TOKEN_KEY", b"test-token-key-test-token-key-test!!".to_vec()).unwrap(),
        database_url: Secret::text("DATABASE_URL", String::new()),
        redis_url: redis_url.to_owned(),
        bucket: env("REEVE_BUCKET"),
        queue_url: env("REEVE_QUEUE_URL"),
    }
}

/// A context on the given database and the stack's Redis, S3 and SQS.
pub async fn ctx(pool: PgPool) -> Ctx {
    ctx_with_redis(pool, &redis_url()).await
}

pub async fn ctx_with_redis(pool: PgPool, redis_url: &str) -> Ctx {
    let aws = aws().await;
    ApiContext::new(shipped_catalog(), pool, RedisClient::new(redis_url).unwrap(), aws, test_settings(redis_url))
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    /// The stable error code of an error envelope.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error envelope: {}", self.body))
    }
}

pub async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await.expect("routers are infallible");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("body is not JSON: {:?}", String::from_utf8_lossy(&bytes)))
    };
    Reply { status, headers, body }
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

pub fn post_json(uri: &str, token: Option<&str>, body: &Value) -> Request<Body> {
    let mut builder = Request::post(uri).header("content-type", "application/json");
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder.body(Body::from(body.to_string())).unwrap()
}

pub fn get_authed(uri: &str, token: &str) -> Request<Body> {
    Request::get(uri).header("authorization", format!("Bearer {token}")).body(Body::empty()).unwrap()
}

/// Creates a space and opens a session on it: `(space_id, token)`.
pub async fn new_session(app: &Router) -> (String, String) {
    let created = send(app, Request::post("/v1/spaces").body(Body::empty()).unwrap()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let space_id = created.body["space_id"].as_str().unwrap().to_owned();
    let session = send(app, post_json("/v1/sessions", None, &serde_json::json!({ "space_id": space_id }))).await;
    assert_eq!(session.status, StatusCode::OK, "{}", session.body);
    (space_id, session.body["token"].as_str().unwrap().to_owned())
}

/// The whole API on a queue of the test's own, with a session open.
pub struct QueuedApi {
    pub app: Router,
    pub token: String,
    pub queue: TestQueue,
}

impl QueuedApi {
    pub async fn new(pool: &sqlx::PgPool, catalog: Catalog) -> QueuedApi {
        let queue = TestQueue::new().await;
        let redis_url = redis_url();
        let mut settings = test_settings(&redis_url);
        settings.queue_url = queue.url.clone();
        let redis = reeve_shared::redis_client::RedisClient::new(&redis_url).unwrap();
        let ctx = ApiContext::new(catalog, pool.clone(), redis, aws().await, settings);
        let app = reeve_shared::http::app(ctx);
        let (_, token) = new_session(&app).await;
        QueuedApi { app, token, queue }
    }

    /// Creates a task of `kind` with `input`: its id.
    pub async fn create(&self, kind: &str, input: Value) -> Id {
        let created =
            send(&self.app, post_json(&format!("/v1/tasks/{kind}"), Some(&self.token), &json!({ "input": input })))
                .await;
        assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
        created.body["id"].as_str().unwrap().parse().unwrap()
    }
}

/// A queue of this test's own, deleted by [`TestQueue::delete`].
pub struct TestQueue {
    sqs: aws_sdk_sqs::Client,
    pub url: String,
}

impl TestQueue {
    pub async fn new() -> TestQueue {
        let sqs = aws().await.sqs;
        let name = format!("reeve-test-{}", ulid::Ulid::new().to_string().to_lowercase());
        let created = sqs.create_queue().queue_name(name).send().await.expect("moto SQS is up");
        TestQueue { url: created.queue_url().expect("a queue url").to_owned(), sqs }
    }

    /// Every message now in the queue (received, then deleted).
    pub async fn drain(&self) -> Vec<Value> {
        let mut bodies = Vec::new();
        loop {
            let got = self
                .sqs
                .receive_message()
                .queue_url(&self.url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .send()
                .await
                .unwrap();
            let messages = got.messages();
            if messages.is_empty() {
                return bodies;
            }
            for m in messages {
                bodies.push(serde_json::from_str(m.body().unwrap()).unwrap());
                let handle = m.receipt_handle().unwrap();
                self.sqs.delete_message().queue_url(&self.url).receipt_handle(handle).send().await.unwrap();
            }
        }
    }

    pub async fn delete(self) {
        self.sqs.delete_queue().queue_url(&self.url).send().await.unwrap();
    }
}

/// Waits until `check` holds, asking every 20 ms: a test waits for the state
/// it needs, not for a fixed time. Panics naming `what` after `within`.
pub async fn wait_until<F: Future<Output = bool>>(what: &str, within: Duration, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "{what} did not happen within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether something accepts TCP connections at `addr` (a server the test started).
pub async fn listening(addr: &str) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}
