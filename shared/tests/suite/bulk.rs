//! Bulk cancel by an owner (`POST /v1/tasks/cancel`, MCP `cancel_tasks`):
//! only the caller's Space is ever touched, a dry run changes nothing, ended
//! tasks are matched but skipped, and the route is never taken for a create
//! of a kind named `cancel`. Real Postgres, Redis and SQS; the router
//! in-process. (The operators' `reeve tasks cancel|rerun` are tested in
//! cli/tests/suite/tasks.rs, and a paid re-run in payments.rs.)

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::QueuedApi as Api;
use common::{Reply, post_json, send};
use reeve_shared::ids::Id;
use reeve_shared::settings;
use reeve_shared::tasks::{self, TaskStatus, events_after, task_error};
use reeve_shared::{mcp, startup};
use serde_json::{Value, json};
use sqlx::PgPool;
use tower::ServiceExt;

fn catalog() -> String {
    common::catalog_text_with(
        r#"
        [tasks.steps]
        title = "Steps"
        description = "A free kind no worker runs here."
        executor = "digest"
        input_schema = { type = "object" }
        quota = { per_hour = 100, at_once = 100 }

        [tasks.other]
        title = "Other"
        description = "A second free kind, for the filters."
        executor = "digest"
        input_schema = { type = "object" }
        quota = { per_hour = 100, at_once = 100 }
    "#,
    )
}

async fn bulk_cancel(api: &Api, token: &str, filter: Value) -> Reply {
    send(&api.app, post_json("/v1/tasks/cancel", Some(token), &filter)).await
}

async fn create_as(api: &Api, token: &str, kind: &str) -> Id {
    let created = send(&api.app, post_json(&format!("/v1/tasks/{kind}"), Some(token), &json!({"input": {}}))).await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
    created.body["id"].as_str().unwrap().parse().unwrap()
}

async fn status_of(pool: &PgPool, id: Id) -> String {
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

async fn event_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM task_events").fetch_one(pool).await.unwrap()
}

fn ids(body: &Value) -> Vec<Id> {
    let mut ids: Vec<Id> =
        body["task_ids"].as_array().unwrap().iter().map(|id| id.as_str().unwrap().parse().unwrap()).collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<Id>) -> Vec<Id> {
    ids.sort();
    ids
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_owner_cancels_by_filter_only_their_own_tasks_after_a_dry_run_that_changes_nothing(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let (_, theirs) = common::new_session(&api.app).await;
    let mine = [create_as(&api, &api.token, "steps").await, create_as(&api, &api.token, "steps").await];
    let ended = create_as(&api, &api.token, "steps").await;
    let error = task_error("internal", "the test failed it");
    tasks::mark_failed(&pool, ended, &[TaskStatus::Queued], &error).await.unwrap().expect("failed");
    let other_kind = create_as(&api, &api.token, "other").await;
    let foreign = [create_as(&api, &theirs, "steps").await, create_as(&api, &theirs, "steps").await];

    // A dry run says what would happen and changes nothing.
    let events_before = event_count(&pool).await;
    let dry = bulk_cancel(&api, &api.token, json!({"kind": "steps", "dry_run": true})).await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.body);
    assert_eq!(
        (
            &dry.body["matched"],
            &dry.body["canceled"],
            &dry.body["requested"],
            &dry.body["skipped"],
            &dry.body["dry_run"]
        ),
        (&json!(3), &json!(0), &json!(0), &json!(1), &json!(true)),
        "{}",
        dry.body
    );
    assert_eq!(ids(&dry.body), sorted(mine.to_vec()), "the queued ones, not the ended one");
    for id in mine.iter().chain(&foreign).chain([&other_kind]) {
        assert_eq!(status_of(&pool, *id).await, "queued", "a dry run changed {id}");
    }
    assert_eq!(event_count(&pool).await, events_before, "a dry run writes no event");

    // For real: the two queued ones; the ended one is matched but skipped.
    let done = bulk_cancel(&api, &api.token, json!({"kind": "steps", "status": ["queued", "failed"]})).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(
        (&done.body["matched"], &done.body["canceled"], &done.body["skipped"], &done.body["more"]),
        (&json!(3), &json!(2), &json!(1), &json!(false)),
        "{}",
        done.body
    );
    assert_eq!(ids(&done.body), sorted(mine.to_vec()));
    for id in mine {
        assert_eq!(status_of(&pool, id).await, "canceled");
        // The same events a single cancel writes.
        let mut conn = pool.acquire().await.unwrap();
        let last = events_after(&mut conn, id, 0).await.unwrap().pop().unwrap();
        assert_eq!(last.data, json!({"status": "canceled"}));
    }
    assert_eq!(status_of(&pool, ended).await, "failed", "an ended task is left as it is");
    assert_eq!(status_of(&pool, other_kind).await, "queued", "another kind is not matched");

    // Another Space's tasks: matched by kind in theirs, by id from mine,
    // never touched.
    for id in foreign {
        assert_eq!(status_of(&pool, id).await, "queued", "another Space's task was touched");
    }
    let by_id = bulk_cancel(&api, &api.token, json!({"ids": foreign})).await;
    assert_eq!(by_id.status, StatusCode::OK, "{}", by_id.body);
    assert_eq!((&by_id.body["matched"], &by_id.body["canceled"]), (&json!(0), &json!(0)), "{}", by_id.body);
    assert_eq!(by_id.body["task_ids"], json!([]));
    for id in foreign {
        assert_eq!(status_of(&pool, id).await, "queued", "another Space's task was touched by its id");
    }
    // Their owner can.
    let theirs_done = bulk_cancel(&api, &theirs, json!({"ids": foreign})).await;
    assert_eq!(theirs_done.body["canceled"], 2, "{}", theirs_done.body);
    api.queue.delete().await;
}

/// `POST /v1/tasks/cancel` is the bulk cancel, never a create of a kind
/// named `cancel` (which the catalog refuses: tests/catalog.rs); a filter
/// that names nothing, or too much, is refused before anything changes.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_bulk_cancel_refuses_a_filter_that_names_nothing_or_too_much(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let queued = api.create("steps", json!({})).await;
    let too_many: Vec<String> = (0..1001).map(|_| Id::new().to_string()).collect();
    for (case, body) in [
        ("nothing named", json!({})),
        ("only a dry run", json!({"dry_run": true})),
        ("a create's body", json!({"input": {}})),
        ("an unknown status", json!({"status": ["stuck"]})),
        ("not a time", json!({"created_after": "yesterday"})),
        ("an empty range", json!({"created_after": "2026-12-02T00:00:00Z", "created_before": "2026-12-01T00:00:00Z"})),
        ("1001 ids", json!({ "ids": too_many })),
        ("not an id", json!({"ids": ["nope"]})),
        ("a NUL in the kind", json!({"kind": "st\u{0}eps"})),
    ] {
        let reply = bulk_cancel(&api, &api.token, body).await;
        assert_eq!(
            (reply.status, reply.code()),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{case}: {}",
            reply.body
        );
    }
    let anonymous = Request::post("/v1/tasks/cancel")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"kind":"steps"}"#))
        .unwrap();
    assert_eq!(send(&api.app, anonymous).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(status_of(&pool, queued).await, "queued", "nothing changed");
    api.queue.delete().await;
}

/// MCP's `cancel_tasks` is the same operation, with the same answer.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_cancel_tasks_tool_cancels_by_filter_in_the_caller_s_space(pool: PgPool) {
    let api = Api::new(&pool, &catalog()).await;
    let (_, theirs) = common::new_session(&api.app).await;
    let mine = create_as(&api, &api.token, "steps").await;
    let foreign = create_as(&api, &theirs, "steps").await;
    let config = common::with_catalog(common::config(&pool), &catalog())
        .with(settings::QUEUE_URL, &api.queue.url)
        .with(settings::MCP_ALLOWED_HOSTS, "*");
    let router = mcp::router(startup::mcp(&config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}")));
    let call = |arguments: Value| {
        let body = json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {
                "name": "cancel_tasks", "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "bulk-test", "version": "1.0.0"},
                    "io.modelcontextprotocol/clientCapabilities": {}
                }
            }
        });
        Request::post(mcp::PATH)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {}", api.token))
            .header("host", "mcp.example")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "cancel_tasks")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let answer = |response: axum::response::Response| async move {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}"));
        body["result"].clone()
    };

    let dry = answer(router.clone().oneshot(call(json!({"kind": "steps", "dry_run": true}))).await.unwrap()).await;
    assert_eq!(dry["structuredContent"]["task_ids"], json!([mine]), "{dry}");
    assert_eq!(status_of(&pool, mine).await, "queued");

    let done = answer(router.clone().oneshot(call(json!({"kind": "steps"}))).await.unwrap()).await;
    let content = &done["structuredContent"];
    assert_eq!(
        (&content["matched"], &content["canceled"], &content["skipped"]),
        (&json!(1), &json!(1), &json!(0)),
        "{done}"
    );
    assert_eq!(status_of(&pool, mine).await, "canceled");
    assert_eq!(status_of(&pool, foreign).await, "queued", "another Space's task was touched");

    let refused = answer(router.clone().oneshot(call(json!({}))).await.unwrap()).await;
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(refused["structuredContent"]["error"]["code"], "invalid_arguments", "{refused}");
    api.queue.delete().await;
}
