//! `GET /v1/openapi.json`: the OpenAPI 3.1 document lists exactly the routes
//! the routers serve (the relay's stream included), each with its security
//! and error responses; it is made from the catalog it is served with (one
//! create operation per task kind, with that kind's input schema); and the
//! answers of the real routes conform to it.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::{Reply, TestQueue, get, get_authed, new_session, post_json, send};
use reeve_shared::catalog::Catalog;
use reeve_shared::http::stream;
use reeve_shared::http::{self, BEARER, Ctx, PAY_LINK, SHARE, STREAM_PATH, TICKET, app, openapi};
use reeve_shared::ids::Id;
use reeve_shared::settings;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tower::ServiceExt;

/// Every route of the API: one create per kind of the shipped catalog, and
/// the relay's stream. Adding one means adding it here too.
const ROUTES: [(&str, &str); 32] = [
    ("GET", "/healthz"),
    ("GET", "/v1/catalog"),
    ("GET", "/v1/openapi.json"),
    ("POST", "/v1/spaces"),
    ("POST", "/v1/sessions"),
    ("DELETE", "/v1/sessions/current"),
    ("POST", "/v1/space/rotate"),
    ("POST", "/v1/uploads"),
    ("POST", "/v1/tasks/digest"),
    ("POST", "/v1/tasks/fetch"),
    ("POST", "/v1/tasks/fetch-metered"),
    ("POST", "/v1/tasks/http"),
    ("POST", "/v1/tasks/wordfreq"),
    ("POST", "/v1/tasks/wordfreq-metered"),
    ("GET", "/v1/tasks/{task}"),
    ("GET", "/v1/tasks"),
    ("POST", "/v1/tasks/{task}/cancel"),
    ("POST", "/v1/tasks/cancel"),
    ("POST", "/v1/tasks/{task}/ticket"),
    ("POST", "/v1/tasks/{task}/share"),
    ("GET", "/v1/tasks/{task}/receipt"),
    ("GET", "/v1/space"),
    ("POST", "/v1/space/webhook-secret"),
    ("GET", "/v1/space/webhook"),
    ("PUT", "/v1/space/webhook"),
    ("DELETE", "/v1/space/webhook"),
    ("GET", "/v1/tasks/{task}/webhooks"),
    ("GET", "/v1/tasks/{task}/events"),
    ("POST", "/v1/executor/reports"),
    ("GET", "/v1/pay-link"),
    ("POST", "/v1/pay-link"),
    ("GET", REFUND_ROUTE.1),
];

/// A batch-settlement channel's cooperative refund: the payer's signature
/// is its credential.
const REFUND_ROUTE: (&str, &str) = ("GET", "/v1/refund/{kind}");

/// The route that takes a job's report token, not a session's.
const REPORT_ROUTE: (&str, &str) = ("POST", "/v1/executor/reports");

/// The routes that take a pay link's token (`Authorization: PayLink`).
const PAY_LINK_ROUTES: [(&str, &str); 2] = [("GET", "/v1/pay-link"), ("POST", "/v1/pay-link")];

/// The routes whose handlers take a bearer token.
const BEARER_ROUTES: [(&str, &str); 23] = [
    ("DELETE", "/v1/sessions/current"),
    ("POST", "/v1/space/rotate"),
    ("POST", "/v1/uploads"),
    ("POST", "/v1/tasks/digest"),
    ("POST", "/v1/tasks/fetch"),
    ("POST", "/v1/tasks/fetch-metered"),
    ("POST", "/v1/tasks/http"),
    ("POST", "/v1/tasks/wordfreq"),
    ("POST", "/v1/tasks/wordfreq-metered"),
    ("GET", "/v1/tasks/{task}"),
    ("GET", "/v1/tasks"),
    ("POST", "/v1/tasks/{task}/cancel"),
    ("POST", "/v1/tasks/cancel"),
    ("POST", "/v1/tasks/{task}/ticket"),
    ("POST", "/v1/tasks/{task}/share"),
    ("GET", "/v1/tasks/{task}/receipt"),
    ("GET", "/v1/space"),
    ("POST", "/v1/space/webhook-secret"),
    ("GET", "/v1/space/webhook"),
    ("PUT", "/v1/space/webhook"),
    ("DELETE", "/v1/space/webhook"),
    ("GET", "/v1/tasks/{task}/webhooks"),
    ("GET", "/v1/tasks/{task}/events"),
];

/// The one routed path every kind's create shares.
const CREATE_TEMPLATE: &str = "/v1/tasks/{task}";

/// The operation keys of an OpenAPI 3.1 (and 3.2) path item.
const OPERATION_KEYS: [&str; 9] = ["get", "put", "post", "delete", "options", "head", "patch", "trace", "query"];

/// Methods the probes try on every documented path (HEAD follows GET in axum,
/// OPTIONS is nobody's).
const PROBED: [Method; 5] = [Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE];

const DUMMY_ID: &str = "01HZX3Y4P5Q6R7S8T9V0W1X2Y3";

type Route = (String, String);

fn doc() -> Value {
    openapi(&common::shipped_catalog())
}

/// The relay's context on the given database, as start-up builds it from
/// the same configuration as the API's, so one session works on both.
fn relay_ctx(pool: PgPool) -> http::stream::RelayCtx {
    common::relay(&common::config(&pool))
}

/// What `reeve serve` listens with: the relay's routes and every API route.
fn serve_app(ctx: Ctx, pool: PgPool) -> Router {
    stream::routes(relay_ctx(pool)).merge(app(ctx))
}

fn routes_of(doc: &Value) -> BTreeSet<Route> {
    operations(doc).into_keys().collect()
}

fn expected(list: &[(&str, &str)]) -> BTreeSet<Route> {
    list.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect()
}

/// `(METHOD, path)` → operation object.
fn operations(doc: &Value) -> BTreeMap<Route, Value> {
    let mut ops = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths is an object") {
        for key in OPERATION_KEYS {
            if let Some(op) = item.get(key) {
                ops.insert((key.to_uppercase(), path.clone()), op.clone());
            }
        }
    }
    ops
}

/// A concrete URI for a path template: every `{param}` becomes a ULID, which
/// is also a well-formed (if unknown) task kind.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|segment| if segment.starts_with('{') && segment.ends_with('}') { DUMMY_ID } else { segment })
        .collect::<Vec<_>>()
        .join("/")
}

/// A request with no token: POSTs carry an empty JSON object.
fn probe(method: &Method, template: &str) -> Request<Body> {
    let builder = Request::builder().method(method.clone()).uri(concrete(template));
    if *method == Method::POST {
        builder.header("content-type", "application/json").body(Body::from("{}")).unwrap()
    } else {
        builder.body(Body::empty()).unwrap()
    }
}

/// Whether the path template `template` matches the concrete path `path`.
fn matches(template: &str, path: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| t == p || (t.starts_with('{') && !p.starts_with('{')))
}

/// Not answered by the fallback nor refused by the method router.
fn is_routed(reply: &Reply) -> bool {
    let fallback = reply.status == StatusCode::NOT_FOUND && reply.body["error"]["message"] == "no such route";
    !fallback && reply.status != StatusCode::METHOD_NOT_ALLOWED
}

/// Follows a local `$ref` (`#/components/...`).
fn resolve<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    doc.pointer(reference.strip_prefix('#')?)
}

/// A schema compiled for the tests below.
struct Validator {
    schemas: boon::Schemas,
    root: boon::SchemaIndex,
}

impl Validator {
    fn is_valid(&self, instance: &Value) -> bool {
        self.schemas.validate(instance, self.root).is_ok()
    }
}

/// A validator for `schema`, with the document's components beside it so its
/// `$ref`s resolve the way they do in the document. OpenAPI's own formats
/// (`int64`) are annotations here, as JSON Schema has them by default.
fn validator(doc: &Value, schema: &Value) -> Validator {
    let wrapped = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": doc["components"],
        "allOf": [schema],
    });
    let mut compiler = boon::Compiler::new();
    let mut schemas = boon::Schemas::new();
    compiler.add_resource("urn:openapi", wrapped).unwrap();
    let root =
        compiler.compile("urn:openapi", &mut schemas).unwrap_or_else(|e| panic!("not a valid schema: {e}: {schema}"));
    Validator { schemas, root }
}

fn assert_valid(doc: &Value, schema: &Value, instance: &Value, what: &str) {
    let checked = validator(doc, schema);
    let errors = checked.schemas.validate(instance, checked.root).err().map(|e| format!("{e:#}"));
    assert!(errors.is_none(), "{what} does not match its schema {schema}: {errors:?}\n{instance}");
}

/// The answer of `method template` is one the document lists for that
/// operation: a documented status, a body matching that response's schema
/// and, for an error envelope, a `code` the response's description names.
fn assert_conforms(doc: &Value, method: &str, template: &str, reply: &Reply) {
    let op = &operations(doc)[&(method.to_owned(), template.to_owned())];
    let status = reply.status.as_u16().to_string();
    let Some(response) = op["responses"].get(&status) else {
        panic!("{method} {template} answered {status}, which it does not document: {}", reply.body);
    };
    let what = format!("the {status} of {method} {template}");
    if let Some(schema) = response.pointer("/content/application~1json/schema") {
        assert_eq!(reply.headers["content-type"], "application/json", "{what}");
        assert_valid(doc, schema, &reply.body, &what);
        if schema["$ref"] == "#/components/schemas/ErrorEnvelope" {
            let code = reply.body["error"]["code"].as_str().unwrap();
            let description = response["description"].as_str().unwrap();
            assert!(description.contains(&format!("`{code}`")), "{what} is `{code}`, undocumented: {description}");
            assert_eq!(reply.body["error"]["request_id"], reply.headers["x-request-id"].to_str().unwrap());
        }
    }
    for (name, _) in response["headers"].as_object().into_iter().flatten() {
        // Idempotent-Replayed is only sent on a replay.
        if !name.eq_ignore_ascii_case("idempotent-replayed") {
            assert!(reply.headers.contains_key(name.to_lowercase().as_str()), "{what} lacks its header {name}");
        }
    }
}

/// Each Lambda: its name, the document of its router alone, the routes it
/// documents, the routes of its whole document (the same, but for
/// task-create, whose one route is documented once per kind), and the app
/// its `main` runs on `ctx`.
type FunctionRouter = (&'static str, utoipa::openapi::OpenApi, BTreeSet<Route>, BTreeSet<Route>, Router);

fn function_routers(ctx: &Ctx) -> Vec<FunctionRouter> {
    let same = |routes: &[(&str, &str)]| (expected(routes), expected(routes));
    let creates = expected(&[
        ("POST", "/v1/tasks/digest"),
        ("POST", "/v1/tasks/fetch"),
        ("POST", "/v1/tasks/fetch-metered"),
        ("POST", "/v1/tasks/http"),
        ("POST", "/v1/tasks/wordfreq"),
        ("POST", "/v1/tasks/wordfreq-metered"),
        ("POST", "/v1/tasks/wordfreq-metered"),
    ]);
    let mut all = vec![];
    let (own, global) = same(&[
        ("POST", "/v1/spaces"),
        ("POST", "/v1/sessions"),
        ("DELETE", "/v1/sessions/current"),
        ("POST", "/v1/space/rotate"),
    ]);
    all.push(("auth", http::login::router().into_openapi(), own, global, http::auth_app(ctx.auth.clone())));
    let (own, global) = same(&[("GET", "/v1/catalog"), ("GET", "/v1/openapi.json")]);
    let catalog = http::catalog_app(ctx.catalog_ctx.clone());
    all.push(("catalog", http::catalog::router().into_openapi(), own, global, catalog));
    let (own, global) = same(&[("POST", "/v1/uploads")]);
    all.push(("presign", http::uploads::router().into_openapi(), own, global, http::presign_app(ctx.uploads.clone())));
    // The executor report route shares the task-create function.
    let mut create_doc = http::tasks::create_router().into_openapi();
    create_doc.merge(http::executor_reports::router().into_openapi());
    // So does the pay page's pay link: paying it creates a task; and a
    // channel's cooperative refund, which answers with the kind's offer.
    create_doc.merge(http::pay_links::router().into_openapi());
    create_doc.merge(http::refunds::router().into_openapi());
    let mut creates = creates;
    creates.insert((REPORT_ROUTE.0.to_owned(), REPORT_ROUTE.1.to_owned()));
    creates.extend(expected(&PAY_LINK_ROUTES));
    creates.extend(expected(&[REFUND_ROUTE]));
    all.push((
        "task-create",
        create_doc,
        expected(&[("POST", CREATE_TEMPLATE), REPORT_ROUTE, PAY_LINK_ROUTES[0], PAY_LINK_ROUTES[1], REFUND_ROUTE]),
        creates,
        http::task_create_app(ctx.task_create.clone()),
    ));
    let (own, global) = same(&[
        ("GET", "/v1/tasks/{task}"),
        ("GET", "/v1/tasks"),
        ("POST", "/v1/tasks/{task}/cancel"),
        ("POST", "/v1/tasks/cancel"),
        ("POST", "/v1/tasks/{task}/ticket"),
        ("POST", "/v1/tasks/{task}/share"),
        ("GET", "/v1/tasks/{task}/receipt"),
        ("GET", "/v1/space"),
        ("POST", "/v1/space/webhook-secret"),
        ("GET", "/v1/space/webhook"),
        ("PUT", "/v1/space/webhook"),
        ("DELETE", "/v1/space/webhook"),
        ("GET", "/v1/tasks/{task}/webhooks"),
    ]);
    let status = http::task_status_app(ctx.task_status.clone());
    all.push(("task-status", http::tasks::status_router().into_openapi(), own, global, status));
    all
}

/// A pool that never reaches Postgres (nothing listens on port 1).
fn dead_pool() -> PgPool {
    PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy("postgres://reeve:x@127.0.0.1:1/reeve")
        .unwrap()
}

/// A context whose Postgres is never reached: for routes that don't use it.
/// Fault: its pool is [`dead_pool`].
async fn ctx_without_db() -> Ctx {
    common::ctx(dead_pool()).await
}

#[test]
fn the_document_is_openapi_3_1_and_lists_exactly_the_routes() {
    let doc = doc();
    let version = doc["openapi"].as_str().unwrap();
    assert!(version.starts_with("3.1."), "openapi: {version}");
    assert_eq!(doc["info"]["title"], "Reeve");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(doc["info"]["description"].as_str().is_some_and(|d| !d.is_empty()));
    assert_eq!(routes_of(&doc), expected(&ROUTES));
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn every_documented_route_is_routed_and_no_other_method_is(pool: PgPool) {
    let doc = doc();
    let app = serve_app(common::ctx(pool.clone()).await, pool);
    let documented = routes_of(&doc);
    // What the document says, not what this file says: a route that takes a
    // token but doesn't declare it (or the reverse) fails here.
    let bearer: BTreeSet<Route> =
        operations(&doc).into_iter().filter(|(_, op)| op.get("security").is_some()).map(|(r, _)| r).collect();
    let paths: BTreeSet<&String> = documented.iter().map(|(_, p)| p).collect();
    for path in paths {
        for method in &PROBED {
            let route = (method.to_string(), path.clone());
            let reply = send(&app, probe(method, path)).await;
            if documented.contains(&route) {
                assert!(
                    is_routed(&reply),
                    "{method} {path} is documented but not routed: {} {}",
                    reply.status,
                    reply.body
                );
                assert_conforms(&doc, method.as_str(), path, &reply);
                // The report route takes a job's report token, and names its
                // own code; a pay link's route, a pay link (`404`: no link).
                let (status, code) = if route == (REPORT_ROUTE.0.to_owned(), REPORT_ROUTE.1.to_owned()) {
                    (StatusCode::UNAUTHORIZED, "invalid_report_token")
                } else if expected(&PAY_LINK_ROUTES).contains(&route) {
                    (StatusCode::NOT_FOUND, "pay_link_invalid")
                } else {
                    (StatusCode::UNAUTHORIZED, "missing_token")
                };
                let refused_for_no_token = reply.status == status && reply.code() == code;
                assert_eq!(
                    refused_for_no_token,
                    bearer.contains(&route),
                    "{method} {path} without a token: {} {}",
                    reply.status,
                    reply.body
                );
            } else if documented.iter().any(|(m, p)| m == method.as_str() && p != path && matches(p, path))
                // A path documented as such (`POST /v1/tasks/cancel`) is its
                // own route: its other methods are 405, never a template's.
                && path != "/v1/tasks/cancel"
            {
                // `GET /v1/tasks/digest` is `GET /v1/tasks/{task}` for a task
                // id "digest": served, and refused for that, not for the method.
                assert!(is_routed(&reply), "{method} {path}: {}", reply.body);
            } else if *method == Method::POST && path == CREATE_TEMPLATE {
                // The one route behind every kind's documented create: for a
                // kind the catalog lacks it is `unknown_task`, once authorised.
                assert!(is_routed(&reply), "{}", reply.body);
                assert_eq!(reply.code(), "missing_token");
            } else {
                assert_eq!(
                    reply.status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is routed but not documented"
                );
                assert_eq!(reply.code(), "method_not_allowed");
            }
        }
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn each_function_router_serves_and_documents_its_own_routes(pool: PgPool) {
    let doc = doc();
    let global = operations(&doc);
    let ctx = common::ctx(pool).await;
    // /healthz is every process's; the stream is the relay's.
    let mut union = expected(&[("GET", "/healthz"), ("GET", STREAM_PATH)]);
    for (function, own, own_routes, routes, served) in function_routers(&ctx) {
        let own = serde_json::to_value(own).unwrap();
        assert_eq!(routes_of(&own), own_routes, "the {function} router documents other routes");
        for (route, op) in operations(&own) {
            if own_routes == routes || routes.contains(&route) {
                assert_eq!(global.get(&route), Some(&op), "{route:?} of {function} is not in the document as such");
            } else {
                // Each kind's create is the routed one, made specific.
                for kind_route in routes.iter().filter(|r| !own_routes.contains(*r)) {
                    let made = &global[kind_route];
                    assert_eq!(made["responses"]["202"], op["responses"]["202"], "{kind_route:?}");
                    assert_eq!(made["security"], op["security"], "{kind_route:?}");
                }
            }
        }
        for (method, path) in &routes {
            let reply = send(&served, probe(&method.parse().unwrap(), path)).await;
            assert!(is_routed(&reply), "the {function} function does not route {method} {path}: {}", reply.body);
        }
        // A function serves its own routes and nothing else.
        for (method, path) in ROUTES.iter().filter(|r| !routes.contains(&(r.0.to_owned(), r.1.to_owned()))) {
            // Another function's path may fit one of this one's templates:
            // `POST /v1/tasks/cancel` is `POST /v1/tasks/{task}` to the
            // task-create function alone, which API Gateway never sends it
            // (it picks the more specific route, task-status's).
            if own_routes.iter().any(|(m, p)| m == method && matches(p, path)) {
                continue;
            }
            let reply = send(&served, probe(&method.parse().unwrap(), path)).await;
            assert!(!is_routed(&reply), "the {function} function also routes {method} {path}");
        }
        union.extend(routes);
    }
    assert_eq!(union, routes_of(&doc), "every documented route belongs to a function, the relay or is /healthz");
}

#[tokio::test]
async fn the_document_is_served_at_v1_openapi_json_by_app_and_the_catalog_function() {
    let ctx = ctx_without_db().await;
    let expected = doc();
    for (who, router) in [("app", app(ctx.clone())), ("catalog", http::catalog_app(ctx.catalog_ctx.clone()))] {
        let reply = send(&router, get("/v1/openapi.json")).await;
        assert_eq!(reply.status, StatusCode::OK, "{who}: {}", reply.body);
        assert_eq!(reply.headers["content-type"], "application/json", "{who}");
        assert_eq!(reply.body, expected, "{who} serves another document than openapi()");
    }
    // Public: a bad token changes nothing.
    let reply = send(&app(ctx), get_authed("/v1/openapi.json", "nonsense")).await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[test]
fn bearer_routes_declare_the_security_requirement_and_public_ones_none() {
    let doc = doc();
    assert_eq!(BEARER, "bearer");
    let scheme = &doc["components"]["securitySchemes"][BEARER];
    assert_eq!(scheme["type"], "http", "{scheme}");
    assert_eq!(scheme["scheme"], "bearer", "{scheme}");
    assert!(doc.get("security").is_none(), "no document-wide requirement: public routes stay public");
    let share = &doc["components"]["securitySchemes"][SHARE];
    assert_eq!((&share["type"], &share["scheme"]), (&json!("http"), &json!("Share")), "{share}");
    let query = &doc["components"]["securitySchemes"][TICKET];
    assert_eq!((&query["type"], &query["in"], &query["name"]), (&json!("apiKey"), &json!("query"), &json!("ticket")));

    let bearer = expected(&BEARER_ROUTES);
    for (route, op) in operations(&doc) {
        let declared = op.get("security").cloned().unwrap_or(Value::Null);
        if bearer.contains(&route) {
            // The stream alone also takes a ticket as a query parameter, and
            // the ticket route alone a share link's token.
            let schemes = if route.1 == STREAM_PATH {
                json!([{ BEARER: [] }, { TICKET: [] }])
            } else if route.1 == "/v1/tasks/{task}/ticket" {
                json!([{ BEARER: [] }, { SHARE: [] }])
            } else {
                json!([{ BEARER: [] }])
            };
            assert_eq!(declared, schemes, "{route:?}");
            let unauthorized = op["responses"]["401"]["description"].as_str().unwrap_or_default();
            assert!(unauthorized.contains("`missing_token`") && unauthorized.contains("`invalid_token`"), "{route:?}");
        } else if expected(&PAY_LINK_ROUTES).contains(&route) {
            assert_eq!(declared, json!([{ PAY_LINK: [] }]), "{route:?}");
            let scheme = &doc["components"]["securitySchemes"][PAY_LINK];
            assert_eq!((&scheme["type"], &scheme["scheme"]), (&json!("http"), &json!("PayLink")), "{scheme}");
        } else if route == (REPORT_ROUTE.0.to_owned(), REPORT_ROUTE.1.to_owned()) {
            assert_eq!(declared, json!([{ "report_token": [] }]), "{route:?}");
            let scheme = &doc["components"]["securitySchemes"]["report_token"];
            assert_eq!((&scheme["type"], &scheme["scheme"]), (&json!("http"), &json!("bearer")), "{scheme}");
        } else {
            assert_eq!(declared, Value::Null, "{route:?} is public");
        }
    }
}

#[test]
fn error_responses_reference_the_envelope_and_name_their_codes() {
    let doc = doc();
    let envelope = resolve(&doc, "#/components/schemas/ErrorEnvelope").expect("ErrorEnvelope is a component");
    assert_eq!(envelope["required"], json!(["error"]));
    let body = resolve(&doc, envelope["properties"]["error"]["$ref"].as_str().unwrap()).unwrap();
    assert_eq!(body["required"], json!(["code", "message", "request_id"]));

    let mut errors = 0;
    for ((method, path), op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().unwrap() {
            let code: u16 = status.parse().unwrap_or_else(|_| panic!("{method} {path}: status {status} is not a code"));
            if code < 400 {
                continue;
            }
            errors += 1;
            let schema = &response["content"]["application/json"]["schema"];
            let description = response["description"].as_str().unwrap();
            if code == 402 {
                assert_eq!(schema["$ref"], "#/components/schemas/PaymentRequired", "{method} {path}");
                assert!(response["headers"].get("PAYMENT-REQUIRED").is_some(), "{method} {path}: the 402 header");
            } else {
                assert_eq!(schema["$ref"], "#/components/schemas/ErrorEnvelope", "{method} {path} {status}");
                assert!(
                    description
                        .split('`')
                        .skip(1)
                        .step_by(2)
                        .any(|c| c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_')),
                    "{method} {path} {status} names no code: {description}"
                );
            }
        }
    }
    assert!(errors >= 20, "only {errors} error responses documented");
}

#[test]
fn the_document_is_structurally_sound() {
    let doc = doc();

    // Every `$ref` points at something in the document.
    fn refs<'a>(node: &'a Value, out: &mut Vec<&'a str>) {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    out.push(r);
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 20, "{all:?}");
    for r in &all {
        assert!(r.starts_with("#/components/"), "{r}");
        assert!(resolve(&doc, r).is_some(), "dangling $ref {r}");
    }
    // The validators below do follow them.
    let envelope = validator(&doc, &json!({"$ref": "#/components/schemas/ErrorEnvelope"}));
    assert!(envelope.is_valid(&json!({"error": {"code": "c", "message": "m", "request_id": "r"}})));
    assert!(!envelope.is_valid(&json!({"error": {"code": "c", "message": "m"}})));

    // Every component schema is a valid JSON Schema, and every example in
    // one matches the schema it illustrates.
    fn examples<'a>(node: &'a Value, out: &mut Vec<(&'a Value, Vec<&'a Value>)>) {
        if let Value::Object(map) = node {
            let mut found: Vec<&Value> = map.get("example").into_iter().collect();
            found.extend(map.get("examples").and_then(Value::as_array).into_iter().flatten());
            if !found.is_empty() {
                out.push((node, found));
            }
            for (key, value) in map {
                if key != "example" && key != "examples" {
                    match value {
                        Value::Object(children) if key == "properties" => {
                            children.values().for_each(|v| examples(v, out))
                        }
                        Value::Array(items) => items.iter().for_each(|v| examples(v, out)),
                        other => examples(other, out),
                    }
                }
            }
        }
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let ops = operations(&doc);
    let mut illustrated = Vec::new();
    for schema in schemas.values() {
        validator(&doc, schema);
        examples(schema, &mut illustrated);
    }
    for op in ops.values() {
        for param in op["parameters"].as_array().into_iter().flatten() {
            if let Some(example) = param.get("example") {
                illustrated.push((&param["schema"], vec![example]));
            }
        }
    }
    assert!(illustrated.len() >= 5, "{}", illustrated.len());
    for (schema, found) in illustrated {
        for example in found {
            assert_valid(&doc, schema, example, "an example");
        }
    }

    // Operations: unique ids, a summary, declared tags, a success answer and
    // exactly the path's parameters.
    let tags: BTreeSet<&str> = doc["tags"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    let mut ids = BTreeSet::new();
    for ((method, path), op) in &ops {
        let id = op["operationId"].as_str().unwrap().to_owned();
        assert!(ids.insert(id.clone()), "operationId {id} twice");
        assert!(op["summary"].as_str().is_some_and(|s| !s.is_empty()), "{method} {path}: no summary");
        let op_tags = op["tags"].as_array().unwrap();
        assert!(!op_tags.is_empty() && op_tags.iter().all(|t| tags.contains(t.as_str().unwrap())), "{method} {path}");
        assert!(op["responses"].as_object().unwrap().keys().any(|s| s.starts_with('2')), "{method} {path}: no 2xx");

        let in_template: BTreeSet<&str> =
            path.split('/').filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).collect();
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        let in_path: BTreeSet<&str> =
            params.iter().filter(|p| p["in"] == "path").map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(in_template, in_path, "{method} {path}: path parameters");
        assert!(params.iter().filter(|p| p["in"] == "path").all(|p| p["required"] == true), "{method} {path}");
    }
}

/// The journey of `tests/suite/flow.rs` and its errors, every answer checked
/// against the document: statuses, bodies, codes and headers.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_real_answers_conform_to_the_document(pool: PgPool) {
    let doc = doc();
    let queue = TestQueue::new().await;
    let ctx = common::api(&common::config(&pool).with(settings::QUEUE_URL, &queue.url)).await;
    let app = serve_app(ctx, pool);
    let check = |method: &str, template: &str, reply: Reply| {
        assert_conforms(&doc, method, template, &reply);
        reply
    };
    let raw_post = |uri: &str, token: &str, content_type: &str, body: Vec<u8>| {
        Request::post(uri)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap()
    };

    check("GET", "/healthz", send(&app, get("/healthz")).await);
    check("GET", "/v1/catalog", send(&app, get("/v1/catalog")).await);
    check("GET", "/v1/openapi.json", send(&app, get("/v1/openapi.json")).await);

    let space = check("POST", "/v1/spaces", send(&app, Request::post("/v1/spaces").body(Body::empty()).unwrap()).await);
    assert_eq!(space.status, StatusCode::CREATED);
    let session = check(
        "POST",
        "/v1/sessions",
        send(&app, post_json("/v1/sessions", None, &json!({"space_id": space.body["space_id"]}))).await,
    );
    assert_eq!(session.status, StatusCode::OK);
    let wrong = send(&app, post_json("/v1/sessions", None, &json!({"space_id": "00000000000000000000"}))).await;
    assert_eq!(check("POST", "/v1/sessions", wrong).code(), "invalid_space");
    // A rotation: refused with another ID, done with the Space's own.
    let rotate = "/v1/space/rotate";
    let first = session.body["token"].as_str().unwrap();
    let other_id = json!({"space_id": "00000000000000000000"});
    let refused = check("POST", rotate, send(&app, post_json(rotate, Some(first), &other_id)).await);
    assert_eq!((refused.status, refused.code()), (StatusCode::FORBIDDEN, "wrong_space_id"));
    let own_id = json!({"space_id": space.body["space_id"]});
    let rotated = check("POST", rotate, send(&app, post_json(rotate, Some(first), &own_id)).await);
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    let ended = check("POST", rotate, send(&app, post_json(rotate, Some(first), &own_id)).await);
    assert_eq!(ended.code(), "invalid_token");
    let (_, token) = new_session(&app).await;

    // Uploads: one accepted and PUT to S3, then the documented refusals.
    let bytes = b"hello, openapi\n".repeat(100);
    let upload_body = json!({"filename": "a.txt", "content_type": "text/plain", "size": bytes.len()});
    let upload = check("POST", "/v1/uploads", send(&app, post_json("/v1/uploads", Some(&token), &upload_body)).await);
    assert_eq!(upload.status, StatusCode::CREATED, "{}", upload.body);
    let mut put = reqwest::Client::new().put(upload.body["url"].as_str().unwrap()).body(bytes);
    for (name, value) in upload.body["headers"].as_object().unwrap() {
        if name != "content-length" {
            put = put.header(name, value.as_str().unwrap());
        }
    }
    assert_eq!(put.send().await.unwrap().status(), reqwest::StatusCode::OK);
    let refusals = [
        (
            post_json("/v1/uploads", Some(&token), &json!({"filename": "a", "content_type": "text/x-nope", "size": 1})),
            "unsupported_content_type",
        ),
        (post_json("/v1/uploads", Some(&token), &json!({"content_type": "text/plain", "size": 1})), "invalid_filename"),
        (
            post_json(
                "/v1/uploads",
                Some(&token),
                &json!({"filename": "a", "content_type": "text/plain", "size": 1u64 << 40}),
            ),
            "upload_too_large",
        ),
        (raw_post("/v1/uploads", &token, "application/json", b"{".to_vec()), "invalid_json"),
        (raw_post("/v1/uploads", &token, "text/plain", b"{}".to_vec()), "unsupported_media_type"),
        (raw_post("/v1/uploads", &token, "application/json", vec![b' '; http::MAX_BODY_BYTES + 1]), "body_too_large"),
        (post_json("/v1/uploads", Some("not-a-token"), &upload_body), "invalid_token"),
    ];
    for (request, code) in refusals {
        assert_eq!(check("POST", "/v1/uploads", send(&app, request).await).code(), code);
    }
    // JSON Schema calls 15.0 an integer, so the route takes it as one.
    let whole = json!({"filename": "b.txt", "content_type": "text/plain", "size": 15.0});
    let reply = check("POST", "/v1/uploads", send(&app, post_json("/v1/uploads", Some(&token), &whole)).await);
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let fraction = json!({"filename": "b.txt", "content_type": "text/plain", "size": 15.5});
    let reply = check("POST", "/v1/uploads", send(&app, post_json("/v1/uploads", Some(&token), &fraction)).await);
    assert_eq!(reply.code(), "invalid_request");

    // Tasks: a free one queued and read back, a priced one's 402, refusals.
    let task = "/v1/tasks/{task}";
    let digest = "/v1/tasks/digest";
    let input = json!({"input": {"upload_id": upload.body["upload_id"]}});
    let created = check("POST", digest, send(&app, post_json(digest, Some(&token), &input)).await);
    assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
    let id = created.body["id"].as_str().unwrap();
    let snapshot = check("GET", task, send(&app, get_authed(&format!("/v1/tasks/{id}"), &token)).await);
    assert_eq!(snapshot.status, StatusCode::OK);
    let unknown = check("GET", task, send(&app, get_authed(&format!("/v1/tasks/{}", Id::new()), &token)).await);
    assert_eq!(unknown.code(), "task_not_found");

    // The relay's stream: the refusals as envelopes, the stream as SSE.
    let stream = check("GET", STREAM_PATH, send(&app, get(&format!("/v1/tasks/{id}/events"))).await);
    assert_eq!(stream.code(), "missing_token");
    let other = format!("/v1/tasks/{}/events", Id::new());
    assert_eq!(check("GET", STREAM_PATH, send(&app, get_authed(&other, &token)).await).code(), "task_not_found");
    let in_url = format!("/v1/tasks/{id}/events?access_token={token}");
    assert_eq!(check("GET", STREAM_PATH, send(&app, get(&in_url)).await).code(), "token_in_url");
    let ticket = check(
        "POST",
        "/v1/tasks/{task}/ticket",
        send(&app, post_json(&format!("/v1/tasks/{id}/ticket"), Some(&token), &json!({}))).await,
    );
    assert_eq!(ticket.status, StatusCode::OK, "{}", ticket.body);
    let ticket = ticket.body["ticket"].as_str().unwrap();
    let another_task = format!("/v1/tasks/{}/events?ticket={ticket}", Id::new());
    assert_eq!(check("GET", STREAM_PATH, send(&app, get(&another_task)).await).code(), "invalid_ticket");
    // A share link, and the ticket it gets.
    let share_path = "/v1/tasks/{task}/share";
    let share = check(
        "POST",
        share_path,
        send(&app, post_json(&format!("/v1/tasks/{id}/share"), Some(&token), &json!({}))).await,
    );
    assert_eq!(share.status, StatusCode::OK, "{}", share.body);
    let share = share.body["share"].as_str().unwrap();
    let with_share = |task: &str| {
        Request::post(format!("/v1/tasks/{task}/ticket"))
            .header("authorization", format!("Share {share}"))
            .body(Body::empty())
            .unwrap()
    };
    let shared = check("POST", "/v1/tasks/{task}/ticket", send(&app, with_share(id)).await);
    assert_eq!(shared.status, StatusCode::OK, "{}", shared.body);
    let refused = check("POST", "/v1/tasks/{task}/ticket", send(&app, with_share(&Id::new().to_string())).await);
    assert_eq!(refused.code(), "invalid_share");
    let bad_resume = format!("/v1/tasks/{id}/events?ticket={ticket}&last_event_id=-1");
    assert_eq!(check("GET", STREAM_PATH, send(&app, get(&bad_resume)).await).code(), "invalid_last_event_id");
    let live = app.clone().oneshot(get_authed(&format!("/v1/tasks/{id}/events"), &token)).await.unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    let stream_op = &operations(&doc)[&("GET".to_owned(), STREAM_PATH.to_owned())];
    let content_type = live.headers()["content-type"].to_str().unwrap();
    assert!(stream_op["responses"]["200"]["content"].get(content_type).is_some(), "{content_type} is documented");
    drop(live);

    let paid = json!({"input": {"url": "https://example.com/a.txt"}});
    let challenge =
        check("POST", "/v1/tasks/fetch", send(&app, post_json("/v1/tasks/fetch", Some(&token), &paid)).await);
    assert_eq!(challenge.status, StatusCode::PAYMENT_REQUIRED);
    // The document shows the very challenge the route answers, but for the
    // URL, which names the host the client reached.
    let fetch_op = &operations(&doc)[&("POST".to_owned(), "/v1/tasks/fetch".to_owned())];
    let mut shown = fetch_op["responses"]["402"]["content"]["application/json"]["example"].clone();
    shown["resource"]["url"] = challenge.body["resource"]["url"].clone();
    // And for the signed offers, made for each request (the example has none).
    let mut answered = challenge.body.clone();
    let offers = answered["extensions"].as_object_mut().and_then(|e| e.remove("offer-receipt"));
    assert!(offers.is_some_and(|o| o["info"]["offers"].is_array()), "the dev catalog's 402 carries signed offers");
    assert_eq!(shown, answered);

    let mut bad_key = post_json("/v1/tasks/digest", Some(&token), &input);
    bad_key.headers_mut().insert("idempotency-key", "".parse().unwrap());
    let reused = |body: &Value| {
        let mut r = post_json("/v1/tasks/digest", Some(&token), body);
        r.headers_mut().insert("idempotency-key", "openapi-1".parse().unwrap());
        r
    };
    let first = reused(&input);
    let conflicting = reused(&json!({"input": {"upload_id": Id::new().to_string()}}));
    let nope = send(&app, post_json("/v1/tasks/nope", Some(&token), &input)).await;
    assert_eq!((nope.status, nope.code()), (StatusCode::NOT_FOUND, "unknown_task"));
    let refusals = [
        (bad_key, "invalid_idempotency_key"),
        (post_json("/v1/tasks/digest", Some(&token), &json!({"input": {}})), "invalid_input"),
        (
            post_json("/v1/tasks/digest", Some(&token), &json!({"input": {"upload_id": Id::new().to_string()}})),
            "unknown_upload",
        ),
        (post_json("/v1/tasks/digest", Some(&token), &json!({"input": [1]})), "invalid_request"),
        (first, ""),
        (conflicting, "idempotency_conflict"),
    ];
    for (request, code) in refusals {
        let reply = check("POST", digest, send(&app, request).await);
        if code.is_empty() {
            assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        } else {
            assert_eq!(reply.code(), code);
        }
    }
    assert_eq!(queue.drain().await.len(), 2, "the digest and the keyed one");
    queue.delete().await;
}

/// What the routers would serve without the document: nothing is routed
/// outside `routes!`, so an undocumented path is the fallback everywhere.
#[tokio::test]
async fn an_undocumented_path_is_the_fallback() {
    let app: Router = app(ctx_without_db().await);
    for uri in ["/v1/openapi", "/v1/task", "/v1/tasks/x/y", "/openapi.json"] {
        let reply = send(&app, get(uri)).await;
        assert!(!is_routed(&reply), "{uri}: {}", reply.body);
    }
}

/// A catalog of one's own: the document follows it, not the shipped one.
const OWN_CATALOG: &str = r#"
[uploads]
max_bytes = 4096
content_types = ["text/csv"]

[tasks.count-words]
title = "Count words"
description = "Counts the words of an upload."
executor = "digest"

[tasks.count-words.input_schema]
type = "object"
required = ["upload_id", "language"]
additionalProperties = false
properties.upload_id = { type = "string", pattern = "^[0-9A-HJKMNP-TV-Z]{26}$" }
properties.language = { type = "string", enum = ["en", "fr"] }
"#;

#[tokio::test]
async fn the_document_is_made_from_the_catalog_it_is_served_with() {
    let catalog = Catalog::parse(OWN_CATALOG).expect("a valid catalog");
    let doc = openapi(&catalog);
    let creates: BTreeSet<Route> = routes_of(&doc)
        .into_iter()
        .filter(|(m, p)| {
            m == "POST"
                && p.starts_with("/v1/tasks/")
                && !p.ends_with("/cancel")
                && !p.ends_with("/ticket")
                && !p.ends_with("/share")
        })
        .collect();
    assert_eq!(creates, expected(&[("POST", "/v1/tasks/count-words")]), "one create per kind, and only those");
    let op = &operations(&doc)[&("POST".to_owned(), "/v1/tasks/count-words".to_owned())];
    assert_eq!(op["operationId"], "create_task_count_words");
    assert!(op["summary"].as_str().unwrap().contains("Count words"));
    assert!(op["description"].as_str().unwrap().starts_with("Counts the words of an upload."));
    assert!(op["parameters"].as_array().unwrap().iter().all(|p| p["in"] != "path"), "the kind is in the path");
    assert!(op["responses"].get("402").is_none(), "a free kind is never asked to pay");
    assert!(op["responses"].get("404").is_none(), "the kind exists");
    assert!(
        !op["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "PAYMENT-SIGNATURE"),
        "a free kind takes no payment"
    );

    // The body is `{"input": <the kind's input_schema>}`, exactly.
    let body = &op["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(body["properties"]["input"], catalog.tasks["count-words"].input_schema);
    assert_eq!(body["required"], json!(["input"]));
    let valid = json!({"input": {"upload_id": DUMMY_ID, "language": "fr"}});
    assert!(validator(&doc, body).is_valid(&valid));
    for wrong in [
        json!({"input": {"upload_id": DUMMY_ID, "language": "de"}}),
        json!({"input": {"upload_id": DUMMY_ID}}),
        json!({"input": {"upload_id": DUMMY_ID, "language": "en"}, "extra": 1}),
        json!({}),
    ] {
        assert!(!validator(&doc, body).is_valid(&wrong), "{wrong} is not a valid body");
    }

    // The upload policy: the limit and the types of this catalog.
    let upload = resolve(&doc, "#/components/schemas/CreateUpload").unwrap();
    assert_eq!(upload["properties"]["size"]["maximum"], 4096);
    assert_eq!(upload["properties"]["content_type"]["enum"], json!(["text/csv"]));

    // And that is the document the API serves with this catalog.
    // Fault: its pool is a dead one; the route reads no database.
    let own = common::api(&common::with_catalog(common::config(&dead_pool()), OWN_CATALOG)).await;
    let served = send(&app(own), get("/v1/openapi.json")).await;
    assert_eq!(served.body, doc);
    assert_ne!(served.body, self::doc(), "the shipped catalog makes another document");
}

#[test]
fn each_kind_of_the_shipped_catalog_has_its_schema_price_and_upload_limit() {
    let catalog = common::shipped_catalog();
    let doc = doc();
    let ops = operations(&doc);
    for (kind, spec) in &catalog.tasks {
        let op = &ops[&("POST".to_owned(), format!("/v1/tasks/{kind}"))];
        let input = &op["requestBody"]["content"]["application/json"]["schema"]["properties"]["input"];
        assert_eq!(input, &spec.input_schema, "{kind}");
        let payment = op["responses"].get("402");
        assert_eq!(payment.is_some(), !spec.is_free(), "{kind}: a 402 exactly when priced");
        if let Some(payment) = payment {
            assert!(payment["headers"].get("PAYMENT-REQUIRED").is_some(), "{kind}");
            let example = &payment["content"]["application/json"]["example"];
            let amounts: Vec<String> = spec.accepts.iter().map(|p| p.amount.to_string()).collect();
            let shown: Vec<&str> =
                example["accepts"].as_array().unwrap().iter().map(|a| a["amount"].as_str().unwrap()).collect();
            assert_eq!(shown, amounts, "{kind}: the 402 shows the catalog's prices");
            assert_valid(&doc, &payment["content"]["application/json"]["schema"], example, "the 402 example");
        }
    }
    let upload = resolve(&doc, "#/components/schemas/CreateUpload").unwrap();
    // The name rules presign enforces, so a valid-looking name is accepted.
    let name = validator(&doc, &upload["properties"]["filename"]);
    for good in ["photo.png", "a", " résumé 2026.pdf", "x".repeat(255).as_str()] {
        assert!(name.is_valid(&json!(good)), "{good:?}");
    }
    for bad in ["", "   ", "a\u{1}b", "tab\tname", "x".repeat(256).as_str()] {
        assert!(!name.is_valid(&json!(bad)), "{bad:?}");
    }
    assert_eq!(upload["properties"]["size"]["maximum"], json!(catalog.uploads.max_bytes));
    assert_eq!(upload["properties"]["content_type"]["enum"], json!(catalog.uploads.content_types));
}

/// Every route that takes a token reads it the same way, the relay's stream
/// included: the scheme in any case, a non-bearer credential refused as
/// `invalid_token`; only the stream also takes `?access_token=`.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn one_bearer_extractor_serves_every_route(pool: PgPool) {
    let ctx = common::ctx(pool.clone()).await;
    let app = serve_app(ctx, pool);
    let (_, token) = new_session(&app).await;
    let unknown = Id::new();
    // Each route, and how it answers once the token is accepted: the same
    // request refused for something after authentication.
    let routes = [
        ("POST", "/v1/uploads".to_owned(), "invalid_filename"),
        ("POST", "/v1/tasks/digest".to_owned(), "invalid_input"),
        ("GET", format!("/v1/tasks/{unknown}"), "task_not_found"),
        ("GET", format!("/v1/tasks/{unknown}/events"), "task_not_found"),
    ];
    let request = |method: &str, uri: &str, authorization: Option<String>| {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(value) = authorization {
            builder = builder.header("authorization", value);
        }
        if method == "POST" {
            let body = if uri.ends_with("uploads") {
                json!({"content_type": "text/plain", "size": 1})
            } else {
                json!({"input": {}})
            };
            builder.header("content-type", "application/json").body(Body::from(body.to_string())).unwrap()
        } else {
            builder.body(Body::empty()).unwrap()
        }
    };
    let accepted =
        [format!("Bearer {token}"), format!("bearer {token}"), format!("BEARER {token}"), format!("Bearer  {token} ")];
    let refused = [
        "Basic dXNlcjpwYXNz".to_owned(),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        format!("Token {token}"),
        "Bearer nonsense".to_owned(),
    ];
    for (method, uri, after_auth) in &routes {
        for value in &accepted {
            let reply = send(&app, request(method, uri, Some(value.clone()))).await;
            assert_eq!(reply.code(), *after_auth, "{method} {uri} with {value:?}");
        }
        for value in &refused {
            let reply = send(&app, request(method, uri, Some(value.clone()))).await;
            assert_eq!(
                (reply.status, reply.code()),
                (StatusCode::UNAUTHORIZED, "invalid_token"),
                "{method} {uri} with {value:?}"
            );
        }
        let reply = send(&app, request(method, uri, None)).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::UNAUTHORIZED, "missing_token"), "{method} {uri}");
        // A session token in a URL is refused on every route, the stream's
        // included: EventSource opens the stream with a ticket instead.
        let with_query = format!("{uri}?access_token={token}");
        let reply = send(&app, request(method, &with_query, None)).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::UNAUTHORIZED, "token_in_url"), "{method} {with_query}");
    }
}

/// `openapi.json` (what the catalog function serves, with the catalog's
/// part added) is what the routes document. A route or a schema changed:
/// `REEVE_BLESS=1 cargo test -p reeve-shared --test suite generated`
/// writes it again; commit it with the change.
#[test]
fn openapi_json_is_the_generated_document() {
    let generated = http::generated_openapi();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/adapters/http/openapi.json");
    if std::env::var_os("REEVE_BLESS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&generated).unwrap() + "\n").unwrap();
    }
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        committed == generated,
        "shared/src/adapters/http/openapi.json is not what the routes document: run \
         `REEVE_BLESS=1 cargo test -p reeve-shared --test suite generated` and commit it"
    );
}
