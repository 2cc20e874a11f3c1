//! `POST /v1/tasks/{task}/share`: a link that lets someone else watch one
//! task, and nothing more (`domain::auth::share`). The link is the console's
//! page with the task and the share token in its fragment, which browsers
//! send to no server, so no access log keeps it; the page trades the token
//! for stream tickets (`Authorization: Share` on `POST
//! /v1/tasks/{task}/ticket`) each time it connects.

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
    OpenApiRouter::default().routes(routes!(share_task))
}

/// A share link to one task.
#[derive(Serialize, ToSchema)]
struct ShareLink {
    /// The share token: `Authorization: Share <share>` on
    /// `POST /v1/tasks/{task}/ticket` of this task, and nowhere else.
    share: String,
    /// The link stops giving tickets then (24 h); a stream open at that
    /// moment runs on until the task ends or it disconnects.
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
    /// The console's link, relative to the console's origin (the relay's
    /// URL): `/#task=<task>&share=<share>`. The token is in the fragment,
    /// which a browser sends to no server.
    url: String,
}

/// Share a task
///
/// A link for someone else to watch this one task, read-only, for 24 hours:
/// its token only gets stream tickets of this task (`Authorization: Share
/// <share>` on `POST /v1/tasks/{task}/ticket`), never a session: it cannot
/// list, create, cancel or pay for tasks, read the Space, its results or its
/// payments, or rotate it. It outlives the session that made it; rotating
/// the Space ID (`POST /v1/space/rotate`) ends every link made before.
/// Each call makes a new link.
#[utoipa::path(
    post,
    path = "/v1/tasks/{task}/share",
    tag = "tasks",
    security(("bearer" = [])),
    params(
        ("task" = Id, Path, description = "The task id, from `POST /v1/tasks/{kind}`."),
    ),
    responses(
        (status = 200, description = "The link.", body = ShareLink),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope,
            description = "`task_not_found`: no such task in this Space (or not a task id at all)."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn share_task(
    State(ctx): State<Arc<TaskStatusContext>>,
    CurrentSession(session): CurrentSession,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<ShareLink>> {
    let Some(task) = id.ok().and_then(|Path(id)| id.parse::<Id>().ok()) else {
        return Err(ApiError::task_not_found());
    };
    let (share, expires_at) = sessions::share_for(&ctx.db, &ctx.token_key, &session, task)
        .await
        .map_err(db_error)?
        .ok_or_else(ApiError::task_not_found)?;
    let url = format!("/#task={task}&share={share}");
    Ok(Json(ShareLink { share, expires_at, url }))
}
