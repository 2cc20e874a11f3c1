//! `http`: an external executor. POSTs the task's input to the endpoint the
//! catalog configures, through the operators' SSRF-guarded client, within
//! the task's `timeout_seconds`, and returns the JSON it answers.
//!
//! The endpoint is the operator's, not the task owner's: no error shown to
//! the owner names it, and no error repeats what it answered beyond the
//! status code.

use std::time::Duration;

use serde_json::{Value, json};

use super::{ExecutorKind, Report, TaskKey};
use crate::domain::catalog::formats;
use crate::domain::catalog::meter::Quantity;
use crate::domain::catalog::read::{Fields, Problems};

/// The `http` executor, for one configured endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http {
    pub endpoint: String,
}

impl ExecutorKind for Http {
    const NAME: &'static str = "http";
    const KEYS: &'static [TaskKey] =
        &[TaskKey { key: "endpoint", noun: "an endpoint", example: r#""https://example.com/run""# }];

    /// `endpoint`: required, an absolute http(s) URL. Whether the host may
    /// be reached is the operators' allow-list's to say, at each call.
    fn configure(task: &Fields<'_>, p: &mut Problems) -> Option<Self> {
        if !task.has("endpoint") {
            task.at("endpoint").report(p, "missing; executor \"http\" needs the URL to POST the input to");
            return None;
        }
        let endpoint = task.optional::<&str>("endpoint", p)?;
        task.verify("endpoint", formats::http_url(endpoint), p)?;
        Some(Http { endpoint: endpoint.to_owned() })
    }

    /// The time the call took.
    fn measures(&self) -> Quantity {
        Quantity::Milliseconds
    }

    fn used(&self, _result: &Value, took: Duration) -> u64 {
        u64::try_from(took.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whatever the endpoint answers: Reeve knows nothing of its shape.
    fn output_schema(&self) -> Value {
        json!({})
    }

    /// Only the report that the call has begun. The size of the answer at
    /// the end, and the log line, describe the answer: one that says yes
    /// and one that says no may differ in nothing else.
    fn discloses(&self, report: &Report) -> bool {
        matches!(report, Report::Progress { detail, .. } if *detail == calling())
    }
}

/// The progress detail sent as the call begins.
fn calling() -> Value {
    json!({ "stage": "calling" })
}

/// Running it: the worker's half.
#[cfg(feature = "worker")]
mod work {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::{Http, calling};
    use crate::domain::executors::{ExecDeps, ExecError, Job, TaskExecutor, codes, outbound_error};

    /// The largest answer accepted from an endpoint.
    pub const MAX_RESPONSE_BYTES: u64 = 1024 * 1024;

    impl TaskExecutor for Http {
        async fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
            job.progress(0.0, calling()).await;
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
            job.log(format!(
                "the executor answered HTTP {} with {} bytes of JSON",
                response.status,
                response.body.len()
            ))
            .await;
            Ok(result)
        }
    }
}
