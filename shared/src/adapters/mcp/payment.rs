//! x402's MCP transport (the tool-result binding): the payment arrives in
//! `params._meta["x402/payment"]`, the settlement leaves in the result's
//! `_meta["x402/payment-response"]`, and an unpaid call answers a tool error
//! whose structured content is the `PaymentRequired`. Everything between —
//! verify, settle before queueing, replay refusal, credits spent before
//! asking — is the REST API's payment path, reached through the same
//! [`crate::domain::tasks::submit`]. A payment's `payment-identifier` id is
//! the call's idempotency key ([`identifier_key`]), as `Idempotency-Key` is
//! a REST create's.
//!
//! A metered tool (x402's `upto`) is only authorized by the call, so its
//! settlement exists once the task has ended and been charged: a call that
//! waited that long, and `tasks/get` after, carry it, with the `amount`
//! used; until then the task's `payment` says where it is.

use base64::Engine;
use serde_json::{Value, json};

use super::failure::ToolResult;
use crate::domain::payments::challenge::BAZAAR;
use crate::domain::payments::payload::{PAYMENT_IDENTIFIER_RULE, payment_identifier};
use crate::domain::payments::{
    MeteredPayment, MeteredStatus, PayError, PaymentInput, PaymentRequired, PaymentResponse,
};

/// Where a request carries its payment.
pub const PAYMENT_META: &str = "x402/payment";
/// Where a result carries its settlement.
pub const PAYMENT_RESPONSE_META: &str = "x402/payment-response";

/// The challenge's `error` for a call without a payment.
/// It names both ways to pay: x402, and a person paying a pay link in a
/// browser, which a client gets by declaring URL elicitation.
pub const PAYMENT_REQUIRED: &str = "payment required: sign one of `accepts` with x402 and call the tool again with \
     the PaymentPayload in _meta[\"x402/payment\"]; or, from a client that declares URL elicitation \
     (capabilities.elicitation.url), call it again without a payment for a link where a person pays in a browser \
     wallet";

/// The payment of a call, as the text the REST path takes (the base64 of
/// the payment's JSON, as in `PAYMENT-SIGNATURE`). The spec sends the
/// `PaymentPayload` object; Cloudflare's client sends it base64-encoded:
/// both are accepted. Anything else is `invalid_payment`, before anything
/// is charged.
pub fn from_meta(meta: Option<&Value>) -> ToolResult<Option<String>> {
    match meta {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(encoded)) => Ok(Some(encoded.trim().to_owned())),
        Some(document @ Value::Object(_)) => {
            Ok(Some(base64::engine::general_purpose::STANDARD.encode(document.to_string())))
        }
        Some(_) => {
            Err(PayError::Malformed("the payment is neither a PaymentPayload object nor its base64".into()).into())
        }
    }
}

/// What a call's `payment-identifier` id is stored as: the call's
/// idempotency key, in a namespace of its own so that it never meets a key
/// a REST client chose (`Idempotency-Key`) in the same Space.
pub const IDENTIFIER_KEY_PREFIX: &str = "x402-payment-identifier:";

/// Where a call names the `payment-identifier` id it is sent again under
/// without a payment: Reeve's own `_meta` key, since x402 carries the id
/// only inside a payment. An agent whose paid call was answered
/// `payment_pending` calls again with no payment and this id: it gets the
/// task once the payment is resolved, waits meanwhile, and no credit of its
/// Space pays for the call while that payment may still charge.
pub const IDENTIFIER_META: &str = "reeve/payment-identifier";

/// The idempotency key of a call: the x402 `payment-identifier` id its
/// payment carries, or else the id it names in `_meta["reeve/payment-identifier"]`
/// ([`IDENTIFIER_META`]). MCP has no `Idempotency-Key` header, and x402's
/// clients sign afresh each time they are asked to pay, keeping the id: so
/// the id is what makes a call sent again (with the same payment, a new
/// one, or none) answer the task it bought, with one charge, or wait while
/// its payment is pending; and a credit never pays under a key whose
/// payment is pending. All of that is the REST `Idempotency-Key`'s path
/// through [`crate::domain::tasks::submit`]; this only names the key. A
/// payment that does not decode carries none: `submit` refuses it
/// `invalid_payment`.
pub fn identifier_key(payment: Option<&str>, named: Option<&Value>) -> ToolResult<Option<String>> {
    let carried = payment.and_then(|p| PaymentInput::Header(p).decode().ok()).and_then(|p| p.payment_id);
    let id = match (carried, named) {
        (Some(id), _) => Some(id),
        (None, None | Some(Value::Null)) => None,
        (None, Some(Value::String(id))) if payment_identifier(id) => Some(id.clone()),
        (None, Some(_)) => {
            let why = format!("_meta[\"{IDENTIFIER_META}\"]: {PAYMENT_IDENTIFIER_RULE}");
            return Err(PayError::Malformed(why).into());
        }
    };
    Ok(id.map(|id| format!("{IDENTIFIER_KEY_PREFIX}{id}")))
}

/// The `_meta` of a paid result.
pub fn response_meta(settlement: &PaymentResponse) -> Value {
    json!({ PAYMENT_RESPONSE_META: settlement })
}

/// The `_meta` of a metered task's result once its capture went through:
/// x402's settle response with the `amount` settled (what the task used,
/// not the ceiling signed). `None` until then (authorized, capturing) and
/// when nothing was charged: a metered call settles nothing at create, so
/// only a call that waited for its task to end has a settlement to show.
pub fn metered_response_meta(payment: &MeteredPayment) -> Option<Value> {
    if payment.status != MeteredStatus::Charged {
        return None;
    }
    let settled = PaymentResponse::settled(payment.transaction.as_deref(), &payment.network, &payment.payer);
    let mut meta = response_meta(&settled);
    meta[PAYMENT_RESPONSE_META]["amount"] = json!(payment.charged.as_deref().unwrap_or("0"));
    Some(meta)
}

/// The REST challenge made into the MCP one: the resource is the tool, an
/// unpaid call's `error` says where the payment goes, and the `bazaar`
/// discovery entry describes the tool (`type: "mcp"`) rather than the
/// route, so a facilitator's discovery list shows it as an MCP tool, with
/// `description` the tool's own as listed (its price in words). The
/// resource's description stays the REST one: for a metered task it says
/// "up to X, charged per unit", what the payer is asked to sign for.
pub fn for_tool(
    mut challenge: PaymentRequired,
    tool: &str,
    input_schema: &Value,
    description: &str,
) -> PaymentRequired {
    if challenge.error == crate::domain::payments::SIGNATURE_REQUIRED {
        challenge.error = PAYMENT_REQUIRED.to_owned();
    }
    challenge.resource.url = resource_url(tool);
    challenge.extensions.insert(BAZAAR.to_owned(), bazaar(tool, input_schema, description));
    challenge
}

/// The resource a tool's payment pays for.
pub fn resource_url(tool: &str) -> String {
    format!("mcp://tool/{tool}")
}

/// x402's bazaar entry for an MCP tool, in the shape its SDKs declare one.
fn bazaar(tool: &str, input_schema: &Value, description: &str) -> Value {
    json!({
        "info": {
            "input": {
                "type": "mcp",
                "toolName": tool,
                "description": description,
                "transport": "streamable-http",
                "inputSchema": input_schema,
            },
            "output": {
                "type": "json",
                "example": {
                    "id": "01HZX3Y4P5Q6R7S8T9V0W1X2Y3",
                    "kind": tool,
                    "status": "queued",
                    "progress": 0.0,
                    "result": null,
                    "error": null,
                    "events_url": "/v1/tasks/01HZX3Y4P5Q6R7S8T9V0W1X2Y3/events"
                }
            }
        },
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "input": {
                    "type": "object",
                    "properties": {
                        "type": { "type": "string", "const": "mcp" },
                        "toolName": { "type": "string" },
                        "description": { "type": "string" },
                        "transport": { "type": "string", "enum": ["streamable-http"] },
                        "inputSchema": { "type": "object" }
                    },
                    "required": ["type", "toolName", "inputSchema"],
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::payments::challenge::Resource;

    fn metered(status: MeteredStatus, charged: Option<&str>, transaction: Option<&str>) -> MeteredPayment {
        MeteredPayment {
            scheme: "upto".into(),
            status,
            network: "eip155:84532".into(),
            asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into(),
            payer: "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".into(),
            authorized: "1000".into(),
            unit: "KiB".into(),
            rate: "7".into(),
            used: charged.map(|_| 6 * 1024),
            charged: charged.map(str::to_owned),
            transaction: transaction.map(str::to_owned),
            reason: None,
        }
    }

    /// Once charged, a metered result carries x402's settle response with
    /// what was settled (what the task used), not the ceiling signed; before
    /// that, and when nothing was charged, there is no settlement to show.
    #[test]
    fn a_metered_task_shows_a_settlement_of_what_it_used_only_once_charged() {
        let transaction = format!("0x{}", "ab".repeat(32));
        let charged = metered(MeteredStatus::Charged, Some("42"), Some(&transaction));
        let meta = metered_response_meta(&charged).expect("charged");
        assert_eq!(
            meta,
            json!({ PAYMENT_RESPONSE_META: {
                "success": true,
                "transaction": transaction,
                "network": "eip155:84532",
                "payer": "0x70997970c51812dc3a010c7d01b50e0d17dc79c8",
                "amount": "42"
            }})
        );
        for status in
            [MeteredStatus::Authorized, MeteredStatus::Capturing, MeteredStatus::Released, MeteredStatus::NotCaptured]
        {
            assert_eq!(metered_response_meta(&metered(status, None, None)), None, "{status:?}");
        }
    }

    /// The MCP challenge keeps the REST resource's description (for a
    /// metered task, "up to …"), names the tool, and its discovery entry
    /// describes the tool as listed.
    #[test]
    fn the_tools_challenge_keeps_the_price_in_words_and_describes_the_tool_as_listed() {
        let rest = PaymentRequired {
            x402_version: 2,
            error: crate::domain::payments::SIGNATURE_REQUIRED.to_owned(),
            resource: Resource {
                url: "https://api.example/v1/tasks/metered".into(),
                description: "Metered fetch: up to 1000 atomic units of local, charged 7 atomic units per KiB used; \
                              nothing if the task fails"
                    .into(),
                mime_type: "application/json".into(),
            },
            accepts: Vec::new(),
            extensions: serde_json::Map::new(),
        };
        let schema = json!({ "type": "object", "required": ["url"] });
        let challenge = for_tool(rest.clone(), "metered", &schema, "Metered fetch: Fetches a URL. Metered price: …");
        assert_eq!(challenge.error, PAYMENT_REQUIRED);
        assert_eq!(challenge.resource.url, "mcp://tool/metered");
        assert_eq!(challenge.resource.description, rest.resource.description);
        let input = &challenge.extensions[BAZAAR]["info"]["input"];
        assert_eq!(
            (&input["type"], &input["toolName"], &input["description"], &input["inputSchema"]),
            (&json!("mcp"), &json!("metered"), &json!("Metered fetch: Fetches a URL. Metered price: …"), &schema)
        );
    }
}
