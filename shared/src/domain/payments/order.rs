//! What paying for one request is made of, whichever scheme pays it: the
//! [`Order`] and the [`Checkout`] it is paid through, what it [`Bought`],
//! why nothing was ([`PayError`]), and the answers both schemes give alike
//! (a task bought before, a key another attempt holds, a window too long).
//! [`super::checkout`] pays `exact`, [`super::authorize`] authorizes
//! `upto`.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::challenge::{PaymentRequired, PaymentRequirements};
use super::counter::Counter;
use super::facilitator::Facilitator;
use super::ledger::{self, Attempt, AttemptStatus, Credit, NewAttempt};
use super::payload::{Payment, PaymentInput};
use super::upto::UptoRefusal;
use super::{PaymentResponse, batch, chain};
use crate::domain::ids::Id;
use crate::domain::request::TaskRequest;

/// How long a client is asked to wait before it sends a pending payment
/// again: about the time a settlement takes to be mined and seen.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// What a payment is checked against and settled with.
#[derive(Clone, Copy)]
pub struct Checkout<'a> {
    pub db: &'a PgPool,
    /// `None` when the deployment has no usable facilitator: a payment is
    /// then refused before anything is charged.
    pub facilitator: Option<&'a Facilitator>,
    /// Each network's JSON-RPC endpoint, to learn from the chain what an
    /// unknown settlement became.
    pub chains: &'a chain::Chains,
}

/// One request to pay for: the request, how the client paid (if it did),
/// and when the answer is due.
#[derive(Debug, Clone, Copy)]
pub struct Order<'a> {
    pub request: TaskRequest<'a>,
    /// `None`: no payment was sent; a credit of the space may pay, or the
    /// answer is the challenge.
    pub payment: Option<PaymentInput<'a>>,
    /// When the caller must have answered (a Lambda invocation's deadline).
    /// The facilitator calls stop [`STORE_MARGIN`] before it; a settle cut
    /// off there is an unknown outcome, left to the reconciler.
    pub deadline: Option<Instant>,
}

/// Kept free before the deadline for storing the task and queueing it.
pub const STORE_MARGIN: Duration = Duration::from_secs(4);
/// A facilitator call is not started with less time than this left: it
/// could not finish, and a settle that cannot finish only makes an unknown
/// outcome out of a payment that was never sent.
pub(super) const MIN_CALL: Duration = Duration::from_secs(2);
/// How far a payer's clock may run ahead of ours: a `validBefore` up to
/// `maxTimeoutSeconds` plus this from now is taken.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);
/// Without a deadline (`reeve serve`), how long a paid create waits for the
/// chain to show a settlement the facilitator reported.
pub(super) const CONFIRM_WAIT: Duration = Duration::from_secs(10);
/// How often the chain is read again for a reported settlement it does not
/// show yet (its endpoint may be a block behind the facilitator's).
pub(super) const CONFIRM_POLL: Duration = Duration::from_millis(500);

/// What the request bought.
#[derive(Debug)]
pub enum Bought<T> {
    /// Settled now: the task, and the `PAYMENT-RESPONSE` to send.
    Settled { task: T, settlement: PaymentResponse },
    /// Paid with this credit.
    Credit { task: T, credit: Credit },
    /// A metered task (`upto`): authorized up to its ceiling, nothing
    /// charged until it ends.
    Authorized { task: T },
    /// This very request was paid for before: the same payment sent again by
    /// the same Space for the same request (a client whose answer was lost,
    /// or that was told its payment was pending), or the same
    /// `Idempotency-Key`. The task it bought, answered again with the
    /// receipt stored when it was paid (`None` for a task paid otherwise),
    /// never a second charge nor an error that makes a client sign again.
    Before { task: Id, receipt: Option<PaymentResponse> },
    /// No payment, and the `Idempotency-Key` was taken meanwhile by another
    /// task: the caller answers that one (or a conflict).
    KeyTaken,
}

/// Why nothing was bought. Each says whether anything was charged.
#[derive(Debug, thiserror::Error)]
pub enum PayError {
    /// No payment and no credit: the challenge.
    #[error("payment required")]
    Required(Box<PaymentRequired>),
    /// Not an x402 v2 exact payment at all.
    #[error("invalid payment: {0}")]
    Malformed(String),
    /// `accepted` is none of this kind's requirements.
    #[error("payment does not match")]
    Mismatch(Box<PaymentRequired>),
    /// This authorization already paid for a task, or is another request's.
    #[error("payment replayed")]
    Replayed(Box<PaymentRequired>),
    /// Refused before anything was settled (the facilitator's `/verify`,
    /// or a `validBefore` too far away); nothing was charged.
    #[error("payment invalid: {reason}")]
    Invalid { challenge: Box<PaymentRequired>, reason: String },
    /// A metered payment whose signed terms cannot be settled here (see
    /// [`UptoRefusal`]); nothing was charged or stored.
    #[error("payment refused: {}", refusal.code())]
    Refused { challenge: Box<PaymentRequired>, refusal: UptoRefusal, detail: String },
    /// The facilitator's `/settle` refused it; nothing was charged. The
    /// settlement (`success: false`) goes back in `PAYMENT-RESPONSE`.
    #[error("payment failed: {reason}")]
    Failed { challenge: Box<PaymentRequired>, reason: String, settlement: Box<PaymentResponse> },
    /// No transfer of this payment to `payTo` is on chain, and none can come
    /// any more: its authorization expired unused, or its nonce was spent by
    /// a transaction that paid nothing. Nothing was received or written.
    #[error("payment not settled")]
    NotSettled(Box<PaymentRequired>),
    /// The chain may still charge this payment (or this key's): the
    /// outcome is being resolved. Send the same request again after
    /// `retry_after`; never sign a new payment for it meanwhile.
    #[error("payment pending")]
    Pending { retry_after: Duration },
    /// Another request is settling this very payment right now.
    #[error("payment in progress")]
    InProgress,
    /// Another request with this `Idempotency-Key` is being paid right now.
    #[error("request in progress")]
    RequestInProgress,
    /// A `payment-identifier` id used before with another payment or request.
    #[error("payment identifier reused")]
    IdentifierConflict,
    /// The `Idempotency-Key` was paid for with another request.
    #[error("idempotency key already used for a different request")]
    IdempotencyConflict,
    /// A `batch-settlement` voucher that buys nothing (see
    /// [`batch::Refusal`]; never [`batch::Refusal::Unread`]): nothing was
    /// charged. The challenge tells the buyer where its channel stands.
    #[error("voucher refused: {refusal}")]
    Voucher { challenge: Box<PaymentRequired>, refusal: Box<batch::Refusal> },
    /// The facilitator could not be asked, or not in time; nothing was
    /// charged.
    #[error("facilitator unavailable")]
    FacilitatorUnavailable,
    /// The payment's network could not be read (a `batch-settlement`
    /// channel's balance); nothing was charged.
    #[error("chain unavailable")]
    ChainUnavailable,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

// The challenges are boxed: they are large, and every result carries them.
pub(super) fn with_error(challenge: &PaymentRequired, code: &str) -> Box<PaymentRequired> {
    Box::new(PaymentRequired { error: code.to_owned(), ..challenge.clone() })
}

pub(super) fn not_settled(challenge: &PaymentRequired) -> PayError {
    PayError::NotSettled(with_error(challenge, "payment_not_settled"))
}

pub(super) fn replayed(challenge: &PaymentRequired) -> PayError {
    PayError::Replayed(with_error(challenge, "payment_replayed"))
}

pub(super) const PENDING: PayError = PayError::Pending { retry_after: RETRY_AFTER };

/// The answer to a request whose `Idempotency-Key` an attempt holds.
pub(super) async fn key_holder<T>(
    db: &PgPool,
    holder: &Attempt,
    request_hash: &[u8; 32],
) -> Result<Bought<T>, PayError> {
    if holder.request_hash != request_hash {
        return Err(PayError::IdempotencyConflict);
    }
    match (holder.status, holder.task_id) {
        // Paid, or (metered) authorized with its task.
        (_, Some(task)) => bought_before(db, task).await,
        // Paid, and credited because its task could not be made.
        (AttemptStatus::Settled, None) => Err(PayError::IdempotencyConflict),
        _ if holder.claimed => Err(PayError::RequestInProgress),
        _ => Err(PENDING),
    }
}

/// Refuses an authorization valid for longer than the requirement allows,
/// before anything is recorded: an attempt stays open (holding its key,
/// costing chain reads) until its `validBefore`, so that is kept to
/// minutes. Standard clients sign `now + maxTimeoutSeconds`.
pub(super) fn check_window(
    payment: &Payment,
    offer: &PaymentRequirements,
    challenge: &PaymentRequired,
) -> Result<(), PayError> {
    let now = super::unix_now();
    let allowed = u64::from(offer.max_timeout_seconds) + CLOCK_SKEW.as_secs();
    // Too long for a u64 is too far away in any case.
    let away = payment.valid_before.parse::<u64>().map_or(u64::MAX, |before| before.saturating_sub(now));
    if away <= allowed {
        return Ok(());
    }
    let max = offer.max_timeout_seconds;
    Err(PayError::Invalid {
        challenge: with_error(challenge, "payment_invalid"),
        reason: format!(
            "valid_before_too_far: the authorization's validBefore is {} s from now, and at most maxTimeoutSeconds \
             ({max} s) is accepted; sign it again with validBefore at most {max} s ahead",
            if away == u64::MAX { "more than 10^19".to_owned() } else { away.to_string() },
        ),
    })
}

/// What a payment already bought: task `task`, with the receipt stored when
/// it was paid. The one answer to a payment (or an `Idempotency-Key`) sent
/// again after it bought its task, on REST and MCP alike.
pub async fn bought_before<T>(db: &PgPool, task: Id) -> Result<Bought<T>, PayError> {
    Ok(Bought::Before { task, receipt: ledger::receipt(db, task).await? })
}

/// What is left of `deadline` for a facilitator call, after the margin;
/// `None` without a deadline. `Err`: too little to start one.
pub(super) fn budget(deadline: Option<Instant>) -> Result<Option<Duration>, ()> {
    let Some(deadline) = deadline else { return Ok(None) };
    let left = deadline.saturating_duration_since(Instant::now()).saturating_sub(STORE_MARGIN);
    if left < MIN_CALL { Err(()) } else { Ok(Some(left)) }
}

/// `/verify` of `payment` for `offer`, under the claimed `attempt`, with
/// the chain's head read beside it and recorded as the block where the
/// search for the payment's transaction starts (before anything is
/// settled). `Ok`: valid, with that block if the chain could be read.
/// Otherwise the attempt is failed, since `/verify` moves no money: too
/// little time left to ask (`facilitator_unavailable`), refused
/// ([`PayError::Invalid`], with the facilitator's reason), or unanswered.
pub(super) async fn verify_beside_head(
    cx: Checkout<'_>,
    facilitator: &Facilitator,
    attempt: Id,
    (payment, offer): (&Payment, &PaymentRequirements),
    challenge: &PaymentRequired,
    deadline: Option<Instant>,
) -> Result<Option<u64>, PayError> {
    let db = cx.db;
    let Ok(budget) = budget(deadline) else {
        ledger::fail_attempt(db, attempt, "deadline").await?;
        return Err(PayError::FacilitatorUnavailable);
    };
    let head = async {
        let chain = cx.chains.get(&offer.network).ok()?;
        chain.head().await.inspect_err(|e| tracing::warn!(error = %e, "cannot read the chain's head")).ok()
    };
    let (verified, head) = tokio::join!(facilitator.verify(&payment.document, offer, budget), head);
    if let Some(head) = &head {
        ledger::set_from_block(db, attempt, head.number).await?;
    }
    match verified {
        Ok(v) if v.is_valid => Ok(head.map(|head| head.number)),
        Ok(v) => {
            let reason = v.invalid_reason.unwrap_or_else(|| "invalid_payment".into());
            tracing::info!(%reason, scheme = %offer.scheme, message = ?v.invalid_message, "facilitator: payment invalid");
            ledger::fail_attempt(db, attempt, &reason).await?;
            Err(PayError::Invalid { challenge: with_error(challenge, "payment_invalid"), reason })
        }
        Err(e) => {
            tracing::error!(error = %e, "facilitator /verify failed");
            ledger::fail_attempt(db, attempt, "facilitator_unavailable").await?;
            Err(PayError::FacilitatorUnavailable)
        }
    }
}

/// What recording a payment's attempt came to.
pub(super) enum Recorded {
    /// Recorded, and claimed by this request.
    New(Id),
    /// It collides with an earlier attempt (the same authorization, an open
    /// attempt with the same `Idempotency-Key`, or the same
    /// `payment-identifier` id).
    Collided,
    /// A task holds the request's `Idempotency-Key` already (a free or
    /// credit-paid one): nothing was recorded, and the caller answers that
    /// task, or a conflict.
    KeyTaken,
}

/// Records `payment`'s attempt for `offer` and the request it pays for,
/// under the request's key lock ([`ledger::lock_key`]), before the
/// facilitator is asked anything. `upto_document`: a metered payment's
/// signed document, which the worker settles with later. `resource`: what
/// it pays for (the challenge's `resource.url`), which its receipt names.
pub(super) async fn record_attempt<C: Counter>(
    db: &PgPool,
    request: &TaskRequest<'_>,
    request_hash: &[u8; 32],
    (payment, offer): (&Payment, &PaymentRequirements),
    upto_document: Option<&serde_json::Value>,
    resource: &str,
    counter: &C,
) -> Result<Recorded, sqlx::Error> {
    let new = NewAttempt {
        network: &offer.network,
        payer: &payment.payer,
        nonce: &payment.nonce,
        payload_hash: &payment.hash,
        space: request.space,
        kind: request.kind,
        input: request.input,
        idempotency_key: request.idempotency_key,
        request_hash,
        payment_id: payment.payment_id.as_deref(),
        asset: &offer.asset,
        amount: &offer.amount,
        pay_to: &offer.pay_to,
        valid_before: &payment.valid_before,
        upto_document,
        resource,
    };
    let mut tx = db.begin().await?;
    if let Some(key) = request.idempotency_key {
        ledger::lock_key(&mut tx, request.space, key).await?;
        if counter.key_taken(&mut tx, request.space, key).await? {
            tx.rollback().await?;
            return Ok(Recorded::KeyTaken);
        }
    }
    let inserted = ledger::insert_attempt(&mut tx, &new).await?;
    tx.commit().await?;
    Ok(inserted.map_or(Recorded::Collided, Recorded::New))
}
