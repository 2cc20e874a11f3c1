//! Test harness shared by the integration tests: a context on a fresh
//! database (sqlx::test makes one per test) and the stack's real Redis, and a
//! way to send a request through a router in-process.

pub mod chain;
pub mod cuttable;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use reeve_shared::aws::AwsClients;
use reeve_shared::catalog::Catalog;
use reeve_shared::db::Connect;
use reeve_shared::http::{Ctx, RelayCtx};
use reeve_shared::ids::Id;
use reeve_shared::settings::{self, Config, Needs};
use reeve_shared::startup;
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
/// which a test's own runner stands in for: TOML, for [`with_catalog`].
pub fn catalog_text_with(extra: &str) -> String {
    let shipped = std::fs::read_to_string(DEV_CATALOG).unwrap();
    format!("{shipped}\n{extra}")
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
/// chain's test token (`local`), then `tasks` (TOML tables): TOML, for
/// [`with_catalog`].
pub fn paid_catalog_text(pay_to: &str, facilitator: &str, max_timeout_seconds: u32, tasks: &str) -> String {
    let token = chain::TOKEN;
    format!(
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
    )
}

/// The address of [`RECEIPT_KEY`], which [`config`] gives: what a
/// catalog's `receipt_signer` publishes.
pub fn receipt_signer() -> String {
    reeve_shared::payments::offer_receipt::SellerKey::from_hex(RECEIPT_KEY).unwrap().address().to_checksum(None)
}

/// `catalog` (a [`paid_catalog_text`]) publishing [`receipt_signer`]: its
/// deployment signs offers and receipts.
pub fn signing_receipts(catalog: &str) -> String {
    catalog.replacen("[payments]\n", &format!("[payments]\n        receipt_signer = \"{}\"\n", receipt_signer()), 1)
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

/// The tests' own secrets, in place of the stack's: a test that signs a
/// token or derives an index with them reaches the same values as the
/// contexts built from [`config`].
pub const PEPPER: &str = "test-pepper-test-pepper-test-pepper!";
pub const TOKEN_KEY: &str = "test-token-key-test-token-key-test!!";
/// The development catalog's receipt key (reeve.dev.toml's
/// `receipt_signer`, scripts/stack.sh's `.env`): public.
pub const RECEIPT_KEY: &str = "0x5ab0c95958f7c7144d59f69084444144eabb3f95c2cd0a1676be703baeddec15";

/// What a binary is given, as a test gives it: the stack's variables (the
/// `.env` scripts/test.sh loads), the development catalog, the tests' own
/// secrets, a 1 MiB fetch cap, a chain endpoint for every network the
/// tests' catalogs price in, and the database `#[sqlx::test]` made for
/// this test, both as `DATABASE_URL` and as its open pool (start-up checks
/// the URL, then takes the pool where it would open one). Contexts come from
/// it through the binaries' own builders: [`api`], [`worker`], [`relay`].
pub fn config(pool: &PgPool) -> Config {
    config_opening_a_pool(pool).with_pool(pool.clone())
}

/// [`config`] without the open pool: start-up opens one of its own on the
/// test's database, as a binary does. The test closes it before it ends,
/// or `#[sqlx::test]` cannot drop the database.
pub fn config_opening_a_pool(pool: &PgPool) -> Config {
    Config::from_env()
        .with(settings::CATALOG, DEV_CATALOG)
        .with(settings::PEPPER, PEPPER)
        .with(settings::TOKEN_KEY, TOKEN_KEY)
        .with(settings::RECEIPT_KEY, RECEIPT_KEY)
        .with(settings::FETCH_MAX_BYTES, (1024 * 1024).to_string())
        .with(settings::DATABASE_URL, database_url(pool))
        .with(settings::CHAIN_RPC_URLS, chain::chain_rpc_urls())
}

/// The URL of `pool`'s database: the stack's `DATABASE_URL` (its host and
/// credentials) naming the database `#[sqlx::test]` made.
pub fn database_url(pool: &PgPool) -> String {
    let options = pool.connect_options();
    let name = options.get_database().expect("sqlx::test names its database");
    let stack = env(settings::DATABASE_URL);
    let (url, query) = stack.split_once('?').map_or((stack.as_str(), None), |(url, query)| (url, Some(query)));
    let authority = url.find("://").map_or(0, |i| i + 3);
    let root = url[authority..].find('/').map_or(url, |slash| &url[..authority + slash]);
    match query {
        Some(query) => format!("{root}/{name}?{query}"),
        None => format!("{root}/{name}"),
    }
}

/// `config` serving a catalog of the test's own (TOML), written to a file as
/// a deployment's is. Such a catalog names its own facilitator, which the
/// stack's (`REEVE_FACILITATOR_URL`) does not replace.
pub fn with_catalog(config: Config, toml: &str) -> Config {
    config.with(settings::CATALOG, catalog_file(toml).display().to_string()).without(settings::FACILITATOR_URL)
}

/// `toml` in a file of the tests' scratch directory, named by its content.
pub fn catalog_file(toml: &str) -> std::path::PathBuf {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    toml.hash(&mut hasher);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("catalogs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{:016x}.toml", hasher.finish()));
    if !path.exists() {
        // Written whole, then renamed: a test running beside never reads half.
        let partial = dir.join(format!("{}.partial", ulid::Ulid::new()));
        std::fs::write(&partial, toml).unwrap();
        std::fs::rename(&partial, &path).unwrap();
    }
    path
}

/// `config` for a worker the test hands its messages to itself: no
/// `REEVE_QUEUE_URL`, so a retry's visibility is not set on the stack's
/// shared queue.
pub fn worker_config(pool: &PgPool) -> Config {
    config(pool).without(settings::QUEUE_URL)
}

/// `config` whose outbound clients (fetch and the operators') may reach the
/// test's own servers on loopback over plain HTTP.
pub fn loopback_outbound(config: Config) -> Config {
    config
        .with(reeve_shared::outbound::FETCH_ALLOW, "127.0.0.1")
        .with(reeve_shared::outbound::OPERATOR_ALLOW, "127.0.0.1")
        .with(reeve_shared::outbound::ALLOW_HTTP, "1")
}

/// Every route's context, as `reeve serve` builds it.
pub async fn api(config: &Config) -> Ctx {
    let sdk = startup::sdk().await;
    startup::api(config, &sdk, Needs::ALL, Connect::Lazily).await.unwrap_or_else(|e| panic!("{e}"))
}

/// The worker's context, as its Lambda and `reeve work` build it.
pub async fn worker(config: &Config) -> WorkerContext {
    let sdk = startup::sdk().await;
    startup::worker(config, &sdk, Connect::Lazily).await.unwrap_or_else(|e| panic!("{e}"))
}

/// The relay's context, as its service and `reeve relay` build it.
pub fn relay(config: &Config) -> RelayCtx {
    startup::relay(config).unwrap_or_else(|e| panic!("{e}")).ctx
}

/// `ctx` with the test's `runner` in place of the catalog's executors: the
/// fault (or the script) a worker test puts in.
pub fn with_runner(ctx: WorkerContext, runner: Arc<dyn Runner>) -> WorkerContext {
    WorkerContext { runner, ..ctx }
}

/// The stack's moto, which serves every AWS service on one port
/// (`AWS_ENDPOINT_URL_SQS` is its address): Secrets Manager for the tests
/// that name secrets by ARN.
pub fn moto() -> aws_config::SdkConfig {
    use aws_config::{BehaviorVersion, Region, SdkConfig};
    let endpoint = std::env::var("AWS_ENDPOINT_URL_SQS").expect("the stack's .env is loaded");
    SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(reeve_shared::aws_http::http_client())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_secretsmanager::config::SharedCredentialsProvider::new(
            aws_sdk_secretsmanager::config::Credentials::new("test", "test", None, None, "test"),
        ))
        .build()
}

/// Creates a secret of the calling test's own in [`moto`] and answers its ARN.
pub async fn create_secret(sdk: &aws_config::SdkConfig, value: &str) -> String {
    let client = aws_sdk_secretsmanager::Client::new(sdk);
    let name = format!("reeve-test/{}", ulid::Ulid::new());
    let created =
        client.create_secret().name(name).secret_string(value).send().await.expect("moto serves Secrets Manager");
    created.arn().expect("an ARN").to_owned()
}

/// The stack's S3 and SQS, configured as every binary is (`startup`).
pub async fn aws() -> AwsClients {
    reeve_shared::startup::aws_clients(&reeve_shared::settings::Config::from_env()).await
}

/// The SDK's S3 client on the stack's S3: what tests put, read and delete
/// objects with, apart from the code under test (which signs its own).
pub async fn s3() -> aws_sdk_s3::Client {
    let config = reeve_shared::settings::Config::from_env();
    reeve_shared::aws::s3(&reeve_shared::startup::sdk().await, config.s3_endpoint().is_some())
}

pub fn redis_url() -> String {
    env("REDIS_URL")
}

/// The stack's bucket.
pub fn bucket() -> String {
    env(settings::BUCKET)
}

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests with scripts/test.sh"))
}

/// The API on the given database and the stack's Redis, S3 and SQS.
pub async fn ctx(pool: PgPool) -> Ctx {
    api(&config(&pool)).await
}

/// The API on the given database and the Redis at `redis_url`.
pub async fn ctx_with_redis(pool: PgPool, redis_url: &str) -> Ctx {
    api(&config(&pool).with(settings::REDIS_URL, redis_url)).await
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
    /// `catalog`: TOML, as [`with_catalog`] takes it.
    pub async fn new(pool: &sqlx::PgPool, catalog: &str) -> QueuedApi {
        Self::with_vars(pool, catalog, &[]).await
    }

    /// [`QueuedApi::new`], its configuration given `vars` too.
    pub async fn with_vars(pool: &sqlx::PgPool, catalog: &str, vars: &[(&str, &str)]) -> QueuedApi {
        let queue = TestQueue::new().await;
        let mut config = with_catalog(config(pool), catalog).with(settings::QUEUE_URL, &queue.url);
        for (name, value) in vars {
            config = config.with(name, *value);
        }
        let ctx = api(&config).await;
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
