//! The OpenAPI 3.1 document of every route, served at `GET /v1/openapi.json`.
//!
//! Each module router is a utoipa-axum `OpenApiRouter` built with
//! `routes!(handler)`: the handler's `#[utoipa::path]` gives both the axum
//! route and its operation, so the document and the routing cannot drift.
//! [`openapi`] merges every module's router, keeps the document and adds what
//! no single route owns: the info, the bearer scheme and the tag list.

use std::sync::LazyLock;

use axum::body::Bytes;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::tag::TagBuilder;
use utoipa::openapi::{InfoBuilder, LicenseBuilder, OpenApi, OpenApiVersion};

/// The name of the bearer security scheme. Operations spell it out as a
/// literal, `security(("bearer" = []))`: the macro takes nothing else.
pub const BEARER: &str = "bearer";

const DESCRIPTION: &str = "\
Reeve is a zero-account, pay-per-task job service.

1. `POST /v1/spaces` creates a Space and shows its 20-digit Space ID once.
2. `POST /v1/sessions` trades the Space ID for a short-lived bearer token, \
which every other call that needs one sends as `Authorization: Bearer <token>`.
3. `GET /v1/catalog` lists the task kinds, their input schemas and prices.
4. `POST /v1/uploads` returns a presigned URL to `PUT` one input file to.
5. `POST /v1/tasks/{kind}` creates a task. A priced task answers `402` with \
x402 v2 payment requirements until it is paid.
6. `GET /v1/tasks/{id}` returns a snapshot of the task.

Every response carries an `x-request-id` header. Every error (but the x402 \
`402`) has the body `{\"error\": {\"code\", \"message\", \"request_id\"}}`; \
`code` is stable and each operation lists the codes it can answer. Any route \
also answers `405 method_not_allowed` to a method it does not serve, and an \
unknown path is `404 not_found`.";

const TAGS: [(&str, &str); 5] = [
    ("spaces", "Spaces and the sessions that authenticate every other call."),
    ("catalog", "What Reeve sells, and this document. No token needed."),
    ("uploads", "Presigned uploads of task input files."),
    ("tasks", "Creating tasks (paid with x402 when priced) and reading them back."),
    ("health", "Whether the process can serve."),
];

/// The document for every route of [`super::app`].
pub fn openapi() -> OpenApi {
    let (_, mut doc) = super::routes().split_for_parts();
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
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("The `token` from `POST /v1/sessions`. It expires at its `expires_at`."))
                .build(),
        ),
    );
    doc.tags = Some(
        TAGS.iter()
            .map(|(name, description)| TagBuilder::new().name(*name).description(Some(*description)).build())
            .collect(),
    );
    doc
}

/// [`openapi`] as JSON, rendered once per process: it cannot change at run time.
pub(super) fn json() -> Bytes {
    static JSON: LazyLock<Bytes> =
        LazyLock::new(|| serde_json::to_vec(&openapi()).expect("the OpenAPI document serialises").into());
    JSON.clone()
}
