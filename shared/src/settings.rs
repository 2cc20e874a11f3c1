//! Secrets and endpoints come from the environment, never from the catalog
//! (DESIGN §3). Every missing or bad variable is reported at once, so an
//! operator fixes the deployment in one round, not one variable at a time.

use std::fmt;
use std::path::PathBuf;

use crate::auth::Secret;
use crate::db::DbError;
use crate::redis_client::BadRedisUrl;

pub const PEPPER: &str = "REEVE_PEPPER";
pub const TOKEN_KEY: &str = "REEVE_TOKEN_KEY";
pub const DATABASE_URL: &str = "DATABASE_URL";
pub const REDIS_URL: &str = "REDIS_URL";
pub const BUCKET: &str = "REEVE_BUCKET";
pub const QUEUE_URL: &str = "REEVE_QUEUE_URL";
pub const CATALOG: &str = "REEVE_CATALOG";
/// The relay's SSE keep-alive interval in seconds (default 15).
pub const KEEPALIVE: &str = "REEVE_KEEPALIVE_SECONDS";
pub const WORKER_CONCURRENCY: &str = "REEVE_WORKER_CONCURRENCY";
pub const MAX_RECEIVES: &str = "REEVE_MAX_RECEIVES";
pub const FETCH_MAX_BYTES: &str = "REEVE_FETCH_MAX_BYTES";
/// Browser origins allowed to call the API and the relay (comma-separated).
pub const CORS_ORIGINS: &str = "REEVE_CORS_ORIGINS";

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

/// Reads variables one by one and remembers every problem, so the caller can
/// ask for all it needs and then fail once with the full list.
pub struct Env<F> {
    lookup: F,
    problems: Vec<String>,
}

impl Env<fn(&str) -> Option<String>> {
    pub fn process() -> Self {
        Env::new(|name| std::env::var(name).ok())
    }
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

    /// A secret must be long enough to resist guessing: at least 32 bytes.
    pub fn secret(&mut self, name: &'static str) -> Option<Secret> {
        let value = self.required(name);
        if value.is_empty() {
            return None;
        }
        match Secret::new(name, value.into_bytes()) {
            Ok(secret) => Some(secret),
            Err(e) => {
                self.problems.push(e.to_string());
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
}

pub fn catalog_path() -> PathBuf {
    Env::process().optional(CATALOG).unwrap_or_else(|| DEFAULT_CATALOG.to_owned()).into()
}

/// What the HTTP API needs to run: the auth secrets, the stores, the bucket
/// and the queue.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub pepper: Secret,
    pub token_key: Secret,
    pub database_url: String,
    pub redis_url: String,
    pub bucket: String,
    pub queue_url: String,
}

impl ApiSettings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::read(&mut Env::process())
    }

    pub fn read<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> Result<Self, SettingsError> {
        let pepper = env.secret(PEPPER);
        let token_key = env.secret(TOKEN_KEY);
        let database_url = env.required(DATABASE_URL);
        let redis_url = env.required(REDIS_URL);
        let bucket = env.required(BUCKET);
        let queue_url = env.required(QUEUE_URL);
        let problems = std::mem::take(&mut env.problems);
        match (pepper, token_key) {
            (Some(pepper), Some(token_key)) if problems.is_empty() => {
                Ok(ApiSettings { pepper, token_key, database_url, redis_url, bucket, queue_url })
            }
            _ => Err(SettingsError { problems }),
        }
    }
}

/// What the worker (the `worker` Lambda and `reeve work`) needs: the stores,
/// the bucket, and how hard to work.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub database_url: String,
    pub redis_url: String,
    pub bucket: String,
    /// `REEVE_QUEUE_URL`: only `reeve work` polls it; the Lambda is handed
    /// its batches.
    pub queue_url: Option<String>,
    /// `REEVE_WORKER_CONCURRENCY` (default 4): records run at once.
    pub concurrency: usize,
    /// `REEVE_MAX_RECEIVES` (default 5): the queue's `maxReceiveCount`. On
    /// that delivery a retryable failure fails the task for good
    /// (`retries_exhausted`), since SQS will not deliver it again.
    pub max_receives: u32,
    /// `REEVE_FETCH_MAX_BYTES` (default 100 MiB): the `fetch` executor's cap.
    pub fetch_max_bytes: u64,
}

impl WorkerSettings {
    pub const DEFAULT_CONCURRENCY: usize = 4;
    pub const DEFAULT_MAX_RECEIVES: u32 = 5;
    pub const DEFAULT_FETCH_MAX_BYTES: u64 = 100 * 1024 * 1024;

    pub fn from_env() -> Result<Self, SettingsError> {
        Self::read(&mut Env::process())
    }

    pub fn read<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> Result<Self, SettingsError> {
        let database_url = env.required(DATABASE_URL);
        let redis_url = env.required(REDIS_URL);
        let bucket = env.required(BUCKET);
        let queue_url = env.optional(QUEUE_URL);
        let concurrency = env.number(WORKER_CONCURRENCY, Self::DEFAULT_CONCURRENCY as u64, 1, 256) as usize;
        let max_receives = env.number(MAX_RECEIVES, Self::DEFAULT_MAX_RECEIVES.into(), 1, 1000) as u32;
        let fetch_max_bytes =
            env.number(FETCH_MAX_BYTES, Self::DEFAULT_FETCH_MAX_BYTES, 1, 5 * 1024 * 1024 * 1024);
        let problems = std::mem::take(&mut env.problems);
        if !problems.is_empty() {
            return Err(SettingsError { problems });
        }
        Ok(WorkerSettings { database_url, redis_url, bucket, queue_url, concurrency, max_receives, fetch_max_bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Env<impl Fn(&str) -> Option<String>> {
        let map: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Env::new(move |name| map.get(name).cloned())
    }

    const LONG: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn complete_environment_is_accepted() {
        let s = ApiSettings::read(&mut env(&[
            (PEPPER, LONG),
            (TOKEN_KEY, LONG),
            (DATABASE_URL, "postgres://localhost/reeve"),
            (REDIS_URL, "redis://localhost"),
            (BUCKET, "reeve"),
            (QUEUE_URL, "http://localhost/q"),
        ]))
        .unwrap();
        assert_eq!(s.database_url, "postgres://localhost/reeve");
    }

    #[test]
    fn every_problem_is_reported_and_no_secret_is_echoed() {
        let err = ApiSettings::read(&mut env(&[
            (PEPPER, "short-pepper"),
            (REDIS_URL, "redis://x"),
            (BUCKET, "b"),
            (QUEUE_URL, "q"),
        ]))
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
        let s = WorkerSettings::read(&mut env(&[
            (DATABASE_URL, "postgres://localhost/reeve"),
            (REDIS_URL, "redis://localhost"),
            (BUCKET, "reeve"),
        ]))
        .unwrap();
        assert_eq!(s.concurrency, WorkerSettings::DEFAULT_CONCURRENCY);
        assert_eq!(s.max_receives, 5);
        assert_eq!(s.queue_url, None);

        let err = WorkerSettings::read(&mut env(&[
            (REDIS_URL, "redis://localhost"),
            (BUCKET, "reeve"),
            (WORKER_CONCURRENCY, "0"),
            (MAX_RECEIVES, "five"),
        ]))
        .unwrap_err();
        assert_eq!(
            err.problems,
            vec![
                "DATABASE_URL is not set".to_string(),
                "REEVE_WORKER_CONCURRENCY must be an integer from 1 to 256".to_string(),
                "REEVE_MAX_RECEIVES must be an integer from 1 to 1000".to_string(),
            ]
        );
    }

    #[test]
    fn blank_counts_as_missing() {
        let err = ApiSettings::read(&mut env(&[
            (PEPPER, LONG),
            (TOKEN_KEY, LONG),
            (DATABASE_URL, "  "),
            (REDIS_URL, "redis://x"),
            (BUCKET, "b"),
            (QUEUE_URL, "q"),
        ]))
        .unwrap_err();
        assert_eq!(err.problems, vec!["DATABASE_URL is not set".to_string()]);
    }
}
