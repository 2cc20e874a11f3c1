//! The `worker` Lambda: SQS batches of `{task_id, kind}` messages, answered
//! with the records to redeliver (`ReportBatchItemFailures`).
//! Glue only: the worker is `reeve_shared::worker`, the same code `reeve work` runs.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use reeve_shared::worker::{deadline_of, handle_batch_until};
use reeve_shared::{startup, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let ctx = startup::lambda_worker().await;
    let ctx = &ctx;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let deadline = deadline_of(event.context.deadline());
        Ok::<_, Error>(handle_batch_until(ctx, event.payload, Some(deadline)).await)
    }))
    .await
}
