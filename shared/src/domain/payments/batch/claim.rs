//! Claiming what the vouchers bought (issue 42): the claims that are due,
//! the `ClaimBatch` digest the receiver authorizer signs, and the payload a
//! facilitator's `/settle` sends to the escrow as `claimWithSignature`.
//!
//! The sweep runs them through a [`Claimer`], where the sweeper is given
//! the receiver authorizer's key (`REEVE_BATCH_AUTHORIZER_KEY`): it reads
//! each due channel from the escrow first (a claim whose answer was lost
//! may have landed), signs one batch per `payTo` and token, has the
//! facilitator's `/settle` send it (`claimWithSignature`), and reads the
//! channels again. A claim is safe to send again: the escrow's totals are
//! cumulative, so a claim at or below what is recorded changes nothing,
//! and a claim that failed or was lost is simply due again next sweep.
//!
//! Claimed money waits in the escrow, credited to the receiver, until a
//! `settle` pays it to `payTo`. Any read that finds claims Reeve had not
//! seen on a channel (a claim just sent, or one that landed after its
//! answer was lost) marks the receiver owed (`batch_payouts`), and every
//! sweep then settles what each owed receiver has unpaid ([`Claimer`]'s
//! payout pass), so nothing claimed is left in the escrow.
//!
//! A channel whose escrow holds less than its vouchers bought (the payer
//! withdrew before a claim landed, which the claim policy leaves three
//! quarters of the withdraw delay to prevent) is claimed as far as its
//! balance goes; the rest is written off, logged and counted
//! (`claim_shortfall`), and never claimed again.

use std::collections::BTreeMap;
use std::time::Duration;

use alloy_primitives::{Address, B256};
use alloy_signer::k256::ecdsa::SigningKey;
use alloy_sol_types::{SolStruct, sol};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool, Row};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::channel::{OnChain, refresh};
use super::escrow::{read, unpaid};
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
        "(CASE WHEN c.charged <= c.total_claimed + c.written_off THEN NULL \
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
          WHERE c.charged > c.total_claimed + c.written_off AND ",
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
    /// What the vouchers bought that the escrow no longer held when the
    /// sweep came to claim it (the payer withdrew it first): lost.
    pub written_off: String,
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
                GREATEST(c.charged - c.total_claimed - c.written_off, 0)::TEXT AS unclaimed, \
                c.written_off::TEXT AS written_off, c.balance::TEXT AS balance, \
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
          WHERE $2 OR c.charged > c.total_claimed + c.written_off \
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
    /// Claims or payouts the facilitator refused or did not answer, and
    /// channels or receivers the chain could not be read for: due again
    /// next sweep.
    pub failed: usize,
    /// Channels found holding less than their vouchers bought: claimed as
    /// far as the balance went, the rest written off.
    pub short: usize,
    /// Payouts to `payTo` the escrow now shows made.
    pub paid_out: usize,
    /// Channels still unclaimed whose payer asked to withdraw more than
    /// half the withdraw delay ago: once the delay is over, what is
    /// unclaimed is the payer's to take.
    pub at_risk: usize,
}

/// How many channels have something unclaimed and a payer who asked to
/// withdraw more than half the withdraw delay ago, by Reeve's last read.
async fn at_risk(db: &PgPool) -> Result<usize, sqlx::Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM batch_channels c \
          WHERE c.withdraw_requested_at > 0 AND c.charged > c.total_claimed + c.written_off \
            AND now() > to_timestamp(c.withdraw_requested_at + (c.config->>'withdrawDelay')::FLOAT8 / 2)",
    )
    .fetch_one(db)
    .await?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

/// The escrow's state of `claim`'s channel, its read kept in
/// `batch_channels`; `None` when the chain cannot be read.
async fn reread(chain: &Chain, db: &PgPool, claim: &Claim) -> Result<Option<OnChain>, sqlx::Error> {
    let channel = format!("{:#x}", claim.channel_id);
    match read(chain, claim.channel_id).await {
        Ok(on_chain) => {
            refresh(&mut *db.acquire().await?, &channel, on_chain).await?;
            Ok(Some(on_chain))
        }
        Err(e) => {
            tracing::warn!(%channel, error = %e, "cannot read a batch-settlement channel");
            Ok(None)
        }
    }
}

/// Writes off what `claim`'s vouchers bought beyond the escrow's `balance`,
/// and narrows the claim to the balance.
async fn write_off(db: &PgPool, claim: &mut Claim, balance: u128) -> Result<(), sqlx::Error> {
    let channel = format!("{:#x}", claim.channel_id);
    let lost = claim.total - balance;
    sqlx::query("UPDATE batch_channels SET written_off = GREATEST(written_off, $2::NUMERIC) WHERE channel_id = $1")
        .bind(&channel)
        .bind(lost.to_string())
        .execute(db)
        .await?;
    tracing::error!(
        %channel, charged = %claim.total, %balance, %lost,
        "a batch-settlement channel holds less than its vouchers bought: the payer withdrew before a claim landed"
    );
    claim.total = balance;
    Ok(())
}

/// The receiver authorizer's key from its 64 hex digits (`0x` optional);
/// what is wrong with it otherwise, never quoting it.
pub fn signing_key(key: &str) -> Result<SigningKey, String> {
    let digits = key.trim().strip_prefix("0x").unwrap_or(key.trim());
    let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(digits, bytes.as_mut()).map_err(|_| "must be 32 bytes as 64 hex digits".to_owned())?;
    SigningKey::from_slice(bytes.as_ref()).map_err(|_| "is not a valid secp256k1 key".to_owned())
}

impl Claimer {
    /// `key`: the receiver authorizer's private key, 64 hex digits (`0x`
    /// optional). The message of an error never quotes it.
    pub fn new(facilitator: Facilitator, key: &str, after: Duration) -> Result<Claimer, String> {
        Ok(Claimer { facilitator, key: signing_key(key)?, after })
    }

    /// The receiver authorizer's address: the catalog's
    /// `batch_receiver_authorizer`.
    pub fn address(&self) -> Address {
        alloy_signer::utils::public_key_to_address(self.key.verifying_key())
    }

    /// Claims what is due, then pays out what owed receivers have unpaid
    /// (see the module documentation), starting nothing after `until`.
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
            // What the escrow shows already: a claim whose answer was lost,
            // or a balance the payer withdrew from.
            let mut open = Vec::new();
            for mut claim in claims {
                let Some(on_chain) = reread(chain, db, &claim).await? else {
                    report.failed += 1;
                    continue;
                };
                if on_chain.total_claimed >= claim.total {
                    report.channels += 1;
                    continue;
                }
                if on_chain.balance < claim.total {
                    write_off(db, &mut claim, on_chain.balance).await?;
                    report.short += 1;
                    if on_chain.total_claimed >= claim.total {
                        continue;
                    }
                }
                open.push(claim);
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
            self.send(&requirements, payload(&open, &signature), budget).await;
            // The escrow decides, not the facilitator's answer.
            for claim in &open {
                match reread(chain, db, claim).await? {
                    Some(on_chain) if on_chain.total_claimed >= claim.total => report.channels += 1,
                    _ => report.failed += 1,
                }
            }
        }
        self.pay_out(db, chains, until, &mut report).await?;
        report.at_risk = at_risk(db).await?;
        if report != Claimed::default() {
            tracing::info!(?report, "batch-settlement claims");
        }
        for (action, n) in [
            ("channel_claimed", report.channels),
            ("claim_failed", report.failed),
            ("claim_shortfall", report.short),
            ("paid_out", report.paid_out),
            ("claim_at_risk", report.at_risk),
        ] {
            if n > 0 {
                crate::infra::metrics::sweeper_action(action, n as u64);
            }
        }
        Ok(report)
    }

    /// Has each owed receiver's unpaid claims (`batch_payouts`) paid to it
    /// by a `settle`, and forgets a receiver once a read made after its
    /// last claims were seen shows nothing unpaid.
    async fn pay_out(
        &self,
        db: &PgPool,
        chains: &Chains,
        until: Instant,
        report: &mut Claimed,
    ) -> Result<(), sqlx::Error> {
        let owed: Vec<(String, String, String)> =
            sqlx::query_as("SELECT network, receiver, token FROM batch_payouts ORDER BY owed_since, receiver LIMIT $1")
                .bind(MAX_CLAIMS)
                .fetch_all(db)
                .await?;
        for (network, receiver, token) in owed {
            if Instant::now() >= until {
                break;
            }
            let (Ok(chain), Ok(to), Ok(asset)) =
                (chains.get(&network), receiver.parse::<Address>(), token.parse::<Address>())
            else {
                tracing::error!(%network, %receiver, "a batch-settlement payout owed on a network without a chain endpoint");
                report.failed += 1;
                continue;
            };
            // The database's clock, as `owed_since` is written by it.
            let read_at: OffsetDateTime = sqlx::query_scalar("SELECT clock_timestamp()").fetch_one(db).await?;
            let mut left = unpaid(chain, to, asset).await;
            if matches!(left, Ok(n) if n > 0) {
                let settle = json!({ "type": "settle", "receiver": receiver, "token": token });
                let budget = Some(until.saturating_duration_since(Instant::now()));
                self.send(&requirements(&network, &receiver, &token), settle, budget).await;
                left = unpaid(chain, to, asset).await;
                if matches!(left, Ok(0)) {
                    report.paid_out += 1;
                }
            }
            match left {
                Ok(0) => {
                    sqlx::query(
                        "DELETE FROM batch_payouts \
                          WHERE network = $1 AND receiver = $2 AND token = $3 AND owed_since < $4",
                    )
                    .bind(&network)
                    .bind(&receiver)
                    .bind(&token)
                    .bind(read_at)
                    .execute(db)
                    .await?;
                }
                Ok(_) => report.failed += 1,
                Err(e) => {
                    tracing::warn!(%receiver, error = %e, "cannot read what the batch-settlement escrow owes a receiver");
                    report.failed += 1;
                }
            }
        }
        Ok(())
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
