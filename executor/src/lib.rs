//! The service side of Reeve's executor protocol, version 1
//! (docs/executors.md): what an HTTP service or a Lambda function needs to
//! sell its work through Reeve.
//!
//! - [`signature`]: check a job's Standard Webhooks signature ([`Secret`]).
//! - [`messages`]: every message as a serde type: the [`Job`] and the
//!   [`Cancel`] Reeve sends, the [`Report`]s a service sends back, Reeve's
//!   answers.
//! - [`reporter`]: a [`Reporter`] sends progress, logs, usage, outputs and
//!   the end of one attempt, each report idempotent, and says when to stop.
//! - [`cancel`]: [`Cancels`] lets a signed cancel stop the attempt it names
//!   in a long-lived service ([`Reporter::check`]).
//! - `lambda` (feature `lambda`): a Lambda function's `main`, one job per
//!   invocation.
//!
//! An HTTP service verifies and parses a delivery with [`verify_message`],
//! answers `202`, and works on with a [`Reporter`] from [`Cancels::reporter`];
//! a cancel it hands to [`Cancels::cancel`] and answers `200`.

pub mod cancel;
pub mod messages;
pub mod reporter;
pub mod signature;

#[cfg(feature = "lambda")]
pub mod lambda;

pub use cancel::Cancels;
pub use messages::{Cancel, Failure, InputFile, Job, Message, Metered, OutputUpload, Report, ReportBody, TaskRef};
pub use reporter::{Error, Reporter, WorkError};
pub use signature::{Secret, SignatureError, SignedHeaders};

/// Why a delivery was refused: answer `401` to a bad signature, `400` to a
/// body that is not a message.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error("the body is not a job or a cancel: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Checks a delivery's signature, then parses its body: what an HTTP
/// service does with each POST before answering.
pub fn verify_message(secret: &Secret, headers: &SignedHeaders<'_>, body: &[u8]) -> Result<Message, DeliveryError> {
    secret.verify(headers, body)?;
    Ok(serde_json::from_slice(body)?)
}
