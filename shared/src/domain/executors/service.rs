//! Reports from a service that accepted a job (docs/executors.md, "Reports"):
//! `POST /v1/executor/reports` with a report token, one report per call.
//!
//! Each report is applied in one transaction that first locks its task, so
//! that it is fenced on the attempt its token names and ordered with every
//! other write: a later attempt makes it `superseded`, a cancel asked for
//! `canceled` (and ends the task, fenced), an end already recorded `ended`.
//! A report's row (`executor_reports`, by the id the service chose) is
//! written in the same transaction as its effect, with its answer: the
//! same report sent again answers that, and does nothing more.
//!
//! The effects are the worker's own writes, not a copy of them: progress
//! and log lines become events through `tasks::events::running_event`, a
//! metered task's through [`super::recorded`] (only what the executor
//! discloses is shown; the rest is held with the attempt until the
//! capture); the end goes through [`transition`]. A metered result is not
//! captured here: it is held with the authorization as the worker holds a
//! finished run before its capture, and the task queued for a worker to
//! resume the capture (the held path of `adapters/worker/metered.rs`).

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Executor, Recorded, Report, recorded};
use crate::domain::auth::SpaceIndex;
use crate::domain::auth::{ReportToken, ReportTokenError, Secret, verify_report_token};
use crate::domain::catalog::Catalog;
use crate::domain::error::{ErrorKind, Refusal, Wording};
use crate::domain::ids::Id;
use crate::domain::payments::{Held, HeldReport, Hold, MeteredAuthorization};
use crate::domain::tasks::events::{Event, EventType, Publisher, running_event};
use crate::domain::tasks::output::{LINK_LIFETIME, MAX_FILE_NAME_CHARS, files_prefix, object_expiry, valid_file_name};
use crate::domain::tasks::{Change, Fence, RETRIES_EXHAUSTED, TaskStatus, task_error, transition_in};
use crate::domain::uploads::{WrittenObject, presign_put, written_object};

/// The stable code of a task its service failed for good.
pub const EXECUTOR_FAILED: &str = "executor_failed";
/// The most a `result` may weigh, as JSON.
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;
/// The longest `message` of a progress or failure report.
const MAX_MESSAGE_CHARS: usize = 500;
/// The longest log line.
const MAX_LINE_CHARS: usize = 2_000;
/// At most this many reports are held for one metered attempt, as the
/// worker holds at most as many (`adapters/worker/reports.rs`).
const HELD_REPORTS_MAX: i64 = 1_000;
/// The first wait before the next attempt after a retryable failure that
/// asked for none, tripled per attempt (the worker's default backoff).
const FIRST_RETRY: Duration = Duration::from_secs(5);
/// The longest SQS may delay a message: the most a retryable failure waits.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(900);

/// Why a report was refused. Every one is the service's to act on, and
/// none names anything of Reeve's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportRefusal {
    /// The report is malformed: the message names the field.
    #[error("invalid report: {0}")]
    Invalid(String),
    /// No token, or a forged or expired one.
    #[error("invalid report token")]
    Token,
    /// The attempt is no longer the task's: another one runs.
    #[error("the attempt was superseded")]
    Superseded,
    /// The buyer canceled the task.
    #[error("the task was canceled")]
    Canceled,
    /// The attempt already ended (a result or a failure was recorded).
    #[error("the attempt already ended")]
    Ended,
    /// The report (a result) is over its limit.
    #[error("the report is too large")]
    TooLarge,
    /// The declared output is over the size limit (`max` bytes), or the
    /// attempt already declared [`MAX_OUTPUTS`] others.
    #[error("the output is too large")]
    OutputTooLarge { max: u64 },
}

impl ReportRefusal {
    pub const INVALID: &'static str = "invalid_report";
    pub const TOKEN: &'static str = "invalid_report_token";
    pub const SUPERSEDED: &'static str = "superseded";
    pub const CANCELED: &'static str = "canceled";
    pub const ENDED: &'static str = "ended";
    pub const TOO_LARGE: &'static str = "too_large";
}

impl Refusal for ReportRefusal {
    fn code(&self) -> &'static str {
        match self {
            ReportRefusal::Invalid(_) => Self::INVALID,
            ReportRefusal::Token => Self::TOKEN,
            ReportRefusal::Superseded => Self::SUPERSEDED,
            ReportRefusal::Canceled => Self::CANCELED,
            ReportRefusal::Ended => Self::ENDED,
            ReportRefusal::TooLarge | ReportRefusal::OutputTooLarge { .. } => Self::TOO_LARGE,
        }
    }
    fn kind(&self) -> ErrorKind {
        match self {
            ReportRefusal::Invalid(_) | ReportRefusal::TooLarge | ReportRefusal::OutputTooLarge { .. } => {
                ErrorKind::Input
            }
            ReportRefusal::Token => ErrorKind::Auth,
            ReportRefusal::Superseded | ReportRefusal::Canceled | ReportRefusal::Ended => ErrorKind::Conflict,
        }
    }
    fn message(&self, _: &Wording) -> String {
        match self {
            ReportRefusal::Invalid(why) => format!("the report is malformed: {why}"),
            ReportRefusal::Token => "the report token is missing, forged or expired".into(),
            ReportRefusal::Superseded => "this attempt is no longer the task's: another one runs; stop".into(),
            ReportRefusal::Canceled => "the buyer canceled the task; stop".into(),
            ReportRefusal::Ended => "this attempt already ended".into(),
            ReportRefusal::TooLarge => format!("the result is over {MAX_RESULT_BYTES} bytes"),
            ReportRefusal::OutputTooLarge { max } => {
                format!("an output may be at most {max} bytes, and an attempt may write at most {MAX_OUTPUTS} files")
            }
        }
    }
}

/// A report, as the service sends it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServiceReport {
    Heartbeat,
    Progress {
        fraction: f64,
        #[serde(default)]
        message: Option<String>,
    },
    Log {
        line: String,
    },
    Usage {
        used: u64,
    },
    Output {
        name: String,
        size: u64,
        content_type: String,
        /// The file's SHA-256, hex: its PUT is bound to it, so the bucket
        /// keeps only a body that hashes to it, and the receipt proves it.
        sha256: String,
    },
    Result {
        result: Value,
        #[serde(default)]
        used: Option<u64>,
    },
    Failure {
        retryable: bool,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        retry_after_seconds: Option<u64>,
    },
}

impl ServiceReport {
    fn name(&self) -> &'static str {
        match self {
            ServiceReport::Heartbeat => "heartbeat",
            ServiceReport::Progress { .. } => "progress",
            ServiceReport::Log { .. } => "log",
            ServiceReport::Usage { .. } => "usage",
            ServiceReport::Output { .. } => "output",
            ServiceReport::Result { .. } => "result",
            ServiceReport::Failure { .. } => "failure",
        }
    }

    fn ends(&self) -> bool {
        matches!(self, ServiceReport::Result { .. } | ServiceReport::Failure { .. })
    }
}

/// A report's id and what it says, read from its JSON body; every problem
/// named by its field.
pub fn parse(body: &[u8]) -> Result<(String, ServiceReport), ReportRefusal> {
    let invalid = |why: String| ReportRefusal::Invalid(why);
    let mut value: serde_json::Map<String, Value> =
        serde_json::from_slice(body).map_err(|e| invalid(format!("the body is not a JSON object ({e})")))?;
    let id = match value.remove("id") {
        Some(Value::String(id)) if valid_id(&id) => id,
        Some(_) => return Err(invalid("id must be 1 to 64 characters of A-Z a-z 0-9 _ . : -".into())),
        None => return Err(invalid("id is missing".into())),
    };
    let report: ServiceReport = serde_json::from_value(Value::Object(value)).map_err(|e| invalid(e.to_string()))?;
    match &report {
        ServiceReport::Progress { fraction, message } => {
            if !(0.0..=1.0).contains(fraction) {
                return Err(invalid("fraction must be from 0 to 1".into()));
            }
            if message.as_ref().is_some_and(|m| m.chars().count() > MAX_MESSAGE_CHARS) {
                return Err(invalid(format!("message is over {MAX_MESSAGE_CHARS} characters")));
            }
        }
        ServiceReport::Log { line } if line.chars().count() > MAX_LINE_CHARS => {
            return Err(invalid(format!("line is over {MAX_LINE_CHARS} characters")));
        }
        ServiceReport::Result { result, .. } => {
            if !result.is_object() {
                return Err(invalid("result must be a JSON object".into()));
            }
            if serde_json::to_vec(result).map_or(0, |r| r.len()) > MAX_RESULT_BYTES {
                return Err(ReportRefusal::TooLarge);
            }
        }
        ServiceReport::Output { name, content_type, sha256, .. } => {
            if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid("sha256 must be the file's SHA-256, 64 hex digits".into()));
            }
            if !valid_file_name(name) {
                return Err(invalid(format!(
                    "name must be 1 to {MAX_FILE_NAME_CHARS} characters of A-Z a-z 0-9 . _ -, and not . or .."
                )));
            }
            if !valid_content_type(content_type) {
                return Err(invalid("content_type must be a media type, type/subtype".into()));
            }
        }
        ServiceReport::Failure { message, .. }
            if message.as_ref().is_some_and(|m| m.chars().count() > MAX_MESSAGE_CHARS) =>
        {
            return Err(invalid(format!("message is over {MAX_MESSAGE_CHARS} characters")));
        }
        _ => {}
    }
    Ok((id, report))
}

/// `type/subtype` (parameters allowed), printable ASCII, at most 255.
fn valid_content_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    (3..=255).contains(&content_type.len())
        && content_type.chars().all(|c| c.is_ascii_graphic() || c == ' ')
        && essence.split_once('/').is_some_and(|(t, s)| !t.is_empty() && !s.is_empty() && !s.contains('/'))
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.chars().all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
}

/// The report token of an `Authorization: Bearer` value, verified now.
pub fn token(key: &Secret, bearer: Option<&str>) -> Result<ReportToken, ReportRefusal> {
    let bearer = bearer.ok_or(ReportRefusal::Token)?;
    verify_report_token(key, bearer, OffsetDateTime::now_utc()).map_err(|e: ReportTokenError| {
        tracing::info!(error = %e, "report token refused");
        ReportRefusal::Token
    })
}

/// What the report route works with.
pub struct Reports<'a> {
    pub db: &'a PgPool,
    pub events: &'a Publisher,
    pub catalog: &'a Catalog,
    /// An attempt's lease, as the worker holds it (`REEVE_LEASE_SECONDS`):
    /// what each report renews, never past the attempt's deadline.
    pub lease: Duration,
    /// The attempts a task may have (`REEVE_MAX_RECEIVES`), as the worker counts them.
    pub max_attempts: u32,
    /// The bucket a service's output files are written to, checked in (a
    /// HEAD of each at the result).
    pub s3: &'a crate::infra::s3_objects::S3Objects,
    pub bucket: &'a str,
    /// The largest output file: the catalog's `[uploads]` `max_bytes`, as
    /// the deployment caps it.
    pub max_output_bytes: u64,
    /// How many days the bucket keeps `outputs/`, if known: each output
    /// file's `object_expires_at`.
    pub output_retention_days: Option<u32>,
}

/// What the route does after the answer is committed: nothing, or queue
/// the task (for its next attempt, or for a worker to resume a metered
/// capture), after `delay`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Then {
    Nothing,
    Enqueue { kind: String, delay: Duration },
}

/// The answer to one report: its JSON, and what follows it.
#[derive(Debug)]
pub struct Answered {
    pub body: Value,
    pub then: Then,
    /// An `output` report's: the PUT to sign as its answer (see [`sign_output`]).
    pub output: Option<OutputPut>,
}

/// The most output files one attempt may declare.
pub const MAX_OUTPUTS: usize = 100;

/// An output file a service declared: what its presigned PUT is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPut {
    pub key: String,
    pub size: u64,
    pub content_type: String,
    /// The body's SHA-256, hex (lower case).
    pub sha256: String,
    /// The attempt's deadline: the link dies at it, if not sooner.
    pub deadline: OffsetDateTime,
}

/// The answer to an `output` report: `{url, method: "PUT", headers,
/// expires_at}`, a PUT of exactly the declared size, type and SHA-256
/// (`x-amz-checksum-sha256`: the bucket refuses a body that does not hash
/// to it, and keeps it for [`with_outputs`] to read back), valid until
/// the attempt's deadline or for [`LINK_LIFETIME`] (the bucket's largest
/// signature age), whichever is sooner. Signed anew each time the report
/// is answered: no signed URL is stored.
pub async fn sign_output(
    s3: &crate::infra::s3_objects::S3Objects,
    bucket: &str,
    put: &OutputPut,
) -> Result<Value, String> {
    let left = put.deadline - OffsetDateTime::now_utc();
    let lifetime = Duration::try_from(left).unwrap_or_default().min(LINK_LIFETIME).max(Duration::from_secs(1));
    let size = i64::try_from(put.size).map_err(|_| "size is out of range".to_owned())?;
    let signed = presign_put(s3, bucket, &put.key, size, &put.content_type, Some(&put.sha256), lifetime).await?;
    let expires_at = signed.expires_at.format(&Rfc3339).unwrap_or_default();
    Ok(json!({ "url": signed.url, "method": signed.method, "headers": signed.headers, "expires_at": expires_at }))
}

/// The output file a stored `output` answer recorded.
fn recorded_output(answer: &Value, space: &SpaceIndex, task: Id, deadline: OffsetDateTime) -> Option<OutputPut> {
    let output = answer.get("output")?;
    let name = output.get("name")?.as_str().filter(|n| valid_file_name(n))?;
    Some(OutputPut {
        key: format!("{}{name}", files_prefix(space, task)),
        size: output.get("size")?.as_u64()?,
        content_type: output.get("content_type")?.as_str()?.to_owned(),
        sha256: output.get("sha256")?.as_str()?.to_owned(),
        deadline,
    })
}

/// Applies one report on the attempt `token` names; see the module
/// documentation. `Err(Ok(_))`: refused; `Err(Err(_))`: the database.
pub async fn apply(
    r: &Reports<'_>,
    token: &ReportToken,
    id: &str,
    report: &ServiceReport,
) -> Result<Answered, Result<ReportRefusal, sqlx::Error>> {
    let task = Id::from_bytes(&token.task).map_err(|_| Ok(ReportRefusal::Token))?;
    // Read before the transaction, not beside it: a second connection taken
    // while this one holds the task's row made concurrent reports starve
    // the pool (eight at once, on `reeve serve`'s eight connections, all
    // answered 503 after the acquire timeout in the `service` benchmark).
    let metered = MeteredAuthorization::of(r.db, task).await.map_err(Err)?;
    let mut tx = r.db.begin().await.map_err(Err)?;
    let row: Option<(Vec<u8>, String, String, i32, bool)> = sqlx::query_as(
        "SELECT space_idx, kind, status, attempts, cancel_requested_at IS NOT NULL FROM tasks WHERE id = $1 FOR UPDATE",
    )
    .bind(task)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Err)?;
    // A task that is gone ended, whatever it was.
    let Some((space, kind, status, attempts, cancel_asked)) = row else { return Err(Ok(ReportRefusal::Ended)) };
    if space != token.space.as_bytes() {
        return Err(Ok(ReportRefusal::Token));
    }
    // The same report again: what it answered, and nothing more.
    let stored: Option<sqlx::types::Json<Value>> = sqlx::query_scalar(
        "SELECT answer FROM executor_reports WHERE task_id = $1 AND attempt = $2 AND report_id = $3",
    )
    .bind(task)
    .bind(token.attempt)
    .bind(id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(Err)?;
    let space = &token.space;
    if let Some(answer) = stored {
        let output = recorded_output(&answer.0, space, task, token.expires_at);
        return Ok(Answered { body: answer.0, then: Then::Nothing, output });
    }
    let status = TaskStatus::parse(&status).unwrap_or(TaskStatus::Failed);
    if attempts != token.attempt {
        return Err(Ok(ReportRefusal::Superseded));
    }
    if status == TaskStatus::Canceled {
        return Err(Ok(ReportRefusal::Canceled));
    }
    if status != TaskStatus::Running || ended(&mut tx, task, token.attempt).await.map_err(Err)? {
        return Err(Ok(ReportRefusal::Ended));
    }
    let events = Vec::new();
    let mut done = Done { events, then: Then::Nothing };
    if cancel_asked {
        // The buyer asked: the attempt ends here, as a worker's run ends
        // when it sees the request, fenced on it.
        let events = transition_in(&mut tx, task, Fence::Run(token.attempt), Change::Cancel).await.map_err(Err)?;
        tx.commit().await.map_err(Err)?;
        r.events.publish_all(task, events.as_deref().unwrap_or_default()).await;
        return Err(Ok(ReportRefusal::Canceled));
    }
    let spec = r.catalog.task(&kind);
    let metered_executor = metered.as_ref().and(spec).map(|spec| &spec.executor);
    let run = Run { task, attempt: token.attempt, deadline: token.expires_at };
    let mut held: Option<Value> = None;
    let body = match report {
        ServiceReport::Heartbeat => {
            renew(&mut tx, &run, r.lease).await.map_err(Err)?;
            json!({ "recorded": true })
        }
        ServiceReport::Progress { fraction, message } => {
            let detail = message.as_ref().map_or(Value::Null, |m| json!({ "message": m }));
            let report = Report::Progress { fraction: *fraction as f32, detail };
            held = record(&mut tx, &run, &report, metered_executor, &mut done).await.map_err(Err)?;
            renew(&mut tx, &run, r.lease).await.map_err(Err)?;
            json!({ "recorded": true })
        }
        ServiceReport::Log { line } => {
            let report = Report::Log { line: line.clone() };
            held = record(&mut tx, &run, &report, metered_executor, &mut done).await.map_err(Err)?;
            renew(&mut tx, &run, r.lease).await.map_err(Err)?;
            json!({ "recorded": true })
        }
        ServiceReport::Usage { used } => {
            renew(&mut tx, &run, r.lease).await.map_err(Err)?;
            // Recorded capped at what the authorization pays for.
            let used = capped(*used, metered.as_ref());
            json!({ "recorded": true, "used": used })
        }
        ServiceReport::Output { name, size, content_type, sha256 } => {
            if *size > r.max_output_bytes {
                return Err(Ok(ReportRefusal::OutputTooLarge { max: r.max_output_bytes }));
            }
            let declared = declared_outputs(&mut tx, &run).await.map_err(Err)?;
            if declared.len() >= MAX_OUTPUTS && !declared.iter().any(|o| o["name"] == json!(name)) {
                return Err(Ok(ReportRefusal::OutputTooLarge { max: r.max_output_bytes }));
            }
            renew(&mut tx, &run, r.lease).await.map_err(Err)?;
            let content_type = content_type.trim().to_ascii_lowercase();
            let sha256 = sha256.to_ascii_lowercase();
            let output = json!({ "name": name, "size": size, "content_type": content_type, "sha256": sha256 });
            json!({ "recorded": true, "output": output })
        }
        ServiceReport::Result { result, used } => {
            let result = &with_outputs(r, &mut tx, &run, space, result.clone()).await.map_err(Err)?;
            match (&metered, spec) {
                (Some(auth), Some(_)) => {
                    let used = match used {
                        Some(used) => capped(*used, Some(auth)),
                        None => last_usage(&mut tx, &run).await.map_err(Err)?,
                    };
                    let reports = held_reports(&mut tx, &run).await.map_err(Err)?;
                    // Reported in the kind's unit; held in what it measures.
                    let base =
                        spec.and_then(|s| s.accepts.iter().find_map(|p| p.meter.as_ref())).map_or(1, |m| m.unit.base());
                    let run_held = Held { result: result.clone(), used: used.saturating_mul(base), reports };
                    match auth.hold_for_capture(&mut tx, task, &run_held).await.map_err(Err)? {
                        None => return Err(Ok(ReportRefusal::Ended)),
                        Some(Hold::Held) => {
                            // Back to the queue, as the worker puts a task whose
                            // capture is open: the worker that claims it only
                            // resumes the capture and delivers this result (and
                            // the sweeper re-sends it if the message is lost).
                            let line = format!(
                                "attempt {} finished and its payment is being settled; the task is not run again",
                                run.attempt
                            );
                            let change = Change::Requeue { line: &line, due: None };
                            let events =
                                transition_in(&mut tx, task, Fence::Run(run.attempt), change).await.map_err(Err)?;
                            done.events.extend(events.ok_or(Ok(ReportRefusal::Ended))?);
                            done.then = Then::Enqueue { kind: kind.clone(), delay: Duration::ZERO };
                        }
                        Some(Hold::Released(payment)) => {
                            let held: Vec<(EventType, Value)> = run_held
                                .reports
                                .iter()
                                .filter_map(|r| Some((EventType::parse(&r.kind)?, r.data.clone())))
                                .collect();
                            let change = Change::Complete { result, payment: Some(&payment), held: &held };
                            let events =
                                transition_in(&mut tx, task, Fence::Run(run.attempt), change).await.map_err(Err)?;
                            done.events.extend(events.ok_or(Ok(ReportRefusal::Ended))?);
                        }
                    }
                    json!({ "recorded": true, "used": used })
                }
                _ => {
                    let change = Change::Complete { result, payment: None, held: &[] };
                    let events = transition_in(&mut tx, task, Fence::Run(run.attempt), change).await.map_err(Err)?;
                    done.events.extend(events.ok_or(Ok(ReportRefusal::Ended))?);
                    json!({ "recorded": true })
                }
            }
        }
        ServiceReport::Failure { retryable: false, message, .. } => {
            let shown =
                message.as_deref().filter(|m| !m.trim().is_empty()).unwrap_or("the service could not do the task");
            let error = task_error(EXECUTOR_FAILED, shown);
            let events = transition_in(&mut tx, task, Fence::Run(run.attempt), Change::Fail { error: &error })
                .await
                .map_err(Err)?;
            done.events.extend(events.ok_or(Ok(ReportRefusal::Ended))?);
            json!({ "recorded": true })
        }
        ServiceReport::Failure { retryable: true, retry_after_seconds, .. } => {
            // The worker's `retry_later`: out of attempts it fails for good,
            // otherwise back to `queued`, due after the wait.
            if run.attempt >= r.max_attempts as i32 {
                let message =
                    format!("gave up after {} attempts; the last one failed: a temporary problem", run.attempt);
                let error = task_error(RETRIES_EXHAUSTED, &message);
                let events = transition_in(&mut tx, task, Fence::Run(run.attempt), Change::Fail { error: &error })
                    .await
                    .map_err(Err)?;
                done.events.extend(events.ok_or(Ok(ReportRefusal::Ended))?);
            } else {
                let after = retry_delay(run.attempt, *retry_after_seconds);
                let due = OffsetDateTime::now_utc() + after;
                let shown_due = due.replace_nanosecond(0).unwrap_or(due).format(&Rfc3339).unwrap_or_default();
                let line = format!(
                    "attempt {} did not finish (a temporary problem); attempt {} is due in {} s, at {shown_due}",
                    run.attempt,
                    run.attempt + 1,
                    after.as_secs()
                );
                let change = Change::Requeue { line: &line, due: Some(due) };
                let events = transition_in(&mut tx, task, Fence::Run(run.attempt), change).await.map_err(Err)?;
                done.events.extend(events.ok_or(Ok(ReportRefusal::Ended))?);
                done.then = Then::Enqueue { kind: kind.clone(), delay: after };
            }
            json!({ "recorded": true })
        }
    };
    sqlx::query(
        "INSERT INTO executor_reports (task_id, attempt, report_id, type, status, answer, held)
         VALUES ($1, $2, $3, $4, 200, $5, $6)",
    )
    .bind(task)
    .bind(run.attempt)
    .bind(id)
    .bind(report.name())
    .bind(sqlx::types::Json(&body))
    .bind(held.map(sqlx::types::Json))
    .execute(&mut *tx)
    .await
    .map_err(Err)?;
    tx.commit().await.map_err(Err)?;
    r.events.publish_all(task, &done.events).await;
    if report.ends() {
        tracing::info!(%task, attempt = run.attempt, report = report.name(), "the service ended its attempt");
    }
    let output = recorded_output(&body, space, task, run.deadline);
    Ok(Answered { body, then: done.then, output })
}

/// The attempt a report is on.
struct Run {
    task: Id,
    attempt: i32,
    /// Its token's expiry: no lease outlives it.
    deadline: OffsetDateTime,
}

/// What a report wrote, to publish once committed, and what follows.
struct Done {
    events: Vec<Event>,
    then: Then,
}

/// Whether the attempt's end was recorded already (a metered result held
/// for its capture leaves the task `running`).
async fn ended(conn: &mut PgConnection, task: Id, attempt: i32) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM executor_reports
                         WHERE task_id = $1 AND attempt = $2 AND type IN ('result', 'failure'))",
    )
    .bind(task)
    .bind(attempt)
    .fetch_one(conn)
    .await
}

/// Renews the attempt's lease: `lease` from now, never past its deadline.
async fn renew(conn: &mut PgConnection, run: &Run, lease: Duration) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE tasks SET lease_until = LEAST(now() + make_interval(secs => $3), $4)
          WHERE id = $1 AND status = 'running' AND attempts = $2",
    )
    .bind(run.task)
    .bind(run.attempt)
    .bind(lease.as_secs_f64())
    .bind(run.deadline)
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes a progress or log report as the worker writes its executor's:
/// an event now, or (a metered task's report that may carry its result)
/// returned to be held with the report's row.
async fn record(
    conn: &mut PgConnection,
    run: &Run,
    report: &Report,
    metered: Option<&Executor>,
    done: &mut Done,
) -> Result<Option<Value>, sqlx::Error> {
    match recorded(report, metered) {
        Recorded::Shown { progress, kind, data } => {
            if let Some(event) = running_event(&mut *conn, run.task, run.attempt, progress, kind, &data).await? {
                done.events.push(event);
            }
            Ok(None)
        }
        Recorded::Held(held) => Ok(Some(json!({ "type": held.kind, "data": held.data }))),
        Recorded::Malformed => Ok(None),
    }
}

/// The reports held for the attempt, in the order they came (at most
/// [`HELD_REPORTS_MAX`], then a line saying how many more were dropped).
async fn held_reports(conn: &mut PgConnection, run: &Run) -> Result<Vec<HeldReport>, sqlx::Error> {
    let rows: Vec<sqlx::types::Json<HeldReport>> = sqlx::query_scalar(
        "SELECT held FROM executor_reports WHERE task_id = $1 AND attempt = $2 AND held IS NOT NULL
          ORDER BY at, report_id LIMIT $3",
    )
    .bind(run.task)
    .bind(run.attempt)
    .bind(HELD_REPORTS_MAX)
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM executor_reports WHERE task_id = $1 AND attempt = $2 AND held IS NOT NULL",
    )
    .bind(run.task)
    .bind(run.attempt)
    .fetch_one(conn)
    .await?;
    let mut held: Vec<HeldReport> = rows.into_iter().map(|r| r.0).collect();
    if total > HELD_REPORTS_MAX {
        let line = format!(
            "{} more reports of this run were dropped (at most {HELD_REPORTS_MAX} are kept)",
            total - HELD_REPORTS_MAX
        );
        held.push(HeldReport { kind: EventType::Log.as_str().to_owned(), data: json!({ "line": line }) });
    }
    Ok(held)
}

/// The output files the attempt declared, each once (the last declaration
/// of a name wins), in the order they were first declared.
async fn declared_outputs(conn: &mut PgConnection, run: &Run) -> Result<Vec<Value>, sqlx::Error> {
    let rows: Vec<sqlx::types::Json<Value>> = sqlx::query_scalar(
        "SELECT answer->'output' FROM executor_reports
          WHERE task_id = $1 AND attempt = $2 AND type = 'output' ORDER BY at, report_id",
    )
    .bind(run.task)
    .bind(run.attempt)
    .fetch_all(conn)
    .await?;
    let mut outputs: Vec<Value> = Vec::new();
    for row in rows {
        match outputs.iter_mut().find(|o| o["name"] == row.0["name"]) {
            Some(seen) => *seen = row.0,
            None => outputs.push(row.0),
        }
    }
    Ok(outputs)
}

/// The service's result with the output files it wrote: `outputs`, each
/// `{name, size, content_type, sha256, key}` under the task's own `files/`
/// prefix (Reeve's, replacing any `outputs` of the service's own). Each
/// declared file is looked for: one never written is left out, and a size
/// is the object's. `sha256` is the digest the bucket verified the body
/// against as it was written (its PUT was bound to one), read back from
/// the object, not what the service declared: should two declarations of
/// a name differ, it is the one of the bytes stored, which the receipt
/// then proves. A file that cannot be looked for (storage unreachable) is
/// listed as declared, without a `sha256`; its link fails if it is not
/// there.
async fn with_outputs(
    r: &Reports<'_>,
    conn: &mut PgConnection,
    run: &Run,
    space: &SpaceIndex,
    mut result: Value,
) -> Result<Value, sqlx::Error> {
    let declared = declared_outputs(conn, run).await?;
    if declared.is_empty() {
        return Ok(result);
    }
    let prefix = files_prefix(space, run.task);
    let mut outputs = Vec::with_capacity(declared.len());
    for mut output in declared {
        let Some(name) = output["name"].as_str().filter(|n| valid_file_name(n)).map(str::to_owned) else { continue };
        let key = format!("{prefix}{name}");
        let declared_sha256 = output.as_object_mut().and_then(|o| o.remove("sha256"));
        match written_object(r.s3, r.bucket, &key).await {
            Ok(Some(WrittenObject { size, written, sha256 })) => {
                output["size"] = json!(size);
                match sha256 {
                    Some(sha256) => output["sha256"] = json!(sha256),
                    None => {
                        tracing::warn!(task = %run.task, name, ?declared_sha256, "an output has no SHA-256 in storage")
                    }
                }
                // The bucket's lifecycle counts from when the file was written.
                if let Some(days) = r.output_retention_days {
                    let expires = object_expiry(written.unwrap_or_else(OffsetDateTime::now_utc), days);
                    output["object_expires_at"] = json!(expires.format(&Rfc3339).ok());
                }
            }
            Ok(None) => {
                tracing::info!(task = %run.task, name, "a declared output was never written; it is not listed");
                continue;
            }
            Err(e) => tracing::warn!(error = %e, task = %run.task, "could not look for an output; listed as declared"),
        }
        output["key"] = json!(key);
        outputs.push(output);
    }
    if let Some(object) = result.as_object_mut() {
        object.insert("outputs".into(), Value::Array(outputs));
    }
    Ok(result)
}

/// `used`, at most the units a metered task's authorization pays for (its
/// ceiling over the rate): usage above it is neither recorded nor charged.
fn capped(used: u64, auth: Option<&MeteredAuthorization>) -> u64 {
    auth.and_then(MeteredAuthorization::ceiling_units).map_or(used, |ceiling| used.min(ceiling))
}

/// The most recent `usage` the attempt reported: what a result without
/// its own `used` is charged for.
async fn last_usage(conn: &mut PgConnection, run: &Run) -> Result<u64, sqlx::Error> {
    let used: Option<i64> = sqlx::query_scalar(
        "SELECT max((answer->>'used')::int8) FROM executor_reports
          WHERE task_id = $1 AND attempt = $2 AND type = 'usage'",
    )
    .bind(run.task)
    .bind(run.attempt)
    .fetch_one(conn)
    .await?;
    Ok(used.and_then(|u| u64::try_from(u).ok()).unwrap_or(0))
}

/// The wait before the next attempt: what the service asked, else 5 s,
/// 15 s, 45 s… as the worker's default backoff; at most what SQS can delay.
fn retry_delay(attempt: i32, asked: Option<u64>) -> Duration {
    let default = FIRST_RETRY.saturating_mul(3u32.saturating_pow(attempt.saturating_sub(1).max(0) as u32));
    asked.map_or(default, Duration::from_secs).min(MAX_RETRY_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_read_with_their_field_named() {
        let (id, report) = parse(br#"{"id":"r-1","type":"progress","fraction":0.5,"message":"half"}"#).unwrap();
        assert_eq!(id, "r-1");
        assert_eq!(report, ServiceReport::Progress { fraction: 0.5, message: Some("half".into()) });
        let refused = |body: &str| parse(body.as_bytes()).unwrap_err();
        assert_eq!(refused(r#"{"type":"heartbeat"}"#), ReportRefusal::Invalid("id is missing".into()));
        assert!(
            matches!(refused(r#"{"id":"a b","type":"heartbeat"}"#), ReportRefusal::Invalid(m) if m.starts_with("id must"))
        );
        assert!(
            matches!(refused(r#"{"id":"a","type":"progress","fraction":2}"#), ReportRefusal::Invalid(m) if m.contains("fraction"))
        );
        assert!(
            matches!(refused(r#"{"id":"a","type":"nap"}"#), ReportRefusal::Invalid(m) if m.contains("unknown variant"))
        );
        assert!(
            matches!(refused(r#"{"id":"a","type":"result","result":1}"#), ReportRefusal::Invalid(m) if m.contains("object"))
        );
        let big = format!(r#"{{"id":"a","type":"result","result":{{"x":"{}"}}}}"#, "x".repeat(MAX_RESULT_BYTES));
        assert_eq!(refused(&big), ReportRefusal::TooLarge);
    }

    #[test]
    fn a_retry_waits_what_was_asked_or_the_backoff_within_what_sqs_can_delay() {
        assert_eq!(retry_delay(1, None), Duration::from_secs(5));
        assert_eq!(retry_delay(3, None), Duration::from_secs(45));
        assert_eq!(retry_delay(2, Some(7)), Duration::from_secs(7));
        assert_eq!(retry_delay(2, Some(100_000)), MAX_RETRY_DELAY);
        assert_eq!(retry_delay(30, None), MAX_RETRY_DELAY);
    }
}
