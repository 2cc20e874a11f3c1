//! A Space's webhook signing secrets. The owner makes the first and rotates
//! it with the same call (`POST /v1/space/webhook-secret`); each is shown
//! once, as `whsec_<base64>`. The key is stored, since every delivery must
//! be signed with it; it opens nothing (a receiver trusts it, Reeve does not).
//!
//! A rotation gives the secret it replaces an end [`ROTATION_GRACE`] later,
//! during which a delivery carries both signatures (the spec's
//! space-separated list), so a receiver can switch at its own pace. A
//! secret already ending when another rotation comes ends at once: at most
//! two sign at any time.

use sqlx::PgPool;
use time::OffsetDateTime;

use super::ROTATION_GRACE;
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::infra::standard_webhooks::SigningKey;

/// A secret just made: its text, shown once, and when the one it replaced
/// stops signing (`None` for a Space's first).
#[derive(Debug)]
pub struct Rotated {
    pub key: SigningKey,
    pub created_at: OffsetDateTime,
    pub previous_expires_at: Option<OffsetDateTime>,
}

/// Makes a new current secret for `space`; the one it replaces keeps
/// signing for [`ROTATION_GRACE`].
pub async fn rotate(db: &PgPool, space: &SpaceIndex) -> Result<Rotated, sqlx::Error> {
    let key = SigningKey::generate();
    let mut tx = db.begin().await?;
    // One rotation at a time per Space: the row lock of the Space.
    sqlx::query("SELECT 1 FROM spaces WHERE idx = $1 FOR UPDATE").bind(space.as_bytes()).execute(&mut *tx).await?;
    sqlx::query(
        "UPDATE webhook_secrets SET expires_at = now()
          WHERE space_idx = $1 AND expires_at IS NOT NULL AND expires_at > now()",
    )
    .bind(space.as_bytes())
    .execute(&mut *tx)
    .await?;
    let previous_expires_at: Option<OffsetDateTime> = sqlx::query_scalar(
        "UPDATE webhook_secrets SET expires_at = now() + make_interval(secs => $2)
          WHERE space_idx = $1 AND expires_at IS NULL
      RETURNING expires_at",
    )
    .bind(space.as_bytes())
    .bind(ROTATION_GRACE.as_secs_f64())
    .fetch_optional(&mut *tx)
    .await?;
    let created_at: OffsetDateTime =
        sqlx::query_scalar("INSERT INTO webhook_secrets (id, space_idx, key) VALUES ($1, $2, $3) RETURNING created_at")
            .bind(Id::new())
            .bind(space.as_bytes())
            .bind(key.as_bytes())
            .fetch_one(&mut *tx)
            .await?;
    tx.commit().await?;
    Ok(Rotated { key, created_at, previous_expires_at })
}

/// Whether `space` has a secret that signs now.
pub async fn has_secret(db: &PgPool, space: &SpaceIndex) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM webhook_secrets
                         WHERE space_idx = $1 AND (expires_at IS NULL OR expires_at > now()))",
    )
    .bind(space.as_bytes())
    .fetch_one(db)
    .await
}

/// The keys that sign a delivery for the Space of `space_idx` now: the
/// current one first, then one in its grace period.
pub async fn signing_keys(db: &PgPool, space_idx: &[u8]) -> Result<Vec<SigningKey>, sqlx::Error> {
    let keys: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT key FROM webhook_secrets
          WHERE space_idx = $1 AND (expires_at IS NULL OR expires_at > now())
          ORDER BY created_at DESC, id DESC",
    )
    .bind(space_idx)
    .fetch_all(db)
    .await?;
    Ok(keys.into_iter().filter_map(|k| SigningKey::from_bytes(k).ok()).collect())
}
