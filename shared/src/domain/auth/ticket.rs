//! Stream tickets: what an `EventSource`, which cannot send headers, opens a
//! task's event stream with instead of a session token in its URL.
//!
//! `base64url_nopad(kind ‖ idx ‖ task ‖ expiry ‖ session id ‖ mac)`:
//!
//! | bytes  | field                                                      |
//! |--------|------------------------------------------------------------|
//! | 0      | kind, `0x54` (`T`): never a session token's version        |
//! | 1..17  | space index                                                |
//! | 17..33 | task id (ULID bytes)                                       |
//! | 33..41 | expiry, Unix seconds, big-endian `i64`                     |
//! | 41..53 | the id of the session (or share link) that asked for it    |
//! | 53..85 | `HMAC-SHA256(token_key, "reeve stream ticket\0" ‖ 0..53)`  |
//!
//! A ticket is narrower than a session in every way: it opens one task's
//! stream (read-only), is good for [`TICKET_TTL`] to connect (a stream it
//! opened lives on), and is refused everywhere else: it is not a session
//! token's length or version, and its MAC is over a different prefix, so no
//! ticket is ever a valid session token, nor a session token a ticket. It
//! carries its session's id, so ending the session ends its tickets too.
//!
//! A share link (`super::share`) has this same layout under its own kind
//! byte and MAC prefix, and a ticket asked for with one carries the link's
//! id instead of a session's.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use subtle::ConstantTimeEq;
use time::{Duration, OffsetDateTime};

use super::{Secret, SessionId, SessionToken, ShareToken, SpaceIndex, hmac_sha256};

/// How long a ticket may be used to connect.
pub const TICKET_TTL: Duration = Duration::seconds(60);

const KIND: u8 = b'T';
const DOMAIN: &[u8] = b"reeve stream ticket\0";
const SIGNED_LEN: usize = 1 + 16 + 16 + 8 + 12;
const TICKET_LEN: usize = SIGNED_LEN + 32;

/// What a verified ticket opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTicket {
    pub space: SpaceIndex,
    pub task: [u8; 16],
    /// The session that asked for it, or the share link it was asked for
    /// with: what ending it is checked against.
    pub session: SessionId,
    /// Until when it may be used to connect.
    pub expires_at: OffsetDateTime,
}

impl StreamTicket {
    /// The instant the ticket is dated from: its expiry less [`TICKET_TTL`].
    /// It was asked for then, or (capped by its session's expiry) later.
    /// What a Space ID rotation compares with (`sessions::ticket_is_ended`).
    pub fn dated(&self) -> OffsetDateTime {
        self.expires_at - TICKET_TTL
    }
}

/// Why a ticket was refused; the HTTP layer answers all of them alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("malformed stream ticket")]
    Malformed,
    #[error("stream ticket signature does not match")]
    BadSignature,
    #[error("stream ticket has expired")]
    Expired,
    #[error("the stream ticket is for another task")]
    OtherTask,
}

/// A ticket for `task`'s stream, asked for by `session`, good to connect
/// until the returned instant (whole seconds, at most the session's own
/// expiry: a ticket never outlives the session that asked for it).
pub fn issue_ticket(
    key: &Secret,
    session: &SessionToken,
    task: [u8; 16],
    now: OffsetDateTime,
) -> (String, OffsetDateTime) {
    let holder = Holder { space: session.space, id: session.id, expires_at: session.expires_at };
    issue(key, KIND, DOMAIN, &holder, task, now + TICKET_TTL)
}

/// A ticket for the one task a share link opens, good to connect until the
/// returned instant (at most the link's own expiry). It carries the link's
/// id where a session's ticket carries the session's.
pub fn issue_ticket_for_share(key: &Secret, share: &ShareToken, now: OffsetDateTime) -> (String, OffsetDateTime) {
    let holder = Holder { space: share.space, id: share.id, expires_at: share.expires_at };
    issue(key, KIND, DOMAIN, &holder, share.task, now + TICKET_TTL)
}

/// Who a task pass (a ticket or a share link) is issued to: a Space, and the
/// id of the session or link that asked for it.
pub(super) struct Holder {
    pub space: SpaceIndex,
    pub id: SessionId,
    /// What the pass may not outlive.
    pub expires_at: OffsetDateTime,
}

/// A task pass of `kind`, MACed under `domain`: one layout for tickets and
/// share links, told apart by their first byte and their MAC's prefix.
pub(super) fn issue(
    key: &Secret,
    kind: u8,
    domain: &[u8],
    holder: &Holder,
    task: [u8; 16],
    until: OffsetDateTime,
) -> (String, OffsetDateTime) {
    let expires_at = until.replace_nanosecond(0).expect("0 is a valid nanosecond").min(holder.expires_at);
    let mut pass = [0u8; TICKET_LEN];
    pass[0] = kind;
    pass[1..17].copy_from_slice(holder.space.as_bytes());
    pass[17..33].copy_from_slice(&task);
    pass[33..41].copy_from_slice(&expires_at.unix_timestamp().to_be_bytes());
    pass[41..SIGNED_LEN].copy_from_slice(holder.id.as_bytes());
    let mac = hmac_sha256(key.as_bytes(), &[domain, &pass[..SIGNED_LEN]]);
    pass[SIGNED_LEN..].copy_from_slice(&mac);
    (URL_SAFE_NO_PAD.encode(pass), expires_at)
}

/// What a verified task pass says.
pub(super) struct Opened {
    pub space: SpaceIndex,
    pub id: SessionId,
    pub expires_at: OffsetDateTime,
}

/// A task pass of `kind` under `domain`, if it is well formed, signed with
/// `key`, for `task`, and not expired at `now`.
pub(super) fn open(
    key: &Secret,
    kind: u8,
    domain: &[u8],
    pass: &str,
    task: [u8; 16],
    now: OffsetDateTime,
) -> Result<Opened, TicketError> {
    if pass.len() != base64::encoded_len(TICKET_LEN, false).expect("small") {
        return Err(TicketError::Malformed);
    }
    let mut bytes = [0u8; TICKET_LEN];
    match URL_SAFE_NO_PAD.decode_slice(pass, &mut bytes) {
        Ok(TICKET_LEN) => {}
        _ => return Err(TicketError::Malformed),
    }
    let (signed, mac) = bytes.split_at(SIGNED_LEN);
    if signed[0] != kind {
        return Err(TicketError::Malformed);
    }
    let expected = hmac_sha256(key.as_bytes(), &[domain, signed]);
    if !bool::from(expected.ct_eq(mac)) {
        return Err(TicketError::BadSignature);
    }
    if !bool::from(signed[17..33].ct_eq(&task)) {
        return Err(TicketError::OtherTask);
    }
    let expiry = i64::from_be_bytes(signed[33..41].try_into().expect("8 bytes"));
    if now.unix_timestamp() >= expiry {
        return Err(TicketError::Expired);
    }
    Ok(Opened {
        expires_at: OffsetDateTime::from_unix_timestamp(expiry).map_err(|_| TicketError::Malformed)?,
        space: SpaceIndex::from_array(signed[1..17].try_into().expect("16 bytes")),
        id: SessionId::from_slice(&signed[41..SIGNED_LEN]).expect("12 bytes"),
    })
}

/// The space and session a ticket for `task` was issued to, if it is well
/// formed, signed with `key`, for that task, and not expired at `now`.
pub fn verify_ticket(
    key: &Secret,
    ticket: &str,
    task: [u8; 16],
    now: OffsetDateTime,
) -> Result<StreamTicket, TicketError> {
    let opened = open(key, KIND, DOMAIN, ticket, task, now)?;
    Ok(StreamTicket { space: opened.space, task, session: opened.id, expires_at: opened.expires_at })
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;
    use crate::domain::auth::{issue_token, verify_session, verify_token};

    const NOW: OffsetDateTime = datetime!(2025-06-01 12:00:00.5 UTC);
    const TASK: [u8; 16] = [3; 16];

    fn key() -> Secret {
        Secret::new("REEVE_TOKEN_KEY", vec![1; 32]).unwrap()
    }

    fn session() -> (String, SessionToken) {
        let (token, _) = issue_token(&key(), &SpaceIndex::from_array([0xaa; 16]), NOW);
        let session = verify_session(&key(), &token, NOW).unwrap();
        (token, session)
    }

    #[test]
    fn a_ticket_opens_its_task_for_60_seconds() {
        let (_, session) = session();
        let (ticket, expires_at) = issue_ticket(&key(), &session, TASK, NOW);
        assert_eq!(expires_at, datetime!(2025-06-01 12:01:00 UTC));
        let opened = verify_ticket(&key(), &ticket, TASK, NOW).unwrap();
        assert_eq!((opened.space, opened.task, opened.session), (session.space, TASK, session.id));
        assert_eq!(verify_ticket(&key(), &ticket, TASK, expires_at), Err(TicketError::Expired));
        assert_eq!(verify_ticket(&key(), &ticket, [4; 16], NOW), Err(TicketError::OtherTask));
    }

    #[test]
    fn a_ticket_never_outlives_its_session() {
        let (_, session) = session();
        let late = session.expires_at - Duration::seconds(10);
        assert_eq!(issue_ticket(&key(), &session, TASK, late).1, session.expires_at);
    }

    #[test]
    fn a_ticket_is_no_session_token_and_a_session_token_no_ticket() {
        let (token, session) = session();
        let (ticket, _) = issue_ticket(&key(), &session, TASK, NOW);
        assert!(verify_token(&key(), &ticket, NOW).is_err());
        assert!(!crate::domain::auth::looks_like_session_token(&ticket));
        assert!(crate::domain::auth::looks_like_session_token(&token));
        assert_eq!(verify_ticket(&key(), &token, TASK, NOW), Err(TicketError::Malformed));
    }

    #[test]
    fn every_tampered_byte_is_rejected() {
        let (_, session) = session();
        let (ticket, _) = issue_ticket(&key(), &session, TASK, NOW);
        let bytes = URL_SAFE_NO_PAD.decode(&ticket).unwrap();
        for i in 0..bytes.len() {
            let mut tampered = bytes.clone();
            tampered[i] ^= 1;
            let want = if i == 0 { TicketError::Malformed } else { TicketError::BadSignature };
            assert_eq!(verify_ticket(&key(), &URL_SAFE_NO_PAD.encode(&tampered), TASK, NOW), Err(want), "byte {i}");
        }
    }
}
