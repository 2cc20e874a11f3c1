//! What an executor reports while it runs (progress, log lines), recorded
//! as the task's events and published to its watchers.
//!
//! A metered run's reports may carry its result (`digest` logs the hash it
//! computed, `fetch` what it downloaded), and a metered result is for money
//! that was taken. So until the capture is charged, a metered task shows
//! only a progress report's fraction (with the bytes counted so far, where
//! its executor declares them free of result data) and the log lines its
//! executor declares free of it; every other log line is held with the run
//! ([`HeldReport`]s), published after the charge, or dropped with the
//! output if nothing can be charged. A new executor's reports are held
//! unless it says otherwise.

use serde_json::json;
use tokio::sync::mpsc;

use super::{REPORT_BUFFER, WorkerContext, store};
use crate::domain::catalog::TaskSpec;
use crate::domain::executors::{self, Recorded, Report};
use crate::domain::ids::Id;
use crate::domain::payments::HeldReport;
use crate::domain::tasks::EventType;

/// At most this many reports are held for one metered run: a bound on a
/// chatty executor's memory. Past it, the rest are counted, and one line
/// says how many were dropped.
pub(super) const HELD_REPORTS_MAX: usize = 1_000;

/// Turns reports into events until the executor drops its sender. Progress
/// reports that pile up are coalesced (only the latest of a run of them is
/// kept); log lines are all kept, in order. A report that cannot be
/// recorded is logged and dropped: it is not worth failing the task over.
///
/// `metered`: the run's kind, when its task is metered: what may carry the
/// result is held and returned instead of published.
pub(super) async fn record_reports(
    ctx: &WorkerContext,
    id: Id,
    attempt: i32,
    mut receiver: mpsc::Receiver<Report>,
    metered: Option<&TaskSpec>,
) -> Vec<HeldReport> {
    let mut pending = Vec::with_capacity(REPORT_BUFFER);
    let (mut held, mut dropped) = (Vec::new(), 0usize);
    while receiver.recv_many(&mut pending, REPORT_BUFFER).await > 0 {
        let batch = std::mem::take(&mut pending);
        let last = batch.len() - 1;
        for (i, report) in batch.iter().enumerate() {
            let superseded = matches!(report, Report::Progress { .. })
                && i < last
                && matches!(batch[i + 1], Report::Progress { .. });
            if superseded {
                continue;
            }
            let (progress, kind, data) = match executors::recorded(report, metered.map(|spec| &spec.executor)) {
                Recorded::Malformed => {
                    tracing::warn!(?report, "ignoring a malformed report");
                    continue;
                }
                Recorded::Shown { progress, kind, data } => (progress, kind, data),
                Recorded::Held(report) => {
                    if held.len() < HELD_REPORTS_MAX {
                        held.push(report);
                    } else {
                        dropped += 1;
                    }
                    continue;
                }
            };
            match store::running_event(&ctx.db, id, attempt, progress, kind, &data).await {
                Ok(Some(event)) => ctx.events.publish_logged(id, &event).await,
                Ok(None) => tracing::debug!("report after the run lost the task; dropped"),
                Err(e) => tracing::warn!(error = %e, "could not record a report; dropped"),
            }
        }
    }
    if dropped > 0 {
        let line = format!("{dropped} more reports of this run were dropped (at most {HELD_REPORTS_MAX} are kept)");
        held.push(HeldReport { kind: EventType::Log.as_str().to_owned(), data: json!({ "line": line }) });
    }
    held
}
