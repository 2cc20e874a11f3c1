//! The one place a task's status changes after create: [`transition`], a
//! conditional `UPDATE` fenced on where the task must be, plus the events
//! the change causes, in one transaction. Create (a task it could not
//! queue), the worker (complete, fail, requeue, cancel) and the API's cancel
//! all go through it, so every terminal state is written the same way and
//! exactly one writer can win a race: the loser's `UPDATE` matches no row.
//!
//! The events are returned, committed, for the caller to publish.

use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::TaskStatus;
use super::events::{Event, EventType, append_event};
use crate::domain::ids::Id;

/// Where the task must be for the change to apply.
#[derive(Debug, Clone, Copy)]
pub enum Fence<'a> {
    /// In one of these statuses, whoever holds it.
    From(&'a [TaskStatus]),
    /// `running` under the claim whose fencing token (`attempts`) this is:
    /// a worker whose lease was taken over can no longer touch the task.
    Run(i32),
}

/// The change, with what it records.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// `→ completed` with the executor's result: events `result`, `status`.
    Complete { result: &'a Value },
    /// `→ failed` with `{"code","message"}` (see [`super::task_error`]):
    /// events `error`, `status` (carrying the error too).
    Fail { error: &'a Value },
    /// `→ queued` for another attempt, lease cleared and progress reset:
    /// events `log` (`line`, why), `status` (with `next_attempt_at`, when
    /// the next attempt is `due`, if known).
    Requeue { line: &'a str, due: Option<OffsetDateTime> },
    /// `→ canceled`: event `status`.
    Cancel,
}

impl Change<'_> {
    pub fn to(&self) -> TaskStatus {
        match self {
            Change::Complete { .. } => TaskStatus::Completed,
            Change::Fail { .. } => TaskStatus::Failed,
            Change::Requeue { .. } => TaskStatus::Queued,
            Change::Cancel => TaskStatus::Canceled,
        }
    }
}

/// The fence every change shares: `$1` id, `$2` statuses, `$3` attempt or NULL.
macro_rules! fenced {
    () => {
        " WHERE id = $1 AND status = ANY($2) AND ($3::int4 IS NULL OR attempts = $3)"
    };
}

/// Applies `change` if the task is inside `fence`, with its events, in one
/// transaction. `None`: the task was elsewhere (someone else moved it
/// first) or is gone, and nothing was written.
pub async fn transition(
    db: &PgPool,
    id: Id,
    fence: Fence<'_>,
    change: Change<'_>,
) -> Result<Option<Vec<Event>>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let events = transition_in(&mut tx, id, fence, change).await?;
    if events.is_some() {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(events)
}

/// [`transition`] inside a transaction the caller owns (and commits).
pub async fn transition_in(
    conn: &mut PgConnection,
    id: Id,
    fence: Fence<'_>,
    change: Change<'_>,
) -> Result<Option<Vec<Event>>, sqlx::Error> {
    let (from, attempt): (Vec<&str>, Option<i32>) = match fence {
        Fence::From(statuses) => (statuses.iter().map(|s| s.as_str()).collect(), None),
        Fence::Run(attempt) => (vec![TaskStatus::Running.as_str()], Some(attempt)),
    };
    let (sql, payload): (&'static str, Option<&Value>) = match change {
        Change::Complete { result } => (
            concat!(
                "UPDATE tasks SET status = 'completed', result = $4, progress = 1, lease_until = NULL, updated_at = now()",
                fenced!()
            ),
            Some(result),
        ),
        Change::Fail { error } => (
            concat!(
                "UPDATE tasks SET status = 'failed', error = $4, lease_until = NULL, updated_at = now()",
                fenced!()
            ),
            Some(error),
        ),
        Change::Requeue { .. } => (
            concat!(
                "UPDATE tasks SET status = 'queued', lease_until = NULL, progress = 0, updated_at = now()",
                fenced!()
            ),
            None,
        ),
        Change::Cancel => {
            (concat!("UPDATE tasks SET status = 'canceled', lease_until = NULL, updated_at = now()", fenced!()), None)
        }
    };
    let mut query = sqlx::query(sql).bind(id).bind(&from).bind(attempt);
    if let Some(payload) = payload {
        query = query.bind(sqlx::types::Json(payload));
    }
    if query.execute(&mut *conn).await?.rows_affected() == 0 {
        return Ok(None);
    }
    let status = change.to().as_str();
    let events = match change {
        Change::Complete { result } => vec![
            append_event(conn, id, EventType::Result, result).await?,
            append_event(conn, id, EventType::Status, &json!({ "status": status })).await?,
        ],
        Change::Fail { error } => vec![
            append_event(conn, id, EventType::Error, error).await?,
            append_event(conn, id, EventType::Status, &json!({ "status": status, "error": error })).await?,
        ],
        Change::Requeue { line, due } => {
            let mut data = json!({ "status": status });
            if let Some(due) = due.and_then(|due| due.format(&Rfc3339).ok()) {
                data["next_attempt_at"] = due.into();
            }
            vec![
                append_event(conn, id, EventType::Log, &json!({ "line": line })).await?,
                append_event(conn, id, EventType::Status, &data).await?,
            ]
        }
        Change::Cancel => vec![append_event(conn, id, EventType::Status, &json!({ "status": status })).await?],
    };
    // A paid task that ends without doing its work leaves a credit on its
    // space, in the same transaction as the change that ended it.
    match change {
        Change::Fail { error } => {
            if let Some(code) = error["code"].as_str() {
                crate::domain::payments::credit_if_owed(conn, id, code).await?;
            }
        }
        Change::Cancel => {
            // Only a task no worker ever claimed was canceled before it ran.
            let attempts: i32 =
                sqlx::query_scalar("SELECT attempts FROM tasks WHERE id = $1").bind(id).fetch_one(&mut *conn).await?;
            if attempts == 0 {
                crate::domain::payments::credit_if_owed(conn, id, "canceled").await?;
            }
        }
        Change::Complete { .. } | Change::Requeue { .. } => {}
    }
    Ok(Some(events))
}
