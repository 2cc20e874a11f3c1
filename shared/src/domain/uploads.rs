//! Uploads (docs/architecture.md#uploads-and-the-size-policy): presigned PUTs of a declared size and type, and the
//! checks that an object really is what was declared.
//!
//! S3 cannot limit a PUT's size by policy, so the limit holds in layers:
//! [`create`] refuses a declared size over the catalog's `max_bytes` and signs
//! the PUT with that exact `Content-Length` and `Content-Type` (a body of any
//! other length, or another type, fails with `403 SignatureDoesNotMatch`);
//! [`ensure_uploaded`] and [`check_object`] HEAD the object before anything
//! trusts it, so correctness never depends on the upload guard having run.
//!
//! One file, though long: the layers below run from presign to the
//! worker's last check, each relying on the one before.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use sqlx::{PgExecutor, PgPool};
use time::OffsetDateTime;

use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::uploads::Uploads;
use crate::domain::ids::Id;
use crate::infra::s3_objects::S3Objects;

/// Every object key of an upload starts with this (the guard's trigger prefix).
pub const KEY_PREFIX: &str = "incoming/tasks/";
pub use crate::domain::catalog::uploads::MAX_FILENAME_BYTES;
/// Longest sanitised name used in an object key, in characters (all ASCII).
pub const MAX_KEY_NAME_CHARS: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// Unknown, or another space's: the same answer, so ids can't be probed.
    #[error("upload {0} not found")]
    NotFound(Id),
    /// Declared but not (yet, or not correctly) uploaded.
    #[error("upload {0} has not been uploaded")]
    NotUploaded(Id),
    #[error("upload {0} was rejected")]
    Rejected(Id),
    /// Uploaded once, and its object is gone now (the bucket expires
    /// uploads).
    #[error("upload {0} is gone from storage")]
    Gone(Id),
    #[error("storage: {0}")]
    Storage(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// Why [`create`] refused to presign. Kept apart from [`UploadError`]: these
/// are answers to a bad declaration, which no later check can produce.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// Missing, empty, too long, or carrying control characters.
    #[error("invalid filename: {0}")]
    InvalidFilename(&'static str),
    /// Zero (JSON that is not a non-negative integer never gets this far).
    #[error("size must be a positive integer")]
    InvalidSize,
    #[error("size {size} exceeds the limit of {max_bytes} bytes")]
    TooLarge { size: u64, max_bytes: u64 },
    #[error("content type not allowed")]
    UnsupportedContentType { allowed: Vec<String> },
    /// Presigning failed (no credentials, say). Nothing was stored.
    #[error("storage: {0}")]
    Storage(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadStatus {
    /// Presigned; nothing checked yet.
    Pending,
    /// The object was seen with the declared size and type.
    Uploaded,
    /// The object was not what was declared; it has been deleted.
    Rejected,
    /// Used by a task.
    Consumed,
}

impl UploadStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            UploadStatus::Pending => "pending",
            UploadStatus::Uploaded => "uploaded",
            UploadStatus::Rejected => "rejected",
            UploadStatus::Consumed => "consumed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => UploadStatus::Pending,
            "uploaded" => UploadStatus::Uploaded,
            "rejected" => UploadStatus::Rejected,
            "consumed" => UploadStatus::Consumed,
            _ => return None,
        })
    }
}

/// One row of `uploads`.
#[derive(Debug, Clone)]
pub struct UploadRow {
    pub id: Id,
    pub space: SpaceIndex,
    /// The object key in the bucket.
    pub key: String,
    /// The name the client declared, as given.
    pub filename: String,
    pub content_type: String,
    pub size: u64,
    pub status: UploadStatus,
    pub created_at: OffsetDateTime,
}

type RawRow = (Id, Vec<u8>, String, String, String, i64, String, OffsetDateTime);

impl TryFrom<RawRow> for UploadRow {
    type Error = sqlx::Error;

    fn try_from(
        (id, space, key, filename, content_type, size, status, created_at): RawRow,
    ) -> Result<Self, sqlx::Error> {
        let decode = |what: &str| sqlx::Error::Decode(format!("uploads row {id}: bad {what}").into());
        Ok(UploadRow {
            id,
            space: SpaceIndex::from_slice(&space).ok_or_else(|| decode("space_idx"))?,
            key,
            filename,
            content_type,
            size: u64::try_from(size).map_err(|_| decode("size"))?,
            status: UploadStatus::parse(&status).ok_or_else(|| decode("status"))?,
            created_at,
        })
    }
}

/// The upload `id` of `space`; `None` for an unknown id and for another
/// space's upload alike.
pub async fn find(db: impl PgExecutor<'_>, space: &SpaceIndex, id: Id) -> Result<Option<UploadRow>, sqlx::Error> {
    let row: Option<RawRow> = sqlx::query_as(
        "SELECT id, space_idx, key, filename, content_type, size, status, created_at
           FROM uploads WHERE id = $1 AND space_idx = $2",
    )
    .bind(id)
    .bind(space.as_bytes())
    .fetch_optional(db)
    .await?;
    row.map(UploadRow::try_from).transpose()
}

/// What a client declares before uploading.
#[derive(Debug, Clone)]
pub struct UploadRequest {
    /// `None` when the client sent none: refused like an empty one.
    pub filename: Option<String>,
    pub content_type: String,
    pub size: u64,
}

/// A presigned PUT: the client sends exactly `method`, `url` and `headers`.
#[derive(Debug, Clone)]
pub struct PresignedUpload {
    pub id: Id,
    pub key: String,
    pub url: String,
    pub method: String,
    /// The headers the signature covers, names in lower case; the client must
    /// send them with exactly these values.
    pub headers: BTreeMap<String, String>,
    pub expires_at: OffsetDateTime,
}

/// Turns any client-supplied name into a safe last component of an object
/// key: only `[A-Za-z0-9._-]`, no path separators, no `..`, no leading dot,
/// at most [`MAX_KEY_NAME_CHARS`] characters (keeping a short extension), and
/// `file` when nothing is left.
pub fn sanitise_filename(name: &str) -> String {
    // A client may send a path; only its last component names the file.
    let base = name.rsplit(['/', '\\']).find(|part| !part.is_empty()).unwrap_or("");
    let mut out = String::with_capacity(base.len().min(MAX_KEY_NAME_CHARS * 2));
    for c in base.chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' };
        // Runs of dots become one dot, so `..` can never appear.
        if c == '.' && out.ends_with('.') {
            continue;
        }
        out.push(c);
    }
    let out = out.trim_start_matches('.');
    let out = truncate_keeping_extension(out, MAX_KEY_NAME_CHARS);
    if out.is_empty() || out == "." { "file".to_owned() } else { out }
}

fn truncate_keeping_extension(name: &str, max: usize) -> String {
    // Everything here is ASCII, so bytes are characters.
    if name.len() <= max {
        return name.to_owned();
    }
    match name.rfind('.') {
        Some(dot) if dot > 0 && name.len() - dot <= 16 => {
            let ext = &name[dot..];
            format!("{}{ext}", &name[..max - ext.len()])
        }
        _ => name[..max].to_owned(),
    }
}

/// `incoming/tasks/<space-hex>/<upload-ulid>/<sanitised-name>`.
pub fn object_key(space: &SpaceIndex, id: Id, filename: &str) -> String {
    format!("{KEY_PREFIX}{}/{id}/{}", space.to_hex(), sanitise_filename(filename))
}

/// A declaration that passed every check: the original name and the
/// canonical (lower-case) content type.
struct Declared {
    filename: String,
    content_type: String,
    size: u64,
}

fn validate(policy: &Uploads, request: UploadRequest) -> Result<Declared, CreateError> {
    let filename = request.filename.ok_or(CreateError::InvalidFilename("filename is required"))?;
    if filename.trim().is_empty() {
        return Err(CreateError::InvalidFilename("filename must not be empty"));
    }
    if filename.len() > MAX_FILENAME_BYTES {
        return Err(CreateError::InvalidFilename("filename is longer than 255 bytes"));
    }
    // Postgres cannot store NUL, and no real file name carries control characters.
    if filename.chars().any(char::is_control) {
        return Err(CreateError::InvalidFilename("filename must not contain control characters"));
    }
    if request.size == 0 {
        return Err(CreateError::InvalidSize);
    }
    if request.size > policy.max_bytes {
        return Err(CreateError::TooLarge { size: request.size, max_bytes: policy.max_bytes });
    }
    let content_type = request.content_type.trim().to_ascii_lowercase();
    if !policy.content_types.iter().any(|allowed| allowed.eq_ignore_ascii_case(&content_type)) {
        return Err(CreateError::UnsupportedContentType { allowed: policy.content_types.clone() });
    }
    Ok(Declared { filename, content_type, size: request.size })
}

/// Checks a declaration against the catalog's `[uploads]` policy, presigns a
/// PUT bound to its exact size and type, and records the `pending` upload.
/// `expires_in` is normally `url_expiry_seconds`; tests pass a short one.
pub async fn create(
    db: &PgPool,
    s3: &S3Objects,
    bucket: &str,
    policy: &Uploads,
    space: &SpaceIndex,
    request: UploadRequest,
    expires_in: Duration,
) -> Result<PresignedUpload, CreateError> {
    let declared = validate(policy, request)?;
    let id = Id::new();
    let key = object_key(space, id, &declared.filename);
    let size = i64::try_from(declared.size).map_err(|_| CreateError::InvalidSize)?;

    let signed = presign_put(s3, bucket, &key, size, &declared.content_type, None, expires_in)
        .await
        .map_err(CreateError::Storage)?;

    record_pending(db, id, space, &key, &declared).await?;

    Ok(PresignedUpload {
        id,
        key,
        url: signed.url,
        method: signed.method,
        headers: signed.headers,
        expires_at: signed.expires_at,
    })
}

/// A presigned PUT of one object: the sender sends exactly `method`, `url`
/// and `headers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedPut {
    pub url: String,
    pub method: String,
    /// The headers the signature covers, names in lower case.
    pub headers: BTreeMap<String, String>,
    pub expires_at: OffsetDateTime,
}

/// Presigns a PUT of `key` bound to its exact `Content-Length` and
/// `Content-Type`, valid `expires_in` from the current whole second: the
/// size policy of uploads, and of the outputs a service writes
/// (`executors::service`). With `sha256` (hex), bound to that digest too:
/// the PUT must carry it as `x-amz-checksum-sha256`, and S3 refuses a body
/// that does not hash to it (`400 BadDigest`) and keeps it with the object
/// ([`written_object`] reads it back).
pub async fn presign_put(
    s3: &S3Objects,
    bucket: &str,
    key: &str,
    size: i64,
    content_type: &str,
    sha256: Option<&str>,
    expires_in: Duration,
) -> Result<SignedPut, String> {
    // SigV4 dates are whole seconds: start on one, so `expires_at` is exact.
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(now.as_secs());
    let mut headers = BTreeMap::from([
        ("content-length".to_owned(), size.to_string()),
        ("content-type".to_owned(), content_type.to_owned()),
    ]);
    if let Some(hex_digest) = sha256 {
        let digest = hex::decode(hex_digest).ok().filter(|d| d.len() == 32).ok_or("sha256 is not 64 hex digits")?;
        headers.insert(CHECKSUM_SHA256.to_owned(), base64::engine::general_purpose::STANDARD.encode(digest));
    }
    let signed: Vec<(&str, &str)> = headers.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    let url = s3
        .presigned_put(bucket, key, &signed, start, expires_in)
        .await
        .map_err(|e| format!("presigning PUT {key}: {e}"))?;
    Ok(SignedPut { url, method: "PUT".to_owned(), headers, expires_at: OffsetDateTime::from(start + expires_in) })
}

/// Records a declared upload as `pending`.
async fn record_pending(
    db: &PgPool,
    id: Id,
    space: &SpaceIndex,
    key: &str,
    declared: &Declared,
) -> Result<(), CreateError> {
    let size = i64::try_from(declared.size).map_err(|_| CreateError::InvalidSize)?;
    sqlx::query(
        "INSERT INTO uploads (id, space_idx, key, filename, content_type, size) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(space.as_bytes())
    .bind(key)
    .bind(&declared.filename)
    .bind(&declared.content_type)
    .bind(size)
    .execute(db)
    .await?;
    Ok(())
}

/// A file sent in a request, for [`store`].
#[derive(Debug, Clone)]
pub struct InlineFile {
    pub filename: String,
    pub content_type: String,
    pub bytes: bytes::Bytes,
}

/// A file stored by the server rather than PUT by the client: for clients
/// that can send bytes only in the request itself (MCP's inline upload,
/// whose size the caller bounds). The same declaration checks as [`create`];
/// the row is recorded `pending` first, so the upload guard, which deletes
/// an object that matches no pending upload, finds it; then the object is
/// written with its exact length and type, and the upload is `uploaded`.
/// `Storage` when the write fails (the row stays `pending` and unusable).
pub async fn store(
    db: &PgPool,
    s3: &S3Objects,
    bucket: &str,
    policy: &Uploads,
    space: &SpaceIndex,
    file: InlineFile,
) -> Result<Id, CreateError> {
    let InlineFile { filename, content_type, bytes } = file;
    let declared =
        validate(policy, UploadRequest { filename: Some(filename), content_type, size: bytes.len() as u64 })?;
    let id = Id::new();
    let key = object_key(space, id, &declared.filename);
    record_pending(db, id, space, &key, &declared).await?;
    s3.put(bucket, &key, &declared.content_type, bytes)
        .await
        .map_err(|e| CreateError::Storage(format!("PUT {key}: {e}")))?;
    sqlx::query("UPDATE uploads SET status = 'uploaded', updated_at = now() WHERE id = $1 AND status = 'pending'")
        .bind(id)
        .execute(db)
        .await?;
    Ok(id)
}

/// The header that binds a PUT to its body's SHA-256 (base64).
const CHECKSUM_SHA256: &str = "x-amz-checksum-sha256";

/// An object as a HEAD shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenObject {
    pub size: i64,
    /// When it was written.
    pub written: Option<time::OffsetDateTime>,
    /// The SHA-256 (hex) S3 verified the body against when it was written
    /// (its PUT carried `x-amz-checksum-sha256`), if it was.
    pub sha256: Option<String>,
}

/// The object under `key`, by a HEAD that asks for its checksum; `None`
/// when there is none.
pub async fn written_object(s3: &S3Objects, bucket: &str, key: &str) -> Result<Option<WrittenObject>, String> {
    let Some(head) = s3.head(bucket, key, true).await.map_err(|e| format!("HEAD {key}: {e}"))? else {
        return Ok(None);
    };
    // A checksum of the whole object: a multipart upload's is one of its
    // parts' checksums (`<base64>-<parts>`), which no reader can compare
    // with a file's SHA-256, and a presigned PUT is one part.
    let sha256 = head
        .checksum_sha256
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .filter(|digest| digest.len() == 32)
        .map(hex::encode);
    Ok(Some(WrittenObject {
        size: head.size.unwrap_or(0),
        written: head.last_modified.map(OffsetDateTime::from),
        sha256,
    }))
}

/// What a HEAD of an upload's object shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectState {
    /// No object under the key.
    Missing,
    /// The declared size and content type.
    Matches,
    /// Something else: what the object really has.
    Differs { size: Option<i64>, content_type: Option<String> },
}

/// HEADs the upload's object and compares it with the declaration. S3 errors
/// other than a 404 are [`UploadError::Storage`].
pub async fn check_object(s3: &S3Objects, bucket: &str, row: &UploadRow) -> Result<ObjectState, UploadError> {
    let head = match s3.head(bucket, &row.key, false).await {
        Ok(Some(head)) => head,
        Ok(None) => return Ok(ObjectState::Missing),
        Err(e) => return Err(UploadError::Storage(format!("HEAD {}: {e}", row.key))),
    };
    let (size, content_type) = (head.size, head.content_type);
    let size_ok = size.and_then(|s| u64::try_from(s).ok()) == Some(row.size);
    let type_ok = content_type.as_deref().is_some_and(|t| t.trim().eq_ignore_ascii_case(&row.content_type));
    Ok(if size_ok && type_ok { ObjectState::Matches } else { ObjectState::Differs { size, content_type } })
}

/// Task create calls this for every upload id a task's input names: the
/// upload must belong to `space` and be uploaded. A `pending` upload is
/// accepted only after a HEAD of its object shows the declared size and
/// type; it is then marked `uploaded`. An object that differs is deleted and
/// its upload marked `rejected`. A `consumed` upload is [`UploadError::NotUploaded`]:
/// only an `uploaded` one may be used.
pub async fn ensure_uploaded(
    db: &PgPool,
    s3: &S3Objects,
    bucket: &str,
    space: &SpaceIndex,
    id: Id,
) -> Result<(), UploadError> {
    let row = find(db, space, id).await?.ok_or(UploadError::NotFound(id))?;
    if row.status != UploadStatus::Pending {
        return verdict(id, row.status);
    }
    match check_object(s3, bucket, &row).await? {
        ObjectState::Missing => Err(UploadError::NotUploaded(id)),
        ObjectState::Differs { size, content_type } => {
            tracing::warn!(
                upload_id = %id, declared_size = row.size, declared_type = %row.content_type,
                ?size, ?content_type, "upload differs from its declaration; rejecting it"
            );
            reject(db, s3, bucket, &row).await
        }
        ObjectState::Matches => {
            let updated = sqlx::query(
                "UPDATE uploads SET status = 'uploaded', updated_at = now() WHERE id = $1 AND status = 'pending'",
            )
            .bind(id)
            .execute(db)
            .await?;
            if updated.rows_affected() == 1 {
                return Ok(());
            }
            // Someone else moved it on meanwhile (the guard, or a concurrent create).
            let row = find(db, space, id).await?.ok_or(UploadError::NotFound(id))?;
            verdict(id, row.status)
        }
    }
}

/// [`ensure_uploaded`], and for an upload already `uploaded`, a HEAD that its
/// object is still there with its declared size and type (the bucket expires
/// `incoming/` a day after upload). A priced create checks this before any
/// payment, so nothing is charged for input that cannot run; a free one
/// leaves it to the worker's own check.
pub async fn ensure_stored(
    db: &PgPool,
    s3: &S3Objects,
    bucket: &str,
    space: &SpaceIndex,
    id: Id,
) -> Result<(), UploadError> {
    let row = find(db, space, id).await?.ok_or(UploadError::NotFound(id))?;
    if row.status != UploadStatus::Uploaded {
        return ensure_uploaded(db, s3, bucket, space, id).await;
    }
    match check_object(s3, bucket, &row).await? {
        ObjectState::Matches => Ok(()),
        ObjectState::Missing => Err(UploadError::Gone(id)),
        // Accepted once, different now: the worker would refuse it too.
        ObjectState::Differs { .. } => Err(UploadError::Rejected(id)),
    }
}

fn verdict(id: Id, status: UploadStatus) -> Result<(), UploadError> {
    match status {
        UploadStatus::Uploaded => Ok(()),
        UploadStatus::Rejected => Err(UploadError::Rejected(id)),
        UploadStatus::Pending | UploadStatus::Consumed => Err(UploadError::NotUploaded(id)),
    }
}

/// Marks the upload `rejected` first, so it can never be accepted, then
/// deletes its object. A failed delete is logged, not returned: the upload
/// stays rejected, and the lifecycle rule expires `incoming/` anyway.
async fn reject(db: &PgPool, s3: &S3Objects, bucket: &str, row: &UploadRow) -> Result<(), UploadError> {
    let updated =
        sqlx::query("UPDATE uploads SET status = 'rejected', updated_at = now() WHERE id = $1 AND status = 'pending'")
            .bind(row.id)
            .execute(db)
            .await?;
    if updated.rows_affected() == 0 {
        // Someone else decided first; their decision stands.
        let now = find(db, &row.space, row.id).await?.ok_or(UploadError::NotFound(row.id))?;
        return verdict(row.id, now.status);
    }
    if let Err(e) = s3.delete(bucket, &row.key).await {
        tracing::error!(upload_id = %row.id, key = %row.key, error = %e, "could not delete a rejected upload");
    }
    Err(UploadError::Rejected(row.id))
}
