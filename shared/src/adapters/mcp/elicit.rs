//! Payment by URL elicitation: a priced tool called by a client that
//! cannot pay (no x402) but declares URL elicitation
//! (`capabilities.elicitation.url`). Instead of the payment requirements,
//! which such a client can only show as an error, the call answers a link
//! to the console's pay page ([`crate::domain::pay_links`]): the client
//! shows it to its user, who reads what the agent asked for and its price
//! and pays with a browser wallet. The retried call answers the task the
//! page bought: the same task, never a second one, as it is created under
//! the link's own idempotency key.
//!
//! How the link is asked for depends on the client's protocol version:
//! - **2026-07-28**: an `input_required` result with one URL elicitation in
//!   `inputRequests` and the link's token as `requestState`. The client
//!   retries with that `requestState`; a paid link answers its task, an
//!   unpaid one the same `input_required` again.
//! - **2025-11-25**: the `-32042` error (`URLElicitationRequiredError`) with
//!   the elicitation in `data.elicitations`; the client retries the call
//!   with the same arguments, which meet the same link by their Space,
//!   kind and input. An `elicitation/create` request sent in the middle of
//!   the call would need the client's answer to reach the instance that
//!   asked: this endpoint is stateless (any instance answers any POST, and
//!   a Lambda's reply is buffered whole), so the error, which the spec
//!   provides for a request that cannot wait, is the way.
//!
//! **What a client declared.** A 2026-07-28 request carries its client's
//! capabilities in `_meta`. A 2025-11-25 client declares them once, in
//! `initialize`, which a stateless server does not keep: so Reeve answers
//! an `initialize` that declares URL elicitation with an `Mcp-Session-Id`
//! that is no session but the declaration itself, sealed with an HMAC
//! ([`Declared::seal`]). The client sends it back on every request, as the
//! spec requires, and any instance reads it; nothing is stored. rmcp's
//! stateless mode ignores the header. A client that declares x402 pays
//! with x402 and is never sent a link.
//!
//! **Phishing.** A link is not bound to the person who opens it: whoever
//! pays it buys the agent's task, in the agent's Space, on the agent's
//! input, which is the point (the person is usually the agent's user). The
//! page says so before anything is signed, and shows the input and where
//! the task goes; a link lasts 15 minutes and pays once.

use axum::body::Body;
use axum::http::{Request, header, request::Parts};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rmcp::model::{
    CallToolResponse, ElicitRequest, ElicitRequestParams, ErrorCode, ErrorData, InputRequest, InputRequests,
    InputRequiredResult, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use time::OffsetDateTime;

use super::context::McpContext;
use super::failure::{ToolFailure, ToolResult};
use crate::domain::auth::{Secret, SpaceIndex, hmac_sha256};
use crate::domain::pay_links::{self, PAY_LINK_TTL, PayLink, PayLinkRefusal};
use crate::domain::payments::PaymentRequired;
use crate::domain::payments::offer_receipt::sha256_json;

/// The header a 2025-11-25 client sends back on every request after
/// `initialize`.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// The JSON-RPC error code of `URLElicitationRequiredError` (2025-11-25).
pub const URL_ELICITATION_REQUIRED: ErrorCode = ErrorCode(-32042);

/// The key of the pay link's request in an `input_required` result.
pub const INPUT_REQUEST_KEY: &str = "reeve/pay";

/// x402's MCP extension, as a client declares it.
const X402_EXTENSION: &str = "org.x402/payment";

const SEAL_DOMAIN: &[u8] = b"reeve mcp declared capabilities\0";
const SEAL_VERSION: &str = "rc1";
const MAC_LEN: usize = 16;
/// The largest `initialize` body read for its capabilities: a handshake is
/// a few hundred bytes; a larger body is passed on unread.
const MAX_INITIALIZE_BYTES: u64 = 64 * 1024;

/// What a client declared about paying.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declared {
    /// `capabilities.elicitation.url`.
    pub url: bool,
    /// x402's MCP extension (`org.x402/payment`, under `extensions` or
    /// `experimental`).
    pub x402: bool,
}

impl Declared {
    /// From a client's `capabilities` object.
    pub fn of(capabilities: &Value) -> Declared {
        let x402 = ["extensions", "experimental"].iter().any(|at| capabilities[at].get(X402_EXTENSION).is_some());
        Declared { url: capabilities["elicitation"]["url"].is_object(), x402 }
    }

    /// Whether a priced call of this client without a payment is answered
    /// with a pay link.
    pub fn pays_by_link(self) -> bool {
        self.url && !self.x402
    }

    /// `rc1.<json>.<mac>`, base64url: what the `Mcp-Session-Id` carries.
    pub fn seal(self, key: &Secret) -> String {
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&self).expect("two booleans serialise"));
        let mac = hmac_sha256(key.as_bytes(), &[SEAL_DOMAIN, body.as_bytes()]);
        format!("{SEAL_VERSION}.{body}.{}", URL_SAFE_NO_PAD.encode(&mac[..MAC_LEN]))
    }

    /// A sealed declaration, if `key` sealed it unaltered.
    pub fn open(key: &Secret, sealed: &str) -> Option<Declared> {
        let mut parts = sealed.trim().split('.');
        let (version, body, mac) = (parts.next()?, parts.next()?, parts.next()?);
        if version != SEAL_VERSION || parts.next().is_some() {
            return None;
        }
        let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
        let expected = hmac_sha256(key.as_bytes(), &[SEAL_DOMAIN, body.as_bytes()]);
        if mac.len() != MAC_LEN || !bool::from(expected[..MAC_LEN].ct_eq(&mac)) {
            return None;
        }
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()
    }
}

/// An `initialize` request's declaration, sealed for the response's
/// `Mcp-Session-Id` when it declares URL elicitation (other clients get no
/// header, as before), with the request as it came. A body that is not a
/// small JSON `initialize` is passed on as it is.
pub async fn initialize_declared(request: Request<Body>, key: &Secret) -> (Request<Body>, Option<String>) {
    // The declared length, else the body's own where it knows it exactly.
    let length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .or_else(|| axum::body::HttpBody::size_hint(request.body()).exact());
    let small = length.is_some_and(|n| n <= MAX_INITIALIZE_BYTES);
    if request.method() != axum::http::Method::POST || !small {
        return (request, None);
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_INITIALIZE_BYTES as usize).await else {
        // The body could not be read whole: rmcp gets nothing either.
        return (Request::from_parts(parts, Body::empty()), None);
    };
    let sealed = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .filter(|message| message["method"] == "initialize")
        .map(|message| Declared::of(&message["params"]["capabilities"]))
        .filter(|declared| declared.url)
        .map(|declared| declared.seal(key));
    (Request::from_parts(parts, Body::from(bytes)), sealed)
}

/// What the client of this call declared: a 2026-07-28 request's own
/// `_meta` capabilities, else what its `initialize` declared (the sealed
/// `Mcp-Session-Id`), else nothing.
pub fn declared(ctx: &McpContext, context: &RequestContext<RoleServer>) -> Declared {
    let in_meta = context.meta.client_capabilities().and_then(|caps| serde_json::to_value(caps).ok());
    if let Some(capabilities) = in_meta {
        return Declared::of(&capabilities);
    }
    let headers = context.extensions.get::<Parts>().map(|parts| &parts.headers);
    let sealed = headers.and_then(|h| h.get(SESSION_HEADER)).and_then(|v| v.to_str().ok());
    sealed.and_then(|s| Declared::open(&ctx.token_key, s)).unwrap_or_default()
}

/// What a call that may be paid by link meets before it runs.
pub enum Before {
    /// A link paid for this call: its task answers, under its key.
    Paid(PayLink),
    /// A link for this call that is still to be paid: asked again.
    Unpaid(PayLink),
    /// None: the call runs; if it must be paid, a new link is made.
    Nothing,
}

/// The link a call meets: the one its `requestState` names (refused if it
/// is not Reeve's, is another Space's, or was made for another input), or
/// else the Space's latest for this kind and input.
pub async fn before_call(
    ctx: &McpContext,
    space: &SpaceIndex,
    kind: &str,
    input: &Value,
    request_state: Option<&str>,
) -> ToolResult<Before> {
    let now = OffsetDateTime::now_utc();
    let input_sha256 = sha256_json(input);
    let link = match request_state {
        Some(state) => {
            let link = pay_links::find(&ctx.db, &ctx.token_key, state).await.map_err(|e| match e {
                PayLinkRefusal::Invalid => ToolFailure::from(PayLinkRefusal::RequestState),
                other => other.into(),
            })?;
            if link.space != *space {
                return Err(PayLinkRefusal::OtherSpace.into());
            }
            if link.kind != kind || link.input_sha256 != input_sha256 {
                return Err(PayLinkRefusal::InputChanged.into());
            }
            if link.paid_task().is_none() && link.expired_at(now) {
                return Err(PayLinkRefusal::Expired.into());
            }
            link
        }
        None => match pay_links::latest(&ctx.db, space, kind, &input_sha256, now).await? {
            Some(link) if link.paid_task().is_some() || !link.expired_at(now) => link,
            _ => return Ok(Before::Nothing),
        },
    };
    Ok(if link.paid_task().is_some() { Before::Paid(link) } else { Before::Unpaid(link) })
}

/// A new link for a call its challenge asks to pay.
pub async fn issue(
    ctx: &McpContext,
    space: &SpaceIndex,
    kind: &str,
    input: &Value,
    challenge: &PaymentRequired,
) -> ToolResult<PayLink> {
    let prices = pay_links::prices_of(challenge);
    Ok(pay_links::issue(&ctx.db, space, kind, input, prices, OffsetDateTime::now_utc()).await?)
}

/// The link asked of the client: `input_required` for a 2026-07-28
/// request, else the `-32042` error.
pub fn ask(
    ctx: &McpContext,
    context: &RequestContext<RoleServer>,
    listed: &Tool,
    link: &PayLink,
) -> Result<CallToolResponse, ErrorData> {
    let token = link.token(&ctx.token_key);
    let url = format!("{}#pay={token}", console_url(ctx, context));
    let modern = context.protocol_version().is_some_and(|v| !v.has_initialize());
    let message = message(listed, modern);
    if modern {
        let params =
            ElicitRequestParams::UrlElicitationParams { meta: None, message, url, elicitation_id: link.id.to_string() };
        let mut requests = InputRequests::new();
        requests.insert(INPUT_REQUEST_KEY.to_owned(), InputRequest::Elicitation(ElicitRequest::new(params)));
        return Ok(CallToolResponse::InputRequired(InputRequiredResult::new(Some(requests), Some(token))));
    }
    let elicitation = json!({ "mode": "url", "elicitationId": link.id.to_string(), "url": url, "message": message });
    Err(ErrorData::new(
        URL_ELICITATION_REQUIRED,
        format!("{} is paid by a person in a browser wallet: open the link, then call it again", listed.name),
        Some(json!({ "elicitations": [elicitation] })),
    ))
}

/// What the client shows its user beside the link.
fn message(listed: &Tool, modern: bool) -> String {
    let title = listed.title.as_deref().unwrap_or(&listed.name);
    let price = listed
        .meta
        .as_ref()
        .and_then(|meta| meta.get(super::kind::PRICE_META))
        .and_then(|price| price["prices"].as_array())
        .map(|prices| {
            prices.iter().filter_map(|p| Some(format!("on {}, {}", p["network"].as_str()?, p["summary"].as_str()?)))
        })
        .map(|texts| texts.collect::<Vec<_>>().join("; or "))
        .unwrap_or_default();
    let again = if modern { "with this request's state" } else { "with the same arguments" };
    format!(
        "The agent asks for a paid task: {title} ({price}). Open the link to see what it will run on and pay with \
         a browser wallet; nothing is charged until you sign. Then the agent calls {} again {again} and gets the \
         task. The link can be paid once, for {} minutes.",
        listed.name,
        PAY_LINK_TTL.whole_minutes()
    )
}

/// Where the console's page is: `REEVE_CONSOLE_URL` (the relay's URL in
/// AWS), else the origin this request reached, as under `reeve serve`,
/// which serves the page beside `/mcp`.
fn console_url(ctx: &McpContext, context: &RequestContext<RoleServer>) -> String {
    if let Some(url) = &ctx.console_url {
        return if url.ends_with('/') { url.clone() } else { format!("{url}/") };
    }
    let host = context
        .extensions
        .get::<Parts>()
        .and_then(|parts| parts.headers.get(header::HOST))
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let local =
        ["localhost", "127.0.0.1", "[::1]"].iter().any(|name| host == *name || host.starts_with(&format!("{name}:")));
    format!("{}://{host}/", if local { "http" } else { "https" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> Secret {
        Secret::new("REEVE_TOKEN_KEY", vec![byte; 32]).unwrap()
    }

    /// URL elicitation counts only where declared as an object; x402 under
    /// either capability map.
    #[test]
    fn what_a_client_declares_is_read_from_its_capabilities() {
        assert_eq!(Declared::of(&json!({})), Declared::default());
        assert_eq!(Declared::of(&json!({ "elicitation": {} })), Declared::default(), "{{}} means form only");
        let url = Declared::of(&json!({ "elicitation": { "url": {} } }));
        assert!(url.pays_by_link());
        let both = Declared::of(&json!({ "elicitation": { "url": {} }, "extensions": { X402_EXTENSION: {} } }));
        assert_eq!(both, Declared { url: true, x402: true });
        assert!(!both.pays_by_link(), "an x402 client pays itself");
        assert!(Declared::of(&json!({ "experimental": { X402_EXTENSION: {} } })).x402);
    }

    /// The sealed declaration opens under its key only, and unaltered.
    #[test]
    fn a_sealed_declaration_opens_only_unaltered_under_its_key() {
        let declared = Declared { url: true, x402: false };
        let sealed = declared.seal(&key(1));
        assert_eq!(Declared::open(&key(1), &sealed), Some(declared));
        assert_eq!(Declared::open(&key(2), &sealed), None);
        let forged = Declared { url: true, x402: true }.seal(&key(2));
        let (_, body_and_mac) = forged.split_once('.').unwrap();
        let (body, _) = body_and_mac.split_once('.').unwrap();
        let (_, mac) = sealed.rsplit_once('.').unwrap();
        assert_eq!(Declared::open(&key(1), &format!("{SEAL_VERSION}.{body}.{mac}")), None);
        assert_eq!(Declared::open(&key(1), "a-real-session-id"), None);
    }
}
