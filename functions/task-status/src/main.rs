//! The `task-status` Lambda: `GET /v1/tasks/{id}`, `GET /v1/tasks` and
//! `POST /v1/tasks/{id}/cancel` behind API Gateway (HTTP API).
//! Glue only: the routes are `reeve_shared::http`'s, the same ones `reeve serve` runs.

use lambda_http::Error;
use reeve_shared::{http, startup, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let ctx = startup::lambda_task_status().await;
    lambda_http::run(http::task_status_app(ctx)).await
}
