//! Load: 200 concurrent clients create tasks and watch each one on the SSE
//! relay while a poller works the queue, all over real TCP, Postgres, Redis
//! and moto SQS. Every task must reach a terminal state and every watcher
//! must see its task's whole event sequence. The executor is a stand-in
//! (tens of milliseconds of "work"), so the figure measures Reeve itself.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::TestQueue;
use reeve_shared::executors::{ExecDeps, Job};
use reeve_shared::http::stream::router as relay_router;
use reeve_shared::ids::Id;
use reeve_shared::settings;
use reeve_shared::worker::{Poller, RunFuture, Runner};
use serde_json::{Value, json};
use sqlx::PgPool;

const CLIENTS: usize = 200;
const TASKS_EACH: usize = 3;

struct Quick(AtomicUsize);

impl Runner for Quick {
    fn run<'a>(&'a self, _deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a> {
        Box::pin(async move {
            self.0.fetch_add(1, Ordering::SeqCst);
            for i in 1..=3 {
                job.progress(i as f32 / 3.0, json!({"step": i})).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(json!({"done": true}))
        })
    }
}

/// The shipped catalog plus `quick`: free, any object input.
fn catalog() -> String {
    let extra = "[tasks.quick]\ntitle = \"Quick\"\nexecutor = \"digest\"\ntimeout_seconds = 30\ninput_schema = { type = \"object\" }\n";
    common::catalog_text_with(extra)
}

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    base
}

/// The `id:` of every SSE message, in order, until the stream ends.
async fn watch(http: &reqwest::Client, relay: &str, token: &str, id: &str) -> (Vec<i64>, Vec<String>) {
    let response = http.get(format!("{relay}/v1/tasks/{id}/events")).bearer_auth(token).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let messages = common::sse_messages(response).await;
    let ids = messages.iter().filter_map(|m| m.id.as_deref()).map(|n| n.parse().unwrap()).collect();
    let kinds = messages.iter().filter_map(|m| m.event.clone()).collect();
    (ids, kinds)
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn two_hundred_clients_create_and_watch_and_nothing_is_lost(pool: PgPool) {
    let queue = TestQueue::new().await;
    let config = common::with_catalog(common::config(&pool), &catalog()).with(settings::QUEUE_URL, &queue.url);
    let api = serve(reeve_shared::http::app(common::api(&config).await)).await;
    let relay = serve(relay_router(common::relay(&config))).await;

    // The worker: `reeve work`'s poller, 16 at once.
    let runner = Arc::new(Quick(AtomicUsize::new(0)));
    let worker_config = config.with(settings::WORKER_CONCURRENCY, "16").with(settings::FETCH_MAX_BYTES, "1024");
    let worker = common::with_runner(common::worker(&worker_config).await, runner.clone());
    let mut poller = Poller::connect(Arc::new(worker), common::aws().await.sqs, queue.url.clone()).await.unwrap();
    poller.wait_time_seconds = 1;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let polling = tokio::spawn(async move {
        poller
            .run(async {
                let _ = stopped.await;
            })
            .await
    });

    // One session per ten clients: sessions are Argon2-bound, tasks are not.
    let http = reqwest::Client::new();
    let mut tokens = Vec::new();
    for _ in 0..CLIENTS / 10 {
        let space: Value =
            serde_json::from_slice(&http.post(format!("{api}/v1/spaces")).send().await.unwrap().bytes().await.unwrap())
                .unwrap();
        let session: Value = serde_json::from_slice(
            &http
                .post(format!("{api}/v1/sessions"))
                .header("content-type", "application/json")
                .body(json!({"space_id": space["space_id"]}).to_string())
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap(),
        )
        .unwrap();
        tokens.push(session["token"].as_str().unwrap().to_owned());
    }

    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (http, api, relay, token) = (http.clone(), api.clone(), relay.clone(), tokens[c / 10].clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for t in 0..TASKS_EACH {
                    let created = http
                        .post(format!("{api}/v1/tasks/quick"))
                        .bearer_auth(&token)
                        .header("content-type", "application/json")
                        .body(json!({"input": {"client": c, "n": t}}).to_string())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(created.status().as_u16(), 202);
                    let body: Value = serde_json::from_slice(&created.bytes().await.unwrap()).unwrap();
                    let id = body["id"].as_str().unwrap().to_owned();
                    let (ids, kinds) = watch(&http, &relay, &token, &id).await;
                    seen.push((id, ids, kinds));
                }
                seen
            })
        })
        .collect();
    let mut watched = Vec::new();
    for client in clients {
        let seen = tokio::time::timeout(Duration::from_secs(240), client).await.expect("bounded").unwrap();
        watched.extend(seen);
    }
    let elapsed = started.elapsed();
    let _ = stop.send(());
    polling.await.unwrap();

    assert_eq!(watched.len(), CLIENTS * TASKS_EACH);
    let mut events_seen = 0;
    for (id, ids, kinds) in &watched {
        let id: Id = id.parse().unwrap();
        let (status, last_seq): (String, i64) =
            sqlx::query_as("SELECT status, last_seq FROM tasks WHERE id = $1").bind(id).fetch_one(&pool).await.unwrap();
        assert_eq!(status, "completed", "{id}");
        assert_eq!(ids, &(1..=last_seq).collect::<Vec<_>>(), "{id}: the watcher saw the whole sequence");
        assert_eq!(kinds.last().map(String::as_str), Some("status"));
        events_seen += ids.len();
    }
    assert_eq!(runner.0.load(Ordering::SeqCst), CLIENTS * TASKS_EACH, "each task ran once");
    let peak_rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM")).map(str::to_owned))
        .unwrap_or_default();
    println!(
        "{CLIENTS} clients x {TASKS_EACH} tasks: {} tasks completed and watched in {:.1}s, {events_seen} events, \
         none missing; {peak_rss}",
        watched.len(),
        elapsed.as_secs_f64()
    );
    queue.delete().await;
}
