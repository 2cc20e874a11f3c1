//! A task's stored output (`fetch`'s download under `outputs/`) and its
//! download link.
//!
//! The task row keeps the object's key and when the bucket's lifecycle rule
//! deletes it (`object_expires_at`, from `OutputRetentionDays`), never a
//! URL: the bucket refuses a signature older than 15 minutes
//! (`storage_policy`), so a link signed once at completion died long before
//! the object it named, which the owner paid for. [`OutputLinks::present`]
//! signs a fresh link each time a result is read (REST, MCP, the CLI through
//! REST), valid for [`LINK_LIFETIME`] or until the object expires if that is
//! sooner. After `object_expires_at` the result says so, with the date,
//! instead of a link that can only fail.
//!
//! Rows written before this held a `url` of their own: they are signed again
//! the same way, so their dead link is replaced too.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::Task;
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;
use crate::infra::s3_objects::S3Objects;

/// A download link's lifetime: the bucket's maximum signature age
/// (`storage_policy::DEFAULT_MAX_SIGNATURE_AGE_MS`).
pub const LINK_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// `outputs/<space-hex>/<task-ulid>/body`: the only key a task's result may
/// be given a link to.
pub fn output_key(space: &SpaceIndex, task_id: Id) -> String {
    format!("outputs/{}/{task_id}/body", space.to_hex())
}

/// `outputs/<space-hex>/<task-ulid>/files/`: where a protocol kind's
/// service writes its output files (docs/executors.md, `output` reports).
pub fn files_prefix(space: &SpaceIndex, task_id: Id) -> String {
    format!("outputs/{}/{task_id}/files/", space.to_hex())
}

/// When a lifecycle rule keeping objects `days` days expires one stored at
/// `stored`: S3 adds the days to the object's creation time and rounds up to
/// the next midnight UTC. (It deletes the object some time after; it stops
/// billing for it then, and the object may be gone from then on.)
pub fn object_expiry(stored: OffsetDateTime, days: u32) -> OffsetDateTime {
    let due = stored.to_offset(time::UtcOffset::UTC) + time::Duration::days(days.into());
    let midnight = due.replace_time(time::Time::MIDNIGHT);
    if midnight == due { due } else { midnight + time::Duration::DAY }
}

/// The longest name of an output file.
pub const MAX_FILE_NAME_CHARS: usize = 100;

/// Whether `name` may name an output file: `[A-Za-z0-9._-]{1,100}`, and
/// neither `.` nor `..`, so that it is one key component under
/// [`files_prefix`] and nothing else.
pub fn valid_file_name(name: &str) -> bool {
    (1..=MAX_FILE_NAME_CHARS).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && name != "."
        && name != ".."
}

/// Signs download links to the bucket's outputs. It holds a signer, not
/// the S3 client: a function that reads results (task-status) links no S3
/// client for them.
#[derive(Debug, Clone)]
pub struct OutputLinks {
    signer: S3Objects,
    bucket: String,
    lifetime: Duration,
}

impl OutputLinks {
    pub fn new(signer: S3Objects, bucket: String) -> Self {
        Self { signer, bucket, lifetime: LINK_LIFETIME }
    }

    /// Links that live `lifetime` (tests: shorter than a test runs).
    pub fn with_lifetime(self, lifetime: Duration) -> Self {
        Self { lifetime, ..self }
    }

    /// `task` with a link signed now to its stored output, or the output's
    /// expiry in its place. Only the key this task's own output is stored
    /// under gets a link: an `http` endpoint's answer may carry any `key`,
    /// and must never become a link to another Space's object.
    pub async fn present(&self, space: &SpaceIndex, mut task: Task) -> Task {
        if let Some(result) = task.result.as_mut() {
            self.present_result(space, task.id, result, SystemTime::now()).await;
        }
        task
    }

    /// [`Self::present`] for each task.
    pub async fn present_all(&self, space: &SpaceIndex, tasks: Vec<Task>) -> Vec<Task> {
        let mut out = Vec::with_capacity(tasks.len());
        for task in tasks {
            out.push(self.present(space, task).await);
        }
        out
    }

    async fn present_result(&self, space: &SpaceIndex, task_id: Id, result: &mut Value, now: SystemTime) {
        self.present_files(space, task_id, result, now).await;
        let key = output_key(space, task_id);
        if result.get("key").and_then(Value::as_str) != Some(key.as_str()) {
            return;
        }
        let start = whole_second(now);
        let lifetime = match self.lifetime_until(result.get("object_expires_at"), start) {
            Ok(lifetime) => lifetime,
            Err(expired) => {
                result["url"] = Value::Null;
                result["url_expires_at"] = Value::Null;
                result["expired"] = expired;
                return;
            }
        };
        match self.sign(&key, start, lifetime).await {
            Ok(url) => {
                let expires = OffsetDateTime::from(start + lifetime).format(&Rfc3339).ok();
                result["url"] = json!(url);
                result["url_expires_at"] = json!(expires);
            }
            Err(e) => {
                // The result is still worth answering; the next read signs again.
                tracing::warn!(error = %e, task_id = %task_id, "signing an output's download link failed");
                result["url"] = Value::Null;
                result["url_expires_at"] = Value::Null;
            }
        }
    }

    /// A protocol kind's output files (`result.outputs`, recorded from the
    /// service's `output` reports): each gets `url` and `url_expires_at`,
    /// signed now, if its `key` is its name under this task's own
    /// [`files_prefix`]; any other entry gets no link.
    async fn present_files(&self, space: &SpaceIndex, task_id: Id, result: &mut Value, now: SystemTime) {
        let Some(outputs) = result.get_mut("outputs").and_then(Value::as_array_mut) else { return };
        let prefix = files_prefix(space, task_id);
        let start = whole_second(now);
        for output in outputs.iter_mut().filter(|o| o.is_object()) {
            let name = output.get("name").and_then(Value::as_str).filter(|n| valid_file_name(n));
            let key = name.map(|n| format!("{prefix}{n}"));
            let owned = key.as_deref().is_some_and(|k| output.get("key").and_then(Value::as_str) == Some(k));
            let lifetime = match self.lifetime_until(output.get("object_expires_at"), start) {
                Ok(lifetime) => lifetime,
                Err(expired) => {
                    output["url"] = Value::Null;
                    output["url_expires_at"] = Value::Null;
                    output["expired"] = expired;
                    continue;
                }
            };
            let signed = match key.filter(|_| owned) {
                Some(key) => match self.sign(&key, start, lifetime).await {
                    Ok(url) => Some(url),
                    Err(e) => {
                        tracing::warn!(error = %e, task_id = %task_id, "signing an output file's link failed");
                        None
                    }
                },
                None => None,
            };
            let expires = signed.as_ref().and_then(|_| OffsetDateTime::from(start + lifetime).format(&Rfc3339).ok());
            output["url"] = json!(signed);
            output["url_expires_at"] = json!(expires);
        }
    }

    /// How long a link signed at `start` may live for an object the bucket
    /// keeps until `object_expires_at` (RFC 3339), if that is known: at most
    /// this signer's lifetime. `Err`: the object's time has passed, and
    /// what the result says instead of a link (`{"at", "message"}`).
    fn lifetime_until(&self, object_expires_at: Option<&Value>, start: SystemTime) -> Result<Duration, Value> {
        let Some(at) = object_expires_at.and_then(Value::as_str) else { return Ok(self.lifetime) };
        let Ok(until) = OffsetDateTime::parse(at, &Rfc3339) else { return Ok(self.lifetime) };
        match SystemTime::from(until).duration_since(start) {
            Ok(left) if left >= Duration::from_secs(1) => Ok(self.lifetime.min(left)),
            _ => {
                let message = format!(
                    "the output was kept until {at} and the bucket has deleted it; run the task again for a new one"
                );
                Err(json!({ "at": at, "message": message }))
            }
        }
    }

    async fn sign(&self, key: &str, start: SystemTime, lifetime: Duration) -> Result<String, String> {
        // Whatever type the remote claimed, a browser saves it rather than
        // rendering it.
        let query = [("response-content-disposition", "attachment")];
        self.signer.presigned_get(&self.bucket, key, &query, start, lifetime).await.map_err(|e| e.to_string())
    }
}

/// `now` to the whole second: SigV4 dates are whole seconds, so a link
/// signed from it says exactly when it expires (`url_expires_at`).
fn whole_second(now: SystemTime) -> SystemTime {
    let since_epoch = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    SystemTime::UNIX_EPOCH + Duration::from_secs(since_epoch.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_expires_at_the_midnight_after_its_days() {
        use time::macros::datetime;
        // S3's own example: created 2024-01-01 10:00 UTC, kept 30 days.
        assert_eq!(object_expiry(datetime!(2024-01-01 10:00 UTC), 30), datetime!(2024-02-01 00:00 UTC));
        assert_eq!(object_expiry(datetime!(2024-01-01 00:00 UTC), 1), datetime!(2024-01-02 00:00 UTC));
        assert_eq!(object_expiry(datetime!(2024-01-01 23:59:59 +02:00), 1), datetime!(2024-01-03 00:00 UTC));
    }
}
