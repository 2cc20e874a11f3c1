//! Pay-per-task with x402 v2: the challenge a priced task answers with, the
//! client's payment, the facilitator that verifies and settles it, the
//! chain that says what became of a settlement nobody heard back from, and
//! the ledger of attempts, payments and credits.
//!
//! Module map:
//! - [`scheme`]: the seam where schemes differ: [`Scheme`] (`exact`,
//!   `upto`, `batch-settlement`) and its hooks at create, before the run, at the end, when a
//!   task ends without its work, and in the sweep; [`pay`], the one call
//!   that pays for a request or refuses, picks the scheme there. The
//!   worker, the sweeper and the task transitions call those hooks, never
//!   a scheme's module.
//! - [`order`]: what paying for a request is made of ([`Order`], [`Bought`],
//!   [`PayError`]) and the steps every scheme takes alike (the attempt,
//!   `/verify` beside the chain's head, the answers to a payment sent
//!   again).
//! - [`checkout`]: `exact` at create: attempt, verify, settle, prove, store,
//!   in the order that keeps "no charge without a task, no task without a
//!   charge"; and a credit paying when no payment was sent.
//! - [`proof`]: what the chain must show before a payment counts: the
//!   transfer this authorization made, of exactly the amount, to `payTo`.
//! - [`reconcile`]: every sweep resolves unknown settlements from the chain.
//! - [`challenge`]: the `402` document (`PAYMENT-REQUIRED`), with the
//!   `payment-identifier` and `bazaar` extensions.
//! - [`payload`]: the payment (a `PAYMENT-SIGNATURE` header or an MCP
//!   call's document), decoded and matched against the kind's requirements.
//! - [`facilitator`]: `/verify` and `/settle` through the SSRF-guarded client.
//! - [`supported`]: which networks the facilitator settles (`/supported`),
//!   against the catalog's prices.
//! - [`chain`]: each network's JSON-RPC endpoint: blocks, logs, receipts.
//! - [`ledger`]: what Postgres keeps, a file per kind of record: attempts
//!   (recorded before settling), payments, credits, and metered holds.
//!
//! - [`offer_receipt`]: x402's `offer-receipt` extension: offers and
//!   receipts signed with the seller's key (JWS ES256K), and their check.
//! - [`counter`]: the [`Counter`] through which the caller stores a task.
//! - [`upto`]: metered prices (x402 `upto`): the contracts, the refusals,
//!   and a metered task's payment as its buyer sees it.
//! - [`authorize`]: `upto` at create: checked, verified, and its task
//!   stored authorized, nothing charged.
//! - [`run_check`]: before a metered task runs, the chain read once to see
//!   that its authorization can still be settled (approval, funds, nonce,
//!   deadline).
//! - [`capture`]: when a metered task ends, what it used settled and proven
//!   on chain, or its authorization released.
//! - [`capture_proof`]: what proves a capture paid (a settle of its own
//!   nonce and witness) or never to be paid (the nonce, past the deadline).
//! - [`batch`]: x402 `batch-settlement`, the seller's side: vouchers checked
//!   locally against each channel's running total, a deposit settled
//!   through the facilitator, and the task stored with its voucher.
//!
//! Nothing here names a task: the caller stores one through a [`Counter`].

#[cfg(feature = "api-tasks")]
pub(crate) mod authorize;
#[cfg(feature = "chain")]
pub mod batch;
#[cfg(all(feature = "chain", feature = "catalog"))]
pub(crate) mod capture;
#[cfg(feature = "chain")]
pub(crate) mod capture_proof;
#[cfg(feature = "chain")]
pub(crate) mod chain;
#[cfg(feature = "catalog")]
pub(crate) mod challenge;
#[cfg(feature = "api-tasks")]
pub(crate) mod checkout;
pub(crate) mod counter;
#[cfg(feature = "outbound")]
pub(crate) mod facilitator;
pub(crate) mod ledger;
#[cfg(feature = "receipts")]
pub mod offer_receipt;
#[cfg(feature = "api-tasks")]
pub(crate) mod order;
#[cfg(feature = "api-tasks")]
pub(crate) mod payload;
#[cfg(feature = "chain")]
pub(crate) mod proof;
#[cfg(feature = "chain")]
pub(crate) mod reconcile;
#[cfg(all(feature = "chain", feature = "catalog"))]
pub(crate) mod run_check;
pub(crate) mod scheme;
#[cfg(feature = "catalog")]
pub(crate) mod supported;
pub(crate) mod upto;

#[cfg(all(feature = "chain", feature = "catalog"))]
pub use capture::{Authorization as MeteredAuthorization, Captured, Capturer, Hold, RESOLVE_MARGIN};
#[cfg(feature = "chain")]
pub use chain::{CHAIN_CONFIRMATIONS, CHAIN_RPC_URLS, Chains};
#[cfg(feature = "catalog")]
pub use challenge::{
    PAYMENT_REQUIRED_HEADER, PAYMENT_RESPONSE_HEADER, PAYMENT_SIGNATURE_HEADER, PaymentRequired, PaymentRequirements,
    SIGNATURE_REQUIRED, payment_required,
};
#[cfg(feature = "api-tasks")]
pub use checkout::held_key;
pub use counter::{Counter, Metering, Note};
#[cfg(feature = "outbound")]
pub use facilitator::{Facilitator, FacilitatorError};
pub use ledger::{CREDITED_CODES, Credit, Held, HeldReport, PaymentRecord, credit_if_owed, receipt, spend_on_rerun};
#[cfg(feature = "api-tasks")]
pub use order::{Bought, CLOCK_SKEW, Checkout, Order, PayError, RETRY_AFTER, STORE_MARGIN, bought_before};
#[cfg(feature = "api-tasks")]
pub use payload::{
    Accepted, Authorization, ExactPayload, PaymentInput, PaymentPayload, Permit2Authorization, SchemePayload,
    TokenPermissions, UptoPayload, UptoWitness,
};
#[cfg(feature = "chain")]
pub use reconcile::{Reconciled, reconcile};
#[cfg(all(feature = "chain", feature = "catalog"))]
pub use run_check::{RunCheck, check_before_run, read_once as read_run_check};
#[cfg(feature = "api-tasks")]
pub use scheme::pay;
#[cfg(all(feature = "chain", feature = "catalog"))]
pub use scheme::sweep;
pub use scheme::{Ended, Scheme, ended_without_work};
#[cfg(feature = "catalog")]
pub use supported::{SupportedKind, settleable, settles, unsupported_prices};
pub use upto::{
    AUTHORIZATION_EXPIRED, AUTHORIZATION_SPENT, INSUFFICIENT_FUNDS, MeteredPayment, MeteredStatus,
    PAYMENT_NOT_CAPTURED, PAYMENT_REVOKED, UptoRefusal,
};

use base64::Engine;
use serde::{Deserialize, Serialize};

/// Seconds since the Unix epoch, by this machine's clock: what a signed
/// `validBefore` or `deadline` is compared with.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// The `PAYMENT-RESPONSE` header: base64 JSON of the settlement, as x402
/// clients read it. Sent with a paid `202`, and with `success: false` and
/// the facilitator's reason when a settle was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentResponse {
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    /// The settlement's transaction hash (proven on chain); empty for a
    /// refusal.
    #[serde(default)]
    pub transaction: String,
    pub network: String,
    #[serde(default)]
    pub payer: String,
    /// `offer-receipt`: the seller's signed receipt
    /// (`extensions["offer-receipt"].info.receipt`), where receipts are
    /// signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<serde_json::Map<String, serde_json::Value>>,
    /// `batch-settlement` only: what this payment charged (`chargedAmount`)
    /// and the payer's channel after it (`channelState`), from which
    /// `@x402/evm`'s client counts its next voucher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
}

impl PaymentResponse {
    /// A settlement that went through (`transaction` unknown when an
    /// earlier call's answer was lost).
    pub fn settled(transaction: Option<&str>, network: &str, payer: &str) -> Self {
        PaymentResponse {
            success: true,
            error_reason: None,
            transaction: transaction.unwrap_or_default().to_owned(),
            network: network.to_owned(),
            payer: payer.to_owned(),
            extensions: None,
            extra: None,
        }
    }

    /// A settle the facilitator refused: nothing was charged.
    pub fn refused(reason: &str, network: &str, payer: &str) -> Self {
        PaymentResponse {
            success: false,
            error_reason: Some(reason.to_owned()),
            transaction: String::new(),
            network: network.to_owned(),
            payer: payer.to_owned(),
            extensions: None,
            extra: None,
        }
    }

    /// Whether it answers a `batch-settlement` voucher (its `extra` carries
    /// the channel): such a task's receipt is not signed yet.
    pub fn is_voucher(&self) -> bool {
        self.extra.as_ref().is_some_and(|extra| extra.get("channelState").is_some())
    }

    pub fn header_value(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(self).expect("plain strings"))
    }

    /// Decodes a `PAYMENT-RESPONSE` header value.
    pub fn from_header(value: &str) -> Option<Self> {
        let bytes = base64::engine::general_purpose::STANDARD.decode(value.trim()).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}
