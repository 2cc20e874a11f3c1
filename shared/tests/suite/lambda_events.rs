//! The sample events in `events/` go through the same path as in Lambda:
//! lambda_http parses the API Gateway HTTP API (v2) payload into an
//! `http::Request`, the function's router answers it, and lambda_http turns
//! the answer back into what API Gateway receives. Each event's expected
//! status and error code is listed in [`EXPECTED`].

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use axum::Router;
use axum::http::StatusCode;
use lambda_http::{Body as LambdaBody, IntoResponse as _};
use reeve_shared::http::{self, Ctx};
use serde_json::Value;
use sqlx::PgPool;
use tower::ServiceExt;

/// The crates under `functions/` that run `lambda_http`, with the router their
/// `main.rs` runs; [`app_of`] builds the same.
const HTTP_FUNCTIONS: &[(&str, &str)] = &[
    ("auth", "http::auth_app(ctx)"),
    ("catalog", "http::catalog_app(ctx)"),
    ("presign", "http::presign_app(ctx)"),
    ("task-create", "http::task_create_app(ctx)"),
    ("task-status", "http::task_status_app(ctx)"),
    ("mcp", "mcp::router(ctx)"),
];

/// The app each HTTP function runs (as in its `main.rs`).
fn app_of(function: &str, ctx: Ctx) -> Option<Router> {
    Some(match function {
        "auth" => http::auth_app(ctx.auth.clone()),
        "catalog" => http::catalog_app(ctx.catalog_ctx.clone()),
        "presign" => http::presign_app(ctx.uploads.clone()),
        "task-create" => http::task_create_app(ctx.task_create.clone()),
        "task-status" => http::task_status_app(ctx.task_status.clone()),
        // Any Host, as the template's default McpAllowedHosts (`*`) says.
        "mcp" => reeve_shared::mcp::router(reeve_shared::startup::mcp_beside(
            &ctx,
            reeve_shared::mcp::McpSettings { allowed_hosts: vec![], allowed_origins: vec![], progress: false },
        )),
        _ => return None,
    })
}

/// What each event file must answer, from its function's router:
/// `(file stem, status, error code)`.
const EXPECTED: &[(&str, u16, Option<&str>)] = &[
    ("auth-create-space", 201, None),
    // No space has that id.
    ("auth-open-session", 401, Some("invalid_space")),
    // A file cannot carry a live token: the dummy one is refused.
    ("auth-rotate-space", 401, Some("invalid_token")),
    ("catalog", 200, None),
    // A file cannot carry a live token: the dummy one is refused.
    ("presign", 401, Some("invalid_token")),
    ("task-create", 401, Some("invalid_token")),
    ("task-status", 401, Some("invalid_token")),
    ("task-status-list", 401, Some("invalid_token")),
    ("task-status-cancel", 401, Some("invalid_token")),
    // JSON-RPC: `initialize`, then `tools/list` on its own (the endpoint is stateless).
    ("mcp-initialize", 200, None),
    ("mcp-tools-list", 200, None),
    // MCP 2026-07-28, declaring the tasks extension: a kind's tool called as a
    // task, then the task read and canceled. The dummy token makes the first a
    // tool error (`invalid_token`) and the other two JSON-RPC errors; the
    // whole flow, with live values, is mcp.rs's Lambda test.
    ("mcp-tools-call-task", 200, None),
    ("mcp-tasks-get", 200, None),
    ("mcp-tasks-cancel", 200, None),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The stems of the HTTP event files (SQS and S3 events belong to other functions).
fn http_events() -> Vec<String> {
    let mut stems: Vec<String> = fs::read_dir(root().join("events"))
        .expect("events/ exists")
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter_map(|name| name.strip_suffix(".json").map(str::to_owned))
        // The sweeper's events are a schedule and an SQS batch, not HTTP.
        .filter(|stem| !stem.starts_with("sqs-") && !stem.starts_with("s3-") && !stem.starts_with("sweeper"))
        .collect();
    stems.sort();
    stems
}

/// Crates under `functions/` whose `main` runs `lambda_http`.
fn http_functions() -> BTreeSet<String> {
    fs::read_dir(root().join("functions"))
        .expect("functions/ exists")
        .map(|entry| entry.unwrap().path())
        .filter(|dir| fs::read_to_string(dir.join("src/main.rs")).is_ok_and(|main| main.contains("lambda_http::run")))
        .map(|dir| dir.file_name().unwrap().to_str().unwrap().to_owned())
        .collect()
}

/// An event file belongs to the function its name starts with:
/// `auth-open-session` → `auth`, `task-create` → `task-create`.
fn function_of(stem: &str, functions: &BTreeSet<String>) -> Option<String> {
    functions
        .iter()
        .filter(|f| stem == f.as_str() || stem.starts_with(&format!("{f}-")))
        .max_by_key(|f| f.len())
        .cloned()
}

#[test]
fn every_http_function_has_an_event_and_every_event_a_function() {
    let functions = http_functions();
    let known: BTreeSet<String> = HTTP_FUNCTIONS.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(functions, known, "functions/ and HTTP_FUNCTIONS (and app_of) disagree");
    for (function, router) in HTTP_FUNCTIONS {
        let main = fs::read_to_string(root().join(format!("functions/{function}/src/main.rs"))).unwrap();
        assert!(main.contains(&format!("lambda_http::run({router})")), "functions/{function} does not run {router}");
    }
    let events = http_events();
    for function in &functions {
        assert!(
            events.iter().any(|stem| function_of(stem, &functions).as_deref() == Some(function)),
            "functions/{function} has no event in events/ (name one `{function}.json` or `{function}-….json`)"
        );
    }
    for stem in &events {
        assert!(function_of(stem, &functions).is_some(), "events/{stem}.json names no function in functions/");
        assert!(EXPECTED.iter().any(|(s, ..)| s == stem), "events/{stem}.json has no expectation in EXPECTED");
    }
}

/// The answer as API Gateway would get it from lambda_http.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) content_type: String,
    pub(crate) body: Value,
    /// `Retry-After`, in seconds, when there is one.
    pub(crate) retry_after: Option<u64>,
}

async fn invoke(function: &str, event: &str, ctx: Ctx) -> Answer {
    let app = app_of(function, ctx).unwrap_or_else(|| panic!("app_of has no arm for {function}"));
    through_lambda(app, event).await
}

/// `event` (an API Gateway HTTP API payload) answered by `app` as in Lambda.
pub(crate) async fn through_lambda(app: Router, event: &str) -> Answer {
    let request = lambda_http::request::from_str(event).expect("a valid API Gateway event");
    // `lambda_http::run` hands the router exactly this request type.
    let request = request.map(axum::body::Body::new);
    let response = app.oneshot(request).await.expect("routers are infallible");
    let response = response.into_response().await;
    let status = response.status();
    let content_type =
        response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().parse().unwrap());
    let body = match response.into_body() {
        // JSON must reach API Gateway as text, not base64.
        LambdaBody::Text(text) => serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        LambdaBody::Empty => Value::Null,
        LambdaBody::Binary(bytes) => panic!("binary body ({} bytes) for {content_type}", bytes.len()),
        other => panic!("unexpected body {other:?}"),
    };
    Answer { status, content_type, body, retry_after }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn every_event_gets_its_expected_answer(pool: PgPool) {
    let ctx = common::ctx(pool).await;
    let functions = http_functions();
    let mut failures = Vec::new();
    for stem in http_events() {
        let Some(&(_, status, code)) = EXPECTED.iter().find(|(s, ..)| *s == stem) else {
            failures.push(format!("{stem}: no expectation"));
            continue;
        };
        let function = function_of(&stem, &functions).unwrap_or_else(|| panic!("{stem}: no function"));
        let event = fs::read_to_string(root().join(format!("events/{stem}.json"))).unwrap();
        let answer = invoke(&function, &event, ctx.clone()).await;
        let got_code = answer.body["error"]["code"].as_str();
        if answer.status.as_u16() != status || got_code != code {
            let body: String = answer.body.to_string().chars().take(300).collect();
            failures.push(format!("{stem} ({function}): expected {status} {code:?}, got {} {body}", answer.status));
            continue;
        }
        if !answer.content_type.starts_with("application/json") {
            failures.push(format!("{stem}: content-type {:?}", answer.content_type));
        }
        if stem == "auth-create-space" {
            let id = answer.body["space_id"].as_str().unwrap_or_default();
            if id.len() != 20 || !id.bytes().all(|b| b.is_ascii_digit()) {
                failures.push(format!("{stem}: space_id is not 20 digits: {}", answer.body));
            }
        }
        if stem == "mcp-initialize" && answer.body["result"]["serverInfo"]["name"] != "reeve" {
            failures.push(format!("{stem}: not an initialize result: {}", answer.body));
        }
        let tools = answer.body["result"]["tools"].as_array();
        if stem == "mcp-tools-list" && !tools.is_some_and(|t| t.iter().any(|t| t["name"] == "digest")) {
            failures.push(format!("{stem}: no digest tool in {}", answer.body));
        }
        let tasks = answer.body["tasks"].as_array();
        if stem == "catalog" && !tasks.is_some_and(|t| t.iter().any(|t| t["kind"] == "digest")) {
            failures.push(format!("{stem}: no digest task in {}", answer.body));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
