//! The seam where payment schemes differ: [`Scheme`] names each x402 scheme
//! Reeve takes, and declares in one place what it does at each point of a
//! paid task's life. Everything else (the challenge, the attempt and its
//! uniqueness, `/verify` beside the chain's head, the ledger) is shared.
//!
//! | hook | `exact` | `upto` | `batch-settlement` |
//! | --- | --- | --- | --- |
//! | [`Scheme::pay`] (create) | verify, settle, prove, store | verify, store authorized | a deposit settled, the voucher decided, store ([`super::batch::pay`]) |
//! | [`Scheme::before_run`] | nothing: paid already | the chain read once ([`super::run_check`]) | nothing: paid already |
//! | [`Scheme::at_end`] (a run's result) | nothing: paid already | capture and prove ([`super::capture`]) | nothing: paid already |
//! | [`Scheme::ended_without_work`] | a credit, if owed (a voucher-paid task's too) | the authorization released | (in `exact`'s) |
//! | [`Scheme::sweep`] | open settlements resolved ([`super::reconcile`]) | nothing: the worker resumes a capture | the claims due claimed and paid to `payTo` ([`super::batch::claim`]) |
//!
//! `batch-settlement` (issue 42, [`super::batch`]) is offered to a kind
//! priced `scheme = "batch"`, paid at create, and claimed in the sweep
//! where the sweeper holds the receiver authorizer's key.
//!
//! The declarations are here; the hooks, which call each scheme's module,
//! are in `hooks.rs`, above every scheme. A new scheme is a variant here,
//! its answers below, its arm in each hook, and its module.

mod hooks;

pub use hooks::ended_without_work;
#[cfg(feature = "api-tasks")]
pub use hooks::pay;
#[cfg(all(feature = "chain", feature = "catalog"))]
pub use hooks::sweep;

/// An x402 payment scheme Reeve takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// A fixed amount, paid with an EIP-3009 authorization, settled before
    /// the task is queued.
    Exact,
    /// A metered price: the payer signs a ceiling through Permit2 at create,
    /// and what the task used is settled when it ends, before its result is
    /// shown (nothing if it fails).
    Upto,
    /// x402's `batch-settlement`: a fixed amount per task, paid with a
    /// cumulative voucher on the payer's escrow channel, checked here with
    /// no transaction and claimed in batches later ([`super::batch`]).
    Batch,
}

/// How a task ended without a result: what [`Scheme::ended_without_work`]
/// decides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended<'a> {
    /// Failed with this error code.
    Failed(&'a str),
    /// Canceled; `before_run`: no worker had claimed it yet.
    Canceled { before_run: bool },
}

impl Scheme {
    /// Every scheme, in the order their end and sweep hooks run.
    pub const ALL: [Scheme; 3] = [Scheme::Exact, Scheme::Upto, Scheme::Batch];

    /// Its name in offers and payloads (`accepts[].scheme`).
    pub const fn name(self) -> &'static str {
        match self {
            Scheme::Exact => "exact",
            Scheme::Upto => "upto",
            Scheme::Batch => "batch-settlement",
        }
    }

    /// The scheme named `name`; `None`: not one Reeve takes.
    pub fn named(name: &str) -> Option<Scheme> {
        Scheme::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether a credit (left by a paid task that did no work) can pay for
    /// a task priced in this scheme: only a fixed price can be matched
    /// against one; a metered task is paid for what it uses.
    pub fn paid_by_credit(self) -> bool {
        match self {
            Scheme::Exact | Scheme::Batch => true,
            Scheme::Upto => false,
        }
    }

    /// Whether its payer signs the settling facilitator's address (the
    /// `upto` witness does): its offer then carries that address, and is
    /// not offered without it.
    pub fn names_facilitator(self) -> bool {
        match self {
            Scheme::Exact | Scheme::Batch => false,
            Scheme::Upto => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scheme_is_found_by_its_name_and_no_other_is() {
        for scheme in Scheme::ALL {
            assert_eq!(Scheme::named(scheme.name()), Some(scheme));
        }
        // The catalog's word for it, not the protocol's.
        assert_eq!(Scheme::named("batch"), None);
        assert_eq!(Scheme::named("Exact"), None);
    }
}
