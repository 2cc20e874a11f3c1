//! Tasks (docs/architecture.md#data-model, docs/architecture.md#queue-and-worker): creating them with idempotency, queueing them,
//! failing them, and reading them back for their space.
//!
//! Module map:
//! - [`input`]: schema violations, the uploads an input names, the request hash.
//! - [`events`]: the durable event log and [`append_event`].
//! - [`queue`]: the SQS message that hands a task to the worker.
//! - [`transition`]: the one fenced status change (conditional `UPDATE` plus
//!   its events, in one statement; with a credit it leaves, in one
//!   transaction) that every writer after create uses.
//! - [`cancel`]: cancel now (`queued`) or ask the worker (`running`).
//! - [`bulk`]: a filter of tasks, canceled by their owner or an operator,
//!   or run again by an operator.
//! - [`list`]: a space's tasks, newest first, with a cursor.
//! - [`submit`]: creating a task end to end: input, uploads, payment or
//!   credit, store, queue.
//! - [`quota`]: the ceilings on a free task per space, checked as it is stored.
//! - [`output`]: a stored output's download link, signed when it is read.
//! - [`receipt`]: a paid task's receipt, signed with the seller's key.
//! - [`fairness`]: at most `running_per_space` of a Space's tasks run at
//!   once; the others wait parked, with their reason, and are woken.
//!
//! Status moves `queued → running → completed | failed | canceled`, and every
//! transition is a conditional `UPDATE … WHERE status = …`.

pub(crate) mod events;
pub mod fairness;
#[cfg(feature = "catalog")]
pub(crate) mod input;
#[cfg(feature = "s3-objects")]
pub mod output;
pub(crate) mod queue;
#[cfg(feature = "api-task-status")]
pub mod receipt;
#[cfg(feature = "api-tasks")]
pub(crate) mod submit;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

pub use events::{Event, EventType, Publisher, append_event, channel, events_after, running_event};
pub use fairness::{RUNNING_PER_SPACE, Slots};
#[cfg(feature = "s3-objects")]
pub use output::{OutputLinks, output_key};
pub use queue::{QueueError, QueueMessage};
#[cfg(feature = "sqs")]
pub use queue::{enqueue, enqueue_after};
#[cfg(feature = "api-task-status")]
pub use quota::{AT_ONCE_RETRY, Limit, QuotaExceeded, QuotaUse, Used};
#[cfg(feature = "api-task-status")]
pub use receipt::{NoReceipt, ReceiptError, signed_receipt};
#[cfg(feature = "catalog")]
pub use shelf::Shelf;
#[cfg(feature = "api-tasks")]
pub use submit::{
    Paid, Submission, SubmitContext, SubmitError, Submitted, UploadProblem, challenge_for, deadline_of, submit,
};

use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
pub use crate::domain::request::TaskRequest;

/// Every delivery the queue allows ended in a retryable failure: the worker
/// fails a task with it on the last delivery, the sweeper one that has been
/// claimed as often without finishing.
pub const RETRIES_EXHAUSTED: &str = "retries_exhausted";

/// The queue's `maxReceiveCount` when `REEVE_MAX_RECEIVES` is unset: the
/// worker fails a task for good on that delivery, the sweeper one claimed
/// as often.
pub const DEFAULT_MAX_RECEIVES: u32 = 5;

/// Where a task is: `queued → running → completed | failed | canceled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    Queued,
    Running,
    Completed,
    Failed,
    Canceled,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => TaskStatus::Queued,
            "running" => TaskStatus::Running,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "canceled" => TaskStatus::Canceled,
            _ => return None,
        })
    }

    /// No transition leaves a terminal status.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Canceled)
    }
}

/// The `status` column as stored: a row with any other text is corrupt.
impl TryFrom<String> for TaskStatus {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        TaskStatus::parse(&s).ok_or_else(|| format!("unknown task status {s:?}"))
    }
}

/// A task as it is now.
// Its owner's view, and the one every client gets: `GET /v1/tasks/{id}`
// and the MCP task tools serialise it as is (the input is never repeated).
// Read from the columns of `task_columns!`. The field docs are the OpenAPI
// document's.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct Task {
    pub id: Id,
    pub kind: String,
    #[sqlx(try_from = "String")]
    pub status: TaskStatus,
    /// From 0 to 1.
    #[schema(minimum = 0, maximum = 1)]
    pub progress: f32,
    /// The executor's output, once `completed`. A stored output (`fetch`)
    /// comes with `url`, a download link signed as the task is read and
    /// valid until `url_expires_at` (15 minutes, or the object's expiry if
    /// sooner): read the task again for a new one. Once the bucket's
    /// retention has passed (`object_expires_at`), `url` is null and
    /// `expired` says so: `{"at", "message"}`. A service kind's result
    /// (docs/executors.md) lists the files its service wrote in `outputs`:
    /// `[{"name", "size", "content_type", "sha256", "key", "url",
    /// "url_expires_at"}]`, each `url` signed the same way, `sha256` the
    /// digest the bucket verified as the file was written
    /// (docs/executor-schemas/outputs.json).
    pub result: Option<Value>,
    /// What went wrong, once `failed`: `{"code", "message"}`.
    pub error: Option<Value>,
    /// How many times a worker has started the task.
    pub attempts: i32,
    /// Why a `queued` task is not running yet, when a worker found its
    /// Space at its limit of tasks running at once: `{"code":
    /// "running_per_space", "message", "limit"}`. It starts when one of
    /// them ends, and its wait counts no attempt. `null` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[sqlx(rename = "wait_reason")]
    pub waiting: Option<Value>,
    /// A metered task's payment (x402 `upto`): authorized up to a ceiling,
    /// then charged what it used with its transaction, or released with
    /// nothing charged. Absent for a free task and one paid a fixed price.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[sqlx(json(nullable))]
    pub payment: Option<crate::domain::payments::MeteredPayment>,
    /// When `POST /v1/tasks/{id}/cancel` asked a running task to stop;
    /// `null` otherwise. Its worker ends it `canceled` within a second; a
    /// service working on it alone is sent a cancel, and it ends at the
    /// service's next report (or once its lease lapses).
    #[serde(with = "time::serde::rfc3339::option")]
    pub cancel_requested_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// The columns a [`Task`] is read from, as a literal for `concat!`: sqlx
/// takes only `'static` SQL, never a string built at run time.
macro_rules! task_columns {
    () => {
        "id, kind, status, progress, result, error, attempts, wait_reason, payment, cancel_requested_at, created_at, \
         updated_at"
    };
}

// After `task_columns!`, which they use.
pub mod bulk;
pub(crate) mod cancel;
pub(crate) mod list;
#[cfg(feature = "catalog")]
pub(crate) mod shelf;
pub(crate) mod transition;

pub use cancel::{CancelOutcome, cancel, cancel_any, cancel_requested};
pub use list::{ListQuery, Page, list};
pub use transition::{Change, Fence, transition, transition_in};

#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// Stored now, `queued` with its first event: the caller must enqueue it.
    New(Task),
    /// The idempotency key was used before for this very request: the task
    /// made then, as it is now. It must not be enqueued again.
    Replayed(Task),
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The idempotency key was used before with another kind or input.
    #[error("idempotency key already used for a different request")]
    IdempotencyConflict,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

#[cfg(feature = "catalog")]
/// The task the request's idempotency key was first used for in its space:
/// `Ok(None)` if never (or the request has no key), `Ok(Some)` if for this
/// same `(kind, input)`, and `IdempotencyConflict` if for another request.
pub async fn find_by_idempotency_key(db: &PgPool, request: &TaskRequest<'_>) -> Result<Option<Task>, CreateError> {
    /// The task with the hash of the request that made it.
    #[derive(sqlx::FromRow)]
    struct Keyed {
        #[sqlx(flatten)]
        task: Task,
        request_hash: Option<Vec<u8>>,
    }
    let sql =
        concat!("SELECT ", task_columns!(), ", request_hash FROM tasks WHERE space_idx = $1 AND idempotency_key = $2");
    let Some(key) = request.idempotency_key else { return Ok(None) };
    let found = sqlx::query_as::<_, Keyed>(sql).bind(request.space.as_bytes()).bind(key).fetch_optional(db).await?;
    let Some(found) = found else { return Ok(None) };
    let hash = request.hash();
    // Not secret material: the hash of the caller's own request.
    if found.request_hash.as_deref() != Some(hash.as_slice()) {
        return Err(CreateError::IdempotencyConflict);
    }
    Ok(Some(found.task))
}

#[cfg(feature = "catalog")]
/// Stores a task as `queued` with its first event (`seq` 1,
/// `{"status":"queued"}`), in one statement.
///
/// With an idempotency key, a second request with the same key answers the
/// first one's task ([`Created::Replayed`]) or a conflict. Two concurrent
/// requests with one key are settled by the `UNIQUE (space_idx,
/// idempotency_key)` constraint: the loser's insert does nothing, and it
/// reads the winner's task once that has committed.
pub async fn create(db: &PgPool, new: TaskRequest<'_>) -> Result<Created, CreateError> {
    // A key whose task vanished between our insert and re-read (its space was
    // deleted) is simply free again: try once more.
    for _ in 0..3 {
        if let Some(task) = insert_queued(db, new).await? {
            return Ok(Created::New(task));
        }
        if let Some(task) = find_by_idempotency_key(db, &new).await? {
            return Ok(Created::Replayed(task));
        }
    }
    Err(CreateError::Db(sqlx::Error::RowNotFound))
}

#[cfg(feature = "catalog")]
/// The task `queued` and its first event, written by one statement: `task`
/// and `event` are its CTEs, and `$1`–`$6` are bound by [`bind_queued`].
/// `$gate` is the `FROM … WHERE …` that may hold the insert back (the free
/// quota's), or empty.
macro_rules! insert_queued_ctes {
    ($gate:literal) => {
        concat!(
            "task AS (
                 INSERT INTO tasks (id, space_idx, kind, input, idempotency_key, request_hash, last_seq)
                 SELECT $1, $2, $3, $4, $5, $6, 1 ",
            $gate,
            "
                 ON CONFLICT (space_idx, idempotency_key) DO NOTHING
                 RETURNING ",
            task_columns!(),
            "
             ), event AS (
                 INSERT INTO task_events (task_id, seq, type, data)
                 SELECT id, 1, 'status', '{\"status\": \"queued\"}' FROM task
             )"
        )
    };
}
// After `insert_queued_ctes!`, which it uses.
#[cfg(feature = "api-task-status")]
pub(crate) mod quota;

#[cfg(feature = "catalog")]
/// Binds `$1`–`$6` of [`insert_queued_ctes`] for `new`.
pub(crate) fn bind_queued<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    new: TaskRequest<'q>,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    query
        .bind(Id::new())
        .bind(new.space.as_bytes())
        .bind(new.kind)
        .bind(sqlx::types::Json(new.input))
        .bind(new.idempotency_key)
        .bind(new.hash().to_vec())
}

#[cfg(feature = "catalog")]
/// The insert of [`create`], alone or inside the caller's transaction: the
/// task `queued` with its first event. `None`: the idempotency key is taken
/// (by a committed task, or one whose transaction is still open and has now
/// won).
pub async fn insert_queued<'c>(
    db: impl sqlx::PgExecutor<'c>,
    new: TaskRequest<'_>,
) -> Result<Option<Task>, sqlx::Error> {
    let sql = concat!("WITH ", insert_queued_ctes!(""), " SELECT ", task_columns!(), " FROM task");
    let task = bind_queued(sqlx::query_as::<_, Task>(sql), new).fetch_optional(db).await?;
    if let Some(task) = &task {
        count_created(task);
    }
    Ok(task)
}

#[cfg(feature = "catalog")]
/// Counts a task [`insert_queued_ctes`] stored, as [`append_event`] counts a
/// status event it writes.
fn count_created(task: &Task) {
    crate::infra::metrics::task_status(&task.kind, 1, &json!({ "status": "queued" }));
}

/// The task `id` if it belongs to `space`. Someone else's task is `None`,
/// exactly like a missing one, so ids cannot be probed.
pub async fn find_for_space(db: &PgPool, space: &SpaceIndex, id: Id) -> Result<Option<Task>, sqlx::Error> {
    let sql = concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = $1 AND space_idx = $2");
    sqlx::query_as(sql).bind(id).bind(space.as_bytes()).fetch_optional(db).await
}

/// The `error` of a failed task.
pub fn task_error(code: &str, message: &str) -> Value {
    json!({ "code": code, "message": message })
}

/// Moves a task to `failed` with `error` (see [`task_error`]) if its status
/// is one of `from`, through [`transition`]: events `error`, then
/// `{"status":"failed","error":…}`, in one transaction. Returns the status
/// event (the error event is the one before it), or `None` when the task
/// was not in one of `from` (someone else moved it first) or does not exist.
pub async fn mark_failed(
    db: &PgPool,
    id: Id,
    from: &[TaskStatus],
    error: &Value,
) -> Result<Option<Event>, sqlx::Error> {
    let events = transition(db, id, Fence::From(from), Change::Fail { error }).await?;
    Ok(events.and_then(|mut events| events.pop()))
}
