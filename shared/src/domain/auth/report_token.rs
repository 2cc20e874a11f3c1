//! Report tokens: what a service that accepted a job (docs/executors.md)
//! reports on that one attempt with, and nothing else.
//!
//! `base64url_nopad(kind ‖ idx ‖ task ‖ attempt ‖ expiry ‖ mac)`:
//!
//! | bytes  | field                                                      |
//! |--------|------------------------------------------------------------|
//! | 0      | kind, `0x52` (`R`): neither a session token's version nor a stream ticket's kind |
//! | 1..17  | space index                                                |
//! | 17..33 | task id (ULID bytes)                                       |
//! | 33..37 | attempt, big-endian `i32`                                  |
//! | 37..45 | expiry (the attempt's deadline), Unix seconds, big-endian `i64` |
//! | 45..77 | `HMAC-SHA256(token_key, "reeve report token\0" ‖ 0..45)`   |
//!
//! Signed with the token key like sessions and tickets, over its own
//! prefix, so no report token is a session token or a ticket, nor the
//! reverse. Nothing is stored when one is issued: the attempt it names is
//! checked against the task when a report comes (a later attempt makes it
//! `superseded`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use subtle::ConstantTimeEq;
use time::OffsetDateTime;

use super::{Secret, SpaceIndex, hmac_sha256};

const KIND: u8 = b'R';
const DOMAIN: &[u8] = b"reeve report token\0";
const SIGNED_LEN: usize = 1 + 16 + 16 + 4 + 8;
const TOKEN_LEN: usize = SIGNED_LEN + 32;

/// What a verified report token lets its holder report on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportToken {
    pub space: SpaceIndex,
    pub task: [u8; 16],
    pub attempt: i32,
    pub expires_at: OffsetDateTime,
}

/// Why a report token was refused; the HTTP layer answers all of them alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReportTokenError {
    #[error("malformed report token")]
    Malformed,
    #[error("report token signature does not match")]
    BadSignature,
    #[error("report token has expired")]
    Expired,
}

/// A token for reports on `attempt` of `task`, good until `expires_at`
/// (truncated to whole seconds, as it is encoded).
pub fn issue_report_token(
    key: &Secret,
    space: &SpaceIndex,
    task: [u8; 16],
    attempt: i32,
    expires_at: OffsetDateTime,
) -> String {
    let mut token = [0u8; TOKEN_LEN];
    token[0] = KIND;
    token[1..17].copy_from_slice(space.as_bytes());
    token[17..33].copy_from_slice(&task);
    token[33..37].copy_from_slice(&attempt.to_be_bytes());
    token[37..45].copy_from_slice(&expires_at.unix_timestamp().to_be_bytes());
    let mac = hmac_sha256(key.as_bytes(), &[DOMAIN, &token[..SIGNED_LEN]]);
    token[SIGNED_LEN..].copy_from_slice(&mac);
    URL_SAFE_NO_PAD.encode(token)
}

/// What a token reports on, if it is well formed, signed with `key`, and
/// not expired at `now`.
pub fn verify_report_token(key: &Secret, token: &str, now: OffsetDateTime) -> Result<ReportToken, ReportTokenError> {
    if token.len() != base64::encoded_len(TOKEN_LEN, false).expect("small") {
        return Err(ReportTokenError::Malformed);
    }
    let mut bytes = [0u8; TOKEN_LEN];
    match URL_SAFE_NO_PAD.decode_slice(token, &mut bytes) {
        Ok(TOKEN_LEN) => {}
        _ => return Err(ReportTokenError::Malformed),
    }
    let (signed, mac) = bytes.split_at(SIGNED_LEN);
    if signed[0] != KIND {
        return Err(ReportTokenError::Malformed);
    }
    let expected = hmac_sha256(key.as_bytes(), &[DOMAIN, signed]);
    if !bool::from(expected.ct_eq(mac)) {
        return Err(ReportTokenError::BadSignature);
    }
    let expiry = i64::from_be_bytes(signed[37..45].try_into().expect("8 bytes"));
    if now.unix_timestamp() >= expiry {
        return Err(ReportTokenError::Expired);
    }
    Ok(ReportToken {
        space: SpaceIndex::from_array(signed[1..17].try_into().expect("16 bytes")),
        task: signed[17..33].try_into().expect("16 bytes"),
        attempt: i32::from_be_bytes(signed[33..37].try_into().expect("4 bytes")),
        expires_at: OffsetDateTime::from_unix_timestamp(expiry).map_err(|_| ReportTokenError::Malformed)?,
    })
}

#[cfg(test)]
mod tests {
    use time::Duration;
    use time::macros::datetime;

    use super::*;
    use crate::domain::auth::{issue_token, verify_ticket, verify_token};

    const NOW: OffsetDateTime = datetime!(2026-12-06 10:00:00 UTC);
    const TASK: [u8; 16] = [7; 16];

    fn key() -> Secret {
        Secret::new("REEVE_TOKEN_KEY", vec![2; 32]).unwrap()
    }

    fn space() -> SpaceIndex {
        SpaceIndex::from_array([0xbb; 16])
    }

    #[test]
    fn a_report_token_names_its_attempt_until_the_deadline() {
        let deadline = NOW + Duration::hours(1);
        let token = issue_report_token(&key(), &space(), TASK, 3, deadline);
        let read = verify_report_token(&key(), &token, NOW).unwrap();
        assert_eq!((read.space, read.task, read.attempt, read.expires_at), (space(), TASK, 3, deadline));
        assert_eq!(verify_report_token(&key(), &token, deadline), Err(ReportTokenError::Expired));
        let other = Secret::new("REEVE_TOKEN_KEY", vec![3; 32]).unwrap();
        assert_eq!(verify_report_token(&other, &token, NOW), Err(ReportTokenError::BadSignature));
    }

    #[test]
    fn a_report_token_is_no_session_token_nor_ticket_and_the_reverse() {
        let token = issue_report_token(&key(), &space(), TASK, 1, NOW + Duration::hours(1));
        assert!(verify_token(&key(), &token, NOW).is_err());
        assert!(verify_ticket(&key(), &token, TASK, NOW).is_err());
        let (session, _) = issue_token(&key(), &space(), NOW);
        assert_eq!(verify_report_token(&key(), &session, NOW), Err(ReportTokenError::Malformed));
    }

    #[test]
    fn every_tampered_byte_is_rejected() {
        let token = issue_report_token(&key(), &space(), TASK, 1, NOW + Duration::hours(1));
        let bytes = URL_SAFE_NO_PAD.decode(&token).unwrap();
        for i in 0..bytes.len() {
            let mut tampered = bytes.clone();
            tampered[i] ^= 1;
            let want = if i == 0 { ReportTokenError::Malformed } else { ReportTokenError::BadSignature };
            let got = verify_report_token(&key(), &URL_SAFE_NO_PAD.encode(&tampered), NOW);
            assert_eq!(got, Err(want), "byte {i}");
        }
    }
}
