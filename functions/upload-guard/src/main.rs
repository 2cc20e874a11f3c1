//! The `upload-guard` Lambda: S3 `ObjectCreated` events on the upload prefix.
//! Glue only: `reeve_shared::upload_guard` settles each object. An error
//! (S3 or Postgres unreachable) fails the invocation, so Lambda retries it.

use aws_lambda_events::event::s3::S3Event;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use reeve_shared::{startup, telemetry};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let guard = startup::lambda_guard().await;
    lambda_runtime::run(service_fn(|event: LambdaEvent<S3Event>| {
        let guard = guard.clone();
        async move {
            guard.handle(&event.payload).await?;
            Ok::<(), Error>(())
        }
    }))
    .await
}
