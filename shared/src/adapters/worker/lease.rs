//! A run's lease: renewed while the run goes on, and the run stopped once it
//! is lost (module docs of [`super`]: leases say whether a worker is alive).

use std::time::Duration;

use super::{WorkerContext, store};
use crate::domain::ids::Id;

/// Why a run stopped before its executor did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lost {
    /// A renewal found the task moved on: another run holds it (it claimed
    /// it over a lapsed lease), or someone else ended it.
    Taken,
    /// No renewal got through before the lease would have run out (Postgres
    /// unreachable or too slow): another run may claim it any moment.
    Expired,
}

/// How often a run renews its lease: four times a lease, so that a renewal
/// or two may fail (a slow query, a blip) before the lease is in danger.
pub fn renew_every(lease: Duration) -> Duration {
    (lease / 4).max(Duration::from_millis(100))
}

/// Renews the run's lease every [`renew_every`]; returns only when the run
/// has lost the task. The lease this run holds is counted from when each
/// renewal (or the claim) was sent, which the database's `lease_until`
/// never precedes: once that much time has passed without a renewal getting
/// through, the run stops by its own clock, since from then on another run
/// may claim the task. A renewal stuck on a dead connection does not hold
/// that up.
pub(super) async fn keep_lease(ctx: &WorkerContext, id: Id, attempt: i32, claimed_at: tokio::time::Instant) -> Lost {
    let lease = ctx.settings.lease;
    let every = renew_every(lease);
    let mut held_until = claimed_at + lease;
    let mut next = claimed_at + every;
    loop {
        let sent = tokio::select! {
            () = tokio::time::sleep_until(held_until) => return Lost::Expired,
            () = tokio::time::sleep_until(next) => tokio::time::Instant::now(),
        };
        let renewed = tokio::select! {
            () = tokio::time::sleep_until(held_until) => return Lost::Expired,
            renewed = store::extend_lease(&ctx.db, id, attempt, lease) => renewed,
        };
        match renewed {
            Ok(true) => {
                held_until = sent + lease;
                tracing::debug!(attempt, "lease renewed");
            }
            Ok(false) => return Lost::Taken,
            Err(e) => tracing::warn!(error = %e, "could not renew the lease; trying again"),
        }
        next = (sent + every).max(tokio::time::Instant::now());
    }
}
