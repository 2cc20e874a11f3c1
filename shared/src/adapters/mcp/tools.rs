//! The tools, built once from the catalog: one per task kind (its
//! `input_schema` as `inputSchema`, its price in the description and in
//! `_meta["reeve/price"]`), and the fixed tools around them.
//!
//! A kind's tool takes the kind's input itself, so an agent fills in the
//! same fields as `POST /v1/tasks/{kind}`'s `input`, plus one optional
//! `wait_seconds`. A kind named like a fixed tool is offered as
//! `task_<kind>`.
//!
//! Its last 196 lines are its unit tests.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{JsonObject, MetaObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::failure::{ToolFailure, ToolResult};
use super::wait::MAX_WAIT_SECONDS;
use crate::domain::catalog::{Catalog, PublicPrice, PublicTask};
use crate::domain::payments::PaymentRequired;
use crate::domain::tasks::Task;

/// The argument of a kind's tool that is not part of its input.
pub const WAIT_SECONDS: &str = "wait_seconds";
/// The `_meta` key of a kind's price.
pub const PRICE_META: &str = "reeve/price";

/// The tools that are not a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixed {
    CreateSpace,
    Login,
    CreateUpload,
    GetTask,
    ListTasks,
    CancelTask,
    GetResult,
}

impl Fixed {
    pub const ALL: [Fixed; 7] = [
        Fixed::CreateSpace,
        Fixed::Login,
        Fixed::CreateUpload,
        Fixed::GetTask,
        Fixed::ListTasks,
        Fixed::CancelTask,
        Fixed::GetResult,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fixed::CreateSpace => "create_space",
            Fixed::Login => "login",
            Fixed::CreateUpload => "create_upload",
            Fixed::GetTask => "get_task",
            Fixed::ListTasks => "list_tasks",
            Fixed::CancelTask => "cancel_task",
            Fixed::GetResult => "get_result",
        }
    }

    /// Whether the tool needs a session token (all but the two that give one).
    pub fn needs_session(self) -> bool {
        !matches!(self, Fixed::CreateSpace | Fixed::Login)
    }

    fn description(self, catalog: &Catalog) -> String {
        match self {
            Fixed::CreateSpace => "Create a Space: the account-free identity your tasks, uploads and payments belong \
                to. Answers a fresh 20-digit space_id, shown once (keep it: it is the only way back in), and a \
                session token for it. Send the token as `Authorization: Bearer <token>` on every other call."
                .into(),
            Fixed::Login => "Open a session on a Space: trade its space_id for a session token (valid 15 minutes), \
                sent as `Authorization: Bearer <token>`. Call it again when a tool says the token expired."
                .into(),
            Fixed::CreateUpload => {
                let uploads = &catalog.uploads;
                format!(
                    "Upload an input file. Either inline: content_base64 holds the file (at most {} bytes decoded), \
                     and it is stored at once; or declare size and get a presigned URL to PUT the bytes to, sending \
                     exactly the headers given (any size up to {} bytes). Answers an upload_id to name in a task's \
                     input. content_type is one of: {}.",
                    super::MAX_INLINE_BYTES.min(uploads.max_bytes as usize),
                    uploads.max_bytes,
                    uploads.content_types.join(", "),
                )
            }
            Fixed::GetTask => "A task as it is now: status, progress (0 to 1), and its result or error once it \
                has ended."
                .into(),
            Fixed::ListTasks => "This Space's tasks, newest first, a page at a time: pass the answer's `next` \
                as `after` for the next page."
                .into(),
            Fixed::CancelTask => "Cancel a task. A queued task is canceled at once; a running one is asked to \
                stop and ends canceled within a second (see get_task). A paid task canceled before it ran leaves \
                a credit that pays for the next task of the same price."
                .into(),
            Fixed::GetResult => "The result of a completed task. A task that failed or was canceled answers its \
                error; one still queued or running answers task_not_finished (call again, or get_task)."
                .into(),
        }
    }

    fn input_schema(self) -> Value {
        let task_id = json!({ "type": "string", "minLength": 26, "maxLength": 26,
            "description": "The task id, from a task tool or list_tasks." });
        match self {
            Fixed::CreateSpace => json!({ "type": "object", "properties": {}, "additionalProperties": false }),
            Fixed::Login => json!({
                "type": "object",
                "properties": { "space_id": { "type": "string", "pattern": "^[0-9]{20}$",
                    "description": "The 20-digit Space ID from create_space." } },
                "required": ["space_id"],
                "additionalProperties": false
            }),
            Fixed::CreateUpload => json!({
                "type": "object",
                "properties": {
                    "filename": { "type": "string", "minLength": 1, "maxLength": 255 },
                    "content_type": { "type": "string" },
                    "content_base64": { "type": "string",
                        "description": "The file itself, base64 (standard alphabet): an inline upload." },
                    "size": { "type": "integer", "minimum": 1,
                        "description": "The exact size in bytes: a presigned upload (PUT the bytes yourself)." }
                },
                "required": ["filename", "content_type"],
                "additionalProperties": false
            }),
            Fixed::GetTask | Fixed::CancelTask | Fixed::GetResult => json!({
                "type": "object",
                "properties": { "task_id": task_id },
                "required": ["task_id"],
                "additionalProperties": false
            }),
            Fixed::ListTasks => json!({
                "type": "object",
                "properties": {
                    "status": { "type": "string", "enum": ["queued", "running", "completed", "failed", "canceled"] },
                    "kind": { "type": "string" },
                    "limit": { "type": "integer", "minimum": 1, "maximum": crate::domain::tasks::list::MAX_LIMIT,
                        "description": "Tasks per page (default 20)." },
                    "after": { "type": "string", "description": "The `next` of the previous page." }
                },
                "additionalProperties": false
            }),
        }
    }

    fn output_schema(self) -> Value {
        let string = json!({ "type": "string" });
        match self {
            Fixed::CreateSpace => json!({
                "type": "object",
                "properties": { "space_id": string, "token": string, "token_type": string,
                    "expires_at": string, "created_at": string },
                "required": ["space_id", "token", "token_type", "expires_at", "created_at"]
            }),
            Fixed::Login => json!({
                "type": "object",
                "properties": { "token": string, "token_type": string, "expires_at": string },
                "required": ["token", "token_type", "expires_at"]
            }),
            Fixed::CreateUpload => json!({
                "type": "object",
                "properties": {
                    "upload_id": string,
                    "uploaded": { "type": "boolean", "description": "True for an inline upload: it is stored." },
                    "size": { "type": "integer" },
                    "url": string,
                    "method": string,
                    "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                    "expires_at": string
                },
                "required": ["upload_id", "uploaded", "size"]
            }),
            Fixed::GetTask | Fixed::CancelTask => task_schema(&json!({})),
            Fixed::ListTasks => json!({
                "type": "object",
                "properties": {
                    "tasks": { "type": "array", "items": task_schema(&json!({})) },
                    "next": { "type": ["string", "null"] }
                },
                "required": ["tasks", "next"]
            }),
            Fixed::GetResult => json!({
                "type": "object",
                "properties": { "task_id": string, "kind": string, "result": {} },
                "required": ["task_id", "kind", "result"]
            }),
        }
    }
}

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

/// What a tool name names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named<'a> {
    Fixed(Fixed),
    /// A task kind, by its catalog name.
    Kind(&'a str),
}

pub struct Tools {
    list: Vec<Tool>,
    /// Tool name → kind.
    kinds: HashMap<String, String>,
    fixed: HashMap<&'static str, (Fixed, Arc<jsonschema::Validator>)>,
}

impl Tools {
    pub fn new(catalog: &Catalog) -> Tools {
        let mut list = Vec::new();
        let mut fixed = HashMap::new();
        for tool in Fixed::ALL {
            let schema = tool.input_schema();
            let validator = jsonschema::validator_for(&schema).expect("the fixed schemas are valid");
            fixed.insert(tool.name(), (tool, Arc::new(validator)));
            let annotations = match tool {
                Fixed::GetTask | Fixed::ListTasks | Fixed::GetResult => ToolAnnotations::new().read_only(true),
                _ => ToolAnnotations::new().read_only(false),
            };
            list.push(
                Tool::new(tool.name(), tool.description(catalog), object(schema))
                    .with_raw_output_schema(object(output_schema(tool.output_schema(), Priced::No)))
                    .with_annotations(annotations),
            );
        }
        let mut kinds = HashMap::new();
        for task in catalog.public().tasks {
            let name =
                if fixed.contains_key(task.kind.as_str()) { format!("task_{}", task.kind) } else { task.kind.clone() };
            let spec = &catalog.tasks[&task.kind];
            let mut meta = MetaObject::new();
            meta.insert(PRICE_META.into(), json!({ "free": task.free, "prices": task.prices }));
            let priced = if task.free { Priced::No } else { Priced::Yes };
            let output = output_schema(task_schema(&spec.executor.output_schema()), priced);
            list.push(
                Tool::new(name.clone(), kind_description(&task), object(kind_input_schema(&task.input_schema)))
                    .with_title(task.title.clone())
                    .with_raw_output_schema(object(output))
                    .with_meta(meta),
            );
            kinds.insert(name, task.kind);
        }
        Tools { list, kinds, fixed }
    }

    pub fn list(&self) -> &[Tool] {
        &self.list
    }

    pub fn find(&self, name: &str) -> Option<Named<'_>> {
        if let Some((tool, _)) = self.fixed.get(name) {
            return Some(Named::Fixed(*tool));
        }
        self.kinds.get(name).map(|kind| Named::Kind(kind))
    }

    /// The tool as listed (for its input schema in a discovery entry).
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.list.iter().find(|t| t.name == name)
    }

    /// Checks a fixed tool's arguments against its input schema, with each
    /// violation and its JSON pointer in the message, as `invalid_input` is.
    pub fn check(&self, tool: Fixed, arguments: &Value) -> ToolResult<()> {
        let (_, validator) = &self.fixed[tool.name()];
        let violations: Vec<String> = validator
            .iter_errors(arguments)
            .take(10)
            .map(|e| {
                let at = e.instance_path().as_str().to_owned();
                format!("{}: {}", if at.is_empty() { "(root)" } else { &at }, e.masked())
            })
            .collect();
        if violations.is_empty() {
            return Ok(());
        }
        Err(ToolFailure::new("invalid_arguments", format!("{} arguments: {}", tool.name(), violations.join("; "))))
    }
}

/// The kind's schema with `wait_seconds` added to its properties (unless
/// the kind itself takes a field of that name).
fn kind_input_schema(input_schema: &Value) -> Value {
    let mut schema = input_schema.clone();
    let Some(object) = schema.as_object_mut() else {
        return schema;
    };
    let properties = object.entry("properties").or_insert_with(|| json!({}));
    if let Some(properties) = properties.as_object_mut()
        && !properties.contains_key(WAIT_SECONDS)
    {
        properties.insert(
            WAIT_SECONDS.into(),
            json!({
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_WAIT_SECONDS,
                "description": format!(
                    "Not part of the task's input. 0 (the default) answers at once with the queued task; up to \
                     {MAX_WAIT_SECONDS} waits for it to end and answers its result if it ends in time."
                )
            }),
        );
    }
    schema
}

fn kind_description(task: &PublicTask) -> String {
    let price = if task.free {
        "Free.".to_owned()
    } else {
        let prices: Vec<String> = task.prices.iter().map(price_text).collect();
        // The catalog keeps a kind's prices all exact or all upto.
        let metered = task.prices.iter().any(|p| p.scheme == "upto");
        let (lead, when) = if metered {
            (
                "Metered price",
                " The payment authorizes the ceiling when the tool is called and is settled for what the task \
                 used when it ends; the task's `payment` shows what was charged, and in which transaction.",
            )
        } else {
            ("Price per task", "")
        };
        format!(
            "{lead}: {}.{when} Paid with x402: called without a payment it answers the payment requirements \
             (isError, with the x402 PaymentRequired); sign one and call again with it in _meta[\"x402/payment\"].",
            prices.join("; or ")
        )
    };
    format!(
        "{}: {} {price} Answers the task (id, status, events_url) at once, or, with wait_seconds, its result when \
         it ends in time; follow it with get_task otherwise.",
        task.title,
        task.description.trim_end_matches('.').to_owned() + "."
    )
}

/// A price as the catalog says it in words (`summary`: the amount, or for a
/// metered price the ceiling, the rate and that a failure costs nothing),
/// after the network it is paid on: the summary names the asset by its
/// catalog id only.
fn price_text(price: &PublicPrice) -> String {
    let network = price.network.as_deref().unwrap_or("an unknown network");
    format!("on {network}, {}", price.summary)
}

fn object(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        // A kind's schema that is not an object (the catalog refuses those).
        _ => Arc::new(JsonObject::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::executors::{Digest, Executor};

    /// A kind paid per task on two networks, and a fetch metered per KiB.
    const PRICED: &str = r#"
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

        [assets.usdc-base-sepolia]
        network = "eip155:84532"
        contract = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
        decimals = 6
        usd_peg = true
        name = "USDC"
        version = "2"

        [tasks.priced]
        title = "Priced"
        description = "Hashes a file."
        executor = "digest"
        input_schema = { type = "object" }
        [[tasks.priced.accepts]]
        asset = "usdc-base"
        amount_usd = "0.01"
        [[tasks.priced.accepts]]
        asset = "usdc-base-sepolia"
        amount_usd = "0.01"

        [tasks.metered]
        title = "Metered fetch"
        description = "Fetches a URL"
        executor = "fetch"
        input_schema = { type = "object" }
        [[tasks.metered.accepts]]
        asset = "usdc-base-sepolia"
        scheme = "upto"
        unit = "MiB"
        rate_usd = "0.001"
        amount_usd = "0.10"
    "#;

    fn listed(tools: &Tools, name: &str) -> (String, Value) {
        let tool = tools.tool(name).unwrap_or_else(|| panic!("no {name} tool"));
        let meta = serde_json::to_value(tool.meta.as_ref().unwrap()).unwrap();
        (tool.description.as_deref().unwrap().to_owned(), meta)
    }

    /// A metered tool says what it may cost in the catalog's own words (the
    /// ceiling, the rate per unit, nothing for a failure) and when it is
    /// charged; a per-task one says its price on each network.
    #[test]
    fn a_metered_tool_says_up_to_its_ceiling_charged_per_unit_and_nothing_if_it_fails() {
        let catalog = Catalog::parse(PRICED).unwrap_or_else(|e| panic!("{e}"));
        let tools = Tools::new(&catalog);

        let (description, meta) = listed(&tools, "metered");
        let summary = "up to 0.10 USD (100000 atomic units of usdc-base-sepolia), charged 0.001 USD per MiB used; \
                       nothing if the task fails";
        assert!(description.contains(&format!("Metered price: on eip155:84532, {summary}.")), "{description}");
        assert!(description.contains("settled for what the task used when it ends"), "{description}");
        assert!(!description.contains("Price per task"), "{description}");
        let price = &meta[PRICE_META]["prices"][0];
        assert_eq!(
            (&price["scheme"], &price["unit"], &price["rate_usd"], &price["amount"], &price["summary"]),
            (&json!("upto"), &json!("MiB"), &json!("0.001"), &json!("100000"), &json!(summary)),
            "{meta}"
        );
        assert_eq!(meta[PRICE_META]["free"], false);

        let (description, _) = listed(&tools, "priced");
        assert!(
            description.contains(
                "Price per task: on eip155:8453, 0.01 USD (10000 atomic units of usdc-base); or on eip155:84532, \
                 0.01 USD (10000 atomic units of usdc-base-sepolia)."
            ),
            "{description}"
        );
        assert!(!description.contains("up to") && !description.contains("Metered"), "{description}");
    }

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
            payment: Some(metered_payment()),
            cancel_requested_at: None,
            created_at: now,
            updated_at: now,
        };
        // A task as the tools answer it (task.rs's view), written out: the
        // tool list does not import the tools.
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
        let priced = jsonschema::validator_for(&output_schema(task_schema(&digest), Priced::Yes)).unwrap();
        let free = jsonschema::validator_for(&output_schema(task_schema(&digest), Priced::No)).unwrap();
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
