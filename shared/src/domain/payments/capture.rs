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
//!   - Paid only as [`super::capture_proof`] proves it: a successful settle
//!     of this authorization's own nonce and witness, moving the amount to
//!     `payTo`. Then the payment is recorded, once.
//!   - Anything else keeps the capture open: a refusal (the payer revoked
//!     its approval, say: it may restore it), a reverted or unrelated
//!     transaction (a second settle may revert while the first one pays),
//!     an unreachable facilitator or chain. A worker resumes it later,
//!     without running the task again, and asks the chain first.
//!   - Nothing charged only once the chain is past the signed deadline
//!     (by [`RESOLVE_MARGIN`]): the nonce unused, or spent by the payer
//!     without a settle to `payTo`. That decision is read once and is final,
//!     so every capture ends, and none loops.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::capture_proof::{self, Decided, Paid, Signed};
use super::chain::{Chain, Chains};
use super::challenge::{PaymentRequirements, UPTO_SETTLE_SECONDS};
use super::facilitator::Facilitator;
use super::ledger::{self, AttemptStatus, Held, OpenAuthorization, SettledPayment};
use super::scheme::Scheme;
use super::upto::{AUTHORIZATION_EXPIRED, AUTHORIZATION_SPENT, MeteredPayment, MeteredStatus};
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::{Meter, Unit};
use crate::domain::ids::Id;

/// How long a capture waits for the chain to show a settlement the
/// facilitator reported.
const CONFIRM_WAIT: Duration = Duration::from_secs(20);
const CONFIRM_POLL: Duration = Duration::from_millis(500);
/// How far past the signed deadline the chain must be before the nonce
/// decides an open capture: a few blocks on any chain, so an endpoint a
/// little behind, or a short reorg, cannot undo what it read.
pub const RESOLVE_MARGIN: Duration = Duration::from_secs(6);

/// A metered task's authorization, as the worker reads it before a run.
#[derive(Debug, Clone)]
pub struct Authorization {
    row: OpenAuthorization,
    view: MeteredPayment,
}

impl Authorization {
    /// The most units the authorization pays for: its ceiling over the
    /// rate (the job's `metered.ceiling`). `None`: unreadable numbers.
    pub fn ceiling_units(&self) -> Option<u64> {
        let ceiling = u128::try_from(self.row.amount.parse::<alloy_primitives::U256>().ok()?).unwrap_or(u128::MAX);
        let rate: u128 = self.view.rate.parse().ok()?;
        Some(u64::try_from(ceiling / rate.max(1)).unwrap_or(u64::MAX))
    }

    /// The task's metered authorization; `None`: the task is not metered.
    pub async fn of(db: &PgPool, task: Id) -> Result<Option<Authorization>, sqlx::Error> {
        let Some(row) = ledger::open_authorization(db, task).await? else { return Ok(None) };
        let view = serde_json::from_value(row.payment.clone())
            .map_err(|e| sqlx::Error::Decode(format!("tasks.payment: {e}").into()))?;
        Ok(Some(Authorization { row, view }))
    }

    /// The scheme whose hooks a run of its task meets: only an `upto`
    /// authorization holds its task open until it ends.
    pub fn scheme(&self) -> Scheme {
        Scheme::Upto
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
    /// Holds `run` (a service's result, reported on its own) for its
    /// capture, exactly as the worker holds a finished run when its capture
    /// starts (`ledger::start_capture`), in the caller's transaction: the
    /// worker that next claims the task resumes the capture and delivers
    /// the run. Nothing used: the authorization is released instead and
    /// its receipt returned, for the task to complete with. `Ok(None)`: the
    /// authorization moved on meanwhile.
    pub async fn hold_for_capture(
        &self,
        conn: &mut sqlx::PgConnection,
        task: Id,
        run: &Held,
    ) -> Result<Option<Hold>, sqlx::Error> {
        let ceiling =
            self.row.amount.parse::<alloy_primitives::U256>().ok().map(|c| u128::try_from(c).unwrap_or(u128::MAX));
        let meter = Unit::parse(&self.view.unit).zip(self.view.rate.parse().ok()).map(|(unit, rate)| Meter {
            unit,
            rate,
            rate_usd: None,
        });
        let (Some(ceiling), Some(meter)) = (ceiling, meter) else {
            return Err(sqlx::Error::Decode("the stored ceiling, unit or rate cannot be read".into()));
        };
        let charge = meter.charge(run.used, ceiling);
        if charge == 0 {
            let released = ledger::release_if_authorized(conn, task, "nothing used").await?;
            let released = released.unwrap_or_else(|| serde_json::json!({ "status": "released", "charged": "0" }));
            return Ok(Some(Hold::Released(released)));
        }
        let started = ledger::start_capture(&mut *conn, self.row.attempt, &charge.to_string(), run).await?;
        Ok(started.map(|_| Hold::Held))
    }

    pub fn held(&self) -> Option<&Held> {
        let holds = matches!(self.row.status, AttemptStatus::Capturing | AttemptStatus::Settled);
        self.row.held.as_ref().filter(|_| holds)
    }
}

/// What [`Authorization::hold_for_capture`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Hold {
    /// Held for a worker to capture.
    Held,
    /// Nothing to charge: released, with this receipt.
    Released(serde_json::Value),
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
        // Stored canonical by create; a ceiling past u128 caps nothing a
        // charge could reach. Unreadable numbers never read as "free".
        let Ok(ceiling) = auth.row.amount.parse::<alloy_primitives::U256>() else {
            return Ok(Captured::Open(format!("the stored ceiling {:?} is not a number", auth.row.amount)));
        };
        let ceiling = u128::try_from(ceiling).unwrap_or(u128::MAX);
        let Some(unit) = Unit::parse(&view.unit) else {
            return Ok(Captured::Open(format!("unknown unit {:?}", view.unit)));
        };
        let Ok(rate) = view.rate.parse() else {
            return Ok(Captured::Open(format!("the stored rate {:?} is not a number", view.rate)));
        };
        let meter = Meter { unit, rate, rate_usd: None };
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
        let Some(signed) = Signed::of(&auth.row.document) else {
            return Ok(Captured::Open("the stored authorization cannot be read".into()));
        };
        let capture = Capture { by: *self, auth, task, charged: &charged, view, signed };
        if resuming {
            // An earlier run's settle may have gone through: the chain first,
            // then, past the deadline, the nonce decides for good.
            if let Some(done) = capture.paid_on_chain(auth.row.transaction.as_deref()).await? {
                return Ok(done);
            }
            if let Some(done) = capture.decide().await? {
                return Ok(done);
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
    signed: Signed,
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
            // Whatever the facilitator says of it, a transaction it names
            // is only what the chain shows it to be.
            Ok(settled) if !settled.transaction.is_empty() => {
                tracing::info!(transaction = %settled.transaction, success = settled.success, charged = self.charged,
                               "facilitator: capture sent");
                ledger::capture_named(self.by.db, self.auth.row.attempt, &settled.transaction).await?;
                self.confirm(&settled.transaction).await
            }
            Ok(settled) if settled.success => {
                Ok(Captured::Open("the facilitator settled without a transaction".into()))
            }
            Ok(settled) => {
                // A refusal proves nothing: an earlier settle may still land,
                // and a payer who withdrew its approval may restore it. The
                // capture stays open until its deadline; then the nonce says.
                let reason = settled.error_reason.unwrap_or_else(|| "settle_failed".into());
                tracing::warn!(%reason, message = ?settled.error_message, "facilitator: capture refused");
                Ok(Captured::Open(format!(
                    "the facilitator refused the capture ({reason}); it is tried again until the authorization's \
                     deadline, then the chain decides"
                )))
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

    /// The network's endpoint. Without one nothing can be proven, so the
    /// capture stays open (start-up refuses a priced network without one).
    fn chain(&self) -> Option<&Chain> {
        self.by.chains.get(&self.auth.row.network).ok()
    }

    /// The block the attempt began at: where a search for its settle starts.
    fn first_block(&self) -> Option<u64> {
        self.auth.row.from_block.and_then(|b| u64::try_from(b).ok())
    }

    /// Waits (a while) for `transaction` to be mined, and records the
    /// settle of this authorization if the chain shows one.
    async fn confirm(&self, transaction: &str) -> Result<Captured, sqlx::Error> {
        let Some(chain) = self.chain() else {
            return Ok(Captured::Open(format!("no chain endpoint to prove {transaction}")));
        };
        let until = Instant::now() + CONFIRM_WAIT;
        loop {
            match capture_proof::find(chain, &self.signed, self.first_block(), Some(transaction), None).await {
                Ok(found) => {
                    if let Some(paid) = found.paid {
                        return self.record(&paid).await;
                    }
                    if found.named_mined {
                        tracing::warn!(%transaction, "the capture's transaction did not pay this authorization");
                        return Ok(Captured::Open(format!(
                            "{transaction} did not settle this authorization; the nonce decides"
                        )));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the chain to confirm a capture"),
            }
            if Instant::now() + CONFIRM_POLL >= until {
                return Ok(Captured::Open(format!("{transaction} is not on chain yet")));
            }
            tokio::time::sleep(CONFIRM_POLL).await;
        }
    }

    /// The settle of this authorization, if the chain shows one: in
    /// `named`'s receipt, or among the payer's transfers to `payTo` since
    /// the attempt began. `None`: not (yet), or the chain cannot tell.
    async fn paid_on_chain(&self, named: Option<&str>) -> Result<Option<Captured>, sqlx::Error> {
        let Some(chain) = self.chain() else { return Ok(None) };
        match capture_proof::find(chain, &self.signed, self.first_block(), named, None).await {
            Ok(found) => match found.paid {
                Some(paid) => self.record(&paid).await.map(Some),
                None => Ok(None),
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the chain to look for a capture");
                Ok(None)
            }
        }
    }

    /// Past the signed deadline (and [`RESOLVE_MARGIN`]), the chain's
    /// final word: paid, or nothing charged. `None` before then, or when
    /// the chain cannot be read.
    async fn decide(&self) -> Result<Option<Captured>, sqlx::Error> {
        let Some(chain) = self.chain() else { return Ok(None) };
        let margin = RESOLVE_MARGIN.as_secs();
        match capture_proof::decide(chain, &self.signed, self.first_block(), margin).await {
            Ok(None) => Ok(None),
            Ok(Some(Decided::Paid(paid))) => self.record(&paid).await.map(Some),
            Ok(Some(Decided::Unused)) => self.refused(AUTHORIZATION_EXPIRED).await.map(Some),
            Ok(Some(Decided::Spent)) => {
                tracing::warn!("the payer spent the authorization's nonce without settling it to payTo");
                self.refused(AUTHORIZATION_SPENT).await.map(Some)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the chain to decide a capture past its deadline");
                Ok(None)
            }
        }
    }

    /// Records `paid`: the amount the chain moved, which is what was asked
    /// unless the facilitator settled another (never above the ceiling:
    /// Permit2 refuses more than was signed). The books follow the chain.
    async fn record(&self, paid: &Paid) -> Result<Captured, sqlx::Error> {
        let row = &self.auth.row;
        let space = SpaceIndex::from_slice(&row.space).ok_or_else(|| sqlx::Error::Decode("space_idx".into()))?;
        let amount = paid.amount.to_string();
        if amount != self.charged {
            tracing::error!(transaction = %paid.transaction, asked = self.charged, moved = %amount,
                            "the facilitator settled another amount than asked; recording what moved");
        }
        let payment = MeteredPayment {
            status: MeteredStatus::Charged,
            transaction: Some(paid.transaction.clone()),
            charged: Some(amount.clone()),
            ..self.view.clone()
        };
        let settled = SettledPayment {
            attempt: row.attempt,
            task_id: self.task,
            space: &space,
            network: &row.network,
            payer: &row.payer,
            asset: &row.asset,
            amount: &amount,
            pay_to: row.pay_to.as_deref().unwrap_or_default(),
            transaction: &paid.transaction,
        };
        if ledger::record_captured(self.by.db, &settled, &payment.to_value()).await? {
            tracing::info!(transaction = %paid.transaction, charged = %amount, "metered task charged");
            Ok(Captured::Charged(payment))
        } else {
            Ok(Captured::Open("the authorization moved on meanwhile".into()))
        }
    }
}
