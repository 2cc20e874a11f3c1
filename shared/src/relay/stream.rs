//! One client's event stream: subscribe first, replay from Postgres after the
//! client's last id, then follow live — never sending a `seq` twice or
//! skipping one, and ending after the task's terminal status.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse;
use futures_util::Stream;
use sqlx::PgPool;
use tokio::sync::{broadcast, mpsc};

use super::{Hub, Signal};
use crate::ids::Id;
use crate::tasks::{Event, EventType, TaskStatus, events_after};

/// How long a client should wait before reconnecting (the SSE `retry:` hint).
pub const RETRY_HINT: Duration = Duration::from_secs(2);

/// Frames buffered per client between the pump and the socket.
const CLIENT_BUFFER: usize = 64;

/// Does this event end the stream?
pub fn is_terminal(event: &Event) -> bool {
    event.kind == EventType::Status
        && event.data["status"].as_str().and_then(TaskStatus::parse).is_some_and(TaskStatus::is_terminal)
}

fn frame(event: &Event) -> sse::Event {
    sse::Event::default()
        .id(event.seq.to_string())
        .event(event.kind.as_str())
        .json_data(event)
        .expect("events serialise")
}

/// The SSE frames for `task` after `after` (the client's last seen seq).
/// The work runs in its own task that ends when the client goes away.
pub async fn events(db: PgPool, hub: Hub, task: Id, after: i64) -> impl Stream<Item = Result<sse::Event, Infallible>> {
    // Subscribe before reading Postgres: an event published in between is
    // then in one or the other, never in neither.
    let mut subscription = hub.subscribe(task).await;
    let (tx, rx) = mpsc::channel(CLIENT_BUFFER);
    tokio::spawn(async move {
        let mut pump = Pump { db, task, last: after, tx, first: true };
        if let Err(e) = pump.run(&mut subscription.receiver).await {
            tracing::warn!(%task, error = %e, "event stream ended early");
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|frame| (Ok(frame), rx)) })
}

struct Pump {
    db: PgPool,
    task: Id,
    last: i64,
    tx: mpsc::Sender<sse::Event>,
    first: bool,
}

enum Flow {
    Continue,
    /// The terminal status went out, or the client left.
    Done,
}

impl Pump {
    async fn run(&mut self, live: &mut broadcast::Receiver<Signal>) -> Result<(), sqlx::Error> {
        if let Flow::Done = self.replay().await? {
            return Ok(());
        }
        // A finished task whose events the client has all: close at once.
        let (status, last_seq): (String, i64) = sqlx::query_as("SELECT status, last_seq FROM tasks WHERE id = $1")
            .bind(self.task)
            .fetch_one(&self.db)
            .await?;
        if TaskStatus::parse(&status).is_some_and(TaskStatus::is_terminal) && self.last >= last_seq {
            return Ok(());
        }
        loop {
            let flow = match live.recv().await {
                Ok(Signal::Event(event)) if event.seq <= self.last => Flow::Continue,
                Ok(Signal::Event(event)) if event.seq == self.last + 1 => self.send(&event).await,
                // A gap (a message lost in Redis), a reconnect, or this
                // client fell behind the broadcast buffer: Postgres has it all.
                Ok(Signal::Event(_)) | Ok(Signal::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    crate::metrics::relay_resync();
                    self.replay().await?
                }
                Err(broadcast::error::RecvError::Closed) => Flow::Done,
            };
            if let Flow::Done = flow {
                return Ok(());
            }
        }
    }

    async fn replay(&mut self) -> Result<Flow, sqlx::Error> {
        let mut conn = self.db.acquire().await?;
        let events = events_after(&mut conn, self.task, self.last).await?;
        drop(conn);
        for event in &events {
            if let Flow::Done = self.send(event).await {
                return Ok(Flow::Done);
            }
        }
        Ok(Flow::Continue)
    }

    async fn send(&mut self, event: &Event) -> Flow {
        let mut frame = frame(event);
        if std::mem::take(&mut self.first) {
            frame = frame.retry(RETRY_HINT);
        }
        if self.tx.send(frame).await.is_err() {
            return Flow::Done;
        }
        self.last = event.seq;
        if is_terminal(event) { Flow::Done } else { Flow::Continue }
    }
}
