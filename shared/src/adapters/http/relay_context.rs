//! [`RelayContext`]: what the relay needs — Postgres, the hub, the token
//! key and the API its console page calls; no S3, no SQS, no Argon2.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::auth::Secret;
use crate::db;
use crate::relay::Hub;
use crate::settings::{API_ORIGIN, DATABASE_URL, Env, KEEPALIVE, REDIS_URL, StartupError, TOKEN_KEY};

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

impl RelayContext {
    /// The relay's settings from the environment: Postgres, Redis and the
    /// token key; `REEVE_KEEPALIVE_SECONDS` moves the keep-alive interval
    /// and `REEVE_API_ORIGIN` names the API its console page calls.
    /// The one place the relay reads its environment.
    pub fn from_env() -> Result<RelayCtx, StartupError> {
        let mut env = Env::process();
        let token_key = env.secret(TOKEN_KEY);
        let database_url = env.required(DATABASE_URL);
        let redis_url = env.required(REDIS_URL);
        let keepalive = Duration::from_secs(env.number(KEEPALIVE, DEFAULT_KEEPALIVE.as_secs(), 1, 300));
        let api_origin = env.origin(API_ORIGIN);
        let finished = env.finish();
        let (Some(token_key), Ok(())) = (token_key, finished.as_ref().map(|_| ())) else {
            return Err(StartupError::Config(finished.err().map(|e| e.problems).unwrap_or_default()));
        };
        let db = db::connect_lazy(&database_url)?;
        let client = crate::redis_client::open(&redis_url)?;
        Ok(Arc::new(RelayContext { db, token_key, hub: Hub::start(client), keepalive, api_origin }))
    }
}
