//! The durable event log of a task (DESIGN §8): `task_events`, with `seq`
//! allocated from the task row's counter so it starts at 1 and has no gaps.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgConnection;
use time::OffsetDateTime;

use crate::ids::Id;

/// What an event says; stored as its lower-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    Status,
    Progress,
    Log,
    Result,
    Error,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Status => "status",
            EventType::Progress => "progress",
            EventType::Log => "log",
            EventType::Result => "result",
            EventType::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "status" => EventType::Status,
            "progress" => EventType::Progress,
            "log" => EventType::Log,
            "result" => EventType::Result,
            "error" => EventType::Error,
            _ => return None,
        })
    }
}

/// One event, serialised as `{"seq","type","data","at"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: i64,
    #[serde(rename = "type")]
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
    let row: Option<(i64, OffsetDateTime)> = sqlx::query_as(
        "WITH bumped AS (
             UPDATE tasks SET last_seq = last_seq + 1 WHERE id = $1 RETURNING id, last_seq
         )
         INSERT INTO task_events (task_id, seq, type, data)
         SELECT id, last_seq, $2, $3 FROM bumped
         RETURNING seq, at",
    )
    .bind(task_id)
    .bind(kind.as_str())
    .bind(sqlx::types::Json(data))
    .fetch_optional(conn)
    .await?;
    let (seq, at) = row.ok_or(sqlx::Error::RowNotFound)?;
    Ok(Event { seq, kind, data: data.clone(), at })
}

/// A task's events after `after_seq`, in order: what a watcher replays.
pub async fn events_after(conn: &mut PgConnection, task_id: Id, after_seq: i64) -> Result<Vec<Event>, sqlx::Error> {
    let rows: Vec<(i64, String, sqlx::types::Json<Value>, OffsetDateTime)> =
        sqlx::query_as("SELECT seq, type, data, at FROM task_events WHERE task_id = $1 AND seq > $2 ORDER BY seq")
            .bind(task_id)
            .bind(after_seq)
            .fetch_all(conn)
            .await?;
    rows.into_iter()
        .map(|(seq, kind, data, at)| {
            let kind = EventType::parse(&kind)
                .ok_or_else(|| sqlx::Error::Decode(format!("unknown event type {kind:?}").into()))?;
            Ok(Event { seq, kind, data: data.0, at })
        })
        .collect()
}
