//! The MCP boundary's errors. A tool that fails answers a tool result with
//! `isError: true`, not a JSON-RPC error: MCP clients show the model a tool
//! result, so it can read what went wrong and correct itself, while a
//! protocol error usually reaches it as an opaque failure. Only a call that
//! names no tool at all is a JSON-RPC error.
//!
//! Every failure has a stable `code`, the same as the REST API's where the
//! REST API has one (`invalid_input`, `payment_replayed`, `task_not_found`,
//! …). Internal causes are logged, never returned.

use rmcp::model::CallToolResult;
use serde_json::{Value, json};

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
    #[error("payment required")]
    Payment(Box<PaymentRequired>),
}

pub type ToolResult<T> = Result<T, ToolFailure>;

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
            ToolFailure::Payment(challenge) => &challenge.error,
        }
    }

    pub fn database(e: sqlx::Error) -> ToolFailure {
        tracing::error!(error = %e, "database error in an MCP tool");
        ToolFailure::new("database_unavailable", "the database is out of reach; try again")
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
            ToolFailure::Payment(challenge) => serde_json::to_value(&*challenge).expect("plain strings serialise"),
        };
        // `content[0].text` is the same JSON, for clients that read no
        // structured content (x402's binding requires exactly that).
        CallToolResult::structured_error(structured)
    }
}

impl From<sqlx::Error> for ToolFailure {
    fn from(e: sqlx::Error) -> Self {
        ToolFailure::database(e)
    }
}

/// A Space ID that is malformed, unknown or wrong is one failure, as in REST.
impl From<SpaceError> for ToolFailure {
    fn from(e: SpaceError) -> Self {
        match e {
            SpaceError::InvalidSpace => ToolFailure::new(
                "invalid_space",
                "no Space has this Space ID (20 digits, from create_space); call create_space for a new one",
            ),
            SpaceError::Db(e) => ToolFailure::database(e),
            SpaceError::Auth(e) => ToolFailure::internal(e),
        }
    }
}

/// The upload declaration's refusals, with the REST API's codes.
impl From<CreateError> for ToolFailure {
    fn from(e: CreateError) -> Self {
        match e {
            CreateError::InvalidFilename(why) => ToolFailure::new("invalid_filename", why),
            CreateError::InvalidSize => ToolFailure::new("invalid_arguments", "size must be a positive integer"),
            CreateError::TooLarge { max_bytes, .. } => {
                ToolFailure::new("upload_too_large", format!("the file is over the upload limit of {max_bytes} bytes"))
            }
            CreateError::UnsupportedContentType { allowed } => ToolFailure::new(
                "unsupported_content_type",
                format!("content_type must be one of: {}", allowed.join(", ")),
            ),
            CreateError::Storage(cause) => {
                tracing::error!(error = %cause, "storage unavailable");
                ToolFailure::new("storage_unavailable", "file storage is unavailable; try again")
            }
            CreateError::Db(e) => ToolFailure::database(e),
        }
    }
}

/// Create's refusals. A refused payment carries the challenge again, so an
/// x402 client can pay afresh; its `error` names what was wrong.
impl From<SubmitError> for ToolFailure {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Payment(p) => p.into(),
            SubmitError::UnknownTask(kind) => ToolFailure::new("unknown_task", format!("no task kind {kind:?}")),
            SubmitError::InputNotObject => ToolFailure::new("invalid_input", "the arguments must be a JSON object"),
            SubmitError::InputNul(pointer) => ToolFailure::new(
                "invalid_input",
                format!("input{pointer} holds a NUL character, which cannot be stored"),
            ),
            SubmitError::InvalidInput(message) => ToolFailure::new("invalid_input", message),
            SubmitError::IdempotencyConflict => {
                ToolFailure::new("idempotency_conflict", "this idempotency key was used with a different input")
            }
            SubmitError::Upload { code, message } => ToolFailure::new(code, message),
            SubmitError::StorageUnavailable => {
                ToolFailure::new("storage_unavailable", "object storage is unavailable; try again")
            }
            SubmitError::QuotaExceeded(exceeded) => ToolFailure::with(
                "quota_exceeded",
                exceeded.message(),
                json!({ "retry_after_seconds": exceeded.retry_after_seconds() }),
            ),
            SubmitError::QueueUnavailable => {
                ToolFailure::new("queue_unavailable", "the task could not be queued and was marked failed; try again")
            }
            SubmitError::Db(e) => ToolFailure::database(e),
            SubmitError::Internal(why) => ToolFailure::internal(why),
        }
    }
}

/// The payment call's refusals. A refused payment carries the challenge
/// again, so an x402 client can pay afresh; its `error` names what was wrong.
impl From<PayError> for ToolFailure {
    fn from(e: PayError) -> Self {
        match e {
            PayError::Required(challenge)
            | PayError::Mismatch(challenge)
            | PayError::Replayed(challenge)
            | PayError::NotSettled(challenge)
            | PayError::Invalid { challenge, .. }
            | PayError::Failed { challenge, .. } => ToolFailure::Payment(challenge),
            PayError::Malformed(why) => ToolFailure::new(
                "invalid_payment",
                format!("{why}; send an x402 PaymentPayload (or its base64) in _meta[\"x402/payment\"]"),
            ),
            PayError::Pending { retry_after } => ToolFailure::with(
                "payment_pending",
                "the payment was sent to be settled and its outcome is not known yet; it may still be charged. Call \
                 the tool again with the same arguments and the same _meta[\"x402/payment\"] after \
                 retry_after_seconds: you get its one task, or payment_not_settled. Do not sign a new payment",
                json!({ "retry_after_seconds": retry_after.as_secs().max(PAYMENT_PENDING_RETRY_SECONDS) }),
            ),
            PayError::InProgress => ToolFailure::new(
                "payment_in_progress",
                "this payment is being settled by another request; retry the same call shortly",
            ),
            PayError::RequestInProgress => ToolFailure::new(
                "request_in_progress",
                "a request with this idempotency key is being paid for; retry the same call shortly",
            ),
            PayError::IdentifierConflict => ToolFailure::new(
                "payment_identifier_conflict",
                "this payment-identifier was already used with a different payment or input",
            ),
            PayError::IdempotencyConflict => {
                ToolFailure::new("idempotency_conflict", "this idempotency key was used with a different input")
            }
            PayError::FacilitatorUnavailable => ToolFailure::new(
                "facilitator_unavailable",
                "the payment facilitator is unavailable; nothing was charged; try again",
            ),
            PayError::Db(e) => ToolFailure::database(e),
        }
    }
}

/// How long a client should wait before resending a payment whose outcome
/// is unknown: the time the server takes to resolve it from the chain.
pub const PAYMENT_PENDING_RETRY_SECONDS: u64 = 30;
