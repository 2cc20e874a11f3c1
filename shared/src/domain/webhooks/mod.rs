//! Completion webhooks, signed per Standard Webhooks: when a task ends, a
//! POST of its view to the endpoint its owner chose.
//!
//! Module map, in the order a delivery passes through it:
//! - here: what an owner subscribes ([`Subscription`]: a URL and the
//!   events, `completed`, `failed`, `canceled`, and `progress` if asked),
//!   checked as it is given;
//!   a task's own (set just after create, [`subscribe_task`]) or its
//!   Space's default ([`set_default`]), and the refusals ([`WebhookRefusal`]);
//! - [`secrets`]: a Space's signing secrets (`whsec_…`), made and rotated by
//!   its owner, shown once; a rotation keeps the one before for
//!   [`ROTATION_GRACE`], during which both sign;
//! - the outbox: a row of `webhook_deliveries` is written by the statement
//!   that ends the task (`tasks::transition`), so no end is without its
//!   row, whatever crashes after; one per end, keyed on the task's run
//!   series (`rerun`), so a task an operator re-runs has its re-run's end
//!   delivered too (and its first end's, if still undelivered, is
//!   `superseded`); a `progress` row by the statement that
//!   records a progress event (`tasks::events::running_event`), at most one
//!   pending per task (see [`PROGRESS`]);
//! - [`outbox`]: that table as the sender and the owner read it: due rows
//!   claimed under a lease, each attempt recorded, the attempts listed;
//! - [`sender`]: the delivery itself, through the users' SSRF-guarded
//!   client with redirects off and a timeout, on the Standard Webhooks
//!   retry schedule with jitter and `Retry-After`; `410` disables the
//!   endpoint for the Space. `reeve serve` and `reeve work` run it in the
//!   background; in AWS the sweeper's schedule does.
//!
//! Signing itself is `infra::standard_webhooks`.

pub mod outbox;
pub mod secrets;
#[cfg(feature = "outbound")]
pub mod sender;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::domain::auth::SpaceIndex;
use crate::domain::error::{ErrorKind, Refusal, Wording};
use crate::domain::ids::Id;

/// How a task may end: the events a subscription gets when it names none.
pub const EVENTS: [&str; 3] = ["completed", "failed", "canceled"];

/// The event of a running task's progress, only when a subscription names
/// it. Progress can come many times a second, so it is coalesced: a task
/// has at most one progress delivery pending, and what it sends is the
/// task's view when it is sent (its latest `progress`), not the report that
/// made it. A progress delivery not yet sent when the task ends is
/// `superseded`: the end's delivery says more, and a late progress after it
/// would only confuse a receiver.
pub const PROGRESS: &str = "progress";

/// Every event a subscription may name.
pub const SUBSCRIBABLE: [&str; 4] = ["completed", "failed", "canceled", PROGRESS];

/// The longest URL an owner may name.
pub const MAX_URL_LEN: usize = 2048;

/// How long a rotated secret keeps signing beside its successor: a day, so a
/// receiver deployed once a day has taken the new one before the old stops.
pub const ROTATION_GRACE: Duration = Duration::from_secs(24 * 60 * 60);

/// The Standard Webhooks retry schedule: the wait before each retry, after
/// the first attempt, which is made as soon as the task ends.
pub const STANDARD_SCHEDULE: [Duration; 9] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(14 * 3600),
    Duration::from_secs(20 * 3600),
    Duration::from_secs(24 * 3600),
];

/// How the sender delivers. The defaults are the Standard Webhooks ones;
/// tests shorten the schedule.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// The wait before each retry; once it is used up the delivery fails.
    pub schedule: Vec<Duration>,
    /// Each wait is moved by up to this fraction either way, so endpoints
    /// that failed together are not all retried in the same second.
    pub jitter: f64,
    /// The whole exchange with the endpoint, body included.
    pub timeout: Duration,
    /// Rows claimed per round, and sent at once.
    pub batch: i64,
}

/// The timeout of one attempt when unset: an endpoint that takes longer
/// should answer first and work after.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings { schedule: STANDARD_SCHEDULE.to_vec(), jitter: 0.1, timeout: DEFAULT_TIMEOUT, batch: 50 }
    }
}

/// Where a task's end is delivered, and which ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Subscription {
    /// An `https://` URL on a public address (a private or loopback one is
    /// refused when it is called). Redirects are not followed.
    #[schema(
        example = "https://example.com/hooks/reeve",
        max_length = 2048,
        pattern = r"^https?://[A-Za-z0-9]+([.-][A-Za-z0-9]+)*(:[0-9]{1,4})?(/[A-Za-z0-9._~/-]*)?$"
    )]
    pub url: String,
    /// Which events to deliver: the ends `completed`, `failed`, `canceled`,
    /// and `progress` while the task runs. The three ends when left out.
    #[serde(default = "all_events")]
    #[schema(example = json!(["completed", "failed", "progress"]), value_type = Vec<WebhookEvent>, min_items = 1)]
    pub events: Vec<String>,
}

/// A webhook event's name, for the document ([`SUBSCRIBABLE`]).
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)] // Only its schema is used.
#[serde(rename_all = "lowercase")]
enum WebhookEvent {
    Completed,
    Failed,
    Canceled,
    Progress,
}

fn all_events() -> Vec<String> {
    EVENTS.iter().map(|e| (*e).to_owned()).collect()
}

impl Subscription {
    /// The URL and the events checked: an absolute `http(s)` URL without
    /// credentials, of at most [`MAX_URL_LEN`]; known events, at least one,
    /// each once. Whether its host may be reached is the sender's guard's
    /// question, asked at every call (a name may resolve elsewhere later).
    pub fn checked(mut self) -> Result<Subscription, WebhookRefusal> {
        let bad = |why: &str| Err(WebhookRefusal::Invalid(why.to_owned()));
        if self.url.len() > MAX_URL_LEN {
            return bad("the webhook URL is longer than 2048 characters");
        }
        let Ok(url) = url::Url::parse(&self.url) else { return bad("the webhook URL is not an absolute URL") };
        if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
            return bad("the webhook URL must be https://");
        }
        if !url.username().is_empty() || url.password().is_some() {
            return bad("the webhook URL must not carry credentials");
        }
        self.url = url.to_string();
        if self.events.is_empty() {
            return bad("name at least one webhook event: completed, failed, canceled, progress");
        }
        for event in &self.events {
            if !SUBSCRIBABLE.contains(&event.as_str()) {
                return bad(&format!("unknown webhook event {event:?}: use completed, failed, canceled, progress"));
            }
        }
        self.events.sort();
        self.events.dedup();
        Ok(self)
    }
}

/// A webhook as a create names it (REST's `webhook`, MCP's `webhook`
/// argument): a URL, for every end, or `{"url", "events"}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum WebhookRequest {
    #[schema(example = "https://example.com/hooks/reeve")]
    Url(String),
    Subscription(Subscription),
}

impl From<WebhookRequest> for Subscription {
    fn from(request: WebhookRequest) -> Self {
        match request {
            WebhookRequest::Url(url) => Subscription { url, events: all_events() },
            WebhookRequest::Subscription(subscription) => subscription,
        }
    }
}

/// Why a webhook request is refused.
#[derive(Debug, thiserror::Error)]
pub enum WebhookRefusal {
    /// The URL or the events are not usable.
    #[error("invalid webhook: {0}")]
    Invalid(String),
    /// Nothing could be signed: the Space has no secret yet.
    #[error("the Space has no webhook secret")]
    SecretRequired,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

impl Refusal for WebhookRefusal {
    fn code(&self) -> &'static str {
        match self {
            WebhookRefusal::Invalid(_) => "invalid_webhook",
            WebhookRefusal::SecretRequired => "webhook_secret_required",
            WebhookRefusal::Db(e) => Refusal::code(e),
        }
    }

    fn kind(&self) -> ErrorKind {
        match self {
            WebhookRefusal::Invalid(_) | WebhookRefusal::SecretRequired => ErrorKind::Unprocessable,
            WebhookRefusal::Db(e) => Refusal::kind(e),
        }
    }

    fn message(&self, words: &Wording) -> String {
        match self {
            WebhookRefusal::Invalid(why) => why.clone(),
            WebhookRefusal::SecretRequired => {
                "this Space has no webhook secret to sign with: create one with POST /v1/space/webhook-secret first"
                    .to_owned()
            }
            WebhookRefusal::Db(e) => e.message(words),
        }
    }
}

/// Refuses a subscription of a Space that has no secret: its deliveries
/// could not be signed.
async fn require_secret(db: &PgPool, space: &SpaceIndex) -> Result<(), WebhookRefusal> {
    if secrets::has_secret(db, space).await? { Ok(()) } else { Err(WebhookRefusal::SecretRequired) }
}

/// Checks a task's subscription before the task is stored, so a refused one
/// stores nothing.
pub async fn check_for_task(
    db: &PgPool,
    space: &SpaceIndex,
    subscription: Subscription,
) -> Result<Subscription, WebhookRefusal> {
    let subscription = subscription.checked()?;
    require_secret(db, space).await?;
    Ok(subscription)
}

/// Gives task `id` its own subscription, once (a replayed create keeps the
/// first one). It is set just after the task is stored; should the task
/// have ended in between (a worker is fast), the same statement writes its
/// outbox row, so the end is delivered either way: whichever of the two
/// statements commits second sees the other's row.
pub async fn subscribe_task(
    db: &PgPool,
    space: &SpaceIndex,
    id: Id,
    subscription: &Subscription,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH subscribed AS (
             UPDATE tasks SET webhook_url = $3, webhook_events = $4
              WHERE id = $1 AND space_idx = $2 AND webhook_url IS NULL
          RETURNING id, space_idx, status, webhook_url, webhook_events, reruns
         )
         INSERT INTO webhook_deliveries (id, task_id, space_idx, url, event, rerun)
         SELECT $5, id, space_idx, webhook_url, status, reruns FROM subscribed
          WHERE status IN ('completed', 'failed', 'canceled') AND status = ANY(webhook_events)
         ON CONFLICT (task_id, rerun) WHERE event <> 'progress' DO NOTHING",
    )
    .bind(id)
    .bind(space.as_bytes())
    .bind(&subscription.url)
    .bind(&subscription.events)
    .bind(Id::new())
    .execute(db)
    .await?;
    Ok(())
}

/// Sets (or with `None` removes) the Space's default subscription, for its
/// tasks that name none. Setting a URL enables it again for the Space if a
/// `410` had disabled it.
pub async fn set_default(
    db: &PgPool,
    space: &SpaceIndex,
    subscription: Option<Subscription>,
) -> Result<Option<Subscription>, WebhookRefusal> {
    let Some(subscription) = subscription else {
        sqlx::query("DELETE FROM space_webhooks WHERE space_idx = $1").bind(space.as_bytes()).execute(db).await?;
        return Ok(None);
    };
    let subscription = subscription.checked()?;
    require_secret(db, space).await?;
    let mut tx = db.begin().await?;
    sqlx::query(
        "INSERT INTO space_webhooks (space_idx, url, events) VALUES ($1, $2, $3)
         ON CONFLICT (space_idx) DO UPDATE SET url = $2, events = $3, updated_at = now()",
    )
    .bind(space.as_bytes())
    .bind(&subscription.url)
    .bind(&subscription.events)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM webhook_disabled WHERE space_idx = $1 AND url = $2")
        .bind(space.as_bytes())
        .bind(&subscription.url)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Some(subscription))
}

/// The Space's default subscription, and the URLs a `410` disabled for it.
pub async fn default_of(db: &PgPool, space: &SpaceIndex) -> Result<(Option<Subscription>, Vec<String>), sqlx::Error> {
    let default: Option<(String, Vec<String>)> =
        sqlx::query_as("SELECT url, events FROM space_webhooks WHERE space_idx = $1")
            .bind(space.as_bytes())
            .fetch_optional(db)
            .await?;
    let disabled: Vec<String> =
        sqlx::query_scalar("SELECT url FROM webhook_disabled WHERE space_idx = $1 ORDER BY disabled_at")
            .bind(space.as_bytes())
            .fetch_all(db)
            .await?;
    Ok((default.map(|(url, events)| Subscription { url, events }), disabled))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(url: &str, events: &[&str]) -> Subscription {
        Subscription { url: url.into(), events: events.iter().map(|e| (*e).to_owned()).collect() }
    }

    #[test]
    fn a_subscription_is_an_http_url_and_known_events() {
        let ok = sub("https://example.com/hook", &["failed", "completed", "failed"]).checked().unwrap();
        assert_eq!(ok.events, ["completed", "failed"]);
        for (bad, events) in [
            ("example.com/hook", &["completed"][..]),
            ("ftp://example.com/", &["completed"]),
            ("https://user:pw@example.com/", &["completed"]),
            ("https://example.com/", &[]),
            ("https://example.com/", &["started"]),
        ] {
            let refused = sub(bad, events).checked().unwrap_err();
            assert_eq!(refused.code(), "invalid_webhook", "{bad} {events:?}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert!(sub(&long, &["completed"]).checked().is_err());
        let all: Subscription = serde_json::from_value(serde_json::json!({"url": "https://example.com/"})).unwrap();
        assert_eq!(all.events, EVENTS, "the ends, not progress, unless asked");
        let progress = sub("https://example.com/", &["progress", "completed"]).checked().unwrap();
        assert_eq!(progress.events, ["completed", "progress"]);
        let url: WebhookRequest = serde_json::from_value(serde_json::json!("https://example.com/")).unwrap();
        assert_eq!(Subscription::from(url).events, EVENTS);
    }

    #[test]
    fn the_default_schedule_is_the_standard_one() {
        let secs: Vec<u64> = WebhookSettings::default().schedule.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400]);
    }
}
