//! `reeve work` killed with SIGKILL in the middle of a 100 MiB digest: the
//! next worker, with the shipped defaults (20 s lease, a sweep every 15 s),
//! runs it again within a minute of the kill; the task ends in exactly one
//! terminal state, its event log is gap-free, and the work (a digest:
//! read-only, so idempotent) is redone. Real processes on a database, an S3
//! object and a moto SQS queue of the test's own.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use reeve_shared::http::app;
use serde_json::Value;
use sha2::Digest as _;

use common::{Worker, digest_task, reeve, repo};

#[tokio::test]
async fn a_worker_killed_mid_task_leaves_it_to_the_next_one_exactly_once() {
    let db = common::FreshDb::empty("reeve_kill").await;
    let pool = db.pool().await;
    let db_url = db.url.clone();
    let aws = common::aws().await;
    // The queue hides a received message for 15 minutes (the deployed queue
    // hides it for 36): the dead worker's message cannot come back within
    // the test, so the recovery is the lease's and the sweep's alone.
    let queue_name = format!("reeve-kill-{}", ulid::Ulid::new().to_string().to_lowercase());
    let queue = aws
        .sqs
        .create_queue()
        .queue_name(queue_name)
        .attributes("VisibilityTimeout".into(), "900")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_owned();
    // The shipped catalog: digest's timeout (300 s) plays no part in the
    // recovery, which waits only for the lease.
    let dir = std::env::temp_dir().join(format!("reeve-kill-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let catalog_path = repo("reeve.dev.toml");

    let ctx = common::api(&db_url, &pool, &queue).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app(ctx)).await });

    // 100 MiB: the digest is still running when the kill comes.
    let bytes: Vec<u8> = (0..100 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let id = digest_task(&api, "big.bin", "application/octet-stream", &bytes).await;
    let state = || {
        sqlx::query_as::<_, (String, f32, i32)>("SELECT status, progress, attempts FROM tasks WHERE id = $1").bind(id)
    };
    let log = |n: &str| std::fs::File::create(dir.join(format!("work-{n}.log"))).unwrap();
    let work = |n: &str| {
        reeve(&db_url, &queue)
            .args(["work", "--catalog", catalog_path.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log(n))
            .spawn()
            .unwrap()
    };

    // Kill -9 once the run has claimed the task and not finished. Waiting for
    // progress too raced the digest on a quiet machine: it could finish
    // between two polls.
    let mut first = work("1");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, _) = state().fetch_one(&pool).await.unwrap();
        assert_ne!(status, "completed", "the digest finished before the kill: make it bigger");
        if status == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "the worker never started the task");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let killed = Instant::now();
    let (status, progress, attempts) = state().fetch_one(&pool).await.unwrap();
    assert_eq!((status.as_str(), attempts), ("running", 1), "killed mid-task at progress {progress}");

    // The next worker starts at once, as a Lambda invocation or another
    // `reeve work` would be there: what the recovery waits for is the lease.
    let _second = Worker(work("2"));
    let deadline = killed + Duration::from_secs(120);
    let mut rerun = None;
    loop {
        let (status, _, attempts) = state().fetch_one(&pool).await.unwrap();
        if attempts >= 2 && rerun.is_none() {
            rerun = Some(killed.elapsed());
        }
        if status == "completed" {
            break;
        }
        assert_ne!(status, "failed");
        if Instant::now() > deadline {
            let logs = std::fs::read_to_string(dir.join("work-2.log")).unwrap_or_default();
            let tail: String = logs.lines().rev().take(30).collect::<Vec<_>>().join("\n");
            panic!("the task never completed after the kill; it is {status}; the second worker said:\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let recovered = killed.elapsed();
    let rerun = rerun.unwrap_or(recovered);
    assert!(
        rerun < Duration::from_secs(60),
        "the shipped defaults run a dead worker's task again within a minute: it took {rerun:?}"
    );

    let (_, _, attempts) = state().fetch_one(&pool).await.unwrap();
    assert_eq!(attempts, 2, "one run killed, one run finished");
    let events: Vec<(i64, String, sqlx::types::Json<Value>)> =
        sqlx::query_as("SELECT seq, type, data FROM task_events WHERE task_id = $1 ORDER BY seq")
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.0).collect();
    assert_eq!(seqs, (1..=events.len() as i64).collect::<Vec<_>>(), "the event log is gap-free");
    let statuses: Vec<String> =
        events.iter().filter(|e| e.1 == "status").map(|e| e.2["status"].as_str().unwrap().to_owned()).collect();
    assert_eq!(statuses, ["queued", "running", "running", "completed"], "exactly one terminal state");
    let result: Value = sqlx::query_scalar::<_, sqlx::types::Json<Value>>("SELECT result FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap()
        .0;
    let expected = hex::encode(sha2::Sha256::digest(&bytes));
    assert_eq!(result["sha256"], expected, "the second run's digest is right");
    println!(
        "killed at progress {progress:.2}; run again {:.1}s later, completed {:.1}s after the kill",
        rerun.as_secs_f64(),
        recovered.as_secs_f64()
    );

    pool.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
    aws.sqs.delete_queue().queue_url(&queue).send().await.unwrap();
    db.drop().await;
}
