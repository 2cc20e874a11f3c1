//! Quotas for what is free: how many tasks of a free kind one space may
//! create per hour, and have queued or running at once (the catalog's
//! `[tasks.<kind>.quota]`).
//!
//! Spaces cost nothing to make, and the operator pays for every run of a
//! free task, so free work needs a ceiling of its own; a priced task's
//! ceiling is its payment, and it is never counted here.
//!
//! The check and the insert are one statement, in a transaction of its own,
//! that first takes a lock on (space, kind) and counts after it (the
//! database function `quota_lock_and_count`), so concurrent creates of one
//! space queue up and each one counts the tasks the others stored: a burst
//! of parallel requests cannot slip past the quota together. Other spaces, and other kinds, never wait
//! for it.
//!
//! The hour is a sliding one: a task counts for the 60 minutes after it was
//! created, whatever became of it (failed and canceled ones too: they ran,
//! or could have). "At once" counts the space's `queued` and `running`
//! tasks of the kind.

use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use utoipa::ToSchema;

use super::{CreateError, Created, Task, TaskRequest, bind_queued};
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::{Catalog, Quota, TaskSpec};
use crate::domain::ids::Id;

/// What a client over the at-once cap is told to wait: a free task's run
/// is short, and its stream says when it ends.
pub const AT_ONCE_RETRY: Duration = Duration::from_secs(5);

/// A create refused by a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {limit}")]
pub struct QuotaExceeded {
    pub kind: String,
    pub limit: Limit,
    /// When a create may succeed again: when the oldest task of the hour
    /// leaves it, or [`AT_ONCE_RETRY`].
    pub retry_after: Duration,
}

impl QuotaExceeded {
    /// Whole seconds until a create may succeed again (at least 1).
    pub fn retry_after_seconds(&self) -> u64 {
        self.retry_after.as_secs().max(1)
    }

    /// What the client is told, for people.
    pub fn message(&self) -> String {
        let kind = &self.kind;
        match self.limit {
            Limit::PerHour(n) => format!(
                "this Space created {n} {kind} tasks in the last hour, as many as it may; the next may come in {} s",
                self.retry_after_seconds()
            ),
            Limit::AtOnce(n) => {
                format!("this Space has {n} {kind} tasks queued or running, as many as it may; wait for one to end")
            }
        }
    }
}

/// Which ceiling was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Limit {
    #[error("{0} tasks per hour")]
    PerHour(u32),
    #[error("{0} tasks at once")]
    AtOnce(u32),
}

/// One ceiling and how much of it a space has used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Used {
    pub limit: u32,
    pub used: u32,
}

/// A space's use of one free kind's quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(as = QuotaUse)]
pub struct QuotaUse {
    pub kind: String,
    /// Tasks created in the last 60 minutes.
    pub per_hour: Used,
    /// Tasks queued or running now.
    pub at_once: Used,
}

/// Stores `new` as [`super::create`] does, unless `spec`'s quota refuses
/// it (`Err`; nothing is stored). The create's own outcome is the `Ok`: a
/// new task, one an idempotency key named before, or its error. A task
/// without a quota (a priced one) is stored as is.
pub async fn create(
    db: &PgPool,
    new: TaskRequest<'_>,
    spec: &TaskSpec,
) -> Result<Result<Created, CreateError>, QuotaExceeded> {
    let Some(quota) = spec.quota else {
        return Ok(super::create(db, new).await);
    };
    match create_within(db, new, quota).await {
        Ok(Admitted::Stored(created)) => Ok(Ok(*created)),
        Ok(Admitted::Refused(exceeded)) => Err(exceeded),
        Err(e) => Ok(Err(e)),
    }
}

// Boxed: a task (with its metered payment) dwarfs the refusal.
enum Admitted {
    Stored(Box<Created>),
    Refused(QuotaExceeded),
}

async fn create_within(db: &PgPool, new: TaskRequest<'_>, quota: Quota) -> Result<Admitted, CreateError> {
    // One statement, so one transaction of its own: `quota_lock_and_count`
    // locks (space, kind) until it ends and counts after the lock (migration
    // 0009 says why that is a function), and the task is inserted only under
    // both ceilings. The next create of this space and kind counts after
    // this one is stored or given up.
    let sql = concat!(
        "WITH used AS (SELECT this_hour, unfinished FROM quota_lock_and_count($2, $3)), ",
        insert_queued_ctes!("FROM used WHERE used.this_hour < $7 AND used.unfinished < $8"),
        " SELECT used.this_hour, used.unfinished, ",
        task_columns!(),
        " FROM used LEFT JOIN task ON true"
    );
    let row = bind_queued(sqlx::query_as::<_, Admission>(sql), new)
        .bind(i64::from(quota.per_hour))
        .bind(i64::from(quota.at_once))
        .fetch_one(db)
        .await?;
    if let Some(task) = row.task {
        super::count_created(&task);
        return Ok(Admitted::Stored(Box::new(Created::New(task))));
    }
    let limit = if row.this_hour >= i64::from(quota.per_hour) {
        Limit::PerHour(quota.per_hour)
    } else if row.unfinished >= i64::from(quota.at_once) {
        Limit::AtOnce(quota.at_once)
    } else {
        // Under both ceilings, so the idempotency key is taken: by this same
        // request (its task is answered again) or by another one (a
        // conflict). Create tells which.
        return Ok(Admitted::Stored(Box::new(super::create(db, new).await?)));
    };
    let retry_after = match limit {
        Limit::PerHour(n) => hour_frees_in(db, new.space, new.kind, n).await?,
        Limit::AtOnce(_) => AT_ONCE_RETRY,
    };
    tracing::info!(kind = new.kind, %limit, "free task refused: quota exceeded");
    Ok(Admitted::Refused(QuotaExceeded { kind: new.kind.to_owned(), limit, retry_after }))
}

/// The counts the admission read, and the task it stored, if any.
struct Admission {
    this_hour: i64,
    unfinished: i64,
    task: Option<Task>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for Admission {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        // Without a stored task, its columns are NULL (the LEFT JOIN).
        let stored = row.try_get::<Option<Id>, _>("id")?.is_some();
        Ok(Admission {
            this_hour: row.try_get("this_hour")?,
            unfinished: row.try_get("unfinished")?,
            task: if stored { Some(Task::from_row(row)?) } else { None },
        })
    }
}

/// How long until the hour holds fewer than `per_hour` tasks: until the
/// `per_hour`-th newest of them is an hour old.
async fn hour_frees_in(db: &PgPool, space: &SpaceIndex, kind: &str, per_hour: u32) -> Result<Duration, sqlx::Error> {
    let seconds: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM created_at + interval '1 hour' - now())::float8
           FROM tasks
          WHERE space_idx = $1 AND kind = $2 AND created_at > now() - interval '1 hour'
          ORDER BY created_at DESC
          OFFSET $3 - 1 LIMIT 1",
    )
    .bind(space.as_bytes())
    .bind(kind)
    .bind(i64::from(per_hour))
    .fetch_optional(db)
    .await?;
    Ok(Duration::from_secs(seconds.map_or(1.0, f64::ceil).max(1.0) as u64))
}

/// The space's use of every free kind's quota, in the catalog's order.
pub async fn usage(db: &PgPool, catalog: &Catalog, space: &SpaceIndex) -> Result<Vec<QuotaUse>, sqlx::Error> {
    let free: Vec<(&String, Quota)> =
        catalog.tasks.iter().filter_map(|(kind, spec)| Some((kind, spec.quota?))).collect();
    let kinds: Vec<&str> = free.iter().map(|(kind, _)| kind.as_str()).collect();
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT kind,
                count(*) FILTER (WHERE created_at > now() - interval '1 hour'),
                count(*) FILTER (WHERE status IN ('queued', 'running'))
           FROM tasks
          WHERE space_idx = $1 AND kind = ANY($2)
            AND (created_at > now() - interval '1 hour' OR status IN ('queued', 'running'))
          GROUP BY kind",
    )
    .bind(space.as_bytes())
    .bind(&kinds)
    .fetch_all(db)
    .await?;
    let used = |kind: &str| rows.iter().find(|(k, _, _)| k == kind).map_or((0, 0), |(_, hour, now)| (*hour, *now));
    Ok(free
        .into_iter()
        .map(|(kind, quota)| {
            let (hour, now) = used(kind);
            QuotaUse {
                kind: kind.clone(),
                per_hour: Used { limit: quota.per_hour, used: u32::try_from(hour).unwrap_or(u32::MAX) },
                at_once: Used { limit: quota.at_once, used: u32::try_from(now).unwrap_or(u32::MAX) },
            }
        })
        .collect())
}
