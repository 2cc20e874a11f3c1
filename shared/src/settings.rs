//! Secrets and endpoints come from the environment, never from the catalog
//! (DESIGN §3). Every missing or bad variable is reported at once, so an
//! operator fixes the deployment in one round, not one variable at a time.

use std::fmt;
use std::path::PathBuf;

use crate::auth::Secret;

pub const PEPPER: &str = "REEVE_PEPPER";
pub const TOKEN_KEY: &str = "REEVE_TOKEN_KEY";
pub const DATABASE_URL: &str = "DATABASE_URL";
pub const REDIS_URL: &str = "REDIS_URL";
pub const BUCKET: &str = "REEVE_BUCKET";
pub const QUEUE_URL: &str = "REEVE_QUEUE_URL";
pub const CATALOG: &str = "REEVE_CATALOG";

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
