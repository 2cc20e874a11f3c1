//! Paying a priced task from the command line: given a `402` challenge and a
//! wallet key, the `PAYMENT-SIGNATURE` header value (an x402 v2 `exact`
//! payment: an EIP-3009 `transferWithAuthorization` signed as EIP-712 typed
//! data with alloy's local signer).
//!
//! The key comes from `REEVE_WALLET_KEY` (read by clap, as [`WalletKey`],
//! which refuses the same value as an argument) or a file
//! (`--wallet-key-file`), never from an argument: arguments show up in `ps`
//! and shell history.
//!
//! `reeve task create … --pay` takes the `402`'s challenge, calls
//! [`wallet_key`] and [`payment_header`], and sends the same request again
//! with the result as `PAYMENT-SIGNATURE`. Without `--pay` the requirements
//! are shown by `payment_required` and the command exits 3.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::path::Path;

use alloy_primitives::{Address, B256, U256};
use alloy_signer::SignerSync;
use alloy_signer_local::PrivateKeySigner;
use alloy_sol_types::{Eip712Domain, SolStruct, sol};
use clap::builder::TypedValueParser;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use reeve_shared::payments::{
    Accepted, Authorization, ExactPayload, PaymentPayload, PaymentRequired, PaymentRequirements,
};
use reeve_shared::settings::WALLET_KEY;

/// The network preferred when a challenge offers several: the local chain
/// (and Base Sepolia, whose chain id it borrows), so a development payment
/// never spends a mainnet asset by accident.
pub const LOCAL_NETWORK: &str = "eip155:84532";

sol! {
    /// EIP-3009's signed message, as USDC defines it.
    struct TransferWithAuthorization {
        address from;
        address to;
        uint256 value;
        uint256 validAfter;
        uint256 validBefore;
        bytes32 nonce;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error("no wallet key: set {WALLET_KEY} or pass --wallet-key-file")]
    NoKey,
    #[error("cannot read the wallet key file {path}: {source}")]
    KeyFile { path: String, source: std::io::Error },
    #[error("the wallet key is not a 32-byte hex private key")]
    BadKey,
    #[error("the challenge offers no `exact` payment on an EVM network")]
    NothingPayable,
    #[error("the chosen requirement is malformed: {0}")]
    BadRequirement(&'static str),
    #[error("signing failed: {0}")]
    Sign(String),
    #[error("no randomness for the nonce: {0}")]
    Rng(String),
}

/// The key in `REEVE_WALLET_KEY`, as clap read it. Its `Debug` never shows
/// the key, so no derived `Debug` of the arguments can print it.
#[derive(Clone)]
pub struct WalletKey(String);

impl std::fmt::Debug for WalletKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WalletKey(..)")
    }
}

/// Clap's parser for the key's argument: it takes the value from
/// `REEVE_WALLET_KEY` and refuses one typed on the command line, without
/// repeating it. Clap has no argument read only from the environment, and
/// this keeps the key out of `ps` and shell history.
#[derive(Clone)]
pub struct WalletKeyParser;

impl TypedValueParser for WalletKeyParser {
    type Value = WalletKey;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<WalletKey, clap::Error> {
        // Only reached if clap ever stops saying where a value came from:
        // refuse rather than take the key from an argument.
        self.parse_ref_(cmd, arg, value, ValueSource::CommandLine)
    }

    fn parse_ref_(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &OsStr,
        source: ValueSource,
    ) -> Result<WalletKey, clap::Error> {
        if source != ValueSource::EnvVariable {
            return Err(cmd.clone().error(
                ErrorKind::ArgumentConflict,
                format!("the wallet key is never an argument: set {WALLET_KEY} or pass --wallet-key-file"),
            ));
        }
        // Not shown, so not `{value:?}` either: the key is secret.
        let key = value
            .to_str()
            .ok_or_else(|| cmd.clone().error(ErrorKind::InvalidUtf8, format!("{WALLET_KEY} is not valid UTF-8")))?;
        Ok(WalletKey(key.to_owned()))
    }
}

/// The payer's key: the file's contents when `file` is given, else
/// `REEVE_WALLET_KEY`'s.
pub fn wallet_key(file: Option<&Path>, env: Option<&WalletKey>) -> Result<String, PayError> {
    let key = match file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|source| PayError::KeyFile { path: path.display().to_string(), source })?,
        None => env.ok_or(PayError::NoKey)?.0.clone(),
    };
    let key = key.trim().to_owned();
    if key.is_empty() {
        return Err(PayError::NoKey);
    }
    Ok(key)
}

/// The requirement to pay: the local network's if offered, else the first
/// `exact` one on an EVM (`eip155:`) network.
pub fn choose(challenge: &PaymentRequired) -> Result<&PaymentRequirements, PayError> {
    let payable: Vec<&PaymentRequirements> =
        challenge.accepts.iter().filter(|a| a.scheme == "exact" && a.network.starts_with("eip155:")).collect();
    payable
        .iter()
        .find(|a| a.network == LOCAL_NETWORK)
        .or_else(|| payable.first())
        .copied()
        .ok_or(PayError::NothingPayable)
}

/// The `PAYMENT-SIGNATURE` value paying `challenge` with `key`, valid from
/// ten minutes before `now` (clock skew) until `now` plus the requirement's
/// `maxTimeoutSeconds`.
pub fn payment_header(challenge: &PaymentRequired, key: &str, now: u64) -> Result<String, PayError> {
    let signer: PrivateKeySigner = key.parse().map_err(|_| PayError::BadKey)?;
    let req = choose(challenge)?;
    let chain_id: u64 = req
        .network
        .strip_prefix("eip155:")
        .and_then(|id| id.parse().ok())
        .ok_or(PayError::BadRequirement("network"))?;
    let asset: Address = req.asset.parse().map_err(|_| PayError::BadRequirement("asset"))?;
    let pay_to: Address = req.pay_to.parse().map_err(|_| PayError::BadRequirement("payTo"))?;
    let value: U256 = req.amount.parse().map_err(|_| PayError::BadRequirement("amount"))?;

    let mut nonce = [0u8; 32];
    getrandom::fill(&mut nonce).map_err(|e| PayError::Rng(e.to_string()))?;
    let valid_after = now.saturating_sub(600);
    let valid_before = now + u64::from(req.max_timeout_seconds);
    let message = TransferWithAuthorization {
        from: signer.address(),
        to: pay_to,
        value,
        validAfter: U256::from(valid_after),
        validBefore: U256::from(valid_before),
        nonce: B256::from(nonce),
    };
    let domain = Eip712Domain::new(
        Some(Cow::Owned(req.extra.name.clone())),
        Some(Cow::Owned(req.extra.version.clone())),
        Some(U256::from(chain_id)),
        Some(asset),
        None,
    );
    let hash = message.eip712_signing_hash(&domain);
    let signature = signer.sign_hash_sync(&hash).map_err(|e| PayError::Sign(e.to_string()))?;

    let payment = PaymentPayload {
        x402_version: 2,
        accepted: Accepted::from(req),
        payload: ExactPayload {
            signature: format!("0x{}", hex::encode(signature.as_bytes())),
            authorization: Authorization {
                from: signer.address().to_checksum(None),
                to: pay_to.to_checksum(None),
                value: value.to_string(),
                valid_after: valid_after.to_string(),
                valid_before: valid_before.to_string(),
                nonce: format!("0x{}", hex::encode(nonce)),
            },
        },
        resource: Some(serde_json::to_value(&challenge.resource).expect("strings serialise")),
        extensions: None,
    };
    Ok(payment.header_value())
}

#[cfg(test)]
mod tests {
    use alloy_primitives::Signature;
    use base64::Engine;
    use serde_json::{Value, json};

    use super::*;

    /// anvil's account 1: a well-known development key with no real value.
    const KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
    const ADDRESS: &str = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";

    fn challenge() -> PaymentRequired {
        serde_json::from_value(challenge_json()).unwrap()
    }

    fn challenge_json() -> Value {
        json!({
            "x402Version": 2,
            "error": "PAYMENT-SIGNATURE header is required",
            "resource": {"url": "http://127.0.0.1:8080/v1/tasks/fetch", "description": "Fetch", "mimeType": "application/json"},
            "accepts": [
                {"scheme": "exact", "network": "eip155:8453", "amount": "10000",
                 "asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
                 "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 300,
                 "extra": {"name": "USD Coin", "version": "2"}},
                {"scheme": "exact", "network": "eip155:84532", "amount": "10000",
                 "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                 "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 300,
                 "extra": {"name": "USDC", "version": "2"}}
            ]
        })
    }

    #[test]
    fn the_payment_pays_the_local_requirement_and_is_signed_by_the_key() {
        let header = payment_header(&challenge(), KEY, 1_800_000_000).unwrap();
        let p: Value =
            serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(&header).unwrap()).unwrap();
        assert_eq!(p["x402Version"], 2);
        assert_eq!(p["accepted"], challenge_json()["accepts"][1], "the local requirement, verbatim");
        assert_eq!(p["resource"], challenge_json()["resource"]);
        let a = &p["payload"]["authorization"];
        assert_eq!(a["from"], ADDRESS);
        assert_eq!(a["to"], "0x209693Bc6afc0C5328bA36FaF03C514EF312287C");
        assert_eq!(a["value"], "10000");
        assert_eq!((a["validAfter"].as_str(), a["validBefore"].as_str()), (Some("1799999400"), Some("1800000300")));

        // The signature recovers to the key's address over the EIP-712 hash
        // of exactly these fields, in the token's domain on chain 84532.
        let message = TransferWithAuthorization {
            from: ADDRESS.parse().unwrap(),
            to: a["to"].as_str().unwrap().parse().unwrap(),
            value: U256::from(10_000u64),
            validAfter: U256::from(1_799_999_400u64),
            validBefore: U256::from(1_800_000_300u64),
            nonce: a["nonce"].as_str().unwrap().parse().unwrap(),
        };
        let domain = Eip712Domain::new(
            Some("USDC".into()),
            Some("2".into()),
            Some(U256::from(84532u64)),
            Some("0x036CbD53842c5426634e7929541eC2318f3dCF7e".parse().unwrap()),
            None,
        );
        let sig_hex = p["payload"]["signature"].as_str().unwrap();
        let signature = Signature::try_from(hex::decode(&sig_hex[2..]).unwrap().as_slice()).unwrap();
        let recovered = signature.recover_address_from_prehash(&message.eip712_signing_hash(&domain)).unwrap();
        assert_eq!(recovered.to_checksum(None), ADDRESS);

        // A fresh nonce every time.
        let again = payment_header(&challenge(), KEY, 1_800_000_000).unwrap();
        assert_ne!(header, again);
    }

    /// The official x402 facilitator of the local stack (scripts/payments.sh)
    /// accepts what this module signs.
    #[tokio::test]
    async fn the_local_facilitator_verifies_the_payment() {
        let url = reeve_shared::settings::Config::from_env()
            .get(reeve_shared::settings::FACILITATOR_URL)
            .unwrap_or_else(|| "http://127.0.0.1:4021".into());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let header = payment_header(&challenge(), KEY, now).unwrap();
        let payment: Value =
            serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(&header).unwrap()).unwrap();
        let body =
            json!({"x402Version": 2, "paymentPayload": payment, "paymentRequirements": challenge_json()["accepts"][1]});
        let answer = reqwest::Client::new()
            .post(format!("{url}/verify"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("the local facilitator is down ({e}): run scripts/payments.sh up"));
        let verdict: Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
        assert_eq!(verdict["isValid"], true, "{verdict}");
        assert_eq!(verdict["payer"], ADDRESS);
    }

    #[test]
    fn without_the_local_network_the_first_evm_requirement_is_paid() {
        let mut c = challenge();
        c.accepts.pop();
        assert_eq!(choose(&c).unwrap().network, "eip155:8453");
        c.accepts[0].scheme = "upto".into();
        assert!(matches!(choose(&c), Err(PayError::NothingPayable)));
    }

    #[test]
    fn the_key_comes_from_the_environment_or_a_file_only() {
        let env = |key: &str| WalletKey(key.to_owned());
        assert!(matches!(wallet_key(None, None), Err(PayError::NoKey)));
        assert!(matches!(wallet_key(None, Some(&env(" \n"))), Err(PayError::NoKey)));
        assert_eq!(wallet_key(None, Some(&env(&format!(" {KEY}\n")))).unwrap(), KEY);
        let dir = std::env::temp_dir().join(format!("reeve-pay-{}", std::process::id()));
        std::fs::write(&dir, format!("{KEY}\n")).unwrap();
        assert_eq!(wallet_key(Some(&dir), Some(&env("ignored"))).unwrap(), KEY);
        std::fs::remove_file(&dir).unwrap();
        assert!(matches!(wallet_key(Some(Path::new("/nonexistent/key")), None), Err(PayError::KeyFile { .. })));
        assert_eq!(format!("{:?}", env(KEY)), "WalletKey(..)", "Debug never shows the key");
        assert!(matches!(payment_header(&challenge(), "0x1234", 0), Err(PayError::BadKey)));
    }
}
