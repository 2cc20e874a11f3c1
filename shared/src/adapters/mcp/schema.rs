//! The schemas every tool's listing is made of: a task as the tools answer
//! it ([`task_schema`]), and an output schema that admits a tool error and,
//! for a priced tool, x402's `PaymentRequired` beside the result
//! ([`output_schema`]). The fixed tools ([`super::tool`]) and the kinds'
//! tools ([`super::kind`]) share them, so a task reads the same from either.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{Value, json};

use crate::domain::payments::PaymentRequired;
use crate::domain::tasks::Task;

/// A task as the tools answer it: [`Task`]'s own schema, standalone,
/// `result` as `result` describes it or `null` until the task completes, and
/// the relay's `events_url`.
pub fn task_schema(result: &Value) -> Value {
    let mut schema = standalone::<Task>();
    if !result.as_object().is_some_and(|o| o.is_empty()) {
        schema["properties"]["result"] = json!({ "anyOf": [result, { "type": "null" }] });
    }
    schema["properties"]["events_url"] =
        json!({ "type": "string", "description": "The relay's SSE stream of the task's events." });
    schema["required"].as_array_mut().expect("Task has required fields").push("events_url".into());
    schema
}

/// Whether a tool may answer x402's `PaymentRequired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priced {
    Yes,
    No,
}

/// A tool's `outputSchema`: what its `structuredContent` may hold. That is
/// its result, a tool error (`{"error": {"code", "message", …}}`, see
/// [`ToolFailure::into_result`]), and, for a priced tool, x402's
/// `PaymentRequired`, each a branch of `anyOf` with a title saying which.
///
/// Why the errors are in it: MCP clients check `structuredContent` against
/// `outputSchema`, and the official TypeScript SDK's `Client.callTool`
/// (`@modelcontextprotocol/sdk` 1.32) checks it on `isError` results too. A
/// schema of the result alone made that client throw `-32602 Structured
/// content does not match the tool's output schema` at every tool error and
/// at every payment request, so an agent built on it could neither read
/// what went wrong nor pay. Declaring no `outputSchema` would pass as well,
/// but it takes the typed result away from every client that checks it and
/// every model that reads it; with `anyOf`, a result still has to match its
/// own branch, so nothing is lost. The root stays `"type": "object"`, as
/// MCP requires of an output schema.
pub fn output_schema(result: Value, priced: Priced) -> Value {
    let mut result = result;
    result["title"] = json!("Result");
    let mut branches = vec![result, tool_error_schema()];
    if priced == Priced::Yes {
        let mut challenge = standalone::<PaymentRequired>();
        challenge["title"] = json!("Payment required (x402)");
        challenge["description"] = json!(
            "An unpaid call, or a refused payment: sign one of `accepts` with x402 and call the tool again with the \
             PaymentPayload in _meta[\"x402/payment\"]. `error` says which."
        );
        branches.push(challenge);
    }
    json!({ "type": "object", "anyOf": branches })
}

/// A tool error, as [`ToolFailure::into_result`] answers it.
fn tool_error_schema() -> Value {
    json!({
        "title": "Tool error",
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "code": { "type": "string", "description": "Stable: what went wrong, in snake_case." },
                    "message": { "type": "string", "description": "What went wrong and what to do, in words." }
                },
                "required": ["code", "message"]
            }
        },
        "required": ["error"]
    })
}

/// `T`'s own schema (the one the OpenAPI document has, so the two cannot
/// drift) with its references inlined: an output schema stands alone, an MCP
/// client has no components to resolve.
fn standalone<T: utoipa::ToSchema>() -> Value {
    let mut named = Vec::new();
    T::schemas(&mut named);
    let named: HashMap<String, Value> =
        named.into_iter().map(|(name, schema)| (format!("#/components/schemas/{name}"), to_json(&schema))).collect();
    let mut schema = to_json(&T::schema());
    inline_refs(&mut schema, &named);
    schema
}

fn to_json(schema: &utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>) -> Value {
    serde_json::to_value(schema).expect("a schema serialises")
}

/// Every `{"$ref": …}` in `schema` replaced by the schema it names.
fn inline_refs(schema: &mut Value, named: &HashMap<String, Value>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref") {
                let mut found =
                    named.get(target).unwrap_or_else(|| panic!("{target} is not among the schema's own")).clone();
                inline_refs(&mut found, named);
                *schema = found;
            } else {
                map.values_mut().for_each(|v| inline_refs(v, named));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| inline_refs(v, named)),
        _ => {}
    }
}

/// A schema as rmcp lists it: an object (a kind's schema that is not one,
/// which the catalog refuses, lists as `{}`).
pub fn object(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

/// The input of a tool that takes a Space ID and nothing else (`login`,
/// `rotate_space`), `description` saying which ID.
pub fn space_id_input(description: &str) -> Value {
    json!({
        "type": "object",
        "properties": { "space_id": { "type": "string", "pattern": "^[0-9]{20}$", "description": description } },
        "required": ["space_id"],
        "additionalProperties": false
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::mcp::failure::ToolFailure;
    use crate::domain::executors::{Digest, Executor};
    use crate::infra::json_schema::JsonSchema;

    /// A metered task's payment, charged.
    fn metered_payment() -> crate::domain::payments::MeteredPayment {
        crate::domain::payments::MeteredPayment {
            scheme: "upto".into(),
            status: crate::domain::payments::MeteredStatus::Charged,
            network: "eip155:84532".into(),
            asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into(),
            payer: "0x70997970c51812dc3a010c7d01b50e0d17dc79c8".into(),
            authorized: "100000".into(),
            unit: "KiB".into(),
            rate: "10".into(),
            used: Some(3),
            charged: Some("1".into()),
            transaction: Some(format!("0x{}", "ab".repeat(32))),
            reason: None,
        }
    }

    /// The outputSchema names every field a task tool answers with, no more,
    /// and stands alone: an MCP client has no components to resolve.
    #[test]
    fn the_task_schema_is_task_s_own_fields_and_events_url_with_no_references() {
        let now = time::OffsetDateTime::now_utc();
        let task = Task {
            id: crate::domain::ids::Id::new(),
            kind: "digest".into(),
            status: crate::domain::tasks::TaskStatus::Queued,
            progress: 0.0,
            result: None,
            error: None,
            attempts: 0,
            waiting: Some(json!({ "code": "running_per_space", "message": "waits", "limit": 1 })),
            payment: Some(metered_payment()),
            cancel_requested_at: None,
            created_at: now,
            updated_at: now,
        };
        let mut fields: Vec<String> =
            serde_json::to_value(&task).unwrap().as_object().unwrap().keys().cloned().collect();
        fields.push("events_url".into());
        fields.sort();
        let schema = task_schema(&json!({}));
        let mut properties: Vec<String> = schema["properties"].as_object().unwrap().keys().cloned().collect();
        properties.sort();
        assert_eq!(properties, fields);
        assert!(!schema.to_string().contains("$ref"), "{schema}");
        assert_eq!(
            schema["properties"]["status"]["enum"],
            json!(["queued", "running", "completed", "failed", "canceled"])
        );
        assert_eq!(schema["properties"]["id"]["type"], "string");
        let typed = task_schema(&json!({ "type": "object" }));
        assert_eq!(typed["properties"]["result"]["anyOf"][1], json!({ "type": "null" }));
    }

    /// Every answer a tool gives passes its outputSchema, as a client that
    /// checks `structuredContent` on errors too (the TypeScript SDK) sees it;
    /// and the schema still refuses what the tool never answers.
    #[test]
    fn a_tools_results_errors_and_payment_requests_all_pass_its_output_schema() {
        let now = time::OffsetDateTime::now_utc();
        let task = Task {
            id: crate::domain::ids::Id::new(),
            kind: "digest".into(),
            status: crate::domain::tasks::TaskStatus::Completed,
            progress: 1.0,
            result: Some(json!({ "sha256": "0".repeat(64), "size": 3 })),
            error: None,
            attempts: 1,
            waiting: None,
            payment: Some(metered_payment()),
            cancel_requested_at: None,
            created_at: now,
            updated_at: now,
        };
        // A task as the tools answer it (task.rs's view), written out: the
        // schemas import no tool.
        let mut view = serde_json::to_value(&task).unwrap();
        view["events_url"] = json!(format!("/v1/tasks/{}/events", task.id));
        let refused = ToolFailure::from(crate::domain::error::TaskRefusal::NotFound).into_result();
        let refused = refused.structured_content.unwrap();
        let challenge = json!({
            "x402Version": 2,
            "error": "payment_replayed",
            "resource": { "url": "mcp://tool/digest", "description": "d", "mimeType": "application/json" },
            "accepts": [{ "scheme": "exact", "network": "eip155:84532", "amount": "10000",
                "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
                "maxTimeoutSeconds": 300, "extra": { "name": "USDC", "version": "2" } }],
            "extensions": { "bazaar": {} }
        });
        let digest = Executor::from(Digest).output_schema();
        let priced = JsonSchema::compile_generated(&output_schema(task_schema(&digest), Priced::Yes)).unwrap();
        let free = JsonSchema::compile_generated(&output_schema(task_schema(&digest), Priced::No)).unwrap();
        for (what, answer) in [("the task", &view), ("a tool error", &refused), ("a payment request", &challenge)] {
            assert!(priced.is_valid(answer), "{what} fails a priced tool's schema: {answer}");
        }
        assert!(free.is_valid(&view) && free.is_valid(&refused));
        assert!(!free.is_valid(&challenge), "a free tool never asks for payment");
        let mut wrong = view.clone();
        wrong["result"]["sha256"] = json!("not hex");
        assert!(!priced.is_valid(&wrong), "a result still matches its own branch");
        assert!(!priced.is_valid(&json!({})));
        let schema = output_schema(task_schema(&digest), Priced::Yes);
        assert_eq!(schema["type"], "object", "MCP asks for an object schema at the root");
        assert!(!schema.to_string().contains("$ref"), "{schema}");
    }
}
