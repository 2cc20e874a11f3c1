//! CORS for browser clients, through the router `reeve serve` listens with:
//! real preflight requests and real cross-origin answers, for the API and
//! the relay's stream alike.

use crate::common;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use common::{new_session, post_json, send};
use reeve_shared::http::stream;
use reeve_shared::http::{CorsOrigins, app, with_cors};
use reeve_shared::settings::{self, Config};
use reeve_shared::startup;
use serde_json::json;
use sqlx::PgPool;

const PAGE: &str = "http://127.0.0.1:8080";
const ELSEWHERE: &str = "https://evil.example";

/// The API and the relay as `reeve serve` listens with them, answering
/// `origins` (`REEVE_CORS_ORIGINS`).
async fn serve_app(pool: PgPool, origins: &str) -> Router {
    let config = common::config(&pool).with(settings::CORS_ORIGINS, origins);
    let ctx = common::api(&config).await;
    let relay = startup::relay(&config).unwrap_or_else(|e| panic!("{e}"));
    with_cors(stream::routes(relay.ctx).merge(app(ctx)), &relay.cors)
}

fn preflight(uri: &str, origin: &str, method: &str, headers: &str) -> Request<Body> {
    Request::options(uri)
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header("access-control-request-headers", headers)
        .body(Body::empty())
        .unwrap()
}

fn list(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.to_str().unwrap().split(',').map(|s| s.trim().to_ascii_lowercase()).collect::<Vec<_>>())
        .collect()
}

fn with_origin(mut request: Request<Body>, origin: &str) -> Request<Body> {
    request.headers_mut().insert("origin", origin.parse().unwrap());
    request
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_allowed_origin_passes_preflight_for_every_kind_of_call(pool: PgPool) {
    let app = serve_app(pool, &format!("{PAGE}, http://localhost:8080")).await;
    let calls = [
        ("/v1/spaces", "POST", "content-type"),
        ("/v1/uploads", "POST", "authorization,content-type"),
        ("/v1/tasks/digest", "POST", "authorization,content-type,idempotency-key"),
        ("/v1/tasks/fetch", "POST", "authorization,content-type,payment-signature"),
        ("/v1/tasks/01HZX3Y4P5Q6R7S8T9V0W1X2Y3", "GET", "authorization"),
        ("/v1/tasks/01HZX3Y4P5Q6R7S8T9V0W1X2Y3/events", "GET", "authorization,last-event-id"),
    ];
    for origin in [PAGE, "http://localhost:8080"] {
        for (uri, method, headers) in calls {
            let reply = send(&app, preflight(uri, origin, method, headers)).await;
            assert!(reply.status.is_success(), "preflight {method} {uri}: {}", reply.status);
            assert_eq!(reply.headers["access-control-allow-origin"], origin, "{uri}");
            assert!(list(&reply.headers, "access-control-allow-methods").contains(&method.to_ascii_lowercase()));
            let allowed = list(&reply.headers, "access-control-allow-headers");
            for h in headers.split(',') {
                assert!(allowed.contains(&h.to_owned()), "{uri}: {h} not allowed: {allowed:?}");
            }
            assert_eq!(reply.headers["access-control-max-age"], "600");
            assert!(list(&reply.headers, "vary").contains(&"origin".to_owned()), "caches keep origins apart");
        }
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn another_origin_gets_no_permission(pool: PgPool) {
    let app = serve_app(pool, PAGE).await;
    for origin in [ELSEWHERE, "http://127.0.0.1:8081", "https://127.0.0.1:8080", "null"] {
        let reply = send(&app, preflight("/v1/uploads", origin, "POST", "authorization,content-type")).await;
        assert!(reply.headers.get("access-control-allow-origin").is_none(), "{origin}: {:?}", reply.headers);
        let reply = send(&app, with_origin(Request::post("/v1/spaces").body(Body::empty()).unwrap(), origin)).await;
        // Without an allow-origin the browser hides the whole answer from
        // the page, whatever else is listed.
        assert!(reply.headers.get("access-control-allow-origin").is_none(), "{origin}");
        assert_eq!(reply.status, StatusCode::CREATED, "CORS is the browser's rule; the server still answers");
    }
}

/// A page reads what it needs from an answer: the x402 challenge, the
/// request id an error names, where a created task lives, when to retry.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn answers_expose_the_headers_a_page_reads_errors_included(pool: PgPool) {
    let app = serve_app(pool, PAGE).await;
    let (_, token) = new_session(&app).await;
    let must_expose = ["payment-required", "payment-response", "x-request-id", "location", "retry-after"];

    let challenge = send(
        &app,
        with_origin(
            post_json("/v1/tasks/fetch", Some(&token), &json!({"input": {"url": "https://example.com/"}})),
            PAGE,
        ),
    )
    .await;
    assert_eq!(challenge.status, StatusCode::PAYMENT_REQUIRED);
    let unauthorized = send(&app, with_origin(post_json("/v1/uploads", None, &json!({})), PAGE)).await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);
    let no_route = send(&app, with_origin(Request::get("/nope").body(Body::empty()).unwrap(), PAGE)).await;
    assert_eq!(no_route.status, StatusCode::NOT_FOUND);
    let stream_refused = send(
        &app,
        with_origin(Request::get("/v1/tasks/01HZX3Y4P5Q6R7S8T9V0W1X2Y3/events").body(Body::empty()).unwrap(), PAGE),
    )
    .await;
    assert_eq!(stream_refused.status, StatusCode::UNAUTHORIZED);

    for (what, reply) in
        [("402", &challenge), ("401", &unauthorized), ("404", &no_route), ("relay 401", &stream_refused)]
    {
        assert_eq!(reply.headers["access-control-allow-origin"], PAGE, "{what}");
        let exposed = list(&reply.headers, "access-control-expose-headers");
        for h in must_expose {
            assert!(exposed.contains(&h.to_owned()), "{what}: {h} is not exposed: {exposed:?}");
        }
        assert!(reply.headers.get("access-control-allow-credentials").is_none(), "tokens, not cookies");
    }
    assert!(challenge.headers.contains_key("payment-required"));
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn with_no_origins_no_cors_header_is_ever_sent(pool: PgPool) {
    let app = serve_app(pool, "").await;
    let reply = send(&app, preflight("/v1/uploads", PAGE, "POST", "authorization")).await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "no preflight is answered");
    assert!(reply.headers.keys().all(|k| !k.as_str().starts_with("access-control-")), "{:?}", reply.headers);
    let reply = send(&app, with_origin(Request::post("/v1/spaces").body(Body::empty()).unwrap(), PAGE)).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert!(reply.headers.keys().all(|k| !k.as_str().starts_with("access-control-")), "{:?}", reply.headers);
}

/// `REEVE_CORS_ORIGINS` as start-up reads it: the origins, or every problem.
fn read(value: Option<&str>) -> Result<CorsOrigins, String> {
    let config = value.map_or_else(Config::default, |v| Config::from_vars([("REEVE_CORS_ORIGINS", v)]));
    let mut env = config.env();
    let origins = settings::cors_origins(&mut env);
    let problems = env.take_problems();
    if problems.is_empty() { Ok(origins) } else { Err(problems.join("\n")) }
}

#[test]
fn reeve_cors_origins_is_a_list_of_exact_origins() {
    assert!(read(None).unwrap().is_empty(), "unset: none, the production default");
    assert!(read(Some(" , ")).unwrap().is_empty());
    let two = read(Some("http://127.0.0.1:8080, https://console.example.com")).unwrap();
    assert_eq!(two, CorsOrigins::parse("http://127.0.0.1:8080,https://console.example.com").unwrap());
    assert!(!two.is_empty());

    let err = read(Some("*, https://ok.example, ftp://x.example, https://a.example/, https://A.example, nohost"))
        .unwrap_err();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 5, "every bad origin, each once: {err}");
    assert!(lines.iter().all(|l| l.starts_with("REEVE_CORS_ORIGINS: ")), "{err}");
    for bad in ["\"*\"", "\"ftp://x.example\"", "\"https://a.example/\"", "\"https://A.example\"", "\"nohost\""] {
        assert!(err.contains(bad), "{bad} is reported: {err}");
    }
    assert!(!err.contains("ok.example"), "{err}");
}
