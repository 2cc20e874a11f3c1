//! Reporting on an attempt: `POST {report.url}` with the attempt's bearer
//! token, one report at a time.
//!
//! Every call makes one report with an id of its own and sends it until
//! Reeve answers: a lost connection, a `408`, `429` or `5xx` is sent again
//! with the same id, which Reeve records once. What Reeve refuses comes
//! back as an [`Error`] a service can act on: [`Error::is_over`] means the
//! attempt is no longer this service's to work on (stop, report nothing more).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use serde_json::Value;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::cancel::Stop;
use crate::messages::{
    ErrorAnswer, Failure, Job, MAX_LOG_LINE_CHARS, MAX_MESSAGE_CHARS, OutputUpload, Report, ReportBody, truncate,
};

/// Why a report (or an output's upload) did not go through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `409 superseded`: the attempt timed out and another one runs the task.
    #[error("this attempt was superseded by another: stop")]
    Superseded,
    /// `409 canceled`: the buyer canceled the task.
    #[error("the task was canceled: stop")]
    Canceled,
    /// `409 ended`: a result or a failure was already recorded.
    #[error("the attempt already ended")]
    Ended,
    /// `401`: the token is missing, forged or expired (past the deadline).
    #[error("the report token was refused: {0}")]
    Token(String),
    /// `400`, `413` or another refusal: the report itself is wrong.
    #[error("the report was refused ({status} {code}): {message}")]
    Refused { status: u16, code: String, message: String },
    /// Reeve could not be reached, or kept answering `408`, `429` or `5xx`.
    #[error("the report could not be delivered: {0}")]
    Transport(String),
    /// The output's bytes could not be stored at the link Reeve gave.
    #[error("the upload of output {name} failed: {reason}")]
    Upload { name: String, reason: String },
}

impl Error {
    /// Whether the attempt is over for this service (superseded, canceled
    /// or ended): stop working and report nothing more.
    pub fn is_over(&self) -> bool {
        matches!(self, Error::Superseded | Error::Canceled | Error::Ended)
    }
}

/// How a piece of work ended badly: a [`Failure`] to report, or a report
/// that could not be made. `?` turns either into it.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    #[error(transparent)]
    Failed(#[from] Failure),
    #[error(transparent)]
    Report(#[from] Error),
}

/// Reports on one attempt of one task.
#[derive(Clone)]
pub struct Reporter {
    client: reqwest::Client,
    url: String,
    token: Zeroizing<String>,
    tries: u32,
    backoff: Duration,
    /// Set by the attempt's cancel ([`crate::Cancels`]).
    stop: Arc<Stop>,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Reporter {
    /// A reporter for `job`'s attempt, with its own HTTP client.
    pub fn new(job: &Job) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("reeve-executor/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("the default HTTP client builds");
        Self::with_client(job, client)
    }

    /// A reporter for `job`'s attempt over `client`.
    pub fn with_client(job: &Job, client: reqwest::Client) -> Self {
        Reporter {
            client,
            url: job.report.url.clone(),
            token: Zeroizing::new(job.report.token.clone()),
            tries: 5,
            backoff: Duration::from_millis(250),
            stop: Stop::new(),
        }
    }

    pub(crate) fn stop(&self) -> &Arc<Stop> {
        &self.stop
    }

    /// Whether the attempt's cancel has arrived ([`crate::Cancels`]).
    pub fn is_canceled(&self) -> bool {
        self.stop.is_set()
    }

    /// Resolves once the attempt's cancel arrives: for a service that waits
    /// on something else meanwhile (`tokio::select!`).
    pub async fn canceled(&self) {
        self.stop.wait().await;
    }

    /// Between two steps of the work: `Ok` until the attempt's cancel has
    /// arrived (a flag read, nothing sent). Then one `heartbeat` goes to
    /// Reeve, whose `409 canceled` ends the task now rather than when the
    /// lease lapses, and the answer is the error to stop with (`?`):
    /// [`Error::Canceled`], or what else Reeve said of the attempt.
    pub async fn check(&self) -> Result<(), Error> {
        if !self.is_canceled() {
            return Ok(());
        }
        match self.heartbeat().await {
            Err(e) if e.is_over() => Err(e),
            _ => Err(Error::Canceled),
        }
    }

    /// Sends each report up to `tries` times (at least once), waiting
    /// `backoff`, then twice that, … between them (or what `Retry-After` says).
    pub fn retrying(mut self, tries: u32, backoff: Duration) -> Self {
        self.tries = tries.max(1);
        self.backoff = backoff;
        self
    }

    /// Renews the attempt's lease, nothing else.
    pub async fn heartbeat(&self) -> Result<(), Error> {
        self.report(ReportBody::Heartbeat).await.map(drop)
    }

    /// How far the work is (`fraction` is clamped to 0..1), with an optional
    /// message (cut to 500 characters).
    pub async fn progress(&self, fraction: f64, message: Option<&str>) -> Result<(), Error> {
        let fraction = if fraction.is_finite() { fraction.clamp(0.0, 1.0) } else { 0.0 };
        let message = message.map(|m| truncate(m, MAX_MESSAGE_CHARS));
        self.report(ReportBody::Progress { fraction, message }).await.map(drop)
    }

    /// A line for the task's event log (cut to 2,000 characters). The buyer
    /// may see it: no secrets.
    pub async fn log(&self, line: &str) -> Result<(), Error> {
        self.report(ReportBody::Log { line: truncate(line, MAX_LOG_LINE_CHARS) }).await.map(drop)
    }

    /// Units used so far (metered kinds): never less than the last report.
    pub async fn usage(&self, used: u64) -> Result<(), Error> {
        self.report(ReportBody::Usage { used }).await.map(drop)
    }

    /// Asks for an upload link for the output `name` of `size` bytes whose
    /// SHA-256 is `sha256` (hex): the link takes only those bytes (the
    /// bucket refuses any others), and the buyer's receipt names the digest.
    pub async fn output_upload(
        &self,
        name: &str,
        size: u64,
        content_type: &str,
        sha256: &str,
    ) -> Result<OutputUpload, Error> {
        let body = ReportBody::Output {
            name: name.to_owned(),
            size,
            content_type: content_type.to_owned(),
            sha256: sha256.to_owned(),
        };
        let answer = self.report(body).await?;
        serde_json::from_value(answer).map_err(|e| Error::Transport(format!("an output's answer is malformed: {e}")))
    }

    /// Stores `bytes` as the output `name`: asks for its link, then PUTs
    /// them there with the headers Reeve signed.
    pub async fn output(&self, name: &str, content_type: &str, bytes: impl Into<Bytes>) -> Result<OutputUpload, Error> {
        let bytes: Bytes = bytes.into();
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let upload = self.output_upload(name, bytes.len() as u64, content_type, &sha256).await?;
        let fail = |reason: String| Error::Upload { name: name.to_owned(), reason };
        let mut wait = self.backoff;
        for attempt in 1..=self.tries {
            let mut put = self.client.put(&upload.url).body(bytes.clone());
            for (header, value) in &upload.headers {
                // The body's length is sent by the client itself.
                if !header.eq_ignore_ascii_case(CONTENT_LENGTH.as_str()) {
                    put = put.header(header, value);
                }
            }
            let retry = match put.send().await {
                Ok(response) if response.status().is_success() => return Ok(upload),
                Ok(response) if is_transient(response.status()) => format!("{}", response.status()),
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    return Err(fail(format!("{status}: {}", truncate(&text, 300))));
                }
                Err(e) => e.to_string(),
            };
            if attempt == self.tries {
                return Err(fail(retry));
            }
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
        unreachable!("tries is at least 1")
    }

    /// Ends the attempt: the task completes with `result`; `used` is the
    /// units a metered kind used in all.
    pub async fn result(&self, result: Value, used: Option<u64>) -> Result<(), Error> {
        self.report(ReportBody::Result { result, used }).await.map(drop)
    }

    /// Ends the attempt with `failure` (its message cut to 500 characters).
    pub async fn failure(&self, failure: Failure) -> Result<(), Error> {
        let failure = Failure { message: truncate(&failure.message, MAX_MESSAGE_CHARS), ..failure };
        self.report(ReportBody::Failure(failure)).await.map(drop)
    }

    /// Reports how a piece of work ended, if it did not report the end
    /// itself: a [`Failure`] is sent, an attempt that is over is left
    /// alone. `Err` only when the failure could not be reported.
    pub async fn finish(&self, outcome: Result<(), WorkError>) -> Result<(), Error> {
        match outcome {
            Ok(()) => Ok(()),
            Err(WorkError::Failed(failure)) => match self.failure(failure).await {
                Err(e) if e.is_over() => Ok(()),
                other => other,
            },
            Err(WorkError::Report(e)) if e.is_over() => {
                tracing::info!(reason = %e, "the attempt is over: stopping");
                Ok(())
            }
            Err(WorkError::Report(e)) => {
                tracing::warn!(error = %e, "a report failed: ending the attempt as retryable");
                let failure = Failure::retryable("the service could not report its progress", None);
                match self.failure(failure).await {
                    Err(end) if end.is_over() => Ok(()),
                    Err(_) => Err(e),
                    Ok(()) => Ok(()),
                }
            }
        }
    }

    /// Sends `body` as a new report (an id of its own); the answer's JSON.
    pub async fn report(&self, body: ReportBody) -> Result<Value, Error> {
        let id = format!("{}-{}", body.kind(), ulid::Ulid::new());
        self.send(&Report { id, body }).await
    }

    /// Sends `report` until Reeve answers it; its answer's JSON. Sending
    /// one report again (the same id) is harmless.
    pub async fn send(&self, report: &Report) -> Result<Value, Error> {
        let body = serde_json::to_vec(report).map_err(|e| Error::Transport(e.to_string()))?;
        let mut wait = self.backoff;
        for attempt in 1..=self.tries {
            let sent = self
                .client
                .post(&self.url)
                .header(AUTHORIZATION, format!("Bearer {}", self.token.as_str()))
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await;
            let why = match sent {
                Ok(response) => {
                    let status = response.status();
                    let retry_after = response
                        .headers()
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    let text = response.bytes().await.unwrap_or_default();
                    if status.is_success() {
                        return Ok(serde_json::from_slice(&text).unwrap_or(Value::Null));
                    }
                    if !is_transient(status) {
                        return Err(refusal(status, &text));
                    }
                    if let Some(after) = retry_after {
                        wait = wait.max(after);
                    }
                    format!("{status}")
                }
                Err(e) => e.to_string(),
            };
            if attempt == self.tries {
                return Err(Error::Transport(why));
            }
            tracing::debug!(report = %report.id, %why, "report not delivered: sending it again");
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
        unreachable!("tries is at least 1")
    }
}

/// An answer worth sending the same report again for.
fn is_transient(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT || status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// The [`Error`] of a refusal, from its status and `{"error": {code, message}}`.
fn refusal(status: StatusCode, body: &[u8]) -> Error {
    let (code, message) = match serde_json::from_slice::<ErrorAnswer>(body) {
        Ok(answer) => (answer.error.code, answer.error.message),
        Err(_) => (String::new(), truncate(&String::from_utf8_lossy(body), 300)),
    };
    match (status, code.as_str()) {
        (StatusCode::CONFLICT, "superseded") => Error::Superseded,
        (StatusCode::CONFLICT, "canceled") => Error::Canceled,
        (StatusCode::CONFLICT, "ended") => Error::Ended,
        (StatusCode::UNAUTHORIZED, _) => Error::Token(message),
        _ => Error::Refused { status: status.as_u16(), code, message },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::body::Bytes as Body;
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{post, put};
    use serde_json::json;

    use super::*;
    use crate::messages::Message;
    use crate::messages::tests::documented_job;

    /// A stand-in for Reeve's report route and the bucket: answers each
    /// POST with the next scripted answer (then `200 {}`), and keeps what it got.
    #[derive(Default)]
    struct Reeve {
        answers: Mutex<VecDeque<(u16, Value)>>,
        reports: Mutex<Vec<(String, Value)>>,
        puts: Mutex<Vec<(String, String, Vec<u8>)>>,
    }

    async fn serve(answers: Vec<(u16, Value)>) -> (Arc<Reeve>, Reporter) {
        let reeve = Arc::new(Reeve { answers: Mutex::new(answers.into()), ..Reeve::default() });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = Router::new()
            .route("/v1/executor/reports", post(report))
            .route("/bucket/{name}", put(store))
            .with_state(reeve.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let mut job = documented_job();
        job["report"]["url"] = json!(format!("{base}/v1/executor/reports"));
        let Message::Job(job) = serde_json::from_value(job).unwrap() else { unreachable!() };
        (reeve, Reporter::new(&job).retrying(3, Duration::from_millis(10)))
    }

    async fn report(State(reeve): State<Arc<Reeve>>, headers: HeaderMap, body: Body) -> (StatusCode, String) {
        let auth = headers.get("authorization").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let report: Value = serde_json::from_slice(&body).unwrap();
        reeve.reports.lock().unwrap().push((auth, report));
        let (status, answer) = reeve.answers.lock().unwrap().pop_front().unwrap_or((200, json!({})));
        (StatusCode::from_u16(status).unwrap(), answer.to_string())
    }

    async fn store(State(reeve): State<Arc<Reeve>>, Path(name): Path<String>, headers: HeaderMap, body: Body) {
        let content_type = headers.get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        reeve.puts.lock().unwrap().push((name, content_type, body.to_vec()));
    }

    fn refusal(code: &str) -> Value {
        json!({"error": {"code": code, "message": format!("{code}!"), "request_id": "req_1"}})
    }

    #[tokio::test]
    async fn a_cancel_stops_the_attempt_it_names_and_check_ends_it_at_reeve() {
        let (reeve, reporter) = serve(vec![(409, refusal("canceled"))]).await;
        let Message::Job(job) = serde_json::from_value(documented_job()).unwrap() else { unreachable!() };
        let cancels = crate::Cancels::default();
        let reporter = cancels.track(&job, reporter);
        reporter.check().await.unwrap();
        assert!(reeve.reports.lock().unwrap().is_empty(), "checking sends nothing until canceled");

        let mut other = crate::Cancel { protocol: 1, task: job.task.clone() };
        other.task.attempt += 1;
        assert!(!cancels.cancel(&other), "another attempt of the task is not this one");
        assert!(!reporter.is_canceled());

        let waiting = tokio::spawn({
            let reporter = reporter.clone();
            async move { reporter.canceled().await }
        });
        let cancel = crate::Cancel { protocol: 1, task: job.task.clone() };
        assert!(cancels.cancel(&cancel));
        tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert!(reporter.is_canceled());
        // One heartbeat tells Reeve, whose 409 canceled is the error to stop with.
        assert_eq!(reporter.check().await, Err(Error::Canceled));
        let reports: Vec<Value> = reeve.reports.lock().unwrap().iter().map(|(_, r)| r.clone()).collect();
        assert_eq!(reports.len(), 1, "{reports:?}");
        assert_eq!(reports[0]["type"], "heartbeat");

        drop(reporter);
        assert!(!cancels.cancel(&cancel), "an attempt whose reporter is gone has left");
    }

    #[tokio::test]
    async fn a_report_is_sent_again_with_its_id_until_it_is_answered() {
        let (reeve, reporter) = serve(vec![(503, json!({})), (429, json!({}))]).await;
        reporter.progress(1.5, Some("reading")).await.unwrap();
        let reports = reeve.reports.lock().unwrap().clone();
        assert_eq!(reports.len(), 3);
        for (auth, report) in &reports {
            assert_eq!(auth, "Bearer rt_secret");
            assert_eq!(report, &reports[0].1, "a retry is the same report");
        }
        let report = &reports[0].1;
        assert_eq!(report["type"], "progress");
        assert_eq!(report["fraction"], 1.0, "clamped to 0..1");
        assert!(crate::messages::is_report_id(report["id"].as_str().unwrap()));
    }

    #[tokio::test]
    async fn each_call_is_a_new_report() {
        let (reeve, reporter) = serve(vec![]).await;
        reporter.heartbeat().await.unwrap();
        reporter.usage(10).await.unwrap();
        reporter.log(&"x".repeat(3_000)).await.unwrap();
        let reports = reeve.reports.lock().unwrap().clone();
        let ids: std::collections::HashSet<_> = reports.iter().map(|(_, r)| r["id"].clone()).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(reports[1].1["used"], 10);
        assert_eq!(reports[2].1["line"].as_str().unwrap().len(), MAX_LOG_LINE_CHARS);
    }

    #[tokio::test]
    async fn refusals_become_errors_a_service_can_act_on() {
        let cases = [
            (409, refusal("superseded"), Error::Superseded),
            (409, refusal("canceled"), Error::Canceled),
            (409, refusal("ended"), Error::Ended),
            (401, refusal("invalid_report_token"), Error::Token("invalid_report_token!".into())),
            (
                413,
                refusal("too_large"),
                Error::Refused { status: 413, code: "too_large".into(), message: "too_large!".into() },
            ),
            (
                400,
                json!("not an envelope"),
                Error::Refused { status: 400, code: String::new(), message: "\"not an envelope\"".into() },
            ),
            (503, json!({}), Error::Transport("503 Service Unavailable".into())),
        ];
        for (status, answer, want) in cases {
            let (_, reporter) = serve(vec![(status, answer.clone()); 3]).await;
            let got = reporter.heartbeat().await.unwrap_err();
            assert_eq!(got, want, "{status} {answer}");
            assert_eq!(got.is_over(), status == 409);
        }
    }

    #[tokio::test]
    async fn an_output_is_asked_for_then_put_with_the_signed_headers() {
        let (reeve, reporter) = serve(vec![]).await;
        let url = reporter.url.replace("/v1/executor/reports", "/bucket/top.csv");
        let upload = json!({"url": url, "method": "PUT",
            "headers": {"content-type": "text/csv", "content-length": "8"}, "expires_at": "2026-12-06T11:00:00Z"});
        reeve.answers.lock().unwrap().push_back((200, upload));
        let got = reporter.output("top.csv", "text/csv", "word,n\n\n").await.unwrap();
        assert_eq!(got.url, url);
        let asked = &reeve.reports.lock().unwrap()[0].1;
        assert_eq!(
            (asked["type"].as_str(), asked["name"].as_str(), asked["size"].as_u64()),
            (Some("output"), Some("top.csv"), Some(8))
        );
        assert_eq!(
            asked["sha256"],
            hex::encode(Sha256::digest(b"word,n\n\n")),
            "the link is bound to the bytes' digest"
        );
        let puts = reeve.puts.lock().unwrap().clone();
        assert_eq!(puts, vec![("top.csv".to_owned(), "text/csv".to_owned(), b"word,n\n\n".to_vec())]);
    }

    #[tokio::test]
    async fn finish_reports_a_failure_and_leaves_an_attempt_that_is_over() {
        let (reeve, reporter) = serve(vec![]).await;
        reporter.finish(Err(Failure::permanent("not a text file").into())).await.unwrap();
        reporter.finish(Err(Error::Canceled.into())).await.unwrap();
        reporter.finish(Ok(())).await.unwrap();
        let reports = reeve.reports.lock().unwrap().clone();
        assert_eq!(reports.len(), 1, "{reports:?}");
        assert_eq!(reports[0].1["type"], "failure");
        assert_eq!(reports[0].1["retryable"], false);
        assert_eq!(reports[0].1["message"], "not a text file");
    }
}
