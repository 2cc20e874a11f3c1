//! Reeve's shared crate: every piece of domain logic lives here, and each
//! binary (`reeve`, the Lambda functions, the relay) is glue around it.
//!
//! Module map:
//! - [`catalog`]: `reeve.toml`, parsed into typed structs and validated as a whole.
//! - [`startup`]: the one start-up path: every binary's context, every problem at once.
//! - [`settings`]: secrets and endpoints, parsed from the environment.
//! - [`auth`]: Space IDs, the HMAC index, Argon2id hashes and session tokens.
//! - [`aws`]: S3 and SQS clients from the standard AWS environment.
//! - [`spaces`]: creating a Space and opening a session on it.
//! - [`uploads`]: presigned uploads and the checks on what arrived.
//! - [`upload_guard`]: settles an upload when S3 reports its object.
//! - [`storage_policy`]: the bucket policy, generated from the template's parameters.
//! - [`tasks`]: creating tasks, idempotency, the queue, snapshots, the list,
//!   cancel, and the one fenced transition every later status change uses.
//! - [`payments`]: x402 challenges, the facilitator, payments and credits.
//! - [`worker`]: claiming queued tasks, running them, recording the outcome.
//! - [`executors`]: the work behind each task kind (digest, fetch, http).
//! - [`outbound`]: the SSRF-guarded HTTP client for hosts Reeve does not own.
//! - [`relay`]: the SSE relay: one Pub/Sub connection, replay from Postgres.
//! - [`ids`]: ULIDs stored as 16 raw bytes, shown as 26-character strings.
//! - [`db`]: the Postgres pool and the embedded migrations.
//! - [`redis_client`]: the one shared Redis connection of a process.
//! - [`error`]: the JSON error envelope every route answers with.
//! - [`http`]: the axum routers that `reeve serve` and the Lambdas run.
//! - [`telemetry`]: tracing set up in one place.
//! - [`metrics`]: every metric's name and the one-line functions that record it.

pub mod auth;
pub mod aws;
pub mod catalog;
pub mod db;
pub mod error;
pub mod executors;
pub mod http;
pub mod ids;
pub mod metrics;
pub mod outbound;
pub mod payments;
pub mod redis_client;
pub mod relay;
pub mod settings;
pub mod spaces;
pub mod startup;
pub mod storage_policy;
pub mod sweeper;
pub mod tasks;
pub mod telemetry;
pub mod upload_guard;
pub mod uploads;
pub mod worker;
