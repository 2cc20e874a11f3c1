//! `GET /v1/tasks/{task}/receipt`: a paid task's receipt, signed with the
//! seller's key (x402 `offer-receipt`; [`crate::domain::tasks::receipt`]).

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{OriginalUri, Path, State};
use axum::http::HeaderMap;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskStatusContext;
use super::error::{ApiError, ApiResult, ErrorEnvelope, db_error};
use super::extract::Session;
use crate::domain::error::TaskRefusal;
use crate::domain::ids::Id;
use crate::domain::payments::offer_receipt::Signed;
use crate::domain::tasks;

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
/// it ended).
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
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn task_receipt(
    State(ctx): State<Arc<TaskStatusContext>>,
    Session(space): Session,
    id: Result<Path<String>, PathRejection>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
) -> ApiResult<Json<Signed>> {
    let Some(task) = id.ok().and_then(|Path(id)| id.parse::<Id>().ok()) else {
        return Err(ApiError::task_not_found());
    };
    let origin = super::extract::origin(&uri, &headers).unwrap_or_default();
    let resource_url = |kind: &str| format!("{origin}/v1/tasks/{kind}");
    match tasks::signed_receipt(&ctx.db, ctx.seller.as_deref(), &space, task, &resource_url).await.map_err(db_error)? {
        None => Err(ApiError::task_not_found()),
        Some(Err(why)) => Err(ApiError::refused(&TaskRefusal::NoReceipt(why.message()))),
        Some(Ok(receipt)) => Ok(Json(receipt)),
    }
}
