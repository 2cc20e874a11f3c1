//! Sessions that can be ended (issue 39). A session token verifies with the
//! token key alone ([`auth::verify_session`]); ending one before its expiry
//! (`DELETE /v1/sessions/current`, `reeve logout`) writes its random session
//! id to `revoked_sessions`, and every route that takes a session asks
//! [`check_session`], which adds one primary-key lookup to the signature
//! check. Those routes all read Postgres anyway, so it costs a round trip on
//! a connection they hold, and no state is kept for sessions that are open.
//!
//! Why a table of ended sessions rather than a per-Space "sessions valid
//! after" instant: logout ends one session, and the Space's other sessions
//! (another terminal, the console, an agent) must go on.
//!
//! Ending all of a Space's sessions at once (a Space ID rotation,
//! `spaces::rotate`) is that per-Space instant, beside the table:
//! `spaces.sessions_from`, a whole second. A session is ended when it was
//! issued before it, and a token says when it was issued to the second
//! ([`SessionToken::issued_at`], its expiry less its lifetime), so the same
//! lookup answers both, with no row per session and no new token format.
//! The instant is the second after the rotation ([`sessions_from`]), so a
//! session opened in the rotation's own second, before it, is ended too;
//! a session opened after it in that second is dated from the next one
//! ([`dated`]): it lasts up to a second longer, and is never taken for one
//! from before. The one-second margin also absorbs clocks that differ by
//! less than a second between the instances that open and rotate.

use sqlx::PgPool;
use time::{Duration, OffsetDateTime};

use crate::domain::auth::{self, Secret, SessionToken, ShareToken, SpaceIndex, StreamTicket, TokenError};
use crate::domain::ids::Id;

/// Why a session was not let in.
#[derive(Debug, thiserror::Error)]
pub enum SessionRefused {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("the session was ended")]
    Ended,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// The session `token` opens: signed with `key`, not expired at `now`, and
/// not ended (by logout, or by a rotation of its Space's ID).
pub async fn check_session(
    db: &PgPool,
    key: &Secret,
    token: &str,
    now: OffsetDateTime,
) -> Result<SessionToken, SessionRefused> {
    let session = auth::verify_session(key, token, now)?;
    if is_ended(db, &session).await? {
        return Err(SessionRefused::Ended);
    }
    Ok(session)
}

/// Whether `session` was ended: by itself (logout), or with every session
/// of its Space (a rotation after it was issued). One round trip.
pub async fn is_ended(db: &PgPool, session: &SessionToken) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM revoked_sessions WHERE session_id = $1)
             OR EXISTS (SELECT 1 FROM spaces WHERE idx = $2 AND sessions_from > $3)",
    )
    .bind(session.id.as_bytes().as_slice())
    .bind(session.space.as_bytes().as_slice())
    .bind(session.issued_at())
    .fetch_one(db)
    .await
}

/// Whether the session that asked for `ticket` was ended, by itself or by
/// a rotation of its Space's ID after the ticket was asked for: a ticket
/// never outlives its session.
pub async fn ticket_is_ended(db: &PgPool, ticket: &StreamTicket) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM revoked_sessions WHERE session_id = $1)
             OR EXISTS (SELECT 1 FROM spaces WHERE idx = $2 AND sessions_from > $3)",
    )
    .bind(ticket.session.as_bytes().as_slice())
    .bind(ticket.space.as_bytes().as_slice())
    .bind(ticket.dated())
    .fetch_one(db)
    .await
}

/// The instant from which a Space's sessions are good again after a
/// rotation at `now`: the next whole second. Every session issued before
/// it is ended.
pub fn sessions_from(now: OffsetDateTime) -> OffsetDateTime {
    now.replace_nanosecond(0).expect("0 is a valid nanosecond") + Duration::SECOND
}

/// When to date a session or ticket issued at `now` on a Space whose
/// sessions are good from `from`: never before it, or it would read as
/// ended.
pub fn dated(now: OffsetDateTime, from: Option<OffsetDateTime>) -> OffsetDateTime {
    from.map_or(now, |from| now.max(from))
}

/// How many expired rows one ending deletes at most: enough to keep up with
/// the endings themselves, small enough to stay quick.
const PRUNE: i64 = 100;

/// Ends `session` at once: every route refuses its token from now on. Ending
/// an ended session again changes nothing. A few rows whose tokens have
/// expired by themselves are deleted on the way: they can refuse nothing.
pub async fn end_session(db: &PgPool, session: &SessionToken) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query(
        "INSERT INTO revoked_sessions (session_id, space_idx, expires_at) VALUES ($1, $2, $3)
         ON CONFLICT (session_id) DO NOTHING",
    )
    .bind(session.id.as_bytes().as_slice())
    .bind(session.space.as_bytes().as_slice())
    .bind(session.expires_at)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "DELETE FROM revoked_sessions WHERE session_id IN
         (SELECT session_id FROM revoked_sessions WHERE expires_at < now() LIMIT $1)",
    )
    .bind(PRUNE)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// A stream ticket for `task`, if the session's Space owns it: `None` for a
/// missing task and another Space's alike, so ids cannot be probed. The
/// ticket opens that task's stream for [`auth::TICKET_TTL`] to connect.
pub async fn ticket_for(
    db: &PgPool,
    key: &Secret,
    session: &SessionToken,
    task: Id,
) -> Result<Option<(String, OffsetDateTime)>, sqlx::Error> {
    // The Space's `sessions_from`, if it owns the task: a ticket asked for
    // in a rotation's second is dated after it, as a session is.
    let owned = sessions_from_of_owner(db, session.space, task).await?;
    Ok(owned.map(|from| auth::issue_ticket(key, session, task.to_bytes(), dated(OffsetDateTime::now_utc(), from))))
}

/// A share link's token for `task`, if the session's Space owns it (`None`
/// for a missing task and another Space's alike). The link lasts
/// [`auth::SHARE_TTL`] and outlives the session; a rotation ends it.
pub async fn share_for(
    db: &PgPool,
    key: &Secret,
    session: &SessionToken,
    task: Id,
) -> Result<Option<(String, OffsetDateTime)>, sqlx::Error> {
    let owned = sessions_from_of_owner(db, session.space, task).await?;
    Ok(owned
        .map(|from| auth::issue_share(key, &session.space, task.to_bytes(), dated(OffsetDateTime::now_utc(), from))))
}

/// What a verified share link gets when it asks for a stream ticket.
#[derive(Debug)]
pub enum SharedTicket {
    /// A ticket of the link's task, and until when it may connect.
    Issued(String, OffsetDateTime),
    /// The task is gone (its Space's retention deleted it).
    NoTask,
    /// The Space's ID was rotated after the link was made.
    Ended,
}

/// A stream ticket for the one task `share` opens, unless the Space's ID
/// was rotated since the link was made, or the task is gone.
pub async fn ticket_for_share(db: &PgPool, key: &Secret, share: &ShareToken) -> Result<SharedTicket, sqlx::Error> {
    let task = Id::from_bytes(&share.task).expect("16 bytes");
    Ok(match sessions_from_of_owner(db, share.space, task).await? {
        None => SharedTicket::NoTask,
        Some(Some(from)) if from > share.issued_at() => SharedTicket::Ended,
        Some(from) => {
            let (ticket, expires_at) = auth::issue_ticket_for_share(key, share, dated(OffsetDateTime::now_utc(), from));
            SharedTicket::Issued(ticket, expires_at)
        }
    })
}

/// The `sessions_from` of the Space that owns `task`, if `space` owns it.
async fn sessions_from_of_owner(
    db: &PgPool,
    space: SpaceIndex,
    task: Id,
) -> Result<Option<Option<OffsetDateTime>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT s.sessions_from FROM tasks t JOIN spaces s ON s.idx = t.space_idx
         WHERE t.id = $1 AND t.space_idx = $2",
    )
    .bind(task)
    .bind(space.as_bytes().as_slice())
    .fetch_optional(db)
    .await
}
