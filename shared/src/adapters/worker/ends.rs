//! How a run ends, each a write fenced on the run's attempt: failed for
//! good, out of attempts, canceled, or back to `queued` after a backoff.

use std::time::Duration;

use time::format_description::well_known::Rfc3339;

use super::{Outcome, Retryable, WorkerContext, codes, retry, store};
use crate::domain::executors::{self, DelegatedAttempt};
use crate::domain::ids::Id;
use crate::domain::tasks::{Change, Fence, TaskStatus, task_error, transition};

/// A task that has had every run it may have, found queued (or running
/// under an expired lease): failed `retries_exhausted` without another run,
/// fenced on where it was found, so a run that claimed it meanwhile wins.
pub(super) async fn exhausted(ctx: &WorkerContext, task: &store::TaskRow) -> Outcome {
    let fence = match task.status {
        // Its last run is still going: this message is a duplicate, and
        // that run ends the task (or, if its worker dies, the sweeper does).
        TaskStatus::Running if task.lease_live => {
            tracing::info!(attempts = task.attempts, "the last attempt is running elsewhere; dropping this message");
            return Outcome::Done;
        }
        TaskStatus::Running => Fence::Run(task.attempts),
        TaskStatus::Queued => Fence::From(&[TaskStatus::Queued]),
        // Terminal: nothing to do.
        _ => return Outcome::Done,
    };
    let message = format!("gave up after {} attempts, none of which finished", task.attempts);
    let error = task_error(codes::RETRIES_EXHAUSTED, &message);
    match transition(&ctx.db, task.id, fence, Change::Fail { error: &error }).await {
        Ok(Some(events)) => {
            ctx.events.publish_all(task.id, &events).await;
            tracing::warn!(attempts = task.attempts, "out of attempts; failed without another run");
            Outcome::Failed(codes::RETRIES_EXHAUSTED)
        }
        // Claimed or finished by someone else meanwhile: theirs now. A live
        // run elsewhere keeps its message; this one is done.
        Ok(None) => Outcome::Done,
        Err(e) => retry("failing the exhausted task", e),
    }
}

/// Tells the service of a delegated attempt that its buyer canceled it
/// (docs/executors.md, "Cancel"), once: the sweeper sends the task's
/// message while a cancel is owed, and this worker alone holds what the
/// call takes (the endpoint's signing secret, the Invoke grant). The task
/// itself ends `canceled` at the service's next report (`409 canceled`),
/// or once its lease lapses; nothing here changes it. A service that could
/// not be told is tried again at the next sweep, so the message is done.
pub(super) async fn tell_service(ctx: &WorkerContext, task: &store::TaskRow) -> Outcome {
    let Some(owed) = task.delegated_cancel else { return Outcome::Done };
    if owed.sent {
        tracing::info!(attempt = task.attempts, "its service was told of the cancel already");
        return Outcome::Done;
    }
    let Some(spec) = ctx.catalog.task(&task.kind) else {
        tracing::warn!("a cancel is owed to a kind no longer offered; its lease will lapse");
        return Outcome::Done;
    };
    let attempt =
        DelegatedAttempt { task_id: task.id, kind: &task.kind, attempt: task.attempts, deadline: owed.deadline };
    match executors::cancel(&ctx.exec, spec, &attempt).await {
        Ok(()) => {
            tracing::info!(attempt = task.attempts, "told its service of the cancel");
            if let Err(e) = store::cancel_sent(&ctx.db, task.id, task.attempts).await {
                tracing::warn!(error = %e, "could not record that the cancel was sent; it may be sent again");
            }
        }
        Err(e) => tracing::warn!(attempt = task.attempts, error = %e, "could not tell its service of the cancel"),
    }
    Outcome::Done
}

pub(super) fn lost(attempt: i32) -> Outcome {
    tracing::warn!(attempt, "the task moved on without this run; its outcome is dropped");
    Outcome::Done
}

pub(super) async fn fail(ctx: &WorkerContext, id: Id, attempt: i32, code: &'static str, message: &str) -> Outcome {
    let error = task_error(code, message);
    match transition(&ctx.db, id, Fence::Run(attempt), Change::Fail { error: &error }).await {
        Ok(Some(events)) => {
            ctx.events.publish_all(id, &events).await;
            Outcome::Failed(code)
        }
        Ok(None) => lost(attempt),
        Err(e) => retry("recording the failure", e),
    }
}

/// How often a running task is checked for a cancel request.
pub const CANCEL_POLL: Duration = Duration::from_millis(400);

/// Returns once the owner has asked to cancel this run's task; never while
/// the run holds it and nobody asked. A failed check is logged and tried
/// again at the next tick.
pub(super) async fn cancel_asked(ctx: &WorkerContext, id: Id, attempt: i32) {
    // The claim said whether a cancel was pending: the first look is one
    // poll later.
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + CANCEL_POLL, CANCEL_POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match crate::domain::tasks::cancel_requested(&ctx.db, id, attempt).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not check for a cancel request"),
        }
    }
}

/// Ends a run its owner canceled: `running → canceled`, fenced on the run.
pub(super) async fn cancel(ctx: &WorkerContext, id: Id, attempt: i32) -> Outcome {
    match transition(&ctx.db, id, Fence::Run(attempt), Change::Cancel).await {
        Ok(Some(events)) => {
            ctx.events.publish_all(id, &events).await;
            tracing::info!(attempt, "canceled by its owner");
            Outcome::Done
        }
        Ok(None) => lost(attempt),
        Err(e) => retry("recording the cancel", e),
    }
}

/// A retryable end of a run: back to `queued` for the next delivery after
/// the backoff, or, on the queue's last delivery, `failed` with
/// `retries_exhausted` (never a capture under way).
pub(super) async fn retry_later(
    ctx: &WorkerContext,
    id: Id,
    attempt: i32,
    receive_count: u32,
    why: Retryable,
) -> Outcome {
    // A capture under way holds its task: the payer may be charged already,
    // so neither a cancel nor the retry limit ends it, and it goes back to
    // the queue until the chain decides (see `payments::capture`).
    let holds = matches!(why, Retryable::Capture(..));
    // The owner sees the events: a timeout is theirs to know, the internal
    // cause of anything else goes to the logs only.
    let (reason, shown, after) = match why {
        Retryable::Timeout(secs) => {
            let reason = format!("timed out after {secs}s");
            (reason.clone(), reason, ctx.settings.backoff.after(attempt, None))
        }
        Retryable::Exec(reason, asked) => {
            (reason, "a temporary problem".to_owned(), ctx.settings.backoff.after(attempt, asked))
        }
        // The invocation ran out, not the task: the next one may start it
        // at once.
        Retryable::Deadline => (
            "stopped before the invocation's deadline".to_owned(),
            "the worker ran out of time".to_owned(),
            Duration::ZERO,
        ),
        Retryable::Capture(reason, after) => (reason, "its payment is being settled".to_owned(), after),
    };
    tracing::warn!(attempt, %reason, "attempt failed with a retryable error");
    // Its owner asked it to stop: no other attempt.
    if !holds && matches!(crate::domain::tasks::cancel_requested(&ctx.db, id, attempt).await, Ok(true)) {
        return cancel(ctx, id, attempt).await;
    }
    // The limit counts the runs since the task's last re-run, if any.
    let tries = store::tries(&ctx.db, id, attempt).await.unwrap_or(attempt);
    if !holds && (tries >= ctx.settings.max_receives as i32 || receive_count >= ctx.settings.max_receives) {
        let message = format!("gave up after {attempt} attempts; the last one failed: {shown}");
        return fail(ctx, id, attempt, codes::RETRIES_EXHAUSTED, &message).await;
    }
    // Due when the message is shown again: the adapter sets its
    // visibility to `after` once this is written.
    let due = time::OffsetDateTime::now_utc() + after;
    let shown_due = due.replace_nanosecond(0).unwrap_or(due).format(&Rfc3339).unwrap_or_default();
    let next = attempt + 1;
    let line = if holds {
        format!(
            "attempt {attempt} finished and {shown}; the outcome is not known yet, asked again in {} s, at \
             {shown_due} (the task is not run again)",
            after.as_secs()
        )
    } else {
        format!(
            "attempt {attempt} did not finish ({shown}); attempt {next} is due in {} s, at {shown_due}",
            after.as_secs()
        )
    };
    match transition(&ctx.db, id, Fence::Run(attempt), Change::Requeue { line: &line, due: Some(due) }).await {
        Ok(Some(events)) => {
            ctx.events.publish_all(id, &events).await;
            Outcome::retry_in(reason, after)
        }
        Ok(None) => lost(attempt),
        // Still `running` under this run's lease: once that expires, the
        // next delivery claims it again.
        Err(e) => retry("putting the task back in the queue", e),
    }
}
