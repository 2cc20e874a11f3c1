//! Task create: `POST /v1/tasks/{kind}` through the API's in-process router
//! (the one `reeve serve` and the task-create function serve) with N
//! concurrent clients, side by side with a bare loop of the same two steps
//! the route must take: the `INSERT` of the task with its first event, and
//! the SQS `SendMessage`. The ratio is what the route costs on top of its
//! own database and queue work: the token check, the input validation, the
//! idempotency and upload checks, routing, JSON and the envelope.
//!
//! Both sides share one connection pool (the production pool settings),
//! the local stack's SQS and a queue of the harness's own, and alternate
//! rounds so that the machine's noise falls on both alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::db::Connect;
use reeve_shared::http::Ctx;
use reeve_shared::settings::{self, Config, Needs};
use reeve_shared::startup;
use reeve_shared::tasks::{self, Created, TaskRequest};
use serde_json::json;
use time::OffsetDateTime;
use tower::ServiceExt;

use crate::stack::BenchDb;
use crate::{median, quantile};

#[derive(clap::Args)]
pub struct Args {
    /// Concurrent clients, one level after another.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    clients: Vec<usize>,
    /// Tasks each client creates per round.
    #[arg(long, default_value_t = 25)]
    per_client: usize,
    /// Rounds per side and level, alternating router and bare loop.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

/// The shipped catalog plus a free kind that takes any object, so that the
/// route neither charges nor needs an upload. No worker runs, so every task
/// stays queued: the kind's free quota is the catalog's largest, far above
/// the run's few hundred tasks (the route still counts it on every create),
/// and so is its limit of tasks in flight, or the route would park every
/// task past the first few instead of sending it, and measure no SQS call.
const KIND: &str = "bench";
fn catalog_toml() -> String {
    let shipped = include_str!("../../reeve.toml");
    format!(
        "{shipped}\n[tasks.{KIND}]\ntitle = \"Bench\"\nexecutor = \"digest\"\ntimeout_seconds = 30\n\
         input_schema = {{ type = \"object\" }}\nrunning_per_space = 10000\n[tasks.{KIND}.quota]\nper_hour = 1000000\nat_once = 10000\n"
    )
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Router,
    Bare,
}

/// One round: tasks per second and every request's latency in µs.
struct Round {
    per_second: f64,
    latencies_us: Vec<u64>,
    /// Requests that failed (the local SQS times out under load): counted
    /// and reported, not timed.
    failures: usize,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let db = BenchDb::create("taskcreate").await?;
    let stack = Config::from_env();
    let aws = startup::aws_clients(&stack).await;
    let queue_name = format!("reeve-bench-{}", std::process::id());
    let queue_url = aws
        .sqs
        .create_queue()
        .queue_name(&queue_name)
        .send()
        .await
        .context("creating the harness's SQS queue (is the local stack up?)")?
        .queue_url()
        .context("a queue url")?
        .to_owned();
    // The API's context as `reeve serve` builds it, on the harness's own
    // database, queue and catalog.
    let catalog_path = std::env::temp_dir().join(format!("reeve-bench-{}.toml", std::process::id()));
    std::fs::write(&catalog_path, catalog_toml()).context("writing the bench catalog")?;
    let config = stack
        .with(settings::CATALOG, catalog_path.display().to_string())
        .with(settings::DATABASE_URL, db.url.clone())
        .with(settings::QUEUE_URL, queue_url.clone())
        // The shipped catalog prices on Base, and start-up refuses a price
        // no chain can prove. The bench's kind is free: nothing calls it.
        .with(settings::CHAIN_RPC_URLS, "eip155:8453=http://127.0.0.1:9".to_owned());
    let sdk = startup::sdk().await;
    let ctx = startup::api(&config, &sdk, Needs::ALL, Connect::Lazily).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let _ = std::fs::remove_file(&catalog_path);

    let space = SpaceIndex::from_array(rand_bytes());
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'bench')").bind(space.as_bytes()).execute(&ctx.db).await?;
    let (token, _) = auth::issue_token(&ctx.settings.token_key, &space, OffsetDateTime::now_utc());
    let router = reeve_shared::http::app(ctx.clone());

    // Warm both paths (pool connections, SQS client, prepared statements).
    for side in [Side::Router, Side::Bare] {
        one_round(side, &ctx, &router, &space, &token, 4, 5).await?;
    }

    let mut rows = Vec::new();
    for &clients in &args.clients {
        let (mut router_rounds, mut bare_rounds) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds {
            bare_rounds.push(one_round(Side::Bare, &ctx, &router, &space, &token, clients, args.per_client).await?);
            router_rounds.push(one_round(Side::Router, &ctx, &router, &space, &token, clients, args.per_client).await?);
        }
        let summary = |rounds: Vec<Round>| {
            let per_second = median(rounds.iter().map(|r| r.per_second).collect());
            let failures: usize = rounds.iter().map(|r| r.failures).sum();
            let mut all: Vec<u64> = rounds.into_iter().flat_map(|r| r.latencies_us).collect();
            all.sort_unstable();
            (per_second, quantile(&all, 0.5) as f64 / 1000.0, quantile(&all, 0.99) as f64 / 1000.0, failures)
        };
        let (router, bare) = (summary(router_rounds), summary(bare_rounds));
        eprintln!("taskcreate {clients} clients: router {router:?} bare {bare:?}");
        rows.push((clients, router, bare));
    }
    let _ = aws.sqs.delete_queue().queue_url(&queue_url).send().await;
    ctx.db.close().await;
    db.drop_now().await?;

    let mut out = String::from("## Task create\n\n");
    out.push_str(&format!(
        "`POST /v1/tasks/{{kind}}` (a free kind, a small object input) through the API's router in-process, against a \
         bare loop of the same `INSERT` (the task and its first event, one statement) and SQS `SendMessage`, on one \
         connection pool and a queue of the harness's own in the local SQS. Each client sends its requests one after \
         another; {} rounds of {} tasks per client for each side, alternating. Throughput is the median round's; \
         p50/p99 are over every request of every round.\n\n",
        args.rounds, args.per_client
    ));
    out.push_str(
        "| clients | router tasks/s | bare tasks/s | router p50 ms | bare p50 ms | router p99 ms | bare p99 ms | \
         throughput router ÷ bare | p99 router ÷ bare | failed router / bare |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (clients, r, b) in &rows {
        out.push_str(&format!(
            "| {clients} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | **{:.2}** | **{:.2}** | {} / {} |\n",
            r.0,
            b.0,
            r.1,
            b.1,
            r.2,
            b.2,
            r.0 / b.0.max(0.001),
            r.2 / b.2.max(0.001),
            r.3,
            b.3
        ));
    }
    out.push('\n');
    print!("{out}");
    Ok(())
}

fn rand_bytes() -> [u8; 16] {
    reeve_shared::ids::Id::new().to_bytes()
}

async fn one_round(
    side: Side,
    ctx: &Ctx,
    router: &axum::Router,
    space: &SpaceIndex,
    token: &str,
    clients: usize,
    per_client: usize,
) -> anyhow::Result<Round> {
    let token: Arc<str> = token.into();
    let started = Instant::now();
    let mut handles = Vec::with_capacity(clients);
    for c in 0..clients {
        let (ctx, router, space, token) = (ctx.clone(), router.clone(), *space, token.clone());
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_client);
            let mut failures = 0;
            for n in 0..per_client {
                let input = json!({ "client": c, "n": n });
                let start = Instant::now();
                let done: anyhow::Result<()> = async {
                    match side {
                        Side::Router => {
                            let request = Request::post(format!("/v1/tasks/{KIND}"))
                                .header("content-type", "application/json")
                                .header("authorization", format!("Bearer {token}"))
                                .body(Body::from(json!({ "input": input }).to_string()))?;
                            let response = router.clone().oneshot(request).await?;
                            let status = response.status();
                            let body = axum::body::to_bytes(response.into_body(), 1 << 20).await?;
                            if status != StatusCode::ACCEPTED {
                                bail!("the route answered {status}: {}", String::from_utf8_lossy(&body));
                            }
                        }
                        Side::Bare => {
                            let new = TaskRequest { space: &space, kind: KIND, input: &input, idempotency_key: None };
                            let Created::New(task) = tasks::create(&ctx.db, new).await? else {
                                bail!("a task without an idempotency key is always new")
                            };
                            tasks::enqueue(&ctx.aws.sqs, &ctx.settings.queue_url, task.id, &task.kind, Some(&space))
                                .await?;
                        }
                    }
                    Ok(())
                }
                .await;
                match done {
                    Ok(()) => latencies.push(start.elapsed().as_micros() as u64),
                    Err(e) => {
                        eprintln!("taskcreate: a request failed: {e:#}");
                        failures += 1;
                    }
                }
            }
            anyhow::Ok((latencies, failures))
        }));
    }
    let (mut latencies_us, mut failures) = (Vec::with_capacity(clients * per_client), 0);
    for handle in handles {
        let (latencies, failed) = tokio::time::timeout(Duration::from_secs(300), handle).await???;
        latencies_us.extend(latencies);
        failures += failed;
    }
    // A few timeouts of the local SQS are a figure; a side that never
    // succeeds is a broken benchmark, not a throughput of zero.
    if latencies_us.is_empty() {
        bail!("every one of {failures} requests failed (the first error is above)");
    }
    let per_second = latencies_us.len() as f64 / started.elapsed().as_secs_f64();
    Ok(Round { per_second, latencies_us, failures })
}
