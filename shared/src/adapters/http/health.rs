//! `GET /healthz`: is this process able to serve? It checks both stores and
//! names whichever is down, so an operator knows where to look.

use std::sync::Arc;

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::HealthContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope};

const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

pub fn router() -> OpenApiRouter<Arc<HealthContext>> {
    OpenApiRouter::default().routes(routes!(healthz))
}

/// Both stores answered.
#[derive(Serialize, ToSchema)]
struct Healthy {
    /// Always `ok`.
    status: &'static str,
    /// Always `ok`.
    postgres: &'static str,
    /// Always `ok`.
    redis: &'static str,
}

/// Is this process able to serve?
///
/// Checks Postgres and Redis, each with a 3-second timeout.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses(
        (status = 200, description = "Both stores answered.", body = Healthy),
        (status = 503, body = ErrorEnvelope,
            description = "`dependency_unavailable`: the message names what is down, e.g. `redis is unavailable`."),
    ),
)]
async fn healthz(State(ctx): State<Arc<HealthContext>>) -> ApiResult<Json<Healthy>> {
    let postgres = async { sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&ctx.db).await.map(|_| ()) };
    let (postgres, redis) = tokio::join!(
        tokio::time::timeout(CHECK_TIMEOUT, postgres),
        tokio::time::timeout(CHECK_TIMEOUT, ctx.redis.ping())
    );
    let mut down = Vec::new();
    if !matches!(postgres, Ok(Ok(()))) {
        tracing::warn!(?postgres, "health: postgres is down");
        down.push("postgres");
    }
    if !matches!(redis, Ok(Ok(()))) {
        tracing::warn!(?redis, "health: redis is down");
        down.push("redis");
    }
    if down.is_empty() {
        Ok(Json(Healthy { status: "ok", postgres: "ok", redis: "ok" }))
    } else {
        let verb = if down.len() == 1 { "is" } else { "are" };
        Err(ApiError::unavailable("dependency_unavailable", format!("{} {verb} unavailable", down.join(" and "))))
    }
}
