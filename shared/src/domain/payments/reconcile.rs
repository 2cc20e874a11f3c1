//! The reconciler: every payment whose settlement's outcome Reeve never
//! learnt is resolved from the chain, in every sweep (the sweeper Lambda,
//! `reeve sweep`, and the sweeps inside `reeve work` and `reeve serve`),
//! whether or not its client ever comes back.
//!
//! For each such attempt (`settling`, held by nobody) the chain is asked
//! for its proof of payment ([`super::proof`]):
//! - **paid**: the authorization's transaction moved exactly the amount to
//!   `payTo`. Its task is created, with a `payment_settled_late` event, in
//!   the transaction that marks the attempt `settled` with that
//!   transaction's hash; or, when the task can no longer be created (its
//!   kind was withdrawn), the space gets a credit for the amount instead;
//! - **spent** by a transaction that paid nothing (the payer's own
//!   transfer with the same nonce, a cancel), or **unused at a block past
//!   `validBefore`**: it never paid and never can. The attempt is `failed`
//!   ([`ledger::NOT_SETTLED`]); no task, credit or payment is written;
//! - **unused and still valid**, or the chain could not be read: looked at
//!   again in the next sweep.
//!
//! A sweep claims at most [`BATCH`] attempts, reads the chain for
//! [`CONCURRENT`] of them at once, and stops starting new ones at the time
//! it is given: what is left is released for the next sweep.
//!
//! A client's retry of the same payment runs the same resolution first
//! ([`resolve_claimed`]), so it answers what the chain says at once.

use futures_util::StreamExt;
use serde::Serialize;
use sqlx::PgPool;
use tokio::time::Instant;

use super::chain::Chains;
use super::counter::{Counter, Note, store_in};
use super::ledger::{self, Attempt, SettledPayment};
use super::proof::{self, Owed, Proof};
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::domain::request::TaskRequest;

/// Attempts claimed per sweep: each costs a few JSON-RPC reads.
pub const BATCH: i64 = 50;
/// Attempts whose chain reads are in flight at once.
pub const CONCURRENT: usize = 4;

/// The reason of a credit for a charge whose task can no longer be created.
pub const KIND_WITHDRAWN: &str = "kind_withdrawn";

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Reconciled {
    /// Charges found on chain whose task was created now.
    pub settled_late: usize,
    /// Charges found on chain that left a credit instead of a task.
    pub credited: usize,
    /// Authorizations that never paid and never can (expired unused, or
    /// spent by a transaction that paid nothing): failed, nothing written.
    pub not_settled: usize,
    /// Still undecided (unused and valid, or the chain unreadable).
    pub open: usize,
    /// JSON-RPC reads that failed or timed out (or networks without an
    /// endpoint).
    pub chain_errors: usize,
    /// Claimed but not looked at: the sweep's time ran out. Released for
    /// the next one.
    pub deferred: usize,
    /// Batch-settlement channels whose claim the escrow now shows.
    pub channels_claimed: usize,
    /// Batch-settlement claims or payouts that did not go through
    /// (refused, not answered, or the chain unreadable): due again at the
    /// next sweep.
    pub claims_failed: usize,
    /// Batch-settlement channels found holding less than their vouchers
    /// bought (the payer withdrew first): the rest written off.
    pub channels_short: usize,
    /// Batch-settlement payouts to `payTo` made (claimed money settled).
    pub paid_out: usize,
    /// Batch-settlement channels with something unclaimed whose payer
    /// asked to withdraw more than half the withdraw delay ago.
    pub channels_at_risk: usize,
    /// The tasks created, `(id, kind)`, for the caller to queue.
    #[serde(skip)]
    pub created: Vec<(Id, String)>,
}

/// Two passes' reports as one: every scheme's sweep adds to the same.
impl std::ops::AddAssign for Reconciled {
    fn add_assign(&mut self, other: Reconciled) {
        self.settled_late += other.settled_late;
        self.credited += other.credited;
        self.not_settled += other.not_settled;
        self.open += other.open;
        self.chain_errors += other.chain_errors;
        self.deferred += other.deferred;
        self.channels_claimed += other.channels_claimed;
        self.claims_failed += other.claims_failed;
        self.channels_short += other.channels_short;
        self.paid_out += other.paid_out;
        self.channels_at_risk += other.channels_at_risk;
        self.created.extend(other.created);
    }
}

/// What the chain made of one attempt.
pub(super) enum Resolution {
    /// Charged: this task was created for it now.
    Task(Id),
    /// Charged, and its task could not be created: a credit instead.
    Credited,
    /// Never paid and never can: the attempt is failed.
    NotSettled,
    /// Not decided yet; the attempt is still the caller's to release.
    Open { chain_error: bool },
}

/// One pass over the open attempts, starting none after `until`.
pub async fn reconcile<C: Counter>(
    db: &PgPool,
    chains: &Chains,
    counter: &C,
    until: Instant,
) -> Result<Reconciled, sqlx::Error> {
    let mut report = Reconciled::default();
    if Instant::now() >= until {
        return Ok(report);
    }
    let attempts = ledger::claim_unresolved(db, BATCH).await?;
    let looked: Vec<(Attempt, Option<Result<Resolution, sqlx::Error>>)> = futures_util::stream::iter(attempts)
        .map(|attempt| async move {
            if Instant::now() >= until {
                return (attempt, None);
            }
            let resolved = resolve_claimed(db, chains, &attempt, counter, Some(until)).await;
            (attempt, Some(resolved))
        })
        .buffer_unordered(CONCURRENT)
        .collect()
        .await;
    for (attempt, resolved) in looked {
        let reason = attempt.reason.as_deref().unwrap_or("settle outcome unknown");
        match resolved {
            Some(Ok(Resolution::Task(id))) => {
                report.settled_late += 1;
                report.created.push((id, attempt.kind.clone()));
            }
            Some(Ok(Resolution::Credited)) => report.credited += 1,
            Some(Ok(Resolution::NotSettled)) => report.not_settled += 1,
            Some(Ok(Resolution::Open { chain_error })) => {
                report.open += 1;
                report.chain_errors += usize::from(chain_error);
                ledger::release_attempt(db, attempt.id, reason, None).await?;
            }
            Some(Err(e)) => {
                tracing::error!(attempt = %attempt.id, error = %e, "could not record a reconciled payment");
                report.open += 1;
                let _ = ledger::release_attempt(db, attempt.id, reason, None).await;
            }
            None => {
                report.deferred += 1;
                ledger::release_attempt(db, attempt.id, reason, None).await?;
            }
        }
    }
    for (action, n) in [
        ("payment_settled_late", report.settled_late),
        ("payment_credited", report.credited),
        ("payment_not_settled", report.not_settled),
        ("payment_still_open", report.open),
        ("payment_deferred", report.deferred),
        ("chain_error", report.chain_errors),
    ] {
        if n > 0 {
            crate::infra::metrics::sweeper_action(action, n as u64);
        }
    }
    Ok(report)
}

/// Resolves an attempt the caller holds (a claim) from the chain, its reads
/// cut off at `until`.
pub(super) async fn resolve_claimed<C: Counter>(
    db: &PgPool,
    chains: &Chains,
    attempt: &Attempt,
    counter: &C,
    until: Option<Instant>,
) -> Result<Resolution, sqlx::Error> {
    let Some(pay_to) = attempt.pay_to.as_deref() else {
        tracing::error!(attempt = %attempt.id, "an attempt without its payTo cannot be proven; left open");
        return Ok(Resolution::Open { chain_error: false });
    };
    let owed =
        Owed { asset: &attempt.asset, payer: &attempt.payer, nonce: &attempt.nonce, pay_to, amount: &attempt.amount };
    let from_block = attempt.from_block.and_then(|b| u64::try_from(b).ok());
    let proof = match chains.get(&attempt.network) {
        Ok(chain) => {
            let proving = proof::prove(chain, &owed, from_block, attempt.transaction.as_deref());
            match until {
                Some(until) => tokio::time::timeout_at(until, proving).await.unwrap_or_else(|_| {
                    Err(super::chain::ChainError::Rpc("the sweep's time ran out reading the chain".into()))
                }),
                None => proving.await,
            }
        }
        Err(e) => Err(e),
    };
    let proof = match proof {
        Ok(proof) => proof,
        Err(e) => {
            tracing::warn!(attempt = %attempt.id, network = %attempt.network, error = %e, "cannot read the chain");
            return Ok(Resolution::Open { chain_error: true });
        }
    };
    match proof {
        Proof::Paid { transaction } => settled_late(db, attempt, counter, &transaction).await,
        Proof::Spent { transaction } => {
            if ledger::fail_attempt(db, attempt.id, ledger::NOT_SETTLED).await? {
                tracing::warn!(
                    attempt = %attempt.id, transaction = ?transaction,
                    "the authorization's nonce was spent by a transaction that paid nothing: not settled"
                );
                return Ok(Resolution::NotSettled);
            }
            Ok(Resolution::Open { chain_error: false })
        }
        Proof::Unused(block) => {
            let expired = attempt.valid_before.as_deref().is_some_and(|v| !proof::can_still_land(v, block.timestamp));
            if expired && ledger::fail_attempt(db, attempt.id, ledger::NOT_SETTLED).await? {
                tracing::info!(attempt = %attempt.id, block = block.number, "authorization expired unused; nothing was charged");
                return Ok(Resolution::NotSettled);
            }
            Ok(Resolution::Open { chain_error: false })
        }
        Proof::Unfound => {
            tracing::warn!(
                attempt = %attempt.id,
                "the authorization is used, but its transaction is not in the blocks searched; left open"
            );
            Ok(Resolution::Open { chain_error: false })
        }
    }
}

/// The charge happened in `transaction`: its task, created now in the
/// transaction that marks the attempt settled, or a credit when it cannot
/// be.
async fn settled_late<C: Counter>(
    db: &PgPool,
    attempt: &Attempt,
    counter: &C,
    transaction: &str,
) -> Result<Resolution, sqlx::Error> {
    let mut tx = db.begin().await?;
    let space = SpaceIndex::from_slice(&attempt.space);
    let request = match (&space, &attempt.input) {
        (Some(space), Some(input)) if counter.offers(&attempt.kind) => {
            Some(TaskRequest { space, kind: &attempt.kind, input, idempotency_key: attempt.idempotency_key.as_deref() })
        }
        _ => None,
    };
    let Some(request) = request else {
        let credit = ledger::credit_attempt(&mut tx, attempt, KIND_WITHDRAWN).await?;
        tx.commit().await?;
        return Ok(match credit {
            Some(_) => Resolution::Credited,
            None => Resolution::Open { chain_error: false },
        });
    };
    let task = store_in(&mut tx, &request, counter).await?;
    let id = C::task_id(&task);
    let recorded = ledger::record_settled(
        &mut tx,
        &SettledPayment {
            attempt: attempt.id,
            task_id: id,
            space: request.space,
            network: &attempt.network,
            payer: &attempt.payer,
            asset: &attempt.asset,
            amount: &attempt.amount,
            pay_to: attempt.pay_to.as_deref().unwrap_or_default(),
            transaction,
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
        transaction: Some(transaction),
    };
    counter.note(&mut tx, &task, &note).await?;
    tx.commit().await?;
    tracing::info!(attempt = %attempt.id, task_id = %id, %transaction, "a payment landed late: its task is created");
    Ok(Resolution::Task(id))
}
