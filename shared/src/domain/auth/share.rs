//! Share links: what a Space's owner hands someone else so they can watch one
//! task, and nothing more. A link is the console's page with the task and a
//! share token in its fragment (`/#task=…&share=…`): browsers send no
//! fragment to a server, so no access log or proxy sees the token.
//!
//! A share token has a stream ticket's layout (`super::ticket`) under its own
//! kind byte, `0x53` (`S`), and its own MAC prefix (`"reeve share link\0"`),
//! so it is never a ticket, and never a session token (another length and
//! version). It is good for one thing: `POST /v1/tasks/{id}/ticket` with
//! `Authorization: Share <token>` gives a stream ticket of that one task. It
//! never lists, spends, cancels, rotates or reads the Space or the task's
//! result: every other route takes a session token and refuses it.
//!
//! A link lasts [`SHARE_TTL`], 24 hours, and outlives the session that made
//! it (a session lasts 15 minutes, too short to send a link and have it
//! opened). A day covers a task's run and its viewer opening the link later
//! that day, reconnecting as often as the network needs; a link left in a
//! chat's history opens nothing the day after. Rotating the Space ID ends
//! every link made before it, as it ends every session.

use time::{Duration, OffsetDateTime};

use super::ticket::{self, Holder, TicketError};

/// The `Authorization` scheme a share link's token is sent with
/// (`Authorization: Share <token>`), on the stream-ticket route only.
pub const SHARE_SCHEME: &str = "Share";
use super::{Secret, SessionId, SpaceIndex};

/// How long a share link may be used to get stream tickets.
pub const SHARE_TTL: Duration = Duration::hours(24);

const KIND: u8 = b'S';
const DOMAIN: &[u8] = b"reeve share link\0";

/// What a verified share token opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareToken {
    pub space: SpaceIndex,
    pub task: [u8; 16],
    /// The link's own random id: the tickets it gives carry it.
    pub id: SessionId,
    pub expires_at: OffsetDateTime,
}

impl ShareToken {
    /// When the link was made, to the second it was dated by: what a Space
    /// ID rotation compares with.
    pub fn issued_at(&self) -> OffsetDateTime {
        self.expires_at - SHARE_TTL
    }
}

/// Why a share token was refused; the HTTP layer answers all of them alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    #[error("malformed share token")]
    Malformed,
    #[error("share token signature does not match")]
    BadSignature,
    #[error("share token has expired")]
    Expired,
    #[error("the share token is for another task")]
    OtherTask,
}

impl From<TicketError> for ShareError {
    fn from(e: TicketError) -> Self {
        match e {
            TicketError::Malformed => ShareError::Malformed,
            TicketError::BadSignature => ShareError::BadSignature,
            TicketError::Expired => ShareError::Expired,
            TicketError::OtherTask => ShareError::OtherTask,
        }
    }
}

/// A share token for `task` of `space`, made at `now` (whole seconds), good
/// until the returned instant.
pub fn issue_share(key: &Secret, space: &SpaceIndex, task: [u8; 16], now: OffsetDateTime) -> (String, OffsetDateTime) {
    let until = now + SHARE_TTL;
    let holder = Holder { space: *space, id: SessionId::generate(), expires_at: until };
    ticket::issue(key, KIND, DOMAIN, &holder, task, until)
}

/// What a share token for `task` opens, if it is well formed, signed with
/// `key`, for that task, and not expired at `now`. Whether a rotation ended
/// it is a question for the database (`sessions::ticket_for_share`).
pub fn verify_share(key: &Secret, share: &str, task: [u8; 16], now: OffsetDateTime) -> Result<ShareToken, ShareError> {
    let opened = ticket::open(key, KIND, DOMAIN, share, task, now)?;
    Ok(ShareToken { space: opened.space, task, id: opened.id, expires_at: opened.expires_at })
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use time::macros::datetime;

    use super::*;
    use crate::domain::auth::{
        TICKET_TTL, issue_ticket_for_share, looks_like_session_token, verify_session, verify_ticket, verify_token,
    };

    const NOW: OffsetDateTime = datetime!(2025-06-01 12:00:00.5 UTC);
    const TASK: [u8; 16] = [3; 16];
    const SPACE: SpaceIndex = SpaceIndex::from_array([0xaa; 16]);

    fn key() -> Secret {
        Secret::new("REEVE_TOKEN_KEY", vec![1; 32]).unwrap()
    }

    #[test]
    fn a_share_opens_its_task_for_a_day() {
        let (share, expires_at) = issue_share(&key(), &SPACE, TASK, NOW);
        assert_eq!(expires_at, datetime!(2025-06-02 12:00:00 UTC));
        let opened = verify_share(&key(), &share, TASK, NOW).unwrap();
        assert_eq!((opened.space, opened.task, opened.expires_at), (SPACE, TASK, expires_at));
        assert_eq!(opened.issued_at(), datetime!(2025-06-01 12:00:00 UTC));
        assert_eq!(verify_share(&key(), &share, TASK, expires_at), Err(ShareError::Expired));
        assert_eq!(verify_share(&key(), &share, [4; 16], NOW), Err(ShareError::OtherTask));
        let other_key = Secret::new("REEVE_TOKEN_KEY", vec![2; 32]).unwrap();
        assert_eq!(verify_share(&other_key, &share, TASK, NOW), Err(ShareError::BadSignature));
        // Two links to one task are two links: each has its own id.
        let (again, _) = issue_share(&key(), &SPACE, TASK, NOW);
        assert_ne!(verify_share(&key(), &again, TASK, NOW).unwrap().id, opened.id);
    }

    #[test]
    fn a_share_gives_tickets_of_its_task_that_never_outlive_it() {
        let (share, _) = issue_share(&key(), &SPACE, TASK, NOW);
        let share = verify_share(&key(), &share, TASK, NOW).unwrap();
        let (ticket, expires_at) = issue_ticket_for_share(&key(), &share, NOW);
        assert_eq!(expires_at, datetime!(2025-06-01 12:01:00 UTC));
        let opened = verify_ticket(&key(), &ticket, TASK, NOW).unwrap();
        assert_eq!((opened.space, opened.session), (SPACE, share.id));
        let late = share.expires_at - time::Duration::seconds(10);
        assert_eq!(issue_ticket_for_share(&key(), &share, late).1, share.expires_at);
        assert!(issue_ticket_for_share(&key(), &share, NOW).1 - NOW <= TICKET_TTL);
    }

    #[test]
    fn a_share_is_no_ticket_and_no_session_token_and_neither_is_a_share() {
        let (share, _) = issue_share(&key(), &SPACE, TASK, NOW);
        assert_eq!(verify_ticket(&key(), &share, TASK, NOW), Err(TicketError::Malformed));
        assert!(verify_token(&key(), &share, NOW).is_err());
        assert!(verify_session(&key(), &share, NOW).is_err());
        assert!(!looks_like_session_token(&share));
        let opened = verify_share(&key(), &share, TASK, NOW).unwrap();
        let (ticket, _) = issue_ticket_for_share(&key(), &opened, NOW);
        assert_eq!(verify_share(&key(), &ticket, TASK, NOW), Err(ShareError::Malformed));
    }

    #[test]
    fn every_tampered_byte_is_rejected() {
        let (share, _) = issue_share(&key(), &SPACE, TASK, NOW);
        let bytes = URL_SAFE_NO_PAD.decode(&share).unwrap();
        for i in 0..bytes.len() {
            let mut tampered = bytes.clone();
            tampered[i] ^= 1;
            let want = if i == 0 { ShareError::Malformed } else { ShareError::BadSignature };
            assert_eq!(verify_share(&key(), &URL_SAFE_NO_PAD.encode(&tampered), TASK, NOW), Err(want), "byte {i}");
        }
    }
}
