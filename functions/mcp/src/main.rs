//! The `mcp` Lambda: `POST /mcp`, the MCP endpoint for agents, behind API Gateway (HTTP API).
//! Glue only: the endpoint is `reeve_shared::mcp`'s, the same one `reeve serve` runs.

use lambda_http::Error;
use reeve_shared::{mcp, startup, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let ctx = startup::lambda_mcp().await;
    lambda_http::run(mcp::router(ctx)).await
}
