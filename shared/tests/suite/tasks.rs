//! Task create and status against the real stack: Postgres, moto SQS and
//! SeaweedFS S3. Each test that reads the queue makes a queue of its own.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use base64::Engine;
use common::{Reply, TestQueue, get_authed, new_session, post_json, send};
use reeve_shared::http::{Ctx, app};
use reeve_shared::ids::Id;
use reeve_shared::settings;
use reeve_shared::tasks::{self, EventType, QueueMessage};
use serde_json::{Value, json};
use sqlx::PgPool;

/// Free tasks that need no upload, plus one that takes several.
const TEST_CATALOG: &str = r#"
    [tasks.echo]
    title = "Echo"
    description = "A free task with a plain input."
    executor = "digest"
    [tasks.echo.input_schema]
    type = "object"
    required = ["text"]
    additionalProperties = false
    [tasks.echo.input_schema.properties.text]
    type = "string"
    maxLength = 100
    [tasks.echo.input_schema.properties.n]
    type = "integer"
    minimum = 0

    [tasks.shout]
    title = "Shout"
    description = "Another free kind, for idempotency across kinds."
    executor = "digest"
    input_schema = { type = "object" }

    [tasks.bundle]
    title = "Bundle"
    description = "Takes uploads by id, with no pattern in its schema."
    executor = "digest"
    [tasks.bundle.input_schema]
    type = "object"
    [tasks.bundle.input_schema.properties.upload_ids]
    type = "array"
    items = { type = "string" }
"#;

fn test_catalog() -> String {
    TEST_CATALOG.to_owned()
}

/// The API serving `catalog` (TOML) on `queue_url`, as start-up builds it.
async fn ctx_with(catalog: String, pool: PgPool, queue_url: &str) -> Ctx {
    common::api(&common::with_catalog(common::config(&pool), &catalog).with(settings::QUEUE_URL, queue_url)).await
}

fn create(kind: &str, token: &str, body: &Value) -> Request<Body> {
    post_json(&format!("/v1/tasks/{kind}"), Some(token), body)
}

fn create_with_key(kind: &str, token: &str, key: &str, body: &Value) -> Request<Body> {
    let mut request = create(kind, token, body);
    request.headers_mut().insert("idempotency-key", HeaderValue::from_str(key).unwrap());
    request
}

async fn task_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(pool).await.unwrap()
}

fn id_of(reply: &Reply) -> Id {
    reply.body["id"].as_str().unwrap_or_else(|| panic!("no id in {}", reply.body)).parse().unwrap()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_free_task_is_stored_queued_with_its_first_event_and_sent_to_sqs(pool: PgPool) {
    let queue = TestQueue::new().await;
    let app = app(ctx_with(test_catalog(), pool.clone(), &queue.url).await);
    let (_, token) = new_session(&app).await;

    let input = json!({"text": "hello", "n": 3});
    let reply = send(&app, create("echo", &token, &json!({ "input": input }))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    assert_eq!(reply.body["kind"], "echo");
    assert_eq!(reply.body["status"], "queued");
    assert_eq!(reply.body["events_url"], format!("/v1/tasks/{id}/events"));
    assert_eq!(reply.headers["location"], format!("/v1/tasks/{id}").as_str());
    assert!(reply.headers.get("idempotent-replayed").is_none());
    let created_at = reply.body["created_at"].as_str().unwrap();
    time::OffsetDateTime::parse(created_at, &time::format_description::well_known::Rfc3339).expect("RFC 3339");

    let (status, stored, last_seq, key): (String, Value, i64, Option<String>) =
        sqlx::query_as("SELECT status, input, last_seq, idempotency_key FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "queued");
    assert_eq!(stored, input);
    assert_eq!(last_seq, 1);
    assert_eq!(key, None);

    let mut conn = pool.acquire().await.unwrap();
    let events = tasks::events_after(&mut conn, id, 0).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].seq, 1);
    assert_eq!(events[0].kind, EventType::Status);
    assert_eq!(events[0].data, json!({"status": "queued"}));
    let event = serde_json::to_value(&events[0]).unwrap();
    assert_eq!(event["type"], "status");
    assert!(event["at"].is_string());

    let messages = queue.drain().await;
    assert_eq!(messages, [json!({"task_id": id.to_string(), "kind": "echo"})]);
    let message: QueueMessage = serde_json::from_value(messages[0].clone()).unwrap();
    assert_eq!(message.task_id, id);
    queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn when_sqs_refuses_the_task_is_failed_and_the_answer_is_503(pool: PgPool) {
    // A queue that does not exist: moto answers QueueDoesNotExist.
    let queue = TestQueue::new().await;
    let missing = format!("{}-gone", queue.url);
    queue.delete().await;
    let app = app(ctx_with(test_catalog(), pool.clone(), &missing).await);
    let (_, token) = new_session(&app).await;

    let reply = send(&app, create("echo", &token, &json!({"input": {"text": "x"}}))).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
    assert_eq!(reply.code(), "queue_unavailable");
    assert!(!reply.body.to_string().contains("5000"), "no endpoint detail leaks: {}", reply.body);

    let (id, status, error): (Id, String, Value) =
        sqlx::query_as("SELECT id, status, error FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(status, "failed");
    assert_eq!(error["code"], "queue_unavailable");

    let mut conn = pool.acquire().await.unwrap();
    let events = tasks::events_after(&mut conn, id, 0).await.unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    // The reason is an `error` event, as for a worker's failure, so
    // `reeve task watch` shows why; then the `status`.
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(events[1].kind, tasks::EventType::Error);
    assert_eq!(events[1].data["code"], "queue_unavailable");
    assert_eq!(events[2].data["status"], "failed");
    assert_eq!(events[2].data["error"]["code"], "queue_unavailable");

    let snapshot = send(&app, get_authed(&format!("/v1/tasks/{id}"), &token)).await;
    assert_eq!(snapshot.status, StatusCode::OK);
    assert_eq!(snapshot.body["status"], "failed");
    assert_eq!(snapshot.body["error"]["code"], "queue_unavailable");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_unreachable_sqs_endpoint_is_also_queue_unavailable(pool: PgPool) {
    // The SDK sends to its endpoint, whatever host the queue URL names: point
    // the endpoint at port 1, where nothing listens.
    let queue = TestQueue::new().await;
    let mut ctx = ctx_with(test_catalog(), pool.clone(), &queue.url).await;
    // Fault: task create's SQS client cannot connect (the SDK takes its
    // endpoint from the process, not from a `Config`).
    let task_create = Arc::get_mut(&mut Arc::get_mut(&mut ctx).expect("just built").task_create).expect("just built");
    let dead = task_create.aws.sqs.config().to_builder().endpoint_url("http://127.0.0.1:1").build();
    task_create.aws.sqs = aws_sdk_sqs::Client::from_conf(dead);
    let app = app(ctx);
    let (_, token) = new_session(&app).await;
    let reply = send(&app, create("echo", &token, &json!({"input": {"text": "x"}}))).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
    assert_eq!(reply.code(), "queue_unavailable");
    let status: String = sqlx::query_scalar("SELECT status FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(status, "failed");
    assert!(queue.drain().await.is_empty());
    queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_same_key_and_body_answer_the_same_task_and_re_send_it_while_queued(pool: PgPool) {
    let queue = TestQueue::new().await;
    let app = app(ctx_with(test_catalog(), pool.clone(), &queue.url).await);
    let (_, token) = new_session(&app).await;

    let body = json!({"input": {"text": "once", "n": 1}});
    let first = send(&app, create_with_key("echo", &token, "key-1", &body)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    // The same JSON with its keys in another order is the same request.
    let reordered = json!({"input": {"n": 1, "text": "once"}});
    let second = send(&app, create_with_key("echo", &token, "key-1", &reordered)).await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{}", second.body);
    assert_eq!(id_of(&second), id_of(&first));
    assert_eq!(second.headers["idempotent-replayed"], "true");
    assert_eq!(second.body["created_at"], first.body["created_at"]);
    assert_eq!(second.headers["location"], first.headers["location"]);
    assert_eq!(task_count(&pool).await, 1);
    // Its message may have been lost between the commit and the send, so a
    // replay of a task still queued sends it again (the worker runs it once).
    let messages = queue.drain().await;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages.iter().all(|m| m["task_id"] == first.body["id"]), "{messages:?}");

    // Same key, other input; same key, other kind.
    let other = send(&app, create_with_key("echo", &token, "key-1", &json!({"input": {"text": "twice"}}))).await;
    assert_eq!(other.status, StatusCode::CONFLICT, "{}", other.body);
    assert_eq!(other.code(), "idempotency_conflict");
    let other_kind = send(&app, create_with_key("shout", &token, "key-1", &body)).await;
    assert_eq!(other_kind.status, StatusCode::CONFLICT, "{}", other_kind.body);
    assert_eq!(other_kind.code(), "idempotency_conflict");

    // A key belongs to its space: another space may use the same one.
    let (_, token_b) = new_session(&app).await;
    let elsewhere = send(&app, create_with_key("echo", &token_b, "key-1", &body)).await;
    assert_eq!(elsewhere.status, StatusCode::ACCEPTED, "{}", elsewhere.body);
    assert_ne!(id_of(&elsewhere), id_of(&first));

    // Without a key, every request is a new task.
    let a = send(&app, create("echo", &token, &body)).await;
    let b = send(&app, create("echo", &token, &body)).await;
    assert_ne!(id_of(&a), id_of(&b));
    assert_eq!(task_count(&pool).await, 4);
    assert_eq!(queue.drain().await.len(), 3);
    queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_replay_answers_the_tasks_status_as_it_is_now(pool: PgPool) {
    let queue = TestQueue::new().await;
    let app = app(ctx_with(test_catalog(), pool.clone(), &queue.url).await);
    let (_, token) = new_session(&app).await;
    let body = json!({"input": {"text": "x"}});
    let first = send(&app, create_with_key("echo", &token, "k", &body)).await;
    sqlx::query("UPDATE tasks SET status = 'running' WHERE id = $1").bind(id_of(&first)).execute(&pool).await.unwrap();
    let again = send(&app, create_with_key("echo", &token, "k", &body)).await;
    assert_eq!(again.status, StatusCode::ACCEPTED);
    assert_eq!(again.body["status"], "running");
    assert_eq!(queue.drain().await.len(), 1);
    queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn concurrent_requests_with_one_key_make_one_task(pool: PgPool) {
    let queue = TestQueue::new().await;
    let app = app(ctx_with(test_catalog(), pool.clone(), &queue.url).await);
    let (_, token) = new_session(&app).await;
    let body = json!({"input": {"text": "race"}});

    let send_one = |app: Router| {
        let request = create_with_key("echo", &token, "race-key", &body);
        async move { send(&app, request).await }
    };
    let (a, b, c, d) =
        tokio::join!(send_one(app.clone()), send_one(app.clone()), send_one(app.clone()), send_one(app.clone()));
    let replies = [a, b, c, d];
    for r in &replies {
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    }
    let id = id_of(&replies[0]);
    assert!(replies.iter().all(|r| id_of(r) == id), "one task for every request");
    let fresh = replies.iter().filter(|r| r.headers.get("idempotent-replayed").is_none()).count();
    assert_eq!(fresh, 1, "exactly one request created the task");
    assert_eq!(task_count(&pool).await, 1);
    let messages = queue.drain().await;
    assert!((1..=4).contains(&messages.len()), "{messages:?}");
    assert!(messages.iter().all(|m| m["task_id"] == id.to_string()), "only that task is queued: {messages:?}");
    queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_domain_create_settles_a_key_race_on_the_unique_constraint(pool: PgPool) {
    // Below the HTTP pre-check: many concurrent inserts with one key.
    let space = reeve_shared::auth::SpaceIndex::from_array([9; 16]);
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space.as_bytes()).execute(&pool).await.unwrap();
    let input = json!({"text": "x"});
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let pool = pool.clone();
        let input = input.clone();
        set.spawn(async move {
            let new = tasks::TaskRequest { space: &space, kind: "echo", input: &input, idempotency_key: Some("k") };
            tasks::create(&pool, new).await.unwrap()
        });
    }
    let results = set.join_all().await;
    let new: Vec<_> = results.iter().filter(|r| matches!(r, tasks::Created::New(_))).collect();
    assert_eq!(new.len(), 1, "{results:?}");
    let ids: std::collections::HashSet<Id> = results
        .iter()
        .map(|r| match r {
            tasks::Created::New(t) | tasks::Created::Replayed(t) => t.id,
        })
        .collect();
    assert_eq!(ids.len(), 1);
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM task_events").fetch_one(&pool).await.unwrap();
    assert_eq!(events, 1);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_priced_task_without_payment_answers_the_x402_challenge(pool: PgPool) {
    let app = app(common::ctx(pool.clone()).await);
    let (_, token) = new_session(&app).await;
    let body = json!({"input": {"url": "https://example.com/a.txt"}});

    let mut request = create("fetch", &token, &body);
    request.headers_mut().insert("host", HeaderValue::from_static("api.example.com"));
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
    assert_eq!(reply.headers["content-type"], "application/json");
    assert!(reply.headers.get("x-request-id").is_some());
    assert!(reply.body.get("error").is_some_and(Value::is_string), "not an error envelope: {}", reply.body);

    let header = reply.headers["payment-required"].to_str().unwrap();
    let decoded: Value =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap();
    assert_eq!(decoded, reply.body, "the header and the body carry the same challenge");
    assert_eq!(reply.body["extensions"]["payment-identifier"]["info"]["required"], false);
    assert_eq!(reply.body["extensions"]["bazaar"]["info"]["input"]["method"], "POST");

    let catalog = common::shipped_catalog();
    let payments = catalog.payments.as_ref().unwrap();
    let c = &reply.body;
    assert_eq!(c["x402Version"], 2);
    assert_eq!(c["error"], "PAYMENT-SIGNATURE header is required");
    assert_eq!(c["resource"]["url"], "https://api.example.com/v1/tasks/fetch");
    assert_eq!(c["resource"]["description"], catalog.task("fetch").unwrap().title.as_str());
    assert_eq!(c["resource"]["mimeType"], "application/json");
    let accepts = c["accepts"].as_array().unwrap();
    assert_eq!(accepts.len(), 1);
    for (entry, asset_id) in accepts.iter().zip(["usdc-base-sepolia"]) {
        let asset = &catalog.assets[asset_id];
        assert_eq!(entry["scheme"], "exact");
        assert_eq!(entry["amount"], "10000");
        assert_eq!(entry["network"], asset.network.as_str());
        assert_eq!(entry["asset"], asset.contract.as_str());
        assert_eq!(entry["payTo"], payments.pay_to.as_str());
        assert_eq!(entry["maxTimeoutSeconds"], payments.max_timeout_seconds);
        assert_eq!(entry["extra"], json!({"name": asset.name, "version": asset.version}));
    }
    assert_eq!(task_count(&pool).await, 0, "nothing is stored before payment");

    // Without a Host, the URL is the path.
    let reply = send(&app, create("fetch", &token, &body)).await;
    assert_eq!(reply.body["resource"]["url"], "/v1/tasks/fetch");

    // A header that is not a payment: refused before anything is charged.
    let mut request = create("fetch", &token, &body);
    request.headers_mut().insert("payment-signature", HeaderValue::from_static("eyJ4NDAyVmVyc2lvbiI6Mn0="));
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.code(), "invalid_payment");
    assert_eq!(task_count(&pool).await, 0);

    // A bad input is refused before any payment is asked for.
    let reply = send(&app, create("fetch", &token, &json!({"input": {"url": "http://example.com"}}))).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reply.code(), "invalid_input");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_task_is_visible_to_its_space_only(pool: PgPool) {
    let queue = TestQueue::new().await;
    let app = app(ctx_with(test_catalog(), pool.clone(), &queue.url).await);
    let (_, token) = new_session(&app).await;
    let (_, other) = new_session(&app).await;
    let created = send(&app, create("echo", &token, &json!({"input": {"text": "mine"}}))).await;
    let id = id_of(&created);

    let own = send(&app, get_authed(&format!("/v1/tasks/{id}"), &token)).await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    let b = &own.body;
    assert_eq!(b["id"], id.to_string());
    assert_eq!(b["kind"], "echo");
    assert_eq!(b["status"], "queued");
    assert_eq!(b["progress"], 0.0);
    assert_eq!(b["result"], Value::Null);
    assert_eq!(b["error"], Value::Null);
    assert_eq!(b["attempts"], 0);
    assert_eq!(b["created_at"], created.body["created_at"]);
    assert!(b["updated_at"].is_string());
    let mut keys: Vec<&str> = b.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(b["cancel_requested_at"], Value::Null);
    assert_eq!(
        keys,
        [
            "attempts",
            "cancel_requested_at",
            "created_at",
            "error",
            "id",
            "kind",
            "progress",
            "result",
            "status",
            "updated_at"
        ]
    );

    let foreign = send(&app, get_authed(&format!("/v1/tasks/{id}"), &other)).await;
    let missing = send(&app, get_authed(&format!("/v1/tasks/{}", Id::new()), &token)).await;
    let malformed = send(&app, get_authed("/v1/tasks/not-an-id", &token)).await;
    for reply in [&foreign, &missing, &malformed] {
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
        assert_eq!(reply.code(), "task_not_found");
        assert_eq!(reply.body["error"]["message"], missing.body["error"]["message"]);
    }

    let anonymous = send(&app, common::get(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn bad_requests_get_stable_codes_and_store_nothing(pool: PgPool) {
    let ctx = common::ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (_, token) = new_session(&app).await;
    let (_, other) = new_session(&app).await;

    // Another space's upload, made through the API.
    let foreign = send(
        &app,
        post_json("/v1/uploads", Some(&other), &json!({"filename": "a.txt", "content_type": "text/plain", "size": 3})),
    )
    .await;
    assert_eq!(foreign.status, StatusCode::CREATED, "{}", foreign.body);
    let foreign_upload = foreign.body["upload_id"].as_str().unwrap().to_owned();

    let raw = |body: &str, content_type: &str, auth: Option<&str>| {
        let mut b = Request::post("/v1/tasks/digest").header("content-type", content_type);
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        b.body(Body::from(body.to_owned())).unwrap()
    };
    let bearer = format!("Bearer {token}");
    let with_key = |key: &[u8]| {
        let mut r = create("digest", &token, &json!({"input": {"upload_id": Id::new().to_string()}}));
        r.headers_mut().insert("idempotency-key", HeaderValue::from_bytes(key).unwrap());
        r
    };
    let mut two_keys = create("digest", &token, &json!({"input": {"upload_id": Id::new().to_string()}}));
    two_keys.headers_mut().append("idempotency-key", HeaderValue::from_static("a"));
    two_keys.headers_mut().append("idempotency-key", HeaderValue::from_static("b"));

    // (name, request, status, code, something the message must mention)
    type Case<'a> = (&'a str, Request<Body>, StatusCode, &'a str, Option<&'a str>);
    let cases: Vec<Case> = vec![
        ("no token", raw("{}", "application/json", None), StatusCode::UNAUTHORIZED, "missing_token", None),
        (
            "bad token",
            raw("{}", "application/json", Some("Bearer nope")),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            None,
        ),
        (
            "not JSON",
            raw("{\"input\":", "application/json", Some(&bearer)),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            None,
        ),
        (
            "wrong type",
            raw("{}", "text/plain", Some(&bearer)),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            None,
        ),
        ("no input", create("digest", &token, &json!({})), StatusCode::BAD_REQUEST, "invalid_request", Some("input")),
        (
            "input not an object",
            create("digest", &token, &json!({"input": [1]})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some("object"),
        ),
        (
            "input null",
            create("digest", &token, &json!({"input": null})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some("object"),
        ),
        (
            "extra field",
            create("digest", &token, &json!({"input": {}, "priority": 1})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some("priority"),
        ),
        (
            "schema: wrong type",
            create("digest", &token, &json!({"input": {"upload_id": 5}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            Some("/upload_id"),
        ),
        (
            "schema: missing field",
            create("digest", &token, &json!({"input": {}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            Some("upload_id"),
        ),
        (
            "schema: extra field",
            create("digest", &token, &json!({"input": {"upload_id": Id::new().to_string(), "more": 1}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            Some("more"),
        ),
        (
            // The shipped schema's pattern catches a malformed id first.
            "malformed upload id (pattern)",
            create("digest", &token, &json!({"input": {"upload_id": "nope"}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_input",
            Some("/upload_id"),
        ),
        (
            "unknown kind",
            create("nope", &token, &json!({"input": {}})),
            StatusCode::NOT_FOUND,
            "unknown_task",
            Some("/v1/catalog"),
        ),
        (
            "unknown upload",
            create("digest", &token, &json!({"input": {"upload_id": Id::new().to_string()}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_upload",
            Some("/upload_id"),
        ),
        (
            "another space's upload",
            create("digest", &token, &json!({"input": {"upload_id": foreign_upload}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_upload",
            Some(foreign_upload.as_str()),
        ),
        ("empty idempotency key", with_key(b""), StatusCode::BAD_REQUEST, "invalid_idempotency_key", None),
        ("long idempotency key", with_key(&[b'k'; 256]), StatusCode::BAD_REQUEST, "invalid_idempotency_key", None),
        ("tab in idempotency key", with_key(b"a\tb"), StatusCode::BAD_REQUEST, "invalid_idempotency_key", None),
        (
            "non-ASCII idempotency key",
            with_key("clé".as_bytes()),
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            None,
        ),
        ("two idempotency keys", two_keys, StatusCode::BAD_REQUEST, "invalid_idempotency_key", None),
    ];
    for (name, request, status, code, needle) in cases {
        let reply = send(&app, request).await;
        assert_eq!(reply.status, status, "{name}: {}", reply.body);
        assert_eq!(reply.code(), code, "{name}: {}", reply.body);
        assert!(!reply.body["error"]["request_id"].as_str().unwrap().is_empty(), "{name}");
        if let Some(needle) = needle {
            let message = reply.body["error"]["message"].as_str().unwrap();
            assert!(message.contains(needle), "{name}: {message:?} should mention {needle:?}");
        }
    }

    // The longest key allowed is fine (it fails later, on the unknown upload).
    let reply = send(&app, with_key(&[b'k'; 255])).await;
    assert_eq!(reply.code(), "unknown_upload");
    assert_eq!(task_count(&pool).await, 0);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn violations_are_listed_with_pointers_and_capped(pool: PgPool) {
    let catalog = String::from(
        r#"
        [tasks.many]
        title = "Many"
        description = "d"
        executor = "digest"
        [tasks.many.input_schema]
        type = "object"
        [tasks.many.input_schema.properties.xs]
        type = "array"
        items = { type = "integer" }
        [tasks.many.input_schema.properties.name]
        type = "string"
    "#,
    );
    let app = app(ctx_with(catalog, pool.clone(), "http://127.0.0.1:1/unused").await);
    let (_, token) = new_session(&app).await;

    let reply = send(&app, create("many", &token, &json!({"input": {"name": 1, "xs": [1, "a"]}}))).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("/name:"), "{message}");
    assert!(message.contains("/xs/1:"), "{message}");

    let xs: Vec<Value> = (0..25).map(|i| json!(format!("s{i}"))).collect();
    let reply = send(&app, create("many", &token, &json!({"input": {"xs": xs}}))).await;
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert_eq!(message.matches("/xs/").count(), 10, "{message}");
    assert!(message.contains("and 15 more"), "{message}");
    assert!(!message.contains("s24"), "values are masked: {message}");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn uploads_must_have_arrived_before_a_task_uses_them(pool: PgPool) {
    let queue = TestQueue::new().await;
    let ctx = ctx_with(test_catalog(), pool.clone(), &queue.url).await;
    let app = app(ctx.clone());
    let (_, token) = new_session(&app).await;

    let presign = |size: u64| {
        post_json(
            "/v1/uploads",
            Some(&token),
            &json!({"filename": "f.txt", "content_type": "text/plain", "size": size}),
        )
    };
    let good = send(&app, presign(3)).await;
    let bad = send(&app, presign(3)).await;
    assert_eq!(good.status, StatusCode::CREATED, "{}", good.body);
    let good_id = good.body["upload_id"].as_str().unwrap().to_owned();
    let bad_id = bad.body["upload_id"].as_str().unwrap().to_owned();

    // Nothing PUT yet.
    let reply = send(&app, create("bundle", &token, &json!({"input": {"upload_ids": [good_id]}}))).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", reply.body);
    assert_eq!(reply.code(), "upload_not_ready");
    assert!(reply.body["error"]["message"].as_str().unwrap().contains("/upload_ids/0"));

    let key_of = |id: &str| {
        let id: Id = id.parse().unwrap();
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT key FROM uploads WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let s3 = common::s3().await;
    let put = |key: String, body: &'static [u8]| {
        s3.put_object()
            .bucket(&ctx.settings.bucket)
            .key(key)
            .content_type("text/plain")
            .body(body.to_vec().into())
            .send()
    };
    put(key_of(&good_id).await, b"abc").await.unwrap();
    put(key_of(&bad_id).await, b"too long").await.unwrap();

    // The wrong size is rejected; a malformed id is refused like an unknown one.
    let reply = send(&app, create("bundle", &token, &json!({"input": {"upload_ids": [good_id, bad_id]}}))).await;
    assert_eq!(reply.code(), "upload_rejected", "{}", reply.body);
    assert!(reply.body["error"]["message"].as_str().unwrap().contains("/upload_ids/1"));
    let reply = send(&app, create("bundle", &token, &json!({"input": {"upload_ids": [good_id, "nope"]}}))).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reply.code(), "unknown_upload", "{}", reply.body);
    assert_eq!(task_count(&pool).await, 0);

    // The good one, named twice, is accepted (and marked uploaded).
    let reply = send(&app, create("bundle", &token, &json!({"input": {"upload_ids": [good_id, good_id]}}))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id: Id = good_id.parse().unwrap();
    let status: String =
        sqlx::query_scalar("SELECT status FROM uploads WHERE id = $1").bind(id).fetch_one(&pool).await.unwrap();
    assert_eq!(status, "uploaded");
    assert_eq!(queue.drain().await.len(), 1);

    // And the shipped digest task takes it too.
    let shipped = app_with_shipped(pool.clone(), &queue.url).await;
    let reply = send(&shipped, create("digest", &token, &json!({"input": {"upload_id": good_id}}))).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert_eq!(queue.drain().await, [json!({"task_id": reply.body["id"], "kind": "digest"})]);
    queue.delete().await;
}

async fn app_with_shipped(pool: PgPool, queue_url: &str) -> Router {
    app(common::api(&common::config(&pool).with(settings::QUEUE_URL, queue_url)).await)
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn append_event_numbers_events_without_gaps_under_concurrency(pool: PgPool) {
    let space = [3u8; 16];
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space).execute(&pool).await.unwrap();
    let id = Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input) VALUES ($1, $2, 'echo', '{}')")
        .bind(id)
        .bind(space)
        .execute(&pool)
        .await
        .unwrap();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..20 {
        let pool = pool.clone();
        set.spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let e = tasks::append_event(&mut tx, id, EventType::Progress, &json!({"i": i})).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            tx.commit().await.unwrap();
            e.seq
        });
    }
    let mut seqs = set.join_all().await;
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=20).collect::<Vec<i64>>());
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(tasks::events_after(&mut conn, id, 15).await.unwrap().len(), 5);

    let missing = tasks::append_event(&mut conn, Id::new(), EventType::Log, &json!({})).await;
    assert!(matches!(missing, Err(sqlx::Error::RowNotFound)), "{missing:?}");

    // mark_failed is conditional on the status it starts from.
    let error = tasks::task_error("boom", "it broke");
    assert!(tasks::mark_failed(&pool, id, &[tasks::TaskStatus::Running], &error).await.unwrap().is_none());
    let event = tasks::mark_failed(&pool, id, &[tasks::TaskStatus::Queued], &error).await.unwrap().unwrap();
    // The error event (21) comes first, then the status (22).
    assert_eq!(event.seq, 22);
    assert!(tasks::mark_failed(&pool, id, &[tasks::TaskStatus::Queued], &error).await.unwrap().is_none());
}

/// The development catalog with, on top, a kind priced on the local chain
/// and on Base mainnet, one priced on Base mainnet only, and a free one; its
/// facilitator `facilitator` (the local one lists eip155:84532 alone).
fn catalog_on(facilitator: &str) -> String {
    let dev = std::fs::read_to_string(common::DEV_CATALOG).unwrap();
    assert!(dev.contains("facilitator_url = \"http://127.0.0.1:4021\""));
    let dev = dev.replace("facilitator_url = \"http://127.0.0.1:4021\"", &format!("facilitator_url = {facilitator:?}"));
    let kinds = r#"
        [tasks.both]
        title = "Priced on both"
        executor = "digest"
        input_schema = { type = "object" }
        [[tasks.both.accepts]]
        asset = "usdc-base"
        amount = "10000"
        [[tasks.both.accepts]]
        asset = "usdc-base-sepolia"
        amount = "10000"

        [tasks.mainnet-only]
        title = "Priced on Base mainnet only"
        executor = "digest"
        input_schema = { type = "object" }
        [[tasks.mainnet-only.accepts]]
        asset = "usdc-base"
        amount = "10000"

        [tasks.free]
        title = "Free"
        executor = "digest"
        input_schema = { type = "object" }
    "#;
    format!("{dev}\n{}\n{kinds}", common::USDC_BASE)
}

/// A price in a network the facilitator does not list (its `GET
/// /supported`) can never settle: it is not offered, and a kind with no
/// other price answers 503 rather than a challenge nobody can pay (or
/// looking free). The facilitator is asked on the first priced request,
/// not when the context is built (a Lambda's init).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn prices_the_facilitator_does_not_settle_are_not_offered(pool: PgPool) {
    let queue = TestQueue::new().await;
    let local = std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into());
    let app = app(ctx_with(catalog_on(&local), pool.clone(), &queue.url).await);
    let (_, token) = new_session(&app).await;

    let both = send(&app, create("both", &token, &json!({"input": {}}))).await;
    assert_eq!(both.status, StatusCode::PAYMENT_REQUIRED, "{}", both.body);
    let offered: Vec<&str> =
        both.body["accepts"].as_array().unwrap().iter().map(|a| a["network"].as_str().unwrap()).collect();
    assert_eq!(offered, ["eip155:84532"], "eip155:8453 is not offered: the local facilitator cannot settle it");

    let mainnet = send(&app, create("mainnet-only", &token, &json!({"input": {}}))).await;
    assert_eq!(mainnet.status, StatusCode::SERVICE_UNAVAILABLE, "{}", mainnet.body);
    assert_eq!(mainnet.body["error"]["code"], "facilitator_unavailable");
    assert_eq!(task_count(&pool).await, 0, "nothing stored, and nothing taken for free");

    let free = send(&app, create("free", &token, &json!({"input": {}}))).await;
    assert_eq!(free.status, StatusCode::ACCEPTED, "{}", free.body);
    queue.delete().await;
}

/// A facilitator that cannot be asked neither blocks free tasks nor removes
/// a price: the challenge offers every price, and a payment then meets the
/// facilitator's own answer (or `facilitator_unavailable`).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_unreachable_facilitator_leaves_free_tasks_and_prices_alone(pool: PgPool) {
    let queue = TestQueue::new().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let app = app(ctx_with(catalog_on(&url), pool.clone(), &queue.url).await);
    let (_, token) = new_session(&app).await;

    let free = send(&app, create("free", &token, &json!({"input": {}}))).await;
    assert_eq!(free.status, StatusCode::ACCEPTED, "{}", free.body);
    let both = send(&app, create("both", &token, &json!({"input": {}}))).await;
    assert_eq!(both.status, StatusCode::PAYMENT_REQUIRED, "{}", both.body);
    assert_eq!(both.body["accepts"].as_array().unwrap().len(), 2, "without an answer, nothing is removed");
    queue.delete().await;
}
