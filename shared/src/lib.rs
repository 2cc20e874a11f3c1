//! Reeve's shared crate: every piece of domain logic lives here, and each
//! binary (`reeve`, the Lambda functions, the relay) is glue around it.
//!
//! The source is laid out in floors, each depending only on those below it:
//! - `startup/`: the composition root. It reads the environment and builds
//!   every binary's context from the floors below.
//! - `adapters/`: how work arrives. [`http`] (the API functions, the relay's
//!   stream, `reeve serve`), `mcp` (agents' tool calls, feature `mcp`), [`worker`] (SQS messages), [`upload_guard`] (S3
//!   notifications), [`sweeper`] (a schedule and the dead-letter queue). An
//!   adapter never imports another.
//! - `domain/`: what Reeve is about. [`auth`] (Space IDs, the HMAC index,
//!   Argon2id, session tokens), [`spaces`] (creating a Space, opening a
//!   session), [`catalog`] (`reeve.toml`), [`uploads`], [`tasks`] (create,
//!   the queue, the event log, cancel, the list, the one fenced transition),
//!   [`payments`] (x402, payments, credits), [`executors`] (the work behind
//!   each kind), [`relay`] (one Pub/Sub connection per process, replay from
//!   Postgres), [`ids`].
//! - `infra/`: the stores and services underneath. [`db`] (Postgres and the
//!   migrations), [`redis_client`], [`aws`] (S3, SQS), [`outbound`] (the
//!   SSRF-guarded client), [`metrics`], [`telemetry`], [`settings`],
//!   [`storage_policy`] (the bucket policy).

mod adapters;
mod domain;
mod infra;
pub mod startup;

#[cfg(feature = "mcp")]
pub use adapters::mcp;
pub use adapters::{http, sweeper, upload_guard, worker};
pub use domain::{auth, catalog, executors, ids, payments, relay, spaces, tasks, uploads};
pub(crate) use infra::canonical_json;
pub use infra::{aws, db, metrics, outbound, redis_client, storage_policy, telemetry};
pub use startup::settings;

#[cfg(test)]
mod layers;
