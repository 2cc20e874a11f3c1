//! The one place a task's status changes after create: [`transition`], a
//! conditional `UPDATE` fenced on where the task must be, plus the events
//! the change causes, in one statement. Create (a task it could not
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
use super::events::{Event, EventType};
use crate::domain::ids::Id;
use crate::domain::payments::Ended;

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
    /// `→ completed` with the executor's result: events `result`, `status`
    /// (carrying a metered task's `payment`, its receipt), after the events
    /// of the reports a metered run held back until it was charged
    /// (`held`, in the order they came), so that they keep their order and
    /// the sequence has no gap.
    Complete { result: &'a Value, payment: Option<&'a Value>, held: &'a [(EventType, Value)] },
    /// `→ failed` with `{"code","message"}` (see [`super::task_error`]):
    /// events `error`, `status` (carrying the error too).
    Fail { error: &'a Value },
    /// `→ queued` for another attempt, lease cleared and progress reset:
    /// events `log` (`line`, why), `status` (with `next_attempt_at`, when
    /// the next attempt is `due`, if known).
    Requeue { line: &'a str, due: Option<OffsetDateTime> },
    /// `→ canceled`: event `status`.
    Cancel,
    /// `failed → queued` again, an operator's re-run (`reeve tasks rerun`):
    /// error, result and lease cleared, `rerun_from` set to `attempts`, so
    /// the retry limit counts afresh while `attempts`, the fencing token,
    /// keeps growing; `reruns` counts it, so the re-run's end gets its own
    /// completion webhook. Events `log` (`line`, why), `status` (with
    /// `rerun: true`).
    Rerun { line: &'a str },
}

impl Change<'_> {
    pub fn to(&self) -> TaskStatus {
        match self {
            Change::Complete { .. } => TaskStatus::Completed,
            Change::Fail { .. } => TaskStatus::Failed,
            Change::Requeue { .. } | Change::Rerun { .. } => TaskStatus::Queued,
            Change::Cancel => TaskStatus::Canceled,
        }
    }

    fn may_leave_credit(&self) -> bool {
        matches!(self, Change::Fail { .. } | Change::Cancel)
    }

    /// The events the change records, in order.
    fn events(&self) -> Vec<(EventType, Value)> {
        let status = self.to().as_str();
        match *self {
            Change::Complete { result, payment, held } => {
                let mut data = json!({ "status": status });
                if let Some(payment) = payment {
                    data["payment"] = payment.clone();
                }
                let mut events = held.to_vec();
                events.extend([(EventType::Result, result.clone()), (EventType::Status, data)]);
                events
            }
            Change::Fail { error } => vec![
                (EventType::Error, error.clone()),
                (EventType::Status, json!({ "status": status, "error": error })),
            ],
            Change::Requeue { line, due } => {
                let mut data = json!({ "status": status });
                if let Some(due) = due.and_then(|due| due.format(&Rfc3339).ok()) {
                    data["next_attempt_at"] = due.into();
                }
                vec![(EventType::Log, json!({ "line": line })), (EventType::Status, data)]
            }
            Change::Cancel => vec![(EventType::Status, json!({ "status": status }))],
            Change::Rerun { line } => vec![
                (EventType::Log, json!({ "line": line })),
                (EventType::Status, json!({ "status": status, "rerun": true })),
            ],
        }
    }
}

/// The fence every change shares: `$1` id, `$2` statuses, `$3` attempt or
/// NULL. `$4` is the change's payload, `$5` and `$6` its events' types and
/// data, `$7` the id of its webhook delivery, if it has one.
///
/// An end (`completed`, `failed`, `canceled`) writes its completion
/// webhook's outbox row in the same statement (`outbox`): to the task's own
/// endpoint if it named one, else its Space's default, if the event is one
/// it asked for (see `domain/webhooks`). No end is then without its row,
/// whatever fails after the commit; the sender delivers it from there. The
/// row is the end of the task's current run series (`reruns`): a re-run's
/// end has a row of its own, and one end never two.
///
/// The status change and its events are one statement: the `UPDATE` bumps
/// the event counter by as many events as it appends, and the `INSERT`
/// numbers them from it. On a pool that is one round trip with no
/// `BEGIN`/`COMMIT`, and it is as atomic as the transaction it replaced.
///
/// A fail or a cancel never moves a task whose metered capture is under way
/// or done (`payment.status` `capturing` or `charged`): its payer may have
/// been charged already, so its run's result is delivered, or the chain
/// shows nothing was charged (see `migrations/0011_held_captures.sql`).
macro_rules! with_events {
    ($set:literal) => {
        with_events!($set, "")
    };
    ($set:literal, held) => {
        with_events!($set, " AND coalesce(payment->>'status', '') NOT IN ('capturing', 'charged')")
    };
    ($set:literal, $held:literal) => {
        concat!(
            "WITH moved AS (
                 UPDATE tasks SET ",
            $set,
            ", last_seq = last_seq + cardinality($5::text[]), updated_at = now(),
                        parked_at = NULL, wait_reason = NULL
                  WHERE id = $1 AND status = ANY($2) AND ($3::int4 IS NULL OR attempts = $3)",
            $held,
            "
              RETURNING id, last_seq, kind, attempts, space_idx, status, webhook_url, webhook_events, rerun_from,
                        reruns
             ), outbox AS (
                 INSERT INTO webhook_deliveries (id, task_id, space_idx, url, event, rerun)
                 SELECT $7, moved.id, moved.space_idx, sub.url, moved.status, moved.reruns
                   FROM moved
                   LEFT JOIN space_webhooks space_default ON space_default.space_idx = moved.space_idx
                  CROSS JOIN LATERAL (
                        SELECT coalesce(moved.webhook_url, space_default.url) AS url,
                               CASE WHEN moved.webhook_url IS NULL THEN space_default.events
                                    ELSE moved.webhook_events END AS events
                        ) sub
                  WHERE moved.status IN ('completed', 'failed', 'canceled')
                    AND sub.url IS NOT NULL AND moved.status = ANY(sub.events)
                 ON CONFLICT (task_id, rerun) WHERE event <> 'progress' DO NOTHING
             ), appended AS (
                 INSERT INTO task_events (task_id, seq, type, data)
                 SELECT moved.id, moved.last_seq - cardinality($5::text[]) + e.n, e.type, e.data
                   FROM moved, unnest($5::text[], $6::jsonb[]) WITH ORDINALITY AS e(type, data, n)
              RETURNING seq, at
             )
             SELECT appended.seq, appended.at, moved.kind, moved.attempts - moved.rerun_from
               FROM appended, moved ORDER BY appended.seq"
        )
    };
}

/// Applies `change` if the task is inside `fence`, with its events. `None`:
/// the task was elsewhere (someone else moved it first) or is gone, and
/// nothing was written.
///
/// A change that ends a paid task without its work (fail, cancel) may leave
/// a credit, written in a transaction with it; the others are one
/// statement on the pool.
pub async fn transition(
    db: &PgPool,
    id: Id,
    fence: Fence<'_>,
    change: Change<'_>,
) -> Result<Option<Vec<Event>>, sqlx::Error> {
    if !change.may_leave_credit() {
        let mut conn = db.acquire().await?;
        return transition_in(&mut conn, id, fence, change).await;
    }
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
        Change::Complete { result, .. } => {
            (with_events!("status = 'completed', result = $4, progress = 1, lease_until = NULL"), Some(result))
        }
        Change::Fail { error } => {
            (with_events!("status = 'failed', error = $4, lease_until = NULL", held), Some(error))
        }
        Change::Requeue { .. } => (with_events!("status = 'queued', lease_until = NULL, progress = 0"), None),
        Change::Cancel => (with_events!("status = 'canceled', lease_until = NULL", held), None),
        Change::Rerun { .. } => (
            with_events!(
                "status = 'queued', error = NULL, result = NULL, progress = 0, lease_until = NULL,
                 cancel_requested_at = NULL, rerun_from = attempts, reruns = reruns + 1"
            ),
            None,
        ),
    };
    let (kinds, data): (Vec<EventType>, Vec<Value>) = change.events().into_iter().unzip();
    let types: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    let rows: Vec<(i64, OffsetDateTime, String, i32)> = sqlx::query_as(sql)
        .bind(id)
        .bind(&from)
        .bind(attempt)
        .bind(payload.map(sqlx::types::Json))
        .bind(&types)
        .bind(data.iter().map(sqlx::types::Json).collect::<Vec<_>>())
        .bind(Id::new())
        .fetch_all(&mut *conn)
        .await?;
    // `runs`: the runs since the task was last re-run (all of them if never).
    let Some(&(_, _, ref task_kind, runs)) = rows.first() else {
        return Ok(None);
    };
    let mut events: Vec<Event> = rows
        .iter()
        .zip(kinds.into_iter().zip(data))
        .map(|(&(seq, at, _, _), (kind, data))| Event { seq, kind, data, at })
        .collect();
    for event in events.iter().filter(|e| e.kind == EventType::Status) {
        crate::infra::metrics::task_status(task_kind, event.seq, &event.data);
    }
    // A paid task that ends without doing its work leaves a credit on its
    // space, and a metered one's authorization is released (nothing
    // charged), in the same transaction as the change that ended it.
    let ended = match change {
        Change::Fail { error } => error["code"].as_str().map(Ended::Failed),
        // Only a task no worker ever claimed (since its re-run, which spent
        // its credit) was canceled before it ran.
        Change::Cancel => Some(Ended::Canceled { before_run: runs == 0 }),
        Change::Complete { .. } | Change::Requeue { .. } | Change::Rerun { .. } => None,
    };
    if let Some(ended) = ended {
        // The final event carries a metered task's receipt.
        if let Some(payment) = crate::domain::payments::ended_without_work(conn, id, ended).await?
            && let Some(last) = events.last_mut()
        {
            last.data["payment"] = payment;
            sqlx::query("UPDATE task_events SET data = $3 WHERE task_id = $1 AND seq = $2")
                .bind(id)
                .bind(last.seq)
                .bind(sqlx::types::Json(&last.data))
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(Some(events))
}
