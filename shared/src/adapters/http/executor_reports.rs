//! `POST /v1/executor/reports`: where a service that accepted a job reports
//! on its attempt (docs/executors.md, "Reports"), with the attempt's report
//! token as its bearer credential. The work is the domain's
//! (`domain::executors::service`); this file reads the request, answers in
//! the error envelope, and queues what the report asks to be queued once it
//! is committed.
//!
//! It is served by the task-create function: of the API's functions it is
//! the one that already holds what a report needs, the token key, Postgres,
//! `sqs:SendMessage` on the task queue (a retryable failure's next attempt,
//! a metered result's capture) and S3, with Redis (the doorbell) in every
//! function's environment; task-status has no SQS.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskCreateContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope, db_error};
use super::extract::bearer_token;
use crate::domain::executors::service::{self, MAX_RESULT_BYTES, ReportRefusal, Reports, Then};
use crate::domain::tasks::enqueue_after;

/// The report route's path.
pub const PATH: &str = "/v1/executor/reports";

/// `POST /v1/executor/reports`, on the task-create function's context.
pub fn router() -> OpenApiRouter<Arc<TaskCreateContext>> {
    // A result may be up to 1 MiB of JSON: more than the API's 64 KiB.
    OpenApiRouter::default().routes(routes!(report)).layer(DefaultBodyLimit::max(MAX_RESULT_BYTES + 64 * 1024))
}

/// One report, as docs/executors.md lists them: `id` (chosen by the
/// service, unique within the attempt) and `type`, with the fields of its
/// type.
#[derive(Deserialize, ToSchema)]
#[allow(dead_code)]
struct ReportRequest {
    /// 1 to 64 characters of `[A-Za-z0-9_.:-]`.
    id: String,
    /// `heartbeat`, `progress`, `log`, `usage`, `output`, `result` or `failure`.
    r#type: String,
    /// `progress`: how far, from 0 to 1.
    fraction: Option<f64>,
    /// `progress` (at most 500 characters), or a permanent `failure`'s
    /// message, shown to the buyer.
    message: Option<String>,
    /// `log`: one line, at most 2,000 characters.
    line: Option<String>,
    /// `usage`, `result`: the units used so far (a metered kind).
    used: Option<u64>,
    /// `output`: the file's name, `[A-Za-z0-9._-]{1,100}`, not `.` or `..`.
    name: Option<String>,
    /// `output`: the file's exact size in bytes, at most the catalog's
    /// `uploads.max_bytes`.
    size: Option<u64>,
    /// `output`: the file's media type, which its PUT must carry.
    content_type: Option<String>,
    /// `result`: the task's result, a JSON object of at most 1 MiB.
    result: Option<Value>,
    /// `failure`: whether another attempt may succeed.
    retryable: Option<bool>,
    /// `failure`, retryable: the wait before the next attempt.
    retry_after_seconds: Option<u64>,
}

/// What a recorded report answers (the same again for the same `id`): for
/// an `output` report, where to PUT the file; for the others `recorded`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct ReportAnswer {
    recorded: Option<bool>,
    /// `usage`, a metered `result`: the units recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    used: Option<u64>,
    /// `output`: a presigned PUT of `outputs/<space>/<task>/files/<name>`,
    /// signed anew each time the report is answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    /// `output`: `PUT`.
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<String>,
    /// `output`: the headers the PUT must carry as given (they are signed:
    /// `content-length` is the declared size, `content-type` its type).
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<std::collections::BTreeMap<String, String>>,
    /// `output`: when the PUT's signature dies: the attempt's deadline, or
    /// 15 minutes (the bucket's largest signature age), whichever is sooner.
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
}

/// Report on an accepted job
///
/// A service that answered a job `202` reports here with the job's
/// `report.token` as its bearer token, one report per request. Each is
/// idempotent by its `id`: sent again, it answers what it answered the
/// first time and does nothing more (an `output` report's PUT is signed
/// again). Reports are fenced on the attempt the
/// token names: a later attempt, a cancel or an end already recorded
/// answers `409`, and the service should stop.
#[utoipa::path(
    post,
    path = "/v1/executor/reports",
    tag = "executors",
    security(("report_token" = [])),
    request_body = ReportRequest,
    responses(
        (status = 200, description = "Recorded, or recorded already under this `id`.", body = ReportAnswer),
        (status = 400, body = ErrorEnvelope,
            description = "`invalid_report`: the report is malformed; the message names the field."),
        (status = 401, body = ErrorEnvelope,
            description = "`invalid_report_token`: the report token is missing, forged or expired."),
        (status = 409, body = ErrorEnvelope,
            description = "`superseded`: the attempt is no longer the task's (another one runs); \
                           `canceled`: the buyer canceled the task; `ended`: the attempt already ended. \
                           Stop working on it."),
        (status = 413, body = ErrorEnvelope,
            description = "`too_large`: the result is over 1 MiB, or the output over the uploads' `max_bytes` \
                           (or the attempt's 101st file); `body_too_large`: the body is larger still."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope, description = concat!(doc_503_db!(),
            " `storage_unavailable`: an output's PUT could not be signed; send the report again.")),
    ),
)]
async fn report(State(ctx): State<Arc<TaskCreateContext>>, headers: HeaderMap, body: Bytes) -> ApiResult<Json<Value>> {
    let bearer = bearer_token(&headers).map_err(|_| refused(ReportRefusal::Token))?;
    let token = service::token(&ctx.settings.token_key, bearer).map_err(refused)?;
    let (id, report) = service::parse(&body).map_err(refused)?;
    let reports = Reports {
        db: &ctx.db,
        events: &ctx.events,
        catalog: &ctx.catalog,
        lease: ctx.lease,
        max_attempts: ctx.max_attempts,
        s3: &ctx.aws.objects,
        bucket: &ctx.settings.bucket,
        max_output_bytes: ctx.catalog.uploads.max_bytes,
        output_retention_days: ctx.settings.output_retention_days,
    };
    let answered = match service::apply(&reports, &token, &id, &report).await {
        Ok(answered) => answered,
        Err(Ok(refusal)) => return Err(refused(refusal)),
        Err(Err(e)) => return Err(db_error(e)),
    };
    if let Then::Enqueue { kind, delay } = &answered.then {
        let task = crate::domain::ids::Id::from_bytes(&token.task).expect("the token's task was read");
        // Written already: a lost message costs only time, since the
        // sweeper re-sends a task left queued (or running past its lease).
        if let Err(e) =
            enqueue_after(&ctx.aws.sqs, &ctx.settings.queue_url, task, kind, Some(&token.space), *delay).await
        {
            tracing::warn!(error = %e, %task, "could not queue the task after a report; the sweeper will");
        }
    }
    if let Some(put) = &answered.output {
        // Signed as it is answered, the first time and each time again.
        return match service::sign_output(&ctx.aws.objects, &ctx.settings.bucket, put).await {
            Ok(upload) => Ok(Json(upload)),
            Err(e) => {
                tracing::error!(error = %e, "could not sign an output's PUT");
                Err(ApiError::unavailable("storage_unavailable", "the output's upload could not be signed; try again"))
            }
        };
    }
    Ok(Json(answered.body))
}

fn refused(refusal: ReportRefusal) -> ApiError {
    let mut error = ApiError::refused(&refusal);
    if matches!(refusal, ReportRefusal::TooLarge | ReportRefusal::OutputTooLarge { .. }) {
        error.status = axum::http::StatusCode::PAYLOAD_TOO_LARGE;
    }
    error
}
