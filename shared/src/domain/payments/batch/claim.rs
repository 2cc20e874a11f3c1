//! Claiming what the vouchers bought (issue 42): the claims that are due,
//! the `ClaimBatch` digest the receiver authorizer signs, and the payload a
//! facilitator's `/settle` sends to the escrow as `claimWithSignature`.
//!
//! Groundwork: nothing runs these yet. The sweep that will (read each due
//! channel from the escrow first, since a claim whose answer was lost may
//! have landed; sign with the receiver authorizer's key; `/settle` the claim
//! and then the `settle` payload that moves the claimed money to `payTo`)
//! needs that key as a seller secret and a facilitator client in the
//! sweeper. A claim is safe to send again: the escrow's totals are
//! cumulative, so a claim at or below what is recorded changes nothing.

use std::time::Duration;

use alloy_primitives::B256;
use alloy_sol_types::{SolStruct, sol};
use serde_json::{Value, json};
use sqlx::{PgConnection, Row};

use super::voucher::domain;

sol! {
    /// One channel's claim, as the receiver authorizer signs it.
    #[derive(Debug, PartialEq, Eq)]
    struct ClaimEntry {
        bytes32 channelId;
        uint128 maxClaimableAmount;
        uint128 totalClaimed;
    }

    /// What the receiver authorizer signs for `claimWithSignature`.
    #[derive(Debug, PartialEq, Eq)]
    struct ClaimBatch {
        ClaimEntry[] claims;
    }
}

/// A channel's claim: its last voucher, and the total to claim with it
/// (what Reeve charged the channel, which that voucher's ceiling is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub channel_id: B256,
    pub network: String,
    /// The channel's configuration as the payer signed it (the escrow needs
    /// it whole).
    pub config: Value,
    pub ceiling: u128,
    /// The voucher's signature, `0x` hex.
    pub signature: String,
    pub total: u128,
}

/// The channels whose claim is due, at most `limit`: those with vouchers
/// Reeve has not seen claimed (by its last read of the escrow) whose payer
/// asked to withdraw, or whose oldest unclaimed voucher is older than
/// `after`, or than a quarter of the channel's withdraw delay, whichever is
/// shorter: a claim then lands with three quarters of the delay to spare
/// even if the payer asks to withdraw the moment the voucher is taken.
/// Withdrawing channels come first.
pub async fn due(conn: &mut PgConnection, after: Duration, limit: i64) -> Result<Vec<Claim>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT c.channel_id, c.network, c.config, c.charged::TEXT AS charged, v.ceiling::TEXT AS ceiling, \
                v.signature \
           FROM batch_channels c \
           JOIN LATERAL (SELECT ceiling, signature FROM batch_vouchers \
                          WHERE channel_id = c.channel_id ORDER BY ceiling DESC LIMIT 1) v ON true \
          WHERE c.charged > c.total_claimed \
            AND (c.withdraw_requested_at > 0 \
                 OR (SELECT min(u.created_at) FROM batch_vouchers u \
                      WHERE u.channel_id = c.channel_id AND u.ceiling > c.total_claimed) \
                    <= now() - make_interval(secs => LEAST($1, (c.config->>'withdrawDelay')::FLOAT8 / 4))) \
          ORDER BY c.withdraw_requested_at DESC, c.channel_id \
          LIMIT $2",
    )
    .bind(after.as_secs_f64())
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            let amount = |column: &str| -> Result<u128, sqlx::Error> {
                let text: String = row.try_get(column)?;
                text.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))
            };
            let id: String = row.try_get("channel_id")?;
            Ok(Claim {
                channel_id: id.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                network: row.try_get("network")?,
                config: row.try_get("config")?,
                ceiling: amount("ceiling")?,
                signature: row.try_get("signature")?,
                total: amount("charged")?,
            })
        })
        .collect()
}

/// The EIP-712 digest of `claims` on `chain_id` (the escrow's
/// `getClaimBatchDigest`): what the receiver authorizer signs.
pub fn digest(chain_id: u64, claims: &[Claim]) -> B256 {
    let claims = claims
        .iter()
        .map(|c| ClaimEntry { channelId: c.channel_id, maxClaimableAmount: c.ceiling, totalClaimed: c.total })
        .collect();
    ClaimBatch { claims }.eip712_signing_hash(&domain(chain_id))
}

/// The `batch-settlement` claim payload (`payload.type = "claim"`) for
/// `claims`, signed by the receiver authorizer (`signature`, `0x` hex), as
/// `@x402/evm`'s channel manager sends it to a facilitator's `/settle`.
pub fn payload(claims: &[Claim], signature: &str) -> Value {
    let claims: Vec<Value> = claims
        .iter()
        .map(|c| {
            json!({
                "voucher": { "channel": c.config, "maxClaimableAmount": c.ceiling.to_string() },
                "signature": c.signature,
                "totalClaimed": c.total.to_string(),
            })
        })
        .collect();
    json!({ "type": "claim", "claims": claims, "claimAuthorizerSignature": signature })
}
