//! The tools, built once from the catalog: the fixed tools, then one per
//! task kind ([`super::kind`]). A kind named like a fixed tool is offered
//! as `task_<kind>`.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::failure::{ToolFailure, ToolResult};
use super::kind;
use super::schema::{Priced, object, output_schema, task_schema};
use crate::domain::catalog::Catalog;

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

/// What a tool name names.
pub enum Named<'a> {
    Fixed(Fixed),
    /// A task kind, by its catalog name, and its tool as listed.
    Kind {
        kind: &'a str,
        listed: &'a Tool,
    },
}

pub struct Tools {
    list: Vec<Tool>,
    /// Tool name → the kind, and its place in `list`.
    kinds: HashMap<String, (String, usize)>,
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
            list.push(kind::listed(catalog, &task, name.clone()));
            kinds.insert(name, (task.kind, list.len() - 1));
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
        self.kinds.get(name).map(|(kind, at)| Named::Kind { kind, listed: &self.list[*at] })
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
