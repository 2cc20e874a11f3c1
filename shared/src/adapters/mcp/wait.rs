//! Following a task until it ends, for a tool called with `wait_seconds`.
//!
//! It reads the task's durable event log, the same log the relay replays,
//! a few times a second: no Redis subscription to open per call (a Lambda
//! would pay for one at every invocation), and nothing is missed between
//! two reads, since every event stays in Postgres. Each new `progress`
//! event becomes a `notifications/progress` when the request carried a
//! `progressToken` and the transport streams.

use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleServer};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::domain::tasks::{self, EventType, Task};

/// The longest a tool waits: a Lambda behind API Gateway must answer within
/// its 30 s integration timeout, with room left to write the answer.
pub const MAX_WAIT_SECONDS: u64 = 25;

/// How often the event log is read while waiting.
const POLL: Duration = Duration::from_millis(200);

/// Kept free before an invocation's deadline after a wait: reading the task
/// and writing the answer.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(2);

/// `wait` cut to what is left of `deadline` (a Lambda invocation's) less
/// [`ANSWER_MARGIN`], measured now; zero when nothing is left.
pub fn within(wait: Duration, deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(deadline) => wait.min(deadline.saturating_duration_since(Instant::now()).saturating_sub(ANSWER_MARGIN)),
        None => wait,
    }
}

/// Where progress goes: the caller's peer and the token it sent.
pub struct Progress {
    pub peer: Peer<RoleServer>,
    pub token: ProgressToken,
}

/// The task once it has ended, or as it is after `wait` (`None` when it
/// vanished, which only deleting its Space does).
pub async fn until_done(
    db: &PgPool,
    space: &SpaceIndex,
    id: Id,
    wait: Duration,
    progress: Option<&Progress>,
) -> Result<Option<Task>, sqlx::Error> {
    let deadline = Instant::now() + wait;
    let mut seen = 0i64;
    let mut last_fraction = -1.0f64;
    loop {
        // The task first, then its events: every event of a task read as
        // ended is in the log by then (the end and its events are one
        // write), so a task that ends between two polls still has each of
        // its progress events sent before the answer.
        let task = tasks::find_for_space(db, space, id).await?;
        if let Some(progress) = progress {
            let events = {
                let mut conn = db.acquire().await?;
                tasks::events_after(&mut conn, id, seen).await?
            };
            for event in events {
                seen = event.seq;
                let fraction = event.data.get("fraction").and_then(|f| f.as_f64());
                if event.kind == EventType::Progress
                    && let Some(fraction) = fraction
                    && fraction > last_fraction
                {
                    last_fraction = fraction;
                    let mut note = ProgressNotificationParam::new(progress.token.clone(), fraction).with_total(1.0);
                    if let Some(detail) = progress_message(&event.data) {
                        note = note.with_message(detail);
                    }
                    // A client that went away gets no more; the wait goes on
                    // for the answer rmcp will drop.
                    let _ = progress.peer.notify_progress(note).await;
                }
            }
        }
        match task {
            Some(task) if !task.status.is_terminal() && Instant::now() < deadline => {}
            other => return Ok(other),
        }
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// A line for a progress event: its detail fields other than the fraction
/// (`{"bytes": 1048576, "total": 3145728}` reads `bytes 1048576, total 3145728`).
fn progress_message(data: &serde_json::Value) -> Option<String> {
    let fields: Vec<String> = data
        .as_object()?
        .iter()
        .filter(|(name, _)| *name != "fraction")
        .map(|(name, value)| match value {
            serde_json::Value::String(s) => format!("{name} {s}"),
            other => format!("{name} {other}"),
        })
        .collect();
    (!fields.is_empty()).then(|| fields.join(", "))
}
