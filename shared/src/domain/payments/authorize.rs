//! Buying a metered task (x402 `upto`): authorize at create, nothing
//! charged. [`checkout::pay`](super::pay) hands an `upto` payment here.
//!
//! 1. The signed terms are checked against the requirement before anything
//!    is stored ([`check_terms`]): the spender is x402's upto proxy, the
//!    witness pays `payTo` through the facilitator that settles here, the
//!    ceiling is at least the requirement's, and the deadline leaves time to
//!    queue, run and settle, without being further away than
//!    `maxTimeoutSeconds`. Each refusal has its own code.
//! 2. The attempt is recorded `verifying` with the signed document, under
//!    the same uniqueness as an `exact` one (the authorization, an open
//!    `Idempotency-Key`, a `payment-identifier` id): one signature buys one
//!    task.
//! 3. `/verify`. Valid: the task is stored, with its `payment` (authorized
//!    up to the ceiling), in the transaction that moves the attempt to
//!    `authorized`. Refused: the attempt fails and nothing is stored; a
//!    payer without Permit2 approval is told how to give it.
//!
//! `/verify` moves no money, so no outcome here is unknown: a facilitator
//! that cannot be asked is `facilitator_unavailable`, and the same payment
//! may simply be sent again.

use alloy_primitives::U256;

use super::challenge::{PaymentRequired, PaymentRequirements, UPTO_MIN_QUEUE_SECONDS, UPTO_SETTLE_SECONDS};
use super::counter::{Counter, Metering, store_in};
use super::facilitator::Facilitator;
use super::ledger::{self, AttemptStatus, Claim};
use super::order::{
    Bought, Checkout, Order, PayError, Recorded, bought_before, check_window, key_holder, record_attempt, replayed,
    verify_beside_head, with_error,
};
use super::payload::{Payment, Permit2Authorization, uint256};
use super::scheme::Scheme;
use super::upto::{MeteredPayment, MeteredStatus, UPTO_PROXY, UptoRefusal};
use crate::domain::ids::Id;

/// The facilitator's reason for a payer that has not approved Permit2.
const ALLOWANCE_REQUIRED: &str = "permit2_allowance_required";

/// Authorizes `payment` (an `upto` one, matching `offer`) for `order`.
pub(super) async fn authorize<C: Counter>(
    cx: Checkout<'_>,
    order: &Order<'_>,
    payment: &Payment,
    offer: &PaymentRequirements,
    challenge: &PaymentRequired,
    counter: &C,
) -> Result<Bought<C::Task>, PayError> {
    let request = &order.request;
    let Some(signed) = &payment.upto else {
        return Err(PayError::Malformed("an upto payment carries payload.permit2Authorization".into()));
    };
    let Some(metering) = counter.metering(request.kind, &offer.asset) else {
        return Err(PayError::Mismatch(with_error(challenge, "payment_mismatch")));
    };
    let Some(facilitator) = cx.facilitator else {
        tracing::error!("a payment arrived but no facilitator client could be built");
        return Err(PayError::FacilitatorUnavailable);
    };
    check_terms(signed, offer, &metering, challenge)?;
    check_window(payment, offer, challenge)?;

    let request_hash = request.hash();
    let document = Some(&payment.document);
    let resource = &challenge.resource.url;
    let recorded = record_attempt(cx.db, request, &request_hash, (payment, offer), document, resource, counter).await?;
    let attempt = match recorded {
        Recorded::KeyTaken => return Ok(Bought::KeyTaken),
        Recorded::New(attempt) => attempt,
        Recorded::Collided => match collision(cx, order, payment, offer, &request_hash, challenge).await? {
            Again::Verify(attempt) => attempt,
            Again::Answer(answer) => return answer,
        },
    };
    let verifying = Verifying { cx, facilitator, payment, offer, challenge, order, metering: &metering };
    verifying.verify_and_store(attempt, counter).await
}

/// The signed terms against the requirement: see the module documentation.
fn check_terms(
    signed: &Permit2Authorization,
    offer: &PaymentRequirements,
    metering: &Metering,
    challenge: &PaymentRequired,
) -> Result<(), PayError> {
    let refuse = |refusal: UptoRefusal, detail: String| {
        Err(PayError::Refused { challenge: with_error(challenge, refusal.code()), refusal, detail })
    };
    if !signed.permitted.token.eq_ignore_ascii_case(&offer.asset) {
        return Err(PayError::Mismatch(with_error(challenge, "payment_mismatch")));
    }
    if !signed.spender.eq_ignore_ascii_case(UPTO_PROXY) {
        return refuse(UptoRefusal::WrongSpender, format!("it names {}", signed.spender));
    }
    if !signed.witness.to.eq_ignore_ascii_case(&offer.pay_to) {
        return refuse(UptoRefusal::WrongPayTo, format!("it pays {}", signed.witness.to));
    }
    match &offer.extra.facilitator_address {
        Some(ours) if signed.witness.facilitator.eq_ignore_ascii_case(ours) => {}
        Some(ours) => {
            return refuse(
                UptoRefusal::WrongFacilitator,
                format!("it names {}, not {ours}", signed.witness.facilitator),
            );
        }
        // The facilitator's `/supported` could not be read: who settles is
        // unknown, so nothing can be checked (nor settled) now.
        None => return Err(PayError::FacilitatorUnavailable),
    }
    // Both are uint256s: the signed one was parsed as one when decoded, and
    // a requirement's is the catalog's (never out of range; if it were,
    // nothing signed could reach it).
    let ceiling = uint256("amount", &offer.amount).unwrap_or(U256::MAX);
    let signed_ceiling = uint256("permitted.amount", &signed.permitted.amount).unwrap_or(U256::ZERO);
    if signed_ceiling < ceiling {
        return refuse(UptoRefusal::CeilingTooLow, format!("signed {signed_ceiling}, required {ceiling}"));
    }
    let now = super::unix_now();
    let needed = u64::from(metering.timeout_seconds + UPTO_SETTLE_SECONDS + UPTO_MIN_QUEUE_SECONDS);
    let left = signed.deadline.parse::<u64>().map_or(u64::MAX, |deadline| deadline.saturating_sub(now));
    if left < needed {
        return refuse(
            UptoRefusal::DeadlineTooShort,
            format!("{left} s left; this kind needs at least {needed} s, and offers {} s", offer.max_timeout_seconds),
        );
    }
    Ok(())
}

/// What a payment whose attempt exists already leads to.
enum Again<T> {
    /// This request holds the attempt now: verify it (again).
    Verify(Id),
    Answer(Result<Bought<T>, PayError>),
}

/// The attempt collided with an earlier one (see `checkout::collision`,
/// whose rules these are, for a scheme that cannot charge at create).
async fn collision<T>(
    cx: Checkout<'_>,
    order: &Order<'_>,
    payment: &Payment,
    offer: &PaymentRequirements,
    request_hash: &[u8; 32],
    challenge: &PaymentRequired,
) -> Result<Again<T>, PayError> {
    let request = &order.request;
    let found = ledger::find_attempt(cx.db, &offer.network, &offer.asset, &payment.payer, &payment.nonce).await?;
    if let Some(earlier) = found {
        let same = earlier.space == request.space.as_bytes()
            && earlier.request_hash == request_hash
            && earlier.payload_hash == payment.hash;
        if !same {
            return Ok(Again::Answer(Err(replayed(challenge))));
        }
        return Ok(match (earlier.status, earlier.task_id) {
            // Its task exists: the same request again gets it.
            (_, Some(task)) => Again::Answer(bought_before(cx.db, task).await),
            (AttemptStatus::Verifying, None) if earlier.claimed => Again::Answer(Err(PayError::InProgress)),
            // Refused before (the payer may have approved Permit2 since), or
            // its request died while verifying: verified afresh.
            (status, None) => match ledger::claim_attempt(cx.db, earlier.id, status).await? {
                Claim::Taken => Again::Verify(earlier.id),
                Claim::Busy => Again::Answer(Err(PayError::InProgress)),
                Claim::KeyHeld => {
                    let key = request.idempotency_key.unwrap_or_default();
                    match ledger::find_by_idempotency_key(cx.db, request.space, key).await? {
                        Some(holder) => Again::Answer(key_holder(cx.db, &holder, request_hash).await),
                        None => Again::Answer(Err(PayError::RequestInProgress)),
                    }
                }
            },
        });
    }
    if let Some(key) = request.idempotency_key
        && let Some(holder) = ledger::find_by_idempotency_key(cx.db, request.space, key).await?
    {
        return Ok(Again::Answer(key_holder(cx.db, &holder, request_hash).await));
    }
    Ok(Again::Answer(Err(PayError::IdentifierConflict)))
}

/// One metered payment being verified, and what it is checked against.
struct Verifying<'a> {
    cx: Checkout<'a>,
    facilitator: &'a Facilitator,
    payment: &'a Payment,
    offer: &'a PaymentRequirements,
    challenge: &'a PaymentRequired,
    order: &'a Order<'a>,
    metering: &'a Metering,
}

impl Verifying<'_> {
    async fn verify_and_store<C: Counter>(&self, attempt: Id, counter: &C) -> Result<Bought<C::Task>, PayError> {
        let db = self.cx.db;
        // Where a search for the capture's transfer starts, read beside
        // `/verify`. A payer without Permit2 approval is told how to give it.
        let (cx, payment, deadline) = (self.cx, (self.payment, self.offer), self.order.deadline);
        match verify_beside_head(cx, self.facilitator, attempt, payment, self.challenge, deadline).await {
            Ok(_) => {}
            Err(PayError::Invalid { reason, .. }) if reason == ALLOWANCE_REQUIRED => {
                let refusal = UptoRefusal::Permit2ApprovalRequired;
                let challenge = with_error(self.challenge, refusal.code());
                return Err(PayError::Refused { challenge, refusal, detail: String::new() });
            }
            Err(e) => return Err(e),
        }

        let view = MeteredPayment {
            scheme: Scheme::Upto.name().into(),
            status: MeteredStatus::Authorized,
            network: self.offer.network.clone(),
            asset: self.offer.asset.clone(),
            payer: self.payment.payer.clone(),
            authorized: self.offer.amount.clone(),
            unit: self.metering.unit.to_owned(),
            rate: self.metering.rate.to_string(),
            used: None,
            charged: None,
            transaction: None,
            reason: None,
        };
        let request = &self.order.request;
        let mut tx = db.begin().await?;
        let task = store_in(&mut tx, request, counter).await?;
        let task = counter.authorized(&mut tx, task, &view).await?;
        if !ledger::authorize_attempt(&mut tx, attempt, C::task_id(&task)).await? {
            tx.rollback().await?;
            return Err(PayError::InProgress);
        }
        tx.commit().await?;
        tracing::info!(%attempt, task_id = %C::task_id(&task), ceiling = %self.offer.amount, "metered task authorized");
        Ok(Bought::Authorized { task })
    }
}
