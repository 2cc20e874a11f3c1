//! Moving a message's visibility on the task queue: the wait before a
//! retry ([`super::backoff`]), a record given back unclaimed (0), and, for
//! `reeve work`, a running message kept hidden. The Lambda's records and
//! the poller's messages come from the same queue (`REEVE_QUEUE_URL`), so
//! both sides go through this.

use std::time::Duration;

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// The task queue, to change its messages' visibility.
#[derive(Debug, Clone)]
pub struct Visibility {
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
}

impl Visibility {
    pub fn new(sqs: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        Visibility { sqs, queue_url: queue_url.into() }
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// The client, to send a woken task's message to the same queue.
    pub fn sqs(&self) -> &aws_sdk_sqs::Client {
        &self.sqs
    }

    /// Hides the message with this receipt for `after` from now (0: shown
    /// at once). SQS's own reason when it refuses.
    pub async fn set(&self, receipt: &str, after: Duration) -> Result<(), String> {
        let secs = i32::try_from(after.as_secs()).unwrap_or(i32::MAX);
        self.sqs
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .visibility_timeout(secs)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sqs_error(&e))
    }

    /// [`Self::set`] for a message to be retried: logged, not returned, as
    /// a message whose visibility could not be moved still comes back, after
    /// the queue's visibility timeout.
    pub async fn retry_in(&self, receipt: &str, after: Duration) {
        match self.set(receipt, after).await {
            Ok(()) => tracing::info!(after_secs = after.as_secs(), "the message comes back then"),
            Err(e) => tracing::warn!(
                error = %e,
                "could not set the message's visibility; it comes back after the queue's visibility timeout"
            ),
        }
    }
}

/// SQS's own code and message when it answered, else the whole chain (a
/// connection failure, a timeout).
pub(super) fn sqs_error<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    e: &SdkError<E, R>,
) -> String {
    match (e.code(), e.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        _ => DisplayErrorContext(e).to_string(),
    }
}
