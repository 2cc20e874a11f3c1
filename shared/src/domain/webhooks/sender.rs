//! The sender: claims the outbox's due rows and POSTs each task's view to
//! its endpoint, signed with the Space's secrets.
//!
//! - Through the users' SSRF-guarded client (the one `fetch` uses, never
//!   the operators'), with redirects off: a 3xx is recorded as the
//!   endpoint's answer and retried, its target never called. A private or
//!   refused address fails the delivery at once; nothing is sent.
//! - Retried on [`WebhookSettings::schedule`] (the Standard Webhooks one
//!   unless told otherwise), each wait moved by the jitter, and never
//!   shorter than the endpoint's `Retry-After` (capped at a day). A `410`
//!   disables the endpoint for the Space: this delivery and every later one
//!   to it end `disabled` until the Space sets the URL again.
//! - The payload is the task's view with links, never its result or input:
//!   `{"type": "task.completed", "timestamp", "data": {…, "links": {…}}}`
//!   (`task.progress` for progress, with the task's `progress` as it is
//!   when sent; one whose task has ended before it was sent is
//!   `superseded`, never sent, and so is an end's whose task an operator
//!   re-ran before it was delivered: the re-run's end has its own).
//!   Each attempt is signed afresh (its `webhook-timestamp` is when it is
//!   sent); the `webhook-id` is the delivery's, the same for every attempt.
//!
//! Where it runs: `reeve serve` and `reeve work` run [`Sender::run_every`]
//! in the background; in AWS the sweeper calls [`Sender::deliver_due`] on
//! its schedule.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use sqlx::PgPool;
use time::format_description::well_known::Rfc3339;

use super::outbox::{self, Attempt, Due, Next};
use super::secrets;
use super::{PROGRESS, WebhookSettings};
use crate::domain::auth::SpaceIndex;
use crate::domain::tasks;
use crate::infra::outbound::{Outbound, OutboundError};
use crate::infra::standard_webhooks::{ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, signature_header};

/// How much of an endpoint's answer is read: it is not looked at beyond
/// its status.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;
/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Deliveries sent at once.
const CONCURRENCY: usize = 8;
/// How often `reeve serve` and `reeve work` look for due deliveries.
pub const POLL: Duration = Duration::from_secs(1);

/// What it needs: the outbox, the users' client without redirects, the
/// schedule.
#[derive(Debug, Clone)]
pub struct Sender {
    pub db: PgPool,
    client: Outbound,
    pub settings: WebhookSettings,
}

impl Sender {
    /// A sender on `users`, the users' guarded client (`fetch`'s): the same
    /// policy and allow-list, with redirects off.
    pub fn new(db: PgPool, users: &Outbound, settings: WebhookSettings) -> Result<Sender, OutboundError> {
        Ok(Sender { db, client: users.not_following_redirects()?, settings })
    }

    /// Sends what is due, a few at a time, while a round can still end
    /// before `until`: how many attempts it made. A database error is
    /// logged and ends the round; the rows it held are claimed again once
    /// their lease lapses.
    pub async fn deliver_due(&self, until: tokio::time::Instant) -> usize {
        let mut sent = 0;
        let lease = self.settings.timeout + Duration::from_secs(30);
        let batch = (CONCURRENCY as i64).min(self.settings.batch.max(1));
        while tokio::time::Instant::now() + self.settings.timeout <= until {
            let due = match outbox::claim_due(&self.db, batch, lease).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::error!(error = %e, "webhooks: cannot read the outbox");
                    return sent;
                }
            };
            let claimed = due.len() as i64;
            let results: Vec<_> = futures_util::stream::iter(due)
                .map(|due| self.deliver(due))
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            for result in results {
                match result {
                    Ok(attempted) => sent += usize::from(attempted),
                    Err(e) => tracing::error!(error = %e, "webhooks: cannot record an attempt"),
                }
            }
            if claimed < batch {
                break;
            }
        }
        if sent > 0 {
            tracing::info!(attempts = sent, "webhooks sent");
        }
        sent
    }

    /// Delivers one claimed row and records it: whether an attempt was made.
    async fn deliver(&self, due: Due) -> Result<bool, sqlx::Error> {
        if due.disabled {
            outbox::record(&self.db, &due, None, Next::Disabled).await?;
            return Ok(false);
        }
        let started = tokio::time::Instant::now();
        let (error, status_code, next) = match self.post(&due).await? {
            Posted::Superseded => {
                outbox::record(&self.db, &due, None, Next::Superseded).await?;
                return Ok(false);
            }
            Posted::Answered { status, retry_after, location } => self.judge(&due, status, retry_after, location),
            Posted::Refused(why) => (Some(why), None, Next::Failed),
            Posted::Failed(why) => (Some(why), None, self.retry(&due, None)),
        };
        let attempt = Attempt { status_code, error, duration: started.elapsed() };
        outbox::record(&self.db, &due, Some(&attempt), next).await?;
        tracing::info!(task_id = %due.task_id, delivery = %due.message_id(), status = next.status(), "webhook attempt");
        Ok(true)
    }

    /// Sends the signed payload once.
    async fn post(&self, due: &Due) -> Result<Posted, sqlx::Error> {
        let Some(space) = SpaceIndex::from_slice(&due.space_idx) else {
            return Ok(Posted::Refused("the delivery names no Space".into()));
        };
        let keys = secrets::signing_keys(&self.db, &due.space_idx).await?;
        if keys.is_empty() {
            return Ok(Posted::Refused("the Space has no webhook secret to sign with".into()));
        }
        let Some(task) = tasks::find_for_space(&self.db, &space, due.task_id).await? else {
            return Ok(Posted::Refused("the task is gone".into()));
        };
        // Progress after the end, or an end the task has left since (only an
        // operator's re-run moves an ended task): the later news has its own
        // delivery, and this one would only confuse a receiver.
        let moved_on = if due.event == PROGRESS {
            task.status.is_terminal()
        } else {
            due.rerun_since || task.status.as_str() != due.event
        };
        if moved_on {
            return Ok(Posted::Superseded);
        }
        let body = payload(due, &task).to_string().into_bytes();
        let id = due.message_id();
        let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
        let headers = [
            (ID_HEADER, id.clone()),
            (TIMESTAMP_HEADER, timestamp.to_string()),
            (SIGNATURE_HEADER, signature_header(&keys, &id, timestamp, &body)),
        ];
        let timeout = self.settings.timeout;
        Ok(match self.client.post_signed(&due.url, body, &headers, timeout, MAX_ANSWER_BYTES).await {
            Ok(answer) => {
                Posted::Answered { status: answer.status, retry_after: answer.retry_after, location: answer.location }
            }
            Err(OutboundError::Blocked(why)) => Posted::Refused(format!("refused: {why}")),
            Err(OutboundError::InvalidUrl(why)) => Posted::Refused(format!("invalid URL: {why}")),
            Err(OutboundError::Timeout) => Posted::Failed(format!("no answer within {} s", timeout.as_secs_f64())),
            Err(e) => Posted::Failed(e.to_string()),
        })
    }

    /// What an answer means: delivered (2xx), disabled (410), or retried.
    fn judge(
        &self,
        due: &Due,
        status: u16,
        retry_after: Option<Duration>,
        location: Option<String>,
    ) -> (Option<String>, Option<u16>, Next) {
        match status {
            200..=299 => (None, Some(status), Next::Delivered),
            410 => (Some("410 Gone: the endpoint is disabled for this Space".into()), Some(status), Next::Disabled),
            300..=399 => {
                let to = location.unwrap_or_else(|| "nowhere".into());
                (Some(format!("redirect to {to} not followed")), Some(status), self.retry(due, None))
            }
            _ => (Some(format!("answered {status}")), Some(status), self.retry(due, retry_after)),
        }
    }

    /// The next step after a failed attempt: the schedule's next wait,
    /// jittered, at least the endpoint's `Retry-After`; or failed once the
    /// schedule is used up.
    fn retry(&self, due: &Due, retry_after: Option<Duration>) -> Next {
        let Some(wait) = self.settings.schedule.get(due.attempts as usize) else { return Next::Failed };
        let wait = jittered(*wait, self.settings.jitter);
        Next::Retry(retry_after.map_or(wait, |asked| wait.max(asked.min(MAX_RETRY_AFTER))))
    }

    /// Delivers every `every` until `shutdown` resolves: `reeve serve` and
    /// `reeve work`. A round in progress at shutdown finishes first.
    pub async fn run_every(&self, every: Duration, shutdown: impl std::future::Future<Output = ()>) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticks.tick() => {}
            }
            let round = self.settings.timeout * 3 + every;
            self.deliver_due(tokio::time::Instant::now() + round).await;
        }
    }

    /// [`Self::run_every`] as a task of its own.
    pub fn spawn_every(
        self,
        every: Duration,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move { self.run_every(every, shutdown).await })
    }
}

/// What sending got.
enum Posted {
    Answered {
        status: u16,
        retry_after: Option<Duration>,
        location: Option<String>,
    },
    /// Never to be sent: a refused address, an unusable URL, no secret.
    Refused(String),
    /// Worth trying again: no answer, a broken connection.
    Failed(String),
    /// Not to be sent: a progress delivery whose task has ended, an end's
    /// whose task was re-run.
    Superseded,
}

/// `wait` moved by a random fraction of up to `jitter` either way.
fn jittered(wait: Duration, jitter: f64) -> Duration {
    if jitter <= 0.0 {
        return wait;
    }
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).expect("the OS random number generator works");
    let unit = f64::from(u32::from_le_bytes(bytes)) / f64::from(u32::MAX);
    wait.mul_f64((1.0 + jitter * (2.0 * unit - 1.0)).max(0.0))
}

/// The body: the task's view with links, not its result or input, so a
/// payload stays small whatever the task made; the links are paths on the
/// API the task was created on. `rerun` says which run of the task it is
/// about (0 its first, n its n-th re-run), so a receiver tells a re-run's
/// end from the first one's.
fn payload(due: &Due, task: &tasks::Task) -> Value {
    let mut data = serde_json::to_value(task).expect("a task serialises");
    if let Some(fields) = data.as_object_mut() {
        fields.remove("result");
    }
    data["rerun"] = due.rerun.into();
    let id = task.id;
    data["links"] = json!({
        "task": format!("/v1/tasks/{id}"),
        "events": format!("/v1/tasks/{id}/events"),
        "webhooks": format!("/v1/tasks/{id}/webhooks"),
    });
    json!({
        "type": format!("task.{}", due.event),
        "timestamp": due.created_at.format(&Rfc3339).unwrap_or_default(),
        "data": data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_fraction() {
        let wait = Duration::from_secs(100);
        assert_eq!(jittered(wait, 0.0), wait);
        for _ in 0..100 {
            let moved = jittered(wait, 0.1);
            assert!(moved >= Duration::from_secs(90) && moved <= Duration::from_secs(110), "{moved:?}");
        }
    }
}
