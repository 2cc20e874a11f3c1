//! CORS for browser clients: which other origins may call the API and the
//! relay from a page, and which answer headers such a page may read.
//!
//! Origins are listed in `REEVE_CORS_ORIGINS` (read by `startup`) (comma-separated, each
//! `scheme://host[:port]`). Unset or empty means no origin is allowed and
//! no CORS header is ever sent, which is the production default: only the
//! pages an operator names can use a visitor's token from a browser.

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, HeaderValue, Method, header};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// x402's headers (`crate::domain::payments` names them; the relay, which has no
/// payments, answers the same CORS as the API).
const PAYMENT_REQUIRED_HEADER: &str = "payment-required";
const PAYMENT_SIGNATURE_HEADER: &str = "payment-signature";

/// Answer headers a cross-origin page may read: the x402 challenge and
/// receipt, the request id every error names, where a new task lives,
/// whether an idempotent create was a replay, and when to send a refused
/// request again (`Retry-After` is not one a browser shows a page unasked).
pub const EXPOSED: [&str; 6] =
    [PAYMENT_REQUIRED_HEADER, "payment-response", "x-request-id", "location", "idempotent-replayed", "retry-after"];

/// Request headers a cross-origin page may send beyond the CORS-safelisted
/// ones.
pub const ALLOWED: [&str; 5] =
    ["authorization", "content-type", "idempotency-key", PAYMENT_SIGNATURE_HEADER, "last-event-id"];

/// How long a browser may cache a preflight answer.
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// The origins allowed to call from a browser; empty allows none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CorsOrigins(Vec<HeaderValue>);

impl CorsOrigins {
    /// Comma-separated origins, every bad one reported. An origin is exactly
    /// what a browser sends in `Origin`: a scheme (`http` or `https`), a host
    /// and maybe a port, no path, no trailing slash. `*` is refused: a page
    /// holding a visitor's token should be one the operator chose.
    pub fn parse(list: &str) -> Result<CorsOrigins, Vec<String>> {
        let mut origins = Vec::new();
        let mut problems = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match origin(item) {
                Ok(value) => origins.push(value),
                Err(why) => problems.push(format!("{item:?} {why}")),
            }
        }
        if problems.is_empty() { Ok(CorsOrigins(origins)) } else { Err(problems) }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The layer answering preflights and marking answers for these origins.
    pub fn layer(&self) -> CorsLayer {
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(self.0.clone()))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers(ALLOWED.map(HeaderName::from_static))
            .expose_headers(EXPOSED.map(HeaderName::from_static))
            .max_age(MAX_AGE)
            .vary([header::ORIGIN, header::ACCESS_CONTROL_REQUEST_METHOD, header::ACCESS_CONTROL_REQUEST_HEADERS])
    }
}

fn origin(item: &str) -> Result<HeaderValue, &'static str> {
    if item == "*" {
        return Err("is a wildcard; list each allowed origin");
    }
    let (scheme, rest) = item.split_once("://").ok_or("is not an origin: expected scheme://host[:port]")?;
    if scheme != "http" && scheme != "https" {
        return Err("is not an origin: the scheme must be http or https");
    }
    let authority: axum::http::uri::Authority =
        rest.parse().map_err(|_| "is not an origin: expected scheme://host[:port]")?;
    if authority.as_str() != rest || rest.contains('@') || authority.host().is_empty() {
        return Err("is not an origin: no path, user or trailing slash");
    }
    if item.chars().any(|c| c.is_ascii_uppercase()) {
        return Err("is not an origin as browsers send it: write it in lowercase");
    }
    HeaderValue::from_str(item).map_err(|_| "is not a valid header value")
}

/// `router` with CORS for `origins` around everything it answers, errors
/// included, so a page can read an error's code and request id. With no
/// origins the router is returned as it is: no CORS header at all.
pub fn with_cors(router: Router, origins: &CorsOrigins) -> Router {
    if origins.is_empty() { router } else { router.layer(origins.layer()) }
}

#[cfg(all(test, feature = "catalog"))]
mod tests {
    #[test]
    fn the_payment_headers_are_x402s() {
        assert_eq!(super::PAYMENT_REQUIRED_HEADER, crate::domain::payments::PAYMENT_REQUIRED_HEADER);
        assert_eq!(super::PAYMENT_SIGNATURE_HEADER, crate::domain::payments::PAYMENT_SIGNATURE_HEADER);
    }
}
