//! `template.yaml` against the code it deploys. Most checks read the
//! template as text, by its (consistent, two-space) indentation; the rules
//! that span resources (`rules`) read it as YAML (`model`).
//!
//! - every function in the template has a crate under `functions/` and an
//!   event under `events/`, and vice versa, and `scripts/sam-check.sh`
//!   invokes each function with each of its events;
//! - the environment variable names the template sets are exactly the names
//!   the code reads;
//! - the bucket policy is exactly `storage_policy`'s statements;
//! - every route a router serves has its `HttpApi` event on the function
//!   that runs that router, and no event lacks a handler (`routes`);
//! - the queue, worker, API and relay settings the design depends on.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use reeve_shared::storage_policy::{self, PolicyParams, Rule};
use serde_json::Value;

/// The template parsed as YAML, for the rules that span resources.
mod model;
/// The template's routes against the routers'.
mod routes;
/// AWS's deploy-time rules.
mod rules;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn template() -> String {
    read("template.yaml")
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The lines of the top-level section `name:` (e.g. `Resources`).
fn section<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!("{name}:");
    text.lines()
        .skip_while(|l| l.trim_end() != header)
        .skip(1)
        .take_while(|l| l.trim().is_empty() || l.starts_with(' ') || l.starts_with('#'))
        .collect()
}

/// The entries of a section, split at two-space indentation: name → body.
fn entries(lines: &[&str]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in lines {
        if indent(line) == 2 && line.trim_end().ends_with(':') && !line.trim_start().starts_with('#') {
            if let Some((name, body)) = current.take() {
                out.insert(name, body);
            }
            current = Some((line.trim().trim_end_matches(':').to_owned(), String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((name, body)) = current {
        out.insert(name, body);
    }
    out
}

fn resources() -> BTreeMap<String, String> {
    entries(&section(&template(), "Resources"))
}

/// The value of the first `key: value` line (any indentation) in `body`.
fn value_of<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    let prefix = format!("{key}:");
    body.lines().map(str::trim).find_map(|l| l.strip_prefix(&prefix)).map(|v| v.trim().trim_matches('"'))
}

/// The workspace's examples the template can deploy beside Reeve (each
/// under a condition, off by default): logical id → binary, built from
/// `examples/<binary>`. They are services Reeve sells, not Reeve: no
/// start-up path, no secrets, no event files.
const EXAMPLE_FUNCTIONS: &[(&str, &str)] = &[("WordfreqFunction", "wordfreq")];

/// Reeve's own template functions: logical id → binary.
fn template_functions() -> BTreeMap<String, String> {
    resources()
        .into_iter()
        .filter(|(name, _)| !EXAMPLE_FUNCTIONS.iter().any(|(example, _)| example == name))
        .filter(|(_, body)| value_of(body, "Type") == Some("AWS::Serverless::Function"))
        .map(|(name, body)| {
            assert_eq!(value_of(&body, "BuildMethod"), Some("rust-cargolambda"), "{name}: BuildMethod");
            let binary = value_of(&body, "Binary").unwrap_or_else(|| panic!("{name} has no Binary")).to_owned();
            (name, binary)
        })
        .collect()
}

/// Crates under `functions/` that run as Lambdas: binary name → crate dir.
/// (`functions/relay` is the Fargate relay, not a Lambda.)
fn lambda_crates() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(root().join("functions")).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(main) = fs::read_to_string(dir.join("src/main.rs")) else { continue };
        if !main.contains("lambda_http::run") && !main.contains("lambda_runtime::run") {
            continue;
        }
        let manifest = fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let bin = manifest
            .split("[[bin]]")
            .nth(1)
            .and_then(|s| {
                s.lines().find_map(|l| l.trim().strip_prefix("name").and_then(|v| v.trim().strip_prefix('=')))
            })
            .map(|v| v.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| panic!("{} has no [[bin]] name", dir.display()));
        out.insert(bin, dir.file_name().unwrap().to_string_lossy().into_owned());
    }
    out
}

/// Event files by the source they imitate, for the functions no route names.
const EVENT_SOURCES: &[(&str, &str)] = &[("sqs-", "worker"), ("s3-", "upload-guard")];

fn event_stems() -> BTreeSet<String> {
    fs::read_dir(root().join("events"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().unwrap().strip_suffix(".json").map(str::to_owned))
        .collect()
}

/// The binary an event file belongs to: `auth-open-session` → `auth`,
/// `task-create` → `task-create`, `sqs-digest` → `worker`.
fn function_of_event(stem: &str, binaries: &BTreeSet<String>) -> Option<String> {
    if let Some((_, f)) = EVENT_SOURCES.iter().find(|(prefix, _)| stem.starts_with(prefix)) {
        return Some((*f).to_owned());
    }
    binaries
        .iter()
        .filter(|b| stem == b.as_str() || stem.starts_with(&format!("{b}-")))
        .max_by_key(|b| b.len())
        .cloned()
}

#[test]
fn every_function_has_a_crate_and_an_event_and_back() {
    let functions = template_functions();
    let binaries: BTreeSet<String> = functions.values().cloned().collect();
    assert_eq!(functions.len(), binaries.len(), "two template functions build the same binary: {functions:?}");
    let crates = lambda_crates();
    let crate_bins: BTreeSet<String> = crates.keys().cloned().collect();
    assert_eq!(binaries, crate_bins, "template functions (left) and Lambda crates under functions/ (right) differ");
    for (bin, dir) in &crates {
        assert_eq!(bin, dir, "functions/{dir} builds `{bin}`: name the crate directory after its binary");
    }
    let events = event_stems();
    for bin in &binaries {
        assert!(
            events.iter().any(|e| function_of_event(e, &binaries).as_deref() == Some(bin)),
            "{bin} has no event in events/"
        );
    }
    for event in &events {
        assert!(function_of_event(event, &binaries).is_some(), "events/{event}.json belongs to no template function");
    }
}

#[test]
fn sam_check_invokes_every_function_with_every_event() {
    let script = read("scripts/sam-check.sh");
    let functions = template_functions();
    let binaries: BTreeSet<String> = functions.values().cloned().collect();
    let table: Vec<(String, String, String)> = script
        .lines()
        .map(str::trim)
        .skip_while(|l| *l != "INVOKES=(")
        .take_while(|l| *l != ")")
        .filter(|l| l.starts_with('"'))
        .map(|l| {
            let fields: Vec<&str> = l.trim_matches('"').split_whitespace().collect();
            assert_eq!(fields.len(), 3, "bad INVOKES line {l}");
            (fields[0].to_owned(), fields[1].to_owned(), fields[2].to_owned())
        })
        .collect();
    let invoked: BTreeSet<&String> = table.iter().map(|(f, ..)| f).collect();
    let declared: BTreeSet<&String> = functions.keys().collect();
    assert_eq!(invoked, declared, "sam-check.sh INVOKES (left) and the template's functions (right) differ");
    let invoked_events: BTreeSet<String> = table.iter().map(|(_, e, _)| e.clone()).collect();
    assert_eq!(invoked_events, event_stems(), "sam-check.sh INVOKES (left) and events/ (right) differ");
    for (function, event, expect) in &table {
        let bin = &functions[function];
        assert_eq!(function_of_event(event, &binaries).as_ref(), Some(bin), "{event} is not {function}'s event");
        assert!(expect == "ok" || expect.parse::<u16>().is_ok(), "{function} {event}: expectation {expect}");
    }
}

/// Names the code reads that the template leaves alone, and why.
const NOT_SET_BY_THE_TEMPLATE: &[(&str, &str)] = &[
    ("REEVE_LOG_FORMAT", "Lambda and Fargate always log JSON"),
    ("REEVE_OUTBOUND_ALLOW_HTTP", "a development setting: production is HTTPS-only"),
    ("REEVE_FETCH_ALLOW", "the users' allow-list: empty in production"),
    ("REEVE_PEPPER", "a development value: auth is given REEVE_PEPPER_SECRET_ARN"),
    ("REEVE_EDGE_SECRET", "auth and mcp are given REEVE_EDGE_SECRET_ARN, and only behind the edge"),
    ("REEVE_RECEIPT_KEY", "task create, task status and mcp are given REEVE_RECEIPT_KEY_SECRET_ARN, when signing"),
    ("REEVE_FACILITATOR_URL", "the local stack's override: production uses the catalog's facilitator_url"),
    ("REEVE_BATCH_AUTHORIZER_KEY", "the sweeper and task create are given REEVE_BATCH_AUTHORIZER_KEY_SECRET_ARN"),
    ("REEVE_BATCH_CLAIM_AFTER_SECONDS", "batch-settlement claims: the default (an hour) stands"),
    // The `reeve` client's, named in settings.rs beside the servers' ones:
    // read by the CLI on a user's machine, never by a deployed function.
    ("REEVE_ENDPOINT", "the client's: the deployment it talks to"),
    ("REEVE_RELAY", "the client's: the relay it follows tasks on"),
    ("REEVE_PROFILE", "the client's: its credentials profile"),
    ("REEVE_SPACE_ID", "the client's: the Space `reeve login` opens"),
    ("REEVE_TOKEN", "the client's: a session token for `reeve task watch`"),
    ("REEVE_WALLET_KEY", "the client's: the payer's key, on the payer's machine only"),
];

/// Environment variable names the code reads: every string literal that is
/// such a name, outside tests, in `shared/src` and the function crates.
fn names_read_by_the_code() -> BTreeSet<String> {
    let mut files = Vec::new();
    let mut dirs = vec![root().join("shared/src")];
    for entry in fs::read_dir(root().join("functions")).unwrap() {
        dirs.push(entry.unwrap().path().join("src"));
    }
    while let Some(dir) = dirs.pop() {
        let Ok(listing) = fs::read_dir(&dir) else { continue };
        for entry in listing {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut names = BTreeSet::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for literal in code.split('"').skip(1).step_by(2) {
            let is_name = literal.starts_with("REEVE_") || literal == "DATABASE_URL" || literal == "REDIS_URL";
            if is_name && literal.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
                names.insert(literal.to_owned());
            }
        }
    }
    names
}

/// Names the template sets: Lambda `Variables:` keys and ECS `- Name:`s.
fn names_set_by_the_template() -> BTreeSet<String> {
    let text = template();
    let mut names = BTreeSet::new();
    let mut in_variables: Option<usize> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(depth) = in_variables {
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if indent(line) > depth {
                if let Some((key, _)) = trimmed.split_once(':') {
                    names.insert(key.trim().to_owned());
                }
                continue;
            }
            in_variables = None;
        }
        if trimmed == "Variables:" {
            in_variables = Some(indent(line));
        } else if let Some(name) = trimmed.strip_prefix("- Name:") {
            let name = name.trim();
            if name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

#[test]
fn the_template_sets_exactly_the_variables_the_code_reads() {
    let read_by_code = names_read_by_the_code();
    for required in ["REEVE_PEPPER", "REEVE_TOKEN_KEY", "DATABASE_URL", "REDIS_URL", "REEVE_BUCKET", "REEVE_QUEUE_URL"]
    {
        assert!(read_by_code.contains(required), "the scan missed {required}: {read_by_code:?}");
    }
    let exempt: BTreeSet<String> = NOT_SET_BY_THE_TEMPLATE.iter().map(|(n, _)| n.to_string()).collect();
    for name in &exempt {
        assert!(read_by_code.contains(name), "{name} is exempt but no code reads it any more");
    }
    let expected: BTreeSet<String> = read_by_code.difference(&exempt).cloned().collect();
    let set = names_set_by_the_template();
    let missing: Vec<&String> = expected.difference(&set).collect();
    let unknown: Vec<&String> = set.difference(&expected).collect();
    assert!(missing.is_empty(), "read by the code but never set by template.yaml: {missing:?}");
    assert!(unknown.is_empty(), "set by template.yaml but read by no code (typo?): {unknown:?}");
}

#[test]
fn the_settings_constants_are_all_set() {
    // settings.rs is the config loader: each of its names must be in the template.
    let settings = read("shared/src/startup/settings.rs");
    let set = names_set_by_the_template();
    for line in settings.lines().filter(|l| l.starts_with("pub const") && l.contains("&str")) {
        let Some(name) = line.split('"').nth(1) else { continue }; // a table of names, not a name
        if name.ends_with(".toml") {
            continue; // DEFAULT_CATALOG, a file name
        }
        if !(name.starts_with("REEVE_") || name == "DATABASE_URL" || name == "REDIS_URL") {
            continue; // a standard variable the client reads (XDG_CONFIG_HOME)
        }
        if NOT_SET_BY_THE_TEMPLATE.iter().any(|(exempt, _)| *exempt == name) {
            continue;
        }
        assert!(set.contains(name), "settings.rs reads {name}; template.yaml never sets it");
    }
}

/// `{"Fn::Sub": "…"}` with the template's values substituted.
fn substitute(value: &mut Value, vars: &BTreeMap<&str, &str>) {
    match value {
        Value::Object(map) if map.len() == 1 && map.contains_key("Fn::Sub") => {
            let mut text = map["Fn::Sub"].as_str().expect("Fn::Sub of a string").to_owned();
            for (name, v) in vars {
                text = text.replace(&format!("${{{name}}}"), v);
            }
            assert!(!text.contains("${"), "unsubstituted variable in {text}");
            *value = Value::String(text);
        }
        Value::Object(map) => map.values_mut().for_each(|v| substitute(v, vars)),
        Value::Array(items) => items.iter_mut().for_each(|v| substitute(v, vars)),
        _ => {}
    }
}

/// The JSON object after `key:` in `body` (matching braces).
fn json_after(body: &str, key: &str) -> Value {
    let start = body.find(&format!("{key}:")).unwrap_or_else(|| panic!("no {key}"));
    let open = start + body[start..].find('{').unwrap();
    let mut depth = 0;
    let mut in_string = false;
    for (i, c) in body[open..].char_indices() {
        match c {
            '"' => in_string = !in_string,
            '{' if !in_string => depth += 1,
            '}' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    let json = &body[open..=open + i];
                    return serde_json::from_str(json).unwrap_or_else(|e| panic!("{key} is not strict JSON: {e}"));
                }
            }
            _ => {}
        }
    }
    panic!("{key}: unbalanced braces")
}

#[test]
fn the_bucket_policy_is_storage_policy_s() {
    let resources = resources();
    let body = &resources["UploadBucketPolicy"];
    let mut policy = json_after(body, "PolicyDocument");
    let parameters = entries(&section(&template(), "Parameters"));
    let upload_prefix = value_of(&parameters["UploadPrefix"], "Default").unwrap().to_owned();
    let vars = BTreeMap::from([
        ("AWS::Partition", "aws"),
        ("UploadBucket", "reeve-test-bucket"),
        ("UploadPrefix", upload_prefix.as_str()),
    ]);
    substitute(&mut policy, &vars);
    let params = PolicyParams { upload_prefix: upload_prefix.clone(), ..PolicyParams::new("reeve-test-bucket") };
    let generated = storage_policy::document(&params, &Rule::ALL).unwrap();
    assert_eq!(policy, generated, "template.yaml's bucket policy and storage_policy::document differ");
    let uses_size_key = template()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .any(|l| l.to_ascii_lowercase().contains("s3:content-length"));
    assert!(!uses_size_key, "S3 has no s3:content-length condition key");
}

#[test]
fn queue_worker_api_and_relay_settings() {
    let resources = resources();
    let worker = &resources["WorkerFunction"];
    let queue = &resources["TaskQueue"];
    let timeout: u64 = value_of(worker, "Timeout").unwrap().parse().unwrap();
    let visibility: u64 = value_of(queue, "VisibilityTimeout").unwrap().parse().unwrap();
    assert!(visibility >= 6 * timeout, "VisibilityTimeout {visibility} < 6 x worker Timeout {timeout}");
    assert!(worker.contains("FunctionResponseTypes: [ReportBatchItemFailures]"));
    let max_receives = value_of(queue, "maxReceiveCount").unwrap();
    assert_eq!(value_of(worker, "REEVE_MAX_RECEIVES"), Some(max_receives), "the worker must know maxReceiveCount");
    assert!(queue.contains("deadLetterTargetArn: !GetAtt TaskDeadLetterQueue.Arn"));

    // The `$default` stage: a named one breaks every route (docs/local-lambda.md).
    assert!(value_of(&resources["HttpApi"], "StageName").is_none(), "keep the HTTP API on $default");
    for route in ["POST /v1/spaces", "POST /v1/sessions"] {
        assert!(resources["HttpApi"].contains(&format!("\"{route}\":")), "no throttling for {route}");
    }

    let guard = &resources["UploadGuardFunction"];
    assert!(guard.contains("Events: s3:ObjectCreated:*") && guard.contains("Value: !Ref UploadPrefix"));
    let bucket = &resources["UploadBucket"];
    assert_eq!(value_of(bucket, "ExpirationInDays"), Some("1"));
    assert_eq!(value_of(bucket, "Prefix"), Some("!Ref UploadPrefix"));

    let lb = &resources["RelayLoadBalancer"];
    let idle: u64 = lb
        .lines()
        .skip_while(|l| !l.contains("idle_timeout.timeout_seconds"))
        .find_map(|l| value_of(l, "Value"))
        .unwrap()
        .parse()
        .unwrap();
    let keepalive: u64 = template()
        .lines()
        .skip_while(|l| !l.contains("REEVE_KEEPALIVE_SECONDS"))
        .find_map(|l| value_of(l, "Value"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(idle > keepalive, "ALB idle timeout {idle}s must exceed the SSE keep-alive {keepalive}s");
    assert_eq!(value_of(&resources["RelayTargetGroup"], "HealthCheckPath"), Some("/healthz"));
}

#[test]
fn the_catalog_layer_ships_reeve_toml() {
    let resources = resources();
    let layer = &resources["CatalogLayer"];
    let dir = value_of(layer, "ContentUri").unwrap();
    let shipped = fs::read_to_string(root().join(dir).join("reeve.toml")).expect("the layer holds reeve.toml");
    assert_eq!(shipped, read("reeve.toml"), "{dir}reeve.toml must be the repository's reeve.toml");
    let globals = section(&template(), "Globals").join("\n");
    assert_eq!(value_of(&globals, "REEVE_CATALOG"), Some("/opt/reeve.toml"), "a layer is unpacked under /opt");
    assert!(globals.contains("Layers: [!Ref CatalogLayer]"));
    assert_eq!(value_of(&globals, "Runtime"), Some("provided.al2023"));
    assert_eq!(
        value_of(&globals, "CodeUri"),
        Some("."),
        "one workspace, one target directory (docs/architecture.md#deployment)"
    );
}

/// The template parameters that name secrets, and the one secret the stack
/// makes itself (the CloudFront edge's origin secret, when the edge is on).
const SECRET_PARAMETERS: [&str; 6] = [
    "DatabaseUrlSecretArn",
    "PepperSecretArn",
    "TokenKeySecretArn",
    "ApiEdgeSecret",
    "ReceiptKeySecretArn",
    "BatchAuthorizerKeySecretArn",
];

/// Which resource may read which secret. Only `auth` reads the pepper;
/// `auth`, the routes behind a session (uploads, tasks) and the relay read
/// the token key; the catalog reads nothing. A new function must be added
/// here, with the secrets it needs and no others.
const SECRET_READERS: &[(&str, &[&str])] = &[
    // auth and mcp spend the login budgets: behind the edge they read its
    // secret, to believe the viewer address CloudFront sends.
    ("AuthFunction", &["ApiEdgeSecret", "DatabaseUrlSecretArn", "PepperSecretArn", "TokenKeySecretArn"]),
    ("CatalogFunction", &[]),
    ("PresignFunction", &["DatabaseUrlSecretArn", "TokenKeySecretArn"]),
    // Task create, task status and mcp sign offers and receipts, when the
    // seller's key is given; task create answers a channel's cooperative
    // refund with the receiver authorizer's.
    (
        "TaskCreateFunction",
        &["BatchAuthorizerKeySecretArn", "DatabaseUrlSecretArn", "ReceiptKeySecretArn", "TokenKeySecretArn"],
    ),
    ("TaskStatusFunction", &["DatabaseUrlSecretArn", "ReceiptKeySecretArn", "TokenKeySecretArn"]),
    // create_space and login hash and verify Space IDs.
    (
        "McpFunction",
        &["ApiEdgeSecret", "DatabaseUrlSecretArn", "PepperSecretArn", "ReceiptKeySecretArn", "TokenKeySecretArn"],
    ),
    // CloudFront sends the edge's secret as an origin header.
    ("ApiDistribution", &["ApiEdgeSecret"]),
    // A protocol kind's job carries a report token, signed with the token key.
    ("WorkerFunction", &["DatabaseUrlSecretArn", "TokenKeySecretArn"]),
    ("UploadGuardFunction", &["DatabaseUrlSecretArn"]),
    // It claims batch-settlement vouchers with the receiver authorizer's key.
    ("SweeperFunction", &["BatchAuthorizerKeySecretArn", "DatabaseUrlSecretArn"]),
    // The relay's secrets are injected by ECS with its execution role.
    ("RelayExecutionRole", &["DatabaseUrlSecretArn", "TokenKeySecretArn"]),
    ("RelayTaskDefinition", &["DatabaseUrlSecretArn", "TokenKeySecretArn"]),
];

/// The variable each secret's ARN is handed in (settings.rs).
fn arn_variable(parameter: &str) -> &'static str {
    match parameter {
        "DatabaseUrlSecretArn" => "REEVE_DATABASE_URL_SECRET_ARN",
        "PepperSecretArn" => "REEVE_PEPPER_SECRET_ARN",
        "TokenKeySecretArn" => "REEVE_TOKEN_KEY_SECRET_ARN",
        "ApiEdgeSecret" => "REEVE_EDGE_SECRET_ARN",
        "ReceiptKeySecretArn" => "REEVE_RECEIPT_KEY_SECRET_ARN",
        "BatchAuthorizerKeySecretArn" => "REEVE_BATCH_AUTHORIZER_KEY_SECRET_ARN",
        other => panic!("{other} is not a secret parameter"),
    }
}

/// The secret parameters a resource's body mentions.
fn secrets_in(body: &str) -> BTreeSet<&'static str> {
    let code: String = body.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
    SECRET_PARAMETERS
        .into_iter()
        .filter(|p| code.contains(&format!("!Ref {p}")) || code.contains(&format!("${{{p}}}")))
        .collect()
}

fn expected_readers() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    SECRET_READERS.iter().map(|(name, secrets)| (*name, secrets.iter().copied().collect())).collect()
}

#[test]
fn each_function_reads_only_its_own_secrets_by_arn() {
    let text = template();
    let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
    // A dynamic reference writes the secret's value into the resource's
    // configuration: never a function's. The one allowed is the edge's
    // origin header, which CloudFront must send as a value.
    let resolved: Vec<&&str> = code.iter().filter(|l| l.contains("{{resolve:")).collect();
    assert_eq!(
        resolved.iter().map(|l| l.trim()).collect::<Vec<_>>(),
        [r#"HeaderValue: !Sub "{{resolve:secretsmanager:${ApiEdgeSecret}:SecretString}}""#],
        "a dynamic reference writes the secret's value into the configuration of what holds it"
    );
    assert!(resources()["ApiDistribution"].contains("{{resolve:"), "the one dynamic reference is CloudFront's");
    let globals = section(&text, "Globals").join("\n");
    assert!(secrets_in(&globals).is_empty(), "Globals gives every function a secret: {:?}", secrets_in(&globals));

    let expected = expected_readers();
    let functions = template_functions();
    for (name, body) in resources() {
        let found = secrets_in(&body);
        let is_function = functions.contains_key(&name);
        let Some(want) = expected.get(name.as_str()) else {
            assert!(!is_function, "{name} is a new function: add it to SECRET_READERS with the secrets it needs");
            assert!(found.is_empty(), "{name} names secrets {found:?} but is not in SECRET_READERS");
            continue;
        };
        assert_eq!(&found, want, "{name} names the wrong secrets");
        if is_function {
            // The ARN (never the value) in the configuration, and a grant for
            // exactly these secrets.
            for parameter in want {
                // The edge's secret exists only with the edge.
                let line = match *parameter {
                    "ApiEdgeSecret" => {
                        format!("{}: !If [ApiHasWaf, !Ref {parameter}, !Ref AWS::NoValue]", arn_variable(parameter))
                    }
                    // The seller's key only where one is given.
                    "ReceiptKeySecretArn" => {
                        format!("{}: !If [HasReceiptKey, !Ref {parameter}, !Ref AWS::NoValue]", arn_variable(parameter))
                    }
                    // The authorizer's key only where vouchers are claimed.
                    "BatchAuthorizerKeySecretArn" => format!(
                        "{}: !If [HasBatchAuthorizerKey, !Ref {parameter}, !Ref AWS::NoValue]",
                        arn_variable(parameter)
                    ),
                    _ => format!("{}: !Ref {parameter}", arn_variable(parameter)),
                };
                assert!(body.contains(&line), "{name} lacks `{line}`");
            }
            let grants = body.contains("Action: secretsmanager:GetSecretValue");
            assert_eq!(grants, !want.is_empty(), "{name}: secretsmanager:GetSecretValue iff it has secrets");
        }
    }
    let pepper_readers: Vec<&str> =
        expected.iter().filter(|(_, s)| s.contains("PepperSecretArn")).map(|(n, _)| *n).collect();
    assert_eq!(pepper_readers, ["AuthFunction", "McpFunction"], "only auth and mcp read the pepper");

    // The relay's container gets the token key and the database URL, by ARN.
    let task = &resources()["RelayTaskDefinition"];
    let injected: Vec<&str> = task
        .lines()
        .skip_while(|l| l.trim() != "Secrets:")
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("- Name:") || l.trim_start().starts_with("ValueFrom:"))
        .filter_map(|l| l.trim().strip_prefix("- Name:").map(str::trim))
        .collect();
    assert_eq!(injected, ["REEVE_TOKEN_KEY", "DATABASE_URL"]);
}

/// The seller's key in KMS (`ReceiptKmsKeyArn`): the three functions that
/// sign offers and receipts are given its ARN and may use that key alone,
/// only to read its public half and sign; nothing else touches KMS.
#[test]
fn only_the_signers_may_use_the_receipt_kms_key() {
    let signers = ["McpFunction", "TaskCreateFunction", "TaskStatusFunction"];
    let grant = "- HasReceiptKmsKey
              - Effect: Allow
                Action: [kms:GetPublicKey, kms:Sign]
                Resource: !Ref ReceiptKmsKeyArn
              - !Ref AWS::NoValue";
    let variable = "REEVE_RECEIPT_KMS_KEY_ID: !If [HasReceiptKmsKey, !Ref ReceiptKmsKeyArn, !Ref AWS::NoValue]";
    let mut found = Vec::new();
    for (name, body) in resources() {
        let code: String = body.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n");
        if !code.contains("kms:") && !code.contains("ReceiptKmsKeyArn") {
            continue;
        }
        assert!(signers.contains(&name.as_str()), "{name} names KMS or the receipt key");
        assert_eq!(code.matches("kms:").count(), 2, "{name}: kms:GetPublicKey and kms:Sign, once");
        assert!(code.contains(grant), "{name} lacks the conditional grant on the key alone:\n{grant}");
        assert!(code.contains(variable), "{name} lacks `{variable}`");
        found.push(name);
    }
    assert_eq!(found, signers);
    // One key or the other, refused by the stack before anything is made.
    let rules = section(&template(), "Rules").join("\n");
    assert!(rules.contains("Assert: !Equals [!Ref ReceiptKeySecretArn, \"\"]"), "no rule refuses both keys");
}

#[test]
fn each_lambda_asks_the_start_up_path_for_what_the_template_grants() {
    let expected = expected_readers();
    let crates = lambda_crates();
    for (function, binary) in template_functions() {
        let main = read(&format!("functions/{}/src/main.rs", crates[&binary]));
        // Each start-up builder reads these secrets (shared/src/startup/mod.rs).
        let asks: BTreeSet<&str> = if main.contains("startup::lambda_auth()") {
            ["ApiEdgeSecret", "DatabaseUrlSecretArn", "PepperSecretArn", "TokenKeySecretArn"].into()
        } else if main.contains("startup::lambda_mcp()") {
            // Plus the seller's key: it signs offers and receipts.
            ["ApiEdgeSecret", "DatabaseUrlSecretArn", "PepperSecretArn", "ReceiptKeySecretArn", "TokenKeySecretArn"]
                .into()
        } else if main.contains("startup::lambda_presign()") {
            ["DatabaseUrlSecretArn", "TokenKeySecretArn"].into()
        } else if main.contains("startup::lambda_task_create()") {
            // Plus the key a channel's cooperative refund is signed with.
            ["BatchAuthorizerKeySecretArn", "DatabaseUrlSecretArn", "ReceiptKeySecretArn", "TokenKeySecretArn"].into()
        } else if main.contains("startup::lambda_task_status()") {
            ["DatabaseUrlSecretArn", "ReceiptKeySecretArn", "TokenKeySecretArn"].into()
        } else if main.contains("startup::lambda_catalog()") {
            BTreeSet::new()
        } else if main.contains("startup::lambda_worker()") {
            // A protocol kind's report token is signed with the token key.
            ["DatabaseUrlSecretArn", "TokenKeySecretArn"].into()
        } else if main.contains("startup::lambda_guard()") {
            ["DatabaseUrlSecretArn"].into()
        } else if main.contains("startup::lambda_sweeper()") {
            // Plus the key it claims batch-settlement vouchers with.
            ["BatchAuthorizerKeySecretArn", "DatabaseUrlSecretArn"].into()
        } else {
            panic!("{binary}'s main does not start through reeve_shared::startup");
        };
        assert_eq!(&asks, &expected[function.as_str()], "{function}: the code and the template disagree");
    }
}

#[test]
fn list_bucket_is_scoped_to_prefixes() {
    let mut seen = 0;
    for (name, body) in resources() {
        let lines: Vec<&str> = body.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() != "Action: s3:ListBucket" {
                continue;
            }
            seen += 1;
            let statement: Vec<&str> =
                lines[i + 1..].iter().take_while(|l| !l.trim_start().starts_with("- Effect:")).copied().collect();
            let statement = statement.join("\n");
            assert!(
                statement.contains("StringLike:") && statement.contains("s3:prefix:"),
                "{name}: unscoped s3:ListBucket"
            );
            assert!(!statement.contains("s3:prefix: \"*\""), "{name}: s3:prefix * lists everything");
        }
    }
    assert!(seen >= 3, "the worker, the guard and task-create need ListBucket for a HEAD's 404");
}

#[test]
fn the_relay_is_https_unless_a_test_stack_says_otherwise() {
    let text = template();
    let parameters = entries(&section(&text, "Parameters"));
    assert_eq!(value_of(&parameters["AllowInsecureRelay"], "Default"), Some("false"));
    let rules = entries(&section(&text, "Rules"));
    let rule = &rules["RelayNeedsCertificate"];
    assert!(rule.contains("RuleCondition: !Equals [!Ref AllowInsecureRelay, \"false\"]"), "{rule}");
    assert!(rule.contains("Assert: !Not [!Equals [!Ref RelayCertificateArn, \"\"]]"), "{rule}");

    let resources = resources();
    let listener = &resources["RelayListener"];
    assert!(listener.contains("Protocol: !If [RelayHasCertificate, HTTPS, HTTP]"));
    assert!(listener.contains("Port: !If [RelayHasCertificate, 443, 80]"));
    let redirect = &resources["RelayRedirectListener"];
    assert_eq!(value_of(redirect, "Condition"), Some("RelayHasCertificate"));
    assert_eq!(value_of(redirect, "Port"), Some("80"));
    assert_eq!(value_of(redirect, "Type"), Some("AWS::ElasticLoadBalancingV2::Listener"));
    assert!(redirect.contains("- Type: redirect") && redirect.contains("Protocol: HTTPS"));
    assert_eq!(value_of(redirect, "StatusCode"), Some("HTTP_301"));
}

#[test]
fn the_optional_waf_limits_login_per_ip() {
    let text = template();
    let parameters = entries(&section(&text, "Parameters"));
    assert_eq!(value_of(&parameters["ApiLoginRateLimitPerIp"], "Default"), Some("0"), "off unless asked for");
    let conditions = section(&text, "Conditions").join("\n");
    assert!(conditions.contains("ApiHasWaf: !Not [!Equals [!Ref ApiLoginRateLimitPerIp, 0]]"));
    let rules = entries(&section(&text, "Rules"));
    assert!(rules["ApiWafNeedsUsEast1"].contains("Assert: !Equals [!Ref AWS::Region, us-east-1]"));

    let resources = resources();
    let acl = &resources["ApiWebAcl"];
    assert_eq!(value_of(acl, "Condition"), Some("ApiHasWaf"));
    assert_eq!(value_of(acl, "Scope"), Some("CLOUDFRONT"), "HTTP APIs take no web ACL: CloudFront carries it");
    assert_eq!(value_of(acl, "Limit"), Some("!Ref ApiLoginRateLimitPerIp"));
    assert_eq!(value_of(acl, "AggregateKeyType"), Some("IP"), "per client, not global");
    assert_eq!(value_of(acl, "ResponseCode"), Some("429"));
    let login = acl.split("- Name: LoginPerIp").nth(1).unwrap().split("\n        - Name:").next().unwrap();
    for path in ["/v1/spaces", "/v1/sessions", "/v1/space/rotate", "/mcp"] {
        assert!(login.contains(&format!("SearchString: {path}")), "{path} is not limited");
    }
    // On /mcp, the calls of the two tools that make Spaces and sessions.
    for tool in ["create_space", "login"] {
        assert!(login.contains(&format!(r#"SearchString: '"{tool}"'"#)), "MCP's {tool} is not limited:\n{login}");
    }
    let distribution = &resources["ApiDistribution"];
    assert_eq!(value_of(distribution, "Condition"), Some("ApiHasWaf"));
    assert_eq!(value_of(distribution, "WebACLId"), Some("!GetAtt ApiWebAcl.Arn"));
    assert_eq!(value_of(distribution, "OriginProtocolPolicy"), Some("https-only"));
    let outputs = entries(&section(&text, "Outputs"));
    assert!(outputs["ApiUrl"].contains("${ApiDistribution.DomainName}"), "clients are pointed at the WAF'd URL");
}

#[test]
fn the_optional_waf_limits_space_creation_per_ip_apart() {
    let text = template();
    let parameters = entries(&section(&text, "Parameters"));
    assert_eq!(value_of(&parameters["ApiSpacesPerIp"], "MinValue"), Some("10"), "WAF's floor for a rate rule");
    let acl = &resources()["ApiWebAcl"];
    let rule = acl.split("- Name: SpacesPerIp").nth(1).expect("a rule of its own for space creation");
    let rule = rule.split("\n        - Name:").next().unwrap();
    assert_eq!(value_of(rule, "Limit"), Some("!Ref ApiSpacesPerIp"));
    assert_eq!(value_of(rule, "AggregateKeyType"), Some("IP"), "per source, not global");
    assert_eq!(value_of(rule, "ResponseCode"), Some("429"));
    assert!(rule.contains("SearchString: /v1/spaces") && !rule.contains("/v1/sessions"), "{rule}");
    // Every new Space ID spends it: a rotation, and MCP's create_space.
    assert!(rule.contains("SearchString: /v1/space/rotate"), "{rule}");
    assert!(rule.contains("SearchString: /mcp") && rule.contains(r#"SearchString: '"create_space"'"#), "{rule}");
    assert!(!rule.contains(r#"'"login"'"#), "{rule}");
}

/// Behind the edge, Reeve counts the viewer CloudFront saw, and believes it
/// only beside the edge's secret: a viewer-request function writes the
/// viewer's address into `X-Reeve-Viewer-Address` on every request, the
/// managed AllViewerExceptHostHeader origin request policy forwards it (it
/// forwards viewer headers, a function's among them, but none of
/// CloudFront's own, so `CloudFront-Viewer-Address` would never arrive),
/// and CloudFront adds `X-Reeve-Edge-Secret`, whose value is a secret the
/// stack generates; the two functions that spend the budgets read the same
/// secret by ARN. Without the edge none of it exists.
#[test]
fn behind_the_edge_the_viewer_address_is_forwarded_with_a_secret_the_functions_read() {
    let resources = resources();
    let secret = &resources["ApiEdgeSecret"];
    assert_eq!(value_of(secret, "Type"), Some("AWS::SecretsManager::Secret"));
    assert_eq!(value_of(secret, "Condition"), Some("ApiHasWaf"), "only with the edge");
    assert!(secret.contains("GenerateSecretString:"), "generated, never typed into a parameter:\n{secret}");
    let length: usize = value_of(secret, "PasswordLength").unwrap().parse().unwrap();
    assert!(length >= 32, "REEVE_EDGE_SECRET must be at least 32 bytes; the template makes {length}");

    let distribution = &resources["ApiDistribution"];
    let header = reeve_shared::http::EDGE_SECRET_HEADER;
    let named = distribution
        .lines()
        .find_map(|l| l.trim().trim_start_matches("- ").strip_prefix("HeaderName:"))
        .map(str::trim)
        .expect("an origin custom header");
    assert_eq!(named.to_ascii_lowercase(), header, "CloudFront sends the header the code checks");
    assert_eq!(
        value_of(distribution, "HeaderValue"),
        Some(r#"!Sub "{{resolve:secretsmanager:${ApiEdgeSecret}:SecretString}}"#),
        "its value is the generated secret"
    );
    assert_eq!(
        value_of(distribution, "OriginRequestPolicyId"),
        Some("b689b0a8-53d0-40ab-baf2-68738e2966ac"),
        "AllViewerExceptHostHeader: every viewer header but Host (API Gateway refuses another's)"
    );
    // The function sets the header the code reads, from what CloudFront saw,
    // on every request the distribution forwards, before the origin.
    let function = &resources["ApiViewerAddressFunction"];
    assert_eq!(value_of(function, "Type"), Some("AWS::CloudFront::Function"));
    assert_eq!(value_of(function, "Condition"), Some("ApiHasWaf"), "only with the edge");
    assert_eq!(value_of(function, "AutoPublish"), Some("true"), "live, not left in DEVELOPMENT");
    let header = reeve_shared::http::VIEWER_ADDRESS_HEADER;
    assert_eq!(header, "x-reeve-viewer-address");
    assert!(
        function.contains(&format!("request.headers['{header}'] = {{ value: event.viewer.ip }};")),
        "the function replaces the header with the viewer's address:\n{function}"
    );
    assert!(distribution.contains("- EventType: viewer-request"), "{distribution}");
    assert_eq!(
        value_of(distribution, "FunctionARN"),
        Some("!GetAtt ApiViewerAddressFunction.FunctionMetadata.FunctionARN")
    );

    for function in ["AuthFunction", "McpFunction"] {
        let body = &resources[function];
        let arn = format!(
            "{}: !If [ApiHasWaf, !Ref ApiEdgeSecret, !Ref AWS::NoValue]",
            reeve_shared::settings::EDGE_SECRET_ARN
        );
        assert!(body.contains(&arn), "{function} is not given the edge's secret by ARN");
        let granted = body.lines().skip_while(|l| !l.contains("Action: secretsmanager:GetSecretValue")).take(12);
        assert!(
            granted.clone().any(|l| l.trim() == "- !If [ApiHasWaf, !Ref ApiEdgeSecret, !Ref AWS::NoValue]"),
            "{function} may not read the edge's secret"
        );
    }
    for (name, body) in &resources {
        if !["AuthFunction", "McpFunction", "ApiDistribution", "ApiEdgeSecret"].contains(&name.as_str()) {
            assert!(!body.contains("ApiEdgeSecret"), "{name} has no business with the edge's secret");
        }
    }
}

/// Lambda kills the worker at its `Timeout`. A task's own timeout must fire
/// first, with the margin left to record the outcome; otherwise no record
/// of it is ever claimed. Every function that loads the catalog checks it
/// against `REEVE_WORKER_TIMEOUT_SECONDS`, which must be that `Timeout`.
#[test]
fn every_catalog_task_fits_in_the_worker_timeout() {
    let resources = resources();
    let timeout: u32 = value_of(&resources["WorkerFunction"], "Timeout").unwrap().parse().unwrap();
    let globals = section(&template(), "Globals").join("\n");
    let passed = value_of(&globals, "REEVE_WORKER_TIMEOUT_SECONDS").map(|v| v.trim_matches('"'));
    assert_eq!(passed, Some(timeout.to_string().as_str()), "every function is told the worker's Timeout");
    assert_eq!(timeout, reeve_shared::catalog::DEFAULT_WORKER_TIMEOUT_SECONDS, "the default is the shipped Timeout");
    let catalog = reeve_shared::catalog::Catalog::load_for(&root().join("reeve.toml"), timeout);
    catalog.expect("every task of reeve.toml fits the shipped worker");
    let margin = u64::from(reeve_shared::catalog::RUN_MARGIN_SECONDS);
    assert!(reeve_shared::worker::DEADLINE_MARGIN.as_secs() < margin, "a fresh invocation claims any kind");
}

/// Without a CORS rule on the bucket a browser cannot PUT a presigned
/// upload, so the console would work locally and fail once deployed.
#[test]
fn the_bucket_takes_browser_uploads_from_the_api_s_origins() {
    let resources = resources();
    let bucket = &resources["UploadBucket"];
    let cors: Vec<&str> = bucket.lines().skip_while(|l| !l.contains("CorsConfiguration:")).collect();
    let cors = cors.join("\n");
    assert!(cors.contains("- HasCorsOrigins"), "only when CorsOrigins is set:\n{bucket}");
    assert!(cors.contains(r#"AllowedOrigins: !Split [",", !Ref CorsOrigins]"#), "the API's origins:\n{cors}");
    assert!(cors.contains("AllowedMethods: [PUT, GET]"), "{cors}");
    assert!(cors.contains("content-type"), "the signed content-type may be sent:\n{cors}");
}

/// A shell command of `text` that starts with `start`, its `\` continuations
/// joined, as words.
fn command_words(text: &str, start: &str) -> Vec<String> {
    let lines = text.lines().map(str::trim).skip_while(|l| !l.starts_with(start));
    let mut words = Vec::new();
    for line in lines {
        words.extend(line.trim_end_matches('\\').split_whitespace().map(str::to_owned));
        if !line.ends_with('\\') {
            break;
        }
    }
    assert!(!words.is_empty(), "no `{start}` command");
    words
}

/// CI runs the README's `cargo lambda deploy` (scripts/sam-check.sh's deploy
/// phase, against moto): every option the README gives, with its value.
#[test]
fn sam_check_deploys_with_cargo_lambda_as_the_readme_says() {
    let readme = command_words(&read("README.md"), "cargo lambda deploy");
    let script = command_words(
        &read("scripts/sam-check.sh"),
        "AWS_ENDPOINT_URL=$moto AWS_ENDPOINT_URL_LAMBDA=$moto cargo lambda deploy",
    );
    let options: Vec<(&String, Option<&String>)> = readme
        .iter()
        .enumerate()
        .filter(|(_, w)| w.starts_with("--"))
        .map(|(i, w)| (w, readme.get(i + 1).filter(|v| !v.starts_with("--"))))
        .collect();
    assert!(options.len() >= 4, "{readme:?}");
    for (option, value) in options {
        let at = script.iter().position(|w| w == option).unwrap_or_else(|| panic!("sam-check.sh lacks {option}"));
        if let Some(value) = value.filter(|v| !v.starts_with("reeve-")) {
            assert_eq!(script.get(at + 1), Some(value), "{option}'s value");
        }
    }
}

/// Every function that settles or reconciles a payment proves a lost
/// settlement from the chain: without `REEVE_CHAIN_RPC_URLS` its pending
/// payments never resolve there, although the same payment resolves on
/// another path. The start-up builders that read the endpoints are these.
#[test]
fn every_paying_function_gets_the_chain_endpoints() {
    // Start-up is one module split by binary: read it whole.
    let startup: String = ["mod.rs", "http.rs", "mcp.rs", "worker.rs"]
        .iter()
        .map(|file| read(&format!("shared/src/startup/{file}")))
        .collect::<Vec<_>>()
        .join("\n");
    // The worker proves what a metered task's capture charged.
    let builders = ["lambda_task_create", "lambda_mcp", "lambda_sweeper", "lambda_worker"];
    // Each builder is `or_exit(inner(…))`; the inner one reads them.
    let reads = |builder: &str| {
        let body = startup.split(&format!("pub async fn {builder}()")).nth(1).expect("the builder exists");
        let inner = body.split("or_exit(").nth(1).and_then(|c| c.split('(').next()).expect("or_exit(inner(…))");
        let inner = startup.split(&format!("pub async fn {inner}(")).nth(1).expect("the inner builder exists");
        inner.split("\n}\n").next().unwrap().contains("chain_endpoints(")
    };
    let line = "REEVE_CHAIN_RPC_URLS: !Ref ChainRpcUrls";
    let crates = lambda_crates();
    let resources = resources();
    let mut paying = 0;
    for (function, binary) in template_functions() {
        let main = read(&format!("functions/{}/src/main.rs", crates[&binary]));
        let builder = builders.iter().find(|b| main.contains(&format!("startup::{b}()")));
        let has = resources[&function].lines().any(|l| l.trim() == line);
        match builder {
            Some(builder) => {
                assert!(reads(builder), "{builder} no longer reads the chain endpoints: update this test");
                assert!(has, "{function} settles or reconciles payments but lacks `{line}`");
                paying += 1;
            }
            None => assert!(!has, "{function} is given chain endpoints it never reads"),
        }
    }
    assert_eq!(paying, builders.len(), "task-create, mcp, sweeper and worker are all in the template");
}

/// Task create verifies and settles a payment before it answers. Its
/// `Timeout` ends the invocation a second before API Gateway's 30 s, so the
/// client always gets the function's own answer (`payment_pending` at
/// worst, which a retry resolves) rather than the gateway's bare 503 that
/// would make it sign again; and after the margin kept for storing and
/// queueing, verify plus settle still get at least 20 s.
#[test]
fn task_create_fits_verify_and_settle_inside_api_gateway_s_30_seconds() {
    let timeout: u64 = value_of(&resources()["TaskCreateFunction"], "Timeout").unwrap().parse().unwrap();
    assert_eq!(timeout, 29, "TaskCreateFunction's Timeout");
    let for_the_facilitator = std::time::Duration::from_secs(timeout) - reeve_shared::payments::STORE_MARGIN;
    assert!(
        for_the_facilitator >= std::time::Duration::from_secs(20),
        "{for_the_facilitator:?} for verify plus settle"
    );
}

/// Every `Allow` statement of every function's inline policies, the
/// template resolved for `parameters`: `(function, statement)`.
fn allowed(parameters: &[(&str, &str)]) -> Vec<(String, Value)> {
    let doc = model::Template::load().resolve(parameters);
    let mut out = Vec::new();
    for (name, resource) in doc["Resources"].as_object().unwrap() {
        for policy in resource["Properties"]["Policies"].as_array().into_iter().flatten() {
            for statement in policy["Statement"].as_array().into_iter().flatten() {
                out.push((name.clone(), statement.clone()));
            }
        }
    }
    out
}

/// A `lambda` kind's function is invoked by the worker's role: exactly the
/// functions the operator lists (the catalog's `function = …`), and no
/// function at all by default.
#[test]
fn the_worker_invokes_exactly_the_listed_executor_functions() {
    let invokes = |statement: &Value| {
        let action = &statement["Action"];
        action == "lambda:InvokeFunction"
            || action.as_array().is_some_and(|a| a.iter().any(|x| x == "lambda:InvokeFunction"))
    };
    let by_default: Vec<_> = allowed(&[]).into_iter().filter(|(_, s)| invokes(s)).collect();
    assert!(by_default.is_empty(), "nothing lists a function, nothing may invoke one: {by_default:?}");
    assert!(
        allowed(&[]).iter().all(|(_, s)| !s["Action"].to_string().contains("lambda:")),
        "no other Lambda action is granted"
    );

    let wordfreq = "arn:aws:lambda:us-east-1:123456789012:function:wordfreq";
    let other = "arn:aws:lambda:us-east-1:123456789012:function:pdf";
    let listed = format!("{wordfreq},{other}");
    let granted: Vec<_> =
        allowed(&[("ExecutorFunctionArns", &listed)]).into_iter().filter(|(_, s)| invokes(s)).collect();
    assert_eq!(granted.len(), 1, "{granted:?}");
    let (function, statement) = &granted[0];
    assert_eq!(function, "WorkerFunction", "only the worker invokes a kind's function");
    assert_eq!(statement["Effect"], "Allow");
    assert_eq!(statement["Action"], "lambda:InvokeFunction", "invoke, nothing more");
    // The parameter itself, a list: `!Ref` of it is the listed ARNs, no wildcard.
    assert_eq!(statement["Resource"], serde_json::json!({ "Ref": "ExecutorFunctionArns" }));
    let doc = model::Template::load().resolve(&[]);
    assert_eq!(doc["Parameters"]["ExecutorFunctionArns"]["Type"], "CommaDelimitedList");
    assert_eq!(doc["Parameters"]["ExecutorFunctionArns"]["Default"], "");
}

/// examples/wordfreq deploys only when asked (`DeployWordfreqExample`),
/// built by `sam build` from its own crate like any function, and then the
/// worker may invoke that function and no other beyond the listed ones.
#[test]
fn the_example_deploys_on_request_and_only_the_worker_may_invoke_it() {
    for (name, binary) in EXAMPLE_FUNCTIONS {
        let manifest = read(&format!("examples/{binary}/Cargo.toml"));
        assert!(manifest.contains(&format!("name = \"{binary}\"")), "examples/{binary} builds `{binary}`");
        let body = &resources()[*name];
        assert_eq!(value_of(body, "BuildMethod"), Some("rust-cargolambda"), "{name}");
        assert_eq!(value_of(body, "Binary"), Some(*binary), "{name}");
    }
    let invokes = |statement: &Value| statement["Action"] == "lambda:InvokeFunction";
    let by_default = model::Template::load().resolve(&[]);
    assert!(by_default["Resources"].get("WordfreqFunction").is_none(), "off by default");
    assert!(allowed(&[]).iter().all(|(_, s)| !invokes(s)), "nothing to invoke by default");

    let deployed = model::Template::load().resolve(&[("DeployWordfreqExample", "true")]);
    let function = &deployed["Resources"]["WordfreqFunction"]["Properties"];
    assert_eq!(function["FunctionName"], serde_json::json!({ "Fn::Sub": "reeve-${Stage}-wordfreq" }));
    assert!(function.get("Policies").is_none(), "the job's links and token are all it needs: {function}");
    let granted: Vec<_> =
        allowed(&[("DeployWordfreqExample", "true")]).into_iter().filter(|(_, s)| invokes(s)).collect();
    assert_eq!(granted.len(), 1, "{granted:?}");
    assert_eq!(granted[0].0, "WorkerFunction");
    assert_eq!(granted[0].1["Resource"], serde_json::json!({ "Fn::GetAtt": ["WordfreqFunction", "Arn"] }));
    // With other functions listed too, each grant stays its own.
    let both = allowed(&[
        ("DeployWordfreqExample", "true"),
        ("ExecutorFunctionArns", "arn:aws:lambda:us-east-1:1:function:f"),
    ]);
    assert_eq!(both.iter().filter(|(_, s)| invokes(s)).count(), 2);
    // The timeout fits any kind Lambda can run: its 15 minutes.
    assert_eq!(function["Timeout"], 900);
}

/// An `http` protocol kind's secret kept in Secrets Manager is read by the
/// worker alone, and only the ones the operator lists.
#[test]
fn the_worker_reads_exactly_the_listed_executor_secrets() {
    let reads = |statement: &Value| statement["Action"] == "secretsmanager:GetSecretValue";
    let listed = "arn:aws:secretsmanager:us-east-1:123456789012:secret:reeve/wordfreq-AbCdEf";
    let before: Vec<_> = allowed(&[]).into_iter().filter(|(_, s)| reads(s)).collect();
    let after: Vec<_> = allowed(&[("ExecutorSecretArns", listed)]).into_iter().filter(|(_, s)| reads(s)).collect();
    let new: Vec<_> = after.iter().filter(|grant| !before.contains(grant)).collect();
    assert_eq!(new.len(), 1, "{new:?}");
    assert_eq!(new[0].0, "WorkerFunction");
    assert_eq!(new[0].1["Resource"], serde_json::json!({ "Ref": "ExecutorSecretArns" }));
}
