//! [`RelayContext`]: what the relay needs — Postgres, the hub, the token
//! key and the API its console page calls; no S3, no SQS, no Argon2.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::auth::Secret;
use crate::relay::Hub;

/// The `:` comment interval when `REEVE_KEEPALIVE_SECONDS` is unset.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

pub struct RelayContext {
    pub db: PgPool,
    pub token_key: Secret,
    pub hub: Hub,
    /// The `:` comment interval; under the load balancer's idle timeout.
    pub keepalive: Duration,
    /// The API origin the console page at `/` calls; `None`: the relay's
    /// own, as under `reeve serve`. Never taken from the page's link.
    pub api_origin: Option<String>,
}

pub type RelayCtx = Arc<RelayContext>;
