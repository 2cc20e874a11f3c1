//! The clients for hosts Reeve does not own: SSRF-guarded.
//!
//! There are two, with two allow-lists, because their URLs come from two
//! different people:
//! - the users' client ([`OutboundPolicy::users`], `REEVE_FETCH_ALLOW`)
//!   fetches URLs a task's owner chose (`fetch`). Its allow-list is empty in
//!   production: a user may reach public addresses only.
//! - the operators' client ([`OutboundPolicy::operators`],
//!   `REEVE_OPERATOR_ALLOW`) calls the endpoints the operator configured:
//!   the `http` executor endpoints and the payment facilitator, which may
//!   well be private hosts.
//!
//! Allow-listing a private executor host for the operators' client
//! therefore never lets a user `fetch` it, directly or through a redirect.
//!
//! - Every resolved address goes through [`is_blocked`] (a custom reqwest
//!   `dns_resolver`), on every resolution, so DNS rebinding fails.
//! - Literal-IP URLs (which reqwest never resolves) are checked the same way
//!   before sending, after WHATWG normalisation (`2130706433`, `0x7f.1`, …).
//! - Redirects are limited (`max_redirects`) and each target is re-checked.
//! - `no_proxy()`, connect and total timeouts, a streamed response size cap.
//! - HTTPS only unless `allow_http` (development); other schemes and URLs with
//!   credentials are always refused.
//! - The allow-list is exact: an IP (`127.0.0.1`, `::1`), a hostname
//!   (`facilitator.internal`) or `host:port`. An allow-listed hostname skips
//!   the address filter; an allow-listed IP passes even in a blocked range.
//!   A plain IP entry also lets that address through when a name resolves to
//!   it; an `ip:port` entry only covers literal-IP URLs on that port. A name
//!   listed only as `host:port` is refused on any other port.

mod guard;
mod ranges;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, LOCATION, RETRY_AFTER};

pub use guard::ResolveFn;
use guard::{AllowList, FilteringResolver, Guard, Refused, ResolveError};
pub use ranges::is_blocked;

#[derive(Debug, Clone)]
pub struct OutboundPolicy {
    /// Plain `http://` allowed: a development setting only.
    pub allow_http: bool,
    /// Exact hosts or IP addresses let through although they would be blocked.
    pub allow: Vec<String>,
    pub max_redirects: usize,
    pub connect_timeout: Duration,
    pub timeout: Duration,
}

impl Default for OutboundPolicy {
    /// HTTPS only, empty allow-list, 3 redirects, 5 s connect, 30 s total.
    fn default() -> Self {
        OutboundPolicy {
            allow_http: false,
            allow: Vec::new(),
            max_redirects: 3,
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
        }
    }
}

/// The users' allow-list (`fetch`): empty in production.
pub const FETCH_ALLOW: &str = "REEVE_FETCH_ALLOW";
/// The operators' allow-list: `http` executor endpoints, the facilitator.
pub const OPERATOR_ALLOW: &str = "REEVE_OPERATOR_ALLOW";
/// Plain `http://` for both clients: development only.
pub const ALLOW_HTTP: &str = "REEVE_OUTBOUND_ALLOW_HTTP";

impl OutboundPolicy {
    /// The users' client: the defaults, with `REEVE_FETCH_ALLOW`
    /// (comma-separated exact entries) and `REEVE_OUTBOUND_ALLOW_HTTP`
    /// (`1`/`true`) applied.
    pub fn users(var: impl Fn(&str) -> Option<String>) -> Self {
        Self::from_vars(FETCH_ALLOW, var)
    }

    /// The operators' client: the defaults, with `REEVE_OPERATOR_ALLOW` and
    /// `REEVE_OUTBOUND_ALLOW_HTTP` applied.
    pub fn operators(var: impl Fn(&str) -> Option<String>) -> Self {
        Self::from_vars(OPERATOR_ALLOW, var)
    }

    fn from_vars(allow_variable: &str, var: impl Fn(&str) -> Option<String>) -> Self {
        let allow = var(allow_variable)
            .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect())
            .unwrap_or_default();
        let allow_http =
            var(ALLOW_HTTP).map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true")).unwrap_or(false);
        OutboundPolicy { allow, allow_http, ..Self::default() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
    #[error("blocked: {0}")]
    Blocked(String),
    #[error("response larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("timed out")]
    Timeout,
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("HTTP error: {0}")]
    Http(String),
}

impl OutboundError {
    /// Worth trying again later (the network), as opposed to never (policy, URL, size).
    pub fn is_retryable(&self) -> bool {
        matches!(self, OutboundError::Timeout | OutboundError::Connect(_) | OutboundError::Http(_))
    }
}

#[derive(Debug, Clone)]
pub struct OutboundResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: bytes::Bytes,
    /// After redirects.
    pub final_url: String,
    /// How long the server asked to wait before asking again (its
    /// `Retry-After`, in seconds or as a date), when it said.
    pub retry_after: Option<Duration>,
    /// Where a redirect pointed, for a client that does not follow them
    /// ([`Outbound::not_following_redirects`]).
    pub location: Option<String>,
}

/// The guarded client. Cheap to clone (shared connection pool). `policy` is
/// the policy it was built with: changing it afterwards has no effect.
#[derive(Clone)]
pub struct Outbound {
    pub policy: OutboundPolicy,
    guard: Arc<Guard>,
    client: reqwest::Client,
    /// Whether redirects are followed (each target re-checked), or handed
    /// back as the 3xx they are.
    follows: bool,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl Outbound {
    /// A client resolving names with the system resolver. Fails only on a
    /// malformed allow-list entry (or a TLS backend that cannot start).
    pub fn new(policy: OutboundPolicy) -> Result<Self, OutboundError> {
        Self::build(policy, None)
    }

    /// The same client with names resolved by `resolver` (tests): its answer
    /// goes through the same filter as the system resolver's. Names that are
    /// IP spellings are never passed to it.
    pub fn with_resolver<F>(policy: OutboundPolicy, resolver: F) -> Result<Self, OutboundError>
    where
        F: Fn(&str) -> Vec<std::net::IpAddr> + Send + Sync + 'static,
    {
        Self::build(policy, Some(Arc::new(resolver)))
    }

    fn build(policy: OutboundPolicy, lookup: Option<Arc<ResolveFn>>) -> Result<Self, OutboundError> {
        let allow = AllowList::parse(&policy.allow).map_err(OutboundError::InvalidUrl)?;
        let guard = Arc::new(Guard { allow_http: policy.allow_http, allow, lookup });
        Self::build_on(policy, guard, true)
    }

    /// The same client (policy, allow-list, resolver) that never follows a
    /// redirect: a 3xx comes back as a response, with its `location`. For a
    /// POST whose body must reach the URL named and nowhere else (a
    /// webhook): a redirect is the endpoint's answer, not a new target.
    pub fn not_following_redirects(&self) -> Result<Self, OutboundError> {
        Self::build_on(self.policy.clone(), self.guard.clone(), false)
    }

    fn build_on(policy: OutboundPolicy, guard: Arc<Guard>, follows: bool) -> Result<Self, OutboundError> {
        let redirect_guard = guard.clone();
        let max_redirects = policy.max_redirects;
        let redirect = if !follows {
            reqwest::redirect::Policy::none()
        } else {
            reqwest::redirect::Policy::custom(move |attempt| {
                // `previous` starts with the original URL.
                if attempt.previous().len() > max_redirects {
                    let msg = format!("more than {max_redirects} redirects");
                    return attempt.error(Refused(msg));
                }
                match redirect_guard.check_url(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(why) => {
                        tracing::debug!(reason = %why, "outbound: redirect refused");
                        attempt.error(Refused(format!("redirect refused: {why}")))
                    }
                }
            })
        };
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(crate::infra::tls::client_config().as_ref().clone())
            .no_proxy()
            .dns_resolver(FilteringResolver(guard.clone()))
            .redirect(redirect)
            .referer(false)
            .https_only(!policy.allow_http)
            .connect_timeout(policy.connect_timeout)
            .timeout(policy.timeout)
            .user_agent(concat!("reeve/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|_| OutboundError::Http("cannot build the HTTP client".into()))?;
        Ok(Outbound { policy, guard, client, follows })
    }

    /// Parses and checks `url` against the policy without sending anything:
    /// scheme, credentials, allow-list, literal IP addresses. Hostnames are
    /// checked later, at each resolution.
    pub fn check_url(&self, url: &str) -> Result<Url, OutboundError> {
        let url = Url::parse(url).map_err(|e| OutboundError::InvalidUrl(e.to_string()))?;
        self.guard.check_url(&url).map_err(OutboundError::Blocked)?;
        Ok(url)
    }

    /// The guarded reqwest client itself, for a library that sends its own
    /// requests (alloy's JSON-RPC transport) to one fixed URL. Every name it
    /// resolves still goes through the address filter, but the policy's URL
    /// checks do not run per request: check that URL with
    /// [`Outbound::check_url`] first.
    pub fn reqwest_client(&self) -> reqwest::Client {
        self.client.clone()
    }

    /// What the client's resolver answers for `host`, after filtering
    /// (never connects). `Blocked` when only blocked addresses are left.
    pub async fn resolve(&self, host: &str) -> Result<Vec<std::net::IpAddr>, OutboundError> {
        self.guard.resolve(host).await.map_err(|e| match e {
            ResolveError::Refused(r) => OutboundError::Blocked(r.0),
            ResolveError::Lookup(m) => OutboundError::Connect(m),
        })
    }

    pub async fn get(&self, url: &str, max_bytes: u64) -> Result<OutboundResponse, OutboundError> {
        let url = self.check_url(url)?;
        let req = self.client.get(url.clone());
        self.send(req, &url, self.policy.timeout, max_bytes).await
    }

    /// POSTs `body` as JSON (`content-type` and `accept: application/json`)
    /// with `timeout` for the whole exchange, body included.
    pub async fn post_json(
        &self,
        url: &str,
        body: &serde_json::Value,
        timeout: Duration,
        max_bytes: u64,
    ) -> Result<OutboundResponse, OutboundError> {
        let url = self.check_url(url)?;
        let bytes = serde_json::to_vec(body).map_err(|e| OutboundError::Http(format!("cannot encode JSON: {e}")))?;
        let req = self
            .client
            .post(url.clone())
            .timeout(timeout)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json")
            .body(bytes);
        self.send(req, &url, timeout, max_bytes).await
    }

    /// POSTs `body`, already JSON, with `headers` besides its content type
    /// (a signed job's `webhook-*` headers), as [`post_json`](Self::post_json).
    pub async fn post_signed(
        &self,
        url: &str,
        body: Vec<u8>,
        headers: &[(&str, String)],
        timeout: Duration,
        max_bytes: u64,
    ) -> Result<OutboundResponse, OutboundError> {
        let url = self.check_url(url)?;
        let mut req = self
            .client
            .post(url.clone())
            .timeout(timeout)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json");
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        self.send(req.body(body), &url, timeout, max_bytes).await
    }

    /// GETs `url` for reading its body a chunk at a time
    /// ([`OutboundStream::chunk`]), so that a large download never sits in
    /// memory whole. The cap and the total timeout hold while reading.
    pub async fn get_stream(&self, url: &str, max_bytes: u64) -> Result<OutboundStream, OutboundError> {
        let url = self.check_url(url)?;
        let host = url.host_str().unwrap_or_default().to_string();
        let deadline = tokio::time::Instant::now() + self.policy.timeout;
        let opened = tokio::time::timeout_at(deadline, self.open(self.client.get(url.clone()), &host, max_bytes)).await;
        let response = opened.map_err(|_| OutboundError::Timeout)??;
        Ok(OutboundStream {
            status: response.status().as_u16(),
            content_type: content_type_of(&response),
            final_url: response.url().to_string(),
            content_length: response.content_length(),
            response,
            host,
            max_bytes,
            read: 0,
            deadline,
        })
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        url: &Url,
        timeout: Duration,
        max_bytes: u64,
    ) -> Result<OutboundResponse, OutboundError> {
        let host = url.host_str().unwrap_or_default().to_string();
        // reqwest enforces `timeout` too; this is the backstop covering the body.
        let result = tokio::time::timeout(timeout, async {
            let mut resp = self.open(req, &host, max_bytes).await?;
            let status = resp.status().as_u16();
            let content_type = content_type_of(&resp);
            let final_url = resp.url().to_string();
            let retry_after = retry_after(resp.headers(), time::OffsetDateTime::now_utc());
            let location = resp.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
            let mut body = BytesMut::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| map_error(e, &host))? {
                if body.len() as u64 + chunk.len() as u64 > max_bytes {
                    return Err(OutboundError::TooLarge { limit: max_bytes });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(OutboundResponse { status, content_type, body: Bytes::from(body), final_url, retry_after, location })
        })
        .await;
        match result {
            Ok(r) => {
                if let Err(e) = &r {
                    tracing::debug!(host = %host, error = %e, "outbound request failed");
                }
                r
            }
            Err(_) => Err(OutboundError::Timeout),
        }
    }

    /// Sends the request and checks what the headers already tell: an
    /// announced size over the cap, a redirect to a refused target.
    async fn open(
        &self,
        req: reqwest::RequestBuilder,
        host: &str,
        max_bytes: u64,
    ) -> Result<reqwest::Response, OutboundError> {
        let resp = req.send().await.map_err(|e| map_error(e, host))?;
        if resp.content_length().is_some_and(|n| n > max_bytes) {
            return Err(OutboundError::TooLarge { limit: max_bytes });
        }
        // A redirect reqwest could not follow (e.g. `Location: file:///…`)
        // is refused like any other, rather than handed back as a 3xx; a
        // client that follows none hands every 3xx back.
        if self.follows && resp.status().is_redirection() {
            let next = resp.headers().get(LOCATION).and_then(|v| v.to_str().ok()).and_then(|l| resp.url().join(l).ok());
            if let Some(Err(why)) = next.map(|next| self.guard.check_url(&next)) {
                return Err(OutboundError::Blocked(format!("redirect refused: {why}")));
            }
        }
        Ok(resp)
    }
}

fn content_type_of(resp: &reqwest::Response) -> Option<String> {
    resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// `Retry-After` (RFC 9110, section 10.2.3) as a wait from `now`: a number
/// of seconds, or an HTTP date (IMF-fixdate, the one form a server may
/// send) that is in the past for a wait of 0. Anything else is ignored.
fn retry_after(headers: &HeaderMap, now: time::OffsetDateTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let at = time::PrimitiveDateTime::parse(value, &format).ok()?.assume_utc();
    Some(Duration::try_from(at - now).unwrap_or(Duration::ZERO))
}

/// A response being read a chunk at a time ([`Outbound::get_stream`]).
pub struct OutboundStream {
    pub status: u16,
    pub content_type: Option<String>,
    /// After redirects.
    pub final_url: String,
    /// The size the remote announced, if it did (already within the cap).
    pub content_length: Option<u64>,
    response: reqwest::Response,
    host: String,
    max_bytes: u64,
    read: u64,
    deadline: tokio::time::Instant,
}

impl OutboundStream {
    /// The next piece of the body; `None` at its end. `TooLarge` as soon as
    /// the body passes the cap, `Timeout` once the request's total time is up.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, OutboundError> {
        let next = tokio::time::timeout_at(self.deadline, self.response.chunk())
            .await
            .map_err(|_| OutboundError::Timeout)?
            .map_err(|e| map_error(e, &self.host))?;
        if let Some(chunk) = &next {
            self.read += chunk.len() as u64;
            if self.read > self.max_bytes {
                return Err(OutboundError::TooLarge { limit: self.max_bytes });
            }
        }
        Ok(next)
    }
}

/// Maps a reqwest error without leaking more than the host: our own refusal
/// (resolver or redirect policy) wins, then timeouts, then connect errors.
fn map_error(e: reqwest::Error, host: &str) -> OutboundError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut io_kind = None;
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<Refused>() {
            return OutboundError::Blocked(r.0.clone());
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            io_kind.get_or_insert(io.kind());
        }
        source = s.source();
    }
    if e.is_timeout() {
        return OutboundError::Timeout;
    }
    if e.is_connect() {
        let what = match io_kind {
            _ if e.is_dns() => "name lookup failed".to_string(),
            Some(std::io::ErrorKind::NotFound) => "name lookup failed".to_string(),
            Some(kind) => kind.to_string(),
            None => "connection failed".to_string(),
        };
        return OutboundError::Connect(format!("{host}: {what}"));
    }
    let what = if e.is_redirect() {
        "bad redirect"
    } else if e.is_body() || e.is_decode() {
        "error reading the response"
    } else if e.is_builder() {
        "cannot build the request"
    } else {
        "request failed"
    };
    OutboundError::Http(format!("{host}: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        let now = time::macros::datetime!(2026-12-02 16:00:00 UTC);
        let of = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, value.parse().unwrap());
            retry_after(&headers, now)
        };
        assert_eq!(of("120"), Some(Duration::from_secs(120)));
        assert_eq!(of(" 0 "), Some(Duration::ZERO));
        assert_eq!(of("Wed, 02 Dec 2026 16:01:30 GMT"), Some(Duration::from_secs(90)));
        assert_eq!(of("Wed, 02 Dec 2026 15:00:00 GMT"), Some(Duration::ZERO), "a date past is now");
        for junk in ["-5", "soon", "1.5", "Wednesday, 02-Dec-26 16:01:30 GMT"] {
            assert_eq!(of(junk), None, "{junk}");
        }
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn policy_from_vars() {
        let p = OutboundPolicy::users(|_| None);
        assert!(!p.allow_http && p.allow.is_empty());
        assert_eq!(
            (p.max_redirects, p.connect_timeout, p.timeout),
            (3, Duration::from_secs(5), Duration::from_secs(30))
        );
        let vars = |k: &str| match k {
            "REEVE_OPERATOR_ALLOW" => Some(" 127.0.0.1, facilitator.internal:8443,,::1 ".into()),
            "REEVE_OUTBOUND_ALLOW_HTTP" => Some("TRUE".into()),
            _ => None,
        };
        let p = OutboundPolicy::operators(vars);
        assert_eq!(p.allow, vec!["127.0.0.1", "facilitator.internal:8443", "::1"]);
        assert!(p.allow_http);
        // The operators' entries are not the users'.
        let users = OutboundPolicy::users(vars);
        assert!(users.allow.is_empty() && users.allow_http);
        for (v, want) in [("1", true), ("true", true), ("0", false), ("yes", false), ("", false)] {
            let p = OutboundPolicy::users(|k| (k == "REEVE_OUTBOUND_ALLOW_HTTP").then(|| v.to_string()));
            assert_eq!(p.allow_http, want, "{v:?}");
        }
    }

    #[test]
    fn bad_allow_list_entry_is_an_error() {
        let policy = OutboundPolicy { allow: vec!["*.example.com".into()], ..Default::default() };
        assert!(matches!(Outbound::new(policy), Err(OutboundError::InvalidUrl(_))));
    }

    #[test]
    fn retryable() {
        assert!(!OutboundError::Blocked("x".into()).is_retryable());
        assert!(!OutboundError::TooLarge { limit: 1 }.is_retryable());
        assert!(!OutboundError::InvalidUrl("x".into()).is_retryable());
        assert!(OutboundError::Timeout.is_retryable());
    }
}
