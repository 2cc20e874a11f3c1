//! `GET /healthz`: is this process able to serve? It checks both stores and
//! names whichever is down, so an operator knows where to look.
//!
//! Postgres is the truth and Redis only the doorbell: without Redis, events
//! still reach every stream through the relay's Postgres checks, a few
//! seconds late. So a lost Redis is `degraded` with `200`, and the load
//! balancer keeps the process (replacing it would drop every stream for
//! nothing); only a lost Postgres is `503`. Alarm on `degraded` from the
//! logs or the metrics instead (docs/operations.md).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[cfg(feature = "api")]
use super::context::HealthContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope};

const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

#[cfg(feature = "api")]
pub fn router() -> OpenApiRouter<Arc<HealthContext>> {
    OpenApiRouter::default().routes(routes!(healthz))
}

/// Postgres answered; Redis may not have.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` while Redis is unavailable.
    #[schema(example = "ok")]
    status: &'static str,
    /// Always `ok` (without Postgres the answer is `503`).
    postgres: &'static str,
    /// `ok` or `unavailable`.
    redis: &'static str,
}

/// The answer for what answered: `503` without Postgres, else `200`,
/// `degraded` without Redis. Logged, so the logs tell when it began.
pub fn answer(postgres: bool, redis: bool) -> ApiResult<Json<Health>> {
    match (postgres, redis) {
        (true, true) => Ok(Json(Health { status: "ok", postgres: "ok", redis: "ok" })),
        (true, false) => {
            tracing::warn!(health = "degraded", "health: degraded: redis is unavailable");
            Ok(Json(Health { status: "degraded", postgres: "ok", redis: "unavailable" }))
        }
        (false, redis) => {
            tracing::warn!(health = "unavailable", redis, "health: postgres is unavailable");
            let message = if redis { "postgres is unavailable" } else { "postgres and redis are unavailable" };
            Err(ApiError::unavailable("dependency_unavailable", message))
        }
    }
}

#[cfg(feature = "api")]
/// Is this process able to serve?
///
/// Checks Postgres and Redis, each with a 3-second timeout. Without Redis the
/// process still serves (`degraded`): events reach their streams from
/// Postgres, only later.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses(
        (status = 200, body = Health,
            description = "Postgres answered: `status` is `ok`, or `degraded` when Redis did not."),
        (status = 503, body = ErrorEnvelope,
            description = "`dependency_unavailable`: Postgres is down; the message names what is, e.g. `postgres is unavailable`."),
    ),
)]
async fn healthz(State(ctx): State<Arc<HealthContext>>) -> ApiResult<Json<Health>> {
    let postgres = async { sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&ctx.db).await.map(|_| ()) };
    let (postgres, redis) = tokio::join!(
        tokio::time::timeout(CHECK_TIMEOUT, postgres),
        tokio::time::timeout(CHECK_TIMEOUT, ctx.redis.ping())
    );
    if !matches!(postgres, Ok(Ok(()))) {
        tracing::warn!(?postgres, "health: postgres check failed");
    }
    if !matches!(redis, Ok(Ok(()))) {
        tracing::warn!(?redis, "health: redis check failed");
    }
    answer(matches!(postgres, Ok(Ok(()))), matches!(redis, Ok(Ok(()))))
}
