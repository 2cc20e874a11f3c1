//! A Lambda function that works on jobs: `lambda::run(handler)` in `main`.
//!
//! Reeve invokes the function with the job as its event (no signature: IAM
//! authenticates the Invoke call). An asynchronous kind is invoked with
//! `InvocationType=Event`, so nothing waits for the function's answer: the
//! handler reports through its [`Reporter`], and [`run`] reports how it
//! ended if the handler did not (a [`Failure`](crate::Failure) it returned).
//! A cancel event is acknowledged and dropped: Lambda runs it in another
//! invocation than the job's (one event at a time per execution
//! environment), which it cannot reach; the running invocation learns of
//! the cancel from its next report (`409 canceled`, [`Error::Canceled`](crate::Error)).
//! A function whose work runs elsewhere (a queue, a batch job) handles the
//! cancel itself, from the event, rather than through `run`.

use std::future::Future;

use lambda_runtime::{LambdaEvent, service_fn};
use serde_json::Value;

use crate::messages::{Job, Message};
use crate::reporter::{Reporter, WorkError};

/// Serves the Lambda runtime API, calling `handler` with each job's
/// event and a [`Reporter`] for its attempt.
///
/// An invocation succeeds once its end is reported (or the attempt is
/// over), so Lambda does not run an asynchronous event again: Reeve
/// decides on retries. It fails only when the event is not a job or the
/// end could not be reported; then Lambda's own retries of the event (same
/// attempt, same reports) apply.
pub async fn run<F, Fut>(handler: F) -> Result<(), lambda_runtime::Error>
where
    F: Fn(Job, Reporter) -> Fut,
    Fut: Future<Output = Result<(), WorkError>>,
{
    let handler = &handler;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        match serde_json::from_value::<Message>(event.payload)? {
            Message::Job(job) => {
                tracing::info!(task = %job.task.id, kind = %job.task.kind, attempt = job.task.attempt, "job");
                let reporter = Reporter::new(&job);
                let outcome = handler(job, reporter.clone()).await;
                reporter.finish(outcome).await?;
            }
            Message::Cancel(cancel) => {
                tracing::info!(task = %cancel.task.id, attempt = cancel.task.attempt, "cancel");
            }
        }
        Ok::<Value, lambda_runtime::Error>(Value::Null)
    }))
    .await
}
