//! The reconciler: every payment whose settlement's outcome Reeve never
//! learnt is resolved from the chain, in every sweep (the sweeper Lambda,
//! `reeve sweep`, and the sweeps inside `reeve work` and `reeve serve`),
//! whether or not its client ever comes back.
//!
//! For each such attempt (`settling`, held by nobody), EIP-3009's
//! `authorizationState(payer, nonce)` on the asset's contract says:
//! - **used**: the transfer happened. Its task is created, with a
//!   `payment_settled_late` event, in the transaction that marks the attempt
//!   `settled`; or, when the task can no longer be created (its kind was
//!   withdrawn), the space gets a credit for the amount instead;
//! - **unused, at a block past `validBefore`**: it can never land. The
//!   attempt is `failed` ([`ledger::NOT_SETTLED`]), nothing was charged;
//! - **unused and still valid**, or the chain could not be read: looked at
//!   again in the next sweep.
//!
//! A client's retry of the same payment runs the same resolution first
//! ([`resolve_claimed`]), so it answers what the chain says at once.

use serde::Serialize;

use sqlx::PgPool;

use super::chain::Chains;
use super::counter::{Counter, Note, Purchase, store_in};
use super::ledger::{self, Attempt, SettledPayment};
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;

/// Attempts looked at per sweep: each is two JSON-RPC calls.
const BATCH: i64 = 200;

/// The reason of a credit for a charge whose task can no longer be created.
pub const KIND_WITHDRAWN: &str = "kind_withdrawn";

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Reconciled {
    /// Charges found on chain whose task was created now.
    pub settled_late: usize,
    /// Charges found on chain that left a credit instead of a task.
    pub credited: usize,
    /// Authorizations past `validBefore` and never used: failed, nothing
    /// charged.
    pub not_settled: usize,
    /// Still undecided (unused and valid, or the chain unreadable).
    pub open: usize,
    /// JSON-RPC reads that failed (or networks without an endpoint).
    pub chain_errors: usize,
    /// The tasks created, `(id, kind)`, for the caller to queue.
    #[serde(skip)]
    pub created: Vec<(Id, String)>,
}

/// What the chain made of one attempt.
pub(super) enum Resolution {
    /// Charged: this task was created for it now.
    Task(Id),
    /// Charged, and its task could not be created: a credit instead.
    Credited,
    /// Can never be charged: the attempt is failed.
    NeverLanded,
    /// Not decided yet; the attempt is still the caller's to release.
    Open { chain_error: bool },
}

/// One pass over the open attempts.
pub async fn reconcile<C: Counter>(db: &PgPool, chains: &Chains, counter: &C) -> Result<Reconciled, sqlx::Error> {
    let mut report = Reconciled::default();
    for attempt in ledger::claim_unresolved(db, BATCH).await? {
        let resolved = resolve_claimed(db, chains, &attempt, counter).await;
        match resolved {
            Ok(Resolution::Task(id)) => {
                report.settled_late += 1;
                report.created.push((id, attempt.kind.clone()));
            }
            Ok(Resolution::Credited) => report.credited += 1,
            Ok(Resolution::NeverLanded) => report.not_settled += 1,
            Ok(Resolution::Open { chain_error }) => {
                report.open += 1;
                report.chain_errors += usize::from(chain_error);
                let reason = attempt.reason.as_deref().unwrap_or("settle outcome unknown");
                ledger::release_attempt(db, attempt.id, reason, None).await?;
            }
            Err(e) => {
                tracing::error!(attempt = %attempt.id, error = %e, "could not record a reconciled payment");
                report.open += 1;
                let _ = ledger::release_attempt(db, attempt.id, "settle outcome unknown", None).await;
            }
        }
    }
    for (action, n) in [
        ("payment_settled_late", report.settled_late),
        ("payment_credited", report.credited),
        ("payment_not_settled", report.not_settled),
        ("payment_still_open", report.open),
        ("chain_error", report.chain_errors),
    ] {
        if n > 0 {
            crate::infra::metrics::sweeper_action(action, n as u64);
        }
    }
    Ok(report)
}

/// Resolves an attempt the caller holds (a claim) from the chain.
pub(super) async fn resolve_claimed<C: Counter>(
    db: &PgPool,
    chains: &Chains,
    attempt: &Attempt,
    counter: &C,
) -> Result<Resolution, sqlx::Error> {
    let seen = match chains.get(&attempt.network) {
        Ok(chain) => chain.authorization(&attempt.asset, &attempt.payer, &attempt.nonce).await,
        Err(e) => Err(e),
    };
    let seen = match seen {
        Ok(seen) => seen,
        Err(e) => {
            tracing::warn!(attempt = %attempt.id, network = %attempt.network, error = %e, "cannot read the chain");
            return Ok(Resolution::Open { chain_error: true });
        }
    };
    if seen.used {
        return settled_late(db, attempt, counter).await;
    }
    let expired = attempt.valid_before.as_deref().is_some_and(|v| !super::chain::can_still_land(v, seen.timestamp));
    if expired && ledger::fail_attempt(db, attempt.id, ledger::NOT_SETTLED).await? {
        tracing::info!(attempt = %attempt.id, block = seen.block, "authorization expired unused; nothing was charged");
        return Ok(Resolution::NeverLanded);
    }
    Ok(Resolution::Open { chain_error: false })
}

/// The charge happened: its task, created now in the transaction that
/// marks the attempt settled, or a credit when it cannot be.
async fn settled_late<C: Counter>(db: &PgPool, attempt: &Attempt, counter: &C) -> Result<Resolution, sqlx::Error> {
    let mut tx = db.begin().await?;
    let space = SpaceIndex::from_slice(&attempt.space);
    let request = match (&space, &attempt.input) {
        (Some(space), Some(input)) if counter.offers(&attempt.kind) => {
            Some(Purchase { space, kind: &attempt.kind, input, idempotency_key: attempt.idempotency_key.as_deref() })
        }
        _ => None,
    };
    let Some(purchase) = request else {
        let credit = ledger::credit_attempt(&mut tx, attempt, KIND_WITHDRAWN).await?;
        tx.commit().await?;
        return Ok(match credit {
            Some(_) => Resolution::Credited,
            None => Resolution::Open { chain_error: false },
        });
    };
    let task = store_in(&mut tx, &purchase, counter).await?;
    let id = C::task_id(&task);
    let recorded = ledger::record_settled(
        &mut tx,
        &SettledPayment {
            attempt: attempt.id,
            task_id: id,
            space: purchase.space,
            network: &attempt.network,
            payer: &attempt.payer,
            asset: &attempt.asset,
            amount: &attempt.amount,
            pay_to: attempt.pay_to.as_deref().unwrap_or_default(),
            transaction: attempt.transaction.as_deref(),
        },
    )
    .await?;
    if !recorded {
        tx.rollback().await?;
        return Ok(Resolution::Open { chain_error: false });
    }
    let note = Note::SettledLate {
        network: &attempt.network,
        payer: &attempt.payer,
        amount: &attempt.amount,
        transaction: attempt.transaction.as_deref(),
    };
    counter.note(&mut tx, &task, &note).await?;
    tx.commit().await?;
    tracing::info!(attempt = %attempt.id, task_id = %id, "a payment landed late: its task is created");
    Ok(Resolution::Task(id))
}
