//! Paying for one request with a `batch-settlement` payment: the create hook
//! of [`Scheme::Batch`](crate::domain::payments::Scheme::Batch), reached
//! through [`pay`](crate::domain::payments::pay) like the other schemes'.
//!
//! 1. The offer's terms (Reeve's receiver, receiver authorizer, token and
//!    withdraw delay) and price are what every voucher is decided against
//!    ([`decide`]).
//! 2. A **deposit** payload (a channel's first payment, or one its balance no
//!    longer covers): its voucher is first decided against what Reeve keeps,
//!    so that a replay answers its task and a voucher that could never buy
//!    anything is refused before money moves. Then the deposit is settled
//!    through the facilitator (it sends the payer's ERC-3009 authorization to
//!    the escrow and pays the gas), and the escrow is read. What the escrow
//!    holds decides, not the facilitator's word: a deposit refused or lost
//!    whose channel covers the voucher anyway (the same deposit sent again,
//!    its first settle landed) still buys the task, and a voucher the escrow
//!    does not cover buys nothing, whatever was said. A deposit sent and not
//!    seen mined buys nothing yet (`payment_pending`): the same payment sent
//!    again reads the escrow again, or is sent again if it never mined; once
//!    its authorization has expired it is not sent again, and unless the
//!    escrow covers the voucher it is refused (`payment_invalid`,
//!    `authorization_expired`): the payer signs a new deposit.
//! 3. A **voucher** payload needs neither the facilitator nor a transaction:
//!    the escrow is read (one Multicall3 call) only when Reeve's last read of
//!    the channel is older than [`STALENESS`], or its balance does not cover
//!    the voucher (the payer may have deposited since).
//! 4. In one transaction, under the request's key lock and the channel's row
//!    lock: the voucher decided, the task stored, the voucher recorded with
//!    the task, the Space and the request it bought. So a voucher buys at
//!    most one task, and the same voucher sent again by the same Space for
//!    the same request answers that task.
//!
//! A voucher that buys nothing is answered with the `402` that
//! resynchronises the buyer ([`super::resynchronising`]): the refusal's code,
//! and on the batch offer the channel as Reeve keeps it and the last voucher
//! it accepted, from which `@x402/evm`'s client signs its next one. Nothing
//! was charged: an unrecorded voucher can never be claimed.
//!
//! The answer to a bought task carries, in `PAYMENT-RESPONSE`'s `extra`, what
//! it charged and the channel after it (`chargedAmount`, `channelState`):
//! what the official client counts its next voucher from.

use std::time::Duration;

use alloy_primitives::Address;
use serde_json::json;
use tokio::time::Instant;

use super::channel::{ChannelState, DecideError, Decision, OnChain, Purchase, Refusal, Terms};
use super::payload::{BatchPayload, Deposit};
use super::{decide, last_voucher, record, resynchronising};
use crate::domain::payments::PaymentResponse;
use crate::domain::payments::challenge::{PaymentRequired, PaymentRequirements};
use crate::domain::payments::checkout::outcome_open;
use crate::domain::payments::counter::{Counter, store_in};
use crate::domain::payments::facilitator::FacilitatorError;
use crate::domain::payments::ledger;
use crate::domain::payments::order::{
    Bought, CONFIRM_POLL, CONFIRM_WAIT, Checkout, Order, PENDING, PayError, STORE_MARGIN, budget, replayed, with_error,
};
use crate::domain::payments::payload::Payment;

/// How old a read of the escrow may be for a voucher to be decided on it
/// without reading again. The balance it guards can only fall by Reeve's
/// own claims and refunds, or by a withdrawal the payer must announce
/// `withdrawDelay` (at least 15 minutes) ahead: a read this old misses at
/// most an announcement, and vouchers taken meanwhile are still claimable.
pub const STALENESS: Duration = Duration::from_secs(60);

/// How long after its `validBefore` a deposit counts as expired: the chain's
/// clock may run behind this one's, and a send of it may still be mined
/// until the chain's clock passes it.
const EXPIRY_MARGIN: Duration = Duration::from_secs(60);

/// Whether an authorization valid before `valid_before` (unix seconds) can
/// no longer be used.
fn expired(valid_before: u64) -> bool {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    now.as_secs() >= valid_before.saturating_add(EXPIRY_MARGIN.as_secs())
}

/// Pays for `order` with `payment`, a `batch-settlement` one matching
/// `offer`. See the module documentation.
pub(in crate::domain::payments) async fn pay<C: Counter>(
    cx: Checkout<'_>,
    order: &Order<'_>,
    (payment, offer): (&Payment, &PaymentRequirements),
    challenge: &PaymentRequired,
    counter: &C,
) -> Result<Bought<C::Task>, PayError> {
    let Some(batch) = &payment.batch else {
        return Err(PayError::Malformed("a batch-settlement payment carries payload.voucher".into()));
    };
    if batch.refund.is_some() {
        // A refund buys nothing: it is asked where `refundChannel` asks it.
        return Err(PayError::Malformed(
            "a batch-settlement refund is asked with GET /v1/refund/{kind}, not with a task".into(),
        ));
    }
    let (Some(terms), Ok(price)) = (terms(offer), offer.amount.parse::<u128>()) else {
        // The catalog's offer always names them; one that does not is no
        // offer a channel can be opened on.
        tracing::error!(network = %offer.network, "a batch-settlement offer without its channel terms");
        return Err(PayError::Mismatch(with_error(challenge, "payment_mismatch")));
    };
    let sale = Sale { cx, order, payment, batch, offer, challenge, terms, price, request_hash: order.request.hash() };

    let mut read = None;
    let mut transaction = None;
    if batch.deposit.is_some() {
        // Before any money moves: a replay answers its task, and a voucher
        // no deposit could make good is refused.
        match sale.step::<C>(None, None).await? {
            Step::Answer(answer) => return answer,
            Step::Unread | Step::Uncovered(_) | Step::Buys => {}
        }
        let (settled, on_chain) = sale.deposit().await?;
        transaction = settled;
        read = Some(on_chain);
    }
    loop {
        let fresh = read.is_some();
        match sale.step(read, Some(counter)).await? {
            Step::Answer(answer) => {
                return answer.map(|bought| match bought {
                    Bought::Settled { task, mut settlement } => {
                        settlement.transaction = transaction.clone().unwrap_or_default();
                        Bought::Settled { task, settlement }
                    }
                    other => other,
                });
            }
            Step::Unread | Step::Uncovered(_) if !fresh => read = Some(sale.read().await?),
            Step::Uncovered(refusal) => return Err(sale.refused(refusal).await?),
            // A read just stored is fresh, and storing always answers.
            Step::Unread | Step::Buys => return Err(PayError::ChainUnavailable),
        }
    }
}

/// The channel terms of `offer`, as the catalog wrote them into it.
pub(super) fn terms(offer: &PaymentRequirements) -> Option<Terms<'_>> {
    Some(Terms {
        network: &offer.network,
        chain_id: offer.network.strip_prefix("eip155:")?.parse().ok()?,
        receiver: offer.pay_to.parse().ok()?,
        receiver_authorizer: offer.extra.receiver_authorizer.as_deref()?.parse::<Address>().ok()?,
        token: offer.asset.parse().ok()?,
        withdraw_delay: offer.extra.withdraw_delay?,
    })
}

/// One batch-settlement payment being decided, and what it is decided
/// against.
struct Sale<'a> {
    cx: Checkout<'a>,
    order: &'a Order<'a>,
    payment: &'a Payment,
    batch: &'a BatchPayload,
    offer: &'a PaymentRequirements,
    challenge: &'a PaymentRequired,
    terms: Terms<'a>,
    price: u128,
    request_hash: [u8; 32],
}

/// What one decision came to.
enum Step<T> {
    /// The answer: the task bought (now or before), or a refusal.
    Answer(Result<Bought<T>, PayError>),
    /// No read of the escrow recent enough: read it and decide again.
    Unread,
    /// The balance Reeve knows does not cover the voucher.
    Uncovered(Refusal),
    /// It would buy the task (asked without storing it).
    Buys,
}

impl Sale<'_> {
    /// Decides the voucher with `read` (the escrow just read, if it was) in
    /// one transaction. With a `counter`, a voucher that buys the task has
    /// it stored and is recorded, under the request's key lock; without one
    /// (or refused) nothing is written but `read`, kept for the next
    /// voucher.
    async fn step<C: Counter>(&self, read: Option<OnChain>, counter: Option<&C>) -> Result<Step<C::Task>, PayError> {
        let request = &self.order.request;
        let mut tx = self.cx.db.begin().await?;
        if let (Some(counter), Some(key)) = (counter, request.idempotency_key) {
            ledger::lock_key(&mut tx, request.space, key).await?;
            if counter.key_taken(&mut tx, request.space, key).await? {
                return Ok(Step::Answer(Ok(Bought::KeyTaken)));
            }
        }
        let voucher = self.batch.voucher();
        let decided = decide(&mut tx, &self.terms, &voucher, self.price, read, STALENESS).await;
        let refusal = match decided {
            Ok(Decision::Buys { channel, ceiling, on_chain }) => {
                let Some(counter) = counter else { return Ok(Step::Buys) };
                let task = store_in(&mut tx, request, counter).await?;
                let purchase = Purchase {
                    space: request.space.as_bytes(),
                    request_hash: &self.request_hash,
                    asset: &self.offer.asset,
                };
                record(&mut tx, (&channel, ceiling), self.price, &self.batch.signature, (C::task_id(&task), &purchase))
                    .await?;
                tx.commit().await?;
                tracing::info!(task_id = %C::task_id(&task), %channel, %ceiling, "task paid by a batch-settlement voucher");
                let state = ChannelState { channel_id: channel, charged: ceiling, on_chain };
                return Ok(Step::Answer(Ok(Bought::Settled { task, settlement: self.response(&state) })));
            }
            Ok(Decision::Again { task, space, request_hash, state }) => {
                let same = space == request.space.as_bytes() && request_hash == self.request_hash;
                match task {
                    Some(task) if same => {
                        // What this voucher brought the channel to, as when it
                        // was first answered.
                        let state = ChannelState { charged: self.batch.ceiling, ..state };
                        return Ok(Step::Answer(Ok(Bought::Before { task, receipt: Some(self.response(&state)) })));
                    }
                    // Bought a task since deleted: it buys no other.
                    None if same => return Ok(Step::Answer(Err(replayed(self.challenge)))),
                    // Spent on another request: the buyer's count is behind.
                    _ => {
                        let expected = state.charged.saturating_add(self.price);
                        Refusal::NotNext { got: self.batch.ceiling, expected, state }
                    }
                }
            }
            Err(DecideError::Refused(Refusal::Unread)) => return Ok(Step::Unread),
            Err(DecideError::Refused(refusal @ Refusal::AboveBalance { .. })) => {
                // Kept: the escrow's read (the one thing a refusal wrote).
                tx.commit().await?;
                return Ok(Step::Uncovered(refusal));
            }
            Err(DecideError::Refused(refusal)) => refusal,
            Err(DecideError::Db(e)) => return Err(e.into()),
        };
        tx.commit().await?;
        Ok(Step::Answer(Err(self.refused(refusal).await?)))
    }

    /// The `402` answering `refusal`: see [`resynchronising`].
    async fn refused(&self, refusal: Refusal) -> Result<PayError, sqlx::Error> {
        let last = match refusal.state() {
            Some(state) => {
                let mut conn = self.cx.db.acquire().await?;
                last_voucher(&mut conn, &state.channel_id).await?
            }
            None => None,
        };
        tracing::info!(code = refusal.code(), reason = %refusal, "batch-settlement voucher refused");
        let challenge = Box::new(resynchronising(self.challenge, &self.offer.network, &refusal, last));
        Ok(PayError::Voucher { challenge, refusal: Box::new(refusal) })
    }

    /// `PAYMENT-RESPONSE` for a voucher that bought a task and brought the
    /// channel to `state`: in `extra`, as `@x402/evm`'s server answers.
    fn response(&self, state: &ChannelState) -> PaymentResponse {
        let mut response = PaymentResponse::settled(None, &self.offer.network, &self.payment.payer);
        response.extra = Some(json!({
            "chargedAmount": self.price.to_string(),
            "channelState": {
                "channelId": state.channel_id,
                "balance": state.on_chain.balance.to_string(),
                "totalClaimed": state.on_chain.total_claimed.to_string(),
                "withdrawRequestedAt": state.on_chain.withdraw_requested_at,
                "refundNonce": state.on_chain.refund_nonce.to_string(),
                "chargedCumulativeAmount": state.charged.to_string(),
            },
        }));
        response
    }

    /// The escrow's state of the channel, now.
    async fn read(&self) -> Result<OnChain, PayError> {
        let chain = self.cx.chains.get(&self.offer.network).map_err(|e| {
            tracing::error!(error = %e, "no chain endpoint to read a batch-settlement channel");
            PayError::ChainUnavailable
        })?;
        super::read(chain, self.batch.channel_id).await.map_err(|e| {
            tracing::warn!(error = %e, "cannot read a batch-settlement channel from the escrow");
            PayError::ChainUnavailable
        })
    }

    /// Settles the payload's deposit through the facilitator, then reads
    /// the escrow: the deposit's transaction (if the facilitator named
    /// one) and what the channel holds. A deposit that did not go through
    /// is an error only if the channel does not cover the voucher anyway.
    async fn deposit(&self) -> Result<(Option<String>, OnChain), PayError> {
        let Some(facilitator) = self.cx.facilitator else {
            tracing::error!("a batch-settlement deposit arrived but no facilitator client could be built");
            return Err(PayError::FacilitatorUnavailable);
        };
        let Ok(budget) = budget(self.order.deadline) else { return Err(PayError::FacilitatorUnavailable) };
        if self.batch.deposit.as_ref().and_then(Deposit::valid_before).is_some_and(expired) {
            // It can no longer land (a facilitator may still wait on a send
            // of it that was dropped): the escrow says whether one did.
            let on_chain = self.read().await?;
            if on_chain.balance >= self.batch.ceiling {
                return Ok((None, on_chain));
            }
            return Err(PayError::Invalid {
                challenge: with_error(self.challenge, "payment_invalid"),
                reason: "authorization_expired: the deposit never landed and no longer can; sign a new one".into(),
            });
        }
        let (network, payer) = (&self.offer.network, &self.payment.payer);
        let failed = match facilitator.settle(&self.payment.document, self.offer, budget).await {
            Ok(settled) if settled.success => {
                tracing::info!(transaction = %settled.transaction, "facilitator: batch-settlement deposit settled");
                let on_chain = self.covering_read().await?;
                return Ok((Some(settled.transaction).filter(|t| !t.is_empty()), on_chain));
            }
            // Sent and not seen mined (`settlement_pending`, or a refusal
            // naming its transaction): the chain decides, as for `exact`.
            Ok(settled) if outcome_open(&settled) => {
                tracing::warn!(
                    transaction = %settled.transaction, reason = ?settled.error_reason,
                    "facilitator: batch-settlement deposit sent, outcome unknown"
                );
                PENDING
            }
            Ok(settled) => {
                let reason = settled.error_reason.unwrap_or_else(|| "settle_failed".into());
                tracing::info!(%reason, message = ?settled.error_message, "facilitator: deposit refused");
                let settlement = Box::new(PaymentResponse::refused(&reason, network, payer));
                PayError::Failed { challenge: with_error(self.challenge, "payment_failed"), reason, settlement }
            }
            // Nothing reached it: nothing was sent.
            Err(FacilitatorError::Unreachable(e)) => {
                tracing::error!(error = %e, "facilitator /settle unreachable for a deposit");
                PayError::FacilitatorUnavailable
            }
            // The deposit may still land: the same payment sent again reads
            // the escrow again.
            Err(e) => {
                tracing::warn!(error = %e, "facilitator /settle of a deposit: outcome unknown");
                PENDING
            }
        };
        let on_chain = self.read().await?;
        if on_chain.balance >= self.batch.ceiling {
            return Ok((None, on_chain));
        }
        Err(failed)
    }

    /// The escrow read after a deposit the facilitator said it settled, read
    /// again for a moment while it does not cover the voucher: this endpoint
    /// may be a block behind the facilitator's.
    async fn covering_read(&self) -> Result<OnChain, PayError> {
        let until = match self.order.deadline {
            Some(deadline) => deadline.checked_sub(STORE_MARGIN).unwrap_or(deadline),
            None => Instant::now() + CONFIRM_WAIT,
        };
        loop {
            let on_chain = self.read().await?;
            if on_chain.balance >= self.batch.ceiling || Instant::now() + CONFIRM_POLL >= until {
                return Ok(on_chain);
            }
            tokio::time::sleep(CONFIRM_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deposit_expires_a_minute_after_its_valid_before() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!(expired(0));
        assert!(expired(now - 61));
        assert!(!expired(now - 30), "the chain's clock may be behind");
        assert!(!expired(now + 300));
        assert!(!expired(u64::MAX), "no overflow");
    }
}
