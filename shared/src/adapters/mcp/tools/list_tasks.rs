//! `list_tasks`: the Space's tasks a page at a time, as `GET /v1/tasks`
//! lists them.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::{ToolFailure, ToolResult};
use crate::adapters::mcp::schema::task_schema;
use crate::adapters::mcp::task::view;
use crate::adapters::mcp::tool::FixedTool;
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::Catalog;
use crate::domain::ids::Id;
use crate::domain::tasks::{self, ListQuery, TaskStatus};

pub struct ListTasks;

#[derive(Deserialize)]
pub struct ListArgs {
    status: Option<TaskStatus>,
    kind: Option<String>,
    limit: Option<u32>,
    after: Option<String>,
}

impl FixedTool for ListTasks {
    const NAME: &'static str = "list_tasks";
    const READ_ONLY: bool = true;
    type Caller = SpaceIndex;
    type Args = ListArgs;

    fn description(_: &Catalog) -> String {
        "This Space's tasks, newest first, a page at a time: pass the answer's `next` as `after` for the next page."
            .into()
    }

    fn input_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "status": { "type": "string", "enum": ["queued", "running", "completed", "failed", "canceled"] },
                "kind": { "type": "string" },
                "limit": { "type": "integer", "minimum": 1, "maximum": tasks::list::MAX_LIMIT,
                    "description": "Tasks per page (default 20)." },
                "after": { "type": "string", "description": "The `next` of the previous page." }
            },
            "additionalProperties": false
        })
    }

    fn output_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "tasks": { "type": "array", "items": task_schema(&json!({})) },
                "next": { "type": ["string", "null"] }
            },
            "required": ["tasks", "next"]
        })
    }

    async fn call(ctx: &McpContext, space: SpaceIndex, args: ListArgs) -> ToolResult<Value> {
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
        let page = tasks::list(&ctx.db, &space, query).await?;
        let tasks = ctx.links().present_all(&space, page.tasks).await;
        Ok(json!({ "tasks": tasks.into_iter().map(view).collect::<Vec<_>>(), "next": page.next }))
    }
}
