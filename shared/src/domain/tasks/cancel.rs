//! Canceling a task. A `queued` task is canceled at once; a `running` one
//! is in a worker's hands, so the API records a request
//! (`tasks.cancel_requested_at`) that the worker checks while the executor
//! runs ([`cancel_requested`]); the worker then stops the executor and ends
//! the task `canceled` through the same fenced [`transition`].

use serde_json::json;
use sqlx::PgPool;

use super::events::{Event, EventType, append_event};
use super::transition::{Change, Fence, transition_in};
use super::{Task, TaskStatus, find_for_space};
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;

/// What a cancel did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The task is `canceled` now (it was `queued`, or `running` under a
    /// lease that had expired: its worker is gone).
    Canceled { task: Task, events: Vec<Event> },
    /// The task is `running`; its worker will stop it. `event` is the
    /// `status` event announcing the request, `None` when it had already
    /// been asked.
    Requested { task: Task, event: Option<Event> },
    /// The task had already ended.
    Finished(Task),
}

/// Cancels the task `id` of `space`; `None` when there is no such task in
/// the space. The row is locked while deciding, so a concurrent claim or
/// completion either happens before (and is seen) or waits and then finds
/// the task `canceled`: exactly one terminal state.
pub async fn cancel(db: &PgPool, space: &SpaceIndex, id: Id) -> Result<Option<CancelOutcome>, sqlx::Error> {
    cancel_in(db, Some(space), id).await
}

/// [`cancel`] of any Space's task: the operators' `reeve tasks cancel`,
/// with the same effects per task as the owner's cancel.
pub async fn cancel_any(db: &PgPool, id: Id) -> Result<Option<CancelOutcome>, sqlx::Error> {
    cancel_in(db, None, id).await
}

/// [`cancel`] in `space`, or in whichever Space holds the task (`None`).
async fn cancel_in(db: &PgPool, space: Option<&SpaceIndex>, id: Id) -> Result<Option<CancelOutcome>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let row: Option<(String, bool, bool, bool, Vec<u8>)> = sqlx::query_as(
        "SELECT status, (lease_until IS NULL OR lease_until < now()), cancel_requested_at IS NOT NULL,
                coalesce(payment->>'status' IN ('capturing', 'charged'), false), space_idx
           FROM tasks WHERE id = $1 AND ($2::bytea IS NULL OR space_idx = $2) FOR UPDATE",
    )
    .bind(id)
    .bind(space.map(|space| space.as_bytes().to_vec()))
    .fetch_optional(&mut *tx)
    .await?;
    let Some((status, lease_expired, already_asked, charging, owner)) = row else {
        return Ok(None);
    };
    let space = SpaceIndex::from_slice(&owner)
        .ok_or_else(|| sqlx::Error::Decode("a task's space_idx is not 16 bytes".into()))?;
    let status = TaskStatus::parse(&status)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown task status {status:?}").into()))?;
    let capturing = charging && !status.is_terminal();
    // A metered task whose run finished and whose capture is under way may
    // have charged its payer already: like a run that ends before it sees
    // the request, it is asked, and ends with its result (or with nothing
    // charged), never canceled.
    let now = !capturing && (status == TaskStatus::Queued || (status == TaskStatus::Running && lease_expired));
    let outcome = if now {
        let events = transition_in(&mut tx, id, Fence::From(&[status]), Change::Cancel)
            .await?
            .ok_or_else(|| sqlx::Error::Protocol("a locked row changed under its lock".into()))?;
        Outcome::Canceled(events)
    } else if status != TaskStatus::Running && !capturing {
        Outcome::Finished
    } else if already_asked {
        Outcome::Requested(None)
    } else {
        sqlx::query("UPDATE tasks SET cancel_requested_at = now(), updated_at = now() WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let data = json!({ "status": status.as_str(), "cancel_requested": true });
        Outcome::Requested(Some(append_event(&mut tx, id, EventType::Status, &data).await?))
    };
    tx.commit().await?;
    let task = find_for_space(db, &space, id).await?.ok_or(sqlx::Error::RowNotFound)?;
    Ok(Some(match outcome {
        Outcome::Canceled(events) => CancelOutcome::Canceled { task, events },
        Outcome::Requested(event) => CancelOutcome::Requested { task, event },
        Outcome::Finished => CancelOutcome::Finished(task),
    }))
}

enum Outcome {
    Canceled(Vec<Event>),
    Requested(Option<Event>),
    Finished,
}

/// For the worker: has the owner asked to cancel this run's task? `false`
/// too when the run no longer holds it (its lease keeper notices that).
pub async fn cancel_requested(db: &PgPool, id: Id, attempt: i32) -> Result<bool, sqlx::Error> {
    let asked: Option<bool> = sqlx::query_scalar(
        "SELECT cancel_requested_at IS NOT NULL FROM tasks WHERE id = $1 AND status = 'running' AND attempts = $2",
    )
    .bind(id)
    .bind(attempt)
    .fetch_optional(db)
    .await?;
    Ok(asked.unwrap_or(false))
}
