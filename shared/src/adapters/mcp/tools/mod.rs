//! The registry: every tool that is not a kind, one file each, listed once
//! in [`FIXED`]; and [`Tools`], the tool list built from it and the catalog
//! (the fixed tools in [`FIXED`]'s order, then one tool per kind), which the
//! server answers `tools/list` with and finds each call's tool in.
//!
//! A tool's file holds one [`FixedTool`](super::tool::FixedTool) item: its
//! name, description, schemas, who may call it and its handler. Adding one
//! is that file, its `mod` line here and its line in [`FIXED`].
//!
//! Only the server imports this module: the tools import
//! [`super::tool`], never this list, so no file is both below and above it.

mod cancel_task;
mod cancel_tasks;
mod create_space;
mod create_upload;
mod get_result;
mod get_task;
mod list_tasks;
mod login;
mod rotate_space;

use std::collections::HashMap;

use rmcp::model::Tool;
use serde_json::Value;

pub use cancel_task::CancelTask;

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use super::kind;
use super::tool::{Identity, Registered, registered};
use crate::domain::catalog::Catalog;
use crate::infra::json_schema::JsonSchema;

/// The tools that are not a kind, in the order `tools/list` shows them.
const FIXED: &[Registered] = &[
    registered::<create_space::CreateSpace>(),
    registered::<login::Login>(),
    registered::<create_upload::CreateUpload>(),
    registered::<get_task::GetTask>(),
    registered::<list_tasks::ListTasks>(),
    registered::<cancel_task::CancelTask>(),
    registered::<cancel_tasks::CancelTasks>(),
    registered::<get_result::GetResult>(),
    registered::<rotate_space::RotateSpace>(),
];

/// A fixed tool ready to call: what it declares, and the validator of its
/// input schema, compiled once.
pub struct Fixed {
    tool: Registered,
    validator: JsonSchema,
}

impl Fixed {
    /// Whether a call must carry a valid session token.
    pub fn needs_session(&self) -> bool {
        self.tool.needs_session
    }

    /// Checks the arguments against the tool's input schema, with each
    /// violation and its JSON pointer in the message, as `invalid_input` is.
    pub fn check(&self, arguments: &Value) -> ToolResult<()> {
        let violations: Vec<String> = self
            .validator
            .violations(arguments)
            .into_iter()
            .take(10)
            .map(|v| format!("{}: {}", if v.pointer.is_empty() { "(root)" } else { &v.pointer }, v.message))
            .collect();
        if violations.is_empty() {
            return Ok(());
        }
        Err(ToolFailure::new("invalid_arguments", format!("{} arguments: {}", self.tool.name, violations.join("; "))))
    }

    /// The tool's handler, on arguments that have passed [`Fixed::check`].
    pub async fn call(&self, ctx: &McpContext, identity: Identity, arguments: Value) -> ToolResult<Value> {
        (self.tool.call)(ctx, identity, arguments).await
    }
}

/// What a tool name names.
pub enum Named<'a> {
    Fixed(&'a Fixed),
    /// A task kind, by its catalog name, and its tool as listed.
    Kind {
        kind: &'a str,
        listed: &'a Tool,
    },
}

/// The tool list, built once per endpoint: the catalog cannot change at
/// run time.
pub struct Tools {
    list: Vec<Tool>,
    fixed: HashMap<&'static str, Fixed>,
    /// Tool name → the kind, and its place in `list`.
    kinds: HashMap<String, (String, usize)>,
}

impl Tools {
    pub fn new(catalog: &Catalog) -> Tools {
        let mut list = Vec::new();
        let mut fixed = HashMap::new();
        for &tool in FIXED {
            let listed = (tool.listed)(catalog);
            let schema = Value::Object((*listed.input_schema).clone());
            let validator = JsonSchema::compile_generated(&schema).expect("the fixed schemas are valid");
            fixed.insert(tool.name, Fixed { tool, validator });
            list.push(listed);
        }
        let mut kinds = HashMap::new();
        for task in catalog.public().tasks {
            // A kind named like a fixed tool is offered as `task_<kind>`.
            let name =
                if fixed.contains_key(task.kind.as_str()) { format!("task_{}", task.kind) } else { task.kind.clone() };
            list.push(kind::listed(catalog, &task, name.clone()));
            kinds.insert(name, (task.kind, list.len() - 1));
        }
        Tools { list, fixed, kinds }
    }

    pub fn list(&self) -> &[Tool] {
        &self.list
    }

    pub fn find(&self, name: &str) -> Option<Named<'_>> {
        if let Some(tool) = self.fixed.get(name) {
            return Some(Named::Fixed(tool));
        }
        self.kinds.get(name).map(|(kind, at)| Named::Kind { kind, listed: &self.list[*at] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What clients see of the registry: the fixed tools first, in the
    /// order registered, then the kinds; each found by its name, marked
    /// read-only only where it says so, and needing a session unless it
    /// gives one. A kind named like a fixed tool is offered as
    /// `task_<kind>`.
    #[test]
    fn every_registered_tool_is_listed_once_in_order_before_the_kinds() {
        let catalog = Catalog::parse(
            r#"
            [tasks.login]
            title = "Login"
            description = "A kind named like a fixed tool."
            executor = "digest"
            input_schema = { type = "object" }

            [tasks.digest]
            title = "Digest"
            description = "Hashes a file."
            executor = "digest"
            input_schema = { type = "object" }
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let tools = Tools::new(&catalog);
        let names: Vec<&str> = tools.list().iter().map(|tool| tool.name.as_ref()).collect();
        let fixed = [
            "create_space",
            "login",
            "create_upload",
            "get_task",
            "list_tasks",
            "cancel_task",
            "cancel_tasks",
            "get_result",
            "rotate_space",
        ];
        // The kinds come in the catalog's order, by name.
        assert_eq!(names, [&fixed[..], &["digest", "task_login"]].concat());
        for name in fixed {
            let Some(Named::Fixed(tool)) = tools.find(name) else { panic!("{name} is not found as a fixed tool") };
            assert_eq!(tool.needs_session(), !matches!(name, "create_space" | "login"), "{name}");
            let listed = tools.list().iter().find(|t| t.name == name).expect("listed");
            let read_only = listed.annotations.as_ref().and_then(|a| a.read_only_hint);
            assert_eq!(read_only, Some(matches!(name, "get_task" | "list_tasks" | "get_result")), "{name}");
        }
        let Some(Named::Kind { kind, listed }) = tools.find("task_login") else { panic!("task_login is a kind") };
        assert_eq!((kind, listed.name.as_ref()), ("login", "task_login"));
        assert!(tools.find("digest").is_some() && tools.find("nothing").is_none());
    }
}
