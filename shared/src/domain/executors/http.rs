//! `http`: an external executor. POSTs the task's input to the endpoint the
//! catalog configures, through the operators' SSRF-guarded client, within
//! the task's `timeout_seconds`, and returns the JSON it answers.
//!
//! The endpoint is the operator's, not the task owner's: no error shown to
//! the owner names it, and no error repeats what it answered beyond the
//! status code.

use std::time::Duration;

use serde_json::{Value, json};

use super::{ExecDeps, ExecError, Job, TaskExecutor, codes, outbound_error};

/// The largest answer accepted from an endpoint.
pub const MAX_RESPONSE_BYTES: u64 = 1024 * 1024;

/// The `http` executor, for one configured endpoint.
#[derive(Debug, Clone)]
pub struct Http {
    pub endpoint: String,
}

impl TaskExecutor for Http {
    async fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
        job.progress(0.0, json!({ "stage": "calling" })).await;
        let timeout = Duration::from_secs(u64::from(job.spec.timeout_seconds));
        let response = deps
            .operators
            .post_json(&self.endpoint, job.input, timeout, MAX_RESPONSE_BYTES)
            .await
            .map_err(|e| outbound_error("the executor endpoint", e))?;
        match response.status {
            200..=299 => {}
            429 | 500..=599 => {
                let reason = format!("http executor: the endpoint answered HTTP {}", response.status);
                // The worker waits what it asks, up to its backoff's cap.
                return Err(match response.retry_after {
                    Some(after) => ExecError::RetryAfter { reason, after },
                    None => ExecError::Retryable(reason),
                });
            }
            status @ 400..=499 => {
                return Err(ExecError::permanent(
                    codes::EXECUTOR_REJECTED,
                    format!("the executor rejected the input (HTTP {status})"),
                ));
            }
            status => {
                return Err(ExecError::permanent(
                    codes::BAD_EXECUTOR_RESPONSE,
                    format!("the executor answered an unexpected HTTP {status}"),
                ));
            }
        }
        let result: Value = serde_json::from_slice(&response.body).map_err(|e| {
            tracing::warn!(status = response.status, error = %e, "http executor: the answer is not JSON");
            ExecError::permanent(codes::BAD_EXECUTOR_RESPONSE, "the executor's answer is not JSON")
        })?;
        job.progress(1.0, json!({ "stage": "done", "bytes": response.body.len() })).await;
        job.log(format!("the executor answered HTTP {} with {} bytes of JSON", response.status, response.body.len()))
            .await;
        Ok(result)
    }
}
