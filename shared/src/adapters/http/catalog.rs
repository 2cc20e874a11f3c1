//! The catalog function's routes, both public like a shop window:
//! `GET /v1/catalog`, the validated catalog with prices in atomic units, and
//! `GET /v1/openapi.json`, the OpenAPI document of the whole API.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::context::CatalogContext;
use crate::domain::catalog::PublicCatalog;

pub fn router() -> OpenApiRouter<Arc<CatalogContext>> {
    OpenApiRouter::default().routes(routes!(catalog)).routes(routes!(openapi_json))
}

/// What Reeve sells
///
/// Every task kind with its input schema and prices (amounts in atomic
/// units, as strings), the assets prices are paid in, and the upload policy.
/// Needs no token.
#[utoipa::path(
    get,
    path = "/v1/catalog",
    tag = "catalog",
    responses((status = 200, description = "The catalog.", body = PublicCatalog)),
)]
async fn catalog(State(ctx): State<Arc<CatalogContext>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], ctx.catalog_json.clone())
}

/// This document
///
/// The OpenAPI 3.1 description of every route, with one create operation
/// per task kind of this deployment's catalog. Needs no token.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "catalog",
    responses((status = 200, description = "An OpenAPI 3.1 document.", content_type = "application/json",
        body = Object)),
)]
async fn openapi_json(State(ctx): State<Arc<CatalogContext>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], ctx.openapi_json())
}
