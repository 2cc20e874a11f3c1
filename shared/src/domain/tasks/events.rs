//! The durable event log of a task (docs/architecture.md#task-events-and-the-sse-relay): `task_events`, with `seq`
//! allocated from the task row's counter so it starts at 1 and has no gaps,
//! and the Redis doorbell that tells watchers a new event is there.
//!
//! An event is first **appended** (committed to Postgres), then **published**
//! to `task:<ulid>:events` as its JSON. Pub/Sub keeps nothing, so the table
//! is the truth: a publish that fails is logged and the event stays, to be
//! replayed by the relay from Postgres.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgConnection;
use time::OffsetDateTime;

use crate::domain::ids::Id;
use crate::infra::redis_client::RedisClient;

/// What an event says; stored as its lower-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    Status,
    Progress,
    Log,
    Result,
    Error,
    /// The task was paid with a credit a failed paid task left on the space.
    CreditUsed,
    /// The task's payment landed on chain after its request was answered
    /// `payment_pending`: the server created the task once it saw the charge.
    PaymentSettledLate,
    /// The worker running the task stopped renewing its lease (it died, or
    /// lost Postgres for longer than the lease) and another run took over:
    /// `{"attempt": <the run that lost it>, "lapsed_at": <RFC 3339>}`, just
    /// before the new run's `running` status.
    LeaseLost,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Status => "status",
            EventType::Progress => "progress",
            EventType::Log => "log",
            EventType::Result => "result",
            EventType::Error => "error",
            EventType::CreditUsed => "credit_used",
            EventType::PaymentSettledLate => "payment_settled_late",
            EventType::LeaseLost => "lease_lost",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "status" => EventType::Status,
            "progress" => EventType::Progress,
            "log" => EventType::Log,
            "result" => EventType::Result,
            "error" => EventType::Error,
            "credit_used" => EventType::CreditUsed,
            "payment_settled_late" => EventType::PaymentSettledLate,
            "lease_lost" => EventType::LeaseLost,
            _ => return None,
        })
    }
}

/// The `type` column as stored: a row with any other text is corrupt.
impl TryFrom<String> for EventType {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        EventType::parse(&s).ok_or_else(|| format!("unknown event type {s:?}"))
    }
}

/// One event, serialised as `{"seq","type","data","at"}`, and read from
/// the columns of the same names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Event {
    pub seq: i64,
    #[serde(rename = "type")]
    #[sqlx(rename = "type", try_from = "String")]
    pub kind: EventType,
    pub data: Value,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// Appends an event to a task's log and returns it with its `seq`.
///
/// The counter bump and the insert are one statement, so they are atomic
/// even outside a transaction, and the row lock on the task serialises
/// concurrent writers: no two events share a `seq`, and none is skipped.
/// Pass a transaction (`&mut *tx`) to make the event part of a larger change,
/// such as a status transition. `RowNotFound` if the task does not exist.
///
/// Publishing the event to Redis is the caller's job, after commit.
pub async fn append_event(
    conn: &mut PgConnection,
    task_id: Id,
    kind: EventType,
    data: &Value,
) -> Result<Event, sqlx::Error> {
    let row: Option<(i64, OffsetDateTime, String)> = sqlx::query_as(
        "WITH bumped AS (
             UPDATE tasks SET last_seq = last_seq + 1 WHERE id = $1 RETURNING id, last_seq, kind
         ), inserted AS (
             INSERT INTO task_events (task_id, seq, type, data)
             SELECT id, last_seq, $2, $3 FROM bumped
             RETURNING seq, at
         )
         SELECT inserted.seq, inserted.at, bumped.kind FROM inserted, bumped",
    )
    .bind(task_id)
    .bind(kind.as_str())
    .bind(sqlx::types::Json(data))
    .fetch_optional(conn)
    .await?;
    let (seq, at, task_kind) = row.ok_or(sqlx::Error::RowNotFound)?;
    if kind == EventType::Status {
        crate::infra::metrics::task_status(&task_kind, seq, data);
    }
    Ok(Event { seq, kind, data: data.clone(), at })
}

/// A task's events after `after_seq`, in order: what a watcher replays.
pub async fn events_after(conn: &mut PgConnection, task_id: Id, after_seq: i64) -> Result<Vec<Event>, sqlx::Error> {
    sqlx::query_as("SELECT seq, type, data, at FROM task_events WHERE task_id = $1 AND seq > $2 ORDER BY seq")
        .bind(task_id)
        .bind(after_seq)
        .fetch_all(conn)
        .await
}

/// The Redis channel a task's events are published on: `task:<ulid>:events`.
pub fn channel(task_id: Id) -> String {
    format!("task:{task_id}:events")
}

/// How long one PUBLISH may take before it counts as failed.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);
/// After a failed PUBLISH, further ones are skipped for this long: a worker
/// with Redis down must not spend seconds per progress event on a doorbell
/// nobody can hear. The events are in Postgres all the same.
pub const PUBLISH_PAUSE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("PUBLISH timed out after {}ms", PUBLISH_TIMEOUT.as_millis())]
    Timeout,
    /// A recent PUBLISH failed; this one was not tried.
    #[error("publishing paused after a recent failure")]
    Paused,
}

/// Publishes committed events to Redis, with a short timeout and a pause
/// after a failure (see [`PUBLISH_PAUSE`]). One per process, shared: a
/// clone shares the connection and the pause.
#[derive(Clone)]
pub struct Publisher {
    redis: Arc<RedisClient>,
    paused_until: Arc<Mutex<Option<Instant>>>,
}

impl Publisher {
    pub fn new(redis: RedisClient) -> Self {
        Publisher { redis: Arc::new(redis), paused_until: Arc::new(Mutex::new(None)) }
    }

    pub fn redis(&self) -> &RedisClient {
        &self.redis
    }

    /// PUBLISHes `event` on the task's [`channel`]; `Ok(n)` is the number of
    /// subscribers that got it. Call it only after the event's transaction
    /// has committed, so a watcher that hears the bell finds it in Postgres.
    pub async fn publish(&self, task_id: Id, event: &Event) -> Result<usize, PublishError> {
        if self.paused_until.lock().expect("not poisoned").is_some_and(|until| Instant::now() < until) {
            return Err(PublishError::Paused);
        }
        let result = publish_once(&self.redis, task_id, event).await;
        *self.paused_until.lock().expect("not poisoned") =
            if result.is_err() { Some(Instant::now() + PUBLISH_PAUSE) } else { None };
        result
    }

    /// [`publish`](Self::publish), logging a failure instead of returning it:
    /// the event is already durable, so there is nothing for a caller to do.
    pub async fn publish_logged(&self, task_id: Id, event: &Event) {
        match self.publish(task_id, event).await {
            Ok(_) => {}
            Err(PublishError::Paused) => {
                tracing::debug!(%task_id, seq = event.seq, "event not published: Redis paused after a failure");
            }
            Err(e) => {
                tracing::warn!(%task_id, seq = event.seq, error = %e, "event not published; it is stored and will be replayed");
            }
        }
    }

    /// Publishes events committed together, in order.
    pub async fn publish_all(&self, task_id: Id, events: &[Event]) {
        for event in events {
            self.publish_logged(task_id, event).await;
        }
    }
}

/// Appends one event of a running task (progress or log), setting
/// `tasks.progress` to `progress` when given, in one statement fenced on the
/// run (`attempt`). `None`: the run lost the task, and nothing was written.
/// What a worker's executor reports and what a service reports on its
/// attempt (`domain::executors::service`) both become events here.
///
/// A progress event of a task whose webhook asks for `progress` (its own
/// subscription, else its Space's default) writes that webhook's outbox row
/// in the same statement, unless one is pending already: progress is
/// coalesced, one delivery at a time (see `domain::webhooks::PROGRESS`).
pub async fn running_event(
    db: impl sqlx::PgExecutor<'_>,
    id: Id,
    attempt: i32,
    progress: Option<f32>,
    kind: EventType,
    data: &Value,
) -> Result<Option<Event>, sqlx::Error> {
    let row: Option<(i64, OffsetDateTime)> = sqlx::query_as(
        "WITH held AS (
             UPDATE tasks SET progress = COALESCE($3, progress), last_seq = last_seq + 1, updated_at = now()
              WHERE id = $1 AND status = 'running' AND attempts = $2
          RETURNING id, last_seq, space_idx, webhook_url, webhook_events, reruns
         ), outbox AS (
             INSERT INTO webhook_deliveries (id, task_id, space_idx, url, event, rerun)
             SELECT $6, held.id, held.space_idx, sub.url, 'progress', held.reruns
               FROM held
               LEFT JOIN space_webhooks space_default ON space_default.space_idx = held.space_idx
              CROSS JOIN LATERAL (
                    SELECT coalesce(held.webhook_url, space_default.url) AS url,
                           CASE WHEN held.webhook_url IS NULL THEN space_default.events
                                ELSE held.webhook_events END AS events
                    ) sub
              WHERE $4 = 'progress' AND sub.url IS NOT NULL AND 'progress' = ANY(sub.events)
             ON CONFLICT (task_id) WHERE event = 'progress' AND status = 'pending' DO NOTHING
         )
         INSERT INTO task_events (task_id, seq, type, data)
         SELECT id, last_seq, $4, $5 FROM held
         RETURNING seq, at",
    )
    .bind(id)
    .bind(attempt)
    .bind(progress)
    .bind(kind.as_str())
    .bind(sqlx::types::Json(data))
    .bind(Id::new())
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(seq, at)| Event { seq, kind, data: data.clone(), at }))
}

/// One PUBLISH of a committed event on the task's [`channel`], bounded by
/// [`PUBLISH_TIMEOUT`]; `Ok(n)` is the number of subscribers that got it.
/// For a process that publishes now and then (the API's cancel); a worker
/// publishing a stream of events uses a [`Publisher`].
pub async fn publish_once(redis: &RedisClient, task_id: Id, event: &Event) -> Result<usize, PublishError> {
    let payload = serde_json::to_string(event).expect("events serialise");
    let attempt = async {
        let mut conn = redis.connection().await?;
        redis::cmd("PUBLISH").arg(channel(task_id)).arg(payload).query_async::<usize>(&mut conn).await
    };
    match tokio::time::timeout(PUBLISH_TIMEOUT, attempt).await {
        Ok(Ok(receivers)) => Ok(receivers),
        Ok(Err(e)) => Err(PublishError::Redis(e)),
        Err(_) => Err(PublishError::Timeout),
    }
}

/// [`publish_once`] for each event in order, logging a failure: the events
/// are in Postgres already, and the relay replays them from there.
pub async fn publish_all_once(redis: &RedisClient, task_id: Id, events: &[Event]) {
    for event in events {
        if let Err(e) = publish_once(redis, task_id, event).await {
            tracing::warn!(%task_id, seq = event.seq, error = %e, "event not published; it is stored and will be replayed");
            return;
        }
    }
}
