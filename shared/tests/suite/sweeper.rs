//! The sweeper and the dead-letter consumer against real Postgres, Redis and
//! moto SQS (a queue of each test's own). Tasks are put in the states a lost
//! message, a killed worker or an exhausted retry leave behind.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::TestQueue;
use reeve_shared::ids::Id;
use reeve_shared::settings;
use reeve_shared::startup;
use reeve_shared::sweeper::{DeadLetter, SweepReport, Sweeper};
use reeve_shared::tasks::{EventType, events_after};
use serde_json::{Value, json};
use sqlx::PgPool;

const SAMPLE_TASK_ID: &str = "01JNVX5C7D9F1H3K5M7P9R1T3V";

/// The sweeper as its Lambda and `reeve sweep` build it, on this test's
/// database and queue.
async fn sweeper(pool: &PgPool, queue: &TestQueue) -> Sweeper {
    let config = common::config(pool).with(settings::QUEUE_URL, &queue.url).with(settings::SWEEP_OLDER_THAN, "300");
    startup::sweeper(&config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"))
}

/// A task in `status` with `attempts` claims, last changed `idle` ago, with
/// a lease ending `lease` from now (negative: expired), and its first event.
async fn task(pool: &PgPool, status: &str, attempts: i32, idle_secs: f64, lease_secs: Option<f64>) -> Id {
    let space = Id::new().to_bytes();
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space).execute(pool).await.unwrap();
    let id = Id::new();
    sqlx::query(
        "INSERT INTO tasks (id, space_idx, kind, input, status, attempts, lease_until, updated_at)
         VALUES ($1, $2, 'digest', '{}', $3, $4,
                 now() + make_interval(secs => $5), now() - make_interval(secs => $6))",
    )
    .bind(id)
    .bind(space)
    .bind(status)
    .bind(attempts)
    .bind(lease_secs)
    .bind(idle_secs)
    .execute(pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    reeve_shared::tasks::append_event(&mut conn, id, EventType::Status, &json!({ "status": "queued" })).await.unwrap();
    id
}

async fn status_and_error(pool: &PgPool, id: Id) -> (String, Option<Value>) {
    sqlx::query_as("SELECT status, error FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

async fn sent_ids(queue: &TestQueue) -> Vec<Id> {
    let mut ids: Vec<Id> =
        queue.drain().await.iter().map(|body| body["task_id"].as_str().unwrap().parse().unwrap()).collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<Id>) -> Vec<Id> {
    ids.sort();
    ids
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn lost_and_expired_tasks_are_sent_again_once_and_live_ones_are_left_alone(pool: PgPool) {
    let queue = TestQueue::new().await;
    let sweeper = sweeper(&pool, &queue).await;
    let lost = task(&pool, "queued", 0, 600.0, None).await;
    let fresh = task(&pool, "queued", 0, 5.0, None).await;
    let expired = task(&pool, "running", 2, 600.0, Some(-60.0)).await;
    let live = task(&pool, "running", 1, 600.0, Some(60.0)).await;
    let done = task(&pool, "completed", 1, 600.0, None).await;

    let report = sweeper.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!(report, SweepReport { resent_queued: 1, resent_expired: 1, ..SweepReport::default() });
    assert_eq!(sent_ids(&queue).await, sorted(vec![lost, expired]));
    assert_eq!(status_and_error(&pool, expired).await.0, "running", "a re-send changes no status");

    // The re-send counts as a change: the next minute's sweep leaves them be.
    let again = sweeper.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!(again, SweepReport::default());
    assert!(queue.drain().await.is_empty());

    // `--older-than 0` takes every stranded task, the fresh one too, but
    // never a live lease or a finished task.
    let now = sweeper.sweep(Duration::ZERO).await.unwrap();
    assert_eq!((now.resent_queued, now.resent_expired), (2, 1));
    let sent = sent_ids(&queue).await;
    assert_eq!(sent, sorted(vec![lost, fresh, expired]));
    assert!(!sent.contains(&live) && !sent.contains(&done));
    queue.delete().await;
}

/// A lease that lapsed is acted on at the next sweep, however recently the
/// task changed: its worker is gone, and the threshold is only for a queued
/// task whose message may still be on its way. Once per lapse: the re-send
/// is a change after it.
/// A pay link holds a task's input; once no call can meet it (made over an
/// hour ago) a sweep deletes it, even for a Space that never calls again.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn pay_links_no_call_can_meet_any_more_are_forgotten(pool: PgPool) {
    let queue = TestQueue::new().await;
    let sweeper = sweeper(&pool, &queue).await;
    let now = time::OffsetDateTime::now_utc();
    let mut links = Vec::new();
    for made in [now - time::Duration::minutes(61), now - time::Duration::minutes(59)] {
        let space = reeve_shared::auth::SpaceIndex::from_slice(&Id::new().to_bytes()).unwrap();
        sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')")
            .bind(space.as_bytes().as_slice())
            .execute(&pool)
            .await
            .unwrap();
        let input = json!({ "url": "https://example.com/private" });
        let link = reeve_shared::pay_links::issue(&pool, &space, "fetch", &input, json!([]), made).await.unwrap();
        links.push(link.id);
    }
    let report = sweeper.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!(report.forgotten_pay_links, 1, "{report:?}");
    let left: Vec<Id> = sqlx::query_scalar("SELECT id FROM pay_links").fetch_all(&pool).await.unwrap();
    assert_eq!(left, vec![links[1]], "the link of the last hour stays");
    assert_eq!(sweeper.sweep(Duration::from_secs(300)).await.unwrap().forgotten_pay_links, 0);
    queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_lapsed_lease_is_sent_again_at_the_next_sweep_whatever_the_threshold(pool: PgPool) {
    let queue = TestQueue::new().await;
    let sweeper = sweeper(&pool, &queue).await;
    // Last changed 5 s ago, lease lapsed 1 s ago: its worker died mid-run.
    let lapsed = task(&pool, "running", 1, 5.0, Some(-1.0)).await;
    // The same, but on its last attempt: failed, not sent.
    let last = task(&pool, "running", 5, 5.0, Some(-1.0)).await;
    // Changed after its lease lapsed (re-sent by an earlier sweep): the
    // message is on its way, so it waits for the threshold.
    let resent = task(&pool, "running", 1, 1.0, Some(-3.0)).await;
    let live = task(&pool, "running", 1, 5.0, Some(15.0)).await;
    let queued = task(&pool, "queued", 0, 5.0, None).await;

    let report = sweeper.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!(report, SweepReport { resent_expired: 1, exhausted: 1, ..SweepReport::default() });
    assert_eq!(sent_ids(&queue).await, vec![lapsed]);
    assert_eq!(status_and_error(&pool, last).await.1.unwrap()["code"], "retries_exhausted");
    for (id, status) in [(lapsed, "running"), (resent, "running"), (live, "running"), (queued, "queued")] {
        assert_eq!(status_and_error(&pool, id).await.0, status);
    }

    let again = sweeper.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!(again, SweepReport::default(), "one re-send per lapse");
    assert!(queue.drain().await.is_empty());
    queue.delete().await;
}

/// The schedule runs the sweeper Lambda once a minute, longer than a
/// lease: its invocation sweeps, then looks for lapsed leases again every
/// 15 s until its deadline is near, so a lease that lapses in between is
/// acted on within seconds, not at the next minute.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_scheduled_invocation_goes_on_sending_leases_that_lapse_until_its_deadline(pool: PgPool) {
    let queue = TestQueue::new().await;
    let sweeper = sweeper(&pool, &queue).await;
    // Its worker renewed it a second ago; it lapses in 2 s.
    let running = task(&pool, "running", 1, 1.0, Some(2.0)).await;

    let started = std::time::Instant::now();
    let deadline = std::time::SystemTime::now() + Duration::from_secs(25);
    let report = sweeper.handle_invocation(json!({}), Some(deadline)).await.unwrap();
    let took = started.elapsed();
    assert_eq!(report["resent_expired"], 1, "{report}");
    assert_eq!(sent_ids(&queue).await, vec![running]);
    // Swept at 0 and 15 s; 30 s would be past the deadline's margin.
    assert!(took >= Duration::from_secs(15) && took < Duration::from_secs(20), "{took:?}");
    assert!(std::time::SystemTime::now() < deadline, "ended before its deadline");

    // Nothing running: the invocation still sweeps once more (a task may
    // start meanwhile), then ends.
    sqlx::query("UPDATE tasks SET status = 'completed'").execute(&pool).await.unwrap();
    let started = std::time::Instant::now();
    let deadline = std::time::SystemTime::now() + Duration::from_secs(60);
    sweeper.handle_invocation(json!({}), Some(deadline)).await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(15) && took < Duration::from_secs(20), "{took:?}");
    queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn tasks_out_of_attempts_fail_as_retries_exhausted_with_their_events(pool: PgPool) {
    let queue = TestQueue::new().await;
    let sweeper = sweeper(&pool, &queue).await;
    let queued = task(&pool, "queued", 5, 600.0, None).await;
    let expired = task(&pool, "running", 5, 600.0, Some(-1.0)).await;
    let live = task(&pool, "running", 5, 600.0, Some(60.0)).await;

    let report = sweeper.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!(report, SweepReport { exhausted: 2, ..SweepReport::default() });
    assert!(queue.drain().await.is_empty(), "nothing out of attempts is sent again");
    for id in [queued, expired] {
        let (status, error) = status_and_error(&pool, id).await;
        assert_eq!(status, "failed");
        let error = error.unwrap();
        assert_eq!(error["code"], "retries_exhausted");
        assert!(error["message"].as_str().unwrap().contains("5 attempts"), "{error}");
        let mut conn = pool.acquire().await.unwrap();
        let events = events_after(&mut conn, id, 0).await.unwrap();
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=events.len() as i64).collect::<Vec<_>>(), "gap-free");
        let last = events.last().unwrap();
        assert_eq!((last.kind, last.data["status"].as_str()), (EventType::Status, Some("failed")));
    }
    assert_eq!(status_and_error(&pool, live).await.0, "running", "a live run is never failed");
    queue.delete().await;
}

/// The sample dead-letter batch (`events/sweeper-dead-letter.json`) with
/// the given task ids as its records' bodies.
fn dead_letter_event(bodies: &[String]) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../events/sweeper-dead-letter.json");
    let sample: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(sample.to_string().contains(SAMPLE_TASK_ID));
    let record = sample["Records"][0].clone();
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let mut r = record.clone();
            r["messageId"] = format!("dead-{i}").into();
            r["body"] = body.clone().into();
            r
        })
        .collect();
    json!({ "Records": records })
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn dead_lettered_tasks_fail_as_dead_lettered_unless_a_live_worker_holds_them(pool: PgPool) {
    let queue = TestQueue::new().await;
    let sweeper = sweeper(&pool, &queue).await;
    let queued = task(&pool, "queued", 1, 0.0, None).await;
    let expired = task(&pool, "running", 2, 0.0, Some(-1.0)).await;
    let live = task(&pool, "running", 1, 0.0, Some(60.0)).await;
    let done = task(&pool, "completed", 1, 0.0, None).await;

    let body = |id: Id| json!({"task_id": id, "kind": "digest"}).to_string();
    assert_eq!(sweeper.dead_lettered(&body(live)).await.unwrap(), DeadLetter::StillRunning);
    assert_eq!(sweeper.dead_lettered(&body(done)).await.unwrap(), DeadLetter::Finished);
    assert_eq!(sweeper.dead_lettered(&body(Id::new())).await.unwrap(), DeadLetter::Finished);
    assert_eq!(sweeper.dead_lettered("{\"task\": 1").await.unwrap(), DeadLetter::Unreadable);

    // The Lambda's way in: an SQS batch from the dead-letter queue.
    let event = dead_letter_event(&[body(queued), body(expired), "not json".into()]);
    let answer = sweeper.handle_invocation(event, None).await.unwrap();
    assert_eq!(answer["batchItemFailures"], json!([]), "every record settled: {answer}");
    for id in [queued, expired] {
        let (status, error) = status_and_error(&pool, id).await;
        assert_eq!(status, "failed");
        assert_eq!(error.unwrap()["code"], "dead_lettered");
    }
    assert_eq!(status_and_error(&pool, live).await.0, "running");
    assert_eq!(status_and_error(&pool, done).await.0, "completed");

    // A schedule's event is a sweep; its threshold may come with it.
    let lost = task(&pool, "queued", 0, 10.0, None).await;
    let swept = sweeper.handle_invocation(json!({ "older_than_seconds": 0 }), None).await.unwrap();
    assert_eq!(swept["resent_queued"], 1, "{swept}");
    assert_eq!(sent_ids(&queue).await, vec![lost]);
    queue.delete().await;
}
