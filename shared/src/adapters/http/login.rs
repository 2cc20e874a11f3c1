//! `POST /v1/spaces`, `POST /v1/sessions`, `DELETE /v1/sessions/current`
//! and `POST /v1/space/rotate`: the auth function's routes, the ones that
//! hold the pepper and run Argon2id.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::AuthContext;
use super::error::{ApiError, ErrorEnvelope, db_error};
use super::extract::{CurrentSession, JsonBody};
use crate::domain::login_limits::Action;
use crate::domain::{sessions, spaces};

pub fn router() -> OpenApiRouter<Arc<AuthContext>> {
    OpenApiRouter::default()
        .routes(routes!(create_space))
        .routes(routes!(open_session))
        .routes(routes!(end_session))
        .routes(routes!(rotate_space))
}

/// A new Space.
#[derive(Serialize, ToSchema)]
struct SpaceCreated {
    /// 20 digits, shown once: the server keeps no plaintext copy. It is the
    /// only way back into the Space.
    #[schema(pattern = "^[0-9]{20}$", example = "12345678901234567890")]
    space_id: String,
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
}

/// Create a Space
///
/// Answers a fresh Space ID, once. Needs no token and no body.
#[utoipa::path(
    post,
    path = "/v1/spaces",
    tag = "spaces",
    responses(
        (status = 201, description = "The Space is created.", body = SpaceCreated),
        (status = 429, description = "`rate_limited`: too many Spaces from this client address (a burst of 10, then one a minute; MCP's `create_space` spends the same budget; or the optional WAF in AWS); `Retry-After` says when to try again. Nothing is created.", body = ErrorEnvelope,
            headers(("Retry-After" = u64, description = "Seconds until one more fits the budget."))),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]

async fn create_space(
    State(ctx): State<Arc<AuthContext>>,
    headers: HeaderMap,
    extensions: Extensions,
) -> Result<Response, Response> {
    super::limit::spend(&ctx, (&headers, &extensions), Action::Space).await?;
    let space = spaces::create(&ctx.db, &ctx.settings.pepper, &ctx.argon2)
        .await
        .map_err(|e| ApiError::refused(&e).into_response())?;
    let created = SpaceCreated { space_id: space.space_id.as_str().to_owned(), created_at: space.created_at };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SessionRequest {
    /// The Space ID from `POST /v1/spaces`.
    #[schema(example = "12345678901234567890")]
    space_id: String,
}

/// A session on a Space.
#[derive(Serialize, ToSchema)]
struct SessionCreated {
    /// Send it as `Authorization: Bearer <token>`.
    token: String,
    /// Always `Bearer`.
    token_type: &'static str,
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
}

/// Open a session
///
/// Trades a Space ID for a short-lived bearer token, so the slow hash of
/// the Space ID runs once per session, not once per request.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "spaces",
    request_body = SessionRequest,
    responses(
        (status = 200, description = "The session is open.", body = SessionCreated),
        (status = 400, description = doc_400_json!(), body = ErrorEnvelope),
        (status = 401, description = "`invalid_space`: no Space has this ID.", body = ErrorEnvelope),
        (status = 413, description = doc_413!(), body = ErrorEnvelope),
        (status = 415, description = doc_415!(), body = ErrorEnvelope),
        (status = 429, description = "`rate_limited`: too many sessions from this client address (a burst of 10, then two a second; MCP's `login` spends the same budget; or the optional WAF in AWS); `Retry-After` says when to try again.", body = ErrorEnvelope,
            headers(("Retry-After" = u64, description = "Seconds until one more fits the budget."))),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]

async fn open_session(
    State(ctx): State<Arc<AuthContext>>,
    headers: HeaderMap,
    extensions: Extensions,
    JsonBody(body): JsonBody<SessionRequest>,
) -> Result<Json<SessionCreated>, Response> {
    super::limit::spend(&ctx, (&headers, &extensions), Action::Session).await?;
    let s = &ctx.settings;
    match spaces::open_session(&ctx.db, &s.pepper, &s.token_key, &ctx.argon2, &body.space_id).await {
        Ok(session) => {
            Ok(Json(SessionCreated { token: session.token, token_type: "Bearer", expires_at: session.expires_at }))
        }
        Err(e) => Err(ApiError::refused(&e).into_response()),
    }
}

/// End this session
///
/// Ends the session whose token is sent, at once: from now on every route
/// (the relay's stream included) refuses that token, as if it had expired.
/// The Space's other sessions go on. `reeve logout` calls it.
#[utoipa::path(
    delete,
    path = "/v1/sessions/current",
    tag = "spaces",
    security(("bearer" = [])),
    responses(
        (status = 204, description = "The session is ended."),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn end_session(
    State(ctx): State<Arc<AuthContext>>,
    CurrentSession(session): CurrentSession,
) -> Result<StatusCode, ApiError> {
    sessions::end_session(&ctx.db, &session).await.map_err(db_error)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RotateRequest {
    /// The Space's current ID: a second factor beside the session, so a
    /// stolen session alone cannot take the Space.
    #[schema(example = "12345678901234567890")]
    space_id: String,
}

/// A Space's new ID, and a session on it.
#[derive(Serialize, ToSchema)]
struct SpaceRotated {
    /// The new ID, 20 digits, shown once: the server keeps no plaintext
    /// copy. The old ID opens nothing any more.
    #[schema(pattern = "^[0-9]{20}$", example = "98765432109876543210")]
    space_id: String,
    /// A session on the Space, for going on without a login: every session
    /// issued before the rotation (the one that asked included) is ended.
    token: String,
    /// Always `Bearer`.
    token_type: &'static str,
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
}

/// Rotate the Space ID
///
/// Gives the session's Space a new ID, shown once, for an ID that may have
/// leaked. It needs the session and, in the body, the Space's current ID.
/// From the answer on, the old ID opens no session and every session issued
/// before is ended (`401 invalid_token` on every route and the relay); the
/// Space keeps its tasks, uploads, payments and credits. A rotation spends
/// the client address's Space budget, as `POST /v1/spaces` does.
/// `reeve space rotate` calls it.
#[utoipa::path(
    post,
    path = "/v1/space/rotate",
    tag = "spaces",
    security(("bearer" = [])),
    request_body = RotateRequest,
    responses(
        (status = 200, description = "The Space has its new ID, and a new session on it.", body = SpaceRotated),
        (status = 400, description = doc_400_json!(), body = ErrorEnvelope),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 403, description = "`wrong_space_id`: the body's `space_id` is not the Space's current ID (malformed, wrong, or rotated already). Nothing is changed, and the session goes on.", body = ErrorEnvelope),
        (status = 413, description = doc_413!(), body = ErrorEnvelope),
        (status = 415, description = doc_415!(), body = ErrorEnvelope),
        (status = 429, description = "`rate_limited`: too many Space IDs made from this client address (new Spaces and rotations spend one budget: a burst of 10, then one a minute); `Retry-After` says when to try again. Nothing is changed.", body = ErrorEnvelope,
            headers(("Retry-After" = u64, description = "Seconds until one more fits the budget."))),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn rotate_space(
    State(ctx): State<Arc<AuthContext>>,
    headers: HeaderMap,
    extensions: Extensions,
    CurrentSession(session): CurrentSession,
    JsonBody(body): JsonBody<RotateRequest>,
) -> Result<Json<SpaceRotated>, Response> {
    super::limit::spend(&ctx, (&headers, &extensions), Action::Space).await?;
    let s = &ctx.settings;
    let rotated = spaces::rotate(&ctx.db, &s.pepper, &s.token_key, &ctx.argon2, &session, &body.space_id)
        .await
        .map_err(|e| ApiError::refused(&e).into_response())?;
    tracing::info!(space = %session.space.to_hex(), "space id rotated");
    Ok(Json(SpaceRotated {
        space_id: rotated.space_id.as_str().to_owned(),
        token: rotated.session.token,
        token_type: "Bearer",
        expires_at: rotated.session.expires_at,
    }))
}
