//! Limits under a flood: the relay's per-client buffer. A hundred SSE
//! clients that stop reading, ten slow ones and one fast one watch one busy
//! task while it emits thousands of 1 KiB events. If the relay queued each
//! client's frames, its memory would grow by (clients x bytes emitted); it
//! must not: a stalled client costs at most the frame in hand, the rest
//! waits in Postgres, and the client is resynchronised from there once it
//! reads again, missing nothing.
//!
//! The clients are raw sockets with a 4 KiB receive buffer (HTTP/1.0, so the
//! body is close-delimited and needs no de-chunking): they buffer nothing in
//! this process, so the growth of this process's RSS is the relay's.

#[allow(dead_code)] // the suite uses all of the harness, this binary a part
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::http::stream::router;
use reeve_shared::ids::Id;
use reeve_shared::relay;
use reeve_shared::settings;
use reeve_shared::startup;
use reeve_shared::tasks::{EventType, append_event};
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SPACE: [u8; 16] = [7; 16];
const STALLED: usize = 100;
const SLOW: usize = 10;
const EVENTS: usize = 3000;
const PAD: usize = 1024;

const TOKEN_KEY: &str = "flood-test-token-key-flood-test-token";

fn token_key() -> auth::Secret {
    auth::Secret::new("REEVE_TOKEN_KEY", TOKEN_KEY.as_bytes().to_vec()).unwrap()
}

/// This process's resident set, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// An SSE request on a socket with a small receive buffer, resuming after
/// `last` if given; returns once the response head has arrived (the relay
/// has subscribed by then) with the body bytes read so far.
async fn open(addr: SocketAddr, task: Id, token: &str, last: Option<i64>) -> (TcpStream, Vec<u8>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let resume = last.map(|n| format!("Last-Event-ID: {n}\r\n")).unwrap_or_default();
    let request =
        format!("GET /v1/tasks/{task}/events HTTP/1.0\r\nHost: relay\r\nAuthorization: Bearer {token}\r\n{resume}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    let end = loop {
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the relay answered: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&seen[..end]).into_owned();
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
    (stream, seen.split_off(end))
}

/// What a client saw: the SSE ids in order, and how often it had to
/// reconnect (the relay ends a stream it cannot feed from Postgres with a
/// reconnect hint, and an EventSource then resumes after its last id).
#[derive(Default)]
struct Seen {
    ids: Vec<i64>,
    reconnects: usize,
}

/// Reads one stream to its end, `pause` between reads of 4 KiB, keeping only
/// the ids (so that the readers themselves hold next to nothing). `true` if
/// the stream ended with the reconnect hint.
async fn read_stream(mut stream: TcpStream, mut pending: Vec<u8>, pause: Duration, seen: &mut Seen) -> bool {
    let mut chunk = [0u8; 4096];
    let mut interrupted = false;
    loop {
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(n) = line.strip_prefix("id:") {
                seen.ids.push(n.trim().parse().unwrap());
            } else if line.starts_with(": interrupted") {
                interrupted = true;
            }
        }
        let n = stream.read(&mut chunk).await.unwrap();
        if n == 0 {
            return interrupted;
        }
        pending.extend_from_slice(&chunk[..n]);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// Follows the task to its end as an EventSource would, from an open stream.
async fn follow(addr: SocketAddr, task: Id, token: String, open: (TcpStream, Vec<u8>), pause: Duration) -> Seen {
    let mut seen = Seen::default();
    let (mut stream, mut pending) = open;
    while read_stream(stream, pending, pause, &mut seen).await {
        seen.reconnects += 1;
        assert!(seen.reconnects < 20, "the relay keeps interrupting");
        tokio::time::sleep(Duration::from_millis(100)).await;
        (stream, pending) = self::open(addr, task, &token, seen.ids.last().copied()).await;
    }
    seen
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn stalled_and_slow_sse_clients_on_a_busy_task_do_not_grow_relay_memory(pool: PgPool) {
    // The relay as start-up builds it, on a pool of its own (`db.rs`: eight
    // connections), with caps no client here reaches.
    let config = common::config_opening_a_pool(&pool)
        .with(settings::TOKEN_KEY, TOKEN_KEY)
        .with(settings::RELAY_STREAMS_PER_SPACE, "1000000")
        .with(settings::RELAY_STREAMS_PER_IP, "1000000");
    let ctx = startup::relay(&config).unwrap_or_else(|e| panic!("{e}")).ctx;
    let relay_db = ctx.db.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(ctx)).await.unwrap() });
    let (token, _) = auth::issue_token(&token_key(), &SpaceIndex::from_array(SPACE), OffsetDateTime::now_utc());

    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(SPACE).execute(&pool).await.unwrap();
    let task = Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input, status) VALUES ($1, $2, 'digest', '{}', 'running')")
        .bind(task)
        .bind(SPACE)
        .execute(&pool)
        .await
        .unwrap();

    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        stalled.push(open(addr, task, &token, None).await);
    }
    let mut slow = Vec::new();
    for _ in 0..SLOW {
        let stream = open(addr, task, &token, None).await;
        slow.push(tokio::spawn(follow(addr, task, token.clone(), stream, Duration::from_millis(20))));
    }
    let stream = open(addr, task, &token, None).await;
    let fast = tokio::spawn(follow(addr, task, token.clone(), stream, Duration::ZERO));

    tokio::time::sleep(Duration::from_millis(300)).await;
    let baseline = rss();
    let peak = Arc::new(AtomicU64::new(baseline));
    let sampler = tokio::spawn({
        let peak = peak.clone();
        async move {
            loop {
                peak.fetch_max(rss(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    // The worker's side: append to Postgres, then ring the Redis doorbell.
    let started = Instant::now();
    let mut conn = pool.acquire().await.unwrap();
    let mut redis = redis::Client::open(common::redis_url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let pad = "x".repeat(PAD);
    let mut emitted_bytes = 0;
    for i in 1..=EVENTS + 1 {
        let (kind, data) = if i <= EVENTS {
            (EventType::Progress, json!({"fraction": i as f64 / EVENTS as f64, "pad": pad}))
        } else {
            sqlx::query("UPDATE tasks SET status = 'completed' WHERE id = $1")
                .bind(task)
                .execute(&mut *conn)
                .await
                .unwrap();
            (EventType::Status, json!({"status": "completed"}))
        };
        let event = append_event(&mut conn, task, kind, &data).await.unwrap();
        let message = serde_json::to_string(&event).unwrap();
        emitted_bytes += message.len();
        let _: i64 =
            redis::cmd("PUBLISH").arg(relay::channel(task)).arg(message).query_async(&mut redis).await.unwrap();
    }
    let last = (EVENTS + 1) as i64;
    let every: Vec<i64> = (1..=last).collect();
    let fast = tokio::time::timeout(Duration::from_secs(60), fast).await.expect("the fast client keeps up").unwrap();
    let flood = started.elapsed();
    assert_eq!(fast.ids, every, "the fast client sees every event once, in order");
    // The stalled clients are still stalled: this is the moment their
    // frames would all be queued if the relay queued them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sampler.abort();
    let growth = peak.load(Ordering::SeqCst).saturating_sub(baseline);
    let unbounded = (STALLED * emitted_bytes) as u64;

    // Now they read, and miss nothing.
    let readers: Vec<_> = stalled
        .into_iter()
        .map(|stream| tokio::spawn(follow(addr, task, token.clone(), stream, Duration::ZERO)))
        .collect();
    let caught_up = Instant::now();
    let mut reconnects = fast.reconnects;
    for reader in readers.into_iter().chain(slow) {
        let seen =
            tokio::time::timeout(Duration::from_secs(90), reader).await.expect("every client catches up").unwrap();
        let gap = seen.ids.iter().zip(&every).position(|(a, b)| a != b);
        assert!(seen.ids == every, "a stalled or slow client got {} ids, first difference at {gap:?}", seen.ids.len());
        reconnects += seen.reconnects;
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "{STALLED} stalled + {SLOW} slow + 1 fast SSE clients, {last} events ({:.1} MiB each client) in {:.1}s: \
         RSS grew {:.1} MiB at peak (queuing every stalled client's frames would hold {:.0} MiB); \
         all {} clients then caught up with every event in {:.1}s ({reconnects} reconnects after an interruption)",
        mib(emitted_bytes as u64),
        flood.as_secs_f64(),
        mib(growth),
        mib(unbounded),
        STALLED + SLOW + 1,
        caught_up.elapsed().as_secs_f64(),
    );
    relay_db.close().await;
    assert!(growth < unbounded / 10, "relay memory grew {:.1} MiB with {STALLED} stalled clients", mib(growth));
}
