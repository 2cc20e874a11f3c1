//! What Reeve remembers about payments, in Postgres: every attempt (before
//! the facilitator settles it), every settled payment, and the credits that
//! paid tasks leave when they end without doing their work.
//!
//! One file, though long: every statement that writes payment attempts,
//! payments and credits, so the attempt's states and the locks each change
//! takes are read in one place.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor, PgPool};
use time::OffsetDateTime;
use utoipa::ToSchema;

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
/// transaction that did not pay `payTo` exactly (see [`super::proof`]).
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

/// The columns a [`Credit`] is read from, as a literal for `concat!`.
macro_rules! credit_columns {
    () => {
        "id, network, asset, amount, source_task, reason, spent_by, created_at"
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
              input, idempotency_key, pay_to, valid_before, claimed_until, scheme, document, status)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15::numeric,
                 now() + make_interval(secs => $16),
                 CASE WHEN $17::jsonb IS NULL THEN 'exact' ELSE 'upto' END, $17,
                 CASE WHEN $17::jsonb IS NULL THEN 'settling' ELSE 'verifying' END)
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
    /// The transaction that paid (see [`super::proof`]).
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
/// only the update that moved it to `settled` gets here.
async fn insert_payment(conn: &mut PgConnection, p: &SettledPayment<'_>) -> Result<(), sqlx::Error> {
    crate::infra::metrics::payment_settled(p.network, p.asset);
    sqlx::query(
        "INSERT INTO payments (id, task_id, network, payer, amount, asset, transaction, space_idx, pay_to)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
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
    .execute(&mut *conn)
    .await?;
    Ok(())
}

// ------------------------------------------------------------ metered (upto)
//
// An `upto` attempt is `verifying` while its create asks `/verify`, then
// `authorized` with its task, and only when the task ends `capturing` (the
// worker sent the used amount to be settled), then `settled` (charged) or
// `failed` (the capture was refused); or `released`, nothing charged. Each
// move that changes what the buyer sees rewrites the task's `payment` in
// the same statement.

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
    db: &PgPool,
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
    // An upload checked at create and gone when the task ran: the bucket
    // expired it, which is Reeve's doing, not the input's.
    "upload_missing",
    // A cancel of a task that never started (its caller passes this code
    // only for a task that was still queued).
    "canceled",
];

/// Leaves a credit on the task's space if the task was paid for (with a
/// payment or a credit) and `code` is one that earns one. Call it in the
/// transaction that moves the task to `failed` or `canceled`; it is a no-op
/// for a free task and for a task already credited.
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
                LIMIT 1) paid ON true
          WHERE t.id = $2
         ON CONFLICT (source_task) DO NOTHING
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
pub async fn receipt(db: &PgPool, task: Id) -> Result<Option<super::PaymentResponse>, sqlx::Error> {
    let row: Option<(Option<String>, String, String)> =
        sqlx::query_as("SELECT transaction, network, payer FROM payments WHERE task_id = $1")
            .bind(task)
            .fetch_optional(db)
            .await?;
    Ok(row
        .map(|(transaction, network, payer)| super::PaymentResponse::settled(transaction.as_deref(), &network, &payer)))
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
