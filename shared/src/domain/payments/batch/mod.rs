//! x402's `batch-settlement` scheme, the seller's side (issue 42): a buyer
//! deposits once into the escrow (a channel), then pays each task with a
//! signed cumulative voucher that Reeve checks itself, in milliseconds and
//! with no transaction, and Reeve claims many vouchers in one transaction
//! later.
//!
//! Here: the voucher and its signer ([`voucher`]), each channel's running
//! total in Postgres with the decision taken on every voucher
//! ([`channel`]), the escrow's state of a channel read from the chain
//! ([`escrow`]), what a payment's payload carries ([`payload`]), the `402`
//! that answers a refused voucher ([`resync`]), and paying at create
//! ([`pay`]: a deposit settled through the facilitator, the voucher decided
//! in the transaction that stores its task). The offer is `Scheme::Batch`,
//! priced `scheme = "batch"` in the catalog. The sweep claims what the
//! vouchers bought and has it paid to `payTo` ([`claim`]) where the sweeper
//! is given the receiver authorizer's key. A payer asks for the rest of its
//! channel back by a cooperative refund ([`refund`]): Reeve claims what the
//! channel was charged and returns the rest in one transaction, signed by
//! the same key.

pub mod channel;
#[cfg(feature = "catalog")]
pub mod claim;
pub mod escrow;
#[cfg(feature = "api-tasks")]
pub(crate) mod pay;
pub mod payload;
#[cfg(feature = "api-tasks")]
pub mod refund;
#[cfg(feature = "catalog")]
pub mod resync;
pub mod voucher;

pub use channel::{
    ChannelState, DecideError, Decision, OnChain, Purchase, Refusal, Terms, VoucherIn, decide, last_voucher, record,
};
pub use escrow::read;
pub use payload::{BatchPayload, Deposit, RefundAsk};
#[cfg(feature = "catalog")]
pub use resync::resynchronising;
pub use voucher::{ChannelConfig, ESCROW, SignatureError, check_signature};
