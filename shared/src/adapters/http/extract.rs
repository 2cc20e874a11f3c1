//! Request extractors whose rejections are [`ApiError`]s, so a bad body or a
//! bad token gets the same envelope and stable code as any other error.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Uri, header};
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use std::sync::Arc;

use sqlx::PgPool;

use super::context::SessionKey;
use super::error::{ApiError, db_error};
use crate::domain::auth::{Secret, SessionToken, SpaceIndex};
use crate::domain::error::TokenRefusal;
use crate::domain::sessions::{self, SessionRefused};

/// A JSON body: `415 unsupported_media_type` unless the request says JSON,
/// `413 body_too_large` past the body limit, `400 invalid_json` with serde's
/// line and column for broken JSON, `400 invalid_request` for the wrong shape.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
        if !is_json {
            return Err(ApiError::new(
                axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "expected Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(rejection.status(), "body_too_large", "request body too large")
            } else {
                ApiError::bad_request("invalid_body", "could not read the request body")
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::bad_request("invalid_json", format!("malformed JSON: {e}"))
            }
            Category::Data => ApiError::bad_request("invalid_request", e.to_string()),
        }
    })
}

/// The space a bearer token was issued for. Every missing, malformed,
/// tampered, expired or ended token is the same `401`, so a caller learns
/// nothing about which check failed.
#[derive(Debug, Clone, Copy)]
pub struct Session(pub SpaceIndex);

impl<S: SessionKey + Send + Sync> FromRequestParts<Arc<S>> for Session {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, ctx: &Arc<S>) -> Result<Self, ApiError> {
        CurrentSession::from_request_parts(parts, ctx).await.map(|CurrentSession(session)| Session(session.space))
    }
}

/// The session a bearer token opens, with its id: for the route that ends it.
#[derive(Debug, Clone, Copy)]
pub struct CurrentSession(pub SessionToken);

impl<S: SessionKey + Send + Sync> FromRequestParts<Arc<S>> for CurrentSession {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, ctx: &Arc<S>) -> Result<Self, ApiError> {
        let Some(token) = bearer_token(&parts.headers)? else {
            let why = "send Authorization: Bearer <token> from POST /v1/sessions";
            return Err(ApiError::refused_saying(&TokenRefusal::Missing, why));
        };
        checked_session(ctx.db(), ctx.token_key(), token).await.map(CurrentSession)
    }
}

/// A session token checked as every route checks one: signed, not expired,
/// not ended. `503 database_unavailable` when the check cannot be made.
pub async fn checked_session(db: &PgPool, key: &Secret, token: &str) -> Result<SessionToken, ApiError> {
    sessions::check_session(db, key, token, OffsetDateTime::now_utc()).await.map_err(|e| match e {
        SessionRefused::Db(e) => db_error(e),
        e => {
            tracing::debug!(reason = %e, "token refused");
            invalid_token()
        }
    })
}

/// The token of the `Authorization: Bearer <token>` header, for every route
/// that takes one (the relay's stream included): `Ok(None)` when there is no
/// such header, `401 invalid_token` when there is one that is not a bearer
/// credential. The scheme is matched without regard to case, as HTTP
/// authentication schemes are (RFC 9110), so `bearer` and `BEARER` work too.
pub fn bearer_token(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let (scheme, token) = value.to_str().ok().and_then(|v| v.trim_start().split_once(' ')).ok_or_else(invalid_token)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(invalid_token());
    }
    Ok(Some(token))
}

/// The token of an `Authorization: Share <token>` header (a share link's,
/// `domain::auth::share`), the scheme matched without regard to case: only
/// the stream-ticket route takes one. An empty one is returned as it is, to
/// be refused as any bad share token is.
pub fn share_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    scheme.eq_ignore_ascii_case(crate::domain::auth::SHARE_SCHEME).then(|| token.trim())
}

pub fn invalid_token() -> ApiError {
    ApiError::refused(&TokenRefusal::Invalid)
}

/// A JSON integer for a `u64` field, written either way JSON Schema calls
/// an integer: `7402` or `7402.0`. serde alone refuses the second, so a
/// body the document calls valid would be refused; a fraction, a negative
/// number or a value past 2^53 (where floats stop being exact) is still
/// `invalid_request`.
pub fn whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    use serde::Deserialize;
    use serde::de::Error;
    let n = serde_json::Number::deserialize(deserializer)?;
    if let Some(n) = n.as_u64() {
        return Ok(n);
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(&f) => Ok(f as u64),
        _ => Err(D::Error::custom(format!("invalid value: {n}, expected a non-negative integer"))),
    }
}

/// `scheme://host[:port]` of the API as the request reached it (the `Host`
/// header or an absolute URI), if it says.
pub(super) fn origin(uri: &Uri, headers: &HeaderMap) -> Option<String> {
    let authority = uri.authority().map(|a| a.as_str().to_owned()).or_else(|| {
        headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
            .filter(|a| !a.as_str().contains('@'))
            .map(|a| a.as_str().to_owned())
    })?;
    let forwarded = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| v == "http" || v == "https");
    let host = authority.rsplit_once(':').map_or(authority.as_str(), |(h, _)| h);
    let local = matches!(host, "localhost" | "127.0.0.1" | "[::1]");
    let scheme = uri
        .scheme_str()
        .map(str::to_owned)
        .or(forwarded)
        .unwrap_or_else(|| if local { "http".into() } else { "https".into() });
    Some(format!("{scheme}://{authority}"))
}
