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
//!   migrations), [`redis_client`], [`aws`] (S3, SQS), [`s3_objects`] (S3
//!   requests and links signed without the S3 client), [`outbound`] (the
//!   SSRF-guarded client), [`metrics`], [`telemetry`], [`settings`],
//!   [`storage_policy`] (the bucket policy).

//!
//! Cargo features pick what a binary serves (see `Cargo.toml`): a function
//! crate enables its own (`api-auth`, `worker`, …) and compiles nothing
//! more. Dead code is judged on the `full` build (the workspace's clippy):
//! a function's build leaves out the features of the others, and with them
//! some callers of what it keeps.
#![cfg_attr(not(feature = "full"), allow(dead_code, unused_imports, unused_macros))]

mod adapters;
mod domain;
mod infra;
pub mod startup;

pub use adapters::http;
#[cfg(feature = "mcp")]
pub use adapters::mcp;
#[cfg(feature = "sweeper")]
pub use adapters::sweeper;
#[cfg(feature = "upload-guard")]
pub use adapters::upload_guard;
#[cfg(feature = "worker")]
pub use adapters::worker;
#[cfg(feature = "catalog")]
pub use domain::executors;
#[cfg(any(feature = "api-tasks", feature = "sweeper"))]
pub use domain::pay_links;
#[cfg(feature = "relay")]
pub use domain::relay;
#[cfg(feature = "s3-objects")]
pub use domain::uploads;
pub use domain::{auth, catalog, ids, payments, sessions, tasks, webhooks};
#[cfg(feature = "api-auth")]
pub use domain::{login_limits, spaces};
#[cfg(feature = "aws")]
pub use infra::aws;
#[cfg(feature = "aws")]
pub use infra::aws_http;
#[cfg(feature = "input-schemas")]
pub use infra::json_schema;
#[cfg(feature = "receipts")]
pub use infra::kms;
#[cfg(feature = "outbound")]
pub use infra::outbound;
#[cfg(feature = "s3-objects")]
pub use infra::s3_objects;
pub use infra::{db, metrics, redis_client, standard_webhooks, storage_policy, telemetry};
pub use startup::settings;

#[cfg(all(test, feature = "full"))]
mod error_codes;
#[cfg(test)]
mod layers;
