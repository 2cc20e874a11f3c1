//! Bulk operations (issue 41): a [`Filter`] of tasks, and the one per-task
//! change each match gets.
//! - The owner's cancel (`POST /v1/tasks/cancel`, MCP `cancel_tasks`, the
//!   console): [`cancel_owned`], only ever in the caller's Space.
//! - The operators' cancel and re-run (`reeve tasks cancel|rerun`, over
//!   `DATABASE_URL` and the queue): [`Operator`], in batches.
//!
//! A cancel is [`super::cancel`] per task, so each has every effect a single
//! cancel has: its events, a paid task's credit or a metered one's released
//! authorization, its completion webhook's outbox row. A re-run is
//! [`rerun`]. Each bulk operation logs one audit line (target
//! `reeve::audit`): who asked, the filter and the counts.

use serde::Serialize;
use sqlx::PgPool;
use time::OffsetDateTime;

use super::TaskStatus;
use super::cancel::{CancelOutcome, cancel, cancel_any};
use super::events::{Event, publish_all_once};
use super::transition::{Change, Fence, transition_in};
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::domain::payments::{CREDITED_CODES, spend_on_rerun};
use crate::infra::redis_client::RedisClient;

/// The most ids one filter may list.
pub const MAX_IDS: usize = 1000;
/// The most tasks one owner's request acts on, oldest first; `more` says
/// that others are left for the next request.
pub const MAX_PER_REQUEST: usize = 1000;

/// Which tasks: all the fields given must hold (an absent one matches
/// everything). At least one must be given, so that no request cancels a
/// whole Space by omission.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Filter {
    /// Only this Space's tasks: always set for an owner, optional for an
    /// operator. Logged as its index's hex, as every log names a Space.
    #[serde(skip)]
    pub space: Option<SpaceIndex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<Id>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(rename = "status", skip_serializing_if = "Option::is_none")]
    pub statuses: Option<Vec<TaskStatus>>,
    /// A failed task's error code (operators only).
    #[serde(rename = "code", skip_serializing_if = "Option::is_none")]
    pub codes: Option<Vec<String>>,
    #[serde(with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub created_after: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub created_before: Option<OffsetDateTime>,
}

/// How many tasks a filter matches, by what can be done with them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counted {
    pub matched: i64,
    /// Already `completed`, `failed` or `canceled`: nothing to cancel.
    pub ended: i64,
    /// `queued`, or `running` and not yet asked to stop: what a cancel acts on.
    pub open: i64,
    /// `failed` by Reeve's fault ([`failed_by_reeve`]): what a re-run acts on.
    pub rerunnable: i64,
}

/// One matching task.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Match {
    pub id: Id,
    pub kind: String,
    #[sqlx(try_from = "String")]
    pub status: TaskStatus,
    /// A failed task's error code.
    pub code: Option<String>,
    #[sqlx(try_from = "Vec<u8>")]
    pub space: SpaceHex,
}

/// A Space's index as hex, as logs and operators name it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpaceHex(pub String);

impl TryFrom<Vec<u8>> for SpaceHex {
    type Error = String;

    fn try_from(bytes: Vec<u8>) -> Result<Self, String> {
        SpaceIndex::from_slice(&bytes).map(|s| SpaceHex(s.to_hex())).ok_or_else(|| "a space_idx is not 16 bytes".into())
    }
}

/// The tasks a bulk change acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidates {
    /// A cancel's: `queued`, or `running` and not yet asked to stop.
    Open,
    /// A re-run's: `failed` by Reeve's fault.
    Rerunnable,
}

/// Whether a task failed with `code` by Reeve's fault, not its input's:
/// exactly the codes that earn a paid task its credit (a cancel aside), so
/// the same list decides who is owed money and what may run again.
pub fn failed_by_reeve(code: &str) -> bool {
    code != "canceled" && CREDITED_CODES.contains(&code)
}

fn rerunnable_codes() -> Vec<&'static str> {
    CREDITED_CODES.iter().copied().filter(|code| failed_by_reeve(code)).collect()
}

/// The `WHERE` of a filter, as a literal for `concat!` (sqlx takes only
/// `'static` SQL): `$1`–`$7` are bound by [`Filter::bind`].
macro_rules! filtered {
    () => {
        "FROM tasks
          WHERE ($1::bytea IS NULL OR space_idx = $1)
            AND ($2::bytea[] IS NULL OR id = ANY($2))
            AND ($3::text IS NULL OR kind = $3)
            AND ($4::text[] IS NULL OR status = ANY($4))
            AND ($5::text[] IS NULL OR error->>'code' = ANY($5))
            AND ($6::timestamptz IS NULL OR created_at >= $6)
            AND ($7::timestamptz IS NULL OR created_at < $7)"
    };
}

/// A page of candidates after `$8` (an id, or NULL), at most `$9`.
macro_rules! page_of {
    ($which:literal) => {
        concat!(
            "SELECT id, kind, status, error->>'code' AS code, space_idx AS space ",
            filtered!(),
            " AND ($8::bytea IS NULL OR id > $8) AND ",
            $which,
            " ORDER BY id LIMIT $9"
        )
    };
}

type Query<'q, O> = sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>;

impl Filter {
    /// Whether the filter may be used: one field at least, at most
    /// [`MAX_IDS`] ids, text Postgres can hold, a time range that is one.
    /// The message says what to change.
    pub fn check(&self) -> Result<(), String> {
        let given = self.ids.is_some()
            || self.kind.is_some()
            || self.statuses.is_some()
            || self.codes.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some();
        if !given {
            return Err(
                "name at least one of ids, kind, status, created_after or created_before: a filter that names \
                 nothing would match every task"
                    .into(),
            );
        }
        self.check_values()
    }

    /// [`Filter::check`] but for the fields named: the operators' filter
    /// may name only a Space.
    pub fn check_values(&self) -> Result<(), String> {
        if self.ids.as_ref().is_some_and(|ids| ids.len() > MAX_IDS) {
            return Err(format!("at most {MAX_IDS} ids at once"));
        }
        let texts = self.kind.iter().chain(self.codes.iter().flatten());
        if texts.into_iter().any(|text| text.contains('\0')) {
            return Err("kind and codes cannot hold a NUL character".into());
        }
        if let (Some(after), Some(before)) = (self.created_after, self.created_before)
            && after >= before
        {
            return Err("created_after must be earlier than created_before".into());
        }
        Ok(())
    }

    fn bind<'q, O>(&'q self, query: Query<'q, O>) -> Query<'q, O> {
        query
            .bind(self.space.map(|space| space.as_bytes().to_vec()))
            .bind(self.ids.as_ref().map(|ids| ids.iter().map(|id| id.to_bytes().to_vec()).collect::<Vec<_>>()))
            .bind(self.kind.as_deref())
            .bind(self.statuses.as_ref().map(|s| s.iter().map(|s| s.as_str()).collect::<Vec<_>>()))
            .bind(self.codes.as_ref())
            .bind(self.created_after)
            .bind(self.created_before)
    }

    /// How many tasks match, by what can be done with them.
    pub async fn count(&self, db: &PgPool) -> Result<Counted, sqlx::Error> {
        let sql = concat!(
            "SELECT count(*),
                    count(*) FILTER (WHERE status IN ('completed', 'failed', 'canceled')),
                    count(*) FILTER (WHERE status IN ('queued', 'running') AND cancel_requested_at IS NULL),
                    count(*) FILTER (WHERE status = 'failed' AND error->>'code' = ANY($8)) ",
            filtered!()
        );
        let (matched, ended, open, rerunnable) =
            self.bind(sqlx::query_as::<_, (i64, i64, i64, i64)>(sql)).bind(rerunnable_codes()).fetch_one(db).await?;
        Ok(Counted { matched, ended, open, rerunnable })
    }

    /// Up to `limit` of the matching `which`, oldest first, after `after`.
    pub async fn page(
        &self,
        db: &PgPool,
        which: Candidates,
        after: Option<Id>,
        limit: usize,
    ) -> Result<Vec<Match>, sqlx::Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        match which {
            Candidates::Open => {
                let sql = page_of!("status IN ('queued', 'running') AND cancel_requested_at IS NULL");
                self.bind(sqlx::query_as(sql)).bind(after).bind(limit).fetch_all(db).await
            }
            Candidates::Rerunnable => {
                let sql = page_of!("status = 'failed' AND error->>'code' = ANY($10)");
                self.bind(sqlx::query_as(sql)).bind(after).bind(limit).bind(rerunnable_codes()).fetch_all(db).await
            }
        }
    }

    /// The filter as the audit line shows it.
    fn shown(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// What an owner's bulk cancel did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BulkCanceled {
    /// The tasks of the Space the filter matches, whatever their status.
    pub matched: i64,
    /// Canceled now (they were queued); 0 on a dry run.
    pub canceled: usize,
    /// Running: their workers were asked to stop them, and end them
    /// `canceled` within a second; 0 on a dry run.
    pub requested: usize,
    /// Matched but already ended (`completed`, `failed`, `canceled`):
    /// left as they are.
    pub skipped: i64,
    /// The tasks canceled or asked to stop (on a dry run: that would be),
    /// oldest first, at most 1000.
    pub task_ids: Vec<Id>,
    /// More than 1000 tasks were to cancel: send the same request again for
    /// the next ones.
    pub more: bool,
    pub dry_run: bool,
}

/// Cancels the tasks of `space` that `filter` matches (its `space` is set
/// to `space` here, whatever it was), at most [`MAX_PER_REQUEST`], oldest
/// first, each with [`cancel`] and its events published; with `dry_run`,
/// only counts them. `by` names the transport for the audit line.
/// Call [`Filter::check`] first.
pub async fn cancel_owned(
    db: &PgPool,
    redis: &RedisClient,
    space: &SpaceIndex,
    mut filter: Filter,
    dry_run: bool,
    by: &str,
) -> Result<BulkCanceled, sqlx::Error> {
    filter.space = Some(*space);
    let counted = filter.count(db).await?;
    let mut open = filter.page(db, Candidates::Open, None, MAX_PER_REQUEST + 1).await?;
    let more = open.len() > MAX_PER_REQUEST;
    open.truncate(MAX_PER_REQUEST);
    let mut done =
        BulkCanceled { matched: counted.matched, skipped: counted.ended, more, dry_run, ..BulkCanceled::default() };
    if dry_run {
        done.task_ids = open.into_iter().map(|task| task.id).collect();
    } else {
        for task in open {
            match cancel(db, space, task.id).await? {
                Some(CancelOutcome::Canceled { events, .. }) => {
                    publish_all_once(redis, task.id, &events).await;
                    done.canceled += 1;
                    done.task_ids.push(task.id);
                }
                Some(CancelOutcome::Requested { event, .. }) => {
                    publish_all_once(redis, task.id, event.as_slice()).await;
                    done.requested += 1;
                    done.task_ids.push(task.id);
                }
                // Ended between the page and its cancel.
                Some(CancelOutcome::Finished(_)) => done.skipped += 1,
                None => {}
            }
        }
    }
    tracing::info!(
        target: "reeve::audit",
        operation = "cancel",
        by,
        space = %space.to_hex(),
        filter = %filter.shown(),
        matched = done.matched,
        canceled = done.canceled,
        requested = done.requested,
        skipped = done.skipped,
        more = done.more,
        dry_run,
        "bulk cancel by the Space's owner"
    );
    Ok(done)
}

/// What [`rerun`] did with one task.
#[derive(Debug, Clone, PartialEq)]
pub enum Rerun {
    /// `queued` again, with its events; `credit`: the credit its failure
    /// left, which the re-run spent.
    Queued { kind: String, events: Vec<Event>, credit: Option<Id> },
    /// Left as it is, and why: `not_failed`, `input_failure` (failed by its
    /// input: it would fail again), `metered` (its payment authorization was
    /// released: nothing could charge the re-run), `credit_spent` (its
    /// credit paid for another task already: it was paid for once).
    Refused(&'static str),
}

/// Runs the failed task `id` again, as a new attempt of the same task, if
/// it failed by Reeve's fault ([`failed_by_reeve`]). A paid task's re-run
/// spends the credit its failure left, in the same transaction: the payment
/// buys the re-run or the credit, never both. `None`: no such task.
/// The caller queues a [`Rerun::Queued`] task and publishes its events.
pub async fn rerun(db: &PgPool, id: Id) -> Result<Option<Rerun>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let row: Option<(String, String, Option<String>, bool, bool)> = sqlx::query_as(
        "SELECT status, kind, error->>'code', payment IS NOT NULL,
                EXISTS (SELECT 1 FROM payments WHERE task_id = t.id)
                OR EXISTS (SELECT 1 FROM credits WHERE spent_by = t.id)
           FROM tasks t WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((status, kind, code, metered, paid)) = row else {
        return Ok(None);
    };
    let code = code.unwrap_or_default();
    let refused = if status != TaskStatus::Failed.as_str() {
        Some("not_failed")
    } else if !failed_by_reeve(&code) {
        Some("input_failure")
    } else if metered {
        Some("metered")
    } else {
        None
    };
    if let Some(reason) = refused {
        tx.rollback().await?;
        return Ok(Some(Rerun::Refused(reason)));
    }
    let credit = if paid {
        match spend_on_rerun(&mut tx, id).await? {
            Some(credit) => Some(credit.id),
            None => {
                tx.rollback().await?;
                return Ok(Some(Rerun::Refused("credit_spent")));
            }
        }
    } else {
        None
    };
    let line = match credit {
        Some(credit) => {
            format!("run again by an operator after {code}; the run spends the credit {credit} it had left")
        }
        None => format!("run again by an operator after {code}"),
    };
    let events = transition_in(&mut tx, id, Fence::From(&[TaskStatus::Failed]), Change::Rerun { line: &line })
        .await?
        .ok_or_else(|| sqlx::Error::Protocol("a locked row changed under its lock".into()))?;
    tx.commit().await?;
    Ok(Some(Rerun::Queued { kind, events, credit }))
}

#[cfg(feature = "sqs")]
pub use operator::{Action, Operator, Tally};

#[cfg(feature = "sqs")]
mod operator {
    use super::*;
    use crate::domain::tasks::events::Publisher;

    /// An operator's bulk change.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Action {
        Cancel,
        Rerun,
    }

    impl Action {
        pub fn candidates(self) -> Candidates {
            match self {
                Action::Cancel => Candidates::Open,
                Action::Rerun => Candidates::Rerunnable,
            }
        }

        pub fn name(self) -> &'static str {
            match self {
                Action::Cancel => "cancel",
                Action::Rerun => "rerun",
            }
        }
    }

    /// What an operator's bulk change has done so far.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
    pub struct Tally {
        /// Candidates seen so far.
        pub seen: u64,
        /// Canceled, or queued again.
        pub done: u64,
        /// Running tasks asked to stop (a cancel).
        pub requested: u64,
        /// Left as they were (ended meanwhile; or for a re-run, metered, or
        /// whose credit paid for another task).
        pub skipped: u64,
        /// Re-run but not sent to the queue: they are `queued`, and the
        /// sweeper sends them once they have waited its threshold.
        pub unsent: u64,
    }

    /// What an operator's bulk changes run on: the database, the doorbell
    /// for the events, the queue for the re-runs.
    pub struct Operator<'a> {
        pub db: &'a PgPool,
        pub events: &'a Publisher,
        pub sqs: &'a aws_sdk_sqs::Client,
        pub queue_url: &'a str,
        /// Who asked, for the audit line (the operator's user name).
        pub by: &'a str,
    }

    impl Operator<'_> {
        /// Applies `action` to every candidate of `filter`, oldest first,
        /// `batch` at a time; `progress` sees the tally after each batch.
        pub async fn apply(
            &self,
            filter: &Filter,
            action: Action,
            batch: usize,
            mut progress: impl FnMut(&Tally),
        ) -> Result<Tally, sqlx::Error> {
            let mut tally = Tally::default();
            let mut after = None;
            let outcome = loop {
                let page = match filter.page(self.db, action.candidates(), after, batch.max(1)).await {
                    Ok(page) => page,
                    Err(e) => break Err(e),
                };
                let Some(last) = page.last() else { break Ok(()) };
                after = Some(last.id);
                for task in &page {
                    tally.seen += 1;
                    if let Err(e) = self.one(action, task.id, &mut tally).await {
                        self.audit(filter, action, &tally, Some(&e));
                        return Err(e);
                    }
                }
                progress(&tally);
            };
            self.audit(filter, action, &tally, outcome.as_ref().err());
            outcome.map(|()| tally)
        }

        async fn one(&self, action: Action, id: Id, tally: &mut Tally) -> Result<(), sqlx::Error> {
            match action {
                Action::Cancel => match cancel_any(self.db, id).await? {
                    Some(CancelOutcome::Canceled { events, .. }) => {
                        self.events.publish_all(id, &events).await;
                        tally.done += 1;
                    }
                    Some(CancelOutcome::Requested { event, .. }) => {
                        self.events.publish_all(id, event.as_slice()).await;
                        tally.requested += 1;
                    }
                    Some(CancelOutcome::Finished(_)) | None => tally.skipped += 1,
                },
                Action::Rerun => match rerun(self.db, id).await? {
                    Some(Rerun::Queued { kind, events, .. }) => {
                        self.events.publish_all(id, &events).await;
                        tally.done += 1;
                        if let Err(e) = super::super::queue::enqueue(self.sqs, self.queue_url, id, &kind, None).await {
                            tracing::warn!(task_id = %id, error = %e, "a re-run task was not sent; the sweeper will");
                            tally.unsent += 1;
                        }
                    }
                    Some(Rerun::Refused(_)) | None => tally.skipped += 1,
                },
            }
            Ok(())
        }

        /// The one audit line of the operation.
        fn audit(&self, filter: &Filter, action: Action, tally: &Tally, error: Option<&sqlx::Error>) {
            tracing::info!(
                target: "reeve::audit",
                operation = action.name(),
                by = self.by,
                space = %filter.space.map_or_else(|| "any".to_owned(), |s| s.to_hex()),
                filter = %filter.shown(),
                seen = tally.seen,
                done = tally.done,
                requested = tally.requested,
                skipped = tally.skipped,
                unsent = tally.unsent,
                error = ?error,
                "bulk {} by an operator",
                action.name()
            );
        }
    }
}
