//! Pay-per-task with x402 v2: the challenge a priced task answers with, the
//! client's payment, the facilitator that verifies and settles it, and the
//! ledger of attempts, payments and credits.
//!
//! Module map:
//! - [`challenge`]: the `402` document (`PAYMENT-REQUIRED`), with the
//!   `payment-identifier` and `bazaar` extensions.
//! - [`payload`]: the `PAYMENT-SIGNATURE` header, decoded and matched
//!   against the kind's requirements.
//! - [`facilitator`]: `/verify` and `/settle` through the SSRF-guarded client.
//! - [`supported`]: which networks the facilitator settles (`/supported`),
//!   against the catalog's prices.
//! - [`ledger`]: attempts (recorded before settling), payments, credits.
//!
//! The order that keeps "no charge without a task, no task without a
//! charge" lives in [`crate::tasks::submit`].

#[cfg(feature = "catalog")]
pub(crate) mod challenge;
#[cfg(feature = "outbound")]
pub(crate) mod facilitator;
pub(crate) mod ledger;
#[cfg(feature = "api-tasks")]
pub(crate) mod payload;
pub(crate) mod supported;

#[cfg(feature = "catalog")]
pub use challenge::{
    PAYMENT_REQUIRED_HEADER, PAYMENT_RESPONSE_HEADER, PAYMENT_SIGNATURE_HEADER, PaymentRequired, PaymentRequirements,
    SIGNATURE_REQUIRED, payment_required,
};
#[cfg(feature = "outbound")]
pub use facilitator::{Facilitator, FacilitatorError};
pub use ledger::{Credit, PaymentRecord, credit_if_owed};
pub use supported::{SupportedKind, settleable, settles, unsupported_prices};

use base64::Engine;
use serde::Serialize;

/// The `PAYMENT-RESPONSE` header of a paid `202`: base64 JSON of the
/// settlement, as x402 clients read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaymentResponse {
    pub success: bool,
    pub transaction: String,
    pub network: String,
    pub payer: String,
}

impl PaymentResponse {
    pub fn header_value(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(self).expect("plain strings"))
    }
}
