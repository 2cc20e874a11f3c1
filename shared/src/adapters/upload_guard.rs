//! The upload guard (docs/architecture.md#the-upload-guard): S3 reports every object created under the
//! upload prefix, and the guard settles the upload it belongs to.
//!
//! - No upload has that key: the object is deleted (nobody was promised it).
//! - The upload is `pending`: a HEAD of the object decides. The declared size
//!   and type, within the upload limit, mark it `uploaded`; anything else
//!   marks it `rejected` and deletes the object. Both updates are conditional
//!   on `status = 'pending'`, so a concurrent task create's decision stands:
//!   an update that changed no row settles against the row as it is now.
//! - The upload is `rejected`: the object is deleted again (a replayed PUT).
//! - The upload is `uploaded` or `consumed`: task create's own HEAD (or an
//!   earlier delivery of this event) got there first. The object is left
//!   alone when it still matches its declaration, since a task may be reading
//!   it, and deleted when it does not; the row is not changed either way
//!   (the worker HEADs it again before use).
//!
//! Correctness never depends on the guard having run: it only cleans up
//! early. Errors reaching S3 or Postgres are returned, so Lambda retries the
//! whole event; every step is idempotent.

use aws_lambda_events::event::s3::{S3Event, S3EventRecord};
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::domain::ids::Id;
use crate::domain::uploads::{self, ObjectState, UploadError, UploadRow, UploadStatus};

/// What the guard did with one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The object matches a pending upload, which is now `uploaded`.
    Accepted,
    /// The object did not match its pending upload: deleted, upload `rejected`.
    Rejected { size: Option<i64>, content_type: Option<String> },
    /// No upload has this key: the object was deleted.
    DeletedUnknown,
    /// The upload was already `rejected`: the object was deleted again.
    DeletedRejected,
    /// The upload was already decided (`uploaded`/`consumed`) and the object
    /// still matches it: left alone.
    AlreadySettled(UploadStatus),
    /// The upload was already decided, but this object no longer matches:
    /// deleted, the row left as it was.
    DeletedMismatch(UploadStatus),
    /// The object is gone already (deleted or expired before we looked).
    Missing,
    /// Not an object-created event, or another bucket's: nothing done.
    Ignored(String),
}

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("storage: {0}")]
    Storage(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

impl From<UploadError> for GuardError {
    fn from(e: UploadError) -> Self {
        match e {
            UploadError::Db(e) => GuardError::Db(e),
            other => GuardError::Storage(other.to_string()),
        }
    }
}

/// What the guard needs: Postgres, S3, the bucket it watches and the limit.
#[derive(Clone, Debug)]
pub struct Guard {
    pub db: PgPool,
    pub s3: crate::infra::s3_objects::S3Objects,
    pub bucket: String,
    /// The largest object any upload may have (the catalog's `max_bytes`,
    /// capped by the deployment's `REEVE_UPLOAD_MAX_BYTES`).
    pub max_bytes: u64,
}

/// Decodes an S3 event key: S3 sends it URL-encoded, with `+` for a space
/// (so `%2B` is a plus). Invalid escapes are kept as they are.
pub fn decode_key(raw: &str) -> String {
    percent_encoding::percent_decode_str(&raw.replace('+', " ")).decode_utf8_lossy().into_owned()
}

type RawRow = (Id, Vec<u8>, String, String, String, i64, String, OffsetDateTime);

/// The upload whose object has `key`, of any space.
pub async fn find_by_key(db: &PgPool, key: &str) -> Result<Option<UploadRow>, sqlx::Error> {
    let row: Option<RawRow> = sqlx::query_as(
        "SELECT id, space_idx, key, filename, content_type, size, status, created_at
           FROM uploads WHERE key = $1",
    )
    .bind(key)
    .fetch_optional(db)
    .await?;
    row.map(UploadRow::try_from).transpose()
}

impl Guard {
    /// Settles every record of `event`. All records are tried; if any failed,
    /// the first error is returned (after logging each) so Lambda retries the
    /// event, and the records already settled settle the same way again.
    pub async fn handle(&self, event: &S3Event) -> Result<Vec<(String, Outcome)>, GuardError> {
        let mut outcomes = Vec::with_capacity(event.records.len());
        let mut first_error = None;
        for record in &event.records {
            let key = record.s3.object.key.as_deref().map(decode_key).unwrap_or_default();
            match self.handle_record(record).await {
                Ok(outcome) => {
                    tracing::info!(key = %key, outcome = ?outcome, "upload guard");
                    outcomes.push((key, outcome));
                }
                Err(e) => {
                    tracing::error!(key = %key, error = %e, "upload guard failed; the event will be retried");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(outcomes),
        }
    }

    pub async fn handle_record(&self, record: &S3EventRecord) -> Result<Outcome, GuardError> {
        let name = record.event_name.as_deref().unwrap_or_default();
        if !name.starts_with("ObjectCreated:") && !name.starts_with("s3:ObjectCreated:") {
            return Ok(Outcome::Ignored(format!("event {name:?}")));
        }
        let bucket = record.s3.bucket.name.as_deref().unwrap_or_default();
        if bucket != self.bucket {
            return Ok(Outcome::Ignored(format!("bucket {bucket:?} is not {:?}", self.bucket)));
        }
        let Some(raw) = record.s3.object.key.as_deref().filter(|k| !k.is_empty()) else {
            return Ok(Outcome::Ignored("no object key".to_owned()));
        };
        self.settle(&decode_key(raw)).await
    }

    /// Settles the object under `key` (already decoded).
    pub async fn settle(&self, key: &str) -> Result<Outcome, GuardError> {
        let Some(row) = find_by_key(&self.db, key).await? else {
            self.delete(key).await?;
            return Ok(Outcome::DeletedUnknown);
        };
        let state = uploads::check_object(&self.s3, &self.bucket, &row).await?;
        let over_limit = row.size > self.max_bytes;
        match (row.status, state) {
            (_, ObjectState::Missing) => Ok(Outcome::Missing),
            (UploadStatus::Rejected, _) => {
                self.delete(key).await?;
                Ok(Outcome::DeletedRejected)
            }
            (status @ (UploadStatus::Uploaded | UploadStatus::Consumed), ObjectState::Matches) => {
                Ok(Outcome::AlreadySettled(status))
            }
            (status @ (UploadStatus::Uploaded | UploadStatus::Consumed), ObjectState::Differs { .. }) => {
                self.delete(key).await?;
                Ok(Outcome::DeletedMismatch(status))
            }
            (UploadStatus::Pending, ObjectState::Matches) if !over_limit => {
                let updated = sqlx::query(
                    "UPDATE uploads SET status = 'uploaded', updated_at = now() WHERE id = $1 AND status = 'pending'",
                )
                .bind(row.id)
                .execute(&self.db)
                .await?;
                if updated.rows_affected() == 1 {
                    Ok(Outcome::Accepted)
                } else {
                    // Decided meanwhile (task create's HEAD): settle against that.
                    Box::pin(self.settle(key)).await
                }
            }
            (UploadStatus::Pending, state) => {
                let (size, content_type) = match state {
                    ObjectState::Differs { size, content_type } => (size, content_type),
                    // Matches its declaration, but the declaration is over
                    // the limit (the limit was lowered after presigning).
                    _ => (i64::try_from(row.size).ok(), Some(row.content_type.clone())),
                };
                tracing::warn!(
                    upload_id = %row.id, declared_size = row.size, declared_type = %row.content_type,
                    max_bytes = self.max_bytes, ?size, ?content_type, "upload differs from its declaration; rejecting it"
                );
                // Mark first, so the upload can never be accepted, then
                // delete, but only if this update won: task create may have
                // marked it `uploaded` since we read it, and a task may be
                // about to read the object.
                let updated = sqlx::query(
                    "UPDATE uploads SET status = 'rejected', updated_at = now() WHERE id = $1 AND status = 'pending'",
                )
                .bind(row.id)
                .execute(&self.db)
                .await?;
                if updated.rows_affected() == 0 {
                    // Decided meanwhile: settle against that decision.
                    return Box::pin(self.settle(key)).await;
                }
                self.delete(key).await?;
                Ok(Outcome::Rejected { size, content_type })
            }
        }
    }

    async fn delete(&self, key: &str) -> Result<(), GuardError> {
        self.s3.delete(&self.bucket, key).await.map_err(|e| GuardError::Storage(format!("DELETE {key}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_url_decoded() {
        assert_eq!(decode_key("incoming/tasks/ab/01J/my+file%281%29.txt"), "incoming/tasks/ab/01J/my file(1).txt");
        assert_eq!(decode_key("a%2Fb%3Dc"), "a/b=c");
        assert_eq!(decode_key("caf%C3%A9"), "café");
        assert_eq!(decode_key("a%2Bb+c"), "a+b c");
        // Broken escapes are kept, not dropped.
        assert_eq!(decode_key("50%"), "50%");
        assert_eq!(decode_key("50%zz"), "50%zz");
        assert_eq!(decode_key("x%4"), "x%4");
        assert_eq!(decode_key("plain-name_1.bin"), "plain-name_1.bin");
    }
}
