//! The client side of the event stream, for `reeve task watch` and
//! `reeve task create --watch`: follows a
//! task's SSE stream to its end, resuming with the last seen id whenever the
//! connection drops, so a flaky network costs no event and no duplicate.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt, future};
use sse_stream::SseStream;

use reeve_shared::ids::Id;
use reeve_shared::relay::is_terminal;
use reeve_shared::tasks::{Event, TaskStatus};

const MAX_RECONNECTS: u32 = 20;

#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The relay refused (bad token, unknown task): retrying cannot help.
    #[error("the relay answered {status}: {message} ({code})")]
    Refused { status: u16, code: String, message: String },
    #[error("lost the stream {0} times in a row; giving up")]
    GaveUp(u32),
}

/// Follows `task` on the relay at `base` and returns its terminal status.
pub async fn follow(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    task: Id,
    mut on_event: impl FnMut(&Event),
) -> Result<TaskStatus, FollowError> {
    let url = format!("{}/v1/tasks/{task}/events", base.trim_end_matches('/'));
    let mut last = 0i64;
    let mut failures = 0u32;
    loop {
        let request = http.get(&url).bearer_auth(token).header("last-event-id", last.to_string());
        let mut progressed = false;
        match request.send().await {
            Ok(response) if response.status().is_client_error() => {
                let status = response.status().as_u16();
                let body = response.bytes().await.unwrap_or_default();
                let envelope = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
                let code = envelope["error"]["code"].as_str().map_or_else(|| format!("http_{status}"), str::to_owned);
                let message = envelope["error"]["message"]
                    .as_str()
                    .map_or_else(|| String::from_utf8_lossy(&body).into_owned(), str::to_owned);
                return Err(FollowError::Refused { status, code, message });
            }
            Ok(response) if response.status().is_success() => {
                let mut events = std::pin::pin!(events(response.bytes_stream()));
                while let Some(event) = events.next().await {
                    if event.seq <= last {
                        continue;
                    }
                    last = event.seq;
                    progressed = true;
                    on_event(&event);
                    if is_terminal(&event) {
                        let status = event.data["status"].as_str().and_then(TaskStatus::parse);
                        return Ok(status.expect("is_terminal checked it"));
                    }
                }
            }
            // A 5xx or a transport error: the relay may be restarting.
            Ok(_) | Err(_) => {}
        }
        failures = if progressed { 0 } else { failures + 1 };
        if failures >= MAX_RECONNECTS {
            return Err(FollowError::GaveUp(failures));
        }
        tokio::time::sleep(Duration::from_millis(250 * u64::from(failures.min(8)))).await;
    }
}

/// The task events of an SSE body, in the order sent. Lines are decoded
/// whole, whatever the network's chunks: a character split between two
/// chunks arrives intact. A message that is no event (a comment, a `retry:`
/// hint) is skipped; the stream ends at the body's end, at a transport error
/// or at a line that is not SSE, and the caller resumes from the last event.
fn events<E>(body: impl Stream<Item = Result<Bytes, E>>) -> impl Stream<Item = Event>
where
    E: std::error::Error + Send + Sync + 'static,
{
    SseStream::from_bytes_stream(body).take_while(|message| future::ready(message.is_ok())).filter_map(|message| {
        let data = message.ok().and_then(|message| message.data);
        future::ready(data.and_then(|data| serde_json::from_str(&data).ok()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&[u8]]) -> impl Stream<Item = Result<Bytes, std::io::Error>> + use<> {
        let parts: Vec<_> = parts.iter().map(|part| Ok(Bytes::copy_from_slice(part))).collect();
        futures_util::stream::iter(parts)
    }

    async fn collect(parts: &[&[u8]]) -> Vec<Event> {
        events(chunks(parts)).collect().await
    }

    const PROGRESS: &str = "id: 3\nevent: progress\ndata: {\"seq\":3,\"type\":\"progress\",\"data\":{\"message\":\"caf\u{e9} \u{1f600}\"},\"at\":\"2026-11-30T00:00:00Z\"}\n\n";

    #[tokio::test]
    async fn a_character_split_between_chunks_arrives_whole() {
        let bytes = PROGRESS.as_bytes();
        let whole = collect(&[bytes]).await;
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].data["message"], "caf\u{e9} \u{1f600}");
        // Every cut, including inside the two- and four-byte characters.
        for cut in 1..bytes.len() {
            let split = collect(&[&bytes[..cut], &bytes[cut..]]).await;
            assert_eq!(split.len(), 1, "cut at byte {cut}");
            assert_eq!(split[0].data, whole[0].data, "cut at byte {cut}");
        }
    }

    #[tokio::test]
    async fn comments_and_hints_are_skipped_and_events_keep_their_order() {
        let hint = b"retry: 2000\n\n: keep-alive\n\n";
        let second = PROGRESS.replace("id: 3", "id: 4").replace("\"seq\":3", "\"seq\":4");
        let seen = collect(&[hint, PROGRESS.as_bytes(), second.as_bytes()]).await;
        assert_eq!(seen.iter().map(|event| event.seq).collect::<Vec<_>>(), [3, 4]);
    }

    #[tokio::test]
    async fn a_broken_message_ends_the_stream_before_anything_after_it() {
        let broken = b"data: {\"seq\":\n\nnot a field\n\n";
        let after = PROGRESS.replace("id: 3", "id: 9").replace("\"seq\":3", "\"seq\":9");
        let seen = collect(&[PROGRESS.as_bytes(), broken, after.as_bytes()]).await;
        // Unparsable data is skipped; a line that is not SSE ends the read (the
        // caller reconnects from seq 3), so seq 9 is not taken from this body.
        assert_eq!(seen.iter().map(|event| event.seq).collect::<Vec<_>>(), [3]);
    }
}
