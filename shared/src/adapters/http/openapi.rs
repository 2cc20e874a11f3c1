//! The OpenAPI 3.1 document of every route, served at `GET /v1/openapi.json`
//! by the catalog function (and `reeve serve`).
//!
//! Each module router is a utoipa-axum `OpenApiRouter` built with
//! `routes!(handler)`: the handler's `#[utoipa::path]` gives both the axum
//! route and its operation, so the document and the routing cannot drift.
//! [`generated`] merges every module's router, keeps the document and adds
//! what no single route owns: the info, the security schemes, the tag list
//! and the relay's stream. That document is committed beside this file as
//! `openapi.json`, and a test keeps it equal to what the routes say: the
//! catalog function serves it without linking any other function's routes
//! (their handlers reach Argon2, S3, SQS and the payment client). [`openapi`]
//! adds what the catalog decides.
//!
//! The catalog decides the most useful part for a client: one create
//! operation per task kind, `POST /v1/tasks/<kind>`, whose request body is
//! that kind's `input_schema` and whose `402` shows its real prices; and the
//! upload policy (`size` up to the limit, `content_type` one of the allowed
//! types). So the document a deployment serves describes what it sells.

use serde_json::{Map, Value, json};
#[cfg(feature = "api")]
use utoipa::ToSchema;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::tag::TagBuilder;
use utoipa::openapi::{InfoBuilder, LicenseBuilder, OpenApiVersion};

#[cfg(feature = "api")]
use crate::domain::payments::offer_receipt::{OfferPayload, ReceiptPayload};

use crate::domain::catalog::{Catalog, TaskSpec};
use crate::domain::payments as x402;

/// [`generated`], as committed.
const GENERATED: &str = include_str!("openapi.json");

/// The name of the bearer security scheme. Operations spell it out as a
/// literal, `security(("bearer" = []))`: the macro takes nothing else.
pub const BEARER: &str = "bearer";

/// The name of the query scheme only the relay's stream accepts, a stream
/// ticket (`POST /v1/tasks/{id}/ticket`): EventSource cannot send an
/// `Authorization` header, and a session token in a URL is refused.
pub const TICKET: &str = "ticket";

/// The name of the scheme only `POST /v1/tasks/{task}/ticket` accepts
/// beside the bearer session: a share link's token, sent as
/// `Authorization: Share <share>`.
pub const SHARE: &str = "share";

/// The name of the scheme only `GET`/`POST /v1/pay-link` accept: a pay
/// link's token, sent as `Authorization: PayLink <token>`.
pub const PAY_LINK: &str = "pay_link";

/// The routed path every task create shares; the document lists one
/// concrete path per kind instead.
const CREATE_TEMPLATE: &str = "/v1/tasks/{task}";
/// The relay's SSE stream.
pub const STREAM_PATH: &str = "/v1/tasks/{task}/events";

const DESCRIPTION: &str = "\
Reeve is a zero-account, pay-per-task job service.

1. `POST /v1/spaces` creates a Space and shows its 20-digit Space ID once.
2. `POST /v1/sessions` trades the Space ID for a short-lived bearer token, \
which every other call that needs one sends as `Authorization: Bearer <token>`.
3. `GET /v1/catalog` lists the task kinds, their input schemas and prices.
4. `POST /v1/uploads` returns a presigned URL to `PUT` one input file to.
5. `POST /v1/tasks/<kind>` creates a task: this document has one operation \
per kind on offer, with that kind's input schema. A priced task answers \
`402` with x402 v2 payment requirements until it is paid.
6. `GET /v1/tasks/{id}` returns a snapshot of the task, and the relay's \
`GET /v1/tasks/{id}/events` streams its events as they happen.

Every response carries an `x-request-id` header. Every error (but the x402 \
`402`) has the body `{\"error\": {\"code\", \"message\", \"request_id\"}}`; \
`code` is stable and each operation lists the codes it can answer. Any route \
also answers `405 method_not_allowed` to a method it does not serve, and an \
unknown path is `404 not_found`.";

/// The name of the scheme only the report route accepts: a job's report
/// token (docs/executors.md), sent as `Authorization: Bearer`.
pub const REPORT_TOKEN: &str = "report_token";

const TAGS: [(&str, &str); 7] = [
    ("spaces", "Spaces and the sessions that authenticate every other call."),
    ("catalog", "What Reeve sells, and this document. No token needed."),
    ("uploads", "Presigned uploads of task input files."),
    ("tasks", "Creating tasks (paid with x402 when priced), reading them back and following them live."),
    (
        "webhooks",
        "Completion webhooks signed per Standard Webhooks: the Space's secret and default endpoint, a task's deliveries.",
    ),
    ("health", "Whether the process can serve."),
    (
        "executors",
        "Where a service that sells its work through Reeve reports on the jobs it accepted (docs/executors.md).",
    ),
];

/// The document for every route of [`super::app`] and the relay's stream,
/// as this catalog makes them.
pub fn openapi(catalog: &Catalog) -> Value {
    let mut doc: Value = serde_json::from_str(GENERATED).expect("openapi.json is JSON");
    per_kind_creates(&mut doc, catalog);
    upload_policy(&mut doc, catalog);
    doc
}

#[cfg(feature = "api")]
/// The document the routes describe, before the catalog's part: what
/// `openapi.json` must hold (`REEVE_BLESS=1 cargo test -p reeve-shared --test
/// openapi generated` writes it).
pub fn generated() -> Value {
    let mut doc = super::documented();
    doc.openapi = OpenApiVersion::Version31;
    doc.info = InfoBuilder::new()
        .title("Reeve")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(DESCRIPTION))
        .license(Some(
            LicenseBuilder::new().name(env!("CARGO_PKG_LICENSE")).identifier(Some(env!("CARGO_PKG_LICENSE"))).build(),
        ))
        .build();
    let components = doc.components.get_or_insert_with(Default::default);
    // What a signed offer's and receipt's JWS carries: no route returns
    // these as JSON, so they are added by name.
    let mut signed = Vec::new();
    for (name, schema) in [
        (OfferPayload::name(), <OfferPayload as utoipa::PartialSchema>::schema()),
        (ReceiptPayload::name(), <ReceiptPayload as utoipa::PartialSchema>::schema()),
    ] {
        signed.push((name.into_owned(), schema));
    }
    OfferPayload::schemas(&mut signed);
    ReceiptPayload::schemas(&mut signed);
    components.schemas.extend(signed);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("The `token` from `POST /v1/sessions`. It expires at its `expires_at`."))
                .build(),
        ),
    );
    components.add_security_scheme(
        REPORT_TOKEN,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A job's `report.token`: scoped to one attempt of one task, it expires at the attempt's deadline.",
                ))
                .build(),
        ),
    );
    doc.tags = Some(
        TAGS.iter()
            .map(|(name, description)| TagBuilder::new().name(*name).description(Some(*description)).build())
            .collect(),
    );
    let mut doc = serde_json::to_value(doc).expect("the OpenAPI document serialises");
    // utoipa names only the registered schemes; a share link's is Reeve's own.
    doc["components"]["securitySchemes"][SHARE] = json!({
        "type": "http", "scheme": crate::domain::auth::SHARE_SCHEME,
        "description": "A share link's `share` token from `POST /v1/tasks/{task}/share`: stream tickets of that \
            one task (`POST /v1/tasks/{task}/ticket`) for 24 h, and nothing else.",
    });
    #[cfg(feature = "api-tasks")]
    {
        doc["components"]["securitySchemes"][PAY_LINK] = json!({
            "type": "http", "scheme": crate::domain::pay_links::PAY_LINK_SCHEME,
            "description": "A pay link's token, from the URL an MCP client was given for a priced tool (the \
                console's `/#pay=<token>`): it reads that one offer and pays it (`/v1/pay-link`), for 15 minutes, \
                and nothing else of the Space.",
        });
    }
    stream(&mut doc);
    doc
}

/// Replaces the one routed `POST /v1/tasks/{task}` with an operation per
/// kind: its body is `{"input": <the kind's input_schema>}`, a free kind
/// has no `402` and no payment header, a priced one shows its challenge and
/// has no quota (`429`).
fn per_kind_creates(doc: &mut Value, catalog: &Catalog) {
    let paths = doc["paths"].as_object_mut().expect("paths is an object");
    let template = paths
        .get_mut(CREATE_TEMPLATE)
        .and_then(|item| item.as_object_mut())
        .and_then(|item| item.remove("post"))
        .expect("the create route is documented");
    for (kind, spec) in &catalog.tasks {
        let path = format!("/v1/tasks/{kind}");
        let op = create_operation(&template, catalog, kind, spec, &path);
        paths.insert(path, json!({ "post": op }));
    }
}

fn create_operation(template: &Value, catalog: &Catalog, kind: &str, spec: &TaskSpec, path: &str) -> Value {
    let mut op = template.clone();
    op["operationId"] = json!(format!("create_task_{}", kind.replace('-', "_")));
    op["summary"] = json!(format!("Create a `{kind}` task: {}", spec.title));
    op["description"] = json!(format!("{}\n\n{}", spec.description, op["description"].as_str().unwrap_or_default()));
    let params = op["parameters"].as_array_mut().expect("create has parameters");
    params.retain(|p| p["in"] != "path");
    if spec.is_free() {
        params.retain(|p| !p["name"].as_str().is_some_and(|n| n.eq_ignore_ascii_case(x402::PAYMENT_SIGNATURE_HEADER)));
    }
    for p in params.iter_mut() {
        // Printable ASCII, as the server checks: a schema that allowed more
        // would describe requests it refuses.
        if p["name"].as_str().is_some_and(|n| n.eq_ignore_ascii_case(super::IDEMPOTENCY_KEY_HEADER)) {
            p["schema"]["pattern"] = json!("^[ -~]+$");
        }
    }
    op["requestBody"] = json!({
        "description": format!("The input of a `{kind}` task, matching its `input_schema` in `GET /v1/catalog`."),
        "required": true,
        "content": {"application/json": {"schema": {
            "type": "object",
            "required": ["input"],
            "additionalProperties": false,
            "properties": {
                "input": spec.input_schema,
                "webhook": {"$ref": "#/components/schemas/WebhookRequest"},
            },
        }}},
    });
    let responses = op["responses"].as_object_mut().expect("create has responses");
    // The kind is in the path, so it exists.
    responses.remove("404");
    match x402::payment_required(catalog, spec, path, x402::SIGNATURE_REQUIRED) {
        None => {
            responses.remove("402");
        }
        Some(challenge) => {
            // Payment is a priced kind's limit: no quota.
            responses.remove("429");
            let example = serde_json::to_value(&challenge).expect("the challenge serialises");
            if let Some(content) = responses.get_mut("402").and_then(|r| r.pointer_mut("/content/application~1json")) {
                content["example"] = example;
            }
        }
    }
    op
}

/// `POST /v1/uploads` as the catalog configures it.
fn upload_policy(doc: &mut Value, catalog: &Catalog) {
    let Some(schema) = doc.pointer_mut("/components/schemas/CreateUpload/properties") else {
        return;
    };
    let policy = &catalog.uploads;
    // What presign checks of a name: not blank, no control character.
    schema["filename"]["minLength"] = json!(1);
    schema["filename"]["maxLength"] = json!(crate::domain::catalog::MAX_FILENAME_BYTES);
    schema["filename"]["pattern"] =
        json!("^[^\\x00-\\x1f\\x7f-\\x9f]*[^\\s\\x00-\\x1f\\x7f-\\x9f][^\\x00-\\x1f\\x7f-\\x9f]*$");
    schema["size"]["maximum"] = json!(policy.max_bytes);
    schema["content_type"]["enum"] = json!(policy.content_types);
    if let Some(first) = policy.content_types.first() {
        schema["content_type"]["example"] = json!(first);
    }
}

/// The relay's SSE stream, which is no utoipa route: it is served by the
/// relay (and by `reeve serve`), not by a Lambda function.
fn stream(doc: &mut Value) {
    let error = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}},
        })
    };
    let op = json!({
        "tags": ["tasks"],
        "operationId": "task_stream",
        "summary": "Follow a task live",
        "description": "Served by the relay, not the API functions. An SSE stream: first every event \
            after the resume point, then live ones until the task ends, when the stream closes. Each \
            message has `id: <seq>`, `event: <type>` and `data: <TaskEvent JSON>`; a `:` comment keeps \
            the connection alive every 15 s. EventSource cannot send headers, so the stream also opens with \
            `?ticket=` from `POST /v1/tasks/{task}/ticket` (this task only, 60 s to connect; the stream \
            then lives on), and the resume point may come as `last_event_id`. A session token in the URL \
            is refused with `token_in_url`. A resume \
            point at or past a finished task's last event gets its terminal status again, then the end. \
            Each relay process caps the streams a Space and a client address hold open at once.",
        "security": [{ BEARER: [] }, { TICKET: [] }],
        "parameters": [
            {"name": "task", "in": "path", "required": true, "description": "The task id.",
                "schema": {"$ref": "#/components/schemas/Id"}},
            {"name": "ticket", "in": "query", "required": false,
                "description": "A stream ticket for this task, from `POST /v1/tasks/{task}/ticket`.",
                "schema": {"type": "string"}},
            {"name": "last_event_id", "in": "query", "required": false,
                "description": "Replay only events after this `seq`.",
                "schema": {"type": "integer", "minimum": 0, "maximum": i64::MAX}},
            {"name": "Last-Event-ID", "in": "header", "required": false,
                "description": "What EventSource sends when it reconnects; wins over `last_event_id`.",
                "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}},
        ],
        "responses": {
            "200": {
                "description": "The event stream.",
                "content": {"text/event-stream": {
                    "schema": {"type": "string", "description": "SSE messages whose `data` is a `TaskEvent`."},
                    "x-event-data": {"$ref": "#/components/schemas/TaskEvent"},
                    "example": "id: 1\nevent: status\ndata: {\"seq\":1,\"type\":\"status\",\"data\":{\"status\":\"queued\"},\"at\":\"2026-01-01T00:00:00Z\"}\n\n",
                }},
            },
            "400": error("`invalid_last_event_id`: the resume point is not a non-negative event number."),
            "401": error("`missing_token`: neither an `Authorization: Bearer` header nor `ticket`; \
                `invalid_token`: the token is malformed, tampered with, expired or ended; `invalid_ticket`: \
                the ticket is malformed, expired, for another task, or its session was ended; \
                `token_in_url`: a session token in the query string (`access_token` included)."),
            "404": error("`task_not_found`: no such task in this Space (or not a task id at all)."),
            "429": {
                "description": "`too_many_streams`: this Space or this client address already holds as \
                    many streams open on this relay as it may; close one, or try again after `Retry-After` \
                    seconds.",
                "headers": {"Retry-After": {"description": "Seconds to wait before trying again.",
                    "schema": {"type": "integer", "minimum": 1}}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}},
            },
            "500": error("`internal`: an unexpected failure, logged under the request id."),
            "503": error("`database_unavailable`: the database is out of reach; try again."),
        },
    });
    doc["paths"][STREAM_PATH] = json!({ "get": op });
    let components = doc["components"].as_object_mut().expect("components");
    components["securitySchemes"][TICKET] = json!({
        "type": "apiKey", "in": "query", "name": "ticket",
        "description": "A stream ticket from `POST /v1/tasks/{task}/ticket`: the relay's stream of that one task \
            only, for EventSource, 60 s to connect. Never a session token: one in a URL is `token_in_url`.",
    });
    let schemas = components.entry("schemas").or_insert_with(|| Value::Object(Map::new()));
    schemas["TaskEvent"] = json!({
        "type": "object",
        "description": "One entry of a task's event log.",
        "required": ["seq", "type", "data", "at"],
        "properties": {
            "seq": {"type": "integer", "minimum": 1, "description": "1, 2, 3… with no gaps, per task."},
            "type": {"type": "string", "enum": ["status", "progress", "log", "result", "error"]},
            "data": {"type": "object", "description": "`status`: `{status}`; `progress`: `{fraction}` \
                from 0 to 1; `log`: `{line}`; `result`: the result; `error`: `{code, message}`."},
            "at": {"type": "string", "format": "date-time"},
        },
    });
}
