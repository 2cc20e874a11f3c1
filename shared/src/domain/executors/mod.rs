//! Executors: the real work behind each task kind (docs/architecture.md#queue-and-worker).
//!
//! Each executor is a small type behind [`TaskExecutor`]; [`run`] picks the
//! one a task's catalog entry names (static dispatch, no boxing). While it
//! runs, an executor reports progress and log lines through [`Job::reports`];
//! the worker turns each [`Report`] into a durable event.
//!
//! Failures are [`ExecError`]s: `Retryable` for Reeve's own trouble (the
//! worker lets SQS redeliver, and a paid task that never gets past it is
//! credited), `Permanent` with a stable code from [`codes`] for a task that
//! can never succeed as given, which is never credited. Which is which
//! follows whose the failing part is: the task owner's (`fetch`'s URL, an
//! upload), or Reeve's and its operator's (S3, Postgres, the `http`
//! executor's endpoint). A permanent error's message is
//! shown to the task's owner, so it names only what the owner supplied (their
//! upload id, their URL) and never an internal host, key or credential; the
//! detail goes to the logs instead.
//!
//! - [`Digest`]: SHA-256 and size of an upload, streamed from S3.
//! - [`Fetch`]: downloads a URL through the guarded client into `outputs/`.
//! - [`Http`]: POSTs the input to an operator-configured endpoint.

mod digest;
mod fetch;
mod http;

use std::future::Future;

use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::{Executor, TaskSpec};
use crate::domain::ids::Id;
use crate::infra::outbound::{Outbound, OutboundError};

pub use digest::Digest;
pub use fetch::{Fetch, output_key};
pub use http::Http;

/// What an executor tells the worker while it runs; the worker turns each
/// into a durable event.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// `fraction` in 0.0..=1.0; `detail` e.g. `{"bytes": N, "total": M}`.
    Progress {
        fraction: f32,
        detail: Value,
    },
    Log {
        line: String,
    },
}

/// Everything executors share, built once per process.
#[derive(Clone)]
pub struct ExecDeps {
    pub db: PgPool,
    pub s3: aws_sdk_s3::Client,
    pub bucket: String,
    /// The users' client, for URLs a task's owner chose (`fetch`): public
    /// addresses only, plus `REEVE_FETCH_ALLOW` (empty in production).
    pub outbound: Outbound,
    /// The operators' client, for the endpoints the operator configured
    /// (`http`): `REEVE_OPERATOR_ALLOW` may let private hosts through here,
    /// never through [`outbound`](Self::outbound).
    pub operators: Outbound,
    /// Cap on what `fetch` downloads.
    pub fetch_max_bytes: u64,
    /// How many days the bucket keeps what `fetch` stores (its lifecycle
    /// rule for `outputs/`), if known.
    pub output_retention_days: Option<u32>,
}

/// One task to run.
pub struct Job<'a> {
    pub task_id: Id,
    pub space: SpaceIndex,
    pub input: &'a Value,
    pub spec: &'a TaskSpec,
    pub reports: mpsc::Sender<Report>,
}

impl Job<'_> {
    /// Sends a progress report. Waits while the worker's channel is full
    /// (back-pressure); a worker that stopped listening is not an error.
    pub async fn progress(&self, fraction: f32, detail: Value) {
        let _ = self.reports.send(Report::Progress { fraction: fraction.clamp(0.0, 1.0), detail }).await;
    }

    /// Sends a log line; see [`Job::progress`].
    pub async fn log(&self, line: impl Into<String>) {
        let _ = self.reports.send(Report::Log { line: line.into() }).await;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Infrastructure trouble (S3, Postgres, a timeout): try again later.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The same, where the failing service said when to try again (an
    /// operator's endpoint answering 503 or 429 with `Retry-After`).
    #[error("retryable after {}s: {reason}", after.as_secs())]
    RetryAfter { reason: String, after: std::time::Duration },
    /// The task can never succeed as given (bad input, rejected upload,
    /// blocked URL): fail it with this stable code.
    #[error("{code}: {message}")]
    Permanent { code: &'static str, message: String },
}

impl ExecError {
    pub fn permanent(code: &'static str, message: impl Into<String>) -> Self {
        ExecError::Permanent { code, message: message.into() }
    }

    /// `what` failed because of `cause`: for the logs and the worker, never
    /// shown to the task's owner.
    pub fn retryable(what: &str, cause: impl std::fmt::Display) -> Self {
        ExecError::Retryable(format!("{what}: {cause}"))
    }

    pub fn is_retryable(&self) -> bool {
        matches!(self, ExecError::Retryable(_) | ExecError::RetryAfter { .. })
    }

    /// The stable code of a permanent error.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            ExecError::Permanent { code, .. } => Some(code),
            ExecError::Retryable(_) | ExecError::RetryAfter { .. } => None,
        }
    }
}

/// The stable codes of [`ExecError::Permanent`].
pub mod codes {
    /// The input lacks a field the executor needs, or it has the wrong form.
    pub const INVALID_INPUT: &str = "invalid_input";
    /// `digest`: no such upload in the task's space (unknown and another
    /// space's look the same).
    pub const UNKNOWN_UPLOAD: &str = "unknown_upload";
    /// `digest`: the upload was rejected (its object was not what was declared).
    pub const UPLOAD_REJECTED: &str = "upload_rejected";
    /// `digest`: the upload has no object (never uploaded, or expired).
    pub const UPLOAD_MISSING: &str = "upload_missing";
    /// `digest`: the object's size or type is not what was declared.
    pub const UPLOAD_MISMATCH: &str = "upload_mismatch";
    /// `fetch`/`http`: the outbound policy refuses the address (private,
    /// loopback, metadata, plain http in production, …).
    pub const URL_BLOCKED: &str = "url_blocked";
    /// `fetch`/`http`: the URL cannot be parsed or has an unusable scheme.
    pub const INVALID_URL: &str = "invalid_url";
    /// `fetch`/`http`: the response is larger than the cap.
    pub const TOO_LARGE: &str = "too_large";
    /// `fetch`: the URL did not resolve, refused or broke the connection, or
    /// did not answer in time. The owner's target, so never credited.
    pub const FETCH_UNREACHABLE: &str = "fetch_unreachable";
    /// `http`: the endpoint answered 4xx (other than 429).
    pub const EXECUTOR_REJECTED: &str = "executor_rejected";
    /// `http`: the endpoint answered 2xx without a JSON body, or an
    /// unexpected status.
    pub const BAD_EXECUTOR_RESPONSE: &str = "bad_executor_response";
}

/// An executor: runs one job to a JSON result.
///
/// Implementations may write `async fn run`; the trait spells out the
/// future so that callers can rely on it being `Send`.
pub trait TaskExecutor {
    fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> impl Future<Output = Result<Value, ExecError>> + Send;
}

/// Runs the executor the task's catalog entry names.
pub async fn run(deps: &ExecDeps, job: Job<'_>) -> Result<Value, ExecError> {
    match &job.spec.executor {
        Executor::Digest => Digest.run(deps, &job).await,
        Executor::Fetch => Fetch.run(deps, &job).await,
        Executor::Http { endpoint } => Http { endpoint: endpoint.clone() }.run(deps, &job).await,
    }
}

/// The string field `name` of the input, or `invalid_input`.
fn input_str<'v>(input: &'v Value, name: &str) -> Result<&'v str, ExecError> {
    input
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ExecError::permanent(codes::INVALID_INPUT, format!("input.{name} must be a string")))
}

/// How the guarded client's refusals look to a task's owner, shared by
/// `fetch` and `http`. `target` names what was called in owner-safe words
/// ("the URL", "the executor endpoint"). The client's own message may name
/// resolved addresses, so it goes to the logs only; network trouble is
/// retryable.
fn outbound_error(target: &str, e: OutboundError) -> ExecError {
    if e.is_retryable() {
        return ExecError::retryable(target, e);
    }
    tracing::warn!(error = %e, "{target} refused by the outbound client");
    match e {
        OutboundError::Blocked(_) => ExecError::permanent(
            codes::URL_BLOCKED,
            format!("{target} is not allowed: it is not public https, or it resolves to a blocked address"),
        ),
        OutboundError::InvalidUrl(_) => {
            ExecError::permanent(codes::INVALID_URL, format!("{target} is not a valid absolute http(s) URL"))
        }
        OutboundError::TooLarge { limit } => {
            ExecError::permanent(codes::TOO_LARGE, format!("the response from {target} is larger than {limit} bytes"))
        }
        // Not retryable, yet none of the above (a variant added later):
        // fail rather than loop; the detail is in the log line above.
        _ => ExecError::permanent(codes::INVALID_URL, format!("{target} cannot be used")),
    }
}

/// Lower-case hex SHA-256.
#[cfg(test)]
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest: [u8; 32] = sha2::Sha256::digest(bytes).into();
    hex::encode(digest)
}
