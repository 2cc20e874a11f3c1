//! `http`: an external executor. POSTs the task's input to the endpoint the
//! catalog configures, through the operators' SSRF-guarded client, within
//! the task's `timeout_seconds`, and returns the JSON it answers.
//!
//! The endpoint is the operator's, not the task owner's: no error shown to
//! the owner names it, and no error repeats what it answered beyond the
//! status code.

use std::time::Duration;

use serde_json::{Value, json};

use super::protocol::{PROTOCOL_VERSION, Protocol, SecretRef};
use super::{ExecutorKind, Report, TaskKey};
use crate::domain::catalog::formats;
use crate::domain::catalog::meter::Quantity;
use crate::domain::catalog::read::{Fields, Problems};

/// The `http` executor, for one configured endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http {
    pub endpoint: String,
    /// `protocol = 1`: the endpoint speaks the executor protocol
    /// (docs/executors.md): a signed job, `202` and reports. `None`: the
    /// bare input POSTed, as before.
    pub protocol: Option<Protocol>,
}

impl ExecutorKind for Http {
    const NAME: &'static str = "http";
    const KEYS: &'static [TaskKey] = &[
        TaskKey { key: "endpoint", noun: "an endpoint", example: r#""https://example.com/run""# },
        TaskKey { key: "protocol", noun: "a protocol", example: "1" },
        TaskKey { key: "secret", noun: "a secret", example: r#""RUN_SECRET""# },
    ];

    /// `endpoint`: required, an absolute http(s) URL. Whether the host may
    /// be reached is the operators' allow-list's to say, at each call.
    /// `protocol = 1` with `secret` (a variable's name or an ARN): the
    /// executor protocol; a secret without a protocol signs nothing, and is
    /// refused rather than ignored.
    fn configure(task: &Fields<'_>, p: &mut Problems) -> Option<Self> {
        if !task.has("endpoint") {
            task.at("endpoint").report(p, "missing; executor \"http\" needs the URL to POST the input to");
            return None;
        }
        let endpoint = task
            .optional::<&str>("endpoint", p)
            .and_then(|e| task.verify("endpoint", formats::http_url(e), p).map(|_| e));
        let version = task.int_in::<u8>("protocol", i64::from(PROTOCOL_VERSION)..=i64::from(PROTOCOL_VERSION), p);
        let secret = task.optional::<&str>("secret", p).and_then(|s| task.verify("secret", SecretRef::parse(s), p));
        let protocol = match (task.has("protocol"), task.has("secret")) {
            (false, false) => None,
            (true, true) => Some(Protocol { version: version?, secret: secret? }),
            (true, false) => {
                task.at("secret").report(
                    p,
                    "missing; protocol = 1 signs each job: name the environment variable (or the Secrets Manager \
                     ARN) that holds the endpoint's whsec_… secret",
                );
                return None;
            }
            (false, true) => {
                task.at("secret").report(p, "only a kind with protocol = 1 signs its jobs; add protocol = 1");
                return None;
            }
        };
        Some(Http { endpoint: endpoint?.to_owned(), protocol })
    }

    /// A protocol kind's service may answer `202` and report on its own:
    /// the worker does not wait for it.
    fn delegates(&self) -> bool {
        self.protocol.is_some()
    }

    /// The time the call took.
    fn measures(&self) -> Quantity {
        Quantity::Milliseconds
    }

    fn used(&self, _result: &Value, took: Duration) -> u64 {
        u64::try_from(took.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whatever the endpoint answers: Reeve knows nothing of its shape,
    /// but a protocol kind's result lists the files its service wrote.
    fn output_schema(&self) -> Value {
        if self.delegates() { super::delegated_result_schema() } else { json!({}) }
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
    use crate::domain::executors::{DelegatedAttempt, ExecDeps, ExecError, Job, TaskExecutor, codes, outbound_error};

    /// The largest answer accepted from an endpoint.
    pub const MAX_RESPONSE_BYTES: u64 = 1024 * 1024;

    impl TaskExecutor for Http {
        async fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
            if let Some(protocol) = &self.protocol {
                return crate::domain::executors::protocol::send::send_job(deps, job, &self.endpoint, protocol).await;
            }
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

        /// A protocol kind's endpoint gets the signed cancel; a bare one
        /// never delegates, so has nothing to cancel.
        async fn cancel(&self, deps: &ExecDeps, attempt: &DelegatedAttempt<'_>) -> Result<(), ExecError> {
            match &self.protocol {
                Some(protocol) => {
                    crate::domain::executors::protocol::send::send_cancel(deps, attempt, &self.endpoint, protocol).await
                }
                None => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use toml::Table;

    use super::*;
    use crate::domain::catalog::read::KeyPath;
    use crate::infra::json_schema::JsonSchema;

    fn configure(text: &str) -> (Option<Http>, Vec<String>) {
        let table: Table = text.parse().unwrap();
        let mut problems = Problems::new();
        let http = Http::configure(&Fields::new(KeyPath::default().key("tasks").key("k"), &table), &mut problems);
        (http, problems.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn without_protocol_it_is_the_bare_call_it_always_was() {
        let (http, problems) = configure(r#"endpoint = "https://x.example/run""#);
        assert!(problems.is_empty(), "{problems:?}");
        let http = http.unwrap();
        assert_eq!(http.protocol, None);
        assert!(!http.delegates());
    }

    #[test]
    fn protocol_1_takes_a_secret_by_variable_or_arn() {
        let (http, problems) = configure("endpoint = \"https://x.example/run\"\nprotocol = 1\nsecret = \"RUN_SECRET\"");
        assert!(problems.is_empty(), "{problems:?}");
        let http = http.unwrap();
        assert_eq!(http.protocol, Some(Protocol { version: 1, secret: SecretRef::Env("RUN_SECRET".into()) }));
        assert!(http.delegates());

        let arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:reeve/run-AbCdEf";
        let (http, problems) =
            configure(&format!("endpoint = \"https://x.example/run\"\nprotocol = 1\nsecret = {arn:?}"));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(http.unwrap().protocol.unwrap().secret, SecretRef::Arn(arn.into()));
    }

    #[test]
    fn a_protocol_kind_s_result_schema_lists_the_files_its_service_wrote() {
        let (bare, _) = configure(r#"endpoint = "https://x.example/run""#);
        assert_eq!(bare.unwrap().output_schema(), json!({}), "a bare endpoint's answer is anything");
        let (http, _) = configure("endpoint = \"https://x.example/run\"\nprotocol = 1\nsecret = \"RUN_SECRET\"");
        let schema = http.unwrap().output_schema();
        let validator = JsonSchema::compile(&schema).unwrap();
        let file = json!({
            "name": "top-100.csv", "size": 12, "content_type": "text/csv",
            "key": "outputs/ab/01J/files/top-100.csv",
            "url": "https://bucket.example/x", "url_expires_at": "2026-12-06T10:15:00Z",
        });
        assert!(validator.is_valid(&json!({ "lines": 3, "outputs": [file] })));
        assert!(validator.is_valid(&json!({ "lines": 3 })), "a service that wrote no file");
        assert!(!validator.is_valid(&json!({ "outputs": [{ "name": "../x" }] })));
        assert!(!validator.is_valid(&json!({ "outputs": {} })));
    }

    #[test]
    fn a_protocol_without_a_secret_or_a_secret_without_a_protocol_is_refused_at_its_path() {
        let (_, problems) = configure("endpoint = \"https://x.example/run\"\nprotocol = 1");
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("tasks.k.secret: missing; protocol = 1 signs each job"), "{problems:?}");
        let (_, problems) = configure("endpoint = \"https://x.example/run\"\nsecret = \"S\"");
        assert!(problems[0].starts_with("tasks.k.secret: only a kind with protocol = 1"), "{problems:?}");
        let (_, problems) = configure("endpoint = \"https://x.example/run\"\nprotocol = 2\nsecret = \"S\"");
        assert!(problems[0].starts_with("tasks.k.protocol: must be from 1 to 1"), "{problems:?}");
        let (_, problems) = configure("endpoint = \"https://x.example/run\"\nprotocol = 1\nsecret = \"whsec_abc=\"");
        assert!(problems[0].contains("never goes in reeve.toml"), "{problems:?}");
        let (_, problems) =
            configure("endpoint = \"https://x.example/run\"\nprotocol = 1\nsecret = \"arn:aws:s3:::bucket\"");
        assert!(problems[0].contains("is not a Secrets Manager secret's ARN"), "{problems:?}");
    }
}
