//! Executors against the real stack (Postgres, SeaweedFS) and local axum
//! servers: `digest` streams an upload and checks it against its declaration
//! first; `fetch` stores a download under `outputs/`, whose link is signed
//! each time the result is read; `http` returns an endpoint's JSON. Every failure has its stable code,
//! or is retryable when trying again could help.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode};
use axum::routing::{any, get, post};
use common::{ctx, new_session, post_json, send, shipped_catalog};
use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::catalog::{Executor, TaskSpec};
use reeve_shared::executors::{self, ExecDeps, ExecError, Http, Job, Report, codes, output_key};
use reeve_shared::http::{app, task_status_app};
use reeve_shared::ids::Id;
use reeve_shared::s3_objects::S3Objects;
use reeve_shared::settings;
use reeve_shared::startup;
use reeve_shared::uploads::{self, PresignedUpload, UploadRequest};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use sqlx::PgPool;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::mpsc;

const MIB: usize = 1024 * 1024;
/// What `fetch` may download in these tests.
const FETCH_MAX: u64 = MIB as u64;

/// As the template's default `OutputRetentionDays`.
const OUTPUT_RETENTION_DAYS: u32 = 30;

/// The executors' dependencies as the worker binary builds them, from a
/// config that lets them reach the tests' own servers on loopback.
async fn deps(pool: PgPool) -> ExecDeps {
    let config = common::loopback_outbound(common::worker_config(&pool))
        .with(settings::FETCH_MAX_BYTES, FETCH_MAX.to_string())
        .with(settings::OUTPUT_RETENTION_DAYS, OUTPUT_RETENTION_DAYS.to_string());
    common::worker(&config).await.exec
}

fn spec(kind: &str) -> TaskSpec {
    shipped_catalog().tasks.get(kind).unwrap_or_else(|| panic!("reeve.dev.toml has [tasks.{kind}]")).clone()
}

fn http_spec(endpoint: &str, timeout_seconds: u32) -> TaskSpec {
    let mut spec = spec("http");
    spec.executor = Executor::Http(Http { endpoint: endpoint.to_owned(), protocol: None });
    spec.timeout_seconds = timeout_seconds;
    spec
}

/// Runs one job through `executors::run`, collecting its reports as they
/// come (through a small channel, so back-pressure is exercised too).
async fn exec(
    deps: &ExecDeps,
    space: SpaceIndex,
    task_id: Id,
    spec: &TaskSpec,
    input: Value,
) -> (Result<Value, ExecError>, Vec<Report>) {
    let (tx, mut rx) = mpsc::channel(2);
    let job = Job { task_id, attempt: 1, kind: "test", space, input: &input, spec, reports: tx };
    let collect = async move {
        let mut reports = Vec::new();
        while let Some(report) = rx.recv().await {
            reports.push(report);
        }
        reports
    };
    // The job owns the only sender: once it is done, the collector ends.
    tokio::join!(executors::run(deps, job), collect)
}

/// `(fraction, detail)` of each progress report, in order.
fn progress(reports: &[Report]) -> Vec<(f32, Value)> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Progress { fraction, detail } => Some((*fraction, detail.clone())),
            Report::Log { .. } => None,
        })
        .collect()
}

fn logs(reports: &[Report]) -> Vec<String> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Log { line } => Some(line.clone()),
            Report::Progress { .. } => None,
        })
        .collect()
}

#[track_caller]
fn assert_progress_runs_0_to_1(reports: &[Report]) {
    let fractions: Vec<f32> = progress(reports).into_iter().map(|(f, _)| f).collect();
    assert_eq!(fractions.first(), Some(&0.0), "starts at 0.0: {fractions:?}");
    assert_eq!(fractions.last(), Some(&1.0), "ends at 1.0: {fractions:?}");
    assert!(fractions.windows(2).all(|w| w[0] < w[1]), "strictly increasing: {fractions:?}");
}

/// What a metered task's stream may show before its payment is captured:
/// the reports its executor discloses. Some progress, never a log line, and
/// none of `secrets` (parts of the result) in any of them.
#[track_caller]
fn assert_shown_before_capture_hides(spec: &TaskSpec, reports: &[Report], secrets: &[&str]) {
    let shown: Vec<&Report> = reports.iter().filter(|r| executors::discloses(&spec.executor, r)).collect();
    assert!(!shown.is_empty(), "how far it got is shown: {reports:?}");
    for report in shown {
        assert!(matches!(report, Report::Progress { .. }), "only progress is shown: {report:?}");
        let text = format!("{report:?}");
        for secret in secrets {
            assert!(!text.contains(secret), "{report:?} shows {secret:?} of the result before the capture");
        }
    }
}

#[track_caller]
fn assert_permanent(result: &Result<Value, ExecError>, code: &str) -> String {
    match result {
        Err(ExecError::Permanent { code: got, message }) => {
            assert_eq!(*got, code, "message: {message}");
            message.clone()
        }
        other => panic!("expected Permanent {code}, got {other:?}"),
    }
}

#[track_caller]
fn assert_retryable(result: &Result<Value, ExecError>) {
    assert!(matches!(result, Err(ExecError::Retryable(_))), "expected Retryable, got {result:?}");
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest: [u8; 32] = Sha256::digest(bytes).into();
    hex::encode(digest)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
}

// ---------------------------------------------------------------- digest

/// A space row of our own, for calling the domain functions directly.
async fn space(pool: &PgPool) -> SpaceIndex {
    let bytes: [u8; 16] = Id::new().to_bytes();
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(bytes).execute(pool).await.unwrap();
    SpaceIndex::from_array(bytes)
}

async fn presign(deps: &ExecDeps, space: &SpaceIndex, content_type: &str, size: u64) -> PresignedUpload {
    let request = UploadRequest { filename: Some("data.bin".into()), content_type: content_type.into(), size };
    let catalog = shipped_catalog();
    uploads::create(&deps.db, &deps.objects, &deps.bucket, &catalog.uploads, space, request, Duration::from_secs(900))
        .await
        .expect("presign")
}

/// A raw PUT to a presigned URL, as a client without any AWS SDK sends it.
async fn put(url: &str, headers: &BTreeMap<String, String>, body: Vec<u8>) {
    let mut request = reqwest::Client::new().put(url).body(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request.send().await.expect("S3 answers");
    let status = response.status();
    assert!(status.is_success(), "PUT: {status} {}", response.text().await.unwrap_or_default());
}

async fn upload(deps: &ExecDeps, space: &SpaceIndex, content_type: &str, bytes: &[u8]) -> PresignedUpload {
    let up = presign(deps, space, content_type, bytes.len() as u64).await;
    put(&up.url, &up.headers, bytes.to_vec()).await;
    up
}

async fn status_of(pool: &PgPool, id: Id) -> String {
    sqlx::query_scalar("SELECT status FROM uploads WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn digest_streams_an_upload_made_through_the_api(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (_, token) = new_session(&app).await;
    let space = auth::verify_token(&ctx.settings.token_key, &token, OffsetDateTime::now_utc()).unwrap();
    let bytes = pattern(3 * MIB + MIB / 2, 7);

    let body = json!({ "filename": "big.bin", "content_type": "application/octet-stream", "size": bytes.len() });
    let reply = send(&app, post_json("/v1/uploads", Some(&token), &body)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let headers: BTreeMap<String, String> = serde_json::from_value(reply.body["headers"].clone()).unwrap();
    put(reply.body["url"].as_str().unwrap(), &headers, bytes.clone()).await;
    let upload_id: Id = reply.body["upload_id"].as_str().unwrap().parse().unwrap();

    let deps = deps(pool.clone()).await;
    let (result, reports) =
        exec(&deps, space, Id::new(), &spec("digest"), json!({ "upload_id": upload_id.to_string() })).await;
    let result = result.expect("digest succeeds");
    assert_eq!(
        result,
        json!({ "sha256": sha256_hex(&bytes), "size": bytes.len(), "upload_id": upload_id.to_string() })
    );

    // 0.0, after 1, 2 and 3 MiB, then 1.0.
    assert_progress_runs_0_to_1(&reports);
    let progress = progress(&reports);
    assert_eq!(progress.len(), 5, "{progress:?}");
    for (fraction, detail) in &progress {
        assert_eq!(detail["total"], json!(bytes.len()), "{detail}");
        let done = detail["bytes"].as_u64().unwrap();
        assert!((fraction - done as f32 / bytes.len() as f32).abs() < 1e-6, "{fraction} vs {detail}");
    }
    let marks: Vec<u64> = progress[1..4].iter().map(|(_, d)| d["bytes"].as_u64().unwrap()).collect();
    for (i, bytes) in marks.iter().enumerate() {
        let mib = (i + 1) as u64 * MIB as u64;
        assert!((mib..mib + MIB as u64).contains(bytes), "a report per MiB: {marks:?}");
    }
    assert!(logs(&reports).iter().any(|l| l.contains(&sha256_hex(&bytes))), "{:?}", logs(&reports));
    // The log line is the result itself: held until a metered task is paid.
    assert_shown_before_capture_hides(&spec("digest"), &reports, &[&sha256_hex(&bytes)]);

    // The upload is still pending (no guard ran here): digest leaves statuses alone.
    assert_eq!(status_of(&pool, upload_id).await, "pending");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn digest_leaves_an_uploaded_upload_uploaded(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let bytes = pattern(1000, 1);
    let up = upload(&deps, &space, "text/plain", &bytes).await;
    uploads::ensure_uploaded(&pool, &deps.objects, &deps.bucket, &space, up.id).await.unwrap();

    let (result, reports) = exec(&deps, space, Id::new(), &spec("digest"), json!({ "upload_id": up.id })).await;
    assert_eq!(result.unwrap()["sha256"], json!(sha256_hex(&bytes)));
    // Small files: just the start and the end.
    assert_eq!(progress(&reports).iter().map(|(f, _)| *f).collect::<Vec<_>>(), [0.0, 1.0]);
    assert_eq!(status_of(&pool, up.id).await, "uploaded");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn digest_refuses_an_object_that_differs_from_its_declaration(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let spec = spec("digest");

    // Replaced by a shorter object of the same type.
    let up = upload(&deps, &space, "application/octet-stream", &pattern(1000, 2)).await;
    let (before, _) = exec(&deps, space, Id::new(), &spec, json!({ "upload_id": up.id })).await;
    before.expect("as uploaded, it digests");
    deps.s3
        .put_object()
        .bucket(&deps.bucket)
        .key(&up.key)
        .content_type("application/octet-stream")
        .body(pattern(999, 3).into())
        .send()
        .await
        .unwrap();
    let (result, reports) = exec(&deps, space, Id::new(), &spec, json!({ "upload_id": up.id })).await;
    let message = assert_permanent(&result, codes::UPLOAD_MISMATCH);
    assert!(message.contains("declared 1000 bytes") && message.contains("found 999 bytes"), "{message}");
    assert!(!message.contains(&up.key), "no object keys in owner-facing messages: {message}");
    assert!(!progress(&reports).iter().any(|(f, _)| *f == 1.0), "never reported done: {reports:?}");

    // Same size, another type.
    let up = upload(&deps, &space, "application/pdf", &pattern(500, 4)).await;
    deps.s3
        .put_object()
        .bucket(&deps.bucket)
        .key(&up.key)
        .content_type("image/png")
        .body(pattern(500, 5).into())
        .send()
        .await
        .unwrap();
    let (result, _) = exec(&deps, space, Id::new(), &spec, json!({ "upload_id": up.id })).await;
    let message = assert_permanent(&result, codes::UPLOAD_MISMATCH);
    assert!(message.contains("application/pdf") && message.contains("image/png"), "{message}");
    // Statuses belong to the create path.
    assert_eq!(status_of(&pool, up.id).await, "pending");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn digest_of_a_never_uploaded_or_rejected_upload_fails(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let spec = spec("digest");

    let never = presign(&deps, &space, "text/plain", 10).await;
    let (result, _) = exec(&deps, space, Id::new(), &spec, json!({ "upload_id": never.id })).await;
    let message = assert_permanent(&result, codes::UPLOAD_MISSING);
    assert!(message.contains(&never.id.to_string()), "{message}");

    let rejected = upload(&deps, &space, "text/plain", b"0123456789").await;
    sqlx::query("UPDATE uploads SET status = 'rejected' WHERE id = $1").bind(rejected.id).execute(&pool).await.unwrap();
    let (result, reports) = exec(&deps, space, Id::new(), &spec, json!({ "upload_id": rejected.id })).await;
    assert_permanent(&result, codes::UPLOAD_REJECTED);
    assert!(reports.is_empty(), "refused before any work: {reports:?}");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn digest_cannot_see_unknown_or_other_spaces_uploads(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let mine = space(&pool).await;
    let theirs = space(&pool).await;
    let spec = spec("digest");
    let their_upload = upload(&deps, &theirs, "text/plain", b"theirs").await;

    let (result, _) = exec(&deps, mine, Id::new(), &spec, json!({ "upload_id": their_upload.id })).await;
    let other_space = assert_permanent(&result, codes::UNKNOWN_UPLOAD);
    let unknown = Id::new();
    let (result, _) = exec(&deps, mine, Id::new(), &spec, json!({ "upload_id": unknown })).await;
    let never_existed = assert_permanent(&result, codes::UNKNOWN_UPLOAD);
    // The same words either way, so ids cannot be probed.
    assert_eq!(
        other_space.replace(&their_upload.id.to_string(), "ID"),
        never_existed.replace(&unknown.to_string(), "ID")
    );

    // The owner can.
    let (result, _) = exec(&deps, theirs, Id::new(), &spec, json!({ "upload_id": their_upload.id })).await;
    assert_eq!(result.unwrap()["sha256"], json!(sha256_hex(b"theirs")));
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn digest_refuses_malformed_input(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let lower = Id::new().to_string().to_lowercase();
    for input in [
        json!({}),
        json!({ "upload_id": 42 }),
        json!({ "upload_id": "nope" }),
        json!({ "upload_id": lower }),
        json!("x"),
    ] {
        let (result, reports) = exec(&deps, space, Id::new(), &spec("digest"), input.clone()).await;
        assert_permanent(&result, codes::INVALID_INPUT);
        assert!(reports.is_empty(), "{input}: {reports:?}");
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn digest_with_storage_or_database_down_is_retryable(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let up = upload(&deps, &space, "text/plain", b"hello").await;

    // S3 unreachable: nothing listens on port 1.
    let config = reeve_shared::startup::sdk().await;
    let dead_s3 =
        aws_sdk_s3::config::Builder::from(&config).endpoint_url("http://127.0.0.1:1").force_path_style(true).build();
    let no_s3 = ExecDeps {
        s3: aws_sdk_s3::Client::from_conf(dead_s3),
        objects: S3Objects::new(&config, Some("http://127.0.0.1:1".into())),
        ..deps.clone()
    };
    let (result, _) = exec(&no_s3, space, Id::new(), &spec("digest"), json!({ "upload_id": up.id })).await;
    assert_retryable(&result);

    // Postgres unreachable.
    let dead_db = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://nobody@127.0.0.1:1/nothing")
        .unwrap();
    let no_db = ExecDeps { db: dead_db, ..deps.clone() };
    let (result, _) = exec(&no_db, space, Id::new(), &spec("digest"), json!({ "upload_id": up.id })).await;
    assert_retryable(&result);

    // And with both back, it works.
    let (result, _) = exec(&deps, space, Id::new(), &spec("digest"), json!({ "upload_id": up.id })).await;
    assert_eq!(result.unwrap()["size"], 5);
}

// ------------------------------------------------------- fetch and http

#[derive(Clone, Default)]
struct Seen {
    /// Requests to `/count`: must stay 0 for blocked URLs.
    hits: Arc<AtomicUsize>,
    /// Bodies POSTed to `/echo`.
    posted: Arc<Mutex<Vec<Value>>>,
}

fn file_bytes() -> Vec<u8> {
    pattern(200_000, 9)
}

/// A server on 127.0.0.1 (the one allow-listed address), answering what
/// each test needs: `(base URL, what it saw)`.
async fn server() -> (String, Seen) {
    let seen = Seen::default();
    let router = Router::new()
        .route("/file", get(|| async { ([("content-type", "image/png")], file_bytes()) }))
        .route("/untyped", get(|| async { Response::builder().body(Body::from(&b"no type"[..])).unwrap() }))
        .route("/missing", get(|| async { (StatusCode::NOT_FOUND, "nothing here") }))
        .route("/boom", get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }))
        .route("/busy", get(|| async { (StatusCode::TOO_MANY_REQUESTS, "slow down") }))
        .route("/big", get(|| async { vec![b'x'; FETCH_MAX as usize + 1] }))
        .route(
            "/count",
            any(|State(seen): State<Seen>| async move {
                seen.hits.fetch_add(1, Ordering::SeqCst);
                "counted"
            }),
        )
        .route(
            "/echo",
            post(|State(seen): State<Seen>, body: axum::body::Bytes| async move {
                let input: Value = serde_json::from_slice(&body).expect("the executor POSTs JSON");
                seen.posted.lock().unwrap().push(input.clone());
                axum::Json(json!({ "echo": input, "ok": true }))
            }),
        )
        .route("/fail", post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "internal-db-7.corp is down") }))
        .route("/reject", post(|| async { (StatusCode::BAD_REQUEST, "secret-upstream-detail") }))
        .route("/text", post(|| async { "not json at all" }))
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(4)).await;
                axum::Json(json!({ "late": true }))
            }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (format!("http://127.0.0.1:{port}"), seen)
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn fetch_stores_the_body_with_a_working_download_link(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let (base, _) = server().await;
    let task_id = Id::new();
    let bytes = file_bytes();

    let before = OffsetDateTime::now_utc();
    let (result, reports) = exec(&deps, space, task_id, &spec("fetch"), json!({ "url": format!("{base}/file") })).await;
    let result = result.expect("fetch succeeds");
    let key = format!("outputs/{}/{task_id}/body", space.to_hex());
    assert_eq!(key, output_key(&space, task_id));
    assert_eq!(result["key"], json!(key));
    assert_eq!(result["size"], json!(bytes.len()));
    assert_eq!(result["sha256"], json!(sha256_hex(&bytes)));
    assert_eq!(result["content_type"], "image/png");
    let fields: Vec<&str> = result.as_object().unwrap().keys().map(String::as_str).collect();
    // No link: one is signed each time the result is read (below).
    assert_eq!(fields, ["content_type", "key", "object_expires_at", "sha256", "size", "status"]);
    assert_eq!(result["status"], 200, "the URL's status is part of the result");
    // The bucket keeps outputs OUTPUT_RETENTION_DAYS: S3 expires them at the
    // midnight (UTC) after that, and the result says when.
    let object_expires_at = OffsetDateTime::parse(result["object_expires_at"].as_str().unwrap(), &Rfc3339).unwrap();
    let kept = object_expires_at - before;
    let days = i64::from(OUTPUT_RETENTION_DAYS);
    assert!(kept > time::Duration::days(days) && kept <= time::Duration::days(days + 1), "{object_expires_at}");
    assert_eq!(object_expires_at.time(), time::Time::MIDNIGHT);
    assert_eq!(object_expires_at.offset(), time::UtcOffset::UTC);
    assert_progress_runs_0_to_1(&reports);
    assert!(progress(&reports).len() >= 3, "start, downloaded, stored: {reports:?}");
    assert!(!logs(&reports).is_empty());
    assert_shown_before_capture_hides(&spec("fetch"), &reports, &[&key, &sha256_hex(&bytes), "image/png"]);

    // What the bucket holds.
    let stored = deps.s3.get_object().bucket(&deps.bucket).key(&key).send().await.expect("stored");
    assert_eq!(stored.content_type(), Some("image/png"));
    let stored = stored.body.collect().await.unwrap().into_bytes();
    assert_eq!(stored.as_ref(), bytes.as_slice());

    // Read through GET /v1/tasks/{id}: a link signed now, for 15 minutes.
    let read = read_result(&pool, space, task_id, &result, TaskLinks::Default).await;
    let expires_at = OffsetDateTime::parse(read["url_expires_at"].as_str().unwrap(), &Rfc3339).unwrap();
    let lifetime = (expires_at - before).whole_seconds();
    assert!((898..=901).contains(&lifetime), "expires in 900 s, got {lifetime}");
    let url = read["url"].as_str().unwrap();
    assert!(url.contains("X-Amz-Expires=900"), "{url}");
    let download = reqwest::get(url).await.unwrap();
    assert_eq!(download.status(), 200);
    let disposition = download.headers().get("content-disposition").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(disposition.as_deref(), Some("attachment"), "saved, never rendered");
    let downloaded = download.bytes().await.unwrap();
    assert_eq!(sha256_hex(&downloaded), sha256_hex(&bytes));
    assert_eq!(downloaded.as_ref(), bytes.as_slice());

    // A rerun (a redelivered message) overwrites the same key.
    let (again, _) = exec(&deps, space, task_id, &spec("fetch"), json!({ "url": format!("{base}/file") })).await;
    assert_eq!(again.unwrap()["key"], json!(key));

    // Without a content type from the remote, the default.
    let (result, _) = exec(&deps, space, Id::new(), &spec("fetch"), json!({ "url": format!("{base}/untyped") })).await;
    assert_eq!(result.unwrap()["content_type"], "application/octet-stream");
}

/// How the test's task-status context signs links.
enum TaskLinks {
    /// As deployed: 15 minutes.
    Default,
    /// Shorter than the test runs.
    Lasting(Duration),
}

/// `result` stored as the completed `fetch` task `task_id` of `space` (once),
/// then read back through `GET /v1/tasks/{id}`: its `result` as answered.
async fn read_result(pool: &PgPool, space: SpaceIndex, task_id: Id, result: &Value, links: TaskLinks) -> Value {
    sqlx::query(
        "INSERT INTO tasks (id, space_idx, kind, input, status, progress, result) \
         VALUES ($1, $2, 'fetch', '{}', 'completed', 1, $3) ON CONFLICT (id) DO UPDATE SET result = $3",
    )
    .bind(task_id)
    .bind(space.as_bytes())
    .bind(result)
    .execute(pool)
    .await
    .unwrap();
    // The task-status function as its Lambda builds it.
    let mut status =
        startup::task_status(&common::config(pool), &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"));
    if let TaskLinks::Lasting(lifetime) = links {
        // Fault: links that expire while the test runs (no setting moves them).
        let fresh = Arc::get_mut(&mut status).expect("just built");
        fresh.links = fresh.links.clone().with_lifetime(lifetime);
    }
    let (token, _) = auth::issue_token(&status.token_key, &space, OffsetDateTime::now_utc());
    let reply = send(&task_status_app(status), common::get_authed(&format!("/v1/tasks/{task_id}"), &token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body["result"].clone()
}

/// What was paid for stays reachable: the task row keeps the output's key,
/// and each read signs a new link (here lasting 2 s, not 15 minutes), so a
/// result read after its first link has died still downloads; a row written
/// with a link of its own (before links were signed on read) gets a fresh one
/// too. Once the bucket's retention has passed, the answer says the output
/// has expired, and when, instead of handing out a link that cannot work.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_fetch_result_read_late_still_downloads_until_its_object_expires(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let (base, _) = server().await;
    let task_id = Id::new();
    let bytes = file_bytes();
    let (result, _) = exec(&deps, space, task_id, &spec("fetch"), json!({ "url": format!("{base}/file") })).await;
    let mut result = result.expect("fetch succeeds");
    let short = || TaskLinks::Lasting(Duration::from_secs(2));

    let first = read_result(&pool, space, task_id, &result, short()).await;
    let first_url = first["url"].as_str().expect("a link").to_owned();
    assert!(first_url.contains("X-Amz-Expires=2"), "{first_url}");
    assert_eq!(reqwest::get(&first_url).await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(reqwest::get(&first_url).await.unwrap().status(), 403, "the first link has died");

    // Read again, later: a new link, and the same bytes.
    let late = read_result(&pool, space, task_id, &result, short()).await;
    let url = late["url"].as_str().expect("a link").to_owned();
    assert_ne!(url, first_url);
    let download = reqwest::get(&url).await.unwrap();
    assert_eq!(download.status(), 200);
    assert_eq!(download.bytes().await.unwrap().as_ref(), bytes.as_slice());
    assert!(late.get("expired").is_none(), "{late}");

    // An old row's own link, long dead, is replaced by a fresh one.
    let mut old = result.clone();
    old["url"] = json!(first_url);
    old["url_expires_at"] = json!("2026-01-01T00:00:00Z");
    let reread = read_result(&pool, space, task_id, &old, short()).await;
    assert_ne!(reread["url"], json!(first_url));
    assert_eq!(reqwest::get(reread["url"].as_str().unwrap()).await.unwrap().status(), 200);

    // A link never outlives the object: 15 minutes, cut to its expiry.
    let soon = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap() + time::Duration::seconds(60);
    result["object_expires_at"] = json!(soon.format(&Rfc3339).unwrap());
    let near = read_result(&pool, space, task_id, &result, TaskLinks::Default).await;
    assert_eq!(near["url_expires_at"], result["object_expires_at"], "{near}");

    // The bucket's retention has passed (the clock moved past the date the
    // worker stored): no link, and the answer says when the output expired.
    let gone = "2026-01-03T00:00:00Z";
    result["object_expires_at"] = json!(gone);
    let expired = read_result(&pool, space, task_id, &result, TaskLinks::Default).await;
    assert_eq!(expired["url"], Value::Null, "{expired}");
    assert_eq!(expired["url_expires_at"], Value::Null);
    assert_eq!(expired["expired"]["at"], gone);
    let message = expired["expired"]["message"].as_str().unwrap();
    assert!(message.contains(gone) && message.contains("run the task again"), "{message}");
    assert_eq!(expired["sha256"], result["sha256"], "the rest of the result is still there");

    // Another Space's key in a result (an http endpoint may answer anything)
    // never becomes a link.
    let other = Id::new();
    let mut foreign = result.clone();
    foreign["object_expires_at"] = Value::Null;
    let read = read_result(&pool, space, other, &foreign, TaskLinks::Default).await;
    assert!(read.get("url").is_none(), "{read}");
}

/// The URL is the owner's: whatever it answers is the fetch's result, and a
/// target that cannot be reached is the owner's error, never retried (so a
/// paid fetch of a dead URL is not run five times and never credited).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_fetch_completes_with_any_status_and_an_unreachable_target_is_the_owners_error(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let (base, _) = server().await;
    let fetch = |input: Value| {
        let deps = deps.clone();
        async move { exec(&deps, space, Id::new(), &spec("fetch"), input).await.0 }
    };

    for (path, status, body) in [("/missing", 404, "nothing here"), ("/boom", 500, "boom"), ("/busy", 429, "slow down")]
    {
        let result = fetch(json!({ "url": format!("{base}{path}") })).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(result["status"], status, "{path}: {result}");
        assert_eq!(result["size"], body.len(), "{path}: the body is stored too");
        assert_eq!(result["sha256"], sha256_hex(body.as_bytes()), "{path}");
    }
    let ok = fetch(json!({ "url": format!("{base}/file") })).await.unwrap();
    assert_eq!(ok["status"], 200);

    // Nothing listens on port 1; `.invalid` never resolves (RFC 2606).
    for url in ["http://127.0.0.1:1/".to_owned(), "http://no-such-host.invalid/".to_owned()] {
        let message = assert_permanent(&fetch(json!({ "url": url })).await, codes::FETCH_UNREACHABLE);
        assert!(message.contains("could not be reached"), "{url}: {message}");
    }
    assert_permanent(&fetch(json!({ "url": format!("{base}/big") })).await, codes::TOO_LARGE);
    assert_permanent(&fetch(json!({ "url": "not a url" })).await, codes::INVALID_URL);
    assert_permanent(&fetch(json!({})).await, codes::INVALID_INPUT);
    assert_permanent(&fetch(json!({ "url": 7 })).await, codes::INVALID_INPUT);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn blocked_urls_fail_before_any_connection(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let (base, seen) = server().await;
    let port = base.rsplit(':').next().unwrap();

    for url in [
        "http://10.0.0.1/".to_owned(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        // These two reach the test server if anything connects.
        format!("http://0.0.0.0:{port}/count"),
        format!("http://[::ffff:127.0.0.1]:{port}/count"),
    ] {
        let started = Instant::now();
        let (result, _) = exec(&deps, space, Id::new(), &spec("fetch"), json!({ "url": url })).await;
        let message = assert_permanent(&result, codes::URL_BLOCKED);
        // A connection to 10.0.0.1 would hang until the 5 s connect timeout.
        assert!(started.elapsed() < Duration::from_secs(2), "{url} took {:?}", started.elapsed());
        assert!(!message.is_empty());

        // The same for an http executor whose endpoint is blocked, and its
        // message does not name the operator's endpoint.
        let (result, _) = exec(&deps, space, Id::new(), &http_spec(&url, 5), json!({ "text": "hi" })).await;
        let message = assert_permanent(&result, codes::URL_BLOCKED);
        for internal in ["10.0.0.1", "169.254", "0.0.0.0", "ffff", port] {
            assert!(!message.contains(internal), "{message} names {internal}");
        }
    }
    assert_eq!(seen.hits.load(Ordering::SeqCst), 0, "no blocked URL reached the server");

    // The allow-listed address does get through.
    let (result, _) = exec(&deps, space, Id::new(), &spec("fetch"), json!({ "url": format!("{base}/count") })).await;
    assert_eq!(result.unwrap()["size"], 7);
    assert_eq!(seen.hits.load(Ordering::SeqCst), 1);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn http_returns_the_endpoints_json(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let (base, seen) = server().await;
    let input = json!({ "text": "hello", "nested": { "n": [1, 2, 3] } });

    let (result, reports) = exec(&deps, space, Id::new(), &http_spec(&format!("{base}/echo"), 5), input.clone()).await;
    assert_eq!(result.expect("http succeeds"), json!({ "echo": input, "ok": true }));
    assert_eq!(*seen.posted.lock().unwrap(), vec![input.clone()], "the endpoint saw the input once");
    assert_progress_runs_0_to_1(&reports);
    // Not even the answer's size: a yes and a no may differ in nothing else.
    let spec = http_spec(&format!("{base}/echo"), 5);
    assert_shown_before_capture_hides(&spec, &reports, &["echo", "bytes"]);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn http_failures_have_stable_codes(pool: PgPool) {
    let deps = deps(pool.clone()).await;
    let space = space(&pool).await;
    let (base, _) = server().await;
    let call = |path: &str, timeout_seconds: u32| {
        let deps = deps.clone();
        let spec = http_spec(&format!("{base}{path}"), timeout_seconds);
        async move { exec(&deps, space, Id::new(), &spec, json!({ "text": "hi" })).await.0 }
    };
    let port = base.rsplit(':').next().unwrap().to_owned();

    let failed = call("/fail", 5).await;
    assert_retryable(&failed);

    let message = assert_permanent(&call("/reject", 5).await, codes::EXECUTOR_REJECTED);
    assert!(message.contains("400"), "{message}");
    for hidden in ["secret-upstream-detail", "127.0.0.1", &port] {
        assert!(!message.contains(hidden), "{message} shows {hidden}");
    }

    let message = assert_permanent(&call("/text", 5).await, codes::BAD_EXECUTOR_RESPONSE);
    assert!(!message.contains("not json at all"), "{message}");

    // The task's timeout_seconds bounds the call.
    let started = Instant::now();
    assert_retryable(&call("/slow", 1).await);
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
}
