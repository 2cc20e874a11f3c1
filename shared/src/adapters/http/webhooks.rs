//! The owner's webhook routes, on the task-status function (Postgres only,
//! like the rest of what an owner reads and manages there):
//! - `POST /v1/space/webhook-secret`: make or rotate the Space's signing
//!   secret, shown once;
//! - `GET`, `PUT` and `DELETE /v1/space/webhook`: the Space's default
//!   endpoint for tasks that name none;
//! - `GET /v1/tasks/{id}/webhooks`: a task's deliveries, every attempt.
//!
//! A task names its own endpoint in its create body (`webhook`,
//! `adapters/http/tasks.rs`). The domain is [`crate::domain::webhooks`].

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use time::OffsetDateTime;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskStatusContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope, db_error};
use super::extract::{JsonBody, Session};
use crate::domain::ids::Id;
use crate::domain::webhooks::outbox::{self, DeliveryView};
use crate::domain::webhooks::{self, ROTATION_GRACE, Subscription, secrets};

pub fn router() -> OpenApiRouter<Arc<TaskStatusContext>> {
    OpenApiRouter::default()
        .routes(routes!(rotate_secret))
        .routes(routes!(read_default, set_default, remove_default))
        .routes(routes!(task_webhooks))
}

/// A signing secret, shown once.
#[derive(Serialize, ToSchema)]
struct NewSecret {
    /// `whsec_<base64>`: verify deliveries with it (any Standard Webhooks
    /// library). Reeve shows it this once.
    #[schema(example = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]
    secret: String,
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
    /// When the secret this one replaced stops signing: until then every
    /// delivery carries both signatures. `null` for a Space's first.
    #[serde(with = "time::serde::rfc3339::option")]
    previous_expires_at: Option<OffsetDateTime>,
}

/// Create or rotate the webhook secret
///
/// Makes a new signing secret for the Space's completion webhooks and
/// shows it once. Called again, it rotates: the new secret signs from now
/// on, and the one it replaces keeps signing beside it for 24 hours (each
/// delivery's `webhook-signature` then holds both, space-separated), so a
/// receiver can switch without missing one. A secret still in its 24 hours
/// when another rotation comes stops at once.
#[utoipa::path(
    post,
    path = "/v1/space/webhook-secret",
    tag = "webhooks",
    security(("bearer" = [])),
    responses(
        (status = 201, description = "The new secret, shown this once.", body = NewSecret),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn rotate_secret(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
) -> ApiResult<(StatusCode, Json<NewSecret>)> {
    let rotated = secrets::rotate(&ctx.db, &space).await.map_err(db_error)?;
    debug_assert_eq!(ROTATION_GRACE.as_secs(), 24 * 3600, "the documentation says 24 hours");
    let body = NewSecret {
        secret: rotated.key.secret_text(),
        created_at: rotated.created_at,
        previous_expires_at: rotated.previous_expires_at,
    };
    Ok((StatusCode::CREATED, Json(body)))
}

/// The Space's default endpoint.
#[derive(Serialize, ToSchema)]
struct SpaceWebhook {
    /// Where tasks that name no `webhook` are delivered; `null` for none.
    default: Option<Subscription>,
    /// URLs that answered `410 Gone`: nothing more is sent to them until
    /// one is set again as the default (`PUT /v1/space/webhook`).
    disabled: Vec<String>,
}

/// Read the default webhook
///
/// The endpoint the Space's tasks are delivered to when they name none,
/// and the endpoints a `410` disabled.
#[utoipa::path(
    get,
    path = "/v1/space/webhook",
    tag = "webhooks",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The default and the disabled endpoints.", body = SpaceWebhook),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn read_default(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
) -> ApiResult<Json<SpaceWebhook>> {
    let (default, disabled) = webhooks::default_of(&ctx.db, &space).await.map_err(db_error)?;
    Ok(Json(SpaceWebhook { default, disabled }))
}

/// Set the default webhook
///
/// Every task of the Space that names no `webhook` is delivered here when
/// it ends with one of `events` (and while it runs, with `progress`
/// among them). Setting a URL a `410` disabled enables it
/// again. Needs the Space's secret first (`POST /v1/space/webhook-secret`).
#[utoipa::path(
    put,
    path = "/v1/space/webhook",
    tag = "webhooks",
    security(("bearer" = [])),
    request_body = Subscription,
    responses(
        (status = 200, description = "The default and the disabled endpoints.", body = SpaceWebhook),
        (status = 400, description = doc_400_json!(), body = ErrorEnvelope),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 413, description = doc_413!(), body = ErrorEnvelope),
        (status = 415, description = doc_415!(), body = ErrorEnvelope),
        (status = 422, body = ErrorEnvelope, description = doc_422_webhook!()),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn set_default(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
    JsonBody(subscription): JsonBody<Subscription>,
) -> ApiResult<Json<SpaceWebhook>> {
    webhooks::set_default(&ctx.db, &space, Some(subscription)).await.map_err(|e| ApiError::refused(&e))?;
    read_default(State(ctx), Session(space)).await
}

/// Remove the default webhook
///
/// Tasks that name no `webhook` are no longer delivered anywhere.
#[utoipa::path(
    delete,
    path = "/v1/space/webhook",
    tag = "webhooks",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The default (now none) and the disabled endpoints.", body = SpaceWebhook),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn remove_default(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
) -> ApiResult<Json<SpaceWebhook>> {
    webhooks::set_default(&ctx.db, &space, None).await.map_err(|e| ApiError::refused(&e))?;
    read_default(State(ctx), Session(space)).await
}

/// A task's webhook deliveries.
#[derive(Serialize, ToSchema)]
#[schema(as = TaskWebhooks)]
struct Deliveries {
    /// Oldest first: one per end delivered (a task ends once), and, when
    /// `progress` was asked for, one per progress delivery (coalesced: at
    /// most one waits at a time). None while it has neither ended nor made
    /// progress that was asked for, or when it ended with an event nobody
    /// asked for.
    deliveries: Vec<DeliveryView>,
}

/// List a task's webhook deliveries
///
/// The webhook deliveries of one of the Space's tasks, with every attempt:
/// its time, the endpoint's status, why it did not count (a timeout, a
/// refused address, a redirect not followed, a status that is not 2xx)
/// and when it is tried next.
#[utoipa::path(
    get,
    path = "/v1/tasks/{task}/webhooks",
    tag = "webhooks",
    security(("bearer" = [])),
    params(
        ("task" = Id, Path, description = "The task id, from `POST /v1/tasks/{kind}`."),
    ),
    responses(
        (status = 200, description = "The task's deliveries and their attempts.", body = Deliveries),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope,
            description = "`task_not_found`: no such task in this Space (or not a task id at all)."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn task_webhooks(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Deliveries>> {
    let Some(id) = id.ok().and_then(|Path(id)| id.parse::<Id>().ok()) else {
        return Err(ApiError::task_not_found());
    };
    match outbox::for_task(&ctx.db, &space, id).await.map_err(db_error)? {
        Some(deliveries) => Ok(Json(Deliveries { deliveries })),
        None => Err(ApiError::task_not_found()),
    }
}
