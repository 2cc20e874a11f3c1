//! Paying for one request, or refusing: [`pay`], the one call behind every
//! priced task create (`POST /v1/tasks/{kind}`, and an MCP tool call). It
//! owns the whole order that keeps "no charge without a task, no task
//! without a charge":
//!
//! 1. The payment is decoded and must be one of the kind's requirements.
//! 2. The attempt is recorded, claimed by this request, with the whole
//!    request it pays for (kind, input, `Idempotency-Key`, space), before
//!    the facilitator is asked anything. It is unique on the authorization
//!    (network, payer, nonce), on an open `Idempotency-Key` and on a
//!    `payment-identifier` id, so one authorization, one key and one id each
//!    buy at most one task, whoever sends them and however often.
//! 3. `/verify`, then `/settle`, each bounded by the request's deadline.
//! 4. Settled: the task is stored in the transaction that moves the attempt
//!    to `settled` ([`Counter::store`]), so the two are written together or
//!    not at all.
//!
//! **Refused** by the facilitator (a verdict, no transaction): the attempt is
//! `failed`, nothing was charged, and the client is told so.
//!
//! **Unknown** (`settlement_pending`, a timeout, a dropped connection, a 5xx,
//! the deadline, or a refusal that carries a transaction hash): the chain may
//! still charge it. The attempt stays `settling`, released, and the answer is
//! [`PayError::Pending`] (`409 payment_pending` with `Retry-After`): never a
//! refusal that says nothing was charged. The server then resolves it from
//! the chain (`payments::reconcile`, in every sweep), and a retry of the same
//! signature, or of the same `Idempotency-Key` with the same request,
//! answers what it became: the one task, or `payment_not_settled`.
//!
//! The task itself is the caller's: `payments` never names a task type. The
//! caller passes a [`Counter`], which stores the request as a task inside
//! the payment's transaction.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::challenge::{PaymentRequired, PaymentRequirements};
use super::counter::{Counter, Note, Purchase, store_in};
use super::facilitator::{Facilitator, FacilitatorError, Settled};
use super::ledger::{self, AttemptStatus, Credit, NewAttempt, SettledPayment};
use super::payload::{Payment, PaymentInput};
use super::reconcile::{Resolution, resolve_claimed};
use super::{PaymentResponse, chain};
use crate::domain::ids::Id;

/// How long a client is asked to wait before it sends a pending payment
/// again: about the time a settlement takes to be mined and seen.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// What a payment is checked against and settled with.
#[derive(Clone, Copy)]
pub struct Checkout<'a> {
    pub db: &'a PgPool,
    /// `None` when the deployment has no usable facilitator: a payment is
    /// then refused before anything is charged.
    pub facilitator: Option<&'a Facilitator>,
    /// Each network's JSON-RPC endpoint, to learn from the chain what an
    /// unknown settlement became.
    pub chains: &'a chain::Chains,
}

/// One request to pay for: the purchase, how the client paid (if it did),
/// and when the answer is due.
#[derive(Debug, Clone, Copy)]
pub struct Order<'a> {
    pub purchase: Purchase<'a>,
    /// `None`: no payment was sent; a credit of the space may pay, or the
    /// answer is the challenge.
    pub payment: Option<PaymentInput<'a>>,
    /// When the caller must have answered (a Lambda invocation's deadline).
    /// The facilitator calls stop [`STORE_MARGIN`] before it; a settle cut
    /// off there is an unknown outcome, left to the reconciler.
    pub deadline: Option<Instant>,
}

/// Kept free before the deadline for storing the task and queueing it.
pub const STORE_MARGIN: Duration = Duration::from_secs(4);
/// A facilitator call is not started with less time than this left: it
/// could not finish, and a settle that cannot finish only makes an unknown
/// outcome out of a payment that was never sent.
const MIN_CALL: Duration = Duration::from_secs(2);

/// What the request bought.
#[derive(Debug)]
pub enum Bought<T> {
    /// Settled now: the task, and the `PAYMENT-RESPONSE` to send.
    Settled { task: T, settlement: PaymentResponse },
    /// Paid with this credit.
    Credit { task: T, credit: Credit },
    /// This very request was paid for before: the same payment sent again by
    /// the same Space for the same request (a client whose answer was lost,
    /// or that was told its payment was pending), or the same
    /// `Idempotency-Key`. The task it bought, answered again with the
    /// receipt stored when it was paid (`None` for a task paid otherwise),
    /// never a second charge nor an error that makes a client sign again.
    Before { task: Id, receipt: Option<PaymentResponse> },
    /// No payment, and the `Idempotency-Key` was taken meanwhile by another
    /// task: the caller answers that one (or a conflict).
    KeyTaken,
}

/// Why nothing was bought. Each says whether anything was charged.
#[derive(Debug, thiserror::Error)]
pub enum PayError {
    /// No payment and no credit: the challenge.
    #[error("payment required")]
    Required(Box<PaymentRequired>),
    /// Not an x402 v2 exact payment at all.
    #[error("invalid payment: {0}")]
    Malformed(String),
    /// `accepted` is none of this kind's requirements.
    #[error("payment does not match")]
    Mismatch(Box<PaymentRequired>),
    /// This authorization already paid for a task, or is another request's.
    #[error("payment replayed")]
    Replayed(Box<PaymentRequired>),
    /// The facilitator's `/verify` refused it; nothing was charged.
    #[error("payment invalid: {reason}")]
    Invalid { challenge: Box<PaymentRequired>, reason: String },
    /// The facilitator's `/settle` refused it; nothing was charged. The
    /// settlement (`success: false`) goes back in `PAYMENT-RESPONSE`.
    #[error("payment failed: {reason}")]
    Failed { challenge: Box<PaymentRequired>, reason: String, settlement: Box<PaymentResponse> },
    /// An earlier unknown outcome of this payment was resolved from the
    /// chain: its authorization expired unused, so nothing was charged.
    #[error("payment not settled")]
    NotSettled(Box<PaymentRequired>),
    /// The chain may still charge this payment (or this key's): the
    /// outcome is being resolved. Send the same request again after
    /// `retry_after`; never sign a new payment for it meanwhile.
    #[error("payment pending")]
    Pending { retry_after: Duration },
    /// Another request is settling this very payment right now.
    #[error("payment in progress")]
    InProgress,
    /// Another request with this `Idempotency-Key` is being paid right now.
    #[error("request in progress")]
    RequestInProgress,
    /// A `payment-identifier` id used before with another payment or request.
    #[error("payment identifier reused")]
    IdentifierConflict,
    /// The `Idempotency-Key` was paid for with another request.
    #[error("idempotency key already used for a different request")]
    IdempotencyConflict,
    /// The facilitator could not be asked, or not in time; nothing was
    /// charged.
    #[error("facilitator unavailable")]
    FacilitatorUnavailable,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

// The challenges are boxed: they are large, and every result carries them.
fn with_error(challenge: &PaymentRequired, code: &str) -> Box<PaymentRequired> {
    Box::new(PaymentRequired { error: code.to_owned(), ..challenge.clone() })
}

/// Pays for `order` against `challenge` (the kind's requirements), or
/// refuses. See the module documentation for the order of things.
pub async fn pay<C: Counter>(
    cx: Checkout<'_>,
    order: Order<'_>,
    challenge: &PaymentRequired,
    counter: &C,
) -> Result<Bought<C::Task>, PayError> {
    match order.payment {
        Some(payment) => with_payment(cx, &order, payment, challenge, counter).await,
        None => with_credit(cx.db, &order.purchase, challenge, counter).await,
    }
}

/// No payment: a credit of the space for one of the kind's prices pays,
/// else the challenge.
async fn with_credit<C: Counter>(
    db: &PgPool,
    purchase: &Purchase<'_>,
    challenge: &PaymentRequired,
    counter: &C,
) -> Result<Bought<C::Task>, PayError> {
    let prices: Vec<(String, String, String)> =
        challenge.accepts.iter().map(|a| (a.network.clone(), a.asset.clone(), a.amount.clone())).collect();
    let mut tx = db.begin().await?;
    let Some(task) = counter.store(&mut tx, purchase).await? else {
        tx.rollback().await?;
        return Ok(Bought::KeyTaken);
    };
    let Some(credit) = ledger::spend_credit(&mut tx, purchase.space, &prices, C::task_id(&task)).await? else {
        tx.rollback().await?;
        return Err(PayError::Required(Box::new(challenge.clone())));
    };
    counter.note(&mut tx, &task, &Note::Credit(&credit)).await?;
    tx.commit().await?;
    tracing::info!(task_id = %C::task_id(&task), credit_id = %credit.id, "task paid with a credit");
    Ok(Bought::Credit { task, credit })
}

async fn with_payment<C: Counter>(
    cx: Checkout<'_>,
    order: &Order<'_>,
    input: PaymentInput<'_>,
    challenge: &PaymentRequired,
    counter: &C,
) -> Result<Bought<C::Task>, PayError> {
    let purchase = &order.purchase;
    let payment = input.decode().map_err(PayError::Malformed)?;
    let Some(offer) = challenge.accepts.iter().find(|o| payment.accepted.matches(o)).cloned() else {
        return Err(PayError::Mismatch(with_error(challenge, "payment_mismatch")));
    };
    let Some(facilitator) = cx.facilitator else {
        tracing::error!("a payment arrived but no facilitator client could be built");
        return Err(PayError::FacilitatorUnavailable);
    };
    let request_hash = crate::infra::canonical_json::request_hash(purchase.kind, purchase.input);
    if let Some(id) = &payment.payment_id
        && let Some(earlier) = ledger::find_by_payment_id(cx.db, purchase.space, id).await?
        && (earlier.payload_hash != payment.hash || earlier.request_hash != request_hash)
    {
        // An id whose payment charged nothing may name a new one.
        if earlier.status != AttemptStatus::Failed || !ledger::release_payment_id(cx.db, earlier.id).await? {
            return Err(PayError::IdentifierConflict);
        }
    }

    let new = NewAttempt {
        network: &offer.network,
        payer: &payment.payer,
        nonce: &payment.nonce,
        payload_hash: &payment.hash,
        space: purchase.space,
        kind: purchase.kind,
        input: purchase.input,
        idempotency_key: purchase.idempotency_key,
        request_hash: &request_hash,
        payment_id: payment.payment_id.as_deref(),
        asset: &offer.asset,
        amount: &offer.amount,
        pay_to: &offer.pay_to,
        valid_before: &payment.valid_before,
    };
    let (attempt, resuming) = match ledger::insert_attempt(cx.db, &new).await? {
        Some(id) => (id, false),
        None => match collision(cx, order, &payment, &offer, &request_hash, challenge, counter).await? {
            Resume::Claimed { attempt, resuming } => (attempt, resuming),
            Resume::Answer(answer) => return *answer,
        },
    };

    let outcome = settle(cx, facilitator, &payment, &offer, challenge, attempt, resuming, order.deadline).await?;
    let settlement = PaymentResponse::settled(outcome.as_deref(), &offer.network, &payment.payer);
    let task = match store_paid(cx.db, purchase, &offer, &payment.payer, attempt, outcome.as_deref(), counter).await {
        Ok(task) => task,
        Err(e) => {
            // Charged, and the task not stored: the attempt stays `settling`,
            // released, so the reconciler (or a retry) stores it from the
            // chain rather than after the claim expires.
            let _ =
                ledger::release_attempt(cx.db, attempt, "settled; the task could not be stored", outcome.as_deref())
                    .await;
            return Err(e);
        }
    };
    Ok(Bought::Settled { task, settlement })
}

/// What a payment whose attempt already exists leads to.
enum Resume<T> {
    /// This request holds the attempt now.
    Claimed { attempt: Id, resuming: bool },
    /// The answer, without a facilitator call.
    Answer(Box<Result<Bought<T>, PayError>>),
}

/// The new attempt collided with an earlier one: the same authorization, an
/// open attempt with the same `Idempotency-Key`, or (raced) the same
/// `payment-identifier` id.
async fn collision<C: Counter>(
    cx: Checkout<'_>,
    order: &Order<'_>,
    payment: &Payment,
    offer: &PaymentRequirements,
    request_hash: &[u8; 32],
    challenge: &PaymentRequired,
    counter: &C,
) -> Result<Resume<C::Task>, PayError> {
    let purchase = &order.purchase;
    let answer = |a: Result<Bought<C::Task>, PayError>| Ok(Resume::Answer(Box::new(a)));
    if let Some(earlier) = ledger::find_attempt(cx.db, &offer.network, &payment.payer, &payment.nonce).await? {
        let same = earlier.space == purchase.space.as_bytes()
            && earlier.request_hash == request_hash
            && earlier.payload_hash == payment.hash;
        if !same {
            return answer(Err(PayError::Replayed(with_error(challenge, "payment_replayed"))));
        }
        return match earlier.status {
            // The same request with the same payment again, from the Space
            // that paid: what it bought, with its receipt. A client whose
            // connection dropped after the charge learns its task here.
            AttemptStatus::Settled => match earlier.task_id {
                Some(task) => answer(Ok(bought_before(cx.db, task).await?)),
                // Paid, and credited because its task could not be made.
                None => answer(Err(PayError::Replayed(with_error(challenge, "payment_replayed")))),
            },
            AttemptStatus::Failed if earlier.reason.as_deref() == Some(ledger::NOT_SETTLED) => {
                answer(Err(PayError::NotSettled(with_error(challenge, "payment_not_settled"))))
            }
            _ if earlier.claimed => answer(Err(PayError::InProgress)),
            status => {
                if !ledger::claim_attempt(cx.db, earlier.id, status).await? {
                    return answer(Err(PayError::InProgress));
                }
                if status == AttemptStatus::Failed {
                    // Refused before, nothing charged: tried afresh (the
                    // payer may have topped up meanwhile).
                    return Ok(Resume::Claimed { attempt: earlier.id, resuming: false });
                }
                // An unknown outcome: first ask the chain what it became.
                match resolve_claimed(cx.db, cx.chains, &earlier, counter).await? {
                    Resolution::Task(task) => answer(Ok(bought_before(cx.db, task).await?)),
                    Resolution::Credited => answer(Err(PayError::Replayed(with_error(challenge, "payment_replayed")))),
                    Resolution::NeverLanded => {
                        answer(Err(PayError::NotSettled(with_error(challenge, "payment_not_settled"))))
                    }
                    // Still open: settling again is safe (one authorization
                    // moves money once) and may learn the outcome now.
                    Resolution::Open { .. } => Ok(Resume::Claimed { attempt: earlier.id, resuming: true }),
                }
            }
        };
    }
    if let Some(key) = purchase.idempotency_key
        && let Some(holder) = ledger::find_by_idempotency_key(cx.db, purchase.space, key).await?
    {
        if holder.request_hash != request_hash {
            return answer(Err(PayError::IdempotencyConflict));
        }
        return answer(match (holder.status, holder.task_id) {
            (AttemptStatus::Settled, Some(task)) => bought_before(cx.db, task).await,
            // Paid, and credited because its task could not be made.
            (AttemptStatus::Settled, None) => Err(PayError::IdempotencyConflict),
            (_, _) if holder.claimed => Err(PayError::RequestInProgress),
            (_, _) => Err(PayError::Pending { retry_after: RETRY_AFTER }),
        });
    }
    // The only other unique: the payment-identifier id, taken meanwhile.
    answer(Err(PayError::IdentifierConflict))
}

/// What a payment already bought: task `task`, with the receipt stored when
/// it was paid. The one answer to a payment (or an `Idempotency-Key`) sent
/// again after it bought its task, on REST and MCP alike.
pub async fn bought_before<T>(db: &PgPool, task: Id) -> Result<Bought<T>, PayError> {
    Ok(Bought::Before { task, receipt: ledger::receipt(db, task).await? })
}

/// What is left of `deadline` for a facilitator call, after the margin;
/// `None` without a deadline. `Err`: too little to start one.
fn budget(deadline: Option<Instant>) -> Result<Option<Duration>, ()> {
    let Some(deadline) = deadline else { return Ok(None) };
    let left = deadline.saturating_duration_since(Instant::now()).saturating_sub(STORE_MARGIN);
    if left < MIN_CALL { Err(()) } else { Ok(Some(left)) }
}

/// Is this settle answer one whose outcome the chain still decides? The
/// official facilitator answers `settlement_pending` after broadcasting,
/// and any refusal that carries a transaction hash names a transaction that
/// was sent.
fn outcome_open(settled: &Settled) -> bool {
    !settled.transaction.is_empty()
        || settled.error_reason.as_deref().is_some_and(|r| r.contains("settlement_pending") || r.contains("pending"))
}

/// Does a facilitator's reason say the authorization's nonce is spent?
fn nonce_already_used(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| r.contains("nonce_already_used") || r.contains("authorization_used"))
}

/// Verifies (unless resuming an unknown outcome: that authorization may be
/// spent already) and settles. `Ok(Some(hash))` settled now; `Ok(None)`
/// settled by an earlier call whose answer was lost.
#[allow(clippy::too_many_arguments)]
async fn settle(
    cx: Checkout<'_>,
    facilitator: &Facilitator,
    payment: &Payment,
    offer: &PaymentRequirements,
    challenge: &PaymentRequired,
    attempt: Id,
    resuming: bool,
    deadline: Option<Instant>,
) -> Result<Option<String>, PayError> {
    let db = cx.db;
    let pending = || PayError::Pending { retry_after: RETRY_AFTER };
    if !resuming {
        let Ok(budget) = budget(deadline) else {
            ledger::fail_attempt(db, attempt, "deadline").await?;
            return Err(PayError::FacilitatorUnavailable);
        };
        match facilitator.verify(&payment.document, offer, budget).await {
            Ok(v) if v.is_valid => {}
            Ok(v) => {
                let reason = v.invalid_reason.unwrap_or_else(|| "invalid_payment".into());
                tracing::info!(%reason, message = ?v.invalid_message, "facilitator: payment invalid");
                ledger::fail_attempt(db, attempt, &reason).await?;
                return Err(PayError::Invalid { challenge: with_error(challenge, "payment_invalid"), reason });
            }
            // `/verify` moves no money, whatever became of it.
            Err(e) => {
                tracing::error!(error = %e, "facilitator /verify failed");
                ledger::fail_attempt(db, attempt, "facilitator_unavailable").await?;
                return Err(PayError::FacilitatorUnavailable);
            }
        }
    }
    let Ok(budget) = budget(deadline) else {
        return if resuming {
            ledger::release_attempt(db, attempt, "settle outcome unknown", None).await?;
            Err(pending())
        } else {
            // Verified, never sent to be settled: nothing can be charged.
            ledger::fail_attempt(db, attempt, "deadline").await?;
            Err(PayError::FacilitatorUnavailable)
        };
    };
    match facilitator.settle(&payment.document, offer, budget).await {
        Ok(settled) if settled.success && !settled.transaction.is_empty() => {
            tracing::info!(transaction = %settled.transaction, "payment settled");
            Ok(Some(settled.transaction))
        }
        Ok(settled) if resuming && nonce_already_used(settled.error_reason.as_deref()) => {
            tracing::warn!(%attempt, "an earlier settle of this payment went through; its answer was lost");
            Ok(None)
        }
        // A refusal of a resumed attempt proves nothing: the first settle
        // may still be pending on chain. Nor does one that names a
        // transaction it sent.
        Ok(settled) if resuming || outcome_open(&settled) => {
            let reason = settled.error_reason.unwrap_or_else(|| "settle outcome unknown".into());
            tracing::warn!(%attempt, %reason, transaction = %settled.transaction, "settle outcome unknown");
            let transaction = Some(settled.transaction.as_str()).filter(|t| !t.is_empty());
            ledger::release_attempt(db, attempt, &reason, transaction).await?;
            Err(pending())
        }
        Ok(settled) => {
            let reason = settled.error_reason.unwrap_or_else(|| "settle_failed".into());
            tracing::info!(%reason, message = ?settled.error_message, "facilitator: settle failed");
            ledger::fail_attempt(db, attempt, &reason).await?;
            let settlement = Box::new(PaymentResponse::refused(&reason, &offer.network, &payment.payer));
            Err(PayError::Failed { challenge: with_error(challenge, "payment_failed"), reason, settlement })
        }
        // Nothing reached it: a fresh attempt was not charged. A resumed one
        // may have been, earlier: it stays open.
        Err(FacilitatorError::Unreachable(e)) if !resuming => {
            tracing::error!(error = %e, "facilitator /settle unreachable");
            ledger::fail_attempt(db, attempt, "facilitator_unavailable").await?;
            Err(PayError::FacilitatorUnavailable)
        }
        Err(e) => {
            tracing::error!(error = %e, %attempt, "facilitator /settle outcome unknown");
            ledger::release_attempt(db, attempt, "settle outcome unknown", None).await?;
            Err(pending())
        }
    }
}

/// The task and its payment, in one transaction with the attempt's move to
/// `settled`: either all three are written or none.
async fn store_paid<C: Counter>(
    db: &PgPool,
    purchase: &Purchase<'_>,
    offer: &PaymentRequirements,
    payer: &str,
    attempt: Id,
    transaction: Option<&str>,
    counter: &C,
) -> Result<C::Task, PayError> {
    let mut tx = db.begin().await?;
    let task = store_in(&mut tx, purchase, counter).await?;
    let recorded = ledger::record_settled(
        &mut tx,
        &SettledPayment {
            attempt,
            task_id: C::task_id(&task),
            space: purchase.space,
            network: &offer.network,
            payer,
            asset: &offer.asset,
            amount: &offer.amount,
            pay_to: &offer.pay_to,
            transaction,
        },
    )
    .await?;
    if !recorded {
        tx.rollback().await?;
        return Err(PayError::InProgress);
    }
    tx.commit().await?;
    Ok(task)
}
