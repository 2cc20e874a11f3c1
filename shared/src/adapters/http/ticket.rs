//! `POST /v1/tasks/{task}/ticket`: a stream ticket, so that a browser's
//! `EventSource`, which cannot send headers, opens a task's stream without a
//! session token in its URL.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use serde::Serialize;
use time::OffsetDateTime;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskStatusContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope, db_error};
use super::extract::CurrentSession;
use crate::domain::ids::Id;
use crate::domain::sessions;

pub fn router() -> OpenApiRouter<Arc<TaskStatusContext>> {
    OpenApiRouter::default().routes(routes!(stream_ticket))
}

/// A ticket to one task's stream.
#[derive(Serialize, ToSchema)]
struct StreamTicket {
    /// Send it as `?ticket=` on `GET /v1/tasks/{task}/events` of this task.
    ticket: String,
    /// Connect before then (60 s); a stream it opened lives on.
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
}

/// Get a stream ticket
///
/// A ticket that opens this one task's event stream (`?ticket=` on
/// `GET /v1/tasks/{task}/events`), read-only, for 60 s to connect; a stream
/// it opened lives on. It is refused on every other route and as a bearer
/// token, and ending the session ends it. For an `EventSource`, which cannot
/// send the `Authorization` header: a session token in a URL is refused.
#[utoipa::path(
    post,
    path = "/v1/tasks/{task}/ticket",
    tag = "tasks",
    security(("bearer" = [])),
    params(
        ("task" = Id, Path, description = "The task id, from `POST /v1/tasks/{kind}`."),
    ),
    responses(
        (status = 200, description = "The ticket.", body = StreamTicket),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope,
            description = "`task_not_found`: no such task in this Space (or not a task id at all)."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn stream_ticket(
    State(ctx): State<Arc<TaskStatusContext>>,
    CurrentSession(session): CurrentSession,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<StreamTicket>> {
    let Some(task) = id.ok().and_then(|Path(id)| id.parse::<Id>().ok()) else {
        return Err(ApiError::task_not_found());
    };
    let (ticket, expires_at) = sessions::ticket_for(&ctx.db, &ctx.token_key, &session, task)
        .await
        .map_err(db_error)?
        .ok_or_else(ApiError::task_not_found)?;
    Ok(Json(StreamTicket { ticket, expires_at }))
}
