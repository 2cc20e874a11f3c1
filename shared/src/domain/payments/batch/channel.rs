//! A channel's running total in Postgres (`batch_channels`,
//! `batch_vouchers`), and the one decision taken on every voucher: does it
//! buy this task?
//!
//! A voucher buys a task only when
//! - its channel is one Reeve can claim from: Reeve's receiver and receiver
//!   authorizer, the offer's token, the withdraw delay Reeve asks, and the
//!   id the escrow computes for that configuration;
//! - it is signed by the payer or the payer's authorizer ([`check_signature`]);
//! - its ceiling is exactly what the channel was charged so far plus this
//!   task's price: lower would pay for less than was bought, higher would
//!   let the next voucher skip a charge (the buyer is resynchronised by the
//!   `402` either way);
//! - the channel's balance, read from the escrow within the staleness bound,
//!   covers it, and the payer has not asked to withdraw.
//!
//! The row of the channel is locked for the decision and the record, so two
//! vouchers of one channel are decided one after the other. A voucher is
//! unique per channel and cumulative amount: sent again, it finds the task it
//! bought ([`Decision::Again`]).

use std::time::Duration;

use alloy_primitives::{Address, B256};
use sqlx::{PgConnection, Row};

use super::voucher::{ChannelConfig, SignatureError, check_signature};
use crate::domain::ids::Id;

/// What Reeve requires of every channel it takes vouchers on: the offer's
/// terms.
#[derive(Debug, Clone)]
pub struct Terms<'a> {
    /// CAIP-2 (`eip155:84532`), and its chain id.
    pub network: &'a str,
    pub chain_id: u64,
    pub receiver: Address,
    pub receiver_authorizer: Address,
    pub token: Address,
    pub withdraw_delay: u64,
}

/// A voucher as a payment carries it.
#[derive(Debug, Clone)]
pub struct VoucherIn<'a> {
    pub config: &'a ChannelConfig,
    pub channel_id: B256,
    /// `maxClaimableAmount`: the cumulative ceiling.
    pub ceiling: u128,
    pub signature: &'a [u8],
}

/// What the escrow said of a channel at one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnChain {
    pub balance: u128,
    pub total_claimed: u128,
    /// Unix seconds; 0: the payer never asked to withdraw.
    pub withdraw_requested_at: u64,
    /// How many cooperative refunds the channel has had (the escrow's
    /// `refundNonce`): the count the next one is signed for.
    pub refund_nonce: u64,
}

/// A channel as Reeve keeps it: what the `402` that resynchronises a buyer
/// tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelState {
    pub channel_id: String,
    pub charged: u128,
    pub on_chain: OnChain,
}

/// What a voucher does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It buys the task: record it with [`record`] in the same transaction.
    /// `on_chain`: the escrow's state it was decided against.
    Buys { channel: String, ceiling: u128, on_chain: OnChain },
    /// It was accepted before: the task it bought (`None`: since deleted),
    /// and who bought it ([`Purchase::space`], [`Purchase::request_hash`]):
    /// only the same request from the same Space is answered that task;
    /// anyone else is told where the channel stands (`state`).
    Again { task: Option<Id>, space: Vec<u8>, request_hash: Vec<u8>, state: ChannelState },
}

/// Who a voucher buys for, and in what: recorded with it by [`record`].
#[derive(Debug, Clone, Copy)]
pub struct Purchase<'a> {
    pub space: &'a [u8; 16],
    /// The request's hash ([`crate::domain::request::TaskRequest::hash`]).
    pub request_hash: &'a [u8; 32],
    /// The token as the offer spells it: a credit the task leaves is in it.
    pub asset: &'a str,
}

/// Why a voucher buys nothing. Every refusal but [`Refusal::Unread`] is
/// answered with the `402` that resynchronises the buyer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The channel is not one Reeve can claim from (`field` differs from
    /// the offer), or the id does not belong to its configuration.
    #[error("the voucher's channel does not match the offer: {0}")]
    WrongChannel(&'static str),
    #[error(transparent)]
    Signature(#[from] SignatureError),
    /// Its ceiling is not what was charged plus this task's price.
    #[error("the voucher's ceiling is {got}; this task needs {expected} (charged so far plus its price)")]
    NotNext { got: u128, expected: u128, state: ChannelState },
    /// The balance read covers less than its ceiling.
    #[error("the channel holds {balance}, less than the voucher's {ceiling}")]
    AboveBalance { ceiling: u128, balance: u128, state: ChannelState },
    /// The payer asked to withdraw: its vouchers may not be claimable by
    /// the time Reeve claims.
    #[error("the channel's payer asked to withdraw at {at}")]
    Withdrawing { at: u64, state: ChannelState },
    /// No read of the escrow within the staleness bound: read it and decide
    /// again with the read.
    #[error("the channel's balance has not been read recently enough")]
    Unread,
}

impl Refusal {
    /// Its stable code, the `error` of the `402` that answers it: the code
    /// `@x402/evm` gives the same refusal where it has one (its client acts
    /// on `invalid_batch_settlement_evm_cumulative_amount_mismatch` by
    /// resynchronising from the `402`'s channel state), Reeve's own
    /// otherwise.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::WrongChannel("receiver") => "invalid_batch_settlement_evm_receiver_mismatch",
            Refusal::WrongChannel("receiverAuthorizer") => "invalid_batch_settlement_evm_receiver_authorizer_mismatch",
            Refusal::WrongChannel("token") => "invalid_batch_settlement_evm_token_mismatch",
            Refusal::WrongChannel("withdrawDelay") => "invalid_batch_settlement_evm_withdraw_delay_mismatch",
            Refusal::WrongChannel(_) => "invalid_batch_settlement_evm_channel_id_mismatch",
            Refusal::Signature(_) => "invalid_batch_settlement_evm_voucher_signature",
            Refusal::NotNext { .. } => "invalid_batch_settlement_evm_cumulative_amount_mismatch",
            Refusal::AboveBalance { .. } => "invalid_batch_settlement_evm_cumulative_exceeds_balance",
            Refusal::Withdrawing { .. } => "batch_withdraw_requested",
            Refusal::Unread => "invalid_batch_settlement_evm_verification_state_unavailable",
        }
    }

    /// The channel as Reeve keeps it, where the refusal knows it: what the
    /// resynchronising `402` tells the buyer.
    pub fn state(&self) -> Option<&ChannelState> {
        match self {
            Refusal::NotNext { state, .. }
            | Refusal::AboveBalance { state, .. }
            | Refusal::Withdrawing { state, .. } => Some(state),
            _ => None,
        }
    }
}

/// The voucher Reeve last accepted on `channel` (its ceiling is what the
/// channel was charged), as `(ceiling, signature)`: a buyer that lost its
/// own state resumes from it. `None`: no voucher yet.
pub async fn last_voucher(conn: &mut PgConnection, channel: &str) -> Result<Option<(u128, String)>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT ceiling::TEXT AS ceiling, signature FROM batch_vouchers WHERE channel_id = $1 \
         ORDER BY ceiling DESC LIMIT 1",
    )
    .bind(channel)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let ceiling: String = row.try_get("ceiling")?;
    let ceiling = ceiling.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok(Some((ceiling, row.try_get("signature")?)))
}

/// Checks that `voucher` is on a channel Reeve can claim from under
/// `terms` and is signed by the channel's payer or its authorizer; answers
/// the channel's id as Reeve keeps it (lowercase hex). (Boxed: a refusal
/// is large, and this is called on every voucher.)
pub fn check_voucher(terms: &Terms<'_>, voucher: &VoucherIn<'_>) -> Result<String, Box<Refusal>> {
    let config = voucher.config;
    let fits = [
        (config.receiver == terms.receiver, "receiver"),
        (config.receiverAuthorizer == terms.receiver_authorizer, "receiverAuthorizer"),
        (config.token == terms.token, "token"),
        (config.withdrawDelay.to::<u64>() == terms.withdraw_delay, "withdrawDelay"),
        (config.id(terms.chain_id) == voucher.channel_id, "channelId"),
    ];
    if let Some((_, field)) = fits.iter().find(|(ok, _)| !ok) {
        return Err(Box::new(Refusal::WrongChannel(field)));
    }
    check_signature(config, terms.chain_id, voucher.ceiling, voucher.signature)
        .map_err(|e| Box::new(Refusal::from(e)))?;
    Ok(format!("{:#x}", voucher.channel_id))
}

/// Decides whether `voucher` buys a task priced `price` under `terms`,
/// the channel's row locked in `conn`'s transaction. `read`: the escrow's
/// state just read, if the caller read it (after an [`Refusal::Unread`]);
/// otherwise the one kept, if no older than `staleness`.
pub async fn decide(
    conn: &mut PgConnection,
    terms: &Terms<'_>,
    voucher: &VoucherIn<'_>,
    price: u128,
    read: Option<OnChain>,
    staleness: Duration,
) -> Result<Decision, DecideError> {
    let channel = check_voucher(terms, voucher).map_err(|refusal| DecideError::Refused(*refusal))?;
    if let Some(read) = read {
        store_read(conn, terms, voucher, &channel, read).await?;
    }
    let Some((charged, on_chain, fresh)) = locked(conn, &channel, staleness).await? else {
        return Err(Refusal::Unread.into());
    };
    let state = ChannelState { channel_id: channel.clone(), charged, on_chain };

    let again = sqlx::query(
        "SELECT task_id, space_idx, request_hash FROM batch_vouchers WHERE channel_id = $1 AND ceiling = $2::NUMERIC",
    )
    .bind(&channel)
    .bind(voucher.ceiling.to_string())
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = again {
        return Ok(Decision::Again {
            task: row.try_get("task_id")?,
            space: row.try_get("space_idx")?,
            request_hash: row.try_get("request_hash")?,
            state,
        });
    }
    let expected = charged.saturating_add(price);
    if voucher.ceiling != expected {
        return Err(Refusal::NotNext { got: voucher.ceiling, expected, state }.into());
    }
    if !fresh {
        return Err(Refusal::Unread.into());
    }
    if on_chain.withdraw_requested_at != 0 {
        return Err(Refusal::Withdrawing { at: on_chain.withdraw_requested_at, state }.into());
    }
    if voucher.ceiling > on_chain.balance {
        return Err(Refusal::AboveBalance { ceiling: voucher.ceiling, balance: on_chain.balance, state }.into());
    }
    Ok(Decision::Buys { channel, ceiling: voucher.ceiling, on_chain })
}

/// Records a voucher [`decide`] said buys `task` for `purchase`, in the
/// same transaction: the channel's total becomes its ceiling.
pub async fn record(
    conn: &mut PgConnection,
    (channel, ceiling): (&str, u128),
    price: u128,
    signature: &[u8],
    (task, purchase): (Id, &Purchase<'_>),
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO batch_vouchers \
             (channel_id, ceiling, price, signature, task_id, space_idx, request_hash, asset) \
         VALUES ($1, $2::NUMERIC, $3::NUMERIC, $4, $5, $6, $7, $8)",
    )
    .bind(channel)
    .bind(ceiling.to_string())
    .bind(price.to_string())
    .bind(format!("0x{}", hex::encode(signature)))
    .bind(task)
    .bind(purchase.space.as_slice())
    .bind(purchase.request_hash.as_slice())
    .bind(purchase.asset)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE batch_channels SET charged = $2::NUMERIC WHERE channel_id = $1")
        .bind(channel)
        .bind(ceiling.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Keeps what the escrow just said of a channel Reeve already keeps (the
/// claimer reads each channel before and after it claims).
pub async fn refresh(conn: &mut PgConnection, channel: &str, read: OnChain) -> Result<(), sqlx::Error> {
    // Claims Reeve had not seen on the channel (its own, landed since the
    // last read, perhaps after their answer was lost) credited the receiver
    // inside the escrow: its payout is owed until a sweep sees it paid.
    // (`before` reads the row as the statement's snapshot has it, before
    // `kept` changes it; a lock there would find it changed by `kept`.)
    sqlx::query(
        "WITH before AS (SELECT total_claimed FROM batch_channels WHERE channel_id = $1), \
              kept AS (UPDATE batch_channels SET balance = $2::NUMERIC, total_claimed = $3::NUMERIC, \
                              withdraw_requested_at = $4, refund_nonce = $5, read_at = now() \
                        WHERE channel_id = $1 RETURNING network, config) \
         INSERT INTO batch_payouts (network, receiver, token) \
         SELECT kept.network, lower(kept.config->>'receiver'), lower(kept.config->>'token') FROM kept, before \
          WHERE $3::NUMERIC > before.total_claimed \
         ON CONFLICT (network, receiver, token) DO UPDATE SET owed_since = clock_timestamp()",
    )
    .bind(channel)
    .bind(read.balance.to_string())
    .bind(read.total_claimed.to_string())
    .bind(i64::try_from(read.withdraw_requested_at).unwrap_or(i64::MAX))
    .bind(i64::try_from(read.refund_nonce).unwrap_or(i64::MAX))
    .execute(conn)
    .await?;
    Ok(())
}

/// The failure of [`decide`]: a refusal, or the database.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Keeps what the escrow just said of `channel` (creating its row on its
/// first voucher). A channel Reeve first sees with claims on it already
/// (its own, from a database restored from before them) starts charged
/// what was claimed: nothing below that can be claimed again.
async fn store_read(
    conn: &mut PgConnection,
    terms: &Terms<'_>,
    voucher: &VoucherIn<'_>,
    channel: &str,
    read: OnChain,
) -> Result<(), sqlx::Error> {
    let config = voucher.config;
    let config_json = serde_json::json!({
        "payer": format!("{:#x}", config.payer),
        "payerAuthorizer": format!("{:#x}", config.payerAuthorizer),
        "receiver": format!("{:#x}", config.receiver),
        "receiverAuthorizer": format!("{:#x}", config.receiverAuthorizer),
        "token": format!("{:#x}", config.token),
        "withdrawDelay": config.withdrawDelay.to::<u64>(),
        "salt": format!("{:#x}", config.salt),
    });
    sqlx::query(
        "INSERT INTO batch_channels \
             (channel_id, network, payer, config, charged, balance, total_claimed, withdraw_requested_at, \
              refund_nonce, read_at) \
         VALUES ($1, $2, $3, $4, $6::NUMERIC, $5::NUMERIC, $6::NUMERIC, $7, $8, now()) \
         ON CONFLICT (channel_id) DO UPDATE SET balance = EXCLUDED.balance, \
             total_claimed = EXCLUDED.total_claimed, \
             withdraw_requested_at = EXCLUDED.withdraw_requested_at, refund_nonce = EXCLUDED.refund_nonce, \
             read_at = now()",
    )
    .bind(channel)
    .bind(terms.network)
    .bind(format!("{:#x}", config.payer))
    .bind(config_json)
    .bind(read.balance.to_string())
    .bind(read.total_claimed.to_string())
    .bind(i64::try_from(read.withdraw_requested_at).unwrap_or(i64::MAX))
    .bind(i64::try_from(read.refund_nonce).unwrap_or(i64::MAX))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The channel's row, locked: what it was charged, the escrow's last
/// answer, and whether that answer is younger than `staleness`. `None`:
/// Reeve never read this channel.
pub(super) async fn locked(
    conn: &mut PgConnection,
    channel: &str,
    staleness: Duration,
) -> Result<Option<(u128, OnChain, bool)>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT charged::TEXT AS charged, balance::TEXT AS balance, total_claimed::TEXT AS total_claimed, \
                withdraw_requested_at, refund_nonce, read_at > now() - make_interval(secs => $2) AS fresh \
         FROM batch_channels WHERE channel_id = $1 FOR UPDATE",
    )
    .bind(channel)
    .bind(staleness.as_secs_f64())
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let amount = |column: &str| -> Result<u128, sqlx::Error> {
        let text: String = row.try_get(column)?;
        text.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))
    };
    let on_chain = OnChain {
        balance: amount("balance")?,
        total_claimed: amount("total_claimed")?,
        withdraw_requested_at: u64::try_from(row.try_get::<i64, _>("withdraw_requested_at")?).unwrap_or_default(),
        refund_nonce: u64::try_from(row.try_get::<i64, _>("refund_nonce")?).unwrap_or_default(),
    };
    Ok(Some((amount("charged")?, on_chain, row.try_get("fresh")?)))
}
