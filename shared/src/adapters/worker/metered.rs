//! A metered task's run begins and ends with its payment: it is started only
//! if what it uses can still be settled afterwards, and its result is given
//! only once what it used is settled ([`payments::Capturer`]).

use std::time::Duration;

use serde_json::Value;

use super::ends::{fail, retry_later};
use super::{Outcome, Retryable, WorkerContext, retry};
use crate::domain::catalog::{Executor, TaskSpec};
use crate::domain::ids::Id;
use crate::domain::payments::{AUTHORIZATION_EXPIRED, Captured, Capturer, MeteredAuthorization, PAYMENT_NOT_CAPTURED};

/// How long a capture whose outcome is open waits before the next run tries
/// again (its amount fixed, and the chain asked first).
const CAPTURE_RETRY: Duration = Duration::from_secs(10);

/// The task's authorization, if it is metered; `Err`: the run ends here
/// (expired, or the database could not be read).
pub(super) async fn before_run(
    ctx: &WorkerContext,
    id: Id,
    attempt: i32,
    spec: &TaskSpec,
) -> Result<Option<MeteredAuthorization>, Outcome> {
    let auth = match MeteredAuthorization::of(&ctx.db, id).await {
        Ok(auth) => auth,
        Err(e) => return Err(retry("reading the task's payment authorization", e)),
    };
    if let Some(auth) = &auth
        && auth.is_authorized()
        && !auth.outlives(Duration::from_secs(spec.timeout_seconds.into()))
    {
        let message = "its payment authorization would expire before what it uses could be settled, so it was \
                       not started; nothing was charged. Create it again with a new payment";
        return Err(fail(ctx, id, attempt, AUTHORIZATION_EXPIRED, message).await);
    }
    Ok(auth)
}

/// What the finished run used, settled: the task's `payment` to deliver
/// its result with. `Err`: the run ends here (capture refused, or its
/// outcome open and the task back in the queue).
pub(super) async fn after_run(
    ctx: &WorkerContext,
    run: (Id, i32, u32),
    spec: &TaskSpec,
    auth: &MeteredAuthorization,
    result: &Value,
    took: Duration,
) -> Result<Value, Outcome> {
    let (id, attempt, receive_count) = run;
    let used = match spec.executor {
        // Bytes fetched or hashed.
        Executor::Fetch | Executor::Digest => result["size"].as_u64().unwrap_or(0),
        // Milliseconds the call took.
        Executor::Http { .. } => u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
    };
    let capturer = Capturer { db: &ctx.db, facilitator: ctx.facilitator.as_ref(), chains: &ctx.chains };
    match capturer.capture(auth, id, used).await {
        Ok(Captured::Charged(payment) | Captured::Released(payment)) => Ok(payment.to_value()),
        Ok(Captured::Refused { reason, .. }) => {
            // Nothing was paid for it: nobody gets it.
            if let Some(key) = result["key"].as_str()
                && let Err(e) = ctx.exec.s3.delete_object().bucket(&ctx.exec.bucket).key(key).send().await
            {
                tracing::error!(error = %e, key, "could not delete the output of a task whose payment was refused");
            }
            let message = format!(
                "the payer refused the capture of what the task used ({reason}: its Permit2 approval or its funds \
                 were withdrawn); nothing was charged and the output was deleted"
            );
            Err(fail(ctx, id, attempt, PAYMENT_NOT_CAPTURED, &message).await)
        }
        Ok(Captured::Open(why)) => {
            tracing::warn!(%why, "the capture's outcome is open; the task goes back to the queue");
            Err(retry_later(ctx, id, attempt, receive_count, Retryable::Exec(why, Some(CAPTURE_RETRY))).await)
        }
        Err(e) => Err(retry("capturing the payment", e)),
    }
}
