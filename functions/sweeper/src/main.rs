//! The `sweeper` Lambda: every minute (EventBridge Scheduler) it sends lost
//! and expired tasks to the queue again and fails exhausted ones, then
//! looks for lapsed leases every 15 s until its deadline is near; as the
//! dead-letter queue's consumer it fails each task SQS gave up on.
//! Glue only: `reeve_shared::sweeper` does both. A database error fails a
//! sweep (the next minute's tries again) or reports the record for retry.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use reeve_shared::{startup, telemetry};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let sweeper = startup::lambda_sweeper().await;
    let sweeper = &sweeper;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        Ok::<_, Error>(sweeper.handle_invocation(event.payload, Some(event.context.deadline())).await?)
    }))
    .await
}
