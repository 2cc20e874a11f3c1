//! The `presign` Lambda: `POST /v1/uploads` behind API Gateway (HTTP API).
//! Glue only: the routes are `reeve_shared::http`'s, the same ones `reeve serve` runs.

use lambda_http::Error;
use reeve_shared::{http, startup, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let ctx = startup::lambda_presign().await;
    lambda_http::run(http::presign_app(ctx)).await
}
