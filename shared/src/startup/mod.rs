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

#[cfg(any(feature = "api-auth", feature = "api-catalog", feature = "api-uploads", feature = "api-task-status"))]
mod http;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(feature = "relay")]
mod relay;
#[cfg(all(feature = "api", feature = "relay", feature = "worker"))]
mod serve;
#[cfg(any(feature = "worker", feature = "sweeper", feature = "upload-guard"))]
mod worker;

#[cfg(any(feature = "api-auth", feature = "api-catalog", feature = "api-uploads", feature = "api-task-status"))]
pub use http::*;
#[cfg(feature = "mcp")]
pub use mcp::*;
#[cfg(feature = "relay")]
pub use relay::*;
#[cfg(all(feature = "api", feature = "relay", feature = "worker"))]
pub use serve::*;
#[cfg(any(feature = "worker", feature = "sweeper", feature = "upload-guard"))]
pub use worker::*;

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
#[cfg(feature = "api-tasks")]
use crate::adapters::http::TaskCreateContext;
#[cfg(feature = "api-task-status")]
use crate::adapters::http::TaskStatusContext;
#[cfg(feature = "api-uploads")]
use crate::adapters::http::UploadsContext;
#[cfg(feature = "api")]
use crate::adapters::http::{ApiContext, Ctx};
#[cfg(feature = "relay")]
use crate::adapters::http::{CorsOrigins, DEFAULT_KEEPALIVE, RelayContext, RelayCtx, RelayLimits};
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
#[cfg(feature = "outbound")]
use crate::domain::webhooks::sender::Sender;
#[cfg(feature = "aws")]
use crate::infra::aws;
#[cfg(all(feature = "s3-objects", feature = "sqs"))]
use crate::infra::aws::AwsClients;
use crate::infra::db::{self, Connect, DbError};
#[cfg(feature = "outbound")]
use crate::infra::outbound::{Outbound, OutboundPolicy};
use crate::infra::redis_client::{self, BadRedisUrl, RedisClient};
#[cfg(feature = "s3-objects")]
use crate::infra::s3_objects::S3Objects;

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
/// standard AWS variables itself), sending through reqwest on the process's
/// roots (`crate::infra::aws_http`) instead of loading the system's store.
#[cfg(feature = "aws")]
pub async fn sdk() -> SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(crate::infra::aws_http::http_client())
        .load()
        .await
}

/// A Lambda function's AWS configuration: its region and credentials from
/// the environment, where Lambda puts them (as `sam local invoke` and the
/// local stack's `.env` do), and an endpoint from `AWS_ENDPOINT_URL_<SERVICE>`
/// or `AWS_ENDPOINT_URL` (moto, `cargo lambda watch`). [`sdk`]'s loader
/// links every other source too, whether asked for or not: profile files,
/// SSO, web identity through STS, ECS and EC2's metadata service, about
/// 0.7 MB of each bootstrap (bench/NOTES.md), for hosts a function never
/// runs on. What the loader set besides, each client's behaviour version
/// sets as it did: retries, timeouts, the clock and the credentials cache.
#[cfg(feature = "aws")]
pub fn lambda_sdk() -> SdkConfig {
    use aws_config::environment::EnvironmentVariableCredentialsProvider;
    use aws_credential_types::provider::SharedCredentialsProvider;

    let region = variable("AWS_REGION").or_else(|| variable("AWS_DEFAULT_REGION"));
    let mut builder = SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(region.map(aws_config::Region::new))
        .credentials_provider(SharedCredentialsProvider::new(EnvironmentVariableCredentialsProvider::new()))
        .http_client(crate::infra::aws_http::http_client())
        .service_config(EnvironmentEndpoints);
    builder.set_endpoint_url(variable("AWS_ENDPOINT_URL"));
    builder.build()
}

#[cfg(feature = "aws")]
fn variable(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// Each client's endpoint from `AWS_ENDPOINT_URL_<SERVICE>` (its service id
/// in upper case, spaces as `_`: `AWS_ENDPOINT_URL_SECRETS_MANAGER`), named
/// as the SDK names it, without the profile files [`sdk`] also reads.
#[cfg(feature = "aws")]
#[derive(Debug)]
struct EnvironmentEndpoints;

#[cfg(feature = "aws")]
impl aws_types::service_config::LoadServiceConfig for EnvironmentEndpoints {
    fn load_config(&self, key: aws_types::service_config::ServiceConfigKey<'_>) -> Option<String> {
        let service = key.service_id().to_uppercase().replace(' ', "_");
        variable(&format!("{}_{service}", key.env()))
    }
}

#[cfg(all(feature = "s3-objects", feature = "sqs"))]
/// Both AWS clients on `config`'s endpoints, with the SDK's configuration
/// loaded for them: for tools and tests (each binary builds only the
/// clients it uses).
pub async fn aws_clients(config: &Config) -> AwsClients {
    AwsClients::from_config(&sdk().await, config.s3_endpoint())
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
/// `REEVE_CHAIN_RPC_URLS`, each payment network's JSON-RPC endpoint, with
/// `REEVE_CHAIN_CONFIRMATIONS`, the blocks each waits before a read proves
/// anything: what proves a payment (task create, MCP, the worker's pre-run
/// check and capture, the sweeps). A malformed value is a problem, and so is
/// each network `catalog` prices in without an endpoint: a payment there
/// could only be taken on the facilitator's word.
pub fn chain_endpoints(config: &Config, catalog: Option<&Catalog>, problems: &mut Vec<String>) -> Chains {
    use crate::domain::payments::{CHAIN_CONFIRMATIONS, CHAIN_RPC_URLS};
    let chains = match config.get(CHAIN_RPC_URLS) {
        None => Chains::none(),
        Some(text) => Chains::parse(&text).unwrap_or_else(|found| {
            problems.extend(found);
            Chains::none()
        }),
    };
    let chains = match config.get(CHAIN_CONFIRMATIONS) {
        None => chains,
        Some(text) => chains.clone().with_confirmations(&text).unwrap_or_else(|found| {
            problems.extend(found);
            chains
        }),
    };
    if let Some(catalog) = catalog {
        problems.extend(chains.unproven_prices(catalog));
    }
    chains
}

#[cfg(feature = "catalog")]
/// The catalog file at `REEVE_CATALOG`, every task's timeout checked
/// against the worker's time limit (`REEVE_WORKER_TIMEOUT_SECONDS`): every
/// process that loads it refuses a kind no worker could finish, not only
/// the worker, so no task of it is sold or queued. Its input schemas are
/// read as JSON, not compiled: for the processes that validate no input.
/// Problems go to `problems`.
pub fn catalog_file(config: &Config, problems: &mut Vec<String>) -> Option<Catalog> {
    load_catalog(config, problems, Catalog::load_for)
}

/// [`catalog_file`] with every input schema compiled, for the processes
/// that validate inputs (task-create, MCP, `reeve serve`) and `reeve config
/// check`. Only they reach the schema compiler, so the others link none
/// even where cargo built this crate with every feature (`sam build`).
#[cfg(feature = "input-schemas")]
pub fn compiled_catalog_file(config: &Config, problems: &mut Vec<String>) -> Option<Catalog> {
    load_catalog(config, problems, Catalog::load_compiled_for)
}

#[cfg(feature = "catalog")]
fn load_catalog(
    config: &Config,
    problems: &mut Vec<String>,
    load: fn(&std::path::Path, u32) -> Result<Catalog, crate::domain::catalog::CatalogError>,
) -> Option<Catalog> {
    let mut env = config.env();
    let worker_timeout = settings::worker_timeout(&mut env);
    problems.extend(env.take_problems());
    load(&config.catalog_path(), worker_timeout).map_err(|e| problems.push(e.to_string())).ok()
}

#[cfg(feature = "catalog")]
/// The catalog as this deployment serves it: `catalog` (the file, as
/// [`catalog_file`] or [`compiled_catalog_file`] read it), its upload
/// limit lowered to the template's `UploadMaxBytes`, and its facilitator
/// moved by `REEVE_FACILITATOR_URL` (the local stack's own). Problems go to
/// `problems`.
fn deployed_catalog(config: &Config, catalog: Option<Catalog>, problems: &mut Vec<String>) -> Option<Catalog> {
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

#[cfg(feature = "receipts")]
/// The seller's signing key (`REEVE_RECEIPT_KEY`, or the KMS key
/// `REEVE_RECEIPT_KMS_KEY_ID` names, asked for its public key here),
/// checked against the address `catalog` publishes (`[payments]
/// receipt_signer`): a catalog that publishes one needs its key, and a key
/// of another address is a problem, so no process signs what buyers would
/// check against another address. A key with no address published signs
/// nothing (logged). The key's value is never part of a problem or a log
/// line.
pub async fn seller_key(
    config: &Config,
    sdk: &SdkConfig,
    catalog: Option<&Catalog>,
    problems: &mut Vec<String>,
) -> Option<Arc<crate::domain::payments::offer_receipt::SellerKey>> {
    use crate::domain::payments::offer_receipt::SellerKey;
    let published = catalog.and_then(|c| c.payments.as_ref()).and_then(|p| p.receipt_signer.as_deref());
    let text = zeroize::Zeroizing::new(config.get(settings::RECEIPT_KEY));
    let in_kms = config.get(settings::RECEIPT_KMS_KEY).filter(|id| !id.trim().is_empty());
    let (address, name, key) = match (published, text.as_deref(), in_kms) {
        (_, Some(_), Some(_)) => {
            problems.push(format!("set {} or {}, not both", settings::RECEIPT_KEY, settings::RECEIPT_KMS_KEY));
            return None;
        }
        (None, None, None) => return None,
        (None, _, _) => {
            tracing::warn!(
                "a receipt key is set, but the catalog publishes no [payments] receipt_signer: offers and receipts are not signed"
            );
            return None;
        }
        (Some(address), None, None) => {
            problems.push(format!(
                "{} is not set (nor {} or {}): the catalog's [payments] receipt_signer {address} signs offers and receipts",
                settings::RECEIPT_KEY,
                settings::RECEIPT_KEY_SECRET_ARN,
                settings::RECEIPT_KMS_KEY
            ));
            return None;
        }
        (Some(address), Some(text), None) => {
            let key = SellerKey::from_hex(text).map_err(|e| problems.push(format!("{} {e}", settings::RECEIPT_KEY)));
            (address, settings::RECEIPT_KEY, key.ok()?)
        }
        (Some(address), None, Some(id)) => {
            let key = SellerKey::in_kms(crate::infra::kms::KmsKey::new(sdk, &id)).await;
            let key = key.map_err(|e| problems.push(format!("{}: {e}", settings::RECEIPT_KMS_KEY)));
            (address, settings::RECEIPT_KMS_KEY, key.ok()?)
        }
    };
    if !key.address().to_string().eq_ignore_ascii_case(address) {
        problems.push(format!(
            "{name} is the key of {}, not of the catalog's [payments] receipt_signer {address}",
            key.address()
        ));
        return None;
    }
    Some(Arc::new(key))
}

#[cfg(all(feature = "receipts", feature = "secrets"))]
/// `reeve config check`: the seller's key, where one is given (by value,
/// by secret ARN, or in KMS), checked as start-up checks it against
/// `catalog`'s `receipt_signer`; a key of another address is named by its
/// address, which is how an operator learns a KMS key's.
pub async fn receipt_key_check(config: &Config, catalog: &Catalog, problems: &mut Vec<String>) {
    let names = [settings::RECEIPT_KEY, settings::RECEIPT_KEY_SECRET_ARN, settings::RECEIPT_KMS_KEY];
    if !names.iter().any(|name| config.get(name).is_some()) {
        return;
    }
    let sdk = sdk().await;
    let (config, fetched) = with_secrets(config, &sdk, &[settings::RECEIPT_KEY]).await;
    problems.extend(fetched);
    seller_key(&config, &sdk, Some(catalog), problems).await;
}

#[cfg(any(feature = "sweeper", feature = "api-tasks"))]
/// The receiver authorizer of batch-settlement channels, which claims the
/// vouchers (the sweep) and signs cooperative refunds (the refund route),
/// from its key (`REEVE_BATCH_AUTHORIZER_KEY`, or the secret its `_SECRET_ARN`
/// names), which must be the key of the catalog's
/// `batch_receiver_authorizer`. No key: vouchers are not claimed (logged
/// where the catalog takes them). The key's value is never part of a
/// problem or a log line.
pub(crate) fn batch_claimer(
    config: &Config,
    catalog: Option<&crate::domain::catalog::Catalog>,
    after: Duration,
    problems: &mut Vec<String>,
) -> Option<crate::domain::payments::batch::claim::Claimer> {
    use crate::domain::payments::batch::claim::Claimer;
    let payments = catalog.and_then(|c| c.payments.as_ref());
    let authorizer = payments.and_then(|p| p.batch_receiver_authorizer.as_deref());
    let key = zeroize::Zeroizing::new(config.get(settings::BATCH_AUTHORIZER_KEY));
    let (Some(catalog), Some(authorizer), Some(key)) = (catalog, authorizer, key.as_deref()) else {
        // Without the catalog (its own problems are reported), the key is
        // still checked, so that its problem is listed with theirs.
        if let (None, Some(key)) = (catalog, key.as_deref())
            && let Err(e) = crate::domain::payments::batch::claim::signing_key(key)
        {
            problems.push(format!("{} {e}", settings::BATCH_AUTHORIZER_KEY));
        }
        if authorizer.is_some() {
            tracing::warn!(
                "{} is not set (nor {}): batch-settlement vouchers are taken but not claimed",
                settings::BATCH_AUTHORIZER_KEY,
                settings::BATCH_AUTHORIZER_KEY_SECRET_ARN
            );
        }
        return None;
    };
    // The facilitator the rest of the process pays through: the catalog's,
    // or `REEVE_FACILITATOR_URL`'s.
    let facilitator = facilitator_check::facilitator_for(config, catalog).map_err(|e| problems.push(e)).ok()??;
    match Claimer::new(facilitator, key, after) {
        Err(e) => {
            problems.push(format!("{} {e}", settings::BATCH_AUTHORIZER_KEY));
            None
        }
        Ok(claimer) if !format!("{:#x}", claimer.address()).eq_ignore_ascii_case(authorizer) => {
            problems.push(format!(
                "{} is the key of {:#x}, not of the catalog's [payments] batch_receiver_authorizer {authorizer}",
                settings::BATCH_AUTHORIZER_KEY,
                claimer.address()
            ));
            None
        }
        Ok(claimer) => Some(claimer),
    }
}

#[cfg(feature = "receipts")]
/// The secrets `needs` names, and the seller's receipt key.
fn receipt_key_too(needs: Needs) -> Vec<&'static str> {
    let mut wanted = needs.secrets();
    wanted.push(settings::RECEIPT_KEY);
    wanted
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

#[cfg(feature = "api-auth")]
/// The secrets `needs` names, and the edge's origin secret: the functions
/// that spend the login budgets (auth and mcp) read it, when the template
/// puts the API behind CloudFront, to believe the viewer address it sends.
fn edge_too(needs: Needs) -> Vec<&'static str> {
    let mut wanted = needs.secrets();
    wanted.push(settings::EDGE_SECRET);
    wanted
}

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

/// Postgres at `url` (checked already), opened as `connect` says, or the
/// pool the configuration holds ([`Config::with_pool`]: a test's own
/// database, which `#[sqlx::test]` made). A binary's configuration holds
/// none.
async fn postgres(config: &Config, url: &str, connect: Connect) -> Result<PgPool, DbError> {
    match config.pool() {
        Some(pool) => Ok(pool.clone()),
        None => db::open(url, connect).await,
    }
}

/// [`postgres`], connecting on first use.
fn postgres_lazily(config: &Config, url: &str) -> Result<PgPool, DbError> {
    match config.pool() {
        Some(pool) => Ok(pool.clone()),
        None => db::connect_lazy(url),
    }
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
