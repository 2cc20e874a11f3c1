//! Payment attempts: one row per authorization, recorded (and claimed) before
//! the facilitator is asked anything, with the request it pays for. Every
//! move of an attempt's state outside a metered hold is here, with the lock
//! each one takes.

use serde_json::Value;
use sqlx::{PgConnection, PgExecutor, PgPool};

use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;

/// How long one request may hold an attempt while it verifies and settles:
/// longer than the facilitator client's own timeouts together, so a live
/// holder never loses it, and short enough that a retry after a crash is
/// not kept waiting long.
pub const CLAIM_SECONDS: i32 = 75;

/// An attempt's state, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptStatus {
    /// Being settled now (claimed), or settled with an outcome nobody has
    /// learnt yet (unclaimed): the chain may still charge it.
    Settling,
    /// Charged: `task_id` is the one task it bought, or it left a credit.
    Settled,
    /// Nothing was charged, and nothing can be any more by this attempt.
    Failed,
    /// `upto`: its create's `/verify` is under way (claimed), or died
    /// (unclaimed). Nothing can be charged yet.
    Verifying,
    /// `upto`: verified, its task stored; nothing charged until it ends.
    Authorized,
    /// `upto`: the used amount was sent to be settled; the chain decides.
    Capturing,
    /// `upto`: nothing was charged, nor ever will be.
    Released,
}

impl AttemptStatus {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "settling" => AttemptStatus::Settling,
            "settled" => AttemptStatus::Settled,
            "failed" => AttemptStatus::Failed,
            "verifying" => AttemptStatus::Verifying,
            "authorized" => AttemptStatus::Authorized,
            "capturing" => AttemptStatus::Capturing,
            "released" => AttemptStatus::Released,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Settling => "settling",
            AttemptStatus::Settled => "settled",
            AttemptStatus::Failed => "failed",
            AttemptStatus::Verifying => "verifying",
            AttemptStatus::Authorized => "authorized",
            AttemptStatus::Capturing => "capturing",
            AttemptStatus::Released => "released",
        }
    }
}

/// The `status` column as stored: a row with any other text is corrupt.
impl TryFrom<String> for AttemptStatus {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        AttemptStatus::parse(&s).ok_or_else(|| format!("unknown attempt status {s:?}"))
    }
}

/// The reason of an attempt that can never have paid: its authorization's
/// `validBefore` passed with its nonce unused, or the nonce was used by a
/// transaction that did not pay `payTo` exactly (see [`crate::domain::payments::proof`]).
pub const NOT_SETTLED: &str = "not_settled";

/// One attempt, with the request it pays for, read from the columns of
/// `attempt_columns!`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Attempt {
    pub id: Id,
    #[sqlx(try_from = "String")]
    pub status: AttemptStatus,
    pub network: String,
    pub payer: String,
    pub nonce: String,
    #[sqlx(rename = "space_idx")]
    pub space: Vec<u8>,
    pub kind: String,
    pub request_hash: Vec<u8>,
    pub payload_hash: Vec<u8>,
    /// `None` for an attempt recorded before attempts kept their request.
    pub input: Option<Value>,
    pub idempotency_key: Option<String>,
    pub asset: String,
    pub amount: String,
    pub pay_to: Option<String>,
    /// Decimal unix seconds.
    pub valid_before: Option<String>,
    pub reason: Option<String>,
    /// The settlement's hash, once known (a `settlement_pending` answer
    /// carries it before it is mined).
    pub transaction: Option<String>,
    /// The chain's block when the attempt began: where the search for the
    /// transaction that used its authorization starts.
    pub from_block: Option<i64>,
    pub task_id: Option<Id>,
    /// Someone holds it right now.
    pub claimed: bool,
}

/// What a new attempt records: the authorization, and the request it pays
/// for, whole, so that its task can still be created if the settlement's
/// outcome is learnt only later.
pub struct NewAttempt<'a> {
    pub network: &'a str,
    pub payer: &'a str,
    pub nonce: &'a str,
    pub payload_hash: &'a [u8; 32],
    pub space: &'a SpaceIndex,
    pub kind: &'a str,
    pub input: &'a Value,
    pub idempotency_key: Option<&'a str>,
    pub request_hash: &'a [u8; 32],
    pub payment_id: Option<&'a str>,
    pub asset: &'a str,
    pub amount: &'a str,
    pub pay_to: &'a str,
    pub valid_before: &'a str,
    /// `Some` for `upto`: the signed document, which the worker settles
    /// with when the task ends. The attempt starts `verifying`, not
    /// `settling`.
    pub upto_document: Option<&'a Value>,
    /// The resource paid for: the challenge's `resource.url`, which the
    /// task's receipt names.
    pub resource: &'a str,
}

/// The columns an [`Attempt`] is read from, as a literal for `concat!`
/// (sqlx takes only `'static` SQL).
macro_rules! attempt_columns {
    () => {
        "id, status, network, payer, nonce, space_idx, kind, request_hash, payload_hash, input, \
         idempotency_key, asset, amount, pay_to, valid_before::text AS valid_before, reason, transaction, from_block, task_id, \
         (claimed_until IS NOT NULL AND claimed_until > now()) AS claimed"
    };
}

/// Takes the lock of a space's `Idempotency-Key` until the caller's
/// transaction ends. A key is held by a task (in `tasks`) or by an attempt
/// that may still pay for one (here): whoever reserves it in either table
/// holds this first, so a credit can never pay for a key whose payment is
/// pending, nor a payment start for a key a credit has just used.
pub async fn lock_key(conn: &mut PgConnection, space: &SpaceIndex, key: &str) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("reeve.key:{}:{key}", space.to_hex()))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Records a new attempt, claimed by the caller. `None`: it collides with
/// an earlier attempt: the same authorization (network, asset, payer,
/// nonce), the same `Idempotency-Key` still open or paid, or the same
/// `payment-identifier` id; [`find_attempt`], [`find_by_idempotency_key`]
/// and [`find_by_payment_id`] say which.
pub async fn insert_attempt(conn: &mut PgConnection, new: &NewAttempt<'_>) -> Result<Option<Id>, sqlx::Error> {
    let id = Id::new();
    let inserted = sqlx::query(
        "INSERT INTO payment_attempts
             (id, network, payer, nonce, payload_hash, space_idx, kind, request_hash, payment_id, asset, amount,
              input, idempotency_key, pay_to, valid_before, claimed_until, scheme, document, status, resource)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15::numeric,
                 now() + make_interval(secs => $16),
                 CASE WHEN $17::jsonb IS NULL THEN 'exact' ELSE 'upto' END, $17,
                 CASE WHEN $17::jsonb IS NULL THEN 'settling' ELSE 'verifying' END, $18)
         ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(new.network)
    .bind(new.payer)
    .bind(new.nonce)
    .bind(new.payload_hash.as_slice())
    .bind(new.space.as_bytes())
    .bind(new.kind)
    .bind(new.request_hash.as_slice())
    .bind(new.payment_id)
    .bind(new.asset)
    .bind(new.amount)
    .bind(sqlx::types::Json(new.input))
    .bind(new.idempotency_key)
    .bind(new.pay_to)
    .bind(new.valid_before)
    .bind(f64::from(CLAIM_SECONDS))
    .bind(new.upto_document.map(sqlx::types::Json))
    .bind(new.resource)
    .execute(conn)
    .await?
    .rows_affected();
    Ok((inserted == 1).then_some(id))
}

/// Records the chain's block when the attempt began (read beside `/verify`,
/// before anything is settled).
pub async fn set_from_block(db: &PgPool, id: Id, block: u64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE payment_attempts SET from_block = $2 WHERE id = $1 AND from_block IS NULL")
        .bind(id)
        .bind(i64::try_from(block).unwrap_or(i64::MAX))
        .execute(db)
        .await
        .map(|_| ())
}

/// The attempt of one authorization: EIP-3009 nonces are per token.
pub async fn find_attempt(
    db: &PgPool,
    network: &str,
    asset: &str,
    payer: &str,
    nonce: &str,
) -> Result<Option<Attempt>, sqlx::Error> {
    let sql = concat!(
        "SELECT ",
        attempt_columns!(),
        " FROM payment_attempts WHERE network = $1 AND lower(asset) = lower($2) AND payer = $3 AND nonce = $4"
    );
    sqlx::query_as(sql).bind(network).bind(asset).bind(payer).bind(nonce).fetch_optional(db).await
}

/// The attempt a space's `payment-identifier` id was first used with.
pub async fn find_by_payment_id(
    db: &PgPool,
    space: &SpaceIndex,
    payment_id: &str,
) -> Result<Option<Attempt>, sqlx::Error> {
    let sql = concat!("SELECT ", attempt_columns!(), " FROM payment_attempts WHERE space_idx = $1 AND payment_id = $2");
    sqlx::query_as(sql).bind(space.as_bytes()).bind(payment_id).fetch_optional(db).await
}

/// The attempt that holds a space's `Idempotency-Key`: one that may still
/// charge, or has. A failed attempt holds nothing.
pub async fn find_by_idempotency_key(
    db: impl PgExecutor<'_>,
    space: &SpaceIndex,
    key: &str,
) -> Result<Option<Attempt>, sqlx::Error> {
    let sql = concat!(
        "SELECT ",
        attempt_columns!(),
        " FROM payment_attempts WHERE space_idx = $1 AND idempotency_key = $2 AND status <> 'failed'"
    );
    sqlx::query_as(sql).bind(space.as_bytes()).bind(key).fetch_optional(db).await
}

/// A `payment-identifier` id whose attempt charged nothing may name a new
/// payment: the failed attempt lets go of it. `false`: it is not failed
/// (any more).
pub async fn release_payment_id(db: &PgPool, id: Id) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(
        "UPDATE payment_attempts SET payment_id = NULL, updated_at = now() WHERE id = $1 AND status = 'failed'",
    )
    .bind(id)
    .execute(db)
    .await?
    .rows_affected();
    Ok(moved == 1)
}

/// What [`claim_attempt`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The caller holds it now.
    Taken,
    /// Someone else holds it, or it moved on.
    Busy,
    /// A failed attempt whose `Idempotency-Key` another attempt holds now:
    /// it cannot be tried again under that key.
    KeyHeld,
}

/// Takes over an attempt in `from` that nobody holds: the retry of a request
/// that failed, or whose settlement's outcome was never learnt.
pub async fn claim_attempt(db: &PgPool, id: Id, from: AttemptStatus) -> Result<Claim, sqlx::Error> {
    if from == AttemptStatus::Settled {
        return Ok(Claim::Busy);
    }
    let moved = sqlx::query(
        "UPDATE payment_attempts
            SET status = CASE WHEN scheme = 'upto' THEN 'verifying' ELSE 'settling' END, updated_at = now(),
                claimed_until = now() + make_interval(secs => $3)
          WHERE id = $1 AND status = $2 AND (claimed_until IS NULL OR claimed_until <= now())",
    )
    .bind(id)
    .bind(from.as_str())
    .bind(f64::from(CLAIM_SECONDS))
    .execute(db)
    .await;
    match moved {
        Ok(done) if done.rows_affected() == 1 => Ok(Claim::Taken),
        Ok(_) => Ok(Claim::Busy),
        // Back to `settling`, a failed attempt reserves its key again: the
        // partial unique index refuses it while another attempt holds it.
        Err(sqlx::Error::Database(e)) if e.constraint() == Some("payment_attempts_idempotency_key") => {
            Ok(Claim::KeyHeld)
        }
        Err(e) => Err(e),
    }
}

/// Nothing was charged and nothing can be by this attempt (the facilitator
/// refused it, or its `validBefore` passed unused; for `upto`, its create's
/// `/verify` refused it): `failed` with the reason. `false`: it had moved
/// on.
pub async fn fail_attempt(db: &PgPool, id: Id, reason: &str) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(
        "UPDATE payment_attempts SET status = 'failed', reason = $2, claimed_until = NULL, updated_at = now()
          WHERE id = $1 AND status IN ('settling', 'verifying')",
    )
    .bind(id)
    .bind(reason)
    .execute(db)
    .await?
    .rows_affected();
    if moved == 1 {
        // Every refusal the facilitator decides, or its being unreachable,
        // ends here with the reason the client is given.
        crate::infra::metrics::payment_failed(reason);
    }
    Ok(moved == 1)
}

/// The settlement's outcome is unknown: the attempt stays `settling` with
/// the transaction hash if one is known, and is released at once so the
/// reconciler (or the client's retry) can resolve it from the chain.
pub async fn release_attempt(db: &PgPool, id: Id, reason: &str, transaction: Option<&str>) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE payment_attempts
            SET claimed_until = NULL, reason = $2, transaction = COALESCE($3, transaction), updated_at = now()
          WHERE id = $1 AND status = 'settling'",
    )
    .bind(id)
    .bind(reason)
    .bind(transaction)
    .execute(db)
    .await?;
    Ok(())
}

/// Claims up to `limit` attempts whose outcome is open and that nobody
/// holds, oldest look first, for the reconciler: each is held for
/// [`CLAIM_SECONDS`], and a look that resolves nothing releases it.
pub async fn claim_unresolved(db: &PgPool, limit: i64) -> Result<Vec<Attempt>, sqlx::Error> {
    let sql = concat!(
        "UPDATE payment_attempts SET claimed_until = now() + make_interval(secs => $2), updated_at = now()
          WHERE id IN (SELECT id FROM payment_attempts
                        WHERE status = 'settling' AND (claimed_until IS NULL OR claimed_until <= now())
                        ORDER BY updated_at LIMIT $1 FOR UPDATE SKIP LOCKED)
         RETURNING ",
        attempt_columns!()
    );
    sqlx::query_as(sql).bind(limit).bind(f64::from(CLAIM_SECONDS)).fetch_all(db).await
}
