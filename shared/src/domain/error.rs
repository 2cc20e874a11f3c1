//! The one vocabulary of refusals. Every error a domain call returns to a
//! client knows here its stable `code`, its [`ErrorKind`], its message, the
//! wait before the same request may succeed ([`Refusal::retry_after`]) and,
//! for a payment, the x402 challenge to pay afresh. The transports only
//! render it: HTTP maps a kind to a status (`adapters/http/error.rs`), MCP
//! to a tool error (`adapters/mcp/failure.rs`). Neither names a code, so a
//! refusal has one code whichever way it was asked.
//!
//! Each code here is documented twice for clients: in the OpenAPI document
//! (under the operations that answer it) and in the README's table of
//! error codes. The shared suite's `errors` test walks every variant and
//! fails on a code missing from either.
//!
//! Messages are for people and never carry an internal cause (a database
//! error, a storage error): those are in the `Display` of the error, which
//! the adapters log.

use std::time::Duration;

#[cfg(feature = "catalog")]
use crate::domain::payments::PaymentRequired;
use crate::domain::payments::PaymentResponse;

/// What sort of refusal it is. The transport decides what each looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong as sent: its shape, a header, a declared value.
    Input,
    /// Well formed, but what it holds or names cannot be used (the kind's
    /// schema, an upload that is missing).
    Unprocessable,
    /// The credential is missing, wrong or expired.
    Auth,
    /// The credential is good, but a second factor the request needs is
    /// not (a rotation's Space ID).
    Forbidden,
    /// Nothing by that name.
    NotFound,
    /// Not paid, or the payment was refused.
    Payment,
    /// The request clashes with another, or with one being handled now.
    Conflict,
    /// Over a limit; it may succeed after `retry_after`.
    Limit,
    /// A service Reeve depends on is out of reach; trying again may work.
    Unavailable,
    /// A fault of Reeve's own; the cause is logged.
    Internal,
}

/// How a transport names the things messages point a client to: a header
/// over HTTP, a tool or an argument over MCP.
#[derive(Debug, Clone, Copy)]
pub struct Wording {
    /// The task's input as the client sent it.
    pub input: &'static str,
    /// The key that makes a retry answer the same task.
    pub idempotency_key: &'static str,
    /// Where a payment is sent.
    pub payment: &'static str,
    /// Where the wait before a retry is told, in seconds.
    pub retry_after: &'static str,
    /// Where the task kinds on offer are listed.
    pub catalog: &'static str,
    /// What makes a new Space.
    pub new_space: &'static str,
}

/// A domain error as a client sees it.
pub trait Refusal: std::error::Error {
    /// Stable and `snake_case`: what a program branches on.
    fn code(&self) -> &'static str;
    fn kind(&self) -> ErrorKind;
    /// For people, in the transport's words; it never names an internal cause.
    fn message(&self, words: &Wording) -> String;
    /// When the same request may succeed, if waiting is the answer.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
    /// The x402 challenge to pay again with, for a refused payment.
    #[cfg(feature = "catalog")]
    fn challenge(&self) -> Option<&PaymentRequired> {
        None
    }
    /// The facilitator's refused settlement, sent back as it said it.
    fn settlement(&self) -> Option<&PaymentResponse> {
        None
    }
}

/// A database failure: out of reach (try again) or a fault of ours.
impl Refusal for sqlx::Error {
    fn code(&self) -> &'static str {
        if Refusal::kind(self) == ErrorKind::Unavailable { "database_unavailable" } else { "internal" }
    }
    fn kind(&self) -> ErrorKind {
        match self {
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        }
    }
    fn message(&self, _: &Wording) -> String {
        if Refusal::kind(self) == ErrorKind::Unavailable {
            "the database is unavailable; try again".into()
        } else {
            INTERNAL.into()
        }
    }
}

/// A receipt that cannot be made now: the database's failure, or the
/// seller's key in KMS not signing (try again shortly; the cause is logged).
#[cfg(feature = "receipts")]
impl Refusal for crate::domain::tasks::ReceiptError {
    fn code(&self) -> &'static str {
        use crate::domain::tasks::ReceiptError;
        match self {
            ReceiptError::Db(e) => Refusal::code(e),
            ReceiptError::Sign(_) => "signer_unavailable",
        }
    }
    fn kind(&self) -> ErrorKind {
        use crate::domain::tasks::ReceiptError;
        match self {
            ReceiptError::Db(e) => Refusal::kind(e),
            ReceiptError::Sign(_) => ErrorKind::Unavailable,
        }
    }
    fn message(&self, words: &Wording) -> String {
        use crate::domain::tasks::ReceiptError;
        match self {
            ReceiptError::Db(e) => e.message(words),
            ReceiptError::Sign(_) => "the receipt could not be signed just now; try again".into(),
        }
    }
    fn retry_after(&self) -> Option<Duration> {
        use crate::domain::tasks::ReceiptError;
        matches!(self, ReceiptError::Sign(_)).then_some(Duration::from_secs(5))
    }
}

/// A task the request names that is not there for it, or that has ended
/// before a cancel: reading, watching and canceling a task answer these
/// over HTTP, the relay and MCP alike.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskRefusal {
    /// A missing task, another Space's task and a string that is not a task
    /// id all answer this, word for word, so ids cannot be probed.
    #[error("no such task in this Space")]
    NotFound,
    /// A cancel of a task that has already ended, in this status.
    #[error("the task has already ended: it is {0}")]
    Finished(&'static str),
    /// A receipt asked of a task that has none: why.
    #[error("no receipt: {0}")]
    NoReceipt(&'static str),
}

impl TaskRefusal {
    pub const NOT_FOUND: &'static str = "task_not_found";
    pub const FINISHED: &'static str = "task_finished";
    pub const NO_RECEIPT: &'static str = "no_receipt";
}

impl Refusal for TaskRefusal {
    fn code(&self) -> &'static str {
        match self {
            TaskRefusal::NotFound => TaskRefusal::NOT_FOUND,
            TaskRefusal::Finished(_) => TaskRefusal::FINISHED,
            TaskRefusal::NoReceipt(_) => TaskRefusal::NO_RECEIPT,
        }
    }
    fn kind(&self) -> ErrorKind {
        match self {
            TaskRefusal::NotFound | TaskRefusal::NoReceipt(_) => ErrorKind::NotFound,
            TaskRefusal::Finished(_) => ErrorKind::Conflict,
        }
    }
    fn message(&self, _: &Wording) -> String {
        self.to_string()
    }
}

/// A session token a request cannot be served with. Every malformed,
/// tampered or expired token is the same `Invalid`, so a caller learns
/// nothing about which check failed. Each transport words the message
/// itself, since it tells where a token comes from and how it is sent
/// there (`ApiError::refused_saying`, `ToolFailure::refused_saying`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    #[error("no session token")]
    Missing,
    #[error("the session token is invalid or expired")]
    Invalid,
    /// A session token in a query string: URLs reach access logs, browser
    /// history and shared links.
    #[error("a session token in a URL")]
    InUrl,
    /// A stream ticket that is malformed, expired, for another task, or
    /// whose session was ended.
    #[error("the stream ticket is invalid or expired")]
    Ticket,
    /// A share link's token that is malformed, expired, for another task,
    /// or made before a rotation of its Space's ID.
    #[error("the share link is invalid or expired")]
    Share,
}

impl TokenRefusal {
    pub const MISSING: &'static str = "missing_token";
    pub const INVALID: &'static str = "invalid_token";
    pub const IN_URL: &'static str = "token_in_url";
    pub const TICKET: &'static str = "invalid_ticket";
    pub const SHARE: &'static str = "invalid_share";
}

impl Refusal for TokenRefusal {
    fn code(&self) -> &'static str {
        match self {
            TokenRefusal::Missing => TokenRefusal::MISSING,
            TokenRefusal::Invalid => TokenRefusal::INVALID,
            TokenRefusal::InUrl => TokenRefusal::IN_URL,
            TokenRefusal::Ticket => TokenRefusal::TICKET,
            TokenRefusal::Share => TokenRefusal::SHARE,
        }
    }
    fn kind(&self) -> ErrorKind {
        ErrorKind::Auth
    }
    fn message(&self, _: &Wording) -> String {
        match self {
            TokenRefusal::Missing => "no session token; open a session for one".into(),
            TokenRefusal::Invalid => "the token is invalid or expired; open a new session".into(),
            TokenRefusal::InUrl => "a session token must not be sent in a URL, where access logs, browser history and \
                shared links keep it: send it as Authorization: Bearer <token>, or open a task's stream with a \
                ticket from POST /v1/tasks/{id}/ticket"
                .into(),
            TokenRefusal::Ticket => "the stream ticket is invalid, expired (a ticket is good for 60 s to connect) or \
                for another task; ask POST /v1/tasks/{id}/ticket for a new one"
                .into(),
            TokenRefusal::Share => "the share link is invalid, expired (a link lasts 24 h), for another task, or \
                was ended by a rotation of its Space's ID; ask the task's owner for a new link"
                .into(),
        }
    }
}

const INTERNAL: &str = "internal error";
const STORAGE: &str = "file storage is unavailable; try again";

#[cfg(feature = "api-tasks")]
mod tasks {
    use super::*;
    use crate::domain::payments::{self, PayError};
    use crate::domain::tasks::{SubmitError, UploadProblem};

    impl UploadProblem {
        pub fn code(self) -> &'static str {
            match self {
                UploadProblem::Unknown => "unknown_upload",
                UploadProblem::NotReady => "upload_not_ready",
                UploadProblem::Missing => "upload_missing",
                UploadProblem::Rejected => "upload_rejected",
            }
        }
    }

    impl Refusal for SubmitError {
        fn code(&self) -> &'static str {
            match self {
                SubmitError::UnknownTask(_) => "unknown_task",
                SubmitError::InputNotObject => "invalid_request",
                SubmitError::InputNul(_) | SubmitError::InvalidInput(_) => "invalid_input",
                SubmitError::IdempotencyConflict => "idempotency_conflict",
                SubmitError::Upload { problem, .. } => problem.code(),
                SubmitError::StorageUnavailable => "storage_unavailable",
                SubmitError::Payment(e) => e.code(),
                SubmitError::QueueUnavailable => "queue_unavailable",
                SubmitError::QuotaExceeded(_) => "quota_exceeded",
                SubmitError::Db(e) => Refusal::code(e),
                SubmitError::Internal(_) => "internal",
            }
        }

        fn kind(&self) -> ErrorKind {
            match self {
                SubmitError::UnknownTask(_) => ErrorKind::NotFound,
                SubmitError::InputNotObject | SubmitError::InputNul(_) => ErrorKind::Input,
                SubmitError::InvalidInput(_) | SubmitError::Upload { .. } => ErrorKind::Unprocessable,
                SubmitError::IdempotencyConflict => ErrorKind::Conflict,
                SubmitError::StorageUnavailable | SubmitError::QueueUnavailable => ErrorKind::Unavailable,
                SubmitError::Payment(e) => e.kind(),
                SubmitError::QuotaExceeded(_) => ErrorKind::Limit,
                SubmitError::Db(e) => Refusal::kind(e),
                SubmitError::Internal(_) => ErrorKind::Internal,
            }
        }

        fn message(&self, words: &Wording) -> String {
            match self {
                SubmitError::UnknownTask(kind) => {
                    let shown: String = kind.chars().take(64).collect();
                    format!("no task kind {shown:?}; {} lists the kinds on offer", words.catalog)
                }
                SubmitError::InputNotObject => format!("{} must be a JSON object", words.input),
                SubmitError::InputNul(pointer) => {
                    let shown = if pointer.is_empty() { "(root)".to_owned() } else { format!("input{pointer}") };
                    format!("{shown} holds a NUL character (\\u0000), which cannot be stored")
                }
                SubmitError::InvalidInput(message) | SubmitError::Upload { message, .. } => message.clone(),
                SubmitError::IdempotencyConflict => idempotency_conflict(words),
                SubmitError::StorageUnavailable => STORAGE.into(),
                SubmitError::Payment(e) => e.message(words),
                SubmitError::QueueUnavailable => format!(
                    "the task could not be queued and was marked failed; try again (with a new {} if you sent one)",
                    words.idempotency_key
                ),
                SubmitError::QuotaExceeded(exceeded) => exceeded.message(),
                SubmitError::Db(e) => e.message(words),
                SubmitError::Internal(_) => INTERNAL.into(),
            }
        }

        fn retry_after(&self) -> Option<Duration> {
            match self {
                SubmitError::Payment(e) => e.retry_after(),
                SubmitError::QuotaExceeded(exceeded) => Some(exceeded.retry_after),
                _ => None,
            }
        }

        fn challenge(&self) -> Option<&PaymentRequired> {
            match self {
                SubmitError::Payment(e) => e.challenge(),
                _ => None,
            }
        }

        fn settlement(&self) -> Option<&PaymentResponse> {
            match self {
                SubmitError::Payment(e) => e.settlement(),
                _ => None,
            }
        }
    }

    fn idempotency_conflict(words: &Wording) -> String {
        format!("this {} was already used with a different kind or input", words.idempotency_key)
    }

    impl Refusal for PayError {
        fn code(&self) -> &'static str {
            match self {
                PayError::Required(_) => "payment_required",
                PayError::Malformed(_) => "invalid_payment",
                PayError::Mismatch(_) => "payment_mismatch",
                PayError::Replayed(_) => "payment_replayed",
                PayError::Invalid { .. } => "payment_invalid",
                PayError::Refused { refusal, .. } => refusal.code(),
                PayError::Voucher { refusal, .. } => refusal.code(),
                PayError::Failed { .. } => "payment_failed",
                PayError::NotSettled(_) => "payment_not_settled",
                PayError::Pending { .. } => "payment_pending",
                PayError::InProgress => "payment_in_progress",
                PayError::RequestInProgress => "request_in_progress",
                PayError::IdentifierConflict => "payment_identifier_conflict",
                PayError::IdempotencyConflict => "idempotency_conflict",
                PayError::FacilitatorUnavailable => "facilitator_unavailable",
                PayError::ChainUnavailable => "chain_unavailable",
                PayError::Db(e) => Refusal::code(e),
            }
        }

        fn kind(&self) -> ErrorKind {
            match self {
                PayError::Malformed(_) => ErrorKind::Input,
                PayError::Required(_)
                | PayError::Mismatch(_)
                | PayError::Replayed(_)
                | PayError::Invalid { .. }
                | PayError::Refused { .. }
                | PayError::Voucher { .. }
                | PayError::Failed { .. }
                | PayError::NotSettled(_) => ErrorKind::Payment,
                PayError::Pending { .. }
                | PayError::InProgress
                | PayError::RequestInProgress
                | PayError::IdentifierConflict
                | PayError::IdempotencyConflict => ErrorKind::Conflict,
                PayError::FacilitatorUnavailable | PayError::ChainUnavailable => ErrorKind::Unavailable,
                PayError::Db(e) => Refusal::kind(e),
            }
        }

        fn message(&self, words: &Wording) -> String {
            let (payment, retry) = (words.payment, words.retry_after);
            match self {
                PayError::Required(_) => format!("this task has a price; pay with {payment}"),
                PayError::Malformed(why) => format!("{why}; send an x402 v2 PaymentPayload in {payment}"),
                PayError::Mismatch(_) => "the payment's `accepted` is none of this task's requirements; pay one of \
                                          the challenge's accepts"
                    .into(),
                PayError::Replayed(_) => {
                    "this payment already paid for another request; sign a new one for this request".into()
                }
                PayError::Invalid { reason, .. } => format!("the payment was refused: {reason}"),
                PayError::Refused { refusal, detail, .. } => refusal.message(detail),
                PayError::Voucher { refusal, .. } => format!(
                    "the voucher was refused ({refusal}); nothing was charged. The challenge's batch-settlement offer \
                     carries the channel as this server keeps it (channelState, voucherState): sign the next \
                     voucher from there"
                ),
                PayError::Failed { reason, .. } => {
                    format!("the payment could not be settled ({reason}); nothing was charged and no task was created")
                }
                PayError::NotSettled(_) => "no transfer of this payment to payTo is on chain, and none can come any \
                                            more: its authorization expired unused, or its nonce was spent by \
                                            another transaction. Nothing was received and no task was created; \
                                            sign a new payment"
                    .into(),
                PayError::Pending { .. } => format!(
                    "the payment was sent to be settled and its outcome is not known yet; it may still be charged. \
                     Send the same request with the same {payment} again after {retry} seconds: you will get its \
                     one task, or payment_not_settled. Do not sign a new payment for it meanwhile"
                ),
                PayError::InProgress => {
                    format!("this payment is being settled by another request; retry after {retry} seconds")
                }
                PayError::RequestInProgress => format!(
                    "a request with this {} is being paid for right now; retry after {retry} seconds",
                    words.idempotency_key
                ),
                PayError::IdentifierConflict => {
                    "this payment-identifier was already used with a different payment or request".into()
                }
                PayError::IdempotencyConflict => idempotency_conflict(words),
                PayError::FacilitatorUnavailable => {
                    "the payment facilitator is unavailable; nothing was charged; try again".into()
                }
                PayError::ChainUnavailable => {
                    "the payment network could not be read to check the payment channel; nothing was charged; try \
                     again"
                        .into()
                }
                PayError::Db(e) => e.message(words),
            }
        }

        fn retry_after(&self) -> Option<Duration> {
            match self {
                PayError::Pending { retry_after } => Some(*retry_after),
                PayError::InProgress | PayError::RequestInProgress => Some(payments::RETRY_AFTER),
                _ => None,
            }
        }

        fn challenge(&self) -> Option<&PaymentRequired> {
            match self {
                PayError::Required(c)
                | PayError::Mismatch(c)
                | PayError::Replayed(c)
                | PayError::NotSettled(c)
                | PayError::Invalid { challenge: c, .. }
                | PayError::Refused { challenge: c, .. }
                | PayError::Voucher { challenge: c, .. }
                | PayError::Failed { challenge: c, .. } => Some(c),
                _ => None,
            }
        }

        fn settlement(&self) -> Option<&PaymentResponse> {
            match self {
                PayError::Failed { settlement, .. } => Some(settlement),
                _ => None,
            }
        }
    }
}

#[cfg(feature = "s3-objects")]
impl Refusal for crate::domain::uploads::CreateError {
    fn code(&self) -> &'static str {
        use crate::domain::uploads::CreateError;
        match self {
            CreateError::InvalidFilename(_) => "invalid_filename",
            CreateError::InvalidSize => "invalid_request",
            CreateError::TooLarge { .. } => "upload_too_large",
            CreateError::UnsupportedContentType { .. } => "unsupported_content_type",
            CreateError::Storage(_) => "storage_unavailable",
            CreateError::Db(e) => Refusal::code(e),
        }
    }

    fn kind(&self) -> ErrorKind {
        use crate::domain::uploads::CreateError;
        match self {
            CreateError::Storage(_) => ErrorKind::Unavailable,
            CreateError::Db(e) => Refusal::kind(e),
            _ => ErrorKind::Input,
        }
    }

    fn message(&self, words: &Wording) -> String {
        use crate::domain::uploads::CreateError;
        match self {
            CreateError::InvalidFilename(why) => (*why).to_owned(),
            CreateError::InvalidSize => "size must be a positive integer".into(),
            CreateError::TooLarge { max_bytes, .. } => format!("size exceeds the upload limit of {max_bytes} bytes"),
            CreateError::UnsupportedContentType { allowed } => {
                format!("content_type must be one of: {}", allowed.join(", "))
            }
            CreateError::Storage(_) => STORAGE.into(),
            CreateError::Db(e) => e.message(words),
        }
    }
}

#[cfg(feature = "api-auth")]
impl Refusal for crate::domain::spaces::SpaceError {
    fn code(&self) -> &'static str {
        use crate::domain::spaces::SpaceError;
        match self {
            SpaceError::InvalidSpace => "invalid_space",
            SpaceError::WrongSpaceId => "wrong_space_id",
            SpaceError::Db(e) => Refusal::code(e),
            SpaceError::Auth(_) => "internal",
        }
    }

    fn kind(&self) -> ErrorKind {
        use crate::domain::spaces::SpaceError;
        match self {
            SpaceError::InvalidSpace => ErrorKind::Auth,
            SpaceError::WrongSpaceId => ErrorKind::Forbidden,
            SpaceError::Db(e) => Refusal::kind(e),
            SpaceError::Auth(_) => ErrorKind::Internal,
        }
    }

    /// A Space ID that is malformed, unknown or wrong is one answer, so
    /// nothing about which check failed can be learnt from it.
    fn message(&self, words: &Wording) -> String {
        use crate::domain::spaces::SpaceError;
        match self {
            SpaceError::InvalidSpace => {
                format!("no Space has this Space ID (20 digits); {} makes a new Space", words.new_space)
            }
            SpaceError::WrongSpaceId => "the Space ID sent is not this Space's current ID; a rotation needs both \
                                            the session and the Space's current ID, and nothing was changed"
                .into(),
            SpaceError::Db(e) => e.message(words),
            SpaceError::Auth(_) => INTERNAL.into(),
        }
    }
}

#[cfg(feature = "api-auth")]
impl Refusal for crate::domain::login_limits::Limited {
    fn code(&self) -> &'static str {
        "rate_limited"
    }

    fn kind(&self) -> ErrorKind {
        ErrorKind::Limit
    }

    fn message(&self, words: &Wording) -> String {
        use crate::domain::login_limits::Action;
        let what = match self.action {
            Action::Space => "Spaces created or Space IDs rotated",
            Action::Session => "sessions opened",
        };
        format!("too many {what} from your address; try again after {} seconds", words.retry_after)
    }

    fn retry_after(&self) -> Option<Duration> {
        Some(Duration::from_secs(self.seconds()))
    }
}
