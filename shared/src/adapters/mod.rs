//! The adapters floor: each one turns an outside trigger into domain calls
//! and the result into an answer. `http` serves requests (the API functions,
//! the relay's stream, `reeve serve`); `worker` runs SQS messages;
//! `upload_guard` settles S3 notifications; `sweeper` runs on a schedule and
//! drains the dead-letter queue; `mcp` serves agents' tool calls (`POST /mcp`). They depend on the domain and the
//! infrastructure, never on one another.

pub mod http;
#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "sweeper")]
pub mod sweeper;
#[cfg(feature = "upload-guard")]
pub mod upload_guard;
#[cfg(feature = "worker")]
pub mod worker;
