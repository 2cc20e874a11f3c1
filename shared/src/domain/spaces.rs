//! Spaces and sessions (docs/architecture.md#auth): a Space is created with a fresh secret
//! id, stored only as its HMAC index and an Argon2id hash; a session trades
//! that id for a short-lived token, so Argon2 runs once per session.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::sync::Semaphore;

use crate::domain::auth::{self, AuthError, Secret, SpaceId};

#[derive(Debug, thiserror::Error)]
pub enum SpaceError {
    /// Malformed, unknown or wrong: deliberately one variant.
    #[error("invalid space id")]
    InvalidSpace,
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
        // happens the new space must not overwrite the old one.
        let created_at: Option<OffsetDateTime> = sqlx::query_scalar(
            "INSERT INTO spaces (idx, hash) VALUES ($1, $2) ON CONFLICT (idx) DO NOTHING RETURNING created_at",
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
    let idx = auth::space_index(pepper, &space_id);
    let stored: Option<String> =
        sqlx::query_scalar("SELECT hash FROM spaces WHERE idx = $1").bind(idx.as_bytes()).fetch_optional(db).await?;
    // An unknown id still pays for a (dummy) verify: same time as a wrong one.
    let valid = limit.run(move || auth::verify_space_id(&space_id, stored.as_deref())).await;
    if !valid {
        return Err(SpaceError::InvalidSpace);
    }
    let (token, expires_at) = auth::issue_token(token_key, &idx, OffsetDateTime::now_utc());
    Ok(NewSession { token, expires_at })
}
