//! The SSE relay against real Postgres and real Redis servers: replay after
//! Last-Event-ID, many clients on one Pub/Sub connection, a Redis restart in
//! the middle of a stream, and refusals before the stream starts.
//!
//! Tests that count or restart Redis connections run their own
//! `redis-server` on a free loopback port, so they disturb nobody else.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::http::stream::RelayLimits;
use reeve_shared::http::stream::router;
use reeve_shared::ids::Id;
use reeve_shared::relay::{self, Hub, StreamCaps};
use reeve_shared::settings;
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

const TOKEN_KEY: &str = "relay-test-token-key-relay-test-token";

fn token_key() -> auth::Secret {
    auth::Secret::new("REEVE_TOKEN_KEY", TOKEN_KEY.as_bytes().to_vec()).unwrap()
}

/// A pool like the relay's own (`db.rs`): eight connections, 5 s to get one.
fn relay_pool(pool: &PgPool) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with((*pool.connect_options()).clone())
}

async fn start_relay(pool: PgPool, redis_url: &str) -> Relay {
    start_relay_with(pool, redis_url, RelayLimits::NONE).await
}

/// A relay with these limits, served as the binaries serve it: with the TCP
/// peer's address known.
/// Built by start-up from the variables that set them:
/// [`RelayLimits::NONE`]'s caps are the largest the settings take.
async fn start_relay_with(pool: PgPool, redis_url: &str, limits: RelayLimits) -> Relay {
    let cap = |n: usize| n.min(1_000_000).to_string();
    let config = common::config(&pool)
        .with(settings::REDIS_URL, redis_url)
        .with(settings::TOKEN_KEY, TOKEN_KEY)
        .with(settings::RELAY_STREAMS_PER_SPACE, cap(limits.caps.per_space))
        .with(settings::RELAY_STREAMS_PER_IP, cap(limits.caps.per_ip))
        .with(settings::TRUSTED_PROXY_HOPS, limits.proxy_hops.to_string());
    let ctx = common::relay(&config);
    let hub = ctx.hub.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let service = router(ctx).into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    let (token, _) = auth::issue_token(&token_key(), &SpaceIndex::from_array(SPACE), OffsetDateTime::now_utc());
    Relay { base, token, hub }
}

/// A ticket for `task`'s stream from the relay's session, as
/// `POST /v1/tasks/{id}/ticket` issues it.
fn ticket_for(relay: &Relay, task: Id) -> String {
    let session = auth::verify_session(&token_key(), &relay.token, OffsetDateTime::now_utc()).unwrap();
    auth::issue_ticket(&token_key(), &session, task.to_bytes(), OffsetDateTime::now_utc()).0
}

async fn new_task(pool: &PgPool) -> Id {
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x') ON CONFLICT DO NOTHING")
        .bind(SPACE)
        .execute(pool)
        .await
        .unwrap();
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
/// (a lost publish is fine: the table is the truth). An empty `redis_url`
/// is a worker whose publishes all get lost.
async fn emit(pool: &PgPool, redis_url: &str, task: Id, kind: EventType, data: Value) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    let event = append_event(&mut conn, task, kind, &data).await.unwrap();
    drop(conn);
    if redis_url.is_empty() {
        return event.seq;
    }
    if let Ok(client) = redis::Client::open(redis_url)
        && let Ok(mut c) = client.get_multiplexed_async_connection().await
    {
        let _: Result<i64, _> = redis::cmd("PUBLISH")
            .arg(relay::channel(task))
            .arg(serde_json::to_string(&event).unwrap())
            .query_async(&mut c)
            .await;
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

/// Reads the whole stream (it must end by itself within 30 s) and returns
/// its frames.
async fn read_all(response: reqwest::Response) -> Vec<Frame> {
    read_all_within(response, Duration::from_secs(30)).await
}

async fn read_all_within(response: reqwest::Response, limit: Duration) -> Vec<Frame> {
    let messages = tokio::time::timeout(limit, common::sse_messages(response))
        .await
        .expect("the stream ends after the terminal status");
    messages
        .into_iter()
        .filter_map(|message| {
            Some(Frame {
                id: message.id?.parse().expect("an event id is its seq"),
                event: message.event?,
                data: serde_json::from_str(&message.data?).expect("an event's data is JSON"),
            })
        })
        .collect()
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
    // A client that has everything of a finished task, or claims more, is
    // sent its terminal status again and closed: an EventSource that were
    // only closed on would reconnect for ever.
    for last in [n, n + 1, 10_000] {
        let frames = read_all(connect(&relay, task, Some(last)).await).await;
        assert_eq!(seqs(&frames), [n], "after {last}");
        assert_eq!(frames[0].data["data"]["status"], "completed");
    }
    // The same resume point works as a query parameter, for EventSource,
    // which opens the stream with a ticket.
    let ticket = ticket_for(&relay, task);
    let url = format!("{}/v1/tasks/{task}/events?ticket={ticket}&last_event_id=5", relay.base);
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
    common::wait_until("the relay notices Redis is gone", Duration::from_secs(10), || async {
        !relay.hub.is_connected()
    })
    .await;
    // Written while Redis is gone: the publishes fail, Postgres keeps them.
    progress(&pool, &redis.url(), task, 4).await;
    redis.restart();
    // Nothing new is published after the restart until the end: the relay
    // must find the missed events in Postgres when it reconnects.
    common::wait_until("the relay reconnects", Duration::from_secs(15), || async { relay.hub.is_connected() }).await;
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
    // A session of the task's own Space, ended (`DELETE /v1/sessions/current`).
    let ended = auth::issue_token(&token_key(), &SpaceIndex::from_array(SPACE), OffsetDateTime::now_utc()).0;
    let session = auth::verify_session(&token_key(), &ended, OffsetDateTime::now_utc()).unwrap();
    reeve_shared::sessions::end_session(&pool, &session).await.unwrap();
    let client = reqwest::Client::new();
    let url = |task: &str| format!("{}/v1/tasks/{task}/events", relay.base);

    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (client.get(url(&task.to_string())), 401, "missing_token"),
        (client.get(url(&task.to_string())).bearer_auth("not-a-token"), 401, "invalid_token"),
        (client.get(format!("{}?access_token=forged", url(&task.to_string()))), 401, "token_in_url"),
        (client.get(format!("{}?access_token={}", url(&task.to_string()), relay.token)), 401, "token_in_url"),
        (client.get(format!("{}?ticket={}", url(&task.to_string()), relay.token)), 401, "token_in_url"),
        (client.get(format!("{}?ticket=forged", url(&task.to_string()))), 401, "invalid_ticket"),
        (client.get(url(&task.to_string())).bearer_auth(&ended), 401, "invalid_token"),
        (client.get(url(&Id::new().to_string())).bearer_auth(&relay.token), 404, "task_not_found"),
        (client.get(url("not-an-id")).bearer_auth(&relay.token), 404, "task_not_found"),
        (client.get(url(&task.to_string())).bearer_auth(&other_space), 404, "task_not_found"),
        (
            client.get(url(&task.to_string())).bearer_auth(&relay.token).header("last-event-id", "abc"),
            400,
            "invalid_last_event_id",
        ),
        (
            client.get(url(&task.to_string())).bearer_auth(&relay.token).header("last-event-id", "-1"),
            400,
            "invalid_last_event_id",
        ),
        (
            client.get(format!("{}?last_event_id=1.5", url(&task.to_string()))).bearer_auth(&relay.token),
            400,
            "invalid_last_event_id",
        ),
    ];
    for (request, status, code) in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{code}");
        assert!(response.headers().contains_key("x-request-id"));
        let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(body["error"]["code"], code);
    }

    // A rotation of the Space's ID (`POST /v1/space/rotate`) ends every
    // session issued before it, and the tickets they asked for.
    let asking = auth::verify_session(&token_key(), &relay.token, OffsetDateTime::now_utc()).unwrap();
    let (ticket, _) = auth::issue_ticket(&token_key(), &asking, task.to_bytes(), OffsetDateTime::now_utc());
    let with_ticket = format!("{}?ticket={ticket}", url(&task.to_string()));
    assert_eq!(client.get(&with_ticket).send().await.unwrap().status(), 200, "the ticket opens the stream");
    let from = reeve_shared::sessions::sessions_from(OffsetDateTime::now_utc());
    sqlx::query("UPDATE spaces SET sessions_from = $1 WHERE idx = $2")
        .bind(from)
        .bind(SPACE.as_slice())
        .execute(&pool)
        .await
        .unwrap();
    for (request, code) in [
        (client.get(&with_ticket), "invalid_ticket"),
        (client.get(url(&task.to_string())).bearer_auth(&relay.token), "invalid_token"),
    ] {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401, "{code} after a rotation");
        let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(body["error"]["code"], code);
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_client_that_falls_behind_is_resynchronised_from_postgres(pool: PgPool) {
    use reeve_shared::relay::{self, Delivery, TaskPosition};
    let redis_url = common::redis_url();
    let hub = Hub::start(redis::Client::open(redis_url.as_str()).unwrap());
    let task = new_task(&pool).await;

    // A client that reads nothing while far more events arrive than the
    // per-task buffer (256) and a replay page (200) hold.
    let position = TaskPosition { last_seq: 0, finished: false };
    let slot = hub.open_stream(StreamCaps::NONE, SpaceIndex::from_array(SPACE), None).unwrap();
    let mut events = Box::pin(relay::events(pool.clone(), hub.clone(), slot, task, 0, position).await);
    progress(&pool, &redis_url, task, 600).await;
    let n = finish(&pool, &redis_url, task).await;

    let mut ids = Vec::new();
    let read = async {
        while let Some(delivery) = events.next().await {
            match delivery {
                Delivery::Event(event) => ids.push(event.seq),
                Delivery::Interrupted => panic!("postgres is up"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.expect("the stream ends");
    assert_eq!(ids, (1..=n).collect::<Vec<_>>(), "every event once, in order, despite the lag");
    drop(events);
    assert_eq!(hub.task_count(), 0);
}

/// The hub has forgotten every task (its last client left) within 3 s.
async fn hub_forgets_everything(hub: &Hub) {
    for _ in 0..60 {
        if hub.task_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the hub still counts {} tasks", hub.task_count());
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_client_that_leaves_before_any_event_releases_its_task(pool: PgPool) {
    let redis_url = common::redis_url();
    let relay = start_relay(pool.clone(), &redis_url).await;
    let task = new_task(&pool).await;
    progress(&pool, &redis_url, task, 2).await;

    // Resuming past the last event of a running task: nothing will come.
    let response = connect(&relay, task, Some(50)).await;
    common::wait_until("the stream subscribes to its task", Duration::from_secs(5), || async {
        relay.hub.task_count() == 1
    })
    .await;
    drop(response);
    hub_forgets_everything(&relay.hub).await;

    // A task that never finishes: the client reads what there is and leaves.
    let mut response = connect(&relay, task, None).await;
    let first = response.chunk().await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("id: 1"));
    drop(response);
    hub_forgets_everything(&relay.hub).await;
}

/// A port that accepts TCP connections and never says a word: a Redis that
/// hangs.
fn black_hole() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    (listener, url)
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_subscribe_abandoned_while_redis_hangs_leaves_nothing_behind(pool: PgPool) {
    let (_hole, url) = black_hole();
    let hub = Hub::start(redis::Client::open(url.as_str()).unwrap());
    let task = new_task(&pool).await;

    // A handler dropped while waiting for the SUBSCRIBE acknowledgement.
    let abandoned = tokio::time::timeout(Duration::from_millis(300), hub.subscribe(task)).await;
    assert!(abandoned.is_err(), "redis never answers, so the subscription cannot be confirmed yet");
    assert_eq!(hub.task_count(), 0, "the abandoned client is not counted");

    // A patient one gets its subscription within the connect timeout (the
    // Postgres check covers it until Redis answers), and leaves cleanly.
    let waited = tokio::time::timeout(Duration::from_secs(8), hub.subscribe(task)).await;
    let subscription = waited.expect("connecting to redis times out instead of hanging");
    assert_eq!(hub.task_count(), 1);
    assert!(!hub.is_connected());
    drop(subscription);
    assert_eq!(hub.task_count(), 0);
}

/// `/healthz` as the load balancer reads it: status and body.
async fn health(relay: &Relay) -> (u16, Value) {
    let response = reqwest::get(format!("{}/healthz", relay.base)).await.unwrap();
    let status = response.status().as_u16();
    (status, serde_json::from_slice(&response.bytes().await.unwrap()).unwrap())
}

/// Polls `/healthz` until its `status` is `want` (within 5 s).
async fn health_becomes(relay: &Relay, want: &str) -> (u16, Value) {
    let mut last = (0, Value::Null);
    for _ in 0..100 {
        last = health(relay).await;
        if last.1["status"] == want {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/healthz never said {want}: {last:?}");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn healthz_keeps_a_relay_without_redis_as_degraded(pool: PgPool) {
    let degraded = json!({"status": "degraded", "postgres": "ok", "redis": "unavailable"});
    let (_hole, hanging) = black_hole();
    let closed = {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        format!("redis://127.0.0.1:{port}")
    };
    for url in [closed, hanging] {
        let relay = start_relay(pool.clone(), &url).await;
        // 200: the load balancer keeps a relay that still serves from Postgres.
        assert_eq!(health(&relay).await, (200, degraded.clone()), "{url}");
    }

    let mut redis = OwnRedis::start();
    let relay = start_relay(pool.clone(), &redis.url()).await;
    let ok = health_becomes(&relay, "ok").await;
    assert_eq!(ok, (200, json!({"status": "ok", "postgres": "ok", "redis": "ok"})));
    redis.stop();
    assert_eq!(health_becomes(&relay, "degraded").await, (200, degraded), "a lost connection is reported");
    redis.restart();
    health_becomes(&relay, "ok").await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn healthz_fails_without_postgres(pool: PgPool) {
    let dead = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(1))
        .connect_lazy("postgres://reeve:x@127.0.0.1:1/reeve")
        .unwrap();
    drop(pool);
    // Fault: the relay's pool never reaches Postgres.
    let relay = start_relay(dead, &common::redis_url()).await;
    let (status, body) = health(&relay).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "dependency_unavailable");
    assert_eq!(body["error"]["message"], "postgres is unavailable");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn with_redis_stopped_streams_still_get_every_event_from_postgres(pool: PgPool) {
    let mut redis = OwnRedis::start();
    let relay = start_relay(pool.clone(), &redis.url()).await;
    health_becomes(&relay, "ok").await;
    let task = new_task(&pool).await;
    progress(&pool, &redis.url(), task, 2).await;
    // One stream from before Redis went away, one from after.
    let before = tokio::spawn(read_all(connect(&relay, task, None).await));
    redis.stop();
    health_becomes(&relay, "degraded").await;
    let after = tokio::spawn(read_all(connect(&relay, task, Some(1)).await));

    // Every publish fails now: only Postgres has these.
    progress(&pool, &redis.url(), task, 3).await;
    let n = finish(&pool, &redis.url(), task).await;
    assert_eq!(seqs(&before.await.unwrap()), (1..=n).collect::<Vec<_>>());
    assert_eq!(seqs(&after.await.unwrap()), (2..=n).collect::<Vec<_>>());
    assert_eq!(health(&relay).await.1["status"], "degraded", "redis is still down");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_stream_past_the_end_of_a_running_task_ends_with_it(pool: PgPool) {
    let redis_url = common::redis_url();
    let relay = start_relay(pool.clone(), &redis_url).await;
    let task = new_task(&pool).await;
    progress(&pool, &redis_url, task, 2).await;
    // Events 3.. do not exist yet, so the client cannot have seen them: it
    // gets them as they come, and the stream ends with the terminal status
    // instead of waiting for a seq 50 that never comes.
    let reader = tokio::spawn(read_all_within(connect(&relay, task, Some(50)).await, Duration::from_secs(10)));
    for _ in 0..100 {
        if relay.hub.task_count() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    progress(&pool, &redis_url, task, 1).await;
    let n = finish(&pool, &redis_url, task).await;
    let frames = reader.await.unwrap();
    assert_eq!(seqs(&frames), [3, n]);
    assert_eq!(frames.last().unwrap().data["data"]["status"], "completed");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_lost_publish_cannot_hang_a_stream(pool: PgPool) {
    let relay = start_relay(pool.clone(), &common::redis_url()).await;
    let task = new_task(&pool).await;
    let mut readers = Vec::new();
    for _ in 0..3 {
        readers.push(tokio::spawn(read_all(connect(&relay, task, None).await)));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A worker whose every PUBLISH is lost: only Postgres has the events.
    progress(&pool, "", task, 3).await;
    sqlx::query("UPDATE tasks SET status = 'completed' WHERE id = $1").bind(task).execute(&pool).await.unwrap();
    let n = emit(&pool, "", task, EventType::Status, json!({"status": "completed"})).await;
    let terminal = std::time::Instant::now();
    for reader in readers {
        assert_eq!(seqs(&reader.await.unwrap()), (1..=n).collect::<Vec<_>>());
    }
    let waited = terminal.elapsed();
    assert!(waited < Duration::from_secs(5), "the streams ended {waited:?} after the terminal event");
    hub_forgets_everything(&relay.hub).await;
}

/// Two clients of a task no publish reaches (Redis down, say): the late one
/// reads everything up to the terminal status from Postgres, and the early
/// one, which is still behind, must hear of it too and end, not wait for
/// ever because another client has read it.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_late_client_reading_the_end_does_not_leave_an_early_one_waiting(pool: PgPool) {
    let relay = start_relay(pool.clone(), &common::redis_url()).await;
    let task = new_task(&pool).await;
    progress(&pool, "", task, 2).await;
    let early = tokio::spawn(read_all_within(connect(&relay, task, None).await, Duration::from_secs(10)));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Within one Postgres check of the hub's: the rest of the events, the
    // terminal status among them, then a late client that saw the task
    // running (its row's status is written last here, so the late client
    // subscribes, as one does that connects just before the end) and
    // replays all of it.
    progress(&pool, "", task, 2).await;
    let n = emit(&pool, "", task, EventType::Status, json!({"status": "completed"})).await;
    let late = connect(&relay, task, None).await;
    assert_eq!(seqs(&read_all_within(late, Duration::from_secs(10)).await), (1..=n).collect::<Vec<_>>());
    sqlx::query("UPDATE tasks SET status = 'completed' WHERE id = $1").bind(task).execute(&pool).await.unwrap();
    assert_eq!(seqs(&early.await.unwrap()), (1..=n).collect::<Vec<_>>(), "the early client ends too");
    hub_forgets_everything(&relay.hub).await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_database_error_ends_the_stream_with_a_retry_hint(pool: PgPool) {
    let redis_url = common::redis_url();
    let relay = start_relay(pool.clone(), &redis_url).await;
    let task = new_task(&pool).await;
    progress(&pool, &redis_url, task, 2).await;
    let mut response = connect(&relay, task, None).await;
    let mut text = String::new();
    while !text.contains("id: 2") {
        text.push_str(std::str::from_utf8(&response.chunk().await.unwrap().unwrap()).unwrap());
    }

    // Postgres now fails every read, and the next event arrives with a gap,
    // so the stream must go to Postgres for the one it missed.
    sqlx::query("ALTER TABLE task_events RENAME TO task_events_gone").execute(&pool).await.unwrap();
    let client = redis::Client::open(redis_url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let skipped = json!({"seq": 4, "type": "progress", "data": {"fraction": 0.9}, "at": "2026-01-01T00:00:00Z"});
    let _: i64 =
        redis::cmd("PUBLISH").arg(relay::channel(task)).arg(skipped.to_string()).query_async(&mut c).await.unwrap();

    let rest = async {
        while let Some(chunk) = response.chunk().await.unwrap() {
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    };
    tokio::time::timeout(Duration::from_secs(10), rest).await.expect("the stream ends instead of going silent");
    let last_block = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last_block.contains("retry: 2000"), "the stream ends with a reconnect hint: {text:?}");
    assert!(!text.contains("id: 4"), "nothing out of order is sent");
    hub_forgets_everything(&relay.hub).await;
}

/// Raises this process's open-file limit to its hard limit: thousands of
/// clients and their server ends are two descriptors each.
fn raise_fd_limit(needed: u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    limit.rlim_cur = limit.rlim_max;
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    assert!(limit.rlim_cur >= needed, "this test needs {needed} open files; the hard limit is {}", limit.rlim_cur);
}

/// A watcher as EventSource behaves: when a stream ends before the terminal
/// status it reconnects with its last id. Returns every seq it saw and how
/// often it had to reconnect.
/// At most `connecting` of them are opening a connection at any moment (a
/// listen backlog overflows otherwise, as it would in production).
async fn watch_to_end(
    base: String,
    token: String,
    task: Id,
    http: reqwest::Client,
    connecting: Arc<tokio::sync::Semaphore>,
) -> (Vec<i64>, usize) {
    let mut seen: Vec<i64> = Vec::new();
    let mut reconnects = 0;
    loop {
        let mut request = http.get(format!("{base}/v1/tasks/{task}/events")).bearer_auth(&token);
        if let Some(last) = seen.last() {
            request = request.header("last-event-id", last.to_string());
        }
        let response = {
            let _turn = connecting.acquire().await.unwrap();
            request.send().await.unwrap()
        };
        assert_eq!(response.status(), 200);
        let frames = read_all_within(response, Duration::from_secs(180)).await;
        let done = frames.last().is_some_and(|f| f.event == "status" && f.data["data"]["status"] == "completed");
        seen.extend(seqs(&frames));
        if done || reconnects >= 5 {
            return (seen, reconnects);
        }
        reconnects += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn five_thousand_watchers_over_five_hundred_tasks_survive_a_redis_restart(pool: PgPool) {
    const TASKS: usize = 500;
    const PER_TASK: usize = 10;
    raise_fd_limit(2 * (TASKS * PER_TASK) as u64 + 1000);
    let mut redis = OwnRedis::start();
    let relay = start_relay(relay_pool(&pool), &redis.url()).await;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        tasks.push(new_task(&pool).await);
    }

    let http = reqwest::Client::new();
    let connected = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let connecting = Arc::new(tokio::sync::Semaphore::new(200));
    let mut watchers = Vec::new();
    for task in &tasks {
        for _ in 0..PER_TASK {
            let (base, token, http, task) = (relay.base.clone(), relay.token.clone(), http.clone(), *task);
            let (connected, connecting) = (connected.clone(), connecting.clone());
            watchers.push(tokio::spawn(async move {
                connected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                watch_to_end(base, token, task, http, connecting).await
            }));
        }
    }
    // Connecting 5,000 streams is the machine's work, not the relay's: on
    // two busy cores it took more than a minute once. Three minutes bound
    // a stall; a watcher that ended is the relay's failure.
    for _ in 0..1800 {
        if relay.hub.task_count() == TASKS && relay_connections(&redis.url()).await.1 == 1 {
            break;
        }
        if watchers.iter().any(|w| w.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if relay.hub.task_count() != TASKS {
        let watched = relay.hub.task_count();
        match watchers.into_iter().find(|w| w.is_finished()) {
            Some(failed) => panic!("only {watched} tasks watched; a watcher ended with {:?}", failed.await),
            None => panic!("only {watched} tasks watched after three minutes, no watcher ended"),
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    for task in &tasks {
        progress(&pool, &redis.url(), *task, 2).await;
    }
    redis.stop();
    common::wait_until("the relay notices Redis is gone", Duration::from_secs(10), || async {
        !relay.hub.is_connected()
    })
    .await;
    // Written while Redis is gone: the publishes fail, Postgres keeps them.
    for task in &tasks {
        progress(&pool, &redis.url(), *task, 2).await;
    }
    redis.restart();
    common::wait_until("the relay reconnects", Duration::from_secs(15), || async { relay.hub.is_connected() }).await;
    let mut last = 0;
    for task in &tasks {
        last = finish(&pool, &redis.url(), *task).await;
    }

    let mut reconnects = 0;
    for watcher in watchers {
        let (seen, again) = watcher.await.unwrap();
        assert_eq!(seen, (1..=last).collect::<Vec<_>>());
        reconnects += again;
    }
    assert_eq!(connected.load(std::sync::atomic::Ordering::Relaxed), TASKS * PER_TASK);
    assert_eq!(reconnects, 0, "no stream had to be cut short");
    hub_forgets_everything(&relay.hub).await;
}

/// A stream request from a client of the given space, sent as it would
/// reach the relay: `forwarded` is the `X-Forwarded-For` the load balancer
/// passes on (what the client sent, with the address it saw appended).
async fn open_stream(relay: &Relay, from: &str, token: &str, task: Id, forwarded: Option<&str>) -> reqwest::Response {
    let client = reqwest::Client::builder().local_address(from.parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    let mut request = client.get(format!("{}/v1/tasks/{task}/events", relay.base)).bearer_auth(token);
    if let Some(forwarded) = forwarded {
        request = request.header("x-forwarded-for", forwarded);
    }
    request.send().await.unwrap()
}

async fn assert_refused(response: reqwest::Response, message: &str) {
    assert_eq!(response.status(), 429, "{message}");
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after >= 1, "{retry_after}");
    let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams", "{message}: {body}");
    assert!(!body["error"]["request_id"].as_str().unwrap().is_empty());
}

/// Polls until `space` has `n` streams open on the relay (within 3 s).
async fn streams_become(relay: &Relay, space: [u8; 16], n: usize) {
    let space = SpaceIndex::from_array(space);
    for _ in 0..150 {
        if relay.hub.stream_count(&space) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the space has {} streams open, not {n}", relay.hub.stream_count(&space));
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_space_over_its_stream_cap_is_refused_until_a_stream_closes(pool: PgPool) {
    let caps = StreamCaps { per_space: 2, per_ip: 100 };
    let relay = start_relay_with(pool.clone(), &common::redis_url(), RelayLimits { caps, proxy_hops: 0 }).await;
    let task = new_task(&pool).await;
    let first = open_stream(&relay, "127.0.0.1", &relay.token, task, None).await;
    let second = open_stream(&relay, "127.0.0.2", &relay.token, task, None).await;
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 200));
    // From another address too: the cap is the space's.
    assert_refused(open_stream(&relay, "127.0.0.3", &relay.token, task, None).await, "a third stream").await;
    // Another space is not this one.
    let other = auth::issue_token(&token_key(), &SpaceIndex::from_array([1; 16]), OffsetDateTime::now_utc()).0;
    assert_eq!(open_stream(&relay, "127.0.0.1", &other, Id::new(), None).await.status(), 404);

    // The client leaves: the cap lifts.
    drop(first);
    streams_become(&relay, SPACE, 1).await;
    let again = open_stream(&relay, "127.0.0.3", &relay.token, task, None).await;
    assert_eq!(again.status(), 200);
    // A stream that ends by itself (its task finished) lifts it too.
    let n = finish(&pool, &common::redis_url(), task).await;
    assert_eq!(seqs(&read_all(again).await), [n]);
    assert_eq!(seqs(&read_all(second).await), [n]);
    streams_become(&relay, SPACE, 0).await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_address_cap_counts_the_address_the_load_balancer_saw(pool: PgPool) {
    // Behind one proxy (the template's load balancer, which appends the
    // address it saw to X-Forwarded-For), three streams per address.
    let caps = StreamCaps { per_space: 100, per_ip: 3 };
    let relay = start_relay_with(pool.clone(), &common::redis_url(), RelayLimits { caps, proxy_hops: 1 }).await;
    let task = new_task(&pool).await;
    // The attacker writes an X-Forwarded-For of its own, new each time, in
    // one line or several; the load balancer appends 203.0.113.7 after it.
    let forged = [
        "198.51.100.1, 203.0.113.7",
        "198.51.100.2, 10.0.0.1, 203.0.113.7",
        "2001:db8::1, 203.0.113.7",
        "garbage, 203.0.113.7",
    ];
    let mut held = Vec::new();
    for (i, xff) in forged.iter().take(3).enumerate() {
        let response = open_stream(&relay, "127.0.0.1", &relay.token, task, Some(xff)).await;
        assert_eq!(response.status(), 200, "stream {i}");
        held.push(response);
    }
    assert_refused(open_stream(&relay, "127.0.0.1", &relay.token, task, Some(forged[3])).await, "forged left").await;
    let two_lines = {
        let client = reqwest::Client::new();
        client
            .get(format!("{}/v1/tasks/{task}/events", relay.base))
            .bearer_auth(&relay.token)
            .header("x-forwarded-for", "198.51.100.9")
            .header("x-forwarded-for", "203.0.113.7")
            .send()
            .await
            .unwrap()
    };
    assert_refused(two_lines, "a second header line").await;
    // The TCP peer is the load balancer, so it is no client: another
    // address behind it is served.
    let other = open_stream(&relay, "127.0.0.1", &relay.token, task, Some("203.0.113.7, 203.0.113.8")).await;
    assert_eq!(other.status(), 200, "203.0.113.8 is another client");

    drop(held.pop());
    streams_become(&relay, SPACE, 3).await;
    let again = open_stream(&relay, "127.0.0.1", &relay.token, task, Some("203.0.113.7")).await;
    assert_eq!(again.status(), 200, "a closed stream lifts the address's cap");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn without_a_trusted_proxy_the_forwarded_header_is_ignored(pool: PgPool) {
    let caps = StreamCaps { per_space: 100, per_ip: 2 };
    let relay = start_relay_with(pool.clone(), &common::redis_url(), RelayLimits { caps, proxy_hops: 0 }).await;
    let task = new_task(&pool).await;
    let mut held = Vec::new();
    for i in 0..2 {
        let xff = format!("198.51.100.{i}");
        held.push(open_stream(&relay, "127.0.0.1", &relay.token, task, Some(&xff)).await);
        assert_eq!(held.last().unwrap().status(), 200);
    }
    // Reached directly, the client is its TCP peer, whatever it writes.
    let forged = open_stream(&relay, "127.0.0.1", &relay.token, task, Some("198.51.100.77")).await;
    assert_refused(forged, "a forged header from a capped peer").await;
    let other_peer = open_stream(&relay, "127.0.0.2", &relay.token, task, None).await;
    assert_eq!(other_peer.status(), 200);
}

#[tokio::test]
async fn one_space_cannot_hold_every_postgres_read_turn() {
    use reeve_shared::relay::{READS_IN_FLIGHT, SPACE_READS_IN_FLIGHT};
    let hub = Hub::start(redis::Client::open(common::redis_url().as_str()).unwrap());
    let busy = SpaceIndex::from_array([1; 16]);
    let slots: Vec<_> = (0..READS_IN_FLIGHT).map(|_| hub.open_stream(StreamCaps::NONE, busy, None).unwrap()).collect();
    // Every stream of the busy space asks for a turn at once (a replay of
    // thousands of events does so page after page); only its share is given.
    let mut turns = Vec::new();
    for slot in &slots {
        if let Ok(turn) = tokio::time::timeout(Duration::from_millis(100), slot.read_turn()).await {
            turns.push(turn);
        }
    }
    assert_eq!(turns.len(), SPACE_READS_IN_FLIGHT, "the busy space holds its share, not every turn");
    // Another space's stream reads at once.
    let quiet = hub.open_stream(StreamCaps::NONE, SpaceIndex::from_array([2; 16]), None).unwrap();
    let turn = tokio::time::timeout(Duration::from_secs(1), quiet.read_turn()).await;
    assert!(turn.is_ok(), "another space gets a turn while the busy one waits for its own");
    // The busy space's next stream is served as soon as one of its turns ends.
    let waiting = tokio::spawn({
        let next = hub.open_stream(StreamCaps::NONE, busy, None).unwrap();
        async move {
            let _turn = next.read_turn().await;
        }
    });
    drop(turns.pop());
    tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("a freed turn is handed on").unwrap();
}

/// A stream ticket opens its one task's stream, within 60 s to connect, and
/// nothing else (issue 39's bad input): not another task, not after it
/// expired, not once its session was ended, not as a bearer token.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_ticket_opens_its_own_task_s_stream_and_nothing_else(pool: PgPool) {
    let redis_url = common::redis_url();
    let relay = start_relay(pool.clone(), &redis_url).await;
    let (task, other) = (new_task(&pool).await, new_task(&pool).await);
    progress(&pool, &redis_url, task, 2).await;
    finish(&pool, &redis_url, task).await;
    let events = |task: Id, ticket: &str| format!("{}/v1/tasks/{task}/events?ticket={ticket}", relay.base);
    let ticket = ticket_for(&relay, task);

    // The ticket opens its task's stream, and the stream runs to the end.
    let frames = read_all(reqwest::get(events(task, &ticket)).await.unwrap()).await;
    assert_eq!(seqs(&frames), [1, 2, 3]);

    let session = auth::verify_session(&token_key(), &relay.token, OffsetDateTime::now_utc()).unwrap();
    let expired = auth::issue_ticket(
        &token_key(),
        &session,
        task.to_bytes(),
        OffsetDateTime::now_utc() - auth::TICKET_TTL - time::Duration::seconds(1),
    )
    .0;
    let ended = auth::issue_token(&token_key(), &SpaceIndex::from_array(SPACE), OffsetDateTime::now_utc()).0;
    let ended = auth::verify_session(&token_key(), &ended, OffsetDateTime::now_utc()).unwrap();
    let of_ended = auth::issue_ticket(&token_key(), &ended, task.to_bytes(), OffsetDateTime::now_utc()).0;
    reeve_shared::sessions::end_session(&pool, &ended).await.unwrap();
    let client = reqwest::Client::new();
    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        ("another task", client.get(events(other, &ticket)), 401, "invalid_ticket"),
        ("expired", client.get(events(task, &expired)), 401, "invalid_ticket"),
        ("its session ended", client.get(events(task, &of_ended)), 401, "invalid_ticket"),
        (
            "as a bearer token",
            client.get(format!("{}/v1/tasks/{task}/events", relay.base)).bearer_auth(&ticket),
            401,
            "invalid_token",
        ),
        ("a malformed task id", client.get(events_of(&relay.base, "nope", &ticket)), 404, "task_not_found"),
    ];
    for (what, request, status, code) in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{what}");
        let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(body["error"]["code"], code, "{what}");
    }
}

fn events_of(base: &str, task: &str, ticket: &str) -> String {
    format!("{base}/v1/tasks/{task}/events?ticket={ticket}")
}
