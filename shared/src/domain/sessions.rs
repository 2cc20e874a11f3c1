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
//! (another terminal, the console, an agent) must go on. Ending all of a
//! Space's sessions at once (a Space ID rotation) is a per-Space instant,
//! which can sit beside this table; it does not replace it.

use sqlx::PgPool;
use time::OffsetDateTime;

use crate::domain::auth::{self, Secret, SessionId, SessionToken, TokenError};
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
/// not ended.
pub async fn check_session(
    db: &PgPool,
    key: &Secret,
    token: &str,
    now: OffsetDateTime,
) -> Result<SessionToken, SessionRefused> {
    let session = auth::verify_session(key, token, now)?;
    if is_ended(db, &session.id).await? {
        return Err(SessionRefused::Ended);
    }
    Ok(session)
}

/// Whether the session `id` was ended.
pub async fn is_ended(db: &PgPool, id: &SessionId) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM revoked_sessions WHERE session_id = $1)")
        .bind(id.as_bytes().as_slice())
        .fetch_one(db)
        .await
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
    let owned: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1 AND space_idx = $2)")
        .bind(task)
        .bind(session.space.as_bytes().as_slice())
        .fetch_one(db)
        .await?;
    Ok(owned.then(|| auth::issue_ticket(key, session, task.to_bytes(), OffsetDateTime::now_utc())))
}
