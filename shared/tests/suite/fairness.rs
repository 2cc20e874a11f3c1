//! Fairness between Spaces, against the real stack (Postgres, Redis, moto
//! SQS): at most `running_per_space` of one Space's tasks run at once,
//! however many workers poll; a task over the limit waits `queued` with its
//! reason and no attempt counted; another Space's task runs meanwhile; a
//! kind's own limit counts its own tasks.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::QueuedApi as Api;
use reeve_shared::auth::SpaceIndex;
use reeve_shared::catalog::{Catalog, CatalogError};
use reeve_shared::executors::{ExecDeps, Job};
use reeve_shared::ids::Id;
use reeve_shared::settings::{self, Config};
use reeve_shared::tasks::{EventType, events_after};
use reeve_shared::worker::{Poller, RunFuture, Runner};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::Semaphore;

/// The development catalog with `[limits] running_per_space = limit`, a
/// kind `steps` that shares it and a kind `wide` with its own limit of
/// `wide`.
fn catalog(limit: u32, wide: u32) -> String {
    common::catalog_text_with(&format!(
        r#"
        [limits]
        running_per_space = {limit}

        [tasks.steps]
        title = "Steps"
        description = "Whatever the test's runner does."
        executor = "digest"
        timeout_seconds = 30
        input_schema = {{ type = "object" }}
        quota = {{ per_hour = 1000, at_once = 1000 }}

        [tasks.wide]
        title = "Wide"
        description = "A kind with a limit of its own."
        executor = "digest"
        timeout_seconds = 30
        input_schema = {{ type = "object" }}
        quota = {{ per_hour = 1000, at_once = 1000 }}
        running_per_space = {wide}
        "#
    ))
}

/// Runs every job until `release` gives it a permit (or at once when its
/// input says `{"hold": false}`), noting how many of each Space's and each
/// (Space, kind)'s jobs run at once, and the most there ever were.
struct Gate {
    release: Arc<Semaphore>,
    now: Mutex<HashMap<(SpaceIndex, Option<String>), usize>>,
    most: Mutex<HashMap<(SpaceIndex, Option<String>), usize>>,
}

impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate { release: Arc::new(Semaphore::new(0)), now: Mutex::default(), most: Mutex::default() })
    }

    fn enter(&self, keys: &[(SpaceIndex, Option<String>)], by: isize) {
        let mut now = self.now.lock().unwrap();
        let mut most = self.most.lock().unwrap();
        for key in keys {
            let n = now.entry(key.clone()).or_default();
            *n = n.saturating_add_signed(by);
            let m = most.entry(key.clone()).or_default();
            *m = (*m).max(*n);
        }
    }

    fn most(&self, space: SpaceIndex, kind: Option<&str>) -> usize {
        self.most.lock().unwrap().get(&(space, kind.map(str::to_owned))).copied().unwrap_or(0)
    }

    fn running(&self, space: SpaceIndex, kind: Option<&str>) -> usize {
        self.now.lock().unwrap().get(&(space, kind.map(str::to_owned))).copied().unwrap_or(0)
    }
}

impl Runner for Gate {
    fn run<'a>(&'a self, _deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a> {
        Box::pin(async move {
            let keys = [(job.space, None), (job.space, Some(job.kind.to_owned()))];
            self.enter(&keys, 1);
            match job.input.get("sleep_ms").and_then(Value::as_u64) {
                Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                None if job.input["hold"] == json!(false) => {}
                None => self.release.acquire().await.unwrap().forget(),
            }
            self.enter(&keys, -1);
            Ok(json!({"done": true}))
        })
    }
}

/// A worker on the test's queue running `gate`, as `reeve work` polls it,
/// with `concurrency` runs at once; stopped by sending on the channel.
async fn poll(pool: &PgPool, toml: &str, queue: &str, gate: Arc<Gate>, concurrency: usize) -> Polling {
    let config: Config = common::with_catalog(common::config(pool), toml)
        .with(settings::QUEUE_URL, queue)
        .with(settings::WORKER_CONCURRENCY, concurrency.to_string());
    let ctx = common::with_runner(common::worker(&config).await, gate);
    let mut poller = Poller::connect(Arc::new(ctx), common::aws().await.sqs, queue).await.unwrap();
    poller.wait_time_seconds = 1;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move { poller.run(async { stopped.await.unwrap() }).await });
    Polling { stop, handle }
}

struct Polling {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<()>,
}

impl Polling {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.handle.await.unwrap();
    }
}

async fn space_of(pool: &PgPool, id: Id) -> SpaceIndex {
    let bytes: Vec<u8> =
        sqlx::query_scalar("SELECT space_idx FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap();
    SpaceIndex::from_slice(&bytes).unwrap()
}

async fn status_and_attempts(pool: &PgPool, id: Id) -> (String, i32) {
    sqlx::query_as("SELECT status, attempts FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

async fn count(pool: &PgPool, ids: &[Id], status: &str) -> usize {
    let mut n = 0;
    for id in ids {
        if status_and_attempts(pool, *id).await.0 == status {
            n += 1;
        }
    }
    n
}

/// The task as its owner reads it: `GET /v1/tasks/{id}`.
async fn view(api: &Api, token: &str, id: Id) -> Value {
    let reply = common::send(&api.app, common::get_authed(&format!("/v1/tasks/{id}"), token)).await;
    assert_eq!(reply.status, axum::http::StatusCode::OK, "{}", reply.body);
    reply.body
}

/// Creates a task of `kind` with `input` in the Space of `token`.
async fn create_as(api: &Api, token: &str, kind: &str, input: Value) -> Id {
    let created = common::send(
        &api.app,
        common::post_json(&format!("/v1/tasks/{kind}"), Some(token), &json!({ "input": input })),
    )
    .await;
    assert_eq!(created.status, axum::http::StatusCode::ACCEPTED, "{}", created.body);
    created.body["id"].as_str().unwrap().parse().unwrap()
}

const WITHIN: Duration = Duration::from_secs(30);

/// Two workers of four runs each poll one queue holding eight tasks of one
/// Space whose limit is 2: never more than two run at once, yet all eight
/// complete, each in one attempt (waiting counted none).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_limit_holds_under_concurrent_workers(pool: PgPool) {
    let toml = catalog(2, 5);
    let api = Api::new(&pool, &toml).await;
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(api.create("steps", json!({"sleep_ms": 300})).await);
    }
    let space = space_of(&pool, ids[0]).await;
    let gate = Gate::new();
    let one = poll(&pool, &toml, &api.queue.url, gate.clone(), 4).await;
    let two = poll(&pool, &toml, &api.queue.url, gate.clone(), 4).await;
    common::wait_until("all eight completed", WITHIN, || async { count(&pool, &ids, "completed").await == 8 }).await;
    one.stop().await;
    two.stop().await;

    assert_eq!(gate.most(space, None), 2, "at most two of the Space's tasks ran at once, and two did");
    for id in &ids {
        assert_eq!(status_and_attempts(&pool, *id).await, ("completed".into(), 1), "no attempt spent waiting");
    }
    api.queue.delete().await;
}

/// With a limit of 1, the second task waits: its owner reads it `queued`
/// with `waiting` saying why, its events say so once, and no attempt is
/// counted; when the first ends it runs, in its first attempt, and
/// `waiting` is gone.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_waiting_task_shows_its_reason_and_spends_no_attempt(pool: PgPool) {
    let toml = catalog(1, 5);
    let api = Api::new(&pool, &toml).await;
    let first = api.create("steps", json!({})).await;
    let gate = Gate::new();
    let worker = poll(&pool, &toml, &api.queue.url, gate.clone(), 4).await;
    common::wait_until("the first running", WITHIN, || async {
        status_and_attempts(&pool, first).await.0 == "running"
    })
    .await;
    let second = api.create("steps", json!({})).await;
    common::wait_until("the second waiting", WITHIN, || async {
        !view(&api, &api.token, second).await["waiting"].is_null()
    })
    .await;

    let waiting = view(&api, &api.token, second).await;
    assert_eq!(waiting["status"], "queued");
    assert_eq!(waiting["attempts"], 0, "waiting spends no attempt");
    assert_eq!(waiting["waiting"]["code"], "running_per_space");
    assert_eq!(waiting["waiting"]["limit"], 1);
    let message = waiting["waiting"]["message"].as_str().unwrap();
    assert!(message.contains("starts when one of them ends"), "{message}");
    let events = events_after(&mut pool.acquire().await.unwrap(), second, 0).await.unwrap();
    let said: Vec<&Value> = events.iter().filter(|e| e.kind == EventType::Status).map(|e| &e.data).collect();
    assert_eq!(said, [&json!({"status": "queued"}), &json!({"status": "queued", "waiting": waiting["waiting"]})]);

    gate.release.add_permits(2);
    common::wait_until("both completed", WITHIN, || async { count(&pool, &[first, second], "completed").await == 2 })
        .await;
    worker.stop().await;
    let done = view(&api, &api.token, second).await;
    assert_eq!((done["status"].as_str(), done["attempts"].as_i64()), (Some("completed"), Some(1)));
    assert!(done.get("waiting").is_none(), "no longer waiting: {done}");
    let events = events_after(&mut pool.acquire().await.unwrap(), second, 0).await.unwrap();
    let statuses: Vec<&str> =
        events.iter().filter(|e| e.kind == EventType::Status).filter_map(|e| e.data["status"].as_str()).collect();
    assert_eq!(statuses, ["queued", "queued", "running", "completed"]);
    assert_eq!(gate.most(space_of(&pool, first).await, None), 1);
    api.queue.delete().await;
}

/// One Space's backlog waits behind its limit while another Space's task,
/// sent after all of it, runs and completes at once.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn another_spaces_task_runs_while_one_spaces_backlog_waits(pool: PgPool) {
    let toml = catalog(1, 5);
    let api = Api::new(&pool, &toml).await;
    let mut backlog = Vec::new();
    for _ in 0..6 {
        backlog.push(api.create("steps", json!({})).await);
    }
    let (_, other_token) = common::new_session(&api.app).await;
    let gate = Gate::new();
    let worker = poll(&pool, &toml, &api.queue.url, gate.clone(), 4).await;
    let other = create_as(&api, &other_token, "steps", json!({"hold": false})).await;

    common::wait_until("the other Space's task completed", WITHIN, || async {
        status_and_attempts(&pool, other).await.0 == "completed"
    })
    .await;
    let busy = space_of(&pool, backlog[0]).await;
    // The backlog's first message and the other Space's may come in one
    // receive: the other's run can end before the first is claimed. And a
    // task is `running` in Postgres a moment before its run reaches the
    // gate: wait for both.
    common::wait_until("the backlog's first task running", WITHIN, || async {
        count(&pool, &backlog, "running").await >= 1 && gate.running(busy, None) >= 1
    })
    .await;
    assert_eq!(count(&pool, &backlog, "running").await, 1, "the backlog runs one at a time");
    assert_eq!(count(&pool, &backlog, "queued").await, 5, "and the rest waits");
    assert_eq!(gate.running(busy, None), 1);
    // The owner of the busy Space sees why.
    let waiting = view(&api, &api.token, *backlog.last().unwrap()).await;
    assert_eq!(waiting["waiting"]["code"], "running_per_space", "{waiting}");

    // The backlog drains, one at a time, as each run ends.
    gate.release.add_permits(backlog.len());
    common::wait_until("the backlog completed", WITHIN, || async { count(&pool, &backlog, "completed").await == 6 })
        .await;
    worker.stop().await;
    assert_eq!(gate.most(busy, None), 1);
    for id in &backlog {
        assert_eq!(status_and_attempts(&pool, *id).await.1, 1, "no attempt spent waiting");
    }
    api.queue.delete().await;
}

/// A Space's backlog waits parked in Postgres, not in the queue: with a
/// limit of 1, six tasks created with no worker put one message in the
/// queue and five tasks that say why they wait, so another Space's task
/// created after them is queued behind one message, not six.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_backlog_beyond_the_limit_waits_out_of_the_queue(pool: PgPool) {
    let toml = catalog(1, 5);
    let api = Api::new(&pool, &toml).await;
    let mut backlog = Vec::new();
    for _ in 0..6 {
        backlog.push(api.create("steps", json!({})).await);
    }
    let (_, other_token) = common::new_session(&api.app).await;
    let other = create_as(&api, &other_token, "steps", json!({})).await;

    let sent = api.queue.drain().await;
    assert_eq!(
        sent,
        [json!({"task_id": backlog[0], "kind": "steps"}), json!({"task_id": other, "kind": "steps"})],
        "the queue holds the busy Space's first task and the other Space's, nothing of the backlog"
    );
    assert!(view(&api, &api.token, backlog[0]).await.get("waiting").is_none());
    for id in &backlog[1..] {
        let waiting = view(&api, &api.token, *id).await;
        assert_eq!((waiting["status"].as_str(), waiting["attempts"].as_i64()), (Some("queued"), Some(0)));
        assert_eq!(waiting["waiting"]["code"], "running_per_space", "{waiting}");
    }
    api.queue.delete().await;
}

/// A kind with its own limit (3) counts its own tasks only: three `wide`
/// run at once beside one `steps` (the catalog's limit, 1), and neither
/// holds the other back.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_kind_with_its_own_limit_counts_its_own_tasks(pool: PgPool) {
    let toml = catalog(1, 3);
    let api = Api::new(&pool, &toml).await;
    let mut wide = Vec::new();
    for _ in 0..5 {
        wide.push(api.create("wide", json!({})).await);
    }
    let steps = [api.create("steps", json!({})).await, api.create("steps", json!({})).await];
    let space = space_of(&pool, steps[0]).await;
    let gate = Gate::new();
    let worker = poll(&pool, &toml, &api.queue.url, gate.clone(), 8).await;

    common::wait_until("three wide and one steps running", WITHIN, || async {
        count(&pool, &wide, "running").await == 3 && count(&pool, &steps, "running").await == 1
    })
    .await;
    // Held there: the others wait, each with its own pool's reason.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((count(&pool, &wide, "running").await, count(&pool, &steps, "running").await), (3, 1));
    let waiting: Vec<Value> = {
        let mut views = Vec::new();
        for id in wide.iter().chain(&steps) {
            let task = view(&api, &api.token, *id).await;
            if task["status"] == "queued" {
                views.push(task);
            }
        }
        views
    };
    assert_eq!(waiting.len(), 3);
    for task in &waiting {
        let limit = if task["kind"] == "wide" { 3 } else { 1 };
        assert_eq!(task["waiting"]["limit"], limit, "{task}");
    }

    gate.release.add_permits(7);
    common::wait_until("all completed", WITHIN, || async {
        count(&pool, &wide, "completed").await == 5 && count(&pool, &steps, "completed").await == 2
    })
    .await;
    worker.stop().await;
    assert_eq!(gate.most(space, Some("wide")), 3);
    assert_eq!(gate.most(space, Some("steps")), 1);
    assert_eq!(gate.most(space, None), 4);
    api.queue.delete().await;
}

/// The settings are checked at load, each mistake at its TOML path.
#[test]
fn the_limits_are_checked_with_their_paths() {
    let text = common::catalog_text_with(
        r#"
        [limits]
        running_per_space = 0
        runing = 3

        [tasks.steps]
        title = "Steps"
        executor = "digest"
        input_schema = { type = "object" }
        running_per_space = "two"
        "#,
    );
    let Err(CatalogError::Invalid { problems, .. }) = Catalog::parse(&text) else { panic!("accepted") };
    let found: Vec<(String, String)> = problems.iter().map(|p| (p.path.clone(), p.message.clone())).collect();
    let at = |path: &str| found.iter().find(|(p, _)| p == path).map(|(_, m)| m.as_str()).unwrap_or("");
    assert!(at("limits.running_per_space").contains("must be from 1 to 10000"), "{found:?}");
    assert!(at("limits.runing").contains("unknown key"), "{found:?}");
    assert!(at("tasks.steps.running_per_space").contains("expected an integer"), "{found:?}");

    let fine = Catalog::parse(&catalog(4, 2)).unwrap();
    assert_eq!(fine.running_per_space, 4);
    assert_eq!(fine.task("wide").unwrap().running_per_space, Some(2));
    assert_eq!(fine.slots("wide").limit, 2);
    assert_eq!(fine.slots("steps").limit, 4);
    assert!(fine.slots("steps").others.contains(&"wide".to_owned()));
    let default = Catalog::parse(&common::catalog_text_with("")).unwrap();
    assert_eq!(default.running_per_space, 10, "the default");
}
