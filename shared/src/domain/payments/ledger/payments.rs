//! Settled payments: the one `payments` row each charge writes, with the
//! task it bought, and what a space or a receipt reads back.

use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::Credit;
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::domain::payments::PaymentResponse;

/// A settled payment, recorded with the one task it bought, in the task's
/// transaction. `false`: the attempt had already bought a task (it is never
/// made to buy two).
pub struct SettledPayment<'a> {
    pub attempt: Id,
    pub task_id: Id,
    pub space: &'a SpaceIndex,
    pub network: &'a str,
    pub payer: &'a str,
    pub asset: &'a str,
    pub amount: &'a str,
    pub pay_to: &'a str,
    /// The transaction that paid (see [`crate::domain::payments::proof`]).
    pub transaction: &'a str,
}

pub async fn record_settled(conn: &mut PgConnection, p: &SettledPayment<'_>) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(
        "UPDATE payment_attempts
            SET status = 'settled', task_id = $2, transaction = $3, claimed_until = NULL, reason = NULL,
                updated_at = now()
          WHERE id = $1 AND status = 'settling' AND task_id IS NULL",
    )
    .bind(p.attempt)
    .bind(p.task_id)
    .bind(p.transaction)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if moved == 0 {
        return Ok(false);
    }
    insert_payment(conn, p).await?;
    Ok(true)
}

/// The `payments` row of a charge, and its count: once per attempt, since
/// only the update that moved it to `settled` gets here. It keeps the
/// resource its attempt paid for, which the task's receipt names.
pub(super) async fn insert_payment(conn: &mut PgConnection, p: &SettledPayment<'_>) -> Result<(), sqlx::Error> {
    crate::infra::metrics::payment_settled(p.network, p.asset);
    sqlx::query(
        "INSERT INTO payments (id, task_id, network, payer, amount, asset, transaction, space_idx, pay_to, resource)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, (SELECT resource FROM payment_attempts WHERE id = $10))",
    )
    .bind(Id::new())
    .bind(p.task_id)
    .bind(p.network)
    .bind(p.payer)
    .bind(p.amount)
    .bind(p.asset)
    .bind(p.transaction)
    .bind(p.space.as_bytes())
    .bind(p.pay_to)
    .bind(p.attempt)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A settled payment as its space sees it.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, sqlx::FromRow)]
#[schema(as = SpacePayment)]
pub struct PaymentRecord {
    /// The settlement's transaction hash; `null` when the facilitator's
    /// answer was lost and the payment was confirmed by a retry.
    pub transaction: Option<String>,
    pub network: String,
    pub asset: String,
    /// Atomic units, as a decimal string.
    pub amount: String,
    pub payer: String,
    /// The task it paid for.
    pub task_id: Id,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// The receipt of the payment that bought `task`, as it was answered when
/// it was paid (`PAYMENT-RESPONSE`, `_meta["x402/payment-response"]`);
/// `None` for a task that was free or paid with a credit.
pub async fn receipt(db: &PgPool, task: Id) -> Result<Option<PaymentResponse>, sqlx::Error> {
    let row: Option<(Option<String>, String, String)> =
        sqlx::query_as("SELECT transaction, network, payer FROM payments WHERE task_id = $1")
            .bind(task)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|(transaction, network, payer)| PaymentResponse::settled(transaction.as_deref(), &network, &payer)))
}

/// The space's payments and credits, newest first (at most `limit` each).
pub async fn for_space(
    db: &PgPool,
    space: &SpaceIndex,
    limit: i64,
) -> Result<(Vec<PaymentRecord>, Vec<Credit>), sqlx::Error> {
    let payments = sqlx::query_as(
        "SELECT transaction, network, asset, amount, payer, task_id, created_at FROM payments
          WHERE space_idx = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
    )
    .bind(space.as_bytes())
    .bind(limit)
    .fetch_all(db)
    .await?;
    let credits = sqlx::query_as(concat!(
        "SELECT ",
        credit_columns!(),
        " FROM credits WHERE space_idx = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
    ))
    .bind(space.as_bytes())
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok((payments, credits))
}
