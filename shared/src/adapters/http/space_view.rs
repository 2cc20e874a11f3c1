//! `GET /v1/space`: the Space behind the session, with what it paid, the
//! credits it holds, and its use of the free kinds' quotas. Served by the
//! task-status function.

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
use crate::domain::payments::ledger::{self, Credit, PaymentRecord};
use crate::domain::tasks::quota::{self, QuotaUse};

/// How many payments and credits the answer lists, newest first.
const LISTED: i64 = 100;

pub fn router() -> OpenApiRouter<Arc<TaskStatusContext>> {
    OpenApiRouter::default().routes(routes!(read_space))
}

/// A Space's payments, credits and quotas.
#[derive(Serialize, ToSchema)]
#[schema(as = Space)]
struct SpaceView {
    /// Settled x402 payments, newest first (up to 100): one per paid task.
    payments: Vec<PaymentRecord>,
    /// Credits left by paid tasks that ended without doing their work, newest
    /// first (up to 100). An unspent one (`spent_by: null`) pays the next
    /// task of the same price in the same asset, instead of a payment.
    credits: Vec<Credit>,
    /// Each free kind's quota and how much of it this Space uses now, in
    /// the catalog's order. Over one, creating the kind answers `429
    /// quota_exceeded`. Priced kinds have none.
    quotas: Vec<QuotaUse>,
}

/// Read the Space
///
/// The payments this Space made, the credits it holds or has spent, and
/// how much of each free kind's quota it uses.
#[utoipa::path(
    get,
    path = "/v1/space",
    tag = "spaces",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The Space's payments, credits and quotas.", body = SpaceView),
        (status = 401, description = doc_401_token!(), body = ErrorEnvelope),
        (status = 500, description = doc_500!(), body = ErrorEnvelope),
        (status = 503, description = doc_503_db!(), body = ErrorEnvelope),
    ),
)]
async fn read_space(State(ctx): State<Arc<TaskStatusContext>>, Session(space): Session) -> ApiResult<Json<SpaceView>> {
    let (ledger, quotas) =
        tokio::join!(ledger::for_space(&ctx.db, &space, LISTED), quota::usage(&ctx.db, &ctx.catalog, &space));
    let (payments, credits) = ledger.map_err(db_error)?;
    Ok(Json(SpaceView { payments, credits, quotas: quotas.map_err(db_error)? }))
}
