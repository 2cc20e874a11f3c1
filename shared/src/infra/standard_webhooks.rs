//! Standard Webhooks signing (<https://www.standardwebhooks.com/>), in one
//! place: every message Reeve signs this way (a task's completion webhook,
//! and later the executor protocol's jobs) goes through [`SigningKey`].
//!
//! - A secret is `whsec_<base64 of 24 to 64 bytes>`; the key is the bytes.
//! - A message carries `webhook-id`, `webhook-timestamp` (Unix seconds) and
//!   `webhook-signature`: `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`.
//! - Several signatures are sent space-separated ([`signature_header`]): a
//!   receiver accepts the message when any one verifies, which is how a
//!   secret is rotated without a moment where one side is wrong.
//! - [`verify`] checks the same way a receiver must: any listed key against
//!   any `v1` signature, in constant time, with the timestamp within a
//!   tolerance of now (replays of old messages fail).

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use zeroize::Zeroize;

/// The prefix of a secret's text.
pub const SECRET_PREFIX: &str = "whsec_";
/// The header names.
pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";
/// The shortest and longest signing key a secret may hold.
pub const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// How many bytes a key Reeve makes holds.
pub const NEW_KEY_BYTES: usize = 32;
/// How far a timestamp may be from now for [`verify`]: the spec's five minutes.
pub const TOLERANCE_SECONDS: i64 = 5 * 60;

/// A signing key: the bytes of a `whsec_…` secret. Never shown (`Debug`
/// says only that it is one), zeroed when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(Vec<u8>);

impl SigningKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> SigningKey {
        let mut bytes = vec![0u8; NEW_KEY_BYTES];
        getrandom::fill(&mut bytes).expect("the OS random number generator works");
        SigningKey(bytes)
    }

    /// A key from stored bytes: 24 to 64 of them.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<SigningKey, String> {
        if !KEY_BYTES.contains(&bytes.len()) {
            return Err(format!(
                "holds {} bytes; a signing secret holds {} to {}",
                bytes.len(),
                KEY_BYTES.start(),
                KEY_BYTES.end()
            ));
        }
        Ok(SigningKey(bytes))
    }

    /// `whsec_<base64 of 24 to 64 bytes>`; the message never repeats it.
    pub fn parse(text: &str) -> Result<SigningKey, String> {
        let Some(encoded) = text.trim().strip_prefix(SECRET_PREFIX) else {
            return Err("is not a Standard Webhooks secret: it must start with whsec_".to_owned());
        };
        let bytes = STANDARD.decode(encoded).map_err(|_| "is not whsec_ followed by base64".to_owned())?;
        SigningKey::from_bytes(bytes)
    }

    /// The key's bytes, to store.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The secret as its owner is given it once: `whsec_<base64>`.
    pub fn secret_text(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.0))
    }

    /// `v1,<base64 HMAC-SHA256>` of `<id>.<timestamp>.<body>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.mac(id, timestamp, body)))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningKey(…)")
    }
}

impl Drop for SigningKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// The `webhook-signature` value signed with every key in `keys`, in order,
/// space-separated (the current key first, then one still in its grace
/// period).
pub fn signature_header(keys: &[SigningKey], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter().map(|key| key.sign(id, timestamp, body)).collect::<Vec<_>>().join(" ")
}

/// Why a message does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("the timestamp is more than five minutes from now")]
    OutsideTolerance,
    #[error("no signature matches")]
    NoMatch,
}

/// Whether `signatures` (a `webhook-signature` value) holds a `v1`
/// signature of `id`, `timestamp` and `body` by any of `keys`, with
/// `timestamp` within [`TOLERANCE_SECONDS`] of `now` (Unix seconds).
pub fn verify(
    keys: &[SigningKey],
    id: &str,
    timestamp: &str,
    body: &[u8],
    signatures: &str,
    now: i64,
) -> Result<(), VerifyError> {
    let timestamp: i64 = timestamp.trim().parse().map_err(|_| VerifyError::BadTimestamp)?;
    if (now - timestamp).abs() > TOLERANCE_SECONDS {
        return Err(VerifyError::OutsideTolerance);
    }
    let sent: Vec<Vec<u8>> = signatures
        .split(' ')
        .filter_map(|s| s.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(|(_, sig)| STANDARD.decode(sig).ok())
        .collect();
    let matched = keys.iter().any(|key| {
        let expected = key.mac(id, timestamp, body);
        sent.iter().any(|sig| bool::from(sig.as_slice().ct_eq(&expected)))
    });
    if matched { Ok(()) } else { Err(VerifyError::NoMatch) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TIMESTAMP: i64 = 1614265330;
    const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;

    /// The Standard Webhooks specification's own example.
    #[test]
    fn signs_as_the_standard_webhooks_example() {
        let key = SigningKey::parse(SPEC_SECRET).unwrap();
        assert_eq!(key.sign(SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert_eq!(key.secret_text(), SPEC_SECRET);
    }

    #[test]
    fn a_secret_must_be_whsec_base64_of_24_to_64_bytes() {
        assert!(SigningKey::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(SigningKey::parse("whsec_not base64!").is_err());
        assert!(SigningKey::parse(&format!("whsec_{}", STANDARD.encode([1u8; 16]))).is_err());
        assert!(SigningKey::parse(&format!("whsec_{}", STANDARD.encode([1u8; 65]))).is_err());
        let key = SigningKey::parse(&format!("whsec_{}", STANDARD.encode([1u8; 32]))).unwrap();
        assert_eq!(format!("{key:?}"), "SigningKey(…)");
        let fresh = SigningKey::generate();
        assert_eq!(fresh.as_bytes().len(), NEW_KEY_BYTES);
        assert_eq!(SigningKey::parse(&fresh.secret_text()).unwrap(), fresh);
    }

    #[test]
    fn any_key_against_any_signature_verifies_within_the_tolerance() {
        let old = SigningKey::parse(SPEC_SECRET).unwrap();
        let new = SigningKey::generate();
        let other = SigningKey::generate();
        let both = signature_header(&[new.clone(), old.clone()], SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY);
        assert_eq!(both.split(' ').count(), 2);
        let ts = SPEC_TIMESTAMP.to_string();
        let now = SPEC_TIMESTAMP + 10;
        for key in [&old, &new] {
            assert_eq!(verify(std::slice::from_ref(key), SPEC_ID, &ts, SPEC_BODY, &both, now), Ok(()));
        }
        assert_eq!(
            verify(std::slice::from_ref(&other), SPEC_ID, &ts, SPEC_BODY, &both, now),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(verify(&[other, old.clone()], SPEC_ID, &ts, SPEC_BODY, &both, now), Ok(()));
        assert_eq!(verify(std::slice::from_ref(&old), SPEC_ID, &ts, b"{}", &both, now), Err(VerifyError::NoMatch));
        let late = SPEC_TIMESTAMP + TOLERANCE_SECONDS + 1;
        assert_eq!(
            verify(std::slice::from_ref(&old), SPEC_ID, &ts, SPEC_BODY, &both, late),
            Err(VerifyError::OutsideTolerance)
        );
        assert_eq!(verify(&[old], SPEC_ID, "soon", SPEC_BODY, &both, now), Err(VerifyError::BadTimestamp));
    }
}
