//! `GET /v1/space`: the Space behind the session, with what it paid and the
//! credits it holds. Served by the task-status function.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::TaskStatusContext;
use super::error::{ApiResult, ErrorEnvelope, db_error};
use super::extract::Session;
use crate::payments::ledger::{self, Credit, PaymentRecord};

/// How many payments and credits the answer lists, newest first.
const LISTED: i64 = 100;

pub fn router() -> OpenApiRouter<Arc<TaskStatusContext>> {
    OpenApiRouter::default().routes(routes!(read_space))
}

/// A Space's payments and credits.
#[derive(Serialize, ToSchema)]
#[schema(as = Space)]
struct SpaceView {
    /// Settled x402 payments, newest first (up to 100): one per paid task.
    payments: Vec<PaymentRecord>,
    /// Credits left by paid tasks that ended without doing their work, newest
    /// first (up to 100). An unspent one (`spent_by: null`) pays the next
    /// task of the same price in the same asset, instead of a payment.
    credits: Vec<Credit>,
}

/// Read the Space
///
/// The payments this Space made and the credits it holds or has spent.
#[utoipa::path(
    get,
    path = "/v1/space",
    tag = "spaces",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The Space's payments and credits.", body = SpaceView),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn read_space(State(ctx): State<Arc<TaskStatusContext>>, Session(space): Session) -> ApiResult<Json<SpaceView>> {
    let (payments, credits) = ledger::for_space(&ctx.db, &space, LISTED).await.map_err(db_error)?;
    Ok(Json(SpaceView { payments, credits }))
}
