//! Spaces and sessions (docs/architecture.md#auth): a Space is created with a fresh secret
//! id, stored only as its HMAC index and an Argon2id hash; a session trades
//! that id for a short-lived token, so Argon2 runs once per session.
//!
//! A Space's ID can be rotated ([`rotate`]): the Space keeps its row and its
//! index (`idx`, which its tasks, uploads, payments and credits name), and
//! takes a new ID, found by its own index (`login_idx`) and checked against
//! its own hash. The old ID opens nothing from then on, and every session
//! issued before is ended (`sessions.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::sync::Semaphore;

use crate::domain::auth::{self, AuthError, Secret, SessionToken, SpaceId, SpaceIndex};
use crate::domain::sessions;

#[derive(Debug, thiserror::Error)]
pub enum SpaceError {
    /// Malformed, unknown or wrong: deliberately one variant.
    #[error("invalid space id")]
    InvalidSpace,
    /// A rotation whose Space ID (the second factor beside the session) is
    /// not the Space's current one: malformed, wrong, or already rotated.
    #[error("the space id is not the session's space's current id")]
    WrongSpaceId,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("auth: {0}")]
    Auth(#[from] AuthError),
}

pub struct NewSpace {
    pub space_id: SpaceId,
    pub created_at: OffsetDateTime,
}

pub struct NewSession {
    pub token: String,
    pub expires_at: OffsetDateTime,
}

/// The bound on Argon2id work in one process. Each run takes 19 MiB and tens
/// of milliseconds of one core, so a burst of sessions queues here rather
/// than exhausting the process.
///
/// The permit travels into the blocking closure: a caller that gives up (a
/// client that posts and disconnects) drops its future, but the blocking
/// thread it started keeps hashing, and the bound must keep counting it.
pub struct Argon2Limit {
    bound: usize,
    permits: Arc<Semaphore>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

impl Argon2Limit {
    pub fn new(permits: usize) -> Arc<Argon2Limit> {
        Arc::new(Argon2Limit {
            bound: permits,
            permits: Arc::new(Semaphore::new(permits)),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    /// How many runs may execute at once.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// How many runs hold a permit now: executing, or started and about to.
    pub fn busy(&self) -> usize {
        self.bound - self.permits.available_permits()
    }

    /// The most Argon2 runs that were ever executing at once in this process.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Runs CPU-heavy work off the async threads, within the bound.
    pub async fn run<T: Send + 'static>(self: &Arc<Self>, work: impl FnOnce() -> T + Send + 'static) -> T {
        let permit = self.permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let now = me.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
            me.peak.fetch_max(now, Ordering::Relaxed);
            crate::infra::metrics::argon2_in_flight(1.0);
            let out = work();
            crate::infra::metrics::argon2_in_flight(-1.0);
            me.in_flight.fetch_sub(1, Ordering::Relaxed);
            out
        })
        .await
        .expect("argon2 work does not panic")
    }
}

pub async fn create(db: &PgPool, pepper: &Secret, limit: &Arc<Argon2Limit>) -> Result<NewSpace, SpaceError> {
    loop {
        let space_id = SpaceId::generate()?;
        let idx = auth::space_index(pepper, &space_id);
        let hash = {
            let id = space_id.clone();
            limit.run(move || auth::hash_space_id(&id)).await?
        };
        // Two draws of 10^20 colliding is as good as impossible, but if it
        // happens the new space must not overwrite the old one, nor take
        // the index of another's rotated ID (`spaces_login_idx`).
        let created_at: Option<OffsetDateTime> = sqlx::query_scalar(
            "INSERT INTO spaces (idx, hash) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING created_at",
        )
        .bind(idx.as_bytes())
        .bind(&hash)
        .fetch_optional(db)
        .await?;
        if let Some(created_at) = created_at {
            return Ok(NewSpace { space_id, created_at });
        }
    }
}

pub async fn open_session(
    db: &PgPool,
    pepper: &Secret,
    token_key: &Secret,
    limit: &Arc<Argon2Limit>,
    space_id: &str,
) -> Result<NewSession, SpaceError> {
    // The format is public, so refusing a malformed id early leaks nothing.
    let space_id = SpaceId::parse(space_id).map_err(|_| SpaceError::InvalidSpace)?;
    let login_idx = auth::space_index(pepper, &space_id);
    // The Space whose current ID this is: its first one (`idx`) or the one
    // a rotation gave it (`login_idx`). An ID rotated away finds nothing.
    let stored: Option<(Vec<u8>, String, Option<OffsetDateTime>)> =
        sqlx::query_as("SELECT idx, hash, sessions_from FROM spaces WHERE COALESCE(login_idx, idx) = $1")
            .bind(login_idx.as_bytes())
            .fetch_optional(db)
            .await?;
    let (idx, hash, from) = match stored {
        Some((idx, hash, from)) => (SpaceIndex::from_slice(&idx), Some(hash), from),
        None => (None, None, None),
    };
    // An unknown id still pays for a (dummy) verify: same time as a wrong one.
    let valid = limit.run(move || auth::verify_space_id(&space_id, hash.as_deref())).await;
    let Some(idx) = idx.filter(|_| valid) else {
        return Err(SpaceError::InvalidSpace);
    };
    // The token names the Space's row, whichever of its IDs opened it.
    let now = sessions::dated(OffsetDateTime::now_utc(), from);
    let (token, expires_at) = auth::issue_token(token_key, &idx, now);
    Ok(NewSession { token, expires_at })
}

/// A rotated Space ID, and a session on it: every other session of the
/// Space, the one that asked included, is ended.
pub struct Rotated {
    /// Shown once: the server keeps only its index and hash.
    pub space_id: SpaceId,
    pub session: NewSession,
    /// Sessions issued before this instant are ended.
    pub sessions_from: OffsetDateTime,
}

/// Gives the Space of `session` a new ID, if `current` is its current ID
/// (a second factor: a stolen session alone cannot take the Space). The old
/// ID stops opening sessions and every session issued so far is ended, at
/// once; the Space keeps its row, so its tasks, uploads, payments and
/// credits stay with it. Two Argon2id runs (the check and the new hash),
/// which is why the caller spends the client's Space budget first.
///
/// `WrongSpaceId` for a malformed, wrong or already rotated `current`: all
/// alike, and a wrong one costs the same Argon2id verify as a right one.
/// MCP's `rotate_space` tool is meant to call this too.
pub async fn rotate(
    db: &PgPool,
    pepper: &Secret,
    token_key: &Secret,
    limit: &Arc<Argon2Limit>,
    session: &SessionToken,
    current: &str,
) -> Result<Rotated, SpaceError> {
    let current = SpaceId::parse(current).map_err(|_| SpaceError::WrongSpaceId)?;
    let stored: Option<(Vec<u8>, String)> =
        sqlx::query_as("SELECT COALESCE(login_idx, idx), hash FROM spaces WHERE idx = $1")
            .bind(session.space.as_bytes())
            .fetch_optional(db)
            .await?;
    let (login_idx, old_hash) = stored.unzip();
    // The index of the ID sent must be the Space's current one (compared
    // in constant time) and the ID must verify against its hash. The verify
    // runs whatever the index says, so both failures cost the same.
    let indexed = login_idx
        .as_deref()
        .and_then(SpaceIndex::from_slice)
        .is_some_and(|stored| stored == auth::space_index(pepper, &current));
    let verified = {
        let hash = old_hash.clone();
        limit.run(move || auth::verify_space_id(&current, hash.as_deref())).await
    };
    let (true, true, Some(old_hash)) = (indexed, verified, old_hash) else {
        return Err(SpaceError::WrongSpaceId);
    };

    loop {
        let space_id = SpaceId::generate()?;
        let new_idx = auth::space_index(pepper, &space_id);
        let hash = {
            let id = space_id.clone();
            limit.run(move || auth::hash_space_id(&id)).await?
        };
        let now = OffsetDateTime::now_utc();
        // Only over the hash just verified: of two rotations at once with
        // the same ID, one wins and the other finds the ID already replaced.
        let rotated: Result<Option<Option<OffsetDateTime>>, sqlx::Error> = sqlx::query_scalar(
            "UPDATE spaces SET login_idx = $2, hash = $3, sessions_from = GREATEST(sessions_from, $4)
             WHERE idx = $1 AND hash = $5 RETURNING sessions_from",
        )
        .bind(session.space.as_bytes())
        .bind(new_idx.as_bytes())
        .bind(&hash)
        .bind(sessions::sessions_from(now))
        .bind(&old_hash)
        .fetch_optional(db)
        .await;
        let sessions_from = match rotated {
            Ok(Some(Some(from))) => from,
            Ok(_) => return Err(SpaceError::WrongSpaceId),
            // Another Space's ID has this index: as good as impossible (two
            // draws of 10^20 colliding), but then draw again.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => continue,
            Err(e) => return Err(e.into()),
        };
        let (token, expires_at) =
            auth::issue_token(token_key, &session.space, sessions::dated(now, Some(sessions_from)));
        return Ok(Rotated { space_id, session: NewSession { token, expires_at }, sessions_from });
    }
}
