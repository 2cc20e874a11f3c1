//! The `worker` Lambda: SQS batches of `{task_id, kind}` messages, answered
//! with the records to redeliver (`ReportBatchItemFailures`).
//! Glue only: the worker is `reeve_shared::worker`, the same code `reeve work` runs.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use reeve_shared::worker::handle_batch;
use reeve_shared::{startup, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let ctx = startup::lambda_worker().await;
    let ctx = &ctx;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<_, Error>(handle_batch(ctx, event.payload).await)
    }))
    .await
}
