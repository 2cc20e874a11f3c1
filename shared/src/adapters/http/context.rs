//! [`ApiContext`]: what every handler may need, built once per process —
//! by [`crate::startup`] for `reeve serve` and each Lambda's `main`, and by
//! the tests.

use std::sync::Arc;

use axum::body::Bytes;
use sqlx::PgPool;

use crate::auth::Secret;
use crate::aws::AwsClients;
use crate::catalog::Catalog;
use crate::outbound::{Outbound, OutboundPolicy};
use crate::redis_client::RedisClient;
use crate::spaces::Argon2Limit;

/// What the HTTP API needs to run: the auth secrets, the stores, the bucket
/// and the queue.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub pepper: Secret,
    pub token_key: Secret,
    /// Empty when the process was not given the database (`Needs::database`).
    pub database_url: Secret,
    pub redis_url: String,
    pub bucket: String,
    pub queue_url: String,
}

pub struct ApiContext {
    pub catalog: Arc<Catalog>,
    /// The catalog's public JSON, rendered once: it cannot change at run time.
    pub catalog_json: Bytes,
    /// The OpenAPI document this catalog makes, rendered once too.
    pub openapi_json: Bytes,
    pub db: PgPool,
    pub redis: RedisClient,
    pub aws: AwsClients,
    pub settings: ApiSettings,
    /// The x402 facilitator client, when the catalog sells anything. `None`
    /// also when it could not be built (logged): payments then answer
    /// `503 facilitator_unavailable`.
    pub facilitator: Option<crate::payments::Facilitator>,
    /// Each Argon2id run takes 19 MiB and tens of milliseconds of one core;
    /// a burst of sessions must queue here rather than exhaust the process.
    pub argon2: Arc<Argon2Limit>,
    /// The operators' SSRF-guarded client (`REEVE_OPERATOR_ALLOW`): for the
    /// hosts the operator configured, such as the payment facilitator. Never
    /// for a URL a user chose.
    pub operators: Outbound,
}

pub type Ctx = Arc<ApiContext>;

impl ApiContext {
    /// A context whose operators' client has the default policy (public
    /// HTTPS hosts only): what tests need.
    pub fn new(catalog: Catalog, db: PgPool, redis: RedisClient, aws: AwsClients, settings: ApiSettings) -> Ctx {
        let operators = Outbound::new(OutboundPolicy::default()).expect("the default policy is valid");
        Self::with_operators(catalog, db, redis, aws, settings, operators)
    }

    pub fn with_operators(
        catalog: Catalog,
        db: PgPool,
        redis: RedisClient,
        aws: AwsClients,
        settings: ApiSettings,
        operators: Outbound,
    ) -> Ctx {
        let catalog_json = serde_json::to_vec(&catalog.public_view()).expect("JSON values serialise").into();
        let openapi_json = serde_json::to_vec(&super::openapi(&catalog)).expect("JSON values serialise").into();
        let permits = std::thread::available_parallelism().map_or(2, |n| n.get());
        let facilitator = catalog.payments.as_ref().and_then(|p| {
            crate::payments::Facilitator::new(&p.facilitator_url)
                .inspect_err(|e| tracing::error!(error = %e, "no facilitator client"))
                .ok()
        });
        Arc::new(ApiContext {
            catalog: Arc::new(catalog),
            catalog_json,
            openapi_json,
            db,
            redis,
            aws,
            settings,
            facilitator,
            argon2: Argon2Limit::new(permits),
            operators,
        })
    }
}
