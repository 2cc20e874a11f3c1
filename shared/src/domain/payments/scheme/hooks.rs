//! Each hook of [`Scheme`], and the calls that run every scheme's: the
//! worker, the sweeper, the end of a task and [`pay`] reach a scheme's
//! module only through these.

use serde_json::Value;
use sqlx::PgConnection;

use super::{Ended, Scheme};
use crate::domain::ids::Id;
use crate::domain::payments::ledger;

impl Scheme {
    /// A paid task ended without doing its work: `exact` leaves a credit on
    /// its space if the end earns one (a task paid with a credit or a
    /// voucher too: only fixed prices are); `upto` releases an authorization nothing was sent
    /// to be settled under. Called in the transaction that ends the task,
    /// for every scheme (each is a no-op for a task another paid for).
    /// Returns the task's metered `payment` as it is now, if it has one.
    pub async fn ended_without_work(
        self,
        conn: &mut PgConnection,
        task: Id,
        ended: Ended<'_>,
    ) -> Result<Option<Value>, sqlx::Error> {
        match (self, ended) {
            (Scheme::Exact, Ended::Failed(code)) => ledger::credit_if_owed(conn, task, code).await.map(|_| None),
            // Only a task that never started was canceled before its work.
            (Scheme::Exact, Ended::Canceled { before_run: true }) => {
                ledger::credit_if_owed(conn, task, "canceled").await.map(|_| None)
            }
            (Scheme::Exact, Ended::Canceled { before_run: false }) => Ok(None),
            (Scheme::Upto, Ended::Failed(reason)) => ledger::release_if_authorized(conn, task, reason).await,
            (Scheme::Upto, Ended::Canceled { .. }) => ledger::release_if_authorized(conn, task, "canceled").await,
            // `exact`'s arm credits a voucher-paid task too: the credit is
            // of whichever fixed price paid it (a payment, a credit or a
            // voucher), read by `credit_if_owed`.
            (Scheme::Batch, _) => Ok(None),
        }
    }
}

/// Every scheme's [`Scheme::ended_without_work`], in [`Scheme::ALL`]'s
/// order: the task's metered `payment` as it is now, if it has one.
pub async fn ended_without_work(
    conn: &mut PgConnection,
    task: Id,
    ended: Ended<'_>,
) -> Result<Option<Value>, sqlx::Error> {
    let mut payment = None;
    for scheme in Scheme::ALL {
        payment = scheme.ended_without_work(conn, task, ended).await?.or(payment);
    }
    Ok(payment)
}

#[cfg(feature = "api-tasks")]
mod at_create {
    use super::Scheme;
    use crate::domain::payments::challenge::{PaymentRequired, PaymentRequirements};
    use crate::domain::payments::counter::Counter;
    use crate::domain::payments::order::{Bought, Checkout, Order, PayError, with_error};
    use crate::domain::payments::payload::Payment;
    use crate::domain::payments::{authorize, batch, checkout};

    /// Pays for `order` against `challenge` (the kind's requirements), or
    /// refuses: the one call behind every priced create. Without a
    /// payment, a credit of the space may pay ([`checkout::with_credit`]);
    /// with one, the scheme of the offer it matches does ([`Scheme::pay`]).
    pub async fn pay<C: Counter>(
        cx: Checkout<'_>,
        order: Order<'_>,
        challenge: &PaymentRequired,
        counter: &C,
    ) -> Result<Bought<C::Task>, PayError> {
        let Some(input) = order.payment else {
            return checkout::with_credit(cx.db, &order.request, challenge, counter).await;
        };
        let payment = input.decode().map_err(PayError::Malformed)?;
        let offer = challenge.accepts.iter().find(|o| payment.accepted.matches(o));
        let Some((offer, scheme)) = offer.and_then(|o| Some((o.clone(), Scheme::named(&o.scheme)?))) else {
            return Err(PayError::Mismatch(with_error(challenge, "payment_mismatch")));
        };
        scheme.pay(cx, &order, (&payment, &offer), challenge, counter).await
    }

    impl Scheme {
        /// At create: `payment`, matching `offer`, pays for `order` (`exact`:
        /// settled and proven, the task stored with its payment;
        /// `batch-settlement`: a voucher decided on the escrow's balance,
        /// the task stored with it) or authorizes it (`upto`: verified, the
        /// task stored authorized, nothing charged).
        pub(in crate::domain::payments) async fn pay<C: Counter>(
            self,
            cx: Checkout<'_>,
            order: &Order<'_>,
            (payment, offer): (&Payment, &PaymentRequirements),
            challenge: &PaymentRequired,
            counter: &C,
        ) -> Result<Bought<C::Task>, PayError> {
            match self {
                Scheme::Exact => checkout::settle(cx, order, payment, offer, challenge, counter).await,
                Scheme::Upto => authorize::authorize(cx, order, payment, offer, challenge, counter).await,
                Scheme::Batch => batch::pay::pay(cx, order, (payment, offer), challenge, counter).await,
            }
        }
    }
}

#[cfg(all(feature = "chain", feature = "catalog"))]
mod at_run {
    use std::time::Duration;

    use sqlx::PgPool;

    use super::Scheme;
    use crate::domain::ids::Id;
    use crate::domain::payments::capture::{Authorization, Captured, Capturer};
    use crate::domain::payments::chain::Chains;
    use crate::domain::payments::ledger::Held;
    use crate::domain::payments::run_check::{self, RunCheck};
    use crate::domain::payments::upto::AUTHORIZATION_EXPIRED;

    impl Scheme {
        /// Before task `task`'s run of up to `run` under `auth`, still
        /// authorized: whether what it uses can be settled afterwards.
        /// `None`: nothing to check. `upto` refuses a deadline too near for
        /// a run and its capture, then reads the chain once.
        pub async fn before_run(
            self,
            db: &PgPool,
            chains: &Chains,
            (task, auth): (Id, &Authorization),
            run: Duration,
        ) -> Result<Option<RunCheck>, sqlx::Error> {
            match self {
                // Paid at create: nothing on chain can take it back.
                Scheme::Exact | Scheme::Batch => Ok(None),
                Scheme::Upto if !auth.outlives(run) => Ok(Some(RunCheck::Refused {
                    code: AUTHORIZATION_EXPIRED,
                    message: "its payment authorization would expire before what it uses could be settled, so it \
                              was not started; nothing was charged. Create it again with a new payment"
                        .into(),
                })),
                Scheme::Upto => run_check::check_before_run(db, chains, task, run).await,
            }
        }

        /// At the end of task `task`'s run under `auth`, before its result
        /// is shown: `upto` captures what `run` used ([`Capturer::capture`]);
        /// `exact` was charged at create.
        pub async fn at_end(
            self,
            by: &Capturer<'_>,
            (task, auth): (Id, &Authorization),
            run: &Held,
        ) -> Result<Captured, sqlx::Error> {
            match self {
                Scheme::Exact | Scheme::Batch => Ok(Captured::Charged(auth.view().clone())),
                Scheme::Upto => by.capture(auth, task, run).await,
            }
        }
    }
}

#[cfg(all(feature = "chain", feature = "catalog"))]
mod in_sweep {
    use sqlx::PgPool;
    use tokio::time::Instant;

    use super::Scheme;
    use crate::domain::payments::batch::claim::Claimer;
    use crate::domain::payments::chain::Chains;
    use crate::domain::payments::counter::Counter;
    use crate::domain::payments::reconcile::{self, Reconciled};

    impl Scheme {
        /// In every sweep, starting nothing after `until`: `exact` resolves
        /// from the chain the settlements whose outcome nobody learnt
        /// ([`reconcile::reconcile`]); an open `upto` capture is resumed by
        /// the worker that delivers its task again, so it has nothing here;
        /// `batch-settlement` claims what is due, where the sweeper has a
        /// `claimer` (the receiver authorizer's key).
        pub async fn sweep<C: Counter>(
            self,
            db: &PgPool,
            (chains, claimer): (&Chains, Option<&Claimer>),
            counter: &C,
            until: Instant,
        ) -> Result<Reconciled, sqlx::Error> {
            match self {
                Scheme::Exact => reconcile::reconcile(db, chains, counter, until).await,
                Scheme::Upto => Ok(Reconciled::default()),
                Scheme::Batch => {
                    let Some(claimer) = claimer else { return Ok(Reconciled::default()) };
                    let claimed = claimer.claim_due(db, chains, until).await?;
                    Ok(Reconciled {
                        channels_claimed: claimed.channels,
                        claims_failed: claimed.failed,
                        channels_short: claimed.short,
                        paid_out: claimed.paid_out,
                        channels_at_risk: claimed.at_risk,
                        ..Reconciled::default()
                    })
                }
            }
        }
    }

    /// Every scheme's [`Scheme::sweep`], in [`Scheme::ALL`]'s order, added
    /// up.
    pub async fn sweep<C: Counter>(
        db: &PgPool,
        (chains, claimer): (&Chains, Option<&Claimer>),
        counter: &C,
        until: Instant,
    ) -> Result<Reconciled, sqlx::Error> {
        let mut report = Reconciled::default();
        for scheme in Scheme::ALL {
            report += scheme.sweep(db, (chains, claimer), counter, until).await?;
        }
        Ok(report)
    }
}

#[cfg(feature = "api-tasks")]
pub use at_create::pay;
#[cfg(all(feature = "chain", feature = "catalog"))]
pub use in_sweep::sweep;
