//! x402's `batch-settlement` scheme, the seller's side (issue 42): a buyer
//! deposits once into the escrow (a channel), then pays each task with a
//! signed cumulative voucher that Reeve checks itself, in milliseconds and
//! with no transaction, and Reeve claims many vouchers in one transaction
//! later.
//!
//! Built so far: the voucher and its signer ([`voucher`]), each channel's
//! running total in Postgres with the decision taken on every voucher
//! ([`channel`]), the escrow's state of a channel read from the chain
//! ([`escrow`]), what a payment's payload carries ([`payload`]), the `402`
//! that answers a refused voucher ([`resync`]), and the offer
//! (`Scheme::Batch`, priced `scheme = "batch"` in the catalog). Not yet:
//! paying at create (the payload decoded beside `exact`'s and `upto`'s,
//! a voucher decided in the transaction that stores its task, deposits
//! through the facilitator), claims and settlement in the sweep, refunds.

pub mod channel;
pub mod escrow;
pub mod payload;
#[cfg(feature = "catalog")]
pub mod resync;
pub mod voucher;

pub use channel::{
    ChannelState, DecideError, Decision, OnChain, Refusal, Terms, VoucherIn, decide, last_voucher, record,
};
pub use escrow::read;
pub use payload::{BatchPayload, Deposit};
#[cfg(feature = "catalog")]
pub use resync::resynchronising;
pub use voucher::{ChannelConfig, ESCROW, SignatureError, check_signature};
