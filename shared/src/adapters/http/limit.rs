//! The login limits on the REST routes: `POST /v1/spaces` and
//! `POST /v1/sessions` spend the client address's budget
//! ([`crate::domain::login_limits`]) before any Argon2id work, the same
//! budget MCP's `create_space` and `login` spend. Over it the answer is
//! `429 rate_limited` with `Retry-After`, and nothing is made.
//!
//! A client is its address as the transport saw it, or behind the
//! template's CloudFront edge the viewer address the edge vouches for
//! ([`crate::infra::client_addr::client_behind`]), every address of one network
//! counted as one client (by default an IPv6 /56, a common home line's
//! prefix, and each IPv4 address). Clients behind one NAT share a
//! budget; behind a reverse proxy of its own, `reeve serve` sees only the
//! proxy, so limit there instead (on AWS, API Gateway gives the real source
//! address, and the template's optional WAF rules add an edge limit).

use axum::http::{Extensions, HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::context::AuthContext;
use super::error::ApiError;
use crate::domain::login_limits::Action;
use crate::infra::client_addr::client_behind;

/// Spends one `action` of the request's client (behind the CloudFront edge,
/// the viewer it vouches for): `Err` is the answer to send instead of doing
/// the work.
pub async fn spend(
    ctx: &AuthContext,
    (headers, extensions): (&HeaderMap, &Extensions),
    action: Action,
) -> Result<(), Response> {
    let Some(client) = client_behind(ctx.limits.edge.as_ref(), headers, extensions) else {
        return Ok(());
    };
    match ctx.limits.spend(&ctx.db, client, action).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(limited)) => {
            let mut response = ApiError::refused(&limited).into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(limited.seconds()));
            Err(response)
        }
        Err(e) => Err(ApiError::refused(&e).into_response()),
    }
}
