//! `lambda`: an AWS Lambda function, by name or ARN, invoked through the
//! Lambda Invoke API with the job an `http` protocol kind is POSTed
//! (docs/executors.md, "The job"), unsigned: IAM authenticates the call.
//!
//! `asynchronous = true` invokes it with `InvocationType=Event`: Lambda
//! queues the event and answers `202`, and the function reports on its own
//! (the attempt is delegated, as an `http` service's `202` delegates it).
//! Otherwise `RequestResponse`: the function's returned payload is the
//! task's result.
//!
//! The function is the operator's: nothing shown to the task's owner names
//! it, and no error repeats what Lambda answered beyond what it means.

use std::time::Duration;

use serde_json::{Value, json};

use super::protocol::PROTOCOL_VERSION;
use super::{ExecutorKind, TaskKey};
use crate::domain::catalog::meter::Quantity;
use crate::domain::catalog::read::{Fields, Problems};

/// The `lambda` executor, for one configured function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lambda {
    /// The function's name, or its (full or partial) ARN, as Invoke takes it.
    pub function: String,
    /// `InvocationType=Event`: the function reports on its own.
    pub asynchronous: bool,
}

impl ExecutorKind for Lambda {
    const NAME: &'static str = "lambda";
    const KEYS: &'static [TaskKey] = &[
        TaskKey { key: "function", noun: "a function", example: r#""wordfreq""# },
        TaskKey { key: "asynchronous", noun: "an asynchronous switch", example: "true" },
        TaskKey { key: "protocol", noun: "a protocol", example: "1" },
    ];

    /// `function`: required, a name or ARN Invoke accepts. `asynchronous`:
    /// `false` by default. `protocol`: implied (a function always receives
    /// the job), so it may only say 1. No `secret`: the call is signed by
    /// the worker's IAM role, and the template grants it only the
    /// functions the catalog names.
    fn configure(task: &Fields<'_>, p: &mut Problems) -> Option<Self> {
        if !task.has("function") {
            task.at("function")
                .report(p, "missing; executor \"lambda\" needs the name or ARN of the function to invoke");
            return None;
        }
        let function = task.optional::<&str>("function", p).and_then(|f| task.verify("function", function_name(f), p));
        let asynchronous =
            if task.has("asynchronous") { task.optional::<bool>("asynchronous", p) } else { Some(false) };
        let protocol_ok = !task.has("protocol")
            || task.int_in::<u8>("protocol", i64::from(PROTOCOL_VERSION)..=i64::from(PROTOCOL_VERSION), p).is_some();
        if !protocol_ok {
            return None;
        }
        Some(Lambda { function: function?.to_owned(), asynchronous: asynchronous? })
    }

    /// An asynchronous function reports on its own: the worker waits only
    /// for Invoke's `202`.
    fn delegates(&self) -> bool {
        self.asynchronous
    }

    /// The time the call took, as `http`'s; a metered asynchronous kind is
    /// charged what its function reports instead.
    fn measures(&self) -> Quantity {
        Quantity::Milliseconds
    }

    fn used(&self, _result: &Value, took: Duration) -> u64 {
        u64::try_from(took.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whatever the function returns or reports: Reeve knows nothing of
    /// its shape, but an asynchronous one's result lists the files it wrote.
    fn output_schema(&self) -> Value {
        if self.delegates() { super::delegated_result_schema() } else { json!({}) }
    }
}

/// A function name, a name with a version or alias, or a full or partial
/// ARN: what Invoke's `FunctionName` accepts (letters, digits, `-`, `_`,
/// and `:`, `.`, `$` in ARNs and qualifiers; at most 170 characters).
/// Invoke itself says whether it exists, at each call.
fn function_name(text: &str) -> Result<&str, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.' | '$');
    if text.is_empty() || text.len() > 170 || !text.chars().all(allowed) {
        return Err(format!(
            "{text:?} is not a Lambda function's name or ARN (1 to 170 characters of letters, digits, - _ : . $)"
        ));
    }
    Ok(text)
}

/// Invoking it: the worker's half.
#[cfg(feature = "worker")]
mod work {
    use serde_json::Value;

    use super::Lambda;
    use crate::domain::executors::{DelegatedAttempt, ExecDeps, ExecError, Job, TaskExecutor};

    impl TaskExecutor for Lambda {
        #[cfg(feature = "lambda-invoke")]
        async fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
            invoke::run(self, deps, job).await
        }

        /// The cancel, as an `Event` invoke of the same function.
        #[cfg(feature = "lambda-invoke")]
        async fn cancel(&self, deps: &ExecDeps, attempt: &DelegatedAttempt<'_>) -> Result<(), ExecError> {
            invoke::cancel(self, deps, attempt).await
        }

        #[cfg(not(feature = "lambda-invoke"))]
        async fn cancel(&self, _: &ExecDeps, _: &DelegatedAttempt<'_>) -> Result<(), ExecError> {
            Err(ExecError::Retryable("this worker was built without the lambda executor".to_owned()))
        }

        /// Start-up refuses a catalog with a `lambda` kind in a worker
        /// built without the Invoke client; should one run anyway, it is
        /// the operator's trouble, never the task's.
        #[cfg(not(feature = "lambda-invoke"))]
        async fn run(&self, _: &ExecDeps, _: &Job<'_>) -> Result<Value, ExecError> {
            Err(ExecError::Retryable("this worker was built without the lambda executor".to_owned()))
        }
    }

    #[cfg(feature = "lambda-invoke")]
    mod invoke {
        use std::time::Duration;

        use aws_sdk_lambda::error::{DisplayErrorContext, SdkError};
        use aws_sdk_lambda::operation::invoke::InvokeError;
        use aws_sdk_lambda::primitives::Blob;
        use aws_sdk_lambda::types::InvocationType;
        use serde_json::Value;

        use super::Lambda;
        use crate::domain::executors::protocol::PROTOCOL_VERSION;
        use crate::domain::executors::protocol::send::{CANCEL_WAIT, build_job, cancel_message};
        use crate::domain::executors::{DelegatedAttempt, ExecDeps, ExecError, Job, codes};

        /// Invokes the function with the cancel of `attempt` as an `Event`:
        /// nothing waits for what it does with it. Accepted (`202`, or
        /// `200` from `cargo lambda watch`): it was told.
        pub(super) async fn cancel(
            lambda: &Lambda,
            deps: &ExecDeps,
            attempt: &DelegatedAttempt<'_>,
        ) -> Result<(), ExecError> {
            let Some(client) = &deps.lambda else {
                return Err(ExecError::Retryable("the worker has no Lambda client".to_owned()));
            };
            let payload = serde_json::to_vec(&cancel_message(attempt, PROTOCOL_VERSION))
                .map_err(|e| ExecError::retryable("encoding the cancel", e))?;
            let call = client
                .invoke()
                .function_name(&lambda.function)
                .invocation_type(InvocationType::Event)
                .payload(Blob::new(payload));
            let output = tokio::time::timeout(CANCEL_WAIT, call.send())
                .await
                .map_err(|_| ExecError::Retryable("lambda executor: Invoke did not answer the cancel".to_owned()))?
                .map_err(|e| invoke_error(&lambda.function, e))?;
            match output.status_code() {
                200 | 202 => Ok(()),
                status => Err(ExecError::Retryable(format!("lambda executor: Invoke answered {status} to a cancel"))),
            }
        }

        pub(super) async fn run(lambda: &Lambda, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
            let Some(client) = &deps.lambda else {
                return Err(ExecError::Retryable("the worker has no Lambda client".to_owned()));
            };
            let (event, deadline) = build_job(deps, job, PROTOCOL_VERSION).await?;
            let payload = serde_json::to_vec(&event).map_err(|e| ExecError::retryable("encoding the job", e))?;
            let invocation = if lambda.asynchronous { InvocationType::Event } else { InvocationType::RequestResponse };
            let call =
                client.invoke().function_name(&lambda.function).invocation_type(invocation).payload(Blob::new(payload));
            // The worker bounds the whole run by the kind's wait as well;
            // bounding the call here says which part took too long.
            let waited = Duration::from_secs(job.spec.waited_seconds().into());
            let output = tokio::time::timeout(waited, call.send())
                .await
                .map_err(|_| {
                    ExecError::Retryable(format!("lambda executor: Invoke did not answer within {}s", waited.as_secs()))
                })?
                .map_err(|e| invoke_error(&lambda.function, e))?;
            if let Some(kind) = output.function_error() {
                // An unhandled error (a panic, a timeout, out of memory): a
                // crash, tried again. A function that refuses its input for
                // good says so with a `failure` report (docs/executors.md).
                tracing::warn!(function = %lambda.function, kind, "lambda executor: the function failed");
                return Err(ExecError::Retryable(format!("lambda executor: the function failed ({kind})")));
            }
            let status = output.status_code();
            if lambda.asynchronous {
                // Lambda queues an Event and answers 202. `cargo lambda
                // watch` runs it to its end and answers 200 instead: the
                // same acceptance, the function's reports already sent.
                return match status {
                    200 | 202 => Err(ExecError::Delegated { deadline }),
                    status => {
                        Err(ExecError::Retryable(format!("lambda executor: Invoke answered {status} to an Event")))
                    }
                };
            }
            let body = output.payload().map(Blob::as_ref).unwrap_or_default();
            serde_json::from_slice(body).map_err(|e| {
                tracing::warn!(function = %lambda.function, error = %e, "lambda executor: the payload is not JSON");
                ExecError::permanent(codes::BAD_EXECUTOR_RESPONSE, "the executor's answer is not JSON")
            })
        }

        /// What an Invoke that did not reach the function means. Only a
        /// missing function is permanent; its message names no function.
        fn invoke_error(function: &str, e: SdkError<InvokeError>) -> ExecError {
            let detail = DisplayErrorContext(&e).to_string();
            match e.as_service_error() {
                Some(InvokeError::ResourceNotFoundException(_)) => {
                    tracing::warn!(function, error = %detail, "lambda executor: no such function");
                    ExecError::permanent(
                        codes::EXECUTOR_UNAVAILABLE,
                        "the executor is not available: its function was not found",
                    )
                }
                Some(InvokeError::TooManyRequestsException(throttled)) => {
                    let reason = "lambda executor: the function is throttled".to_owned();
                    match throttled.retry_after_seconds().and_then(|s| s.parse::<u64>().ok()) {
                        Some(after) => ExecError::RetryAfter { reason, after: Duration::from_secs(after) },
                        None => ExecError::Retryable(reason),
                    }
                }
                _ => {
                    tracing::warn!(function, error = %detail, "lambda executor: Invoke failed");
                    ExecError::retryable("lambda executor: Invoke failed", detail)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use toml::Table;

    use super::*;
    use crate::domain::catalog::read::KeyPath;

    fn configure(text: &str) -> (Option<Lambda>, Vec<String>) {
        let table: Table = text.parse().unwrap();
        let mut problems = Problems::new();
        let lambda = Lambda::configure(&Fields::new(KeyPath::default().key("tasks").key("k"), &table), &mut problems);
        (lambda, problems.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn a_function_by_name_or_arn_synchronous_unless_asked() {
        let (lambda, problems) = configure(r#"function = "wordfreq""#);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(lambda, Some(Lambda { function: "wordfreq".into(), asynchronous: false }));
        assert!(!lambda.unwrap().delegates());

        let arn = "arn:aws:lambda:eu-west-1:123456789012:function:wordfreq:$LATEST";
        let (lambda, problems) = configure(&format!("function = {arn:?}\nasynchronous = true\nprotocol = 1"));
        assert!(problems.is_empty(), "{problems:?}");
        let lambda = lambda.unwrap();
        assert_eq!(lambda.function, arn);
        assert!(lambda.delegates(), "an Event invoke is answered 202: the worker does not wait");
    }

    #[test]
    fn each_problem_is_at_its_path() {
        let cases = [
            ("asynchronous = true", "tasks.k.function: missing; executor \"lambda\" needs the name or ARN"),
            (r#"function = "my function""#, "tasks.k.function: \"my function\" is not a Lambda function's name"),
            (r#"function = """#, "tasks.k.function: \"\" is not a Lambda function's name"),
            ("function = 3", "tasks.k.function: "),
            ("function = \"f\"\nasynchronous = \"yes\"", "tasks.k.asynchronous: "),
            ("function = \"f\"\nprotocol = 2", "tasks.k.protocol: must be from 1 to 1"),
        ];
        for (text, expected) in cases {
            let (lambda, problems) = configure(text);
            assert!(lambda.is_none(), "{text}");
            assert_eq!(problems.len(), 1, "{text}: {problems:?}");
            assert!(problems[0].starts_with(expected), "{text}: {problems:?}");
        }
    }
}
