//! Every variable a Reeve process reads, by name, and the one read of the
//! environment ([`Config::from_env`]). Secrets and endpoints come from the
//! environment, never from the catalog. Each builder in [`crate::startup`]
//! parses what its binary needs from a [`Config`] and reports every missing
//! or bad variable at once, so an operator fixes a deployment in one round,
//! not one variable at a time.
//!
//! The one other read is the log format, before start-up
//! ([`crate::infra::telemetry::init`]): a problem found here must already be
//! logged the way the platform indexes it.
//!
//! A long file: its last 160 lines are its unit tests, and every variable's
//! name and default is here by design.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::adapters::http::ApiSettings;
#[cfg(feature = "relay")]
use crate::adapters::http::CorsOrigins;
#[cfg(feature = "worker")]
use crate::adapters::worker::Backoff;
#[cfg(feature = "worker")]
pub use crate::adapters::worker::WorkerSettings;
use crate::domain::auth::Secret;
use crate::domain::login_limits::{Budget, LoginLimits};
use crate::infra::client_addr::ClientPrefixes;
use crate::infra::client_addr::EdgeSecret;
#[cfg(feature = "outbound")]
use crate::infra::outbound::OutboundPolicy;

pub const PEPPER: &str = "REEVE_PEPPER";
pub const TOKEN_KEY: &str = "REEVE_TOKEN_KEY";
pub const DATABASE_URL: &str = "DATABASE_URL";
pub const REDIS_URL: &str = "REDIS_URL";
pub const BUCKET: &str = "REEVE_BUCKET";
pub const QUEUE_URL: &str = "REEVE_QUEUE_URL";
pub const CATALOG: &str = "REEVE_CATALOG";
/// The relay's SSE keep-alive interval in seconds (default 15).
pub const KEEPALIVE: &str = "REEVE_KEEPALIVE_SECONDS";
/// Streams one space may hold open on one relay process (default 32).
pub const RELAY_STREAMS_PER_SPACE: &str = "REEVE_RELAY_STREAMS_PER_SPACE";
/// Streams one client address may hold open on one relay process (default 128).
pub const RELAY_STREAMS_PER_IP: &str = "REEVE_RELAY_STREAMS_PER_IP";
/// Proxies in front of the relay that append the address they saw to
/// `X-Forwarded-For` (default 0: the TCP peer is the client; the template's
/// load balancer makes it 1).
pub const TRUSTED_PROXY_HOPS: &str = "REEVE_TRUSTED_PROXY_HOPS";
pub const WORKER_CONCURRENCY: &str = "REEVE_WORKER_CONCURRENCY";
pub const MAX_RECEIVES: &str = "REEVE_MAX_RECEIVES";
pub const FETCH_MAX_BYTES: &str = "REEVE_FETCH_MAX_BYTES";
/// How long a running task's lease lasts without a renewal, in seconds
/// (default 20): the longest a dead worker's task waits for the sweeper.
pub const LEASE: &str = "REEVE_LEASE_SECONDS";
/// The wait before a task's second attempt after a retryable failure, in
/// seconds (default 5); each later wait is three times the one before.
pub const RETRY_BACKOFF: &str = "REEVE_RETRY_BACKOFF_SECONDS";
/// The longest wait between attempts, `Retry-After` included, in seconds
/// (default 120).
pub const RETRY_BACKOFF_MAX: &str = "REEVE_RETRY_BACKOFF_MAX_SECONDS";
/// Days the bucket keeps `outputs/` (the template's `OutputRetentionDays`,
/// its lifecycle rule), so a result can say until when its object lives.
pub const OUTPUT_RETENTION_DAYS: &str = "REEVE_OUTPUT_RETENTION_DAYS";
/// Where the relay listens (default `0.0.0.0:8080`).
pub const RELAY_BIND: &str = "REEVE_RELAY_BIND";
/// Where the relay serves Prometheus `/metrics`: a port of its own, because
/// its load balancer forwards every path of the relay's port.
pub const METRICS_BIND: &str = "REEVE_METRICS_BIND";
/// The CloudWatch namespace of a Lambda's EMF metric lines (`Reeve/<Stage>`
/// in a deployment), so stages in one account never mix their series.
pub const METRICS_NAMESPACE: &str = "REEVE_METRICS_NAMESPACE";
/// The template's `UploadMaxBytes`: an upper bound on the catalog's
/// `uploads.max_bytes`, for presign and the upload guard alike. Optional.
pub const UPLOAD_MAX_BYTES: &str = "REEVE_UPLOAD_MAX_BYTES";
/// The worker's time limit in seconds: its Lambda's `Timeout`, which the
/// template passes on (default 360, the shipped one). Every process that
/// loads the catalog refuses a task whose `timeout_seconds` plus the
/// worker's 30 s margin would not fit.
pub const WORKER_TIMEOUT: &str = "REEVE_WORKER_TIMEOUT_SECONDS";
/// The scheduled sweep's threshold in seconds (default 300).
pub const SWEEP_OLDER_THAN: &str = "REEVE_SWEEP_OLDER_THAN_SECONDS";
/// How long one completion webhook attempt may take, in seconds (1 to 30;
/// default 10).
pub const WEBHOOK_TIMEOUT: &str = "REEVE_WEBHOOK_TIMEOUT_SECONDS";
/// The completion webhooks' retry schedule: the seconds before each retry,
/// comma-separated (default the Standard Webhooks one, 5 s to 24 h).
pub const WEBHOOK_SCHEDULE: &str = "REEVE_WEBHOOK_RETRY_SCHEDULE_SECONDS";
/// The login budgets (`crate::domain::login_limits`), per client: how many
/// Spaces (default 10) and sessions (default 10) one client may make at
/// once, and every how many milliseconds one more fits (default 60000, one
/// a minute, and 500, two a second).
pub const SPACES_BURST: &str = "REEVE_SPACES_BURST";
pub const SPACES_INTERVAL: &str = "REEVE_SPACES_INTERVAL_MS";
pub const SESSIONS_BURST: &str = "REEVE_SESSIONS_BURST";
pub const SESSIONS_INTERVAL: &str = "REEVE_SESSIONS_INTERVAL_MS";
/// How wide a network the login budgets count as one client: an IPv4
/// prefix (0 to 32, default 32: each address) and an IPv6 prefix (0 to 128,
/// default 56: one holder's usual network).
pub const CLIENT_IPV4_PREFIX: &str = "REEVE_CLIENT_IPV4_PREFIX";
pub const CLIENT_IPV6_PREFIX: &str = "REEVE_CLIENT_IPV6_PREFIX";
/// The secret the optional CloudFront edge sends in its origin header
/// (`crate::infra::client_addr`): a request carrying it is counted by the
/// viewer's address. Unset: no edge, every request by its source address.
pub const EDGE_SECRET: &str = "REEVE_EDGE_SECRET";
/// The seller's key for signed offers and receipts (x402 `offer-receipt`):
/// 64 hex digits, whose address the catalog publishes as `[payments]
/// receipt_signer`. Read by task-create, task-status and mcp.
pub const RECEIPT_KEY: &str = "REEVE_RECEIPT_KEY";
/// Or the seller's key stays in AWS KMS: the id, ARN or alias of an
/// `ECC_SECG_P256K1` `SIGN_VERIFY` key, which signs each offer and receipt
/// (`kms:Sign`) and whose address the catalog publishes. Not a secret.
pub const RECEIPT_KMS_KEY: &str = "REEVE_RECEIPT_KMS_KEY_ID";
/// The batch-settlement receiver authorizer's key (64 hex digits), whose
/// address is the catalog's `[payments] batch_receiver_authorizer`: the
/// sweeper (and the sweep beside `reeve serve` and `reeve work`) signs its
/// claims with it. Unset: vouchers are not claimed.
pub const BATCH_AUTHORIZER_KEY: &str = "REEVE_BATCH_AUTHORIZER_KEY";
/// How long a batch-settlement voucher may wait unclaimed at most, in
/// seconds (default 3600; a quarter of the channel's withdraw delay caps it).
pub const BATCH_CLAIM_AFTER: &str = "REEVE_BATCH_CLAIM_AFTER_SECONDS";
/// Set by Lambda in every function's environment.
const LAMBDA_FUNCTION_NAME: &str = "AWS_LAMBDA_FUNCTION_NAME";
/// The variables that move S3 off AWS (a local server); the SDK reads them
/// itself, Reeve only to know the addressing is path-style.
const S3_ENDPOINTS: [&str; 2] = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"];

/// Deployments name each secret by the ARN of a Secrets Manager secret; the
/// value is read at start-up, so a function's configuration never holds it.
pub const PEPPER_SECRET_ARN: &str = "REEVE_PEPPER_SECRET_ARN";
pub const TOKEN_KEY_SECRET_ARN: &str = "REEVE_TOKEN_KEY_SECRET_ARN";
pub const DATABASE_URL_SECRET_ARN: &str = "REEVE_DATABASE_URL_SECRET_ARN";
pub const EDGE_SECRET_ARN: &str = "REEVE_EDGE_SECRET_ARN";
pub const RECEIPT_KEY_SECRET_ARN: &str = "REEVE_RECEIPT_KEY_SECRET_ARN";
pub const BATCH_AUTHORIZER_KEY_SECRET_ARN: &str = "REEVE_BATCH_AUTHORIZER_KEY_SECRET_ARN";

/// The secrets, each with the variable that names its ARN.
pub const SECRETS: [(&str, &str); 6] = [
    (PEPPER, PEPPER_SECRET_ARN),
    (TOKEN_KEY, TOKEN_KEY_SECRET_ARN),
    (DATABASE_URL, DATABASE_URL_SECRET_ARN),
    (EDGE_SECRET, EDGE_SECRET_ARN),
    (RECEIPT_KEY, RECEIPT_KEY_SECRET_ARN),
    (BATCH_AUTHORIZER_KEY, BATCH_AUTHORIZER_KEY_SECRET_ARN),
];

/// The variable naming `secret`'s ARN (`REEVE_PEPPER` → `REEVE_PEPPER_SECRET_ARN`).
pub fn arn_variable(secret: &str) -> Option<&'static str> {
    SECRETS.iter().find(|(name, _)| *name == secret).map(|(_, arn)| *arn)
}

/// Which secrets a process is given: each function gets only those its
/// routes use, so a function that is compromised or misconfigured exposes
/// nothing else. A secret not needed is never read; in its place the
/// process holds a random key of its own ([`Secret::withheld`]), so any use
/// fails closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    pub pepper: bool,
    pub token_key: bool,
    pub database: bool,
}

impl Needs {
    /// `auth`: creating spaces and opening sessions.
    pub const AUTH: Needs = Needs { pepper: true, token_key: true, database: true };
    /// Routes behind a bearer token (uploads, tasks): the token key and Postgres.
    pub const SESSION: Needs = Needs { pepper: false, token_key: true, database: true };
    /// `catalog`: the catalog and the OpenAPI document, no secret at all.
    pub const NONE: Needs = Needs { pepper: false, token_key: false, database: false };
    /// `reeve serve`: every route in one process.
    pub const ALL: Needs = Needs::AUTH;

    /// The secrets asked for, by name.
    pub fn secrets(self) -> Vec<&'static str> {
        [(self.pepper, PEPPER), (self.token_key, TOKEN_KEY), (self.database, DATABASE_URL)]
            .into_iter()
            .filter_map(|(wanted, name)| wanted.then_some(name))
            .collect()
    }
}

/// `POST /v1/executor/reports` as a protocol kind's service reaches it
/// (`https://<api-host>/v1/executor/reports`): where its job says to
/// report. Needed by the worker only when the catalog has such a kind.
pub const REPORT_URL: &str = "REEVE_REPORT_URL";
/// Browser origins allowed to call the API and the relay (comma-separated).
pub const CORS_ORIGINS: &str = "REEVE_CORS_ORIGINS";
/// The API the relay's console page calls (`https://<api-host>`); unset, the
/// page calls the relay's own origin, as under `reeve serve`.
pub const API_ORIGIN: &str = "REEVE_API_ORIGIN";
/// The `Host` values `POST /mcp` answers (comma-separated; loopback if unset, any for `*`).
pub const MCP_ALLOWED_HOSTS: &str = "REEVE_MCP_ALLOWED_HOSTS";
/// Browser origins allowed to call `POST /mcp` (comma-separated; none if unset).
pub const MCP_ALLOWED_ORIGINS: &str = "REEVE_MCP_ALLOWED_ORIGINS";
/// The console's URL (the relay's), where `POST /mcp` sends a person to pay
/// a pay link; unset, the origin the MCP request reached (`reeve serve`).
pub const CONSOLE_URL: &str = "REEVE_CONSOLE_URL";

// Names that belong to a lower floor, which reads them itself; here too, so
// every variable Reeve reads is named in this file (the README's table is
// checked against the code by shared/tests/suite/environment.rs).
#[cfg(feature = "outbound")]
pub use crate::domain::payments::facilitator::FACILITATOR_URL_VAR as FACILITATOR_URL;
#[cfg(feature = "chain")]
pub use crate::domain::payments::{CHAIN_CONFIRMATIONS, CHAIN_RPC_URLS};
#[cfg(feature = "outbound")]
pub use crate::infra::outbound::{ALLOW_HTTP, FETCH_ALLOW, OPERATOR_ALLOW};
pub use crate::infra::telemetry::LOG_FORMAT;

// The `reeve` client's (cli/): where a deployment is, and who is asking.
/// The deployment's API.
pub const ENDPOINT: &str = "REEVE_ENDPOINT";
/// The relay's URL, when it is not the API's host.
pub const RELAY: &str = "REEVE_RELAY";
/// The credentials profile.
pub const PROFILE: &str = "REEVE_PROFILE";
/// A Space ID for `reeve login`, instead of the one the profile keeps.
pub const SPACE_ID: &str = "REEVE_SPACE_ID";
/// A session token, instead of the one the profile caches.
pub const SESSION_TOKEN: &str = "REEVE_TOKEN";
/// The payer's private key (hex) for `--pay`; never an argument.
pub const WALLET_KEY: &str = "REEVE_WALLET_KEY";
/// The base of the credentials file (`DIR/reeve/credentials.toml`), as XDG says.
pub const CONFIG_HOME: &str = "XDG_CONFIG_HOME";

/// Where `reeve.toml` is read from when `REEVE_CATALOG` is not set.
pub const DEFAULT_CATALOG: &str = "reeve.toml";

#[derive(Debug, thiserror::Error)]
pub struct SettingsError {
    pub problems: Vec<String>,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad environment: {}", self.problems.join("; "))
    }
}

/// Reads variables one by one and remembers every problem, so the caller can
/// ask for all it needs and then fail once with the full list.
pub struct Env<F> {
    lookup: F,
    problems: Vec<String>,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    pub fn new(lookup: F) -> Self {
        Env { lookup, problems: Vec::new() }
    }

    pub fn optional(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|v| !v.trim().is_empty())
    }

    pub fn required(&mut self, name: &str) -> String {
        self.optional(name).unwrap_or_else(|| {
            self.problems.push(format!("{name} is not set"));
            String::new()
        })
    }

    /// Records a problem found elsewhere (a URL that does not parse, …).
    pub fn problem(&mut self, problem: impl Into<String>) {
        self.problems.push(problem.into());
    }

    /// A key must be long enough to resist guessing: at least 32 bytes.
    pub fn secret(&mut self, name: &'static str) -> Option<Secret> {
        let value = self.required_secret(name)?;
        match Secret::new(name, value.into_bytes()) {
            Ok(secret) => Some(secret),
            Err(e) => {
                self.problems.push(e.to_string());
                None
            }
        }
    }

    /// A secret that is not a key (the database URL): any non-empty value.
    pub fn secret_text(&mut self, name: &'static str) -> Option<Secret> {
        self.required_secret(name).map(|value| Secret::text(name, value))
    }

    fn required_secret(&mut self, name: &'static str) -> Option<String> {
        let value = self.optional(name);
        if value.is_none() {
            self.problems.push(match arn_variable(name) {
                Some(arn) => format!("{name} is not set (nor {arn}, the ARN of a secret holding it)"),
                None => format!("{name} is not set"),
            });
        }
        value
    }

    /// A socket address such as `0.0.0.0:8080`, or `default` when unset.
    pub fn socket_addr(&mut self, name: &str, default: std::net::SocketAddr) -> std::net::SocketAddr {
        let Some(value) = self.optional(name) else { return default };
        value.trim().parse().unwrap_or_else(|_| {
            self.problems.push(format!("{name} must be an address such as 0.0.0.0:8080, got {value:?}"));
            default
        })
    }

    /// A web origin such as `https://api.example.com`, written as browsers
    /// write it (lowercase host, no default port), or `None` when unset. A
    /// URL with nothing after its host but one `/` is taken by its origin,
    /// so the template's `https://…/` API URL can be given as it is.
    pub fn origin(&mut self, name: &str) -> Option<String> {
        let value = self.optional(name)?;
        let url = url::Url::parse(value.trim()).ok().filter(|url| {
            matches!(url.scheme(), "http" | "https")
                && url.has_host()
                && url.username().is_empty()
                && url.password().is_none()
                && url.path() == "/"
                && url.query().is_none()
                && url.fragment().is_none()
        });
        match url {
            Some(url) => Some(url.origin().ascii_serialization()),
            None => {
                self.problems.push(format!("{name} must be an origin such as https://api.example.com, got {value:?}"));
                None
            }
        }
    }

    /// A required absolute http(s) URL, as written.
    pub fn http_url(&mut self, name: &str) -> Option<String> {
        let value = self.required(name);
        if value.is_empty() {
            return None;
        }
        let url = url::Url::parse(value.trim())
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host() && url.username().is_empty());
        match url {
            Some(_) => Some(value.trim().to_owned()),
            None => {
                self.problems.push(format!("{name} must be an absolute http(s) URL, got {value:?}"));
                None
            }
        }
    }

    /// A positive integer in `min..=max`, or `default` when unset.
    pub fn number(&mut self, name: &str, default: u64, min: u64, max: u64) -> u64 {
        let Some(value) = self.optional(name) else {
            return default;
        };
        match value.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => n,
            _ => {
                self.problems.push(format!("{name} must be an integer from {min} to {max}"));
                default
            }
        }
    }

    pub fn finish(self) -> Result<(), SettingsError> {
        if self.problems.is_empty() { Ok(()) } else { Err(SettingsError { problems: self.problems }) }
    }

    /// Every problem so far, leaving none behind.
    pub fn take_problems(&mut self) -> Vec<String> {
        std::mem::take(&mut self.problems)
    }
}

/// The process's environment, read once. Every builder in
/// [`crate::startup`] reads its settings from a `Config`, so tests build
/// their contexts from a `Config` of their own through the same code as a
/// `main`, and no other module reads a variable.
#[derive(Clone, Default)]
pub struct Config {
    vars: HashMap<String, String>,
    /// A pool already open on `DATABASE_URL`'s database, which the builders
    /// use instead of opening their own: a test's ([`Config::with_pool`]).
    pool: Option<sqlx::PgPool>,
}

impl Config {
    /// The process's variables (those that are valid UTF-8).
    pub fn from_env() -> Config {
        Config::from_vars(
            std::env::vars_os().filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?))),
        )
    }

    pub fn from_vars<K: Into<String>, V: Into<String>>(vars: impl IntoIterator<Item = (K, V)>) -> Config {
        Config { vars: vars.into_iter().map(|(k, v)| (k.into(), v.into())).collect(), pool: None }
    }

    /// The same configuration on `pool`, already open on `DATABASE_URL`'s
    /// database: every builder still reads and checks `DATABASE_URL`, then
    /// takes this pool where it would open one. For tests, whose database
    /// `#[sqlx::test]` makes, hands over as a pool and drops with it; no
    /// binary calls it.
    pub fn with_pool(mut self, pool: sqlx::PgPool) -> Config {
        self.pool = Some(pool);
        self
    }

    /// The pool given by [`Config::with_pool`].
    pub(crate) fn pool(&self) -> Option<&sqlx::PgPool> {
        self.pool.as_ref()
    }

    /// The same configuration with `name` set: a command-line flag over the
    /// environment, or a test's own value.
    pub fn with(mut self, name: &str, value: impl Into<String>) -> Config {
        self.vars.insert(name.to_owned(), value.into());
        self
    }

    /// The same configuration without `name`.
    pub fn without(mut self, name: &str) -> Config {
        self.vars.remove(name);
        self
    }

    /// A variable's value; blank counts as unset.
    pub fn get(&self, name: &str) -> Option<String> {
        self.vars.get(name).filter(|v| !v.trim().is_empty()).cloned()
    }

    /// A reader of these variables that collects every problem.
    pub fn env(&self) -> Env<impl Fn(&str) -> Option<String> + '_> {
        Env::new(move |name: &str| self.vars.get(name).cloned())
    }

    /// `REEVE_CATALOG`, or `reeve.toml`.
    pub fn catalog_path(&self) -> PathBuf {
        self.get(CATALOG).unwrap_or_else(|| DEFAULT_CATALOG.to_owned()).into()
    }

    /// Inside Lambda.
    pub fn in_lambda(&self) -> bool {
        self.get(LAMBDA_FUNCTION_NAME).is_some()
    }

    /// The S3 endpoint when it is not AWS's (SeaweedFS locally).
    pub fn s3_endpoint(&self) -> Option<String> {
        S3_ENDPOINTS.iter().find_map(|name| self.get(name)).map(|url| url.trim().to_owned())
    }

    /// `REEVE_METRICS_NAMESPACE` (the template sets `Reeve/<Stage>`), else
    /// [`crate::infra::metrics::DEFAULT_NAMESPACE`].
    pub fn metrics_namespace(&self) -> String {
        self.get(METRICS_NAMESPACE)
            .map(|ns| ns.trim().to_owned())
            .unwrap_or_else(|| crate::infra::metrics::DEFAULT_NAMESPACE.to_owned())
    }

    /// These variables with `values` (secrets read from Secrets Manager)
    /// under their plain names.
    pub(crate) fn overlaid(&self, values: HashMap<&'static str, Secret>) -> Config {
        let mut config = self.clone();
        for (name, secret) in values {
            config.vars.insert(name.to_owned(), secret.expose_str().to_owned());
        }
        config
    }
}

/// [`OUTPUT_RETENTION_DAYS`], if set. S3's lifecycle rules count whole
/// days; the template allows 1 to 3650.
pub fn output_retention_days<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> Option<u32> {
    env.optional(OUTPUT_RETENTION_DAYS).map(|_| env.number(OUTPUT_RETENTION_DAYS, 0, 1, 3650) as u32)
}

/// Every setting `needs` asks for; the secrets it does not are withheld.
pub fn api_settings<F: Fn(&str) -> Option<String>>(
    env: &mut Env<F>,
    needs: Needs,
) -> Result<ApiSettings, SettingsError> {
    let pepper = if needs.pepper { env.secret(PEPPER) } else { Some(Secret::withheld(PEPPER)) };
    let token_key = if needs.token_key { env.secret(TOKEN_KEY) } else { Some(Secret::withheld(TOKEN_KEY)) };
    let database_url =
        if needs.database { env.secret_text(DATABASE_URL) } else { Some(Secret::text(DATABASE_URL, String::new())) };
    let redis_url = env.required(REDIS_URL);
    let bucket = env.required(BUCKET);
    let queue_url = env.required(QUEUE_URL);
    let limits = login_limits(env);
    let output_retention_days = output_retention_days(env);
    let problems = env.take_problems();
    match (pepper, token_key, database_url) {
        (Some(pepper), Some(token_key), Some(database_url)) if problems.is_empty() => {
            Ok(ApiSettings {
                pepper,
                token_key,
                database_url,
                redis_url,
                bucket,
                queue_url,
                limits,
                output_retention_days,
                // Checked against the catalog by the builder that has it.
                #[cfg(feature = "receipts")]
                seller: None,
            })
        }
        _ => Err(SettingsError { problems }),
    }
}

/// The login budgets and the prefixes that group addresses into clients
/// ([`SPACES_BURST`] … [`CLIENT_IPV6_PREFIX`]), each the shipped default
/// when unset. An interval of 0 would be no limit at all, and a burst of 0
/// one the limiter cannot keep (it lets one through), so each is at least 1;
/// an interval is at most a day.
pub fn login_limits<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> LoginLimits {
    let defaults = LoginLimits::default();
    let mut budget = |burst_name: &str, interval_name: &str, default: Budget| Budget {
        burst: env.number(burst_name, default.burst.into(), 1, 1_000_000) as u32,
        every: Duration::from_millis(env.number(interval_name, default.every.as_millis() as u64, 1, 86_400_000)),
    };
    let spaces = budget(SPACES_BURST, SPACES_INTERVAL, defaults.spaces);
    let sessions = budget(SESSIONS_BURST, SESSIONS_INTERVAL, defaults.sessions);
    let prefixes = ClientPrefixes {
        v4: env.number(CLIENT_IPV4_PREFIX, defaults.prefixes.v4.into(), 0, 32) as u8,
        v6: env.number(CLIENT_IPV6_PREFIX, defaults.prefixes.v6.into(), 0, 128) as u8,
    };
    // Optional: only a deployment behind the edge has one. Generated by
    // the template (48 characters); a short one is a mistake, not a key.
    let edge = env.optional(EDGE_SECRET).and_then(|value| {
        if value.len() < 32 {
            env.problem(format!("{EDGE_SECRET} must be at least 32 bytes (got {})", value.len()));
            return None;
        }
        Some(EdgeSecret::new(&value))
    });
    LoginLimits { spaces, sessions, prefixes, edge }
}

/// What the worker (the `worker` Lambda and `reeve work`) needs.
#[cfg(feature = "worker")]
pub fn worker_settings<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> Result<WorkerSettings, SettingsError> {
    let database_url = env.secret_text(DATABASE_URL);
    let redis_url = env.required(REDIS_URL);
    let bucket = env.required(BUCKET);
    let queue_url = env.optional(QUEUE_URL);
    let concurrency = env.number(WORKER_CONCURRENCY, WorkerSettings::DEFAULT_CONCURRENCY as u64, 1, 256) as usize;
    let max_receives = max_receives(env);
    let fetch_max_bytes =
        env.number(FETCH_MAX_BYTES, WorkerSettings::DEFAULT_FETCH_MAX_BYTES, 1, 5 * 1024 * 1024 * 1024);
    let output_retention_days = output_retention_days(env);
    // Renewed every quarter of it: below 2 s a renewal's round trip is a
    // fair part of the lease; above 5 minutes a dead worker's task waits
    // longer than the sweeper's threshold for lost messages.
    let lease = Duration::from_secs(env.number(LEASE, WorkerSettings::DEFAULT_LEASE.as_secs(), 2, 300));
    let backoff = retry_backoff(env);
    let problems = env.take_problems();
    let Some(database_url) = database_url.filter(|_| problems.is_empty()) else {
        return Err(SettingsError { problems });
    };
    Ok(WorkerSettings {
        database_url,
        redis_url,
        bucket,
        queue_url,
        concurrency,
        max_receives,
        fetch_max_bytes,
        output_retention_days,
        lease,
        backoff,
    })
}

/// [`RETRY_BACKOFF`] and [`RETRY_BACKOFF_MAX`]: at most what SQS may hide
/// a message for (12 hours), the first no longer than the cap.
#[cfg(feature = "worker")]
fn retry_backoff<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> Backoff {
    let defaults = Backoff::default();
    let limit = Backoff::LIMIT.as_secs();
    let first = env.number(RETRY_BACKOFF, defaults.first.as_secs(), 0, limit);
    let max = env.number(RETRY_BACKOFF_MAX, defaults.max.as_secs(), 0, limit);
    if first > max {
        env.problem(format!("{RETRY_BACKOFF} ({first}) must not be more than {RETRY_BACKOFF_MAX} ({max})"));
    }
    Backoff { first: Duration::from_secs(first), max: Duration::from_secs(max) }
}

/// `REEVE_MAX_RECEIVES` (default 5): the queue's `maxReceiveCount`.
pub fn max_receives<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> u32 {
    env.number(MAX_RECEIVES, crate::domain::tasks::DEFAULT_MAX_RECEIVES.into(), 1, 1000) as u32
}

/// [`WORKER_TIMEOUT`]: more than the worker's margin, at most Lambda's 900.
#[cfg(feature = "catalog")]
pub fn worker_timeout<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> u32 {
    use crate::domain::catalog::{DEFAULT_WORKER_TIMEOUT_SECONDS, MAX_WORKER_TIMEOUT_SECONDS, RUN_MARGIN_SECONDS};
    let (default, min, max) = (DEFAULT_WORKER_TIMEOUT_SECONDS, RUN_MARGIN_SECONDS + 1, MAX_WORKER_TIMEOUT_SECONDS);
    env.number(WORKER_TIMEOUT, default.into(), min.into(), max.into()) as u32
}

/// The sweep's threshold ([`SWEEP_OLDER_THAN`]), `default` when unset.
pub fn sweep_older_than<F: Fn(&str) -> Option<String>>(env: &mut Env<F>, default: Duration) -> Duration {
    Duration::from_secs(env.number(SWEEP_OLDER_THAN, default.as_secs(), 0, 86_400 * 14))
}

/// How long a batch-settlement voucher may wait unclaimed at most
/// ([`BATCH_CLAIM_AFTER`]): an hour unless set, 0 to 30 days.
pub fn batch_claim_after<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> Duration {
    Duration::from_secs(env.number(BATCH_CLAIM_AFTER, 3600, 0, 86_400 * 30))
}

/// How completion webhooks are sent: [`WEBHOOK_TIMEOUT`] and
/// [`WEBHOOK_SCHEDULE`] over the Standard Webhooks defaults.
pub fn webhook_settings<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> crate::domain::webhooks::WebhookSettings {
    use crate::domain::webhooks::{DEFAULT_TIMEOUT, WebhookSettings};
    let timeout = Duration::from_secs(env.number(WEBHOOK_TIMEOUT, DEFAULT_TIMEOUT.as_secs(), 1, 30));
    let mut settings = WebhookSettings { timeout, ..WebhookSettings::default() };
    if let Some(raw) = env.optional(WEBHOOK_SCHEDULE) {
        let waits: Result<Vec<Duration>, _> =
            raw.split(',').map(|w| w.trim().parse::<u64>().map(Duration::from_secs)).collect();
        match waits {
            Ok(waits) if (1..=20).contains(&waits.len()) && waits.iter().all(|w| w.as_secs() <= 86_400) => {
                settings.schedule = waits;
            }
            _ => env.problem(format!(
                "{WEBHOOK_SCHEDULE} must be 1 to 20 comma-separated waits in seconds, each at most 86400, got {raw:?}"
            )),
        }
    }
    settings
}

/// [`UPLOAD_MAX_BYTES`]: `None` when unset, a problem naming the variable
/// when it is not a positive integer.
pub fn upload_limit<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> Option<u64> {
    let raw = env.optional(UPLOAD_MAX_BYTES)?;
    match raw.trim().parse::<u64>() {
        Ok(n) if n > 0 => Some(n),
        _ => {
            env.problem(format!("{UPLOAD_MAX_BYTES} must be a positive integer (bytes), got {raw:?}"));
            None
        }
    }
}

/// `REEVE_CORS_ORIGINS`, every bad origin a problem.
#[cfg(feature = "relay")]
pub fn cors_origins<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> CorsOrigins {
    CorsOrigins::parse(&env.optional(CORS_ORIGINS).unwrap_or_default()).unwrap_or_else(|problems| {
        for p in problems {
            env.problem(format!("{CORS_ORIGINS}: {p}"));
        }
        CorsOrigins::default()
    })
}

/// `REEVE_MCP_ALLOWED_HOSTS` and `REEVE_MCP_ALLOWED_ORIGINS`, each a
/// comma-separated list. Hosts default to loopback only; `*` allows any
/// (behind API Gateway, which routes only the API's own names to it).
/// `progress`: whether the process's replies stream (see
/// [`crate::adapters::mcp::McpSettings`]).
#[cfg(feature = "mcp")]
pub fn mcp_settings<F: Fn(&str) -> Option<String>>(env: &Env<F>, progress: bool) -> crate::adapters::mcp::McpSettings {
    let list = |name: &str| -> Vec<String> {
        env.optional(name)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut allowed_hosts = list(MCP_ALLOWED_HOSTS);
    if allowed_hosts.is_empty() {
        allowed_hosts = crate::adapters::mcp::McpSettings::LOOPBACK.map(str::to_owned).to_vec();
    } else if allowed_hosts.iter().any(|h| h == "*") {
        allowed_hosts.clear();
    }
    crate::adapters::mcp::McpSettings { allowed_hosts, allowed_origins: list(MCP_ALLOWED_ORIGINS), progress }
}

/// The users' client (`REEVE_FETCH_ALLOW`) and the operators' client
/// (`REEVE_OPERATOR_ALLOW`); `REEVE_OUTBOUND_ALLOW_HTTP` applies to both.
#[cfg(feature = "outbound")]
pub fn outbound_policies<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> (OutboundPolicy, OutboundPolicy) {
    (OutboundPolicy::users(|k| env.optional(k)), OutboundPolicy::operators(|k| env.optional(k)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Env<impl Fn(&str) -> Option<String>> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Env::new(move |name| map.get(name).cloned())
    }

    const LONG: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn webhook_settings_default_to_the_standard_schedule_and_check_their_numbers() {
        let mut e = env(&[]);
        let s = webhook_settings(&mut e);
        assert_eq!(s.schedule.len(), 9);
        assert_eq!(s.timeout, Duration::from_secs(10));
        assert!(e.take_problems().is_empty());
        let mut e = env(&[(WEBHOOK_SCHEDULE, " 1, 2,3 "), (WEBHOOK_TIMEOUT, "5")]);
        let s = webhook_settings(&mut e);
        assert_eq!(s.schedule, [1, 2, 3].map(Duration::from_secs));
        assert_eq!(s.timeout, Duration::from_secs(5));
        for bad in ["5,,6", "-1", "5 min", "90000"] {
            let vars = [(WEBHOOK_SCHEDULE, bad)];
            let mut e = env(&vars);
            webhook_settings(&mut e);
            let problems = e.take_problems();
            assert!(problems.len() == 1 && problems[0].starts_with(WEBHOOK_SCHEDULE), "{bad:?}: {problems:?}");
        }
        let mut e = env(&[(WEBHOOK_TIMEOUT, "31")]);
        webhook_settings(&mut e);
        assert_eq!(e.take_problems().len(), 1);
    }

    #[test]
    fn complete_environment_is_accepted() {
        let s = api_settings(
            &mut env(&[
                (PEPPER, LONG),
                (TOKEN_KEY, LONG),
                (DATABASE_URL, "postgres://localhost/reeve"),
                (REDIS_URL, "redis://localhost"),
                (BUCKET, "reeve"),
                (QUEUE_URL, "http://localhost/q"),
            ]),
            Needs::ALL,
        )
        .unwrap();
        assert_eq!(s.database_url.expose_str(), "postgres://localhost/reeve");
        assert!(!format!("{s:?}").contains("postgres://"), "{s:?}");
    }

    #[test]
    fn every_problem_is_reported_and_no_secret_is_echoed() {
        let err = api_settings(
            &mut env(&[(PEPPER, "short-pepper"), (REDIS_URL, "redis://x"), (BUCKET, "b"), (QUEUE_URL, "q")]),
            Needs::ALL,
        )
        .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.problems.len(), 3, "{text}");
        assert!(text.contains("REEVE_PEPPER must be at least 32 bytes"), "{text}");
        assert!(text.contains("REEVE_TOKEN_KEY is not set"), "{text}");
        assert!(text.contains("DATABASE_URL is not set"), "{text}");
        assert!(!text.contains("short-pepper"), "the secret leaked: {text}");
    }

    #[test]
    fn worker_settings_have_defaults_and_check_numbers() {
        let s = worker_settings(&mut env(&[
            (DATABASE_URL, "postgres://localhost/reeve"),
            (REDIS_URL, "redis://localhost"),
            (BUCKET, "reeve"),
        ]))
        .unwrap();
        assert_eq!(s.concurrency, WorkerSettings::DEFAULT_CONCURRENCY);
        assert_eq!(s.max_receives, 5);
        assert_eq!(s.queue_url, None);
        assert_eq!(s.lease, Duration::from_secs(20));
        assert_eq!((s.backoff.first.as_secs(), s.backoff.max.as_secs()), (5, 120));

        let err = worker_settings(&mut env(&[
            (REDIS_URL, "redis://localhost"),
            (BUCKET, "reeve"),
            (WORKER_CONCURRENCY, "0"),
            (MAX_RECEIVES, "five"),
        ]))
        .unwrap_err();
        assert_eq!(
            err.problems,
            vec![
                "DATABASE_URL is not set (nor REEVE_DATABASE_URL_SECRET_ARN, the ARN of a secret holding it)"
                    .to_string(),
                "REEVE_WORKER_CONCURRENCY must be an integer from 1 to 256".to_string(),
                "REEVE_MAX_RECEIVES must be an integer from 1 to 1000".to_string(),
            ]
        );
    }

    #[test]
    fn blank_counts_as_missing() {
        let err = api_settings(
            &mut env(&[
                (PEPPER, LONG),
                (TOKEN_KEY, LONG),
                (DATABASE_URL, "  "),
                (REDIS_URL, "redis://x"),
                (BUCKET, "b"),
                (QUEUE_URL, "q"),
            ]),
            Needs::ALL,
        )
        .unwrap_err();
        assert_eq!(
            err.problems,
            vec![
                "DATABASE_URL is not set (nor REEVE_DATABASE_URL_SECRET_ARN, the ARN of a secret holding it)"
                    .to_string()
            ]
        );
    }

    #[test]
    fn a_function_reads_only_the_secrets_it_needs() {
        // The catalog function is given no secret at all, and starts.
        let s =
            api_settings(&mut env(&[(REDIS_URL, "redis://x"), (BUCKET, "b"), (QUEUE_URL, "q")]), Needs::NONE).unwrap();
        assert_eq!(s.database_url.expose_str(), "");
        // A session route needs the token key and the database, not the pepper.
        let err = api_settings(
            &mut env(&[(PEPPER, LONG), (REDIS_URL, "redis://x"), (BUCKET, "b"), (QUEUE_URL, "q")]),
            Needs::SESSION,
        )
        .unwrap_err();
        assert_eq!(err.problems.len(), 2, "{err}");
        assert!(err.problems[0].starts_with("REEVE_TOKEN_KEY is not set (nor REEVE_TOKEN_KEY_SECRET_ARN"));
        assert!(err.problems[1].starts_with("DATABASE_URL is not set"));
    }

    #[test]
    fn login_budgets_default_to_the_shipped_ones_and_move_by_setting() {
        let none: &[(&str, &str)] = &[];
        assert_eq!(login_limits(&mut env(none)), LoginLimits::default());
        assert_eq!(
            LoginLimits::default().prefixes,
            ClientPrefixes { v4: 32, v6: 56 },
            "each IPv4 address, each IPv6 /56"
        );
        let mut e = env(&[
            (SPACES_BURST, "3"),
            (SPACES_INTERVAL, "1000"),
            (SESSIONS_BURST, "20"),
            (SESSIONS_INTERVAL, "250"),
            (CLIENT_IPV4_PREFIX, "24"),
            (CLIENT_IPV6_PREFIX, "48"),
            (EDGE_SECRET, "an-edge-secret-of-at-least-32-bytes"),
        ]);
        let limits = login_limits(&mut e);
        assert!(e.finish().is_ok());
        assert_eq!(
            limits,
            LoginLimits {
                spaces: Budget { burst: 3, every: Duration::from_secs(1) },
                sessions: Budget { burst: 20, every: Duration::from_millis(250) },
                prefixes: ClientPrefixes { v4: 24, v6: 48 },
                edge: Some(EdgeSecret::new("an-edge-secret-of-at-least-32-bytes")),
            }
        );
        let mut short = env(&[(EDGE_SECRET, "too-short")]);
        assert_eq!(login_limits(&mut short).edge, None);
        assert_eq!(short.take_problems(), ["REEVE_EDGE_SECRET must be at least 32 bytes (got 9)"]);
    }

    #[test]
    fn bad_login_budgets_are_refused_each_by_its_name() {
        // (variable, bad value)
        let cases = [
            (SPACES_BURST, "0"),
            (SESSIONS_BURST, "0"),
            (SPACES_INTERVAL, "0"),
            (SESSIONS_INTERVAL, "0"),
            (SPACES_BURST, "ten"),
            (CLIENT_IPV4_PREFIX, "33"),
            (CLIENT_IPV6_PREFIX, "129"),
            (CLIENT_IPV6_PREFIX, "-1"),
        ];
        for (name, value) in cases {
            let vars = [(name, value)];
            let mut e = env(&vars);
            login_limits(&mut e);
            let problems = e.take_problems();
            assert_eq!(problems.len(), 1, "{name}={value}: {problems:?}");
            assert!(problems[0].starts_with(&format!("{name} must be an integer from ")), "{problems:?}");
        }
        // At start-up: every one at once, with the API's other settings.
        let err = api_settings(
            &mut env(&[
                (PEPPER, LONG),
                (TOKEN_KEY, LONG),
                (DATABASE_URL, "postgres://localhost/reeve"),
                (REDIS_URL, "redis://x"),
                (BUCKET, "b"),
                (QUEUE_URL, "q"),
                (SPACES_BURST, "0"),
                (SESSIONS_INTERVAL, "0"),
                (CLIENT_IPV6_PREFIX, "200"),
            ]),
            Needs::ALL,
        )
        .unwrap_err();
        assert_eq!(
            err.problems,
            vec![
                "REEVE_SPACES_BURST must be an integer from 1 to 1000000".to_string(),
                "REEVE_SESSIONS_INTERVAL_MS must be an integer from 1 to 86400000".to_string(),
                "REEVE_CLIENT_IPV6_PREFIX must be an integer from 0 to 128".to_string(),
            ]
        );
    }

    #[test]
    fn a_bad_socket_address_is_a_problem() {
        let default = std::net::SocketAddr::from(([0, 0, 0, 0], 8080));
        let mut e = env(&[(RELAY_BIND, "localhost:eighty")]);
        assert_eq!(e.socket_addr(RELAY_BIND, default), default);
        assert_eq!(
            e.take_problems(),
            vec![r#"REEVE_RELAY_BIND must be an address such as 0.0.0.0:8080, got "localhost:eighty""#]
        );
        let mut e = env(&[(RELAY_BIND, "127.0.0.1:9000")]);
        assert_eq!(e.socket_addr(RELAY_BIND, default).port(), 9000);
        assert!(e.finish().is_ok());
    }

    #[test]
    fn an_origin_is_taken_as_browsers_write_it_and_anything_more_is_a_problem() {
        for (given, origin) in [
            (
                "https://abc123.execute-api.eu-west-1.amazonaws.com/",
                "https://abc123.execute-api.eu-west-1.amazonaws.com",
            ),
            ("https://API.example.com:443", "https://api.example.com"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ] {
            let vars = [(API_ORIGIN, given)];
            let mut e = env(&vars);
            assert_eq!(e.origin(API_ORIGIN).as_deref(), Some(origin), "{given}");
            assert!(e.finish().is_ok(), "{given}");
        }
        let none: &[(&str, &str)] = &[];
        assert_eq!(env(none).origin(API_ORIGIN), None);
        for bad in [
            "api.example.com",
            "https://api.example.com/v1",
            "https://api.example.com/?a=1",
            "ftp://api.example.com",
            "https://me@api.example.com",
        ] {
            let vars = [(API_ORIGIN, bad)];
            let mut e = env(&vars);
            assert_eq!(e.origin(API_ORIGIN), None, "{bad}");
            let problems = e.take_problems();
            assert_eq!(problems.len(), 1, "{bad}");
            assert!(problems[0].starts_with("REEVE_API_ORIGIN must be an origin"), "{problems:?}");
        }
    }
}
