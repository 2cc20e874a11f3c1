//! A task as the task tools answer it, and how they find one: the fixed
//! tools `get_task`, `list_tasks`, `cancel_task` and `get_result`
//! ([`super::tools`]), a kind's tool ([`super::kind`]) and the tasks
//! extension ([`super::server`]) all answer a task this way.

use rmcp::model::{CallToolResult, ContentBlock, Resource};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use crate::domain::auth::SpaceIndex;
use crate::domain::error::TaskRefusal;
use crate::domain::ids::Id;
use crate::domain::tasks::{self, Task};

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

/// `answer` with a `resource_link` content block for each output file its
/// structured task (or `get_result` answer) lists with a download link
/// (`result.outputs`, a service kind's files): MCP's way to point a client
/// at a file it can fetch, beside the same links in `structuredContent`.
/// The first block stays the structured content's JSON, as the spec asks.
pub fn with_file_links(mut answer: CallToolResult) -> CallToolResult {
    let Some(structured) = &answer.structured_content else { return answer };
    let files = structured["result"]["outputs"].as_array().into_iter().flatten();
    let links: Vec<ContentBlock> = files
        .filter_map(|file| {
            let (url, name) = (file["url"].as_str()?, file["name"].as_str()?);
            let mut link = Resource::new(url, name);
            link.mime_type = file["content_type"].as_str().map(str::to_owned);
            link.size = file["size"].as_u64();
            link.description = file["url_expires_at"]
                .as_str()
                .map(|at| format!("an output file of the task; this download link is valid until {at}"));
            Some(ContentBlock::resource_link(link))
        })
        .collect();
    answer.content.extend(links);
    answer
}

/// The arguments of a tool that names one task.
#[derive(Deserialize)]
pub struct TaskRef {
    pub task_id: String,
}

impl TaskRef {
    /// A malformed id names no task: the same answer as a missing one.
    pub fn id(&self) -> ToolResult<Id> {
        self.task_id.parse().map_err(|_| not_found())
    }
}

pub fn not_found() -> ToolFailure {
    ToolFailure::from(TaskRefusal::NotFound)
}

/// The Space's task, with its download links signed.
pub async fn find(ctx: &McpContext, space: &SpaceIndex, task: &TaskRef) -> ToolResult<Task> {
    let task = tasks::find_for_space(&ctx.db, space, task.id()?).await?.ok_or_else(not_found)?;
    Ok(ctx.links().present(space, task).await)
}

/// The input schema of a tool that names one task.
pub fn task_ref_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": { "task_id": { "type": "string", "minLength": 26, "maxLength": 26,
            "description": "The task id, from a task tool or list_tasks." } },
        "required": ["task_id"],
        "additionalProperties": false
    })
}
