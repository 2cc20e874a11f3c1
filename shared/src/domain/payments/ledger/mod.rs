//! What Reeve remembers about payments, in Postgres, one room per kind of
//! record:
//! - [`attempts`]: every attempt, recorded before the facilitator settles
//!   it, and its moves (claimed, failed, released for the reconciler);
//! - [`payments`]: every settled payment, with the one task it bought;
//! - [`credits`]: what paid tasks leave when they end without doing their
//!   work, and their spending;
//! - [`holds`]: a metered (`upto`) authorization from create to capture,
//!   with the run it holds.
//!
//! Everything is re-exported here, so callers name `ledger::…` and need not
//! know which room keeps it.

/// The columns a [`Credit`] is read from, as a literal for `concat!` (sqlx
/// takes only `'static` SQL): credits are read by [`credits`] and, for a
/// space's listing, by [`payments`].
macro_rules! credit_columns {
    () => {
        "id, network, asset, amount, source_task, reason, spent_by, created_at"
    };
}

mod attempts;
mod credits;
mod holds;
mod payments;

pub use attempts::*;
pub use credits::*;
pub use holds::*;
pub use payments::*;
