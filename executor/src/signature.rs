//! The job's signature, as Standard Webhooks specifies it
//! (<https://www.standardwebhooks.com>): three headers, an HMAC-SHA256 of
//! `"<id>.<timestamp>.<body>"` keyed with the endpoint's secret.
//!
//! Checked here rather than with the `standardwebhooks` crate (see
//! `Cargo.toml`); the tests verify signatures made by the official Python
//! package, so the two agree byte for byte.

use std::fmt;

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use hmac::{KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use time::OffsetDateTime;
use zeroize::Zeroizing;

/// The header carrying the delivery's id (`job_<task>_<attempt>`).
pub const HEADER_ID: &str = "webhook-id";
/// The header carrying the Unix seconds the job was signed at.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// The header carrying one or more `v1,<base64>` signatures, space-separated.
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// How far a job's timestamp may be from the service's clock, either way:
/// an older job is a replay, a newer one a clock to fix.
pub const TOLERANCE_SECONDS: i64 = 5 * 60;

const SECRET_PREFIX: &str = "whsec_";
const VERSION: &str = "v1";

/// A secret's base64 with or without its `=` padding, as the official
/// libraries accept it.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a job's signature was refused. None of these is worth a retry by
/// the sender with the same headers: answer `401`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the secret is not `whsec_` followed by base64")]
    InvalidSecret,
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the webhook-timestamp header is not Unix seconds")]
    InvalidTimestamp,
    #[error("the job was signed more than 5 minutes ago")]
    TooOld,
    #[error("the job was signed more than 5 minutes in the future")]
    TooNew,
    #[error("no signature matches")]
    NoMatch,
}

/// An endpoint's signing secret: the key bytes of `whsec_<base64>`.
/// Wiped from memory when dropped, and never printed.
#[derive(Clone)]
pub struct Secret {
    key: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// The secret `whsec_<base64>`. The prefix may be left out, as every
    /// Standard Webhooks library allows.
    pub fn parse(secret: &str) -> Result<Secret, SignatureError> {
        let encoded = secret.trim().strip_prefix(SECRET_PREFIX).unwrap_or(secret.trim());
        let key = SECRET_BASE64.decode(encoded).map_err(|_| SignatureError::InvalidSecret)?;
        if key.is_empty() {
            return Err(SignatureError::InvalidSecret);
        }
        Ok(Secret { key: Zeroizing::new(key) })
    }

    /// The secret read from the environment variable `name` (what
    /// `secret = "<NAME>"` in `reeve.toml` points to).
    pub fn from_env(name: &str) -> Result<Secret, SignatureError> {
        let value = Zeroizing::new(std::env::var(name).map_err(|_| SignatureError::InvalidSecret)?);
        Secret::parse(&value)
    }

    /// A new random secret (24 bytes, the Standard Webhooks minimum), in
    /// its `whsec_` form.
    pub fn generate() -> String {
        let mut key = Zeroizing::new([0u8; 24]);
        getrandom::fill(key.as_mut_slice()).expect("the system's random source");
        format!("{SECRET_PREFIX}{}", STANDARD.encode(key.as_slice()))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        let mut mac =
            <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }

    /// The `webhook-signature` value of `body` sent as `id` at `timestamp`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("{VERSION},{}", STANDARD.encode(self.mac(id, timestamp, body)))
    }

    /// Checks a delivery's three header values against `body`, at the
    /// clock's time now.
    pub fn verify(&self, headers: &SignedHeaders<'_>, body: &[u8]) -> Result<(), SignatureError> {
        self.verify_at(headers, body, OffsetDateTime::now_utc().unix_timestamp())
    }

    /// [`verify`](Self::verify) with the clock reading `now` (Unix seconds).
    pub fn verify_at(&self, headers: &SignedHeaders<'_>, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let timestamp: i64 = headers.timestamp.trim().parse().map_err(|_| SignatureError::InvalidTimestamp)?;
        if now.saturating_sub(timestamp) > TOLERANCE_SECONDS {
            return Err(SignatureError::TooOld);
        }
        if timestamp.saturating_sub(now) > TOLERANCE_SECONDS {
            return Err(SignatureError::TooNew);
        }
        let expected = self.mac(headers.id, timestamp, body);
        // Every listed signature is compared, in constant time, so a
        // rotation (old and new secret side by side) works and the time
        // taken says nothing about which one almost matched.
        let mut matched = subtle::Choice::from(0);
        for candidate in headers.signature.split_ascii_whitespace() {
            let Some((version, encoded)) = candidate.split_once(',') else { continue };
            if version != VERSION {
                continue;
            }
            if let Ok(given) = STANDARD.decode(encoded) {
                matched |= given.as_slice().ct_eq(&expected);
            }
        }
        if bool::from(matched) { Ok(()) } else { Err(SignatureError::NoMatch) }
    }
}

/// The three Standard Webhooks header values of one delivery.
#[derive(Debug, Clone, Copy)]
pub struct SignedHeaders<'a> {
    pub id: &'a str,
    pub timestamp: &'a str,
    pub signature: &'a str,
}

impl<'a> SignedHeaders<'a> {
    /// The three headers, looked up by name (lowercase) with `get`: from an
    /// `http::HeaderMap`, a Lambda function URL's event, a test's map.
    pub fn from_lookup(get: impl Fn(&str) -> Option<&'a str>) -> Result<Self, SignatureError> {
        let id = get(HEADER_ID).ok_or(SignatureError::MissingHeader(HEADER_ID))?;
        let timestamp = get(HEADER_TIMESTAMP).ok_or(SignatureError::MissingHeader(HEADER_TIMESTAMP))?;
        let signature = get(HEADER_SIGNATURE).ok_or(SignatureError::MissingHeader(HEADER_SIGNATURE))?;
        Ok(SignedHeaders { id, timestamp, signature })
    }

    /// The three headers of an `http` request (axum, hyper, reqwest).
    pub fn from_headers(headers: &'a reqwest::header::HeaderMap) -> Result<Self, SignatureError> {
        Self::from_lookup(|name| headers.get(name).and_then(|v| v.to_str().ok()))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    /// Signatures made by the official Python package (`standardwebhooks`,
    /// pinned in scripts/requirements.txt) with `signatures.py`.
    #[derive(Deserialize)]
    struct Fixture {
        secret: String,
        other_secret: String,
        id: String,
        timestamp: i64,
        body: String,
        signature: String,
    }

    fn fixtures() -> Vec<Fixture> {
        serde_json::from_str(include_str!("../tests/fixtures/signatures.json")).unwrap()
    }

    /// Verifies `body` as `f`'s delivery signed `signature`, at `now`.
    fn check(secret: &Secret, f: &Fixture, signature: &str, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let timestamp = f.timestamp.to_string();
        secret.verify_at(&SignedHeaders { id: &f.id, timestamp: &timestamp, signature }, body, now)
    }

    #[test]
    fn python_signatures_verify_and_match_ours() {
        for f in fixtures() {
            let secret = Secret::parse(&f.secret).unwrap();
            let body = f.body.as_bytes();
            check(&secret, &f, &f.signature, body, f.timestamp).unwrap();
            check(&secret, &f, &f.signature, body, f.timestamp + 299).unwrap();
            assert_eq!(secret.sign(&f.id, f.timestamp, body), f.signature);
        }
    }

    /// The example in the Standard Webhooks specification.
    #[test]
    fn the_specifications_example_verifies() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let signature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert_eq!(secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body), signature);
        let headers = SignedHeaders { id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: "1614265330", signature };
        secret.verify_at(&headers, body, 1614265330).unwrap();
    }

    #[test]
    fn a_changed_byte_an_old_timestamp_or_a_wrong_key_is_refused() {
        for f in fixtures() {
            let secret = Secret::parse(&f.secret).unwrap();
            let body = f.body.as_bytes();
            let sig = f.signature.as_str();
            // Every single byte of the body matters.
            for i in 0..body.len() {
                let mut changed = body.to_vec();
                changed[i] ^= 0x01;
                assert_eq!(check(&secret, &f, sig, &changed, f.timestamp), Err(SignatureError::NoMatch), "byte {i}");
            }
            // The id and the timestamp are signed too.
            let ts = f.timestamp.to_string();
            let other_id = SignedHeaders { id: "job_other_1", timestamp: &ts, signature: sig };
            assert_eq!(secret.verify_at(&other_id, body, f.timestamp), Err(SignatureError::NoMatch));
            let later = (f.timestamp + 1).to_string();
            let moved = SignedHeaders { id: &f.id, timestamp: &later, signature: sig };
            assert_eq!(secret.verify_at(&moved, body, f.timestamp), Err(SignatureError::NoMatch));
            // A replay after five minutes, and a clock far behind.
            assert_eq!(check(&secret, &f, sig, body, f.timestamp + 301), Err(SignatureError::TooOld));
            assert_eq!(check(&secret, &f, sig, body, f.timestamp - 301), Err(SignatureError::TooNew));
            let wrong = Secret::parse(&f.other_secret).unwrap();
            assert_eq!(check(&wrong, &f, sig, body, f.timestamp), Err(SignatureError::NoMatch));
        }
    }

    #[test]
    fn any_listed_v1_signature_may_match() {
        let f = &fixtures()[0];
        let secret = Secret::parse(&f.secret).unwrap();
        let body = f.body.as_bytes();
        let other = Secret::parse(&f.other_secret).unwrap().sign(&f.id, f.timestamp, body);
        let v2 = f.signature.replacen("v1,", "v2,", 1);
        let listed = [
            format!("{other} {}", f.signature),
            format!("{} {other}", f.signature),
            format!("v1,not-base64 {}", f.signature),
        ];
        for sig in &listed {
            check(&secret, f, sig, body, f.timestamp).unwrap();
        }
        for sig in [other.as_str(), v2.as_str(), "", "v1,", "v1"] {
            assert_eq!(check(&secret, f, sig, body, f.timestamp), Err(SignatureError::NoMatch), "{sig:?}");
        }
    }

    #[test]
    fn bad_secrets_and_headers_are_named() {
        assert_eq!(Secret::parse("whsec_!!!").unwrap_err(), SignatureError::InvalidSecret);
        assert_eq!(Secret::parse("whsec_").unwrap_err(), SignatureError::InvalidSecret);
        // Unpadded base64 is the same secret, as in the Python package.
        let padded = Secret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oDaXJzdCBrZXkhISE=").unwrap();
        let unpadded = Secret::parse("C2FVsBQIhrscChlQIMV+b5sSYspob7oDaXJzdCBrZXkhISE").unwrap();
        assert_eq!(padded.sign("a", 1, b"b"), unpadded.sign("a", 1, b"b"));
        let f = &fixtures()[0];
        let secret = Secret::parse(&f.secret).unwrap();
        let h = SignedHeaders { id: &f.id, timestamp: "soon", signature: &f.signature };
        assert_eq!(secret.verify_at(&h, b"{}", 0), Err(SignatureError::InvalidTimestamp));
        let missing = SignedHeaders::from_lookup(|name| (name != HEADER_SIGNATURE).then_some("x"));
        assert_eq!(missing.unwrap_err(), SignatureError::MissingHeader(HEADER_SIGNATURE));
    }

    #[test]
    fn a_generated_secret_parses_and_signs() {
        let text = Secret::generate();
        assert!(text.starts_with("whsec_"));
        let secret = Secret::parse(&text).unwrap();
        assert_eq!(secret.key.len(), 24);
        let sig = secret.sign("job_x_1", 100, b"{}");
        let h = SignedHeaders { id: "job_x_1", timestamp: "100", signature: &sig };
        secret.verify_at(&h, b"{}", 100).unwrap();
        assert_ne!(Secret::generate(), text);
        assert_eq!(format!("{secret:?}"), "Secret(…)");
    }
}
