//! The facilitator client: `POST /verify` and `POST /settle` of the x402 HTTP
//! facilitator API, sent through the SSRF-guarded outbound client.
//!
//! The facilitator's host is let through the guard as an operator entry of
//! its own (see [`operator_policy`]): it is the deployment's configuration,
//! never something a task's input can name, so it does not belong on the
//! users' allow-list that `fetch` and `http` executors see.
//!
//! Each call ends in one of three ways the caller must tell apart:
//! - an answer ([`Verified`] / [`Settled`]), positive or not;
//! - [`FacilitatorError::Unreachable`]: nothing reached it (connection
//!   refused, name lookup failed, blocked), so nothing was charged;
//! - [`FacilitatorError::Unknown`]: it may have acted (a timeout, a dropped
//!   connection, a 5xx, an answer we cannot read). For `/settle` the payment
//!   may or may not be on chain.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Url;
use serde::Deserialize;
use serde_json::{Value, json};

use super::challenge::{PaymentRequirements, X402_VERSION};
use super::supported::Supported;
use crate::infra::outbound::{Outbound, OutboundError, OutboundPolicy};

/// Replaces the catalog's `facilitator_url` for this deployment (the local
/// stack points it at its own facilitator); production leaves it unset.
pub const FACILITATOR_URL_VAR: &str = "REEVE_FACILITATOR_URL";

const VERIFY_TIMEOUT: Duration = Duration::from_secs(15);
/// A settlement waits for the transaction's receipt: a few blocks on Base.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(45);
const MAX_ANSWER_BYTES: u64 = 64 * 1024;
/// `GET /supported` at start-up and in `reeve config check`: a slow
/// facilitator may not hold `reeve serve`'s start up for longer.
const SUPPORTED_TIMEOUT: Duration = Duration::from_secs(5);
/// The same on a Lambda's first priced request, which a client waits for.
const KNOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// Facilitators that settle many chains list many kinds.
const MAX_SUPPORTED_BYTES: u64 = 1024 * 1024;
/// After `/supported` failed, how long a process goes before asking again.
const SUPPORTED_RETRY: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct Facilitator {
    base: String,
    outbound: Outbound,
    /// What `/supported` answered, asked once per process (clones share it).
    known: Arc<Mutex<Known>>,
}

#[derive(Debug, Default)]
enum Known {
    #[default]
    Unasked,
    Kinds(Arc<Supported>),
    FailedAt(Instant),
}

#[derive(Debug, thiserror::Error)]
pub enum FacilitatorError {
    #[error("facilitator unreachable: {0}")]
    Unreachable(String),
    #[error("facilitator outcome unknown: {0}")]
    Unknown(String),
}

/// `/verify`'s answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    pub is_valid: bool,
    #[serde(default)]
    pub invalid_reason: Option<String>,
    #[serde(default)]
    pub invalid_message: Option<String>,
    #[serde(default)]
    pub payer: Option<String>,
}

/// `/settle`'s answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settled {
    pub success: bool,
    #[serde(default)]
    pub error_reason: Option<String>,
    #[serde(default)]
    pub error_message: Option<String>,
    #[serde(default)]
    pub payer: Option<String>,
    #[serde(default)]
    pub transaction: String,
    #[serde(default)]
    pub network: String,
}

/// The outbound policy for reaching `url`: HTTPS only unless the URL is plain
/// http (which the catalog allows for loopback only), and the URL's exact
/// `host:port` as the only allow-list entry.
pub fn operator_policy(url: &str) -> Result<OutboundPolicy, String> {
    let parsed = Url::parse(url).map_err(|e| format!("facilitator URL {url:?}: {e}"))?;
    let host = parsed.host_str().ok_or_else(|| format!("facilitator URL {url:?} has no host"))?;
    let port = parsed.port_or_known_default().unwrap_or(443);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let entry = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    Ok(OutboundPolicy {
        allow_http: parsed.scheme() == "http",
        allow: vec![entry],
        max_redirects: 0,
        timeout: SETTLE_TIMEOUT,
        ..OutboundPolicy::default()
    })
}

/// The facilitator URL in force: `REEVE_FACILITATOR_URL` if set (checked by
/// the same rule as the catalog's: https, or http on loopback), else the
/// catalog's.
pub fn effective_url(catalog_url: &str, var: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    match var(FACILITATOR_URL_VAR).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()) {
        None => Ok(catalog_url.to_owned()),
        Some(url) => {
            crate::domain::catalog::check_facilitator_url(&url).map_err(|e| format!("{FACILITATOR_URL_VAR}: {e}"))?;
            Ok(url)
        }
    }
}

/// The smaller of a call's own timeout and the time the caller has left.
fn bounded(timeout: Duration, budget: Option<Duration>) -> Duration {
    budget.map_or(timeout, |budget| budget.min(timeout))
}

impl Facilitator {
    pub fn new(url: &str) -> Result<Facilitator, String> {
        let policy = operator_policy(url)?;
        let outbound = Outbound::new(policy).map_err(|e| format!("facilitator client: {e}"))?;
        Ok(Facilitator { base: url.trim_end_matches('/').to_owned(), outbound, known: Arc::default() })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// `GET /supported`: the kinds this facilitator settles, and the
    /// extensions it honours.
    pub async fn supported(&self) -> Result<Supported, FacilitatorError> {
        self.ask_supported(SUPPORTED_TIMEOUT).await
    }

    async fn ask_supported(&self, timeout: Duration) -> Result<Supported, FacilitatorError> {
        let url = format!("{}/supported", self.base);
        let asked = tokio::time::timeout(timeout, self.outbound.get(&url, MAX_SUPPORTED_BYTES)).await;
        let answer = match asked {
            Err(_) => {
                let secs = timeout.as_secs();
                return Err(FacilitatorError::Unreachable(format!("/supported did not answer within {secs} s")));
            }
            Ok(Err(e)) => return Err(FacilitatorError::Unreachable(e.to_string())),
            Ok(Ok(answer)) => answer,
        };
        if answer.status != 200 {
            return Err(FacilitatorError::Unknown(format!("/supported answered {}", answer.status)));
        }
        let supported: Supported = serde_json::from_slice(&answer.body)
            .map_err(|e| FacilitatorError::Unknown(format!("/supported answered an unreadable body: {e}")))?;
        Ok(supported)
    }

    /// What `/supported` answered this process, asking it the first time
    /// (and again [`SUPPORTED_RETRY`] after a failure). `None` while it
    /// cannot be known: the caller then goes on as if every network were
    /// settled, and `/verify` or `/settle` tell.
    pub async fn known(&self) -> Option<Arc<Supported>> {
        match &*self.known.lock().expect("never poisoned") {
            Known::Kinds(kinds) => return Some(kinds.clone()),
            Known::FailedAt(at) if at.elapsed() < SUPPORTED_RETRY => return None,
            _ => {}
        }
        let answer = self.ask_supported(KNOWN_TIMEOUT).await;
        let mut known = self.known.lock().expect("never poisoned");
        match answer {
            Ok(supported) => {
                let supported = Arc::new(supported);
                *known = Known::Kinds(supported.clone());
                Some(supported)
            }
            Err(e) => {
                tracing::warn!(error = %e, facilitator = %self.base, "cannot tell which networks the facilitator settles");
                *known = Known::FailedAt(Instant::now());
                None
            }
        }
    }

    /// Keeps an answer to `/supported` got elsewhere (start-up's check).
    pub fn remember(&self, supported: Supported) {
        *self.known.lock().expect("never poisoned") = Known::Kinds(Arc::new(supported));
    }

    /// `/verify`, within `budget` if given (else its own timeout). It moves
    /// no money, whatever becomes of it.
    pub async fn verify(
        &self,
        payment: &Value,
        requirements: &PaymentRequirements,
        budget: Option<Duration>,
    ) -> Result<Verified, FacilitatorError> {
        self.call("verify", payment, requirements, bounded(VERIFY_TIMEOUT, budget)).await
    }

    /// `/settle`, within `budget` if given. Cut off, its outcome is unknown.
    pub async fn settle(
        &self,
        payment: &Value,
        requirements: &PaymentRequirements,
        budget: Option<Duration>,
    ) -> Result<Settled, FacilitatorError> {
        self.call("settle", payment, requirements, bounded(SETTLE_TIMEOUT, budget)).await
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        payment: &Value,
        requirements: &PaymentRequirements,
        timeout: Duration,
    ) -> Result<T, FacilitatorError> {
        let body = json!({
            "x402Version": X402_VERSION,
            "paymentPayload": payment,
            "paymentRequirements": requirements,
        });
        let url = format!("{}/{path}", self.base);
        let answer = match self.outbound.post_json(&url, &body, timeout, MAX_ANSWER_BYTES).await {
            Ok(answer) => answer,
            Err(e @ (OutboundError::Connect(_) | OutboundError::Blocked(_) | OutboundError::InvalidUrl(_))) => {
                return Err(FacilitatorError::Unreachable(e.to_string()));
            }
            Err(e) => return Err(FacilitatorError::Unknown(e.to_string())),
        };
        if answer.status >= 500 {
            return Err(FacilitatorError::Unknown(format!("/{path} answered {}", answer.status)));
        }
        // x402 facilitators answer a refused payment with 200 or 400 and the
        // same document; anything else unreadable is an unknown outcome.
        serde_json::from_slice(&answer.body).map_err(|_| {
            FacilitatorError::Unknown(format!("/{path} answered {} with an unreadable body", answer.status))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_lets_through_exactly_the_facilitator() {
        let p = operator_policy("http://127.0.0.1:4021").unwrap();
        assert_eq!(p.allow, ["127.0.0.1:4021"]);
        assert!(p.allow_http);
        let p = operator_policy("https://x402.org/facilitator").unwrap();
        assert_eq!(p.allow, ["x402.org:443"]);
        assert!(!p.allow_http);
        assert_eq!(operator_policy("http://[::1]:9/").unwrap().allow, ["[::1]:9"]);
    }

    #[test]
    fn the_override_is_checked_like_the_catalog() {
        let none = |_: &str| None;
        assert_eq!(effective_url("https://a.example", none).unwrap(), "https://a.example");
        let local = |_: &str| Some("http://127.0.0.1:4021".to_owned());
        assert_eq!(effective_url("https://a.example", local).unwrap(), "http://127.0.0.1:4021");
        let plain = |_: &str| Some("http://facilitator.example".to_owned());
        assert!(effective_url("https://a.example", plain).unwrap_err().contains(FACILITATOR_URL_VAR));
    }
}
