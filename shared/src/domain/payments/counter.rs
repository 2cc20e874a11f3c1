//! Where a paid-for request becomes a task. `payments` never names a task
//! type: [`pay`](super::pay) and the reconciler store one through the
//! caller's [`Counter`] (`tasks::Shelf`), inside the transaction that
//! records the payment, so the two are written together or not at all.

use std::future::Future;

use serde_json::{Value, json};
use sqlx::PgConnection;

use super::ledger::Credit;
use super::upto::MeteredPayment;
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::domain::request::TaskRequest;

/// Where a paid-for request becomes a task: implemented by `tasks`.
pub trait Counter: Sync {
    type Task: Send;

    fn task_id(task: &Self::Task) -> Id;

    /// Whether the catalog still offers `kind`: a charge learnt late for a
    /// kind that was withdrawn leaves a credit instead of a task.
    fn offers(&self, kind: &str) -> bool;

    /// Stores `request` as a queued task in the caller's transaction.
    /// `None`: its `Idempotency-Key` is taken by another task.
    fn store(
        &self,
        conn: &mut PgConnection,
        request: &TaskRequest<'_>,
    ) -> impl Future<Output = Result<Option<Self::Task>, sqlx::Error>> + Send;

    /// Whether a task of `space` already holds `key`, seen in the caller's
    /// transaction (which holds the key's lock: [`super::ledger::lock_key`]).
    fn key_taken(
        &self,
        conn: &mut PgConnection,
        space: &SpaceIndex,
        key: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// What a metered price (`upto`) of `kind` in `asset` (its contract)
    /// charges, and the kind's timeout; `None`: not metered there.
    fn metering(&self, kind: &str, asset: &str) -> Option<Metering>;

    /// Records a metered task's payment as its buyer sees it (`tasks.payment`)
    /// in the caller's transaction, and returns the task with it.
    fn authorized(
        &self,
        conn: &mut PgConnection,
        task: Self::Task,
        payment: &MeteredPayment,
    ) -> impl Future<Output = Result<Self::Task, sqlx::Error>> + Send;

    /// Appends the event that says how the task was paid, when it is not
    /// the plain case (a credit, a charge learnt late).
    fn note(
        &self,
        conn: &mut PgConnection,
        task: &Self::Task,
        note: &Note<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// A metered price, as the catalog sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metering {
    /// The kind's `timeout_seconds`.
    pub timeout_seconds: u32,
    /// The unit's name (`byte`, `KiB`, `MiB`, `GiB`, `second`).
    pub unit: &'static str,
    /// Atomic units per unit.
    pub rate: u128,
}

/// How a task was paid, for its event log.
#[derive(Debug)]
pub enum Note<'a> {
    /// With a credit: a `credit_used` event.
    Credit(&'a Credit),
    /// With a charge learnt from the chain after the request was answered
    /// `payment_pending`: a `payment_settled_late` event.
    SettledLate { network: &'a str, payer: &'a str, amount: &'a str, transaction: Option<&'a str> },
}

impl Note<'_> {
    /// The event's data.
    pub fn data(&self) -> Value {
        match self {
            Note::Credit(credit) => json!({
                "credit_id": credit.id,
                "network": credit.network,
                "asset": credit.asset,
                "amount": credit.amount,
                "source_task": credit.source_task,
            }),
            Note::SettledLate { network, payer, amount, transaction } => json!({
                "network": network,
                "payer": payer,
                "amount": amount,
                "transaction": transaction,
            }),
        }
    }
}

/// Stores the paid request as a task. Its `Idempotency-Key` taken meanwhile
/// by another task (a free one, which reserves nothing): the payer still
/// paid for a task of their own, so it is stored without it.
pub(crate) async fn store_in<C: Counter>(
    conn: &mut PgConnection,
    request: &TaskRequest<'_>,
    counter: &C,
) -> Result<C::Task, sqlx::Error> {
    if let Some(task) = counter.store(conn, request).await? {
        return Ok(task);
    }
    let keyless = request.keyless();
    counter.store(conn, &keyless).await?.ok_or_else(|| sqlx::Error::Protocol("a task without a key was refused".into()))
}
