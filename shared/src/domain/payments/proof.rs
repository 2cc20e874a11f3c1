//! Proof of payment for the `exact` scheme (EIP-3009): what the chain must
//! show before Reeve counts a payment as received.
//!
//! A used nonce is not a payment. EIP-3009 marks `(authorizer, nonce)` used
//! by *any* `transferWithAuthorization` or `receiveWithAuthorization` with
//! that nonce, and by `cancelAuthorization`; the payer holds its key, so it
//! can spend the nonce itself, to itself, before or after handing Reeve the
//! signature. What proves a payment is the transfer it made:
//!
//! 1. the token's `AuthorizationUsed(authorizer, nonce)` log, found with
//!    `eth_getLogs` from the block the attempt began at (recorded when it
//!    was created, less a few blocks for an endpoint that lags), in pieces
//!    of [`LOG_CHUNK`] blocks and never more than [`MAX_SPAN`];
//! 2. its transaction's receipt, which must have succeeded and hold a
//!    `Transfer` of exactly the amount of the token from the payer to
//!    `payTo`.
//!
//! Anything else that used the nonce ([`Proof::Spent`]) received nothing.
//! No log in the searched blocks and the nonce still unused at the last of
//! them is [`Proof::Unused`]: an authorization lands only in a block whose
//! time is before its `validBefore`, so unused at a block at or past it
//! means it never will be ([`can_still_land`]). The state is read at that
//! same block, so a transaction mined between the two reads cannot fall in
//! between.
//!
//! When a facilitator names the transaction (a settle answer, or one that
//! reverted), its receipt is read first: the common case costs one read.
//!
//! Every read stops at the network's confirmed head
//! ([`Chain::confirmed_head`]: the latest block less its confirmations,
//! `REEVE_CHAIN_CONFIRMATIONS`): a transaction in a later block is not
//! proof yet, and "unused" is said of the confirmed block, never of one a
//! reorganisation could replace.
//!
//! Only this file knows EIP-3009; another scheme proves its payment its own
//! way and gives the same [`Proof`].

use alloy_primitives::{Address, B256, U256};
use alloy_rpc_types_eth::{Filter, TransactionReceipt};
use alloy_sol_types::{SolCall, SolEvent, sol};

use super::chain::{Block, Chain, ChainError, parse_hash};

sol! {
    /// EIP-3009: whether `nonce` of `authorizer` was used (or canceled).
    function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
    /// EIP-3009: emitted by every use of a nonce, whatever the transfer.
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    /// ERC-20.
    event Transfer(address indexed from, address indexed to, uint256 value);
}

/// `eth_getLogs` asks for at most this many blocks at once: what hosted
/// endpoints accept.
pub const LOG_CHUNK: u64 = 1_000;
/// One search covers at most this many blocks from its start: an
/// authorization is valid for `maxTimeoutSeconds` (minutes), far fewer
/// blocks on any chain; past them, the state at the last block searched
/// decides.
pub const MAX_SPAN: u64 = 10_000;
/// The search starts this many blocks before the one recorded when the
/// attempt began, in case the endpoint read then lagged the chain.
pub const MARGIN: u64 = 16;

/// What a payment must have done: `payer` moved exactly `amount` of
/// `asset` to `pay_to`, using its authorization's `nonce`.
#[derive(Debug, Clone, Copy)]
pub struct Owed<'a> {
    pub asset: &'a str,
    pub payer: &'a str,
    pub nonce: &'a str,
    pub pay_to: &'a str,
    /// Atomic units, decimal.
    pub amount: &'a str,
}

/// What the chain shows of an authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    /// The transfer to us: this transaction used the authorization,
    /// succeeded, and moved exactly the amount from the payer to `payTo`.
    Paid { transaction: String },
    /// The nonce was used, and that use paid us nothing: a transfer
    /// elsewhere or of another amount, a cancel, or a use before the
    /// attempt began. The transaction, when it was found.
    Spent { transaction: Option<String> },
    /// Not used as of this block.
    Unused(Block),
    /// Used, but not in the blocks searched, and the attempt's first block
    /// is unknown (an attempt recorded without one): undecided.
    Unfound,
}

/// The block range one search covers: from the attempt's first block (less
/// [`MARGIN`]) or, unknown, [`MAX_SPAN`] back from `head`; at most
/// [`MAX_SPAN`] blocks, ending at `head` at the latest.
pub fn search_range(from_block: Option<u64>, head: u64) -> (u64, u64) {
    let start = match from_block {
        Some(from) => from.saturating_sub(MARGIN).min(head),
        None => head.saturating_sub(MAX_SPAN),
    };
    (start, head.min(start.saturating_add(MAX_SPAN)))
}

/// What the chain shows of `owed`'s authorization: see the module
/// documentation. `named`: a transaction a facilitator said it sent.
pub async fn prove(
    chain: &Chain,
    owed: &Owed<'_>,
    from_block: Option<u64>,
    named: Option<&str>,
) -> Result<Proof, ChainError> {
    let parsed = Parsed::of(owed)?;
    // Nothing past the network's confirmations proves anything: a block a
    // reorganisation could still drop is read as if not yet mined. (With
    // none, a mined receipt is confirmed: the common case costs one read.)
    let mut confirmed = None;
    if let Some(named) = named {
        let hash = parse_hash(named)?;
        if let Some(receipt) = chain.receipt(hash).await?
            && parsed.paid_by(&receipt)
        {
            if chain.confirmations() == 0 {
                return Ok(Proof::Paid { transaction: named.to_ascii_lowercase() });
            }
            let head = chain.confirmed_head().await?;
            if receipt.block_number.is_some_and(|mined| mined <= head.number) {
                return Ok(Proof::Paid { transaction: named.to_ascii_lowercase() });
            }
            confirmed = Some(head);
        }
        // Not mined (or not confirmed) yet, reverted (front-run, say), or
        // not ours: the log says which transaction used the nonce, if any
        // did.
    }
    let head = match confirmed {
        Some(head) => head,
        None => chain.confirmed_head().await?,
    };
    let (start, end) = search_range(from_block, head.number);
    let last = if end == head.number { head } else { chain.block(end).await? };
    let mut at = start;
    while at <= end {
        let to = end.min(at + LOG_CHUNK - 1);
        let filter = Filter::new()
            .address(parsed.asset)
            .event_signature(AuthorizationUsed::SIGNATURE_HASH)
            .topic1(parsed.payer.into_word())
            .topic2(parsed.nonce)
            .from_block(at)
            .to_block(to);
        if let Some(transaction) = chain.logs(&filter).await?.iter().find_map(|log| log.transaction_hash) {
            let receipt = chain.receipt(transaction).await?;
            let shown = format!("{transaction:#x}");
            return Ok(match receipt {
                Some(receipt) if parsed.paid_by(&receipt) => Proof::Paid { transaction: shown },
                Some(_) => Proof::Spent { transaction: Some(shown) },
                None => return Err(ChainError::Rpc(format!("no receipt for {shown}, whose log was found"))),
            });
        }
        at = to + 1;
    }
    let call = authorizationStateCall { authorizer: parsed.payer, nonce: parsed.nonce }.abi_encode();
    let answer = chain.call(parsed.asset, call, last.number).await?;
    let used = authorizationStateCall::abi_decode_returns(&answer)
        .map_err(|e| ChainError::Rpc(format!("authorizationState answered {e}")))?;
    Ok(match (used, from_block) {
        (false, _) => Proof::Unused(last),
        // Used by the last block searched, yet in none of them since the
        // attempt began: used before it, by someone else's transaction.
        (true, Some(_)) => Proof::Spent { transaction: None },
        (true, None) => Proof::Unfound,
    })
}

/// Whether an authorization valid before `valid_before` (decimal unix
/// seconds) can still land, seen at a block of `timestamp`.
pub fn can_still_land(valid_before: &str, timestamp: u64) -> bool {
    match valid_before.parse::<U256>() {
        Ok(before) => U256::from(timestamp) < before,
        // Unreadable: assume it can, so it is never failed on a guess.
        Err(_) => true,
    }
}

/// [`Owed`] in the chain's types.
struct Parsed {
    asset: Address,
    payer: Address,
    nonce: B256,
    pay_to: Address,
    amount: U256,
}

impl Parsed {
    fn of(owed: &Owed<'_>) -> Result<Parsed, ChainError> {
        let malformed = |what: &str, value: &str| ChainError::Malformed(format!("{what} {value:?}"));
        Ok(Parsed {
            asset: owed.asset.parse().map_err(|_| malformed("asset", owed.asset))?,
            payer: owed.payer.parse().map_err(|_| malformed("payer", owed.payer))?,
            nonce: owed.nonce.parse().map_err(|_| malformed("nonce", owed.nonce))?,
            pay_to: owed.pay_to.parse().map_err(|_| malformed("payTo", owed.pay_to))?,
            amount: U256::from_str_radix(owed.amount, 10).map_err(|_| malformed("amount", owed.amount))?,
        })
    }

    /// Whether `receipt` is the payment: it succeeded, used this
    /// authorization, and moved exactly the amount from the payer to
    /// `payTo`, all in the token's own logs.
    fn paid_by(&self, receipt: &TransactionReceipt) -> bool {
        if !receipt.inner.status() {
            return false;
        }
        let ours = || receipt.inner.logs().iter().filter(|log| log.address() == self.asset);
        let used = ours().any(|log| {
            AuthorizationUsed::decode_log(&log.inner)
                .is_ok_and(|e| e.data.authorizer == self.payer && e.data.nonce == self.nonce)
        });
        let transferred = ours().any(|log| {
            Transfer::decode_log(&log.inner)
                .is_ok_and(|e| e.data.from == self.payer && e.data.to == self.pay_to && e.data.value == self.amount)
        });
        used && transferred
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_starts_before_the_attempt_and_never_spans_more_than_its_cap() {
        // (first block recorded, head) → (start, end)
        let cases = [
            (Some(1_000), 1_050, (984, 1_050)),
            (Some(5), 10, (0, 10)),
            (Some(100), 50_000, (84, 84 + MAX_SPAN)),
            // The endpoint's head behind the recorded block: nothing past it.
            (Some(2_000), 1_990, (1_984, 1_990)),
            (None, 50_000, (50_000 - MAX_SPAN, 50_000)),
            (None, 10, (0, 10)),
        ];
        for (from, head, want) in cases {
            assert_eq!(search_range(from, head), want, "{from:?} at {head}");
        }
    }

    #[test]
    fn an_authorization_lands_only_in_a_block_before_valid_before() {
        assert!(can_still_land("1000", 999));
        assert!(!can_still_land("1000", 1000));
        assert!(!can_still_land("1000", 1001));
        assert!(can_still_land("115792089237316195423570985008687907853269984665640564039457584007913129639935", 5));
        assert!(can_still_land("not a number", u64::MAX));
    }
}
