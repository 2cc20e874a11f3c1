//! The hand-off to the worker (docs/architecture.md#queue-and-worker): one SQS message per task,
//! `{"task_id": "<ulid>", "kind": "<kind>"}`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::ids::Id;

/// How long a send may take before the queue counts as unavailable. The SDK
/// retries on its own within this; past it, the caller fails the task. A
/// message that did get through after all finds a terminal task, which the
/// worker skips.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The error code of a task whose message SQS refused at create: it is
/// failed (and, if paid, credited) rather than left queued with no message.
pub const QUEUE_UNAVAILABLE: &str = "queue_unavailable";

/// The message body the worker reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMessage {
    pub task_id: Id,
    pub kind: String,
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("sending to SQS failed: {0}")]
    Send(String),
    #[error("sending to SQS timed out after {}s", SEND_TIMEOUT.as_secs())]
    Timeout,
}

/// Sends a task's message to `queue_url`.
#[cfg(feature = "sqs")]
pub async fn enqueue(sqs: &aws_sdk_sqs::Client, queue_url: &str, task_id: Id, kind: &str) -> Result<(), QueueError> {
    let body = serde_json::to_string(&QueueMessage { task_id, kind: kind.to_owned() }).expect("strings serialise");
    let send = sqs.send_message().queue_url(queue_url).message_body(body).send();
    match tokio::time::timeout(SEND_TIMEOUT, send).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(QueueError::Send(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())),
        Err(_) => Err(QueueError::Timeout),
    }
}
