//! `GET /healthz`: is this process able to serve? It checks both stores and
//! names whichever is down, so an operator knows where to look.

use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::Ctx;
use crate::error::{ApiError, ApiResult};

const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

pub fn router() -> Router<Ctx> {
    Router::new().route("/healthz", get(healthz))
}

async fn healthz(State(ctx): State<Ctx>) -> ApiResult<Json<Value>> {
    let postgres = async {
        sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&ctx.db).await.map(|_| ())
    };
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
        Ok(Json(json!({"status": "ok", "postgres": "ok", "redis": "ok"})))
    } else {
        let verb = if down.len() == 1 { "is" } else { "are" };
        Err(ApiError::unavailable("dependency_unavailable", format!("{} {verb} unavailable", down.join(" and "))))
    }
}
