//! `POST /v1/spaces` and `POST /v1/sessions`: the auth function's routes.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::Ctx;
use super::extract::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::spaces::{self, SpaceError};

pub fn router() -> Router<Ctx> {
    Router::new().route("/v1/spaces", post(create_space)).route("/v1/sessions", post(open_session))
}

#[derive(Serialize)]
struct SpaceCreated {
    /// Shown once: the server keeps no plaintext copy.
    space_id: String,
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
}

async fn create_space(State(ctx): State<Ctx>) -> ApiResult<(StatusCode, Json<SpaceCreated>)> {
    let space = spaces::create(&ctx.db, &ctx.settings.pepper, &ctx.argon2).await.map_err(internal)?;
    Ok((
        StatusCode::CREATED,
        Json(SpaceCreated { space_id: space.space_id.as_str().to_owned(), created_at: space.created_at }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRequest {
    space_id: String,
}

#[derive(Serialize)]
struct SessionCreated {
    token: String,
    token_type: &'static str,
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
}

async fn open_session(
    State(ctx): State<Ctx>,
    JsonBody(body): JsonBody<SessionRequest>,
) -> ApiResult<Json<SessionCreated>> {
    let s = &ctx.settings;
    match spaces::open_session(&ctx.db, &s.pepper, &s.token_key, &ctx.argon2, &body.space_id).await {
        Ok(session) => {
            Ok(Json(SessionCreated { token: session.token, token_type: "Bearer", expires_at: session.expires_at }))
        }
        Err(SpaceError::InvalidSpace) => {
            Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid_space", "unknown or wrong space id"))
        }
        Err(e) => Err(internal(e)),
    }
}

fn internal(e: SpaceError) -> ApiError {
    match e {
        SpaceError::Db(db) => crate::error::db_error(db),
        other => ApiError::internal(other),
    }
}
