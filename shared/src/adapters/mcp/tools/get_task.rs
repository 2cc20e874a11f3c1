//! `get_task`: a task as it is now, as `GET /v1/tasks/{id}` answers it.

use serde_json::Value;

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::ToolResult;
use crate::adapters::mcp::schema::task_schema;
use crate::adapters::mcp::task::{TaskRef, find, task_ref_schema, view};
use crate::adapters::mcp::tool::FixedTool;
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::Catalog;

pub struct GetTask;

impl FixedTool for GetTask {
    const NAME: &'static str = "get_task";
    const READ_ONLY: bool = true;
    type Caller = SpaceIndex;
    type Args = TaskRef;

    fn description(_: &Catalog) -> String {
        "A task as it is now: status, progress (0 to 1), and its result or error once it has ended.".into()
    }

    fn input_schema() -> Value {
        task_ref_schema()
    }

    fn output_schema() -> Value {
        task_schema(&serde_json::json!({}))
    }

    async fn call(ctx: &McpContext, space: SpaceIndex, task: TaskRef) -> ToolResult<Value> {
        Ok(view(find(ctx, &space, &task).await?))
    }
}
