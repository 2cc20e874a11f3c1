//! Property tests (proptest): hostile input never panics and never gets a
//! 500. Bounded for CI: `PROPTEST_CASES` (default 256 per property here)
//! sets the count; the longer documented run is in RELIABILITY.md.
//!
//! Covered: `reeve.toml` parsing and validation, session tokens, SQS bodies,
//! request JSON for every route with any `PAYMENT-SIGNATURE` (x402) and
//! `Idempotency-Key` header, `Last-Event-ID`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{ctx, new_session, send};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use reeve_shared::auth::{self, Secret, SpaceIndex};
use reeve_shared::catalog::{Catalog, CatalogError};
use reeve_shared::http::app;
use reeve_shared::http::stream::router as relay_router;
use reeve_shared::ids::Id;
use reeve_shared::tasks::{EventType, QueueMessage, append_event};
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;
use ulid::Ulid;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: cases(), ..ProptestConfig::default() }
}

fn shipped() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../reeve.toml")).unwrap()
}

/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        "[0-9A-Z]{26}".prop_map(Value::from),
        "[0-9]{20}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("input".to_owned()),
                    Just("space_id".to_owned()),
                    Just("upload_id".to_owned()),
                    Just("url".to_owned()),
                    Just("size".to_owned()),
                    Just("content_type".to_owned()),
                    Just("filename".to_owned()),
                    ".{0,12}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Random values from `strategy`, for the async properties (which run
/// inside one `sqlx::test` rather than under proptest's sync runner).
fn samples<S: Strategy>(strategy: S, n: u32) -> Vec<S::Value> {
    let mut runner = TestRunner::default();
    (0..n).map(|_| strategy.new_tree(&mut runner).unwrap().current()).collect()
}

/// Whether a catalog error says where a reader must go: a syntax error's
/// line and column within the text (the line one past the end for an
/// unexpected end) with a one-line message, or problems each naming a TOML
/// path with a one-line message.
fn says_where(error: &CatalogError, text: &str) -> bool {
    let one_line = |m: &str| !m.trim().is_empty() && !m.contains('\n');
    match error {
        CatalogError::Syntax { line, column, message, .. } => {
            *line >= 1 && *line <= text.split('\n').count() + 1 && *column >= 1 && one_line(message)
        }
        CatalogError::Invalid { problems, .. } => {
            !problems.is_empty() && problems.iter().all(|p| !p.path.is_empty() && one_line(&p.message))
        }
        CatalogError::Read { .. } => false,
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_text_as_reeve_toml_is_a_catalog_or_an_error_naming_where(text in ".{0,400}") {
        if let Err(error) = Catalog::parse(&text) {
            prop_assert!(says_where(&error, &text), "{error:?}");
        }
    }

    #[test]
    fn the_shipped_catalog_with_a_line_changed_never_panics(
        line in 0usize..200,
        replacement in prop_oneof![
            Just(String::new()),
            "[a-z_]{1,12} = [0-9]{1,25}",
            "[a-z_]{1,12} = \"[^\"]{0,20}\"",
            "\\[tasks\\.[a-z]{1,5}\\]",
            "\\[\\[tasks\\.[a-z]{1,5}\\.accepts\\]\\]",
            "timeout_seconds = -?[0-9]{1,12}",
            "amount_usd = \"-?[0-9]{0,6}\\.?[0-9]{0,8}\"",
            "input_schema = \\{ type = \"[a-z]{1,8}\" \\}",
        ],
    ) {
        let text = shipped();
        let mut lines: Vec<&str> = text.lines().collect();
        let at = line % lines.len();
        lines[at] = &replacement;
        let changed = lines.join("\n");
        if let Err(error) = Catalog::parse(&changed) {
            prop_assert!(says_where(&error, &changed), "{error:?}");
            // A syntax error is found at the changed line or after it, never
            // in the untouched lines before it.
            if let CatalogError::Syntax { line, .. } = error {
                prop_assert!(line > at, "line {} changed, error at line {line}", at + 1);
            }
        }
    }

    #[test]
    fn a_session_token_verifies_only_unchanged(
        junk in ".{0,120}",
        flip in 0usize..200,
        bit in 0u8..8,
    ) {
        let key = Secret::new("REEVE_TOKEN_KEY", b"fuzz-token-key-fuzz-token-key-fuzz!!".to_vec()).unwrap();
        let now = OffsetDateTime::now_utc();
        prop_assert!(auth::verify_token(&key, &junk, now).is_err());
        let (token, _) = auth::issue_token(&key, &SpaceIndex::from_array([5; 16]), now);
        let mut bytes = token.clone().into_bytes();
        let at = flip % bytes.len();
        bytes[at] ^= 1 << bit;
        if let Ok(changed) = String::from_utf8(bytes)
            && changed != token
        {
            prop_assert!(auth::verify_token(&key, &changed, now).is_err(), "{changed}");
        }
    }

    #[test]
    fn an_sqs_body_parses_only_as_what_it_says(body in prop_oneof![
        ".{0,80}",
        json_value().prop_map(|v| v.to_string()),
        ("[0-9A-Za-z]{0,30}", ".{0,10}").prop_map(|(id, kind)| json!({"task_id": id, "kind": kind}).to_string()),
        // A real id in serde's sequence form, which names no task_id.
        (any::<u128>(), ".{0,10}").prop_map(|(id, kind)| json!([Id::from(Ulid(id)), kind]).to_string()),
    ]) {
        // What parses is an object whose task_id is that id's text: the
        // worker never runs a task the body did not name.
        if let Ok(message) = serde_json::from_str::<QueueMessage>(&body) {
            let value: Value = serde_json::from_str(&body).unwrap();
            let id = message.task_id.to_string();
            prop_assert_eq!(value["task_id"].as_str(), Some(id.as_str()));
            prop_assert_eq!(value["kind"].as_str(), Some(message.kind.as_str()));
        }
    }

    #[test]
    fn every_queued_message_reads_back_as_sent(id in any::<u128>(), kind in ".{0,20}") {
        let sent = QueueMessage { task_id: Id::from(Ulid(id)), kind };
        let read: QueueMessage = serde_json::from_str(&serde_json::to_string(&sent).unwrap()).unwrap();
        prop_assert_eq!(read, sent);
    }
}

/// Every route gets hostile JSON bodies and headers: the answer is never a
/// 500, and every error is the envelope.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn every_route_answers_hostile_json_with_a_4xx_envelope(pool: PgPool) {
    let app = app(ctx(pool).await);
    let (_, token) = new_session(&app).await;
    let routes = ["/v1/spaces", "/v1/sessions", "/v1/uploads", "/v1/tasks/digest", "/v1/tasks/fetch", "/v1/tasks/nope"];
    let bodies = samples(json_value(), cases());
    let headers = samples("[ -~]{0,120}", cases());
    for (i, (body, header)) in bodies.iter().zip(&headers).enumerate() {
        let uri = routes[i % routes.len()];
        let mut request = Request::post(uri)
            .header("content-type", "application/json")
            .header("payment-signature", header.as_str())
            .header("idempotency-key", header.as_str());
        if i % 3 != 0 {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let Ok(request) = request.body(Body::from(body.to_string())) else { continue };
        let reply = send(&app, request).await;
        assert!(reply.status != StatusCode::INTERNAL_SERVER_ERROR, "{uri} {body}: {}", reply.body);
        if reply.status.as_u16() >= 400 {
            assert!(reply.body["error"]["code"].is_string(), "{uri} {body}: not an envelope: {}", reply.body);
        }
        // A task id of any shape in the status route.
        let id = body.as_str().unwrap_or("01JNVX5C7D9F1H3K5M7P9R1T3V");
        let Ok(get) = Request::get(format!("/v1/tasks/{}", urlish(id)))
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
        else {
            continue;
        };
        let reply = send(&app, get).await;
        assert!(matches!(reply.status.as_u16(), 400 | 404), "{id}: {} {}", reply.status, reply.body);
    }
}

/// Keeps only what may appear in a path segment.
fn urlish(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric() || "-._~".contains(*c)).collect()
}

/// `Last-Event-ID` (header) and `last_event_id` (query) of any shape: a
/// clear 400, or the stream; never a panic.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn last_event_id_of_any_shape_is_a_clear_answer(pool: PgPool) {
    let ctx = common::relay(&common::config(&pool));
    let key = ctx.token_key.clone();
    let space = [6u8; 16];
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space).execute(&pool).await.unwrap();
    let task = reeve_shared::ids::Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input, status) VALUES ($1, $2, 'digest', '{}', 'completed')")
        .bind(task)
        .bind(space)
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for status in ["running", "completed"] {
        append_event(&mut conn, task, EventType::Status, &json!({ "status": status })).await.unwrap();
    }
    drop(conn);
    let relay = relay_router(ctx);
    let (token, _) = auth::issue_token(&key, &SpaceIndex::from_array(space), OffsetDateTime::now_utc());
    let values = samples(
        prop_oneof!["[ -~]{0,40}", "-?[0-9]{1,30}", Just("18446744073709551616".to_owned()), Just(" 1".to_owned())],
        cases(),
    );
    for value in values {
        let Ok(request) = Request::get(format!("/v1/tasks/{task}/events"))
            .header("authorization", format!("Bearer {token}"))
            .header("last-event-id", value.as_str())
            .body(Body::empty())
        else {
            continue;
        };
        // The task is finished, so a good resume point ends the stream at once.
        let reply = tokio::time::timeout(Duration::from_secs(10), async {
            use tower::ServiceExt;
            let response = relay.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            (status, bytes)
        })
        .await
        .expect("the stream of a finished task ends");
        assert!(matches!(reply.0.as_u16(), 200 | 400), "{value:?}: {}", reply.0);
        if reply.0 == StatusCode::BAD_REQUEST {
            let body: Value = serde_json::from_slice(&reply.1).unwrap();
            assert_eq!(body["error"]["code"], "invalid_last_event_id", "{value:?}");
        }
    }
}
