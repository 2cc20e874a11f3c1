//! Paying for one request with an `exact` payment, or refusing: the create
//! hook of [`Scheme::Exact`], reached through [`super::pay`] (the one call
//! behind every priced task create, `POST /v1/tasks/{kind}` and an MCP tool
//! call), and the credit that pays when no payment was sent. It owns the
//! whole order that keeps "no charge without a task, no task without a
//! charge":
//!
//! 1. The payment is decoded and must be one of the kind's requirements, and
//!    its `validBefore` no further away than the requirement's
//!    `maxTimeoutSeconds` (plus [`CLOCK_SKEW`]): an attempt is open for
//!    minutes at most.
//! 2. The attempt is recorded, claimed by this request, with the whole
//!    request it pays for (kind, input, `Idempotency-Key`, space), before
//!    the facilitator is asked anything. It is unique on the authorization
//!    (network, asset, payer, nonce), on an open `Idempotency-Key` and on a
//!    `payment-identifier` id, so one authorization, one key and one id each
//!    buy at most one task, whoever sends them and however often. A key is
//!    reserved under its lock ([`ledger::lock_key`]): a credit never pays
//!    for a key whose payment is pending, nor a payment for a key a credit
//!    has just used.
//! 3. `/verify` (beside it, the chain's block is recorded: where the search
//!    for the payment's transfer starts), then `/settle`, each bounded by the
//!    request's deadline.
//! 4. The chain proves the payment ([`super::proof`]): the transaction the
//!    facilitator named must have moved exactly the amount to `payTo` with
//!    this authorization. Then the task is stored in the transaction that
//!    moves the attempt to `settled` with that transaction's hash
//!    ([`Counter::store`]), so the two are written together or not at all.
//!
//! **Refused** by the facilitator (a verdict, no transaction): the attempt is
//! `failed`, nothing was charged, and the client is told so.
//!
//! **Not a payment**: the nonce was used by a transaction that paid `payTo`
//! nothing (the payer's own transfer elsewhere, say, which beat the
//! facilitator's): the attempt fails `not_settled` and nothing is written.
//!
//! **Unknown** (`settlement_pending`, a timeout, a dropped connection, a 5xx,
//! the deadline, or a transaction not seen yet): the chain may still charge
//! it. The attempt stays `settling`, released, and the answer is
//! [`PayError::Pending`] (`409 payment_pending` with `Retry-After`): never a
//! refusal that says nothing was charged. The server then resolves it from
//! the chain (`payments::reconcile`, in every sweep), and a retry of the same
//! signature, or of the same `Idempotency-Key` with the same request,
//! answers what it became: the one task, or `payment_not_settled`.
//!
//! The task itself is the caller's: `payments` never names a task type. The
//! caller passes a [`Counter`], which stores the request as a task inside
//! the payment's transaction.
//!
//! One file, though long: the order above is one sequence whose safety
//! depends on each step's place in it (the key before the settle, the record
//! before the verify, the proof before the task); split, it would be read
//! across files.

use sqlx::PgPool;
use tokio::time::Instant;

use super::PaymentResponse;
use super::challenge::{PaymentRequired, PaymentRequirements};
use super::counter::{Counter, Note, store_in};
use super::facilitator::{Facilitator, FacilitatorError, Settled};
use super::ledger::{self, AttemptStatus, Claim, SettledPayment};
use super::order::{
    Bought, CONFIRM_POLL, CONFIRM_WAIT, Checkout, Order, PENDING, PayError, Recorded, STORE_MARGIN, bought_before,
    budget, check_window, key_holder, not_settled, record_attempt, replayed, verify_beside_head, with_error,
};
use super::payload::Payment;
use super::proof::{self, Owed, Proof};
use super::reconcile::{Resolution, resolve_claimed};
use super::scheme::Scheme;
use crate::domain::ids::Id;
use crate::domain::request::TaskRequest;

/// No payment: a credit of the space for one of the kind's prices pays,
/// else the challenge. Under an `Idempotency-Key` a payment holds, the
/// answer is that payment's: its task, or wait for it (a standard x402
/// client probes without a payment when it retries).
pub(super) async fn with_credit<C: Counter>(
    db: &PgPool,
    request: &TaskRequest<'_>,
    challenge: &PaymentRequired,
    counter: &C,
) -> Result<Bought<C::Task>, PayError> {
    // A credit is a fixed price: only a scheme of fixed prices takes one.
    let prices: Vec<(String, String, String)> = challenge
        .accepts
        .iter()
        .filter(|a| Scheme::named(&a.scheme).is_some_and(Scheme::paid_by_credit))
        .map(|a| (a.network.clone(), a.asset.clone(), a.amount.clone()))
        .collect();
    let mut tx = db.begin().await?;
    if let Some(key) = request.idempotency_key {
        ledger::lock_key(&mut tx, request.space, key).await?;
        if let Some(holder) = ledger::find_by_idempotency_key(&mut *tx, request.space, key).await? {
            tx.rollback().await?;
            return key_holder(db, &holder, &request.hash()).await;
        }
    }
    let Some(task) = counter.store(&mut tx, request).await? else {
        tx.rollback().await?;
        return Ok(Bought::KeyTaken);
    };
    let Some(credit) = ledger::spend_credit(&mut tx, request.space, &prices, C::task_id(&task)).await? else {
        tx.rollback().await?;
        return Err(PayError::Required(Box::new(challenge.clone())));
    };
    counter.note(&mut tx, &task, &Note::Credit(&credit)).await?;
    tx.commit().await?;
    tracing::info!(task_id = %C::task_id(&task), credit_id = %credit.id, "task paid with a credit");
    Ok(Bought::Credit { task, credit })
}

/// The payment that holds a request's `Idempotency-Key`, if one does (it may
/// still charge, or it did): a create under that key that is not paid
/// through [`pay`] (a free task) gets that payment's answer: the task it
/// bought with its receipt, a conflict, or wait for it. `None`: no payment
/// holds the key.
pub async fn held_key(
    db: &PgPool,
    request: &TaskRequest<'_>,
) -> Result<Option<(Id, Option<PaymentResponse>)>, PayError> {
    let Some(key) = request.idempotency_key else { return Ok(None) };
    let Some(holder) = ledger::find_by_idempotency_key(db, request.space, key).await? else { return Ok(None) };
    Ok(match key_holder::<()>(db, &holder, &request.hash()).await? {
        Bought::Before { task, receipt } => Some((task, receipt)),
        _ => None,
    })
}

/// Pays for `order` with `payment`, an `exact` one matching `offer`:
/// [`Scheme::Exact`]'s create. See the module documentation.
pub(super) async fn settle<C: Counter>(
    cx: Checkout<'_>,
    order: &Order<'_>,
    payment: &Payment,
    offer: &PaymentRequirements,
    challenge: &PaymentRequired,
    counter: &C,
) -> Result<Bought<C::Task>, PayError> {
    let request = &order.request;
    let Some(facilitator) = cx.facilitator else {
        tracing::error!("a payment arrived but no facilitator client could be built");
        return Err(PayError::FacilitatorUnavailable);
    };
    check_window(payment, offer, challenge)?;
    let request_hash = request.hash();
    if let Some(id) = &payment.payment_id
        && let Some(earlier) = ledger::find_by_payment_id(cx.db, request.space, id).await?
        && (earlier.payload_hash != payment.hash || earlier.request_hash != request_hash)
    {
        // An id whose payment charged nothing may name a new one.
        let released = earlier.status == AttemptStatus::Failed && ledger::release_payment_id(cx.db, earlier.id).await?;
        // Another payment under the request's own key (an MCP call's key is
        // its payment-identifier id): the key answers, as for any payment
        // sent again under it: its task, or wait for its payment, never a
        // conflict that has the client sign a new one.
        let keyed = request.idempotency_key.is_some() && earlier.idempotency_key.as_deref() == request.idempotency_key;
        if !released && !keyed {
            return Err(PayError::IdentifierConflict);
        }
    }

    let recorded =
        record_attempt(cx.db, request, &request_hash, (payment, offer), None, &challenge.resource.url, counter).await?;
    let claimed = match recorded {
        Recorded::KeyTaken => return Ok(Bought::KeyTaken),
        Recorded::New(attempt) => Claimed { attempt, resuming: false, from_block: None },
        Recorded::Collided => match collision(cx, order, payment, offer, &request_hash, challenge, counter).await? {
            Resume::Claimed(claimed) => claimed,
            Resume::Answer(answer) => return *answer,
        },
    };

    let settling = Settling { cx, facilitator, payment, offer, challenge, deadline: order.deadline };
    let transaction = settling.settle(claimed).await?;
    let settlement = PaymentResponse::settled(Some(&transaction), &offer.network, &payment.payer);
    let paid = Paid { offer, payer: &payment.payer, attempt: claimed.attempt, transaction: &transaction };
    let task = match store_paid(cx.db, request, &paid, counter).await {
        Ok(task) => task,
        Err(e) => {
            // Charged, and the task not stored: the attempt stays `settling`,
            // released, so the reconciler (or a retry) stores it from the
            // chain rather than after the claim expires.
            let reason = "settled; the task could not be stored";
            let _ = ledger::release_attempt(cx.db, claimed.attempt, reason, Some(&transaction)).await;
            return Err(e);
        }
    };
    Ok(Bought::Settled { task, settlement })
}

/// The attempt this request holds now.
#[derive(Debug, Clone, Copy)]
struct Claimed {
    attempt: Id,
    /// An earlier settle of it may have gone through: it is not verified
    /// again (its authorization may be spent already).
    resuming: bool,
    /// The chain's block when it began, if known.
    from_block: Option<u64>,
}

/// What a payment whose attempt already exists leads to.
enum Resume<T> {
    /// This request holds the attempt now.
    Claimed(Claimed),
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
    let request = &order.request;
    let answer = |a: Result<Bought<C::Task>, PayError>| Ok(Resume::Answer(Box::new(a)));
    let found = ledger::find_attempt(cx.db, &offer.network, &offer.asset, &payment.payer, &payment.nonce).await?;
    if let Some(earlier) = found {
        let same = earlier.space == request.space.as_bytes()
            && earlier.request_hash == request_hash
            && earlier.payload_hash == payment.hash;
        if !same {
            return answer(Err(replayed(challenge)));
        }
        return match earlier.status {
            // The same request with the same payment again, from the Space
            // that paid: what it bought, with its receipt. A client whose
            // connection dropped after the charge learns its task here.
            AttemptStatus::Settled => match earlier.task_id {
                Some(task) => answer(bought_before(cx.db, task).await),
                // Paid, and credited because its task could not be made.
                None => answer(Err(replayed(challenge))),
            },
            AttemptStatus::Failed if earlier.reason.as_deref() == Some(ledger::NOT_SETTLED) => {
                answer(Err(not_settled(challenge)))
            }
            _ if earlier.claimed => answer(Err(PayError::InProgress)),
            status => match ledger::claim_attempt(cx.db, earlier.id, status).await? {
                Claim::Busy => answer(Err(PayError::InProgress)),
                // Refused before, and its key taken since by another payment.
                Claim::KeyHeld => {
                    let key = request.idempotency_key.unwrap_or_default();
                    match ledger::find_by_idempotency_key(cx.db, request.space, key).await? {
                        Some(holder) => answer(key_holder(cx.db, &holder, request_hash).await),
                        None => answer(Err(PayError::RequestInProgress)),
                    }
                }
                // Refused before, nothing charged: tried afresh (the payer
                // may have topped up meanwhile).
                Claim::Taken if status == AttemptStatus::Failed => {
                    let from_block = earlier.from_block.and_then(|b| u64::try_from(b).ok());
                    Ok(Resume::Claimed(Claimed { attempt: earlier.id, resuming: false, from_block }))
                }
                // An unknown outcome: first ask the chain what it became.
                Claim::Taken => match resolve_claimed(cx.db, cx.chains, &earlier, counter, order.deadline).await? {
                    Resolution::Task(task) => answer(bought_before(cx.db, task).await),
                    Resolution::Credited => answer(Err(replayed(challenge))),
                    Resolution::NotSettled => answer(Err(not_settled(challenge))),
                    // Still open: settling again is safe (one authorization
                    // moves money once) and may learn the outcome now.
                    Resolution::Open { .. } => {
                        let from_block = earlier.from_block.and_then(|b| u64::try_from(b).ok());
                        Ok(Resume::Claimed(Claimed { attempt: earlier.id, resuming: true, from_block }))
                    }
                },
            },
        };
    }
    if let Some(key) = request.idempotency_key
        && let Some(holder) = ledger::find_by_idempotency_key(cx.db, request.space, key).await?
    {
        return answer(key_holder(cx.db, &holder, request_hash).await);
    }
    // The only other unique: the payment-identifier id, taken meanwhile.
    answer(Err(PayError::IdentifierConflict))
}

/// Is this settle answer one whose outcome the chain still decides? The
/// official facilitator answers `settlement_pending` after broadcasting,
/// and any refusal that carries a transaction hash names a transaction that
/// was sent.
pub(super) fn outcome_open(settled: &Settled) -> bool {
    !settled.transaction.is_empty()
        || settled.error_reason.as_deref().is_some_and(|r| r.contains("settlement_pending") || r.contains("pending"))
}

/// Does a facilitator's reason say the authorization's nonce is spent?
fn nonce_already_used(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| r.contains("nonce_already_used") || r.contains("authorization_used"))
}

/// One payment being verified and settled, and what it is checked against.
struct Settling<'a> {
    cx: Checkout<'a>,
    facilitator: &'a Facilitator,
    payment: &'a Payment,
    offer: &'a PaymentRequirements,
    challenge: &'a PaymentRequired,
    deadline: Option<Instant>,
}

/// What the chain is asked to confirm: the facilitator's answer said so,
/// or only left it possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    /// `success` with this transaction: read again for a moment if the
    /// chain does not show it yet.
    Settled,
    /// A transaction (or a spent nonce) that may or may not have paid.
    Maybe,
}

impl Settling<'_> {
    /// Verifies (unless resuming an unknown outcome: that authorization may
    /// be spent already) and settles; the transaction that paid, proven on
    /// chain.
    async fn settle(&self, claimed: Claimed) -> Result<String, PayError> {
        let (db, attempt, resuming) = (self.cx.db, claimed.attempt, claimed.resuming);
        let mut from_block = claimed.from_block;
        if !resuming {
            // Where the search for this payment's transfer will start: read
            // beside `/verify`, before anything is settled.
            let (cx, payment) = (self.cx, (self.payment, self.offer));
            let head =
                verify_beside_head(cx, self.facilitator, attempt, payment, self.challenge, self.deadline).await?;
            from_block = from_block.or(head);
        }
        let Ok(budget) = budget(self.deadline) else {
            return if resuming {
                ledger::release_attempt(db, attempt, "settle outcome unknown", None).await?;
                Err(PENDING)
            } else {
                // Verified, never sent to be settled: nothing can be charged.
                ledger::fail_attempt(db, attempt, "deadline").await?;
                Err(PayError::FacilitatorUnavailable)
            };
        };
        let claimed = Claimed { from_block, ..claimed };
        match self.facilitator.settle(&self.payment.document, self.offer, budget).await {
            Ok(settled) if settled.success && !settled.transaction.is_empty() => {
                tracing::info!(transaction = %settled.transaction, "facilitator: settled");
                self.confirm(claimed, Some(&settled.transaction), Said::Settled).await
            }
            // An earlier settle of this payment may have gone through, its
            // answer lost; or someone else spent the nonce. The chain tells.
            Ok(settled) if resuming && nonce_already_used(settled.error_reason.as_deref()) => {
                self.confirm(claimed, None, Said::Maybe).await
            }
            // A refusal of a resumed attempt proves nothing: the first
            // settle may still be pending on chain. Nor does one that names
            // a transaction it sent: that transaction tells.
            Ok(settled) if resuming || outcome_open(&settled) => {
                let reason = settled.error_reason.unwrap_or_else(|| "settle outcome unknown".into());
                tracing::warn!(%attempt, %reason, transaction = %settled.transaction, "settle outcome unknown");
                let named = Some(settled.transaction.as_str()).filter(|t| !t.is_empty());
                self.confirm(claimed, named, Said::Maybe).await
            }
            Ok(settled) => {
                let reason = settled.error_reason.unwrap_or_else(|| "settle_failed".into());
                tracing::info!(%reason, message = ?settled.error_message, "facilitator: settle failed");
                ledger::fail_attempt(db, attempt, &reason).await?;
                let (network, payer) = (&self.offer.network, &self.payment.payer);
                let settlement = Box::new(PaymentResponse::refused(&reason, network, payer));
                let challenge = with_error(self.challenge, "payment_failed");
                Err(PayError::Failed { challenge, reason, settlement })
            }
            // Nothing reached it: a fresh attempt was not charged. A resumed
            // one may have been, earlier: it stays open.
            Err(FacilitatorError::Unreachable(e)) if !resuming => {
                tracing::error!(error = %e, "facilitator /settle unreachable");
                ledger::fail_attempt(db, attempt, "facilitator_unavailable").await?;
                Err(PayError::FacilitatorUnavailable)
            }
            Err(e) => {
                tracing::error!(error = %e, %attempt, "facilitator /settle outcome unknown");
                ledger::release_attempt(db, attempt, "settle outcome unknown", None).await?;
                Err(PENDING)
            }
        }
    }

    /// What the chain shows of this payment ([`proof::prove`]), within what
    /// is left of the deadline: the transaction that paid; or, its nonce
    /// spent by a transaction that paid nothing, `payment_not_settled` with
    /// the attempt failed; or, undecided, `payment_pending` with the
    /// attempt released for the reconciler.
    async fn confirm(&self, claimed: Claimed, named: Option<&str>, said: Said) -> Result<String, PayError> {
        let (db, attempt) = (self.cx.db, claimed.attempt);
        let release = |reason: &'static str| async move {
            ledger::release_attempt(db, attempt, reason, named).await?;
            Err::<String, PayError>(PENDING)
        };
        let Ok(chain) = self.cx.chains.get(&self.offer.network) else {
            // No endpoint for this network (start-up warned): the
            // facilitator's word is all there is.
            return match (said, named) {
                (Said::Settled, Some(transaction)) => Ok(transaction.to_ascii_lowercase()),
                _ => release("settle outcome unknown; no chain endpoint to resolve it").await,
            };
        };
        let owed = Owed {
            asset: &self.offer.asset,
            payer: &self.payment.payer,
            nonce: &self.payment.nonce,
            pay_to: &self.offer.pay_to,
            amount: &self.offer.amount,
        };
        let until = match self.deadline {
            Some(deadline) => deadline.checked_sub(STORE_MARGIN).unwrap_or(deadline),
            None => Instant::now() + CONFIRM_WAIT,
        };
        loop {
            let proof = tokio::time::timeout_at(until, proof::prove(chain, &owed, claimed.from_block, named)).await;
            match proof {
                Ok(Ok(Proof::Paid { transaction })) => return Ok(transaction),
                Ok(Ok(Proof::Spent { transaction })) => {
                    tracing::warn!(
                        %attempt, transaction = ?transaction,
                        "the authorization's nonce was spent by a transaction that paid nothing: not settled"
                    );
                    ledger::fail_attempt(db, attempt, ledger::NOT_SETTLED).await?;
                    return Err(not_settled(self.challenge));
                }
                // Reported mined, not seen yet: this endpoint may be a block
                // behind the facilitator's.
                Ok(Ok(Proof::Unused(_) | Proof::Unfound))
                    if said == Said::Settled && Instant::now() + CONFIRM_POLL < until =>
                {
                    tokio::time::sleep(CONFIRM_POLL).await;
                }
                Ok(Ok(_)) => return release("settlement not seen on chain yet").await,
                Ok(Err(e)) => {
                    tracing::warn!(%attempt, error = %e, "cannot read the chain to confirm a settlement");
                    return release("settle outcome unknown; the chain could not be read").await;
                }
                Err(_) => return release("settle outcome unknown; the chain did not answer in time").await,
            }
        }
    }
}

/// A settlement proven on chain, and the attempt it settles.
struct Paid<'a> {
    offer: &'a PaymentRequirements,
    payer: &'a str,
    attempt: Id,
    transaction: &'a str,
}

/// The task and its payment, in one transaction with the attempt's move to
/// `settled`: either all three are written or none.
async fn store_paid<C: Counter>(
    db: &PgPool,
    request: &TaskRequest<'_>,
    paid: &Paid<'_>,
    counter: &C,
) -> Result<C::Task, PayError> {
    let mut tx = db.begin().await?;
    let task = store_in(&mut tx, request, counter).await?;
    let recorded = ledger::record_settled(
        &mut tx,
        &SettledPayment {
            attempt: paid.attempt,
            task_id: C::task_id(&task),
            space: request.space,
            network: &paid.offer.network,
            payer: paid.payer,
            asset: &paid.offer.asset,
            amount: &paid.offer.amount,
            pay_to: &paid.offer.pay_to,
            transaction: paid.transaction,
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
