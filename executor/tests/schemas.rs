//! The crate's messages against the protocol's JSON Schemas
//! (docs/executor-schemas/): what the crate sends and parses is what the
//! document says, and the schemas refuse what the document forbids.

use std::collections::BTreeMap;

use reeve_executor::messages::{Cancel, ErrorAnswer, ErrorBody, Metered, ReportTarget};
use reeve_executor::{Failure, InputFile, Job, Message, OutputUpload, Report, ReportBody, TaskRef};
use serde_json::{Value, json};
use time::macros::datetime;

const SCHEMAS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/executor-schemas");

fn schema(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{SCHEMAS}/{name}.json")).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A schema compiled, with or without its `format`s asserted.
struct Compiled {
    schemas: boon::Schemas,
    root: boon::SchemaIndex,
}

impl Compiled {
    fn new(name: &str, formats: bool) -> Compiled {
        let mut compiler = boon::Compiler::new();
        if formats {
            compiler.enable_format_assertions();
        }
        let url = format!("file://{SCHEMAS}/{name}.json");
        let mut schemas = boon::Schemas::new();
        let root = compiler.compile(&url, &mut schemas).unwrap_or_else(|e| panic!("{name} is not a valid schema: {e}"));
        Compiled { schemas, root }
    }

    /// Each violation, empty when `value` is valid.
    fn errors(&self, value: &Value) -> Option<String> {
        self.schemas.validate(value, self.root).err().map(|e| format!("{e:#}"))
    }
}

fn validator(name: &str) -> Compiled {
    Compiled::new(name, true)
}

fn assert_valid(name: &str, value: &Value) {
    let errors = validator(name).errors(value);
    assert!(errors.is_none(), "{name}: {value} is refused: {errors:?}");
}

fn assert_invalid(name: &str, value: &Value) {
    assert!(validator(name).errors(value).is_some(), "{name}: {value} is accepted");
}

fn task() -> TaskRef {
    TaskRef {
        id: "01KBQ4X3T5G7N0Z2M9W8Y6V4R2".into(),
        kind: "wordfreq".into(),
        attempt: 2,
        deadline: datetime!(2026-12-06 11:00 UTC),
    }
}

fn job(metered: Option<Metered>) -> Message {
    Message::Job(Job {
        protocol: 1,
        task: task(),
        input: json!({"upload_id": "01KBQ4WZK1D3F5H7J9M2P4R6T8"}),
        files: vec![InputFile {
            upload_id: "01KBQ4WZK1D3F5H7J9M2P4R6T8".into(),
            url: "https://s3.example.com/in?X-Amz-Signature=abc".into(),
            size: 12,
            content_type: "text/plain".into(),
            expires_at: datetime!(2026-12-06 11:00 UTC),
        }],
        report: ReportTarget {
            url: "https://api.example.com/v1/executor/reports".into(),
            token: "rt_x".into(),
            expires_at: datetime!(2026-12-06 11:00 UTC),
        },
        metered,
    })
}

fn reports() -> Vec<ReportBody> {
    vec![
        ReportBody::Heartbeat,
        ReportBody::Progress { fraction: 0.25, message: Some("read 1,000 lines".into()) },
        ReportBody::Progress { fraction: 1.0, message: None },
        ReportBody::Log { line: "started".into() },
        ReportBody::Usage { used: 1_000 },
        ReportBody::Output {
            name: "top-100.csv".into(),
            size: 1_234,
            content_type: "text/csv".into(),
            sha256: "0f".repeat(32),
        },
        ReportBody::Result { result: json!({"lines": 3}), used: Some(3) },
        ReportBody::Result { result: json!({}), used: None },
        ReportBody::Failure(Failure::permanent("not text")),
        ReportBody::Failure(Failure::retryable("busy", Some(30))),
    ]
}

#[test]
fn jobs_and_cancels_validate() {
    assert_valid("job", &serde_json::to_value(job(None)).unwrap());
    let metered = job(Some(Metered { unit: "line".into(), ceiling: 50_000 }));
    assert_valid("job", &serde_json::to_value(metered).unwrap());
    let cancel = serde_json::to_value(Message::Cancel(Cancel { protocol: 1, task: task() })).unwrap();
    assert_valid("cancel", &cancel);
    assert_invalid("job", &cancel);
    assert_invalid("cancel", &serde_json::to_value(job(None)).unwrap());
}

#[test]
fn the_documents_example_job_validates_and_parses() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/executors.md")).unwrap();
    let start = doc.find("```json\n").expect("a JSON example") + "```json\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let example: Value = serde_json::from_str(&doc[start..end]).unwrap();
    assert_eq!(example["type"], "job");
    // Formats are not checked here: the example elides its ids and links.
    let errors = Compiled::new("job", false).errors(&example);
    assert!(errors.is_none(), "{errors:?}");
    let parsed: Message = serde_json::from_value(example).unwrap();
    assert!(matches!(parsed, Message::Job(_)));
}

#[test]
fn every_report_validates_against_its_own_schema_and_the_union() {
    for body in reports() {
        let kind = body.kind();
        let report = serde_json::to_value(Report { id: format!("{kind}-01KBQ4X3T5G7N0Z2M9W8Y6V4R2"), body }).unwrap();
        assert_valid(&format!("report-{kind}"), &report);
        assert_valid("report", &report);
    }
}

#[test]
fn the_union_is_the_reports_inlined() {
    let union = schema("report");
    let types = ["heartbeat", "progress", "log", "usage", "output", "result", "failure"];
    let inlined: Vec<Value> = types
        .iter()
        .map(|t| {
            let mut one = schema(&format!("report-{t}"));
            let one_map = one.as_object_mut().unwrap();
            one_map.remove("$schema");
            one_map.remove("$id");
            one
        })
        .collect();
    assert_eq!(union["oneOf"], Value::Array(inlined), "report.json is out of date with report-<type>.json");
}

#[test]
fn what_the_document_forbids_is_refused() {
    let cases = [
        json!({"id": "a b", "type": "heartbeat"}),
        json!({"id": "x".repeat(65), "type": "heartbeat"}),
        json!({"id": "r", "type": "heartbeat", "extra": 1}),
        json!({"id": "r", "type": "progress", "fraction": 1.5}),
        json!({"id": "r", "type": "progress", "fraction": 0.5, "message": "m".repeat(501)}),
        json!({"id": "r", "type": "log", "line": "l".repeat(2_001)}),
        json!({"id": "r", "type": "usage", "used": -1}),
        json!({"id": "r", "type": "output", "name": "../etc", "size": 1, "content_type": "text/csv",
               "sha256": "0f".repeat(32)}),
        json!({"id": "r", "type": "output", "name": "top.csv", "size": 1, "content_type": "text/csv"}),
        json!({"id": "r", "type": "output", "name": "top.csv", "size": 1, "content_type": "text/csv",
               "sha256": "abc"}),
        json!({"id": "r", "type": "result", "result": [1]}),
        json!({"id": "r", "type": "failure", "message": "no retryable"}),
        json!({"id": "r", "type": "sideways"}),
    ];
    for report in &cases {
        assert_invalid("report", report);
    }
}

#[test]
fn answers_validate() {
    let upload = OutputUpload {
        url: "https://s3.example.com/out?X-Amz-Signature=abc".into(),
        method: "PUT".into(),
        headers: BTreeMap::from([("content-type".into(), "text/csv".into())]),
        expires_at: datetime!(2026-12-06 11:00 UTC),
    };
    let upload = serde_json::to_value(upload).unwrap();
    assert_valid("answer-output", &upload);
    assert_valid("answer-recorded", &upload);
    assert_valid("answer-recorded", &json!({}));
    for code in ["invalid_report", "invalid_report_token", "superseded", "canceled", "ended", "too_large"] {
        let error =
            ErrorAnswer { error: ErrorBody { code: code.into(), message: "m".into(), request_id: Some("r".into()) } };
        assert_valid("answer-error", &serde_json::to_value(error).unwrap());
    }
    assert_invalid(
        "answer-output",
        &json!({"url": "https://x", "method": "POST", "headers": {}, "expires_at": "2026-12-06T11:00:00Z"}),
    );
}
