//! The console page the relay serves at `/`: plain HTML and JS
//! (`assets/watch.html`), told which API to call by the server that serves
//! it, never by its link.
//!
//! The page used to take its API from `#api=<origin>` in its URL, so a
//! crafted link to the genuine page sent the Space ID a visitor typed to
//! whatever server the link named. Now the relay writes the API origin of its
//! own configuration (`REEVE_API_ORIGIN`: the template's API URL in AWS)
//! into the page's `<meta name="reeve-api-origin">`; left empty, as under
//! `reeve serve`, the page calls its own origin.
//!
//! The same page is the **pay page** of a pay link (`/#pay=<token>`, which
//! `POST /mcp` gives a client without x402): it then shows only that offer
//! (what the agent asked for, its price, what happens next) and pays it with
//! the console's own wallet flow at `/v1/pay-link` (`domain::pay_links`).
//!
//! A paid task's signed receipt has a "verify" link that checks it in the
//! page itself (the signature, and that its key is the catalog's published
//! signer), so a person need not take the server's word for its own
//! receipt. WebCrypto has no secp256k1, so the page carries
//! `@noble/curves`' and `@noble/hashes`' audited code for it
//! (`assets/noble-secp256k1.js`, bundled unchanged; its header says how,
//! and tests/console/bundle.test.mjs rebuilds it from the pinned packages),
//! written into the page here: one document, and no route of its own.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const HTML: &str = include_str!("assets/watch.html");
/// secp256k1 and keccak for the receipt check (see the module doc).
const NOBLE: &str = include_str!("assets/noble-secp256k1.js");
/// The tag in `watch.html` that [`NOBLE`] replaces.
const NOBLE_TAG: &str = "<script>/* assets/noble-secp256k1.js */</script>";
/// The page with its libraries in place.
static PAGE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| HTML.replacen(NOBLE_TAG, &format!("<script>\n{NOBLE}\n</script>"), 1));
/// The tag [`page`] fills in; the page reads its `content`.
const API_META: &str = r#"<meta name="reeve-api-origin" content="">"#;

/// No other site may frame the page (its Pay button could be overlaid), and
/// no form of it may submit anywhere: a form sent without its script would
/// put a Space ID in a URL.
pub const CONTENT_SECURITY_POLICY: &str =
    "frame-ancestors 'none'; form-action 'none'; base-uri 'none'; object-src 'none'";

/// The page calling the API at `api_origin` (an origin checked at start-up,
/// see `Env::origin`), or at its own origin when `None`.
pub fn page(api_origin: Option<&str>) -> Response {
    let html = match api_origin {
        None => PAGE.clone(),
        Some(origin) => {
            PAGE.replacen(API_META, &format!(r#"<meta name="reeve-api-origin" content="{}">"#, attribute(origin)), 1)
        }
    };
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        ],
        html,
    )
        .into_response()
}

/// `value` safe inside a double-quoted HTML attribute. An origin has none
/// of these characters; this is the second lock on the door.
fn attribute(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn html(api_origin: Option<&str>) -> String {
        let body = axum::body::to_bytes(page(api_origin).into_body(), usize::MAX).await.unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn the_configured_origin_is_written_into_the_page_and_nothing_else_names_one() {
        assert_eq!(PAGE.matches(API_META).count(), 1);
        let html = html(Some("https://abc123.execute-api.eu-west-1.amazonaws.com")).await;
        assert!(html.contains(
            r#"<meta name="reeve-api-origin" content="https://abc123.execute-api.eu-west-1.amazonaws.com">"#
        ));
        assert!(!html.contains(API_META));
        assert!(self::html(None).await.contains(API_META), "unset: the page's own origin");
    }

    #[tokio::test]
    async fn the_receipt_check_s_library_is_in_the_page_once() {
        assert_eq!(HTML.matches(NOBLE_TAG).count(), 1);
        assert!(!NOBLE.contains("</script"), "the library cannot end its own script element");
        let html = html(None).await;
        assert!(!html.contains(NOBLE_TAG));
        assert_eq!(html.matches("globalThis.ReeveNoble=").count(), 1);
    }

    #[tokio::test]
    async fn an_odd_value_cannot_leave_its_attribute() {
        assert!(html(Some(r#""><script>alert(1)</script>"#)).await.contains("&quot;&gt;&lt;script&gt;"));
    }
}
