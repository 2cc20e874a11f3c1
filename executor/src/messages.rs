//! Every message of the protocol (docs/executors.md), as serde types: what
//! Reeve sends (the job, the cancel), what the service reports, and what
//! Reeve answers. Their JSON Schemas are in docs/executor-schemas/; a test
//! checks these types against them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

/// The protocol version this crate speaks.
pub const PROTOCOL: u32 = 1;

/// The longest a progress message or a failure's message may be, in characters.
pub const MAX_MESSAGE_CHARS: usize = 500;
/// The longest a log line may be, in characters.
pub const MAX_LOG_LINE_CHARS: usize = 2_000;

/// What Reeve sends a service: a job, or the cancel of one. A Lambda
/// function's event is one of these; so is the body of a POST to an
/// endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    Job(Job),
    Cancel(Cancel),
}

/// One attempt of a task, to work on (`"type": "job"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub protocol: u32,
    pub task: TaskRef,
    /// The task's input, as the buyer gave it (checked against the kind's schema).
    pub input: Value,
    /// Every upload the input names, each with a link to read it.
    #[serde(default)]
    pub files: Vec<InputFile>,
    /// Where and how to report.
    pub report: ReportTarget,
    /// Present for metered kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metered: Option<Metered>,
}

/// A signed cancel of a running attempt (`"type": "cancel"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancel {
    pub protocol: u32,
    pub task: TaskRef,
}

/// Which task and attempt a job or a cancel is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRef {
    pub id: String,
    pub kind: String,
    pub attempt: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub deadline: OffsetDateTime,
}

/// An input file: a presigned GET link, valid until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    pub upload_id: String,
    pub url: String,
    pub size: u64,
    pub content_type: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// Where to send reports, with the bearer token for this attempt.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportTarget {
    pub url: String,
    pub token: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// The token is a bearer credential: it is never printed.
impl fmt::Debug for ReportTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReportTarget")
            .field("url", &self.url)
            .field("token", &"…")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// What a metered kind counts, and the most it will charge for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metered {
    pub unit: String,
    pub ceiling: u64,
}

/// One report: an id the service chose, unique within the attempt, and
/// what it says. Sending the same report again is harmless.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub id: String,
    #[serde(flatten)]
    pub body: ReportBody,
}

/// What a report says (its `type` and fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReportBody {
    /// Renews the attempt's lease, nothing else.
    Heartbeat,
    /// How far the work is, from 0 to 1.
    Progress {
        fraction: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A line for the task's event log.
    Log { line: String },
    /// Units used so far (metered kinds), never decreasing.
    Usage { used: u64 },
    /// Asks for an upload link for an output file of `size` bytes whose
    /// SHA-256 (hex) is `sha256`: the link only takes those bytes, and the
    /// buyer's receipt names the digest.
    Output { name: String, size: u64, content_type: String, sha256: String },
    /// The attempt ends: the task completes with `result`.
    Result {
        result: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        used: Option<u64>,
    },
    /// The attempt ends: the task fails, or is tried again.
    Failure(Failure),
}

impl ReportBody {
    /// The report's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            ReportBody::Heartbeat => "heartbeat",
            ReportBody::Progress { .. } => "progress",
            ReportBody::Log { .. } => "log",
            ReportBody::Usage { .. } => "usage",
            ReportBody::Output { .. } => "output",
            ReportBody::Result { .. } => "result",
            ReportBody::Failure(_) => "failure",
        }
    }
}

/// How the work failed. Permanent: the task fails and the buyer sees
/// `message`. Retryable: the task is queued for its next attempt, after
/// `retry_after_seconds` if given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub retryable: bool,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
}

impl Failure {
    /// A failure for good; `message` is shown to the buyer.
    pub fn permanent(message: impl Into<String>) -> Self {
        Failure { retryable: false, message: message.into(), retry_after_seconds: None }
    }

    /// A failure worth another attempt, after `after_seconds` if given.
    pub fn retryable(message: impl Into<String>, after_seconds: Option<u64>) -> Self {
        Failure { retryable: true, message: message.into(), retry_after_seconds: after_seconds }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.retryable { "retryable" } else { "permanent" };
        write!(f, "{kind} failure: {}", self.message)
    }
}

impl std::error::Error for Failure {}

/// Reeve's answer to an `output` report: where to PUT the file's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputUpload {
    pub url: String,
    /// Always `PUT`.
    pub method: String,
    /// Headers the PUT must carry, exactly (they are signed).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// Reeve's answer to a refused report: `{"error": {code, message, request_id}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorAnswer {
    pub error: ErrorBody,
}

/// What was refused and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Whether `id` may be a report's id: 1 to 64 of `[A-Za-z0-9_.:-]`.
pub fn is_report_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

/// Whether `name` may be an output's name: 1 to 100 of `[A-Za-z0-9._-]`.
pub fn is_output_name(name: &str) -> bool {
    (1..=100).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// `text` cut to at most `max` characters.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => text[..end].to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// The job of docs/executors.md, as JSON.
    pub(crate) fn documented_job() -> Value {
        json!({
            "type": "job",
            "protocol": 1,
            "task": { "id": "01KBQ4X3T5G7N0Z2M9W8Y6V4R2", "kind": "wordfreq", "attempt": 1, "deadline": "2026-12-06T11:00:00Z" },
            "input": { "upload_id": "01KBQ4WZK1D3F5H7J9M2P4R6T8" },
            "files": [
                { "upload_id": "01KBQ4WZK1D3F5H7J9M2P4R6T8", "url": "https://s3.example.com/in?sig", "size": 1048576,
                  "content_type": "text/plain", "expires_at": "2026-12-06T11:00:00Z" }
            ],
            "report": { "url": "https://api.example.com/v1/executor/reports", "token": "rt_secret", "expires_at": "2026-12-06T11:00:00Z" },
            "metered": { "unit": "line", "ceiling": 50000 }
        })
    }

    #[test]
    fn the_documented_job_parses_and_round_trips() {
        let message: Message = serde_json::from_value(documented_job()).unwrap();
        let Message::Job(job) = &message else { panic!("not a job: {message:?}") };
        assert_eq!(job.task.attempt, 1);
        assert_eq!(job.files[0].size, 1_048_576);
        assert_eq!(job.metered, Some(Metered { unit: "line".into(), ceiling: 50_000 }));
        assert_eq!(serde_json::to_value(&message).unwrap(), documented_job());
        assert!(!format!("{job:?}").contains("rt_secret"), "the token is printed");
    }

    #[test]
    fn a_cancel_parses() {
        let cancel = json!({"type": "cancel", "protocol": 1,
            "task": {"id": "t", "kind": "k", "attempt": 2, "deadline": "2026-12-06T11:00:00Z"}});
        let message: Message = serde_json::from_value(cancel.clone()).unwrap();
        assert!(matches!(&message, Message::Cancel(c) if c.task.attempt == 2));
        assert_eq!(serde_json::to_value(&message).unwrap(), cancel);
    }

    #[test]
    fn reports_serialize_as_documented() {
        let cases = [
            (ReportBody::Heartbeat, json!({"id": "r1", "type": "heartbeat"})),
            (
                ReportBody::Progress { fraction: 0.5, message: Some("half".into()) },
                json!({"id": "r1", "type": "progress", "fraction": 0.5, "message": "half"}),
            ),
            (ReportBody::Log { line: "l".into() }, json!({"id": "r1", "type": "log", "line": "l"})),
            (ReportBody::Usage { used: 7 }, json!({"id": "r1", "type": "usage", "used": 7})),
            (
                ReportBody::Output {
                    name: "top.csv".into(),
                    size: 9,
                    content_type: "text/csv".into(),
                    sha256: "ab".repeat(32),
                },
                json!({"id": "r1", "type": "output", "name": "top.csv", "size": 9, "content_type": "text/csv",
                       "sha256": "ab".repeat(32)}),
            ),
            (
                ReportBody::Result { result: json!({"n": 1}), used: Some(3) },
                json!({"id": "r1", "type": "result", "result": {"n": 1}, "used": 3}),
            ),
            (
                ReportBody::Failure(Failure::retryable("busy", Some(30))),
                json!({"id": "r1", "type": "failure", "retryable": true, "message": "busy", "retry_after_seconds": 30}),
            ),
        ];
        for (body, want) in cases {
            let report = Report { id: "r1".into(), body };
            assert_eq!(serde_json::to_value(&report).unwrap(), want, "{}", report.body.kind());
            let back: Report = serde_json::from_value(want).unwrap();
            assert_eq!(back, report);
        }
    }

    #[test]
    fn ids_names_and_truncation() {
        assert!(is_report_id("progress.01KBQ4X3T5G7N0Z2M9W8Y6V4R2:3"));
        assert!(!is_report_id(""));
        assert!(!is_report_id(&"a".repeat(65)));
        assert!(!is_report_id("a b"));
        assert!(is_output_name("top-100_words.csv"));
        assert!(!is_output_name("../x"));
        assert!(!is_output_name(&"a".repeat(101)));
        assert_eq!(truncate("héllo", 2), "hé");
        assert_eq!(truncate("hé", 5), "hé");
    }
}
