//! `GET /v1/refund/{kind}`: a payer's cooperative refund of its
//! batch-settlement channel, where `@x402/evm`'s `refundChannel(url)` asks
//! it. The client first asks with no payment and reads the kind's
//! `batch-settlement` offer from the `402` (the channel's terms), then asks
//! again with a `refund` payload in `PAYMENT-SIGNATURE`: a voucher of what
//! Reeve charged the channel, signed by the payer or its payer authorizer.
//! That signature is the only credential: no Space, no session. The work
//! is one domain call, [`batch::refund::refund`].

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskCreateContext;
use super::error::{ApiError, ErrorEnvelope};
use super::tasks::{SubmitFailure, challenge_response, header_text, resource_url};
use crate::domain::error::Refusal;
use crate::domain::payments::batch::refund::{RefundError, refund};
use crate::domain::payments::{self, PaymentRequired, Scheme};
use crate::domain::tasks::SubmitError;

/// The route.
pub const PATH: &str = "/v1/refund/{kind}";

pub fn router() -> OpenApiRouter<Arc<TaskCreateContext>> {
    OpenApiRouter::default().routes(routes!(refund_channel))
}

/// A refund made.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct RefundAcknowledged {
    /// `"Refund acknowledged"`, as `@x402/evm`'s server answers.
    message: &'static str,
    /// The channel refunded.
    channel_id: String,
    /// What went back to the payer, in the token's smallest units.
    refunded_amount: String,
}

/// Refund a batch-settlement channel
///
/// Asked by `@x402/evm`'s `refundChannel(url)` (any client of x402's
/// `batch-settlement` scheme). Without `PAYMENT-SIGNATURE`: `402` with the
/// kind's `batch-settlement` offer, the channel terms to sign against. With
/// a `refund` payload (the channel's configuration and a voucher of exactly
/// what this server charged the channel, signed by the payer or its payer
/// authorizer): this server claims what it charged and has everything else
/// in the channel (or the payload's `amount`, at most that) sent back to the
/// payer in the same transaction, signed by its receiver authorizer. The
/// answer carries the refund's transaction and the channel after it in
/// `PAYMENT-RESPONSE` (`extra.channelState`, with the escrow's new
/// `refundNonce`). The same request sent again answers the same refund; the
/// channel can be deposited into and paid from again afterwards.
#[utoipa::path(
    get,
    path = PATH,
    tag = "tasks",
    params(("kind" = String, Path, description = "A kind priced by batch settlement, from `GET /v1/catalog`: \
        its offer names the channel's receiver and token.")),
    responses(
        (status = 200, description = "Refunded.", body = RefundAcknowledged,
            headers(
                ("PAYMENT-RESPONSE" = String, description = "The refund's settlement, base64 JSON: `transaction`, \
                    and in `extra` `refundedAmount` and `channelState` (`balance`, `totalClaimed`, \
                    `withdrawRequestedAt`, `refundNonce`, `chargedCumulativeAmount`)."),
            )),
        (status = 400, body = ErrorEnvelope, description = "`invalid_payment`: `PAYMENT-SIGNATURE` is not a \
            batch-settlement `refund` payload, or does not name this kind's offer."),
        (status = 402, body = PaymentRequired, description = "No payment: the kind's batch-settlement offer \
            (this body is the x402 challenge, not an error envelope). A refusal answers an error envelope \
            instead, with the challenge in `PAYMENT-REQUIRED` and its code \
            as the challenge's `error`, nothing refunded: the voucher refusals of `POST /v1/tasks/{kind}` \
            (`invalid_batch_settlement_evm_voucher_signature`: not signed by the channel's payer or its \
            authorizer; `…_cumulative_amount_mismatch`: not of what the channel was charged, with the channel \
            in `extra.channelState`; `…_receiver_mismatch` and the other channel mismatches); \
            `invalid_batch_settlement_evm_missing_channel`: no voucher was ever taken on this channel; \
            `invalid_batch_settlement_evm_refund_no_balance`: nothing is left to refund; `batch_refund_failed`: \
            the escrow refused the refund (`PAYMENT-RESPONSE` says why).",
            headers(
                ("PAYMENT-REQUIRED" = String,
                    description = "The challenge as JSON, base64 (standard alphabet, padded)."),
            )),
        (status = 404, body = ErrorEnvelope, description = "`unknown_task`: no kind of that name priced by batch \
            settlement."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope, description = "Nothing refunded; the same request may be sent again \
            (`Retry-After`): `facilitator_unavailable`; `chain_unavailable`: the channel cannot be read; \
            `batch_refund_unavailable`: this deployment has no receiver authorizer's key to sign refunds; \
            `database_unavailable`."),
    ),
)]
async fn refund_channel(
    State(ctx): State<Arc<TaskCreateContext>>,
    kind: Result<Path<String>, PathRejection>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Result<Response, SubmitFailure> {
    let kind = kind.map(|Path(k)| k).unwrap_or_default();
    let url = resource_url(&uri, &headers);
    let batch = Scheme::Batch.name();
    let challenge = ctx
        .catalog
        .task(&kind)
        .and_then(|spec| payments::payment_required(&ctx.catalog, spec, &url, payments::SIGNATURE_REQUIRED))
        .map(|mut challenge| {
            challenge.accepts.retain(|offer| offer.scheme == batch);
            challenge
        })
        .filter(|challenge| !challenge.accepts.is_empty())
        .ok_or_else(|| SubmitError::UnknownTask(kind.clone()))?;
    let Some(header) = header_text(&headers, payments::PAYMENT_SIGNATURE_HEADER)? else {
        return Ok(challenge_response(&challenge));
    };
    let answer = match payments::payload::decode(header) {
        Err(why) => Err(RefundError::Malformed(why)),
        Ok(payment) => match challenge.accepts.iter().find(|offer| payment.accepted.matches(offer)) {
            None => Err(RefundError::Malformed("accepted is not this kind's batch-settlement offer".into())),
            Some(offer) => {
                let authorizer = ctx.batch_authorizer.as_deref();
                refund(&ctx.db, &ctx.chains, authorizer, &payment, offer, &challenge).await
            }
        },
    };
    Ok(match answer {
        Ok(refunded) => {
            let body = RefundAcknowledged {
                message: "Refund acknowledged",
                channel_id: refunded.channel_id,
                refunded_amount: refunded.amount.to_string(),
            };
            let mut response = Json(body).into_response();
            let value = HeaderValue::from_str(&refunded.response.header_value()).expect("base64 is a header value");
            response.headers_mut().insert(payments::PAYMENT_RESPONSE_HEADER, value);
            response
        }
        Err(e) => refused(&e),
    })
}

/// A refusal: the envelope, and the challenge, the facilitator's answer and
/// the wait where the refusal has them.
fn refused(e: &RefundError) -> Response {
    let mut response = ApiError::refused(e).into_response();
    let headers = response.headers_mut();
    if let Some(challenge) = Refusal::challenge(e) {
        headers.insert(payments::PAYMENT_REQUIRED_HEADER, header_of(challenge));
    }
    if let Some(settlement) = e.settlement() {
        let value = HeaderValue::from_str(&settlement.header_value()).expect("base64 is a header value");
        headers.insert(payments::PAYMENT_RESPONSE_HEADER, value);
    }
    if let Some(after) = e.retry_after() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(after.as_secs().max(1)));
    }
    response
}

fn header_of(challenge: &PaymentRequired) -> HeaderValue {
    HeaderValue::from_str(&challenge.header_value()).expect("base64 is a valid header value")
}
