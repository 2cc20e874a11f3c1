//! `fetch`: downloads a URL through the SSRF-guarded client (docs/architecture.md#outbound-http-ssrf) and
//! stores it under `outputs/`.
//!
//! Input `{"url": "https://…"}`. The client enforces the address policy and
//! the size cap ([`ExecDeps::fetch_max_bytes`]) before and while reading;
//! this executor streams what comes back to [`output_key`] with the remote's
//! content type (a multipart upload of [`PART_SIZE`] parts, so memory stays
//! at about one part per fetch), and answers with its key, size, SHA-256
//! and when the bucket deletes the object, `object_expires_at` (the
//! lifecycle rule for `outputs/`; null when the deployment does not say it
//! has one). No link: the bucket refuses a signature older than 15 minutes
//! and keeps the object for days, so one is signed each time the result is
//! read ([`crate::domain::tasks::output`]).
//! A rerun (a redelivered message) overwrites the same key.
//!
//! The URL is the task owner's choice, so what it answers is the task's
//! result, whatever the status: a 404 or a 503 is a completed fetch with
//! `status` in its result (and the body stored). A target that does not
//! resolve, refuses the connection, breaks it or does not answer in time is
//! `fetch_unreachable`: the owner's input, failed at once, never retried and
//! never credited. Only Reeve's own trouble (storing the body) is
//! retryable, and so credited if it never goes away.

use std::time::Duration;

use serde_json::{Value, json};

use super::{ExecutorKind, Report};
use crate::domain::catalog::meter::Quantity;
use crate::domain::catalog::read::{Fields, Problems};

#[cfg(feature = "worker")]
pub use work::output_key;

/// The `fetch` executor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fetch;

impl ExecutorKind for Fetch {
    const NAME: &'static str = "fetch";

    /// Nothing to configure: the URL comes with each task's input.
    fn configure(_: &Fields<'_>, _: &mut Problems) -> Option<Self> {
        Some(Fetch)
    }

    /// The bytes downloaded.
    fn measures(&self) -> Quantity {
        Quantity::Bytes
    }

    /// The size of what was downloaded and stored.
    fn used(&self, result: &Value, _took: Duration) -> u64 {
        result["size"].as_u64().unwrap_or(0)
    }

    /// As a task is read: `url` is signed then, null once the output has
    /// expired (`expired` then says when).
    fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "key": { "type": "string" }, "size": { "type": "integer" },
                "sha256": { "type": "string" }, "url": { "type": ["string", "null"] },
                "expired": {
                    "type": "object",
                    "properties": { "at": { "type": "string" }, "message": { "type": "string" } },
                    "required": ["at", "message"]
                }
            },
            "required": ["key", "size", "sha256", "url"]
        })
    }

    /// Progress is a stage word and the bytes downloaded so far: the units
    /// counted. The log lines tell the download's type, the URL's status
    /// and where it is stored.
    fn discloses(&self, report: &Report) -> bool {
        matches!(report, Report::Progress { .. })
    }
}

/// Running it: the worker's half.
#[cfg(feature = "worker")]
mod work {
    use aws_sdk_s3::error::DisplayErrorContext;
    use aws_sdk_s3::primitives::ByteStream;
    use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
    use bytes::BytesMut;
    use serde_json::{Value, json};
    use sha2::Digest as _;
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;

    use super::Fetch;
    use crate::domain::executors::{ExecDeps, ExecError, Job, TaskExecutor, codes, input_str, outbound_error};
    use crate::domain::tasks::output::object_expiry;
    use crate::infra::outbound::OutboundStream;

    const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";
    /// The download is stored in parts of this size (S3's smallest but the
    /// last), so a fetch holds about one part in memory, whatever the body's size.
    pub const PART_SIZE: usize = 5 * 1024 * 1024;

    pub use crate::domain::tasks::output::output_key;

    impl TaskExecutor for Fetch {
        async fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
            let url = input_str(job.input, "url")?;
            job.progress(0.0, json!({ "stage": "downloading" })).await;

            let mut response = deps.outbound.get_stream(url, deps.fetch_max_bytes).await.map_err(target_error)?;
            let content_type = response
                .content_type
                .as_deref()
                .and_then(usable_content_type)
                .unwrap_or(DEFAULT_CONTENT_TYPE)
                .to_owned();
            let key = output_key(&job.space, job.task_id);
            let stored = store_streaming(deps, job, &key, &content_type, &mut response).await?;
            let (size, sha256) = (stored.size, stored.sha256);
            job.log(format!("downloaded {size} bytes of {content_type} (HTTP {})", response.status)).await;

            let object_expires_at = deps
                .output_retention_days
                .map(|days| object_expiry(OffsetDateTime::now_utc(), days).format(&Rfc3339))
                .transpose()
                .map_err(|e| ExecError::retryable("formatting the expiry", e))?;

            job.progress(1.0, json!({ "stage": "stored", "bytes": size })).await;
            job.log(format!("stored as {key}")).await;
            Ok(json!({
                "status": response.status,
                "key": key,
                "size": size,
                "sha256": sha256,
                "content_type": content_type,
                "object_expires_at": object_expires_at,
            }))
        }
    }

    /// The target's failures are the owner's: the network ones too, which
    /// would be retryable for a host Reeve runs.
    fn target_error(e: crate::infra::outbound::OutboundError) -> ExecError {
        if e.is_retryable() {
            tracing::info!(error = %e, "fetch: the URL could not be reached");
            return ExecError::permanent(
                codes::FETCH_UNREACHABLE,
                "the URL could not be reached: its name did not resolve, or it refused, broke or did not answer the \
                 connection in time",
            );
        }
        outbound_error("the URL", e)
    }

    /// What was stored.
    struct Stored {
        size: u64,
        sha256: String,
    }

    /// Streams the body to `key`: one PUT when it fits in a part, else a
    /// multipart upload, part by part as the body arrives. A failure part-way
    /// aborts the upload, so no partial object or stray parts are left.
    async fn store_streaming(
        deps: &ExecDeps,
        job: &Job<'_>,
        key: &str,
        content_type: &str,
        body: &mut OutboundStream,
    ) -> Result<Stored, ExecError> {
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        let mut part = BytesMut::with_capacity(PART_SIZE);
        let mut upload: Option<Multipart> = None;
        loop {
            let chunk = match body.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(e) => {
                    if let Some(upload) = upload {
                        upload.abort(deps).await;
                    }
                    return Err(target_error(e));
                }
            };
            hasher.update(&chunk);
            size += chunk.len() as u64;
            part.extend_from_slice(&chunk);
            if part.len() >= PART_SIZE {
                let multipart = match upload.as_mut() {
                    Some(m) => m,
                    None => upload.insert(Multipart::start(deps, key, content_type).await?),
                };
                // The full part is handed over and dropped once sent; the next
                // buffer is only allocated after that.
                let full = std::mem::take(&mut part).freeze();
                if let Err(e) = multipart.send_part(deps, full).await {
                    upload.expect("started above").abort(deps).await;
                    return Err(e);
                }
                part.reserve(PART_SIZE);
                let fraction = body.content_length.map_or(0.5, |total| 0.9 * size as f32 / total.max(1) as f32);
                job.progress(fraction, json!({ "stage": "downloading", "bytes": size })).await;
            }
        }
        let stored = Stored { size, sha256: hex::encode(hasher.finalize()) };
        job.progress(0.9, json!({ "stage": "storing", "bytes": size })).await;
        match upload {
            None => {
                deps.s3
                    .put_object()
                    .bucket(&deps.bucket)
                    .key(key)
                    .content_type(content_type)
                    .content_length(part.len() as i64)
                    .body(ByteStream::from(part.freeze()))
                    .send()
                    .await
                    .map_err(|e| ExecError::retryable("storing the download", DisplayErrorContext(&e)))?;
            }
            Some(mut multipart) => {
                let last = part.freeze();
                let sent = if last.is_empty() { Ok(()) } else { multipart.send_part(deps, last).await };
                if let Err(e) = sent {
                    multipart.abort(deps).await;
                    return Err(e);
                }
                multipart.complete(deps).await?;
            }
        }
        Ok(stored)
    }

    /// A multipart upload in progress.
    struct Multipart {
        key: String,
        upload_id: String,
        parts: Vec<CompletedPart>,
    }

    impl Multipart {
        async fn start(deps: &ExecDeps, key: &str, content_type: &str) -> Result<Multipart, ExecError> {
            let created = deps
                .s3
                .create_multipart_upload()
                .bucket(&deps.bucket)
                .key(key)
                .content_type(content_type)
                .send()
                .await
                .map_err(|e| ExecError::retryable("starting the upload", DisplayErrorContext(&e)))?;
            let upload_id =
                created.upload_id().ok_or_else(|| ExecError::Retryable("storage gave no upload id".into()))?.to_owned();
            Ok(Multipart { key: key.to_owned(), upload_id, parts: Vec::new() })
        }

        async fn send_part(&mut self, deps: &ExecDeps, bytes: bytes::Bytes) -> Result<(), ExecError> {
            let number = self.parts.len() as i32 + 1;
            let sent = deps
                .s3
                .upload_part()
                .bucket(&deps.bucket)
                .key(&self.key)
                .upload_id(&self.upload_id)
                .part_number(number)
                .content_length(bytes.len() as i64)
                .body(ByteStream::from(bytes))
                .send()
                .await
                .map_err(|e| ExecError::retryable("storing a part of the download", DisplayErrorContext(&e)))?;
            self.parts
                .push(CompletedPart::builder().part_number(number).set_e_tag(sent.e_tag().map(str::to_owned)).build());
            Ok(())
        }

        async fn complete(self, deps: &ExecDeps) -> Result<(), ExecError> {
            let parts = CompletedMultipartUpload::builder().set_parts(Some(self.parts.clone())).build();
            let done = deps
                .s3
                .complete_multipart_upload()
                .bucket(&deps.bucket)
                .key(&self.key)
                .upload_id(&self.upload_id)
                .multipart_upload(parts)
                .send()
                .await;
            if let Err(e) = done {
                let e = ExecError::retryable("completing the upload", DisplayErrorContext(&e));
                self.abort(deps).await;
                return Err(e);
            }
            Ok(())
        }

        /// Best effort: an upload left behind costs storage, not correctness.
        async fn abort(self, deps: &ExecDeps) {
            let aborted = deps
                .s3
                .abort_multipart_upload()
                .bucket(&deps.bucket)
                .key(&self.key)
                .upload_id(&self.upload_id)
                .send()
                .await;
            if let Err(e) = aborted {
                tracing::warn!(key = %self.key, error = %DisplayErrorContext(&e), "could not abort a multipart upload");
            }
        }
    }

    /// The remote's content type when it is a sane header value (printable
    /// ASCII, not absurdly long); `None` sends the default.
    fn usable_content_type(raw: &str) -> Option<&str> {
        let t = raw.trim();
        (!t.is_empty() && t.len() <= 255 && t.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))).then_some(t)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn content_types_are_kept_only_when_sane() {
            assert_eq!(usable_content_type(" image/png "), Some("image/png"));
            assert_eq!(usable_content_type("text/plain; charset=utf-8"), Some("text/plain; charset=utf-8"));
            assert_eq!(usable_content_type(""), None);
            assert_eq!(usable_content_type("text/plain\r\nx-evil: 1"), None);
            assert_eq!(usable_content_type("tëxt/plain"), None);
            assert_eq!(usable_content_type(&"a".repeat(300)), None);
        }
    }
}
