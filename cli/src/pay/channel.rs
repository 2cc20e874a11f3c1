//! Paying over a batch-settlement channel (`reeve task create --pay
//! --channel`), as `@x402/evm`'s batch-settlement client pays: the payer's
//! channel to the seller is x402's escrow keyed by the payer, the seller
//! (`payTo` and its receiver authorizer), the token and the withdraw delay;
//! its first payment deposits into it (an EIP-3009 `receiveWithAuthorization`
//! to x402's deposit collector, which the seller's facilitator sends), and
//! every payment carries a voucher: the payer's EIP-712 signature of the
//! channel's new cumulative total, which the seller checks without a
//! transaction.
//!
//! What the channel was charged and holds is kept in a file of its own
//! under the credentials directory (`reeve/channels/<network>/<id>.json`),
//! from each paid answer's `PAYMENT-RESPONSE`. Without one (a new channel,
//! another machine, a deleted file) the first voucher is for one price and
//! no deposit: the seller refuses it with the channel as it keeps it
//! (`extra.channelState` of the `402`'s offer), and the next is signed from
//! there, so a lost file never deposits twice or pays a task twice.

use std::path::{Path, PathBuf};

use alloy_primitives::aliases::U40;
use alloy_primitives::{Address, B256, U256, keccak256};
use alloy_signer::SignerSync;
use alloy_signer_local::PrivateKeySigner;
use alloy_sol_types::{Eip712Domain, SolStruct, SolValue, sol};
use reeve_shared::payments::batch::ChannelConfig;
use reeve_shared::payments::batch::voucher::{Voucher, domain};
use reeve_shared::payments::{Accepted, PaymentRequired, PaymentRequirements, PaymentResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{LOCAL_NETWORK, PayError, chain_id, random_bytes};

/// The scheme's name in a `402`.
pub const BATCH: &str = "batch-settlement";

/// `@x402/evm`'s `ERC3009_DEPOSIT_COLLECTOR_ADDRESS`: what a deposit's
/// EIP-3009 authorization pays, the same on every chain.
const DEPOSIT_COLLECTOR: Address = alloy_primitives::address!("0x4020806089470a89826cB9fB1f4059150b550004");

/// Deposits this many prices where the seller announces no minimum, as
/// `@x402/evm`'s client does by default.
const DEPOSIT_PRICES: u128 = 5;

sol! {
    /// EIP-3009's `receiveWithAuthorization` message, as USDC defines it.
    struct ReceiveWithAuthorization {
        address from;
        address to;
        uint256 value;
        uint256 validAfter;
        uint256 validBefore;
        bytes32 nonce;
    }
}

/// The `batch-settlement` offer of `challenge`: the local network's if
/// offered, else the first on an EVM network.
pub fn offer(challenge: &PaymentRequired) -> Option<&PaymentRequirements> {
    let offers: Vec<&PaymentRequirements> =
        challenge.accepts.iter().filter(|a| a.scheme == BATCH && a.network.starts_with("eip155:")).collect();
    offers.iter().find(|a| a.network == LOCAL_NETWORK).or_else(|| offers.first()).copied()
}

/// What the payer knows of its channel: what the seller charged on it so
/// far and what the escrow holds, as the seller last said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Known {
    #[serde(with = "decimal")]
    charged: u128,
    #[serde(with = "decimal")]
    balance: u128,
}

/// The file's contents: the channel, and what is known of it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    network: String,
    channel_id: String,
    receiver: String,
    token: String,
    #[serde(flatten)]
    known: Known,
}

/// The payer's channel to the seller of one offer.
pub struct Channel {
    config: ChannelConfig,
    chain_id: u64,
    id: B256,
    file: PathBuf,
    known: Option<Known>,
}

/// One payment on the channel: the `PAYMENT-SIGNATURE` value, and the
/// deposit it carries, if any.
pub struct Payment {
    pub header: String,
    pub deposit: Option<u128>,
}

impl Channel {
    /// The channel `signer` pays `offer`'s seller on, with what
    /// `credentials_dir/channels/` knows of it.
    pub fn open(
        credentials_dir: &Path,
        offer: &PaymentRequirements,
        signer: &PrivateKeySigner,
    ) -> Result<Channel, PayError> {
        let chain_id = chain_id(offer)?;
        let address = |text: Option<&str>, what: &'static str| -> Result<Address, PayError> {
            text.and_then(|t| t.parse().ok()).ok_or(PayError::BadRequirement(what))
        };
        let receiver_authorizer = address(offer.extra.receiver_authorizer.as_deref(), "extra.receiverAuthorizer")?;
        if receiver_authorizer.is_zero() {
            return Err(PayError::BadRequirement("extra.receiverAuthorizer"));
        }
        let delay = offer.extra.withdraw_delay.ok_or(PayError::BadRequirement("extra.withdrawDelay"))?;
        let config = ChannelConfig {
            payer: signer.address(),
            payerAuthorizer: signer.address(),
            receiver: address(Some(&offer.pay_to), "payTo")?,
            receiverAuthorizer: receiver_authorizer,
            token: address(Some(&offer.asset), "asset")?,
            withdrawDelay: U40::from(delay),
            // The official client's default: one channel per payer and seller.
            salt: B256::ZERO,
        };
        let id = config.id(chain_id);
        let file = credentials_dir.join("channels").join(offer.network.replace(':', "-")).join(format!("{id:#x}.json"));
        let known = match std::fs::read_to_string(&file) {
            Ok(text) => Some(
                serde_json::from_str::<Record>(&text)
                    .map_err(|e| PayError::Channel(format!("{} is not a channel record: {e}", file.display())))?
                    .known,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(PayError::Channel(format!("cannot read {}: {e}", file.display()))),
        };
        Ok(Channel { config, chain_id, id, file, known })
    }

    pub fn id(&self) -> String {
        format!("{:#x}", self.id)
    }

    /// The payment for one task of `offer`, signed by `signer` (the
    /// channel's payer and its authorizer), valid until `now` plus the
    /// offer's timeout: a voucher for what was charged plus the price, and
    /// a deposit first when the channel is known not to hold that: of
    /// `deposit` (`--deposit`), else the offer's minimum, and never less
    /// than the voucher needs.
    pub fn pay(
        &self,
        challenge: &PaymentRequired,
        offer: &PaymentRequirements,
        signer: &PrivateKeySigner,
        now: u64,
        deposit: Option<u128>,
    ) -> Result<Payment, PayError> {
        let price: u128 = offer.amount.parse().map_err(|_| PayError::BadRequirement("amount"))?;
        let known = self.known.unwrap_or(Known { charged: 0, balance: 0 });
        let ceiling = known.charged.checked_add(price).ok_or(PayError::BadRequirement("amount"))?;
        let voucher = self.voucher(ceiling, signer)?;
        // Unknown: a voucher alone, which the seller answers with the
        // channel as it keeps it, rather than a deposit the channel may not
        // need.
        let deposit = match self.known {
            Some(known) if known.balance < ceiling => {
                let least = deposit.unwrap_or_else(|| {
                    offer
                        .extra
                        .min_deposit
                        .as_deref()
                        .and_then(|m| m.parse::<u128>().ok())
                        .filter(|m| *m >= price)
                        .unwrap_or(price.saturating_mul(DEPOSIT_PRICES))
                });
                Some((ceiling - known.balance).max(least))
            }
            _ => None,
        };
        let mut payload = json!({
            "type": if deposit.is_some() { "deposit" } else { "voucher" },
            "channelConfig": self.config_json(),
            "voucher": voucher,
        });
        if let Some(amount) = deposit {
            payload["deposit"] = self.deposit(offer, amount, signer, now)?;
        }
        Ok(Payment { header: self.document(challenge, offer, payload), deposit })
    }

    /// The request for a cooperative refund (x402's `refund` payload, as
    /// `@x402/evm`'s `refundChannel` sends it): a voucher of what the seller
    /// charged the channel, signed by `signer`, and the `amount` to return
    /// (all that is not charged without one). Unknown, the voucher is for
    /// nothing charged: the seller answers with the channel as it keeps it.
    pub fn refund(
        &self,
        challenge: &PaymentRequired,
        offer: &PaymentRequirements,
        signer: &PrivateKeySigner,
        amount: Option<u128>,
    ) -> Result<String, PayError> {
        let charged = self.known.map_or(0, |k| k.charged);
        let mut payload = json!({
            "type": "refund",
            "channelConfig": self.config_json(),
            "voucher": self.voucher(charged, signer)?,
        });
        if let Some(amount) = amount {
            payload["amount"] = json!(amount.to_string());
        }
        Ok(self.document(challenge, offer, payload))
    }

    /// Records what a refund's `PAYMENT-RESPONSE` says the channel is now;
    /// what went back to the payer.
    pub fn refunded(&mut self, response: &PaymentResponse) -> Result<u128, PayError> {
        self.learn(response, "refundedAmount", "the refund's answer")
    }

    fn config_json(&self) -> Value {
        json!({
            "payer": self.config.payer.to_checksum(None),
            "payerAuthorizer": self.config.payerAuthorizer.to_checksum(None),
            "receiver": self.config.receiver.to_checksum(None),
            "receiverAuthorizer": self.config.receiverAuthorizer.to_checksum(None),
            "token": self.config.token.to_checksum(None),
            "withdrawDelay": self.config.withdrawDelay.to::<u64>(),
            "salt": format!("{:#x}", self.config.salt),
        })
    }

    /// The `PAYMENT-SIGNATURE` value carrying `payload` for `offer`.
    fn document(&self, challenge: &PaymentRequired, offer: &PaymentRequirements, payload: Value) -> String {
        let document = json!({
            "x402Version": 2,
            "accepted": Accepted::from(offer),
            "payload": payload,
            "resource": challenge.resource,
        });
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, document.to_string())
    }

    /// The voucher of `ceiling`: the most the seller may ever claim.
    fn voucher(&self, ceiling: u128, signer: &PrivateKeySigner) -> Result<Value, PayError> {
        let hash =
            Voucher { channelId: self.id, maxClaimableAmount: ceiling }.eip712_signing_hash(&domain(self.chain_id));
        let signature = signer.sign_hash_sync(&hash).map_err(|e| PayError::Sign(e.to_string()))?;
        Ok(json!({
            "channelId": self.id(),
            "maxClaimableAmount": ceiling.to_string(),
            "signature": format!("0x{}", hex::encode(signature.as_bytes())),
        }))
    }

    /// The deposit of `amount`: the token's EIP-3009 authorization to the
    /// deposit collector, its nonce bound to the channel and a fresh salt
    /// (`@x402/evm`'s `buildErc3009DepositNonce`), so it can fund only this
    /// channel.
    fn deposit(
        &self,
        offer: &PaymentRequirements,
        amount: u128,
        signer: &PrivateKeySigner,
        now: u64,
    ) -> Result<Value, PayError> {
        let salt_bytes = random_bytes()?;
        let salt = U256::from_be_bytes(salt_bytes);
        let valid_before = now + u64::from(offer.max_timeout_seconds);
        let message = ReceiveWithAuthorization {
            from: signer.address(),
            to: DEPOSIT_COLLECTOR,
            value: U256::from(amount),
            validAfter: U256::ZERO,
            validBefore: U256::from(valid_before),
            nonce: keccak256((self.id, salt).abi_encode()),
        };
        let token = Eip712Domain::new(
            Some(offer.extra.name.clone().into()),
            Some(offer.extra.version.clone().into()),
            Some(U256::from(self.chain_id)),
            Some(self.config.token),
            None,
        );
        let signature =
            signer.sign_hash_sync(&message.eip712_signing_hash(&token)).map_err(|e| PayError::Sign(e.to_string()))?;
        Ok(json!({
            "amount": amount.to_string(),
            "authorization": {
                "erc3009Authorization": {
                    "validAfter": "0",
                    "validBefore": valid_before.to_string(),
                    "salt": format!("0x{}", hex::encode(salt_bytes)),
                    "signature": format!("0x{}", hex::encode(signature.as_bytes())),
                },
            },
        }))
    }

    /// Learns the channel from a `402` refusing a payment on it (the
    /// seller's `channelState` on its offer): whether there was anything to
    /// learn, so that paying again can succeed. A channel whose payer asked
    /// to withdraw is an error: the seller takes no voucher on it.
    pub fn resynchronise(&mut self, refusal: &PaymentRequired) -> Result<bool, PayError> {
        let Some(state) = refusal
            .accepts
            .iter()
            .filter(|a| a.scheme == BATCH)
            .filter_map(|a| a.extra.channel_state.as_ref())
            .find(|s| s["channelId"].as_str().is_some_and(|id| id.eq_ignore_ascii_case(&self.id())))
        else {
            return Ok(false);
        };
        if state["withdrawRequestedAt"].as_u64().is_some_and(|at| at > 0) {
            return Err(PayError::Channel(format!(
                "the payer asked to withdraw from channel {}: the seller takes no voucher on it; withdraw the \
                 rest from the escrow once its delay has passed",
                self.id()
            )));
        }
        let learnt = known_of(state)?;
        let changed = self.known != Some(learnt);
        self.known = Some(learnt);
        self.save()?;
        Ok(changed)
    }

    /// Records what a paid answer's `PAYMENT-RESPONSE` says the channel is
    /// now; what it charged.
    pub fn paid(&mut self, response: &PaymentResponse) -> Result<u128, PayError> {
        self.learn(response, "chargedAmount", "the paid answer")
    }

    /// Keeps the channel state a `PAYMENT-RESPONSE` carries in `extra`;
    /// answers its `amount` field (what was charged, or refunded).
    fn learn(&mut self, response: &PaymentResponse, amount: &str, what: &str) -> Result<u128, PayError> {
        let extra =
            response.extra.as_ref().ok_or_else(|| PayError::Channel(format!("{what} carried no channel state")))?;
        let known = known_of(&extra["channelState"])?;
        let moved = decimal_at(extra, amount)?;
        self.known = Some(known);
        self.save()?;
        Ok(moved)
    }

    /// What the escrow holds and the seller has charged, as last known.
    pub fn known(&self) -> Option<(u128, u128)> {
        self.known.map(|k| (k.balance, k.charged))
    }

    fn save(&self) -> Result<(), PayError> {
        let Some(known) = self.known else { return Ok(()) };
        let record = Record {
            network: format!("eip155:{}", self.chain_id),
            channel_id: self.id(),
            receiver: self.config.receiver.to_checksum(None),
            token: self.config.token.to_checksum(None),
            known,
        };
        let io = |e: std::io::Error| PayError::Channel(format!("cannot write {}: {e}", self.file.display()));
        let dir = self.file.parent().expect("the file is under channels/");
        std::fs::create_dir_all(dir).map_err(io)?;
        // Written aside and renamed: a crash leaves the old record or the
        // new one, never half of one.
        let partial = self.file.with_extension("json.partial");
        let text = serde_json::to_string_pretty(&record).expect("plain values");
        std::fs::write(&partial, text + "\n").map_err(io)?;
        std::fs::rename(&partial, &self.file).map_err(io)
    }
}

fn known_of(state: &Value) -> Result<Known, PayError> {
    Ok(Known { charged: decimal_at(state, "chargedCumulativeAmount")?, balance: decimal_at(state, "balance")? })
}

fn decimal_at(value: &Value, key: &str) -> Result<u128, PayError> {
    value[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| PayError::Channel(format!("the seller's channel state has no decimal {key}")))
}

/// Amounts as decimal strings, as x402 writes them (a JSON number could
/// not hold every one).
mod decimal {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use alloy_primitives::Signature;
    use base64::Engine;

    use super::*;

    /// anvil's account 1: a well-known development key with no real value.
    const KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";

    fn challenge(min_deposit: &str) -> PaymentRequired {
        serde_json::from_value(json!({
            "x402Version": 2,
            "error": "PAYMENT-SIGNATURE header is required",
            "resource": {"url": "http://127.0.0.1:8080/v1/tasks/job", "description": "Job", "mimeType": "application/json"},
            "accepts": [
                {"scheme": "exact", "network": "eip155:84532", "amount": "1000",
                 "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                 "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 300,
                 "extra": {"name": "USDC", "version": "2"}},
                {"scheme": BATCH, "network": "eip155:84532", "amount": "1000",
                 "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                 "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 300,
                 "extra": {"name": "USDC", "version": "2", "receiverAuthorizer": "0x000000000000000000000000000000000000a11c",
                           "withdrawDelay": 900, "minDeposit": min_deposit}}
            ]
        }))
        .unwrap()
    }

    fn decode(header: &str) -> Value {
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap()
    }

    /// A channel whose record says it holds `balance` and was charged
    /// `charged`, in a directory of its own.
    fn channel(dir: &Path, offer: &PaymentRequirements, known: Option<(u128, u128)>) -> Channel {
        let mut channel = Channel::open(dir, offer, &KEY.parse().unwrap()).unwrap();
        channel.known = known.map(|(balance, charged)| Known { balance, charged });
        channel.save().unwrap();
        Channel::open(dir, offer, &KEY.parse().unwrap()).unwrap()
    }

    #[test]
    fn a_voucher_is_the_payers_signature_of_what_was_charged_plus_the_price() {
        let dir = std::env::temp_dir().join(format!("reeve-channel-unit-{}", std::process::id()));
        let required = challenge("10000");
        let offer = offer(&required).unwrap();
        assert_eq!(offer.scheme, BATCH, "the batch offer, not the exact one");
        let signer: PrivateKeySigner = KEY.parse().unwrap();
        let channel = channel(&dir, offer, Some((10_000, 3_000)));
        assert_eq!(channel.known(), Some((10_000, 3_000)), "read back from its record");
        let paid = decode(&channel.pay(&required, offer, &signer, 1_800_000_000, None).unwrap().header);
        assert_eq!(paid["payload"]["type"], "voucher", "the balance covers it: {paid}");
        assert_eq!(paid["payload"]["voucher"]["maxClaimableAmount"], "4000");
        assert_eq!(paid["accepted"]["scheme"], BATCH);
        let hash = Voucher { channelId: channel.id, maxClaimableAmount: 4_000 }.eip712_signing_hash(&domain(84532));
        let signature = hex::decode(&paid["payload"]["voucher"]["signature"].as_str().unwrap()[2..]).unwrap();
        let by = Signature::try_from(signature.as_slice()).unwrap().recover_address_from_prehash(&hash).unwrap();
        assert_eq!(by, signer.address());
        assert_eq!(paid["payload"]["channelConfig"]["payer"], signer.address().to_checksum(None));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_deposit_is_the_offers_minimum_or_what_the_payer_asks_and_never_less_than_the_task_needs() {
        let dir = std::env::temp_dir().join(format!("reeve-channel-deposit-{}", std::process::id()));
        let required = challenge("10000");
        let offer = offer(&required).unwrap();
        let signer: PrivateKeySigner = KEY.parse().unwrap();
        let deposit = |known: Option<(u128, u128)>, asked: Option<u128>| {
            let payment = channel(&dir, offer, known).pay(&required, offer, &signer, 1_800_000_000, asked).unwrap();
            let sent = decode(&payment.header)["payload"]["deposit"]["amount"].as_str().map(str::to_owned);
            assert_eq!(sent, payment.deposit.map(|d| d.to_string()));
            payment.deposit
        };
        assert_eq!(deposit(None, None), None, "unknown: a voucher alone, to learn the channel");
        assert_eq!(deposit(Some((0, 0)), None), Some(10_000), "the offer's minimum");
        assert_eq!(deposit(Some((0, 0)), Some(100_000)), Some(100_000), "--deposit");
        assert_eq!(deposit(Some((500, 0)), Some(10)), Some(500), "what the voucher needs beyond the balance");
        assert_eq!(deposit(Some((10_000, 9_500)), None), Some(10_000), "an empty channel is topped up");
        let _ = std::fs::remove_dir_all(dir);
    }
}
