//! `reeve work`: the worker outside Lambda. Long-polls the queue (holding up
//! to twice its concurrency received, so a free slot never waits on a
//! receive), runs each message through [`process`], deletes it only once it is `Done` or
//! `Failed`, and leaves a `Retry` to reappear after its backoff (its
//! visibility set to it), or when its visibility timeout runs out (which is
//! also how SQS counts it towards the dead-letter queue).
//! While a message runs, its visibility is extended, so a long task is not
//! handed to a second worker. On shutdown, the messages in flight are run
//! to the end, and a receive already sent is awaited and whatever it brings
//! is given back with visibility 0, never left hidden.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
};
use futures_util::StreamExt;
use futures_util::stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::visibility::{Visibility, sqs_error};
use super::{Outcome, Retry, WorkerContext, process};

/// SQS's limit on one receive.
pub const MAX_BATCH: usize = 10;
/// The longest long-poll SQS allows.
pub const WAIT_TIME_SECONDS: i32 = 20;
/// How much longer than its long poll a receive interrupted by shutdown is
/// awaited before its messages are left to time out.
pub const RECEIVE_MARGIN: Duration = Duration::from_secs(5);
/// What a queue without the attribute (or a test) is taken to have.
pub const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum PollError {
    #[error("cannot read the queue's attributes: {0}")]
    Queue(String),
    #[error("receiving from SQS failed: {0}")]
    Receive(String),
}

/// What one [`Poller::poll_once`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PollReport {
    pub received: usize,
    /// `Done`: deleted.
    pub done: usize,
    /// `Failed`: deleted.
    pub failed: usize,
    /// `Retry`: left in the queue.
    pub retried: usize,
}

#[derive(Clone)]
pub struct Poller {
    ctx: Arc<WorkerContext>,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    visibility: Visibility,
    /// How long a receive waits for a message (20 s, SQS's maximum).
    pub wait_time_seconds: i32,
    /// The queue's visibility timeout: a message being worked on is made
    /// invisible for this long again every third of it.
    pub visibility_timeout: Duration,
}

impl Poller {
    /// A poller on `queue_url`. Reads the queue's visibility timeout, which
    /// also checks at start-up that the queue is there.
    pub async fn connect(
        ctx: Arc<WorkerContext>,
        sqs: aws_sdk_sqs::Client,
        queue_url: impl Into<String>,
    ) -> Result<Poller, PollError> {
        let queue_url = queue_url.into();
        let attributes = sqs
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(QueueAttributeName::VisibilityTimeout)
            .send()
            .await
            .map_err(|e| PollError::Queue(sqs_error(&e)))?;
        let visibility_timeout = attributes
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::VisibilityTimeout))
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&secs| secs > 0)
            .map_or(DEFAULT_VISIBILITY_TIMEOUT, Duration::from_secs);
        let visibility = Visibility::new(sqs.clone(), queue_url.clone());
        Ok(Poller { ctx, sqs, queue_url, visibility, wait_time_seconds: WAIT_TIME_SECONDS, visibility_timeout })
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// Receives one batch (waiting up to `wait_time_seconds`), runs its
    /// messages to the end, at most `settings.concurrency` at once, and
    /// returns what became of them.
    pub async fn poll_once(&self) -> Result<PollReport, PollError> {
        let messages = self.receive(MAX_BATCH).await?;
        let mut report = PollReport { received: messages.len(), ..PollReport::default() };
        let outcomes: Vec<Outcome> = stream::iter(messages)
            .map(|message| self.handle(message, None))
            .buffer_unordered(self.ctx.settings.concurrency.max(1))
            .collect()
            .await;
        for outcome in outcomes {
            match outcome {
                Outcome::Done => report.done += 1,
                Outcome::Failed(_) => report.failed += 1,
                Outcome::Retry(_) => report.retried += 1,
            }
        }
        Ok(report)
    }

    /// Polls until `shutdown` resolves, then stops receiving and lets the
    /// messages in flight finish. Up to `settings.concurrency` messages run
    /// at once, and as many again are held received, waiting for a slot
    /// (their visibility kept up meanwhile): a slot that frees finds its next
    /// message already here, rather than waiting on a receive for one
    /// message. At shutdown the held ones are given back unstarted.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let concurrency = self.ctx.settings.concurrency.max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        let held = concurrency * 2;
        let (stopping, stop) = watch::channel(false);
        let mut running = JoinSet::new();
        let mut backoff = Duration::from_secs(1);
        tokio::pin!(shutdown);
        tracing::info!(queue_url = %self.queue_url, "polling");
        loop {
            while let Some(joined) = running.try_join_next() {
                log_join(joined);
            }
            let free = held.saturating_sub(running.len());
            if free == 0 {
                tokio::select! {
                    () = &mut shutdown => break,
                    Some(joined) = running.join_next() => log_join(joined),
                }
                continue;
            }
            let receive = self.receive(free.min(MAX_BATCH));
            tokio::pin!(receive);
            let received = tokio::select! {
                () = &mut shutdown => {
                    // The request may already be at SQS, which hides what it
                    // hands back whether or not anyone reads the answer.
                    // Dropping it would leave those messages invisible for
                    // the whole visibility timeout; wait for it and give
                    // them back instead.
                    self.finish_receive(receive).await;
                    break;
                }
                received = &mut receive => received,
            };
            match received {
                Ok(messages) => {
                    backoff = Duration::from_secs(1);
                    for message in messages {
                        let (poller, slot) = (self.clone(), Slot { slots: slots.clone(), stop: stop.clone() });
                        running.spawn(async move {
                            poller.handle(message, Some(slot)).await;
                        });
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, backoff_secs = backoff.as_secs(), "receive failed; backing off");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        stopping.send_replace(true);
        while let Some(joined) = running.try_join_next() {
            log_join(joined);
        }
        tracing::info!(in_flight = running.len(), "shutting down: finishing the messages in flight");
        while let Some(joined) = running.join_next().await {
            log_join(joined);
        }
        tracing::info!("stopped");
    }

    /// Awaits a receive interrupted by shutdown (at most its long poll plus
    /// a margin) and makes every message it got visible again at once.
    async fn finish_receive(&self, receive: impl Future<Output = Result<Vec<Message>, PollError>>) {
        let limit = Duration::from_secs(u64::try_from(self.wait_time_seconds.max(0)).unwrap_or(0)) + RECEIVE_MARGIN;
        tracing::info!(wait_secs = limit.as_secs(), "shutting down: waiting for the receive in flight");
        match tokio::time::timeout(limit, receive).await {
            Ok(Ok(messages)) => self.release(&messages).await,
            Ok(Err(e)) => tracing::debug!(error = %e, "the receive in flight failed; nothing to give back"),
            Err(_) => tracing::warn!(
                "the receive in flight did not answer; what it took reappears after the visibility timeout"
            ),
        }
    }

    /// Gives messages back to the queue unworked: visibility 0, so another
    /// worker (or the next start) can take them right away.
    pub async fn release(&self, messages: &[Message]) {
        let entries: Vec<_> = messages
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle()?)
                    .visibility_timeout(0)
                    .build()
                    .ok()
            })
            .collect();
        if entries.is_empty() {
            return;
        }
        let count = entries.len();
        let changed = self
            .sqs
            .change_message_visibility_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await;
        match changed {
            Ok(answer) if answer.failed().is_empty() => tracing::info!(count, "gave the received messages back"),
            Ok(answer) => tracing::warn!(failed = answer.failed().len(), "some messages could not be given back"),
            Err(e) => tracing::warn!(error = %sqs_error(&e), "could not give the received messages back"),
        }
    }

    async fn receive(&self, max: usize) -> Result<Vec<Message>, PollError> {
        let received = self
            .sqs
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(self.wait_time_seconds)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| PollError::Receive(sqs_error(&e)))?;
        let messages = received.messages.unwrap_or_default();
        crate::infra::metrics::sqs_received(messages.len());
        Ok(messages)
    }

    /// Runs one message, once `slot` (when given) has a place for it,
    /// keeping it invisible while it waits and runs; deletes it unless it is
    /// to be retried. One still waiting at shutdown is given back.
    async fn handle(&self, message: Message, slot: Option<Slot>) -> Outcome {
        let message_id = message.message_id().unwrap_or_default().to_owned();
        let receive_count = message
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        let span = tracing::info_span!("sqs_message", message_id = %message_id, receive_count);
        async {
            let Some(receipt) = message.receipt_handle() else {
                tracing::error!("a message without a receipt handle; leaving it");
                return Outcome::retry("no receipt handle");
            };
            let body = message.body().unwrap_or("");
            let work = async {
                let _running = match slot {
                    Some(slot) => match slot.take().await {
                        Some(permit) => Some(permit),
                        None => return Outcome::retry_in("given back unstarted at shutdown", Duration::ZERO),
                    },
                    None => None,
                };
                process(&self.ctx, body, receive_count).await
            };
            tokio::pin!(work);
            let every = (self.visibility_timeout / 3).max(Duration::from_secs(1));
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let outcome = loop {
                tokio::select! {
                    outcome = &mut work => break outcome,
                    _ = ticks.tick() => self.extend_visibility(receipt).await,
                }
            };
            match &outcome {
                Outcome::Done | Outcome::Failed(_) => self.delete(receipt).await,
                Outcome::Retry(Retry { after: Some(after), .. }) => self.visibility.retry_in(receipt, *after).await,
                Outcome::Retry(Retry { after: None, .. }) => {}
            }
            outcome
        }
        .instrument(span)
        .await
    }

    async fn extend_visibility(&self, receipt: &str) {
        match self.visibility.set(receipt, self.visibility_timeout).await {
            Ok(()) => tracing::debug!(secs = self.visibility_timeout.as_secs(), "visibility extended"),
            Err(e) => tracing::warn!(error = %e, "could not extend the message's visibility"),
        }
    }

    /// A message that cannot be deleted comes back later and finds its task
    /// finished: harmless, so it is only logged.
    async fn delete(&self, receipt: &str) {
        let deleted = self.sqs.delete_message().queue_url(&self.queue_url).receipt_handle(receipt).send().await;
        match deleted {
            Ok(_) => crate::infra::metrics::sqs_deleted(1),
            Err(e) => {
                tracing::warn!(error = %sqs_error(&e), "could not delete the message; it will come back and be skipped")
            }
        }
    }
}

/// A place among the messages that run at once, waited for by a message
/// held received; `stop` turns true at shutdown.
struct Slot {
    slots: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

impl Slot {
    /// The place, or `None` once shutdown began first.
    async fn take(mut self) -> Option<OwnedSemaphorePermit> {
        tokio::select! {
            biased;
            _ = self.stop.wait_for(|stopping| *stopping) => None,
            permit = self.slots.clone().acquire_owned() => Some(permit.expect("the semaphore is never closed")),
        }
    }
}

fn log_join(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined {
        tracing::error!(error = %e, "a message's task panicked");
    }
}
