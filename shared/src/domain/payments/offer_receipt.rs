//! Signed offers and receipts: x402's `offer-receipt` extension, as the
//! TypeScript `@x402/extensions` package (2.27) writes and verifies it.
//!
//! Both artifacts are `{format: "jws", signature}`, the signature a JWS in
//! compact form (`header.payload.signature`) whose header is
//! `{alg: "ES256K", kid}` and whose payload is the artifact's JSON, keys
//! sorted (RFC 8785 for what Reeve writes: strings and integers). `kid` is
//! the seller key's `did:key` (secp256k1, multicodec `0xe7`), so a verifier
//! needs nothing but the artifact to check its signature; the key's
//! Ethereum address, published in `GET /v1/catalog` (`receipts.signer`) and
//! in every `402`, is what says the key is this seller's.
//!
//! Why JWS, not the extension's EIP-712 form: EIP-712 signs a fixed schema
//! (an offer's eight fields, a receipt's six), and fields outside it would
//! travel unsigned. A JWS signs its whole payload, so a receipt also proves
//! what Reeve adds: the task, its kind and input's digest, the amount
//! charged (a metered task's units and rate), and, once the task has ended,
//! the SHA-256 of its result and of each output file.
//!
//! - An offer, one per `accepts` entry, goes in a `402`'s
//!   `extensions["offer-receipt"].info.offers`, with its `acceptIndex`.
//! - A receipt goes in the settlement response's (`PAYMENT-RESPONSE`,
//!   MCP's `_meta["x402/payment-response"]`)
//!   `extensions["offer-receipt"].info.receipt`, and is what
//!   `GET /v1/tasks/{id}/receipt` answers.
//!
//! The signing key ([`SellerKey`]) comes from `REEVE_RECEIPT_KEY` (or the
//! Secrets Manager secret `REEVE_RECEIPT_KEY_SECRET_ARN` names), or stays
//! in AWS KMS (`REEVE_RECEIPT_KMS_KEY_ID`, [`crate::infra::kms`]): never the
//! catalog, never a log line (its `Debug` shows the address only).

use alloy_primitives::Address;
use alloy_signer::k256::ecdsa::signature::{Signer as _, Verifier as _};
use alloy_signer::k256::ecdsa::{Signature, SigningKey, VerifyingKey};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{PaymentRequired, PaymentRequirements, PaymentResponse};
use crate::domain::catalog::{Catalog, Price};
use crate::infra::canonical_json::canonical_json;
use crate::infra::kms::{KmsError, KmsKey};

/// The extension's key in `extensions`.
pub const OFFER_RECEIPT: &str = "offer-receipt";
/// The payloads' schema version (`version`).
pub const PAYLOAD_VERSION: u32 = 1;
/// The one format Reeve signs in.
pub const FORMAT: &str = "jws";
/// ECDSA on secp256k1 with SHA-256 (RFC 8812).
pub const ALGORITHM: &str = "ES256K";
/// The multicodec prefix of a compressed secp256k1 public key (`0xe7`, as
/// an unsigned varint), which a `did:key` identifier starts with.
const SECP256K1_PUB: [u8; 2] = [0xe7, 0x01];

/// The seller's signing key. `Debug` shows its address, never the key.
#[derive(Clone)]
pub struct SellerKey {
    signer: Signer,
    address: Address,
    kid: String,
}

/// Where the private key is: in this process, or in KMS (with its public
/// half, which checks each signature KMS answers before it is used).
#[derive(Clone)]
enum Signer {
    Local(SigningKey),
    Kms(KmsKey, VerifyingKey),
}

impl std::fmt::Debug for SellerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.signer {
            Signer::Local(_) => write!(f, "SellerKey({}, redacted)", self.address),
            Signer::Kms(key, _) => write!(f, "SellerKey({}, in KMS {})", self.address, key.id()),
        }
    }
}

/// Why a value is not a signing key. The messages never quote the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("must be 32 bytes as 64 hex digits (0x optional)")]
    NotHex,
    #[error("is not a valid secp256k1 private key")]
    OutOfRange,
}

/// Why nothing was signed: only a key in KMS can fail to sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error(transparent)]
    Kms(#[from] KmsError),
    #[error("the KMS key {0} signed with another key than the one it publishes")]
    NotThisKey(String),
}

impl SellerKey {
    /// A key written as 64 hex digits, `0x` optional.
    pub fn from_hex(text: &str) -> Result<SellerKey, KeyError> {
        let text = text.trim();
        let digits = text.strip_prefix("0x").unwrap_or(text);
        let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(digits, bytes.as_mut()).map_err(|_| KeyError::NotHex)?;
        let key = SigningKey::from_slice(bytes.as_ref()).map_err(|_| KeyError::OutOfRange)?;
        let verifying = *key.verifying_key();
        Ok(SellerKey::new(Signer::Local(key), &verifying))
    }

    /// The key `key` names in KMS, once KMS shows it is a secp256k1
    /// signing key (asked once, at start-up).
    pub async fn in_kms(key: KmsKey) -> Result<SellerKey, KmsError> {
        let verifying = key.public_key().await?;
        Ok(SellerKey::new(Signer::Kms(key, verifying), &verifying))
    }

    fn new(signer: Signer, verifying: &VerifyingKey) -> SellerKey {
        SellerKey { address: alloy_signer::utils::public_key_to_address(verifying), kid: did_key(verifying), signer }
    }

    /// The address receipts are checked against.
    pub fn address(&self) -> Address {
        self.address
    }

    /// The JWS `kid`: the key's `did:key` URL.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// `payload` signed: a compact JWS of its canonical JSON. A key in this
    /// process signs deterministically (RFC 6979), so the same payload
    /// signs the same; KMS signs the same payload differently each time,
    /// every signature as valid.
    pub async fn sign(&self, payload: &impl Serialize) -> Result<Signed, SignError> {
        let payload = serde_json::to_value(payload).expect("payloads are plain JSON");
        let header = json!({ "alg": ALGORITHM, "kid": self.kid });
        let input =
            format!("{}.{}", BASE64URL.encode(canonical_json(&header)), BASE64URL.encode(canonical_json(&payload)));
        let signature: Signature = match &self.signer {
            Signer::Local(key) => key.sign(input.as_bytes()),
            Signer::Kms(key, verifying) => {
                let signature = key.sign(input.as_bytes()).await?;
                verifying
                    .verify(input.as_bytes(), &signature)
                    .map_err(|_| SignError::NotThisKey(key.id().to_owned()))?;
                signature
            }
        };
        Ok(Signed {
            format: FORMAT.to_owned(),
            accept_index: None,
            signature: format!("{input}.{}", BASE64URL.encode(signature.to_bytes())),
        })
    }
}

/// `did:key:z…#z…` for a secp256k1 key: base58btc of the multicodec prefix
/// and the compressed point.
fn did_key(key: &VerifyingKey) -> String {
    let mut bytes = SECP256K1_PUB.to_vec();
    bytes.extend_from_slice(key.to_encoded_point(true).as_bytes());
    let id = format!("z{}", bs58::encode(bytes).into_string());
    format!("did:key:{id}#{id}")
}

/// The key a `did:key` names, if it is a secp256k1 one.
fn key_of_did(kid: &str) -> Option<VerifyingKey> {
    let did = kid.split('#').next()?;
    let id = did.strip_prefix("did:key:z")?;
    let bytes = bs58::decode(id).into_vec().ok()?;
    let point = bytes.strip_prefix(&SECP256K1_PUB[..])?;
    VerifyingKey::from_sec1_bytes(point).ok()
}

/// A signed offer or receipt, as the extension carries it. For JWS the
/// payload travels inside `signature` only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = SignedArtifact)]
pub struct Signed {
    /// Always `jws`.
    pub format: String,
    /// An offer's place in `accepts` (a hint: match by the payload's fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_index: Option<usize>,
    /// A JWS in compact form, `ES256K`, whose `kid` is the seller key's
    /// `did:key`; its payload is the offer or receipt.
    pub signature: String,
}

/// An offer: what the seller commits to for one `accepts` entry. The first
/// eight fields are the extension's; the rest are Reeve's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OfferPayload {
    /// Always `1`.
    pub version: u32,
    pub resource_url: String,
    pub scheme: String,
    pub network: String,
    pub asset: String,
    pub pay_to: String,
    /// Atomic units (for `upto`, the ceiling).
    pub amount: String,
    /// Unix seconds after which the offer no longer holds.
    pub valid_until: u64,
    /// The task kind on offer.
    pub kind: String,
    /// SHA-256 (hex) of the input's canonical JSON, when the offer answers
    /// a request with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_sha256: Option<String>,
    /// A metered price's unit and rate (atomic units per unit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
}

/// A receipt: what a paid task's buyer paid, and, once the task has ended,
/// what it got. The first six fields are the extension's; the rest are
/// Reeve's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReceiptPayload {
    /// Always `1`.
    pub version: u32,
    /// CAIP-2.
    pub network: String,
    /// The resource paid for, as its payment's challenge named it (whichever
    /// interface reads the receipt): `https://<api>/v1/tasks/<kind>`,
    /// `mcp://tool/<tool>` for a tool call, or `https://<api>/v1/pay-link`
    /// for a pay link paid on the console's pay page.
    pub resource_url: String,
    pub payer: String,
    /// Unix seconds: when it was paid, or, once the task ended, when it ended.
    pub issued_at: u64,
    /// The settlement's transaction hash (for a task paid with a credit,
    /// the payment's the credit came from); empty for a batch-settlement
    /// voucher's task, whose money the seller claims later, with others',
    /// in one transaction.
    pub transaction: String,
    /// The task paid for.
    pub task: String,
    pub kind: String,
    /// SHA-256 (hex) of the task's input as canonical JSON (keys sorted,
    /// no whitespace).
    pub input_sha256: String,
    /// `exact` or `upto`; `batch-settlement` for a task a voucher paid,
    /// whose `voucher` says which; `credit` for a task paid with a credit,
    /// whose `credit` says which.
    pub scheme: String,
    /// The token contract.
    pub asset: String,
    pub pay_to: String,
    /// What was charged, atomic units.
    pub amount: String,
    /// A metered task's count: `used` units of `unit` at `rate` (atomic
    /// units per unit), within the `authorized` ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metered: Option<MeteredCharge>,
    /// A task paid with a credit: the credit, and the task whose failure
    /// left it. The payment fields (`payer`, `transaction`, `payTo`) then
    /// name the payment the credit was first owed for, followed back
    /// through credits that paid for tasks which failed in turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credit: Option<CreditSpent>,
    /// A task a batch-settlement voucher paid: the channel and the
    /// voucher's cumulative amount, which the escrow pays out against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voucher: Option<VoucherSpent>,
    /// Proof of delivery, once the task has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<Delivery>,
}

/// The batch-settlement voucher that paid for a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VoucherSpent {
    /// The escrow's channel id (hex).
    pub channel_id: String,
    /// The voucher's cumulative amount (atomic units): what the channel had
    /// been charged once this task was bought.
    pub cumulative_amount: String,
}

/// The credit that paid for a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreditSpent {
    /// The credit's id (`GET /v1/space` lists it).
    pub id: String,
    /// The paid task that ended without doing its work; absent for a
    /// charge whose task could no longer be created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_task: Option<String>,
    /// Why it was owed: that task's error code.
    pub reason: String,
}

/// How a metered task's charge was counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeteredCharge {
    pub unit: String,
    pub rate: String,
    /// Bytes (or, for `second`, milliseconds) the task used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<u64>,
    pub authorized: String,
}

/// What an ended task delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    /// `completed`, `failed` or `canceled`.
    pub status: String,
    /// SHA-256 (hex) of the result as canonical JSON without its download
    /// links (`url`, `url_expires_at`, `expired`, also in each of
    /// `outputs`); `null` without a result.
    pub result_sha256: Option<String>,
    /// The output files, each with its SHA-256: the downloaded bytes must
    /// hash to it.
    pub outputs: Vec<DeliveredFile>,
}

/// One output file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveredFile {
    /// `body` for a `fetch` task's download; the file's name otherwise.
    pub name: String,
    pub size: u64,
    /// Hex.
    pub sha256: String,
}

/// `{info, schema}` of the extension in a `402`: the offers, and the
/// address that signs them.
pub fn offers_extension(key: &SellerKey, offers: Vec<Signed>) -> Value {
    json!({
        "info": {
            "offers": offers,
            "signer": { "address": key.address().to_checksum(None), "kid": key.kid() }
        },
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "offers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "format": { "type": "string" },
                            "acceptIndex": { "type": "integer" },
                            "signature": { "type": "string" }
                        },
                        "required": ["format", "signature"]
                    }
                }
            },
            "required": ["offers"]
        }
    })
}

/// Signs an offer for each of `challenge`'s `accepts` (in its order, each
/// with its `acceptIndex`) and adds them as the `offer-receipt` extension.
/// Each offer holds for the entry's `maxTimeoutSeconds` from `now`, names
/// the kind and, for a request with one, the input's digest, and for a
/// metered price its unit and rate. When one cannot be signed (KMS is
/// unreachable) the challenge is left without offers: still one a buyer can
/// pay, whose receipt it can ask for later.
pub async fn sign_offers(
    key: &SellerKey,
    challenge: &mut PaymentRequired,
    catalog: &Catalog,
    kind: &str,
    input: Option<&Value>,
    now: u64,
) -> Result<(), SignError> {
    let spec = catalog.task(kind);
    let input_sha256 = input.map(sha256_json);
    let meter = |req: &PaymentRequirements| {
        let same = |price: &&Price| {
            price.scheme() == req.scheme
                && price.amount.to_string() == req.amount
                && catalog.assets.get(&price.asset).is_some_and(|a| a.contract == req.asset && a.network == req.network)
        };
        spec.and_then(|spec| spec.accepts.iter().find(same)).and_then(|price| price.meter.as_ref())
    };
    let payloads: Vec<_> = challenge
        .accepts
        .iter()
        .map(|req| {
            let meter = meter(req);
            OfferPayload {
                version: PAYLOAD_VERSION,
                resource_url: challenge.resource.url.clone(),
                scheme: req.scheme.clone(),
                network: req.network.clone(),
                asset: req.asset.clone(),
                pay_to: req.pay_to.clone(),
                amount: req.amount.clone(),
                valid_until: now + u64::from(req.max_timeout_seconds),
                kind: kind.to_owned(),
                input_sha256: input_sha256.clone(),
                unit: meter.map(|m| m.unit.name().to_owned()),
                rate: meter.map(|m| m.rate.to_string()),
            }
        })
        .collect();
    let signed = futures_util::future::try_join_all(payloads.iter().map(|payload| key.sign(payload))).await?;
    let offers =
        signed.into_iter().enumerate().map(|(index, offer)| Signed { accept_index: Some(index), ..offer }).collect();
    challenge.extensions.insert(OFFER_RECEIPT.to_owned(), offers_extension(key, offers));
    Ok(())
}

/// `settlement` with `receipt` in its `offer-receipt` extension.
pub fn with_receipt(mut settlement: PaymentResponse, receipt: &Signed) -> PaymentResponse {
    settlement
        .extensions
        .get_or_insert_with(Default::default)
        .insert(OFFER_RECEIPT.to_owned(), receipt_extension(receipt));
    settlement
}

/// The signed receipt a settlement response carries, if any.
pub fn receipt_in(settlement: &Value) -> Option<Signed> {
    serde_json::from_value(settlement.pointer("/extensions/offer-receipt/info/receipt")?.clone()).ok()
}

/// `{info, schema}` of the extension in a settlement response.
pub fn receipt_extension(receipt: &Signed) -> Value {
    json!({
        "info": { "receipt": receipt },
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "receipt": {
                    "type": "object",
                    "properties": { "format": { "type": "string" }, "signature": { "type": "string" } },
                    "required": ["format", "signature"]
                }
            },
            "required": ["receipt"]
        }
    })
}

/// SHA-256 (hex) of `value`'s canonical JSON.
pub fn sha256_json(value: &Value) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(canonical_json(value).as_bytes()))
}

/// The fields of a result that change each time it is read (signed
/// download links), left out of what a receipt hashes.
const LINK_FIELDS: [&str; 3] = ["url", "url_expires_at", "expired"];

/// SHA-256 (hex) of a task's result as a receipt proves it: canonical JSON
/// without its download links, at the top and in each of `outputs`.
pub fn result_sha256(result: &Value) -> String {
    let mut result = result.clone();
    if let Some(object) = result.as_object_mut() {
        for field in LINK_FIELDS {
            object.remove(field);
        }
        if let Some(outputs) = object.get_mut("outputs").and_then(Value::as_array_mut) {
            for output in outputs.iter_mut().filter_map(Value::as_object_mut) {
                for field in LINK_FIELDS {
                    output.remove(field);
                }
            }
        }
    }
    sha256_json(&result)
}

/// Why an artifact is refused. None of these says anything about the key
/// beyond what the artifact carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("not a signed offer or receipt: {0}")]
    Malformed(String),
    #[error("format {0:?} is not supported (Reeve signs jws)")]
    Format(String),
    #[error("algorithm {0:?} is not ES256K")]
    Algorithm(String),
    #[error("the kid is not a secp256k1 did:key")]
    Kid,
    #[error("the signature does not match the payload: it was changed, or signed by another key")]
    BadSignature,
    #[error("signed by {found}, not by the published signer {expected}")]
    WrongSigner { found: Address, expected: Address },
}

/// What a verified artifact says, and who signed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub payload: Value,
    pub signer: Address,
    pub kid: String,
}

/// Checks `signed`: a JWS `ES256K` whose signature holds under the key its
/// `kid` names and, when `expected` is given, whose key is that address's.
pub fn verify(signed: &Signed, expected: Option<Address>) -> Result<Verified, VerifyError> {
    if signed.format != FORMAT {
        return Err(VerifyError::Format(signed.format.clone()));
    }
    let malformed = |why: &str| VerifyError::Malformed(why.to_owned());
    let mut parts = signed.signature.split('.');
    let (Some(header), Some(payload), Some(signature), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("a JWS has three dot-separated parts"));
    };
    let decode = |part: &str, what: &str| {
        BASE64URL.decode(part).map_err(|_| VerifyError::Malformed(format!("the {what} is not base64url")))
    };
    let header_json: Value =
        serde_json::from_slice(&decode(header, "header")?).map_err(|_| malformed("the header is not JSON"))?;
    let alg = header_json.get("alg").and_then(Value::as_str).unwrap_or_default();
    if alg != ALGORITHM {
        return Err(VerifyError::Algorithm(alg.to_owned()));
    }
    let kid = header_json.get("kid").and_then(Value::as_str).ok_or(VerifyError::Kid)?;
    let key = key_of_did(kid).ok_or(VerifyError::Kid)?;
    let signature = Signature::from_slice(&decode(signature, "signature")?).map_err(|_| VerifyError::BadSignature)?;
    let input_len = header.len() + 1 + payload.len();
    key.verify(&signed.signature.as_bytes()[..input_len], &signature).map_err(|_| VerifyError::BadSignature)?;
    let signer = alloy_signer::utils::public_key_to_address(&key);
    if let Some(expected) = expected
        && expected != signer
    {
        return Err(VerifyError::WrongSigner { found: signer, expected });
    }
    let payload: Value =
        serde_json::from_slice(&decode(payload, "payload")?).map_err(|_| malformed("the payload is not JSON"))?;
    if !payload.is_object() {
        return Err(malformed("the payload is not a JSON object"));
    }
    Ok(Verified { payload, signer, kid: kid.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The development key (reeve.dev.toml's `receipt_signer`): public.
    const DEV_KEY: &str = "5ab0c95958f7c7144d59f69084444144eabb3f95c2cd0a1676be703baeddec15";

    fn receipt() -> ReceiptPayload {
        ReceiptPayload {
            version: 1,
            network: "eip155:84532".into(),
            resource_url: "https://api.example/v1/tasks/fetch".into(),
            payer: "0x857b06519E91e3A54538791bDbb0E22373e36b66".into(),
            issued_at: 1_703_123_456,
            transaction: format!("0x{}", "ab".repeat(32)),
            task: "01HZX3Y4P5Q6R7S8T9V0W1X2Y3".into(),
            kind: "fetch".into(),
            input_sha256: sha256_json(&json!({"url": "https://example.com"})),
            scheme: "exact".into(),
            asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into(),
            pay_to: "0x209693Bc6afc0C5328bA36FaF03C514EF312287C".into(),
            amount: "10000".into(),
            metered: None,
            credit: None,
            voucher: None,
            delivery: None,
        }
    }

    #[tokio::test]
    async fn a_receipt_verifies_under_its_key_and_says_what_was_signed() {
        let key = SellerKey::from_hex(DEV_KEY).unwrap();
        let signed = key.sign(&receipt()).await.unwrap();
        assert_eq!(signed, key.sign(&receipt()).await.unwrap(), "RFC 6979: the same payload signs the same");
        let verified = verify(&signed, Some(key.address())).unwrap();
        assert_eq!(verified.signer, key.address());
        assert_eq!(serde_json::from_value::<ReceiptPayload>(verified.payload).unwrap(), receipt());
        assert!(key.kid().starts_with("did:key:zQ3s"), "{}", key.kid());
        // The key is nowhere in what is shown or signed.
        assert!(!format!("{key:?}").contains(DEV_KEY) && !signed.signature.contains(DEV_KEY));
    }

    #[test]
    fn the_development_key_is_the_published_signer() {
        let key = SellerKey::from_hex(&format!("0x{DEV_KEY}")).unwrap();
        let dev = crate::domain::catalog::Catalog::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../reeve.dev.toml"
        )))
        .unwrap();
        let published = dev.payments.unwrap().receipt_signer.expect("reeve.dev.toml publishes its signer");
        assert_eq!(published, key.address().to_checksum(None));
    }

    #[tokio::test]
    async fn a_changed_byte_or_another_key_is_refused() {
        let key = SellerKey::from_hex(DEV_KEY).unwrap();
        let signed = key.sign(&receipt()).await.unwrap();
        // One byte of the payload changed: the amount.
        let mut changed = receipt();
        changed.amount = "10001".into();
        let forged_payload = BASE64URL.encode(canonical_json(&serde_json::to_value(&changed).unwrap()));
        let parts: Vec<&str> = signed.signature.split('.').collect();
        let forged = Signed { signature: format!("{}.{forged_payload}.{}", parts[0], parts[2]), ..signed.clone() };
        assert_eq!(verify(&forged, None), Err(VerifyError::BadSignature));
        // Every single byte of the compact form, flipped.
        for i in 0..signed.signature.len() {
            let mut bytes = signed.signature.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let Ok(text) = String::from_utf8(bytes) else { continue };
            if text == signed.signature {
                continue;
            }
            let flipped = Signed { signature: text, ..signed.clone() };
            assert!(verify(&flipped, Some(key.address())).is_err(), "byte {i} changed and still verified");
        }
        // Signed by another key (its own kid): valid, but not the seller's.
        let other = SellerKey::from_hex(&"11".repeat(32)).unwrap();
        let theirs = other.sign(&receipt()).await.unwrap();
        assert!(verify(&theirs, None).is_ok());
        assert_eq!(
            verify(&theirs, Some(key.address())),
            Err(VerifyError::WrongSigner { found: other.address(), expected: key.address() })
        );
        // Another key's signature under the seller's kid.
        let theirs_parts: Vec<&str> = theirs.signature.split('.').collect();
        let swapped = Signed { signature: format!("{}.{}.{}", parts[0], parts[1], theirs_parts[2]), ..signed };
        assert_eq!(verify(&swapped, Some(key.address())), Err(VerifyError::BadSignature));
    }

    #[tokio::test]
    async fn only_jws_es256k_with_a_did_key_is_read() {
        let key = SellerKey::from_hex(DEV_KEY).unwrap();
        let signed = key.sign(&receipt()).await.unwrap();
        let eip712 = Signed { format: "eip712".into(), ..signed.clone() };
        assert!(matches!(verify(&eip712, None), Err(VerifyError::Format(_))));
        let parts: Vec<&str> = signed.signature.split('.').collect();
        let none = BASE64URL.encode(br#"{"alg":"none","kid":"x"}"#);
        let alg_none = Signed { signature: format!("{none}.{}.", parts[1]), ..signed.clone() };
        assert!(matches!(verify(&alg_none, None), Err(VerifyError::Algorithm(_))));
        let web = BASE64URL.encode(br#"{"alg":"ES256K","kid":"did:web:evil.example"}"#);
        let did_web = Signed { signature: format!("{web}.{}.{}", parts[1], parts[2]), ..signed.clone() };
        assert_eq!(verify(&did_web, None), Err(VerifyError::Kid));
        for text in ["", "a.b", "a.b.c.d", "!!.!!.!!"] {
            let junk = Signed { signature: text.into(), ..signed.clone() };
            assert!(verify(&junk, None).is_err(), "{text:?}");
        }
    }

    #[test]
    fn keys_are_64_hex_digits() {
        assert_eq!(SellerKey::from_hex("xyz").unwrap_err(), KeyError::NotHex);
        assert_eq!(SellerKey::from_hex(&"ab".repeat(31)).unwrap_err(), KeyError::NotHex);
        assert_eq!(SellerKey::from_hex(&"00".repeat(32)).unwrap_err(), KeyError::OutOfRange);
        assert_eq!(SellerKey::from_hex(&"ff".repeat(32)).unwrap_err(), KeyError::OutOfRange);
    }

    #[test]
    fn a_result_hashes_without_its_links() {
        let stored = json!({"key": "outputs/x/y/body", "size": 3, "sha256": "ab", "url": null,
                            "outputs": [{"name": "a.csv", "size": 1, "key": "k"}]});
        let mut read = stored.clone();
        read["url"] = json!("https://s3.example/signed?X-Amz-Signature=1");
        read["url_expires_at"] = json!("2026-01-01T00:00:00Z");
        read["outputs"][0]["url"] = json!("https://s3.example/a?sig");
        read["outputs"][0]["url_expires_at"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(result_sha256(&stored), result_sha256(&read));
        read["size"] = json!(4);
        assert_ne!(result_sha256(&stored), result_sha256(&read));
    }
}
