//! `get_result`: the result of a completed task, as
//! `GET /v1/tasks/{id}/result` answers it.

use serde_json::{Value, json};

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::{ToolFailure, ToolResult};
use crate::adapters::mcp::task::{TaskRef, find, task_ref_schema, view};
use crate::adapters::mcp::tool::FixedTool;
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::Catalog;
use crate::domain::tasks::TaskStatus;

pub struct GetResult;

impl FixedTool for GetResult {
    const NAME: &'static str = "get_result";
    const READ_ONLY: bool = true;
    type Caller = SpaceIndex;
    type Args = TaskRef;

    fn description(_: &Catalog) -> String {
        "The result of a completed task; each output file it wrote is also a resource_link with its download link \
         (valid 15 minutes; call again for a fresh one). A task that failed or was canceled answers its error; one \
         still queued or running answers task_not_finished (call again, or get_task)."
            .into()
    }

    fn input_schema() -> Value {
        task_ref_schema()
    }

    fn output_schema() -> Value {
        let string = json!({ "type": "string" });
        json!({
            "type": "object",
            "properties": { "task_id": string, "kind": string, "result": {} },
            "required": ["task_id", "kind", "result"]
        })
    }

    async fn call(ctx: &McpContext, space: SpaceIndex, task: TaskRef) -> ToolResult<Value> {
        let task = find(ctx, &space, &task).await?;
        match task.status {
            TaskStatus::Completed => Ok(json!({ "task_id": task.id, "kind": task.kind, "result": task.result })),
            TaskStatus::Queued | TaskStatus::Running => Err(ToolFailure::with(
                "task_not_finished",
                format!(
                    "the task is {}; call again once it has ended, or follow it with get_task",
                    task.status.as_str()
                ),
                json!({ "task": view(task) }),
            )),
            TaskStatus::Failed | TaskStatus::Canceled => Err(ToolFailure::with(
                "task_not_completed",
                format!("the task ended {} and has no result", task.status.as_str()),
                json!({ "task": view(task) }),
            )),
        }
    }
}
