//! Auth, in two steps (docs/architecture.md#auth).
//!
//! 1. A Space ID is turned into a fast, non-secret database key with
//!    [`space_index`] (`HMAC-SHA256(pepper, id)[..16]`).
//! 2. The row's Argon2id PHC string is checked with [`verify_space_id`].
//!
//! A successful check is exchanged for a short-lived session token
//! ([`issue_token`] / [`verify_token`]), so Argon2id runs once per session.
//! Narrower passes derive from a session: a stream ticket opens one task's
//! stream for 60 s ([`issue_ticket`]); a share link gives stream tickets of
//! one task for a day, to someone else ([`issue_share`]).
//!
//! Nothing here logs or formats a Space ID or a secret: `Debug` is redacted
//! and no error message carries them.

#[cfg(feature = "api-auth")]
mod password;
mod report_token;
mod secret;
mod share;
mod space_id;
mod ticket;
mod token;

#[cfg(feature = "api-auth")]
pub use password::{hash_space_id, verify_space_id};
pub use report_token::{ReportToken, ReportTokenError, issue_report_token, verify_report_token};
pub use secret::Secret;
pub use share::{SHARE_SCHEME, SHARE_TTL, ShareError, ShareToken, issue_share, verify_share};
pub use space_id::{SpaceId, SpaceIndex, space_index};
pub use ticket::{StreamTicket, TICKET_TTL, TicketError, issue_ticket, issue_ticket_for_share, verify_ticket};
pub use token::{
    SESSION_TTL, SessionId, SessionToken, TokenError, issue_token, looks_like_session_token, verify_session,
    verify_token,
};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Errors from Space IDs, secrets and hashing. Messages never include the
/// Space ID or secret bytes.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("malformed space id: expected exactly 20 ASCII digits")]
    MalformedSpaceId,
    #[error("{name} must be at least {min} bytes (got {len})", min = secret::MIN_SECRET_LEN)]
    SecretTooShort { name: &'static str, len: usize },
    #[error("the OS random number generator failed")]
    Rng(#[source] getrandom::Error),
    #[cfg(feature = "api-auth")]
    #[error("argon2id hashing failed")]
    Hash(#[source] argon2::password_hash::Error),
}

/// HMAC-SHA256 over the concatenation of `parts`. The one HMAC construction
/// used for both the space index and token MACs, so the RFC 4231 vectors in
/// the tests cover both.
pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length (long keys are hashed first), so this
    // cannot fail; `Hmac<Sha256>` implements `KeyInit` with that guarantee.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::hmac_sha256;

    fn hex(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// RFC 4231 §4.2–4.8, HMAC-SHA-256 outputs.
    #[test]
    fn hmac_sha256_rfc4231_vectors() {
        let big_key = [0xaa; 131];
        let cases: [(&[u8], &[u8], &str); 7] = [
            (&[0x0b; 20], b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
            (b"Jefe", b"what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
            (&[0xaa; 20], &[0xdd; 50], "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
            (
                &hex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                &[0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            // Case 5 specifies only the first 128 bits of output.
            (&[0x0c; 20], b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
            (
                &big_key,
                b"Test Using Larger Than Block-Size Key - Hash Key First",
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                &big_key,
                b"This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm.",
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (i, (key, data, expected)) in cases.iter().enumerate() {
            let expected = hex(expected);
            let mac = hmac_sha256(key, &[data]);
            assert_eq!(&mac[..expected.len()], &expected[..], "RFC 4231 test case {}", i + 1);
        }
    }

    #[test]
    fn hmac_sha256_parts_are_concatenated() {
        let data = b"what do ya want for nothing?";
        let (a, b) = data.split_at(9);
        assert_eq!(hmac_sha256(b"Jefe", &[a, b]), hmac_sha256(b"Jefe", &[data]));
        assert_eq!(hmac_sha256(b"Jefe", &[a, &[], b]), hmac_sha256(b"Jefe", &[data]));
    }
}
