//! The client side of the event stream, for `reeve task watch` and
//! `reeve task create --watch`: follows a
//! task's SSE stream to its end, resuming with the last seen id whenever the
//! connection drops, so a flaky network costs no event and no duplicate.

use std::time::Duration;

use futures_util::StreamExt;

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
                let mut body = response.bytes_stream();
                let mut buffer = String::new();
                while let Some(Ok(chunk)) = body.next().await {
                    buffer.push_str(&String::from_utf8_lossy(&chunk));
                    while let Some(end) = buffer.find("\n\n") {
                        let block: String = buffer.drain(..end + 2).collect();
                        let Some(event) = parse_block(&block) else { continue };
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

/// One SSE message block to an event; comments and partial blocks are None.
fn parse_block(block: &str) -> Option<Event> {
    let data: String = block.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
    serde_json::from_str(&data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_parse_to_events_and_comments_are_skipped() {
        let block = "retry: 2000\nid: 3\nevent: progress\ndata: {\"seq\":3,\"type\":\"progress\",\"data\":{\"fraction\":0.5},\"at\":\"2026-11-30T00:00:00Z\"}\n\n";
        let event = parse_block(block).unwrap();
        assert_eq!(event.seq, 3);
        assert_eq!(event.data["fraction"], 0.5);
        assert!(parse_block(":\n\n").is_none());
        assert!(parse_block("data: {\"seq\":\n\n").is_none());
    }
}
