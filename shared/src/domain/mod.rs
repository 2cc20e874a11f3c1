//! The domain floor: what Reeve is about, whoever asks. Spaces and their
//! sessions, the catalog, uploads, tasks and their events, payments and
//! credits, the executors that do the work, and the relay's fan-out of a
//! task's events. Nothing here knows how a request arrived (HTTP, SQS, S3,
//! a schedule): that is the adapters' job. It uses the infrastructure floor
//! (Postgres, Redis, S3, the outbound client, metrics) and nothing above.

pub mod auth;
pub mod catalog;
pub mod error;
#[cfg(feature = "catalog")]
pub mod executors;
pub mod ids;
// Not only `api-auth`'s: every function's settings carry the login budgets
// (`startup::settings`, `ApiSettings`), whether or not it spends them.
pub mod login_limits;
// The sweeper forgets old pay links.
#[cfg(any(feature = "api-tasks", feature = "sweeper"))]
pub mod pay_links;
pub mod payments;
#[cfg(feature = "relay")]
pub mod relay;
pub mod request;
pub mod sessions;
#[cfg(feature = "api-auth")]
pub mod spaces;
pub mod tasks;
#[cfg(feature = "s3-objects")]
pub mod uploads;
pub mod webhooks;
