//! The task tools: `get_task`, `list_tasks`, `cancel_task` and
//! `get_result` read and stop the Space's tasks (a kind's tool creates one:
//! [`super::kind`]).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use crate::domain::auth::SpaceIndex;
use crate::domain::error::TaskRefusal;
use crate::domain::ids::Id;
use crate::domain::tasks::{self, CancelOutcome, ListQuery, Task, TaskStatus};

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
