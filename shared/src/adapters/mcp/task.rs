//! The task tools: a kind's tool creates a task (one [`tasks::submit`],
//! exactly as `POST /v1/tasks/{kind}`), and `get_task`, `list_tasks`,
//! `cancel_task` and `get_result` read and stop the Space's tasks.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use super::payment;
use super::tools::WAIT_SECONDS;
use super::wait::{self, MAX_WAIT_SECONDS, Progress};
use crate::domain::auth::SpaceIndex;
use crate::domain::error::TaskRefusal;
use crate::domain::ids::Id;
use crate::domain::tasks::{
    self, CancelOutcome, ListQuery, Paid, Submission, SubmitContext, Task, TaskRequest, TaskStatus,
};

/// A task as every task tool answers it: the REST answer's fields
/// ([`Task`]), and where its events stream.
#[derive(Serialize)]
struct TaskView {
    #[serde(flatten)]
    task: Task,
    events_url: String,
}

pub fn view(task: Task) -> Value {
    let events_url = format!("/v1/tasks/{}/events", task.id);
    serde_json::to_value(TaskView { task, events_url }).expect("plain fields serialise")
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
/// `wait_seconds`.
pub struct KindCall<'a> {
    pub tool: &'a str,
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
    let KindCall { tool, kind, mut arguments, key } = call;
    let spec = ctx.catalog.task(kind).ok_or_else(|| ToolFailure::internal("a tool names no kind"))?;
    // A kind whose own input has a `wait_seconds` keeps it: its tool does not wait.
    let ours = spec.input_schema.pointer(&format!("/properties/{WAIT_SECONDS}")).is_none();
    let wait = if ours { wait_seconds(arguments.remove(WAIT_SECONDS))? } else { 0 };
    let input = Value::Object(arguments);
    let resource_url = payment::resource_url(tool);
    let cx = SubmitContext {
        catalog: &ctx.catalog,
        db: &ctx.db,
        s3: &ctx.aws.s3,
        bucket: &ctx.bucket,
        sqs: &ctx.aws.sqs,
        queue_url: &ctx.queue_url,
        facilitator: ctx.facilitator.as_ref(),
        chains: &ctx.chains,
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
                    // The tool as listed: its schema, and its description,
                    // which says the price (for a metered one, "up to").
                    let listed = ctx.tools.tool(tool);
                    let schema = listed.map(|t| Value::Object((*t.input_schema).clone()));
                    let description = listed.and_then(|t| t.description.as_deref()).unwrap_or(&spec.description);
                    let challenge =
                        payment::for_tool(*challenge, tool, &schema.unwrap_or_else(|| json!({})), description);
                    ToolFailure::Payment { code, challenge: Box::new(challenge) }
                }
                other => other,
            });
        }
    };
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

#[derive(Deserialize)]
pub struct TaskRef {
    task_id: String,
}

impl TaskRef {
    /// A malformed id names no task: the same answer as a missing one.
    fn id(&self) -> ToolResult<Id> {
        self.task_id.parse().map_err(|_| not_found())
    }
}

fn not_found() -> ToolFailure {
    ToolFailure::from(TaskRefusal::NotFound)
}

async fn find(ctx: &McpContext, space: &SpaceIndex, task: &TaskRef) -> ToolResult<Task> {
    let task = tasks::find_for_space(&ctx.db, space, task.id()?).await?.ok_or_else(not_found)?;
    Ok(ctx.links().present(space, task).await)
}

pub async fn get(ctx: &McpContext, space: &SpaceIndex, task: TaskRef) -> ToolResult<Value> {
    Ok(view(find(ctx, space, &task).await?))
}

pub async fn result(ctx: &McpContext, space: &SpaceIndex, task: TaskRef) -> ToolResult<Value> {
    let task = find(ctx, space, &task).await?;
    match task.status {
        TaskStatus::Completed => Ok(json!({ "task_id": task.id, "kind": task.kind, "result": task.result })),
        TaskStatus::Queued | TaskStatus::Running => Err(ToolFailure::with(
            "task_not_finished",
            format!("the task is {}; call again once it has ended, or follow it with get_task", task.status.as_str()),
            json!({ "task": view(task) }),
        )),
        TaskStatus::Failed | TaskStatus::Canceled => Err(ToolFailure::with(
            "task_not_completed",
            format!("the task ended {} and has no result", task.status.as_str()),
            json!({ "task": view(task) }),
        )),
    }
}

#[derive(Deserialize)]
pub struct ListArgs {
    status: Option<TaskStatus>,
    kind: Option<String>,
    limit: Option<u32>,
    after: Option<String>,
}

pub async fn list(ctx: &McpContext, space: &SpaceIndex, args: ListArgs) -> ToolResult<Value> {
    let after = match args.after {
        None => None,
        Some(after) => Some(
            after
                .parse::<Id>()
                .map_err(|_| ToolFailure::new("invalid_arguments", "after must be a task id (a page's `next`)"))?,
        ),
    };
    let limit = args.limit.unwrap_or(tasks::list::DEFAULT_LIMIT);
    let query = ListQuery { status: args.status, kind: args.kind.as_deref(), after, limit };
    let page = tasks::list(&ctx.db, space, query).await?;
    let tasks = ctx.links().present_all(space, page.tasks).await;
    Ok(json!({ "tasks": tasks.into_iter().map(view).collect::<Vec<_>>(), "next": page.next }))
}

pub async fn cancel(ctx: &McpContext, space: &SpaceIndex, task: TaskRef) -> ToolResult<Value> {
    let id = task.id()?;
    match tasks::cancel(&ctx.db, space, id).await?.ok_or_else(not_found)? {
        CancelOutcome::Canceled { task, events } => {
            tasks::events::publish_all_once(&ctx.redis, id, &events).await;
            tracing::info!(task_id = %id, "task canceled over MCP");
            Ok(view(task))
        }
        CancelOutcome::Requested { task, event } => {
            tasks::events::publish_all_once(&ctx.redis, id, event.as_slice()).await;
            tracing::info!(task_id = %id, "cancel requested of a running task over MCP");
            Ok(view(task))
        }
        CancelOutcome::Finished(task) => {
            let refusal = TaskRefusal::Finished(task.status.as_str());
            Err(ToolFailure::refused_saying(&refusal, refusal.to_string(), Some(json!({ "task": view(task) }))))
        }
    }
}
