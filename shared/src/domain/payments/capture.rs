//! When a metered task ends: what it used, settled and proven on chain, or
//! its authorization released. The worker calls [`Capturer::capture`] with
//! what the run measured, before the task's result is given to anyone:
//! delivery follows capture.
//!
//! - Used nothing: nothing is sent to be settled (an `upto` settle of 0
//!   would not even use the authorization); it is released.
//! - Used something: the attempt moves `capturing` with the amount (what
//!   the units cost, capped at the ceiling, fixed from then on) and the
//!   run's result (held, never shown, until the capture is decided), and the
//!   facilitator's `/settle` gets the amount as `paymentRequirements.amount`.
//!   - A transaction: its receipt must have succeeded, hold the token's
//!     `Transfer` of exactly that amount from the payer to `payTo`, and a
//!     `Settled` log of x402's upto proxy: only the facilitator the payer
//!     named can make the proxy move it. Then the payment is recorded, once.
//!   - Refused: nothing moved (the payer revoked its approval or moved its
//!     funds): [`Captured::Refused`], and the task ends
//!     `payment_not_captured`.
//!   - Anything else (unreachable, cut off, not mined yet): the outcome is
//!     open, and the attempt stays `capturing` with the amount. A worker
//!     resumes it later, without running the task again; a settle again of
//!     a spent authorization is refused, so a resumed capture asks the chain
//!     for the transfer first. Once the chain is past the signed deadline
//!     with no transfer, nothing can ever be charged: refused
//!     (`authorization_expired`), so every capture ends.

use std::time::Duration;

use alloy_primitives::{Address, U256};
use alloy_rpc_types_eth::{Filter, TransactionReceipt};
use alloy_sol_types::{SolEvent, sol};
use sqlx::PgPool;
use tokio::time::Instant;

use super::chain::{Chains, parse_hash};
use super::challenge::{PaymentRequirements, UPTO_SETTLE_SECONDS};
use super::facilitator::Facilitator;
use super::ledger::{self, AttemptStatus, Held, OpenAuthorization, SettledPayment};
use super::proof::search_range;
use super::upto::{MeteredPayment, MeteredStatus, UPTO_PROXY};
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::{Meter, Unit};
use crate::domain::ids::Id;

sol! {
    /// ERC-20.
    event Transfer(address indexed from, address indexed to, uint256 value);
    /// x402's upto proxy, after a settle.
    event Settled();
    /// x402's upto proxy, after a settle that applied an EIP-2612 permit.
    event SettledWithPermit();
}

/// How long a capture waits for the chain to show a settlement the
/// facilitator reported.
const CONFIRM_WAIT: Duration = Duration::from_secs(20);
const CONFIRM_POLL: Duration = Duration::from_millis(500);

/// A metered task's authorization, as the worker reads it before a run.
#[derive(Debug, Clone)]
pub struct Authorization {
    row: OpenAuthorization,
    view: MeteredPayment,
}

impl Authorization {
    /// The task's metered authorization; `None`: the task is not metered.
    pub async fn of(db: &PgPool, task: Id) -> Result<Option<Authorization>, sqlx::Error> {
        let Some(row) = ledger::open_authorization(db, task).await? else { return Ok(None) };
        let view = serde_json::from_value(row.payment.clone())
            .map_err(|e| sqlx::Error::Decode(format!("tasks.payment: {e}").into()))?;
        Ok(Some(Authorization { row, view }))
    }

    /// Nothing sent to be settled yet.
    pub fn is_authorized(&self) -> bool {
        self.row.status == AttemptStatus::Authorized
    }

    /// Whether a run of `run` started now could still be settled after it:
    /// the signed deadline, less the time a settle needs.
    pub fn outlives(&self, run: Duration) -> bool {
        let deadline = self.row.valid_before.as_deref().and_then(|d| d.parse::<u64>().ok()).unwrap_or(0);
        let needed = super::unix_now() + run.as_secs() + u64::from(UPTO_SETTLE_SECONDS);
        needed <= deadline
    }

    pub fn view(&self) -> &MeteredPayment {
        &self.view
    }

    /// The run whose capture is under way (or done, its task not yet
    /// completed), if one is: the task is not run again, only its capture
    /// resumed and that run's result delivered.
    pub fn held(&self) -> Option<&Held> {
        let holds = matches!(self.row.status, AttemptStatus::Capturing | AttemptStatus::Settled);
        self.row.held.as_ref().filter(|_| holds)
    }
}

/// What became of a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Captured {
    /// Charged (proven on chain), or charged by an earlier run.
    Charged(MeteredPayment),
    /// Nothing used: released, nothing charged.
    Released(MeteredPayment),
    /// The payer's side refused it: nothing charged.
    Refused { payment: MeteredPayment, reason: String },
    /// Not known yet: try again later.
    Open(String),
}

/// What a capture settles through and proves with.
#[derive(Clone, Copy)]
pub struct Capturer<'a> {
    pub db: &'a PgPool,
    /// `None`: the deployment has no usable facilitator.
    pub facilitator: Option<&'a Facilitator>,
    pub chains: &'a Chains,
}

impl Capturer<'_> {
    /// Settles what task `task`'s run used under `auth`, holding the run
    /// until it is decided. See the module documentation.
    pub async fn capture(&self, auth: &Authorization, task: Id, run: &Held) -> Result<Captured, sqlx::Error> {
        let view = MeteredPayment { used: Some(run.used), ..auth.view.clone() };
        match auth.row.status {
            AttemptStatus::Settled => return Ok(Captured::Charged(auth.view.clone())),
            AttemptStatus::Authorized | AttemptStatus::Capturing => {}
            other => return Ok(Captured::Open(format!("its authorization is {other:?}, not capturable"))),
        }
        let ceiling: u128 = auth.row.amount.parse().unwrap_or(0);
        let Some(unit) = Unit::parse(&view.unit) else {
            return Ok(Captured::Open(format!("unknown unit {:?}", view.unit)));
        };
        let meter = Meter { unit, rate: view.rate.parse().unwrap_or(0), rate_usd: None };
        let charge = meter.charge(run.used, ceiling);
        if auth.row.status == AttemptStatus::Authorized && charge == 0 {
            let mut conn = self.db.acquire().await?;
            let released = ledger::release_if_authorized(&mut conn, task, "nothing used").await?;
            let released: MeteredPayment = match released.map(serde_json::from_value) {
                Some(Ok(released)) => released,
                _ => MeteredPayment { status: MeteredStatus::Released, charged: Some("0".into()), ..view },
            };
            return Ok(Captured::Released(MeteredPayment { used: Some(run.used), ..released }));
        }
        let resuming = auth.row.status == AttemptStatus::Capturing;
        let Some((charged, held)) = ledger::start_capture(self.db, auth.row.attempt, &charge.to_string(), run).await?
        else {
            return Ok(Captured::Open("the authorization moved on meanwhile".into()));
        };
        let Some(charged) = Some(charged).filter(|c| c.parse::<u128>().is_ok()) else {
            return Ok(Captured::Open("no amount recorded for the capture".into()));
        };
        let view = MeteredPayment {
            charged: Some(charged.clone()),
            used: Some(held.used),
            status: MeteredStatus::Capturing,
            ..view
        };
        let capture = Capture { by: *self, auth, task, charged: &charged, view, resuming };
        if resuming {
            // An earlier run's settle may have gone through: the chain first.
            if let Some(done) = capture.find_on_chain(auth.row.transaction.as_deref()).await? {
                return Ok(done);
            }
            // Past the signed deadline with nothing paid, nothing ever can
            // be: Permit2 refuses the signature from then on.
            if capture.expired_unpaid().await {
                return capture.refused(super::upto::AUTHORIZATION_EXPIRED).await;
            }
        }
        capture.settle().await
    }
}

/// One capture under way.
struct Capture<'a> {
    by: Capturer<'a>,
    auth: &'a Authorization,
    task: Id,
    charged: &'a str,
    view: MeteredPayment,
    /// An earlier run sent this capture already: its settle may still land.
    resuming: bool,
}

impl Capture<'_> {
    async fn settle(&self) -> Result<Captured, sqlx::Error> {
        let Some(facilitator) = self.by.facilitator else {
            return Ok(Captured::Open("no facilitator client could be built".into()));
        };
        let document = &self.auth.row.document;
        let Ok(mut requirements) = serde_json::from_value::<PaymentRequirements>(document["accepted"].clone()) else {
            return Ok(Captured::Open("the stored payment has no readable `accepted`".into()));
        };
        requirements.amount = self.charged.to_owned();
        match facilitator.settle(document, &requirements, None).await {
            Ok(settled) if settled.success && !settled.transaction.is_empty() => {
                tracing::info!(transaction = %settled.transaction, charged = self.charged, "facilitator: captured");
                ledger::capture_named(self.by.db, self.auth.row.attempt, &settled.transaction).await?;
                self.confirm(&settled.transaction).await
            }
            Ok(settled) if settled.success => {
                Ok(Captured::Open("the facilitator settled without a transaction".into()))
            }
            Ok(settled) => {
                // A refusal may still hide a transaction it sent.
                if !settled.transaction.is_empty() {
                    ledger::capture_named(self.by.db, self.auth.row.attempt, &settled.transaction).await?;
                    return self.confirm(&settled.transaction).await;
                }
                let reason = settled.error_reason.unwrap_or_else(|| "settle_failed".into());
                // A second settle of a spent authorization is refused too:
                // after an earlier run's settle, a refusal proves nothing
                // (that one may still land), so the chain must tell.
                if self.resuming {
                    tracing::warn!(%reason, "capture refused after an earlier settle; the chain decides");
                    return Ok(Captured::Open(format!(
                        "refused ({reason}) after an earlier settle that may still land"
                    )));
                }
                tracing::warn!(%reason, message = ?settled.error_message, "facilitator: capture refused");
                self.refused(&reason).await
            }
            Err(e) => {
                tracing::warn!(error = %e, "capture outcome unknown");
                Ok(Captured::Open(format!("the capture's outcome is unknown: {e}")))
            }
        }
    }

    async fn refused(&self, reason: &str) -> Result<Captured, sqlx::Error> {
        let payment = MeteredPayment {
            status: MeteredStatus::NotCaptured,
            reason: Some(reason.to_owned()),
            charged: Some("0".into()),
            ..self.view.clone()
        };
        if !ledger::refuse_capture(self.by.db, self.auth.row.attempt, self.task, reason, &payment.to_value()).await? {
            return Ok(Captured::Open("the authorization moved on meanwhile".into()));
        }
        Ok(Captured::Refused { payment, reason: reason.to_owned() })
    }

    /// Waits (a while) for `transaction` to show the transfer, and records it.
    async fn confirm(&self, transaction: &str) -> Result<Captured, sqlx::Error> {
        let until = Instant::now() + CONFIRM_WAIT;
        loop {
            if let Some(done) = self.find_on_chain(Some(transaction)).await? {
                return Ok(done);
            }
            if Instant::now() + CONFIRM_POLL >= until {
                return Ok(Captured::Open(format!("{transaction} is not on chain yet")));
            }
            tokio::time::sleep(CONFIRM_POLL).await;
        }
    }

    /// The transfer that paid this capture: in `named`'s receipt, or found
    /// in the token's logs since the attempt began. `None`: not (yet).
    async fn find_on_chain(&self, named: Option<&str>) -> Result<Option<Captured>, sqlx::Error> {
        let row = &self.auth.row;
        let Ok(chain) = self.by.chains.get(&row.network) else {
            // No endpoint for this network (start-up warned): the
            // facilitator's word is all there is.
            return match named {
                Some(transaction) => self.record(transaction).await.map(Some),
                None => Ok(None),
            };
        };
        let Some(owed) = Owed::of(row, self.charged) else { return Ok(None) };
        let read = async {
            if let Some(named) = named {
                let Some(receipt) = chain.receipt(parse_hash(named)?).await? else { return Ok(None) };
                return Ok(Some((named.to_ascii_lowercase(), owed.paid_by(&receipt))));
            }
            let head = chain.head().await?.number;
            let (from, to) = search_range(row.from_block.and_then(|b| u64::try_from(b).ok()), head);
            let filter = Filter::new()
                .address(owed.asset)
                .event_signature(Transfer::SIGNATURE_HASH)
                .topic1(owed.payer.into_word())
                .topic2(owed.pay_to.into_word())
                .from_block(from)
                .to_block(to);
            for log in chain.logs(&filter).await? {
                let Some(hash) = log.transaction_hash else { continue };
                // Another task's capture (the same payer, payTo and amount)
                // is not this one's.
                if ledger::transaction_recorded(self.by.db, &format!("{hash:#x}")).await.unwrap_or(true) {
                    continue;
                }
                if let Some(receipt) = chain.receipt(hash).await?
                    && owed.paid_by(&receipt)
                {
                    return Ok(Some((format!("{hash:#x}"), true)));
                }
            }
            Ok::<_, super::chain::ChainError>(None)
        };
        match read.await {
            Ok(Some((transaction, true))) => self.record(&transaction).await.map(Some),
            // Mined, and it paid nothing (reverted): nothing was charged.
            Ok(Some((transaction, false))) => {
                tracing::warn!(%transaction, "the capture's transaction did not pay");
                self.refused("settlement_reverted").await.map(Some)
            }
            Ok(None) => Ok(None),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the chain to confirm a capture");
                Ok(None)
            }
        }
    }

    /// Whether the chain is past the authorization's deadline, and no
    /// transfer paid this capture in any block up to it. `false` when the
    /// chain cannot tell (unreadable, or the blocks since the attempt began
    /// are more than one search covers).
    async fn expired_unpaid(&self) -> bool {
        let row = &self.auth.row;
        let Some(deadline) = row.valid_before.as_deref().and_then(|d| d.parse::<u64>().ok()) else { return false };
        if super::unix_now() <= deadline {
            return false;
        }
        let Ok(chain) = self.by.chains.get(&row.network) else { return false };
        let Ok(head) = chain.head().await else { return false };
        let (_, to) = search_range(row.from_block.and_then(|b| u64::try_from(b).ok()), head.number);
        if head.timestamp <= deadline || to < head.number {
            return false;
        }
        // The whole range, named transaction or not: a dropped one is in no
        // block, a landed one is in the logs.
        matches!(self.find_on_chain(None).await, Ok(None))
    }

    async fn record(&self, transaction: &str) -> Result<Captured, sqlx::Error> {
        let row = &self.auth.row;
        let space = SpaceIndex::from_slice(&row.space).ok_or_else(|| sqlx::Error::Decode("space_idx".into()))?;
        let payment = MeteredPayment {
            status: MeteredStatus::Charged,
            transaction: Some(transaction.to_owned()),
            ..self.view.clone()
        };
        let paid = SettledPayment {
            attempt: row.attempt,
            task_id: self.task,
            space: &space,
            network: &row.network,
            payer: &row.payer,
            asset: &row.asset,
            amount: self.charged,
            pay_to: row.pay_to.as_deref().unwrap_or_default(),
            transaction,
        };
        if ledger::record_captured(self.by.db, &paid, &payment.to_value()).await? {
            tracing::info!(%transaction, charged = self.charged, "metered task charged");
            Ok(Captured::Charged(payment))
        } else {
            Ok(Captured::Open("the authorization moved on meanwhile".into()))
        }
    }
}

/// What the capture's transfer must be, in the chain's types.
struct Owed {
    asset: Address,
    payer: Address,
    pay_to: Address,
    amount: U256,
    proxy: Address,
}

impl Owed {
    fn of(row: &OpenAuthorization, charged: &str) -> Option<Owed> {
        Some(Owed {
            asset: row.asset.parse().ok()?,
            payer: row.payer.parse().ok()?,
            pay_to: row.pay_to.as_deref()?.parse().ok()?,
            amount: U256::from_str_radix(charged, 10).ok()?,
            proxy: UPTO_PROXY.parse().ok()?,
        })
    }

    /// The receipt succeeded, the proxy settled in it, and the token moved
    /// exactly the amount from the payer to `payTo`.
    fn paid_by(&self, receipt: &TransactionReceipt) -> bool {
        if !receipt.inner.status() {
            return false;
        }
        let logs = receipt.inner.logs();
        let settled = logs.iter().filter(|log| log.address() == self.proxy).any(|log| {
            let topic = log.topics().first();
            topic == Some(&Settled::SIGNATURE_HASH) || topic == Some(&SettledWithPermit::SIGNATURE_HASH)
        });
        let transferred = logs.iter().filter(|log| log.address() == self.asset).any(|log| {
            Transfer::decode_log(&log.inner)
                .is_ok_and(|e| e.data.from == self.payer && e.data.to == self.pay_to && e.data.value == self.amount)
        });
        settled && transferred
    }
}
