//! `POST /v1/tasks/{kind}` (the task-create function), and `GET
//! /v1/tasks/{id}`, `GET /v1/tasks` and `POST /v1/tasks/{id}/cancel` (the
//! task-status function). The domain logic is in [`crate::domain::tasks`].
//!
//! Create is one call to [`tasks::submit`]; this file only turns HTTP into
//! its arguments and its result into a response. Its answers, in order:
//! 1. the token: `401 missing_token` / `401 invalid_token`;
//! 2. the body is `{"input": {…}}` and nothing else: `415`, `413`,
//!    `400 invalid_json`, `400 invalid_request`;
//! 3. the kind is in the catalog: `404 unknown_task`;
//! 4. the `Idempotency-Key` header, if any, is 1..=255 printable ASCII:
//!    `400 invalid_idempotency_key`; the `webhook`, if any, is usable and
//!    the Space can sign it: `422 invalid_webhook`,
//!    `422 webhook_secret_required`;
//! 5. the input holds no NUL (`400 invalid_input` with its pointer) and
//!    matches the task's schema: `422 invalid_input`;
//! 6. a key used before: the same request answers its task again (`202`,
//!    `Idempotent-Replayed: true`), another is `409 idempotency_conflict`;
//! 7. the uploads the input names: `422 unknown_upload`,
//!    `422 upload_not_ready`, `422 upload_missing`, `422 upload_rejected`,
//!    `503 storage_unavailable`;
//! 8. a priced task: no `PAYMENT-SIGNATURE` and no credit → `402` whose body
//!    is the x402 challenge; a payment → `400 invalid_payment`,
//!    `402 payment_mismatch`, `402 payment_replayed`, `402 payment_invalid`,
//!    `402 payment_failed` (with `PAYMENT-RESPONSE` `success: false`),
//!    `402 payment_not_settled` (those carry the challenge in
//!    `PAYMENT-REQUIRED`), `409 payment_pending` (`Retry-After`; the chain
//!    may still charge it), `409 payment_in_progress`,
//!    `409 request_in_progress`, `409 payment_identifier_conflict`,
//!    `503 facilitator_unavailable` (nothing charged);
//! 9. store and queue: `202` with `Location` (and `PAYMENT-RESPONSE` when
//!    paid now), `429 quota_exceeded` with `Retry-After` for a free task over
//!    its Space's quota, or `503 queue_unavailable`.
//!
//! A long file on purpose: a quarter of it is each route's OpenAPI description
//! (its `utoipa::path` attribute), kept beside the handler it describes so
//! the two change together; the handlers themselves are short.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[cfg(feature = "api-tasks")]
use super::context::TaskCreateContext;
use super::context::TaskStatusContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope, Rendered, db_error};
use super::extract::{JsonBody, Session};
use crate::domain::error::{Refusal, TaskRefusal};
use crate::domain::ids::Id;
#[cfg(feature = "api-tasks")]
use crate::domain::payments::{self, PayError, PaymentInput, PaymentRequired, PaymentResponse};
use crate::domain::tasks::bulk::{self, BulkCanceled};
use crate::domain::tasks::events::publish_all_once;
use crate::domain::tasks::{self, CancelOutcome, ListQuery, Task, TaskStatus};
#[cfg(feature = "api-tasks")]
use crate::domain::tasks::{Paid, Submission, SubmitError, Submitted, TaskRequest};
use crate::domain::webhooks::{self, WebhookRequest};

/// One path for both routers: axum merges their methods only when the path
/// strings are identical, so the segment has one neutral name — a kind for
/// `POST`, an id for `GET`.
const TASK_PATH: &str = "/v1/tasks/{task}";

pub use super::IDEMPOTENCY_KEY_HEADER;
#[cfg(feature = "api-tasks")]
pub const IDEMPOTENT_REPLAYED_HEADER: &str = "idempotent-replayed";
#[cfg(feature = "api-tasks")]
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

#[cfg(feature = "api-tasks")]
/// `POST /v1/tasks/{kind}`: the task-create function's route.
pub fn create_router() -> OpenApiRouter<Arc<TaskCreateContext>> {
    OpenApiRouter::default().routes(routes!(create_task))
}

/// `GET /v1/tasks/{id}`, `GET /v1/tasks`, `POST /v1/tasks/{id}/cancel`,
/// `POST /v1/tasks/cancel`, `POST /v1/tasks/{id}/ticket`, `POST /v1/tasks/{id}/share` and
/// `GET /v1/space`: the task-status
/// function's routes. They share it because
/// each needs only Postgres and the Redis doorbell, no S3 or SQS: the owner
/// reading and stopping what their Space owns.
pub fn status_router() -> OpenApiRouter<Arc<TaskStatusContext>> {
    OpenApiRouter::default()
        .routes(routes!(task_status))
        .routes(routes!(list_tasks))
        .routes(routes!(cancel_task))
        .routes(routes!(cancel_tasks))
        .merge(super::receipts::router())
        .merge(super::ticket::router())
        .merge(super::share::router())
        .merge(super::space_view::router())
        .merge(super::webhooks::router())
}

#[cfg(feature = "api-tasks")]
/// A task's input.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    /// A JSON object matching the kind's `input_schema` in `GET /v1/catalog`.
    /// Files are named by upload id in `upload_id` / `upload_ids` fields.
    #[schema(value_type = Object, example = json!({"url": "https://example.com/"}))]
    input: Value,
    /// Where to POST the task's view when it ends, signed per Standard
    /// Webhooks with the Space's secret (`POST /v1/space/webhook-secret`
    /// first): a URL, for every end, or `{"url", "events"}` for some of
    /// `completed`, `failed`, `canceled`, and `progress` while it runs.
    /// Without it, the Space's default
    /// (`PUT /v1/space/webhook`) applies, if it has one.
    #[serde(default)]
    webhook: Option<WebhookRequest>,
}

#[cfg(feature = "api-tasks")]
/// A created (or replayed) task.
#[derive(Serialize, ToSchema)]
#[schema(as = TaskAccepted)]
pub(super) struct Accepted {
    id: Id,
    kind: String,
    status: TaskStatus,
    /// The relay's SSE stream of the task's events.
    #[schema(example = "/v1/tasks/01HZX3Y4P5Q6R7S8T9V0W1X2Y3/events")]
    events_url: String,
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
    /// A metered task's payment: authorized up to its ceiling, nothing
    /// charged until it ends (no `PAYMENT-RESPONSE` then).
    #[serde(skip_serializing_if = "Option::is_none")]
    payment: Option<crate::domain::payments::MeteredPayment>,
}

#[cfg(feature = "api-tasks")]
/// Create a task
///
/// Checks, in order, and answers with the first failure: the token; the
/// body; the kind; the `Idempotency-Key`; the input against the kind's
/// schema; a reused key; the uploads the input names; payment. A priced task
/// without a `PAYMENT-SIGNATURE` is paid with a credit the Space holds for
/// the same price if it has one (the task gets a `credit_used` event);
/// otherwise it answers `402` with x402 v2 payment requirements, both as the
/// body and, base64, in the `PAYMENT-REQUIRED` header. With a signature the
/// payment is verified and settled by the facilitator before the task is
/// queued, and the `202` carries `PAYMENT-RESPONSE`.
#[utoipa::path(
    post,
    path = TASK_PATH,
    tag = "tasks",
    security(("bearer" = [])),
    params(
        ("task" = String, Path, description = "The task kind, from `GET /v1/catalog`.", example = "digest"),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 255,
            description = "1 to 255 printable ASCII characters. The same key with the same request answers \
                the same task again (`Idempotent-Replayed: true`, nothing re-queued)."),
        ("PAYMENT-SIGNATURE" = Option<String>, Header, nullable = false,
            description = "An x402 v2 payment for a priced task: base64 JSON whose `accepted` is one of the \
                challenge's `accepts`. Each payment pays for one task; the `payment-identifier` extension's id \
                makes a retry of the same request answer the same task."),
    ),
    request_body = CreateRequest,
    responses(
        (status = 202, description = "The task is queued (or was, for a replayed `Idempotency-Key` or \
            payment). When a payment paid for it, a `PAYMENT-RESPONSE` header carries base64 JSON \
            `{success, transaction, network, payer}`: the settlement of this request, or, sent again, the \
            receipt stored when it was paid; a task paid with a credit has none (its receipt, scheme \
            `credit`, is at `GET /v1/tasks/{task}/receipt`). Where the seller signs \
            receipts, its `extensions[\"offer-receipt\"].info.receipt` is the task's signed receipt (as \
            `GET /v1/tasks/{task}/receipt` answers it).",
            body = Accepted,
            headers(
                ("Location" = String, description = "The task's URL: `/v1/tasks/{id}`."),
                ("Idempotent-Replayed" = String,
                    description = "`true` when an earlier request's task is answered again."),
            )),
        (status = 400, body = ErrorEnvelope, description = concat!(
            doc_400_json!(),
            " An `input` that is not an object is `invalid_request` too, the same code over MCP. ",
            "`invalid_idempotency_key`: not one header of 1 to 255 printable ASCII characters; ",
            "`invalid_payment`: a `PAYMENT-SIGNATURE` that is not base64 JSON of an x402 v2 `exact`, `upto` or ",
            "`batch-settlement` (a voucher or a deposit) payment; ",
            "`invalid_input`: a string (or key) anywhere in the input holds a NUL character, which cannot be ",
            "stored; the message names its JSON pointer. Checked before any upload or payment.")),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 402, body = PaymentRequired,
            description = "A priced task: x402 v2 payment requirements, one `accepts` entry per price, with the \
                `payment-identifier` and `bazaar` extensions and, where the seller signs, `offer-receipt`: \
                `info.offers`, one signed offer (a JWS `ES256K`) per `accepts` entry naming this request's kind \
                and input digest, and `info.signer.address`, the catalog's `receipts.signer`. Without a payment (`payment_required`) this body is the \
                challenge, not an error envelope. A refused payment answers an error envelope instead, with the challenge in \
                `PAYMENT-REQUIRED`: `payment_mismatch` (`accepted` is not one of this kind's requirements), \
                `payment_replayed` (the payment already paid for another request, or another Space's; the same \
                request sent again by the Space that paid answers its task), \
                `payment_invalid` (the facilitator's verification refused it), `payment_failed` (settling it \
                failed; `PAYMENT-RESPONSE` carries `{success: false, errorReason}` too), `payment_not_settled` (an \
                earlier answer was `payment_pending`, and the payment's `validBefore` has since passed without it \
                being used on chain). A metered (`upto`) payment may also be refused with \
                `permit2_approval_required` (approve Permit2 once, or sign the offered EIP-2612 permit), \
                `ceiling_too_low`, `deadline_too_short`, `wrong_spender`, `wrong_facilitator` or `wrong_pay_to`. \
                A `batch-settlement` voucher may be refused with the codes `@x402/evm` gives the same refusal: \
                `invalid_batch_settlement_evm_cumulative_amount_mismatch` (its ceiling is not what the channel was \
                charged plus this task's price: the batch offer then carries `extra.channelState` and \
                `extra.voucherState`, from which the official client signs again), \
                `invalid_batch_settlement_evm_cumulative_exceeds_balance` (the channel's balance does not cover it), \
                `invalid_batch_settlement_evm_voucher_signature` (not signed by the channel's payer or its \
                authorizer), `invalid_batch_settlement_evm_receiver_mismatch`, \
                `invalid_batch_settlement_evm_receiver_authorizer_mismatch`, \
                `invalid_batch_settlement_evm_token_mismatch`, `invalid_batch_settlement_evm_withdraw_delay_mismatch` \
                or `invalid_batch_settlement_evm_channel_id_mismatch` (a channel this server cannot claim from), or \
                `batch_withdraw_requested` (the payer asked to withdraw the channel). \
                None of them charges anything or creates a task.",
            headers(
                ("PAYMENT-REQUIRED" = String,
                    description = "The same JSON as the body, base64 (standard alphabet, padded)."),
            )),
        (status = 404, description = "`unknown_task`: no such kind in the catalog.", body = ErrorEnvelope),
        (status = 409, body = ErrorEnvelope,
            description = "`payment_pending`: the payment was sent to be settled and its outcome is not known \
                yet (the facilitator answered `settlement_pending`, timed out, failed, or the invocation ran out of \
                time): it may still be charged. The server resolves it from the chain on its own; send the same \
                request with the same `PAYMENT-SIGNATURE` after `Retry-After` seconds to get its one task \
                (`202`) or `402 payment_not_settled`. Never sign a new payment for it meanwhile. \
                `idempotency_conflict`: the `Idempotency-Key` was used with a different kind or input; \
                `request_in_progress`: another request with this `Idempotency-Key` is being paid for; \
                `payment_identifier_conflict`: the payment-identifier id was used with another payment or request; \
                `payment_in_progress`: another request is settling this payment. `payment_pending`, \
                `request_in_progress` and `payment_in_progress` carry `Retry-After`: the seconds to wait before \
                sending the same request again."),
        (status = 413, description = doc_413!(), body = ErrorEnvelope),
        (status = 415, description = doc_415!(), body = ErrorEnvelope),
        (status = 422, body = ErrorEnvelope, description = concat!(
            "`invalid_input`: the input does not match the kind's schema (the message lists up to 10 violations ",
            "with their JSON pointers) or names too many uploads; ",
            "`unknown_upload`: an upload id that is unknown, another Space's, or not an id; ",
            "`upload_not_ready`: the file has not been `PUT` yet; ",
            "`upload_missing`: a priced task's file is gone from storage (uploads are kept for a day); ",
            "`upload_rejected`: the file did not match its declared size or type; ",
            doc_422_webhook!(), " The webhook is checked before the input.")),
        (status = 429, body = ErrorEnvelope,
            description = "`quota_exceeded`: a free kind only: this Space already created its `quota.per_hour` \
                tasks of the kind in the last 60 minutes, or has its `quota.at_once` of them queued or running \
                (`GET /v1/catalog` lists the quotas, `GET /v1/space` the Space's use). Nothing was stored; \
                try again after `Retry-After` seconds. Priced kinds have no quota.",
            headers(("Retry-After" = u64, description = "Seconds until a create may succeed again."))),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope, description = concat!(
            "`queue_unavailable`: the task could not be queued and is marked failed; ",
            "retry with a new `Idempotency-Key`; ",
            "`storage_unavailable`: uploads could not be checked; ",
            "`facilitator_unavailable`: the payment facilitator could not be reached (or too little time was ",
            "left to ask it) before anything was settled: nothing was charged (an outcome that is not known is ",
            "`409 payment_pending` instead); ",
            "`chain_unavailable`: a `batch-settlement` channel's balance could not be read from its network; ",
            "nothing was charged; ",
            doc_503_db!())),
    ),
)]
async fn create_task(
    State(ctx): State<Arc<TaskCreateContext>>,
    Session(space): Session,
    kind: Result<Path<String>, PathRejection>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    invocation: Option<Extension<lambda_http::Context>>,
    JsonBody(request): JsonBody<CreateRequest>,
) -> Result<Response, SubmitFailure> {
    let kind = kind.map(|Path(k)| k).unwrap_or_default();
    if ctx.catalog.task(&kind).is_none() {
        return Err(SubmitError::UnknownTask(kind).into());
    }
    let key = idempotency_key(&headers)?;
    let payment = header_text(&headers, payments::PAYMENT_SIGNATURE_HEADER)?;
    let url = resource_url(&uri, &headers);
    let webhook = match request.webhook {
        Some(webhook) => Some(
            webhooks::check_for_task(&ctx.db, &space, webhook.into())
                .await
                .map_err(|e| SubmitFailure::from(ApiError::refused(&e)))?,
        ),
        None => None,
    };
    let cx = ctx.submit_context();
    let submission = Submission {
        request: TaskRequest { space: &space, kind: &kind, input: &request.input, idempotency_key: key },
        payment: payment.map(PaymentInput::Header),
        resource_url: &url,
        // In Lambda, the invocation ends at its context's deadline.
        deadline: invocation.map(|Extension(c)| tasks::deadline_of(&c)),
    };
    match tasks::submit(&cx, submission).await {
        Ok(submitted) => {
            if let Some(webhook) = &webhook {
                // The task is stored (and maybe already running): its end
                // is delivered whichever commits first (see
                // `webhooks::subscribe_task`).
                webhooks::subscribe_task(&ctx.db, &space, submitted.task.id, webhook)
                    .await
                    .map_err(|e| SubmitFailure::from(db_error(e)))?;
            }
            Ok(accepted(submitted))
        }
        Err(SubmitError::Payment(PayError::Required(challenge))) => Ok(challenge_response(&challenge)),
        Err(e) => Err(e.into()),
    }
}

#[cfg(feature = "api-tasks")]
/// A header that must be visible ASCII if present (`400 invalid_payment`
/// for a payment that is not).
pub(super) fn header_text<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, SubmitFailure> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(SubmitError::Payment(PayError::Malformed(format!("send one {name} header"))).into());
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| SubmitError::Payment(PayError::Malformed(format!("{name} must be base64 text"))).into())
}

#[cfg(feature = "api-tasks")]
/// A create that ended without a task: the envelope; for a refused
/// payment the challenge again in `PAYMENT-REQUIRED`, so an x402 client can
/// pay afresh, and for a refused settle the `PAYMENT-RESPONSE` saying why;
/// `Retry-After` when the same request should be sent again.
pub struct SubmitFailure {
    error: ApiError,
    // Boxed: the challenge is large, and every create's `Result` carries it.
    challenge: Option<Box<PaymentRequired>>,
    settlement: Option<Box<PaymentResponse>>,
    retry_after: Option<std::time::Duration>,
}

#[cfg(feature = "api-tasks")]
impl From<SubmitError> for SubmitFailure {
    fn from(e: SubmitError) -> Self {
        let error = ApiError::refused(&e);
        // Refusals decided here, before any facilitator call (a voucher is
        // decided by Reeve alone); the ledger counts those that come back
        // from the facilitator.
        let refused_early = matches!(
            e,
            SubmitError::Payment(
                PayError::Malformed(_)
                    | PayError::Mismatch(_)
                    | PayError::Replayed(_)
                    | PayError::IdentifierConflict
                    | PayError::Voucher { .. }
            )
        );
        if refused_early {
            crate::infra::metrics::payment_failed(error.code);
        }
        SubmitFailure {
            error,
            challenge: e.challenge().cloned().map(Box::new),
            settlement: e.settlement().cloned().map(Box::new),
            retry_after: e.retry_after(),
        }
    }
}

#[cfg(feature = "api-tasks")]
impl From<ApiError> for SubmitFailure {
    fn from(error: ApiError) -> Self {
        SubmitFailure { error, challenge: None, settlement: None, retry_after: None }
    }
}

#[cfg(feature = "api-tasks")]
impl IntoResponse for SubmitFailure {
    fn into_response(self) -> Response {
        let mut response = self.error.into_response();
        let headers = response.headers_mut();
        if let Some(challenge) = self.challenge {
            let value = HeaderValue::from_str(&challenge.header_value()).expect("base64 is a valid header value");
            headers.insert(payments::PAYMENT_REQUIRED_HEADER, value);
        }
        if let Some(settlement) = self.settlement {
            let value = HeaderValue::from_str(&settlement.header_value()).expect("base64 is a valid header value");
            headers.insert(payments::PAYMENT_RESPONSE_HEADER, value);
        }
        if let Some(after) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(after.as_secs().max(1)));
        }
        response
    }
}

/// Read a task
///
/// A snapshot of one of the Space's tasks. The relay's
/// `GET /v1/tasks/{id}/events` streams its events instead.
#[utoipa::path(
    get,
    path = TASK_PATH,
    tag = "tasks",
    security(("bearer" = [])),
    params(
        ("task" = Id, Path, description = "The task id, from `POST /v1/tasks/{kind}`."),
    ),
    responses(
        (status = 200, description = "The task.", body = Task),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope,
            description = "`task_not_found`: no such task in this Space (or not a task id at all)."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn task_status(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Task>> {
    // A malformed id cannot name a task: the same 404 as a missing one.
    let Some(id) = id.ok().and_then(|Path(id)| id.parse::<Id>().ok()) else {
        return Err(ApiError::task_not_found());
    };
    match tasks::find_for_space(&ctx.db, &space, id).await.map_err(db_error)? {
        Some(task) => Ok(Json(ctx.links.present(&space, task).await)),
        None => Err(ApiError::task_not_found()),
    }
}

/// The query of `GET /v1/tasks`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListParams {
    /// Only tasks in this status.
    status: Option<TaskStatus>,
    /// Only tasks of this kind.
    kind: Option<String>,
    /// How many tasks per page (default 20).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<u32>,
    /// The `next` of the previous page: only tasks older than this one.
    after: Option<Id>,
}

/// A page of tasks.
#[derive(Serialize, ToSchema)]
#[schema(as = TaskPage)]
struct TaskPage {
    /// Newest first.
    tasks: Vec<Task>,
    /// Pass as `after` for the next page; `null` on the last one.
    next: Option<Id>,
}

/// List tasks
///
/// The Space's tasks, newest first, a page at a time: pass the answer's
/// `next` as `after` for the following page.
#[utoipa::path(
    get,
    path = "/v1/tasks",
    tag = "tasks",
    security(("bearer" = [])),
    params(ListParams),
    responses(
        (status = 200, description = "A page of tasks.", body = TaskPage),
        (status = 400, body = ErrorEnvelope, description =
            "`invalid_query`: an unknown `status`, a `limit` outside 1 to 100, an `after` that is not a task id, or a `kind` holding a NUL."),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn list_tasks(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
    params: Result<Query<ListParams>, QueryRejection>,
) -> ApiResult<Json<TaskPage>> {
    let Query(params) = params.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    // Postgres cannot hold a NUL in a text parameter: the client's error,
    // not a server fault.
    if params.kind.as_deref().is_some_and(tasks::input::has_nul) {
        return Err(ApiError::bad_request("invalid_query", "kind holds a NUL character (%00)"));
    }
    let limit = params.limit.unwrap_or(tasks::list::DEFAULT_LIMIT);
    if !(1..=tasks::list::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit must be between 1 and {}", tasks::list::MAX_LIMIT),
        ));
    }
    let query = ListQuery { status: params.status, kind: params.kind.as_deref(), after: params.after, limit };
    let page = tasks::list(&ctx.db, &space, query).await.map_err(db_error)?;
    Ok(Json(TaskPage { tasks: ctx.links.present_all(&space, page.tasks).await, next: page.next }))
}

/// Cancel a task
///
/// A `queued` task is canceled at once (`200`). A `running` one is asked to
/// stop (`202`): its worker notices within a second, stops the executor and
/// ends it `canceled`; follow its events to see that. A task whose service
/// works on it alone (a service kind that accepted the job) is sent a
/// signed cancel within seconds, and ends `canceled` at the service's next
/// report, or once its lease lapses. Each change is a `status` event on the
/// task's stream.
#[utoipa::path(
    post,
    path = "/v1/tasks/{task}/cancel",
    tag = "tasks",
    security(("bearer" = [])),
    params(
        ("task" = Id, Path, description = "The task id, from `POST /v1/tasks/{kind}`."),
    ),
    responses(
        (status = 200, description = "The task was queued and is `canceled` now.", body = Task),
        (status = 202, description = "The task is `running`; its worker has been asked to stop it.", body = Task),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope,
            description = "`task_not_found`: no such task in this Space (or not a task id at all)."),
        (status = 409, description = "`task_finished`: the task has already ended.", body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn cancel_task(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let Some(id) = id.ok().and_then(|Path(id)| id.parse::<Id>().ok()) else {
        return Err(ApiError::task_not_found());
    };
    let outcome = tasks::cancel(&ctx.db, &space, id).await.map_err(db_error)?.ok_or_else(ApiError::task_not_found)?;
    match outcome {
        CancelOutcome::Canceled { task, events } => {
            publish_all_once(&ctx.redis, id, &events).await;
            tracing::info!(task_id = %id, "task canceled");
            Ok((StatusCode::OK, Json(task)).into_response())
        }
        CancelOutcome::Requested { task, event } => {
            publish_all_once(&ctx.redis, id, event.as_slice()).await;
            tracing::info!(task_id = %id, "cancel requested of a running task");
            Ok((StatusCode::ACCEPTED, Json(task)).into_response())
        }
        CancelOutcome::Finished(task) => Err(ApiError::refused(&TaskRefusal::Finished(task.status.as_str()))),
    }
}

/// The filter of `POST /v1/tasks/cancel`: the fields given must all hold.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BulkCancelRequest {
    /// Only these tasks (at most 1000); ids of other Spaces match nothing.
    #[schema(max_items = 1000)]
    ids: Option<Vec<Id>>,
    /// Only tasks of this kind.
    kind: Option<String>,
    /// Only tasks in one of these statuses.
    status: Option<Vec<TaskStatus>>,
    /// Only tasks created at or after this time (RFC 3339).
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-12-01T00:00:00Z")]
    created_after: Option<OffsetDateTime>,
    /// Only tasks created before this time (RFC 3339).
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    created_before: Option<OffsetDateTime>,
    /// Count and list what would be canceled, and cancel nothing.
    #[serde(default)]
    dry_run: bool,
}

/// Cancel tasks by filter
///
/// Cancels the Space's tasks that the filter matches: at least one of
/// `ids`, `kind`, `status`, `created_after`, `created_before`; every field
/// given must hold. Each task is canceled as `POST /v1/tasks/{id}/cancel`
/// would cancel it (a queued one at once, a running one asked to stop; a
/// paid task canceled before it ran leaves a credit), at most 1000 per
/// request, oldest first: `more` says to send the request again for the
/// rest. Tasks that have already ended are matched but left as they are
/// (`skipped`). Only the caller's Space is ever touched. With `dry_run`,
/// nothing changes: the answer says what would be canceled.
#[utoipa::path(
    post,
    path = "/v1/tasks/cancel",
    tag = "tasks",
    security(("bearer" = [])),
    request_body = BulkCancelRequest,
    responses(
        (status = 200, description = "What was canceled (or, on a dry run, would be).", body = BulkCanceled),
        (status = 400, body = ErrorEnvelope, description = concat!(
            doc_400_json!(),
            " `invalid_request` too for a filter that names nothing, more than 1000 `ids`, a `kind` holding a NUL, ",
            "or `created_after` not earlier than `created_before`.")),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 413, description = doc_413!(), body = ErrorEnvelope),
        (status = 415, description = doc_415!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn cancel_tasks(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
    JsonBody(request): JsonBody<BulkCancelRequest>,
) -> ApiResult<Json<BulkCanceled>> {
    let filter = bulk::Filter {
        space: Some(space),
        ids: request.ids,
        kind: request.kind,
        statuses: request.status,
        codes: None,
        created_after: request.created_after,
        created_before: request.created_before,
    };
    filter.check().map_err(|message| ApiError::bad_request("invalid_request", message))?;
    let done = bulk::cancel_owned(&ctx.db, &ctx.redis, &space, filter, request.dry_run, "http").await;
    Ok(Json(done.map_err(db_error)?))
}

#[cfg(feature = "api-tasks")]
/// The `Idempotency-Key` header: absent, or exactly one value of 1..=255
/// printable ASCII characters (space through `~`).
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<&str>> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let bytes = value.as_bytes();
    let valid = values.next().is_none()
        && (1..=MAX_IDEMPOTENCY_KEY_LEN).contains(&bytes.len())
        && bytes.iter().all(|b| (0x20..=0x7e).contains(b));
    if !valid {
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            "Idempotency-Key must be one header of 1 to 255 printable ASCII characters",
        ));
    }
    Ok(Some(value.to_str().expect("checked printable ASCII")))
}

#[cfg(feature = "api-tasks")]
pub(super) fn challenge_response(challenge: &PaymentRequired) -> Response {
    let header_value = HeaderValue::from_str(&challenge.header_value()).expect("base64 is a valid header value");
    let mut response = (
        StatusCode::PAYMENT_REQUIRED,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        challenge.to_json(),
    )
        .into_response();
    response.headers_mut().insert(payments::PAYMENT_REQUIRED_HEADER, header_value);
    response.extensions_mut().insert(Rendered);
    response
}

#[cfg(feature = "api-tasks")]
/// The URL a client paid for: absolute when the request says which host it
/// reached (the `Host` header or an absolute URI), else just the path.
pub(super) fn resource_url(uri: &Uri, headers: &HeaderMap) -> String {
    format!("{}{}", super::extract::origin(uri, headers).unwrap_or_default(), uri.path())
}

#[cfg(feature = "api-tasks")]
pub(super) fn accepted(submitted: Submitted) -> Response {
    let Submitted { task, replayed, paid } = submitted;
    let body = Accepted {
        id: task.id,
        kind: task.kind.clone(),
        status: task.status,
        events_url: format!("/v1/tasks/{}/events", task.id),
        created_at: task.created_at,
        payment: task.payment.clone(),
    };
    let mut response = (StatusCode::ACCEPTED, Json(body)).into_response();
    let location = HeaderValue::from_str(&format!("/v1/tasks/{}", task.id)).expect("ids are ASCII");
    response.headers_mut().insert(header::LOCATION, location);
    if replayed {
        response.headers_mut().insert(IDEMPOTENT_REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    if let Paid::Payment(settlement) = paid {
        let value = HeaderValue::from_str(&settlement.header_value()).expect("base64 is a valid header value");
        response.headers_mut().insert(payments::PAYMENT_RESPONSE_HEADER, value);
    }
    response
}
