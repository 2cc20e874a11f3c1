//! The worker Lambda's handler: an SQS batch in, the records to redeliver
//! out (`ReportBatchItemFailures`).

use std::collections::HashMap;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures_util::StreamExt;
use futures_util::stream;
use tracing::Instrument;

use super::{Outcome, Retry, WorkerContext, process_until};
use crate::domain::tasks::QueueMessage;

/// The attribute SQS counts deliveries in (1 on the first).
pub const RECEIVE_COUNT: &str = "ApproximateReceiveCount";

/// A record's delivery count; 1 when the attribute is missing or unreadable.
pub fn receive_count(record: &SqsMessage) -> u32 {
    record.attributes.get(RECEIVE_COUNT).and_then(|n| n.trim().parse().ok()).unwrap_or(1)
}

/// Runs every record of the batch, at most `settings.concurrency` at once,
/// and reports the ones to retry ([`Outcome::Retry`]) as batch item
/// failures, each first hidden for its backoff (or shown at once, given
/// back unclaimed) so that SQS hands it out again then rather than after
/// the queue's visibility timeout. `Done` and `Failed` records are not
/// failures: Lambda deletes them, so a malformed body or a failed task is
/// not redelivered.
///
/// Records for the same task (a duplicate delivery in one batch) run one
/// after another, so the second finds the task finished instead of held by
/// a live lease, and neither needs a redelivery.
pub async fn handle_batch(ctx: &WorkerContext, event: SqsEvent) -> SqsBatchResponse {
    handle_batch_until(ctx, event, None).await
}

/// [`handle_batch`] within an invocation that Lambda ends at `deadline`
/// (`Context::deadline`, see [`deadline_of`]): runs still going near it are
/// stopped and their tasks handed back, and records not yet started are
/// left for redelivery.
pub async fn handle_batch_until(
    ctx: &WorkerContext,
    event: SqsEvent,
    deadline: Option<tokio::time::Instant>,
) -> SqsBatchResponse {
    let mut groups: Vec<Vec<SqsMessage>> = Vec::new();
    let mut by_task: HashMap<String, usize> = HashMap::new();
    for record in event.records {
        let task = record
            .body
            .as_deref()
            .and_then(|body| serde_json::from_str::<QueueMessage>(body).ok())
            .map(|m| m.task_id.to_string());
        match task {
            Some(task) if by_task.contains_key(&task) => groups[by_task[&task]].push(record),
            Some(task) => {
                by_task.insert(task, groups.len());
                groups.push(vec![record]);
            }
            // Unreadable: a group of its own.
            None => groups.push(vec![record]),
        }
    }

    let concurrency = ctx.settings.concurrency.max(1);
    let outcomes: Vec<(String, Outcome)> = stream::iter(groups)
        .map(|group| async move {
            let mut outcomes = Vec::with_capacity(group.len());
            for record in group {
                outcomes.push(handle_record(ctx, record, deadline).await);
            }
            outcomes
        })
        .buffer_unordered(concurrency)
        .flat_map(stream::iter)
        .collect()
        .await;

    crate::infra::metrics::flush();
    let mut response = SqsBatchResponse::default();
    for (message_id, outcome) in outcomes {
        if outcome.is_retry() {
            // An empty id makes Lambda retry the whole batch: still a retry.
            response.add_failure(message_id);
        }
    }
    response
}

async fn handle_record(
    ctx: &WorkerContext,
    record: SqsMessage,
    deadline: Option<tokio::time::Instant>,
) -> (String, Outcome) {
    let message_id = record.message_id.clone().unwrap_or_default();
    let receive_count = receive_count(&record);
    let span = tracing::info_span!("sqs_record", message_id = %message_id, receive_count);
    let body = record.body.as_deref().unwrap_or("");
    let outcome = process_until(ctx, body, receive_count, deadline).instrument(span.clone()).await;
    if let Outcome::Retry(Retry { after: Some(after), .. }) = &outcome {
        match (&ctx.visibility, record.receipt_handle.as_deref()) {
            (Some(queue), Some(receipt)) => queue.retry_in(receipt, *after).instrument(span).await,
            _ => span.in_scope(|| {
                tracing::warn!("no queue to set the visibility on; it comes back after the queue's visibility timeout")
            }),
        }
    }
    (message_id, outcome)
}

/// Lambda's deadline (wall-clock time) as an instant on tokio's clock.
pub fn deadline_of(deadline: std::time::SystemTime) -> tokio::time::Instant {
    let left = deadline.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    tokio::time::Instant::now() + left
}
