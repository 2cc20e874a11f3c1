//! [`McpContext`]: what the tools need, built once per process — by the
//! `mcp` Lambda's `main`, by `reeve serve`, and by the tests.

use std::net::SocketAddr;
use std::sync::Arc;

use sqlx::PgPool;

use crate::domain::auth::Secret;
use crate::domain::catalog::Catalog;
use crate::domain::payments::Facilitator;
use crate::domain::spaces::Argon2Limit;
use crate::infra::aws::AwsClients;
use crate::infra::redis_client::RedisClient;

/// How the endpoint is reached and what it may do.
#[derive(Debug, Clone)]
pub struct McpSettings {
    /// The `Host` values requests may carry (`host` or `host:port`): the
    /// API's own names. rmcp refuses any other with `403`, which stops DNS
    /// rebinding against a server on a private address. Empty allows any
    /// (`*` in the configuration: behind API Gateway, which only routes
    /// requests for the API's own names here).
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call the endpoint (`https://app.example`,
    /// `http://localhost:*`). Empty refuses every request that carries an
    /// `Origin`; agents send none.
    pub allowed_origins: Vec<String>,
    /// Whether a waiting tool sends `notifications/progress`. Only where the
    /// reply streams to the client as it is written (`reeve serve`): a
    /// Lambda's reply is buffered whole, so notifications would arrive with
    /// the result, too late to mean anything.
    pub progress: bool,
}

impl McpSettings {
    /// The loopback names rmcp defaults to: what a local `reeve serve` is
    /// reached by when nothing else is configured.
    pub const LOOPBACK: [&'static str; 3] = ["localhost", "127.0.0.1", "::1"];

    /// The origins allowed on a server that listens at `listening` itself:
    /// the configured ones and, on a loopback address where the Host list
    /// is the loopback default, the page of that very server under each of
    /// its names: `http://localhost:PORT`, `http://127.0.0.1:PORT` and
    /// `http://[::1]:PORT`. A browser sends those only for a page the
    /// server itself served (the relay's console, say); a DNS-rebinding
    /// page carries its own name, and another local site its own port, so
    /// both are still refused. Where the Host list is configured (behind
    /// API Gateway), nothing is added.
    pub fn allowed_origins_at(&self, listening: Option<SocketAddr>) -> Vec<String> {
        let mut origins = self.allowed_origins.clone();
        let loopback_hosts = self.allowed_hosts.iter().map(String::as_str).eq(Self::LOOPBACK);
        if let Some(addr) = listening.filter(|addr| addr.ip().is_loopback() && loopback_hosts) {
            let port = addr.port();
            origins.extend(["localhost", "127.0.0.1", "[::1]"].map(|name| format!("http://{name}:{port}")));
        }
        origins
    }
}

/// The stores the tools use, and where in them.
pub struct McpStores {
    pub db: PgPool,
    /// The doorbell for the events a cancel writes.
    pub redis: RedisClient,
    pub aws: AwsClients,
    pub bucket: String,
    pub queue_url: String,
    /// Each payment network's JSON-RPC endpoint: a paid call whose
    /// settlement's outcome was lost is resolved from the chain.
    pub chains: crate::domain::payments::Chains,
}

pub struct McpContext {
    pub catalog: Arc<Catalog>,
    pub db: PgPool,
    /// The doorbell for the events a cancel writes.
    pub redis: RedisClient,
    pub aws: AwsClients,
    pub pepper: Secret,
    pub token_key: Secret,
    pub bucket: String,
    pub queue_url: String,
    /// `None` when the catalog sells nothing, or the client could not be
    /// built (logged): a payment then gets `facilitator_unavailable`.
    pub facilitator: Option<Facilitator>,
    pub chains: crate::domain::payments::Chains,
    /// The process's bound on Argon2id runs, shared with the HTTP routes
    /// where they run in the same process.
    pub argon2: Arc<Argon2Limit>,
    pub settings: McpSettings,
    /// Spaces and sessions per client address, counted in Postgres with
    /// `POST /v1/spaces` and `POST /v1/sessions`.
    pub limits: crate::domain::login_limits::LoginLimits,
    /// The key offers and receipts are signed with, if the catalog
    /// publishes one.
    pub seller: Option<Arc<crate::domain::payments::offer_receipt::SellerKey>>,
    /// The console's URL (`REEVE_CONSOLE_URL`, the relay's URL in AWS), where
    /// a pay link's page is (`super::elicit`). `None`: the origin the
    /// request reached, as under `reeve serve`, which serves both.
    pub console_url: Option<String>,
}

impl McpContext {
    /// The context: the facilitator client is made from the catalog, once
    /// (the tool list is the server's, [`super::server::ReeveMcp::new`]).
    /// `pepper` and `token_key` are the API's secrets (create_space and
    /// login need both).
    pub fn new(
        catalog: Arc<Catalog>,
        stores: McpStores,
        (pepper, token_key): (Secret, Secret),
        argon2: Arc<Argon2Limit>,
        settings: McpSettings,
    ) -> Arc<McpContext> {
        let facilitator = catalog.payments.as_ref().and_then(|p| {
            Facilitator::new(&p.facilitator_url)
                .inspect_err(|e| tracing::error!(error = %e, "no facilitator client"))
                .ok()
        });
        let McpStores { db, redis, aws, bucket, queue_url, chains } = stores;
        Arc::new(McpContext {
            catalog,
            db,
            redis,
            aws,
            pepper,
            token_key,
            bucket,
            queue_url,
            facilitator,
            chains,
            argon2,
            settings,
            limits: Default::default(),
            seller: None,
            console_url: None,
        })
    }

    /// Signs a result's download link as it is read.
    pub fn links(&self) -> crate::domain::tasks::OutputLinks {
        crate::domain::tasks::OutputLinks::new(self.aws.objects.clone(), self.bucket.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(hosts: &[&str], origins: &[&str]) -> McpSettings {
        McpSettings {
            allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
            allowed_origins: origins.iter().map(|o| o.to_string()).collect(),
            progress: false,
        }
    }

    /// The server's own origin is added only on loopback, with its own port,
    /// and only where the Host list is the loopback default: a deployment's
    /// configured lists are what it gets.
    #[test]
    fn only_a_loopback_server_lets_in_its_own_origin() {
        let local = settings(&McpSettings::LOOPBACK, &["https://app.example"]);
        let at = |addr: &str| Some(addr.parse::<SocketAddr>().unwrap());
        assert_eq!(
            local.allowed_origins_at(at("127.0.0.1:8080")),
            ["https://app.example", "http://localhost:8080", "http://127.0.0.1:8080", "http://[::1]:8080"]
        );
        assert_eq!(local.allowed_origins_at(at("[::1]:9")).len(), 4);
        for (settings, listening) in [
            (&local, None),
            (&local, at("0.0.0.0:8080")),
            (&local, at("192.0.2.7:8080")),
            (&settings(&["api.example.com"], &["https://app.example"]), at("127.0.0.1:8080")),
            (&settings(&[], &["https://app.example"]), at("127.0.0.1:8080")),
        ] {
            assert_eq!(settings.allowed_origins_at(listening), ["https://app.example"], "{settings:?} {listening:?}");
        }
    }
}
