//! Credits: what a paid task that did no work, or a charge whose task could
//! no longer be created, leaves on its space, and the task that spends it.

use serde::Serialize;
use sqlx::PgConnection;
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::Attempt;
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;

/// A charge whose task can no longer be created: the attempt is `settled`
/// without a task, and its space holds a credit for the amount instead, in
/// one transaction. `None`: the attempt had moved on.
pub async fn credit_attempt(
    conn: &mut PgConnection,
    attempt: &Attempt,
    reason: &str,
) -> Result<Option<Credit>, sqlx::Error> {
    let moved = sqlx::query(
        "UPDATE payment_attempts SET status = 'settled', claimed_until = NULL, reason = $2, updated_at = now()
          WHERE id = $1 AND status = 'settling' AND task_id IS NULL",
    )
    .bind(attempt.id)
    .bind(reason)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if moved == 0 {
        return Ok(None);
    }
    crate::infra::metrics::payment_settled(&attempt.network, &attempt.asset);
    let credit: Credit = sqlx::query_as(concat!(
        "INSERT INTO credits (id, space_idx, network, asset, amount, source_attempt, reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         RETURNING ",
        credit_columns!()
    ))
    .bind(Id::new())
    .bind(&attempt.space)
    .bind(&attempt.network)
    .bind(&attempt.asset)
    .bind(&attempt.amount)
    .bind(attempt.id)
    .bind(reason)
    .fetch_one(&mut *conn)
    .await?;
    crate::infra::metrics::credit_issued(&credit.asset, reason);
    tracing::info!(attempt = %attempt.id, credit_id = %credit.id, amount = %credit.amount, reason, "credit left for a charge without a task");
    Ok(Some(credit))
}

/// A credit a space holds (or held) for a paid task that did no work.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, sqlx::FromRow)]
pub struct Credit {
    pub id: Id,
    /// CAIP-2, e.g. `eip155:84532`.
    pub network: String,
    /// The token contract.
    pub asset: String,
    /// Atomic units, as a decimal string.
    pub amount: String,
    /// The paid task that ended without doing its work; `null` for a
    /// payment that landed after its request was answered but whose task
    /// could no longer be created (its kind was withdrawn).
    pub source_task: Option<Id>,
    /// Why it ended: its error code.
    pub reason: String,
    /// The task this credit paid for, once spent.
    pub spent_by: Option<Id>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// Spends the oldest unspent credit of `space` for one of `prices`
/// (network, asset contract, atomic amount) on `task_id`, inside the task's
/// transaction. `None`: no such credit.
pub async fn spend_credit(
    conn: &mut PgConnection,
    space: &SpaceIndex,
    prices: &[(String, String, String)],
    task_id: Id,
) -> Result<Option<Credit>, sqlx::Error> {
    for (network, asset, amount) in prices {
        let credit: Option<Credit> = sqlx::query_as(concat!(
            "UPDATE credits SET spent_by = $5, spent_at = now()
              WHERE id = (SELECT id FROM credits
                           WHERE space_idx = $1 AND network = $2 AND lower(asset) = lower($3) AND amount = $4
                             AND spent_at IS NULL
                           ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
          RETURNING ",
            credit_columns!()
        ))
        .bind(space.as_bytes())
        .bind(network)
        .bind(asset)
        .bind(amount)
        .bind(task_id)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(credit) = credit {
            crate::infra::metrics::credit_spent(&credit.asset);
            return Ok(Some(credit));
        }
    }
    Ok(None)
}

/// Error codes of a task that ended without doing its work through no fault
/// of its input: the payer is owed a credit. Anything else (an invalid
/// input, a rejected upload, a URL the owner chose that failed) is not.
pub const CREDITED_CODES: &[&str] = &[
    "retries_exhausted",
    "dead_lettered",
    "timed_out",
    "timeout",
    "deadline_exceeded",
    "internal",
    "queue_unavailable",
    "unknown_kind",
    "malformed_message",
    "bad_executor_response",
    // A `lambda` kind whose function is missing: the operator's doing.
    "executor_unavailable",
    // An upload checked at create and gone when the task ran: the bucket
    // expired it, which is Reeve's doing, not the input's.
    "upload_missing",
    // A cancel of a task that never started (its caller passes this code
    // only for a task that was still queued).
    "canceled",
];

/// Leaves a credit on the task's space if the task was paid for (with a
/// payment, a credit or a batch-settlement voucher) and `code` is one that
/// earns one. Call it in the
/// transaction that moves the task to `failed` or `canceled`; it is a no-op
/// for a free task and for a task already credited (since its last re-run:
/// a credit it spent on its re-run does not count, see
/// [`spend_on_rerun`]).
pub async fn credit_if_owed(conn: &mut PgConnection, task_id: Id, code: &str) -> Result<Option<Credit>, sqlx::Error> {
    if !CREDITED_CODES.contains(&code) {
        return Ok(None);
    }
    let credit: Option<Credit> = sqlx::query_as(concat!(
        "INSERT INTO credits (id, space_idx, network, asset, amount, source_task, reason)
         SELECT $1, t.space_idx, paid.network, paid.asset, paid.amount, t.id, $3
           FROM tasks t
           JOIN LATERAL (
                SELECT network, asset, amount FROM payments WHERE task_id = t.id
                UNION ALL
                SELECT network, asset, amount FROM credits WHERE spent_by = t.id
                UNION ALL
                SELECT c.network, v.asset, v.price::TEXT FROM batch_vouchers v
                  JOIN batch_channels c USING (channel_id) WHERE v.task_id = t.id
                LIMIT 1) paid ON true
          WHERE t.id = $2
         ON CONFLICT (source_task) WHERE spent_by IS DISTINCT FROM source_task DO NOTHING
         RETURNING ",
        credit_columns!()
    ))
    .bind(Id::new())
    .bind(task_id)
    .bind(code)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(c) = &credit {
        crate::infra::metrics::credit_issued(&c.asset, code);
        tracing::info!(task_id = %task_id, credit_id = %c.id, amount = %c.amount, reason = code, "credit left for a paid task");
    }
    Ok(credit)
}

/// A re-run of the paid task `task_id` spends the credit its failure left:
/// `spent_by` is the task itself, inside the re-run's transaction, so the
/// payment buys the re-run or the credit, never both. `None`: it has no
/// unspent credit of its own (it was free, or its credit paid for another
/// task already, and then it must not run again).
pub async fn spend_on_rerun(conn: &mut PgConnection, task_id: Id) -> Result<Option<Credit>, sqlx::Error> {
    let credit: Option<Credit> = sqlx::query_as(concat!(
        "UPDATE credits SET spent_by = $1, spent_at = now()
          WHERE source_task = $1 AND spent_at IS NULL
          RETURNING ",
        credit_columns!()
    ))
    .bind(task_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(credit) = &credit {
        crate::infra::metrics::credit_spent(&credit.asset);
    }
    Ok(credit)
}
