//! Executors: the real work behind each task kind (docs/architecture.md#queue-and-worker).
//!
//! Each executor is one file: a type that declares everything about itself
//! through [`ExecutorKind`] (its name in `reeve.toml`, the keys of its
//! table and their checks, what it meters and how a finished run's usage is
//! read, the schema of its result, which of its reports may be shown before
//! a metered task is paid) and does its work through [`TaskExecutor`]. The
//! [`registry`] lists each once; from that list come the [`Executor`] a
//! catalog entry holds, the names error messages offer, and [`run`]'s
//! dispatch (static, no boxing), so a name cannot drift from its behaviour.
//! While it runs, an executor reports progress and log lines through
//! [`Job::reports`]; the worker turns each [`Report`] into a durable event.
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
//! The declarations are built wherever the catalog is (the catalog function
//! checks them, MCP shows their result schemas); running needs the worker's
//! clients, so that half of each file, and [`ExecDeps`], [`Job`] and
//! [`ExecError`], exist with the `worker` feature only.
//!
//! - [`Digest`]: SHA-256 and size of an upload, streamed from S3.
//! - [`Fetch`]: downloads a URL through the guarded client into `outputs/`.
//! - [`Http`]: POSTs the input to an operator-configured endpoint.
//! - [`Lambda`]: invokes an operator's Lambda function with the job.

mod digest;
mod fetch;
mod http;
mod lambda;
pub mod protocol;
pub(crate) mod registry;
#[cfg(feature = "api-tasks")]
pub mod service;

#[cfg(feature = "worker")]
use std::future::Future;
use std::time::Duration;

use serde_json::{Map, Value, json};
#[cfg(feature = "worker")]
use sqlx::PgPool;
#[cfg(feature = "worker")]
use tokio::sync::mpsc;

#[cfg(feature = "worker")]
use crate::domain::auth::SpaceIndex;
#[cfg(feature = "worker")]
use crate::domain::catalog::TaskSpec;
use crate::domain::catalog::meter::Quantity;
use crate::domain::catalog::read::{Fields, Problems};
#[cfg(feature = "worker")]
use crate::domain::ids::Id;
use crate::domain::payments::HeldReport;
use crate::domain::tasks::EventType;
#[cfg(feature = "worker")]
use crate::infra::outbound::{Outbound, OutboundError};

pub use digest::Digest;
pub use fetch::Fetch;
#[cfg(feature = "worker")]
pub use fetch::output_key;
pub use http::Http;
pub use lambda::Lambda;
pub use protocol::{PROTOCOL_VERSION, Protocol, SecretRef};
pub use registry::Executor;

/// One executor, declared whole in its own file and listed once in the
/// [`registry`]. Everything Reeve says or checks about an executor comes
/// from here, so adding one is its file and its line in the registry.
pub(crate) trait ExecutorKind: Sized {
    /// What `executor = "…"` says in `reeve.toml`.
    const NAME: &'static str;

    /// The keys of a `[tasks.<kind>]` table that this executor reads
    /// beyond those every kind has. A kind whose executor does not read one
    /// of them is told which executor does.
    const KEYS: &'static [TaskKey] = &[];

    /// Builds the executor from its kind's table, each problem reported at
    /// its TOML path; `None` if there was one.
    fn configure(task: &Fields<'_>, problems: &mut Problems) -> Option<Self>;

    /// What a metered price of this executor counts: a unit of another
    /// quantity is refused when the catalog is loaded.
    fn measures(&self) -> Quantity;

    /// How much of [`measures`](Self::measures) a finished run used, from
    /// its result and how long it took.
    fn used(&self, result: &Value, took: Duration) -> u64;

    /// The JSON Schema of a completed task's `result`, as MCP announces it
    /// in the kind's tool. Loose on purpose: the fields an agent relies on
    /// are required, and more may be added.
    fn output_schema(&self) -> Value;

    /// Whether `report` may be shown while a metered task's payment is not
    /// yet captured: `true` only for what says nothing of the result (how
    /// far it got, the units counted so far). Anything else is held with
    /// the result. Held is the default, so a new executor cannot leak a
    /// result before it is paid for by forgetting to say.
    fn discloses(&self, report: &Report) -> bool {
        let _ = report;
        false
    }

    /// Whether a run may be handed to a service that answers `202` and
    /// reports on its own (docs/executors.md): the worker then waits only
    /// for that answer, so the kind's `timeout_seconds` is not bounded by
    /// the worker's invocation.
    fn delegates(&self) -> bool {
        false
    }
}

/// The JSON Schema of the `outputs` Reeve adds to the result of a kind
/// whose service wrote files (docs/executor-schemas/outputs.json).
pub fn outputs_schema() -> Value {
    serde_json::from_str(include_str!("../../../../docs/executor-schemas/outputs.json"))
        .expect("docs/executor-schemas/outputs.json is JSON")
}

/// The result schema of a kind whose service may answer `202` and report:
/// whatever the service says, and the `outputs` Reeve adds to it.
fn delegated_result_schema() -> Value {
    let mut outputs = outputs_schema();
    if let Some(fields) = outputs.as_object_mut() {
        fields.remove("$schema");
        fields.remove("$id");
    }
    json!({ "type": "object", "properties": { "outputs": outputs } })
}

/// A key of a `[tasks.<kind>]` table that only some executors read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TaskKey {
    pub key: &'static str,
    /// How a message names it: "an endpoint".
    pub noun: &'static str,
    /// A value it accepts, as TOML: what the registry's tests configure
    /// each executor with.
    #[cfg_attr(not(test), allow(dead_code))]
    pub example: &'static str,
}

/// Whether `report`, sent by a task `executor` runs, may be shown before
/// the task's payment is captured (see [`ExecutorKind::discloses`]): what
/// the worker asks of each report of a metered task, whose stream must hold
/// every other one until the capture.
pub fn discloses(executor: &Executor, report: &Report) -> bool {
    executor.discloses(report)
}

/// How a report becomes an event of its task.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// Written now: `(tasks.progress, type, data)`.
    Shown { progress: Option<f32>, kind: EventType, data: Value },
    /// A metered task's report that may carry its result: kept with the
    /// run, published only once its capture is charged.
    Held(HeldReport),
    /// Not a report (a fraction that is no number).
    Malformed,
}

/// The event `report` becomes, for a task `metered` by that executor or
/// free (`None`). A metered task shows only how far it got (the fraction,
/// and the bytes counted where its executor says they tell nothing of the
/// result; stage details are stale by the charge) and what its executor
/// [`discloses`]; everything else is held. What the worker does with its
/// executor's reports and the report route with a service's.
pub fn recorded(report: &Report, metered: Option<&Executor>) -> Recorded {
    let Some((progress, kind, data)) = report_event(report) else { return Recorded::Malformed };
    match metered {
        None => Recorded::Shown { progress, kind, data },
        Some(executor) if kind == EventType::Progress => {
            let mut shown = json!({ "fraction": data["fraction"] });
            if executor.discloses(report)
                && let Some(bytes) = data.get("bytes").filter(|b| b.is_u64())
            {
                shown["bytes"] = bytes.clone();
            }
            Recorded::Shown { progress, kind, data: shown }
        }
        Some(executor) if executor.discloses(report) => Recorded::Shown { progress, kind, data },
        Some(_) => Recorded::Held(HeldReport { kind: kind.as_str().to_owned(), data }),
    }
}

/// The event a report becomes: `(tasks.progress, type, data)`.
fn report_event(report: &Report) -> Option<(Option<f32>, EventType, Value)> {
    match report {
        Report::Progress { fraction, detail } => {
            if !fraction.is_finite() {
                return None;
            }
            let fraction = fraction.clamp(0.0, 1.0);
            // f32 → JSON shows 0.3 as 0.30000001192092896: round for people.
            let shown = (f64::from(fraction) * 10_000.0).round() / 10_000.0;
            let mut data = Map::new();
            match detail {
                Value::Object(fields) => data.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone()))),
                Value::Null => {}
                other => {
                    data.insert("detail".into(), other.clone());
                }
            }
            data.insert("fraction".into(), json!(shown));
            Some((Some(fraction), EventType::Progress, Value::Object(data)))
        }
        Report::Log { line } => Some((None, EventType::Log, json!({ "line": line }))),
    }
}

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

#[cfg(feature = "worker")]
/// Everything executors share, built once per process.
#[derive(Clone)]
pub struct ExecDeps {
    pub db: PgPool,
    /// Uploads read, and links to them signed.
    pub objects: crate::infra::s3_objects::S3Objects,
    /// What `fetch` stores, as a multipart upload.
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
    /// What sending a protocol kind's job takes (docs/executors.md).
    pub protocol: ProtocolDeps,
    /// The Invoke client of `lambda` kinds (its endpoint the SDK's own
    /// `AWS_ENDPOINT_URL_LAMBDA` when set); `None` when the catalog has none.
    #[cfg(feature = "lambda-invoke")]
    pub lambda: Option<aws_sdk_lambda::Client>,
}

#[cfg(feature = "worker")]
/// What the worker signs and links a protocol kind's job with, read once
/// at start-up. Empty when the catalog has no such kind.
#[derive(Clone, Debug, Default)]
pub struct ProtocolDeps {
    /// Each endpoint's signing key, by where its `secret` says it is.
    pub keys: std::collections::HashMap<SecretRef, protocol::JobKey>,
    /// `POST /v1/executor/reports` as services reach it
    /// (`REEVE_REPORT_URL`).
    pub report_url: Option<String>,
    /// The key report tokens are signed with: the API's token key.
    pub token_key: Option<crate::domain::auth::Secret>,
}

#[cfg(feature = "worker")]
impl ExecDeps {
    /// No protocol kind's keys: what a worker whose catalog has none holds.
    pub fn default_protocol() -> ProtocolDeps {
        ProtocolDeps::default()
    }
}

#[cfg(feature = "worker")]
/// One task to run.
pub struct Job<'a> {
    pub task_id: Id,
    /// The run's fencing token: which attempt of the task this is.
    pub attempt: i32,
    /// The kind's name in the catalog.
    pub kind: &'a str,
    pub space: SpaceIndex,
    pub input: &'a Value,
    pub spec: &'a TaskSpec,
    pub reports: mpsc::Sender<Report>,
}

#[cfg(feature = "worker")]
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

#[cfg(feature = "worker")]
/// An attempt handed to its service (it answered `202`), whose buyer has
/// since canceled the task: what the service's cancel names.
#[derive(Debug, Clone, Copy)]
pub struct DelegatedAttempt<'a> {
    pub task_id: Id,
    pub kind: &'a str,
    pub attempt: i32,
    /// The job's deadline, as the job said it.
    pub deadline: time::OffsetDateTime,
}

#[cfg(feature = "worker")]
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
    /// Not a failure: the service accepted the job (`202`) and reports on
    /// its own until `deadline`; the run holds the task no longer.
    #[error("delegated to the service until {deadline}")]
    Delegated { deadline: time::OffsetDateTime },
}

#[cfg(feature = "worker")]
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
            ExecError::Retryable(_) | ExecError::RetryAfter { .. } | ExecError::Delegated { .. } => None,
        }
    }
}

#[cfg(feature = "worker")]
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
    /// `lambda`: the operator's function does not exist (anymore).
    pub const EXECUTOR_UNAVAILABLE: &str = "executor_unavailable";
}

#[cfg(feature = "worker")]
/// An executor's work: runs one job to a JSON result. The [`registry`]
/// calls it for every executor it lists, so each must have it.
///
/// Implementations may write `async fn run`; the trait spells out the
/// future so that callers can rely on it being `Send`.
pub trait TaskExecutor {
    fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> impl Future<Output = Result<Value, ExecError>> + Send;

    /// Tells the service of a delegated attempt that its buyer canceled it
    /// (docs/executors.md, "Cancel"). `Err`: it could not be told, and is
    /// told again later. Only an executor that [`delegates`](ExecutorKind::delegates)
    /// has attempts to cancel: the others keep this, which does nothing.
    fn cancel(
        &self,
        deps: &ExecDeps,
        attempt: &DelegatedAttempt<'_>,
    ) -> impl Future<Output = Result<(), ExecError>> + Send {
        let _ = (deps, attempt);
        async { Ok(()) }
    }
}

#[cfg(feature = "worker")]
/// Runs the executor the task's catalog entry names.
pub async fn run(deps: &ExecDeps, job: Job<'_>) -> Result<Value, ExecError> {
    job.spec.executor.run(deps, &job).await
}

#[cfg(feature = "worker")]
/// Tells the service of `attempt`, a delegated attempt of a task of kind
/// `spec`, that its buyer canceled it.
pub async fn cancel(deps: &ExecDeps, spec: &TaskSpec, attempt: &DelegatedAttempt<'_>) -> Result<(), ExecError> {
    spec.executor.cancel(deps, attempt).await
}

#[cfg(feature = "worker")]
/// The string field `name` of the input, or `invalid_input`.
fn input_str<'v>(input: &'v Value, name: &str) -> Result<&'v str, ExecError> {
    input
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ExecError::permanent(codes::INVALID_INPUT, format!("input.{name} must be a string")))
}

#[cfg(feature = "worker")]
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
#[cfg(all(test, feature = "worker"))]
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest: [u8; 32] = sha2::Sha256::digest(bytes).into();
    hex::encode(digest)
}

#[cfg(test)]
mod report_tests {
    use super::*;

    #[test]
    fn progress_reports_carry_their_detail_and_a_rounded_fraction() {
        let (progress, kind, data) =
            report_event(&Report::Progress { fraction: 0.3, detail: json!({"bytes": 3, "total": 10}) }).unwrap();
        assert_eq!(progress, Some(0.3));
        assert_eq!(kind, EventType::Progress);
        assert_eq!(data, json!({"fraction": 0.3, "bytes": 3, "total": 10}));

        let (progress, _, data) = report_event(&Report::Progress { fraction: 7.0, detail: json!("x") }).unwrap();
        assert_eq!(progress, Some(1.0));
        assert_eq!(data, json!({"fraction": 1.0, "detail": "x"}));
        assert!(report_event(&Report::Progress { fraction: f32::NAN, detail: Value::Null }).is_none());

        let (progress, kind, data) = report_event(&Report::Log { line: "hi".into() }).unwrap();
        assert_eq!((progress, kind, data), (None, EventType::Log, json!({"line": "hi"})));
    }
}
