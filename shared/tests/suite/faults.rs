//! Faults with real services: duplicate deliveries at volume, Redis gone
//! mid-run, Postgres gone under requests and under a running worker, SQS
//! gone under create. (Process kills are `cli/tests/suite/kill.rs`; see
//! RELIABILITY.md.)

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::SqsEvent;
use futures_util::StreamExt;
use futures_util::stream;
use reeve_shared::executors::{ExecDeps, Job};
use reeve_shared::ids::Id;
use reeve_shared::settings;
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
    let ctx = common::worker(&common::worker_config(pool).with(settings::REDIS_URL, redis_url)).await;
    common::with_runner(ctx, runner)
}

/// `n` queued digest tasks with their first event, as create leaves them.
async fn queued_tasks(pool: &PgPool, n: usize) -> Vec<Id> {
    queued_tasks_of(pool, "digest", n).await
}

async fn queued_tasks_of(pool: &PgPool, kind: &str, n: usize) -> Vec<Id> {
    // Each in a Space of its own: these tests are about delivery, and one
    // Space's tasks past `running_per_space` would wait parked (fairness::).
    let spaces: Vec<[u8; 16]> = (0..n).map(|_| Id::new().to_bytes()).collect();
    sqlx::query("INSERT INTO spaces (idx, hash) SELECT idx, 'x' FROM unnest($1::bytea[]) AS idx")
        .bind(&spaces)
        .execute(pool)
        .await
        .unwrap();
    let ids: Vec<Id> = (0..n).map(|_| Id::new()).collect();
    let raw: Vec<[u8; 16]> = ids.iter().map(|id| id.to_bytes()).collect();
    sqlx::query(
        "INSERT INTO tasks (id, space_idx, kind, input, status, last_seq)
         SELECT t.id, t.space, $3, '{}', 'queued', 1 FROM unnest($1::bytea[], $2::bytea[]) AS t(id, space)",
    )
    .bind(&raw)
    .bind(&spaces)
    .bind(kind)
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
    let batches: Vec<SqsEvent> = in_batch
        .chunks(5)
        .map(|c| batch(&c.iter().flat_map(|id| [body(*id), body(*id)]).collect::<Vec<_>>()))
        .collect();
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
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>();
    let to_b = stream::iter(concurrent.to_vec())
        .map(|id| {
            let b = &b;
            async move { process(b, &body(id), 1).await }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>();
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
    let addr = format!("127.0.0.1:{port}");
    common::wait_until("redis-server listens", Duration::from_secs(10), || common::listening(&addr)).await;
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
    common::wait_until("redis-server listens again", Duration::from_secs(10), || common::listening(&addr)).await;
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

/// Postgres stops while requests arrive: each answers `503` in the
/// envelope, nothing is half-written, and service resumes once it is back.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn with_postgres_stopped_requests_get_503_and_nothing_is_half_written(pool: PgPool) {
    use axum::http::StatusCode;
    use common::{get_authed, new_session, post_json, send};
    let options = (*pool.connect_options()).clone();
    let proxy = common::cuttable::Cuttable::to((options.get_host().to_owned(), options.get_port())).await;
    let through = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(3))
        .connect_with(options.host("127.0.0.1").port(proxy.port))
        .await
        .unwrap();
    // Fault: the API's pool reaches Postgres through the proxy the test cuts.
    let app = reeve_shared::http::app(common::ctx(through).await);
    let (_, token) = new_session(&app).await;
    let counts = || async {
        sqlx::query_as::<_, (i64, i64, i64)>(
            "SELECT (SELECT count(*) FROM spaces), (SELECT count(*) FROM uploads), (SELECT count(*) FROM tasks)",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let before = counts().await;

    proxy.cut();
    let upload = json!({"filename": "a.txt", "content_type": "text/plain", "size": 3});
    let mut answers = Vec::new();
    for round in 0..5 {
        for request in [
            axum::http::Request::post("/v1/spaces").body(axum::body::Body::empty()).unwrap(),
            post_json("/v1/sessions", None, &json!({"space_id": "12345678901234567890"})),
            post_json("/v1/uploads", Some(&token), &upload),
            post_json("/v1/tasks/digest", Some(&token), &json!({"input": {"upload_id": Id::new()}})),
            get_authed(&format!("/v1/tasks/{}", Id::new()), &token),
        ] {
            let reply = send(&app, request).await;
            assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "round {round}: {}", reply.body);
            assert_eq!(reply.code(), "database_unavailable");
            answers.push(reply.status);
        }
    }
    assert_eq!(counts().await, before, "nothing was written while Postgres was away");

    proxy.restore();
    let created = send(&app, axum::http::Request::post("/v1/spaces").body(axum::body::Body::empty()).unwrap()).await;
    assert_eq!(created.status, StatusCode::CREATED, "service resumes: {}", created.body);
    println!("{} requests with Postgres cut: all 503 database_unavailable", answers.len());
}

/// The SQS server stops (a moto of this test's own): create answers `503
/// queue_unavailable`, and the task is left `failed`, never `queued`.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn with_sqs_stopped_create_answers_503_and_leaves_no_task_queued(pool: PgPool) {
    use axum::http::StatusCode;
    use common::{new_session, post_json, send};
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut moto = std::process::Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("moto_server is on PATH (the project venv)");
    let endpoint = format!("http://127.0.0.1:{port}");
    let aws = common::aws().await;
    let sqs = aws_sdk_sqs::Client::from_conf(aws.sqs.config().to_builder().endpoint_url(&endpoint).build());
    let mut queue = None;
    for _ in 0..100 {
        if let Ok(q) = sqs.create_queue().queue_name("reeve-faults").send().await {
            queue = q.queue_url().map(str::to_owned);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let queue = queue.expect("our moto started");
    let mut ctx = common::api(&common::config(&pool).with(settings::QUEUE_URL, queue)).await;
    // Fault: task create's SQS client reaches this test's own moto, which
    // it stops below (the SDK takes its endpoint from the process).
    Arc::get_mut(&mut Arc::get_mut(&mut ctx).expect("just built").task_create).expect("just built").aws.sqs = sqs;
    let app = reeve_shared::http::app(ctx);
    let (_, token) = new_session(&app).await;
    // Two uploads, PUT to the real S3, so that the tasks pass every check.
    let mut upload_ids = Vec::new();
    for _ in 0..2 {
        let up = send(
            &app,
            post_json(
                "/v1/uploads",
                Some(&token),
                &json!({"filename": "hi.txt", "content_type": "text/plain", "size": 2}),
            ),
        )
        .await;
        assert_eq!(up.status, StatusCode::CREATED, "{}", up.body);
        let mut put = reqwest::Client::new().put(up.body["url"].as_str().unwrap()).body("hi");
        for (k, v) in up.body["headers"].as_object().unwrap() {
            if k != "content-length" {
                put = put.header(k, v.as_str().unwrap());
            }
        }
        assert!(put.send().await.unwrap().status().is_success());
        upload_ids.push(up.body["upload_id"].clone());
    }
    let ok =
        send(&app, post_json("/v1/tasks/digest", Some(&token), &json!({"input": {"upload_id": upload_ids[0]}}))).await;
    assert_eq!(ok.status, StatusCode::ACCEPTED, "{}", ok.body);

    moto.kill().unwrap();
    moto.wait().unwrap();
    let started = Instant::now();
    let down =
        send(&app, post_json("/v1/tasks/digest", Some(&token), &json!({"input": {"upload_id": upload_ids[1]}}))).await;
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE, "{}", down.body);
    assert_eq!(down.code(), "queue_unavailable");
    let queued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'queued'").fetch_one(&pool).await.unwrap();
    let failed: Vec<Value> =
        sqlx::query_scalar::<_, sqlx::types::Json<Value>>("SELECT error FROM tasks WHERE status = 'failed'")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .map(|j| j.0)
            .collect();
    assert_eq!(queued, 1, "only the task created while SQS was up is queued");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["code"], "queue_unavailable");
    println!("create with SQS stopped: 503 queue_unavailable in {:.1}s", started.elapsed().as_secs_f64());
}

/// Runs until the test opens its gate, writing a side effect of the task's
/// own into Postgres through the worker's (cuttable) pool: one row per task,
/// made idempotent by its key, as an executor that may run again must be.
/// Half the tasks write once more after the gate, so that an outage there
/// is the executor's retryable error rather than the worker's.
struct Gated {
    started: AtomicUsize,
    runs: Mutex<HashMap<Id, usize>>,
    /// Effects that landed, and re-runs the key turned into no-ops.
    written: AtomicUsize,
    skipped: AtomicUsize,
    gate: tokio::sync::watch::Receiver<bool>,
    write_after: Mutex<std::collections::HashSet<Id>>,
}

impl Runner for Gated {
    fn run<'a>(&'a self, deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a> {
        use reeve_shared::executors::ExecError;
        Box::pin(async move {
            let id = job.task_id;
            *self.runs.lock().unwrap().entry(id).or_default() += 1;
            let inserted = sqlx::query("INSERT INTO effects (task_id) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind(id)
                .execute(&deps.db)
                .await
                .map_err(|e| ExecError::Retryable(format!("writing the effect: {e}")))?
                .rows_affected();
            let counter = if inserted == 1 { &self.written } else { &self.skipped };
            counter.fetch_add(1, Ordering::SeqCst);
            self.started.fetch_add(1, Ordering::SeqCst);
            job.progress(0.5, json!({"effect": true})).await;
            let _ = self.gate.clone().wait_for(|open| *open).await;
            if self.write_after.lock().unwrap().contains(&id) {
                sqlx::query("UPDATE effects SET finished = true WHERE task_id = $1")
                    .bind(id)
                    .execute(&deps.db)
                    .await
                    .map_err(|e| ExecError::Retryable(format!("finishing the effect: {e}")))?;
            }
            Ok(json!({ "task": id }))
        })
    }
}

/// An SQS batch of `(message id, body)` records, delivered for the
/// `receive_count`-th time.
fn redelivery(records: &[(String, String)], receive_count: u32) -> SqsEvent {
    let records: Vec<Value> = records
        .iter()
        .map(|(id, body)| {
            json!({"messageId": id, "body": body,
                   "attributes": {"ApproximateReceiveCount": receive_count.to_string()}})
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

/// Postgres stops under a running worker (its pool goes through a proxy
/// this test cuts), with four tasks mid-run and six not yet started in one
/// Lambda batch. The worker neither panics nor fails a task: every record
/// comes back as a batch item failure. Once Postgres is back and SQS
/// redelivers, every task completes exactly once with a gap-free log, and
/// each side effect exists once although the runs cut mid-way ran again.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn with_postgres_stopped_under_a_running_worker_every_message_is_handed_back_and_completes_once(pool: PgPool) {
    const N: usize = 10;
    sqlx::query("CREATE TABLE effects (task_id bytea PRIMARY KEY, finished boolean NOT NULL DEFAULT false)")
        .execute(&pool)
        .await
        .unwrap();
    let options = (*pool.connect_options()).clone();
    let proxy = common::cuttable::Cuttable::to((options.get_host().to_owned(), options.get_port())).await;
    // A short acquire timeout: each call that meets the outage gives up in
    // a second rather than sqlx's default 30.
    let through = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options.host("127.0.0.1").port(proxy.port))
        .await
        .unwrap();
    // Every connection opened before the run, each given several tries: on
    // a loaded machine a fresh one through the proxy can take longer than
    // that second, and a claim that gives up hands its record back before
    // its run starts.
    let warm = futures_util::future::join_all((0..8).map(|_| async {
        for _ in 0..10 {
            if let Ok(connection) = through.acquire().await {
                return connection;
            }
        }
        panic!("no connection to Postgres through the proxy in 10 tries");
    }))
    .await;
    drop(warm);

    let (open, gate) = tokio::sync::watch::channel(false);
    let runner = Arc::new(Gated {
        started: AtomicUsize::new(0),
        runs: Mutex::default(),
        written: AtomicUsize::new(0),
        skipped: AtomicUsize::new(0),
        gate,
        write_after: Mutex::default(),
    });
    let catalog = common::catalog_text_with(
        r#"
        [tasks.gated]
        title = "Gated"
        description = "Whatever the test's runner does."
        executor = "digest"
        timeout_seconds = 5
        input_schema = { type = "object" }
        "#,
    );
    // Fault: the worker's pool reaches Postgres through the proxy the test cuts.
    let config = common::with_catalog(common::worker_config(&through), &catalog)
        // Redelivery below goes on until the cut runs' leases run out; it
        // must not reach the last delivery meanwhile.
        .with(settings::MAX_RECEIVES, "100")
        // A cut run's lease is what redelivery waits out. Long enough that a
        // run renews it through the proxy on a loaded machine (at 2 s, CI's
        // parallel suite let the first runs lapse before they started).
        .with(settings::LEASE, "5");
    let ctx = Arc::new(common::with_runner(common::worker(&config).await, runner.clone()));

    let ids = queued_tasks_of(&pool, "gated", N).await;
    runner.write_after.lock().unwrap().extend(ids.iter().step_by(2).copied());
    let records: Vec<(String, String)> =
        ids.iter().map(|id| (format!("m-{id}"), json!({"task_id": id, "kind": "gated"}).to_string())).collect();

    let lambda = tokio::spawn({
        let (ctx, event) = (ctx.clone(), redelivery(&records, 1));
        async move { handle_batch(&ctx, event).await }
    });
    let wait = Instant::now();
    while runner.started.load(Ordering::SeqCst) < 4 {
        assert!(!lambda.is_finished(), "the batch ended before four runs started: {:?}", runner.started);
        assert!(wait.elapsed() < Duration::from_secs(60), "four runs start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.cut();
    let cut = Instant::now();
    open.send(true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(60), lambda)
        .await
        .expect("the batch ends while Postgres is away")
        .expect("the worker does not panic");
    let during = cut.elapsed();
    let mut handed_back: Vec<String> = response.batch_item_failures.iter().map(|f| f.item_identifier.clone()).collect();
    handed_back.sort();
    let mut all: Vec<String> = records.iter().map(|(m, _)| m.clone()).collect();
    all.sort();
    assert_eq!(handed_back, all, "every record is handed back for redelivery");

    let statuses: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM tasks GROUP BY status ORDER BY status")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        statuses.iter().all(|(s, _)| s == "queued" || s == "running"),
        "nothing was marked finished or failed while Postgres was away: {statuses:?}"
    );
    let cut_mid_run = runner.started.load(Ordering::SeqCst);
    assert_eq!(cut_mid_run, 4, "only the first four runs had started");

    proxy.restore();
    let restored = Instant::now();
    let mut pending = records.clone();
    let mut deliveries = 1;
    while !pending.is_empty() {
        assert!(restored.elapsed() < Duration::from_secs(60), "redelivery finishes every task: {pending:?} left");
        tokio::time::sleep(Duration::from_millis(500)).await;
        deliveries += 1;
        let failed: std::collections::HashSet<String> = handle_batch(&ctx, redelivery(&pending, deliveries))
            .await
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect();
        pending.retain(|(m, _)| failed.contains(m));
    }
    let recovered = restored.elapsed();

    assert_all_completed_once(&pool, &ids).await;
    let mut conn = pool.acquire().await.unwrap();
    for id in &ids {
        let events = reeve_shared::tasks::events_after(&mut conn, *id, 0).await.unwrap();
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=events.len() as i64).collect::<Vec<_>>(), "{id}: gap-free");
        let last = events.last().unwrap();
        assert_eq!(last.data["status"], "completed", "{id}: the terminal state is the last event");
        let errors = events.iter().filter(|e| e.data.get("status").is_some_and(|s| s == "failed")).count();
        assert_eq!(errors, 0, "{id}: never failed");
    }
    let results: Vec<sqlx::types::Json<Value>> =
        sqlx::query_scalar("SELECT result FROM tasks ORDER BY id").fetch_all(&pool).await.unwrap();
    assert!(results.iter().all(|r| r.0["task"].is_string()), "every task has its result");
    let effects: (i64, i64) = sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE finished) FROM effects")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(effects, (N as i64, N.div_ceil(2) as i64), "one side effect per task, finished where asked");
    let runs = runner.runs.lock().unwrap().clone();
    let reran = runs.values().filter(|&&n| n == 2).count();
    assert!(runs.values().all(|&n| n == 1 || n == 2), "{runs:?}");
    assert_eq!(runs.len(), N);
    assert_eq!(runner.written.load(Ordering::SeqCst), N, "each effect landed once");
    assert_eq!(runner.skipped.load(Ordering::SeqCst), reran, "a re-run's effect was a no-op");
    println!(
        "Postgres cut under a worker: {N} records ({cut_mid_run} mid-run) all handed back in {:.2}s; \
         after restore all {N} completed once in {:.1}s over {} deliveries; {reran} runs ran again, \
         their effect a no-op",
        during.as_secs_f64(),
        recovered.as_secs_f64(),
        deliveries,
    );
}
