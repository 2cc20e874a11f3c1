//! The `task-create` Lambda: `POST /v1/tasks/{kind}` behind API Gateway (HTTP API).
//! Glue only: the routes are `reeve_shared::http`'s, the same ones `reeve serve` runs.

use lambda_http::Error;
use reeve_shared::{http, startup, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let ctx = startup::lambda_task_create().await;
    lambda_http::run(http::task_create_app(ctx)).await
}
