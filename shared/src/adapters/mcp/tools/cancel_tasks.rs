//! `cancel_tasks`: cancels the Space's tasks that a filter matches, as
//! `POST /v1/tasks/cancel` does, with the same answer.

use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::adapters::mcp::context::McpContext;
use crate::adapters::mcp::failure::{ToolFailure, ToolResult};
use crate::adapters::mcp::tool::FixedTool;
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::Catalog;
use crate::domain::ids::Id;
use crate::domain::tasks::TaskStatus;
use crate::domain::tasks::bulk::{self, Filter, MAX_IDS};

pub struct CancelTasks;

#[derive(Deserialize)]
pub struct CancelTasksArgs {
    ids: Option<Vec<String>>,
    kind: Option<String>,
    status: Option<Vec<TaskStatus>>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    created_after: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    created_before: Option<OffsetDateTime>,
    #[serde(default)]
    dry_run: bool,
}

impl FixedTool for CancelTasks {
    const NAME: &'static str = "cancel_tasks";
    const READ_ONLY: bool = false;
    type Caller = SpaceIndex;
    type Args = CancelTasksArgs;

    fn description(_: &Catalog) -> String {
        "Cancel this Space's tasks that a filter matches (at least one of ids, kind, status, created_after, \
         created_before; all given must hold), each as cancel_task would: queued ones at once, running ones asked \
         to stop. Ended tasks are matched but skipped. At most 1000 per call, oldest first: call again while `more` \
         is true. Try dry_run first: it says what would be canceled and changes nothing."
            .into()
    }

    fn input_schema() -> Value {
        let statuses = json!(["queued", "running", "completed", "failed", "canceled"]);
        json!({
            "type": "object",
            "properties": {
                "ids": { "type": "array", "items": { "type": "string" }, "maxItems": MAX_IDS,
                    "description": "Only these task ids." },
                "kind": { "type": "string", "description": "Only tasks of this kind." },
                "status": { "type": "array", "items": { "type": "string", "enum": statuses },
                    "description": "Only tasks in one of these statuses." },
                "created_after": { "type": "string", "format": "date-time",
                    "description": "Only tasks created at or after this time (RFC 3339)." },
                "created_before": { "type": "string", "format": "date-time",
                    "description": "Only tasks created before this time (RFC 3339)." },
                "dry_run": { "type": "boolean", "description": "Say what would be canceled; change nothing." }
            },
            "additionalProperties": false
        })
    }

    fn output_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "matched": { "type": "integer" },
                "canceled": { "type": "integer" },
                "requested": { "type": "integer" },
                "skipped": { "type": "integer" },
                "task_ids": { "type": "array", "items": { "type": "string" } },
                "more": { "type": "boolean" },
                "dry_run": { "type": "boolean" }
            },
            "required": ["matched", "canceled", "requested", "skipped", "task_ids", "more", "dry_run"]
        })
    }

    async fn call(ctx: &McpContext, space: SpaceIndex, args: CancelTasksArgs) -> ToolResult<Value> {
        let ids = match args.ids {
            None => None,
            Some(ids) => Some(
                ids.iter()
                    .map(|id| id.parse::<Id>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| ToolFailure::new("invalid_arguments", "ids must be task ids"))?,
            ),
        };
        let filter = Filter {
            space: Some(space),
            ids,
            kind: args.kind,
            statuses: args.status,
            codes: None,
            created_after: args.created_after,
            created_before: args.created_before,
        };
        filter.check().map_err(|message| ToolFailure::new("invalid_arguments", message))?;
        let done = bulk::cancel_owned(&ctx.db, &ctx.redis, &space, filter, args.dry_run, "mcp").await?;
        serde_json::to_value(done).map_err(ToolFailure::internal)
    }
}
