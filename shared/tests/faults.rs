//! Faults with real services: duplicate deliveries at volume, Redis gone
//! mid-run. (Process kills live in `scripts/faults.sh`; see RELIABILITY.md.)

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::SqsEvent;
use futures_util::StreamExt;
use futures_util::stream;
use reeve_shared::aws::AwsClients;
use reeve_shared::executors::{ExecDeps, Job};
use reeve_shared::ids::Id;
use reeve_shared::outbound::{Outbound, OutboundPolicy};
use reeve_shared::redis_client::RedisClient;
use reeve_shared::settings::WorkerSettings;
use reeve_shared::worker::{Outcome, RunFuture, Runner, WorkerContext, handle_batch, process};
use serde_json::{Value, json};
use sqlx::PgPool;

/// Counts runs per task; each run takes a little while, so that duplicate
/// deliveries really overlap.
#[derive(Default)]
struct Counting {
    total: AtomicUsize,
    per_task: Mutex<HashMap<Id, usize>>,
}

impl Runner for Counting {
    fn run<'a>(&'a self, _deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a> {
        Box::pin(async move {
            self.total.fetch_add(1, Ordering::SeqCst);
            *self.per_task.lock().unwrap().entry(job.task_id).or_default() += 1;
            job.progress(0.5, json!({"half": true})).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(json!({"ok": true}))
        })
    }
}

async fn worker(pool: &PgPool, runner: Arc<Counting>, redis_url: &str) -> WorkerContext {
    let settings = WorkerSettings {
        database_url: String::new(),
        redis_url: redis_url.to_owned(),
        bucket: std::env::var("REEVE_BUCKET").unwrap(),
        queue_url: None,
        concurrency: 4,
        max_receives: 5,
        fetch_max_bytes: 1024,
    };
    let exec = ExecDeps {
        db: pool.clone(),
        s3: AwsClients::from_env().await.s3,
        bucket: settings.bucket.clone(),
        outbound: Outbound::new(OutboundPolicy::default()).unwrap(),
        fetch_max_bytes: 1024,
    };
    let mut ctx =
        WorkerContext::new(common::shipped_catalog(), pool.clone(), RedisClient::new(redis_url).unwrap(), exec, settings);
    ctx.runner = runner;
    ctx
}

/// `n` queued digest tasks with their first event, as create leaves them.
async fn queued_tasks(pool: &PgPool, n: usize) -> Vec<Id> {
    let space = Id::new().to_bytes();
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space).execute(pool).await.unwrap();
    let ids: Vec<Id> = (0..n).map(|_| Id::new()).collect();
    let raw: Vec<[u8; 16]> = ids.iter().map(|id| id.to_bytes()).collect();
    sqlx::query(
        "INSERT INTO tasks (id, space_idx, kind, input, status, last_seq)
         SELECT id, $2, 'digest', '{}', 'queued', 1 FROM unnest($1::bytea[]) AS id",
    )
    .bind(&raw)
    .bind(space)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO task_events (task_id, seq, type, data)
         SELECT id, 1, 'status', '{\"status\":\"queued\"}' FROM unnest($1::bytea[]) AS id",
    )
    .bind(&raw)
    .execute(pool)
    .await
    .unwrap();
    ids
}

fn body(id: Id) -> String {
    json!({"task_id": id, "kind": "digest"}).to_string()
}

fn batch(bodies: &[String]) -> SqsEvent {
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| json!({"messageId": format!("m{i}"), "body": body, "attributes": {"ApproximateReceiveCount": "1"}}))
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

/// Every task completed with a gap-free log ending in one `completed`.
async fn assert_all_completed_once(pool: &PgPool, ids: &[Id]) {
    let raw: Vec<[u8; 16]> = ids.iter().map(|id| id.to_bytes()).collect();
    let (completed, bad_logs, terminal_events): (i64, i64, i64) = sqlx::query_as(
        "SELECT
           (SELECT count(*) FROM tasks WHERE id = ANY($1) AND status = 'completed'),
           (SELECT count(*) FROM (
               SELECT task_id FROM task_events WHERE task_id = ANY($1)
               GROUP BY task_id HAVING max(seq) <> count(*) OR min(seq) <> 1) gaps),
           (SELECT count(*) FROM task_events
             WHERE task_id = ANY($1) AND type = 'status' AND data->>'status' = 'completed')",
    )
    .bind(&raw)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(completed, ids.len() as i64, "every task completed");
    assert_eq!(bad_logs, 0, "every event log is gap-free");
    assert_eq!(terminal_events, ids.len() as i64, "one terminal status event per task");
}

/// 1,000 tasks, each delivered twice: half as a duplicate in one Lambda
/// batch, half to two workers at the same moment. The executor runs
/// exactly 1,000 times.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_thousand_tasks_each_delivered_twice_run_exactly_a_thousand_times(pool: PgPool) {
    const N: usize = 1000;
    let runner = Arc::new(Counting::default());
    let a = worker(&pool, runner.clone(), &common::redis_url()).await;
    let b = worker(&pool, runner.clone(), &common::redis_url()).await;
    let ids = queued_tasks(&pool, N).await;
    let (in_batch, concurrent) = ids.split_at(N / 2);
    let started = Instant::now();

    // Duplicates in one batch: 5 tasks x 2 copies per batch of 10.
    let batches: Vec<SqsEvent> =
        in_batch.chunks(5).map(|c| batch(&c.iter().flat_map(|id| [body(*id), body(*id)]).collect::<Vec<_>>())).collect();
    let lambda = stream::iter(batches)
        .map(|event| handle_batch(&a, event))
        .buffer_unordered(4)
        .map(|response| response.batch_item_failures.len())
        .collect::<Vec<_>>();
    // The same message to two workers at once.
    let to_a = stream::iter(concurrent.to_vec())
        .map(|id| {
            let a = &a;
            async move { process(a, &body(id), 1).await }
        }).buffer_unordered(8).collect::<Vec<_>>();
    let to_b = stream::iter(concurrent.to_vec())
        .map(|id| {
            let b = &b;
            async move { process(b, &body(id), 1).await }
        }).buffer_unordered(8).collect::<Vec<_>>();
    let (failures, outcomes_a, outcomes_b) = tokio::join!(lambda, to_a, to_b);
    assert_eq!(failures.iter().sum::<usize>(), 0, "a duplicate in one batch needs no redelivery");

    // A copy that met the other's live lease is redelivered by SQS: do so.
    let retried_count = outcomes_a.iter().chain(outcomes_b.iter()).filter(|o| o.is_retry()).count();
    for id in concurrent {
        assert_eq!(process(&a, &body(*id), 2).await, Outcome::Done);
    }
    println!(
        "{N} tasks x 2 deliveries in {:.1}s; {retried_count} copies met a live lease and were redelivered",
        started.elapsed().as_secs_f64(),
    );

    assert_eq!(runner.total.load(Ordering::SeqCst), N, "the executor ran exactly once per task");
    assert!(runner.per_task.lock().unwrap().values().all(|&n| n == 1));
    assert_all_completed_once(&pool, &ids).await;
}

/// Redis stops while tasks run (a Redis of this test's own, on another
/// port): the tasks complete anyway, every event is in Postgres, and a
/// watcher that replays from Postgres once Redis is back sees it all.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn with_redis_stopped_mid_run_tasks_complete_and_nothing_is_lost(pool: PgPool) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let spawn = || {
        std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is installed")
    };
    let mut redis = spawn();
    let url = format!("redis://127.0.0.1:{port}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runner = Arc::new(Counting::default());
    let ctx = worker(&pool, runner.clone(), &url).await;
    let ids = queued_tasks(&pool, 40).await;

    let (first, rest) = ids.split_at(20);
    for id in first {
        assert_eq!(process(&ctx, &body(*id), 1).await, Outcome::Done);
    }
    redis.kill().unwrap();
    redis.wait().unwrap();
    let down = Instant::now();
    for id in rest {
        assert_eq!(process(&ctx, &body(*id), 1).await, Outcome::Done);
    }
    let elapsed = down.elapsed();
    assert!(elapsed < Duration::from_secs(30), "a missing Redis must not stall the worker: {elapsed:?}");
    let mut redis = spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_all_completed_once(&pool, &ids).await;
    // What a watcher replays from Postgres after the outage.
    let mut conn = pool.acquire().await.unwrap();
    for id in rest {
        let events = reeve_shared::tasks::events_after(&mut conn, *id, 0).await.unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["status", "status", "progress", "result", "status"], "{id}");
    }
    println!("20 tasks completed with Redis down in {:.1}s", elapsed.as_secs_f64());
    redis.kill().unwrap();
    redis.wait().unwrap();
}
