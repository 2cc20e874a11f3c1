//! The run-start check of a metered task (x402 `upto`): before its executor
//! starts, the worker asks the chain whether the authorization signed at
//! create can still be settled once the run ends. Nothing runs on an
//! authorization the payer has withdrawn: a run whose capture is then
//! refused would have done its work for nothing, and shown its result to a
//! payer who never pays.
//!
//! One round trip: a Multicall3 `aggregate3` `eth_call` reads at one block
//! - the payer's token balance, which must cover the ceiling;
//! - its token allowance to Permit2, which must cover the ceiling, unless
//!   the EIP-2612 permit it signed for gas sponsoring
//!   (`extensions.eip2612GasSponsoring`) can still set it: the token's
//!   `nonces(payer)` is still the permit's nonce, it approves Permit2 for at
//!   least the ceiling, and its deadline outlasts the run and the capture;
//! - Permit2's `nonceBitmap(payer, nonce >> 8)`, whose bit `nonce & 0xff`
//!   must be clear (set: the nonce was used or the payer invalidated it with
//!   `invalidateUnorderedNonces`);
//! - the block's time, which must leave the signed deadline the kind's
//!   timeout plus the time a capture needs ([`UPTO_SETTLE_SECONDS`]).
//!
//! Each failure has its code: [`PAYMENT_REVOKED`] (the approval or the
//! nonce), [`INSUFFICIENT_FUNDS`], [`AUTHORIZATION_EXPIRED`]. A chain that
//! cannot be read decides nothing: the run is tried again later.

use std::time::Duration;

use alloy_primitives::{Address, U256};
use alloy_rpc_types_eth::BlockId;
use alloy_sol_types::{SolCall, sol};
use serde_json::Value;
use sqlx::PgPool;

use super::chain::{Block, Chain, Chains};
use super::challenge::UPTO_SETTLE_SECONDS;
use super::upto::{AUTHORIZATION_EXPIRED, INSUFFICIENT_FUNDS, PAYMENT_REVOKED, PERMIT2};
use crate::domain::ids::Id;

sol! {
    /// ERC-20.
    function balanceOf(address owner) external view returns (uint256);
    /// ERC-20.
    function allowance(address owner, address spender) external view returns (uint256);
    /// EIP-2612: the owner's next permit nonce.
    function nonces(address owner) external view returns (uint256);
    /// Permit2: 256 unordered nonces of `owner` per word, a set bit used.
    function nonceBitmap(address owner, uint256 wordPos) external view returns (uint256);
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunCheck {
    /// The authorization can still be settled after a run.
    Stands,
    /// It cannot: the task fails with `code`, nothing runs, nothing is
    /// charged.
    Refused { code: &'static str, message: String },
    /// The chain could not tell (unreachable, no endpoint, a malformed
    /// answer): try again later.
    Unreadable(String),
}

/// Checks the authorization of task `task`, whose run takes up to `run`.
/// `None`: the task has no metered authorization still `authorized` (not
/// metered, or its capture is under way already).
pub async fn check_before_run(
    db: &PgPool,
    chains: &Chains,
    task: Id,
    run: Duration,
) -> Result<Option<RunCheck>, sqlx::Error> {
    let signed: Option<Signed> = sqlx::query_as(
        "SELECT network, asset, payer, amount, nonce, valid_before::text AS valid_before, document
           FROM payment_attempts
          WHERE task_id = $1 AND scheme = 'upto' AND status = 'authorized' AND document IS NOT NULL",
    )
    .bind(task)
    .fetch_optional(db)
    .await?;
    let Some(Signed { network, asset, payer, amount, nonce, valid_before, document }) = signed else {
        return Ok(None);
    };
    let terms = match Terms::of(&asset, &payer, &amount, &nonce, valid_before.as_deref(), &document) {
        Ok(terms) => terms,
        // Verified at create, so never expected: nothing can be told.
        Err(what) => return Ok(Some(RunCheck::Unreadable(format!("the stored authorization's {what}")))),
    };
    let chain = match chains.get(&network) {
        Ok(chain) => chain,
        Err(e) => return Ok(Some(RunCheck::Unreadable(e.to_string()))),
    };
    let started = std::time::Instant::now();
    let read = chain.aggregate3(&terms.calls(), BlockId::latest()).await;
    tracing::debug!(took_ms = started.elapsed().as_millis() as u64, "run-start check read the chain");
    let readings = match read {
        Ok((block, answers)) => match Readings::of(block, &answers) {
            Some(readings) => readings,
            None => return Ok(Some(RunCheck::Unreadable("the token or Permit2 did not answer".into()))),
        },
        Err(e) => return Ok(Some(RunCheck::Unreadable(e.to_string()))),
    };
    Ok(Some(judge(&terms, &readings, run)))
}

/// The check's one chain read for `payer`'s authorization of `token` with
/// Permit2 nonce `nonce` (decimal), the permit's `nonces` read too when
/// `with_permit`, verdict left out: what the worker bench times.
pub async fn read_once(chain: &Chain, token: &str, payer: &str, nonce: &str, with_permit: bool) -> Result<(), String> {
    let permit = with_permit.then(|| json_permit(token, payer));
    let document = serde_json::json!({"extensions": {"eip2612GasSponsoring": {"info": permit}}});
    let terms = Terms::of(token, payer, "1", nonce, Some("0"), &document).map_err(|what| format!("bad {what}"))?;
    let (block, answers) = chain.aggregate3(&terms.calls(), BlockId::latest()).await.map_err(|e| e.to_string())?;
    Readings::of(block, &answers).map(|_| ()).ok_or_else(|| "the token or Permit2 did not answer".into())
}

fn json_permit(token: &str, payer: &str) -> Value {
    serde_json::json!({"from": payer, "asset": token, "spender": PERMIT2, "amount": "1", "nonce": "0", "deadline": "0"})
}

/// A metered attempt still `authorized`, as stored at create.
#[derive(sqlx::FromRow)]
struct Signed {
    network: String,
    asset: String,
    payer: String,
    /// The ceiling, atomic units.
    amount: String,
    /// Permit2's nonce, decimal.
    nonce: String,
    /// Permit2's deadline, decimal unix seconds.
    valid_before: Option<String>,
    #[sqlx(json)]
    document: Value,
}

/// What the payer signed at create, in the chain's types.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Terms {
    token: Address,
    payer: Address,
    /// What a capture may take: the requirement's amount.
    ceiling: U256,
    /// Permit2's unordered nonce.
    nonce: U256,
    /// Permit2's deadline, unix seconds.
    deadline: u64,
    /// The EIP-2612 permit signed for gas sponsoring, if any.
    permit: Option<Permit>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Permit {
    nonce: U256,
    deadline: u64,
    amount: U256,
}

impl Terms {
    fn of(
        asset: &str,
        payer: &str,
        amount: &str,
        nonce: &str,
        valid_before: Option<&str>,
        document: &Value,
    ) -> Result<Terms, &'static str> {
        let number = |text: &str| text.trim().parse::<U256>().ok();
        let token: Address = asset.parse().map_err(|_| "asset")?;
        let payer: Address = payer.parse().map_err(|_| "payer")?;
        let permit = document.pointer("/extensions/eip2612GasSponsoring/info").and_then(|info| {
            let text = |key: &str| info.get(key).and_then(Value::as_str);
            let spender: Address = text("spender")?.parse().ok()?;
            let from: Address = text("from")?.parse().ok()?;
            let for_this = spender == PERMIT2.parse::<Address>().ok()? && from == payer;
            let same_token = text("asset")?.parse::<Address>().ok()? == token;
            (for_this && same_token).then_some(())?;
            Some(Permit {
                nonce: number(text("nonce")?)?,
                deadline: text("deadline")?.parse().ok()?,
                amount: number(text("amount")?)?,
            })
        });
        Ok(Terms {
            token,
            payer,
            ceiling: number(amount).ok_or("amount")?,
            nonce: number(nonce).ok_or("nonce")?,
            deadline: valid_before.and_then(|d| d.parse().ok()).ok_or("deadline")?,
            permit,
        })
    }

    /// The reads, in the order [`Readings::of`] takes them.
    fn calls(&self) -> Vec<(Address, Vec<u8>)> {
        let permit2: Address = PERMIT2.parse().expect("a valid address");
        let mut calls = vec![
            (self.token, balanceOfCall { owner: self.payer }.abi_encode()),
            (self.token, allowanceCall { owner: self.payer, spender: permit2 }.abi_encode()),
            (permit2, nonceBitmapCall { owner: self.payer, wordPos: self.nonce >> 8 }.abi_encode()),
        ];
        if self.permit.is_some() {
            calls.push((self.token, noncesCall { owner: self.payer }.abi_encode()));
        }
        calls
    }

    /// Whether Permit2 has this authorization's nonce marked used.
    fn nonce_used(&self, bitmap: U256) -> bool {
        let bit = self.nonce & U256::from(0xff);
        (bitmap >> bit) & U256::from(1) == U256::from(1)
    }
}

/// What the chain answered, at one block.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Readings {
    block: Block,
    balance: U256,
    allowance: U256,
    bitmap: U256,
    /// The token's `nonces(payer)`, when a permit was signed (`None` also
    /// when the token has no EIP-2612: the permit cannot be used).
    permit_nonce: Option<U256>,
}

impl Readings {
    fn of(block: Block, answers: &[Option<alloy_primitives::Bytes>]) -> Option<Readings> {
        let word = |i: usize| -> Option<U256> {
            let answer = answers.get(i)?.as_ref()?;
            (answer.len() >= 32).then(|| U256::from_be_slice(&answer[..32]))
        };
        Some(Readings { block, balance: word(0)?, allowance: word(1)?, bitmap: word(2)?, permit_nonce: word(3) })
    }
}

/// The verdict on `terms` given `readings`, for a run of `run`.
fn judge(terms: &Terms, readings: &Readings, run: Duration) -> RunCheck {
    let refused = |code, message: String| RunCheck::Refused {
        code,
        message: format!("{message}, so it was not started; nothing was charged. Create it again with a new payment"),
    };
    if terms.nonce_used(readings.bitmap) {
        return refused(
            PAYMENT_REVOKED,
            "its payment authorization was withdrawn: Permit2 shows its nonce used (the payer invalidated it, or \
             spent the signature elsewhere)"
                .into(),
        );
    }
    // Permit2 refuses the signature in any block whose time is past the
    // deadline: the run and the capture must both fit before it.
    let needed = readings.block.timestamp + run.as_secs() + u64::from(UPTO_SETTLE_SECONDS);
    if needed > terms.deadline {
        let left = terms.deadline.saturating_sub(readings.block.timestamp);
        return refused(
            AUTHORIZATION_EXPIRED,
            format!(
                "its payment authorization would expire before what it uses could be settled ({left} s left by \
                 the chain's clock; the run and its capture need {} s)",
                needed - readings.block.timestamp
            ),
        );
    }
    let permit_usable = terms.permit.as_ref().is_some_and(|permit| {
        readings.permit_nonce == Some(permit.nonce) && permit.amount >= terms.ceiling && permit.deadline >= needed
    });
    if readings.allowance < terms.ceiling && !permit_usable {
        return refused(
            PAYMENT_REVOKED,
            format!(
                "its payment authorization was withdrawn: the payer's token allowance to Permit2 ({}) no longer \
                 covers the ceiling it authorized ({}), and no permit it signed can restore it",
                readings.allowance, terms.ceiling
            ),
        );
    }
    if readings.balance < terms.ceiling {
        return refused(
            INSUFFICIENT_FUNDS,
            format!(
                "the payer's balance ({}) no longer covers the ceiling it authorized ({})",
                readings.balance, terms.ceiling
            ),
        );
    }
    RunCheck::Stands
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const TOKEN: &str = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
    const PAYER: &str = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";
    const NOW: u64 = 1_800_000_000;
    const RUN: Duration = Duration::from_secs(60);

    fn terms(permit: bool) -> Terms {
        let mut document = json!({"payload": {}});
        if permit {
            document["extensions"] = json!({"eip2612GasSponsoring": {"info": {
                "from": PAYER, "asset": TOKEN, "spender": PERMIT2, "amount": "1000",
                "nonce": "4", "deadline": (NOW + 600).to_string(), "signature": "0x00", "version": "1"
            }}});
        }
        Terms::of(TOKEN, &PAYER.to_ascii_lowercase(), "1000", "770", Some(&(NOW + 600).to_string()), &document).unwrap()
    }

    fn healthy() -> Readings {
        Readings {
            block: Block { number: 10, timestamp: NOW },
            balance: U256::from(1_000_000),
            allowance: U256::MAX,
            bitmap: U256::ZERO,
            permit_nonce: None,
        }
    }

    #[test]
    fn each_way_an_authorization_stops_standing_has_its_code() {
        // Nonce 770: word 3, bit 2.
        let word = terms(false).calls()[2].1.clone();
        assert_eq!(U256::from_be_slice(&word[36..68]), U256::from(3), "nonceBitmap(payer, 770 >> 8)");
        type Edit = fn(&mut Readings);
        let cases: [(&str, Edit, Option<&str>); 8] = [
            ("healthy", |_| {}, None),
            ("another nonce of the word used", |r| r.bitmap = U256::from(0b1011), None),
            ("the nonce invalidated", |r| r.bitmap = U256::from(0b100), Some(PAYMENT_REVOKED)),
            ("approval revoked", |r| r.allowance = U256::ZERO, Some(PAYMENT_REVOKED)),
            ("approval below the ceiling", |r| r.allowance = U256::from(999), Some(PAYMENT_REVOKED)),
            ("funds moved away", |r| r.balance = U256::from(999), Some(INSUFFICIENT_FUNDS)),
            ("the deadline too near", |r| r.block.timestamp = NOW + 600 - 89, Some(AUTHORIZATION_EXPIRED)),
            ("the deadline just far enough", |r| r.block.timestamp = NOW + 600 - 90, None),
        ];
        for (name, edit, want) in cases {
            let mut readings = healthy();
            edit(&mut readings);
            match (judge(&terms(false), &readings, RUN), want) {
                (RunCheck::Stands, None) => {}
                (RunCheck::Refused { code, message }, Some(want)) => {
                    assert_eq!(code, want, "{name}: {message}");
                    assert!(message.contains("nothing was charged"), "{name}: {message}");
                }
                (got, want) => panic!("{name}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_signed_permit_stands_in_for_the_approval_while_it_can_still_be_used() {
        let unapproved = Readings { allowance: U256::ZERO, permit_nonce: Some(U256::from(4)), ..healthy() };
        assert_eq!(judge(&terms(true), &unapproved, RUN), RunCheck::Stands);
        assert_eq!(terms(true).calls().len(), 4, "the token's nonces() is read too");
        // The payer used its permit nonce for something else.
        let spent = Readings { permit_nonce: Some(U256::from(5)), ..unapproved.clone() };
        assert!(matches!(judge(&terms(true), &spent, RUN), RunCheck::Refused { code: PAYMENT_REVOKED, .. }));
        // A permit for less than the ceiling cannot cover it.
        let mut small = terms(true);
        small.permit.as_mut().unwrap().amount = U256::from(999);
        assert!(matches!(judge(&small, &unapproved, RUN), RunCheck::Refused { code: PAYMENT_REVOKED, .. }));
        // A permit for another spender is not one.
        let mut document = json!({"extensions": {"eip2612GasSponsoring": {"info": {
            "from": PAYER, "asset": TOKEN, "spender": TOKEN, "amount": "1000", "nonce": "4", "deadline": "1"}}}});
        assert_eq!(Terms::of(TOKEN, PAYER, "1000", "1", Some("9"), &document).unwrap().permit, None);
        document["extensions"]["eip2612GasSponsoring"]["info"]["spender"] = json!(PERMIT2);
        assert!(Terms::of(TOKEN, PAYER, "1000", "1", Some("9"), &document).unwrap().permit.is_some());
    }

    #[test]
    fn unreadable_answers_decide_nothing() {
        let block = Block { number: 1, timestamp: NOW };
        let word = Some(alloy_primitives::Bytes::from(vec![0u8; 32]));
        assert!(Readings::of(block, &[word.clone(), word.clone(), word.clone()]).is_some());
        assert!(Readings::of(block, &[word.clone(), None, word.clone()]).is_none(), "a reverted read");
        assert!(Readings::of(block, &[word.clone(), word]).is_none(), "a missing read");
    }
}
