//! `digest`: the SHA-256 and size of an upload, streamed from S3.
//!
//! Input `{"upload_id": "<ulid>"}`. The upload must belong to the task's
//! space and not be rejected; before reading it, a HEAD of its object must
//! show the declared size and type (docs/architecture.md#checks-at-create-and-in-the-worker), so correctness never rests
//! on the upload guard or on task create having looked. The body is then
//! hashed as it streams, never held whole, and counted: an object that turns
//! out longer or shorter than declared (replaced after the HEAD) fails too.
//! Upload statuses are left alone; the create path owns them.

use std::time::Duration;

use serde_json::{Value, json};

use super::{ExecutorKind, Report};
use crate::domain::catalog::meter::Quantity;
use crate::domain::catalog::read::{Fields, Problems};

/// The `digest` executor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest;

impl ExecutorKind for Digest {
    const NAME: &'static str = "digest";

    /// Nothing to configure: the upload comes with each task's input.
    fn configure(_: &Fields<'_>, _: &mut Problems) -> Option<Self> {
        Some(Digest)
    }

    /// The bytes hashed.
    fn measures(&self) -> Quantity {
        Quantity::Bytes
    }

    /// The upload's size, which every byte of was hashed.
    fn used(&self, result: &Value, _took: Duration) -> u64 {
        result["size"].as_u64().unwrap_or(0)
    }

    fn output_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": { "sha256": { "type": "string", "pattern": "^[0-9a-f]{64}$" }, "size": { "type": "integer" } },
            "required": ["sha256", "size"]
        })
    }

    /// Progress counts the bytes hashed of an upload whose size its owner
    /// declared: nothing of the result. The log lines tell the upload's
    /// type and, at the end, its SHA-256, which is the result itself.
    fn discloses(&self, report: &Report) -> bool {
        matches!(report, Report::Progress { .. })
    }
}

/// Running it: the worker's half.
#[cfg(feature = "worker")]
mod work {
    use std::pin::pin;

    use bytes::Bytes;
    use futures_util::{Stream, StreamExt};
    use serde_json::{Value, json};
    use sha2::Digest as _;
    use tokio::sync::mpsc;

    use super::Digest;
    use crate::domain::executors::{ExecDeps, ExecError, Job, Report, TaskExecutor, codes, input_str};
    use crate::domain::ids::Id;
    use crate::domain::uploads::{self, ObjectState, UploadRow, UploadStatus};

    const MIB: u64 = 1024 * 1024;

    impl TaskExecutor for Digest {
        async fn run(&self, deps: &ExecDeps, job: &Job<'_>) -> Result<Value, ExecError> {
            let id: Id = input_str(job.input, "upload_id")?.parse().map_err(|_| {
                ExecError::permanent(codes::INVALID_INPUT, "input.upload_id must be an upload id (a 26-character ULID)")
            })?;
            let row = uploads::find(&deps.db, &job.space, id)
                .await
                .map_err(|e| ExecError::retryable("loading the upload", e))?
                .ok_or_else(|| ExecError::permanent(codes::UNKNOWN_UPLOAD, format!("upload {id} not found")))?;
            if row.status == UploadStatus::Rejected {
                return Err(ExecError::permanent(
                    codes::UPLOAD_REJECTED,
                    format!("upload {id} was rejected: the uploaded file did not match its declaration"),
                ));
            }
            job.progress(0.0, json!({ "bytes": 0, "total": row.size })).await;

            match uploads::check_object(&deps.objects, &deps.bucket, &row)
                .await
                .map_err(|e| ExecError::retryable("checking the upload's object", e))?
            {
                ObjectState::Matches => {}
                ObjectState::Missing => return Err(missing(id)),
                ObjectState::Differs { size, content_type } => {
                    return Err(mismatch(
                        &row,
                        size.map_or("an unknown number of".to_owned(), |s| s.to_string()),
                        content_type,
                    ));
                }
            }
            job.log(format!("upload {id}: {} bytes of {}, checked; hashing", row.size, row.content_type)).await;

            let body = match deps.objects.get(&deps.bucket, &row.key).await {
                Ok(Some(body)) => body.map(|chunk| chunk.map_err(|e| e.to_string())),
                // Deleted between the HEAD and the GET.
                Ok(None) => return Err(missing(id)),
                Err(e) => return Err(ExecError::retryable("reading the upload's object", e)),
            };
            let sha256 = match hash_stream(body, row.size, &job.reports).await {
                Ok(sha256) => sha256,
                Err(HashError::Read(e)) => return Err(ExecError::retryable("streaming the upload's object", e)),
                Err(HashError::Longer) => return Err(mismatch(&row, format!("more than {}", row.size), None)),
                Err(HashError::Shorter(n)) => return Err(mismatch(&row, n.to_string(), None)),
            };
            job.log(format!("upload {id}: sha256 {sha256}")).await;
            Ok(json!({ "sha256": sha256, "size": row.size, "upload_id": id }))
        }
    }

    fn missing(id: Id) -> ExecError {
        ExecError::permanent(
            codes::UPLOAD_MISSING,
            format!("upload {id} has no file: it was never uploaded, or it has expired"),
        )
    }

    /// `found_size` in words ("1234", "more than 1000"); `found_type` when known.
    fn mismatch(row: &UploadRow, found_size: String, found_type: Option<String>) -> ExecError {
        let found_type = match found_type {
            Some(t) if t.trim().eq_ignore_ascii_case(&row.content_type) => String::new(),
            Some(t) => format!(" of type {t:?}"),
            None => String::new(),
        };
        ExecError::permanent(
            codes::UPLOAD_MISMATCH,
            format!(
                "upload {} does not match its declaration: declared {} bytes of type {:?}, found {found_size} bytes{found_type}",
                row.id, row.size, row.content_type
            ),
        )
    }

    #[derive(Debug, PartialEq)]
    enum HashError {
        /// Reading the stream failed (the network, S3): worth retrying.
        Read(String),
        /// More bytes than declared; reading stopped there.
        Longer,
        /// The stream ended cleanly after this many bytes, fewer than declared.
        Shorter(u64),
    }

    /// Hashes `body`, which must be exactly `declared` bytes long, reporting
    /// progress each time another MiB has gone through (fractions strictly
    /// increasing, below 1.0) and 1.0 at the end.
    async fn hash_stream(
        body: impl Stream<Item = Result<Bytes, String>>,
        declared: u64,
        reports: &mpsc::Sender<Report>,
    ) -> Result<String, HashError> {
        let mut body = pin!(body);
        let mut hasher = sha2::Sha256::new();
        let mut bytes = 0u64;
        let mut next_mark = MIB;
        let fraction = |n: u64| if declared == 0 { 1.0 } else { (n as f64 / declared as f64) as f32 };
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(HashError::Read)?;
            bytes += chunk.len() as u64;
            if bytes > declared {
                return Err(HashError::Longer);
            }
            hasher.update(&chunk);
            if bytes >= next_mark && bytes < declared {
                let report = Report::Progress {
                    fraction: fraction(bytes),
                    detail: json!({ "bytes": bytes, "total": declared }),
                };
                let _ = reports.send(report).await;
                next_mark = (bytes / MIB + 1) * MIB;
            }
        }
        if bytes < declared {
            return Err(HashError::Shorter(bytes));
        }
        let _ = reports
            .send(Report::Progress { fraction: 1.0, detail: json!({ "bytes": bytes, "total": declared }) })
            .await;
        let digest: [u8; 32] = hasher.finalize().into();
        Ok(hex::encode(digest))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn chunks(sizes: &[usize]) -> (Vec<u8>, Vec<Result<Bytes, String>>) {
            let mut all = Vec::new();
            let mut out = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let chunk: Vec<u8> = (0..n).map(|j| ((i * 31 + j) % 251) as u8).collect();
                all.extend_from_slice(&chunk);
                out.push(Ok(Bytes::from(chunk)));
            }
            (all, out)
        }

        async fn hash(items: Vec<Result<Bytes, String>>, declared: u64) -> (Result<String, HashError>, Vec<Report>) {
            let (tx, mut rx) = mpsc::channel(1024);
            let result = hash_stream(futures_util::stream::iter(items), declared, &tx).await;
            drop(tx);
            let mut reports = Vec::new();
            while let Some(r) = rx.recv().await {
                reports.push(r);
            }
            (result, reports)
        }

        fn fractions(reports: &[Report]) -> Vec<f32> {
            reports
                .iter()
                .map(|r| match r {
                    Report::Progress { fraction, .. } => *fraction,
                    other => panic!("unexpected {other:?}"),
                })
                .collect()
        }

        #[tokio::test]
        async fn hashes_and_reports_each_mib_once() {
            // Chunks that straddle MiB marks, and one that crosses two at once.
            let mib = MIB as usize;
            let (all, items) = chunks(&[1000, mib, 2 * mib + 5, 300_000]);
            let (result, reports) = hash(items, all.len() as u64).await;
            assert_eq!(result.unwrap(), crate::domain::executors::sha256_hex(&all));
            let f = fractions(&reports);
            // after 1 MiB + 1000, after 3 MiB + 1005, then the end.
            assert_eq!(f.len(), 3, "{f:?}");
            assert!(f.windows(2).all(|w| w[0] < w[1]), "{f:?}");
            assert_eq!(*f.last().unwrap(), 1.0);
        }

        #[tokio::test]
        async fn an_exact_multiple_of_a_mib_ends_once_at_one() {
            let (all, items) = chunks(&[MIB as usize, MIB as usize]);
            let (result, reports) = hash(items, all.len() as u64).await;
            assert!(result.is_ok());
            assert_eq!(fractions(&reports), vec![0.5, 1.0]);
        }

        #[tokio::test]
        async fn longer_or_shorter_than_declared_fails() {
            let (_, items) = chunks(&[600, 600]);
            assert_eq!(hash(items, 1000).await.0, Err(HashError::Longer));
            let (_, items) = chunks(&[600, 300]);
            assert_eq!(hash(items, 1000).await.0, Err(HashError::Shorter(900)));
            let items = vec![Ok(Bytes::from_static(b"abc")), Err("reset".to_owned())];
            assert_eq!(hash(items, 1000).await.0, Err(HashError::Read("reset".to_owned())));
        }
    }
}
