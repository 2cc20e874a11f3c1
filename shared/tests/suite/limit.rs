//! The per-client login limit as `reeve serve` runs it: a real listener with
//! the peer address, two clients on two loopback addresses. The one over its
//! budget gets `429 rate_limited` with `Retry-After`; the other is served.
//! Space creation has the tightest budget, since every Space brings its own
//! quota of free work.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reeve_shared::http::app;
use reeve_shared::http::{Budget, LoginLimits, SPACES, envelope, login_limit};
use serde_json::{Value, json};
use sqlx::PgPool;

async fn serve(pool: PgPool) -> SocketAddr {
    // Three sessions at once per client, then one a second.
    let sessions = Budget { burst: 3, every: Duration::from_secs(1) };
    serve_with(pool, LoginLimits::new(SPACES, sessions)).await
}

async fn serve_with(pool: PgPool, limits: LoginLimits) -> SocketAddr {
    let ctx = common::ctx(pool).await;
    let limits = Arc::new(limits);
    let routes = app(ctx)
        .layer(axum::middleware::from_fn_with_state(limits, login_limit))
        .layer(axum::middleware::from_fn(envelope));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, routes.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap()
    });
    addr
}

fn client(from: &str) -> reqwest::Client {
    reqwest::Client::builder().local_address(from.parse::<IpAddr>().unwrap()).build().unwrap()
}

async fn open_session(client: &reqwest::Client, addr: SocketAddr) -> reqwest::Response {
    client
        .post(format!("http://{addr}/v1/sessions"))
        .header("content-type", "application/json")
        .body(json!({ "space_id": "00000000000000000000" }).to_string())
        .send()
        .await
        .unwrap()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn one_client_over_its_budget_does_not_lock_out_another(pool: PgPool) {
    let addr = serve(pool).await;
    let greedy = client("127.0.0.1");
    for _ in 0..3 {
        let answer = open_session(&greedy, addr).await;
        assert_eq!(answer.status(), 401, "an unknown space, but not throttled");
    }
    let refused = open_session(&greedy, addr).await;
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    assert!(refused.headers().contains_key("x-request-id"));
    let body: Value = serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(!body["error"]["request_id"].as_str().unwrap().is_empty(), "{body}");

    // Another address is another client, with its own budget.
    let other = client("127.0.0.2");
    assert_eq!(open_session(&other, addr).await.status(), 401);

    // Other routes are not limited.
    let catalog = greedy.get(format!("http://{addr}/v1/catalog")).send().await.unwrap();
    assert_eq!(catalog.status(), 200);
}

async fn create_space(client: &reqwest::Client, addr: SocketAddr) -> reqwest::Response {
    client.post(format!("http://{addr}/v1/spaces")).send().await.unwrap()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn space_creation_past_the_per_address_limit_is_refused(pool: PgPool) {
    // The shipped budget: a burst of 10 Spaces per address, then one a minute.
    let addr = serve_with(pool.clone(), LoginLimits::default()).await;
    let greedy = client("127.0.0.1");
    for i in 0..SPACES.burst {
        assert_eq!(create_space(&greedy, addr).await.status(), 201, "space {i}");
    }
    let refused = create_space(&greedy, addr).await;
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((50..=60).contains(&retry_after), "the next Space in about a minute: {retry_after}");
    let body: Value = serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let spaces: i64 = sqlx::query_scalar("SELECT count(*) FROM spaces").fetch_one(&pool).await.unwrap();
    assert_eq!(spaces, i64::from(SPACES.burst), "a refused create makes no Space");

    // Another address is another client.
    assert_eq!(create_space(&client("127.0.0.2"), addr).await.status(), 201);
    // An IPv4 client's other ports and connections are the same client.
    assert_eq!(create_space(&client("127.0.0.1"), addr).await.status(), 429);
}
