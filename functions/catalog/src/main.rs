//! The `catalog` Lambda: `GET /v1/catalog` behind API Gateway (HTTP API).
//! Glue only: the routes are `reeve_shared::http`'s, the same ones `reeve serve` runs.

use lambda_http::Error;
use reeve_shared::{http, startup, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let ctx = startup::lambda_catalog().await;
    lambda_http::run(http::catalog_app(ctx)).await
}
