//! The task lifecycle an owner drives: listing their tasks a page at a time
//! and canceling one, queued or running, against the worker racing them.
//! Real Postgres, Redis and SQS; the router in-process.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::QueuedApi as Api;
use common::{Reply, get_authed, new_session, send};
use reeve_shared::executors::{ExecDeps, ExecError, Job};
use reeve_shared::ids::Id;
use reeve_shared::tasks::{self, CancelOutcome, Change, Event, EventType, Fence, events_after};
use reeve_shared::worker::{Outcome, RunFuture, Runner, WorkerContext, claim, process};
use serde_json::{Value, json};
use sqlx::PgPool;

/// The shipped catalog plus `steps`, run by the test's own runner. Both
/// kinds are free, and the listing test keeps 20 of one queued, past the
/// default quota's 10 at once (tests/quota.rs tests the quota itself).
fn catalog() -> String {
    common::catalog_text_with(
        r#"
        [tasks.steps]
        title = "Steps"
        description = "Whatever the test's runner does."
        executor = "digest"
        timeout_seconds = 30
        input_schema = { type = "object" }
        quota = { per_hour = 100, at_once = 100 }

        [tasks.other]
        title = "Other"
        description = "A second free kind, for the filters."
        executor = "digest"
        timeout_seconds = 30
        input_schema = { type = "object" }
        quota = { per_hour = 100, at_once = 100 }
    "#,
    )
}

impl Api {
    async fn list(&self, query: &str) -> Reply {
        send(&self.app, get_authed(&format!("/v1/tasks{query}"), &self.token)).await
    }

    async fn cancel(&self, id: &str) -> Reply {
        cancel_as(&self.app, &self.token, id).await
    }
}

async fn cancel_as(app: &Router, token: &str, id: &str) -> Reply {
    let request = Request::post(format!("/v1/tasks/{id}/cancel"))
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    send(app, request).await
}

/// Reports progress every 50 ms for `steps` steps, then answers; counts runs.
struct Stepper {
    runs: AtomicUsize,
    steps: usize,
}

impl Runner for Stepper {
    fn run<'a>(&'a self, _deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            for i in 1..=self.steps {
                tokio::time::sleep(Duration::from_millis(50)).await;
                job.progress(i as f32 / self.steps as f32, json!({"step": i})).await;
            }
            Ok(json!({"steps": self.steps}))
        })
    }
}

async fn worker(pool: &PgPool, steps: usize) -> (WorkerContext, Arc<Stepper>) {
    let ctx = common::worker(&common::with_catalog(common::worker_config(pool), &catalog())).await;
    let stepper = Arc::new(Stepper { runs: AtomicUsize::new(0), steps });
    (common::with_runner(ctx, stepper.clone()), stepper)
}

fn body_of(id: Id) -> String {
    json!({"task_id": id, "kind": "steps"}).to_string()
}

async fn status_of(pool: &PgPool, id: Id) -> String {
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

async fn events_of(pool: &PgPool, id: Id) -> Vec<Event> {
    let mut conn = pool.acquire().await.unwrap();
    events_after(&mut conn, id, 0).await.unwrap()
}

/// The `status` values of the events, in order.
fn statuses(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == EventType::Status)
        .map(|e| e.data["status"].as_str().unwrap().to_owned())
        .collect()
}

/// Gap-free, and exactly one terminal status event, the last event.
fn assert_one_ending(events: &[Event]) -> String {
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as i64).collect::<Vec<_>>(), "seq runs 1..n with no gaps");
    let terminal: Vec<String> =
        statuses(events).into_iter().filter(|s| matches!(s.as_str(), "completed" | "failed" | "canceled")).collect();
    assert_eq!(terminal.len(), 1, "exactly one terminal state: {events:?}");
    let last = events.last().unwrap();
    assert_eq!(last.kind, EventType::Status);
    assert_eq!(last.data["status"], terminal[0].as_str(), "the terminal status is the last event");
    terminal[0].clone()
}

fn ids(page: &Value) -> Vec<String> {
    page["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
}

// ------------------------------------------------------------------ list

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_list_pages_newest_first_with_a_cursor_and_filters(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let mut created = Vec::new();
    for i in 0..25 {
        created.push(api.create(if i % 5 == 0 { "steps" } else { "other" }, json!({})).await);
    }
    let newest_first: Vec<String> = created.iter().rev().map(Id::to_string).collect();

    // Default limit 20, then the rest; `next` is the last id of a full page.
    let first = api.list("").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(ids(&first.body), newest_first[..20]);
    assert_eq!(first.body["next"], newest_first[19].as_str());
    let second = api.list(&format!("?after={}", newest_first[19])).await;
    assert_eq!(ids(&second.body), newest_first[20..]);
    assert_eq!(second.body["next"], Value::Null);

    // Small pages walk the whole list once, in order.
    let mut walked = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = api.list(&format!("?limit=7{cursor}")).await;
        assert!(ids(&page.body).len() <= 7);
        walked.extend(ids(&page.body));
        match page.body["next"].as_str() {
            Some(next) => cursor = format!("&after={next}"),
            None => break,
        }
    }
    assert_eq!(walked, newest_first);

    // Each item is what GET /v1/tasks/{id} answers.
    let one = send(&api.app, get_authed(&format!("/v1/tasks/{}", newest_first[0]), &api.token)).await;
    assert_eq!(first.body["tasks"][0], one.body);

    // Filters, alone and together.
    let steps: Vec<String> = created.iter().step_by(5).rev().map(Id::to_string).collect();
    assert_eq!(ids(&api.list("?kind=steps").await.body), steps);
    assert_eq!(api.cancel(&steps[0]).await.status, StatusCode::OK);
    assert_eq!(ids(&api.list("?status=canceled").await.body), vec![steps[0].clone()]);
    assert_eq!(ids(&api.list("?status=queued&kind=steps").await.body), steps[1..]);
    assert_eq!(ids(&api.list("?status=completed").await.body), Vec::<String>::new());
    assert_eq!(api.list("?limit=100").await.body["tasks"].as_array().unwrap().len(), 25);

    // Another space sees none of them.
    let (_, other) = new_session(&api.app).await;
    let theirs = send(&api.app, get_authed("/v1/tasks", &other)).await;
    assert_eq!(theirs.body, json!({"tasks": [], "next": null}));

    // Bad values are a 400 envelope naming the problem.
    for query in ["?limit=0", "?limit=101", "?limit=ten", "?status=paused", "?after=not-an-id", "?limit=-1"] {
        let reply = api.list(query).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}: {}", reply.body);
        assert_eq!(reply.code(), "invalid_query", "{query}");
    }
    let anonymous = send(&api.app, common::get("/v1/tasks")).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    api.queue.delete().await;
}

// ------------------------------------------------------------------ cancel

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_queued_task_is_canceled_at_once_and_no_executor_ever_starts(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let id = api.create("steps", json!({})).await;

    let reply = api.cancel(&id.to_string()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["status"], "canceled");
    assert!(reply.body["cancel_requested_at"].is_null(), "canceled at once, never asked to stop: {}", reply.body);
    assert_eq!(statuses(&events_of(&pool, id).await), ["queued", "canceled"]);

    // Its message still arrives; the worker skips it without running anything.
    let (ctx, stepper) = worker(&pool, 3).await;
    assert_eq!(process(&ctx, &body_of(id), 1).await, Outcome::Done);
    assert_eq!(stepper.runs.load(Ordering::SeqCst), 0, "no executor started");
    assert_eq!(status_of(&pool, id).await, "canceled");

    // Terminal: 409; unknown, foreign and malformed ids: 404.
    let again = api.cancel(&id.to_string()).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "task_finished"));
    let (_, other) = new_session(&api.app).await;
    let fresh = api.create("steps", json!({})).await;
    for (token, task) in [(&api.token, Id::new().to_string()), (&other, fresh.to_string()), (&api.token, "nope".into())]
    {
        let reply = cancel_as(&api.app, token, &task).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::NOT_FOUND, "task_not_found"), "{task}");
    }
    assert_eq!(status_of(&pool, fresh).await, "queued", "someone else's cancel changed nothing");
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_running_task_canceled_mid_way_ends_canceled_within_two_seconds(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let id = api.create("steps", json!({})).await;
    // 200 steps of 50 ms: 10 s if nobody stops it.
    let (ctx, stepper) = worker(&pool, 200).await;
    let run = tokio::spawn(async move { process(&ctx, &body_of(id), 1).await });

    // Wait for a few steps, then cancel.
    let deadline = Instant::now() + Duration::from_secs(10);
    while events_of(&pool, id).await.iter().filter(|e| e.kind == EventType::Progress).count() < 3 {
        assert!(Instant::now() < deadline, "the task never made progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let asked = Instant::now();
    let reply = api.cancel(&id.to_string()).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_eq!(reply.body["status"], "running");
    assert!(reply.body["cancel_requested_at"].is_string(), "the answer says a stop was asked: {}", reply.body);

    let outcome = tokio::time::timeout(Duration::from_secs(2), run).await.expect("stopped within 2 s").unwrap();
    assert_eq!(outcome, Outcome::Done);
    assert!(asked.elapsed() < Duration::from_secs(2));
    assert_eq!(status_of(&pool, id).await, "canceled");
    assert_eq!(stepper.runs.load(Ordering::SeqCst), 1);

    let events = events_of(&pool, id).await;
    assert_eq!(assert_one_ending(&events), "canceled");
    assert_eq!(statuses(&events), ["queued", "running", "running", "canceled"]);
    let request = events.iter().find(|e| e.data["cancel_requested"] == true).expect("the request is an event");
    assert!(events.iter().all(|e| e.kind != EventType::Result), "no result once canceled");
    // No progress is recorded after the task ended.
    let steps = events.iter().filter(|e| e.kind == EventType::Progress).count();
    assert!(steps < 100, "the executor was stopped early ({steps} steps)");
    assert!(request.seq < events.last().unwrap().seq);

    // Asking again is still a 409 now that it ended.
    let again = api.cancel(&id.to_string()).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "task_finished"));
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn cancel_racing_the_claim_leaves_exactly_one_terminal_state(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let (ctx, stepper) = worker(&pool, 2).await;
    let ctx = Arc::new(ctx);
    let space = space_of(&pool, api.create("steps", json!({})).await).await;
    let mut endings = std::collections::HashMap::new();
    for _ in 0..20 {
        let id = api.create("steps", json!({})).await;
        let worker = ctx.clone();
        let (outcome, canceled) =
            tokio::join!(async { process(&worker, &body_of(id), 1).await }, tasks::cancel(&pool, &space, id));
        assert_eq!(outcome, Outcome::Done);
        let canceled = canceled.unwrap().unwrap();
        let ending = assert_one_ending(&events_of(&pool, id).await);
        assert_eq!(status_of(&pool, id).await, ending);
        // A cancel that won outright means the executor never started.
        if matches!(canceled, CancelOutcome::Canceled { .. }) {
            assert_eq!(ending, "canceled");
        }
        *endings.entry(ending).or_insert(0) += 1;
    }
    assert!(stepper.runs.load(Ordering::SeqCst) <= 20);
    assert!(endings.keys().all(|e| e == "canceled" || e == "completed"), "{endings:?}");
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn cancel_racing_the_completion_leaves_exactly_one_terminal_state(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let space = space_of(&pool, api.create("steps", json!({})).await).await;
    let mut won = (0, 0);
    for _ in 0..30 {
        let id = api.create("steps", json!({})).await;
        // A claim whose lease has already run out: its worker may still
        // complete it, while a cancel takes it as abandoned.
        let claim = claim(&pool, id, Duration::ZERO, 5).await.unwrap().unwrap();
        let result = json!({"done": true});
        let (completed, canceled) = tokio::join!(
            tasks::transition(
                &pool,
                id,
                Fence::Run(claim.attempt),
                Change::Complete { result: &result, payment: None, held: &[] }
            ),
            tasks::cancel(&pool, &space, id),
        );
        let completed = completed.unwrap().is_some();
        let canceled = matches!(canceled.unwrap().unwrap(), CancelOutcome::Canceled { .. });
        assert!(completed != canceled, "exactly one of them wins");
        let ending = assert_one_ending(&events_of(&pool, id).await);
        assert_eq!(ending, if completed { "completed" } else { "canceled" });
        if completed { won.0 += 1 } else { won.1 += 1 }
    }
    assert_eq!(won.0 + won.1, 30);
    api.queue.delete().await;
}

async fn space_of(pool: &PgPool, id: Id) -> reeve_shared::auth::SpaceIndex {
    let bytes: Vec<u8> =
        sqlx::query_scalar("SELECT space_idx FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap();
    reeve_shared::auth::SpaceIndex::from_slice(&bytes).unwrap()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_task_that_could_not_be_queued_shows_why_in_its_events(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let id = api.create("steps", json!({})).await;
    let error = tasks::task_error("queue_unavailable", "the task could not be queued");
    let status = tasks::mark_failed(&pool, id, &[tasks::TaskStatus::Queued], &error).await.unwrap().unwrap();
    let events = events_of(&pool, id).await;
    assert_eq!(events.len(), 3);
    assert_eq!((events[1].kind, &events[1].data), (EventType::Error, &error), "the reason is an error event");
    assert_eq!(status, events[2]);
    assert_eq!(status.data, json!({"status": "failed", "error": error}));
    api.queue.delete().await;
}

/// Fails with a retryable error after `after`.
struct Flaky {
    runs: AtomicUsize,
    after: Duration,
}

impl Runner for Flaky {
    fn run<'a>(&'a self, _deps: &'a ExecDeps, _job: Job<'a>) -> RunFuture<'a> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.after).await;
            Err(ExecError::Retryable("the network hiccuped".into()))
        })
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_canceled_run_that_fails_retryably_is_not_retried(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let space = space_of(&pool, api.create("steps", json!({})).await).await;
    let id = api.create("steps", json!({})).await;
    let (ctx, _) = worker(&pool, 1).await;
    let flaky = Arc::new(Flaky { runs: AtomicUsize::new(0), after: Duration::from_millis(300) });
    let ctx = Arc::new(common::with_runner(ctx, flaky.clone()));
    let worker = ctx.clone();
    let run = tokio::spawn(async move { process(&worker, &body_of(id), 1).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_of(&pool, id).await != "running" {
        assert!(Instant::now() < deadline, "never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tasks::cancel(&pool, &space, id).await.unwrap().unwrap();

    // Whether the worker notices the request first or the failure comes
    // first, the task ends canceled and is not handed back for a retry.
    assert_eq!(run.await.unwrap(), Outcome::Done);
    assert_eq!(status_of(&pool, id).await, "canceled");
    assert_eq!(assert_one_ending(&events_of(&pool, id).await), "canceled");

    // At most the one run (the request may even beat the executor's
    // start), and a later delivery of its message runs nothing.
    let runs = flaky.runs.load(Ordering::SeqCst);
    assert!(runs <= 1, "{runs} runs");
    assert_eq!(process(&ctx, &body_of(id), 2).await, Outcome::Done);
    assert_eq!(flaky.runs.load(Ordering::SeqCst), runs);
    api.queue.delete().await;
}

/// One attempt limit per task, whatever the message: two copies of a
/// task's message (the sweeper's re-send and SQS's redelivery), each on its
/// first delivery, never run it past `REEVE_MAX_RECEIVES`; the copy that
/// finds it out of attempts fails it `retries_exhausted` without a run.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_task_out_of_attempts_is_failed_without_a_run_whatever_the_receive_count(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let id = api.create("steps", json!({})).await;
    let (mut ctx, _) = worker(&pool, 1).await;
    let flaky = Arc::new(Flaky { runs: AtomicUsize::new(0), after: Duration::ZERO });
    ctx.runner = flaky.clone();
    let max = ctx.settings.max_receives;
    // Each run is its message's first delivery: the receive counts alone
    // would allow any number of runs.
    for attempt in 1..max {
        assert!(process(&ctx, &body_of(id), 1).await.is_retry(), "attempt {attempt} is handed back");
    }
    assert_eq!(process(&ctx, &body_of(id), 1).await, Outcome::Failed("retries_exhausted"), "the last attempt");
    assert_eq!(flaky.runs.load(Ordering::SeqCst), max as usize);

    // A task put back with all its attempts used (a run whose worker died
    // on the last one, then swept back): not run again.
    sqlx::query("UPDATE tasks SET status = 'queued', error = NULL WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(process(&ctx, &body_of(id), 1).await, Outcome::Failed("retries_exhausted"));
    assert_eq!(flaky.runs.load(Ordering::SeqCst), max as usize, "no run past the limit");
    assert_eq!(status_of(&pool, id).await, "failed");
    api.queue.delete().await;
}
