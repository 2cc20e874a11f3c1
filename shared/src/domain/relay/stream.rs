//! One client's event stream: subscribe first, replay from Postgres after the
//! client's last id, then follow live — never yielding a `seq` twice or
//! skipping one, and ending after the task's terminal status.
//!
//! The stream is a plain state machine polled by the HTTP response body: it
//! has no task of its own and no buffer beyond one replay page, so a client
//! that goes away drops it (and its subscription) whether or not an event
//! ever comes. It yields domain events; turning them into SSE frames is the
//! HTTP layer's job.

use std::sync::Arc;

use futures_util::Stream;
use serde_json::Value;
use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::sync::broadcast::error::RecvError;

use super::hub::{Hub, Signal, Subscription};
use super::streams::StreamSlot;
use crate::domain::ids::Id;
use crate::domain::tasks::{Event, EventType, TaskStatus};

/// Events read from Postgres per replay query: a client far behind pages
/// through its backlog instead of loading it whole.
pub const REPLAY_PAGE: i64 = 200;

/// What a client's stream yields.
#[derive(Debug, Clone)]
pub enum Delivery {
    Event(Arc<Event>),
    /// The relay could not read Postgres; the stream ends here, and the
    /// client should reconnect with its last event id.
    Interrupted,
}

/// Does this event end the stream?
pub fn is_terminal(event: &Event) -> bool {
    event.kind == EventType::Status
        && event.data["status"].as_str().and_then(TaskStatus::parse).is_some_and(TaskStatus::is_terminal)
}

/// Where a task stood when the client connected (read while checking that
/// the client may watch it).
#[derive(Debug, Clone, Copy)]
pub struct TaskPosition {
    pub last_seq: i64,
    pub finished: bool,
}

/// Where a stream resumes: after the client's last seen seq, but never past
/// what the task holds.
///
/// - A finished task's last event is its terminal status (every writer is
///   fenced on the task's status, so nothing is appended after it). A client
///   that has it, or claims to be past it, is sent it again and the stream
///   ends: an EventSource that was only closed on would reconnect for ever.
/// - An unfinished task's events past `last_seq` do not exist yet, so a
///   client cannot have seen them: waiting for the seq it names would skip
///   the task's real events, its terminal status among them, and never end.
pub fn resume_after(after: i64, position: TaskPosition) -> i64 {
    if position.finished { after.min(position.last_seq - 1).max(0) } else { after.min(position.last_seq) }
}

/// The events of `task` after `after` (the client's last seen seq). The
/// stream holds `slot` (its place under the relay's caps) until it is
/// dropped, and reads Postgres with its turns.
pub async fn events(
    db: PgPool,
    hub: Hub,
    slot: StreamSlot,
    task: Id,
    after: i64,
    position: TaskPosition,
) -> impl Stream<Item = Delivery> + Send + 'static {
    hub.watch_postgres(&db);
    // A finished task has everything in Postgres: nothing to subscribe to.
    // Otherwise subscribe before reading Postgres: an event published in
    // between is then in one or the other, never in neither.
    let subscription = if position.finished { None } else { Some(hub.subscribe(task).await) };
    let watch = Watch {
        db,
        slot,
        task,
        subscription,
        last: resume_after(after, position),
        page: Vec::new().into_iter(),
        replay: true,
        done: false,
    };
    futures_util::stream::unfold(watch, |mut watch| async move {
        let delivery = watch.next().await?;
        Some((delivery, watch))
    })
}

struct Watch {
    db: PgPool,
    slot: StreamSlot,
    task: Id,
    /// `None` for a finished task: its replay is all there is.
    subscription: Option<Subscription>,
    last: i64,
    /// The rest of the current replay page.
    page: std::vec::IntoIter<Arc<Event>>,
    /// Postgres may hold events after `last` that live delivery missed.
    replay: bool,
    done: bool,
}

impl Watch {
    async fn next(&mut self) -> Option<Delivery> {
        loop {
            if self.done {
                return None;
            }
            if let Some(event) = self.page.next() {
                if event.seq == self.last + 1 {
                    return Some(self.deliver(event));
                }
                continue;
            }
            // The page is spent: let its allocation go before waiting.
            self.page = Vec::new().into_iter();
            if self.replay {
                match self.read_page().await {
                    Ok(page) => {
                        // A short page is the end of what Postgres holds.
                        self.replay = page.len() as i64 == REPLAY_PAGE;
                        if let (Some(last), Some(subscription)) = (page.last(), &self.subscription) {
                            subscription.observe(last.seq);
                        }
                        self.page = page.into_iter();
                    }
                    Err(e) => {
                        tracing::warn!(task = %self.task, error = %e, "event stream interrupted: postgres read failed");
                        self.done = true;
                        return Some(Delivery::Interrupted);
                    }
                }
                continue;
            }
            // A finished task's replay ended short of its terminal status:
            // there is nothing more to wait for.
            let Some(subscription) = self.subscription.as_mut() else {
                self.done = true;
                return None;
            };
            match subscription.receiver.recv().await {
                Ok(Signal::Event(event)) if event.seq <= self.last => {}
                Ok(Signal::Event(event)) if event.seq == self.last + 1 => return Some(self.deliver(event)),
                Ok(Signal::Behind(seq)) if seq <= self.last => {}
                // A gap (a message lost in Redis), a reconnect, Postgres
                // ahead of Redis, or this client fell behind the broadcast
                // buffer: Postgres has it all.
                Ok(Signal::Event(_) | Signal::Behind(_) | Signal::Resync) | Err(RecvError::Lagged(_)) => {
                    crate::infra::metrics::relay_resync();
                    self.replay = true
                }
                Err(RecvError::Closed) => {
                    self.done = true;
                    return Some(Delivery::Interrupted);
                }
            }
        }
    }

    fn deliver(&mut self, event: Arc<Event>) -> Delivery {
        self.last = event.seq;
        self.done = is_terminal(&event);
        Delivery::Event(event)
    }

    async fn read_page(&self) -> Result<Vec<Arc<Event>>, sqlx::Error> {
        let _turn = self.slot.read_turn().await;
        let rows: Vec<(i64, String, sqlx::types::Json<Value>, OffsetDateTime)> = sqlx::query_as(
            "SELECT seq, type, data, at FROM task_events WHERE task_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(self.task)
        .bind(self.last)
        .bind(REPLAY_PAGE)
        .fetch_all(&self.db)
        .await?;
        rows.into_iter()
            .map(|(seq, kind, data, at)| {
                let kind = EventType::parse(&kind)
                    .ok_or_else(|| sqlx::Error::Decode(format!("unknown event type {kind:?}").into()))?;
                Ok(Arc::new(Event { seq, kind, data: data.0, at }))
            })
            .collect()
    }
}
