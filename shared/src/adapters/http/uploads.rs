//! `POST /v1/uploads`: the presign function's route.
//!
//! `{filename, content_type, size}` with a bearer token answers `201 Created`
//! with `{upload_id, url, method: "PUT", headers, expires_at}`; the client
//! PUTs the bytes to `url` sending exactly `headers`.
//!
//! Errors (all `400` unless noted): `invalid_filename` (missing, empty, over
//! 255 bytes, control characters), `invalid_request` (size not a positive
//! integer, or any other wrong shape), `upload_too_large` (the message names
//! the limit), `unsupported_content_type` (the message lists the allowed
//! types), `503 storage_unavailable` when presigning fails, and the shared
//! ones: `401 missing_token`/`invalid_token`, `400 invalid_json`,
//! `413 body_too_large`, `415 unsupported_media_type`.

use std::sync::Arc;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::UploadsContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope};
use super::extract::{JsonBody, Session};
use crate::domain::ids::Id;
use crate::domain::uploads::{self, UploadRequest};

pub fn router() -> OpenApiRouter<Arc<UploadsContext>> {
    OpenApiRouter::default().routes(routes!(create_upload))
}

/// One file to upload.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateUpload {
    // Optional in serde so that a missing name gets `invalid_filename`, not
    // a generic shape error; required as far as clients are concerned.
    /// The file's name: 1 to 255 bytes, no control characters.
    #[serde(default)]
    #[schema(value_type = String, required = true, example = "photo.png")]
    filename: Option<String>,
    /// One of the catalog's `uploads.content_types`.
    #[schema(example = "image/png")]
    content_type: String,
    /// The exact size in bytes, at most the catalog's `uploads.max_bytes`.
    #[serde(deserialize_with = "super::extract::whole_number")]
    #[schema(minimum = 1, example = 48213)]
    size: u64,
}

/// Where and how to upload the file.
#[derive(Serialize, ToSchema)]
struct UploadCreated {
    /// Refer to the file by this id in a task's input (`upload_id` or
    /// `upload_ids` fields).
    upload_id: Id,
    /// The presigned URL to send the bytes to.
    url: String,
    /// Always `PUT`.
    method: String,
    /// Send exactly these headers with the `PUT`.
    headers: BTreeMap<String, String>,
    /// When `url` stops working.
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
}

/// Upload an input file
///
/// Answers a presigned URL: the client `PUT`s the bytes to it, straight to
/// object storage, sending exactly the `headers` given. A task can use the
/// file once it has arrived.
#[utoipa::path(
    post,
    path = "/v1/uploads",
    tag = "uploads",
    security(("bearer" = [])),
    request_body = CreateUpload,
    responses(
        (status = 201, description = "The upload URL.", body = UploadCreated),
        (status = 400, body = ErrorEnvelope, description = concat!(
            "`invalid_filename`: missing, empty, over 255 bytes or with control characters; ",
            "`invalid_request`: `size` is not a positive integer, or another shape error; ",
            "`upload_too_large`: over the limit, which the message names; ",
            "`unsupported_content_type`: the message lists the allowed types; ",
            doc_400_json!())),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 413, description = doc_413!(), body = ErrorEnvelope),
        (status = 415, description = doc_415!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope, description = concat!(
            "`storage_unavailable`: the URL could not be presigned; try again; ",
            doc_503_db!())),
    ),
)]

async fn create_upload(
    State(ctx): State<Arc<UploadsContext>>,
    Session(space): Session,
    JsonBody(body): JsonBody<CreateUpload>,
) -> ApiResult<(StatusCode, Json<UploadCreated>)> {
    let policy = &ctx.uploads;
    let request = UploadRequest { filename: body.filename, content_type: body.content_type, size: body.size };
    let expires_in = Duration::from_secs(policy.url_expiry_seconds.into());
    let presigned = uploads::create(&ctx.db, &ctx.s3, &ctx.bucket, policy, &space, request, expires_in)
        .await
        .map_err(|e| ApiError::refused(&e))?;
    Ok((
        StatusCode::CREATED,
        Json(UploadCreated {
            upload_id: presigned.id,
            url: presigned.url,
            method: presigned.method,
            headers: presigned.headers,
            expires_at: presigned.expires_at,
        }),
    ))
}
