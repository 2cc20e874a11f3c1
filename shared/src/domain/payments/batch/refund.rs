//! A payer's cooperative refund of its channel (issue 42), as x402's
//! `batch-settlement` scheme and `@x402/evm`'s `refundChannel` ask it: the
//! client sends a `refund` payload (its channel, a voucher of exactly what
//! the channel was charged, signed by the payer or its payer authorizer, and
//! optionally how much it wants back) in `PAYMENT-SIGNATURE`, and Reeve
//! answers with the refund's settlement in `PAYMENT-RESPONSE`.
//!
//! The voucher is the payer's proof: only the channel's voucher signer can
//! sign it, and its ceiling must be what Reeve charged the channel (a client
//! whose count drifted is resynchronised by the same `402` a voucher gets).
//! Reeve then, under the channel's row lock (no voucher is decided on the
//! channel meanwhile):
//! 1. reads the escrow, so the refund is of what is there now;
//! 2. signs, with the receiver authorizer's key, the claim of everything
//!    the channel was charged (when the escrow does not show it claimed
//!    yet) and the refund of the rest for the escrow's current refund count
//!    (`refundNonce`);
//! 3. has the facilitator send both in one transaction (the escrow's
//!    `multicall` of `claimWithSignature` and `refundWithSignature`), so the
//!    payer gets back exactly what was not charged and Reeve keeps exactly
//!    what was, whatever the order of anything else;
//! 4. reads the escrow again: what it shows decides, not the facilitator's
//!    word. The refund is recorded (`batch_refunds`) and the claimed money
//!    is then paid to `payTo` (the escrow's `settle`), as a sweep would.
//!
//! The same request sent again (the same signed payload) answers the refund
//! it made, and never makes a second, even of a part; the escrow's refund
//! count makes a signed refund good once. A facilitator out of reach changes nothing: the request can be sent
//! again.

use alloy_primitives::{B256, U256};
use alloy_sol_types::{SolStruct, sol};
use serde_json::{Value, json};
use sqlx::{PgPool, Row};

use super::channel::{ChannelState, Refusal as VoucherRefusal, check_voucher, locked, refresh};
use super::claim::{self, Claim, Claimer};
use super::escrow::read;
use super::pay::terms;
use super::voucher::domain;
use super::{OnChain, last_voucher, resynchronising};
use crate::domain::error::{ErrorKind, Refusal, Wording};
use crate::domain::payments::PaymentResponse;
use crate::domain::payments::chain::Chains;
use crate::domain::payments::challenge::{PaymentRequired, PaymentRequirements};
use crate::domain::payments::facilitator::FacilitatorError;
use crate::domain::payments::payload::Payment;

sol! {
    /// What the receiver authorizer signs for `refundWithSignature`.
    #[derive(Debug, PartialEq, Eq)]
    struct Refund {
        bytes32 channelId;
        uint256 nonce;
        uint128 amount;
    }
}

/// The EIP-712 digest of a refund of `amount` from `channel` at refund
/// count `nonce` on `chain_id` (the escrow's `getRefundDigest`).
pub fn digest(chain_id: u64, channel: B256, nonce: u64, amount: u128) -> B256 {
    Refund { channelId: channel, nonce: U256::from(nonce), amount }.eip712_signing_hash(&domain(chain_id))
}

/// A refund made (now, or before for the same request).
#[derive(Debug, Clone)]
pub struct Refunded {
    pub channel_id: String,
    /// What went back to the payer.
    pub amount: u128,
    /// `PAYMENT-RESPONSE`: the refund's transaction, and the channel after
    /// it in `extra.channelState`.
    pub response: PaymentResponse,
}

/// Why no refund was made. Nothing was changed by any of them.
#[derive(Debug, thiserror::Error)]
pub enum RefundError {
    /// Not a batch-settlement payment, or not a refund.
    #[error("{0}")]
    Malformed(String),
    /// The voucher is not on a channel of this offer, not the payer's, or
    /// not of what the channel was charged (the challenge resynchronises).
    #[error("{refusal}")]
    Voucher { challenge: Box<PaymentRequired>, refusal: Box<VoucherRefusal> },
    /// Reeve never took a voucher on the channel.
    #[error("no channel Reeve keeps")]
    UnknownChannel(Box<PaymentRequired>),
    /// Everything in the channel is charged (or already refunded).
    #[error("nothing in the channel is left to refund")]
    NothingToRefund(Box<PaymentRequired>),
    /// The facilitator sent the refund and the escrow refused it, or the
    /// facilitator refused to send it.
    #[error("the refund was refused: {reason}")]
    Failed { challenge: Box<PaymentRequired>, reason: String, settlement: Box<PaymentResponse> },
    /// This deployment has no receiver authorizer's key to sign refunds.
    #[error("refunds are not offered here")]
    NotOffered,
    #[error("the facilitator is unreachable")]
    FacilitatorUnavailable,
    #[error("the escrow cannot be read")]
    ChainUnavailable,
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl RefundError {
    pub const NOT_OFFERED: &'static str = "batch_refund_unavailable";
    pub const FAILED: &'static str = "batch_refund_failed";
    /// `@x402/evm`'s codes for the same refusals.
    pub const UNKNOWN_CHANNEL: &'static str = "invalid_batch_settlement_evm_missing_channel";
    pub const NOTHING_TO_REFUND: &'static str = "invalid_batch_settlement_evm_refund_no_balance";
}

impl Refusal for RefundError {
    fn code(&self) -> &'static str {
        match self {
            RefundError::Malformed(_) => "invalid_payment",
            RefundError::Voucher { refusal, .. } => refusal.code(),
            RefundError::UnknownChannel(_) => Self::UNKNOWN_CHANNEL,
            RefundError::NothingToRefund(_) => Self::NOTHING_TO_REFUND,
            RefundError::Failed { .. } => Self::FAILED,
            RefundError::NotOffered => Self::NOT_OFFERED,
            RefundError::FacilitatorUnavailable => "facilitator_unavailable",
            RefundError::ChainUnavailable => "chain_unavailable",
            RefundError::Db(e) => e.code(),
        }
    }

    fn kind(&self) -> ErrorKind {
        match self {
            RefundError::Malformed(_) => ErrorKind::Input,
            RefundError::Voucher { .. }
            | RefundError::UnknownChannel(_)
            | RefundError::NothingToRefund(_)
            | RefundError::Failed { .. } => ErrorKind::Payment,
            RefundError::NotOffered | RefundError::FacilitatorUnavailable | RefundError::ChainUnavailable => {
                ErrorKind::Unavailable
            }
            RefundError::Db(e) => Refusal::kind(e),
        }
    }

    fn message(&self, words: &Wording) -> String {
        match self {
            RefundError::Malformed(why) => format!("{}: {why}", words.payment),
            RefundError::Voucher { refusal, .. } => refusal.to_string(),
            RefundError::UnknownChannel(_) => "Reeve took no voucher on this channel: it has nothing to refund; \
                                               the payer can withdraw from the escrow itself"
                .into(),
            RefundError::NothingToRefund(_) => {
                "everything the channel holds was charged for tasks or is refunded already".into()
            }
            RefundError::Failed { reason, .. } => {
                format!("the refund did not go through ({reason}); nothing was refunded or claimed")
            }
            RefundError::NotOffered => "cooperative refunds are not offered by this deployment; the payer can \
                                        withdraw from the escrow after the channel's withdraw delay"
                .into(),
            RefundError::FacilitatorUnavailable => {
                "the facilitator cannot be reached; nothing was refunded; send the same request again".into()
            }
            RefundError::ChainUnavailable => {
                "the channel cannot be read from its network; nothing was refunded; try again".into()
            }
            RefundError::Db(e) => e.message(words),
        }
    }

    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            RefundError::FacilitatorUnavailable | RefundError::ChainUnavailable => {
                Some(std::time::Duration::from_secs(5))
            }
            _ => None,
        }
    }

    fn challenge(&self) -> Option<&PaymentRequired> {
        match self {
            RefundError::Voucher { challenge, .. }
            | RefundError::UnknownChannel(challenge)
            | RefundError::NothingToRefund(challenge)
            | RefundError::Failed { challenge, .. } => Some(challenge),
            _ => None,
        }
    }

    fn settlement(&self) -> Option<&PaymentResponse> {
        match self {
            RefundError::Failed { settlement, .. } => Some(settlement),
            _ => None,
        }
    }
}

/// Refunds the channel `payment` (a `refund` payload on the batch offer
/// `offer` of `challenge`) names, signed by `authorizer`. See the module
/// documentation.
pub async fn refund(
    db: &PgPool,
    chains: &Chains,
    authorizer: Option<&Claimer>,
    payment: &Payment,
    offer: &PaymentRequirements,
    challenge: &PaymentRequired,
) -> Result<Refunded, RefundError> {
    let Some(batch) = &payment.batch else {
        return Err(RefundError::Malformed("a refund is a batch-settlement payload".into()));
    };
    let Some(ask) = batch.refund else {
        return Err(RefundError::Malformed("this route takes a payload of type \"refund\"".into()));
    };
    let Some(terms) = terms(offer) else {
        tracing::error!(network = %offer.network, "a batch-settlement offer without its channel terms");
        return Err(RefundError::NotOffered);
    };
    let Some(authorizer) = authorizer else { return Err(RefundError::NotOffered) };
    let with = |code: &str| Box::new(PaymentRequired { error: code.to_owned(), ..challenge.clone() });
    let voucher_refused = |refusal: VoucherRefusal, last: Option<(u128, String)>| {
        tracing::info!(code = refusal.code(), reason = %refusal, "batch-settlement refund refused");
        RefundError::Voucher {
            challenge: Box::new(resynchronising(challenge, &offer.network, &refusal, last)),
            refusal: Box::new(refusal),
        }
    };
    let channel = check_voucher(&terms, &batch.voucher()).map_err(|r| voucher_refused(*r, None))?;
    let chain = chains.get(&offer.network).map_err(|e| {
        tracing::error!(error = %e, "no chain endpoint to refund a batch-settlement channel");
        RefundError::ChainUnavailable
    })?;

    // The channel's row stays locked until the refund is known: a voucher
    // decided meanwhile could be covered by money on its way back.
    let mut tx = db.begin().await?;
    let Some((charged, kept, _)) = locked(&mut tx, &channel, std::time::Duration::ZERO).await? else {
        tracing::info!(%channel, "batch-settlement refund of a channel Reeve does not keep");
        return Err(RefundError::UnknownChannel(with(RefundError::UNKNOWN_CHANNEL)));
    };
    if batch.ceiling != charged {
        let state = ChannelState { channel_id: channel.clone(), charged, on_chain: kept };
        let last = last_voucher(&mut tx, &channel).await?;
        return Err(voucher_refused(VoucherRefusal::NotNext { got: batch.ceiling, expected: charged, state }, last));
    }
    let before = read(chain, batch.channel_id).await.map_err(|e| {
        tracing::warn!(%channel, error = %e, "cannot read a batch-settlement channel to refund it");
        RefundError::ChainUnavailable
    })?;
    refresh(&mut tx, &channel, before).await?;
    let claimed = charged.max(before.total_claimed);
    let unclaimed = before.balance.saturating_sub(claimed);
    // The same request again (or, with nothing left, a request for all of
    // it at the same charge): answer the refund it made.
    let made = match made_before(&mut tx, &channel, &payment.hash).await? {
        None if unclaimed == 0 && ask.amount.is_none() => made_at(&mut tx, &channel, charged).await?,
        made => made,
    };
    if let Some((amount, transaction)) = made {
        tx.commit().await?;
        return Ok(refunded(&channel, offer, &payment.payer, charged, before, amount, &transaction));
    }
    if unclaimed == 0 {
        tx.commit().await?;
        return Err(RefundError::NothingToRefund(with(RefundError::NOTHING_TO_REFUND)));
    }
    let amount = ask.amount.map_or(unclaimed, |asked| asked.min(unclaimed));

    // The claim of what was charged, when the escrow does not show it yet,
    // and the refund of the rest, both signed by the receiver authorizer.
    let config: Value = sqlx::query("SELECT config FROM batch_channels WHERE channel_id = $1")
        .bind(&channel)
        .fetch_one(&mut *tx)
        .await?
        .try_get("config")?;
    let claims: Vec<Claim> = if charged > before.total_claimed {
        vec![Claim {
            channel_id: batch.channel_id,
            network: offer.network.clone(),
            config,
            ceiling: charged,
            signature: format!("0x{}", hex::encode(&batch.signature)),
            total: charged,
        }]
    } else {
        Vec::new()
    };
    let (Some(refund_signature), Some(claim_signature)) = (
        authorizer.sign(digest(terms.chain_id, batch.channel_id, before.refund_nonce, amount)),
        authorizer.sign(claim::digest(terms.chain_id, &claims)),
    ) else {
        return Err(RefundError::NotOffered);
    };
    let claim_entries = claim::payload(&claims, &claim_signature)["claims"].clone();
    let mut payload = payment.document["payload"].clone();
    payload["amount"] = json!(amount.to_string());
    payload["refundNonce"] = json!(before.refund_nonce.to_string());
    payload["claims"] = claim_entries;
    payload["refundAuthorizerSignature"] = json!(refund_signature);
    if !claims.is_empty() {
        payload["claimAuthorizerSignature"] = json!(claim_signature);
    }
    let document = json!({ "x402Version": 2, "accepted": offer, "payload": payload });
    let sent = authorizer.facilitator().settle(&document, offer, None).await;

    // What the escrow shows decides: a refund whose answer was lost may
    // have landed, and one said to have landed must show.
    let after = read(chain, batch.channel_id).await.ok();
    let landed = after.filter(|a| a.refund_nonce > before.refund_nonce);
    let transaction = match (&sent, landed) {
        (Ok(settled), Some(_)) => settled.transaction.clone(),
        (Err(_), Some(_)) => String::new(),
        (Ok(settled), None) if settled.success => {
            // Said sent, not shown (yet): nothing is recorded; the same
            // request again reads the escrow anew.
            tracing::warn!(%channel, transaction = %settled.transaction, "a refund said sent is not in the escrow");
            return Err(RefundError::ChainUnavailable);
        }
        (Ok(settled), None) => {
            let reason = settled.error_reason.clone().unwrap_or_else(|| "settle_failed".into());
            tracing::warn!(%channel, %reason, message = ?settled.error_message, "batch-settlement refund refused");
            crate::infra::metrics::sweeper_action("refund_failed", 1);
            let settlement = Box::new(PaymentResponse::refused(&reason, &offer.network, &payment.payer));
            return Err(RefundError::Failed { challenge: with(RefundError::FAILED), reason, settlement });
        }
        (Err(e), None) => {
            tracing::warn!(%channel, error = %e, "batch-settlement refund: no answer from the facilitator");
            crate::infra::metrics::sweeper_action("refund_failed", 1);
            return Err(match e {
                FacilitatorError::Unreachable(_) | FacilitatorError::Unknown(_) => RefundError::FacilitatorUnavailable,
            });
        }
    };
    let after = landed.expect("matched above");
    refresh(&mut tx, &channel, after).await?;
    let returned = before.balance.saturating_sub(after.balance);
    sqlx::query(
        "INSERT INTO batch_refunds (channel_id, refund_nonce, charged, amount, balance, transaction, request_hash) \
         VALUES ($1, $2, $3::NUMERIC, $4::NUMERIC, $5::NUMERIC, $6, $7) ON CONFLICT DO NOTHING",
    )
    .bind(&channel)
    .bind(i64::try_from(before.refund_nonce).unwrap_or(i64::MAX))
    .bind(charged.to_string())
    .bind(returned.to_string())
    .bind(after.balance.to_string())
    .bind(&transaction)
    .bind(payment.hash.as_slice())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(%channel, refunded = %returned, %charged, %transaction, "batch-settlement channel refunded");
    crate::infra::metrics::sweeper_action("channel_refunded", 1);

    // What the refund's claim gave the receiver is paid to `payTo`; should
    // this fail, the read above marked `payTo` owed, and the next sweep
    // pays it out.
    if !claims.is_empty() {
        let settle = json!({ "type": "settle", "receiver": offer.pay_to, "token": offer.asset });
        let requirements = claim::requirements(&offer.network, &offer.pay_to, &offer.asset);
        if !authorizer.send(&requirements, settle, None).await {
            crate::infra::metrics::sweeper_action("claim_failed", 1);
        }
    }
    Ok(refunded(&channel, offer, &payment.payer, charged, after, returned, &transaction))
}

/// The refund made for the request hashed `request` on `channel`: its
/// amount and transaction.
async fn made_before(
    conn: &mut sqlx::PgConnection,
    channel: &str,
    request: &[u8; 32],
) -> Result<Option<(u128, String)>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT amount::TEXT AS amount, transaction FROM batch_refunds WHERE channel_id = $1 AND request_hash = $2",
    )
    .bind(channel)
    .bind(request.as_slice())
    .fetch_optional(&mut *conn)
    .await?;
    made_of(row)
}

/// The last refund recorded for `channel` charged `charged`.
async fn made_at(
    conn: &mut sqlx::PgConnection,
    channel: &str,
    charged: u128,
) -> Result<Option<(u128, String)>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT amount::TEXT AS amount, transaction FROM batch_refunds \
          WHERE channel_id = $1 AND charged = $2::NUMERIC ORDER BY refund_nonce DESC LIMIT 1",
    )
    .bind(channel)
    .bind(charged.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    made_of(row)
}

fn made_of(row: Option<sqlx::postgres::PgRow>) -> Result<Option<(u128, String)>, sqlx::Error> {
    let Some(row) = row else { return Ok(None) };
    let amount: String = row.try_get("amount")?;
    Ok(Some((amount.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?, row.try_get("transaction")?)))
}

/// The answer to a refund: `PAYMENT-RESPONSE` as `@x402/evm`'s server
/// answers one (the channel after it in `extra.channelState`).
fn refunded(
    channel: &str,
    offer: &PaymentRequirements,
    payer: &str,
    charged: u128,
    on_chain: OnChain,
    amount: u128,
    transaction: &str,
) -> Refunded {
    let mut response = PaymentResponse::settled(Some(transaction), &offer.network, payer);
    response.extra = Some(json!({
        "refundedAmount": amount.to_string(),
        "channelState": {
            "channelId": channel,
            "balance": on_chain.balance.to_string(),
            "totalClaimed": on_chain.total_claimed.to_string(),
            "withdrawRequestedAt": on_chain.withdraw_requested_at,
            "refundNonce": on_chain.refund_nonce.to_string(),
            "chargedCumulativeAmount": charged.to_string(),
        },
    }));
    Refunded { channel_id: channel.to_owned(), amount, response }
}
