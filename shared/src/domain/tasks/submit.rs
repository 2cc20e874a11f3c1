//! Creating a task, end to end: the one domain call behind
//! `POST /v1/tasks/{kind}` (and the MCP tool that creates tasks), so the
//! Lambda, `reeve serve`, MCP and the tests run the same steps.
//!
//! In order, stopping at the first failure:
//! 1. the kind exists, and the input is an object every string of which the
//!    database can hold (no NUL) and that matches its schema;
//! 2. an `Idempotency-Key` used before answers its task again (a task still
//!    `queued` has its message re-sent, as that message may have been lost);
//! 3. every upload the input names is this space's and has arrived (for a
//!    priced task, its object is still in storage: a HEAD, before any
//!    payment);
//! 4. a priced task is paid, or refused: [`payments::pay`] owns that whole
//!    order (attempt, verify, settle, prove, credit) and stores the task
//!    through [`Shelf`](super::Shelf) inside the payment's transaction;
//! 5. a free task is stored, within its space's quota ([`super::quota`]:
//!    refused with nothing stored, and never anything to charge), and the
//!    task is queued; under a key a payment holds, that payment answers.

use std::collections::HashSet;

use serde_json::Value;
use sqlx::PgPool;
use tokio::time::Instant;

use super::input::{self, MAX_UPLOADS};
use super::{Shelf, Task, TaskRequest, TaskStatus, find_by_idempotency_key};
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::{Catalog, TaskSpec};
use crate::domain::payments::offer_receipt::{self, SellerKey};
use crate::domain::payments::{
    self, Bought, Checkout, Credit, Order, PayError, PaymentInput, PaymentRequired, PaymentResponse, SIGNATURE_REQUIRED,
};
use crate::domain::uploads::{self, UploadError};

/// What [`submit`] needs from the process.
pub struct SubmitContext<'a> {
    pub catalog: &'a Catalog,
    pub db: &'a PgPool,
    pub s3: &'a crate::infra::s3_objects::S3Objects,
    pub bucket: &'a str,
    pub sqs: &'a aws_sdk_sqs::Client,
    pub queue_url: &'a str,
    /// `None` when the deployment has no usable facilitator.
    pub facilitator: Option<&'a payments::Facilitator>,
    /// Each network's JSON-RPC endpoint (`REEVE_CHAIN_RPC_URLS`).
    pub chains: &'a payments::Chains,
    /// The seller's key: a `402`'s offers and a paid task's receipt are
    /// signed with it. `None`: the deployment signs neither.
    pub seller: Option<&'a SellerKey>,
}

/// One create request, as the HTTP layer (or an MCP tool call) extracted it.
#[derive(Debug, Clone, Copy)]
pub struct Submission<'a> {
    pub request: TaskRequest<'a>,
    /// The payment as sent: a `PAYMENT-SIGNATURE` header, or the decoded
    /// document of an MCP call's `_meta`.
    pub payment: Option<PaymentInput<'a>>,
    /// The URL the client posted to, for the challenge's `resource`.
    pub resource_url: &'a str,
    /// When the answer is due (a Lambda invocation's deadline): the
    /// facilitator calls end before it, and a settle cut off there is an
    /// unknown outcome that the reconciler resolves.
    pub deadline: Option<Instant>,
}

/// A Lambda invocation's deadline (wall-clock time, from its context) on
/// tokio's clock, for [`Submission::deadline`]: REST and MCP creates alike.
pub fn deadline_of(invocation: &lambda_http::Context) -> Instant {
    let left = invocation.deadline().duration_since(std::time::SystemTime::now()).unwrap_or_default();
    Instant::now() + left
}

#[derive(Debug)]
pub struct Submitted {
    pub task: Task,
    /// An earlier request's task, answered again.
    pub replayed: bool,
    pub paid: Paid,
}

#[derive(Debug)]
pub enum Paid {
    /// A free task, or a replay of one that was not paid with a payment.
    Nothing,
    /// The `PAYMENT-RESPONSE` to send: settled now, or, for a replay, the
    /// receipt stored when its task was paid.
    Payment(PaymentResponse),
    /// Paid with this credit.
    Credit(Credit),
    /// A metered task, authorized up to its ceiling (the task's `payment`
    /// says so): nothing charged until it ends.
    Authorized,
}

/// Why a task was not created. Its code, kind and message are in the one
/// vocabulary of refusals (`domain/error.rs`).
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("unknown task kind")]
    UnknownTask(String),
    #[error("input is not an object")]
    InputNotObject,
    /// A string the database cannot store (a NUL), at this JSON pointer.
    #[error("input holds a NUL character")]
    InputNul(String),
    #[error("input does not match the schema")]
    InvalidInput(String),
    #[error("idempotency key already used for a different request")]
    IdempotencyConflict,
    #[error("{}: {message}", problem.code())]
    Upload { problem: UploadProblem, message: String },
    #[error("object storage unavailable")]
    StorageUnavailable,
    /// Not paid: the challenge, a refusal, or a payment still pending.
    #[error(transparent)]
    Payment(PayError),
    /// Stored, but SQS refused the message: the task is `failed` (and, if
    /// paid, credited).
    #[error("queue unavailable")]
    QueueUnavailable,
    /// A free task over its space's quota (`[tasks.<kind>.quota]`).
    #[error("quota exceeded: {0}")]
    QuotaExceeded(#[from] super::quota::QuotaExceeded),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("internal: {0}")]
    Internal(String),
}

/// What is wrong with an upload the input names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadProblem {
    /// Unknown, another Space's, or not an upload id.
    Unknown,
    /// Declared, but its file has not arrived.
    NotReady,
    /// Arrived once, and gone from storage since.
    Missing,
    /// Its file did not match its declared size or type.
    Rejected,
}

impl From<PayError> for SubmitError {
    fn from(e: PayError) -> Self {
        match e {
            PayError::Db(e) => SubmitError::Db(e),
            PayError::IdempotencyConflict => SubmitError::IdempotencyConflict,
            other => SubmitError::Payment(other),
        }
    }
}

/// Creates (or answers again) a task. See the module documentation. Where
/// the seller signs, a paid task's settlement carries its signed receipt.
pub async fn submit(cx: &SubmitContext<'_>, s: Submission<'_>) -> Result<Submitted, SubmitError> {
    let mut submitted = submit_unsigned(cx, s).await?;
    // A voucher's task has no signed receipt yet (its payment is a line of
    // the channel, not a settlement of its own).
    if let (Some(key), Paid::Payment(settlement)) = (cx.seller, &mut submitted.paid)
        && settlement.success
        && !settlement.is_voucher()
    {
        let space = s.request.space;
        match super::signed_receipt(cx.db, Some(key), space, submitted.task.id, &|_| s.resource_url.to_owned()).await {
            Ok(Some(Ok(receipt))) => *settlement = offer_receipt::with_receipt(settlement.clone(), &receipt),
            Ok(_) => tracing::warn!(task_id = %submitted.task.id, "a paid task without its payment's receipt"),
            // The task is paid and queued: its receipt is still there to ask for.
            Err(e) => tracing::warn!(task_id = %submitted.task.id, error = %e, "could not sign the receipt"),
        }
    }
    Ok(submitted)
}

async fn submit_unsigned(cx: &SubmitContext<'_>, s: Submission<'_>) -> Result<Submitted, SubmitError> {
    let request = &s.request;
    let spec = cx.catalog.task(request.kind).ok_or_else(|| SubmitError::UnknownTask(request.kind.to_owned()))?;
    if !request.input.is_object() {
        return Err(SubmitError::InputNotObject);
    }
    if let Some(pointer) = input::nul_pointer(request.input) {
        return Err(SubmitError::InputNul(pointer));
    }
    let (violations, total) = input::violations(spec, request.input);
    if total > 0 {
        return Err(SubmitError::InvalidInput(input::describe_violations(&violations, total)));
    }
    if let Some(task) = find_keyed(cx.db, request).await? {
        return replay(cx, request.space, task).await;
    }
    check_uploads(cx, request.space, request.input, !spec.is_free()).await?;

    if spec.is_free() {
        // A key a payment holds is that payment's, whatever this request is.
        if let Some((task, receipt)) = payments::held_key(cx.db, request).await? {
            return answer_paid(cx, request.space, task, receipt).await;
        }
        return match store(cx.db, request, spec).await? {
            (task, false) => queue(cx, request.space, task, Paid::Nothing).await,
            (task, true) => replay(cx, request.space, task).await,
        };
    }
    let challenge = challenge_for(cx, spec, request, s.resource_url).await?;
    let checkout = Checkout { db: cx.db, facilitator: cx.facilitator, chains: cx.chains };
    let order = Order { request: *request, payment: s.payment, deadline: s.deadline };
    match payments::pay(checkout, order, &challenge, &Shelf { catalog: cx.catalog }).await? {
        Bought::Settled { task, settlement } => queue(cx, request.space, task, Paid::Payment(settlement)).await,
        Bought::Credit { task, credit } => queue(cx, request.space, task, Paid::Credit(credit)).await,
        Bought::Authorized { task } => queue(cx, request.space, task, Paid::Authorized).await,
        Bought::Before { task, receipt } => answer_paid(cx, request.space, task, receipt).await,
        // The key was taken meanwhile: by this same request, or a conflict.
        Bought::KeyTaken => match find_keyed(cx.db, request).await? {
            Some(task) => replay(cx, request.space, task).await,
            None => Err(SubmitError::Internal("an idempotency key taken by a vanished task".into())),
        },
    }
}

/// The x402 challenge for `request` of the priced kind `spec`: its prices
/// as `accepts`, only those the facilitator settles (asked once per
/// process, here rather than at a Lambda's init), and, where the seller
/// signs, its signed offers for exactly this kind and input. The `402`,
/// every refusal that carries the challenge, and a pay link's page
/// (`domain::pay_links`) all show this one.
pub async fn challenge_for(
    cx: &SubmitContext<'_>,
    spec: &TaskSpec,
    request: &TaskRequest<'_>,
    resource_url: &str,
) -> Result<PaymentRequired, SubmitError> {
    let challenge = payments::payment_required(cx.catalog, spec, resource_url, SIGNATURE_REQUIRED)
        .ok_or_else(|| SubmitError::Internal("a priced task without a payable challenge".into()))?;
    // Only what the facilitator settles is offered (payments::supported);
    // it is asked once per process, here rather than at a Lambda's init.
    let mut challenge = match cx.facilitator {
        Some(facilitator) => match facilitator.known().await {
            Some(supported) => payments::settleable(challenge, &supported, request.kind)
                .ok_or(SubmitError::Payment(PayError::FacilitatorUnavailable))?,
            None => challenge,
        },
        None => challenge,
    };
    // Every answer that carries the challenge (the `402`, a refusal) carries
    // the seller's signed offers for exactly this request.
    if let Some(key) = cx.seller {
        let now = payments::unix_now();
        let signed =
            offer_receipt::sign_offers(key, &mut challenge, cx.catalog, request.kind, Some(request.input), now);
        if let Err(e) = signed.await {
            tracing::error!(error = %e, "the offers could not be signed: the 402 goes without them");
        }
    }
    Ok(challenge)
}

/// The task the request's `Idempotency-Key` already names, if any.
async fn find_keyed(db: &PgPool, request: &TaskRequest<'_>) -> Result<Option<Task>, SubmitError> {
    find_by_idempotency_key(db, request).await.map_err(|e| match e {
        super::CreateError::IdempotencyConflict => SubmitError::IdempotencyConflict,
        super::CreateError::Db(db) => SubmitError::Db(db),
    })
}

/// A task a payment bought before, answered again with its receipt.
async fn answer_paid(
    cx: &SubmitContext<'_>,
    space: &SpaceIndex,
    task: crate::domain::ids::Id,
    receipt: Option<PaymentResponse>,
) -> Result<Submitted, SubmitError> {
    match super::find_for_space(cx.db, space, task).await? {
        Some(task) => Ok(replay_paid(cx, space, task, receipt).await),
        None => Err(SubmitError::Internal("a paid task that vanished".into())),
    }
}

/// An earlier request's task, with the receipt of the payment that bought
/// it if one did: a client that lost the first answer learns what it paid.
async fn replay(cx: &SubmitContext<'_>, space: &SpaceIndex, task: Task) -> Result<Submitted, SubmitError> {
    let receipt = payments::receipt(cx.db, task.id).await?;
    Ok(replay_paid(cx, space, task, receipt).await)
}

/// An earlier request's task, answered again with `receipt`. One still
/// `queued` may have lost its message (a crash between commit and send), so
/// it is sent again; duplicate messages are harmless, as the worker claims a
/// task once.
async fn replay_paid(
    cx: &SubmitContext<'_>,
    space: &SpaceIndex,
    task: Task,
    receipt: Option<PaymentResponse>,
) -> Submitted {
    if task.status == TaskStatus::Queued
        && let Err(e) = super::enqueue(cx.sqs, cx.queue_url, task.id, &task.kind, Some(space)).await
    {
        tracing::warn!(task_id = %task.id, error = %e, "could not re-send a replayed task's message");
    }
    Submitted { task, replayed: true, paid: receipt.map_or(Paid::Nothing, Paid::Payment) }
}

/// Inserts the task in its own transaction. `true`: a key taken meanwhile by
/// the same request answers that task (the caller's replay check raced it).
async fn store(db: &PgPool, request: &TaskRequest<'_>, spec: &TaskSpec) -> Result<(Task, bool), SubmitError> {
    match super::quota::create(db, *request, spec).await? {
        Ok(super::Created::New(task)) => Ok((task, false)),
        Ok(super::Created::Replayed(task)) => Ok((task, true)),
        Err(super::CreateError::IdempotencyConflict) => Err(SubmitError::IdempotencyConflict),
        Err(super::CreateError::Db(e)) => Err(e.into()),
    }
}

/// Sends the stored task to the queue. If SQS refuses, the task is failed
/// with `queue_unavailable` (a paid one leaves a credit) rather than left
/// `queued` with no message.
async fn queue(
    cx: &SubmitContext<'_>,
    space: &SpaceIndex,
    mut task: Task,
    paid: Paid,
) -> Result<Submitted, SubmitError> {
    tracing::info!(task_id = %task.id, kind = %task.kind, "task stored");
    // Over its Space's limit, the task waits parked rather than in the
    // queue ahead of other Spaces' tasks. Should the check fail, it is
    // sent anyway: the worker's claim holds the limit too.
    match super::fairness::admit(cx.db, task.id, &cx.catalog.slots(&task.kind)).await {
        Ok(Some(waiting)) => {
            tracing::info!(task_id = %task.id, "its Space is at its limit of tasks in flight: parked");
            task.waiting = Some(waiting);
            return Ok(Submitted { task, replayed: false, paid });
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(task_id = %task.id, error = %e, "could not check its Space's limit; sent"),
    }
    if let Err(e) = super::enqueue(cx.sqs, cx.queue_url, task.id, &task.kind, Some(space)).await {
        tracing::error!(task_id = %task.id, error = %e, "queue unavailable; failing the task");
        let error = super::task_error(super::queue::QUEUE_UNAVAILABLE, "the task could not be queued");
        if let Err(db) = super::mark_failed(cx.db, task.id, &[TaskStatus::Queued], &error).await {
            tracing::error!(task_id = %task.id, error = %db, "could not mark the unqueued task failed");
        }
        return Err(SubmitError::QueueUnavailable);
    }
    Ok(Submitted { task, replayed: false, paid })
}

/// Every upload the input names must be this space's and have arrived; for
/// a `priced` task, its object must still be in storage too (checked before
/// any payment, so nothing is charged for input that cannot run).
async fn check_uploads(
    cx: &SubmitContext<'_>,
    space: &SpaceIndex,
    input: &Value,
    priced: bool,
) -> Result<(), SubmitError> {
    let upload = |problem: UploadProblem, message: String| SubmitError::Upload { problem, message };
    let refs = input::upload_refs(input);
    let mut seen = HashSet::new();
    let mut ids = Vec::new();
    for r in &refs {
        let Some(id) = r.id else {
            return Err(upload(
                UploadProblem::Unknown,
                format!("{} is not an upload id (expected the 26-character id from POST /v1/uploads)", r.pointer),
            ));
        };
        if seen.insert(id) {
            ids.push((id, r.pointer.as_str()));
        }
    }
    if ids.len() > MAX_UPLOADS {
        return Err(SubmitError::InvalidInput(format!(
            "a task may use at most {MAX_UPLOADS} uploads; this input names {}",
            ids.len()
        )));
    }
    for (id, pointer) in ids {
        let checked = if priced {
            uploads::ensure_stored(cx.db, cx.s3, cx.bucket, space, id).await
        } else {
            uploads::ensure_uploaded(cx.db, cx.s3, cx.bucket, space, id).await
        };
        match checked {
            Ok(()) => {}
            Err(UploadError::NotFound(_)) => {
                return Err(upload(
                    UploadProblem::Unknown,
                    format!("upload {id} (at {pointer}) not found in this space"),
                ));
            }
            Err(UploadError::NotUploaded(_)) => {
                return Err(upload(
                    UploadProblem::NotReady,
                    format!("upload {id} (at {pointer}) has not arrived yet; PUT the file to its upload URL first"),
                ));
            }
            Err(UploadError::Gone(_)) => {
                return Err(upload(
                    UploadProblem::Missing,
                    format!(
                        "upload {id} (at {pointer}) is no longer in storage (uploads are kept for a day); upload the \
                         file again and use its new id. Nothing was charged"
                    ),
                ));
            }
            Err(UploadError::Rejected(_)) => {
                return Err(upload(
                    UploadProblem::Rejected,
                    format!("upload {id} (at {pointer}) was rejected: it did not match its declared size or type"),
                ));
            }
            Err(UploadError::Storage(cause)) => {
                tracing::error!(upload_id = %id, error = %cause, "storage unavailable checking an upload");
                return Err(SubmitError::StorageUnavailable);
            }
            Err(UploadError::Db(e)) => return Err(e.into()),
        }
    }
    Ok(())
}
