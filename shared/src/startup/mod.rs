//! The one start-up path. Every binary's `main` builds its context here —
//! each Lambda, the relay, `reeve serve`, `reeve work` — and this is the only
//! module that reads an environment variable ([`Env::process`]).
//!
//! Each builder gathers every problem of the catalog and the environment
//! before it fails, as one [`StartupError`], so an operator fixes a
//! deployment in one round: a missing secret, a malformed Postgres or Redis
//! URL, a bad bind address and a catalog error are reported together. Only
//! then are the stores opened (`Connect::Now` may still fail on an
//! unreachable Postgres, which can only be known by trying).
//!
//! Secrets: each secret is either a plain variable (`REEVE_PEPPER`; a
//! development `.env`) or, in a deployment, the ARN of a Secrets Manager
//! secret (`REEVE_PEPPER_SECRET_ARN`), read here once at init with the SDK,
//! so the function's configuration holds the ARN, never the value. A
//! function asks only for the secrets its routes use ([`Needs`]).
//!
//! This module sits above the others: it assembles `http`'s, the worker's
//! and the upload guard's contexts, as a `main` would.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use aws_config::SdkConfig;
use aws_sdk_secretsmanager::error::{DisplayErrorContext, ProvideErrorMetadata};

use crate::auth::Secret;
use crate::aws::{AwsClients, S3_ENDPOINT_VARIABLES};
use crate::catalog::Catalog;
use crate::db::{self, Connect, DbError};
use crate::executors::ExecDeps;
use crate::http::{ApiContext, Ctx};
use crate::outbound::{Outbound, OutboundPolicy};
use crate::payments::facilitator;
use crate::redis_client::{self, BadRedisUrl, RedisClient};
use crate::settings::{self, ApiSettings, Env, Needs, WorkerSettings};
use crate::sweeper::Sweeper;
use crate::upload_guard::{self, Guard, GuardSettings};
use crate::worker::WorkerContext;

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

impl Env<fn(&str) -> Option<String>> {
    /// The process's environment: the one place a variable is read.
    pub fn process() -> Self {
        Env::new(process_var)
    }
}

fn process_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Where the relay listens when `REEVE_RELAY_BIND` is not set: in a
/// container it must listen beyond loopback.
pub const DEFAULT_RELAY_BIND: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8080);

/// `REEVE_RELAY_BIND`, checked: a bad address is a start-up problem, never
/// silently the default. Run with `RelayContext::from_env` through [`both`]:
/// it also checks the shape of the relay's Postgres and Redis URLs, so they
/// are reported with every other problem whatever the relay's own builder
/// stops at first (a problem both find is reported once).
pub fn relay_bind() -> Result<SocketAddr, StartupError> {
    // The relay's `rediss://` connection needs it, whoever opens the client.
    redis_client::install_crypto_provider();
    let mut env = Env::process();
    let bind = env.socket_addr(settings::RELAY_BIND, DEFAULT_RELAY_BIND);
    let mut problems = env.take_problems();
    check_urls(&mut problems, &env, true);
    if problems.is_empty() { Ok(bind) } else { Err(StartupError::Config(problems)) }
}

/// Where the relay serves `/metrics` when `REEVE_METRICS_BIND` is not set:
/// loopback, so a relay started by hand shows its metrics to nobody else.
/// The image and the template set `0.0.0.0:9090` for the scraper.
pub const DEFAULT_RELAY_METRICS_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9090);

/// The relay's two listeners: the SSE routes (behind the load balancer) and
/// Prometheus `/metrics`, which must be on another port, since the load
/// balancer forwards every path of the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayListeners {
    pub relay: SocketAddr,
    pub metrics: SocketAddr,
}

/// `REEVE_RELAY_BIND` ([`relay_bind`]) and `REEVE_METRICS_BIND`, checked
/// together: a bad address, or `/metrics` on the relay's own port, is a
/// start-up problem.
pub fn relay_listeners() -> Result<RelayListeners, StartupError> {
    let relay = relay_bind();
    let mut env = Env::process();
    let metrics = env.socket_addr(settings::METRICS_BIND, DEFAULT_RELAY_METRICS_BIND);
    let mut problems = env.take_problems();
    if let Ok(relay) = &relay
        && shares_a_port(*relay, metrics)
    {
        problems.push(format!(
            "{} ({metrics}) must not be the relay's port ({relay}): the load balancer forwards every path there",
            settings::METRICS_BIND
        ));
    }
    let metrics = if problems.is_empty() { Ok(metrics) } else { Err(StartupError::Config(problems)) };
    both(relay, metrics).map(|(relay, metrics)| RelayListeners { relay, metrics })
}

/// Whether two listeners would claim the same port on some address.
fn shares_a_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// The CloudWatch namespace of this Lambda's EMF lines:
/// `REEVE_METRICS_NAMESPACE` (the template sets `Reeve/<Stage>`), else
/// [`crate::metrics::DEFAULT_NAMESPACE`].
pub fn metrics_namespace() -> String {
    Env::process()
        .optional(settings::METRICS_NAMESPACE)
        .map(|ns| ns.trim().to_owned())
        .unwrap_or_else(|| crate::metrics::DEFAULT_NAMESPACE.to_owned())
}

/// The database URL alone (`reeve migrate`): plain or from Secrets Manager.
pub async fn database_url() -> Result<Secret, StartupError> {
    let sdk = aws_config::load_from_env().await;
    let (fetched, mut problems) = fetch_secrets(&process_var, &sdk, &[settings::DATABASE_URL]).await;
    let mut env = Env::new(overlay(process_var, fetched));
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

/// The API's context for a Lambda with these `needs`: the catalog at
/// `REEVE_CATALOG`, Postgres on first use. Exits 1 on any problem.
pub async fn lambda_api(needs: Needs) -> Ctx {
    let catalog = Env::process().catalog_path();
    or_exit(api(needs, &catalog, Connect::Lazily).await)
}

/// The API's context from the process environment and `catalog`.
pub async fn api(needs: Needs, catalog: &Path, connect: Connect) -> Result<Ctx, StartupError> {
    let sdk = aws_config::load_from_env().await;
    api_with(process_var, &sdk, needs, catalog, connect).await
}

/// [`api`] over any variable lookup and SDK configuration (tests).
pub async fn api_with<F: Fn(&str) -> Option<String>>(
    lookup: F,
    sdk: &SdkConfig,
    needs: Needs,
    catalog: &Path,
    connect: Connect,
) -> Result<Ctx, StartupError> {
    let mut wanted = Vec::new();
    if needs.pepper {
        wanted.push(settings::PEPPER);
    }
    if needs.token_key {
        wanted.push(settings::TOKEN_KEY);
    }
    if needs.database {
        wanted.push(settings::DATABASE_URL);
    }
    let (fetched, mut problems) = fetch_secrets(&lookup, sdk, &wanted).await;
    let (catalog, settings, operators, custom_s3) = {
        let mut env = Env::new(overlay(lookup, fetched));
        let catalog = Catalog::load(catalog).map_err(|e| problems.push(e.to_string())).ok();
        // The deployment may lower the catalog's upload limit (the template's
        // `UploadMaxBytes`), for presign and the upload guard alike.
        let cap = upload_guard::upload_limit_from(&env).map_err(|e| problems.push(e)).ok().flatten();
        let operators = outbound(&mut problems, OutboundPolicy::operators(|k| env.optional(k)), "REEVE_OPERATOR_ALLOW");
        let custom_s3 = custom_s3_endpoint(&env);
        check_urls(&mut problems, &env, needs.database);
        let settings = ApiSettings::read(&mut env, needs).map_err(|e| problems.extend(e.problems)).ok();
        let catalog = catalog.and_then(|mut catalog| {
            catalog.uploads.max_bytes = upload_guard::effective_max_bytes(&catalog.uploads, cap);
            // The local stack points payments at its own facilitator.
            if let Some(payments) = catalog.payments.as_mut() {
                let url = facilitator::effective_url(&payments.facilitator_url, |k| env.optional(k));
                payments.facilitator_url = url.map_err(|e| problems.push(e)).ok()?;
            }
            Some(catalog)
        });
        (catalog, settings, operators, custom_s3)
    };
    let (Some(catalog), Some(settings), Some(operators), true) = (catalog, settings, operators, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    let db =
        if needs.database { db::open(settings.database_url.expose_str(), connect).await? } else { db::unconfigured() };
    let redis = RedisClient::new(&settings.redis_url)?;
    let aws = AwsClients::from_config(sdk, custom_s3);
    Ok(ApiContext::with_operators(catalog, db, redis, aws, settings, operators))
}

/// The worker Lambda's context: the catalog at `REEVE_CATALOG`, Postgres on
/// first use. Exits 1 on any problem.
pub async fn lambda_worker() -> WorkerContext {
    let catalog = Env::process().catalog_path();
    or_exit(worker(&catalog, Connect::Lazily).await)
}

/// The worker's context (the `worker` Lambda, `reeve work`).
pub async fn worker(catalog: &Path, connect: Connect) -> Result<WorkerContext, StartupError> {
    let sdk = aws_config::load_from_env().await;
    worker_with(process_var, &sdk, catalog, connect).await
}

/// [`worker`] over any variable lookup and SDK configuration (tests).
pub async fn worker_with<F: Fn(&str) -> Option<String>>(
    lookup: F,
    sdk: &SdkConfig,
    catalog: &Path,
    connect: Connect,
) -> Result<WorkerContext, StartupError> {
    let (fetched, mut problems) = fetch_secrets(&lookup, sdk, &[settings::DATABASE_URL]).await;
    let (catalog, settings, users, operators, custom_s3) = {
        let mut env = Env::new(overlay(lookup, fetched));
        let catalog = Catalog::load(catalog).map_err(|e| problems.push(e.to_string())).ok();
        let settings = WorkerSettings::read(&mut env).map_err(|e| problems.extend(e.problems)).ok();
        let users = outbound(&mut problems, OutboundPolicy::users(|k| env.optional(k)), "REEVE_FETCH_ALLOW");
        let operators = outbound(&mut problems, OutboundPolicy::operators(|k| env.optional(k)), "REEVE_OPERATOR_ALLOW");
        check_urls(&mut problems, &env, true);
        (catalog, settings, users, operators, custom_s3_endpoint(&env))
    };
    let (Some(catalog), Some(settings), Some(outbound), Some(operators), true) =
        (catalog, settings, users, operators, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    let db = db::open(settings.database_url.expose_str(), connect).await?;
    let redis = RedisClient::new(&settings.redis_url)?;
    let aws = AwsClients::from_config(sdk, custom_s3);
    let exec = ExecDeps {
        db: db.clone(),
        s3: aws.s3,
        bucket: settings.bucket.clone(),
        outbound,
        operators,
        fetch_max_bytes: settings.fetch_max_bytes,
        output_retention_days: settings.output_retention_days,
    };
    Ok(WorkerContext::new(catalog, db, redis, exec, settings))
}

/// The upload guard Lambda's context. Exits 1 on any problem.
/// The sweeper Lambda's context: the database URL (by ARN in a
/// deployment), Redis, the queue. Exits 1 on any problem.
pub async fn lambda_sweeper() -> crate::sweeper::Sweeper {
    or_exit(sweeper().await)
}

/// The sweeper's context from the environment, the database URL read from
/// Secrets Manager when it is given by ARN.
pub async fn sweeper() -> Result<crate::sweeper::Sweeper, StartupError> {
    let sdk = aws_config::load_from_env().await;
    let (fetched, mut problems) = fetch_secrets(&process_var, &sdk, &[settings::DATABASE_URL]).await;
    let env = Env::new(overlay(process_var, fetched));
    if let Some(url) = env.optional(settings::DATABASE_URL) {
        check_database_url(&mut problems, &url);
    }
    let settings = crate::sweeper::SweeperSettings::read(env).map_err(|e| problems.extend(e.problems)).ok();
    let (Some(settings), true) = (settings, problems.is_empty()) else {
        return Err(StartupError::Config(problems));
    };
    let sqs = AwsClients::from_config(&sdk, custom_s3_endpoint(&Env::new(process_var))).sqs;
    crate::sweeper::Sweeper::with_settings(settings, sqs)
}

/// The sweeper a long-running worker runs beside its poller (`reeve work`,
/// `reeve serve`), on the worker's own Postgres pool and Redis doorbell.
pub fn sweeper_beside(worker: &WorkerContext, sqs: aws_sdk_sqs::Client, queue_url: String) -> Sweeper {
    Sweeper {
        db: worker.db.clone(),
        sqs,
        queue_url,
        events: worker.events.clone(),
        max_attempts: worker.settings.max_receives,
        older_than: crate::sweeper::DEFAULT_OLDER_THAN,
    }
}

pub async fn lambda_guard() -> Guard {
    or_exit(guard().await)
}

/// The upload guard's context: Postgres (on first use), S3, the bucket and
/// the upload limit.
pub async fn guard() -> Result<Guard, StartupError> {
    let sdk = aws_config::load_from_env().await;
    guard_with(process_var, &sdk).await
}

/// [`guard`] over any variable lookup and SDK configuration (tests).
pub async fn guard_with<F: Fn(&str) -> Option<String>>(lookup: F, sdk: &SdkConfig) -> Result<Guard, StartupError> {
    let (fetched, mut problems) = fetch_secrets(&lookup, sdk, &[settings::DATABASE_URL]).await;
    let (settings, custom_s3) = {
        let mut env = Env::new(overlay(lookup, fetched));
        if let Some(url) = env.optional(settings::DATABASE_URL) {
            check_database_url(&mut problems, &url);
        }
        let settings = GuardSettings::read(&mut env).map_err(|e| problems.extend(e.problems)).ok();
        (settings, custom_s3_endpoint(&env))
    };
    let (Some(settings), true) = (settings, problems.is_empty()) else {
        return Err(StartupError::Config(problems));
    };
    let db = db::connect_lazy(settings.database_url.expose_str())?;
    let s3 = AwsClients::from_config(sdk, custom_s3).s3;
    Ok(Guard { db, s3, bucket: settings.bucket, max_bytes: settings.max_bytes })
}

/// Reads the secrets in `wanted` that the environment names by ARN rather
/// than by value, all at once: name → value, and a problem for each one
/// that cannot be read. A secret given both ways is a problem too (which
/// one would win is a guess). A secret given neither way is left to the
/// settings, which report it as not set.
async fn fetch_secrets<F: Fn(&str) -> Option<String>>(
    lookup: &F,
    sdk: &SdkConfig,
    wanted: &[&'static str],
) -> (HashMap<&'static str, Secret>, Vec<String>) {
    let present = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
    let mut problems = Vec::new();
    let mut by_arn = Vec::new();
    for &name in wanted {
        let Some(arn_variable) = settings::arn_variable(name) else { continue };
        match (present(name), present(arn_variable)) {
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

/// A value long enough to pass the settings' checks; only ever used when a
/// problem has been recorded, so start-up fails anyway.
fn placeholder(name: &'static str) -> Secret {
    Secret::text(name, "postgres://placeholder.invalid/unread-secret".to_owned())
}

/// `lookup`, with the secrets read from Secrets Manager under their plain
/// names.
fn overlay<F: Fn(&str) -> Option<String>>(
    lookup: F,
    fetched: HashMap<&'static str, Secret>,
) -> impl Fn(&str) -> Option<String> {
    move |name| match fetched.get(name) {
        Some(secret) => Some(secret.expose_str().to_owned()),
        None => lookup(name),
    }
}

fn outbound(problems: &mut Vec<String>, policy: OutboundPolicy, variable: &str) -> Option<Outbound> {
    Outbound::new(policy).map_err(|e| problems.push(format!("{variable}: {e}"))).ok()
}

fn custom_s3_endpoint<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> bool {
    S3_ENDPOINT_VARIABLES.iter().any(|name| env.optional(name).is_some())
}

/// The Postgres and Redis URLs, if set, checked without connecting, so a
/// malformed one is reported with every other problem.
fn check_urls<F: Fn(&str) -> Option<String>>(problems: &mut Vec<String>, env: &Env<F>, database: bool) {
    if let Some(url) = env.optional(settings::DATABASE_URL).filter(|_| database) {
        check_database_url(problems, &url);
    }
    if let Some(Err(e)) = env.optional(settings::REDIS_URL).map(|url| redis_client::open(&url)) {
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
