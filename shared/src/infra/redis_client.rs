//! One shared, self-reconnecting Redis connection per process, opened on first
//! use: a process must start (and report itself unhealthy) while Redis is down.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct RedisClient {
    client: redis::Client,
    manager: Arc<OnceCell<ConnectionManager>>,
}

#[derive(Debug, thiserror::Error)]
#[error("REDIS_URL is not a valid Redis URL")]
pub struct BadRedisUrl;

/// The redis crate's rustls builds its TLS configuration with the process's
/// default crypto provider, and two are compiled in (reqwest's aws-lc-rs,
/// sqlx's ring), so none is the default until one is installed: without
/// this, the first `rediss://` connection fails. Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// A client for `url` (`redis://` or `rediss://`), not yet connected.
pub fn open(url: &str) -> Result<redis::Client, BadRedisUrl> {
    install_crypto_provider();
    redis::Client::open(url).map_err(|_| BadRedisUrl)
}

impl RedisClient {
    pub fn new(url: &str) -> Result<Self, BadRedisUrl> {
        let client = open(url)?;
        Ok(RedisClient { client, manager: Arc::new(OnceCell::new()) })
    }

    /// A client built by the caller: e.g. `redis::Client::build_with_tls`
    /// for a server whose certificate a private CA signed.
    pub fn from_client(client: redis::Client) -> Self {
        install_crypto_provider();
        RedisClient { client, manager: Arc::new(OnceCell::new()) }
    }

    pub async fn connection(&self) -> redis::RedisResult<ConnectionManager> {
        self.manager
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(Duration::from_secs(2)))
                    .set_number_of_retries(2);
                self.client.get_connection_manager_with_config(config).await
            })
            .await
            .cloned()
    }

    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.map(|_| ())
    }
}
