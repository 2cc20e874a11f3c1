//! [`RelayContext`]: what the relay needs — Postgres, the hub, the token
//! key, its limits and the API its console page calls; no S3, no SQS, no
//! Argon2.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::domain::auth::Secret;
use crate::domain::relay::{Hub, StreamCaps};

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
    pub limits: RelayLimits,
}

pub type RelayCtx = Arc<RelayContext>;

/// How many streams a space and a client may hold open, and how the
/// client's address is known (`REEVE_RELAY_STREAMS_PER_SPACE`,
/// `REEVE_RELAY_STREAMS_PER_IP`, `REEVE_TRUSTED_PROXY_HOPS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayLimits {
    pub caps: StreamCaps,
    /// Proxies in front of the relay that each append the address they saw
    /// to `X-Forwarded-For`. 0: the TCP peer is the client. 1 (an ALB): the
    /// right-most entry, the one the ALB added; anything left of it was
    /// written by the client and proves nothing.
    pub proxy_hops: usize,
}

impl RelayLimits {
    /// No caps: for tests that open thousands of streams from one place.
    pub const NONE: RelayLimits = RelayLimits { caps: StreamCaps::NONE, proxy_hops: 0 };
}
