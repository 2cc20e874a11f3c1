//! Paying a priced task from the command line: given a `402` challenge and a
//! wallet key, the `PAYMENT-SIGNATURE` header value, signed as EIP-712
//! typed data with alloy's local signer. Three x402 v2 schemes:
//! - `exact`: an EIP-3009 `transferWithAuthorization` of the price;
//! - `upto` (a metered price, [`upto`]): a Permit2 authorization of a
//!   ceiling, of which the seller settles what the task used, with the
//!   token's EIP-2612 permit when the 402 offers gas sponsoring and the
//!   payer never approved Permit2;
//! - `batch-settlement` (with `--channel`, [`channel`]): a deposit into the
//!   payer's escrow channel once, then a signed cumulative voucher per task.
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

pub mod channel;
mod upto;

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
    Accepted, Authorization, ExactPayload, PaymentPayload, PaymentRequired, PaymentRequirements, SchemePayload,
    UptoPayload,
};
use reeve_shared::settings::{CHAIN_RPC_URLS, WALLET_KEY};

/// The network preferred when a challenge offers several: the local chain
/// (and Base Sepolia, whose chain id it borrows), so a development payment
/// never spends a mainnet asset by accident.
pub const LOCAL_NETWORK: &str = "eip155:84532";

/// The schemes this client signs.
const EXACT: &str = "exact";
const UPTO: &str = "upto";

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
    #[error("the challenge offers no `exact` or `upto` payment on an EVM (eip155) network")]
    NothingPayable,
    #[error(
        "the `upto` requirement names no facilitator (extra.facilitatorAddress), so no payment signed for it \
         could be settled: the server's facilitator must settle `upto` on this network"
    )]
    NoFacilitator,
    #[error("reading the payer's token from the chain: {0}")]
    Chain(String),
    #[error("the chosen requirement is malformed: {0}")]
    BadRequirement(&'static str),
    #[error("signing failed: {0}")]
    Sign(String),
    #[error("no randomness for the nonce: {0}")]
    Rng(String),
    /// The batch-settlement channel's record or the seller's account of it.
    #[error("{0}")]
    Channel(String),
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
/// `exact` or `upto` one on an EVM (`eip155:`) network.
pub fn choose(challenge: &PaymentRequired) -> Result<&PaymentRequirements, PayError> {
    let payable: Vec<&PaymentRequirements> = challenge
        .accepts
        .iter()
        .filter(|a| (a.scheme == EXACT || a.scheme == UPTO) && a.network.starts_with("eip155:"))
        .collect();
    payable
        .iter()
        .find(|a| a.network == LOCAL_NETWORK)
        .or_else(|| payable.first())
        .copied()
        .ok_or(PayError::NothingPayable)
}

/// A signed payment: the `PAYMENT-SIGNATURE` value, and what the payer
/// should know before sending it.
#[derive(Debug)]
pub struct Signed {
    pub header: String,
    pub note: Option<String>,
}

/// The `PAYMENT-SIGNATURE` value paying `challenge` with `key`, valid until
/// `now` plus the requirement's `maxTimeoutSeconds` (an `exact` one from
/// ten minutes before `now`, for clock skew).
///
/// For `upto`, `chain_rpc` (`--chain-rpc`: a URL, or `network=url` pairs)
/// is where the payer's Permit2 allowance and permit nonce are read, to sign
/// the token's permit when the 402 offers gas sponsoring and the allowance
/// is below the ceiling. Without an endpoint for the network, Permit2 alone
/// is signed, and the note says what a payer that never approved it must do.
pub async fn payment_header(
    challenge: &PaymentRequired,
    key: &str,
    now: u64,
    chain_rpc: Option<&str>,
) -> Result<Signed, PayError> {
    let signer: PrivateKeySigner = key.parse().map_err(|_| PayError::BadKey)?;
    let req = choose(challenge)?;
    if req.scheme == EXACT {
        let payload = exact(req, &signer, now)?;
        return Ok(Signed { header: payment(challenge, req, payload, None).header_value(), note: None });
    }
    // A requirement nothing could be paid with is refused before the chain
    // is read.
    let upto::Terms { token, ceiling, .. } = upto::Terms::of(req)?;
    let endpoint = chain_rpc.and_then(|value| upto::endpoint_for(value, &req.network));
    let standing = match &endpoint {
        Some(url) => Some(upto::standing(url, token, signer.address()).await?),
        None => None,
    };
    let sponsored = challenge.extensions.contains_key(upto::EIP2612_GAS_SPONSORING);
    let approve =
        format!("approve({}, max) on the token {} once", upto::PERMIT2.to_checksum(None), token.to_checksum(None));
    let note = match standing {
        None => Some(format!(
            "signed a Permit2 authorization only: with no JSON-RPC endpoint for {network} (--chain-rpc or \
             {CHAIN_RPC_URLS}) reeve cannot read the payer's Permit2 allowance{sponsoring}. A payer that has not \
             approved Permit2 must send {approve}",
            network = req.network,
            sponsoring = if sponsored { " to sign the token's permit the server offers" } else { "" },
        )),
        Some(s) if s.permit2_allowance < ceiling && sponsored => Some(
            "the payer has not approved Permit2 for this ceiling: signed the token's EIP-2612 permit too, \
             which the facilitator applies when it settles (no gas for the payer)"
                .to_owned(),
        ),
        Some(s) if s.permit2_allowance < ceiling => Some(format!(
            "the payer's Permit2 allowance is below the ceiling and the server offers no gas sponsoring: this \
             payment will be refused until the payer sends {approve}"
        )),
        Some(_) => None,
    };
    let signed = upto::sign(challenge, req, &signer, now, standing, random_u256()?)?;
    let payload =
        SchemePayload::Upto(UptoPayload { signature: signed.signature, permit2_authorization: signed.authorization });
    Ok(Signed { header: payment(challenge, req, payload, signed.extensions).header_value(), note })
}

/// The payment document: `payload`, paying `req` of `challenge`.
fn payment(
    challenge: &PaymentRequired,
    req: &PaymentRequirements,
    payload: SchemePayload,
    extensions: Option<serde_json::Map<String, serde_json::Value>>,
) -> PaymentPayload {
    PaymentPayload {
        x402_version: 2,
        accepted: Accepted::from(req),
        payload,
        resource: Some(serde_json::to_value(&challenge.resource).expect("strings serialise")),
        extensions,
    }
}

/// The chain id of `req`'s CAIP-2 network (`eip155:<id>`).
fn chain_id(req: &PaymentRequirements) -> Result<u64, PayError> {
    req.network.strip_prefix("eip155:").and_then(|id| id.parse().ok()).ok_or(PayError::BadRequirement("network"))
}

fn random_bytes() -> Result<[u8; 32], PayError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| PayError::Rng(e.to_string()))?;
    Ok(bytes)
}

/// Permit2's nonces are unordered 256-bit values: a random one is unused.
fn random_u256() -> Result<U256, PayError> {
    Ok(U256::from_be_bytes(random_bytes()?))
}

/// The `exact` payload: an EIP-3009 authorization of `req`'s amount.
fn exact(req: &PaymentRequirements, signer: &PrivateKeySigner, now: u64) -> Result<SchemePayload, PayError> {
    let chain_id = chain_id(req)?;
    let asset: Address = req.asset.parse().map_err(|_| PayError::BadRequirement("asset"))?;
    let pay_to: Address = req.pay_to.parse().map_err(|_| PayError::BadRequirement("payTo"))?;
    let value: U256 = req.amount.parse().map_err(|_| PayError::BadRequirement("amount"))?;

    let nonce = random_bytes()?;
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
    Ok(SchemePayload::Exact(ExactPayload {
        signature: format!("0x{}", hex::encode(signature.as_bytes())),
        authorization: Authorization {
            from: signer.address().to_checksum(None),
            to: pay_to.to_checksum(None),
            value: value.to_string(),
            valid_after: valid_after.to_string(),
            valid_before: valid_before.to_string(),
            nonce: format!("0x{}", hex::encode(nonce)),
        },
    }))
}

#[cfg(test)]
mod on_chain_tests;

#[cfg(test)]
mod tests {
    use alloy_primitives::Signature;
    use base64::Engine;
    use serde_json::{Value, json};

    use super::*;

    /// anvil's account 1: a well-known development key with no real value.
    const KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
    const ADDRESS: &str = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";
    const TOKEN: &str = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
    const PAY_TO: &str = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C";
    const FACILITATOR: &str = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC";

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
                 "payTo": PAY_TO, "maxTimeoutSeconds": 300,
                 "extra": {"name": "USD Coin", "version": "2"}},
                {"scheme": "exact", "network": "eip155:84532", "amount": "10000",
                 "asset": TOKEN, "payTo": PAY_TO, "maxTimeoutSeconds": 300,
                 "extra": {"name": "USDC", "version": "2"}}
            ]
        })
    }

    /// A metered task's challenge: one `upto` requirement of a 1000000
    /// ceiling on the local chain, offering gas sponsoring or not.
    fn upto_challenge(sponsored: bool) -> PaymentRequired {
        let mut required = json!({
            "x402Version": 2,
            "error": "PAYMENT-SIGNATURE header is required",
            "resource": {"url": "http://127.0.0.1:8080/v1/tasks/transcode", "description": "Transcode",
                         "mimeType": "application/json"},
            "accepts": [
                {"scheme": "upto", "network": "eip155:84532", "amount": "1000000", "asset": TOKEN,
                 "payTo": PAY_TO, "maxTimeoutSeconds": 900,
                 "extra": {"name": "USDC", "version": "2", "facilitatorAddress": FACILITATOR}}
            ]
        });
        if sponsored {
            required["extensions"] = json!({"eip2612GasSponsoring": {"info": {"version": "1"}, "schema": {}}});
        }
        serde_json::from_value(required).unwrap()
    }

    fn decode(header: &str) -> Value {
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap()
    }

    fn recover(signature: &Value, hash: B256) -> String {
        let bytes = hex::decode(&signature.as_str().unwrap()[2..]).unwrap();
        Signature::try_from(bytes.as_slice()).unwrap().recover_address_from_prehash(&hash).unwrap().to_checksum(None)
    }

    fn number(v: &Value) -> U256 {
        v.as_str().unwrap().parse().unwrap()
    }

    fn address(v: &Value) -> Address {
        v.as_str().unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn the_payment_pays_the_local_requirement_and_is_signed_by_the_key() {
        let signed = payment_header(&challenge(), KEY, 1_800_000_000, None).await.unwrap();
        assert!(signed.note.is_none(), "{signed:?}");
        let p = decode(&signed.header);
        assert_eq!(p["x402Version"], 2);
        assert_eq!(p["accepted"], challenge_json()["accepts"][1], "the local requirement, verbatim");
        assert_eq!(p["resource"], challenge_json()["resource"]);
        let a = &p["payload"]["authorization"];
        assert_eq!(a["from"], ADDRESS);
        assert_eq!(a["to"], PAY_TO);
        assert_eq!(a["value"], "10000");
        assert_eq!((a["validAfter"].as_str(), a["validBefore"].as_str()), (Some("1799999400"), Some("1800000300")));

        // The signature recovers to the key's address over the EIP-712 hash
        // of exactly these fields, in the token's domain on chain 84532.
        let message = TransferWithAuthorization {
            from: ADDRESS.parse().unwrap(),
            to: address(&a["to"]),
            value: U256::from(10_000u64),
            validAfter: U256::from(1_799_999_400u64),
            validBefore: U256::from(1_800_000_300u64),
            nonce: a["nonce"].as_str().unwrap().parse().unwrap(),
        };
        let domain = Eip712Domain::new(
            Some("USDC".into()),
            Some("2".into()),
            Some(U256::from(84532u64)),
            Some(TOKEN.parse().unwrap()),
            None,
        );
        assert_eq!(recover(&p["payload"]["signature"], message.eip712_signing_hash(&domain)), ADDRESS);

        // A fresh nonce every time.
        let again = payment_header(&challenge(), KEY, 1_800_000_000, None).await.unwrap();
        assert_ne!(signed.header, again.header);
    }

    /// The official x402 facilitator of the local stack (scripts/payments.sh)
    /// accepts what this module signs.
    #[tokio::test]
    async fn the_local_facilitator_verifies_the_payment() {
        let url = reeve_shared::settings::Config::from_env()
            .get(reeve_shared::settings::FACILITATOR_URL)
            .unwrap_or_else(|| "http://127.0.0.1:4021".into());
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let payment = decode(&payment_header(&challenge(), KEY, now, None).await.unwrap().header);
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
    fn exact_and_upto_on_evm_networks_are_payable_the_local_one_first() {
        let requirement = |scheme: &str, network: &str| {
            let mut r = challenge().accepts[0].clone();
            (r.scheme, r.network) = (scheme.to_owned(), network.to_owned());
            r
        };
        // What is offered, as (scheme, network) pairs, and what is paid.
        type Offer<'a> = (&'a str, &'a str);
        let cases: &[(&[Offer], Option<Offer>)] = &[
            (&[("exact", "eip155:8453"), ("exact", LOCAL_NETWORK)], Some(("exact", LOCAL_NETWORK))),
            (&[("exact", "eip155:8453")], Some(("exact", "eip155:8453"))),
            (&[("upto", "eip155:8453"), ("upto", LOCAL_NETWORK)], Some(("upto", LOCAL_NETWORK))),
            (&[("upto", "eip155:8453")], Some(("upto", "eip155:8453"))),
            (&[("batch", LOCAL_NETWORK), ("upto", "eip155:8453")], Some(("upto", "eip155:8453"))),
            (&[("exact", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp")], None),
            (&[("batch", LOCAL_NETWORK)], None),
            (&[], None),
        ];
        for (offered, wanted) in cases {
            let mut c = challenge();
            c.accepts = offered.iter().map(|(s, n)| requirement(s, n)).collect();
            match (choose(&c), wanted) {
                (Ok(r), Some((scheme, network))) => {
                    assert_eq!((r.scheme.as_str(), r.network.as_str()), (*scheme, *network), "{offered:?}")
                }
                (Err(PayError::NothingPayable), None) => {}
                (got, _) => panic!("{offered:?}: {got:?}"),
            }
        }
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
    }

    #[tokio::test]
    async fn a_bad_key_or_requirement_is_refused_before_anything_is_signed() {
        assert!(matches!(payment_header(&challenge(), "0x1234", 0, None).await, Err(PayError::BadKey)));
        let mut no_facilitator = upto_challenge(true);
        no_facilitator.accepts[0].extra.facilitator_address = None;
        let mut bad_facilitator = upto_challenge(false);
        bad_facilitator.accepts[0].extra.facilitator_address = Some("the facilitator".into());
        let mut bad_network = upto_challenge(false);
        bad_network.accepts[0].network = "eip155:base".into();
        let mut bad_amount = upto_challenge(false);
        bad_amount.accepts[0].amount = "1.5".into();
        let mut no_time = upto_challenge(false);
        no_time.accepts[0].max_timeout_seconds = 0;
        let cases = [
            ("no facilitator", no_facilitator, "names no facilitator (extra.facilitatorAddress)"),
            ("bad facilitator", bad_facilitator, "extra.facilitatorAddress"),
            ("bad network", bad_network, "network"),
            ("bad amount", bad_amount, "amount"),
            ("no time", no_time, "maxTimeoutSeconds"),
        ];
        for (name, challenge, wanted) in cases {
            // An endpoint nobody listens on: a refusal comes before any read.
            let err = payment_header(&challenge, KEY, 1_800_000_000, Some("http://127.0.0.1:9")).await;
            let err = err.expect_err(name).to_string();
            assert!(err.contains(wanted), "{name}: {err}");
        }
    }

    /// Permit2 hashes its witness with this exact type string
    /// (`PermitWitnessTransferFrom(…,Witness witness)` followed by the
    /// referenced types in name order), and so does `@x402/evm`'s
    /// `uptoPermit2WitnessTypes`.
    #[test]
    fn the_permit2_witness_type_is_the_one_x402_signs() {
        use alloy_sol_types::SolStruct as _;
        assert_eq!(
            upto::PermitWitnessTransferFrom::eip712_encode_type(),
            "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,uint256 deadline,\
             Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,\
             uint256 validAfter)"
        );
        assert_eq!(
            upto::Permit::eip712_encode_type(),
            "Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)"
        );
    }

    #[tokio::test]
    async fn an_upto_payment_signs_its_ceiling_for_the_proxy_and_names_the_facilitator() {
        let signed = payment_header(&upto_challenge(true), KEY, 1_800_000_000, None).await.unwrap();
        // No endpoint: Permit2 only, and the user is told what approval it
        // needs.
        let note = signed.note.unwrap();
        assert!(note.contains("approve(0x000000000022D473030F116dDEE9F6B43aC78BA3, max)"), "{note}");
        assert!(note.contains("--chain-rpc"), "{note}");
        let p = decode(&signed.header);
        assert_eq!(p["accepted"], serde_json::to_value(&upto_challenge(true).accepts[0]).unwrap());
        assert!(p.get("extensions").is_none(), "{p}");
        let a = &p["payload"]["permit2Authorization"];
        assert_eq!(a["from"], ADDRESS);
        assert_eq!(a["permitted"], json!({"token": TOKEN, "amount": "1000000"}));
        assert_eq!(a["spender"], "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002");
        assert_eq!(a["deadline"], "1800000900", "now + maxTimeoutSeconds");
        assert_eq!(a["witness"], json!({"to": PAY_TO, "facilitator": FACILITATOR, "validAfter": "0"}));
        assert!(a["nonce"].as_str().unwrap().bytes().all(|b| b.is_ascii_digit()), "a decimal nonce: {a}");

        let message = upto::PermitWitnessTransferFrom {
            permitted: upto::TokenPermissions {
                token: address(&a["permitted"]["token"]),
                amount: U256::from(1_000_000),
            },
            spender: upto::UPTO_PROXY,
            nonce: number(&a["nonce"]),
            deadline: U256::from(1_800_000_900u64),
            witness: upto::Witness {
                to: address(&a["witness"]["to"]),
                facilitator: FACILITATOR.parse().unwrap(),
                validAfter: U256::ZERO,
            },
        };
        let domain =
            Eip712Domain::new(Some("Permit2".into()), None, Some(U256::from(84532)), Some(upto::PERMIT2), None);
        assert_eq!(recover(&p["payload"]["signature"], message.eip712_signing_hash(&domain)), ADDRESS);

        let again = decode(&payment_header(&upto_challenge(true), KEY, 1_800_000_000, None).await.unwrap().header);
        assert_ne!(again["payload"]["permit2Authorization"]["nonce"], a["nonce"], "a fresh nonce every time");
    }

    /// The token's permit is signed exactly when the 402 offers sponsoring
    /// and Permit2 may move less than the ceiling.
    #[test]
    fn the_token_permit_is_signed_only_when_offered_and_needed() {
        let signer: PrivateKeySigner = KEY.parse().unwrap();
        let standing = |allowance: u64| {
            Some(upto::Standing { permit2_allowance: U256::from(allowance), permit_nonce: U256::from(7) })
        };
        let cases = [
            ("offered, never approved", true, standing(0), true),
            ("offered, approved below the ceiling", true, standing(999_999), true),
            ("offered, approved the ceiling", true, standing(1_000_000), false),
            ("not offered", false, standing(0), false),
            ("offered, chain unknown", true, None, false),
        ];
        for (name, sponsored, standing, permit) in cases {
            let challenge = upto_challenge(sponsored);
            let signed =
                upto::sign(&challenge, &challenge.accepts[0], &signer, 1_800_000_000, standing, U256::from(42))
                    .unwrap();
            assert_eq!(signed.authorization.nonce, "42", "{name}");
            let Some(extensions) = signed.extensions else {
                assert!(!permit, "{name}: no permit");
                continue;
            };
            assert!(permit, "{name}: a permit");
            let info = &extensions["eip2612GasSponsoring"]["info"];
            assert_eq!(
                info.as_object().unwrap().keys().collect::<Vec<_>>(),
                ["amount", "asset", "deadline", "from", "nonce", "signature", "spender", "version"],
                "{name}: @x402/evm's fields: {info}"
            );
            assert_eq!(
                (
                    &info["from"],
                    &info["asset"],
                    &info["spender"],
                    &info["amount"],
                    &info["nonce"],
                    &info["deadline"],
                    &info["version"]
                ),
                (
                    &json!(ADDRESS),
                    &json!(TOKEN),
                    &json!("0x000000000022D473030F116dDEE9F6B43aC78BA3"),
                    &json!("1000000"),
                    &json!("7"),
                    &json!("1800000900"),
                    &json!("1")
                ),
                "{name}"
            );
            let message = upto::Permit {
                owner: ADDRESS.parse().unwrap(),
                spender: upto::PERMIT2,
                value: U256::from(1_000_000),
                nonce: U256::from(7),
                deadline: U256::from(1_800_000_900u64),
            };
            let domain = Eip712Domain::new(
                Some("USDC".into()),
                Some("2".into()),
                Some(U256::from(84532)),
                Some(TOKEN.parse().unwrap()),
                None,
            );
            assert_eq!(recover(&info["signature"], message.eip712_signing_hash(&domain)), ADDRESS, "{name}");
        }
    }

    #[test]
    fn the_chain_endpoint_is_the_networks_own_or_a_bare_url() {
        let cases = [
            ("http://127.0.0.1:8545", Some("http://127.0.0.1:8545")),
            ("eip155:84532=http://127.0.0.1:8545", Some("http://127.0.0.1:8545")),
            ("eip155:8453=https://mainnet.base.org, eip155:84532=http://127.0.0.1:8545", Some("http://127.0.0.1:8545")),
            ("https://any.example/v2/key?x=1, eip155:84532=http://127.0.0.1:8545", Some("http://127.0.0.1:8545")),
            ("eip155:8453=https://mainnet.base.org", None),
            (
                "eip155:8453=https://mainnet.base.org,https://any.example/v2/key?x=1",
                Some("https://any.example/v2/key?x=1"),
            ),
            ("", None),
        ];
        for (value, wanted) in cases {
            assert_eq!(upto::endpoint_for(value, LOCAL_NETWORK).as_deref(), wanted, "{value}");
        }
        assert_eq!(upto::shown("https://rpc.example/v2/SECRET"), "https://rpc.example");
    }

    #[tokio::test]
    async fn an_unreachable_chain_is_an_error_that_hides_the_endpoints_path() {
        let err = payment_header(&upto_challenge(true), KEY, 1_800_000_000, Some("http://127.0.0.1:9/v2/SECRET"))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("http://127.0.0.1") && !err.contains("SECRET"), "{err}");
    }
}
