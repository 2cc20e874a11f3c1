//! The MCP boundary's errors. A tool that fails answers a tool result with
//! `isError: true`, not a JSON-RPC error: MCP clients show the model a tool
//! result, so it can read what went wrong and correct itself, while a
//! protocol error usually reaches it as an opaque failure. Only a call that
//! names no tool at all is a JSON-RPC error.
//!
//! Every failure has a stable `code`. A domain refusal's comes from the one
//! vocabulary (`domain/error.rs`), so it is the REST API's; the few of the
//! tools' own (`invalid_arguments`, `invalid_base64`, `task_not_finished`,
//! …) are named where they are refused. Internal causes are logged, never
//! returned.

use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use crate::domain::error::{ErrorKind, Refusal, TaskRefusal, TokenRefusal, Wording};
use crate::domain::login_limits::Limited;
use crate::domain::pay_links::PayLinkRefusal;
use crate::domain::payments::{PayError, PaymentRequired};
use crate::domain::spaces::SpaceError;
use crate::domain::tasks::SubmitError;
use crate::domain::uploads::CreateError;

#[derive(Debug, thiserror::Error)]
pub enum ToolFailure {
    /// `{"error": {"code", "message", …}}` as the structured content.
    #[error("{code}: {message}")]
    Refused { code: &'static str, message: String, detail: Option<Value> },
    /// x402's tool-result binding: the `PaymentRequired` itself is the
    /// structured content, and its JSON the first text block.
    /// `code` is the refusal's (`payment_required`, `payment_mismatch`, …).
    #[error("{code}")]
    Payment { code: &'static str, challenge: Box<PaymentRequired> },
}

pub type ToolResult<T> = Result<T, ToolFailure>;

/// How messages name what a tool call sends.
pub const WORDING: Wording = Wording {
    input: "the arguments",
    // A call's only key is its payment's x402 payment-identifier id.
    idempotency_key: "payment-identifier id",
    payment: "_meta[\"x402/payment\"]",
    retry_after: "retry_after_seconds",
    catalog: "tools/list",
    new_space: "create_space",
};

impl ToolFailure {
    pub fn new(code: &'static str, message: impl Into<String>) -> ToolFailure {
        ToolFailure::Refused { code, message: message.into(), detail: None }
    }

    /// With more fields beside `code` and `message` (e.g. the task).
    pub fn with(code: &'static str, message: impl Into<String>, detail: Value) -> ToolFailure {
        ToolFailure::Refused { code, message: message.into(), detail: Some(detail) }
    }

    pub fn code(&self) -> &str {
        match self {
            ToolFailure::Refused { code, .. } => code,
            ToolFailure::Payment { code, .. } => code,
        }
    }

    /// A domain refusal; see [`refused_from`]. A fault or an outage logs
    /// the error (its cause included); the model sees only the message.
    pub fn refused<E: Refusal>(e: &E) -> ToolFailure {
        let kind = e.kind();
        if matches!(kind, ErrorKind::Internal | ErrorKind::Unavailable) {
            tracing::error!(error = %e, code = e.code(), "MCP tool refused");
        }
        if let Some(challenge) = e.challenge() {
            return ToolFailure::Payment { code: e.code(), challenge: Box::new(challenge.clone()) };
        }
        let detail = e.retry_after().map(|after| json!({ "retry_after_seconds": after.as_secs().max(1) }));
        ToolFailure::Refused { code: e.code(), message: e.message(&WORDING), detail }
    }

    /// A domain refusal in the tools' own words: its code, with `message`
    /// in place of the vocabulary's (a session token's, which tells which
    /// tool gives one) and `detail` beside it.
    pub fn refused_saying<E: Refusal>(e: &E, message: impl Into<String>, detail: Option<Value>) -> ToolFailure {
        ToolFailure::Refused { code: e.code(), message: message.into(), detail }
    }

    pub fn internal(why: impl std::fmt::Display) -> ToolFailure {
        tracing::error!(error = %why, "internal error in an MCP tool");
        ToolFailure::new("internal", "an unexpected failure; it was logged")
    }

    pub fn into_result(self) -> CallToolResult {
        let structured = match self {
            ToolFailure::Refused { code, message, detail } => {
                let mut error = json!({ "code": code, "message": message });
                if let Some(Value::Object(more)) = detail {
                    error.as_object_mut().expect("an object").extend(more);
                }
                json!({ "error": error })
            }
            ToolFailure::Payment { challenge, .. } => {
                serde_json::to_value(&*challenge).expect("plain strings serialise")
            }
        };
        // `content[0].text` is the same JSON, for clients that read no
        // structured content (x402's binding requires exactly that).
        CallToolResult::structured_error(structured)
    }
}

/// A domain refusal as a tool error: its code, message and wait from the
/// one vocabulary (`domain/error.rs`), the same as the REST API's. A
/// refused payment is x402's tool-result binding, its challenge again, so an
/// x402 client can pay afresh; the challenge's `error` names what was wrong.
macro_rules! refused_from {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for ToolFailure {
            fn from(e: $error) -> Self {
                ToolFailure::refused(&e)
            }
        }
    )*};
}
refused_from!(
    sqlx::Error,
    SpaceError,
    CreateError,
    SubmitError,
    PayError,
    Limited,
    TaskRefusal,
    TokenRefusal,
    PayLinkRefusal
);
