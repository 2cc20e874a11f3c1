//! `fetch`: downloads a URL through the SSRF-guarded client (DESIGN §9) and
//! stores it under `outputs/`.
//!
//! Input `{"url": "https://…"}`. The client enforces the address policy and
//! the size cap ([`ExecDeps::fetch_max_bytes`]) before and while reading;
//! this executor stores what came back at [`output_key`] with the remote's
//! content type, and answers with its size, SHA-256 and a presigned GET.
//! A rerun (a redelivered message) overwrites the same key.

use std::time::{Duration, SystemTime};

use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{ExecDeps, ExecError, Job, TaskExecutor, codes, input_str, outbound_error, sha256_hex};
use crate::auth::SpaceIndex;
use crate::ids::Id;

/// Lifetime of the presigned GET in the result.
pub const URL_EXPIRY: Duration = Duration::from_secs(15 * 60);
const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// `outputs/<space-hex>/<task-ulid>/body`.
pub fn output_key(space: &SpaceIndex, task_id: Id) -> String {
    format!("outputs/{}/{task_id}/body", space.to_hex())
}

/// The `fetch` executor.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fetch;

impl TaskExecutor for Fetch {
    async fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
        let url = input_str(job.input, "url")?;
        job.progress(0.0, json!({ "stage": "downloading" })).await;

        let response = deps.outbound.get(url, deps.fetch_max_bytes).await.map_err(|e| outbound_error("the URL", e))?;
        match response.status {
            200..=299 => {}
            429 | 500..=599 => {
                return Err(ExecError::Retryable(format!("fetch: the remote answered HTTP {}", response.status)));
            }
            status => {
                return Err(ExecError::permanent(codes::FETCH_FAILED, format!("the URL answered HTTP {status}")));
            }
        }
        let size = response.body.len() as u64;
        let content_type =
            response.content_type.as_deref().and_then(usable_content_type).unwrap_or(DEFAULT_CONTENT_TYPE);
        let sha256 = sha256_hex(&response.body);
        job.progress(0.5, json!({ "stage": "storing", "bytes": size })).await;
        job.log(format!("downloaded {size} bytes of {content_type} (HTTP {})", response.status)).await;

        let key = output_key(&job.space, job.task_id);
        deps.s3
            .put_object()
            .bucket(&deps.bucket)
            .key(&key)
            .content_type(content_type)
            .content_length(size as i64)
            .body(ByteStream::from(response.body))
            .send()
            .await
            .map_err(|e| ExecError::retryable("storing the download", DisplayErrorContext(&e)))?;

        // SigV4 dates are whole seconds: start on one, so `url_expires_at` is exact.
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(now.as_secs());
        let config = PresigningConfig::builder()
            .start_time(start)
            .expires_in(URL_EXPIRY)
            .build()
            .map_err(|e| ExecError::retryable("presigning config", e))?;
        let presigned = deps
            .s3
            .get_object()
            .bucket(&deps.bucket)
            .key(&key)
            // Whatever type the remote claimed, a browser saves it rather than
            // rendering it.
            .response_content_disposition("attachment")
            .presigned(config)
            .await
            .map_err(|e| ExecError::retryable("presigning the download", DisplayErrorContext(&e)))?;
        let expires_at = OffsetDateTime::from(start + URL_EXPIRY)
            .format(&Rfc3339)
            .map_err(|e| ExecError::retryable("formatting the expiry", e))?;

        job.progress(1.0, json!({ "stage": "stored", "bytes": size })).await;
        job.log(format!("stored as {key}")).await;
        Ok(json!({
            "key": key,
            "size": size,
            "sha256": sha256,
            "content_type": content_type,
            "url": presigned.uri(),
            "url_expires_at": expires_at,
        }))
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
