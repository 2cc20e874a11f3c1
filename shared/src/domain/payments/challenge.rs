//! The x402 v2 challenge of a priced task: what a client must pay, built
//! purely from the catalog.
//!
//! A priced task created without a `PAYMENT-SIGNATURE` header answers `402`
//! with this document twice: as the JSON body, and base64 (standard
//! alphabet) in the `PAYMENT-REQUIRED` header. There is one `accepts` entry
//! per `[[tasks.<kind>.accepts]]` of the catalog, in catalog order, and two
//! extensions: `payment-identifier` (a client's idempotency key for the
//! payment) and `bazaar` (the task's input schema, so agents browsing a
//! facilitator's discovery list can find and call it).
//!
//! These are Reeve's own types rather than `x402-types`': the OpenAPI
//! document needs their schemas (utoipa), and the crate would add
//! alloy-primitives to every Lambda for six string fields.

use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::catalog::{Catalog, Price, TaskSpec, price_summary};

pub const X402_VERSION: u32 = 2;

/// Response header carrying the base64 challenge.
pub const PAYMENT_REQUIRED_HEADER: &str = "payment-required";
/// Request header carrying the client's signed payment.
pub const PAYMENT_SIGNATURE_HEADER: &str = "payment-signature";

/// The `error` of a challenge sent to a request without a payment.
pub const SIGNATURE_REQUIRED: &str = "PAYMENT-SIGNATURE header is required";
/// Response header of a paid `202`: base64 JSON of the settlement.
pub const PAYMENT_RESPONSE_HEADER: &str = "payment-response";
/// The x402 extension a client names its payment with (an idempotency key).
pub const PAYMENT_IDENTIFIER: &str = "payment-identifier";
/// The x402 discovery extension.
pub const BAZAAR: &str = "bazaar";

/// The extension through which an `upto` payer that never approved Permit2
/// signs the token's EIP-2612 permit instead, and pays no gas.
pub const EIP2612_GAS_SPONSORING: &str = "eip2612GasSponsoring";

/// What an authorization must still have left after a metered task's
/// timeout, so the worker can settle what it used: the facilitator wants 6 s
/// left by its own clock, and a settle takes a few.
pub const UPTO_SETTLE_SECONDS: u32 = 30;
pub use crate::domain::catalog::METERED_MIN_QUEUE_SECONDS as UPTO_MIN_QUEUE_SECONDS;

/// `maxTimeoutSeconds` of a metered price: the queue wait (`[payments]
/// metered_queue_seconds`), the kind's timeout and the time to settle.
/// Standard clients sign `deadline = now + maxTimeoutSeconds`.
pub fn upto_timeout(queue_seconds: u32, task_timeout: u32) -> u32 {
    queue_seconds + task_timeout + UPTO_SETTLE_SECONDS
}

/// The body of a `402` and, base64-encoded, its `PAYMENT-REQUIRED` header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequired {
    /// Always `2`.
    pub x402_version: u32,
    /// Why payment is asked for.
    pub error: String,
    pub resource: Resource,
    pub accepts: Vec<PaymentRequirements>,
    /// `payment-identifier` and `bazaar`, each `{info, schema}`.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schema(value_type = Object)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
}

/// What is being paid for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = PaymentResource)]
pub struct Resource {
    pub url: String,
    pub description: String,
    pub mime_type: String,
}

/// One way to pay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequirements {
    /// `exact`: a fixed amount, paid with an EIP-3009 authorization before
    /// the task is queued. `upto`: a metered price; the payer signs
    /// `amount` as a ceiling through Permit2, and is charged what the task
    /// used when it ends, nothing if it fails. `batch-settlement`: a fixed
    /// amount, paid with a cumulative voucher on the payer's escrow channel
    /// (x402's batch-settlement scheme).
    pub scheme: String,
    /// CAIP-2, e.g. `eip155:8453`.
    pub network: String,
    /// Atomic units, as a decimal string (it may not fit a JSON number):
    /// the price, or for `upto` the ceiling.
    pub amount: String,
    /// The token contract.
    pub asset: String,
    pub pay_to: String,
    pub max_timeout_seconds: u32,
    /// The token's EIP-712 domain, which the client signs with.
    pub extra: Extra,
}

/// The token's EIP-712 domain; for `upto`, also the address that settles;
/// for `batch-settlement`, the terms of the channel a payer opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = PaymentExtra)]
pub struct Extra {
    pub name: String,
    pub version: String,
    /// `upto` only: the facilitator's address (from its `/supported`), which
    /// the payer names in its signed witness: no one else can settle it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facilitator_address: Option<String>,
    /// `batch-settlement` only: the address that authorizes Reeve's claims
    /// and refunds, which every channel to Reeve names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiver_authorizer: Option<String>,
    /// `batch-settlement` only: seconds a payer waits between asking to
    /// withdraw and withdrawing (the channel's `withdrawDelay`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdraw_delay: Option<u64>,
    /// `batch-settlement` only: the least a first deposit should hold
    /// (atomic units, a decimal string): [`BATCH_MIN_DEPOSIT_TASKS`] tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_deposit: Option<String>,
    /// `batch-settlement` only, in the `402` refusing a voucher: the
    /// payer's channel as Reeve keeps it (`channelId`, `balance`,
    /// `totalClaimed`, `withdrawRequestedAt`, `refundNonce`,
    /// `chargedCumulativeAmount`), from which the buyer signs its next
    /// voucher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub channel_state: Option<serde_json::Value>,
    /// `batch-settlement` only, beside `channelState`: the last voucher
    /// Reeve accepted on the channel (`signedMaxClaimable`, `signature`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub voucher_state: Option<serde_json::Value>,
}

/// How many tasks a batch-settlement deposit should pay for at least, as
/// `@x402/evm`'s server asks by default: fewer would spend the deposit's
/// transaction on too few tasks.
pub const BATCH_MIN_DEPOSIT_TASKS: u128 = 10;

/// The challenge for `task`, or `None` when it is free. `resource_url` is the
/// URL the client posted to; `error` says why payment is asked for (one of
/// [`SIGNATURE_REQUIRED`] or a payment error code).
///
/// The catalog was validated at load: a priced task implies `[payments]`
/// and every price names a known asset. Should either ever be missing, the
/// task is treated as not payable (`None`) and the problem logged, rather
/// than offering a challenge nobody could pay.
pub fn payment_required(
    catalog: &Catalog,
    task: &TaskSpec,
    resource_url: &str,
    error: &str,
) -> Option<PaymentRequired> {
    if task.is_free() {
        return None;
    }
    let Some(payments) = &catalog.payments else {
        tracing::error!("a priced task but no [payments] in the catalog");
        return None;
    };
    let mut accepts = Vec::with_capacity(task.accepts.len());
    for price in &task.accepts {
        let Some(asset) = catalog.assets.get(&price.asset) else {
            tracing::error!(asset = %price.asset, "a price names an unknown asset");
            return None;
        };
        let max_timeout_seconds = match price.meter {
            None => payments.max_timeout_seconds,
            Some(_) => upto_timeout(payments.metered_queue_seconds, task.timeout_seconds),
        };
        accepts.push(PaymentRequirements {
            scheme: price.scheme().to_owned(),
            network: asset.network.clone(),
            amount: price.amount.to_string(),
            asset: asset.contract.clone(),
            pay_to: payments.pay_to.clone(),
            max_timeout_seconds,
            // The facilitator's address comes from its `/supported`
            // (`supported::settleable`).
            extra: Extra {
                name: asset.name.clone(),
                version: asset.version.clone(),
                facilitator_address: None,
                receiver_authorizer: price.batch.then(|| payments.batch_receiver_authorizer.clone()).flatten(),
                withdraw_delay: price.batch.then_some(payments.batch_withdraw_delay_seconds),
                min_deposit: price.batch.then(|| price.amount.saturating_mul(BATCH_MIN_DEPOSIT_TASKS).to_string()),
                channel_state: None,
                voucher_state: None,
            },
        });
    }
    let description = match task.accepts.as_slice() {
        [price] if price.meter.is_some() => format!("{}: {}", task.title, price_summary(price)),
        _ => task.title.clone(),
    };
    Some(PaymentRequired {
        x402_version: X402_VERSION,
        error: error.to_owned(),
        resource: Resource { url: resource_url.to_owned(), description, mime_type: "application/json".to_owned() },
        accepts,
        extensions: extensions(catalog, task),
    })
}

/// The extensions Reeve honours, in the shape x402's SDKs declare them:
/// `payment-identifier`, `bazaar`, and for a metered task whose every
/// metered price is in a token with EIP-2612 `permit`,
/// `eip2612GasSponsoring` (the facilitator settles with the token's permit;
/// kept only if the facilitator lists it, see `supported::settleable`).
fn extensions(catalog: &Catalog, task: &TaskSpec) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::json;
    let mut map = serde_json::Map::new();
    let metered: Vec<&Price> = task.accepts.iter().filter(|price| price.meter.is_some()).collect();
    let permits = |price: &&Price| catalog.assets.get(&price.asset).is_some_and(|asset| asset.eip2612);
    if !metered.is_empty() && metered.iter().all(permits) {
        map.insert(
            EIP2612_GAS_SPONSORING.to_owned(),
            json!({
                "info": {
                    "description": "No Permit2 approval yet? Sign the token's EIP-2612 permit for Permit2 \
                                    instead: the facilitator applies it when it settles, and you pay no gas.",
                    "version": "1"
                },
                "schema": {}
            }),
        );
    }
    map.insert(
        PAYMENT_IDENTIFIER.to_owned(),
        json!({
            "info": { "required": false },
            "schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {
                    "required": { "type": "boolean" },
                    "id": { "type": "string", "minLength": 16, "maxLength": 128, "pattern": "^[a-zA-Z0-9_-]+$" }
                },
                "required": ["required"]
            }
        }),
    );
    let body_schema = json!({
        "type": "object",
        "properties": { "input": task.input_schema },
        "required": ["input"],
        "additionalProperties": false
    });
    map.insert(
        BAZAAR.to_owned(),
        json!({
            "info": {
                "input": { "type": "http", "method": "POST", "bodyType": "json", "body": { "input": {} } },
                "output": { "type": "json", "example": output_example(task) }
            },
            "schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {
                    "input": {
                        "type": "object",
                        "properties": {
                            "type": { "type": "string", "const": "http" },
                            "method": { "type": "string", "enum": ["POST"] },
                            "bodyType": { "type": "string", "enum": ["json"] },
                            "body": body_schema
                        },
                        "required": ["type", "method", "bodyType", "body"],
                        "additionalProperties": false
                    },
                    "output": {
                        "type": "object",
                        "properties": { "type": { "type": "string" }, "example": { "type": "object" } },
                        "required": ["type"]
                    }
                },
                "required": ["input"]
            }
        }),
    );
    map
}

/// What `POST /v1/tasks/{kind}` answers: the task is queued, and its result
/// arrives on the events stream.
fn output_example(task: &TaskSpec) -> serde_json::Value {
    let _ = task;
    serde_json::json!({
        "id": "01HZX3Y4P5Q6R7S8T9V0W1X2Y3",
        "status": "queued",
        "events_url": "/v1/tasks/01HZX3Y4P5Q6R7S8T9V0W1X2Y3/events"
    })
}

impl PaymentRequired {
    /// The JSON document, as sent in the body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain strings and numbers serialise")
    }

    /// The `PAYMENT-REQUIRED` header value: the same JSON, base64 with the
    /// standard alphabet and padding (always a valid header value).
    pub fn header_value(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.to_json())
    }

    /// Reads a `PAYMENT-REQUIRED` header back (clients and tests).
    pub fn from_header_value(value: &str) -> Option<PaymentRequired> {
        let bytes = base64::engine::general_purpose::STANDARD.decode(value.trim()).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const CATALOG: &str = r#"
        [payments]
        pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
        facilitator_url = "https://x402.org/facilitator"
        max_timeout_seconds = 120

        [assets.usdc-base]
        network = "eip155:8453"
        contract = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
        decimals = 6
        usd_peg = true
        name = "USD Coin"
        version = "2"

        [assets.big]
        network = "eip155:84532"
        contract = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
        decimals = 18
        name = "Big"
        version = "1"

        [tasks.priced]
        title = "A priced task"
        description = "d"
        executor = "fetch"
        input_schema = { type = "object" }

        [[tasks.priced.accepts]]
        asset = "usdc-base"
        amount_usd = "0.25"

        [[tasks.priced.accepts]]
        asset = "big"
        amount = "123456789012345678901234567890"

        [tasks.free]
        title = "Free"
        description = "d"
        executor = "digest"
        input_schema = { type = "object" }
    "#;

    fn catalog() -> Catalog {
        Catalog::parse(CATALOG).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_free_task_needs_no_payment() {
        let c = catalog();
        assert_eq!(payment_required(&c, c.task("free").unwrap(), "/v1/tasks/free", SIGNATURE_REQUIRED), None);
    }

    #[test]
    fn the_challenge_has_one_entry_per_price_in_catalog_order() {
        let c = catalog();
        let challenge =
            payment_required(&c, c.task("priced").unwrap(), "https://api.example/v1/tasks/priced", SIGNATURE_REQUIRED)
                .unwrap();
        let expected = json!({
            "x402Version": 2,
            "error": "PAYMENT-SIGNATURE header is required",
            "resource": {
                "url": "https://api.example/v1/tasks/priced",
                "description": "A priced task",
                "mimeType": "application/json"
            },
            "accepts": [
                {
                    "scheme": "exact",
                    "network": "eip155:8453",
                    "amount": "250000",
                    "asset": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
                    "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
                    "maxTimeoutSeconds": 120,
                    "extra": {"name": "USD Coin", "version": "2"}
                },
                {
                    "scheme": "exact",
                    "network": "eip155:84532",
                    "amount": "123456789012345678901234567890",
                    "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
                    "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
                    "maxTimeoutSeconds": 120,
                    "extra": {"name": "Big", "version": "1"}
                }
            ]
        });
        let mut body: serde_json::Value = serde_json::from_slice(&challenge.to_json()).unwrap();
        let extensions = body.as_object_mut().unwrap().remove("extensions").unwrap();
        assert_eq!(body, expected);
        assert_eq!(extensions["payment-identifier"]["info"], json!({"required": false}));
        let bazaar = &extensions["bazaar"];
        assert_eq!(bazaar["info"]["input"]["method"], "POST");
        assert_eq!(bazaar["info"]["input"]["bodyType"], "json");
        assert_eq!(
            bazaar["schema"]["properties"]["input"]["properties"]["body"]["properties"]["input"],
            json!({"type": "object"})
        );
        assert_eq!(bazaar["info"]["output"]["example"]["status"], "queued");
    }

    #[test]
    fn the_header_is_standard_base64_of_the_body() {
        let c = catalog();
        let challenge =
            payment_required(&c, c.task("priced").unwrap(), "/v1/tasks/priced", "payment_mismatch").unwrap();
        let header = challenge.header_value();
        assert!(axum::http::HeaderValue::from_str(&header).is_ok());
        let decoded = base64::engine::general_purpose::STANDARD.decode(&header).unwrap();
        assert_eq!(decoded, challenge.to_json());
        assert_eq!(PaymentRequired::from_header_value(&header), Some(challenge.clone()));
        assert_eq!(challenge.error, "payment_mismatch");
    }

    /// Gas sponsoring is offered for a metered price in a token with
    /// EIP-2612 `permit` (and kept only while the facilitator lists it:
    /// `supported`'s tests).
    #[test]
    fn gas_sponsoring_is_offered_where_the_token_has_a_permit() {
        let metered = |kind: &str, asset: &str| {
            format!(
                r#"
                [tasks.{kind}]
                title = "Metered"
                description = "d"
                executor = "fetch"
                input_schema = {{ type = "object" }}
                [[tasks.{kind}.accepts]]
                asset = "{asset}"
                scheme = "upto"
                unit = "MiB"
                rate = "10"
                amount = "1000"
                "#
            )
        };
        let text = format!(
            "{CATALOG}\n[assets.plain]\nnetwork = \"eip155:84532\"\ncontract = \"0x1111111111111111111111111111111111111111\"\n\
             decimals = 6\nname = \"Plain\"\nversion = \"1\"\neip2612 = false\n{}{}",
            metered("permitted", "usdc-base"),
            metered("plain", "plain")
        );
        let c = Catalog::parse(&text).unwrap_or_else(|e| panic!("{e}"));
        let offered =
            |kind: &str| payment_required(&c, c.task(kind).unwrap(), "/v1/tasks/x", SIGNATURE_REQUIRED).unwrap();
        assert!(offered("permitted").extensions.contains_key(EIP2612_GAS_SPONSORING));
        assert!(!offered("plain").extensions.contains_key(EIP2612_GAS_SPONSORING), "the token has no permit");
        assert!(!offered("priced").extensions.contains_key(EIP2612_GAS_SPONSORING), "exact prices need none");
    }

    #[test]
    fn both_shipped_catalogs_price_fetch_at_a_cent() {
        // reeve.toml on Base mainnet, reeve.dev.toml on the local chain.
        for (file, network) in [("reeve.toml", "eip155:8453"), ("reeve.dev.toml", "eip155:84532")] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
            let c = Catalog::load(&path).unwrap();
            let challenge =
                payment_required(&c, c.task("fetch").unwrap(), "/v1/tasks/fetch", SIGNATURE_REQUIRED).unwrap();
            let offers: Vec<(&str, &str)> =
                challenge.accepts.iter().map(|a| (a.network.as_str(), a.amount.as_str())).collect();
            assert_eq!(offers, [(network, "10000")], "{file}");
            assert!(challenge.accepts.iter().all(|a| a.scheme == "exact" && a.max_timeout_seconds == 300));
        }
    }
}
