//! `GET /v1/tasks/{task}/receipt`: a paid task's receipt, signed with the
//! seller's key (x402 `offer-receipt`; [`crate::domain::tasks::receipt`]).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskStatusContext;
use super::error::{ApiError, ErrorEnvelope};
use super::extract::Session;
use crate::domain::error::{Refusal, TaskRefusal};
use crate::domain::ids::Id;
use crate::domain::payments::offer_receipt::Signed;
use crate::domain::tasks::{self, ReceiptError};

pub fn router() -> OpenApiRouter<Arc<TaskStatusContext>> {
    OpenApiRouter::default().routes(routes!(task_receipt))
}

/// Get a task's signed receipt
///
/// Proof of what this paid task's buyer paid and, once it has ended, of what
/// it delivered, signed with the seller's key as x402's `offer-receipt`
/// extension specifies: `{format: "jws", signature}`, a JWS (`ES256K`)
/// whose `kid` is the key's `did:key`. Its payload (`ReceiptPayload`)
/// names the task, its kind and the SHA-256 of its input, the amount
/// charged (for a metered task its unit, rate and use; for a task paid with
/// a credit, scheme `credit`, the credit and the task that left it), the
/// network, transaction and payer, and, once the task has ended, the SHA-256 of its
/// result and of each output file. It is the seller's when the key's
/// address is the catalog's `receipts.signer`; `reeve receipt verify FILE
/// [--output FILE]…` checks that offline. The receipt is the same each time
/// it is read until the task ends, then a final one (its `issuedAt` is when
/// it ended); a key held in AWS KMS signs it anew at each read, every
/// signature valid.
#[utoipa::path(
    get,
    path = "/v1/tasks/{task}/receipt",
    tag = "tasks",
    security(("bearer" = [])),
    params(
        ("task" = Id, Path, description = "The task id, from `POST /v1/tasks/{kind}`."),
    ),
    responses(
        (status = 200, description = "The signed receipt; its JWS payload is a `ReceiptPayload`.", body = Signed),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope,
            description = "`task_not_found`: no such task in this Space (or not a task id at all). \
                `no_receipt`: the task has no receipt: it was free, a metered task has not \
                been charged (yet, or at all: it used nothing, failed or was canceled), or this deployment signs \
                no receipts; the message says which."),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope,
            description = "`database_unavailable`: try again. `signer_unavailable`: the seller's key is in \
                AWS KMS, which did not sign just now; try again after `Retry-After` seconds."),
    ),
)]
async fn task_receipt(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
    id: Result<Path<String>, PathRejection>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> Result<Json<Signed>, Response> {
    let Some(task) = id.ok().and_then(|Path(id)| id.parse::<Id>().ok()) else {
        return Err(ApiError::task_not_found().into_response());
    };
    let origin = super::extract::origin(&uri, &headers).unwrap_or_default();
    let resource_url = |kind: &str| format!("{origin}/v1/tasks/{kind}");
    let receipt = tasks::signed_receipt(&ctx.db, ctx.seller.as_deref(), &space, task, &resource_url).await;
    match receipt.map_err(unavailable)? {
        None => Err(ApiError::task_not_found().into_response()),
        Some(Err(why)) => Err(ApiError::refused(&TaskRefusal::NoReceipt(why.message())).into_response()),
        Some(Ok(receipt)) => Ok(Json(receipt)),
    }
}

/// The database's or the signer's failure, with the wait before a retry.
fn unavailable(e: ReceiptError) -> Response {
    let mut response = ApiError::refused(&e).into_response();
    if let Some(after) = e.retry_after() {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(after.as_secs()));
    }
    response
}
