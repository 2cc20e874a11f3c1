//! Metered prices on x402's `upto` scheme: what is common to authorizing at
//! create ([`super::authorize`]) and settling when the task ends
//! ([`super::capture`]): the contracts, the refusals, and the task's
//! `payment` as its buyer sees it.
//!
//! The payer signs a Permit2 `PermitWitnessTransferFrom` of a ceiling to
//! x402's upto proxy, witnessing `payTo` and the one facilitator that may
//! settle it. Nothing moves at create. When the task ends the worker
//! settles what it used (capped at the ceiling) through the facilitator's
//! `/settle`, with the amount as `paymentRequirements.amount`; a task that
//! failed, was canceled or used nothing settles nothing, and its
//! authorization is recorded as released.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Permit2, at its canonical address on every chain.
pub const PERMIT2: &str = "0x000000000022D473030F116dDEE9F6B43aC78BA3";
/// x402's upto proxy (`x402UptoPermit2ProxyAddress` in `@x402/evm`): the
/// spender every upto authorization names.
pub const UPTO_PROXY: &str = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002";

/// A metered task that could not be started in time to settle what it would
/// use: nothing was charged.
pub const AUTHORIZATION_EXPIRED: &str = "authorization_expired";
/// A metered task not started because its payer withdrew the authorization
/// after create (revoked Permit2's approval, or used or invalidated the
/// Permit2 nonce): nothing ran, nothing was charged.
pub const PAYMENT_REVOKED: &str = "payment_revoked";
/// A metered task not started because its payer's balance no longer covers
/// the ceiling it authorized: nothing ran, nothing was charged.
pub const INSUFFICIENT_FUNDS: &str = "insufficient_funds";
/// The payer refused the capture of what its task used (revoked Permit2's
/// approval, or moved its funds): nothing was charged, and the task's
/// output was deleted.
pub const PAYMENT_NOT_CAPTURED: &str = "payment_not_captured";
/// Why a capture charged nothing: the payer used the authorization's
/// Permit2 nonce itself (invalidated it, or spent it on a transfer of its
/// own), so the signature can never settle.
pub const AUTHORIZATION_SPENT: &str = "authorization_spent";

/// Why a metered payment was refused before anything was stored: each its
/// own code, and a message that says what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UptoRefusal {
    /// The payer has not approved Permit2 for the token.
    Permit2ApprovalRequired,
    /// The signed ceiling is below the requirement's amount.
    CeilingTooLow,
    /// The signed deadline leaves too little time to queue, run and settle.
    DeadlineTooShort,
    /// The authorization's spender is not x402's upto proxy.
    WrongSpender,
    /// The witness names another facilitator than the one that settles.
    WrongFacilitator,
    /// The witness pays someone other than `payTo`.
    WrongPayTo,
}

impl UptoRefusal {
    pub const ALL: [UptoRefusal; 6] = [
        UptoRefusal::Permit2ApprovalRequired,
        UptoRefusal::CeilingTooLow,
        UptoRefusal::DeadlineTooShort,
        UptoRefusal::WrongSpender,
        UptoRefusal::WrongFacilitator,
        UptoRefusal::WrongPayTo,
    ];

    pub fn code(self) -> &'static str {
        match self {
            UptoRefusal::Permit2ApprovalRequired => "permit2_approval_required",
            UptoRefusal::CeilingTooLow => "ceiling_too_low",
            UptoRefusal::DeadlineTooShort => "deadline_too_short",
            UptoRefusal::WrongSpender => "wrong_spender",
            UptoRefusal::WrongFacilitator => "wrong_facilitator",
            UptoRefusal::WrongPayTo => "wrong_pay_to",
        }
    }

    /// What to do about it; `detail` is this payment's numbers.
    pub fn message(self, detail: &str) -> String {
        let what = match self {
            UptoRefusal::Permit2ApprovalRequired => format!(
                "the payer has not approved Permit2 ({PERMIT2}) to spend this token: send approve(Permit2, max) \
                 from the payer once, or sign the EIP-2612 permit the 402 offers (eip2612GasSponsoring) and pay \
                 no gas"
            ),
            UptoRefusal::CeilingTooLow => {
                "the signed ceiling (permitted.amount) is below the requirement's amount; sign the amount offered"
                    .into()
            }
            UptoRefusal::DeadlineTooShort => "the signed deadline leaves too little time to queue the task, run it \
                                              and settle what it used; sign deadline = now + maxTimeoutSeconds"
                .into(),
            UptoRefusal::WrongSpender => format!("the authorization's spender must be x402's upto proxy {UPTO_PROXY}"),
            UptoRefusal::WrongFacilitator => "the witness names another facilitator; name the requirement's \
                                              extra.facilitatorAddress, the only one that settles here"
                .into(),
            UptoRefusal::WrongPayTo => "the witness's `to` must be the requirement's payTo".into(),
        };
        let detail = if detail.is_empty() { String::new() } else { format!(" ({detail})") };
        format!("{what}{detail}. Nothing was charged and no task was created")
    }
}

/// Where a metered payment is, as its buyer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MeteredStatus {
    /// Signed up to `authorized`; nothing charged yet.
    Authorized,
    /// What the task used is being settled.
    Capturing,
    /// `charged` was settled, in `transaction`.
    Charged,
    /// Nothing was charged, nor ever will be (failed, canceled, nothing
    /// used).
    Released,
    /// The payer refused the capture; nothing was charged, the output was
    /// deleted.
    NotCaptured,
}

/// A metered task's payment: `GET /v1/tasks/{id}`, the task list, MCP and
/// the console show it as is, and a metered task's final status event
/// carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = MeteredPayment)]
pub struct MeteredPayment {
    /// Always `upto`.
    pub scheme: String,
    pub status: MeteredStatus,
    /// CAIP-2.
    pub network: String,
    /// The token contract.
    pub asset: String,
    pub payer: String,
    /// The ceiling the payer signed, atomic units (decimal string).
    pub authorized: String,
    /// What the price counts (`byte`, `KiB`, `MiB`, `GiB`, `second`).
    pub unit: String,
    /// Atomic units per `unit`.
    pub rate: String,
    /// What the task used, in bytes (or, for `second`, milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<u64>,
    /// What was (or is being) settled, atomic units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charged: Option<String>,
    /// The settlement's transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction: Option<String>,
    /// Why nothing was charged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl MeteredPayment {
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("strings and numbers serialise")
    }
}
