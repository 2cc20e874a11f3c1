//! The sweeper: nothing stuck, nothing lost. SQS is the only thing that
//! wakes a worker, so a task whose message is gone waits forever unless
//! something looks for it:
//!
//! - a `queued` task whose message was lost (create committed, then the
//!   send never happened: a disconnect, a Lambda timeout) is sent again;
//! - a `running` task whose lease lapsed (its worker was killed, or lost
//!   Postgres for longer than its lease) is sent again, and the next worker
//!   claims it over the lapsed lease;
//! - a task that has been claimed as often as the queue would deliver it
//!   (`REEVE_MAX_RECEIVES`) is failed as `retries_exhausted` instead, since
//!   sending it again would only run it past its limit;
//! - but a metered task whose capture is under way (its run finished, what
//!   it used sent to be settled, the outcome open) is sent again whatever
//!   its count, and never failed: the next worker resumes the capture with
//!   the run's held result, without running it again, before the payer's
//!   authorization runs out (see `payments::capture`). Such a task waiting
//!   in the queue is sent again once it has not changed for
//!   [`CAPTURE_SILENCE`], by every sweep, lapsed-lease ones too: its
//!   authorization may have less time left than `older_than`.
//!
//! A lapsed lease is acted on at the first sweep after it lapsed, whatever
//! `older_than` says: a lease is short and renewed every few seconds, so
//! one that ran out means its worker is gone, and waiting longer only
//! delays the task. Anything else waits until the task has not changed for
//! `older_than`, since a queued task's message may simply still be on its
//! way. A re-send touches `updated_at`, which then lies after the lapse, so
//! the next sweep does not send it again at once; if that message is lost
//! too, `older_than` later it is. Duplicate messages are harmless: every
//! claim is a conditional update, so a task runs once however often it is
//! delivered.
//!
//! Every sweep also runs the payments reconciler ([`crate::domain::payments::reconcile`]):
//! a payment whose settlement's outcome was never learnt is resolved from
//! the chain, its task created (and queued here) if the charge landed, or
//! the attempt failed if it never can. It runs last, for at most
//! [`RECONCILE_BUDGET`] and never past a Lambda invocation's deadline less
//! its margin: a slow chain endpoint never keeps a lost task from being
//! sent again, nor a sweep from ending in time.
//!
//! Each sweep also forgets pay links no call can meet any more
//! ([`pay_links::forget_old`]): they hold a task's input.
//!
//! The dead-letter queue's consumer ([`Sweeper::dead_lettered`]) fails each
//! task SQS gave up on as `dead_lettered`, unless a live worker still holds
//! it, or its capture is under way (then it is sent again).
//!
//! `reeve sweep` runs one sweep; `reeve work` and `reeve serve`'s worker
//! sweep every [`EVERY`] ([`Sweeper::spawn_every`]); in AWS the `sweeper`
//! Lambda runs on a schedule and also drains the dead-letter queue. The
//! schedule's finest grain is a minute, longer than a lease, so each
//! scheduled invocation sweeps once, then looks for lapsed leases again
//! every [`EVERY`] while there are running tasks (and at least once more),
//! until its own deadline is near ([`Sweeper::handle_invocation`]).

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::Catalog;
use crate::domain::ids::Id;
use crate::domain::pay_links;
use crate::domain::payments::batch::claim::Claimer;
use crate::domain::payments::{self, Chains};
use crate::domain::tasks::RETRIES_EXHAUSTED;
use crate::domain::tasks::events::Publisher;
use crate::domain::tasks::queue::{self, QueueMessage};
use crate::domain::tasks::{self, Change, Fence, TaskStatus, fairness, task_error};
use crate::domain::webhooks::sender::Sender;

/// How often `reeve work` and `reeve serve` sweep, and the `sweeper`
/// Lambda within each scheduled minute: with a lease of 20 s, a dead
/// worker's task is sent again at most 35 s after its last renewal.
pub const EVERY: Duration = Duration::from_secs(15);
/// How long a task must have been left alone before it is swept, unless
/// told otherwise: far longer than a message waits in a healthy queue.
pub const DEFAULT_OLDER_THAN: Duration = Duration::from_secs(300);
/// Tasks handled per query, so one sweep of a huge backlog stays bounded
/// in memory.
const BATCH: i64 = 500;
/// How long before its deadline a scheduled invocation stops sweeping: a
/// lapsed-lease sweep takes well under a second, and one cut off by Lambda
/// would leave touched tasks unsent until the threshold.
const DEADLINE_MARGIN: Duration = Duration::from_secs(5);
/// How long a scheduled invocation sweeps lapsed leases even with nothing
/// running: a task that starts after the loop ended and whose worker dies
/// at once is swept by the next scheduled invocation, a minute after this
/// one began, so the loop ends no sooner than this for that to come within
/// 45 s of the death.
const KEEP_SWEEPING: Duration = Duration::from_secs(15);
/// The longest a sweep spends reconciling payments, after its tasks: the
/// chain reads of a batch take a second or two on a healthy endpoint, and a
/// stalled one must not hold the scheduled invocation's lapsed-lease sweeps.
pub const RECONCILE_BUDGET: Duration = Duration::from_secs(20);

/// Stable codes the sweeper fails a task with.
pub mod codes {
    /// SQS moved the task's message to the dead-letter queue.
    pub const DEAD_LETTERED: &str = "dead_lettered";
    pub use crate::domain::tasks::RETRIES_EXHAUSTED;
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("queue: {0}")]
    Queue(#[from] queue::QueueError),
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// `queued` tasks whose message was sent again.
    pub resent_queued: usize,
    /// `running` tasks with an expired lease whose message was sent again.
    pub resent_expired: usize,
    /// Tasks failed as `retries_exhausted`.
    pub exhausted: usize,
    /// Delegated attempts whose buyer canceled, their message sent for a
    /// worker to tell the service (docs/executors.md, "Cancel").
    pub cancels: usize,
    /// Sends that failed; those tasks are tried again a threshold later.
    pub send_errors: usize,
    /// Payments whose unknown outcome was resolved from the chain.
    pub payments: payments::Reconciled,
    /// Parked tasks sent again, a slot of their Space being free.
    pub woken: usize,
    /// Pay links deleted: no call could meet them any more.
    pub forgotten_pay_links: u64,
}

/// What became of one dead-lettered message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetter {
    /// The task is now `failed` with `dead_lettered`.
    Failed,
    /// The task had already finished (or is gone): nothing to do.
    Finished,
    /// A live worker holds the task (the dead message was a duplicate): left
    /// to it; if that worker dies, a sweep sends the task again.
    StillRunning,
    /// Its metered capture is under way: sent again, to be resumed.
    Resent,
    /// Not a task message: dropped.
    Unreadable,
}

/// What the sweeper needs: Postgres, the queue, the doorbell, the limit.
pub struct Sweeper {
    pub db: PgPool,
    pub sqs: aws_sdk_sqs::Client,
    pub queue_url: String,
    pub events: Publisher,
    /// A task claimed this many times is failed, not sent again: the
    /// queue's `maxReceiveCount` (`REEVE_MAX_RECEIVES`).
    pub max_attempts: u32,
    /// The scheduled sweep's threshold.
    pub older_than: Duration,
    /// Whether a task's kind is still offered, for a payment that lands late.
    pub catalog: Arc<Catalog>,
    /// Each payment network's JSON-RPC endpoint, for the reconciler.
    pub chains: Chains,
    /// The completion webhooks' sender, in AWS (see [`Sweeper::sweep_by`]).
    pub webhooks: Option<Sender>,
    /// Claims what batch-settlement vouchers bought, where the sweeper is
    /// given the receiver authorizer's key (`REEVE_BATCH_AUTHORIZER_KEY`).
    pub batch_claims: Option<Claimer>,
}

/// A task row as the sweeper sees it.
type Candidate = (Id, String, String, i32);

/// The tasks no worker is on: `running` under a lease that lapsed since
/// the task last changed (a re-send is a change, so each lapse is acted on
/// once), or `queued` or `running` without a live lease and left alone for
/// `older_than` (the first parameter named, in seconds; NULL for lapsed
/// leases only), or `queued` with its capture under way and left alone for
/// the second ([`CAPTURE_SILENCE`]) whatever `older_than` is.
macro_rules! stranded {
    ($older_than:literal, $capture_silence:literal) => {
        concat!(
            "((status = 'running' AND lease_until < now() AND updated_at <= lease_until)
              OR (status = 'queued' AND payment->>'status' IN ('capturing', 'charged')
                  AND updated_at < now() - make_interval(secs => ",
            $capture_silence,
            "::float8))
              OR (updated_at < now() - make_interval(secs => ",
            $older_than,
            "::float8)
                  AND ((status = 'queued' AND parked_at IS NULL)
                       OR (status = 'running' AND (lease_until IS NULL OR lease_until < now())))))"
        )
    };
}

/// How long a task whose capture is under way may wait in the queue
/// unclaimed before a sweep sends it again.
/// Its worker asks again after 10 s, and the payer's authorization may have
/// less than a minute left, so a lost message cannot wait for `older_than`.
pub const CAPTURE_SILENCE: Duration = Duration::from_secs(30);

impl Sweeper {
    /// One sweep over every task left alone for `older_than`.
    pub async fn sweep(&self, older_than: Duration) -> Result<SweepReport, SweepError> {
        self.sweep_by(older_than, tokio::time::Instant::now() + RECONCILE_BUDGET).await
    }

    /// One sweep: tasks first (failed when exhausted, else sent again), then
    /// payments, reconciling none after `reconcile_until`.
    async fn sweep_by(
        &self,
        older_than: Duration,
        reconcile_until: tokio::time::Instant,
    ) -> Result<SweepReport, SweepError> {
        let mut report = SweepReport::default();
        self.fail_exhausted(Some(older_than), &mut report).await?;
        self.resend(Some(older_than), &mut report).await?;
        self.wake_cancels(&mut report).await?;
        self.wake(&mut report).await?;
        report.forgotten_pay_links = pay_links::forget_old(&self.db, time::OffsetDateTime::now_utc()).await?;
        crate::infra::metrics::sweeper_action("pay_links_forgotten", report.forgotten_pay_links);
        self.reconcile(reconcile_until, &mut report).await?;
        // In AWS completion webhooks ride on this schedule: their outbox is
        // polled, so they need no function and no trigger of their own. They
        // go last, in the reconciler's time left, so a slow endpoint never
        // holds up a task or a payment.
        if let Some(webhooks) = &self.webhooks {
            webhooks.deliver_due(reconcile_until).await;
        }
        if report != SweepReport::default() {
            tracing::info!(?report, "swept");
        }
        Ok(report)
    }

    /// Only the leases that lapsed since the last sweep: their tasks sent
    /// again, or failed when out of attempts. Added to `report`.
    pub async fn sweep_lapsed(&self, report: &mut SweepReport) -> Result<(), SweepError> {
        let before = report.clone();
        self.fail_exhausted(None, report).await?;
        self.resend(None, report).await?;
        self.wake_cancels(report).await?;
        self.wake(report).await?;
        if *report != before {
            tracing::info!(?report, "swept lapsed leases");
        }
        Ok(())
    }

    /// Whether any task is running, whose worker may yet die.
    async fn anything_running(&self) -> Result<bool, SweepError> {
        Ok(sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'running')")
            .fetch_one(&self.db)
            .await?)
    }

    /// The scheduled invocation's sweep: one [`Self::sweep`], then
    /// [`Self::sweep_lapsed`] every [`EVERY`] until `deadline` is near,
    /// stopping early once nothing is running after [`KEEP_SWEEPING`].
    async fn sweep_until(
        &self,
        older_than: Duration,
        deadline: tokio::time::Instant,
    ) -> Result<SweepReport, SweepError> {
        let started = tokio::time::Instant::now();
        let reconcile_until =
            (started + RECONCILE_BUDGET).min(deadline.checked_sub(DEADLINE_MARGIN).unwrap_or(started));
        let mut report = self.sweep_by(older_than, reconcile_until).await?;
        loop {
            let next = tokio::time::Instant::now() + EVERY;
            if next + DEADLINE_MARGIN > deadline {
                return Ok(report);
            }
            let kept = tokio::time::Instant::now() >= started + KEEP_SWEEPING;
            if kept && !self.anything_running().await? {
                return Ok(report);
            }
            tokio::time::sleep_until(next).await;
            self.sweep_lapsed(&mut report).await?;
        }
    }

    /// Resolves the payments whose settlement's outcome is unknown, and
    /// queues the tasks that the charges found on chain paid for.
    async fn reconcile(&self, until: tokio::time::Instant, report: &mut SweepReport) -> Result<(), SweepError> {
        let shelf = tasks::Shelf { catalog: &self.catalog };
        let chains = (&self.chains, self.batch_claims.as_ref());
        report.payments = payments::sweep(&self.db, chains, &shelf, until).await?;
        for (id, kind) in std::mem::take(&mut report.payments.created) {
            // Not sent: the task is `queued`, and a later sweep's re-send
            // (after its threshold) finds it.
            if let Err(e) = queue::enqueue(&self.sqs, &self.queue_url, id, &kind, None).await {
                tracing::error!(task_id = %id, error = %e, "could not queue a task whose payment landed late");
                report.send_errors += 1;
                crate::infra::metrics::sweeper_action("send_failed", 1);
            }
        }
        Ok(())
    }

    /// Wakes every Space whose parked tasks have a free slot: the worker
    /// wakes a Space after each of its runs, but not after an end it did not
    /// see (a service's report, a run whose worker died) or a wake it could
    /// not send. A parked task is not swept as stranded: this is its way
    /// back (see `domain/tasks/fairness`).
    async fn wake(&self, report: &mut SweepReport) -> Result<(), SweepError> {
        for (space, kind) in fairness::parked_pools(&self.db, BATCH).await? {
            let slots = self.catalog.slots(&kind);
            let woken = fairness::wake(&self.db, &space, &slots).await?;
            let woken = fairness::send_woken(&self.db, &self.sqs, &self.queue_url, woken).await?;
            report.woken += woken;
            crate::infra::metrics::sweeper_action("woken", woken as u64);
        }
        Ok(())
    }

    /// Fails the stranded tasks that have had all their attempts.
    async fn fail_exhausted(&self, older_than: Option<Duration>, report: &mut SweepReport) -> Result<(), SweepError> {
        let mut after = Id::from(ulid::Ulid::nil());
        loop {
            let batch: Vec<Candidate> = sqlx::query_as(concat!(
                r#"SELECT id, kind, status, attempts FROM tasks
                  WHERE id > $1 AND attempts - rerun_from >= $2 AND coalesce(payment->>'status', '') NOT IN ('capturing', 'charged') AND "#,
                stranded!("$3", "$5"),
                r#"
                  ORDER BY id LIMIT $4"#
            ))
            .bind(after)
            .bind(self.max_attempts as i32)
            .bind(older_than.map(|d| d.as_secs_f64()))
            .bind(BATCH)
            .bind(CAPTURE_SILENCE.as_secs_f64())
            .fetch_all(&self.db)
            .await?;
            let Some(last) = batch.last() else { return Ok(()) };
            after = last.0;
            let full = batch.len() as i64 == BATCH;
            for (id, _, status, attempts) in batch {
                let message = format!("gave up after {attempts} attempts, none of which finished");
                if self.fail(id, &status, attempts, RETRIES_EXHAUSTED, &message).await? {
                    tracing::warn!(task_id = %id, attempts, "retries exhausted; failed");
                    report.exhausted += 1;
                    crate::infra::metrics::sweeper_action("failed_exhausted", 1);
                }
            }
            if !full {
                return Ok(());
            }
        }
    }

    /// Sends the stranded tasks' messages again, touching each first so that
    /// two sweepers (the scheduled one and `reeve work`'s) never both do.
    async fn resend(&self, older_than: Option<Duration>, report: &mut SweepReport) -> Result<(), SweepError> {
        loop {
            let batch: Vec<(Id, String, String, Vec<u8>)> = sqlx::query_as(concat!(
                r#"UPDATE tasks SET updated_at = now()
                  WHERE id IN (
                        SELECT id FROM tasks
                         WHERE (attempts - rerun_from < $1 OR payment->>'status' IN ('capturing', 'charged')) AND "#,
                stranded!("$2", "$4"),
                r#"
                         ORDER BY id LIMIT $3
                           FOR UPDATE SKIP LOCKED)
                RETURNING id, kind, status, space_idx"#
            ))
            .bind(self.max_attempts as i32)
            .bind(older_than.map(|d| d.as_secs_f64()))
            .bind(BATCH)
            .bind(CAPTURE_SILENCE.as_secs_f64())
            .fetch_all(&self.db)
            .await?;
            let full = batch.len() as i64 == BATCH;
            for (id, kind, status, space) in batch {
                let space = SpaceIndex::from_slice(&space);
                match queue::enqueue(&self.sqs, &self.queue_url, id, &kind, space.as_ref()).await {
                    Ok(()) if status == "queued" => {
                        report.resent_queued += 1;
                        crate::infra::metrics::sweeper_action("resent_queued", 1);
                    }
                    Ok(()) => {
                        report.resent_expired += 1;
                        crate::infra::metrics::sweeper_action("resent_lease_expired", 1);
                    }
                    Err(e) => {
                        // Touched but not sent: the next sweep after the
                        // threshold tries again.
                        tracing::error!(task_id = %id, error = %e, "could not send a swept task again");
                        report.send_errors += 1;
                        crate::infra::metrics::sweeper_action("send_failed", 1);
                    }
                }
            }
            // With `older_than` zero the touched rows match again at once:
            // one pass is the whole sweep.
            if !full || older_than.is_some_and(|d| d.is_zero()) {
                return Ok(());
            }
        }
    }

    /// Sends the message of each task whose running attempt its service
    /// works on (it answered `202`) and whose buyer canceled it, until its
    /// service has been told: the worker that gets it, finding the task
    /// held by the service's live lease, sends the service its signed
    /// cancel (docs/executors.md, "Cancel"). The cancel itself never waits
    /// on the service: it only marked the task, the outbox this reads.
    /// Sent again at each sweep until told; the service's next report, or
    /// its lease lapsing, ends the task whatever becomes of it.
    async fn wake_cancels(&self, report: &mut SweepReport) -> Result<(), SweepError> {
        let owed: Vec<(Id, String)> = sqlx::query_as(
            "SELECT id, kind FROM tasks
              WHERE status = 'running' AND lease_until >= now() AND cancel_requested_at IS NOT NULL
                AND cancel_sent_at IS NULL AND delegated_attempt = attempts
              ORDER BY id LIMIT $1",
        )
        .bind(BATCH)
        .fetch_all(&self.db)
        .await?;
        for (id, kind) in owed {
            // No fair-queue group: a cancel owed is a rare, short message.
            match queue::enqueue(&self.sqs, &self.queue_url, id, &kind, None).await {
                Ok(()) => {
                    report.cancels += 1;
                    crate::infra::metrics::sweeper_action("cancel_owed", 1);
                }
                Err(e) => {
                    tracing::error!(task_id = %id, error = %e, "could not send a canceled task's message");
                    report.send_errors += 1;
                    crate::infra::metrics::sweeper_action("send_failed", 1);
                }
            }
        }
        Ok(())
    }

    /// Fails a stranded task (`queued`, or `running` under the lease of run
    /// `attempts`) with `code`, writing and publishing its events. `false`:
    /// it moved on meanwhile (a worker claimed or finished it).
    async fn fail(&self, id: Id, status: &str, attempts: i32, code: &str, message: &str) -> Result<bool, SweepError> {
        let error = task_error(code, message);
        // Fenced by where the sweep found it: a `running` task by its run's
        // token, so a worker that claimed it since holds a new one and this
        // write matches no row.
        let fence = match TaskStatus::parse(status) {
            Some(TaskStatus::Queued) => Fence::From(&[TaskStatus::Queued]),
            Some(TaskStatus::Running) => Fence::Run(attempts),
            _ => return Ok(false),
        };
        let events = tasks::transition(&self.db, id, fence, Change::Fail { error: &error }).await?;
        match events {
            Some(events) => {
                self.events.publish_all(id, &events).await;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Settles one dead-lettered message body.
    pub async fn dead_lettered(&self, body: &str) -> Result<DeadLetter, SweepError> {
        let Ok(message) = serde_json::from_str::<QueueMessage>(body) else {
            let shown: String = body.chars().take(200).collect();
            tracing::error!(body = %shown, "dead-lettered message is not {{task_id, kind}}; dropping it");
            crate::infra::metrics::sweeper_action("dropped_unreadable", 1);
            return Ok(DeadLetter::Unreadable);
        };
        let id = message.task_id;
        // Twice at most: a task that moves between the read and the write is
        // read again once, and then whatever it became decides.
        for _ in 0..2 {
            let row: Option<(String, i32, bool, bool, Vec<u8>)> = sqlx::query_as(
                "SELECT status, attempts, (lease_until IS NOT NULL AND lease_until >= now()),
                        coalesce(payment->>'status' IN ('capturing', 'charged'), false), space_idx
                   FROM tasks WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(&self.db)
            .await?;
            let Some((status, attempts, live, capturing, space)) = row else { return Ok(DeadLetter::Finished) };
            let why = "the queue gave up delivering this task";
            match TaskStatus::parse(&status) {
                Some(TaskStatus::Running) if live => return Ok(DeadLetter::StillRunning),
                // Its capture is under way: it ends charged or with nothing
                // charged, never dead-lettered. A fresh message resumes it.
                Some(TaskStatus::Queued | TaskStatus::Running) if capturing => {
                    let space = SpaceIndex::from_slice(&space);
                    queue::enqueue(&self.sqs, &self.queue_url, id, &message.kind, space.as_ref()).await?;
                    tracing::warn!(task_id = %id, "dead-lettered during its capture; sent again");
                    crate::infra::metrics::sweeper_action("resent_capturing", 1);
                    return Ok(DeadLetter::Resent);
                }
                Some(TaskStatus::Queued | TaskStatus::Running) => {
                    if self.fail(id, &status, attempts, codes::DEAD_LETTERED, why).await? {
                        tracing::warn!(task_id = %id, attempts, "dead-lettered; failed");
                        crate::infra::metrics::sweeper_action("failed_dead_lettered", 1);
                        return Ok(DeadLetter::Failed);
                    }
                }
                _ => return Ok(DeadLetter::Finished),
            }
        }
        Ok(DeadLetter::StillRunning)
    }

    /// The dead-letter queue's batch: every record settled; the ones that
    /// hit a database error are reported for redelivery.
    pub async fn handle_dead_letters(&self, event: SqsEvent) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        for record in event.records {
            let message_id = record.message_id.clone().unwrap_or_default();
            match self.dead_lettered(record.body.as_deref().unwrap_or("")).await {
                Ok(outcome) => tracing::info!(%message_id, ?outcome, "dead letter settled"),
                Err(e) => {
                    tracing::error!(%message_id, error = %e, "could not settle a dead letter; it will be retried");
                    response.add_failure(message_id);
                }
            }
        }
        response
    }

    /// The sweeper Lambda's one entry point: an SQS batch from the
    /// dead-letter queue, or anything else (the schedule's event) for a
    /// sweep, whose threshold may be given as `older_than_seconds`. With
    /// the invocation's `deadline` (`Context::deadline`), a sweep goes on
    /// looking for lapsed leases until near it ([`Self::sweep_until`]), so
    /// a dead worker's task is sent again within seconds of its lease
    /// lapsing, not at the next scheduled minute.
    pub async fn handle_invocation(
        &self,
        payload: Value,
        deadline: Option<std::time::SystemTime>,
    ) -> Result<Value, SweepError> {
        if payload.get("Records").is_some_and(Value::is_array) {
            return match serde_json::from_value::<SqsEvent>(payload) {
                Ok(event) => {
                    let response = self.handle_dead_letters(event).await;
                    // In Lambda, the batch's EMF lines go out with it.
                    crate::infra::metrics::flush();
                    Ok(serde_json::to_value(response).expect("serialises"))
                }
                Err(e) => {
                    tracing::error!(error = %e, "an event with Records that is not an SQS batch; ignored");
                    Ok(serde_json::json!({ "ignored": "not an SQS batch" }))
                }
            };
        }
        let older_than =
            payload.get("older_than_seconds").and_then(Value::as_u64).map_or(self.older_than, Duration::from_secs);
        let report = match deadline {
            Some(deadline) => {
                let left = deadline.duration_since(std::time::SystemTime::now()).unwrap_or_default();
                self.sweep_until(older_than, tokio::time::Instant::now() + left).await
            }
            None => self.sweep(older_than).await,
        };
        // What a failed sweep did before its error is counted too.
        crate::infra::metrics::flush();
        Ok(serde_json::to_value(report?).expect("serialises"))
    }

    /// [`Self::run_every`] as a task of its own: the sweep a long-running
    /// worker process runs beside its poller (`reeve work`, and `reeve
    /// serve`'s built-in worker), until `shutdown` resolves (the signal that
    /// stops the poller, so neither outlives the other). A sweep in progress
    /// at shutdown finishes first.
    pub fn spawn_every(
        self,
        every: Duration,
        older_than: Duration,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move { self.run_every(every, older_than, shutdown).await })
    }

    /// Sweeps every `every` until `shutdown` resolves; for `reeve work`.
    /// A failed sweep is logged and the next one tries again.
    pub async fn run_every(
        &self,
        every: Duration,
        older_than: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticks.tick() => {}
            }
            if let Err(e) = self.sweep(older_than).await {
                tracing::error!(error = %e, every_secs = every.as_secs(), "sweep failed; trying again at the next one");
            }
        }
    }
}
