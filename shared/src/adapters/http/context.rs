//! The contexts of the HTTP routes, one per function, each holding only what
//! its routes use, so a Lambda builds (and links) nothing more: the `auth`
//! function has no S3, SQS or catalog; `catalog` has no database, secret or
//! AWS client. [`ApiContext`] is every route's at once, for `reeve serve`
//! and the tests; [`app`](super::app) hands each router its part of it.
//! All are built by [`crate::startup`].

use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use sqlx::PgPool;

use crate::domain::auth::Secret;
#[cfg(feature = "catalog")]
use crate::domain::catalog::Catalog;
use crate::domain::catalog::Uploads;
#[cfg(feature = "api-auth")]
use crate::domain::spaces::Argon2Limit;
#[cfg(feature = "api-tasks")]
use crate::infra::aws::AwsClients;
#[cfg(feature = "api")]
use crate::infra::outbound::{Outbound, OutboundPolicy};
use crate::infra::redis_client::RedisClient;

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
    /// The login budgets (`REEVE_SPACES_BURST` and its kin).
    pub limits: crate::domain::login_limits::LoginLimits,
    /// The key offers and receipts are signed with (`REEVE_RECEIPT_KEY`),
    /// when the catalog publishes a `receipt_signer`.
    #[cfg(feature = "receipts")]
    pub seller: Option<Arc<crate::domain::payments::offer_receipt::SellerKey>>,
    /// `REEVE_OUTPUT_RETENTION_DAYS`: how long the bucket keeps `outputs/`,
    /// so that a service's output files say when they expire; unset, no
    /// expiry is known.
    pub output_retention_days: Option<u32>,
}

/// A context whose routes take a session token.
pub trait SessionKey {
    /// The key session tokens are signed with.
    fn token_key(&self) -> &Secret;
    /// Where ended sessions are recorded (`revoked_sessions`).
    fn db(&self) -> &PgPool;
}

#[cfg(feature = "api-auth")]
/// The `auth` function's: `POST /v1/spaces` and `POST /v1/sessions`.
pub struct AuthContext {
    pub db: PgPool,
    pub settings: AuthSettings,
    /// Each Argon2id run takes 19 MiB and tens of milliseconds of one core;
    /// a burst of sessions must queue here rather than exhaust the process.
    pub argon2: Arc<Argon2Limit>,
    /// Spaces and sessions per client address, counted in Postgres with
    /// MCP's create_space and login.
    pub limits: crate::domain::login_limits::LoginLimits,
}

#[cfg(feature = "api-auth")]
/// The two keys of the login routes.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    pub pepper: Secret,
    pub token_key: Secret,
}

#[cfg(feature = "api-catalog")]
/// The `catalog` function's: the catalog and the OpenAPI document it makes.
pub struct CatalogContext {
    pub catalog: Arc<Catalog>,
    /// The catalog's public JSON, rendered once: it cannot change at run time.
    pub catalog_json: Bytes,
    /// The OpenAPI document, rendered on its first request: most cold starts
    /// serve the catalog only.
    openapi_json: OnceLock<Bytes>,
}

#[cfg(feature = "api-uploads")]
/// The `presign` function's: `POST /v1/uploads`.
pub struct UploadsContext {
    pub db: PgPool,
    pub token_key: Secret,
    pub s3: crate::infra::s3_objects::S3Objects,
    pub bucket: String,
    /// The catalog's upload policy, capped by the deployment's limit.
    pub uploads: Uploads,
}

#[cfg(feature = "api-tasks")]
/// The `task-create` function's: `POST /v1/tasks/{kind}`.
pub struct TaskCreateContext {
    pub catalog: Arc<Catalog>,
    pub db: PgPool,
    pub aws: AwsClients,
    pub settings: ApiSettings,
    /// The x402 facilitator client, when the catalog sells anything. `None`
    /// also when it could not be built (logged): payments then answer
    /// `503 facilitator_unavailable`.
    pub facilitator: Option<crate::domain::payments::Facilitator>,
    /// Each payment network's JSON-RPC endpoint (`REEVE_CHAIN_RPC_URLS`): a
    /// retried payment whose settlement's outcome was lost is resolved from
    /// the chain.
    pub chains: crate::domain::payments::Chains,
    /// Where the report route publishes the events a service's reports
    /// make (the doorbell; the events are in Postgres).
    pub events: crate::domain::tasks::Publisher,
    /// An attempt's lease, as the worker holds it (`REEVE_LEASE_SECONDS`):
    /// what a service's report renews.
    pub lease: std::time::Duration,
    /// The receiver authorizer of batch-settlement channels
    /// (`REEVE_BATCH_AUTHORIZER_KEY`), which signs a payer's cooperative
    /// refund. `None`: refunds answer `503 batch_refund_unavailable`.
    pub batch_authorizer: Option<Arc<crate::domain::payments::batch::claim::Claimer>>,
    /// The attempts a task may have (`REEVE_MAX_RECEIVES`): a service's
    /// retryable failure on the last one fails the task.
    pub max_attempts: u32,
}

#[cfg(feature = "api-tasks")]
impl TaskCreateContext {
    /// What the one create path needs of it: a REST create and a pay
    /// link's page both submit through it.
    pub fn submit_context(&self) -> crate::domain::tasks::SubmitContext<'_> {
        crate::domain::tasks::SubmitContext {
            catalog: &self.catalog,
            db: &self.db,
            s3: &self.aws.objects,
            bucket: &self.settings.bucket,
            sqs: &self.aws.sqs,
            queue_url: &self.settings.queue_url,
            facilitator: self.facilitator.as_ref(),
            chains: &self.chains,
            seller: self.settings.seller.as_deref(),
        }
    }
}

#[cfg(feature = "api-task-status")]
/// The `task-status` function's: a Space reading and stopping its tasks.
pub struct TaskStatusContext {
    pub db: PgPool,
    /// The doorbell a cancel rings.
    pub redis: RedisClient,
    pub token_key: Secret,
    /// The free kinds' quotas, which `GET /v1/space` reports on.
    pub catalog: Arc<Catalog>,
    /// A result's download link, signed when the task is read.
    pub links: crate::domain::tasks::OutputLinks,
    /// The key receipts are signed with, if the catalog publishes one.
    pub seller: Option<Arc<crate::domain::payments::offer_receipt::SellerKey>>,
}

#[cfg(feature = "api")]
/// `GET /healthz` of `reeve serve`: both stores.
pub struct HealthContext {
    pub db: PgPool,
    pub redis: RedisClient,
}

#[cfg(feature = "api-uploads")]
impl SessionKey for UploadsContext {
    fn token_key(&self) -> &Secret {
        &self.token_key
    }
    fn db(&self) -> &PgPool {
        &self.db
    }
}

#[cfg(feature = "api-tasks")]
impl SessionKey for TaskCreateContext {
    fn token_key(&self) -> &Secret {
        &self.settings.token_key
    }
    fn db(&self) -> &PgPool {
        &self.db
    }
}

#[cfg(feature = "api-task-status")]
impl SessionKey for TaskStatusContext {
    fn token_key(&self) -> &Secret {
        &self.token_key
    }
    fn db(&self) -> &PgPool {
        &self.db
    }
}

#[cfg(feature = "api-auth")]
impl SessionKey for AuthContext {
    fn token_key(&self) -> &Secret {
        &self.settings.token_key
    }
    fn db(&self) -> &PgPool {
        &self.db
    }
}

#[cfg(feature = "api-auth")]
impl AuthContext {
    pub fn new(
        db: PgPool,
        pepper: Secret,
        token_key: Secret,
        limits: crate::domain::login_limits::LoginLimits,
    ) -> Arc<AuthContext> {
        let permits = std::thread::available_parallelism().map_or(2, |n| n.get());
        Arc::new(AuthContext {
            db,
            settings: AuthSettings { pepper, token_key },
            argon2: Argon2Limit::new(permits),
            limits,
        })
    }
}

#[cfg(feature = "api-catalog")]
impl CatalogContext {
    pub fn new(catalog: Arc<Catalog>) -> Arc<CatalogContext> {
        let catalog_json = serde_json::to_vec(&catalog.public_view()).expect("JSON values serialise").into();
        Arc::new(CatalogContext { catalog, catalog_json, openapi_json: OnceLock::new() })
    }

    /// The OpenAPI document of this deployment, as JSON.
    pub fn openapi_json(&self) -> Bytes {
        self.openapi_json
            .get_or_init(|| serde_json::to_vec(&super::openapi(&self.catalog)).expect("JSON values serialise").into())
            .clone()
    }
}

#[cfg(feature = "api-tasks")]
impl TaskCreateContext {
    /// The worker's default lease (`REEVE_LEASE_SECONDS` unset).
    pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(20);

    /// The facilitator client, when the catalog sells anything.
    pub fn new(
        catalog: Arc<Catalog>,
        db: PgPool,
        aws: AwsClients,
        settings: ApiSettings,
        chains: crate::domain::payments::Chains,
    ) -> Arc<TaskCreateContext> {
        let facilitator = catalog.payments.as_ref().and_then(|p| {
            crate::domain::payments::Facilitator::new(&p.facilitator_url)
                .inspect_err(|e| tracing::error!(error = %e, "no facilitator client"))
                .ok()
        });
        // No Redis URL (a test's context): publishing fails, and is logged.
        let redis = RedisClient::new(&settings.redis_url)
            .or_else(|_| RedisClient::new("redis://127.0.0.1:1"))
            .expect("a loopback URL is valid");
        Arc::new(TaskCreateContext {
            catalog,
            db,
            aws,
            settings,
            facilitator,
            chains,
            events: crate::domain::tasks::Publisher::new(redis),
            lease: Self::DEFAULT_LEASE,
            max_attempts: crate::domain::tasks::DEFAULT_MAX_RECEIVES,
            batch_authorizer: None,
        })
    }
}

#[cfg(feature = "api")]
/// Every route's context at once: `reeve serve` and the tests.
pub struct ApiContext {
    pub catalog: Arc<Catalog>,
    pub db: PgPool,
    pub redis: RedisClient,
    pub aws: AwsClients,
    pub settings: ApiSettings,
    /// The operators' SSRF-guarded client (`REEVE_OPERATOR_ALLOW`): for the
    /// hosts the operator configured. Never for a URL a user chose.
    pub operators: Outbound,
    pub auth: Arc<AuthContext>,
    pub catalog_ctx: Arc<CatalogContext>,
    pub uploads: Arc<UploadsContext>,
    pub task_create: Arc<TaskCreateContext>,
    pub task_status: Arc<TaskStatusContext>,
    pub health: Arc<HealthContext>,
}

#[cfg(feature = "api")]
pub type Ctx = Arc<ApiContext>;

#[cfg(feature = "api")]
impl ApiContext {
    /// A context whose operators' client has the default policy (public
    /// HTTPS hosts only), and no chain endpoints: what tests need.
    pub fn new(catalog: Catalog, db: PgPool, redis: RedisClient, aws: AwsClients, settings: ApiSettings) -> Ctx {
        let operators = Outbound::new(OutboundPolicy::default()).expect("the default policy is valid");
        Self::with_operators(catalog, db, redis, aws, settings, operators, crate::domain::payments::Chains::none())
    }

    /// Every function's context, on the same pool, Redis client and AWS
    /// clients.
    pub fn with_operators(
        catalog: Catalog,
        db: PgPool,
        redis: RedisClient,
        aws: AwsClients,
        settings: ApiSettings,
        operators: Outbound,
        chains: crate::domain::payments::Chains,
    ) -> Ctx {
        let catalog = Arc::new(catalog);
        let auth =
            AuthContext::new(db.clone(), settings.pepper.clone(), settings.token_key.clone(), settings.limits.clone());
        let uploads = Arc::new(UploadsContext {
            db: db.clone(),
            token_key: settings.token_key.clone(),
            s3: aws.objects.clone(),
            bucket: settings.bucket.clone(),
            uploads: catalog.uploads.clone(),
        });
        let task_create = TaskCreateContext::new(catalog.clone(), db.clone(), aws.clone(), settings.clone(), chains);
        let task_status = Arc::new(TaskStatusContext {
            db: db.clone(),
            redis: redis.clone(),
            token_key: settings.token_key.clone(),
            catalog: catalog.clone(),
            links: crate::domain::tasks::OutputLinks::new(aws.objects.clone(), settings.bucket.clone()),
            seller: settings.seller.clone(),
        });
        let health = Arc::new(HealthContext { db: db.clone(), redis: redis.clone() });
        Arc::new(ApiContext {
            catalog_ctx: CatalogContext::new(catalog.clone()),
            catalog,
            db,
            redis,
            aws,
            settings,
            operators,
            auth,
            uploads,
            task_create,
            task_status,
            health,
        })
    }
}
