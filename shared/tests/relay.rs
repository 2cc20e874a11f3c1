//! The SSE relay against real Postgres and real Redis servers: replay after
//! Last-Event-ID, many clients on one Pub/Sub connection, a Redis restart in
//! the middle of a stream, and refusals before the stream starts.
//!
//! Tests that count or restart Redis connections run their own
//! `redis-server` on a free loopback port, so they disturb nobody else.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::http::events::{RelayContext, router};
use reeve_shared::ids::Id;
use reeve_shared::relay::{self, Hub};
use reeve_shared::tasks::{EventType, append_event};
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

const SPACE: [u8; 16] = [9; 16];

/// A `redis-server` of the test's own, stopped on drop.
struct OwnRedis {
    port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut redis = OwnRedis { port, child: None };
        redis.restart();
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn restart(&mut self) {
        self.stop();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is installed by scripts/stack.sh");
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not start on {}", self.port);
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Relay {
    base: String,
    token: String,
    hub: Hub,
}

fn token_key() -> auth::Secret {
    auth::Secret::new("REEVE_TOKEN_KEY", b"relay-test-token-key-relay-test-token".to_vec()).unwrap()
}

async fn start_relay(pool: PgPool, redis_url: &str) -> Relay {
    let hub = Hub::start(redis::Client::open(redis_url).unwrap());
    let ctx = Arc::new(RelayContext {
        db: pool,
        token_key: token_key(),
        hub: hub.clone(),
        keepalive: Duration::from_secs(15),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(ctx)).await.unwrap() });
    let (token, _) = auth::issue_token(&token_key(), &SpaceIndex::from_array(SPACE), OffsetDateTime::now_utc());
    Relay { base, token, hub }
}

async fn new_task(pool: &PgPool) -> Id {
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x') ON CONFLICT DO NOTHING").bind(SPACE).execute(pool).await.unwrap();
    let id = Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input) VALUES ($1, $2, 'digest', '{}')")
        .bind(id)
        .bind(SPACE)
        .execute(pool)
        .await
        .unwrap();
    id
}

/// What the worker does: append to Postgres, then ring the Redis doorbell
/// (a lost publish is fine: the table is the truth).
async fn emit(pool: &PgPool, redis_url: &str, task: Id, kind: EventType, data: Value) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    let event = append_event(&mut conn, task, kind, &data).await.unwrap();
    if let Ok(client) = redis::Client::open(redis_url) {
        if let Ok(mut c) = client.get_multiplexed_async_connection().await {
            let _: Result<i64, _> =
                redis::cmd("PUBLISH").arg(relay::channel(task)).arg(serde_json::to_string(&event).unwrap()).query_async(&mut c).await;
        }
    }
    event.seq
}

async fn progress(pool: &PgPool, redis_url: &str, task: Id, n: usize) {
    for i in 0..n {
        emit(pool, redis_url, task, EventType::Progress, json!({"fraction": i as f64 / n as f64})).await;
    }
}

async fn finish(pool: &PgPool, redis_url: &str, task: Id) -> i64 {
    sqlx::query("UPDATE tasks SET status = 'completed' WHERE id = $1").bind(task).execute(pool).await.unwrap();
    emit(pool, redis_url, task, EventType::Status, json!({"status": "completed"})).await
}

/// One SSE frame as a client sees it.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    id: i64,
    event: String,
    data: Value,
}

/// Reads the whole stream (it must end by itself) and returns its frames.
async fn read_all(response: reqwest::Response) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut buffer = String::new();
    let mut body = response.bytes_stream();
    let read = async {
        while let Some(chunk) = body.next().await {
            buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, None, None);
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().parse::<i64>().unwrap());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data = Some(serde_json::from_str::<Value>(v.trim()).unwrap());
                    }
                }
                if let (Some(id), Some(event), Some(data)) = (id, event, data) {
                    frames.push(Frame { id, event, data });
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.expect("the stream ends after the terminal status");
    frames
}

fn seqs(frames: &[Frame]) -> Vec<i64> {
    frames.iter().map(|f| f.id).collect()
}

async fn connect(relay: &Relay, task: Id, last: Option<i64>) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .get(format!("{}/v1/tasks/{task}/events", relay.base))
        .header("authorization", format!("Bearer {}", relay.token));
    if let Some(last) = last {
        request = request.header("last-event-id", last.to_string());
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    response
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_client_resuming_after_event_k_gets_exactly_the_rest_in_order(pool: PgPool) {
    let redis_url = common::redis_url();
    let relay = start_relay(pool.clone(), &redis_url).await;
    let task = new_task(&pool).await;
    progress(&pool, &redis_url, task, 6).await;
    let n = finish(&pool, &redis_url, task).await;
    assert_eq!(n, 7);

    for k in [0, 1, 4, 6] {
        let frames = read_all(connect(&relay, task, Some(k)).await).await;
        assert_eq!(seqs(&frames), ((k + 1)..=n).collect::<Vec<_>>(), "after {k}");
        assert_eq!(frames.last().unwrap().event, "status");
        assert_eq!(frames.last().unwrap().data["data"]["status"], "completed");
    }
    // A client that has everything of a finished task is closed at once.
    assert!(read_all(connect(&relay, task, Some(n)).await).await.is_empty());
    // The same resume point works as a query parameter, for EventSource.
    let url = format!("{}/v1/tasks/{task}/events?access_token={}&last_event_id=5", relay.base, relay.token);
    let frames = read_all(reqwest::get(url).await.unwrap()).await;
    assert_eq!(seqs(&frames), [6, 7]);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn live_events_follow_the_replay_without_gaps_or_repeats(pool: PgPool) {
    let redis_url = common::redis_url();
    let relay = start_relay(pool.clone(), &redis_url).await;
    let task = new_task(&pool).await;
    progress(&pool, &redis_url, task, 3).await;

    let reader = tokio::spawn(read_all(connect(&relay, task, None).await));
    tokio::time::sleep(Duration::from_millis(200)).await;
    progress(&pool, &redis_url, task, 5).await;
    let n = finish(&pool, &redis_url, task).await;
    let frames = reader.await.unwrap();
    assert_eq!(seqs(&frames), (1..=n).collect::<Vec<_>>());
    assert_eq!(relay.hub.task_count(), 0, "the last client left, so the hub unsubscribed");
}

/// The relay's connections as Redis sees them: (all, subscribed).
async fn relay_connections(redis_url: &str) -> (usize, usize) {
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut conn).await.unwrap();
    let others: Vec<&str> = list.lines().filter(|l| !l.contains("cmd=client")).collect();
    let subscribed = others.iter().filter(|l| l.split(' ').any(|f| f.starts_with("sub=") && f != "sub=0")).count();
    (others.len(), subscribed)
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_hundred_clients_share_one_pubsub_connection_and_all_get_everything(pool: PgPool) {
    let redis = OwnRedis::start();
    let relay = start_relay(pool.clone(), &redis.url()).await;
    let task = new_task(&pool).await;

    let mut readers = Vec::new();
    for _ in 0..100 {
        readers.push(tokio::spawn(read_all(connect(&relay, task, None).await)));
    }
    assert_eq!(relay_connections(&redis.url()).await, (1, 1), "one Pub/Sub connection for 100 clients");

    progress(&pool, &redis.url(), task, 20).await;
    let n = finish(&pool, &redis.url(), task).await;
    for reader in readers {
        assert_eq!(seqs(&reader.await.unwrap()), (1..=n).collect::<Vec<_>>());
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_redis_restart_mid_stream_loses_no_event(pool: PgPool) {
    let mut redis = OwnRedis::start();
    let relay = start_relay(pool.clone(), &redis.url()).await;
    let task = new_task(&pool).await;

    let mut readers = Vec::new();
    for _ in 0..10 {
        readers.push(tokio::spawn(read_all(connect(&relay, task, None).await)));
    }
    progress(&pool, &redis.url(), task, 3).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    redis.stop();
    // Written while Redis is gone: the publishes fail, Postgres keeps them.
    progress(&pool, &redis.url(), task, 4).await;
    redis.restart();
    // Nothing new is published after the restart until the end: the relay
    // must find the missed events in Postgres when it reconnects.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = finish(&pool, &redis.url(), task).await;

    for reader in readers {
        assert_eq!(seqs(&reader.await.unwrap()), (1..=n).collect::<Vec<_>>());
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn refusals_come_before_the_stream_as_error_envelopes(pool: PgPool) {
    let redis_url = common::redis_url();
    let relay = start_relay(pool.clone(), &redis_url).await;
    let task = new_task(&pool).await;
    let other_space = auth::issue_token(&token_key(), &SpaceIndex::from_array([1; 16]), OffsetDateTime::now_utc()).0;
    let client = reqwest::Client::new();
    let url = |task: &str| format!("{}/v1/tasks/{task}/events", relay.base);

    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (client.get(url(&task.to_string())), 401, "missing_token"),
        (client.get(url(&task.to_string())).bearer_auth("not-a-token"), 401, "invalid_token"),
        (client.get(format!("{}?access_token=forged", url(&task.to_string()))), 401, "invalid_token"),
        (client.get(url(&Id::new().to_string())).bearer_auth(&relay.token), 404, "not_found"),
        (client.get(url("not-an-id")).bearer_auth(&relay.token), 404, "not_found"),
        (client.get(url(&task.to_string())).bearer_auth(&other_space), 404, "not_found"),
        (client.get(url(&task.to_string())).bearer_auth(&relay.token).header("last-event-id", "abc"), 400, "invalid_last_event_id"),
        (client.get(url(&task.to_string())).bearer_auth(&relay.token).header("last-event-id", "-1"), 400, "invalid_last_event_id"),
        (client.get(format!("{}?last_event_id=1.5", url(&task.to_string()))).bearer_auth(&relay.token), 400, "invalid_last_event_id"),
    ];
    for (request, status, code) in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{code}");
        assert!(response.headers().contains_key("x-request-id"));
        let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(body["error"]["code"], code);
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_client_that_falls_behind_is_resynchronised_from_postgres(pool: PgPool) {
    use reeve_shared::relay::stream;
    let redis_url = common::redis_url();
    let hub = Hub::start(redis::Client::open(redis_url.as_str()).unwrap());
    let task = new_task(&pool).await;

    // A client that reads nothing while far more events arrive than the
    // per-client and per-task buffers hold (64 + 256).
    let frames = stream::events(pool.clone(), hub.clone(), task, 0).await;
    let mut frames = Box::pin(frames);
    progress(&pool, &redis_url, task, 600).await;
    let n = finish(&pool, &redis_url, task).await;

    let mut ids = Vec::new();
    let read = async {
        while let Some(Ok(frame)) = frames.next().await {
            // axum's SSE event renders as text; its id line is what a client keys on.
            let text = format!("{frame:?}");
            let id = text.split("id: ").nth(1).and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()).map(|d| d.parse::<i64>().unwrap());
            ids.extend(id);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.expect("the stream ends");
    assert_eq!(ids, (1..=n).collect::<Vec<_>>(), "every event once, in order, despite the lag");
}
