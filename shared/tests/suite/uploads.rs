//! Uploads against the real stack: `POST /v1/uploads` presigns a PUT that
//! SeaweedFS accepts only with the declared length and type, before expiry;
//! `ensure_uploaded` trusts an object only after a HEAD shows the
//! declaration, and deletes one that differs.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Reply, ctx, new_session, post_json, send};
use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::http::{Ctx, app};
use reeve_shared::ids::Id;
use reeve_shared::uploads::{
    self, KEY_PREFIX, ObjectState, PresignedUpload, UploadError, UploadRequest, UploadStatus, sanitise_filename,
};
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

/// A space row of our own, for calling the domain functions directly.
async fn space(pool: &PgPool) -> SpaceIndex {
    let bytes: [u8; 16] = Id::new().to_bytes();
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(bytes).execute(pool).await.unwrap();
    SpaceIndex::from_array(bytes)
}

async fn presign(
    ctx: &Ctx,
    space: &SpaceIndex,
    name: &str,
    content_type: &str,
    size: u64,
    expiry: Duration,
) -> PresignedUpload {
    let request = UploadRequest { filename: Some(name.to_owned()), content_type: content_type.to_owned(), size };
    uploads::create(&ctx.db, &ctx.aws.objects, &ctx.settings.bucket, &ctx.catalog.uploads, space, request, expiry)
        .await
        .expect("presign")
}

/// The `X-Amz-SignedHeaders` of a presigned URL, in lower case: what the
/// signature binds a PUT to.
fn signed_headers(url: &str) -> Vec<String> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.eq_ignore_ascii_case("X-Amz-SignedHeaders"))
        .map(|(_, value)| {
            value.replace("%3B", ";").replace("%3b", ";").split(';').map(str::to_ascii_lowercase).collect()
        })
        .unwrap_or_default()
}

const EXPIRY: Duration = Duration::from_secs(900);

/// A raw PUT, as a client without any AWS SDK would send it.
async fn put(url: &str, headers: &BTreeMap<String, String>, body: Vec<u8>) -> (u16, String) {
    let mut request = reqwest::Client::new().put(url).body(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request.send().await.expect("S3 answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

async fn status_of(pool: &PgPool, id: Id) -> String {
    sqlx::query_scalar("SELECT status FROM uploads WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

async fn object_exists(ctx: &Ctx, key: &str) -> bool {
    match common::s3().await.head_object().bucket(&ctx.settings.bucket).key(key).send().await {
        Ok(_) => true,
        Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 404) => false,
        Err(e) => panic!("HEAD {key}: {}", aws_sdk_s3::error::DisplayErrorContext(&e)),
    }
}

async fn ensure(ctx: &Ctx, space: &SpaceIndex, id: Id) -> Result<(), UploadError> {
    uploads::ensure_uploaded(&ctx.db, &ctx.aws.objects, &ctx.settings.bucket, space, id).await
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn presign_put_and_ensure_uploaded_end_to_end(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (_, token) = new_session(&app).await;
    let space = auth::verify_token(&ctx.settings.token_key, &token, OffsetDateTime::now_utc()).unwrap();
    let bytes: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();

    let before = OffsetDateTime::now_utc();
    let body =
        json!({ "filename": "Quarterly report 2024.pdf", "content_type": "application/pdf", "size": bytes.len() });
    let reply = send(&app, post_json("/v1/uploads", Some(&token), &body)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);

    // The answer: exactly these fields, the headers the client must send.
    let fields: Vec<&str> = reply.body.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(fields, ["expires_at", "headers", "method", "upload_id", "url"]);
    assert_eq!(reply.body["method"], "PUT");
    assert_eq!(reply.body["headers"], json!({ "content-length": "3000", "content-type": "application/pdf" }));
    let expires_at = OffsetDateTime::parse(
        reply.body["expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let lifetime = (expires_at - before).whole_seconds();
    assert!((898..=901).contains(&lifetime), "expires in 900 s, got {lifetime}");

    let url = reply.body["url"].as_str().unwrap();
    let signed = signed_headers(url);
    assert!(signed.contains(&"content-length".to_owned()) && signed.contains(&"content-type".to_owned()), "{signed:?}");
    assert!(url.contains("X-Amz-Expires=900"), "{url}");

    // Nothing secret beyond what a presigned URL inherently carries.
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").expect("the stack's .env is loaded");
    assert!(!secret.is_empty());
    let whole = format!("{} {:?}", reply.body, reply.headers);
    assert!(!whole.contains(&secret), "the secret key leaked");

    let id: Id = reply.body["upload_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(status_of(&pool, id).await, "pending");
    let row = uploads::find(&pool, &space, id).await.unwrap().unwrap();
    assert_eq!(row.filename, "Quarterly report 2024.pdf", "the original name is kept");
    assert_eq!(row.size, 3000);
    assert_eq!(row.content_type, "application/pdf");
    let prefix = format!("{KEY_PREFIX}{}/{id}/", space.to_hex());
    assert!(row.key.starts_with(&prefix), "{} should start with {prefix}", row.key);
    assert_eq!(row.key, format!("{prefix}Quarterly_report_2024.pdf"));

    // Before the PUT there is nothing to accept.
    assert!(matches!(ensure(&ctx, &space, id).await, Err(UploadError::NotUploaded(i)) if i == id));

    let headers: BTreeMap<String, String> = serde_json::from_value(reply.body["headers"].clone()).unwrap();
    let (status, text) = put(url, &headers, bytes.clone()).await;
    assert_eq!(status, 200, "{text}");

    assert_eq!(
        uploads::check_object(&ctx.aws.objects, &ctx.settings.bucket, &row).await.unwrap(),
        ObjectState::Matches
    );
    ensure(&ctx, &space, id).await.expect("the object matches its declaration");
    assert_eq!(status_of(&pool, id).await, "uploaded");
    ensure(&ctx, &space, id).await.expect("and stays accepted");

    let got = common::s3().await.get_object().bucket(&ctx.settings.bucket).key(&row.key).send().await.unwrap();
    assert_eq!(got.body.collect().await.unwrap().into_bytes().as_ref(), bytes.as_slice());
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_signature_binds_the_length_and_the_type(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let space = space(&pool).await;
    let up = presign(&ctx, &space, "data.bin", "application/octet-stream", 1024, EXPIRY).await;
    let mut no_length = up.headers.clone();
    no_length.remove("content-length"); // reqwest sets it from the body

    for (what, size) in [("shorter", 1000usize), ("longer", 1025), ("empty", 0)] {
        let (status, text) = put(&up.url, &no_length, vec![b'x'; size]).await;
        assert_eq!(status, 403, "a {what} body must be refused: {text}");
        assert!(text.contains("SignatureDoesNotMatch"), "{what}: {text}");
    }

    let mut other_type = up.headers.clone();
    other_type.insert("content-type".into(), "text/html".into());
    let (status, text) = put(&up.url, &other_type, vec![b'x'; 1024]).await;
    assert_eq!(status, 403, "another Content-Type must be refused: {text}");
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");

    let mut no_type = up.headers.clone();
    no_type.remove("content-type");
    let (status, text) = put(&up.url, &no_type, vec![b'x'; 1024]).await;
    assert_eq!(status, 403, "leaving Content-Type out must be refused: {text}");

    assert!(!object_exists(&ctx, &up.key).await, "no refused PUT may leave an object");

    // The very same URL with what was declared works: the refusals above
    // were about the length and type, not a broken URL.
    let (status, text) = put(&up.url, &up.headers, vec![b'x'; 1024]).await;
    assert_eq!(status, 200, "{text}");
    ensure(&ctx, &space, up.id).await.unwrap();
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_expired_url_is_refused(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let space = space(&pool).await;
    let up = presign(&ctx, &space, "late.txt", "text/plain", 5, Duration::from_secs(1)).await;
    assert!(up.url.contains("X-Amz-Expires=1&") || up.url.ends_with("X-Amz-Expires=1"), "{}", up.url);
    assert!(up.expires_at <= OffsetDateTime::now_utc() + time::Duration::seconds(1));

    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, text) = put(&up.url, &up.headers, b"hello".to_vec()).await;
    assert_eq!(status, 403, "an expired URL must be refused: {text}");
    // SeaweedFS says why: `AccessDenied`, "Request has expired" (not a signature mismatch).
    assert!(text.contains("AccessDenied") && text.contains("expired"), "{text}");
    assert!(!object_exists(&ctx, &up.key).await);
    assert!(matches!(ensure(&ctx, &space, up.id).await, Err(UploadError::NotUploaded(_))));
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn another_spaces_upload_is_not_found(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let (owner, stranger) = (space(&pool).await, space(&pool).await);
    let up = presign(&ctx, &owner, "mine.txt", "text/plain", 4, EXPIRY).await;
    let (status, text) = put(&up.url, &up.headers, b"mine".to_vec()).await;
    assert_eq!(status, 200, "{text}");

    assert!(matches!(ensure(&ctx, &stranger, up.id).await, Err(UploadError::NotFound(i)) if i == up.id));
    assert!(uploads::find(&pool, &stranger, up.id).await.unwrap().is_none());
    assert_eq!(status_of(&pool, up.id).await, "pending", "a stranger's check changes nothing");
    assert!(matches!(ensure(&ctx, &owner, Id::new()).await, Err(UploadError::NotFound(_))));

    ensure(&ctx, &owner, up.id).await.expect("the owner's check passes");
    assert!(matches!(ensure(&ctx, &stranger, up.id).await, Err(UploadError::NotFound(_))), "uploaded or not");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_pending_upload_never_put_is_not_uploaded(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let space = space(&pool).await;
    let up = presign(&ctx, &space, "never.txt", "text/plain", 10, EXPIRY).await;
    let row = uploads::find(&pool, &space, up.id).await.unwrap().unwrap();
    assert_eq!(
        uploads::check_object(&ctx.aws.objects, &ctx.settings.bucket, &row).await.unwrap(),
        ObjectState::Missing
    );
    assert!(matches!(ensure(&ctx, &space, up.id).await, Err(UploadError::NotUploaded(i)) if i == up.id));
    assert_eq!(status_of(&pool, up.id).await, "pending");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_object_of_another_size_is_rejected_and_deleted(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let space = space(&pool).await;
    let up = presign(&ctx, &space, "big.bin", "application/octet-stream", 10, EXPIRY).await;
    // Written past the presigned URL, straight with the bucket's credentials.
    common::s3()
        .await
        .put_object()
        .bucket(&ctx.settings.bucket)
        .key(&up.key)
        .content_type("application/octet-stream")
        .body(vec![0u8; 4096].into())
        .send()
        .await
        .unwrap();
    let row = uploads::find(&pool, &space, up.id).await.unwrap().unwrap();
    assert_eq!(
        uploads::check_object(&ctx.aws.objects, &ctx.settings.bucket, &row).await.unwrap(),
        ObjectState::Differs { size: Some(4096), content_type: Some("application/octet-stream".into()) }
    );

    assert!(matches!(ensure(&ctx, &space, up.id).await, Err(UploadError::Rejected(i)) if i == up.id));
    assert_eq!(status_of(&pool, up.id).await, "rejected");
    assert!(!object_exists(&ctx, &up.key).await, "the oversized object must be deleted");
    assert!(matches!(ensure(&ctx, &space, up.id).await, Err(UploadError::Rejected(_))), "and it stays rejected");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_object_of_another_type_is_rejected_and_deleted(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let space = space(&pool).await;
    let up = presign(&ctx, &space, "pic.png", "image/png", 8, EXPIRY).await;
    common::s3()
        .await
        .put_object()
        .bucket(&ctx.settings.bucket)
        .key(&up.key)
        .content_type("text/html")
        .body(b"<script>".to_vec().into())
        .send()
        .await
        .unwrap();
    assert!(matches!(ensure(&ctx, &space, up.id).await, Err(UploadError::Rejected(_))));
    assert!(!object_exists(&ctx, &up.key).await);
    let row = uploads::find(&pool, &space, up.id).await.unwrap().unwrap();
    assert_eq!(row.status, UploadStatus::Rejected);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn consumed_uploads_cannot_be_used_again(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let space = space(&pool).await;
    let up = presign(&ctx, &space, "once.txt", "text/plain", 4, EXPIRY).await;
    assert_eq!(put(&up.url, &up.headers, b"once".to_vec()).await.0, 200);
    ensure(&ctx, &space, up.id).await.unwrap();
    sqlx::query("UPDATE uploads SET status = 'consumed' WHERE id = $1").bind(up.id).execute(&pool).await.unwrap();
    assert!(matches!(ensure(&ctx, &space, up.id).await, Err(UploadError::NotUploaded(_))));
}

#[test]
fn hostile_names_are_sanitised() {
    let long = "a".repeat(1000);
    let long_ext = format!("{}.tar.gz", "b".repeat(300));
    let cases: &[(&str, &str)] = &[
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("..", "file"),
        ("../..", "file"),
        ("a/b\\c", "c"),
        ("C:\\Users\\me\\photo.jpg", "photo.jpg"),
        ("dir/", "dir"),
        ("/", "file"),
        ("", "file"),
        (".hidden", "hidden"),
        ("...env", "env"),
        ("a..b", "a.b"),
        ("x....", "x."),
        ("résumé.pdf", "r_sum_.pdf"),
        ("日本語", "___"),
        ("a\0b", "a_b"),
        ("line\nbreak\r", "line_break_"),
        ("name with spaces & $ymbols;.txt", "name_with_spaces____ymbols_.txt"),
        ("%2e%2e%2fetc", "_2e_2e_2fetc"),
        ("-rf", "-rf"),
    ];
    for (input, want) in cases {
        assert_eq!(sanitise_filename(input), *want, "{input:?}");
    }
    assert_eq!(sanitise_filename(&long), "a".repeat(100));
    let capped = sanitise_filename(&long_ext);
    assert_eq!(capped.len(), 100);
    assert!(capped.ends_with(".gz"), "a short extension survives the cap: {capped}");

    for input in ["../../etc/passwd", "a/b\\c", ".hidden", "a\0b", &long, "日本語/..", "..\\..\\x"] {
        let name = sanitise_filename(input);
        assert!(!name.is_empty() && name.len() <= 100, "{input:?} -> {name:?}");
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)), "{input:?} -> {name:?}");
        assert!(!name.starts_with('.') && !name.contains(".."), "{input:?} -> {name:?}");
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn hostile_names_through_the_api(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (_, token) = new_session(&app).await;
    let space = auth::verify_token(&ctx.settings.token_key, &token, OffsetDateTime::now_utc()).unwrap();
    let prefix = format!("{KEY_PREFIX}{}/", space.to_hex());

    for (name, tail) in [
        ("../../etc/passwd", "passwd"),
        ("a/b\\c", "c"),
        (".hidden", "hidden"),
        ("über.txt", "_ber.txt"),
        (&*"n".repeat(200), &*"n".repeat(100)),
    ] {
        let body = json!({ "filename": name, "content_type": "text/plain", "size": 1 });
        let reply = send(&app, post_json("/v1/uploads", Some(&token), &body)).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{name:?}: {}", reply.body);
        let id: Id = reply.body["upload_id"].as_str().unwrap().parse().unwrap();
        let row = uploads::find(&pool, &space, id).await.unwrap().unwrap();
        assert_eq!(row.key, format!("{prefix}{id}/{tail}"), "{name:?}");
        assert_eq!(row.filename, name, "the original name is stored as given");
    }

    for name in ["a\0b", "tab\there", &"x".repeat(1000), "", "   "] {
        let body = json!({ "filename": name, "content_type": "text/plain", "size": 1 });
        let reply = send(&app, post_json("/v1/uploads", Some(&token), &body)).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::BAD_REQUEST, "invalid_filename"), "{name:?}");
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn bad_requests_get_stable_codes(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (_, token) = new_session(&app).await;
    let max = ctx.catalog.uploads.max_bytes;
    let ok = json!({ "filename": "a.txt", "content_type": "text/plain", "size": 10 });
    let with = |field: &str, value: Value| {
        let mut body = ok.clone();
        body[field] = value;
        body
    };
    let without = |field: &str| {
        let mut body = ok.clone();
        body.as_object_mut().unwrap().remove(field);
        body
    };
    let raw = |content_type: &str, token: Option<&str>, body: String| {
        let mut request = Request::post("/v1/uploads").header("content-type", content_type);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request.body(Body::from(body)).unwrap()
    };

    let cases: Vec<(&str, Request<Body>, StatusCode, &str)> = vec![
        ("no token", post_json("/v1/uploads", None, &ok), StatusCode::UNAUTHORIZED, "missing_token"),
        ("bad token", post_json("/v1/uploads", Some("not-a-token"), &ok), StatusCode::UNAUTHORIZED, "invalid_token"),
        (
            "not bearer",
            Request::post("/v1/uploads")
                .header("content-type", "application/json")
                .header("authorization", format!("Basic {token}"))
                .body(Body::from(ok.to_string()))
                .unwrap(),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ),
        (
            "malformed JSON",
            raw("application/json", Some(&token), "{\"size\": ".into()),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            "text/plain body",
            raw("text/plain", Some(&token), ok.to_string()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            "body over 64 KiB",
            post_json("/v1/uploads", Some(&token), &with("filename", json!("f".repeat(70 * 1024)))),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
        (
            "size as a word",
            post_json("/v1/uploads", Some(&token), &with("size", json!("ten"))),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "size zero",
            post_json("/v1/uploads", Some(&token), &with("size", json!(0))),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "negative size",
            post_json("/v1/uploads", Some(&token), &with("size", json!(-5))),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "fractional size",
            post_json("/v1/uploads", Some(&token), &with("size", json!(1.5))),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "size past u64",
            raw("application/json", Some(&token), ok.to_string().replace("10", "99999999999999999999999")),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "missing size",
            post_json("/v1/uploads", Some(&token), &without("size")),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "size over max",
            post_json("/v1/uploads", Some(&token), &with("size", json!(max + 1))),
            StatusCode::BAD_REQUEST,
            "upload_too_large",
        ),
        (
            "size u64::MAX",
            post_json("/v1/uploads", Some(&token), &with("size", json!(u64::MAX))),
            StatusCode::BAD_REQUEST,
            "upload_too_large",
        ),
        (
            "disallowed type",
            post_json("/v1/uploads", Some(&token), &with("content_type", json!("application/x-msdownload"))),
            StatusCode::BAD_REQUEST,
            "unsupported_content_type",
        ),
        (
            "type with parameters",
            post_json("/v1/uploads", Some(&token), &with("content_type", json!("text/plain; charset=utf-8"))),
            StatusCode::BAD_REQUEST,
            "unsupported_content_type",
        ),
        (
            "missing type",
            post_json("/v1/uploads", Some(&token), &without("content_type")),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "empty filename",
            post_json("/v1/uploads", Some(&token), &with("filename", json!(""))),
            StatusCode::BAD_REQUEST,
            "invalid_filename",
        ),
        (
            "missing filename",
            post_json("/v1/uploads", Some(&token), &without("filename")),
            StatusCode::BAD_REQUEST,
            "invalid_filename",
        ),
        (
            "null filename",
            post_json("/v1/uploads", Some(&token), &with("filename", Value::Null)),
            StatusCode::BAD_REQUEST,
            "invalid_filename",
        ),
        (
            "unknown field",
            post_json("/v1/uploads", Some(&token), &with("bucket", json!("other"))),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
    ];

    for (what, request, status, code) in cases {
        let reply: Reply = send(&app, request).await;
        assert_eq!((reply.status, reply.code()), (status, code), "{what}: {}", reply.body);
        assert!(reply.body["error"]["request_id"].as_str().is_some_and(|id| !id.is_empty()), "{what}");
    }

    let reply = send(&app, post_json("/v1/uploads", Some(&token), &with("size", json!(max + 1)))).await;
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&max.to_string()), "the message names the limit: {message}");
    let reply = send(&app, post_json("/v1/uploads", Some(&token), &with("content_type", json!("video/mp4")))).await;
    let message = reply.body["error"]["message"].as_str().unwrap();
    for allowed in &ctx.catalog.uploads.content_types {
        assert!(message.contains(allowed.as_str()), "the message lists {allowed}: {message}");
    }

    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM uploads").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 0, "no refused request may store an upload");

    // And the same declaration done right goes through, with the type canonicalised.
    let reply = send(&app, post_json("/v1/uploads", Some(&token), &with("content_type", json!(" Text/Plain ")))).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    assert_eq!(reply.body["headers"]["content-type"], "text/plain");
}
