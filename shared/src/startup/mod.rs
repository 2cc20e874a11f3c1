//! The one start-up path. Every binary's `main` builds its context here —
//! each Lambda, the relay, `reeve serve`, `reeve work` — from one
//! [`Config`], the process's environment read once ([`Config::from_env`]);
//! tests build theirs from a `Config` of their own through the same code.
//!
//! Each builder gathers every problem of the catalog and the environment
//! before it fails, as one [`StartupError`], so an operator fixes a
//! deployment in one round: a missing secret, a malformed Postgres or Redis
//! URL, a bad bind address and a catalog error are reported together. Only
//! then are the stores opened (`Connect::Now` may still fail on an
//! unreachable Postgres, which can only be known by trying).
//!
//! Secrets: each secret is either a plain variable (`REEVE_PEPPER`; a
//! development `.env`, or the relay's container, which ECS gives the values)
//! or, in a Lambda, the ARN of a Secrets Manager secret
//! (`REEVE_PEPPER_SECRET_ARN`), read here once at init with the SDK, so the
//! function's configuration holds the ARN, never the value. A function asks
//! only for the secrets its routes use ([`Needs`]).
//!
//! This module sits above the others: it assembles the adapters' contexts
//! from the domain and the infrastructure, as a `main` would.

#[cfg(all(feature = "catalog", feature = "outbound"))]
mod facilitator_check;
pub mod settings;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "aws")]
use aws_config::SdkConfig;
#[cfg(feature = "secrets")]
use aws_sdk_secretsmanager::error::{DisplayErrorContext, ProvideErrorMetadata};
use sqlx::PgPool;

#[cfg(all(feature = "catalog", feature = "outbound"))]
pub use facilitator_check::{FacilitatorCheck, check_facilitator, facilitator_for};
pub use settings::{Config, Env, Needs, SettingsError};

#[cfg(feature = "api-auth")]
use crate::adapters::http::AuthContext;
#[cfg(feature = "api-catalog")]
use crate::adapters::http::CatalogContext;
#[cfg(feature = "api-uploads")]
use crate::adapters::http::UploadsContext;
#[cfg(feature = "api")]
use crate::adapters::http::{ApiContext, Ctx};
#[cfg(feature = "relay")]
use crate::adapters::http::{CorsOrigins, DEFAULT_KEEPALIVE, RelayContext, RelayCtx, RelayLimits};
#[cfg(feature = "api-tasks")]
use crate::adapters::http::{TaskCreateContext, TaskStatusContext};
#[cfg(feature = "mcp")]
use crate::adapters::mcp::{McpContext, McpStores};
#[cfg(feature = "sweeper")]
use crate::adapters::sweeper::Sweeper;
#[cfg(feature = "upload-guard")]
use crate::adapters::upload_guard::Guard;
#[cfg(feature = "worker")]
use crate::adapters::worker::WorkerContext;
use crate::domain::auth::Secret;
#[cfg(feature = "catalog")]
use crate::domain::catalog::Catalog;
#[cfg(feature = "worker")]
use crate::domain::executors::ExecDeps;
#[cfg(feature = "chain")]
use crate::domain::payments::Chains;
#[cfg(feature = "outbound")]
use crate::domain::payments::facilitator;
#[cfg(feature = "relay")]
use crate::domain::relay::{Hub, StreamCaps};
#[cfg(feature = "mcp")]
use crate::domain::spaces::Argon2Limit;
use crate::domain::tasks::Publisher;
#[cfg(feature = "aws")]
use crate::infra::aws;
#[cfg(all(feature = "s3", feature = "sqs"))]
use crate::infra::aws::AwsClients;
use crate::infra::db::{self, Connect, DbError};
#[cfg(feature = "outbound")]
use crate::infra::outbound::{Outbound, OutboundPolicy};
use crate::infra::redis_client::{self, BadRedisUrl, RedisClient};

/// Why a process could not start: what every binary's `main` reports.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The catalog and the environment, every problem of both.
    #[error("{}", .0.join("\n"))]
    Config(Vec<String>),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Redis(#[from] BadRedisUrl),
}

impl StartupError {
    /// Each problem on its own line.
    pub fn problems(&self) -> Vec<String> {
        match self {
            StartupError::Config(problems) => problems.clone(),
            other => vec![other.to_string()],
        }
    }
}

/// Two builders' results as one: both values, or every problem of either
/// (a problem both report, such as a missing `DATABASE_URL`, once).
pub fn both<A, B>(a: Result<A, StartupError>, b: Result<B, StartupError>) -> Result<(A, B), StartupError> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (a, b) => {
            let mut problems: Vec<String> = Vec::new();
            for line in [a.err(), b.err()].into_iter().flatten().flat_map(|e| e.problems()) {
                if !problems.contains(&line) {
                    problems.push(line);
                }
            }
            Err(StartupError::Config(problems))
        }
    }
}

/// For a `main` that cannot return the error readably (lambda_runtime
/// reports nothing for an error before `run`, and an `Err` from `main`
/// prints its Debug form): logs every problem (JSON in Lambda and Fargate)
/// and exits 1.
pub fn or_exit<T>(result: Result<T, StartupError>) -> T {
    result.unwrap_or_else(|e| {
        tracing::error!("cannot start: {e}");
        std::process::exit(1)
    })
}

/// The AWS SDK's configuration, loaded once per process (the SDK reads the
/// standard AWS variables itself), with an HTTPS client that trusts the
/// process's roots (`crate::infra::tls`) instead of loading the system's store.
#[cfg(feature = "aws")]
pub async fn sdk() -> SdkConfig {
    use aws_smithy_http_client::tls::{self, TlsContext, TrustStore, rustls_provider::CryptoMode};
    let trust = TrustStore::empty().with_native_roots(false).with_pem_certificate(crate::infra::tls::roots_pem());
    let context = TlsContext::builder().with_trust_store(trust).build().expect("a trust store is a valid TLS context");
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
        .tls_context(context)
        .build_https();
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http).load().await
}

#[cfg(all(feature = "s3", feature = "sqs"))]
/// Both AWS clients on `config`'s endpoints, with the SDK's configuration
/// loaded for them: for tools and tests (each binary builds only the
/// clients it uses).
pub async fn aws_clients(config: &Config) -> AwsClients {
    AwsClients::from_config(&sdk().await, config.s3_endpoint().is_some())
}

/// A Lambda's configuration: the process's environment, with the EMF
/// metrics exporter installed when it runs in Lambda (a Lambda has nowhere
/// to serve Prometheus from; its metrics go to stdout as EMF lines). Every
/// `lambda_*` builder starts with it.
pub fn lambda_config() -> Config {
    let config = Config::from_env();
    if config.in_lambda()
        && let Err(e) = crate::infra::metrics::install_emf(&config.metrics_namespace())
    {
        tracing::error!("{e}");
    }
    config
}

/// Problems collected so far as a result.
fn checked(problems: Vec<String>) -> Result<(), StartupError> {
    if problems.is_empty() { Ok(()) } else { Err(StartupError::Config(problems)) }
}

// ------------------------------------------------------- HTTP functions
//
// Each function's context holds what its routes use and no more, and its
// builder reads only the variables and secrets those need: the `catalog`
// function is given no secret and opens no store; `auth` loads no catalog.
// Postgres is reached on first use, so a cold start opens nothing.

#[cfg(feature = "api-auth")]
/// The `auth` function's context. Exits 1 on any problem.
pub async fn lambda_auth() -> Arc<AuthContext> {
    let config = lambda_config();
    or_exit(auth(&config, &sdk().await).await)
}

#[cfg(feature = "api-auth")]
/// Creating Spaces and opening sessions: the pepper, the token key, Postgres.
pub async fn auth(config: &Config, sdk: &SdkConfig) -> Result<Arc<AuthContext>, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &Needs::AUTH.secrets()).await;
    let mut env = config.env();
    let pepper = env.secret(settings::PEPPER);
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let (Some(pepper), Some(token_key), Some(database_url), true) =
        (pepper, token_key, database_url, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    Ok(AuthContext::new(db::connect_lazy(database_url.expose_str())?, pepper, token_key))
}

#[cfg(feature = "api-catalog")]
/// The `catalog` function's context. Exits 1 on any problem.
pub async fn lambda_catalog() -> Arc<CatalogContext> {
    or_exit(catalog(&lambda_config()))
}

#[cfg(feature = "api-catalog")]
/// The catalog and its OpenAPI document: the catalog file, nothing else.
pub fn catalog(config: &Config) -> Result<Arc<CatalogContext>, StartupError> {
    let mut problems = Vec::new();
    let catalog = deployed_catalog(config, &mut problems);
    match catalog {
        Some(catalog) if problems.is_empty() => Ok(CatalogContext::new(Arc::new(catalog))),
        _ => Err(StartupError::Config(problems)),
    }
}

#[cfg(feature = "api-uploads")]
/// The `presign` function's context. Exits 1 on any problem.
pub async fn lambda_presign() -> Arc<UploadsContext> {
    let config = lambda_config();
    let sdk = sdk().await;
    or_exit(presign(&config, &sdk).await)
}

#[cfg(feature = "api-uploads")]
/// Presigned uploads: the token key, Postgres, S3, the bucket and the
/// upload policy.
pub async fn presign(config: &Config, sdk: &SdkConfig) -> Result<Arc<UploadsContext>, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &Needs::SESSION.secrets()).await;
    let mut env = config.env();
    let uploads = deployed_uploads(&config, &mut problems);
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let bucket = env.required(settings::BUCKET);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let (Some(uploads), Some(token_key), Some(database_url), true) =
        (uploads, token_key, database_url, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    Ok(Arc::new(UploadsContext {
        db: db::connect_lazy(database_url.expose_str())?,
        token_key,
        s3: aws::s3(sdk, config.s3_endpoint().is_some()),
        bucket,
        uploads,
    }))
}

#[cfg(feature = "api-tasks")]
/// The `task-create` function's context. Exits 1 on any problem.
pub async fn lambda_task_create() -> Arc<TaskCreateContext> {
    let config = lambda_config();
    let sdk = sdk().await;
    or_exit(task_create(&config, &sdk).await)
}

#[cfg(feature = "api-tasks")]
/// Creating tasks: the catalog, the token key, Postgres, S3 (the uploads an
/// input names), SQS and the facilitator.
pub async fn task_create(config: &Config, sdk: &SdkConfig) -> Result<Arc<TaskCreateContext>, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &Needs::SESSION.secrets()).await;
    let mut env = config.env();
    let catalog = deployed_catalog(&config, &mut problems);
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let bucket = env.required(settings::BUCKET);
    let queue_url = env.required(settings::QUEUE_URL);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let chains = chain_endpoints(&config, catalog.as_ref(), &mut problems);
    let (Some(catalog), Some(token_key), Some(database_url), true) =
        (catalog, token_key, database_url, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    let db = db::connect_lazy(database_url.expose_str())?;
    let api_settings = crate::adapters::http::ApiSettings {
        pepper: Secret::withheld(settings::PEPPER),
        token_key,
        database_url,
        redis_url: String::new(),
        bucket,
        queue_url,
    };
    let aws = AwsClients::from_config(sdk, config.s3_endpoint().is_some());
    Ok(TaskCreateContext::new(Arc::new(catalog), db, aws, api_settings, chains))
}

#[cfg(feature = "api-tasks")]
/// The `task-status` function's context. Exits 1 on any problem.
pub async fn lambda_task_status() -> Arc<TaskStatusContext> {
    let config = lambda_config();
    let sdk = sdk().await;
    or_exit(task_status(&config, &sdk).await)
}

#[cfg(feature = "api-tasks")]
/// Reading, listing and canceling tasks, and `GET /v1/space`: the token key,
/// Postgres, the Redis doorbell, the catalog for the free kinds' quotas, and
/// the bucket whose outputs a result's link is signed for.
pub async fn task_status(config: &Config, sdk: &SdkConfig) -> Result<Arc<TaskStatusContext>, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &Needs::SESSION.secrets()).await;
    let catalog = deployed_catalog(&config, &mut problems);
    let mut env = config.env();
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let redis_url = env.required(settings::REDIS_URL);
    let bucket = env.required(settings::BUCKET);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let (Some(token_key), Some(database_url), Some(catalog), true) =
        (token_key, database_url, catalog, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    Ok(Arc::new(TaskStatusContext {
        db: db::connect_lazy(database_url.expose_str())?,
        redis: RedisClient::new(&redis_url)?,
        token_key,
        catalog: Arc::new(catalog),
        links: crate::domain::tasks::OutputLinks::new(aws::s3(sdk, config.s3_endpoint().is_some()), bucket),
    }))
}

/// The catalog's upload policy alone (presign, the upload guard), lowered
/// to the template's `UploadMaxBytes`: read without the task schemas.
fn deployed_uploads(config: &Config, problems: &mut Vec<String>) -> Option<crate::domain::catalog::Uploads> {
    let uploads =
        crate::domain::catalog::Uploads::load(&config.catalog_path()).map_err(|e| problems.push(e.to_string())).ok();
    let mut env = config.env();
    let cap = settings::upload_limit(&mut env);
    problems.extend(env.take_problems());
    Some(uploads?.capped(cap))
}

#[cfg(feature = "chain")]
/// `REEVE_CHAIN_RPC_URLS`, each payment network's JSON-RPC endpoint, for
/// resolving a settlement whose outcome was lost (task create, the sweeps).
/// A malformed value is a problem; a priced network without one is logged.
fn chain_endpoints(config: &Config, catalog: Option<&Catalog>, problems: &mut Vec<String>) -> Chains {
    let chains = match config.get(crate::domain::payments::CHAIN_RPC_URLS) {
        None => Chains::none(),
        Some(text) => Chains::parse(&text).unwrap_or_else(|found| {
            problems.extend(found);
            Chains::none()
        }),
    };
    if let Some(catalog) = catalog {
        chains.warn_missing(catalog);
    }
    chains
}

#[cfg(feature = "catalog")]
/// The catalog file at `REEVE_CATALOG`, every task's timeout checked
/// against the worker's time limit (`REEVE_WORKER_TIMEOUT_SECONDS`): every
/// process that loads it refuses a kind no worker could finish, not only
/// the worker, so no task of it is sold or queued. Problems go to `problems`.
pub fn catalog_file(config: &Config, problems: &mut Vec<String>) -> Option<Catalog> {
    let mut env = config.env();
    let worker_timeout = settings::worker_timeout(&mut env);
    problems.extend(env.take_problems());
    Catalog::load_for(&config.catalog_path(), worker_timeout).map_err(|e| problems.push(e.to_string())).ok()
}

#[cfg(feature = "catalog")]
/// The catalog as this deployment serves it: `REEVE_CATALOG`, its upload
/// limit lowered to the template's `UploadMaxBytes`, and its facilitator
/// moved by `REEVE_FACILITATOR_URL` (the local stack's own). Problems go to
/// `problems`.
fn deployed_catalog(config: &Config, problems: &mut Vec<String>) -> Option<Catalog> {
    let catalog = catalog_file(config, problems);
    let mut env = config.env();
    let cap = settings::upload_limit(&mut env);
    problems.extend(env.take_problems());
    let mut catalog = catalog?;
    catalog.uploads = catalog.uploads.capped(cap);
    // Only the functions that pay (task-create) reach the facilitator.
    #[cfg(feature = "outbound")]
    if let Some(payments) = catalog.payments.as_mut() {
        let url = facilitator::effective_url(&payments.facilitator_url, |k| config.get(k));
        payments.facilitator_url = url.map_err(|e| problems.push(e)).ok()?;
    }
    Some(catalog)
}

// ------------------------------------------------------------- whole API

#[cfg(feature = "api")]
/// The API's context: the catalog at `REEVE_CATALOG`, the secrets `needs`
/// asks for, the stores.
pub async fn api(config: &Config, sdk: &SdkConfig, needs: Needs, connect: Connect) -> Result<Ctx, StartupError> {
    let (config, problems) = with_secrets(config, sdk, &needs.secrets()).await;
    let (catalog, settings, operators, chains) = api_parts(&config, needs, problems)?;
    let db =
        if needs.database { db::open(settings.database_url.expose_str(), connect).await? } else { db::unconfigured() };
    let redis = RedisClient::new(&settings.redis_url)?;
    let aws = AwsClients::from_config(sdk, config.s3_endpoint().is_some());
    Ok(ApiContext::with_operators(catalog, db, redis, aws, settings, operators, chains))
}

#[cfg(feature = "api")]
/// The API's catalog, settings, operators' client and chain endpoints, every
/// problem at once.
fn api_parts(
    config: &Config,
    needs: Needs,
    mut problems: Vec<String>,
) -> Result<(Catalog, crate::adapters::http::ApiSettings, Outbound, Chains), StartupError> {
    let catalog = deployed_catalog(config, &mut problems);
    let chains = chain_endpoints(config, catalog.as_ref(), &mut problems);
    let mut env = config.env();
    let (_, operators) = settings::outbound_policies(&env);
    let operators = outbound(&mut problems, operators, crate::infra::outbound::OPERATOR_ALLOW);
    check_urls(&mut problems, config, needs.database);
    let api_settings = settings::api_settings(&mut env, needs).map_err(|e| problems.extend(e.problems)).ok();
    problems.extend(env.take_problems());
    match (catalog, api_settings, operators) {
        (Some(catalog), Some(api_settings), Some(operators)) if problems.is_empty() => {
            Ok((catalog, api_settings, operators, chains))
        }
        _ => Err(StartupError::Config(problems)),
    }
}

// ---------------------------------------------------------------- worker

#[cfg(feature = "worker")]
/// The worker Lambda's context: the catalog at `REEVE_CATALOG`, Postgres on
/// first use. Exits 1 on any problem.
pub async fn lambda_worker() -> WorkerContext {
    let config = lambda_config();
    let sdk = sdk().await;
    or_exit(worker(&config, &sdk, Connect::Lazily).await)
}

#[cfg(feature = "worker")]
/// The worker's context (the `worker` Lambda, `reeve work`).
pub async fn worker(config: &Config, sdk: &SdkConfig, connect: Connect) -> Result<WorkerContext, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &[settings::DATABASE_URL]).await;
    let catalog = catalog_file(&config, &mut problems);
    // For the sweep that runs beside a long-lived worker.
    #[cfg(feature = "chain")]
    let chains = chain_endpoints(&config, catalog.as_ref(), &mut problems);
    let (catalog, worker_settings, users, operators) = worker_parts(&config, catalog, problems)?;
    let db = db::open(worker_settings.database_url.expose_str(), connect).await?;
    let redis = RedisClient::new(&worker_settings.redis_url)?;
    let s3 = aws::s3(sdk, config.s3_endpoint().is_some());
    #[allow(unused_mut)]
    let mut ctx = worker_on(catalog, db, redis, (s3, aws::sqs(sdk)), worker_settings, users, operators);
    #[cfg(feature = "chain")]
    {
        ctx.chains = chains;
    }
    Ok(ctx)
}

#[cfg(feature = "worker")]
type WorkerParts = (Catalog, crate::adapters::worker::WorkerSettings, Outbound, Outbound);

#[cfg(feature = "worker")]
/// The worker's settings and clients over `catalog` (`None`: its problems
/// are in `problems` already), every problem at once.
fn worker_parts(
    config: &Config,
    catalog: Option<Catalog>,
    mut problems: Vec<String>,
) -> Result<WorkerParts, StartupError> {
    let mut env = config.env();
    let worker_settings = settings::worker_settings(&mut env).map_err(|e| problems.extend(e.problems)).ok();
    let (users, operators) = settings::outbound_policies(&env);
    let users = outbound(&mut problems, users, crate::infra::outbound::FETCH_ALLOW);
    let operators = outbound(&mut problems, operators, crate::infra::outbound::OPERATOR_ALLOW);
    check_urls(&mut problems, config, true);
    problems.extend(env.take_problems());
    match (catalog, worker_settings, users, operators) {
        (Some(c), Some(s), Some(u), Some(o)) if problems.is_empty() => Ok((c, s, u, o)),
        _ => Err(StartupError::Config(problems)),
    }
}

#[cfg(feature = "worker")]
fn worker_on(
    catalog: Catalog,
    db: PgPool,
    redis: RedisClient,
    (s3, sqs): (aws_sdk_s3::Client, aws_sdk_sqs::Client),
    worker_settings: crate::adapters::worker::WorkerSettings,
    users: Outbound,
    operators: Outbound,
) -> WorkerContext {
    // The Lambda is handed its records, but sets a retry's visibility on
    // the queue they came from.
    let visibility =
        worker_settings.queue_url.as_ref().map(|url| crate::adapters::worker::Visibility::new(sqs, url.clone()));
    let exec = ExecDeps {
        db: db.clone(),
        s3,
        bucket: worker_settings.bucket.clone(),
        outbound: users,
        operators,
        fetch_max_bytes: worker_settings.fetch_max_bytes,
        output_retention_days: worker_settings.output_retention_days,
    };
    WorkerContext { visibility, ..WorkerContext::new(catalog, db, redis, exec, worker_settings) }
}

// --------------------------------------------------------------- sweeper

#[cfg(feature = "sweeper")]
/// The sweeper Lambda's context: the database URL (by ARN in a
/// deployment), Redis, the queue. Exits 1 on any problem.
pub async fn lambda_sweeper() -> Sweeper {
    let config = lambda_config();
    let sdk = sdk().await;
    or_exit(sweeper(&config, &sdk).await)
}

#[cfg(feature = "sweeper")]
/// The sweeper's context (the `sweeper` Lambda, `reeve sweep`).
pub async fn sweeper(config: &Config, sdk: &SdkConfig) -> Result<Sweeper, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &[settings::DATABASE_URL]).await;
    let mut env = config.env();
    let database_url = env.secret_text(settings::DATABASE_URL);
    let redis_url = env.required(settings::REDIS_URL);
    let queue_url = env.required(settings::QUEUE_URL);
    let max_attempts = settings::max_receives(&mut env);
    let older_than = settings::sweep_older_than(&mut env, crate::adapters::sweeper::DEFAULT_OLDER_THAN);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    // The reconciler creates the task of a payment that landed late, if its
    // kind is still offered.
    let catalog = catalog_file(&config, &mut problems);
    let chains = chain_endpoints(&config, catalog.as_ref(), &mut problems);
    checked(problems)?;
    let database_url = database_url.expect("reported when missing");
    Ok(Sweeper {
        db: db::connect_lazy(database_url.expose_str())?,
        sqs: aws::sqs(sdk),
        queue_url,
        events: Publisher::new(RedisClient::new(&redis_url)?),
        max_attempts,
        older_than,
        catalog: Arc::new(catalog.expect("reported when unreadable")),
        chains,
    })
}

#[cfg(all(feature = "poller", feature = "sweeper"))]
/// The sweeper a long-running worker runs beside its poller (`reeve work`,
/// `reeve serve`), on the worker's own Postgres pool and Redis doorbell.
pub fn sweeper_beside(worker: &WorkerContext, sqs: aws_sdk_sqs::Client, queue_url: String) -> Sweeper {
    Sweeper {
        db: worker.db.clone(),
        sqs,
        queue_url,
        events: worker.events.clone(),
        max_attempts: worker.settings.max_receives,
        older_than: crate::adapters::sweeper::DEFAULT_OLDER_THAN,
        catalog: worker.catalog.clone(),
        chains: worker.chains.clone(),
    }
}

// ---------------------------------------------------------- upload guard

#[cfg(feature = "upload-guard")]
/// The upload guard Lambda's context. Exits 1 on any problem.
pub async fn lambda_guard() -> Guard {
    let config = lambda_config();
    let sdk = sdk().await;
    or_exit(guard(&config, &sdk).await)
}

#[cfg(feature = "upload-guard")]
/// The upload guard's context: Postgres (on first use), S3, the bucket and
/// the upload limit (the catalog's, capped by the deployment's; the rest of
/// the catalog is not loaded).
pub async fn guard(config: &Config, sdk: &SdkConfig) -> Result<Guard, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &[settings::DATABASE_URL]).await;
    let mut env = config.env();
    let uploads = deployed_uploads(&config, &mut problems);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let bucket = env.required(settings::BUCKET);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let (Some(uploads), Some(database_url), true) = (uploads, database_url, problems.is_empty()) else {
        return Err(StartupError::Config(problems));
    };
    Ok(Guard {
        db: db::connect_lazy(database_url.expose_str())?,
        s3: aws::s3(sdk, config.s3_endpoint().is_some()),
        bucket,
        max_bytes: uploads.max_bytes,
    })
}

// ----------------------------------------------------------------- relay

#[cfg(feature = "relay")]
/// Where the relay listens when `REEVE_RELAY_BIND` is not set: in a
/// container it must listen beyond loopback.
pub const DEFAULT_RELAY_BIND: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8080);

#[cfg(feature = "relay")]
/// Where the relay serves `/metrics` when `REEVE_METRICS_BIND` is not set:
/// loopback, so a relay started by hand shows its metrics to nobody else.
/// The image and the template set `0.0.0.0:9090` for the scraper.
pub const DEFAULT_RELAY_METRICS_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9090);

#[cfg(feature = "relay")]
/// The relay's two listeners: the SSE routes (behind the load balancer) and
/// Prometheus `/metrics`, which must be on another port, since the load
/// balancer forwards every path of the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayListeners {
    pub relay: SocketAddr,
    pub metrics: SocketAddr,
}

#[cfg(feature = "relay")]
/// Everything the relay process needs: its context, its listeners and the
/// browser origins it answers.
pub struct Relay {
    pub ctx: RelayCtx,
    pub listeners: RelayListeners,
    pub cors: CorsOrigins,
}

#[cfg(feature = "relay")]
/// The relay (the Fargate service and `reeve relay`): Postgres, Redis and
/// the token key, both listen addresses and the CORS origins, every problem
/// of them at once. `REEVE_KEEPALIVE_SECONDS` moves the keep-alive interval,
/// and [`relay_limits`] reads the caps.
/// Its secrets are plain variables: ECS puts their values in its
/// environment.
pub fn relay(config: &Config) -> Result<Relay, StartupError> {
    let mut problems = Vec::new();
    let mut env = config.env();
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.required(settings::DATABASE_URL);
    let redis_url = env.required(settings::REDIS_URL);
    let keepalive = Duration::from_secs(env.number(settings::KEEPALIVE, DEFAULT_KEEPALIVE.as_secs(), 1, 300));
    let api_origin = env.origin(settings::API_ORIGIN);
    let limits = relay_limits(&mut env);
    let relay_bind = env.socket_addr(settings::RELAY_BIND, DEFAULT_RELAY_BIND);
    let metrics_bind = env.socket_addr(settings::METRICS_BIND, DEFAULT_RELAY_METRICS_BIND);
    let cors = settings::cors_origins(&mut env);
    check_urls(&mut problems, config, true);
    problems.extend(env.take_problems());
    if shares_a_port(relay_bind, metrics_bind) {
        problems.push(format!(
            "{} ({metrics_bind}) must not be the relay's port ({relay_bind}): the load balancer forwards every path there",
            settings::METRICS_BIND
        ));
    }
    let (Some(token_key), true) = (token_key, problems.is_empty()) else {
        return Err(StartupError::Config(problems));
    };
    let db = db::connect_lazy(&database_url)?;
    let ctx = relay_on(db, redis_client::open(&redis_url)?, token_key, keepalive, api_origin, limits);
    Ok(Relay { ctx, listeners: RelayListeners { relay: relay_bind, metrics: metrics_bind }, cors })
}

#[cfg(feature = "relay")]
/// The relay's caps on open streams (`REEVE_RELAY_STREAMS_PER_SPACE`,
/// `REEVE_RELAY_STREAMS_PER_IP`) and how many proxies in front of it append
/// the client's address to `X-Forwarded-For` (`REEVE_TRUSTED_PROXY_HOPS`;
/// the template's load balancer is 1; unset, the TCP peer is the client).
fn relay_limits<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> RelayLimits {
    let caps = StreamCaps {
        per_space: env.number(settings::RELAY_STREAMS_PER_SPACE, StreamCaps::DEFAULT_PER_SPACE as u64, 1, 1_000_000)
            as usize,
        per_ip: env.number(settings::RELAY_STREAMS_PER_IP, StreamCaps::DEFAULT_PER_IP as u64, 1, 1_000_000) as usize,
    };
    RelayLimits { caps, proxy_hops: env.number(settings::TRUSTED_PROXY_HOPS, 0, 0, 10) as usize }
}

#[cfg(feature = "relay")]
fn relay_on(
    db: PgPool,
    redis: redis::Client,
    token_key: Secret,
    keepalive: Duration,
    api_origin: Option<String>,
    limits: RelayLimits,
) -> RelayCtx {
    Arc::new(RelayContext { db, token_key, hub: Hub::start(redis), keepalive, api_origin, limits })
}

#[cfg(feature = "relay")]
/// Whether two listeners would claim the same port on some address.
fn shares_a_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

#[cfg(feature = "relay")]
/// Why a running relay stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Metrics(#[from] crate::infra::metrics::MountError),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("relay stopped: {0}")]
    Serve(std::io::Error),
}

#[cfg(feature = "relay")]
/// Runs the relay until `shutdown` resolves: Prometheus `/metrics` on its
/// own listener, never on the relay's port (the load balancer forwards every
/// path of that port to the internet), then the SSE routes with `/healthz`.
/// The Fargate service and `reeve relay` both run it.
pub async fn run_relay(
    relay: Relay,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RelayError> {
    let Relay { ctx, listeners, cors } = relay;
    let handle = crate::infra::metrics::install_prometheus().map_err(crate::infra::metrics::MountError::from)?;
    crate::infra::metrics::serve(listeners.metrics, handle)
        .await
        .map_err(|e| crate::infra::metrics::MountError::Bind(listeners.metrics, e))?;
    let listener =
        tokio::net::TcpListener::bind(listeners.relay).await.map_err(|e| RelayError::Listen(listeners.relay, e))?;
    tracing::info!(bind = %listeners.relay, "relay serving");
    // The peer address is the client when no proxy is trusted: the
    // per-address stream cap counts by it.
    let service = crate::adapters::http::with_cors(crate::adapters::http::relay_app(ctx), &cors)
        .into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service).with_graceful_shutdown(shutdown).await.map_err(RelayError::Serve)
}

// ---------------------------------------------------------------- serve

#[cfg(all(feature = "api", feature = "relay", feature = "worker"))]
/// Everything `reeve serve` runs in one process: every API route, the
/// relay's routes and (unless it serves only) a worker, all on one Postgres
/// pool, one Redis client and one SDK configuration.
pub struct Serve {
    pub api: Ctx,
    pub relay: RelayCtx,
    pub cors: CorsOrigins,
    pub worker: Option<WorkerContext>,
    /// `POST /mcp`, beside the API on its stores.
    #[cfg(feature = "mcp")]
    pub mcp: Arc<McpContext>,
}

#[cfg(all(feature = "api", feature = "relay", feature = "worker"))]
/// `reeve serve`'s contexts, every problem of all of them at once.
pub async fn serve(config: &Config, sdk: &SdkConfig, with_worker: bool) -> Result<Serve, StartupError> {
    let (config, problems) = with_secrets(config, sdk, &Needs::ALL.secrets()).await;
    let api = api_parts(&config, Needs::ALL, problems);
    // The worker runs the API's catalog: loaded and checked once.
    let catalog = api.as_ref().ok().map(|(catalog, ..)| catalog.clone());
    let worker = match (with_worker, catalog) {
        (false, _) => Ok(None),
        (true, Some(catalog)) => worker_parts(&config, Some(catalog), Vec::new()).map(Some),
        (true, None) => worker_parts(&config, None, vec![]).map(Some).or_else(|e| match e {
            // The catalog's own problems are the API's to report.
            StartupError::Config(problems) if problems.is_empty() => Ok(None),
            other => Err(other),
        }),
    };
    let mut env = config.env();
    let keepalive = Duration::from_secs(env.number(settings::KEEPALIVE, DEFAULT_KEEPALIVE.as_secs(), 1, 300));
    let api_origin = env.origin(settings::API_ORIGIN);
    let limits = relay_limits(&mut env);
    let cors = settings::cors_origins(&mut env);
    let rest = checked(env.take_problems());
    let ((catalog, api_settings, operators, chains), (worker, ())) = both(api, both(worker, rest))?;
    let db = db::open(api_settings.database_url.expose_str(), Connect::Now).await?;
    let redis_url = api_settings.redis_url.clone();
    let aws = AwsClients::from_config(sdk, config.s3_endpoint().is_some());
    let relay = relay_on(
        db.clone(),
        redis_client::open(&redis_url)?,
        api_settings.token_key.clone(),
        keepalive,
        api_origin,
        limits,
    );
    let worker = match worker {
        Some((catalog, worker_settings, users, operators)) => {
            let redis = RedisClient::new(&redis_url)?;
            let clients = (aws.s3.clone(), aws.sqs.clone());
            let mut ctx = worker_on(catalog, db.clone(), redis, clients, worker_settings, users, operators);
            ctx.chains = chains.clone();
            Some(ctx)
        }
        None => None,
    };
    let redis = RedisClient::new(&redis_url)?;
    let api = ApiContext::with_operators(catalog, db, redis, aws, api_settings, operators, chains);
    // A long-lived process may ask the facilitator before it serves; a
    // Lambda asks on its first priced request instead (payments::supported).
    let source = config.catalog_path().display().to_string();
    facilitator_check::announce_unsettled_prices(&api.catalog, api.task_create.facilitator.as_ref(), &source).await;
    // Its replies stream from here, so waiting tools send progress.
    #[cfg(feature = "mcp")]
    let mcp = mcp_beside(&api, settings::mcp_settings(&config.env(), true));
    Ok(Serve {
        api,
        relay,
        cors,
        worker,
        #[cfg(feature = "mcp")]
        mcp,
    })
}

// ------------------------------------------------------------------- MCP

/// The `mcp` function's context. Exits 1 on any problem.
#[cfg(feature = "mcp")]
pub async fn lambda_mcp() -> Arc<McpContext> {
    let config = lambda_config();
    or_exit(mcp(&config, &sdk().await).await)
}

/// `POST /mcp` alone: what auth, presign, task-create and task-status use
/// together (its tools do what they do): both secrets, the catalog, Postgres,
/// Redis, the bucket and the queue. A Lambda's reply is buffered whole, so
/// it sends no progress notifications.
#[cfg(feature = "mcp")]
pub async fn mcp(config: &Config, sdk: &SdkConfig) -> Result<Arc<McpContext>, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &Needs::AUTH.secrets()).await;
    let mut env = config.env();
    let catalog = deployed_catalog(&config, &mut problems);
    let pepper = env.secret(settings::PEPPER);
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let redis_url = env.required(settings::REDIS_URL);
    let bucket = env.required(settings::BUCKET);
    let queue_url = env.required(settings::QUEUE_URL);
    let mcp_settings = settings::mcp_settings(&env, false);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let chains = chain_endpoints(&config, catalog.as_ref(), &mut problems);
    let (Some(catalog), Some(pepper), Some(token_key), Some(database_url), true) =
        (catalog, pepper, token_key, database_url, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    let stores = McpStores {
        db: db::connect_lazy(database_url.expose_str())?,
        redis: RedisClient::new(&redis_url)?,
        aws: AwsClients::from_config(sdk, config.s3_endpoint().is_some()),
        bucket,
        queue_url,
        chains,
    };
    // One Argon2id run per core at a time, as the auth function allows.
    let argon2 = Argon2Limit::new(std::thread::available_parallelism().map_or(2, |n| n.get()));
    Ok(McpContext::new(Arc::new(catalog), stores, (pepper, token_key), argon2, mcp_settings))
}

/// The MCP endpoint beside the API, on its catalog, secrets and stores
/// (`reeve serve`, and tests).
#[cfg(all(feature = "mcp", feature = "api"))]
pub fn mcp_beside(api: &ApiContext, settings: crate::adapters::mcp::McpSettings) -> Arc<McpContext> {
    let stores = McpStores {
        db: api.db.clone(),
        redis: api.redis.clone(),
        aws: api.aws.clone(),
        bucket: api.settings.bucket.clone(),
        queue_url: api.settings.queue_url.clone(),
        chains: api.task_create.chains.clone(),
    };
    let secrets = (api.settings.pepper.clone(), api.settings.token_key.clone());
    let mut ctx = McpContext::new(api.catalog.clone(), stores, secrets, api.auth.argon2.clone(), settings);
    // The same budgets as the API's login routes (one Postgres row per address).
    if let Some(fresh) = Arc::get_mut(&mut ctx) {
        fresh.limits = api.auth.limits;
    }
    ctx
}

// --------------------------------------------------------------- migrate

#[cfg(feature = "secrets")]
/// The database URL alone (`reeve migrate`): plain or from Secrets Manager.
pub async fn database_url(config: &Config, sdk: &SdkConfig) -> Result<Secret, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &[settings::DATABASE_URL]).await;
    let mut env = config.env();
    let url = env.secret_text(settings::DATABASE_URL);
    problems.extend(env.take_problems());
    if let Some(url) = &url {
        check_database_url(&mut problems, url.expose_str());
    }
    match url {
        Some(url) if problems.is_empty() => Ok(url),
        _ => Err(StartupError::Config(problems)),
    }
}

// --------------------------------------------------------------- secrets

#[cfg(feature = "secrets")]
/// `config` with the secrets in `wanted` that it names by ARN rather than by
/// value read from Secrets Manager, all at once, under their plain names.
/// A secret given both ways is a problem (which one would win is a guess);
/// a secret given neither way is left to the settings, which report it as
/// not set.
async fn with_secrets(config: &Config, sdk: &SdkConfig, wanted: &[&'static str]) -> (Config, Vec<String>) {
    let (fetched, problems) = fetch_secrets(config, sdk, wanted).await;
    (config.overlaid(fetched), problems)
}

#[cfg(feature = "secrets")]
async fn fetch_secrets(
    config: &Config,
    sdk: &SdkConfig,
    wanted: &[&'static str],
) -> (HashMap<&'static str, Secret>, Vec<String>) {
    let mut problems = Vec::new();
    let mut by_arn = Vec::new();
    for &name in wanted {
        let Some(arn_variable) = settings::arn_variable(name) else { continue };
        match (config.get(name), config.get(arn_variable)) {
            (Some(_), Some(_)) => problems.push(format!("set {name} or {arn_variable}, not both")),
            (None, Some(arn)) => by_arn.push((name, arn_variable, arn.trim().to_owned())),
            _ => {}
        }
    }
    let mut fetched = HashMap::new();
    if by_arn.is_empty() {
        return (fetched, problems);
    }
    let client = aws_sdk_secretsmanager::Client::new(sdk);
    let reads = by_arn.iter().map(|(_, _, arn)| client.get_secret_value().secret_id(arn).send());
    let answers = futures_util::future::join_all(reads).await;
    for ((name, arn_variable, arn), answer) in by_arn.into_iter().zip(answers) {
        match answer {
            Ok(mut output) => match output.secret_string.take() {
                Some(value) if !value.trim().is_empty() => {
                    fetched.insert(name, Secret::text(name, value));
                }
                _ => {
                    problems
                        .push(format!("{arn_variable}: the secret {arn} has no SecretString (it must hold {name})"));
                    fetched.insert(name, placeholder(name));
                }
            },
            Err(e) => {
                // The service's own code and message ("ResourceNotFoundException:
                // … can't find the specified secret", "AccessDeniedException: …"),
                // or why it could not be asked (no credentials, no network).
                let why = match e.as_service_error() {
                    Some(service) => {
                        format!("{}: {}", service.code().unwrap_or("error"), service.message().unwrap_or(""))
                    }
                    None => DisplayErrorContext(&e).to_string(),
                };
                problems.push(format!("{arn_variable}: cannot read {arn} from Secrets Manager: {why}"));
                // Reported here; a placeholder keeps the settings from also
                // calling the variable "not set".
                fetched.insert(name, placeholder(name));
            }
        }
    }
    (fetched, problems)
}

#[cfg(feature = "secrets")]
/// A value long enough to pass the settings' checks; only ever used when a
/// problem has been recorded, so start-up fails anyway.
fn placeholder(name: &'static str) -> Secret {
    Secret::text(name, "postgres://placeholder.invalid/unread-secret".to_owned())
}

#[cfg(feature = "outbound")]
fn outbound(problems: &mut Vec<String>, policy: OutboundPolicy, variable: &str) -> Option<Outbound> {
    Outbound::new(policy).map_err(|e| problems.push(format!("{variable}: {e}"))).ok()
}

/// The Postgres and Redis URLs, if set, checked without connecting, so a
/// malformed one is reported with every other problem.
fn check_urls(problems: &mut Vec<String>, config: &Config, database: bool) {
    if let Some(url) = config.get(settings::DATABASE_URL).filter(|_| database) {
        check_database_url(problems, &url);
    }
    if let Some(Err(e)) = config.get(settings::REDIS_URL).map(|url| redis_client::open(&url)) {
        problems.push(e.to_string());
    }
}

fn check_database_url(problems: &mut Vec<String>, url: &str) {
    if let Err(e) = db::check_url(url) {
        problems.push(e.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_merges_every_problem_once() {
        let a: Result<(), _> = Err(StartupError::Config(vec!["DATABASE_URL is not set".into(), "x".into()]));
        let b: Result<(), _> = Err(StartupError::Config(vec!["DATABASE_URL is not set".into(), "y".into()]));
        assert_eq!(both(a, b).unwrap_err().problems(), ["DATABASE_URL is not set", "x", "y"]);
        let ok: Result<u8, StartupError> = Ok(1);
        let bad: Result<u8, StartupError> = Err(StartupError::Redis(BadRedisUrl));
        assert_eq!(both(ok, bad).unwrap_err().problems(), ["REDIS_URL is not a valid Redis URL"]);
    }
}
