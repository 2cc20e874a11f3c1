//! Two clients, two allow-lists: the operator's private executor host,
//! allow-listed for the operators' client, is never reachable by a user's
//! `fetch` — not directly, not through a redirect — while the `http`
//! executor reaches it.

use crate::common;

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::{any, get, post};
use reeve_shared::auth::{self, Secret, SpaceId, SpaceIndex};
use reeve_shared::catalog::{Executor, TaskSpec};
use reeve_shared::db::Connect;
use reeve_shared::executors::{self, ExecDeps, ExecError, Http, Job, codes};
use reeve_shared::ids::Id;
use reeve_shared::outbound::Outbound;
use reeve_shared::settings::{self, Config};
use reeve_shared::startup;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// The operator's private executor: counts every request it gets.
async fn executor_host() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let router = Router::new()
        .route(
            "/count",
            any(|State(hits): State<Arc<AtomicUsize>>| async move {
                hits.fetch_add(1, Ordering::SeqCst);
                "private data"
            }),
        )
        .route(
            "/echo",
            post(|State(hits): State<Arc<AtomicUsize>>, body: axum::body::Bytes| async move {
                hits.fetch_add(1, Ordering::SeqCst);
                let input: Value = serde_json::from_slice(&body).unwrap();
                axum::Json(json!({ "echo": input }))
            }),
        )
        .with_state(hits.clone());
    (serve(router).await, hits)
}

/// A host a user may fetch, which redirects to `location`.
async fn redirector(location: String) -> u16 {
    let router = Router::new().route(
        "/go",
        get(move || {
            let location = location.clone();
            async move { (StatusCode::FOUND, [(header::LOCATION, location)], "") }
        }),
    );
    serve(router).await
}

async fn serve(router: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

fn spec(kind: &str) -> TaskSpec {
    common::shipped_catalog().tasks.get(kind).unwrap().clone()
}

fn http_spec(endpoint: String) -> TaskSpec {
    let mut spec = spec("http");
    spec.executor = Executor::Http(Http { endpoint, protocol: None });
    spec.timeout_seconds = 5;
    spec
}

fn space() -> SpaceIndex {
    let key = Secret::new("REEVE_PEPPER", vec![7; 32]).unwrap();
    auth::space_index(&key, &SpaceId::parse("12345678901234567890").unwrap())
}

async fn run(deps: &ExecDeps, spec: &TaskSpec, input: Value) -> Result<Value, ExecError> {
    let (tx, mut rx) = mpsc::channel(16);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let job = Job { task_id: Id::new(), attempt: 1, kind: "test", space: space(), input: &input, spec, reports: tx };
    let result = executors::run(deps, job).await;
    drain.await.unwrap();
    result
}

fn assert_blocked(result: Result<Value, ExecError>, what: &str) {
    match result {
        Err(e) => assert_eq!(e.code(), Some(codes::URL_BLOCKED), "{what}: {e}"),
        Ok(v) => panic!("{what} was fetched: {v}"),
    }
}

/// Names resolve as a deployment's DNS would: the executor's name to a
/// private address, the redirector's to the one a user may reach.
fn resolver(name: &str) -> Vec<IpAddr> {
    match name {
        "executor.internal" | "public.example" => vec!["127.0.0.1".parse().unwrap()],
        _ => Vec::new(),
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn fetch_cannot_reach_an_operator_allowed_host_directly_or_by_redirect(pool: sqlx::PgPool) {
    let (port, hits) = executor_host().await;
    let private = format!("http://executor.internal:{port}");
    let public = redirector(format!("{private}/count")).await;
    // The worker as start-up builds it, with the two lists a deployment
    // would set. The one stand-in: both clients resolve names through
    // `resolver`, a deployment's DNS, over the policies start-up read.
    let config = common::worker_config(&pool)
        .with(settings::FETCH_ALLOW, format!("public.example:{public}"))
        .with(settings::OPERATOR_ALLOW, "executor.internal")
        .with(settings::ALLOW_HTTP, "1");
    let built = common::worker(&config).await.exec;
    let deps = ExecDeps {
        outbound: Outbound::with_resolver(built.outbound.policy.clone(), resolver).unwrap(),
        operators: Outbound::with_resolver(built.operators.policy.clone(), resolver).unwrap(),
        ..built
    };

    assert_blocked(run(&deps, &spec("fetch"), json!({ "url": format!("{private}/count") })).await, "direct fetch");
    let via = format!("http://public.example:{public}/go");
    assert_blocked(run(&deps, &spec("fetch"), json!({ "url": via })).await, "fetch through a redirect");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "no user request reached the operator's host");

    // The operator's endpoint is reachable for what it is for.
    let answer = run(&deps, &http_spec(format!("{private}/echo")), json!({ "text": "hi" })).await.unwrap();
    assert_eq!(answer, json!({ "echo": { "text": "hi" } }));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_worker_gives_the_operator_allow_list_to_http_only(_pool: sqlx::PgPool) {
    let (port, hits) = executor_host().await;
    let sdk = reeve_shared::startup::sdk().await;
    let catalog = Path::new(common::DEV_CATALOG);
    let vars = [
        ("DATABASE_URL", std::env::var("DATABASE_URL").unwrap()),
        ("REDIS_URL", common::redis_url()),
        ("REEVE_BUCKET", "reeve-test".to_owned()),
        ("REEVE_OPERATOR_ALLOW", "127.0.0.1".to_owned()),
        ("REEVE_OUTBOUND_ALLOW_HTTP", "1".to_owned()),
        ("REEVE_CHAIN_RPC_URLS", common::chain::chain_rpc_urls()),
        // The development catalog sells wordfreq, a kind that speaks the
        // executor protocol: its jobs carry report tokens and the route.
        ("REEVE_TOKEN_KEY", common::TOKEN_KEY.to_owned()),
        ("REEVE_REPORT_URL", "http://127.0.0.1:8080/v1/executor/reports".to_owned()),
    ];
    let config = Config::from_vars(vars).with(settings::CATALOG, catalog.display().to_string());
    let worker = startup::worker(&config, &sdk, Connect::Lazily).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(worker.exec.outbound.policy.allow.is_empty(), "the users' list stays empty");

    let url = format!("http://127.0.0.1:{port}");
    assert_blocked(run(&worker.exec, &spec("fetch"), json!({ "url": format!("{url}/count") })).await, "fetch");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    let answer = run(&worker.exec, &http_spec(format!("{url}/echo")), json!({ "n": 1 })).await.unwrap();
    assert_eq!(answer, json!({ "echo": { "n": 1 } }));
}
