//! The `402` that answers a refused voucher: the kind's challenge with the
//! refusal's code as its `error`, and on its `batch-settlement` offer the
//! channel as Reeve keeps it and the last voucher Reeve accepted, in the
//! shape `@x402/evm`'s client reads (`extra.channelState`,
//! `extra.voucherState`). A buyer whose own count drifted (a lost response,
//! another process paying on the same channel) signs its next voucher from
//! there and retries once: the scheme's resynchronisation.

use serde_json::json;

use super::channel::Refusal;
use crate::domain::payments::challenge::PaymentRequired;
use crate::domain::payments::scheme::Scheme;

/// `challenge` answering `refusal` on `network`; `last`: the last voucher
/// Reeve accepted on the channel, `(ceiling, signature)`.
pub fn resynchronising(
    challenge: &PaymentRequired,
    network: &str,
    refusal: &Refusal,
    last: Option<(u128, String)>,
) -> PaymentRequired {
    let mut answer = PaymentRequired { error: refusal.code().to_owned(), ..challenge.clone() };
    let Some(state) = refusal.state() else { return answer };
    let batch = Scheme::Batch.name();
    for offer in answer.accepts.iter_mut().filter(|o| o.scheme == batch && o.network == network) {
        offer.extra.channel_state = Some(json!({
            "channelId": state.channel_id,
            "balance": state.on_chain.balance.to_string(),
            "totalClaimed": state.on_chain.total_claimed.to_string(),
            "withdrawRequestedAt": state.on_chain.withdraw_requested_at,
            "refundNonce": state.on_chain.refund_nonce.to_string(),
            "chargedCumulativeAmount": state.charged.to_string(),
        }));
        offer.extra.voucher_state = last
            .as_ref()
            .map(|(ceiling, signature)| json!({ "signedMaxClaimable": ceiling.to_string(), "signature": signature }));
    }
    answer
}
