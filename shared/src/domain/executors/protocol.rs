//! The executor protocol, version 1 (docs/executors.md), Reeve's side of
//! the job: its envelope, signed as Standard Webhooks specifies, and what
//! the service's answer means.
//!
//! The signing key is the endpoint's `whsec_…` secret, read once when the
//! worker starts (from the variable or Secrets Manager ARN the kind's
//! `secret` names): `webhook-signature: v1,<base64 HMAC-SHA256(key,
//! "<webhook-id>.<webhook-timestamp>.<body>")>`, the key being the base64
//! after `whsec_`.

use std::fmt;

/// How a kind that speaks the executor protocol signs its jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    /// The protocol version: 1.
    pub version: u8,
    /// Where the endpoint's signing secret is: an environment variable's
    /// name or a Secrets Manager ARN. Read once when the worker starts.
    pub secret: SecretRef,
}

/// Where a secret is kept: never in `reeve.toml` itself.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecretRef {
    /// An environment variable's name.
    Env(String),
    /// A Secrets Manager secret's ARN, holding the value as its string.
    Arn(String),
}

impl SecretRef {
    /// `arn:aws:secretsmanager:…` is an ARN; anything else must be an
    /// environment variable's name (`[A-Za-z_][A-Za-z0-9_]*`).
    pub fn parse(text: &str) -> Result<SecretRef, String> {
        if text.starts_with("arn:") {
            let parts: Vec<&str> = text.splitn(7, ':').collect();
            return match parts.as_slice() {
                ["arn", _, "secretsmanager", region, account, "secret", name]
                    if !region.is_empty() && !account.is_empty() && !name.is_empty() =>
                {
                    Ok(SecretRef::Arn(text.to_owned()))
                }
                _ => Err(format!("{text:?} is not a Secrets Manager secret's ARN (arn:aws:secretsmanager:…:secret:…)")),
            };
        }
        let mut chars = text.chars();
        let starts = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if starts && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') && text.len() <= 128 {
            Ok(SecretRef::Env(text.to_owned()))
        } else {
            Err(format!(
                "{text:?} is neither an environment variable's name nor a Secrets Manager ARN; the secret itself \
                 never goes in reeve.toml"
            ))
        }
    }

    /// What it names, for messages: the variable's name or the ARN.
    pub fn name(&self) -> &str {
        match self {
            SecretRef::Env(name) | SecretRef::Arn(name) => name,
        }
    }
}

/// The only protocol version there is.
pub const PROTOCOL_VERSION: u8 = 1;

/// An endpoint's signing key (its `whsec_…` secret): one Standard Webhooks
/// signer for jobs, cancels and completion webhooks alike.
pub use crate::infra::standard_webhooks::SigningKey as JobKey;

/// The `webhook-id` of an attempt's job: the same for every delivery of it.
pub fn job_id(task: impl fmt::Display, attempt: i32) -> String {
    format!("job_{task}_{attempt}")
}

/// The `webhook-id` of an attempt's cancel: the same for every delivery of it.
pub fn cancel_id(task: impl fmt::Display, attempt: i32) -> String {
    format!("cancel_{task}_{attempt}")
}

/// Sending the job: the worker's half.
#[cfg(feature = "worker")]
pub(super) mod send {
    use std::time::Duration;

    use serde_json::{Value, json};
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;

    use super::{Protocol, cancel_id, job_id};
    use crate::domain::auth::issue_report_token;
    use crate::domain::executors::{DelegatedAttempt, ExecDeps, ExecError, Job, codes, outbound_error};
    use crate::domain::ids::Id;
    use crate::domain::uploads::{self, UploadStatus};
    use crate::infra::outbound::OutboundError;

    /// The largest answer accepted from an endpoint.
    const MAX_RESPONSE_BYTES: u64 = 1024 * 1024;
    /// The longest a presigned S3 link may live: the bucket refuses a
    /// signature older than 15 minutes (`storage_policy`), whatever its
    /// expiry says, so no link is given a longer one.
    const MAX_LINK: Duration = crate::domain::tasks::output::LINK_LIFETIME;

    fn rfc3339(at: OffsetDateTime) -> String {
        at.format(&Rfc3339).unwrap_or_default()
    }

    /// Sends the job of `job`'s attempt to `endpoint`, signed with the key
    /// `protocol` names. `Ok`: the service answered `200` with the result.
    /// [`ExecError::Delegated`]: it answered `202`, and reports on its own.
    pub async fn send_job(
        deps: &ExecDeps,
        job: &Job<'_>,
        endpoint: &str,
        protocol: &Protocol,
    ) -> Result<Value, ExecError> {
        let setup = &deps.protocol;
        // Start-up refuses a worker without these for a kind that needs
        // them: missing here is the operator's trouble, never the task's.
        let key = setup.keys.get(&protocol.secret).ok_or_else(|| {
            ExecError::Retryable(format!("no signing secret was read for {}", protocol.secret.name()))
        })?;
        let (body, deadline) = build_job(deps, job, protocol.version).await?;
        let body = serde_json::to_vec(&body).map_err(|e| ExecError::retryable("encoding the job", e))?;
        let headers = signed(key, job_id(job.task_id, job.attempt), &body);
        let timeout = Duration::from_secs(job.spec.waited_seconds().into());
        let response = deps
            .operators
            .post_signed(endpoint, body, &headers, timeout, MAX_RESPONSE_BYTES)
            .await
            .map_err(|e| outbound_error("the executor endpoint", e))?;
        match response.status {
            202 => Err(ExecError::Delegated { deadline }),
            200..=299 => serde_json::from_slice(&response.body).map_err(|e| {
                tracing::warn!(status = response.status, error = %e, "http executor: the answer is not JSON");
                ExecError::permanent(codes::BAD_EXECUTOR_RESPONSE, "the executor's answer is not JSON")
            }),
            408 | 429 | 500..=599 => {
                let reason = format!("http executor: the endpoint answered HTTP {}", response.status);
                Err(match response.retry_after {
                    Some(after) => ExecError::RetryAfter { reason, after },
                    None => ExecError::Retryable(reason),
                })
            }
            status @ 400..=499 => Err(ExecError::permanent(
                codes::EXECUTOR_REJECTED,
                format!("the executor rejected the input (HTTP {status})"),
            )),
            status => Err(ExecError::permanent(
                codes::BAD_EXECUTOR_RESPONSE,
                format!("the executor answered an unexpected HTTP {status}"),
            )),
        }
    }

    /// The Standard Webhooks headers of `body`, delivered as `id`, signed
    /// now with `key`.
    fn signed(key: &super::JobKey, id: String, body: &[u8]) -> [(&'static str, String); 3] {
        let timestamp = OffsetDateTime::now_utc().unix_timestamp();
        let signature = key.sign(&id, timestamp, body);
        [("webhook-id", id), ("webhook-timestamp", timestamp.to_string()), ("webhook-signature", signature)]
    }

    /// The longest a cancel's delivery is waited for: the worker that sends
    /// it has other records to run, and a service that does not answer is
    /// told again at the next sweep.
    pub const CANCEL_WAIT: Duration = Duration::from_secs(10);

    /// The cancel of `attempt` (docs/executors.md, "Cancel"): what an
    /// `http` kind POSTs, signed, and a `lambda` kind's function receives.
    pub fn cancel_message(attempt: &DelegatedAttempt<'_>, version: u8) -> Value {
        json!({
            "type": "cancel",
            "protocol": version,
            "task": {
                "id": attempt.task_id,
                "kind": attempt.kind,
                "attempt": attempt.attempt,
                "deadline": rfc3339(attempt.deadline),
            },
        })
    }

    /// Tells `endpoint` that the buyer canceled `attempt`, signed as its job
    /// was. `Ok`: the service answered (whatever it said, but `408`, `429`
    /// or `5xx`): it was told. `Err`: it was not, and is told again later.
    pub async fn send_cancel(
        deps: &ExecDeps,
        attempt: &DelegatedAttempt<'_>,
        endpoint: &str,
        protocol: &Protocol,
    ) -> Result<(), ExecError> {
        let key = deps.protocol.keys.get(&protocol.secret).ok_or_else(|| {
            ExecError::Retryable(format!("no signing secret was read for {}", protocol.secret.name()))
        })?;
        let body = serde_json::to_vec(&cancel_message(attempt, protocol.version))
            .map_err(|e| ExecError::retryable("encoding the cancel", e))?;
        let headers = signed(key, cancel_id(attempt.task_id, attempt.attempt), &body);
        // The answer is not used: only its status says whether it arrived.
        let response = match deps.operators.post_signed(endpoint, body, &headers, CANCEL_WAIT, 64 * 1024).await {
            Ok(response) => response,
            Err(OutboundError::TooLarge { .. }) => return Ok(()),
            Err(e) => return Err(ExecError::retryable("sending the cancel", e)),
        };
        match response.status {
            408 | 429 | 500..=599 => {
                Err(ExecError::Retryable(format!("the endpoint answered the cancel HTTP {}", response.status)))
            }
            _ => Ok(()),
        }
    }

    /// The job of `job`'s attempt (docs/executors.md, "The job"), and its
    /// deadline: what an `http` kind POSTs, signed, and a `lambda` kind's
    /// function receives as its event.
    pub async fn build_job(deps: &ExecDeps, job: &Job<'_>, version: u8) -> Result<(Value, OffsetDateTime), ExecError> {
        let setup = &deps.protocol;
        let (Some(report_url), Some(token_key)) = (&setup.report_url, &setup.token_key) else {
            return Err(ExecError::Retryable("the worker has no report URL or token key".to_owned()));
        };
        let now = OffsetDateTime::now_utc().replace_nanosecond(0).expect("0 is a valid nanosecond");
        let deadline = now + Duration::from_secs(job.spec.timeout_seconds.into());
        let files = files(deps, job, deadline).await?;
        let token = issue_report_token(token_key, &job.space, job.task_id.to_bytes(), job.attempt, deadline);
        let mut body = json!({
            "type": "job",
            "protocol": version,
            "task": {
                "id": job.task_id,
                "kind": job.kind,
                "attempt": job.attempt,
                "deadline": rfc3339(deadline),
            },
            "input": job.input,
            "files": files,
            "report": { "url": report_url, "token": token, "expires_at": rfc3339(deadline) },
        });
        if let Some(metered) = metered(job) {
            body["metered"] = metered;
        }
        Ok((body, deadline))
    }

    /// The metered kind's terms, as the service is told them: the unit and
    /// the most of it Reeve charges for (usage above it is capped).
    fn metered(job: &Job<'_>) -> Option<Value> {
        let price = job.spec.accepts.iter().find(|p| p.meter.is_some())?;
        let meter = price.meter.as_ref()?;
        // Usage is reported in the unit, at `rate` each, capped at the
        // amount: the most units charged for is `amount / rate`.
        let ceiling = price.amount / meter.rate.max(1);
        Some(json!({ "unit": meter.unit.name(), "ceiling": u64::try_from(ceiling).unwrap_or(u64::MAX) }))
    }

    /// Every upload the input names (`upload_id`, `upload_ids`), each with
    /// a link to read it until `deadline` or for [`MAX_LINK`], whichever is
    /// sooner, and when that is (`expires_at`).
    async fn files(deps: &ExecDeps, job: &Job<'_>, deadline: OffsetDateTime) -> Result<Vec<Value>, ExecError> {
        let mut named: Vec<&Value> = job.input.get("upload_id").into_iter().collect();
        if let Some(ids) = job.input.get("upload_ids").and_then(Value::as_array) {
            named.extend(ids);
        }
        // SigV4 dates are whole seconds: start on one, so `expires_at` is exact.
        let now = OffsetDateTime::now_utc();
        let start = now.replace_nanosecond(0).unwrap_or(now);
        let life = Duration::try_from(deadline - start).unwrap_or(Duration::ZERO).min(MAX_LINK);
        let expires_at = rfc3339(start + life);
        let mut files = Vec::with_capacity(named.len());
        for value in named {
            let id: Id = value.as_str().and_then(|s| s.parse().ok()).ok_or_else(|| {
                ExecError::permanent(codes::INVALID_INPUT, "an upload id of the input is not an upload id (a ULID)")
            })?;
            let row = uploads::find(&deps.db, &job.space, id)
                .await
                .map_err(|e| ExecError::retryable("loading an upload", e))?
                .ok_or_else(|| ExecError::permanent(codes::UNKNOWN_UPLOAD, format!("upload {id} not found")))?;
            match row.status {
                UploadStatus::Uploaded | UploadStatus::Consumed => {}
                UploadStatus::Rejected => {
                    return Err(ExecError::permanent(
                        codes::UPLOAD_REJECTED,
                        format!("upload {id} was rejected: the uploaded file did not match its declaration"),
                    ));
                }
                UploadStatus::Pending => {
                    return Err(ExecError::permanent(
                        codes::UPLOAD_MISSING,
                        format!("upload {id} has no file: it was never uploaded, or it has expired"),
                    ));
                }
            }
            let url = deps
                .objects
                .presigned_get(&deps.bucket, &row.key, &[], start.into(), life)
                .await
                .map_err(|e| ExecError::retryable("signing an upload's link", e))?;
            files.push(json!({
                "upload_id": id,
                "url": url,
                "size": row.size,
                "content_type": row.content_type,
                "expires_at": expires_at,
            }));
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_named_by_its_task_and_attempt() {
        assert_eq!(job_id("01J", 2), "job_01J_2");
    }
}
