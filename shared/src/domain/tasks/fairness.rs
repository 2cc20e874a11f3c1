//! Fairness between Spaces (docs/operations.md#fairness-between-spaces): at
//! most `running_per_space` of one Space's tasks run at once, so that one
//! Space's backlog cannot take every worker from the others.
//!
//! A claim counts the Space's running tasks under a lock of the Space (a
//! transaction-scoped advisory lock), so two workers claiming for one Space
//! at once count one after the other and the limit holds however many
//! workers there are. A task over the limit is not claimed: no attempt is
//! counted, and it is **parked** (`parked_at`), `queued` with its reason
//! (`wait_reason`, shown as the task's `waiting`, and said once in its
//! events). Its message is deleted: a parked task costs the queue nothing,
//! and its receive count, which the dead-letter queue counts, never grows
//! while it waits.
//!
//! A new task is parked the same way when it is created over the limit
//! ([`admit`]): its Space's backlog waits here, not in the queue, which
//! holds at most the limit of each Space's tasks, so another Space's task
//! is never queued behind one Space's backlog.
//!
//! A parked task is **woken** (its message sent again) when a slot frees:
//! the worker wakes its Space after each message it handled, and every sweep
//! wakes every Space with parked tasks, for an end the worker did not see
//! (a service's report, a worker that died). A wake takes the same lock, so
//! a park and the end that frees its slot cannot miss each other: either the
//! claim counts after the end (and runs), or the wake sees the park.

use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};

use super::events::{Event, EventType};
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;

/// The `waiting.code` of a task parked by its Space's limit.
pub const RUNNING_PER_SPACE: &str = "running_per_space";

/// The running tasks a task counts against in its Space, and how many may
/// be ([`crate::domain::catalog::Catalog::slots`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slots {
    pub limit: u32,
    /// The kind, when it has a limit of its own: only its tasks count.
    pub kind: Option<String>,
    /// Otherwise, the kinds with a limit of their own, whose tasks do not.
    pub others: Vec<String>,
}

/// Takes the lock of task `id`'s Space until the transaction ends, and
/// counts the Space's running tasks that `slots` counts: after the lock,
/// so no other claim can raise it before the commit (migration 0018's
/// `running_lock_and_count`). Claims and wakes of one Space run one after
/// the other. 0, and no lock, when there is no such task.
pub async fn lock_and_count(conn: &mut PgConnection, id: Id, slots: &Slots) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT running_lock_and_count((SELECT space_idx FROM tasks WHERE id = $1), $2, $3)")
        .bind(id)
        .bind(slots.kind.as_deref())
        .bind(&slots.others)
        .fetch_one(&mut *conn)
        .await
}

/// Whether the new `queued` task `id` goes to the queue: only while its
/// Space has fewer than `slots.limit` tasks in flight (running, or queued
/// and not parked) older than it; otherwise it is [`park`]ed at once, under
/// the Space's lock, and a freed slot wakes it (migration 0027). So one
/// Space's backlog waits here, not in the queue ahead of other Spaces'
/// tasks. `Some(waiting)`: parked, with its reason.
pub async fn admit(db: &PgPool, id: Id, slots: &Slots) -> Result<Option<Value>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let in_flight: i64 =
        sqlx::query_scalar("SELECT in_flight_lock_and_count((SELECT space_idx FROM tasks WHERE id = $1), $2, $3, $1)")
            .bind(id)
            .bind(slots.kind.as_deref())
            .bind(&slots.others)
            .fetch_one(&mut *tx)
            .await?;
    if in_flight < i64::from(slots.limit) {
        tx.rollback().await?;
        return Ok(None);
    }
    let reason = wait_reason(slots);
    let parked = park(&mut tx, id, &reason).await?;
    tx.commit().await?;
    Ok(parked.map(|_| reason))
}

/// Why a parked task waits, as its owner reads it (`waiting`).
pub fn wait_reason(slots: &Slots) -> Value {
    let limit = slots.limit;
    let message = match &slots.kind {
        Some(kind) => format!(
            "{limit} of this Space's {kind} tasks are running, as many as may run at once; this one starts when one \
             of them ends, and no attempt is counted meanwhile"
        ),
        None => format!(
            "{limit} of this Space's tasks are running, as many as may run at once; this one starts when one of \
             them ends, and no attempt is counted meanwhile"
        ),
    };
    json!({ "code": RUNNING_PER_SPACE, "message": message, "limit": limit })
}

/// Parks the `queued` task `id` with `reason`, inside the caller's
/// transaction (under [`lock_space`]). The first time it waits (no
/// `wait_reason` yet), its events say so: `status` `queued` with
/// `waiting`; a task parked again (woken, then beaten to the slot) says
/// nothing new. `None`: no such queued task; `Some(None)`: parked, no event.
pub async fn park(conn: &mut PgConnection, id: Id, reason: &Value) -> Result<Option<Option<Event>>, sqlx::Error> {
    let data = json!({ "status": "queued", "waiting": reason });
    let row: Option<(Option<i64>, Option<time::OffsetDateTime>)> = sqlx::query_as(
        "WITH before AS (
             SELECT wait_reason IS NULL AS is_first FROM tasks WHERE id = $1 AND status = 'queued' FOR UPDATE
         ), parked AS (
             UPDATE tasks SET parked_at = now(), wait_reason = $2, updated_at = now(),
                              last_seq = last_seq + CASE WHEN before.is_first THEN 1 ELSE 0 END
               FROM before
              WHERE id = $1 AND status = 'queued'
          RETURNING id, last_seq, before.is_first
         ), appended AS (
             INSERT INTO task_events (task_id, seq, type, data)
             SELECT id, last_seq, 'status', $3 FROM parked WHERE is_first
          RETURNING seq, at
         )
         SELECT appended.seq, appended.at FROM parked LEFT JOIN appended ON true",
    )
    .bind(id)
    .bind(sqlx::types::Json(reason))
    .bind(sqlx::types::Json(&data))
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|(seq, at)| Some(Event { seq: seq?, kind: EventType::Status, data, at: at? })))
}

/// A parked task to send again, as its message needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Woken {
    pub id: Id,
    pub kind: String,
    pub space: SpaceIndex,
}

/// Unparks as many of `space`'s parked tasks counted by `slots` as it has
/// free slots, oldest first, in one statement under the Space's lock
/// (migration 0018's `wake_parked`): the caller sends each one's message
/// (and [`repark`]s one it cannot send). Even "none" is read under the
/// lock: a claim that counted the run now ended may be parking its task
/// this very moment, and the lock makes this wake wait for it.
pub async fn wake(db: &PgPool, space: &SpaceIndex, slots: &Slots) -> Result<Vec<Woken>, sqlx::Error> {
    let rows: Vec<(Id, String)> = sqlx::query_as("SELECT woken_id, woken_kind FROM wake_parked($1, $2, $3, $4)")
        .bind(space.as_bytes())
        .bind(slots.kind.as_deref())
        .bind(&slots.others)
        .bind(i64::from(slots.limit))
        .fetch_all(db)
        .await?;
    Ok(rows.into_iter().map(|(id, kind)| Woken { id, kind, space: *space }).collect())
}

/// [`wake`] for the Space of task `id`, in the same one statement.
pub async fn wake_for(db: &PgPool, id: Id, slots: &Slots) -> Result<Vec<Woken>, sqlx::Error> {
    let rows: Vec<(Id, String, Vec<u8>)> = sqlx::query_as(
        "SELECT w.woken_id, w.woken_kind, t.space_idx
           FROM tasks t, wake_parked(t.space_idx, $2, $3, $4) w
          WHERE t.id = $1",
    )
    .bind(id)
    .bind(slots.kind.as_deref())
    .bind(&slots.others)
    .bind(i64::from(slots.limit))
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, kind, space)| Some(Woken { id, kind, space: SpaceIndex::from_slice(&space)? }))
        .collect())
}

/// Every Space and kind with a parked task (at most `limit` of them), for
/// the sweep's wake.
pub async fn parked_pools(db: &PgPool, limit: i64) -> Result<Vec<(SpaceIndex, String)>, sqlx::Error> {
    let rows: Vec<(Vec<u8>, String)> = sqlx::query_as(
        "SELECT DISTINCT space_idx, kind FROM tasks WHERE status = 'queued' AND parked_at IS NOT NULL LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().filter_map(|(space, kind)| Some((SpaceIndex::from_slice(&space)?, kind))).collect())
}

/// Parks a woken task again whose message could not be sent: the next wake
/// (a sweep's at the latest) sends it.
pub async fn repark(db: &PgPool, id: Id) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE tasks SET parked_at = now() WHERE id = $1 AND status = 'queued'").bind(id).execute(db).await?;
    Ok(())
}

/// Sends each woken task's message; one that cannot be sent is parked
/// again, for the next wake. How many were sent.
#[cfg(feature = "sqs")]
pub async fn send_woken(
    db: &PgPool,
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    woken: Vec<Woken>,
) -> Result<usize, sqlx::Error> {
    let mut sent = 0;
    for task in woken {
        match super::queue::enqueue(sqs, queue_url, task.id, &task.kind, Some(&task.space)).await {
            Ok(()) => {
                tracing::info!(task_id = %task.id, "a slot of its Space freed: woken");
                sent += 1;
            }
            Err(e) => {
                tracing::warn!(task_id = %task.id, error = %e, "could not send a woken task; parked again");
                repark(db, task.id).await?;
            }
        }
    }
    Ok(sent)
}
