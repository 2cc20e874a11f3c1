//! `reeve tasks cancel|rerun`: an operator's bulk changes, as the binary
//! runs them over `DATABASE_URL` and the queue. A dry run by default that
//! changes nothing; `--yes` acts, with a progress line; a task failed by
//! its input is never run again; `--space` keeps to one Space. Real
//! processes on a database and a moto SQS queue of the test's own.

use crate::common;

use std::process::Output;

use reeve_shared::http::app;
use reeve_shared::ids::Id;
use reeve_shared::tasks::{self, TaskStatus, task_error};

use common::{digest_task, reeve, repo};

fn run(db: &str, queue: &str, args: &[&str]) -> (String, String) {
    let mut command = reeve(db, queue);
    // The audit line is at `info`.
    command.args(args).arg("--catalog").arg(repo("reeve.dev.toml")).env("RUST_LOG", "info");
    let out: Output = command.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "reeve {args:?}:\n{stdout}{stderr}");
    (stdout.into_owned(), stderr.into_owned())
}

async fn status(pool: &sqlx::PgPool, id: Id) -> String {
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn an_operator_reruns_what_failed_by_reeve_and_cancels_the_rest_after_dry_runs() {
    let db = common::FreshDb::empty("reeve_tasks").await;
    let pool = db.pool().await;
    let aws = common::aws().await;
    let name = format!("reeve-tasks-{}", ulid::Ulid::new().to_string().to_lowercase());
    let queue = aws.sqs.create_queue().queue_name(name).send().await.unwrap().queue_url().unwrap().to_owned();
    let ctx = common::api(&db.url, &pool, &queue).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app(ctx)).await });
    // Three Spaces' digests: one failed by Reeve, one by its input, one queued.
    let by_reeve = digest_task(&api, "a.txt", "text/plain", b"a").await;
    let by_input = digest_task(&api, "b.txt", "text/plain", b"b").await;
    let queued = digest_task(&api, "c.txt", "text/plain", b"c").await;
    server.abort();
    aws.sqs.purge_queue().queue_url(&queue).send().await.unwrap();
    for (id, code) in [(by_reeve, "internal"), (by_input, "invalid_input")] {
        let error = task_error(code, "failed by the test");
        tasks::mark_failed(&pool, id, &[TaskStatus::Queued], &error).await.unwrap().expect("failed");
    }

    // A filter is required.
    let out = reeve(&db.url, &queue).args(["tasks", "cancel"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("name at least one of --id, --kind"));

    // Dry runs: the count and a sample, nothing changed.
    let (dry, _) = run(&db.url, &queue, &["tasks", "rerun", "--kind", "digest"]);
    assert!(dry.contains("3 tasks match: 1 to run again"), "{dry}");
    assert!(dry.contains(&by_reeve.to_string()) && dry.contains("internal"), "the sample: {dry}");
    assert!(!dry.contains(&by_input.to_string()), "an input failure is no candidate: {dry}");
    assert!(dry.contains("dry run: nothing changed"), "{dry}");
    let (dry, _) = run(&db.url, &queue, &["tasks", "cancel", "--kind", "digest", "--dry-run"]);
    assert!(dry.contains("3 tasks match: 1 to cancel, 2 already ended"), "{dry}");
    for (id, was) in [(by_reeve, "failed"), (by_input, "failed"), (queued, "queued")] {
        assert_eq!(status(&pool, id).await, was, "a dry run changed {id}");
    }

    // The re-run, limited to one Space by its index: first another's.
    let space_of = |id: Id| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT encode(space_idx, 'hex') FROM tasks WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let elsewhere = space_of(queued).await;
    let (none, _) = run(&db.url, &queue, &["tasks", "rerun", "--status", "failed", "--space", &elsewhere, "--yes"]);
    assert!(none.contains("queued again 0"), "{none}");
    assert_eq!(status(&pool, by_reeve).await, "failed", "another Space's task was run again");
    let (done, stderr) = run(&db.url, &queue, &["tasks", "rerun", "--status", "failed", "--yes"]);
    assert!(done.contains("rerun: 1/1 done"), "a progress line: {done}");
    assert!(done.contains("queued again 1"), "{done}");
    assert!(stderr.contains("bulk rerun by an operator"), "one audit line: {stderr}");
    assert_eq!(status(&pool, by_reeve).await, "queued", "run again");
    assert_eq!(status(&pool, by_input).await, "failed", "failed by its input: never run again");
    let sent = aws.sqs.receive_message().queue_url(&queue).max_number_of_messages(10).send().await.unwrap();
    let bodies: Vec<&str> = sent.messages().iter().filter_map(|m| m.body()).collect();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert!(bodies[0].contains(&by_reeve.to_string()), "{bodies:?}");

    // Cancel the rest, in batches of one.
    let (done, stderr) = run(&db.url, &queue, &["tasks", "cancel", "--kind", "digest", "--apply", "--batch", "1"]);
    assert!(done.contains("cancel: 1/2 done") && done.contains("cancel: 2/2 done"), "{done}");
    assert!(done.contains("canceled 2"), "{done}");
    assert!(stderr.contains("bulk cancel by an operator"), "{stderr}");
    for (id, now) in [(by_reeve, "canceled"), (by_input, "failed"), (queued, "canceled")] {
        assert_eq!(status(&pool, id).await, now, "{id}");
    }

    pool.close().await;
    aws.sqs.delete_queue().queue_url(&queue).send().await.unwrap();
    db.drop().await;
}
