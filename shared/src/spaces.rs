//! Spaces and sessions (DESIGN §4): a Space is created with a fresh secret
//! id, stored only as its HMAC index and an Argon2id hash; a session trades
//! that id for a short-lived token, so Argon2 runs once per session.

use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::sync::Semaphore;

use crate::auth::{self, AuthError, Secret, SpaceId};

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

/// Runs CPU-heavy Argon2 work off the async threads, at most as many at once
/// as the semaphore allows.
async fn argon2<T: Send + 'static>(limit: &Semaphore, work: impl FnOnce() -> T + Send + 'static) -> T {
    let _permit = limit.acquire().await.expect("the semaphore is never closed");
    crate::metrics::argon2_in_flight(1.0);
    let out = tokio::task::spawn_blocking(work).await;
    crate::metrics::argon2_in_flight(-1.0);
    out.expect("argon2 work does not panic")
}

pub async fn create(db: &PgPool, pepper: &Secret, limit: &Semaphore) -> Result<NewSpace, SpaceError> {
    loop {
        let space_id = SpaceId::generate()?;
        let idx = auth::space_index(pepper, &space_id);
        let hash = {
            let id = space_id.clone();
            argon2(limit, move || auth::hash_space_id(&id)).await?
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
    limit: &Semaphore,
    space_id: &str,
) -> Result<NewSession, SpaceError> {
    // The format is public, so refusing a malformed id early leaks nothing.
    let space_id = SpaceId::parse(space_id).map_err(|_| SpaceError::InvalidSpace)?;
    let idx = auth::space_index(pepper, &space_id);
    let stored: Option<String> =
        sqlx::query_scalar("SELECT hash FROM spaces WHERE idx = $1").bind(idx.as_bytes()).fetch_optional(db).await?;
    // An unknown id still pays for a (dummy) verify: same time as a wrong one.
    let valid = argon2(limit, move || auth::verify_space_id(&space_id, stored.as_deref())).await;
    if !valid {
        return Err(SpaceError::InvalidSpace);
    }
    let (token, expires_at) = auth::issue_token(token_key, &idx, OffsetDateTime::now_utc());
    Ok(NewSession { token, expires_at })
}
