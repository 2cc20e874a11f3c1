//! The executor protocol's service side, asserted the same way for every
//! service that implements it: the Rust example in-process, the Rust
//! example as a Lambda function under `cargo lambda watch` (invoked
//! asynchronously through its Invoke API), and the Python service written
//! from docs/executors.md alone (tests/executors/service.py), over HTTP
//! with a signed job.
//!
//! A stand-in for Reeve's side serves the text input, the report route
//! (token, idempotency by id, `409 ended` after the end, each report checked
//! against docs/executor-schemas/) and the output's PUT. Every service must
//! send the same reports and produce byte for byte the same CSV and summary.
//!
//! The Lambda case serves the function itself with `cargo lambda watch -p
//! wordfreq --env-var WORDFREQ_REPORT_EVERY=4` on a free loopback port
//! (cargo-lambda is in the stack's .venv), or uses the one
//! `REEVE_WORDFREQ_INVOKE_URL` names.

#[path = "../../../tests/executors/harness.rs"]
mod harness;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use harness::{PythonService, Watch, root};
use reeve_executor::{Job, Message, Reporter, Secret};
use serde_json::{Value, json};
use wordfreq::{Counter, OUTPUT, Settings};

const TOKEN: &str = "rt_test_token";
/// Lines between progress reports, for every service under test.
const EVERY: u64 = 4;

/// The input: 30 lines, words repeated so the ranking has ties to break.
fn text() -> String {
    let words = ["the", "cat", "sat", "on", "The", "mat", "it's", "über", "42", "a"];
    (0..30)
        .map(|i| {
            let line: Vec<&str> = (0..=(i % 7)).map(|j| words[(i * 3 + j * 5) % words.len()]).collect();
            format!("{}, {}!\n", line.join(" "), words[i % 4])
        })
        .collect()
}

fn expected() -> Counter {
    let mut counter = Counter::default();
    for line in text().lines() {
        counter.add_line(line);
    }
    counter
}

/// What Reeve's side saw of one attempt.
#[derive(Default)]
struct Seen {
    /// Each distinct report, in arrival order.
    reports: Vec<Value>,
    /// Deliveries per report id (retries included).
    deliveries: HashMap<String, usize>,
    /// Answers already given, by report id: a retry gets the same.
    answers: HashMap<String, (u16, Value)>,
    puts: Vec<(String, String, Vec<u8>)>,
    ended_at: Option<Instant>,
    refused: Vec<String>,
}

struct FakeReeve {
    base: String,
    text: String,
    seen: Mutex<Seen>,
    /// docs/executor-schemas/report.json, compiled.
    report_schema: (boon::Schemas, boon::SchemaIndex),
}

async fn fake_reeve() -> Arc<FakeReeve> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mut schemas = boon::Schemas::new();
    let url = format!("file://{}", root().join("docs/executor-schemas/report.json").display());
    let root = boon::Compiler::new().compile(&url, &mut schemas).unwrap();
    let reeve = Arc::new(FakeReeve { base, text: text(), seen: Mutex::default(), report_schema: (schemas, root) });
    let app = Router::new()
        .route("/files/input.txt", get(|State(r): State<Arc<FakeReeve>>| async move { r.text.clone() }))
        .route("/v1/executor/reports", post(report))
        .route("/bucket/{name}", put(store))
        .with_state(reeve.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    reeve
}

fn refuse(status: StatusCode, code: &str) -> (u16, Value) {
    (status.as_u16(), json!({"error": {"code": code, "message": code, "request_id": "req_test"}}))
}

async fn report(State(reeve): State<Arc<FakeReeve>>, headers: HeaderMap, body: Bytes) -> Response {
    let (status, answer) = record(&reeve, &headers, &body);
    (StatusCode::from_u16(status).unwrap(), axum::Json(answer)).into_response()
}

/// Reeve's report route, as docs/executors.md states it.
fn record(reeve: &FakeReeve, headers: &HeaderMap, body: &[u8]) -> (u16, Value) {
    let mut seen = reeve.seen.lock().unwrap();
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {TOKEN}")) {
        seen.refused.push("token".into());
        return refuse(StatusCode::UNAUTHORIZED, "invalid_report_token");
    }
    let Ok(report) = serde_json::from_slice::<Value>(body) else {
        seen.refused.push("not JSON".into());
        return refuse(StatusCode::BAD_REQUEST, "invalid_report");
    };
    if reeve.report_schema.0.validate(&report, reeve.report_schema.1).is_err() {
        seen.refused.push(format!("schema: {report}"));
        return refuse(StatusCode::BAD_REQUEST, "invalid_report");
    }
    let id = report["id"].as_str().unwrap().to_owned();
    *seen.deliveries.entry(id.clone()).or_default() += 1;
    if let Some(answer) = seen.answers.get(&id) {
        return answer.clone();
    }
    let answer = if seen.ended_at.is_some() {
        refuse(StatusCode::CONFLICT, "ended")
    } else {
        match report["type"].as_str().unwrap() {
            "output" => {
                let name = report["name"].as_str().unwrap();
                (
                    200,
                    json!({"url": format!("{}/bucket/{name}", reeve.base), "method": "PUT",
                    "headers": {"content-type": report["content_type"]}, "expires_at": "2099-01-01T00:00:00Z"}),
                )
            }
            "result" | "failure" => {
                seen.ended_at = Some(Instant::now());
                (200, json!({}))
            }
            _ => (200, json!({})),
        }
    };
    seen.reports.push(report);
    seen.answers.insert(id, answer.clone());
    answer
}

async fn store(State(reeve): State<Arc<FakeReeve>>, Path(name): Path<String>, headers: HeaderMap, body: Bytes) {
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    reeve.seen.lock().unwrap().puts.push((name, content_type, body.to_vec()));
}

impl FakeReeve {
    fn job(&self, metered: bool) -> Value {
        let mut job = json!({
            "type": "job",
            "protocol": 1,
            "task": {"id": "01KBQ4X3T5G7N0Z2M9W8Y6V4R2", "kind": "wordfreq", "attempt": 1, "deadline": "2099-01-01T00:00:00Z"},
            "input": {"upload_id": "01KBQ4WZK1D3F5H7J9M2P4R6T8"},
            "files": [{"upload_id": "01KBQ4WZK1D3F5H7J9M2P4R6T8", "url": format!("{}/files/input.txt", self.base),
                "size": self.text.len(), "content_type": "text/plain", "expires_at": "2099-01-01T00:00:00Z"}],
            "report": {"url": format!("{}/v1/executor/reports", self.base), "token": TOKEN, "expires_at": "2099-01-01T00:00:00Z"},
        });
        if metered {
            job["metered"] = json!({"unit": "line", "ceiling": 50_000});
        }
        job
    }

    async fn wait_for_end(&self, within: Duration) -> Instant {
        let start = Instant::now();
        loop {
            if let Some(at) = self.seen.lock().unwrap().ended_at {
                return at;
            }
            assert!(start.elapsed() < within, "no result or failure within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The protocol's assertions, the same for every service.
    fn assert_protocol(&self, metered: bool) {
        let seen = self.seen.lock().unwrap();
        assert!(seen.refused.is_empty(), "refused reports: {:?}", seen.refused);
        let want = expected();
        let types: Vec<&str> = seen.reports.iter().map(|r| r["type"].as_str().unwrap()).collect();
        assert_eq!(types.last(), Some(&"result"), "{types:?}");
        assert_eq!(types.iter().filter(|t| **t == "result" || **t == "failure").count(), 1, "{types:?}");

        let ids: HashSet<&str> = seen.reports.iter().map(|r| r["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), seen.reports.len(), "every report has an id of its own");

        // Progress as it reads: every EVERY lines, never backwards, ending at 1.
        let fractions: Vec<f64> =
            seen.reports.iter().filter(|r| r["type"] == "progress").map(|r| r["fraction"].as_f64().unwrap()).collect();
        assert!(fractions.len() as u64 >= want.lines / EVERY, "{fractions:?}");
        assert!(fractions.windows(2).all(|w| w[0] <= w[1]), "{fractions:?}");
        assert_eq!(fractions.last(), Some(&1.0));

        let usage: Vec<u64> =
            seen.reports.iter().filter(|r| r["type"] == "usage").map(|r| r["used"].as_u64().unwrap()).collect();
        if metered {
            assert!(usage.windows(2).all(|w| w[0] <= w[1]), "{usage:?}");
            assert_eq!(usage.last(), Some(&want.lines));
        } else {
            assert!(usage.is_empty(), "a free kind reports no usage: {usage:?}");
        }

        let csv = want.csv(100);
        let output: Vec<&Value> = seen.reports.iter().filter(|r| r["type"] == "output").collect();
        assert_eq!(output.len(), 1);
        assert_eq!(output[0]["name"], OUTPUT);
        assert_eq!(output[0]["content_type"], "text/csv");
        assert_eq!(output[0]["size"], csv.len());
        assert_eq!(seen.puts, vec![(OUTPUT.to_owned(), "text/csv".to_owned(), csv.into_bytes())]);

        let end = seen.reports.last().unwrap();
        assert_eq!(end["result"], wordfreq::summary(&want));
        assert_eq!(end["used"].as_u64(), metered.then_some(want.lines));
    }
}

#[tokio::test]
async fn the_rust_example_in_process() {
    for metered in [false, true] {
        let reeve = fake_reeve().await;
        let Message::Job(job) = serde_json::from_value::<Message>(reeve.job(metered)).unwrap() else { unreachable!() };
        let reporter = Reporter::new(&job);
        let outcome = wordfreq::work(job, reporter.clone(), Settings { report_every: EVERY }).await;
        reporter.finish(outcome).await.unwrap();
        reeve.wait_for_end(Duration::from_secs(5)).await;
        reeve.assert_protocol(metered);
    }
}

#[tokio::test]
async fn a_job_without_a_file_fails_for_good() {
    let reeve = fake_reeve().await;
    let mut job = reeve.job(false);
    job["files"] = json!([]);
    let job: Job = serde_json::from_value(job).unwrap();
    let reporter = Reporter::new(&job);
    reporter.finish(wordfreq::work(job, reporter.clone(), Settings { report_every: EVERY }).await).await.unwrap();
    let seen = reeve.seen.lock().unwrap();
    assert_eq!(seen.reports.len(), 1);
    assert_eq!(seen.reports[0]["type"], "failure");
    assert_eq!(seen.reports[0]["retryable"], false);
}

/// The example as a Lambda function, invoked asynchronously through the
/// Invoke API `cargo lambda watch` serves, as Reeve's `lambda` executor does.
#[tokio::test]
async fn the_rust_example_under_cargo_lambda_watch() {
    let served;
    let invoke = match std::env::var("REEVE_WORDFREQ_INVOKE_URL") {
        Ok(url) => url,
        Err(_) => {
            served = Watch::start(EVERY).await;
            served.url.clone()
        }
    };
    let client = reqwest::Client::new();
    for metered in [false, true] {
        let reeve = fake_reeve().await;
        let sent = Instant::now();
        let answer = client
            .post(format!("{invoke}/2015-03-31/functions/wordfreq/invocations"))
            .header("x-amz-invocation-type", "Event")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&reeve.job(metered)).unwrap())
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .unwrap();
        let answered = Instant::now();
        // AWS answers an Event invocation 202 at once. cargo lambda watch
        // (1.9.2) does not emulate it: it runs the invocation to its end and
        // answers 200 with the function's payload (null here), so its answer
        // comes after the last report.
        let status = answer.status().as_u16();
        assert!(status == 202 || status == 200, "{status}: {}", answer.text().await.unwrap_or_default());
        let ended = reeve.wait_for_end(Duration::from_secs(120)).await;
        eprintln!(
            "invoke answered {status} {:?} after sending; the result came {:?} after sending",
            answered - sent,
            ended - sent
        );
        reeve.assert_protocol(metered);
    }
}

/// The Python service, over HTTP with a signed job.
#[tokio::test]
async fn the_python_service_over_http() {
    let secret_text = Secret::generate();
    let secret = Secret::parse(&secret_text).unwrap();
    let service = PythonService::start(&secret_text, &["--report-every", &EVERY.to_string()]).await;
    let endpoint = &service.endpoint;
    let client = reqwest::Client::new();

    for (n, metered) in [false, true].into_iter().enumerate() {
        let reeve = fake_reeve().await;
        let body = serde_json::to_vec(&reeve.job(metered)).unwrap();
        let id = format!("job_01KBQ4X3T5G7N0Z2M9W8Y6V4R2_{}", n + 1);
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let post = |timestamp: i64, signature: String, body: Vec<u8>| {
            client
                .post(endpoint)
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signature)
                .body(body)
                .send()
        };

        // Refused: a changed byte, another key, an old timestamp, no signature.
        let mut changed = body.clone();
        changed[10] ^= 1;
        let other = Secret::parse(&Secret::generate()).unwrap();
        let refused = [
            (now, secret.sign(&id, now, &body), changed),
            (now, other.sign(&id, now, &body), body.clone()),
            (now - 301, secret.sign(&id, now - 301, &body), body.clone()),
            (now, String::new(), body.clone()),
        ];
        for (timestamp, signature, body) in refused {
            assert_eq!(post(timestamp, signature, body).await.unwrap().status(), 401);
        }

        // Several signatures (a rotation): the right one among them is enough.
        let listed = format!("{} {}", other.sign(&id, now, &body), secret.sign(&id, now, &body));
        assert_eq!(post(now, listed, body.clone()).await.unwrap().status(), 202);
        // A redelivery of the same attempt is accepted and not worked twice.
        assert_eq!(post(now, secret.sign(&id, now, &body), body.clone()).await.unwrap().status(), 202);
        reeve.wait_for_end(Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        reeve.assert_protocol(metered);
    }
}
