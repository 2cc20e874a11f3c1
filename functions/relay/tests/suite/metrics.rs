//! The relay binary's Prometheus `/metrics`, as the Fargate service runs it:
//! on `REEVE_METRICS_BIND`, a port the load balancer never forwards to, and
//! not on the relay's own port. A real watcher is connected while the
//! scraper reads, over the stack's Postgres and Redis.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reeve_shared::auth::{Secret, SpaceId, issue_token, space_index};
use reeve_shared::ids::Id;
use sqlx::PgPool;
use time::OffsetDateTime;

const TOKEN_KEY: &str = "0123456789abcdef0123456789abcdef";

/// The relay process, killed when the test ends however it ends.
struct Relay(Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A variable of the stack's `.env`, as the relay's start-up reads it.
fn stack(name: &str) -> String {
    reeve_shared::settings::Config::from_env().get(name).unwrap_or_else(|| panic!("{name}: load the stack's .env"))
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

async fn wait_for(addr: SocketAddr) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing listens on {addr}");
}

/// `url` pointing at database `name` instead, its query kept.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let base = &base[..base.rfind('/').expect("a database in DATABASE_URL")];
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// A queued task in a fresh space, as create leaves it, and a session
/// token for that space.
async fn queued_task(pool: &PgPool) -> (Id, String) {
    let pepper = Secret::new("REEVE_PEPPER", b"a pepper only this test uses!!!!".to_vec()).unwrap();
    let space = space_index(&pepper, &SpaceId::generate().unwrap());
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space.as_bytes()).execute(pool).await.unwrap();
    let task = Id::new();
    sqlx::query(
        "INSERT INTO tasks (id, space_idx, kind, input, status, last_seq) VALUES ($1, $2, 'digest', '{}', 'queued', 1)",
    )
    .bind(task)
    .bind(space.as_bytes())
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO task_events (task_id, seq, type, data) VALUES ($1, 1, 'status', '{\"status\":\"queued\"}')",
    )
    .bind(task)
    .execute(pool)
    .await
    .unwrap();
    let key = Secret::new("REEVE_TOKEN_KEY", TOKEN_KEY.as_bytes().to_vec()).unwrap();
    let (token, _) = issue_token(&key, &space, OffsetDateTime::now_utc());
    (task, token)
}

/// The value of the sample whose line starts with `series`, if any.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

async fn scrape(metrics: SocketAddr) -> String {
    let response = reqwest::get(format!("http://{metrics}/metrics")).await.unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    response.text().await.unwrap()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn metrics_are_on_their_own_port_with_a_watcher_connected(pool: PgPool) {
    let (task, token) = queued_task(&pool).await;
    let database: String = sqlx::query_scalar("SELECT current_database()").fetch_one(&pool).await.unwrap();
    let database_url = with_database(&stack("DATABASE_URL"), &database);
    let (relay, metrics) = (free_addr(), free_addr());
    let _relay = Relay(
        Command::new(env!("CARGO_BIN_EXE_relay"))
            .env("DATABASE_URL", database_url)
            .env("REDIS_URL", stack("REDIS_URL"))
            .env("REEVE_TOKEN_KEY", TOKEN_KEY)
            .env("REEVE_RELAY_BIND", relay.to_string())
            .env("REEVE_METRICS_BIND", metrics.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(relay).await;
    wait_for(metrics).await;

    // A watcher: the stream is open once its first frame (the queued
    // status) arrives, and stays open, since the task has not finished.
    let mut watcher = reqwest::Client::new()
        .get(format!("http://{relay}/v1/tasks/{task}/events"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(watcher.status(), reqwest::StatusCode::OK);
    let first = tokio::time::timeout(Duration::from_secs(10), watcher.chunk()).await.unwrap().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("queued"), "{first:?}");

    let page = scrape(metrics).await;
    assert_eq!(sample(&page, "reeve_relay_watchers"), Some(1.0), "{page}");
    assert_eq!(sample(&page, "reeve_relay_subscribed_tasks"), Some(1.0), "{page}");
    let opened = r#"reeve_http_requests_total{method="GET",route="/v1/tasks/{task}/events",status="200"}"#;
    assert_eq!(sample(&page, opened), Some(1.0), "{page}");
    assert!(!page.contains(&task.to_string()), "a task id is never a series: {page}");

    // The relay's own port, which the load balancer forwards every path
    // of, has no /metrics: it is the usual not-found envelope.
    let public = reqwest::get(format!("http://{relay}/metrics")).await.unwrap();
    assert_eq!(public.status(), reqwest::StatusCode::NOT_FOUND);
    assert!(public.text().await.unwrap().contains("\"not_found\""));

    // The watcher leaves: the gauges fall back to rest.
    drop(watcher);
    let mut page = String::new();
    for _ in 0..50 {
        page = scrape(metrics).await;
        if sample(&page, "reeve_relay_watchers") == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sample(&page, "reeve_relay_watchers"), Some(0.0), "{page}");
    assert_eq!(sample(&page, "reeve_relay_subscribed_tasks"), Some(0.0), "{page}");
}

#[test]
fn metrics_on_the_relay_port_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .env_clear()
        .env("REEVE_RELAY_BIND", "0.0.0.0:8080")
        .env("REEVE_METRICS_BIND", "127.0.0.1:8080")
        .env("REEVE_TOKEN_KEY", TOKEN_KEY)
        .env("DATABASE_URL", "postgres://reeve@127.0.0.1:1/reeve")
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("REEVE_METRICS_BIND (127.0.0.1:8080) must not be the relay's port (0.0.0.0:8080)"),
        "{stderr}"
    );
}
