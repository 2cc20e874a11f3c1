//! Relay fan-out: N watchers (raw HTTP/1.1 clients, a few KiB each) on T
//! tasks of one relay process; a publisher appends each event to Postgres
//! and PUBLISHes it as the worker does, noting the instant of the PUBLISH;
//! each watcher notes when the frame arrived. The same scenarios run
//! against the real relay binary and the baseline, one after the other in
//! one run, so their ratios are comparable.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use reeve_shared::auth::{self, Secret, SpaceIndex};
use reeve_shared::ids::Id;
use reeve_shared::relay;
use reeve_shared::tasks::{EventType, append_event};
use serde_json::json;
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::process::Command;
use tokio::sync::Semaphore;

use crate::quantile;
use crate::stack::{self, BenchDb, OwnRedis, free_port, rss_kib, wait_for_port};

#[derive(clap::Args)]
pub struct Args {
    /// The relay binary under test (target/release/relay).
    #[arg(long)]
    relay: PathBuf,
    /// Events per task after the watchers connected (the last is the
    /// terminal status).
    #[arg(long, default_value_t = 10)]
    events: i64,
    /// Watchers on one task for the ceiling run (0 skips it).
    #[arg(long, default_value_t = 50_000)]
    ceiling: usize,
    /// The side-by-side scenarios, as watchers x tasks.
    #[arg(long, value_delimiter = ',', default_value = "1000x1,10000x1,10000x1000")]
    scenarios: Vec<String>,
}

const SPACE: [u8; 16] = [7; 16];
/// Watchers per loopback source address, well under the ephemeral port
/// range (28,232 ports), so that the TIME_WAIT sockets a scenario leaves
/// behind never starve the next one. The watchers start at 127.0.0.2:
/// 127.0.0.1 is left to the relays' own Redis and Postgres connections and
/// the publisher.
const PER_SOURCE: usize = 5_000;

/// The loopback source address of watcher `i`.
fn source_of(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i / PER_SOURCE) as u8))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Relay,
    Baseline,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Relay => "relay (one shared Pub/Sub connection)",
            Kind::Baseline => "baseline (one Pub/Sub connection per client)",
        }
    }
}

struct Outcome {
    kind: Kind,
    watchers: usize,
    tasks: usize,
    connected: usize,
    complete: usize,
    p50_ms: f64,
    p99_ms: f64,
    rss_per_watcher_kib: f64,
    redis_connections: usize,
    redis_subscribed: usize,
    connect_secs: f64,
    /// Why the scenario could not be measured at all.
    error: Option<String>,
}

impl Outcome {
    fn failed(kind: Kind, watchers: usize, tasks: usize, error: anyhow::Error) -> Outcome {
        Outcome {
            kind,
            watchers,
            tasks,
            connected: 0,
            complete: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            rss_per_watcher_kib: 0.0,
            redis_connections: 0,
            redis_subscribed: 0,
            connect_secs: 0.0,
            error: Some(format!("{error:#}")),
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let baseline = std::env::current_exe()?;
    let db = BenchDb::create("fanout").await?;
    let key_text = std::env::var("REEVE_TOKEN_KEY").context("REEVE_TOKEN_KEY")?;
    let key = Secret::new("REEVE_TOKEN_KEY", key_text.clone().into_bytes())?;
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'bench')").bind(SPACE).execute(&db.pool).await?;

    let mut outcomes = Vec::new();
    for scenario_text in &args.scenarios {
        let (watchers, tasks) = scenario_text
            .split_once('x')
            .and_then(|(w, t)| Some((w.parse::<usize>().ok()?, t.parse::<usize>().ok()?)))
            .with_context(|| format!("scenario {scenario_text:?} is not <watchers>x<tasks>"))?;
        for kind in [Kind::Relay, Kind::Baseline] {
            let bin = if kind == Kind::Relay { &args.relay } else { &baseline };
            let outcome = scenario(kind, bin, &db, &key, &key_text, watchers, tasks, args.events)
                .await
                .unwrap_or_else(|e| Outcome::failed(kind, watchers, tasks, e));
            eprintln!(
                "fanout {} {watchers}/{tasks}: connected {} complete {}/{} p99 {:.1} ms rss/watcher {:.1} KiB redis {} {}",
                kind.name(),
                outcome.connected,
                outcome.complete,
                watchers,
                outcome.p99_ms,
                outcome.rss_per_watcher_kib,
                outcome.redis_connections,
                outcome.error.as_deref().unwrap_or("")
            );
            outcomes.push(outcome);
        }
    }
    let mut ceiling = Vec::new();
    // Every watcher is one socket in the relay (and one in this harness),
    // so no relay process can hold more watchers than its open-file limit,
    // whatever its memory. The children inherit this process's limit.
    let fd_limit = stack::fd_limit();
    let most = usize::try_from(fd_limit).unwrap_or(usize::MAX).saturating_sub(FD_MARGIN);
    let target = args.ceiling.min(most);
    if target > 0 {
        // Upwards in steps, stopping at the first count not held in full.
        let mut tries: Vec<usize> = [15_000, 35_000].into_iter().filter(|&n| n < target).collect();
        tries.push(target);
        for watchers in tries {
            let outcome = scenario(Kind::Relay, &args.relay, &db, &key, &key_text, watchers, 1, args.events)
                .await
                .unwrap_or_else(|e| Outcome::failed(Kind::Relay, watchers, 1, e));
            eprintln!("ceiling {watchers}: complete {}/{}", outcome.complete, watchers);
            let full = outcome.complete == watchers;
            ceiling.push(outcome);
            if !full {
                break;
            }
        }
    }
    let limit = Ceiling { asked: args.ceiling, fd_limit, capped: args.ceiling > most };
    db.drop_now().await?;
    print!("{}", report(&outcomes, &ceiling, &limit, args.events));
    Ok(())
}

/// What bounded the ceiling attempt.
struct Ceiling {
    asked: usize,
    fd_limit: u64,
    capped: bool,
}

/// Descriptors kept free in each process beyond its watchers: the listener,
/// the pools, Redis, the runtime.
const FD_MARGIN: usize = 500;

fn report(outcomes: &[Outcome], ceiling: &[Outcome], limit: &Ceiling, events: i64) -> String {
    let mut out = String::new();
    out.push_str("## Relay fan-out\n\n");
    out.push_str(&format!(
        "Watchers connect before anything happens; then each task gets {} events ({} progress, then the terminal status), \
         appended to Postgres and PUBLISHed the way the worker does. Latency is from the PUBLISH call to the frame arriving \
         at the watcher, over every event of every watcher. RSS per watcher is the relay process's growth from before the \
         first watcher to all of them connected and idle, divided by the watchers. Complete means the watcher saw \
         seq 1..={} exactly once, in order, and the server closed the stream.\n\n",
        events + 1,
        events,
        events + 1
    ));
    out.push_str("| relay | watchers / tasks | complete | p50 ms | p99 ms | RSS KiB / watcher | Redis connections (subscribed) | connect s |\n");
    out.push_str("|---|---|---|---|---|---|---|---|\n");
    for o in outcomes.iter().chain(ceiling) {
        if let Some(error) = &o.error {
            out.push_str(&format!(
                "| {} | {} / {} | not measured: {} | | | | | |\n",
                o.kind.name(),
                o.watchers,
                o.tasks,
                error.replace('|', "/")
            ));
            continue;
        }
        out.push_str(&format!(
            "| {} | {} / {} | {:.1}% ({}/{}) | {:.1} | {:.1} | {:.1} | {} ({}) | {:.1} |\n",
            o.kind.name(),
            o.watchers,
            o.tasks,
            100.0 * o.complete as f64 / o.watchers as f64,
            o.complete,
            o.watchers,
            o.p50_ms,
            o.p99_ms,
            o.rss_per_watcher_kib,
            o.redis_connections,
            o.redis_subscribed,
            o.connect_secs
        ));
    }
    out.push_str("\nRatios, baseline ÷ relay, same scenario, same run:\n\n");
    out.push_str("| watchers / tasks | Redis connections | RSS per watcher | p99 |\n|---|---|---|---|\n");
    for pair in outcomes.chunks(2) {
        if let [r, b] = pair
            && r.error.is_none()
            && b.error.is_none()
        {
            out.push_str(&format!(
                "| {} / {} | {:.0}× | {:.2}× | {:.2}× |\n",
                r.watchers,
                r.tasks,
                b.redis_connections as f64 / r.redis_connections.max(1) as f64,
                b.rss_per_watcher_kib / r.rss_per_watcher_kib.max(0.001),
                b.p99_ms / r.p99_ms.max(0.001)
            ));
        }
    }
    if let Some(last) = ceiling.last() {
        let held = ceiling.iter().filter(|o| o.complete == o.watchers).max_by_key(|o| o.watchers);
        match held {
            Some(o) => out.push_str(&format!(
                "\nCeiling: the largest count tried with every watcher complete is **{}** watchers on one task, \
                 clients spread over {} loopback source addresses; the relay's RSS grew by {:.0} MiB for them \
                 ({:.1} KiB each). Largest tried: {} ({:.1}% complete).\n",
                o.watchers,
                o.watchers.div_ceil(PER_SOURCE),
                o.rss_per_watcher_kib * o.watchers as f64 / 1024.0,
                o.rss_per_watcher_kib,
                last.watchers,
                100.0 * last.complete as f64 / last.watchers as f64
            )),
            None => out.push_str(&format!(
                "\nCeiling: no count tried held every watcher (largest tried: {}).\n",
                last.watchers
            )),
        }
    }
    if limit.capped {
        out.push_str(&format!(
            "\nThe ceiling run was asked for {} watchers but stopped at the open-file limit: this machine allows \
             {} descriptors per process (hard limit; raising it needs CAP_SYS_RESOURCE, which this container \
             lacks), and each watcher is one socket in the relay process. So here the ceiling is set by that \
             limit, not by the relay's memory or CPU.\n",
            limit.asked, limit.fd_limit
        ));
    }
    out.push('\n');
    out
}

#[allow(clippy::too_many_arguments)]
async fn scenario(
    kind: Kind,
    bin: &PathBuf,
    db: &BenchDb,
    key: &Secret,
    key_text: &str,
    watchers: usize,
    task_count: usize,
    events: i64,
) -> anyhow::Result<Outcome> {
    let redis = OwnRedis::start().await?;
    let port = free_port();
    let mut command = Command::new(bin);
    if kind == Kind::Baseline {
        command.arg("baseline-relay");
    }
    let mut child = command
        .env("DATABASE_URL", &db.url)
        .env("REDIS_URL", redis.url())
        .env("BENCH_REDIS_URLS", redis.urls())
        .env("REEVE_TOKEN_KEY", key_text)
        .env("REEVE_RELAY_BIND", format!("127.0.0.1:{port}"))
        // Every watcher is of one Space, from a few loopback addresses: the
        // relay's caps on open streams (32 per Space, 128 per address by
        // default) would refuse all but the first few, so they go to their
        // largest here. The bench measures the fan-out, not the caps.
        .env("REEVE_RELAY_STREAMS_PER_SPACE", "1000000")
        .env("REEVE_RELAY_STREAMS_PER_IP", "1000000")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id().context("relay pid")?;
    wait_for_port(port).await?;

    let mut tasks = Vec::with_capacity(task_count);
    for _ in 0..task_count {
        let id = Id::new();
        sqlx::query(
            "INSERT INTO tasks (id, space_idx, kind, input, status) VALUES ($1, $2, 'digest', '{}', 'running')",
        )
        .bind(id)
        .bind(SPACE)
        .execute(&db.pool)
        .await?;
        tasks.push(id);
    }
    let (token, _) = auth::issue_token(key, &SpaceIndex::from_array(SPACE), OffsetDateTime::now_utc());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_kib(pid)?;

    let epoch = Instant::now();
    let published: Arc<Vec<Vec<AtomicU64>>> =
        Arc::new((0..task_count).map(|_| (0..=events + 1).map(|_| AtomicU64::new(0)).collect()).collect());
    let ready = Arc::new(AtomicUsize::new(0));
    let connecting = Arc::new(Semaphore::new(256));
    let server = SocketAddr::from(([127, 0, 0, 1], port));
    let mut handles = Vec::with_capacity(watchers);
    let started = Instant::now();
    for i in 0..watchers {
        let source = source_of(i);
        let task_index = i % task_count;
        let request = format!(
            "GET /v1/tasks/{}/events HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {token}\r\naccept: text/event-stream\r\n\r\n",
            tasks[task_index]
        );
        let (ready, connecting, published) = (ready.clone(), connecting.clone(), published.clone());
        handles.push(tokio::spawn(async move {
            watch(server, source, request, events + 1, ready, connecting, move |seq, at| {
                let sent = published[task_index].get(seq as usize).map_or(0, |t| t.load(Ordering::Relaxed));
                let now = at.duration_since(epoch).as_nanos() as u64;
                (sent > 0 && now >= sent).then(|| ((now - sent) / 1000) as u32)
            })
            .await
        }));
    }
    while ready.load(Ordering::Relaxed) < watchers && started.elapsed() < Duration::from_secs(180) {
        if handles.iter().filter(|h| h.is_finished()).count() + ready.load(Ordering::Relaxed) >= watchers {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let connect_secs = started.elapsed().as_secs_f64();
    let connected = ready.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_idle = rss_kib(pid)?;
    let (redis_connections, redis_subscribed) = redis.connections().await?;

    // The worker's part: append, then ring the doorbell.
    let publisher = redis::Client::open(redis.url())?;
    let mut bell = publisher.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("CLIENT").arg("SETNAME").arg("bench").query_async(&mut bell).await?;
    let mut conn = db.pool.acquire().await?;
    for seq in 1..=events + 1 {
        for (t, task) in tasks.iter().enumerate() {
            let terminal = seq == events + 1;
            let (kind, data) = if terminal {
                sqlx::query("UPDATE tasks SET status = 'completed' WHERE id = $1")
                    .bind(task)
                    .execute(&mut *conn)
                    .await?;
                (EventType::Status, json!({"status": "completed"}))
            } else {
                (EventType::Progress, json!({"fraction": seq as f64 / events as f64}))
            };
            let event = append_event(&mut conn, *task, kind, &data).await?;
            published[t][event.seq as usize].store(epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let _: i64 = redis::cmd("PUBLISH")
                .arg(relay::channel(*task))
                .arg(serde_json::to_string(&event)?)
                .query_async(&mut bell)
                .await?;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(conn);

    let mut complete = 0;
    let mut latencies: Vec<u32> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    for handle in handles {
        let left = deadline.saturating_duration_since(Instant::now());
        if let Ok(Ok(result)) = tokio::time::timeout(left, handle).await {
            if result.complete {
                complete += 1;
            }
            latencies.extend(result.latencies_us);
        }
    }
    latencies.sort_unstable();
    let _ = child.kill().await;
    redis.stop().await;
    Ok(Outcome {
        kind,
        watchers,
        tasks: task_count,
        connected,
        complete,
        p50_ms: quantile(&latencies, 0.5) as f64 / 1000.0,
        p99_ms: quantile(&latencies, 0.99) as f64 / 1000.0,
        rss_per_watcher_kib: rss_idle.saturating_sub(rss_before) as f64 / connected.max(1) as f64,
        redis_connections,
        redis_subscribed,
        connect_secs,
        error: None,
    })
}

struct Watched {
    complete: bool,
    latencies_us: Vec<u32>,
}

/// One watcher: a bare HTTP/1.1 request, then the chunked SSE body read
/// line by line (hyper writes each SSE event as one chunk, so lines are
/// never split across chunk framing).
async fn watch(
    server: SocketAddr,
    source: IpAddr,
    request: String,
    last: i64,
    ready: Arc<AtomicUsize>,
    connecting: Arc<Semaphore>,
    latency: impl Fn(i64, Instant) -> Option<u32>,
) -> Watched {
    let mut result = Watched { complete: false, latencies_us: Vec::with_capacity(last as usize) };
    let stream = {
        let _permit = connecting.acquire().await.expect("open");
        let Ok(socket) = TcpSocket::new_v4() else { return result };
        // A port whose last connection is in TIME_WAIT may be bound again.
        if socket.set_reuseaddr(true).is_err() || socket.bind(SocketAddr::new(source, 0)).is_err() {
            return result;
        }
        let Ok(mut stream) = socket.connect(server).await else { return result };
        if stream.write_all(request.as_bytes()).await.is_err() {
            return result;
        }
        stream
    };
    let mut stream = stream;
    let mut buffer: Vec<u8> = Vec::with_capacity(512);
    let mut chunk = [0u8; 2048];
    let mut headers_done = false;
    let mut next = 1i64;
    let mut in_order = true;
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return result,
            Ok(n) => n,
        };
        let at = Instant::now();
        buffer.extend_from_slice(&chunk[..n]);
        if !headers_done {
            let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            if !buffer.starts_with(b"HTTP/1.1 200") {
                return result;
            }
            buffer.drain(..end + 4);
            headers_done = true;
            ready.fetch_add(1, Ordering::Relaxed);
        }
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            if let Some(rest) = line.strip_prefix(b"id: ") {
                let seq: i64 = std::str::from_utf8(rest).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(-1);
                in_order &= seq == next;
                next = seq + 1;
                if let Some(us) = latency(seq, at) {
                    result.latencies_us.push(us);
                }
            } else if line == b"0\r\n" && next == last + 1 {
                // The last chunk of the body: the server closed the stream.
                result.complete = in_order;
                return result;
            }
        }
        if buffer.capacity() > 4096 {
            buffer.shrink_to(512);
        }
    }
}
