//! `GET` and `POST /v1/pay-link`: the console's pay page reading and paying
//! the one offer a pay link names (`domain::pay_links`). An MCP client that
//! cannot pay gives its user the link; the page shows what the agent asked
//! for and its price (`GET`), and pays it with the browser's wallet
//! (`POST`, with the x402 payment in `PAYMENT-SIGNATURE`, as a task create
//! is paid). The task is created in the link's Space under the link's own
//! idempotency key, so the agent's retried call answers that task.
//!
//! The link's token is sent as `Authorization: PayLink <token>`, never in
//! the URL: the page takes it from its own fragment (`/#pay=<token>`),
//! which a browser sends to no server. It is not a session: it reads the
//! one offer and pays it, and nothing else of the Space.

use std::sync::Arc;

use axum::extract::{OriginalUri, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use axum::{Extension, Json};
use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskCreateContext;
use super::error::{ApiError, ErrorEnvelope};
use super::tasks::{Accepted, SubmitFailure, accepted, challenge_response, header_text, resource_url};
use crate::domain::pay_links::{self, PAY_LINK_SCHEME, PayLink, PayLinkRefusal};
use crate::domain::payments::{self, PayError, PaymentInput, PaymentRequired};
use crate::domain::tasks::{self, Submission, SubmitError, TaskRequest};

/// The route; both methods.
pub const PATH: &str = "/v1/pay-link";

pub fn router() -> OpenApiRouter<Arc<TaskCreateContext>> {
    OpenApiRouter::default().routes(routes!(read_offer, pay_offer))
}

/// What a pay link offers, for the person about to pay it.
#[derive(Serialize, ToSchema)]
struct PayLinkOffer {
    /// The task kind the agent asked for.
    kind: String,
    /// The kind's title and description, from the catalog.
    title: String,
    description: String,
    /// The input the agent sent: what the task will run on.
    #[schema(value_type = Object)]
    input: Value,
    /// SHA-256 (hex) of the input's canonical JSON, as signed offers and
    /// receipts name it.
    input_sha256: String,
    /// Until then the link can be paid (15 minutes after the agent's call).
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
    /// The x402 challenge to pay, as `POST /v1/tasks/{kind}` answers it
    /// with `402`: one `accepts` entry per price, and the seller's signed
    /// offers where it signs.
    payment_required: PaymentRequired,
}

/// Read a pay link's offer
///
/// The one offer a pay link names: the kind, the agent's input and its
/// digest, the price (`payment_required`, the x402 challenge) and until
/// when it can be paid. The console's pay page shows it to the person who
/// opened the link. Reads nothing else of the Space and changes nothing.
///
/// The link comes from `POST /mcp`: a priced tool called without a payment
/// by a client that declares URL elicitation and not x402 answers it (the
/// `-32042` error's URL, or an `input_required` result whose `requestState`
/// is the link's token). The client's retried call answers the task paid
/// here; with a `requestState` it is refused as a tool error with
/// `invalid_request_state` (not one Reeve made), `pay_link_other_space`
/// (another Space's link) or `pay_link_input_changed` (other arguments than
/// the link's), and `pay_link_expired` once the link expired unpaid.
#[utoipa::path(
    get,
    path = PATH,
    tag = "tasks",
    security(("pay_link" = [])),
    responses(
        (status = 200, description = "The offer.", body = PayLinkOffer),
        (status = 404, body = ErrorEnvelope, description = "`pay_link_invalid`: no `Authorization: PayLink` \
            header, or a token that was altered or names no link."),
        (status = 409, body = ErrorEnvelope, description = "`pay_link_expired`: the link is over 15 minutes old \
            and was not paid; `pay_link_used`: it has been paid and its task created; `pay_link_price_changed`: \
            the kind's prices changed since the link was made. Nothing is charged by any of them."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope, description = "`database_unavailable`; `facilitator_unavailable`: \
            the payment service cannot be asked which prices it settles."),
    ),
)]
async fn read_offer(
    State(ctx): State<Arc<TaskCreateContext>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Result<Json<PayLinkOffer>, SubmitFailure> {
    let url = resource_url(&uri, &headers);
    let (link, challenge) = open(&ctx, &headers, &url).await?;
    let spec = ctx.catalog.task(&link.kind).ok_or_else(|| refused(PayLinkRefusal::PriceChanged))?;
    Ok(Json(PayLinkOffer {
        kind: link.kind.clone(),
        title: spec.title.clone(),
        description: spec.description.clone(),
        input: link.input,
        input_sha256: link.input_sha256,
        expires_at: link.expires_at,
        payment_required: challenge,
    }))
}

/// Pay a pay link's offer
///
/// Pays the offer a pay link names and creates its task in the link's
/// Space, on the link's input, as `POST /v1/tasks/{kind}` does: without
/// `PAYMENT-SIGNATURE` it answers `402` with the challenge; with one, the
/// payment is verified and settled (or, metered, authorized) before the
/// task is queued. The task is created under the link's own idempotency
/// key, so the agent's retried MCP call answers this task, and a link is
/// paid at most once.
#[utoipa::path(
    post,
    path = PATH,
    tag = "tasks",
    security(("pay_link" = [])),
    params(
        ("PAYMENT-SIGNATURE" = Option<String>, Header, nullable = false,
            description = "The x402 v2 `PaymentPayload` (base64 JSON) paying one of `accepts`."),
    ),
    responses(
        (status = 202, description = "Paid, and the task queued in the link's Space (`PAYMENT-RESPONSE` as \
            for `POST /v1/tasks/{kind}`).", body = Accepted),
        (status = 400, body = ErrorEnvelope, description = "`invalid_payment`: the payment is not a readable \
            x402 payment."),
        (status = 402, body = PaymentRequired, description = "No `PAYMENT-SIGNATURE`: the challenge, as \
            `POST /v1/tasks/{kind}` answers it. A refused payment answers an error envelope instead, with the \
            challenge in `PAYMENT-REQUIRED`: `payment_mismatch`, `payment_replayed`, `payment_invalid`, \
            `payment_failed`, `payment_not_settled` (see `POST /v1/tasks/{kind}`). Nothing is charged.",
            headers(
                ("PAYMENT-REQUIRED" = String,
                    description = "The same JSON as the body, base64 (standard alphabet, padded)."),
            )),
        (status = 404, body = ErrorEnvelope, description = "`pay_link_invalid`: no `Authorization: PayLink` \
            header, or a token that was altered or names no link."),
        (status = 409, body = ErrorEnvelope, description = "`pay_link_expired`, `pay_link_used`, \
            `pay_link_price_changed` (as for `GET`); `payment_pending`, `payment_in_progress`, \
            `request_in_progress` (as for `POST /v1/tasks/{kind}`). Nothing is charged by the first three."),
        (status = 422, body = ErrorEnvelope, description = "`upload_missing`: an upload the input names is \
            gone from storage since the agent's call; nothing is charged."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope, description = "`database_unavailable`, `facilitator_unavailable`, \
            `storage_unavailable`, `queue_unavailable`."),
    ),
)]
async fn pay_offer(
    State(ctx): State<Arc<TaskCreateContext>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    invocation: Option<Extension<lambda_http::Context>>,
) -> Result<Response, SubmitFailure> {
    let url = resource_url(&uri, &headers);
    let (link, challenge) = open(&ctx, &headers, &url).await?;
    let Some(payment) = header_text(&headers, payments::PAYMENT_SIGNATURE_HEADER)? else {
        // Asked before anything is submitted: a credit of the Space never
        // pays a link's offer by itself.
        return Ok(challenge_response(&challenge));
    };
    let cx = ctx.submit_context();
    let submission = Submission {
        request: TaskRequest {
            space: &link.space,
            kind: &link.kind,
            input: &link.input,
            idempotency_key: Some(&link.key),
        },
        payment: Some(PaymentInput::Header(payment)),
        resource_url: &url,
        deadline: invocation.map(|Extension(c)| tasks::deadline_of(&c)),
    };
    match tasks::submit(&cx, submission).await {
        Ok(submitted) => {
            tracing::info!(task_id = %submitted.task.id, "a pay link was paid");
            Ok(accepted(submitted))
        }
        Err(SubmitError::Payment(PayError::Required(challenge))) => Ok(challenge_response(&challenge)),
        Err(e) => Err(e.into()),
    }
}

/// The link the request's `Authorization: PayLink` names and the kind's
/// challenge as it is now, if the link can be paid.
async fn open(
    ctx: &TaskCreateContext,
    headers: &HeaderMap,
    url: &str,
) -> Result<(PayLink, PaymentRequired), SubmitFailure> {
    let token = pay_link_token(headers).ok_or_else(|| refused(PayLinkRefusal::Invalid))?;
    let link = pay_links::find(&ctx.db, &ctx.settings.token_key, token).await.map_err(refused)?;
    let now = OffsetDateTime::now_utc();
    // Paid or expired, say so before asking the facilitator anything.
    if link.paid_task().is_some() {
        return Err(refused(PayLinkRefusal::Used));
    }
    if link.expired_at(now) {
        return Err(refused(PayLinkRefusal::Expired));
    }
    let spec = ctx.catalog.task(&link.kind).ok_or_else(|| refused(PayLinkRefusal::PriceChanged))?;
    let request = TaskRequest { space: &link.space, kind: &link.kind, input: &link.input, idempotency_key: None };
    let challenge = tasks::challenge_for(&ctx.submit_context(), spec, &request, url).await?;
    pay_links::payable(&link, &challenge, now).map_err(refused)?;
    Ok((link, challenge))
}

fn refused(e: PayLinkRefusal) -> SubmitFailure {
    SubmitFailure::from(ApiError::refused(&e))
}

/// The token of an `Authorization: PayLink <token>` header, the scheme
/// matched without regard to case.
fn pay_link_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case(PAY_LINK_SCHEME) && !token.trim().is_empty()).then(|| token.trim())
}
