//! The hand-off to the worker (docs/architecture.md#queue-and-worker): one SQS message per task,
//! `{"task_id": "<ulid>", "kind": "<kind>"}`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::auth::SpaceIndex;
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueMessage {
    pub task_id: Id,
    pub kind: String,
}

/// Only the object form: serde's derive would also take `["<ulid>", "<kind>"]`,
/// a body nothing sends, and the worker acts only on what says `task_id`.
impl<'de> Deserialize<'de> for QueueMessage {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Fields {
            task_id: Id,
            kind: String,
        }

        struct ObjectOnly;

        impl<'de> serde::de::Visitor<'de> for ObjectOnly {
            type Value = Fields;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object {task_id, kind}")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Fields, A::Error> {
                Fields::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }

        let Fields { task_id, kind } = deserializer.deserialize_map(ObjectOnly)?;
        Ok(QueueMessage { task_id, kind })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("sending to SQS failed: {0}")]
    Send(String),
    #[error("sending to SQS timed out after {}s", SEND_TIMEOUT.as_secs())]
    Timeout,
}

/// The message's group: its Space (the index, never the id), so that on a
/// fair queue (a standard queue whose messages carry a `MessageGroupId`)
/// SQS shares delivery between Spaces, and one Space's backlog does not
/// delay another's next task. `None` for the rare re-send that does not know
/// the Space: delivered all the same, outside the fair share.
#[cfg(feature = "sqs")]
fn group(space: Option<&SpaceIndex>) -> Option<String> {
    space.map(SpaceIndex::to_hex)
}

/// Sends a task's message to `queue_url`, grouped by its `space`.
#[cfg(feature = "sqs")]
pub async fn enqueue(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    task_id: Id,
    kind: &str,
    space: Option<&SpaceIndex>,
) -> Result<(), QueueError> {
    enqueue_after(sqs, queue_url, task_id, kind, space, Duration::ZERO).await
}

/// [`enqueue`], shown to workers only after `delay` (SQS allows up to 15
/// minutes): a task queued again for its next attempt.
#[cfg(feature = "sqs")]
pub async fn enqueue_after(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    task_id: Id,
    kind: &str,
    space: Option<&SpaceIndex>,
    delay: Duration,
) -> Result<(), QueueError> {
    let body = serde_json::to_string(&QueueMessage { task_id, kind: kind.to_owned() }).expect("strings serialise");
    let delay = i32::try_from(delay.as_secs().min(900)).unwrap_or(900);
    let mut send = sqs.send_message().queue_url(queue_url).message_body(body).set_message_group_id(group(space));
    if delay > 0 {
        send = send.delay_seconds(delay);
    }
    match tokio::time::timeout(SEND_TIMEOUT, send.send()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(QueueError::Send(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())),
        Err(_) => Err(QueueError::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_object_form_is_a_message() {
        let id = "01JNVX5C7D9F1H3K5M7P9R1T3V";
        let object: QueueMessage = serde_json::from_str(&format!(r#"{{"task_id":"{id}","kind":"digest"}}"#)).unwrap();
        assert_eq!(object.task_id.to_string(), id);
        assert_eq!(object.kind, "digest");
        let error = serde_json::from_str::<QueueMessage>(&format!(r#"["{id}","digest"]"#)).unwrap_err();
        assert!(error.to_string().contains("an object {task_id, kind}"), "{error}");
    }
}
