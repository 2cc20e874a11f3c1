//! The worker's own writes to `tasks`: the claim, its lease and the events
//! of a running task, each a conditional `UPDATE`. The status changes that
//! end or hand back a run are [`crate::domain::tasks::transition`]s.
//!
//! A claim bumps `attempts` and hands the new value back: it is the fencing
//! token of that run. Every later write of the run says `… AND status =
//! 'running' AND attempts = $n`, so a worker whose lease expired and was
//! taken over can no longer touch the task: its writes match no row, and it
//! learns it has lost the task. Each write and the events it causes are one
//! statement (a claim over a lapsed lease, one transaction); the events are
//! published after commit.

use std::time::Duration;

use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;

use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::domain::tasks::TaskStatus;
use crate::domain::tasks::events::{Event, EventType, append_event};
use crate::domain::tasks::fairness::{self, Slots};

/// What the worker needs of a task row.
#[derive(Debug, Clone)]
pub struct TaskRow {
    pub id: Id,
    pub space: SpaceIndex,
    pub kind: String,
    pub input: Value,
    pub status: TaskStatus,
    /// Runs started so far (the last run's fencing token).
    pub attempts: i32,
    /// Runs since the task was last re-run (`reeve tasks rerun`), all of
    /// them if never: what the retry limit counts.
    pub tries: i32,
    /// A run holds it under a lease that has not expired.
    pub lease_live: bool,
    /// Its running attempt was handed to its service, and the buyer has
    /// asked to cancel it since: the service is owed a cancel
    /// (docs/executors.md), unless it was sent already.
    pub delegated_cancel: Option<DelegatedCancel>,
}

/// A cancel owed to the service of a delegated attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelegatedCancel {
    /// The attempt's deadline, as its job said.
    pub deadline: OffsetDateTime,
    /// The service has been told.
    pub sent: bool,
}

pub async fn load(db: &PgPool, id: Id) -> Result<Option<TaskRow>, sqlx::Error> {
    type Row = (Vec<u8>, String, sqlx::types::Json<Value>, String, i32, i32, bool, Option<OffsetDateTime>, bool);
    let row: Option<Row> = sqlx::query_as(
        "SELECT space_idx, kind, input, status, attempts, attempts - rerun_from,
                (lease_until IS NOT NULL AND lease_until >= now()),
                CASE WHEN status = 'running' AND lease_until >= now() AND cancel_requested_at IS NOT NULL
                          AND delegated_attempt = attempts THEN delegated_until END,
                cancel_sent_at IS NOT NULL
           FROM tasks WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    row.map(|(space, kind, input, status, attempts, tries, lease_live, delegated_until, sent)| {
        let status = TaskStatus::parse(&status).ok_or_else(|| bad(id, "status"))?;
        let mut row = task_row(id, &space, kind, input.0, status, (attempts, tries), lease_live)?;
        row.delegated_cancel = delegated_until.map(|deadline| DelegatedCancel { deadline, sent });
        Ok(row)
    })
    .transpose()
}

/// Records that the service of the task's delegated attempt `attempt` was
/// told of its cancel.
pub async fn cancel_sent(db: &PgPool, id: Id, attempt: i32) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE tasks SET cancel_sent_at = now() WHERE id = $1 AND attempts = $2 AND status = 'running'")
        .bind(id)
        .bind(attempt)
        .execute(db)
        .await?;
    Ok(())
}

fn bad(id: Id, what: &str) -> sqlx::Error {
    sqlx::Error::Decode(format!("tasks row {id}: bad {what}").into())
}

fn task_row(
    id: Id,
    space: &[u8],
    kind: String,
    input: Value,
    status: TaskStatus,
    (attempts, tries): (i32, i32),
    lease_live: bool,
) -> Result<TaskRow, sqlx::Error> {
    let space = SpaceIndex::from_slice(space).ok_or_else(|| bad(id, "space_idx"))?;
    Ok(TaskRow { id, space, kind, input, status, attempts, tries, lease_live, delegated_cancel: None })
}

/// How many runs `attempt` is of its task since the task was last re-run
/// (`reeve tasks rerun`): `attempt` itself if it never was.
pub async fn tries(db: &PgPool, id: Id, attempt: i32) -> Result<i32, sqlx::Error> {
    let tries: Option<i32> = sqlx::query_scalar("SELECT $2 - rerun_from FROM tasks WHERE id = $1")
        .bind(id)
        .bind(attempt)
        .fetch_optional(db)
        .await?;
    Ok(tries.unwrap_or(attempt))
}

/// A successful claim: the run's fencing token and its events (a
/// `lease_lost` one first when it took over from a run whose lease lapsed,
/// then `status: running`).
#[derive(Debug, Clone)]
pub struct Claim {
    /// The task as claimed: `running`, under this run's lease.
    pub task: TaskRow,
    pub attempt: i32,
    pub events: Vec<Event>,
    /// The run this claim took the task from, when its lease had lapsed.
    pub took_over: Option<Lapsed>,
    /// The owner asked to cancel during an earlier attempt, which was
    /// handed back: the run is to cancel, not start.
    pub cancel_requested: bool,
}

/// A run whose lease lapsed before it ended, found by the claim after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lapsed {
    /// That run's fencing token.
    pub attempt: i32,
    /// From the lapse to this claim; `None` for a running task that had no
    /// lease at all (written before leases were kept).
    pub ago: Option<Duration>,
}

fn secs(lease: Duration) -> f64 {
    lease.as_secs_f64()
}

/// `queued`, or `running` with a lapsed (or missing) lease, becomes
/// `running` with a lease of `lease` from now, if it has had fewer than
/// `max_attempts` runs or its metered capture is under way (which only
/// resumes the capture, and no limit ends). `None` when the task is in
/// neither state (terminal, gone, or held by a live lease) or out of
/// attempts.
///
/// A `queued` task, the common case, is claimed in one statement. Any
/// other is read under lock first, so that a claim over a lapsed lease
/// knows whose run it ends and since when, and says so in the task's log.
pub async fn claim(db: &PgPool, id: Id, lease: Duration, max_attempts: u32) -> Result<Option<Claim>, sqlx::Error> {
    let max_attempts = i32::try_from(max_attempts).unwrap_or(i32::MAX);
    if let Some(claim) = claim_queued(&mut *db.acquire().await?, id, lease, max_attempts).await? {
        return Ok(Some(claim));
    }
    claim_lapsed(db, id, lease, max_attempts).await
}

/// What [`claim_within`] did.
#[derive(Debug)]
pub enum Claimed {
    Run(Box<Claim>),
    /// Not claimed: its Space already runs as many of the tasks `slots`
    /// counts as may run at once. The task is parked, `queued` with its
    /// reason, no attempt counted; the event says so the first time.
    Parked(Option<Event>),
    /// Not claimable, as [`claim`]'s `None`.
    No,
}

/// [`claim`] within the limit of its Space's running tasks (`slots`, its
/// kind's; see [`fairness`]): a `queued` task is claimed only while fewer
/// than that run, counted under the Space's lock in the claim's own
/// statement, else parked. Taking over a lapsed lease is not limited (that
/// task holds its slot), nor resuming a capture under way (its payer's
/// deadline runs).
pub async fn claim_within(
    db: &PgPool,
    id: Id,
    lease: Duration,
    max_attempts: u32,
    slots: &Slots,
) -> Result<Claimed, sqlx::Error> {
    let max = i32::try_from(max_attempts).unwrap_or(i32::MAX);
    // Twice at most: a Space found full, then not full once locked again
    // for the park (a run ended in between), is claimed again once.
    for _ in 0..2 {
        let (claimed, running) = claim_gated(db, id, lease, max, slots).await?;
        if let Some(claim) = claimed {
            return Ok(Claimed::Run(Box::new(claim)));
        }
        if running < i64::from(slots.limit) {
            // Under the limit, yet not claimed as queued: a running task
            // (over a lapsed lease), or not claimable at all.
            return Ok(claim_lapsed(db, id, lease, max).await?.map_or(Claimed::No, |c| Claimed::Run(Box::new(c))));
        }
        let mut tx = db.begin().await?;
        if fairness::lock_and_count(&mut tx, id, slots).await? < i64::from(slots.limit) {
            tx.rollback().await?;
            continue;
        }
        let parked = fairness::park(&mut tx, id, &fairness::wait_reason(slots)).await?;
        tx.commit().await?;
        return match parked {
            Some(event) => Ok(Claimed::Parked(event)),
            // Not queued: a running task (whose takeover is not limited),
            // or not claimable at all.
            None => Ok(claim_lapsed(db, id, lease, max).await?.map_or(Claimed::No, |c| Claimed::Run(Box::new(c)))),
        };
    }
    Ok(Claimed::No)
}

/// [`claim`] of a `running` task whose lease lapsed (or a `queued` one
/// that is out of attempts but for its capture).
async fn claim_lapsed(db: &PgPool, id: Id, lease: Duration, max_attempts: i32) -> Result<Option<Claim>, sqlx::Error> {
    let mut tx = db.begin().await?;
    type Before = (String, i32, Option<OffsetDateTime>, Option<f64>, Vec<u8>, String, sqlx::types::Json<Value>);
    let before: Option<Before> = sqlx::query_as(
        "SELECT status, attempts, lease_until, EXTRACT(EPOCH FROM now() - lease_until)::float8, space_idx, kind, input
           FROM tasks WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let claimed: Option<(i32, i32, bool)> = match before {
        None => None,
        Some(_) => {
            sqlx::query_as(
                "UPDATE tasks
                    SET status = 'running', attempts = attempts + 1,
                        lease_until = now() + make_interval(secs => $2), updated_at = now(),
                        parked_at = NULL, wait_reason = NULL
                  WHERE id = $1 AND (attempts - rerun_from < $3 OR payment->>'status' IN ('capturing', 'charged'))
                    AND (status = 'queued'
                         OR (status = 'running' AND (lease_until IS NULL OR lease_until < now())))
                 RETURNING attempts, attempts - rerun_from, cancel_requested_at IS NOT NULL",
            )
            .bind(id)
            .bind(secs(lease))
            .bind(max_attempts)
            .fetch_optional(&mut *tx)
            .await?
        }
    };
    let (
        Some((attempt, tries, cancel_requested)),
        Some((status, previous, lapsed_at, lapsed_secs, space, kind, input)),
    ) = (claimed, before)
    else {
        tx.rollback().await?;
        return Ok(None);
    };
    let took_over = (status == TaskStatus::Running.as_str())
        .then(|| Lapsed { attempt: previous, ago: lapsed_secs.map(|s| Duration::from_secs_f64(s.max(0.0))) });
    let mut events = Vec::with_capacity(2);
    if let Some(lapsed) = took_over {
        let at = lapsed_at.and_then(|at| at.format(&time::format_description::well_known::Rfc3339).ok());
        let data = json!({ "attempt": lapsed.attempt, "lapsed_at": at });
        events.push(append_event(&mut tx, id, EventType::LeaseLost, &data).await?);
    }
    events
        .push(append_event(&mut tx, id, EventType::Status, &json!({ "status": "running", "attempt": attempt })).await?);
    tx.commit().await?;
    let task = task_row(id, &space, kind, input.0, TaskStatus::Running, (attempt, tries), true)?;
    Ok(Some(Claim { task, attempt, events, took_over, cancel_requested }))
}

/// The CTEs `claimed` and `appended` of a queued task's claim, `$1`–`$3`
/// bound as [`claim_queued`] binds them; `$gate` more conditions.
macro_rules! claim_queued_ctes {
    ($gate:literal) => {
        concat!(
            "claimed AS (
             UPDATE tasks
                SET status = 'running', attempts = attempts + 1, last_seq = last_seq + 1,
                    lease_until = now() + make_interval(secs => $2), updated_at = now(),
                    parked_at = NULL, wait_reason = NULL
              WHERE id = $1 AND status = 'queued' AND (attempts - rerun_from < $3 OR payment->>'status' IN ('capturing', 'charged'))",
            $gate,
            "
          RETURNING id, attempts, attempts - rerun_from AS tries, last_seq, kind, cancel_requested_at IS NOT NULL AS cancel_requested,
                    space_idx, input
         ), appended AS (
             INSERT INTO task_events (task_id, seq, type, data)
             SELECT id, last_seq, 'status', jsonb_build_object('status', 'running', 'attempt', attempts)
               FROM claimed
          RETURNING seq, at
         )"
        )
    };
}

/// What a claim of a queued task answers, from [`claim_queued_ctes`].
macro_rules! claim_queued_select {
    () => {
        "SELECT claimed.attempts, claimed.tries, appended.seq, appended.at, claimed.kind, claimed.cancel_requested,
                claimed.space_idx, claimed.input
           FROM claimed, appended"
    };
}

/// [`claim`] of a `queued` task: the status change and its `running` event
/// in one statement, one round trip. `None` when the task is not `queued`
/// (or out of attempts).
async fn claim_queued(
    conn: &mut PgConnection,
    id: Id,
    lease: Duration,
    max_attempts: i32,
) -> Result<Option<Claim>, sqlx::Error> {
    let row: Option<QueuedRow> = sqlx::query_as(concat!("WITH ", claim_queued_ctes!(""), " ", claim_queued_select!()))
        .bind(id)
        .bind(secs(lease))
        .bind(max_attempts)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|row| claimed_queued(id, row)).transpose()
}

/// [`claim_queued`] within its Space's limit, in one statement that takes
/// the Space's lock and counts after it (`running_lock_and_count`): the
/// claim, if the Space ran fewer than `slots.limit` (or the task's capture
/// is under way), and the count either way.
async fn claim_gated(
    db: &PgPool,
    id: Id,
    lease: Duration,
    max_attempts: i32,
    slots: &Slots,
) -> Result<(Option<Claim>, i64), sqlx::Error> {
    type Row = (
        i64,
        Option<i32>,
        Option<i32>,
        Option<i64>,
        Option<OffsetDateTime>,
        Option<String>,
        Option<bool>,
        Option<Vec<u8>>,
        Option<sqlx::types::Json<Value>>,
    );
    let sql = concat!(
        "WITH gate AS (SELECT running_lock_and_count((SELECT space_idx FROM tasks WHERE id = $1), $4, $5) AS running), ",
        claim_queued_ctes!(" AND ((SELECT running FROM gate) < $6 OR payment->>'status' IN ('capturing', 'charged'))"),
        " SELECT gate.running, c.* FROM gate LEFT JOIN (",
        claim_queued_select!(),
        ") c ON true"
    );
    let row: Row = sqlx::query_as(sql)
        .bind(id)
        .bind(secs(lease))
        .bind(max_attempts)
        .bind(slots.kind.as_deref())
        .bind(&slots.others)
        .bind(i64::from(slots.limit))
        .fetch_one(db)
        .await?;
    let (running, attempt, tries, seq, at, kind, cancel_requested, space, input) = row;
    let claim = match (attempt, tries, seq, at, kind, cancel_requested, space, input) {
        (Some(a), Some(t), Some(s), Some(at), Some(k), Some(c), Some(sp), Some(i)) => {
            Some(claimed_queued(id, (a, t, s, at, k, c, sp, i))?)
        }
        _ => None,
    };
    Ok((claim, running))
}

type QueuedRow = (i32, i32, i64, OffsetDateTime, String, bool, Vec<u8>, sqlx::types::Json<Value>);

/// The [`Claim`] a claim of a queued task answered.
fn claimed_queued(id: Id, row: QueuedRow) -> Result<Claim, sqlx::Error> {
    let (attempt, tries, seq, at, kind, cancel_requested, space, input) = row;
    let data = json!({ "status": "running", "attempt": attempt });
    crate::infra::metrics::task_status(&kind, seq, &data);
    let events = vec![Event { seq, kind: EventType::Status, data, at }];
    let task = task_row(id, &space, kind, input.0, TaskStatus::Running, (attempt, tries), true)?;
    Ok(Claim { task, attempt, events, took_over: None, cancel_requested })
}

/// Renews the run's lease: `lease` from now. `false`: the run no longer
/// holds the task (taken over, or moved on by someone else), and nothing
/// was written. Fenced like every other write of the run, so a worker that
/// comes back after its lease was taken cannot renew it.
pub async fn extend_lease(db: &PgPool, id: Id, attempt: i32, lease: Duration) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(
        "UPDATE tasks SET lease_until = now() + make_interval(secs => $3)
          WHERE id = $1 AND status = 'running' AND attempts = $2",
    )
    .bind(id)
    .bind(attempt)
    .bind(secs(lease))
    .execute(db)
    .await?
    .rows_affected();
    Ok(moved == 1)
}

/// Records that the run's attempt was handed to its service until
/// `deadline` (it answered the job `202`), with a fresh lease, never past
/// the deadline, for the service's first report to renew. `false`: the run
/// no longer holds the task, and nothing was written.
pub async fn delegate(
    db: &PgPool,
    id: Id,
    attempt: i32,
    lease: Duration,
    deadline: OffsetDateTime,
) -> Result<bool, sqlx::Error> {
    let moved = sqlx::query(
        "UPDATE tasks SET delegated_attempt = $2, delegated_until = $4,
                          lease_until = LEAST(now() + make_interval(secs => $3), $4), updated_at = now()
          WHERE id = $1 AND status = 'running' AND attempts = $2",
    )
    .bind(id)
    .bind(attempt)
    .bind(secs(lease))
    .bind(deadline)
    .execute(db)
    .await?
    .rows_affected();
    Ok(moved == 1)
}

/// Appends one event of a running task: the one write a worker's report
/// and a service's report share (`domain::tasks::events`).
pub use crate::domain::tasks::events::running_event;
