//! `GET /v1/tasks/{task}/events`: the relay's SSE stream (DESIGN §8).
//!
//! EventSource cannot set headers, so the token may also come as the
//! `access_token` query parameter and the resume point as `last_event_id`.
//! Every refusal happens before the stream starts, as an error envelope.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::response::sse::{KeepAlive, Sse};
use axum::routing::get;
use serde::Deserialize;
use sqlx::PgPool;
use time::OffsetDateTime;

use super::extract::{bearer_token, invalid_token};
use crate::auth::{self, Secret};
use crate::error::{self, ApiError, ApiResult, db_error};
use super::StartupError;
use crate::db;
use crate::ids::Id;
use crate::redis_client::BadRedisUrl;
use crate::relay::{Hub, stream};
use crate::settings::{DATABASE_URL, Env, KEEPALIVE, REDIS_URL, TOKEN_KEY};

pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// What the relay needs: no S3, no SQS, no Argon2.
pub struct RelayContext {
    pub db: PgPool,
    pub token_key: Secret,
    pub hub: Hub,
    /// The `:` comment interval; under the load balancer's idle timeout.
    pub keepalive: Duration,
}

pub type RelayCtx = std::sync::Arc<RelayContext>;

impl RelayContext {
    /// The relay's settings from the environment: Postgres, Redis and the
    /// token key; `REEVE_KEEPALIVE_SECONDS` moves the keep-alive interval.
    pub fn from_env() -> Result<RelayCtx, StartupError> {
        let mut env = Env::process();
        let token_key = env.secret(TOKEN_KEY);
        let database_url = env.required(DATABASE_URL);
        let redis_url = env.required(REDIS_URL);
        let keepalive = Duration::from_secs(env.number(KEEPALIVE, DEFAULT_KEEPALIVE.as_secs(), 1, 300));
        let finished = env.finish();
        let (Some(token_key), Ok(())) = (token_key, finished.as_ref().map(|_| ())) else {
            return Err(StartupError::Config(finished.err().map(|e| e.problems).unwrap_or_default()));
        };
        let db = db::connect_lazy(&database_url)?;
        let client = redis::Client::open(redis_url.as_str()).map_err(|_| BadRedisUrl)?;
        Ok(std::sync::Arc::new(RelayContext { db, token_key, hub: Hub::start(client), keepalive }))
    }
}

/// The relay's routes with the error envelope — the event stream and the
/// small watch page at `/` — ready to merge into `reeve serve`'s app.
pub fn routes(ctx: RelayCtx) -> Router {
    Router::new()
        .route("/v1/tasks/{task}/events", get(task_events))
        .route("/", get(watch_page))
        .layer(axum::middleware::from_fn(error::envelope))
        .with_state(ctx)
}

/// The relay as its own service: [`routes`] plus `/healthz` for the load
/// balancer.
pub fn router(ctx: RelayCtx) -> Router {
    let health = Router::new()
        .route("/healthz", get(healthz))
        .layer(axum::middleware::from_fn(error::envelope))
        .with_state(ctx.clone());
    routes(ctx).merge(health)
}

/// The load balancer's check: the relay is useless without Postgres.
async fn healthz(State(ctx): State<RelayCtx>) -> ApiResult<&'static str> {
    sqlx::query("SELECT 1").execute(&ctx.db).await.map_err(|_| {
        ApiError::unavailable("dependency_unavailable", "postgres is unavailable")
    })?;
    Ok("ok")
}

async fn watch_page() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("assets/watch.html"))
}

#[derive(Deserialize)]
struct StreamQuery {
    access_token: Option<String>,
    last_event_id: Option<String>,
}

async fn task_events(
    State(ctx): State<RelayCtx>,
    Path(task): Path<String>,
    Query(query): Query<StreamQuery>,
    headers: HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let bearer = bearer_token(&headers)?;
    let Some(token) = bearer.or(query.access_token.as_deref()) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            "send Authorization: Bearer <token> or ?access_token=<token>",
        ));
    };
    let space = auth::verify_token(&ctx.token_key, token, OffsetDateTime::now_utc()).map_err(|_| invalid_token())?;

    let last_header = headers.get("last-event-id").map(|v| v.to_str().unwrap_or("-"));
    let after = match last_header.or(query.last_event_id.as_deref()) {
        None => 0,
        Some(raw) => raw.trim().parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            ApiError::bad_request("invalid_last_event_id", "Last-Event-ID must be a non-negative event number")
        })?,
    };

    // A malformed id, a missing task and another space's task look the same.
    let task: Id = task.parse().map_err(|_| ApiError::not_found("task"))?;
    let owned: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1 AND space_idx = $2)")
        .bind(task)
        .bind(space.as_bytes())
        .fetch_one(&ctx.db)
        .await
        .map_err(db_error)?;
    if !owned {
        return Err(ApiError::not_found("task"));
    }

    let events = stream::events(ctx.db.clone(), ctx.hub.clone(), task, after).await;
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(ctx.keepalive)))
}
