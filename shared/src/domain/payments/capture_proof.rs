//! Proof for a metered (`upto`) capture: what the chain must show before a
//! capture counts as paid, or as never to be paid.
//!
//! A transfer of the right amount from the payer to `payTo` is not enough:
//! the same payer may owe the same `payTo` the same amount for another task,
//! and the facilitator may name any transaction. What settles *this*
//! authorization is a call of x402's upto proxy (`settle` or
//! `settleWithPermit`) whose calldata carries this authorization's Permit2
//! nonce, owner, token and witness (`to`, `facilitator`), whose receipt
//! succeeded with the proxy's `Settled` log, and in which the token moved the
//! settled amount from the payer to `payTo`. Permit2 lets one nonce be used
//! once, so at most one transaction can ever be that proof.
//!
//! Nothing paid is proven only by the nonce itself, read with Permit2's
//! `nonceBitmap` at a confirmed block past the signed deadline (from then
//! on Permit2 refuses the signature, so the state read there is final):
//! - unused: the authorization can never be used; nothing was charged;
//! - used, and no transaction in the blocks since the attempt began settled
//!   it through the proxy: the payer spent the nonce itself
//!   (`invalidateUnorderedNonces`, or another Permit2 transfer of its own);
//!   nothing was charged to `payTo`.
//!
//! A reverted receipt, or one that does not match, proves neither: the
//! capture stays open until the nonce decides.

use alloy_primitives::{Address, B256, U256};
use alloy_rpc_types_eth::{Filter, TransactionReceipt};
use alloy_sol_types::{SolCall, SolEvent, sol};

use super::chain::{Block, Chain, ChainError, SentTransaction};
use super::proof::{LOG_CHUNK, search_range};
use super::upto::{PERMIT2, UPTO_PROXY};

sol! {
    /// ERC-20.
    event Transfer(address indexed from, address indexed to, uint256 value);
    /// x402's upto proxy, after a settle.
    event Settled();
    /// x402's upto proxy, after a settle that applied an EIP-2612 permit.
    event SettledWithPermit();

    struct TokenPermissions { address token; uint256 amount; }
    struct PermitTransferFrom { TokenPermissions permitted; uint256 nonce; uint256 deadline; }
    struct Witness { address to; address facilitator; uint256 validAfter; }
    struct EIP2612Permit { uint256 value; uint256 deadline; bytes32 r; bytes32 s; uint8 v; }

    /// The proxy's two ways to settle, as `@x402/evm`'s ABI has them.
    function settle(PermitTransferFrom permit, uint256 amount, address owner, Witness witness, bytes signature);
    function settleWithPermit(
        EIP2612Permit permit2612,
        PermitTransferFrom permit,
        uint256 amount,
        address owner,
        Witness witness,
        bytes signature
    );

    /// Permit2: bit `nonce & 0xff` of word `nonce >> 8` is set once the
    /// owner's unordered nonce is used or invalidated.
    function nonceBitmap(address owner, uint256 wordPos) external view returns (uint256);
}

/// The authorization a capture settles, in the chain's types: who signed
/// which Permit2 nonce for which token, paying whom, through which
/// facilitator, up to when.
#[derive(Debug, Clone, Copy)]
pub struct Signed {
    pub token: Address,
    pub payer: Address,
    pub nonce: U256,
    pub pay_to: Address,
    pub facilitator: Address,
    /// Unix seconds; Permit2 refuses the signature in any later block.
    pub deadline: u64,
}

impl Signed {
    /// From the stored payment document (`payload.permit2Authorization`).
    pub fn of(document: &serde_json::Value) -> Option<Signed> {
        let auth = &document["payload"]["permit2Authorization"];
        let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
        Some(Signed {
            token: text(&auth["permitted"]["token"])?.parse().ok()?,
            payer: text(&auth["from"])?.parse().ok()?,
            nonce: U256::from_str_radix(&text(&auth["nonce"])?, 10).ok()?,
            pay_to: text(&auth["witness"]["to"])?.parse().ok()?,
            facilitator: text(&auth["witness"]["facilitator"])?.parse().ok()?,
            deadline: text(&auth["deadline"])?.parse().ok()?,
        })
    }

    /// Whether `sent` was the facilitator's settle of this authorization,
    /// and `receipt` shows it paid: the amount it settled, else `None`.
    fn paid_by(&self, sent: &SentTransaction, receipt: &TransactionReceipt) -> Option<U256> {
        let proxy: Address = UPTO_PROXY.parse().ok()?;
        if !receipt.inner.status() || sent.to != Some(proxy) || sent.from != self.facilitator {
            return None;
        }
        let (permit, amount, owner, witness) = if let Ok(call) = settleCall::abi_decode(&sent.input) {
            (call.permit, call.amount, call.owner, call.witness)
        } else {
            let call = settleWithPermitCall::abi_decode(&sent.input).ok()?;
            (call.permit, call.amount, call.owner, call.witness)
        };
        let ours = owner == self.payer
            && permit.nonce == self.nonce
            && permit.permitted.token == self.token
            && witness.to == self.pay_to
            && witness.facilitator == self.facilitator;
        if !ours {
            return None;
        }
        let logs = receipt.inner.logs();
        let settled = logs.iter().filter(|log| log.address() == proxy).any(|log| {
            let topic = log.topics().first();
            topic == Some(&Settled::SIGNATURE_HASH) || topic == Some(&SettledWithPermit::SIGNATURE_HASH)
        });
        let transferred = logs.iter().filter(|log| log.address() == self.token).any(|log| {
            Transfer::decode_log(&log.inner)
                .is_ok_and(|e| e.data.from == self.payer && e.data.to == self.pay_to && e.data.value == amount)
        });
        (settled && transferred).then_some(amount)
    }
}

/// A transaction that settled the authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paid {
    /// `0x`-prefixed, lower case.
    pub transaction: String,
    /// Atomic units, as moved on chain.
    pub amount: U256,
}

/// What a look at the chain found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The settle of this authorization, if one is mined.
    pub paid: Option<Paid>,
    /// The named transaction is mined (and, if `paid` is `None`, did not
    /// pay: reverted, or not this authorization's).
    pub named_mined: bool,
}

/// Looks for the settle of `signed`: first the transaction a facilitator
/// named, then the token's transfers from the payer to `payTo` since the
/// attempt began (`from_block`), up to `until` (the confirmed head when
/// `None`). Nothing past the network's confirmations counts: a named
/// transaction mined later is "not mined" yet.
pub async fn find(
    chain: &Chain,
    signed: &Signed,
    from_block: Option<u64>,
    named: Option<&str>,
    until: Option<u64>,
) -> Result<Found, ChainError> {
    let end = match until {
        Some(block) => block,
        None => chain.confirmed_head().await?.number,
    };
    let mut named_mined = false;
    if let Some(named) = named {
        let hash = super::chain::parse_hash(named)?;
        if let Some(receipt) = chain.receipt(hash).await?
            && receipt.block_number.is_some_and(|mined| mined <= end)
        {
            named_mined = true;
            if let Some(paid) = settled_in(chain, signed, hash, &receipt).await? {
                return Ok(Found { paid: Some(paid), named_mined });
            }
        }
    }
    let (start, end) = search_range(from_block, end);
    let mut at = start;
    while at <= end {
        let to = end.min(at + LOG_CHUNK - 1);
        let filter = Filter::new()
            .address(signed.token)
            .event_signature(Transfer::SIGNATURE_HASH)
            .topic1(signed.payer.into_word())
            .topic2(signed.pay_to.into_word())
            .from_block(at)
            .to_block(to);
        let mut hashes: Vec<B256> = chain.logs(&filter).await?.iter().filter_map(|log| log.transaction_hash).collect();
        hashes.dedup();
        for hash in hashes {
            let Some(receipt) = chain.receipt(hash).await? else { continue };
            if let Some(paid) = settled_in(chain, signed, hash, &receipt).await? {
                return Ok(Found { paid: Some(paid), named_mined });
            }
        }
        at = to + 1;
    }
    Ok(Found { paid: None, named_mined })
}

async fn settled_in(
    chain: &Chain,
    signed: &Signed,
    hash: B256,
    receipt: &TransactionReceipt,
) -> Result<Option<Paid>, ChainError> {
    // A failed receipt pays nothing: no need to read what it asked for.
    if !receipt.inner.status() {
        return Ok(None);
    }
    let Some(sent) = chain.transaction(hash).await? else { return Ok(None) };
    Ok(signed.paid_by(&sent, receipt).map(|amount| Paid { transaction: format!("{hash:#x}"), amount }))
}

/// Whether Permit2 shows `signed`'s nonce used (or invalidated) at block `at`.
pub async fn nonce_used(chain: &Chain, signed: &Signed, at: u64) -> Result<bool, ChainError> {
    let permit2: Address = PERMIT2.parse().map_err(|_| ChainError::Malformed("Permit2's address".into()))?;
    let call = nonceBitmapCall { owner: signed.payer, wordPos: signed.nonce >> 8 }.abi_encode();
    let answer = chain.call(permit2, call, at).await?;
    let word = nonceBitmapCall::abi_decode_returns(&answer)
        .map_err(|e| ChainError::Rpc(format!("nonceBitmap answered {e}")))?;
    let bit = signed.nonce & U256::from(0xff_u8);
    Ok(word.bit(bit.to::<usize>()))
}

/// What the chain decided of an authorization, once past its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Settled through the proxy in this transaction.
    Paid(Paid),
    /// The nonce was never used: nothing was, nor can be, charged.
    Unused,
    /// The payer used the nonce itself, paying `payTo` nothing.
    Spent,
}

/// Decides `signed` from the chain once a confirmed block is past its
/// deadline by `margin` seconds; `None` while none is. The state read there
/// is final: Permit2 refuses the signature in every block after the
/// deadline.
pub async fn decide(
    chain: &Chain,
    signed: &Signed,
    from_block: Option<u64>,
    margin: u64,
) -> Result<Option<Decided>, ChainError> {
    let head: Block = chain.confirmed_head().await?;
    if head.timestamp <= signed.deadline.saturating_add(margin) {
        return Ok(None);
    }
    if !nonce_used(chain, signed, head.number).await? {
        return Ok(Some(Decided::Unused));
    }
    let found = find(chain, signed, from_block, None, Some(head.number)).await?;
    Ok(Some(found.paid.map_or(Decided::Spent, Decided::Paid)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Bytes, Log as PrimitiveLog, LogData, address};
    use alloy_rpc_types_eth::Log;

    const PAYER: Address = address!("0x1111111111111111111111111111111111111111");
    const PAY_TO: Address = address!("0x2222222222222222222222222222222222222222");
    const TOKEN: Address = address!("0x3333333333333333333333333333333333333333");
    const FACILITATOR: Address = address!("0x4444444444444444444444444444444444444444");

    fn signed() -> Signed {
        Signed {
            token: TOKEN,
            payer: PAYER,
            nonce: U256::from(77),
            pay_to: PAY_TO,
            facilitator: FACILITATOR,
            deadline: 1,
        }
    }

    fn settle_input(nonce: u64, amount: u64, to: Address) -> Bytes {
        settleCall {
            permit: PermitTransferFrom {
                permitted: TokenPermissions { token: TOKEN, amount: U256::from(1_000) },
                nonce: U256::from(nonce),
                deadline: U256::from(1),
            },
            amount: U256::from(amount),
            owner: PAYER,
            witness: Witness { to, facilitator: FACILITATOR, validAfter: U256::ZERO },
            signature: Bytes::new(),
        }
        .abi_encode()
        .into()
    }

    fn receipt(success: bool, logs: Vec<PrimitiveLog>) -> TransactionReceipt {
        let logs: Vec<Log> = logs.into_iter().map(|inner| Log { inner, ..Default::default() }).collect();
        let json = serde_json::json!({
            "transactionHash": B256::ZERO, "transactionIndex": "0x0", "blockHash": B256::ZERO, "blockNumber": "0x1",
            "from": FACILITATOR, "to": UPTO_PROXY, "cumulativeGasUsed": "0x1", "gasUsed": "0x1",
            "effectiveGasPrice": "0x1", "contractAddress": null, "logs": logs, "logsBloom": alloy_primitives::Bloom::ZERO,
            "type": "0x2", "status": if success { "0x1" } else { "0x0" }
        });
        serde_json::from_value(json).unwrap()
    }

    fn transfer(value: u64) -> PrimitiveLog {
        let event = Transfer { from: PAYER, to: PAY_TO, value: U256::from(value) };
        PrimitiveLog { address: TOKEN, data: event.encode_log_data() }
    }

    fn settled_log() -> PrimitiveLog {
        PrimitiveLog {
            address: UPTO_PROXY.parse().unwrap(),
            data: LogData::new_unchecked(vec![Settled::SIGNATURE_HASH], Bytes::new()),
        }
    }

    /// A capture is proven only by a settle of this authorization's own
    /// nonce and witness, which succeeded and moved what it settled.
    #[test]
    fn only_this_authorizations_settle_proves_the_capture() {
        let proxy = Some(UPTO_PROXY.parse().unwrap());
        let sent = |input: Bytes| SentTransaction { from: FACILITATOR, to: proxy, input };
        let good = receipt(true, vec![transfer(5), settled_log()]);
        assert_eq!(signed().paid_by(&sent(settle_input(77, 5, PAY_TO)), &good), Some(U256::from(5)));
        let cases = [
            ("another nonce: another task's settle", sent(settle_input(78, 5, PAY_TO)), good.clone()),
            ("another recipient in the witness", sent(settle_input(77, 5, PAYER)), good.clone()),
            ("settled an amount the token did not move", sent(settle_input(77, 6, PAY_TO)), good.clone()),
            ("reverted", sent(settle_input(77, 5, PAY_TO)), receipt(false, vec![])),
            ("no Settled log", sent(settle_input(77, 5, PAY_TO)), receipt(true, vec![transfer(5)])),
            (
                "sent by another account than the facilitator",
                SentTransaction { from: PAYER, to: proxy, input: settle_input(77, 5, PAY_TO) },
                good.clone(),
            ),
            (
                "not a call of the proxy",
                SentTransaction { from: FACILITATOR, to: Some(TOKEN), input: settle_input(77, 5, PAY_TO) },
                good.clone(),
            ),
            ("calldata of something else", sent(Bytes::from_static(&[1, 2, 3, 4])), good.clone()),
        ];
        for (case, sent, receipt) in cases {
            assert_eq!(signed().paid_by(&sent, &receipt), None, "{case}");
        }
    }

    #[test]
    fn the_signed_terms_are_read_from_the_stored_document() {
        let document = serde_json::json!({"payload": {"permit2Authorization": {
            "from": PAYER, "permitted": {"token": TOKEN, "amount": "1000"}, "spender": UPTO_PROXY,
            "nonce": "77", "deadline": "1", "witness": {"to": PAY_TO, "facilitator": FACILITATOR, "validAfter": "0"}
        }}});
        let read = Signed::of(&document).unwrap();
        assert_eq!((read.payer, read.nonce, read.pay_to, read.deadline), (PAYER, U256::from(77), PAY_TO, 1));
        assert!(Signed::of(&serde_json::json!({"payload": {}})).is_none());
    }
}
