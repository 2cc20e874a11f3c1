//! `401 token_in_url`: a session token in a query string is refused on every
//! route, before its handler runs. URLs reach access logs (the relay's load
//! balancer writes whole URLs to S3), browser history and shared links, and
//! a session can spend the Space's credits. The `access_token` parameter
//! the stream once took is refused whatever its value; any other parameter
//! is refused when its value has a session token's shape, signed or not.
//! A task's stream opens with a ticket instead (`POST /v1/tasks/{id}/ticket`).

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::domain::auth;
use crate::domain::error::TokenRefusal;

/// The query parameter the stream took a session token in, before tickets.
pub const ACCESS_TOKEN: &str = "access_token";

pub async fn refuse(request: Request, next: Next) -> Response {
    if request.uri().query().is_some_and(carries_a_session_token) {
        return ApiError::refused(&TokenRefusal::InUrl).into_response();
    }
    next.run(request).await
}

fn carries_a_session_token(query: &str) -> bool {
    url::form_urlencoded::parse(query.as_bytes())
        .any(|(name, value)| name == ACCESS_TOKEN || auth::looks_like_session_token(&value))
}
