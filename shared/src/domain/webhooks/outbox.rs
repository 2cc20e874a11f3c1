//! The outbox, `webhook_deliveries`, and its attempts. A row is written by
//! the statement that ends its task (`tasks::transition`) or subscribes it
//! (`super::subscribe_task`), or records its progress
//! (`tasks::events::running_event`); here the sender claims the rows that are due
//! and records what each attempt got, and the owner reads them.
//!
//! A claim is a lease (`claimed_until`), taken with `FOR UPDATE SKIP LOCKED`:
//! two senders (the sweeper's and a `reeve work`'s) never send one row at
//! once, and a sender that died mid-send leaves its rows to be claimed again
//! once the lease lapses: at least once, never lost.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;

/// A delivery claimed to be sent now.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Due {
    pub id: Id,
    pub task_id: Id,
    pub space_idx: Vec<u8>,
    pub url: String,
    pub event: String,
    /// The task's run series it is about: 0 its first run, n its n-th
    /// re-run by an operator.
    pub rerun: i32,
    /// The task has been re-run since: an end's delivery from before is
    /// superseded, never sent (the re-run's own end will be).
    pub rerun_since: bool,
    /// Attempts made before this one.
    pub attempts: i32,
    /// When the task ended (for progress: when the progress that made the
    /// delivery was recorded): the payload's `timestamp`.
    pub created_at: OffsetDateTime,
    /// A `410` disabled the endpoint for the Space, by this delivery or another.
    pub disabled: bool,
}

impl Due {
    /// The `webhook-id`: the same for every attempt of it, so a receiver
    /// can tell a retry from a new message.
    pub fn message_id(&self) -> String {
        message_id(self.id)
    }
}

/// `msg_<ULID>`, the `webhook-id` of delivery `id`.
pub fn message_id(id: Id) -> String {
    format!("msg_{id}")
}

/// Claims up to `batch` due deliveries for `lease`.
pub async fn claim_due(db: &PgPool, batch: i64, lease: Duration) -> Result<Vec<Due>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE webhook_deliveries d SET claimed_until = now() + make_interval(secs => $2)
          WHERE id IN (
                SELECT id FROM webhook_deliveries
                 WHERE status = 'pending' AND next_attempt_at <= now()
                   AND (claimed_until IS NULL OR claimed_until < now())
                 ORDER BY next_attempt_at LIMIT $1
                   FOR UPDATE SKIP LOCKED)
      RETURNING id, task_id, space_idx, url, event, rerun, attempts, created_at,
                coalesce((SELECT t.reruns > d.rerun FROM tasks t WHERE t.id = d.task_id), false) AS rerun_since,
                EXISTS (SELECT 1 FROM webhook_disabled w WHERE w.space_idx = d.space_idx AND w.url = d.url)
                    AS disabled",
    )
    .bind(batch)
    .bind(lease.as_secs_f64())
    .fetch_all(db)
    .await
}

/// What one attempt got.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The endpoint's HTTP status, if it answered.
    pub status_code: Option<u16>,
    /// What went wrong, for its owner: a timeout, a refused address, a
    /// redirect not followed, a status that is not 2xx.
    pub error: Option<String>,
    pub duration: Duration,
}

/// Where a delivery goes after an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    Delivered,
    /// Tried again after this wait.
    Retry(Duration),
    /// No more attempts: refused, or the schedule is used up.
    Failed,
    /// The endpoint answered `410`, now or before: disabled for the Space.
    Disabled,
    /// Never sent: a progress delivery whose task ended before it was sent,
    /// or an end's whose task an operator ran again before it was
    /// delivered (the re-run's end has a delivery of its own).
    Superseded,
}

impl Next {
    /// The delivery's status after it.
    pub fn status(self) -> &'static str {
        match self {
            Next::Delivered => "delivered",
            Next::Retry(_) => "pending",
            Next::Failed => "failed",
            Next::Disabled => "disabled",
            Next::Superseded => "superseded",
        }
    }
}

/// Records `attempt` (none when nothing was sent: the endpoint was disabled
/// before, or a progress delivery was superseded) and where the delivery
/// goes next, in one transaction; a `410` disables the endpoint for the
/// Space.
pub async fn record(db: &PgPool, due: &Due, attempt: Option<&Attempt>, next: Next) -> Result<(), sqlx::Error> {
    let wait = match next {
        Next::Retry(wait) => Some(wait.as_secs_f64()),
        _ => None,
    };
    let mut tx = db.begin().await?;
    let next_at: Option<OffsetDateTime> = sqlx::query_scalar(
        "UPDATE webhook_deliveries
            SET status = $2, attempts = attempts + $3, claimed_until = NULL, updated_at = now(),
                next_attempt_at = CASE WHEN $4::float8 IS NULL THEN next_attempt_at
                                       ELSE now() + make_interval(secs => $4) END
          WHERE id = $1 AND status = 'pending'
      RETURNING CASE WHEN $4::float8 IS NULL THEN NULL ELSE next_attempt_at END",
    )
    .bind(due.id)
    .bind(next.status())
    .bind(i32::from(attempt.is_some()))
    .bind(wait)
    .fetch_optional(&mut *tx)
    .await?
    .flatten();
    if let Some(attempt) = attempt {
        sqlx::query(
            "INSERT INTO webhook_attempts (delivery_id, n, status_code, error, duration_ms, next_attempt_at)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(due.id)
        .bind(due.attempts + 1)
        .bind(attempt.status_code.map(i32::from))
        .bind(&attempt.error)
        .bind(i64::try_from(attempt.duration.as_millis()).unwrap_or(i64::MAX))
        .bind(next_at)
        .execute(&mut *tx)
        .await?;
    }
    if next == Next::Disabled && attempt.is_some() {
        sqlx::query("INSERT INTO webhook_disabled (space_idx, url) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(&due.space_idx)
            .bind(&due.url)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}

/// A delivery as its owner sees it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DeliveryView {
    /// The `webhook-id` every attempt carries.
    #[schema(example = "msg_01HZX3Y4P5Q6R7S8T9V0W1X2Y3")]
    pub id: String,
    pub url: String,
    /// `completed`, `failed` or `canceled`: how the task ended; or
    /// `progress`, while it ran.
    pub event: String,
    /// Which run of the task it is about: 0 its first, n its n-th re-run by
    /// an operator. Each run's end has its own delivery.
    #[schema(minimum = 0, example = 0)]
    pub rerun: i32,
    /// `pending` (to be tried at `next_attempt_at`), `delivered`, `failed`
    /// (refused, or every retry used), `disabled` (the endpoint answered
    /// `410`, now or for an earlier delivery) or `superseded` (never sent:
    /// a progress delivery whose task ended before it was sent, or an end's
    /// whose task an operator ran again before it was delivered).
    pub status: String,
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Every attempt, oldest first.
    pub attempts: Vec<AttemptView>,
}

/// One attempt.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct AttemptView {
    /// 1 for the first.
    pub n: i32,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The endpoint's answer, if it gave one.
    pub status_code: Option<i32>,
    /// Why it did not count as delivered.
    pub error: Option<String>,
    pub duration_ms: i64,
    /// When it is tried again, after a failure that is retried.
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
}

/// The deliveries of task `id`, oldest first, if it is `space`'s: `None` for a task that
/// is missing or someone else's.
pub async fn for_task(db: &PgPool, space: &SpaceIndex, id: Id) -> Result<Option<Vec<DeliveryView>>, sqlx::Error> {
    let owned: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1 AND space_idx = $2)")
        .bind(id)
        .bind(space.as_bytes())
        .fetch_one(db)
        .await?;
    if !owned {
        return Ok(None);
    }
    type Row = (Id, String, String, i32, String, OffsetDateTime, OffsetDateTime);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, url, event, rerun, status, next_attempt_at, created_at FROM webhook_deliveries
          WHERE task_id = $1 ORDER BY created_at, id",
    )
    .bind(id)
    .fetch_all(db)
    .await?;
    let mut views = Vec::with_capacity(rows.len());
    for (delivery, url, event, rerun, status, next_attempt_at, created_at) in rows {
        let attempts: Vec<AttemptView> = sqlx::query_as(
            "SELECT n, at, status_code, error, duration_ms, next_attempt_at FROM webhook_attempts
              WHERE delivery_id = $1 ORDER BY n",
        )
        .bind(delivery)
        .fetch_all(db)
        .await?;
        let next_attempt_at = (status == "pending").then_some(next_attempt_at);
        views.push(DeliveryView {
            id: message_id(delivery),
            url,
            event,
            rerun,
            status,
            next_attempt_at,
            created_at,
            attempts,
        });
    }
    Ok(Some(views))
}
