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

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::Ctx;
use super::extract::{JsonBody, Session};
use crate::error::{self, ApiError, ApiResult};
use crate::ids::Id;
use crate::uploads::{self, CreateError, UploadRequest};

pub fn router() -> Router<Ctx> {
    Router::new().route("/v1/uploads", post(create_upload))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateUpload {
    /// Optional here so that a missing name gets `invalid_filename`, not a
    /// generic shape error.
    #[serde(default)]
    filename: Option<String>,
    content_type: String,
    size: u64,
}

#[derive(Serialize)]
struct UploadCreated {
    upload_id: Id,
    url: String,
    method: String,
    headers: BTreeMap<String, String>,
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
}

async fn create_upload(
    State(ctx): State<Ctx>,
    Session(space): Session,
    JsonBody(body): JsonBody<CreateUpload>,
) -> ApiResult<(StatusCode, Json<UploadCreated>)> {
    let policy = &ctx.catalog.uploads;
    let request = UploadRequest { filename: body.filename, content_type: body.content_type, size: body.size };
    let expires_in = Duration::from_secs(policy.url_expiry_seconds.into());
    let presigned = uploads::create(&ctx.db, &ctx.aws.s3, &ctx.settings.bucket, policy, &space, request, expires_in)
        .await
        .map_err(create_error)?;
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

fn create_error(e: CreateError) -> ApiError {
    match e {
        CreateError::InvalidFilename(why) => ApiError::bad_request("invalid_filename", why),
        CreateError::InvalidSize => ApiError::bad_request("invalid_request", "size must be a positive integer"),
        CreateError::TooLarge { max_bytes, .. } => {
            ApiError::bad_request("upload_too_large", format!("size exceeds the upload limit of {max_bytes} bytes"))
        }
        CreateError::UnsupportedContentType { allowed } => ApiError::bad_request(
            "unsupported_content_type",
            format!("content_type must be one of: {}", allowed.join(", ")),
        ),
        CreateError::Storage(cause) => storage_unavailable(cause),
        CreateError::Db(db) => error::db_error(db),
    }
}

fn storage_unavailable(cause: String) -> ApiError {
    tracing::error!(error = %cause, "storage unavailable");
    ApiError::unavailable("storage_unavailable", "file storage is unavailable; try again")
}
