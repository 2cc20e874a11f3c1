//! Creating a task, end to end: the one domain call behind
//! `POST /v1/tasks/{kind}`, so the Lambda, `reeve serve` and the tests run
//! the same steps.
//!
//! In order, stopping at the first failure:
//! 1. the kind exists and the input is an object matching its schema;
//! 2. an `Idempotency-Key` used before answers its task again (a task still
//!    `queued` has its message re-sent, as that message may have been lost);
//! 3. every upload the input names is this space's and has arrived;
//! 4. a priced task is paid: with a `PAYMENT-SIGNATURE`, or else with a
//!    credit the space holds for that price, or else it is refused with the
//!    x402 challenge;
//! 5. the task is stored and queued.
//!
//! **Payment order.** The attempt is recorded (unique on network, payer and
//! nonce) before the facilitator is asked anything; then `/verify`, then
//! `/settle`, then the task is stored in the transaction that marks the
//! attempt settled, then queued. Settling comes before the work because the
//! work can outlive the authorisation's `validBefore`.
//!
//! **An unknown outcome.** A settle that times out, drops, or gets a 5xx may
//! or may not be on chain. Its attempt stays `settling` and the client is
//! told to retry with the same signature. The retry settles again, and:
//! - success: the transfer happened now; one task;
//! - "nonce already used": the authorisation is spent on chain. Only its
//!   holder could have spent it, and Reeve had just sent it to be settled to
//!   its own `payTo`, so Reeve takes it as its earlier settlement landing:
//!   one task, with the transaction hash unknown. (A payer who signed a
//!   second authorisation with the same nonce and spent it elsewhere in
//!   between would get this one task unpaid; that needs them to make our
//!   settle time out, and gains them one task at most.)
//! - any other refusal: the payment never went through: a clear `402`.
//!
//! An attempt is held by one request at a time (a claim that expires), and
//! the task is inserted only by the update that moves the attempt from
//! `settling` to `settled`, so one payment buys at most one task.

use std::collections::HashSet;

use serde_json::{Value, json};
use sqlx::PgPool;

use super::input::{self, MAX_UPLOADS};
use super::{EventType, NewTask, Task, TaskStatus, append_event, find_by_idempotency_key, insert_queued};
use crate::auth::SpaceIndex;
use crate::catalog::{Catalog, TaskSpec};
use crate::ids::Id;
use crate::payments::ledger::{self, AttemptStatus, NewAttempt, SettledPayment};
use crate::payments::payload::{self, Payment};
use crate::payments::{
    Credit, Facilitator, FacilitatorError, PaymentRequired, PaymentRequirements, PaymentResponse, SIGNATURE_REQUIRED,
};
use crate::uploads::{self, UploadError};

/// What [`submit`] needs from the process.
pub struct SubmitContext<'a> {
    pub catalog: &'a Catalog,
    pub db: &'a PgPool,
    pub s3: &'a aws_sdk_s3::Client,
    pub bucket: &'a str,
    pub sqs: &'a aws_sdk_sqs::Client,
    pub queue_url: &'a str,
    /// `None` when the deployment has no usable facilitator.
    pub facilitator: Option<&'a Facilitator>,
}

/// One create request, as the HTTP layer extracted it.
#[derive(Debug, Clone, Copy)]
pub struct Submission<'a> {
    pub space: &'a SpaceIndex,
    pub kind: &'a str,
    pub input: &'a Value,
    pub idempotency_key: Option<&'a str>,
    /// The `PAYMENT-SIGNATURE` header, as sent.
    pub payment: Option<&'a str>,
    /// The URL the client posted to, for the challenge's `resource`.
    pub resource_url: &'a str,
}

#[derive(Debug)]
pub struct Submitted {
    pub task: Task,
    /// An earlier request's task, answered again.
    pub replayed: bool,
    pub paid: Paid,
}

#[derive(Debug)]
pub enum Paid {
    /// A free task, or a replay (it was paid, if at all, back then).
    Nothing,
    /// Settled now: the `PAYMENT-RESPONSE` to send.
    Payment(PaymentResponse),
    /// Paid with this credit.
    Credit(Credit),
}

/// Why a task was not created. `From<SubmitError> for ApiError` (in the HTTP
/// layer) gives each its status and stable code.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("unknown task kind")]
    UnknownTask(String),
    #[error("input is not an object")]
    InputNotObject,
    #[error("input does not match the schema")]
    InvalidInput(String),
    #[error("idempotency key already used for a different request")]
    IdempotencyConflict,
    #[error("{code}: {message}")]
    Upload { code: &'static str, message: String },
    #[error("object storage unavailable")]
    StorageUnavailable,
    /// No payment and no credit: the challenge.
    #[error("payment required")]
    PaymentRequired(PaymentRequired),
    #[error("invalid payment: {0}")]
    InvalidPayment(String),
    /// `accepted` is none of this kind's requirements.
    #[error("payment does not match")]
    PaymentMismatch(PaymentRequired),
    /// This authorisation already paid for a task, or is another request's.
    #[error("payment replayed")]
    PaymentReplayed(PaymentRequired),
    /// The facilitator's `/verify` refused it; nothing was charged.
    #[error("payment invalid: {reason}")]
    PaymentInvalid { challenge: PaymentRequired, reason: String },
    /// The facilitator's `/settle` refused it; nothing was charged.
    #[error("payment failed: {reason}")]
    PaymentFailed { challenge: PaymentRequired, reason: String },
    /// Another request is settling this very payment right now.
    #[error("payment in progress")]
    PaymentInProgress,
    /// A `payment-identifier` id used before with another payment or request.
    #[error("payment identifier reused")]
    PaymentIdentifierConflict,
    /// Unreachable, a 5xx, or no answer. `outcome_unknown`: the settle may
    /// have gone through; the same request again resolves it.
    #[error("facilitator unavailable")]
    FacilitatorUnavailable { outcome_unknown: bool },
    /// Stored, but SQS refused the message: the task is `failed` (and, if
    /// paid, credited).
    #[error("queue unavailable")]
    QueueUnavailable,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("internal: {0}")]
    Internal(String),
}

/// Creates (or answers again) a task. See the module documentation.
pub async fn submit(cx: &SubmitContext<'_>, s: Submission<'_>) -> Result<Submitted, SubmitError> {
    let spec = cx.catalog.task(s.kind).ok_or_else(|| SubmitError::UnknownTask(s.kind.to_owned()))?;
    if !s.input.is_object() {
        return Err(SubmitError::InputNotObject);
    }
    let (violations, total) = input::violations(spec, s.input);
    if total > 0 {
        return Err(SubmitError::InvalidInput(input::describe_violations(&violations, total)));
    }
    if let Some(key) = s.idempotency_key {
        let found = find_by_idempotency_key(cx.db, s.space, key, s.kind, s.input).await.map_err(|e| match e {
            super::CreateError::IdempotencyConflict => SubmitError::IdempotencyConflict,
            super::CreateError::Db(db) => SubmitError::Db(db),
        })?;
        if let Some(task) = found {
            return Ok(replay(cx, task).await);
        }
    }
    check_uploads(cx, s.space, s.input).await?;

    if spec.is_free() {
        return match store(cx.db, &s).await? {
            (task, false) => queue(cx, task, Paid::Nothing).await,
            (task, true) => Ok(replay(cx, task).await),
        };
    }
    let challenge = crate::payments::payment_required(cx.catalog, spec, s.resource_url, SIGNATURE_REQUIRED)
        .ok_or_else(|| SubmitError::Internal("a priced task without a payable challenge".into()))?;
    // Only what the facilitator settles is offered (payments::supported);
    // it is asked once per process, here rather than at a Lambda's init.
    let challenge = match cx.facilitator {
        Some(facilitator) => match facilitator.known_kinds().await {
            Some(kinds) => crate::payments::settleable(challenge, &kinds, s.kind)
                .ok_or(SubmitError::FacilitatorUnavailable { outcome_unknown: false })?,
            None => challenge,
        },
        None => challenge,
    };
    match s.payment {
        Some(header) => pay(cx, &s, spec, challenge, header).await,
        None => with_credit(cx, &s, challenge).await,
    }
}

/// An earlier request's task. One still `queued` may have lost its message
/// (a crash between commit and send), so it is sent again; duplicate
/// messages are harmless, as the worker claims a task once.
async fn replay(cx: &SubmitContext<'_>, task: Task) -> Submitted {
    if task.status == TaskStatus::Queued
        && let Err(e) = super::enqueue(cx.sqs, cx.queue_url, task.id, &task.kind).await
    {
        tracing::warn!(task_id = %task.id, error = %e, "could not re-send a replayed task's message");
    }
    Submitted { task, replayed: true, paid: Paid::Nothing }
}

/// Inserts the task in its own transaction. `true`: a key taken meanwhile by
/// the same request answers that task (the caller's replay check raced it).
async fn store(db: &PgPool, s: &Submission<'_>) -> Result<(Task, bool), SubmitError> {
    let new = NewTask { space: s.space, kind: s.kind, input: s.input, idempotency_key: s.idempotency_key };
    match super::create(db, new).await {
        Ok(super::Created::New(task)) => Ok((task, false)),
        Ok(super::Created::Replayed(task)) => Ok((task, true)),
        Err(super::CreateError::IdempotencyConflict) => Err(SubmitError::IdempotencyConflict),
        Err(super::CreateError::Db(e)) => Err(e.into()),
    }
}

/// Sends the stored task to the queue. If SQS refuses, the task is failed
/// with `queue_unavailable` (a paid one leaves a credit) rather than left
/// `queued` with no message.
async fn queue(cx: &SubmitContext<'_>, task: Task, paid: Paid) -> Result<Submitted, SubmitError> {
    tracing::info!(task_id = %task.id, kind = %task.kind, "task stored");
    if let Err(e) = super::enqueue(cx.sqs, cx.queue_url, task.id, &task.kind).await {
        tracing::error!(task_id = %task.id, error = %e, "queue unavailable; failing the task");
        if let Err(db) = fail_unqueued(cx.db, task.id).await {
            tracing::error!(task_id = %task.id, error = %db, "could not mark the unqueued task failed");
        }
        return Err(SubmitError::QueueUnavailable);
    }
    Ok(Submitted { task, replayed: false, paid })
}

async fn fail_unqueued(db: &PgPool, id: Id) -> Result<(), sqlx::Error> {
    const CODE: &str = "queue_unavailable";
    let error = super::task_error(CODE, "the task could not be queued");
    let mut tx = db.begin().await?;
    let moved = sqlx::query(
        "UPDATE tasks SET status = 'failed', error = $2, lease_until = NULL, updated_at = now()
          WHERE id = $1 AND status = 'queued'",
    )
    .bind(id)
    .bind(sqlx::types::Json(&error))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if moved == 1 {
        append_event(&mut tx, id, EventType::Error, &error).await?;
        append_event(&mut tx, id, EventType::Status, &json!({ "status": "failed", "error": error })).await?;
        crate::payments::credit_if_owed(&mut tx, id, CODE).await?;
    }
    tx.commit().await
}

/// Every upload the input names must be this space's and have arrived.
async fn check_uploads(cx: &SubmitContext<'_>, space: &SpaceIndex, input: &Value) -> Result<(), SubmitError> {
    let upload = |code: &'static str, message: String| SubmitError::Upload { code, message };
    let refs = input::upload_refs(input);
    let mut seen = HashSet::new();
    let mut ids = Vec::new();
    for r in &refs {
        let Some(id) = r.id else {
            return Err(upload(
                "unknown_upload",
                format!("{} is not an upload id (expected the 26-character id from POST /v1/uploads)", r.pointer),
            ));
        };
        if seen.insert(id) {
            ids.push((id, r.pointer.as_str()));
        }
    }
    if ids.len() > MAX_UPLOADS {
        return Err(SubmitError::InvalidInput(format!(
            "a task may use at most {MAX_UPLOADS} uploads; this input names {}",
            ids.len()
        )));
    }
    for (id, pointer) in ids {
        match uploads::ensure_uploaded(cx.db, cx.s3, cx.bucket, space, id).await {
            Ok(()) => {}
            Err(UploadError::NotFound(_)) => {
                return Err(upload("unknown_upload", format!("upload {id} (at {pointer}) not found in this space")));
            }
            Err(UploadError::NotUploaded(_)) => {
                return Err(upload(
                    "upload_not_ready",
                    format!("upload {id} (at {pointer}) has not arrived yet; PUT the file to its upload URL first"),
                ));
            }
            Err(UploadError::Rejected(_)) => {
                return Err(upload(
                    "upload_rejected",
                    format!("upload {id} (at {pointer}) was rejected: it did not match its declared size or type"),
                ));
            }
            Err(UploadError::Storage(cause)) => {
                tracing::error!(upload_id = %id, error = %cause, "storage unavailable checking an upload");
                return Err(SubmitError::StorageUnavailable);
            }
            Err(UploadError::Db(e)) => return Err(e.into()),
        }
    }
    Ok(())
}

fn with_error(challenge: &PaymentRequired, code: &str) -> PaymentRequired {
    PaymentRequired { error: code.to_owned(), ..challenge.clone() }
}

/// No signature: a credit of this space for one of the kind's prices pays,
/// else the challenge.
async fn with_credit(
    cx: &SubmitContext<'_>,
    s: &Submission<'_>,
    challenge: PaymentRequired,
) -> Result<Submitted, SubmitError> {
    let prices: Vec<(String, String, String)> =
        challenge.accepts.iter().map(|a| (a.network.clone(), a.asset.clone(), a.amount.clone())).collect();
    let mut tx = cx.db.begin().await?;
    let new = NewTask { space: s.space, kind: s.kind, input: s.input, idempotency_key: s.idempotency_key };
    let Some(task) = insert_queued(&mut tx, new).await? else {
        // The key was taken meanwhile: by this same request, or a conflict.
        tx.rollback().await?;
        let key = s.idempotency_key.expect("only a key can conflict");
        return match find_by_idempotency_key(cx.db, s.space, key, s.kind, s.input).await {
            Ok(Some(task)) => Ok(replay(cx, task).await),
            Ok(None) => Err(SubmitError::Internal("an idempotency key taken by a vanished task".into())),
            Err(super::CreateError::IdempotencyConflict) => Err(SubmitError::IdempotencyConflict),
            Err(super::CreateError::Db(e)) => Err(e.into()),
        };
    };
    let Some(credit) = ledger::spend_credit(&mut tx, s.space, &prices, task.id).await? else {
        tx.rollback().await?;
        return Err(SubmitError::PaymentRequired(challenge));
    };
    let data = json!({
        "credit_id": credit.id,
        "network": credit.network,
        "asset": credit.asset,
        "amount": credit.amount,
        "source_task": credit.source_task,
    });
    append_event(&mut tx, task.id, EventType::CreditUsed, &data).await?;
    tx.commit().await?;
    tracing::info!(task_id = %task.id, credit_id = %credit.id, "task paid with a credit");
    queue(cx, task, Paid::Credit(credit)).await
}

/// Does a facilitator's reason say the authorisation's nonce is spent?
fn nonce_already_used(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| r.contains("nonce_already_used") || r.contains("authorization_used"))
}

async fn pay(
    cx: &SubmitContext<'_>,
    s: &Submission<'_>,
    spec: &TaskSpec,
    challenge: PaymentRequired,
    header: &str,
) -> Result<Submitted, SubmitError> {
    let _ = spec;
    let payment = payload::decode(header).map_err(SubmitError::InvalidPayment)?;
    let Some(offer) = challenge.accepts.iter().find(|o| payment.accepted.matches(o)).cloned() else {
        return Err(SubmitError::PaymentMismatch(with_error(&challenge, "payment_mismatch")));
    };
    let Some(facilitator) = cx.facilitator else {
        tracing::error!("a payment arrived but no facilitator client could be built");
        return Err(SubmitError::FacilitatorUnavailable { outcome_unknown: false });
    };
    let request_hash = input::request_hash(s.kind, s.input);
    if let Some(id) = &payment.payment_id
        && let Some(earlier) = ledger::find_by_payment_id(cx.db, s.space, id).await?
        && (earlier.payload_hash != payment.hash || earlier.request_hash != request_hash)
    {
        return Err(SubmitError::PaymentIdentifierConflict);
    }

    let new = NewAttempt {
        network: &offer.network,
        payer: &payment.payer,
        nonce: &payment.nonce,
        payload_hash: &payment.hash,
        space: s.space,
        kind: s.kind,
        request_hash: &request_hash,
        payment_id: payment.payment_id.as_deref(),
        asset: &offer.asset,
        amount: &offer.amount,
    };
    let inserted = match ledger::insert_attempt(cx.db, &new).await {
        Ok(inserted) => inserted,
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => return Err(SubmitError::PaymentIdentifierConflict),
        Err(e) => return Err(e.into()),
    };
    let (attempt, resuming) = match inserted {
        Some(id) => (id, false),
        None => {
            let Some(earlier) = ledger::find_attempt(cx.db, &offer.network, &payment.payer, &payment.nonce).await?
            else {
                return Err(SubmitError::PaymentInProgress);
            };
            let same = earlier.space == s.space.as_bytes()
                && earlier.request_hash == request_hash
                && earlier.payload_hash == payment.hash;
            match earlier.status {
                AttemptStatus::Settled => {
                    // Named with a payment-identifier, the same payment for
                    // the same request is that request again: its task.
                    if same
                        && payment.payment_id.is_some()
                        && earlier.payment_id == payment.payment_id
                        && let Some(task_id) = earlier.task_id
                        && let Some(task) = super::find_for_space(cx.db, s.space, task_id).await?
                    {
                        return Ok(replay(cx, task).await);
                    }
                    return Err(SubmitError::PaymentReplayed(with_error(&challenge, "payment_replayed")));
                }
                _ if !same => return Err(SubmitError::PaymentReplayed(with_error(&challenge, "payment_replayed"))),
                _ if earlier.claimed => return Err(SubmitError::PaymentInProgress),
                status => {
                    if !ledger::claim_attempt(cx.db, earlier.id, status).await? {
                        return Err(SubmitError::PaymentInProgress);
                    }
                    (earlier.id, status == AttemptStatus::Settling)
                }
            }
        }
    };

    let transaction = settle(cx, facilitator, &payment, &offer, &challenge, attempt, resuming).await?;
    let task = match store_paid(cx.db, s, &payment, &offer, attempt, transaction.as_deref()).await {
        Ok(task) => task,
        Err(e) => {
            // Paid, and the task not stored: let the client's retry resolve it
            // at once rather than after the claim expires.
            let _ = ledger::release_attempt(cx.db, attempt, "settled; the task could not be stored").await;
            return Err(e);
        }
    };
    let response = PaymentResponse {
        success: true,
        transaction: transaction.unwrap_or_default(),
        network: offer.network.clone(),
        payer: payment.payer.clone(),
    };
    queue(cx, task, Paid::Payment(response)).await
}

/// Verifies (unless resuming an unknown outcome: that authorisation may be
/// spent already) and settles. `Ok(Some(hash))` settled now; `Ok(None)`
/// settled by an earlier call whose answer was lost.
async fn settle(
    cx: &SubmitContext<'_>,
    facilitator: &Facilitator,
    payment: &Payment,
    offer: &PaymentRequirements,
    challenge: &PaymentRequired,
    attempt: Id,
    resuming: bool,
) -> Result<Option<String>, SubmitError> {
    let db = cx.db;
    if !resuming {
        match facilitator.verify(&payment.document, offer).await {
            Ok(v) if v.is_valid => {}
            Ok(v) => {
                let reason = v.invalid_reason.unwrap_or_else(|| "invalid_payment".into());
                tracing::info!(%reason, message = ?v.invalid_message, "facilitator: payment invalid");
                ledger::fail_attempt(db, attempt, &reason).await?;
                return Err(SubmitError::PaymentInvalid {
                    challenge: with_error(challenge, "payment_invalid"),
                    reason,
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "facilitator /verify failed");
                ledger::fail_attempt(db, attempt, "facilitator_unavailable").await?;
                return Err(SubmitError::FacilitatorUnavailable { outcome_unknown: false });
            }
        }
    }
    match facilitator.settle(&payment.document, offer).await {
        Ok(settled) if settled.success && !settled.transaction.is_empty() => {
            tracing::info!(transaction = %settled.transaction, "payment settled");
            Ok(Some(settled.transaction))
        }
        Ok(settled) if resuming && nonce_already_used(settled.error_reason.as_deref()) => {
            tracing::warn!(attempt = %attempt, "an earlier settle of this payment went through; its answer was lost");
            Ok(None)
        }
        Ok(settled) => {
            let reason = settled.error_reason.unwrap_or_else(|| "settle_failed".into());
            tracing::info!(%reason, message = ?settled.error_message, "facilitator: settle failed");
            ledger::fail_attempt(db, attempt, &reason).await?;
            Err(SubmitError::PaymentFailed { challenge: with_error(challenge, "payment_failed"), reason })
        }
        // Nothing reached it: a fresh attempt was not charged. A resumed one
        // may have been, earlier: it stays open for the next retry.
        Err(FacilitatorError::Unreachable(e)) if !resuming => {
            tracing::error!(error = %e, "facilitator /settle unreachable");
            ledger::fail_attempt(db, attempt, "facilitator_unavailable").await?;
            Err(SubmitError::FacilitatorUnavailable { outcome_unknown: false })
        }
        Err(e) => {
            tracing::error!(error = %e, attempt = %attempt, "facilitator /settle outcome unknown");
            ledger::release_attempt(db, attempt, "settle outcome unknown").await?;
            Err(SubmitError::FacilitatorUnavailable { outcome_unknown: true })
        }
    }
}

/// The task and its payment, in one transaction with the attempt's move to
/// `settled`: either all three are written or none.
async fn store_paid(
    db: &PgPool,
    s: &Submission<'_>,
    payment: &Payment,
    offer: &PaymentRequirements,
    attempt: Id,
    transaction: Option<&str>,
) -> Result<Task, SubmitError> {
    let mut tx = db.begin().await?;
    let new = NewTask { space: s.space, kind: s.kind, input: s.input, idempotency_key: s.idempotency_key };
    let task = match insert_queued(&mut tx, new).await? {
        Some(task) => task,
        // The key was taken while this payment settled: the payer still paid
        // for a task of their own, so it is stored without the key.
        None => insert_queued(&mut tx, NewTask { idempotency_key: None, ..new })
            .await?
            .ok_or_else(|| SubmitError::Internal("a task without a key could not be inserted".into()))?,
    };
    let recorded = ledger::record_settled(
        &mut tx,
        &SettledPayment {
            attempt,
            task_id: task.id,
            space: s.space,
            network: &offer.network,
            payer: &payment.payer,
            asset: &offer.asset,
            amount: &offer.amount,
            pay_to: &offer.pay_to,
            transaction,
        },
    )
    .await?;
    if !recorded {
        tx.rollback().await?;
        return Err(SubmitError::PaymentInProgress);
    }
    tx.commit().await?;
    Ok(task)
}
