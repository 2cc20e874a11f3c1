//! `GET /v1/catalog`: the validated catalog with prices in atomic units. It
//! needs no auth: prices are public, like a shop window.

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use super::Ctx;

pub fn router() -> Router<Ctx> {
    Router::new().route("/v1/catalog", get(catalog))
}

async fn catalog(State(ctx): State<Ctx>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], ctx.catalog_json.clone())
}
