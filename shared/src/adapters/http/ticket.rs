//! `POST /v1/tasks/{task}/ticket`: a stream ticket, so that a browser's
//! `EventSource`, which cannot send headers, opens a task's stream without a
//! session token in its URL. The Space's session asks for one with
//! `Authorization: Bearer`; someone the owner shared the task with asks
//! with the share link's token, `Authorization: Share` (`super::share`).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde::Serialize;
use time::OffsetDateTime;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskStatusContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope, db_error};
use super::extract::{bearer_token, checked_session, share_token};
use crate::domain::auth;
use crate::domain::error::TokenRefusal;
use crate::domain::ids::Id;
use crate::domain::sessions::{self, SharedTicket};

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
///
/// Asked for with the Space's session (`Authorization: Bearer`), or with a
/// share link's token of this task (`Authorization: Share <share>`, from
/// `POST /v1/tasks/{task}/share`): what a shared page renews its stream
/// with, for as long as the link lasts.
#[utoipa::path(
    post,
    path = "/v1/tasks/{task}/ticket",
    tag = "tasks",
    security(("bearer" = []), ("share" = [])),
    params(
        ("task" = Id, Path, description = "The task id, from `POST /v1/tasks/{kind}`."),
    ),
    responses(
        (status = 200, description = "The ticket.", body = StreamTicket),
        (status = 401, description = concat!(doc_401_token!(), " `invalid_share`: the share link's token is \
            malformed, tampered with, expired (24 h), for another task, or was made before a rotation of the \
            Space ID."), body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope,
            description = "`task_not_found`: no such task in this Space (or not a task id at all)."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn stream_ticket(
    State(ctx): State<Arc<TaskStatusContext>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<StreamTicket>> {
    let task = id.ok().and_then(|Path(id)| id.parse::<Id>().ok());
    if let Some(share) = share_token(&headers) {
        let (ticket, expires_at) = shared_ticket(&ctx, share, task).await?;
        return Ok(Json(StreamTicket { ticket, expires_at }));
    }
    let Some(token) = bearer_token(&headers)? else {
        let why = "send Authorization: Bearer <token> from POST /v1/sessions, or Authorization: Share <share> of a \
            share link";
        return Err(ApiError::refused_saying(&TokenRefusal::Missing, why));
    };
    let session = checked_session(&ctx.db, &ctx.token_key, token).await?;
    let task = task.ok_or_else(ApiError::task_not_found)?;
    let (ticket, expires_at) = sessions::ticket_for(&ctx.db, &ctx.token_key, &session, task)
        .await
        .map_err(db_error)?
        .ok_or_else(ApiError::task_not_found)?;
    Ok(Json(StreamTicket { ticket, expires_at }))
}

/// A ticket asked for with a share link's token: signed, for this task (a
/// link for another task, or for no task id at all, opens nothing here),
/// within its day, and not ended by a rotation.
async fn shared_ticket(
    ctx: &TaskStatusContext,
    share: &str,
    task: Option<Id>,
) -> Result<(String, OffsetDateTime), ApiError> {
    let refused = |why: &dyn std::fmt::Display| {
        tracing::debug!(reason = %why, "share link refused");
        ApiError::refused(&TokenRefusal::Share)
    };
    let Some(task) = task else { return Err(refused(&"not a task id")) };
    let share = auth::verify_share(&ctx.token_key, share, task.to_bytes(), OffsetDateTime::now_utc())
        .map_err(|e| refused(&e))?;
    match sessions::ticket_for_share(&ctx.db, &ctx.token_key, &share).await.map_err(db_error)? {
        SharedTicket::Issued(ticket, expires_at) => Ok((ticket, expires_at)),
        SharedTicket::NoTask => Err(ApiError::task_not_found()),
        SharedTicket::Ended => Err(refused(&"the Space ID was rotated after the link was made")),
    }
}
