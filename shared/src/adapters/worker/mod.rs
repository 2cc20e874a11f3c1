//! The worker (docs/architecture.md#queue-and-worker): takes `{task_id, kind}` messages from SQS, claims
//! the task, runs its executor and records the outcome as durable events.
//!
//! Module map:
//! - [`store`]: claiming a task and keeping its lease; every other status
//!   change goes through [`crate::domain::tasks::transition`].
//! - [`batch`]: the Lambda's side: an `SqsEvent` in, an `SqsBatchResponse` out.
//! - [`poller`]: `reeve work`'s side: long-polls the queue itself.
//!
//! Both sides call [`process`] for each message and act on its [`Outcome`]:
//!
//! | outcome | Lambda | `reeve work` |
//! |---|---|---|
//! | `Done` | not a batch item failure (deleted) | deleted |
//! | `Failed(code)` | not a batch item failure (deleted) | deleted |
//! | `Retry` | its visibility set to `after`, then a batch item failure | its visibility set to `after`, left to reappear |
//!
//! A `Retry` with no `after` (trouble with Postgres, which a quick
//! redelivery would only meet again) keeps the visibility it has: the
//! message comes back after the queue's visibility timeout.
//!
//! A run of a task goes: claim, which takes a lease and bumps `attempts`,
//! the run's fencing token, and reads the task (not claimable: missing or
//! terminal → `Done`, out of attempts → `failed`, held by a live lease
//! elsewhere → `Retry`) → the executor, bounded by the task's
//! `timeout_seconds`, while its reports become `progress`/`log` events and
//! the lease is renewed → the outcome:
//! - a result → `completed` (`result`, `status` events) → `Done`;
//! - a permanent error → `failed` with its code (`error`, `status`) → `Failed`;
//! - a cancel asked for by the owner (checked every [`ends::CANCEL_POLL`]) → the
//!   executor is stopped → `canceled` (`status`) → `Done`;
//! - a retryable error or a timeout → back to `queued` (`log`, `status`,
//!   both saying when the next attempt is due) → `Retry` after the
//!   [`backoff`] (5 s, 15 s, 45 s… up to `REEVE_RETRY_BACKOFF_MAX_SECONDS`,
//!   or the endpoint's `Retry-After` under the same cap); on the task's
//!   last attempt or the queue's last delivery (`REEVE_MAX_RECEIVES` both)
//!   → `failed` with `retries_exhausted` instead, so nothing stays queued
//!   once SQS gives up.
//!
//! **Leases say whether a worker is alive.** A lease is short
//! (`REEVE_LEASE_SECONDS`, 20 s by default) whatever the task's timeout,
//! and the run renews it every quarter of that. A renewal is fenced on the
//! run's token like every other write, so a run that finds its lease taken
//! stops at once and writes nothing more (`Done`: the task is another
//! run's). A run that cannot renew (Postgres gone) stops by its own clock
//! once its lease would have run out, before anyone may take over, and
//! leaves its message to come back (`Retry`). A worker that dies stops
//! renewing; the sweeper re-sends the task at its first sweep after the
//! lease lapsed, and the next claim takes over, with a `lease_lost` event.
//!
//! **One attempt limit per task.** The limit counts the task's own runs
//! (`attempts`), not a message's deliveries: the sweeper's re-send and a
//! redelivery are two messages with two receive counts, but one task. A
//! claim never starts run `REEVE_MAX_RECEIVES + 1`; a task found out of
//! attempts is failed `retries_exhausted` without running.
//!
//! Trouble with Postgres at any step is `Retry`, never a failed task; Redis
//! trouble only costs the live doorbell (the events are in Postgres).

pub mod backoff;
pub(crate) mod batch;
mod ends;
mod lease;
mod metered;
#[cfg(feature = "poller")]
pub(crate) mod poller;
mod reports;
pub(crate) mod store;
pub mod visibility;
mod wake;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::mpsc;
use tracing::Instrument;

pub use backoff::Backoff;
pub use batch::{deadline_of, handle_batch, handle_batch_until};
#[cfg(feature = "poller")]
pub use poller::Poller;
pub use store::{Claim, claim};
pub use visibility::Visibility;

use ends::{cancel, cancel_asked, exhausted, fail, lost, retry_later};
use lease::{Lost, keep_lease};
use reports::record_reports;

use crate::domain::auth::Secret;
use crate::domain::catalog::{Catalog, TaskSpec};
use crate::domain::executors::{self, ExecDeps, ExecError, Job};
use crate::domain::ids::Id;
use crate::domain::payments::{Held, HeldReport};
use crate::domain::tasks::EventType;
use crate::domain::tasks::events::Publisher;
use crate::domain::tasks::{Change, Fence, QueueMessage, transition};
use crate::infra::redis_client::RedisClient;

/// Stable codes the worker itself fails a task or a message with.
pub mod codes {
    /// The message body is not `{"task_id","kind"}` JSON: no task to fail.
    pub const MALFORMED_MESSAGE: &str = "malformed_message";
    /// The task's kind is no longer in the catalog.
    pub const UNKNOWN_KIND: &str = "unknown_kind";
    pub use crate::domain::tasks::RETRIES_EXHAUSTED;
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing more to do: the task completed now, was already terminal, is
    /// gone, or was taken over by another run. Delete the message.
    Done,
    /// Try this message again later (SQS redelivers it).
    Retry(Retry),
    /// Failed for good with this code: the task is `failed`, or the message
    /// was unreadable. Delete the message.
    Failed(&'static str),
}

/// Why a message is to come back, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    pub reason: String,
    /// When SQS should hand the message out again: its visibility is set to
    /// this before the record is reported failed. `None`: left as it is, so
    /// it comes back after the queue's visibility timeout.
    pub after: Option<Duration>,
}

impl Outcome {
    pub fn is_retry(&self) -> bool {
        matches!(self, Outcome::Retry(_))
    }

    /// Back after the queue's visibility timeout.
    pub fn retry(reason: impl Into<String>) -> Outcome {
        Outcome::Retry(Retry { reason: reason.into(), after: None })
    }

    /// Back after `after`.
    pub fn retry_in(reason: impl Into<String>, after: Duration) -> Outcome {
        Outcome::Retry(Retry { reason: reason.into(), after: Some(after) })
    }
}

/// The executor's future, boxed so that [`Runner`] is object-safe.
pub type RunFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, ExecError>> + Send + 'a>>;

/// What runs a job. In production [`Executors`], the catalog's executors;
/// tests substitute their own to drive timeouts and reports.
pub trait Runner: Send + Sync {
    fn run<'a>(&'a self, deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a>;
}

/// [`executors::run`]: the executor the task's catalog entry names.
pub struct Executors;

impl Runner for Executors {
    fn run<'a>(&'a self, deps: &'a ExecDeps, job: Job<'a>) -> RunFuture<'a> {
        Box::pin(executors::run(deps, job))
    }
}

/// What the worker (the `worker` Lambda and `reeve work`) needs: the stores,
/// the bucket, and how hard to work.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub database_url: Secret,
    pub redis_url: String,
    pub bucket: String,
    /// `REEVE_QUEUE_URL`: `reeve work` polls it; the Lambda, handed its
    /// batches, sets its records' visibility on it.
    pub queue_url: Option<String>,
    /// `REEVE_WORKER_CONCURRENCY` (default 4): records run at once.
    pub concurrency: usize,
    /// `REEVE_MAX_RECEIVES` (default 5): the queue's `maxReceiveCount`. On
    /// that delivery a retryable failure fails the task for good
    /// (`retries_exhausted`), since SQS will not deliver it again.
    pub max_receives: u32,
    /// `REEVE_FETCH_MAX_BYTES` (default 100 MiB): the `fetch` executor's cap.
    pub fetch_max_bytes: u64,
    /// `REEVE_OUTPUT_RETENTION_DAYS`: how long the bucket keeps `outputs/`;
    /// unset, no expiry is known (a local bucket without the rule).
    pub output_retention_days: Option<u32>,
    /// `REEVE_LEASE_SECONDS` (default 20): how long a run holds its task
    /// without renewing. It bounds how long a dead worker's task waits
    /// before the sweeper sends it again, so it is short; the run renews it
    /// every quarter of it, so a few slow renewals in a row are survived.
    pub lease: Duration,
    /// The wait before the next attempt after a retryable failure.
    pub backoff: Backoff,
}

impl WorkerSettings {
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);
    pub const DEFAULT_CONCURRENCY: usize = 4;
    pub const DEFAULT_MAX_RECEIVES: u32 = crate::domain::tasks::DEFAULT_MAX_RECEIVES;
    pub const DEFAULT_FETCH_MAX_BYTES: u64 = 100 * 1024 * 1024;
}

/// How long before the invocation's deadline a run is stopped by default:
/// time to hand the task back (a conditional update and its events) before
/// Lambda kills the process, which would leave it `running` until its lease
/// ran out. A record is claimed only with its kind's `timeout_seconds` plus
/// this left, so a run's own timeout comes first; the stop is for a run that
/// started late (a slow claim). Less than the catalog's
/// [`RUN_MARGIN_SECONDS`](crate::domain::catalog::RUN_MARGIN_SECONDS), so a
/// fresh invocation always has the time for any kind.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(10);
/// Reports an executor may have in flight before it waits for the worker.
pub const REPORT_BUFFER: usize = 64;

/// Everything the worker needs, built once per process.
pub struct WorkerContext {
    pub db: PgPool,
    pub events: Publisher,
    pub catalog: Arc<Catalog>,
    pub exec: ExecDeps,
    pub runner: Arc<dyn Runner>,
    pub settings: WorkerSettings,
    /// The task queue, to set a retried or given-back message's visibility;
    /// `None` (no `REEVE_QUEUE_URL`), such a message keeps the visibility it
    /// has.
    pub visibility: Option<Visibility>,
    /// How long before an invocation's deadline its runs are stopped.
    pub deadline_margin: Duration,
    /// Each payment network's JSON-RPC endpoint: a metered task's capture
    /// is proven with them, and the sweep that runs beside a long-lived
    /// worker (`reeve work`, `reeve serve`) reconciles payments with them.
    pub chains: crate::domain::payments::Chains,
    /// Settles what a metered task used; `None` when the catalog prices
    /// nothing.
    pub facilitator: Option<crate::domain::payments::Facilitator>,
}

impl WorkerContext {
    /// A context running the catalog's executors.
    pub fn new(catalog: Catalog, db: PgPool, redis: RedisClient, exec: ExecDeps, settings: WorkerSettings) -> Self {
        WorkerContext {
            db,
            events: Publisher::new(redis),
            catalog: Arc::new(catalog),
            exec,
            runner: Arc::new(Executors),
            settings,
            visibility: None,
            deadline_margin: DEADLINE_MARGIN,
            chains: crate::domain::payments::Chains::none(),
            facilitator: None,
        }
    }
}

/// Handles one message body, delivered for the `receive_count`-th time.
/// Never panics on input and never fails a task for infrastructure trouble.
pub async fn process(ctx: &WorkerContext, body: &str, receive_count: u32) -> Outcome {
    process_until(ctx, body, receive_count, None).await
}

/// [`process`] within an invocation that ends at `deadline` (the Lambda's):
/// the executor is stopped `deadline_margin` before it and the task handed
/// back for another delivery, so it is never left `running` by a killed
/// process. A message that arrives with less than its kind's timeout left
/// before that stop is not claimed (no attempt counted) but given back, to
/// be shown again at once.
pub async fn process_until(
    ctx: &WorkerContext,
    body: &str,
    receive_count: u32,
    deadline: Option<tokio::time::Instant>,
) -> Outcome {
    let message: QueueMessage = match serde_json::from_str(body) {
        Ok(message) => message,
        Err(e) => {
            let shown: String = body.chars().take(200).collect();
            tracing::error!(error = %e, body = %shown, "malformed message: not {{task_id, kind}}; dropping it");
            return Outcome::Failed(codes::MALFORMED_MESSAGE);
        }
    };
    let span = tracing::info_span!("task", task_id = %message.task_id, kind = %message.kind, receive_count);
    let stop_at = deadline.map(|d| d.checked_sub(ctx.deadline_margin).unwrap_or(d));
    let outcome = run_task(ctx, &message, receive_count, stop_at).instrument(span.clone()).await;
    // Whatever became of it, a run of its Space may have ended.
    wake::wake_space(ctx, &message).instrument(span.clone()).await;
    span.in_scope(|| match &outcome {
        Outcome::Done => tracing::info!("message done"),
        Outcome::Failed(code) => tracing::warn!(code, "task failed"),
        Outcome::Retry(Retry { reason, after }) => {
            let after_secs = after.map(|after| after.as_secs());
            tracing::warn!(%reason, after_secs, "message will be retried")
        }
    });
    outcome
}

fn retry(what: &str, e: impl std::fmt::Display) -> Outcome {
    tracing::warn!(error = %e, "{what} failed");
    Outcome::retry(format!("{what}: {e}"))
}

/// Why a run should be tried again.
enum Retryable {
    Timeout(u32),
    /// The executor's reason, and the wait its service asked for.
    Exec(String, Option<Duration>),
    /// Stopped before the invocation's deadline.
    Deadline,
    /// A finished run's capture, whose outcome is open, and the wait before
    /// it is resumed.
    Capture(String, Duration),
}

async fn run_task(
    ctx: &WorkerContext,
    message: &QueueMessage,
    receive_count: u32,
    stop_at: Option<tokio::time::Instant>,
) -> Outcome {
    let id = message.task_id;
    // A run must have its whole timeout before the stop: one claimed with
    // less would count an attempt that could never finish. The message is
    // shown again at once, for an invocation with the time to run it. The
    // kind is the one the message names (the one the task was created
    // with), so the claim is the first round trip of a run.
    if let Some(at) = stop_at {
        let left = at.saturating_duration_since(tokio::time::Instant::now());
        // A kind no longer offered is only failed: no time needed.
        let needed =
            ctx.catalog.task(&message.kind).map_or(Duration::ZERO, |s| Duration::from_secs(s.waited_seconds().into()));
        if left < needed || left.is_zero() {
            let (left_secs, needed_secs) = (left.as_secs_f64(), needed.as_secs());
            tracing::info!(left_secs, needed_secs, "too little time left in the invocation; given back unclaimed");
            return Outcome::retry_in("too little time left in the invocation to run it", Duration::ZERO);
        }
    }
    let max_attempts = ctx.settings.max_receives;

    // The lease is counted from before the claim was sent: the database's
    // lease then ends no earlier than this run believes.
    let claimed_at = tokio::time::Instant::now();
    // The kind the message names is the task's (see above): its slots.
    let slots = ctx.catalog.slots(&message.kind);
    let claim = match store::claim_within(&ctx.db, id, ctx.settings.lease, max_attempts, &slots).await {
        Ok(store::Claimed::Run(claim)) => *claim,
        // Its Space runs as many as it may: parked, its message done with,
        // until a run of its Space ends and wakes it.
        Ok(store::Claimed::Parked(event)) => {
            tracing::info!("its Space is at its limit of tasks running at once; parked until one ends");
            ctx.events.publish_all(id, event.as_slice()).await;
            return Outcome::Done;
        }
        // Not claimable: read why.
        Ok(store::Claimed::No) => {
            return match store::load(&ctx.db, id).await {
                Ok(None) => {
                    tracing::warn!("no such task; dropping the message");
                    Outcome::Done
                }
                Ok(Some(now)) if now.status.is_terminal() => {
                    tracing::info!(status = now.status.as_str(), "task already finished; skipping");
                    Outcome::Done
                }
                // Its service works on it, and its buyer canceled: the
                // sweeper sent this message for the service to be told.
                // Boxed: a cold path, kept out of the run's future, whose
                // layout is already deep.
                Ok(Some(now)) if now.delegated_cancel.is_some() => Box::pin(ends::tell_service(ctx, &now)).await,
                Ok(Some(now)) if now.tries >= max_attempts as i32 => exhausted(ctx, &now).await,
                Ok(Some(now)) => {
                    tracing::info!(status = now.status.as_str(), "another worker holds a live lease");
                    Outcome::retry("held by another worker's live lease")
                }
                Err(e) => retry("reading the task", e),
            };
        }
        Err(e) => return retry("claiming the task", e),
    };
    let task = &claim.task;
    if task.kind != message.kind {
        tracing::warn!(task_kind = %task.kind, "the message names another kind than the task; using the task's");
    }
    let spec = ctx.catalog.task(&task.kind);
    let attempt = claim.attempt;
    tracing::info!(attempt, "claimed");
    if attempt == 1 {
        crate::infra::metrics::queue_wait(&task.kind, id.ulid().datetime());
    }
    if let Some(lapsed) = claim.took_over {
        let lapsed_secs = lapsed.ago.map(|ago| ago.as_secs_f64());
        tracing::warn!(lost_attempt = lapsed.attempt, lapsed_secs, "took over from a run whose lease lapsed");
        crate::infra::metrics::lease_lost(&task.kind, lapsed.ago);
    }
    ctx.events.publish_all(id, &claim.events).await;

    let Some(spec) = spec else {
        tracing::error!("the task's kind is not in the catalog");
        let message = format!("task kind {:?} is no longer offered", task.kind);
        return fail(ctx, id, attempt, codes::UNKNOWN_KIND, &message).await;
    };

    let metered = match metered::before_run(ctx, (id, attempt, receive_count), spec).await {
        Ok(metered) => metered,
        Err(ended) => return ended,
    };
    // An earlier run finished and its capture is under way: that run's
    // result is delivered once charged, and nothing runs again (nor can a
    // cancel stop it now: the payer may be charged already).
    if let Some(auth) = &metered
        && let Some(held) = auth.held()
    {
        tracing::info!(attempt, "resuming the capture of an earlier run");
        return metered::deliver(ctx, (id, attempt, receive_count), auth, held, claimed_at).await;
    }
    // Asked to cancel during an earlier attempt, which was handed back.
    if claim.cancel_requested {
        return cancel(ctx, id, attempt).await;
    }
    // Dropping the run stops the executor: a cancel asked for meanwhile
    // wins over whatever it was doing.
    let started = std::time::Instant::now();
    let run = tokio::select! {
        run = execute(ctx, task, spec, attempt, metered.is_some(), claimed_at, stop_at) => run,
        () = cancel_asked(ctx, id, attempt) => return cancel(ctx, id, attempt).await,
    };
    crate::infra::metrics::task_run(&task.kind, started.elapsed());
    let (result, held_reports) = match run {
        Ok(ended) => ended,
        Err(Lost::Taken) => {
            tracing::warn!(attempt, "lost the task to another run while executing; stopped, writing nothing more");
            return Outcome::Done;
        }
        Err(Lost::Expired) => {
            // Nobody may have taken it yet, but anyone may now: stopped as if
            // taken. The sweeper sends the task again once the lease lapsed;
            // this message is left to come back too.
            tracing::warn!(attempt, "could not renew the lease before it ran out; stopped, writing nothing more");
            return Outcome::retry("the run's lease ran out before it could be renewed");
        }
    };
    let took = started.elapsed();
    match result {
        Ok(value) => match &metered {
            None => complete(ctx, id, attempt, &value, None, &[]).await,
            Some(auth) => {
                let held = Held { used: metered::used(spec, &value, took), result: value, reports: held_reports };
                // The run's renewals stopped with it: renew once, and keep
                // renewing from there while the capture waits.
                let renewed_at = tokio::time::Instant::now();
                match store::extend_lease(&ctx.db, id, attempt, ctx.settings.lease).await {
                    Ok(true) => metered::deliver(ctx, (id, attempt, receive_count), auth, &held, renewed_at).await,
                    Ok(false) => lost(attempt),
                    Err(e) => retry("renewing the lease before the capture", e),
                }
            }
        },
        Err(Ok(ExecError::Permanent { code, message })) => fail(ctx, id, attempt, code, &message).await,
        // The service took the job and reports on its own: the attempt
        // stays `running` under the lease its reports renew, and nothing
        // here waits for it. Silent past the lease, it is retried by the
        // sweeper like a dead worker.
        Err(Ok(ExecError::Delegated { deadline })) => {
            match store::delegate(&ctx.db, id, attempt, ctx.settings.lease, deadline).await {
                Ok(true) => {
                    tracing::info!(attempt, %deadline, "accepted by the service; it reports on its own");
                    Outcome::Done
                }
                Ok(false) => lost(attempt),
                Err(e) => retry("recording that the service accepted the job", e),
            }
        }

        Err(Ok(ExecError::Retryable(reason))) => {
            retry_later(ctx, id, attempt, receive_count, Retryable::Exec(reason, None)).await
        }
        Err(Ok(ExecError::RetryAfter { reason, after })) => {
            retry_later(ctx, id, attempt, receive_count, Retryable::Exec(reason, Some(after))).await
        }
        Err(Err(why)) => retry_later(ctx, id, attempt, receive_count, why).await,
    }
}

/// Ends a run with its result (and a metered task's `payment`, its
/// receipt, in the final event), after the reports it `held` back.
async fn complete(
    ctx: &WorkerContext,
    id: Id,
    attempt: i32,
    result: &Value,
    payment: Option<&Value>,
    held: &[HeldReport],
) -> Outcome {
    let held: Vec<(EventType, Value)> =
        held.iter().filter_map(|r| Some((EventType::parse(&r.kind)?, r.data.clone()))).collect();
    match transition(&ctx.db, id, Fence::Run(attempt), Change::Complete { result, payment, held: &held }).await {
        Ok(Some(events)) => {
            ctx.events.publish_all(id, &events).await;
            tracing::info!(attempt, "completed");
            Outcome::Done
        }
        Ok(None) => lost(attempt),
        Err(e) => retry("recording the result", e),
    }
}

/// What a run ended with: its result, or why it did not finish; and the
/// reports a metered run held back (see [`reports`]).
type RunEnd = (Result<Value, Result<ExecError, Retryable>>, Vec<HeldReport>);

/// Runs the job with its reports recorded (a `metered` run's held back) and
/// its lease kept alive, bounded by the task's timeout. `Err`: the run lost
/// the task meanwhile, and the executor was stopped. `Ok((Err(Err(_)), _))`:
/// timed out, or stopped at `stop_at`.
async fn execute(
    ctx: &WorkerContext,
    task: &store::TaskRow,
    spec: &TaskSpec,
    attempt: i32,
    metered: bool,
    claimed_at: tokio::time::Instant,
    stop_at: Option<tokio::time::Instant>,
) -> Result<RunEnd, Lost> {
    let id = task.id;
    let (reports, receiver) = mpsc::channel(REPORT_BUFFER);
    let job = Job { task_id: id, attempt, kind: &task.kind, space: task.space, input: &task.input, spec, reports };
    // A kind whose service may answer 202 is waited for only that long.
    let timeout = Duration::from_secs(spec.waited_seconds().into());
    let run = async {
        let stop = async {
            match stop_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ran = tokio::time::timeout(timeout, ctx.runner.run(&ctx.exec, job)) => match ran {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(e)) => Err(Ok(e)),
                Err(_) => Err(Err(Retryable::Timeout(spec.waited_seconds()))),
            },
            () = stop => Err(Err(Retryable::Deadline)),
        }
    };
    // The executor owns the only sender: once it returns (or is dropped on
    // timeout) the reporter drains what is left and ends.
    let work = async { tokio::join!(run, record_reports(ctx, id, attempt, receiver, metered.then_some(spec))) };
    tokio::select! {
        result = work => Ok(result),
        lost = keep_lease(ctx, id, attempt, claimed_at) => Err(lost),
    }
}
