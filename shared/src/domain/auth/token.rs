//! Session tokens: `base64url_nopad(version ‖ idx ‖ expiry ‖ session id ‖ mac)`.
//!
//! | bytes  | field                                             |
//! |--------|---------------------------------------------------|
//! | 0      | version, `2`                                      |
//! | 1..17  | space index                                       |
//! | 17..25 | expiry, Unix seconds, big-endian `i64`            |
//! | 25..37 | session id, 12 random bytes                       |
//! | 37..69 | `HMAC-SHA256(token_key, bytes 0..37)`             |
//!
//! Verifying a token needs only the token key: nothing is stored when a
//! session opens. What is stored is the end of one: `DELETE
//! /v1/sessions/current` writes the session id to `revoked_sessions`, and
//! every route that takes a session looks it up there
//! (`spaces::check_session`). The random id is what makes one session
//! distinct from another: two sessions of one Space opened in the same
//! second would otherwise be the same token, and ending one would end both.
//! Version 1 had no id; its tokens are refused, which costs their holders
//! one new session (a token lasts [`SESSION_TTL`]).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use subtle::ConstantTimeEq;
use time::{Duration, OffsetDateTime};

use super::{Secret, SpaceIndex, hmac_sha256};

/// How long a session token is valid after it is issued.
pub const SESSION_TTL: Duration = Duration::minutes(15);

const VERSION: u8 = 2;
const SIGNED_LEN: usize = 1 + 16 + 8 + SESSION_ID_LEN;
const TOKEN_LEN: usize = SIGNED_LEN + 32;
/// 69 bytes encode to exactly 92 base64 characters (no partial group).
const ENCODED_LEN: usize = TOKEN_LEN / 3 * 4;
const SESSION_ID_LEN: usize = 12;

/// One session's id: random, so that two sessions are never the same token.
/// Not a secret (the MAC is what makes a token): it names the session in
/// `revoked_sessions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId([u8; SESSION_ID_LEN]);

impl SessionId {
    pub fn as_bytes(&self) -> &[u8; SESSION_ID_LEN] {
        &self.0
    }

    pub fn from_slice(bytes: &[u8]) -> Option<SessionId> {
        bytes.try_into().ok().map(SessionId)
    }

    pub(super) fn generate() -> SessionId {
        let mut id = [0u8; SESSION_ID_LEN];
        // The OS RNG fails only where the process could not have started
        // (no entropy source at all); the Space ID's draw reports it.
        getrandom::fill(&mut id).expect("the OS random number generator");
        SessionId(id)
    }
}

/// What a verified session token says: whose it is, which session it is,
/// and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionToken {
    pub space: SpaceIndex,
    pub id: SessionId,
    pub expires_at: OffsetDateTime,
}

impl SessionToken {
    /// When the session was opened, to the second it was dated by: its
    /// expiry less [`SESSION_TTL`]. What a Space ID rotation compares with
    /// (`sessions::is_ended`).
    pub fn issued_at(&self) -> OffsetDateTime {
        self.expires_at - SESSION_TTL
    }
}

/// Why a token was refused. The variants are distinct for logs; the HTTP
/// layer answers all of them with the same `401 invalid_token`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed session token")]
    Malformed,
    #[error("unknown session token version")]
    UnknownVersion,
    #[error("session token signature does not match")]
    BadSignature,
    #[error("session token has expired")]
    Expired,
}

/// Issues a token for `idx`, a new session, valid until the returned
/// instant (`now` plus [`SESSION_TTL`], truncated to whole seconds as it is
/// encoded).
pub fn issue_token(key: &Secret, idx: &SpaceIndex, now: OffsetDateTime) -> (String, OffsetDateTime) {
    issue_with_id(key, idx, SessionId::generate(), now)
}

fn issue_with_id(key: &Secret, idx: &SpaceIndex, id: SessionId, now: OffsetDateTime) -> (String, OffsetDateTime) {
    let expires_at = (now + SESSION_TTL).replace_nanosecond(0).expect("0 is a valid nanosecond");

    let mut token = [0u8; TOKEN_LEN];
    token[0] = VERSION;
    token[1..17].copy_from_slice(idx.as_bytes());
    token[17..25].copy_from_slice(&expires_at.unix_timestamp().to_be_bytes());
    token[25..SIGNED_LEN].copy_from_slice(id.as_bytes());
    let mac = hmac_sha256(key.as_bytes(), &[&token[..SIGNED_LEN]]);
    token[SIGNED_LEN..].copy_from_slice(&mac);

    (URL_SAFE_NO_PAD.encode(token), expires_at)
}

/// Returns the space index a token was issued for, if it is well formed,
/// signed with `key`, and not expired at `now`. Whether its session was
/// ended is a question for the database: `spaces::check_session`.
pub fn verify_token(key: &Secret, token: &str, now: OffsetDateTime) -> Result<SpaceIndex, TokenError> {
    verify_session(key, token, now).map(|session| session.space)
}

/// Whether `text` has a session token's shape (its length, alphabet and
/// version), signed or not: what must never sit in a URL, since URLs reach
/// access logs, browser history and shared links. Needs no key, so every
/// route can refuse one before anything else.
pub fn looks_like_session_token(text: &str) -> bool {
    let mut bytes = [0u8; TOKEN_LEN];
    text.len() == ENCODED_LEN
        && matches!(URL_SAFE_NO_PAD.decode_slice(text, &mut bytes), Ok(TOKEN_LEN))
        && bytes[0] == VERSION
}

/// [`verify_token`], with the session's id and expiry.
pub fn verify_session(key: &Secret, token: &str, now: OffsetDateTime) -> Result<SessionToken, TokenError> {
    // Checking the length first bounds the work done on attacker input.
    if token.len() != ENCODED_LEN {
        return Err(TokenError::Malformed);
    }
    let mut bytes = [0u8; TOKEN_LEN];
    match URL_SAFE_NO_PAD.decode_slice(token, &mut bytes) {
        Ok(TOKEN_LEN) => {}
        _ => return Err(TokenError::Malformed),
    }
    let (signed, mac) = bytes.split_at(SIGNED_LEN);

    // The version picks the format, so it is read before the MAC; it is the
    // only field looked at before the MAC is checked.
    if signed[0] != VERSION {
        return Err(TokenError::UnknownVersion);
    }
    let expected = hmac_sha256(key.as_bytes(), &[signed]);
    if !bool::from(expected.ct_eq(mac)) {
        return Err(TokenError::BadSignature);
    }

    let mut idx = [0u8; 16];
    idx.copy_from_slice(&signed[1..17]);
    let mut expiry = [0u8; 8];
    expiry.copy_from_slice(&signed[17..25]);
    let expiry = i64::from_be_bytes(expiry);
    if now.unix_timestamp() >= expiry {
        return Err(TokenError::Expired);
    }
    let expires_at = OffsetDateTime::from_unix_timestamp(expiry).map_err(|_| TokenError::Malformed)?;
    let id = SessionId::from_slice(&signed[25..SIGNED_LEN]).expect("the slice is the id's length");
    Ok(SessionToken { space: SpaceIndex::from_array(idx), id, expires_at })
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    const NOW: OffsetDateTime = datetime!(2025-06-01 12:00:00.5 UTC);

    fn key(byte: u8) -> Secret {
        Secret::new("REEVE_TOKEN_KEY", vec![byte; 32]).unwrap()
    }

    fn decode(token: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(token).unwrap()
    }

    fn encode(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    const A: SpaceIndex = SpaceIndex::from_array([0xaa; 16]);
    const B: SpaceIndex = SpaceIndex::from_array([0xbb; 16]);

    #[test]
    fn round_trip_returns_the_same_index() {
        let (token, expires_at) = issue_token(&key(1), &A, NOW);
        assert_eq!(token.len(), ENCODED_LEN);
        assert_eq!(decode(&token).len(), 69);
        assert_eq!(expires_at, datetime!(2025-06-01 12:15:00 UTC));
        assert_eq!(verify_token(&key(1), &token, NOW), Ok(A));
        assert_eq!(verify_token(&key(1), &token, expires_at - Duration::nanoseconds(1)), Ok(A));
    }

    #[test]
    fn layout_matches_the_documented_format() {
        let (token, expires_at) = issue_token(&key(1), &A, NOW);
        let bytes = decode(&token);
        assert_eq!(bytes[0], 2);
        assert_eq!(&bytes[1..17], A.as_bytes());
        assert_eq!(bytes[17..25], expires_at.unix_timestamp().to_be_bytes());
        let session = verify_session(&key(1), &token, NOW).unwrap();
        assert_eq!(&bytes[25..37], session.id.as_bytes());
        assert_eq!(session.expires_at, expires_at);
        assert_eq!(bytes[37..], hmac_sha256(&[1; 32], &[&bytes[..37]]));
    }

    #[test]
    fn expires_at_the_expiry_second() {
        let (token, expires_at) = issue_token(&key(1), &A, NOW);
        assert_eq!(verify_token(&key(1), &token, expires_at), Err(TokenError::Expired));
        assert_eq!(verify_token(&key(1), &token, expires_at + Duration::days(1)), Err(TokenError::Expired));
    }

    #[test]
    fn every_tampered_byte_is_rejected() {
        let (token, _) = issue_token(&key(1), &A, NOW);
        let bytes = decode(&token);
        for i in 0..bytes.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut tampered = bytes.clone();
                tampered[i] ^= flip;
                let want = if i == 0 { TokenError::UnknownVersion } else { TokenError::BadSignature };
                assert_eq!(verify_token(&key(1), &encode(&tampered), NOW), Err(want), "byte {i} ^ {flip:#x}");
            }
        }
    }

    #[test]
    fn the_mac_is_checked_before_the_expiry() {
        // Forged to expire far in the future; the MAC must stop it, not the clock.
        let (token, _) = issue_token(&key(1), &A, NOW);
        let mut bytes = decode(&token);
        bytes[17..25].copy_from_slice(&i64::MAX.to_be_bytes());
        let later = NOW + Duration::days(365);
        assert_eq!(verify_token(&key(1), &encode(&bytes), later), Err(TokenError::BadSignature));
        // And an expired token with a broken MAC reports the MAC.
        let mut bytes = decode(&token);
        bytes[68] ^= 1;
        assert_eq!(verify_token(&key(1), &encode(&bytes), later), Err(TokenError::BadSignature));
    }

    #[test]
    fn a_validly_signed_unknown_version_is_rejected() {
        let (token, _) = issue_token(&key(1), &A, NOW);
        let mut bytes = decode(&token);
        bytes[0] = 1;
        let mac = hmac_sha256(&[1; 32], &[&bytes[..37]]);
        bytes[37..].copy_from_slice(&mac);
        assert_eq!(verify_token(&key(1), &encode(&bytes), NOW), Err(TokenError::UnknownVersion));
    }

    #[test]
    fn wrong_lengths_are_malformed() {
        let (token, _) = issue_token(&key(1), &A, NOW);
        let bytes = decode(&token);
        let cases = [
            String::new(),
            token[..token.len() - 1].to_owned(),
            format!("{token}A"),
            encode(&bytes[..68]),
            // A version-1 token's length: refused by its length alone.
            encode(&bytes[..57]),
            encode(&[&bytes[..], &[0]].concat()),
            encode(&[&bytes[..], &bytes[..]].concat()),
        ];
        for bad in &cases {
            assert_eq!(verify_token(&key(1), bad, NOW), Err(TokenError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn non_base64url_is_malformed() {
        let (token, _) = issue_token(&key(1), &A, NOW);
        // `+` and `/` are the standard alphabet, not the URL-safe one.
        let mut cases: Vec<String> =
            ["!", "+", "/", "=", " ", "."].iter().map(|c| format!("{c}{}", &token[1..])).collect();
        cases.push("A".repeat(ENCODED_LEN - 2) + "é"); // 76 bytes, not ASCII
        cases.push(" ".repeat(ENCODED_LEN));
        for bad in &cases {
            assert_eq!(bad.len(), ENCODED_LEN);
            assert_eq!(verify_token(&key(1), bad, NOW), Err(TokenError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn a_token_for_one_space_never_opens_another() {
        let (token_a, _) = issue_token(&key(1), &A, NOW);
        let (token_b, _) = issue_token(&key(1), &B, NOW);
        assert_ne!(token_a, token_b);
        assert_eq!(verify_token(&key(1), &token_a, NOW), Ok(A));
        assert_eq!(verify_token(&key(1), &token_b, NOW), Ok(B));
        assert_ne!(verify_token(&key(1), &token_a, NOW), Ok(B));

        // Splicing B's index into A's token breaks the MAC.
        let mut spliced = decode(&token_a);
        spliced[1..17].copy_from_slice(B.as_bytes());
        assert_eq!(verify_token(&key(1), &encode(&spliced), NOW), Err(TokenError::BadSignature));
    }

    #[test]
    fn two_sessions_opened_in_the_same_second_are_two_tokens() {
        let (one, _) = issue_token(&key(1), &A, NOW);
        let (two, _) = issue_token(&key(1), &A, NOW);
        assert_ne!(one, two);
        let (one, two) = (verify_session(&key(1), &one, NOW).unwrap(), verify_session(&key(1), &two, NOW).unwrap());
        assert_ne!(one.id, two.id);
        assert_eq!((one.space, one.expires_at), (two.space, two.expires_at));
    }

    #[test]
    fn the_session_id_is_signed() {
        let id = SessionId([7; SESSION_ID_LEN]);
        let (token, _) = issue_with_id(&key(1), &A, id, NOW);
        assert_eq!(verify_session(&key(1), &token, NOW).map(|s| s.id), Ok(id));
        let mut bytes = decode(&token);
        bytes[30] ^= 1;
        assert_eq!(verify_session(&key(1), &encode(&bytes), NOW), Err(TokenError::BadSignature));
    }

    #[test]
    fn a_token_from_another_key_is_rejected() {
        let (token, _) = issue_token(&key(1), &A, NOW);
        assert_eq!(verify_token(&key(2), &token, NOW), Err(TokenError::BadSignature));
    }

    #[test]
    fn tokens_are_url_safe() {
        for i in 0..=255u8 {
            let (token, _) = issue_token(&key(i), &SpaceIndex::from_array([i; 16]), NOW);
            assert_eq!(token.len(), ENCODED_LEN);
            assert!(token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{token}");
        }
    }
}
