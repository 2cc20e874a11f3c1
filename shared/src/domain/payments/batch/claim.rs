//! Claiming what the vouchers bought (issue 42): the claims that are due,
//! the `ClaimBatch` digest the receiver authorizer signs, and the payload a
//! facilitator's `/settle` sends to the escrow as `claimWithSignature`.
//!
//! The sweep runs them through a [`Claimer`], where the sweeper is given
//! the receiver authorizer's key (`REEVE_BATCH_AUTHORIZER_KEY`): it reads
//! each due channel from the escrow first (a claim whose answer was lost
//! may have landed), signs one batch per `payTo` and token, has the
//! facilitator's `/settle` send it (`claimWithSignature`), reads the
//! channels again, and then has the claimed money paid to `payTo` (the
//! `settle` payload). A claim is safe to send again: the escrow's totals
//! are cumulative, so a claim at or below what is recorded changes nothing,
//! and a claim that failed or was lost is simply due again next sweep.

use std::collections::BTreeMap;
use std::time::Duration;

use alloy_primitives::{Address, B256};
use alloy_signer::k256::ecdsa::SigningKey;
use alloy_sol_types::{SolStruct, sol};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool, Row};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::channel::refresh;
use super::escrow::read;
use super::voucher::domain;
use crate::domain::payments::chain::{Chain, Chains};
use crate::domain::payments::challenge::{Extra, PaymentRequirements};
use crate::domain::payments::facilitator::Facilitator;
use crate::domain::payments::scheme::Scheme;

/// How many channels one sweep claims at most.
const MAX_CLAIMS: i64 = 100;

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

/// When a channel's claim falls due, as SQL over `batch_channels c` with
/// `$1` the claim policy in seconds: at once when its payer asked to
/// withdraw, else its oldest unclaimed voucher's time plus the policy or a
/// quarter of the channel's withdraw delay, whichever is shorter; NULL when
/// nothing is unclaimed. [`due`] and [`channels`] read it alike.
macro_rules! claim_due_at {
    () => {
        "(CASE WHEN c.charged <= c.total_claimed THEN NULL \
               WHEN c.withdraw_requested_at > 0 THEN now() \
               ELSE (SELECT min(u.created_at) FROM batch_vouchers u \
                      WHERE u.channel_id = c.channel_id AND u.ceiling > c.total_claimed) \
                    + make_interval(secs => LEAST($1, (c.config->>'withdrawDelay')::FLOAT8 / 4)) END)"
    };
}

/// The channels whose claim is due, at most `limit`: those with vouchers
/// Reeve has not seen claimed (by its last read of the escrow) whose payer
/// asked to withdraw, or whose oldest unclaimed voucher is older than
/// `after`, or than a quarter of the channel's withdraw delay, whichever is
/// shorter: a claim then lands with three quarters of the delay to spare
/// even if the payer asks to withdraw the moment the voucher is taken.
/// Withdrawing channels come first.
pub async fn due(conn: &mut PgConnection, after: Duration, limit: i64) -> Result<Vec<Claim>, sqlx::Error> {
    let rows = sqlx::query(concat!(
        "SELECT c.channel_id, c.network, c.config, c.charged::TEXT AS charged, v.ceiling::TEXT AS ceiling, \
                v.signature \
           FROM batch_channels c \
           JOIN LATERAL (SELECT ceiling, signature FROM batch_vouchers \
                          WHERE channel_id = c.channel_id ORDER BY ceiling DESC LIMIT 1) v ON true \
          WHERE c.charged > c.total_claimed AND ",
        claim_due_at!(),
        " <= now() \
          ORDER BY c.withdraw_requested_at DESC, c.channel_id \
          LIMIT $2"
    ))
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

/// A channel as an operator sees it (`reeve payments channels`): what its
/// vouchers bought, what the escrow showed claimed at Reeve's last read
/// (`read_at`), and when the rest is claimed. Amounts are the token's
/// smallest units, as decimal text (they may exceed a JSON number).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct ChannelState {
    pub channel_id: String,
    pub network: String,
    pub payer: String,
    pub pay_to: Option<String>,
    pub asset: Option<String>,
    pub charged: String,
    pub claimed: String,
    pub unclaimed: String,
    /// What the escrow held for the channel at the last read.
    pub balance: String,
    #[serde(with = "time::serde::rfc3339::option")]
    pub oldest_unclaimed_at: Option<OffsetDateTime>,
    /// When a sweep claims it (a past time: the next sweep).
    #[serde(with = "time::serde::rfc3339::option")]
    pub claim_due_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub withdraw_requested_at: Option<OffsetDateTime>,
    /// From when the payer can take back whatever is still unclaimed.
    #[serde(with = "time::serde::rfc3339::option")]
    pub withdrawable_at: Option<OffsetDateTime>,
    /// The cooperative refunds made at the payer's request: how many (the
    /// escrow's `refundNonce` at the last read), what they returned in all,
    /// and when the last one was.
    pub refunds: i64,
    pub refunded: String,
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_refund_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub read_at: OffsetDateTime,
}

/// The channels, those with something unclaimed first by when their claim
/// falls due (every channel with `all`, else only those), at most `limit`;
/// `after` is the claim policy (`REEVE_BATCH_CLAIM_AFTER_SECONDS`).
pub async fn channels(db: &PgPool, after: Duration, all: bool, limit: i64) -> Result<Vec<ChannelState>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT c.channel_id, c.network, c.payer, c.config->>'receiver' AS pay_to, c.config->>'token' AS asset, \
                c.charged::TEXT AS charged, c.total_claimed::TEXT AS claimed, \
                GREATEST(c.charged - c.total_claimed, 0)::TEXT AS unclaimed, c.balance::TEXT AS balance, \
                (SELECT min(u.created_at) FROM batch_vouchers u \
                  WHERE u.channel_id = c.channel_id AND u.ceiling > c.total_claimed) AS oldest_unclaimed_at, ",
        claim_due_at!(),
        " AS claim_due_at, \
                CASE WHEN c.withdraw_requested_at > 0 THEN to_timestamp(c.withdraw_requested_at) END \
                  AS withdraw_requested_at, \
                CASE WHEN c.withdraw_requested_at > 0 \
                     THEN to_timestamp(c.withdraw_requested_at + (c.config->>'withdrawDelay')::FLOAT8) END \
                  AS withdrawable_at, \
                c.refund_nonce AS refunds, \
                (SELECT COALESCE(sum(r.amount), 0) FROM batch_refunds r WHERE r.channel_id = c.channel_id)::TEXT \
                  AS refunded, \
                (SELECT max(r.created_at) FROM batch_refunds r WHERE r.channel_id = c.channel_id) AS last_refund_at, \
                c.read_at \
           FROM batch_channels c \
          WHERE $2 OR c.charged > c.total_claimed \
          ORDER BY claim_due_at NULLS LAST, c.channel_id \
          LIMIT $3"
    ))
    .bind(after.as_secs_f64())
    .bind(all)
    .bind(limit)
    .fetch_all(db)
    .await
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

/// What the sweep claims with: the facilitator that sends the claims, the
/// receiver authorizer's key that signs them, and how long a voucher may
/// wait unclaimed at most ([`due`]'s `after`).
pub struct Claimer {
    facilitator: Facilitator,
    key: SigningKey,
    after: Duration,
}

impl std::fmt::Debug for Claimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Claimer({}, key redacted, after {:?})", self.address(), self.after)
    }
}

/// What one pass of the claimer did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Channels whose claim the escrow now shows.
    pub channels: usize,
    /// Claims or settles the facilitator refused or did not answer, and
    /// channels the chain could not be read for: due again next sweep.
    pub failed: usize,
}

/// Whether the escrow shows `claim` claimed, its read kept in
/// `batch_channels`; `None` when the chain cannot be read.
async fn shows_claimed(chain: &Chain, db: &PgPool, claim: &Claim) -> Result<Option<bool>, sqlx::Error> {
    let channel = format!("{:#x}", claim.channel_id);
    match read(chain, claim.channel_id).await {
        Ok(on_chain) => {
            refresh(&mut *db.acquire().await?, &channel, on_chain).await?;
            Ok(Some(on_chain.total_claimed >= claim.total))
        }
        Err(e) => {
            tracing::warn!(%channel, error = %e, "cannot read a batch-settlement channel");
            Ok(None)
        }
    }
}

impl Claimer {
    /// `key`: the receiver authorizer's private key, 64 hex digits (`0x`
    /// optional). The message of an error never quotes it.
    pub fn new(facilitator: Facilitator, key: &str, after: Duration) -> Result<Claimer, String> {
        let digits = key.trim().strip_prefix("0x").unwrap_or(key.trim());
        let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(digits, bytes.as_mut()).map_err(|_| "must be 32 bytes as 64 hex digits".to_owned())?;
        let key = SigningKey::from_slice(bytes.as_ref()).map_err(|_| "is not a valid secp256k1 key".to_owned())?;
        Ok(Claimer { facilitator, key, after })
    }

    /// The receiver authorizer's address: the catalog's
    /// `batch_receiver_authorizer`.
    pub fn address(&self) -> Address {
        alloy_signer::utils::public_key_to_address(self.key.verifying_key())
    }

    /// Claims what is due (see the module documentation), starting nothing
    /// after `until`.
    pub async fn claim_due(&self, db: &PgPool, chains: &Chains, until: Instant) -> Result<Claimed, sqlx::Error> {
        let due = due(&mut *db.acquire().await?, self.after, MAX_CLAIMS).await?;
        let mut report = Claimed::default();
        let mut batches: BTreeMap<(String, String, String), Vec<Claim>> = BTreeMap::new();
        for claim in due {
            let text = |key: &str| claim.config.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
            batches.entry((claim.network.clone(), text("receiver"), text("token"))).or_default().push(claim);
        }
        for ((network, receiver, token), claims) in batches {
            if Instant::now() >= until {
                break;
            }
            let (Ok(chain), Some(chain_id)) =
                (chains.get(&network), network.strip_prefix("eip155:").and_then(|id| id.parse::<u64>().ok()))
            else {
                tracing::error!(%network, "batch-settlement claims due on a network without a chain endpoint");
                report.failed += claims.len();
                continue;
            };
            // What the escrow shows already: a claim whose answer was lost.
            let mut open = Vec::new();
            for claim in claims {
                match shows_claimed(chain, db, &claim).await? {
                    Some(true) => report.channels += 1,
                    Some(false) => open.push(claim),
                    None => report.failed += 1,
                }
            }
            if open.is_empty() {
                continue;
            }
            let Some(signature) = self.sign(digest(chain_id, &open)) else {
                report.failed += open.len();
                continue;
            };
            let requirements = requirements(&network, &receiver, &token);
            let budget = Some(until.saturating_duration_since(Instant::now()));
            let claimed = self.send(&requirements, payload(&open, &signature), budget).await;
            for claim in &open {
                match shows_claimed(chain, db, claim).await? {
                    Some(true) => report.channels += 1,
                    _ => report.failed += 1,
                }
            }
            if claimed {
                let settle = json!({ "type": "settle", "receiver": receiver, "token": token });
                let budget = Some(until.saturating_duration_since(Instant::now()));
                if !self.send(&requirements, settle, budget).await {
                    report.failed += 1;
                }
            }
        }
        if report != Claimed::default() {
            tracing::info!(?report, "batch-settlement claims");
        }
        for (action, n) in [("channel_claimed", report.channels), ("claim_failed", report.failed)] {
            if n > 0 {
                crate::infra::metrics::sweeper_action(action, n as u64);
            }
        }
        Ok(report)
    }

    /// The receiver authorizer's signature of `digest`, `0x` hex (65
    /// bytes, `v` 27 or 28, as the escrow's ECDSA check takes it).
    pub(super) fn sign(&self, digest: B256) -> Option<String> {
        let (signature, recovery) = self.key.sign_prehash_recoverable(digest.as_slice()).ok()?;
        let mut bytes = signature.to_bytes().to_vec();
        bytes.push(27 + recovery.to_byte());
        Some(format!("0x{}", hex::encode(bytes)))
    }

    /// The facilitator claims and refunds are sent through.
    pub(super) fn facilitator(&self) -> &Facilitator {
        &self.facilitator
    }

    /// `/settle` of a channel manager's payload: whether it went through.
    pub(super) async fn send(
        &self,
        requirements: &PaymentRequirements,
        payload: Value,
        budget: Option<Duration>,
    ) -> bool {
        let kind = payload["type"].as_str().unwrap_or_default().to_owned();
        let document = json!({ "x402Version": 2, "accepted": requirements, "payload": payload });
        match self.facilitator.settle(&document, requirements, budget).await {
            Ok(settled) if settled.success => {
                tracing::info!(%kind, transaction = %settled.transaction, "batch-settlement: sent");
                true
            }
            Ok(settled) => {
                tracing::warn!(%kind, reason = ?settled.error_reason, message = ?settled.error_message, "batch-settlement: refused");
                false
            }
            Err(e) => {
                tracing::warn!(%kind, error = %e, "batch-settlement: no answer");
                false
            }
        }
    }
}

/// The requirements a channel manager's payload is sent with: the
/// receiver and token, no price.
pub(super) fn requirements(network: &str, receiver: &str, token: &str) -> PaymentRequirements {
    PaymentRequirements {
        scheme: Scheme::Batch.name().to_owned(),
        network: network.to_owned(),
        amount: "0".into(),
        asset: token.to_owned(),
        pay_to: receiver.to_owned(),
        max_timeout_seconds: 0,
        extra: Extra {
            name: String::new(),
            version: String::new(),
            facilitator_address: None,
            receiver_authorizer: None,
            withdraw_delay: None,
            min_deposit: None,
            channel_state: None,
            voucher_state: None,
        },
    }
}
