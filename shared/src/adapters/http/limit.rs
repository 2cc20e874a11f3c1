//! Per-client limits on the login routes of `reeve serve`.
//!
//! `POST /v1/spaces` and `POST /v1/sessions` run Argon2id, so they are
//! throttled. A throttle shared by every caller lets one client lock everyone
//! out, so each client gets its own budget here (a GCRA limiter per key,
//! the `governor` crate), and a client over it gets `429 rate_limited` with
//! `Retry-After`, while other clients are unaffected.
//!
//! Spaces are also what free work is counted by: each has its own quota of
//! every free task kind (`tasks::quota`). So a client gets few of them, a
//! burst of 10 and then one a minute (70 in a first hour), which bounds the
//! free work one address can have done.
//!
//! A client is its IP address, as the TCP peer: `reeve serve` is meant to
//! be reached directly. The limits of that choice:
//! - every IPv6 address in one /64 is one client, since a single host is
//!   commonly handed a whole /64 and could otherwise rotate addresses freely;
//!   so neighbours sharing a /64 share a budget;
//! - clients behind one NAT (an office, a carrier-grade NAT) share one IPv4
//!   address, hence one budget;
//! - behind a reverse proxy every request comes from the proxy: put the
//!   limit in the proxy instead (on AWS, the template's optional WAF rules
//!   do this for the API).
//!
//! The state lives in this process only; several `reeve serve` processes
//! each count on their own.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::client_addr::client_key;
use super::error::ApiError;

/// One route's budget per client: `burst` at once, then one more each
/// `every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub burst: u32,
    pub every: Duration,
}

/// Per client: a burst of 10 new spaces, then one a minute.
pub const SPACES: Budget = Budget { burst: 10, every: Duration::from_secs(60) };
/// Per client: a burst of 10 sessions, then two a second.
pub const SESSIONS: Budget = Budget { burst: 10, every: Duration::from_millis(500) };

/// Keys remembered before idle ones are dropped.
const MAX_TRACKED: usize = 100_000;

/// The limiters of the login routes.
pub struct LoginLimits {
    spaces: DefaultKeyedRateLimiter<IpAddr>,
    sessions: DefaultKeyedRateLimiter<IpAddr>,
}

impl Default for LoginLimits {
    fn default() -> Self {
        Self::new(SPACES, SESSIONS)
    }
}

impl LoginLimits {
    pub fn new(spaces: Budget, sessions: Budget) -> Self {
        let quota = |budget: Budget| {
            Quota::with_period(budget.every)
                .expect("a budget refills after some time")
                .allow_burst(NonZeroU32::new(budget.burst).expect("burst > 0"))
        };
        LoginLimits { spaces: RateLimiter::keyed(quota(spaces)), sessions: RateLimiter::keyed(quota(sessions)) }
    }

    fn for_request(&self, method: &Method, path: &str) -> Option<&DefaultKeyedRateLimiter<IpAddr>> {
        if method != Method::POST {
            return None;
        }
        match path {
            "/v1/spaces" => Some(&self.spaces),
            "/v1/sessions" => Some(&self.sessions),
            _ => None,
        }
    }
}

/// The layer: `router.layer(axum::middleware::from_fn_with_state(limits, limit))`,
/// served with `into_make_service_with_connect_info::<SocketAddr>()` so the
/// peer address is known. Without it (a test's `oneshot`), nothing is limited.
pub async fn limit(State(limits): State<Arc<LoginLimits>>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    if let (Some(limiter), Some(peer)) = (limits.for_request(request.method(), request.uri().path()), peer) {
        if limiter.len() > MAX_TRACKED {
            limiter.retain_recent();
        }
        if let Err(not_until) = limiter.check_key(&client_key(peer)) {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let mut response = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("too many requests from your address; try again in {seconds} s"),
            )
            .into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
            return response;
        }
    }
    next.run(request).await
}
