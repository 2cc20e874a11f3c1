//! A task whose message was lost: the API stores and queues it, the queue is
//! purged before any worker runs, and only a sweep puts it back. `reeve
//! sweep` does it by hand before `reeve work` runs; `reeve serve`'s own
//! worker does it by itself. Real processes on a database and a moto SQS
//! queue of the test's own.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use reeve_shared::aws::AwsClients;
use reeve_shared::http::app;
use serde_json::Value;

use common::{Worker, digest_task, reeve, repo};

/// Messages waiting in `url` (moto counts exactly).
async fn queue_depth(aws: &AwsClients, url: &str) -> u64 {
    const NAME: &str = "ApproximateNumberOfMessages";
    let got = aws.sqs.get_queue_attributes().queue_url(url).attribute_names(NAME.into()).send().await.unwrap();
    got.attributes()
        .and_then(|a| a.iter().find(|(k, _)| k.as_str() == NAME))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

/// A digest task on a database and a queue of the test's own, created
/// through the API and then stranded: its message purged before any worker
/// saw it.
struct Stranded {
    db: common::FreshDb,
    db_url: String,
    pool: sqlx::PgPool,
    aws: AwsClients,
    queue: String,
    id: reeve_shared::ids::Id,
    size: usize,
}

impl Stranded {
    async fn new() -> Stranded {
        let db = common::FreshDb::empty("reeve_sweep").await;
        let pool = db.pool().await;
        let db_url = db.url.clone();
        let aws = common::aws().await;
        let queue_name = format!("reeve-sweep-{}", ulid::Ulid::new().to_string().to_lowercase());
        let queue = aws.sqs.create_queue().queue_name(queue_name).send().await.unwrap().queue_url().unwrap().to_owned();

        // The API in-process, and no worker anywhere.
        let ctx = common::api(&db_url, &pool, &queue).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app(ctx)).await });

        let bytes = b"lost, then found".to_vec();
        let id = digest_task(&api, "lost.txt", "text/plain", &bytes).await;
        server.abort();

        // The message is lost before any worker saw it.
        aws.sqs.purge_queue().queue_url(&queue).send().await.unwrap();
        assert_eq!(queue_depth(&aws, &queue).await, 0);
        let stranded = Stranded { db, db_url, pool, aws, queue, id, size: bytes.len() };
        assert_eq!(stranded.status().await, "queued", "stranded: queued with no message");
        stranded
    }

    async fn status(&self) -> String {
        sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1").bind(self.id).fetch_one(&self.pool).await.unwrap()
    }

    /// Waits for the task to complete (within `limit`) and checks its result.
    async fn completes_within(&self, limit: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let now = self.status().await;
            if now == "completed" {
                break;
            }
            assert!(started.elapsed() < limit, "the task never completed; it is {now}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let took = started.elapsed();
        let result: Value = sqlx::query_scalar::<_, sqlx::types::Json<Value>>("SELECT result FROM tasks WHERE id = $1")
            .bind(self.id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
            .0;
        assert_eq!(result["size"], self.size);
        took
    }

    async fn cleanup(self) {
        self.pool.close().await;
        self.aws.sqs.delete_queue().queue_url(&self.queue).send().await.unwrap();
        self.db.drop().await;
    }
}

#[tokio::test]
async fn a_task_whose_message_was_lost_completes_after_a_sweep_and_a_worker_run() {
    let task = Stranded::new().await;
    let (db_url, queue) = (&task.db_url, &task.queue);
    let out = reeve(db_url, queue)
        .args(["sweep", "--older-than", "0", "--once", "--catalog"])
        .arg(repo("reeve.dev.toml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 queued"), "{stdout}");
    assert_eq!(queue_depth(&task.aws, queue).await, 1, "the sweep sent the task again");

    let worker = Worker(
        reeve(db_url, queue)
            .args(["work", "--catalog"])
            .arg(repo("reeve.dev.toml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    task.completes_within(Duration::from_secs(60)).await;
    drop(worker);
    task.cleanup().await;
}

/// `reeve serve`'s built-in worker sweeps as `reeve work` does: the stranded
/// task completes with no manual sweep, and SIGTERM stops the sweeps with
/// the rest of the process.
#[tokio::test]
async fn reeve_serve_completes_a_task_whose_message_was_lost_without_a_manual_sweep() {
    let task = Stranded::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut serve = Worker(
        reeve(&task.db_url, &task.queue)
            .args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--catalog"])
            .arg(repo("reeve.dev.toml"))
            // The task is stranded from the start: any threshold above the
            // time since create would wait, 1 s keeps the test short.
            .args(["--sweep-every", "1", "--sweep-older-than", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let took = task.completes_within(Duration::from_secs(60)).await;
    println!("reeve serve completed the stranded task {:.1}s after it started", took.as_secs_f64());

    let pid = serve.0.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let asked = Instant::now();
    let status = loop {
        if let Some(status) = serve.0.try_wait().unwrap() {
            break status;
        }
        assert!(asked.elapsed() < Duration::from_secs(30), "reeve serve (and its sweeps) stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    task.cleanup().await;
}

/// One attempt limit per task: a task whose executor always fails
/// retryably (its endpoint answers 503) ends `retries_exhausted` after
/// exactly `REEVE_MAX_RECEIVES` runs, although the sweeper re-sends it a
/// second after each failure and SQS would redeliver every message too:
/// the worker counts the task's own attempts, not a message's deliveries.
#[tokio::test]
async fn a_task_that_always_fails_retryably_runs_exactly_max_receives_times_under_reeve_serve() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let hits = Arc::new(AtomicUsize::new(0));
    let endpoint = {
        let hits = hits.clone();
        let router = axum::Router::new().route(
            "/down",
            axum::routing::post(move || {
                hits.fetch_add(1, Ordering::SeqCst);
                async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "down") }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        addr
    };
    let db = common::FreshDb::empty("reeve_limit").await;
    let pool = db.pool().await;
    let (name, db_url) = (db.name.clone(), db.url.clone());
    let aws = common::aws().await;
    let queue = aws.sqs.create_queue().queue_name(name.replace('_', "-")).send().await.unwrap();
    let queue = queue.queue_url().unwrap().to_owned();
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let catalog = dir.join("reeve.toml");
    let flaky = format!(
        "\n[tasks.flaky]\ntitle = \"Flaky\"\ndescription = \"Its endpoint is always down\"\nexecutor = \"http\"\n\
         endpoint = \"http://{endpoint}/down\"\ntimeout_seconds = 5\ninput_schema = {{ type = \"object\" }}\n"
    );
    std::fs::write(&catalog, std::fs::read_to_string(repo("reeve.dev.toml")).unwrap() + &flaky).unwrap();

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _serve = Worker(
        reeve(&db_url, &queue)
            .args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--catalog"])
            .arg(&catalog)
            .args(["--sweep-every", "1", "--sweep-older-than", "1"])
            .env("REEVE_MAX_RECEIVES", "3")
            .env("REEVE_OPERATOR_ALLOW", endpoint.to_string())
            .env("REEVE_OUTBOUND_ALLOW_HTTP", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let api = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(60), "reeve serve did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let http = reqwest::Client::new();
    let post = |path: String, token: Option<String>, body: Value| {
        let mut request =
            http.post(format!("{api}{path}")).header("content-type", "application/json").body(body.to_string());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let space = common::json_of(post("/v1/spaces".into(), None, serde_json::json!({})).await.unwrap()).await;
    let session = common::json_of(
        post("/v1/sessions".into(), None, serde_json::json!({"space_id": space["space_id"]})).await.unwrap(),
    )
    .await;
    let token = session["token"].as_str().unwrap().to_owned();
    let created = post("/v1/tasks/flaky".into(), Some(token), serde_json::json!({"input": {}})).await.unwrap();
    assert_eq!(created.status().as_u16(), 202);
    let id: reeve_shared::ids::Id = common::json_of(created).await["id"].as_str().unwrap().parse().unwrap();

    let (status, attempts, error) = loop {
        let row: (String, i32, Option<sqlx::types::Json<Value>>) =
            sqlx::query_as("SELECT status, attempts, error FROM tasks WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        if row.0 == "failed" {
            break row;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "still {} after {} attempts", row.0, row.1);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status, "failed");
    assert_eq!(error.unwrap().0["code"], "retries_exhausted");
    assert_eq!(attempts, 3, "exactly REEVE_MAX_RECEIVES runs");
    // The sweeps go on every second, and the messages are still around: no
    // run past the limit.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(hits.load(Ordering::SeqCst), 3, "the endpoint was called once per attempt");
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM tasks WHERE id = $1").bind(id).fetch_one(&pool).await.unwrap();
    assert_eq!(attempts, 3);

    pool.close().await;
    aws.sqs.delete_queue().queue_url(&queue).send().await.unwrap();
    db.drop().await;
}
