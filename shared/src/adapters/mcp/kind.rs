//! The kinds' tools: one per catalog kind, made from the catalog when the
//! tool list is built ([`listed`]) and run by one [`tasks::submit`],
//! exactly as `POST /v1/tasks/{kind}` ([`run`]). A kind's tool takes the
//! kind's input itself, so an agent fills in the same fields as the REST
//! route's `input`, plus two optional arguments of its own, `wait_seconds`
//! and `webhook` (the REST create's `webhook`); its price is in its
//! description and in `_meta["reeve/price"]`.

use std::time::Duration;

use rmcp::model::{MetaObject, Tool};
use serde_json::{Map, Value, json};

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use super::payment;
use super::schema::{Priced, object, output_schema, task_schema};
use super::wait::{self, MAX_WAIT_SECONDS, Progress};
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::{Catalog, PublicPrice, PublicTask, TaskSpec};
use crate::domain::tasks::{self, Paid, Submission, SubmitContext, Task, TaskRequest};
use crate::domain::webhooks::{self, Subscription, WebhookRequest};

/// The arguments of a kind's tool that are not part of its input (unless
/// the kind's own input names a field so; then the tool does not take it).
pub const WAIT_SECONDS: &str = "wait_seconds";
pub const WEBHOOK: &str = "webhook";
/// The `_meta` key of a kind's price.
pub const PRICE_META: &str = "reeve/price";

/// The tool of the catalog's kind `task`, listed under `name`.
pub fn listed(catalog: &Catalog, task: &PublicTask, name: String) -> Tool {
    let spec = &catalog.tasks[&task.kind];
    let mut meta = MetaObject::new();
    meta.insert(PRICE_META.into(), json!({ "free": task.free, "prices": task.prices }));
    let priced = if task.free { Priced::No } else { Priced::Yes };
    let output = output_schema(task_schema(&spec.executor.output_schema()), priced);
    Tool::new(name, kind_description(task), object(kind_input_schema(&task.input_schema)))
        .with_title(task.title.clone())
        .with_raw_output_schema(object(output))
        .with_meta(meta)
}

/// What a kind's tool did: the task, and the `_meta` of the settlement when
/// this call paid (for a metered task, once it was charged).
pub struct Created {
    pub task: Task,
    pub settlement: Option<Value>,
}

/// How a kind's tool answers once its task is created.
pub enum Answer {
    /// With the task as it is after `wait_seconds` (none: at once), sending
    /// progress there if given.
    Wait(Option<Progress>),
    /// At once, whatever `wait_seconds` says: the tasks extension's handle.
    Handle,
}

/// A call of a kind's tool: `arguments` is the task's input, plus
/// `wait_seconds` and `webhook`.
pub struct KindCall<'a> {
    /// The tool as listed: its name, its schema and its description, which
    /// says the price (for a metered one, "up to"), as a payment request
    /// repeats them.
    pub listed: &'a Tool,
    pub kind: &'a str,
    pub arguments: Map<String, Value>,
    /// Its idempotency key ([`payment::identifier_key`]).
    pub key: Option<String>,
}

/// A kind's tool. `deadline` is the Lambda invocation's, which bounds the
/// payment as for the REST create.
pub async fn run(
    ctx: &McpContext,
    space: &SpaceIndex,
    call: KindCall<'_>,
    payment: Option<&str>,
    deadline: Option<tokio::time::Instant>,
    answer: Answer,
) -> ToolResult<Created> {
    let KindCall { listed, kind, mut arguments, key } = call;
    let tool = listed.name.as_ref();
    let spec = ctx.catalog.task(kind).ok_or_else(|| ToolFailure::internal("a tool names no kind"))?;
    // A kind whose own input has a `wait_seconds` (or `webhook`) keeps it:
    // its tool does not wait (or take a webhook).
    let ours = |name: &str| spec.input_schema.pointer(&format!("/properties/{name}")).is_none();
    let wait = if ours(WAIT_SECONDS) { wait_seconds(arguments.remove(WAIT_SECONDS))? } else { 0 };
    // Checked before the task is stored, as the REST create does: a refused
    // webhook stores (and charges) nothing.
    let webhook = match ours(WEBHOOK).then(|| arguments.remove(WEBHOOK)).flatten() {
        None | Some(Value::Null) => None,
        Some(value) => Some(webhook_argument(ctx, space, value).await?),
    };
    let input = Value::Object(arguments);
    let resource_url = payment::resource_url(tool);
    let cx = SubmitContext {
        catalog: &ctx.catalog,
        db: &ctx.db,
        s3: &ctx.aws.objects,
        bucket: &ctx.bucket,
        sqs: &ctx.aws.sqs,
        queue_url: &ctx.queue_url,
        facilitator: ctx.facilitator.as_ref(),
        chains: &ctx.chains,
        seller: ctx.seller.as_deref(),
    };
    let submission = Submission {
        request: TaskRequest { space, kind, input: &input, idempotency_key: key.as_deref() },
        payment: payment.map(crate::domain::payments::PaymentInput::Header),
        resource_url: &resource_url,
        deadline,
    };
    let submitted = match tasks::submit(&cx, submission).await {
        Ok(submitted) => submitted,
        Err(e) => {
            return Err(match ToolFailure::from(e) {
                ToolFailure::Payment { code, challenge } => {
                    let schema = Value::Object((*listed.input_schema).clone());
                    let description = listed.description.as_deref().unwrap_or(&spec.description);
                    let challenge = payment::for_tool(*challenge, tool, &schema, description);
                    ToolFailure::Payment { code, challenge: Box::new(challenge) }
                }
                other => other,
            });
        }
    };
    if let Some(webhook) = &webhook {
        // Stored, maybe already running: its end is delivered whichever
        // commits first (see `webhooks::subscribe_task`).
        webhooks::subscribe_task(&ctx.db, space, submitted.task.id, webhook).await?;
    }
    let settlement = match submitted.paid {
        Paid::Payment(settlement) => Some(payment::response_meta(&settlement)),
        Paid::Nothing | Paid::Credit(_) | Paid::Authorized => None,
    };
    let mut task = submitted.task;
    // The wait is measured from now, after the payment: settle and wait
    // together must fit the invocation, or the client gets no answer and
    // its retry of the same payment is a second charge's signature.
    let wait = wait::within(Duration::from_secs(wait), deadline);
    if let (Answer::Wait(progress), false) = (answer, wait.is_zero()) {
        let ended = wait::until_done(&ctx.db, space, task.id, wait, progress.as_ref()).await?;
        if let Some(ended) = ended {
            task = ended;
        }
    }
    // A metered call settles nothing at create: once its task has ended
    // within the wait and been charged, the result carries that settlement
    // (with the amount used, which a replay's stored receipt lacks), as
    // `tasks/get` does from the payment recorded.
    let settlement = task.payment.as_ref().and_then(payment::metered_response_meta).or(settlement);
    let task = ctx.links().present(space, task).await;
    Ok(Created { task, settlement })
}

/// A call's task input: its arguments without `wait_seconds` and `webhook`
/// (each unless the kind's own input names a field so), as [`run`] submits
/// it. What a pay link is made for.
pub fn task_input(spec: &TaskSpec, arguments: &Map<String, Value>) -> Value {
    let ours = |name: &str| spec.input_schema.pointer(&format!("/properties/{name}")).is_none();
    let mut input = arguments.clone();
    for name in [WAIT_SECONDS, WEBHOOK] {
        if ours(name) {
            input.remove(name);
        }
    }
    Value::Object(input)
}

fn wait_seconds(value: Option<Value>) -> ToolResult<u64> {
    match value {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n <= MAX_WAIT_SECONDS) => Ok(n.as_u64().unwrap_or(0)),
        Some(_) => Err(ToolFailure::new(
            "invalid_arguments",
            format!("{WAIT_SECONDS} must be a whole number of seconds from 0 to {MAX_WAIT_SECONDS}"),
        )),
    }
}

/// The `webhook` argument as a subscription the Space can sign: the REST
/// create's `invalid_webhook` and `webhook_secret_required`.
async fn webhook_argument(ctx: &McpContext, space: &SpaceIndex, value: Value) -> ToolResult<Subscription> {
    let request: WebhookRequest = serde_json::from_value(value).map_err(|_| {
        ToolFailure::new(
            "invalid_webhook",
            format!("{WEBHOOK} must be an https:// URL, or {{\"url\": \"https://…\", \"events\": [\"completed\", …]}}"),
        )
    })?;
    webhooks::check_for_task(&ctx.db, space, request.into()).await.map_err(|e| ToolFailure::refused(&e))
}

/// The kind's schema with `wait_seconds` and `webhook` added to its
/// properties (each unless the kind itself takes a field of that name).
fn kind_input_schema(input_schema: &Value) -> Value {
    let mut schema = input_schema.clone();
    let Some(object) = schema.as_object_mut() else {
        return schema;
    };
    let properties = object.entry("properties").or_insert_with(|| json!({}));
    if let Some(properties) = properties.as_object_mut()
        && !properties.contains_key(WEBHOOK)
    {
        properties.insert(
            WEBHOOK.into(),
            json!({
                "description": "Not part of the task's input. Where Reeve POSTs the task's view when it ends, signed \
                    per Standard Webhooks with the Space's secret (made with POST /v1/space/webhook-secret or `reeve \
                    space webhook-secret`): an https:// URL for every end, or {url, events} for some of completed, \
                    failed, canceled, and progress while it runs. Without it, the Space's default applies, if any.",
                "anyOf": [
                    { "type": "string", "maxLength": webhooks::MAX_URL_LEN },
                    {
                        "type": "object",
                        "properties": {
                            "url": { "type": "string", "maxLength": webhooks::MAX_URL_LEN },
                            "events": {
                                "type": "array",
                                "minItems": 1,
                                "items": { "enum": webhooks::SUBSCRIBABLE }
                            }
                        },
                        "required": ["url"]
                    }
                ]
            }),
        );
    }
    if let Some(properties) = object.get_mut("properties").and_then(Value::as_object_mut)
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
             (isError, with the x402 PaymentRequired); sign one and call again with it in _meta[\"x402/payment\"]. \
             A client that declares URL elicitation and not x402 is given a link instead, where a person pays in a \
             browser wallet; calling again then answers the task paid there.",
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The description and `_meta` of `kind`'s tool.
    fn shown(catalog: &Catalog, kind: &str) -> (String, Value) {
        let public = catalog.public().tasks.into_iter().find(|t| t.kind == kind);
        let tool = listed(catalog, &public.unwrap_or_else(|| panic!("no {kind} kind")), kind.to_owned());
        let meta = serde_json::to_value(tool.meta.as_ref().unwrap()).unwrap();
        (tool.description.as_deref().unwrap().to_owned(), meta)
    }

    /// A metered tool says what it may cost in the catalog's own words (the
    /// ceiling, the rate per unit, nothing for a failure) and when it is
    /// charged; a per-task one says its price on each network.
    #[test]
    fn a_metered_tool_says_up_to_its_ceiling_charged_per_unit_and_nothing_if_it_fails() {
        let catalog = Catalog::parse(PRICED).unwrap_or_else(|e| panic!("{e}"));

        let (description, meta) = shown(&catalog, "metered");
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

        let (description, _) = shown(&catalog, "priced");
        assert!(
            description.contains(
                "Price per task: on eip155:8453, 0.01 USD (10000 atomic units of usdc-base); or on eip155:84532, \
                 0.01 USD (10000 atomic units of usdc-base-sepolia)."
            ),
            "{description}"
        );
        assert!(!description.contains("up to") && !description.contains("Metered"), "{description}");
    }
}
