//! [`TaskRequest`]: a request for a task as its client made it (its Space,
//! the kind, the input and the `Idempotency-Key`). One type carries it the
//! whole way: from the adapters (`POST /v1/tasks/{kind}`, an MCP tool call)
//! through payments (an attempt keeps it whole, so that its task can still
//! be created when its payment is learnt late) to storage (the task row).

use serde_json::Value;

use crate::domain::auth::SpaceIndex;
use crate::infra::canonical_json;

/// A request for a task. The input has passed the kind's schema by the time
/// anything stores it.
#[derive(Debug, Clone, Copy)]
pub struct TaskRequest<'a> {
    pub space: &'a SpaceIndex,
    pub kind: &'a str,
    pub input: &'a Value,
    pub idempotency_key: Option<&'a str>,
}

impl TaskRequest<'_> {
    /// What tells two requests apart under one `Idempotency-Key` (and one
    /// payment): SHA-256 of the kind and the canonical input.
    pub fn hash(&self) -> [u8; 32] {
        canonical_json::request_hash(self.kind, self.input)
    }

    /// The same request without its key: a paid request whose key another
    /// task took meanwhile is still owed its own task.
    pub fn keyless(self) -> Self {
        TaskRequest { idempotency_key: None, ..self }
    }
}
