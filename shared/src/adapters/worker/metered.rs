//! A metered task's run begins and ends with its payment: it is started only
//! if what it uses can still be settled afterwards, and its result is given
//! only once what it used is settled. Both are hooks of the authorization's
//! scheme (`payments::Scheme::before_run`, `payments::Scheme::at_end`).

use std::time::Duration;

use serde_json::Value;

use super::ends::{fail, lost, retry_later};
use super::lease::{Lost, keep_lease};
use super::{Outcome, Retryable, WorkerContext, complete, retry};
use crate::domain::catalog::TaskSpec;
use crate::domain::ids::Id;
use crate::domain::payments::{
    AUTHORIZATION_EXPIRED, AUTHORIZATION_SPENT, Captured, Capturer, Held, MeteredAuthorization, PAYMENT_NOT_CAPTURED,
    RunCheck,
};

/// How long a capture whose outcome is open waits before the next delivery
/// tries again (its amount fixed, and the chain asked first).
const CAPTURE_RETRY: Duration = Duration::from_secs(10);

/// How long a run whose authorization the chain could not check waits before
/// the next delivery asks again.
const CHECK_RETRY: Duration = Duration::from_secs(5);

/// The task's authorization, if it is metered; `Err`: the run ends here.
/// An authorization not yet sent to be settled meets its scheme's check
/// first (`payments::Scheme::before_run`): withdrawn, underfunded or too
/// near its deadline, the task fails with the code that says which and
/// nothing runs (the failure releases the authorization: nothing is
/// charged); a chain that cannot be read sends the run back to the queue,
/// to ask again.
pub(super) async fn before_run(
    ctx: &WorkerContext,
    run: (Id, i32, u32),
    spec: &TaskSpec,
) -> Result<Option<MeteredAuthorization>, Outcome> {
    let (id, attempt, receive_count) = run;
    let auth = match MeteredAuthorization::of(&ctx.db, id).await {
        Ok(auth) => auth,
        Err(e) => return Err(retry("reading the task's payment authorization", e)),
    };
    let Some(authorized) = auth.as_ref().filter(|auth| auth.is_authorized()) else { return Ok(auth) };
    let timeout = Duration::from_secs(spec.timeout_seconds.into());
    match authorized.scheme().before_run(&ctx.db, &ctx.chains, (id, authorized), timeout).await {
        Ok(Some(RunCheck::Stands) | None) => Ok(auth),
        Ok(Some(RunCheck::Refused { code, message })) => {
            tracing::info!(code, "the payer's authorization no longer stands; not run");
            Err(fail(ctx, id, attempt, code, &message).await)
        }
        Ok(Some(RunCheck::Unreadable(why))) => {
            tracing::warn!(%why, "cannot check the payment authorization on chain; the run waits");
            let why = format!("checking the payment authorization on chain: {why}");
            Err(retry_later(ctx, id, attempt, receive_count, Retryable::Exec(why, Some(CHECK_RETRY))).await)
        }
        Err(e) => Err(retry("reading the payment authorization's terms", e)),
    }
}

/// What a finished run used, as its executor measures it (bytes fetched
/// or hashed, milliseconds a call took).
pub(super) fn used(spec: &TaskSpec, result: &Value, took: Duration) -> u64 {
    spec.executor.used(result, took)
}

/// Ends a metered task's run: what it used settled, then its result
/// delivered with the task's `payment`. Delivery follows capture: refused,
/// the output is deleted; open, the task waits in the queue with the run
/// held, and the next delivery only resumes the capture.
///
/// The task's lease (counted from `leased_at`) is renewed while the capture
/// waits: a settle and its confirmation can outlast a lease, and a second
/// worker taking over a capture in flight would send a second settle of the
/// same authorization. A capture cut short is safe to resume: the next run
/// asks the chain first.
pub(super) async fn deliver(
    ctx: &WorkerContext,
    run: (Id, i32, u32),
    auth: &MeteredAuthorization,
    held: &Held,
    leased_at: tokio::time::Instant,
) -> Outcome {
    let (id, attempt, receive_count) = run;
    let capturer = Capturer { db: &ctx.db, facilitator: ctx.facilitator.as_ref(), chains: &ctx.chains };
    let captured = tokio::select! {
        captured = auth.scheme().at_end(&capturer, (id, auth), held) => captured,
        lost_lease = keep_lease(ctx, id, attempt, leased_at) => return match lost_lease {
            Lost::Taken => lost(attempt),
            Lost::Expired => Outcome::retry("the capture's lease ran out before it could be renewed"),
        },
    };
    match captured {
        Ok(Captured::Charged(payment) | Captured::Released(payment)) => {
            complete(ctx, id, attempt, &held.result, Some(&payment.to_value()), &held.reports).await
        }
        Ok(Captured::Refused { reason, .. }) => {
            // Nothing was paid for it: nobody gets it.
            if let Some(key) = held.result["key"].as_str()
                && let Err(e) = ctx.exec.s3.delete_object().bucket(&ctx.exec.bucket).key(key).send().await
            {
                tracing::error!(error = %e, key, "could not delete the output of a task whose payment was refused");
            }
            let message = match reason.as_str() {
                AUTHORIZATION_EXPIRED => "what the task used could not be settled before its payment authorization \
                                          expired; nothing was charged and the output was deleted"
                    .to_owned(),
                AUTHORIZATION_SPENT => "the payer used its payment authorization's Permit2 nonce elsewhere, so what \
                                        the task used could not be settled; nothing was charged and the output was \
                                        deleted"
                    .to_owned(),
                other => format!(
                    "the capture of what the task used was refused ({other}); nothing was charged and \
                                  the output was deleted"
                ),
            };
            fail(ctx, id, attempt, PAYMENT_NOT_CAPTURED, &message).await
        }
        Ok(Captured::Open(why)) => {
            tracing::warn!(%why, "the capture's outcome is open; the task waits in the queue with its run held");
            retry_later(ctx, id, attempt, receive_count, Retryable::Capture(why, CAPTURE_RETRY)).await
        }
        Err(e) => retry("capturing the payment", e),
    }
}
