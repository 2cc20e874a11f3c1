//! What a `batch-settlement` payment carries (its `payload`), read into
//! typed values before anything is decided: a voucher on a channel, and for
//! a channel's first payment (or one its balance no longer covers) the
//! deposit that funds it, as `@x402/evm`'s batch-settlement client sends
//! them; and a payer's request for a cooperative refund (`type: "refund"`:
//! a voucher of what the channel was charged, and optionally how much to
//! return), as its `refundChannel` sends it. Any other shape is refused as
//! malformed: nothing here is guessed.

use alloy_primitives::aliases::U40;
use alloy_primitives::{Address, B256, Bytes};
use serde_json::Value;

use super::channel::VoucherIn;
use super::voucher::ChannelConfig;

/// A batch-settlement payment's `payload`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPayload {
    pub config: ChannelConfig,
    pub channel_id: B256,
    /// The voucher's `maxClaimableAmount`: the channel's cumulative
    /// ceiling with this payment.
    pub ceiling: u128,
    pub signature: Bytes,
    /// `Some` for a `deposit` payload: what the payer puts in escrow first,
    /// settled through the facilitator before the voucher is decided.
    pub deposit: Option<Deposit>,
    /// `Some` for a `refund` payload: the payer asks for the channel's
    /// unclaimed balance back (its voucher's ceiling is what the channel was
    /// charged, nothing more).
    pub refund: Option<RefundAsk>,
}

/// A payer's request for a cooperative refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefundAsk {
    /// How much to return; `None`: all that is unclaimed.
    pub amount: Option<u128>,
}

/// A deposit into the channel: its amount, and the payer's authorization
/// of it (passed to the facilitator as signed; its `/settle` checks it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deposit {
    pub amount: u128,
    pub authorization: Value,
}

impl Deposit {
    /// When the payer's authorization stops being usable (unix seconds): an
    /// ERC-3009 authorization's `validBefore`, a Permit2 one's `deadline`;
    /// `None` when it names neither.
    pub fn valid_before(&self) -> Option<u64> {
        let seconds = |v: &Value| v.as_u64().or_else(|| v.as_str()?.parse().ok());
        let auth = &self.authorization;
        seconds(&auth["erc3009Authorization"]["validBefore"])
            .or_else(|| seconds(&auth["permit2Authorization"]["deadline"]))
    }
}

impl BatchPayload {
    /// Reads `payload`, or says what is wrong with it (for a `400`).
    pub fn parse(payload: &Value) -> Result<BatchPayload, String> {
        let kind = text(payload, "type")?;
        let (deposit, refund) = match kind {
            "voucher" => (None, None),
            "deposit" => {
                let deposit = field(payload, "deposit")?;
                let amount = amount(deposit, "amount", "deposit.amount")?;
                if amount == 0 {
                    return Err("deposit.amount must be more than 0".into());
                }
                (Some(Deposit { amount, authorization: field(deposit, "authorization")?.clone() }), None)
            }
            "refund" => {
                let asked = match payload.get("amount") {
                    None => None,
                    Some(_) => Some(amount(payload, "amount", "amount")?).filter(|a| *a > 0),
                };
                if payload.get("amount").is_some() && asked.is_none() {
                    return Err("amount must be more than 0".into());
                }
                (None, Some(RefundAsk { amount: asked }))
            }
            other => return Err(format!("payload.type {other:?} is not a voucher, a deposit or a refund")),
        };
        let config = field(payload, "channelConfig")?;
        let address = |key: &str| -> Result<Address, String> {
            text(config, key)?.parse().map_err(|_| format!("channelConfig.{key} is not an address"))
        };
        let delay = field(config, "withdrawDelay")?
            .as_u64()
            .filter(|delay| *delay < 1 << 40)
            .ok_or("channelConfig.withdrawDelay is not a uint40")?;
        let config = ChannelConfig {
            payer: address("payer")?,
            payerAuthorizer: address("payerAuthorizer")?,
            receiver: address("receiver")?,
            receiverAuthorizer: address("receiverAuthorizer")?,
            token: address("token")?,
            withdrawDelay: U40::from(delay),
            salt: text(config, "salt")?.parse().map_err(|_| "channelConfig.salt is not 32 bytes of hex")?,
        };
        let voucher = field(payload, "voucher")?;
        Ok(BatchPayload {
            config,
            channel_id: text(voucher, "channelId")?.parse().map_err(|_| "voucher.channelId is not 32 bytes of hex")?,
            ceiling: amount(voucher, "maxClaimableAmount", "voucher.maxClaimableAmount")?,
            signature: text(voucher, "signature")?.parse().map_err(|_| "voucher.signature is not hex")?,
            deposit,
            refund,
        })
    }

    /// The voucher, as [`super::decide`] takes it.
    pub fn voucher(&self) -> VoucherIn<'_> {
        VoucherIn {
            config: &self.config,
            channel_id: self.channel_id,
            ceiling: self.ceiling,
            signature: &self.signature,
        }
    }
}

fn field<'a>(value: &'a Value, key: &str) -> Result<&'a Value, String> {
    value.get(key).ok_or_else(|| format!("{key} is missing"))
}

fn text<'a>(value: &'a Value, key: &str) -> Result<&'a str, String> {
    field(value, key)?.as_str().ok_or_else(|| format!("{key} is not a string"))
}

/// A uint128 written as a decimal string (it may not fit a JSON number).
fn amount(value: &Value, key: &str, shown: &str) -> Result<u128, String> {
    let written = text(value, key)?;
    if written.is_empty() || !written.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{shown} is not a decimal amount"));
    }
    written.parse().map_err(|_| format!("{shown} does not fit a uint128"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::payments::batch::check_signature;

    /// A deposit payload made by `@x402/evm`'s batch-settlement client
    /// (scripts/payments/batch-pay.mjs, anvil's account 1) for an offer of
    /// 1,000 a task, `minDeposit` 10,000, withdraw delay 3,600 s.
    fn official() -> Value {
        json!({
            "type": "deposit",
            "channelConfig": {
                "payer": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
                "payerAuthorizer": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
                "receiver": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
                "receiverAuthorizer": "0x4444444444444444444444444444444444444444",
                "token": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                "withdrawDelay": 3600,
                "salt": "0x0000000000000000000000000000000000000000000000000000000000000000"
            },
            "voucher": {
                "channelId": "0x89e93206f45719853254dfac00e7e64433051107d8dd164742dc5ea75bff2fdd",
                "maxClaimableAmount": "1000",
                "signature": "0xa8c296c990c1a0fd6ded07352557562cb6977772c760eb0e92ebc854af578fe429ec0cbee3d2e866587c7b5443a4fe7a163bad16e4833436b2ca47c73ea1d4fe1b"
            },
            "deposit": {
                "amount": "10000",
                "authorization": { "erc3009Authorization": {
                    "validAfter": "0",
                    "validBefore": "1796577346",
                    "salt": "0x20e585db0eebc3f8a3aa7dbefa098f687d42381424375d7bcfdd0d58278a3b4b",
                    "signature": "0xbd1978f2f49853a09b497992d1f5391d2625bfb744ee24532d4879b110d097b35b5722dbc5e53cb1b07684a7063f4d3c29d633cf40dc2e2dd6ebd576b679fe481b"
                } }
            }
        })
    }

    #[test]
    fn the_official_clients_deposit_is_read_into_a_voucher_its_payer_signed() {
        let read = BatchPayload::parse(&official()).unwrap();
        assert_eq!(read.config.id(84532), read.channel_id);
        assert_eq!(read.ceiling, 1000);
        assert_eq!(read.config.withdrawDelay, U40::from(3600));
        assert_eq!(read.deposit.as_ref().map(|d| d.amount), Some(10_000));
        assert_eq!(read.deposit.as_ref().and_then(Deposit::valid_before), Some(1_796_577_346));
        assert_eq!(check_signature(&read.config, 84532, read.ceiling, &read.signature), Ok(()));
        // The same voucher without the deposit: a voucher payload.
        let mut voucher = official();
        voucher["type"] = json!("voucher");
        voucher.as_object_mut().unwrap().remove("deposit");
        let read = BatchPayload::parse(&voucher).unwrap();
        assert_eq!((read.deposit, read.ceiling), (None, 1000));
        // A refund request as `refundChannel` sends it: all, or an amount.
        voucher["type"] = json!("refund");
        let read = BatchPayload::parse(&voucher).unwrap();
        assert_eq!((read.deposit, read.refund, read.ceiling), (None, Some(RefundAsk { amount: None }), 1000));
        voucher["amount"] = json!("250");
        assert_eq!(BatchPayload::parse(&voucher).unwrap().refund, Some(RefundAsk { amount: Some(250) }));
        voucher["amount"] = json!("0");
        assert_eq!(BatchPayload::parse(&voucher).unwrap_err(), "amount must be more than 0");
    }

    #[test]
    fn a_payload_of_another_shape_is_refused_naming_what_is_wrong() {
        let broken = |path: &[&str], value: Value| {
            let mut payload = official();
            let (last, parents) = path.split_last().unwrap();
            let parent = parents.iter().fold(&mut payload, |v, key| &mut v[*key]);
            parent[*last] = value;
            BatchPayload::parse(&payload).unwrap_err()
        };
        assert_eq!(broken(&["type"], json!("claim")), "payload.type \"claim\" is not a voucher, a deposit or a refund");
        assert_eq!(
            broken(&["voucher", "maxClaimableAmount"], json!("-1")),
            "voucher.maxClaimableAmount is not a decimal amount"
        );
        assert_eq!(broken(&["voucher", "maxClaimableAmount"], json!(1000)), "maxClaimableAmount is not a string");
        assert_eq!(
            broken(&["voucher", "maxClaimableAmount"], json!("340282366920938463463374607431768211456")),
            "voucher.maxClaimableAmount does not fit a uint128"
        );
        assert_eq!(broken(&["deposit", "amount"], json!("0")), "deposit.amount must be more than 0");
        assert_eq!(
            broken(&["channelConfig", "withdrawDelay"], json!(1u64 << 40)),
            "channelConfig.withdrawDelay is not a uint40"
        );
        assert_eq!(broken(&["channelConfig", "payer"], json!("0x12")), "channelConfig.payer is not an address");
        assert_eq!(broken(&["voucher", "channelId"], json!("0x12")), "voucher.channelId is not 32 bytes of hex");
        let mut bare = official();
        bare.as_object_mut().unwrap().remove("voucher");
        assert_eq!(BatchPayload::parse(&bare).unwrap_err(), "voucher is missing");
    }
}
