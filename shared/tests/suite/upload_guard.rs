//! The upload guard against the real stack (SeaweedFS and Postgres), driven
//! by `events/s3-upload-guard.json` with the key and bucket substituted, as
//! S3 would send it: the key URL-encoded.

use crate::common;

use std::time::Duration;

use aws_lambda_events::event::s3::S3Event;
use aws_sdk_s3::primitives::ByteStream;
use common::ctx;
use reeve_shared::auth::SpaceIndex;
use reeve_shared::http::Ctx;
use reeve_shared::ids::Id;
use reeve_shared::s3_objects::S3Objects;
use reeve_shared::settings::{self, Config};
use reeve_shared::startup;
use reeve_shared::upload_guard::{Guard, GuardError, Outcome, find_by_key};
use reeve_shared::uploads::{self, PresignedUpload, UploadRequest, UploadStatus};
use serde_json::Value;
use sqlx::PgPool;

const EVENT: &str = include_str!("../../../events/s3-upload-guard.json");

/// S3's encoding of a key in an event: URL-encoded, a space as `+`.
fn s3_encode(key: &str) -> String {
    let mut out = String::new();
    for b in key.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(b as char),
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// The sample event with this bucket, key (encoded here), size and event name.
fn event(bucket: &str, key: &str, size: i64, name: &str) -> S3Event {
    let mut value: Value = serde_json::from_str(EVENT).expect("events/s3-upload-guard.json is JSON");
    let record = &mut value["Records"][0];
    record["eventName"] = name.into();
    record["s3"]["bucket"]["name"] = bucket.into();
    record["s3"]["bucket"]["arn"] = format!("arn:aws:s3:::{bucket}").into();
    record["s3"]["object"]["key"] = s3_encode(key).into();
    record["s3"]["object"]["size"] = size.into();
    serde_json::from_value(value).expect("an S3 event")
}

/// The upload guard as its Lambda builds it, on this test's database.
async fn guard(pool: &PgPool) -> Guard {
    guard_of(&common::config(pool)).await
}

async fn guard_of(config: &Config) -> Guard {
    startup::guard(config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"))
}

/// [`guard`] with the deployment's limit (`REEVE_UPLOAD_MAX_BYTES`) at 50 bytes.
async fn strict_guard(pool: &PgPool) -> Guard {
    guard_of(&common::config(pool).with(settings::UPLOAD_MAX_BYTES, "50")).await
}

async fn space(pool: &PgPool) -> SpaceIndex {
    let bytes: [u8; 16] = Id::new().to_bytes();
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(bytes).execute(pool).await.unwrap();
    SpaceIndex::from_array(bytes)
}

async fn presign(ctx: &Ctx, space: &SpaceIndex, content_type: &str, size: u64) -> PresignedUpload {
    let request = UploadRequest { filename: Some("in put.bin".into()), content_type: content_type.into(), size };
    uploads::create(
        &ctx.db,
        &ctx.aws.objects,
        &ctx.settings.bucket,
        &ctx.catalog.uploads,
        space,
        request,
        Duration::from_secs(900),
    )
    .await
    .expect("presign")
}

/// The client's PUT through the presigned URL, with exactly its headers.
async fn put_presigned(upload: &PresignedUpload, body: Vec<u8>) {
    let mut request = reqwest::Client::new().put(&upload.url).body(body);
    for (name, value) in &upload.headers {
        request = request.header(name, value);
    }
    let response = request.send().await.expect("S3 answers");
    assert_eq!(response.status().as_u16(), 200, "{}", response.text().await.unwrap_or_default());
}

/// A PUT with the stack's own credentials: what a presigned URL would never
/// allow, standing in for an object that is not what was declared.
async fn put_direct(ctx: &Ctx, key: &str, content_type: &str, body: Vec<u8>) {
    common::s3()
        .await
        .put_object()
        .bucket(&ctx.settings.bucket)
        .key(key)
        .content_type(content_type)
        .body(ByteStream::from(body))
        .send()
        .await
        .expect("PUT");
}

async fn exists(ctx: &Ctx, key: &str) -> bool {
    match common::s3().await.head_object().bucket(&ctx.settings.bucket).key(key).send().await {
        Ok(_) => true,
        Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => false,
        Err(e) => panic!("HEAD {key}: {}", aws_sdk_s3::error::DisplayErrorContext(&e)),
    }
}

async fn status(pool: &PgPool, key: &str) -> UploadStatus {
    find_by_key(pool, key).await.unwrap().expect("the upload row").status
}

/// Runs the guard on a one-record event and returns that record's outcome.
async fn run(guard: &Guard, bucket: &str, key: &str, size: i64) -> Outcome {
    let outcomes = guard.handle(&event(bucket, key, size, "ObjectCreated:Put")).await.expect("the guard succeeds");
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].0, key, "the event's key is decoded");
    outcomes[0].1.clone()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_matching_object_is_accepted_and_a_redelivery_changes_nothing(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let guard = guard(&pool).await;
    let space = space(&pool).await;
    let body = b"hello, guard".to_vec();
    let upload = presign(&ctx, &space, "text/plain", body.len() as u64).await;
    put_presigned(&upload, body.clone()).await;

    let outcome = run(&guard, &ctx.settings.bucket, &upload.key, body.len() as i64).await;
    assert_eq!(outcome, Outcome::Accepted);
    assert_eq!(status(&pool, &upload.key).await, UploadStatus::Uploaded);
    assert!(exists(&ctx, &upload.key).await);

    // S3 delivers at least once: the same event again leaves it as it is.
    let again = run(&guard, &ctx.settings.bucket, &upload.key, body.len() as i64).await;
    assert_eq!(again, Outcome::AlreadySettled(UploadStatus::Uploaded));
    assert!(exists(&ctx, &upload.key).await, "a settled upload's object is never deleted");
    // And task create, which trusts `uploaded`, agrees.
    uploads::ensure_uploaded(&ctx.db, &ctx.aws.objects, &ctx.settings.bucket, &space, upload.id).await.unwrap();
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_oversize_object_is_rejected_and_deleted(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let guard = guard(&pool).await;
    let space = space(&pool).await;
    let upload = presign(&ctx, &space, "application/octet-stream", 10).await;
    put_direct(&ctx, &upload.key, "application/octet-stream", vec![7u8; 4096]).await;

    let outcome = run(&guard, &ctx.settings.bucket, &upload.key, 4096).await;
    assert_eq!(outcome, Outcome::Rejected { size: Some(4096), content_type: Some("application/octet-stream".into()) });
    assert_eq!(status(&pool, &upload.key).await, UploadStatus::Rejected);
    assert!(!exists(&ctx, &upload.key).await, "the oversize object was deleted");

    // Task create now refuses it too.
    let err = uploads::ensure_uploaded(&ctx.db, &ctx.aws.objects, &ctx.settings.bucket, &space, upload.id).await;
    assert!(matches!(err, Err(uploads::UploadError::Rejected(_))), "{err:?}");

    // A replayed PUT of a rejected upload is deleted again.
    put_direct(&ctx, &upload.key, "application/octet-stream", vec![7u8; 10]).await;
    assert_eq!(run(&guard, &ctx.settings.bucket, &upload.key, 10).await, Outcome::DeletedRejected);
    assert!(!exists(&ctx, &upload.key).await);
    assert_eq!(status(&pool, &upload.key).await, UploadStatus::Rejected);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_object_of_another_type_is_rejected_and_deleted(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let guard = guard(&pool).await;
    let space = space(&pool).await;
    let upload = presign(&ctx, &space, "text/plain", 5).await;
    put_direct(&ctx, &upload.key, "image/png", b"\x89PNG\r".to_vec()).await;

    let outcome = run(&guard, &ctx.settings.bucket, &upload.key, 5).await;
    assert_eq!(outcome, Outcome::Rejected { size: Some(5), content_type: Some("image/png".into()) });
    assert_eq!(status(&pool, &upload.key).await, UploadStatus::Rejected);
    assert!(!exists(&ctx, &upload.key).await);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_declaration_over_the_deployment_limit_is_rejected(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let space = space(&pool).await;
    let body = vec![1u8; 100];
    let upload = presign(&ctx, &space, "application/octet-stream", 100).await;
    put_presigned(&upload, body).await;

    // The limit was lowered (UploadMaxBytes) after the URL was handed out.
    let strict = strict_guard(&pool).await;
    let outcome = run(&strict, &ctx.settings.bucket, &upload.key, 100).await;
    assert!(matches!(outcome, Outcome::Rejected { size: Some(100), .. }), "{outcome:?}");
    assert_eq!(status(&pool, &upload.key).await, UploadStatus::Rejected);
    assert!(!exists(&ctx, &upload.key).await);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_unknown_key_is_deleted_and_its_key_url_decoded(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let guard = guard(&pool).await;
    // A name S3 must encode in the event: spaces, parentheses, non-ASCII.
    let key = format!("incoming/tasks/stray {} (1) café.txt", Id::new());
    put_direct(&ctx, &key, "text/plain", b"nobody asked for this".to_vec()).await;
    assert!(exists(&ctx, &key).await);

    let outcome = run(&guard, &ctx.settings.bucket, &key, 21).await;
    assert_eq!(outcome, Outcome::DeletedUnknown);
    assert!(!exists(&ctx, &key).await, "the stray object was deleted");
    assert!(find_by_key(&pool, &key).await.unwrap().is_none(), "no row appears");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn other_events_and_buckets_are_ignored(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let guard = guard(&pool).await;
    let key = format!("incoming/tasks/{}/keep.txt", Id::new());
    put_direct(&ctx, &key, "text/plain", b"keep".to_vec()).await;

    let removed = guard.handle(&event(&ctx.settings.bucket, &key, 4, "ObjectRemoved:Delete")).await.unwrap();
    assert!(matches!(removed[0].1, Outcome::Ignored(_)), "{removed:?}");
    let elsewhere = guard.handle(&event("someone-elses-bucket", &key, 4, "ObjectCreated:Put")).await.unwrap();
    assert!(matches!(elsewhere[0].1, Outcome::Ignored(_)), "{elsewhere:?}");
    assert!(exists(&ctx, &key).await, "nothing was deleted");
    common::s3().await.delete_object().bucket(&ctx.settings.bucket).key(&key).send().await.unwrap();
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn unreachable_storage_fails_the_invocation_so_lambda_retries(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    // Port 9 (discard) on loopback: nothing listens, connections are refused.
    // Fault: the guard's S3 reaches nothing (the endpoint is otherwise the
    // process's, not a `Config`'s).
    let dead = S3Objects::new(&reeve_shared::startup::sdk().await, Some("http://127.0.0.1:9".into()));
    let broken = Guard { s3: dead, ..guard(&pool).await };
    let key = format!("incoming/tasks/{}/x.txt", Id::new());
    let err = broken.handle(&event(&ctx.settings.bucket, &key, 1, "ObjectCreated:Put")).await.unwrap_err();
    assert!(matches!(err, GuardError::Storage(_)), "{err:?}");
}

/// Task create marks a pending upload `uploaded` while the guard, which read
/// it as `pending`, is about to reject it. The guard's conditional update
/// then changes no row: create's decision stands, so the object a task is
/// about to read must not be deleted.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_guard_that_loses_the_race_to_task_create_deletes_nothing(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let space = space(&pool).await;
    let upload = presign(&ctx, &space, "application/octet-stream", 100).await;
    put_presigned(&upload, vec![1u8; 100]).await;

    // Create's update, not yet committed: the guard still reads `pending`,
    // and its own update waits on the row lock until create commits.
    let mut create = pool.begin().await.unwrap();
    sqlx::query("UPDATE uploads SET status = 'uploaded' WHERE id = $1")
        .bind(upload.id)
        .execute(&mut *create)
        .await
        .unwrap();
    let strict = strict_guard(&pool).await;
    let key = upload.key.clone();
    let settling = tokio::spawn(async move { strict.settle(&key).await });
    let waited = async {
        loop {
            let waiting: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted").fetch_one(&pool).await.unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), waited).await.expect("the guard reaches its update");
    create.commit().await.unwrap();

    let outcome = settling.await.unwrap().expect("the guard succeeds");
    assert_eq!(outcome, Outcome::AlreadySettled(UploadStatus::Uploaded));
    assert_eq!(status(&pool, &upload.key).await, UploadStatus::Uploaded);
    assert!(exists(&ctx, &upload.key).await, "the object create accepted is still there");
}
