//! Tracing, set up here and nowhere else. Logs are JSON in Lambda and on
//! Fargate, where CloudWatch indexes the fields (the request id and task id
//! are span fields); a terminal gets the readable format unless
//! `REEVE_LOG_FORMAT=json`. Logs go to stderr, so stdout in Lambda carries
//! only the EMF metric lines (`crate::infra::metrics`, installed by `startup`).
//!
//! This is the one read of the environment outside `startup`, and on
//! purpose: it runs first, so that a start-up problem is logged in the
//! format the platform indexes (`RUST_LOG`, `REEVE_LOG_FORMAT`, and whether
//! Lambda or ECS runs the process).

use tracing_subscriber::EnvFilter;

/// `json` for JSON logs where nothing else asks for them.
pub const LOG_FORMAT: &str = "REEVE_LOG_FORMAT";

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var(LOG_FORMAT).is_ok_and(|v| v == "json")
        || std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some()
        || std::env::var_os("ECS_CONTAINER_METADATA_URI_V4").is_some();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second init (tests, or a binary that calls it twice) is harmless.
    let _ = if json { builder.json().with_current_span(true).try_init() } else { builder.try_init() };
}
