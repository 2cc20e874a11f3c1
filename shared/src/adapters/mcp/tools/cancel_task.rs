//! `cancel_task`: stops a task, as `POST /v1/tasks/{id}/cancel` does. The
//! tasks extension's `tasks/cancel` is this tool's handler too.

use serde_json::{Value, json};

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::{ToolFailure, ToolResult};
use crate::adapters::mcp::schema::task_schema;
use crate::adapters::mcp::task::{TaskRef, not_found, task_ref_schema, view};
use crate::adapters::mcp::tool::FixedTool;
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::Catalog;
use crate::domain::error::TaskRefusal;
use crate::domain::tasks::{self, CancelOutcome};

pub struct CancelTask;

impl FixedTool for CancelTask {
    const NAME: &'static str = "cancel_task";
    const READ_ONLY: bool = false;
    type Caller = SpaceIndex;
    type Args = TaskRef;

    fn description(_: &Catalog) -> String {
        "Cancel a task. A queued task is canceled at once; a running one is asked to stop and ends canceled within \
         a second (see get_task). A paid task canceled before it ran leaves a credit that pays for the next task of \
         the same price."
            .into()
    }

    fn input_schema() -> Value {
        task_ref_schema()
    }

    fn output_schema() -> Value {
        task_schema(&json!({}))
    }

    async fn call(ctx: &McpContext, space: SpaceIndex, task: TaskRef) -> ToolResult<Value> {
        let id = task.id()?;
        match tasks::cancel(&ctx.db, &space, id).await?.ok_or_else(not_found)? {
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
}
