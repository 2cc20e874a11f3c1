//! Metered holds (`upto`): an authorization that holds its task from create
//! until the task ends, what the run produced while its capture is decided,
//! and the capture's own moves.
//!
//! An `upto` attempt is `verifying` while its create asks `/verify`, then
//! `authorized` with its task, and only when the task ends `capturing` (the
//! worker sent the used amount to be settled), then `settled` (charged) or
//! `failed` (the capture was refused); or `released`, nothing charged. Each
//! move that changes what the buyer sees rewrites the task's `payment` in
//! the same statement.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use super::payments::insert_payment;
use super::{AttemptStatus, SettledPayment};
use crate::domain::ids::Id;

/// Verified: the attempt holds its task now, nothing charged.
pub async fn authorize_attempt(conn: &mut PgConnection, id: Id, task_id: Id) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(
        "UPDATE payment_attempts SET status = 'authorized', task_id = $2, claimed_until = NULL, reason = NULL,
                updated_at = now()
          WHERE id = $1 AND status = 'verifying' AND task_id IS NULL",
    )
    .bind(id)
    .bind(task_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(moved == 1)
}

/// The task's metered authorization: the attempt's state and what the
/// worker settles with. `None`: the task is not metered.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OpenAuthorization {
    pub attempt: Id,
    #[sqlx(try_from = "String")]
    pub status: AttemptStatus,
    pub network: String,
    pub asset: String,
    pub payer: String,
    pub pay_to: Option<String>,
    /// The ceiling, atomic units.
    pub amount: String,
    /// The signed deadline, decimal unix seconds.
    pub valid_before: Option<String>,
    pub transaction: Option<String>,
    pub from_block: Option<i64>,
    #[sqlx(json)]
    pub document: Value,
    /// The task's `payment`, as its buyer sees it.
    #[sqlx(json)]
    pub payment: Value,
    #[sqlx(rename = "space_idx")]
    pub space: Vec<u8>,
    /// A capture's run: its result and what it used (see [`start_capture`]).
    #[sqlx(json(nullable))]
    pub held: Option<Held>,
}

/// What a finished run of a metered task produced and used, held with its
/// attempt from the start of its capture until the capture is decided: the
/// result is delivered only once charged, and no run executes the task
/// again meanwhile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub result: Value,
    /// Bytes, or milliseconds for `second`.
    pub used: u64,
    /// What the run reported that may carry its result (log lines, a
    /// progress report's details), in the order it came: published only
    /// once the capture is charged, just before the result, and deleted
    /// with the output if it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reports: Vec<HeldReport>,
}

/// One report a metered run held back: its event's type (`log`,
/// `progress`) and data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldReport {
    #[serde(rename = "type")]
    pub kind: String,
    pub data: Value,
}

pub async fn open_authorization(db: &PgPool, task_id: Id) -> Result<Option<OpenAuthorization>, sqlx::Error> {
    sqlx::query_as(
        "SELECT a.id AS attempt, a.status, a.network, a.asset, a.payer, a.pay_to, a.amount,
                a.valid_before::text AS valid_before, a.transaction, a.from_block, a.document, t.payment,
                a.space_idx, a.held
           FROM payment_attempts a JOIN tasks t ON t.id = a.task_id
          WHERE a.task_id = $1 AND a.scheme = 'upto' AND a.document IS NOT NULL AND t.payment IS NOT NULL",
    )
    .bind(task_id)
    .fetch_optional(db)
    .await
}

/// Starts (or resumes) a capture of `charged`: `authorized → capturing`,
/// with the run's result and use held, and the task's `payment` reading
/// `capturing` (which holds the task: see `migrations/0011_held_captures.sql`).
/// A capture already under way keeps the amount and the run it started
/// with, which an earlier settle may have charged. `None`: it is neither
/// any more.
pub async fn start_capture(
    db: impl sqlx::PgExecutor<'_>,
    id: Id,
    charged: &str,
    held: &Held,
) -> Result<Option<(String, Held)>, sqlx::Error> {
    let started: Option<(String, sqlx::types::Json<Held>)> = sqlx::query_as(
        "WITH started AS (
             UPDATE payment_attempts
                SET charged = CASE WHEN status = 'authorized' THEN $2 ELSE charged END,
                    held = COALESCE(held, $3), status = 'capturing', updated_at = now()
              WHERE id = $1 AND status IN ('authorized', 'capturing')
          RETURNING task_id, charged, held)
         UPDATE tasks SET payment = payment || jsonb_build_object(
                    'status', 'capturing', 'charged', started.charged, 'used', started.held->'used')
           FROM started WHERE tasks.id = started.task_id
      RETURNING started.charged, started.held",
    )
    .bind(id)
    .bind(charged)
    .bind(sqlx::types::Json(held))
    .fetch_optional(db)
    .await?;
    Ok(started.map(|(charged, held)| (charged, held.0)))
}

/// A capture's settlement named this transaction before its outcome was
/// known.
pub async fn capture_named(db: &PgPool, id: Id, transaction: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE payment_attempts SET transaction = $2, updated_at = now() WHERE id = $1 AND status = 'capturing'",
    )
    .bind(id)
    .bind(transaction)
    .execute(db)
    .await
    .map(|_| ())
}

/// A capture proven on chain: the attempt `settled`, its payment recorded,
/// and the task's `payment` set to `view`, in one transaction. `false`: it
/// was not capturing any more.
pub async fn record_captured(db: &PgPool, p: &SettledPayment<'_>, view: &Value) -> Result<bool, sqlx::Error> {
    let mut tx = db.begin().await?;
    let moved = sqlx::query(
        "UPDATE payment_attempts SET status = 'settled', transaction = $2, claimed_until = NULL, reason = NULL,
                updated_at = now()
          WHERE id = $1 AND status = 'capturing'",
    )
    .bind(p.attempt)
    .bind(p.transaction)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if moved == 0 {
        tx.rollback().await?;
        return Ok(false);
    }
    insert_payment(&mut tx, p).await?;
    set_view(&mut tx, p.task_id, view).await?;
    tx.commit().await?;
    Ok(true)
}

/// The chain shows the capture can never be paid: nothing was charged; the
/// attempt `failed`, what the run held (its result and reports) is
/// dropped, and the task's `payment` says so. `false`: it was not
/// capturing any more.
pub async fn refuse_capture(db: &PgPool, id: Id, task_id: Id, reason: &str, view: &Value) -> Result<bool, sqlx::Error> {
    let mut tx = db.begin().await?;
    let moved = sqlx::query(
        "UPDATE payment_attempts SET status = 'failed', reason = $2, claimed_until = NULL, held = NULL,
                updated_at = now()
          WHERE id = $1 AND status = 'capturing'",
    )
    .bind(id)
    .bind(reason)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if moved == 1 {
        set_view(&mut tx, task_id, view).await?;
        crate::infra::metrics::payment_failed(reason);
    }
    tx.commit().await?;
    Ok(moved == 1)
}

/// Releases the task's authorization if nothing was sent to be settled
/// yet: `authorized → released` with `reason`, and the task's `payment`
/// says nothing was charged. Called in the transaction that ends the task
/// (failed, canceled), and by the worker for a task that used nothing.
/// Returns the task's `payment` as it is now (`None`: not metered).
pub async fn release_if_authorized(
    conn: &mut PgConnection,
    task_id: Id,
    reason: &str,
) -> Result<Option<Value>, sqlx::Error> {
    let released: Option<sqlx::types::Json<Value>> = sqlx::query_scalar(
        "WITH released AS (
             UPDATE payment_attempts SET status = 'released', reason = $2, claimed_until = NULL, updated_at = now()
              WHERE task_id = $1 AND scheme = 'upto' AND status = 'authorized'
          RETURNING task_id)
         UPDATE tasks SET payment = payment || jsonb_build_object('status', 'released', 'charged', '0', 'reason', $2)
          WHERE id = (SELECT task_id FROM released)
      RETURNING payment",
    )
    .bind(task_id)
    .bind(reason)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(view) = released {
        return Ok(Some(view.0));
    }
    let current: Option<Option<sqlx::types::Json<Value>>> =
        sqlx::query_scalar("SELECT payment FROM tasks WHERE id = $1").bind(task_id).fetch_optional(&mut *conn).await?;
    Ok(current.flatten().map(|view| view.0))
}

async fn set_view(conn: &mut PgConnection, task_id: Id, view: &Value) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE tasks SET payment = $2 WHERE id = $1")
        .bind(task_id)
        .bind(sqlx::types::Json(view))
        .execute(conn)
        .await
        .map(|_| ())
}
