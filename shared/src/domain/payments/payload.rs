//! The client's payment: the `PAYMENT-SIGNATURE` header, decoded and checked
//! against what this task kind offers.
//!
//! Three schemes: `exact`, an EIP-3009 authorization of the price,
//! `batch-settlement`, a cumulative voucher on the payer's escrow channel
//! (its payload read by [`super::batch::payload`]), and `upto`, a Permit2
//! `PermitWitnessTransferFrom` of a ceiling to x402's upto proxy,
//! witnessing `payTo` and the facilitator (what `@x402/evm` and the Python
//! SDK's upto clients sign). The document itself is kept as sent: it
//! goes to the facilitator verbatim, so fields this parser does not know
//! survive (the `eip2612GasSponsoring` permit among them).
//!
//! Every number in a payment has one spelling. The chain reads a Permit2
//! nonce `"0123"` and `"123"` as one nonce; Reeve, comparing text, read two
//! authorizations, and one signature bought two tasks. So each number is
//! parsed into the integer it is on chain (a `uint256`, checked in range),
//! and anything but its canonical decimal (digits, no leading zero, no sign,
//! no space, no `0x`) is refused naming the field; `exact`'s `bytes32`
//! nonce is `0x` and 64 hex digits, kept lowercase. The attempt is then
//! unique on that one form.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::batch::BatchPayload;
use super::challenge::{Extra, PAYMENT_IDENTIFIER, PaymentRequirements, X402_VERSION};
use super::scheme::Scheme;

/// The longest header we decode: a real payment is well under 2 KiB.
const MAX_HEADER_BYTES: usize = 16 * 1024;

/// A decoded `PAYMENT-SIGNATURE`.
#[derive(Debug, Clone)]
pub struct Payment {
    /// The document as sent, for the facilitator.
    pub document: Value,
    /// SHA-256 of the canonical document: the same payment has one hash.
    pub hash: [u8; 32],
    pub accepted: Accepted,
    /// `authorization.from` (`permit2Authorization.from`), lowercase.
    pub payer: String,
    /// `authorization.nonce`, lowercase hex; for `upto` the Permit2 nonce,
    /// in canonical decimal (see [`uint256`]).
    pub nonce: String,
    /// The `payment-identifier` extension's id, if the client sent one.
    pub payment_id: Option<String>,
    /// `authorization.validBefore` (`permit2Authorization.deadline`; unix
    /// seconds, in canonical decimal): after it, an authorization never used
    /// can never be.
    pub valid_before: String,
    /// `Some` for an `upto` payment: what its Permit2 signature permits.
    pub upto: Option<Permit2Authorization>,
    /// `Some` for a `batch-settlement` payment: its voucher, and the deposit
    /// that funds the channel first if it carries one. Its `payer` is the
    /// channel's, its `nonce` the voucher's channel and ceiling (what makes
    /// it unique), and its `valid_before` `"0"`: a voucher does not expire.
    pub batch: Option<BatchPayload>,
}

/// A payment as a client sent it: the `PAYMENT-SIGNATURE` header of an HTTP
/// request, or the decoded document an MCP tool call carries in its `_meta`.
#[derive(Debug, Clone, Copy)]
pub enum PaymentInput<'a> {
    Header(&'a str),
    Document(&'a Value),
}

impl PaymentInput<'_> {
    pub fn decode(self) -> Result<Payment, String> {
        match self {
            PaymentInput::Header(header) => decode(header),
            PaymentInput::Document(document) => from_document(document.clone()),
        }
    }
}

/// The requirement the client says it paid (`accepted`): one of the
/// challenge's `accepts`, as sent back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    pub scheme: String,
    pub network: String,
    pub amount: String,
    pub asset: String,
    pub pay_to: String,
    pub max_timeout_seconds: u64,
    /// The token's EIP-712 domain; clients repeat it, Reeve does not need it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Extra>,
}

impl From<&PaymentRequirements> for Accepted {
    fn from(r: &PaymentRequirements) -> Self {
        Accepted {
            scheme: r.scheme.clone(),
            network: r.network.clone(),
            amount: r.amount.clone(),
            asset: r.asset.clone(),
            pay_to: r.pay_to.clone(),
            max_timeout_seconds: u64::from(r.max_timeout_seconds),
            extra: Some(r.extra.clone()),
        }
    }
}

/// An x402 v2 `exact` payment (what `PAYMENT-SIGNATURE` holds, base64): the
/// one representation of it, which the server decodes and the CLI signs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentPayload {
    pub x402_version: u32,
    pub accepted: Accepted,
    pub payload: SchemePayload,
    /// The challenge's `resource`, repeated; unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<serde_json::Map<String, Value>>,
}

/// What the scheme signed: an EIP-3009 authorization (`exact`) or a Permit2
/// one (`upto`), told apart by their fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SchemePayload {
    Exact(ExactPayload),
    Upto(UptoPayload),
}

/// The `upto` scheme's payload: a Permit2 authorization and its signature.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UptoPayload {
    pub signature: String,
    pub permit2_authorization: Permit2Authorization,
}

/// Permit2's `PermitWitnessTransferFrom` as x402's upto clients sign it:
/// `permitted.amount` is the ceiling, `spender` the upto proxy, and the
/// witness names `payTo` and the one facilitator that may settle it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Permit2Authorization {
    pub from: String,
    pub permitted: TokenPermissions,
    pub spender: String,
    /// A decimal string (Permit2's unordered nonces are 256-bit).
    pub nonce: String,
    pub deadline: String,
    pub witness: UptoWitness,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenPermissions {
    pub token: String,
    pub amount: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UptoWitness {
    pub to: String,
    pub facilitator: String,
    pub valid_after: String,
}

/// The scheme's payload: an EIP-3009 authorization and its signature.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExactPayload {
    pub signature: String,
    pub authorization: Authorization,
}

/// EIP-3009's `transferWithAuthorization` fields, as decimal and hex
/// strings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    pub from: String,
    pub to: String,
    pub value: String,
    pub valid_after: String,
    pub valid_before: String,
    pub nonce: String,
}

impl PaymentPayload {
    /// The `PAYMENT-SIGNATURE` header value: base64 (standard) of its JSON.
    pub fn header_value(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(self).expect("plain strings"))
    }
}

fn hex_of_len(s: &str, digits: usize) -> bool {
    s.len() == digits + 2 && s.starts_with("0x") && s[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// A `uint256` as x402 writes one: a decimal string. Only the canonical
/// spelling is taken (digits only, no leading zero but `"0"` itself, at most
/// 2^256 − 1), so that one integer has one text wherever Reeve stores or
/// compares it. `field` names it in the refusal; the value is not echoed.
pub fn uint256(field: &str, text: &str) -> Result<alloy_primitives::U256, String> {
    let wrong = |what: &str| Err(format!("{field} must be a uint256 in decimal digits: {what}"));
    if text.is_empty() {
        return wrong("it is empty");
    }
    if text.starts_with("0x") || text.starts_with("0X") {
        return wrong("it is hex; write it in decimal");
    }
    if text.starts_with(['+', '-']) {
        return wrong("it has a sign");
    }
    if text.bytes().any(|b| b.is_ascii_whitespace()) {
        return wrong("it holds whitespace");
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return wrong("it holds a character that is not a digit");
    }
    if text.len() > 1 && text.starts_with('0') {
        return wrong("it has a leading zero");
    }
    // Digits only by now (ruint's parser would also skip `_`).
    alloy_primitives::U256::from_str_radix(text, 10).or_else(|_| wrong("it is larger than 2^256 - 1"))
}

/// What the `payment-identifier` extension's schema allows of an id.
pub const PAYMENT_IDENTIFIER_RULE: &str = "the payment-identifier id must be 16 to 128 letters, digits, '-' or '_'";

/// Whether `id` is a `payment-identifier` id ([`PAYMENT_IDENTIFIER_RULE`]).
pub fn payment_identifier(id: &str) -> bool {
    (16..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `uint256` for every `(field, text)`, in order: the first refusal.
fn uint256s(fields: &[(&str, &str)]) -> Result<(), String> {
    fields.iter().try_for_each(|(field, text)| uint256(field, text).map(|_| ()))
}

/// Decodes the header: base64 (standard or URL-safe alphabet) of the x402 v2
/// payment JSON. The message says what is wrong, without echoing the value.
pub fn decode(header: &str) -> Result<Payment, String> {
    let header = header.trim();
    if header.is_empty() || header.len() > MAX_HEADER_BYTES {
        return Err(format!("PAYMENT-SIGNATURE must be 1 to {MAX_HEADER_BYTES} bytes of base64"));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(header)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(header))
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header))
        .map_err(|_| "PAYMENT-SIGNATURE is not base64".to_owned())?;
    let document: Value =
        serde_json::from_slice(&bytes).map_err(|_| "PAYMENT-SIGNATURE does not decode to JSON".to_owned())?;
    from_document(document)
}

/// Checks a decoded payment document (what the header's base64 holds).
pub fn from_document(document: Value) -> Result<Payment, String> {
    if serde_json::to_vec(&document).map_or(true, |b| b.len() > MAX_HEADER_BYTES) {
        return Err(format!("the payment must be at most {MAX_HEADER_BYTES} bytes of JSON"));
    }
    if document.pointer("/accepted/scheme").and_then(Value::as_str) == Some(Scheme::Batch.name()) {
        return batch_document(document);
    }
    let parsed: PaymentPayload = serde_json::from_value(document.clone())
        .map_err(|_| "the payment is not an x402 v2 exact, upto or batch-settlement payment".to_owned())?;
    if parsed.x402_version != X402_VERSION {
        return Err(format!("x402Version must be {X402_VERSION}"));
    }
    uint256("accepted.amount", &parsed.accepted.amount)?;
    let (payer, nonce, valid_before, upto, signature) = match &parsed.payload {
        SchemePayload::Exact(exact) => {
            let a = &exact.authorization;
            if !hex_of_len(&a.from, 40) || !hex_of_len(&a.to, 40) {
                return Err("authorization.from and .to must be 0x-prefixed 20-byte addresses".to_owned());
            }
            // Hex of either case is the same 32 bytes to the token: kept
            // lowercase, the one form the attempt is unique on.
            if !hex_of_len(&a.nonce, 64) {
                return Err("authorization.nonce must be a 0x-prefixed 32-byte value (0x and 64 hex digits)".to_owned());
            }
            uint256s(&[
                ("authorization.value", &a.value),
                ("authorization.validAfter", &a.valid_after),
                ("authorization.validBefore", &a.valid_before),
            ])?;
            (&a.from, a.nonce.to_ascii_lowercase(), &a.valid_before, None, &exact.signature)
        }
        SchemePayload::Upto(upto) => {
            let a = &upto.permit2_authorization;
            let addresses = [&a.from, &a.permitted.token, &a.spender, &a.witness.to, &a.witness.facilitator];
            if !addresses.iter().all(|address| hex_of_len(address, 40)) {
                return Err("permit2Authorization's from, permitted.token, spender, witness.to and \
                            witness.facilitator must be 0x-prefixed 20-byte addresses"
                    .to_owned());
            }
            uint256s(&[
                ("permit2Authorization.permitted.amount", &a.permitted.amount),
                ("permit2Authorization.deadline", &a.deadline),
                ("permit2Authorization.witness.validAfter", &a.witness.valid_after),
            ])?;
            // Permit2's nonce is a uint256: its canonical decimal is the
            // one text an attempt is unique on.
            let nonce = uint256("permit2Authorization.nonce", &a.nonce)?.to_string();
            (&a.from, nonce, &a.deadline, Some(a.clone()), &upto.signature)
        }
    };
    if !(signature.starts_with("0x")
        && signature.len() > 2
        && signature.len().is_multiple_of(2)
        && signature[2..].bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err("payload.signature must be 0x-prefixed hex".to_owned());
    }
    let payment_id = payment_id(parsed.extensions.as_ref())?;
    // The hash names the payment: what was signed and the requirement it
    // pays, as parsed. The rest (`resource`, `extensions`, fields a client
    // adds or leaves out, nulls it writes or omits) is unsigned and
    // advisory, so the same payment sent again by another client library,
    // or re-serialised, is still the same payment. Its numbers are
    // canonical by now, so they hash as the chain reads them; the hex of
    // `exact`'s nonce and of the signature is hashed as written, which keeps
    // every stored hash valid: a copy in another case is the same
    // authorization (one attempt) but not the same document, so it is
    // refused as a replay rather than answered as a resend.
    let hash = payment_hash(&parsed.accepted, &parsed.payload);
    Ok(Payment {
        valid_before: valid_before.clone(),
        payer: payer.to_ascii_lowercase(),
        nonce,
        upto,
        batch: None,
        accepted: parsed.accepted,
        document,
        hash,
        payment_id,
    })
}

/// The `payment-identifier` extension's id, if the client sent one.
/// The hash that names a payment: what was signed (`payload`) and the
/// requirement it pays, as parsed (see [`from_document`]).
fn payment_hash(paid: &Accepted, payload: &impl Serialize) -> [u8; 32] {
    let named = serde_json::json!({
        "accepted": [&paid.scheme, &paid.network, &paid.amount, paid.asset.to_ascii_lowercase(),
                     paid.pay_to.to_ascii_lowercase(), paid.max_timeout_seconds],
        "payload": payload,
    });
    Sha256::digest(crate::infra::canonical_json::canonical_json(&named).as_bytes()).into()
}

fn payment_id(extensions: Option<&serde_json::Map<String, Value>>) -> Result<Option<String>, String> {
    match extensions.and_then(|e| e.get(PAYMENT_IDENTIFIER)).map(|ext| ext.pointer("/info/id")) {
        None | Some(None | Some(Value::Null)) => Ok(None),
        Some(Some(Value::String(id))) if payment_identifier(id) => Ok(Some(id.clone())),
        Some(Some(_)) => Err(PAYMENT_IDENTIFIER_RULE.to_owned()),
    }
}

/// A `batch-settlement` payment: the envelope as for every scheme, its
/// payload read by [`BatchPayload::parse`] (a voucher, or a deposit with
/// its voucher; a refund is refused there: Reeve takes none yet).
fn batch_document(document: Value) -> Result<Payment, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Envelope {
        x402_version: u32,
        accepted: Accepted,
        payload: Value,
        #[serde(default)]
        extensions: Option<serde_json::Map<String, Value>>,
    }
    let parsed: Envelope = serde_json::from_value(document.clone())
        .map_err(|_| "the payment is not an x402 v2 batch-settlement payment".to_owned())?;
    if parsed.x402_version != X402_VERSION {
        return Err(format!("x402Version must be {X402_VERSION}"));
    }
    uint256("accepted.amount", &parsed.accepted.amount)?;
    let batch = BatchPayload::parse(&parsed.payload).map_err(|why| format!("payload: {why}"))?;
    let payment_id = payment_id(parsed.extensions.as_ref())?;
    // Named by what was signed (the voucher, and a deposit's authorization)
    // and the requirement it pays, as for the other schemes.
    let hash = payment_hash(&parsed.accepted, &parsed.payload);
    Ok(Payment {
        payer: format!("{:#x}", batch.config.payer),
        nonce: format!("{:#x}/{}", batch.channel_id, batch.ceiling),
        valid_before: "0".into(),
        upto: None,
        batch: Some(batch),
        accepted: parsed.accepted,
        document,
        hash,
        payment_id,
    })
}

impl Accepted {
    /// Whether this is `offered`: the same scheme, network, asset, amount,
    /// `payTo` and `maxTimeoutSeconds` (addresses compared without case, as
    /// EIP-55 checksums are only a spelling).
    pub fn matches(&self, offered: &PaymentRequirements) -> bool {
        self.scheme == offered.scheme
            && self.network == offered.network
            && self.asset.eq_ignore_ascii_case(&offered.asset)
            && self.amount == offered.amount
            && self.pay_to.eq_ignore_ascii_case(&offered.pay_to)
            && self.max_timeout_seconds == u64::from(offered.max_timeout_seconds)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn encode(v: &Value) -> String {
        base64::engine::general_purpose::STANDARD.encode(v.to_string())
    }

    fn sample() -> Value {
        json!({
            "x402Version": 2,
            "accepted": {
                "scheme": "exact", "network": "eip155:84532", "amount": "10000",
                "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 300,
                "extra": {"name": "USDC", "version": "2"}
            },
            "payload": {
                "signature": "0xabcd",
                "authorization": {
                    "from": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
                    "to": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
                    "value": "10000", "validAfter": "0", "validBefore": "1796117988",
                    "nonce": "0xDCAE34F6418ED6BC7CC8DE51FB4D83E29DE70845050F89511B4719A889092EED"
                }
            }
        })
    }

    /// A voucher payment as `@x402/evm`'s batch-settlement client sends it.
    fn batch_sample() -> Value {
        json!({
            "x402Version": 2,
            "accepted": {
                "scheme": "batch-settlement", "network": "eip155:84532", "amount": "1000",
                "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 300,
                "extra": {"name": "USDC", "version": "2", "receiverAuthorizer": "0x4444444444444444444444444444444444444444",
                          "withdrawDelay": 3600}
            },
            "payload": {
                "type": "voucher",
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
                    "maxClaimableAmount": "3000",
                    "signature": "0xa8c296c990c1a0fd6ded07352557562cb6977772c760eb0e92ebc854af578fe429ec0cbee3d2e866587c7b5443a4fe7a163bad16e4833436b2ca47c73ea1d4fe1b"
                }
            }
        })
    }

    #[test]
    fn a_batch_settlement_payment_decodes_with_its_voucher_and_nothing_else_does() {
        let p = decode(&encode(&batch_sample())).unwrap();
        let batch = p.batch.as_ref().unwrap();
        assert_eq!((batch.ceiling, batch.deposit.is_none()), (3000, true));
        assert_eq!(p.payer, "0x70997970c51812dc3a010c7d01b50e0d17dc79c8");
        assert_eq!(p.nonce, "0x89e93206f45719853254dfac00e7e64433051107d8dd164742dc5ea75bff2fdd/3000");
        assert!(p.upto.is_none());
        // A shape the batch reader does not know is named, not guessed.
        let mut claim = batch_sample();
        claim["payload"]["type"] = json!("claim");
        assert_eq!(
            decode(&encode(&claim)).unwrap_err(),
            "payload: payload.type \"claim\" is not a voucher, a deposit or a refund"
        );
        // An exact payload under a batch-settlement `accepted` is not one.
        let mut mixed = sample();
        mixed["accepted"]["scheme"] = json!("batch-settlement");
        assert_eq!(decode(&encode(&mixed)).unwrap_err(), "payload: type is missing");
        // Nor is a batch payment an exact one, nor a header's batch voucher
        // any other scheme's.
        assert!(decode(&encode(&sample())).unwrap().batch.is_none());
    }

    #[test]
    fn a_payment_decodes_with_its_payer_nonce_and_hash() {
        let p = decode(&encode(&sample())).unwrap();
        assert_eq!(p.payer, "0x70997970c51812dc3a010c7d01b50e0d17dc79c8");
        assert!(p.nonce.starts_with("0xdcae34"));
        assert_eq!(p.payment_id, None);
        let mut with_id = sample();
        with_id["extensions"] =
            json!({"payment-identifier": {"info": {"required": false, "id": "pay_0123456789abcdef"}}});
        let q = decode(&encode(&with_id)).unwrap();
        assert_eq!(q.payment_id.as_deref(), Some("pay_0123456789abcdef"));
        assert_eq!(p.hash, q.hash, "extensions are not part of what was signed");
        let mut reserialised = sample();
        reserialised["resource"] = Value::Null;
        reserialised["accepted"]["asset"] = json!("0x036cbd53842c5426634e7929541ec2318f3dcf7e");
        assert_eq!(decode(&encode(&reserialised)).unwrap().hash, p.hash, "nulls and spelling are not the payment");
        let mut other = sample();
        other["payload"]["authorization"]["value"] = json!("10001");
        assert_ne!(decode(&encode(&other)).unwrap().hash, p.hash);
    }

    #[test]
    fn malformed_payments_are_refused_with_a_reason() {
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut v = sample();
            f(&mut v);
            encode(&v)
        };
        let cases: Vec<(&str, String, &str)> = vec![
            ("empty", String::new(), "1 to"),
            ("not base64", "!!!".into(), "not base64"),
            ("not JSON", base64::engine::general_purpose::STANDARD.encode("nope"), "JSON"),
            ("version 1", edit(&|v| v["x402Version"] = json!(1)), "x402Version"),
            (
                "no payload",
                edit(&|v| {
                    v.as_object_mut().unwrap().remove("payload");
                }),
                "not an x402 v2 exact, upto or batch-settlement",
            ),
            ("short nonce", edit(&|v| v["payload"]["authorization"]["nonce"] = json!("0x12")), "nonce"),
            ("bad payer", edit(&|v| v["payload"]["authorization"]["from"] = json!("alice")), "addresses"),
            ("value", edit(&|v| v["payload"]["authorization"]["value"] = json!("-1")), "decimal"),
            ("signature", edit(&|v| v["payload"]["signature"] = json!("zz")), "signature"),
            (
                "payment id",
                edit(&|v| v["extensions"] = json!({"payment-identifier": {"info": {"id": "short"}}})),
                "payment-identifier",
            ),
        ];
        for (name, header, want) in cases {
            let err = decode(&header).expect_err(name);
            assert!(err.contains(want), "{name}: {err}");
        }
    }

    fn upto_sample() -> Value {
        json!({
            "x402Version": 2,
            "accepted": {
                "scheme": "upto", "network": "eip155:84532", "amount": "1000",
                "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 690,
                "extra": {"name": "USDC", "version": "2"}
            },
            "payload": {
                "signature": "0xabcd",
                "permit2Authorization": {
                    "from": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
                    "permitted": {"token": "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "amount": "1000"},
                    "spender": "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002",
                    "nonce": "123",
                    "deadline": "1796117988",
                    "witness": {
                        "to": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
                        "facilitator": "0x23618e81E3f5cdF7f54C3d65f7FBc0aBf5B21E8f",
                        "validAfter": "0"
                    }
                }
            }
        })
    }

    /// Every number of both schemes has one spelling: anything else is
    /// refused naming the field, so no two texts of one nonce (or amount,
    /// or deadline) are ever two payments.
    #[test]
    fn every_payment_number_is_canonical_decimal_or_refused_naming_its_field() {
        let max = "115792089237316195423570985008687907853269984665640564039457584007913129639935";
        let over = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
        let spellings: [(&str, &str, &str); 9] = [
            ("a leading zero", "0123", "leading zero"),
            ("a plus sign", "+123", "sign"),
            ("a minus sign", "-1", "sign"),
            ("a space before", " 123", "whitespace"),
            ("a newline after", "123\n", "whitespace"),
            ("hex", "0x7b", "hex"),
            ("an underscore", "1_23", "not a digit"),
            ("2^256", over, "larger than 2^256 - 1"),
            ("empty", "", "empty"),
        ];
        // A field's name, the sample it is in, and where.
        type Field = (&'static str, fn() -> Value, &'static str);
        let fields: [Field; 8] = [
            ("accepted.amount", sample, "/accepted/amount"),
            ("authorization.value", sample, "/payload/authorization/value"),
            ("authorization.validAfter", sample, "/payload/authorization/validAfter"),
            ("authorization.validBefore", sample, "/payload/authorization/validBefore"),
            ("permit2Authorization.permitted.amount", upto_sample, "/payload/permit2Authorization/permitted/amount"),
            ("permit2Authorization.nonce", upto_sample, "/payload/permit2Authorization/nonce"),
            ("permit2Authorization.deadline", upto_sample, "/payload/permit2Authorization/deadline"),
            (
                "permit2Authorization.witness.validAfter",
                upto_sample,
                "/payload/permit2Authorization/witness/validAfter",
            ),
        ];
        for (field, document, pointer) in fields {
            for (case, text, why) in spellings {
                let mut v = document();
                *v.pointer_mut(pointer).unwrap() = json!(text);
                let err = decode(&encode(&v)).expect_err(&format!("{field}, {case}"));
                assert!(err.starts_with(field) && err.contains(why), "{field}, {case}: {err}");
            }
            let mut v = document();
            *v.pointer_mut(pointer).unwrap() = json!(max);
            assert!(decode(&encode(&v)).is_ok(), "{field}: 2^256 - 1 is a uint256");
            *v.pointer_mut(pointer).unwrap() = json!("0");
            assert!(decode(&encode(&v)).is_ok(), "{field}: 0 is canonical");
        }
        let upto = decode(&encode(&upto_sample())).unwrap();
        assert_eq!((upto.nonce.as_str(), upto.valid_before.as_str()), ("123", "1796117988"));
        let mut zero = upto_sample();
        zero["payload"]["permit2Authorization"]["nonce"] = json!("0");
        assert_eq!(decode(&encode(&zero)).unwrap().nonce, "0");
    }

    /// `exact`'s nonce is 32 bytes of hex whatever its case, stored in one:
    /// upper and lower case are one authorization.
    #[test]
    fn an_exact_nonce_is_one_authorization_in_either_case() {
        let lower = decode(&encode(&sample())).unwrap();
        let mut upper = sample();
        let nonce =
            upper["payload"]["authorization"]["nonce"].as_str().unwrap().to_ascii_uppercase().replacen("0X", "0x", 1);
        upper["payload"]["authorization"]["nonce"] = json!(nonce);
        let upper = decode(&encode(&upper)).unwrap();
        assert_eq!(upper.nonce, lower.nonce);
        assert_eq!(lower.nonce, lower.nonce.to_ascii_lowercase());
        for (case, nonce) in [
            ("0X prefix", format!("0X{}", &nonce[2..])),
            ("63 digits", nonce[..65].to_owned()),
            ("65 digits", format!("{nonce}0")),
            ("decimal", "123".to_owned()),
        ] {
            let mut v = sample();
            v["payload"]["authorization"]["nonce"] = json!(nonce);
            let err = decode(&encode(&v)).expect_err(case);
            assert!(err.starts_with("authorization.nonce"), "{case}: {err}");
        }
    }

    #[test]
    fn accepted_must_equal_an_offer_field_for_field() {
        let offered = PaymentRequirements {
            scheme: "exact".into(),
            network: "eip155:84532".into(),
            amount: "10000".into(),
            asset: "0x036cbd53842c5426634e7929541ec2318f3dcf7e".into(),
            pay_to: "0x209693bc6afc0c5328ba36faf03c514ef312287c".into(),
            max_timeout_seconds: 300,
            extra: super::super::challenge::Extra {
                name: "USDC".into(),
                version: "2".into(),
                facilitator_address: None,
                receiver_authorizer: None,
                withdraw_delay: None,
                min_deposit: None,
                channel_state: None,
                voucher_state: None,
            },
        };
        assert!(decode(&encode(&sample())).unwrap().accepted.matches(&offered));
        for (field, value) in [
            ("scheme", json!("upto")),
            ("network", json!("eip155:8453")),
            ("amount", json!("9999")),
            ("asset", json!("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913")),
            ("payTo", json!("0x0000000000000000000000000000000000000001")),
            ("maxTimeoutSeconds", json!(301)),
        ] {
            let mut v = sample();
            v["accepted"][field] = value;
            assert!(!decode(&encode(&v)).unwrap().accepted.matches(&offered), "{field}");
        }
    }
}
