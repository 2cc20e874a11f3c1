//! x402's MCP transport (the tool-result binding): the payment arrives in
//! `params._meta["x402/payment"]`, the settlement leaves in the result's
//! `_meta["x402/payment-response"]`, and an unpaid call answers a tool error
//! whose structured content is the `PaymentRequired`. Everything between —
//! verify, settle before queueing, replay refusal, `payment-identifier`,
//! credits spent before asking — is the REST API's payment path, reached
//! through the same [`crate::domain::tasks::submit`].

use base64::Engine;
use serde_json::{Value, json};

use super::failure::ToolResult;
use crate::domain::payments::challenge::BAZAAR;
use crate::domain::payments::{PayError, PaymentRequired, PaymentResponse};

/// Where a request carries its payment.
pub const PAYMENT_META: &str = "x402/payment";
/// Where a result carries its settlement.
pub const PAYMENT_RESPONSE_META: &str = "x402/payment-response";

/// The challenge's `error` for a call without a payment.
pub const PAYMENT_REQUIRED: &str = "payment required: sign one of `accepts` with x402 and call the tool again with \
     the PaymentPayload in _meta[\"x402/payment\"]";

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

/// The `_meta` of a paid result.
pub fn response_meta(settlement: &PaymentResponse) -> Value {
    json!({ PAYMENT_RESPONSE_META: settlement })
}

/// The REST challenge made into the MCP one: the resource is the tool, an
/// unpaid call's `error` says where the payment goes, and the `bazaar`
/// discovery entry describes the tool (`type: "mcp"`) rather than the
/// route, so a facilitator's discovery list shows it as an MCP tool.
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
    challenge.resource.description = description.to_owned();
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
