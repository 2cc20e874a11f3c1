//! MCP's tasks extension (`io.modelcontextprotocol/tasks`, MCP 2026-07-28)
//! through the official Rust SDK's client, rmcp, against a real `reeve
//! serve` process: a kind's tool called as a task answers a task handle
//! whose id is Reeve's task id, `tasks/get` follows it from the task's row
//! (the same row `GET /v1/tasks/{id}` reads), and `tasks/cancel` is Reeve's
//! cancel, and a paid call's task carries its receipt. The process keeps
//! nothing between requests: every call below is a POST of its own.

use std::time::Duration;

use base64::Engine as _;
use rmcp::ClientServiceExt as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities, ClientConfig,
    CreateTaskResult, DetailedTask, GetTaskParams, Implementation, ProtocolVersion, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use sha2::Digest as _;

use crate::common;

use super::client::Serve;
use super::client::chain::{ChainLock, Payer, balance};

type Client = RunningService<RoleClient, ClientConfig>;

const TEXT: &str = "hello, reeve, from rmcp\n";

/// A client that declares the tasks extension on every request (MCP
/// 2026-07-28 carries the client's capabilities in each request's `_meta`),
/// with the session token as its bearer.
async fn connect(serve: &Serve, token: Option<&str>) -> Client {
    connect_with(serve, token, ClientCapabilities::builder().enable_tasks().build()).await
}

async fn connect_with(serve: &Serve, token: Option<&str>, capabilities: ClientCapabilities) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", serve.endpoint));
    if let Some(token) = token {
        config = config.auth_header(token.to_owned());
    }
    ClientConfig::new(capabilities, Implementation::new("reeve-test", "1"))
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_config(config),
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
        )
        .await
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", serve.log()))
}

fn call(name: &str, arguments: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name.to_owned()).with_arguments(arguments.as_object().unwrap().clone())
}

/// A tool result's structured content, asserting the call succeeded.
fn structured(response: CallToolResponse) -> Value {
    match response {
        CallToolResponse::Complete(result) => {
            assert_ne!(result.is_error, Some(true), "{result:?}");
            result.structured_content.unwrap()
        }
        other => panic!("expected a complete result, got {other:?}"),
    }
}

fn handle(response: CallToolResponse) -> CreateTaskResult {
    match response {
        CallToolResponse::Task(handle) => handle,
        other => panic!("expected a task handle, got {other:?}"),
    }
}

/// A fresh Space's token, and a client on it with `TEXT` uploaded.
async fn signed_in(serve: &Serve) -> (String, Client, String) {
    let anonymous = connect(serve, None).await;
    let space = structured(anonymous.call_tool_once(call("create_space", json!({}))).await.unwrap());
    anonymous.cancel().await.unwrap();
    let token = space["token"].as_str().unwrap().to_owned();
    let client = connect(serve, Some(&token)).await;
    let upload_id = upload(&client).await;
    (token, client, upload_id)
}

async fn upload(client: &Client) -> String {
    let inline = base64::engine::general_purpose::STANDARD.encode(TEXT);
    let upload = structured(
        client
            .call_tool_once(call(
                "create_upload",
                json!({"filename": "a.txt", "content_type": "text/plain", "content_base64": inline}),
            ))
            .await
            .unwrap(),
    );
    upload["upload_id"].as_str().unwrap().to_owned()
}

/// `tasks/get` until the task has ended (within 30 s).
async fn until_ended(client: &Client, id: &str) -> DetailedTask {
    for _ in 0..150 {
        let got = client.get_task(GetTaskParams::new(id.to_owned())).await.unwrap().task;
        if got.status().is_terminal() {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("task {id} did not end in 30 s");
}

/// The task as the REST API has it: `GET /v1/tasks/{id}`.
async fn rest_task(serve: &Serve, token: &str, id: &str) -> Value {
    let answer = reqwest::Client::new()
        .get(format!("{}/v1/tasks/{id}", serve.endpoint))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "GET /v1/tasks/{id}: {}", answer.status());
    answer.json().await.unwrap()
}

#[tokio::test]
async fn a_digest_called_as_a_task_is_polled_to_completed_with_its_sha256() {
    let serve = Serve::start(&[]).await;
    let (token, client, upload_id) = signed_in(&serve).await;

    let created = handle(client.call_tool_once(call("digest", json!({"upload_id": upload_id}))).await.unwrap());
    let id = created.task.task_id.clone();
    assert!(id.parse::<reeve_shared::ids::Id>().is_ok(), "the handle's taskId is Reeve's task id: {id}");
    assert_eq!(created.task.status, TaskStatus::Working, "{created:?}");
    assert!(created.task.poll_interval_ms.is_some(), "{created:?}");

    let done = until_ended(&client, &id).await;
    let TaskPayload::Completed { result } = done.payload else { panic!("not completed: {done:?}") };
    let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let task = result.structured_content.unwrap();
    let sha256 = hex::encode(sha2::Sha256::digest(TEXT.as_bytes()));
    assert_eq!((task["id"].as_str(), task["status"].as_str()), (Some(id.as_str()), Some("completed")), "{task}");
    assert_eq!(task["result"]["sha256"], sha256.as_str());

    // The same row as the REST API's.
    let rest = rest_task(&serve, &token, &id).await;
    assert_eq!((&rest["status"], &rest["result"]), (&task["status"], &task["result"]));

    // Another Space's client is told there is no such task.
    let (_, stranger, _) = signed_in(&serve).await;
    let refused = stranger.get_task(GetTaskParams::new(id.clone())).await.expect_err("another Space's task");
    assert!(format!("{refused:?}").contains("task_not_found"), "{refused:?}");
    stranger.cancel().await.unwrap();
    client.cancel().await.unwrap();
    serve.cleanup().await;
}

#[tokio::test]
async fn a_task_canceled_while_queued_ends_cancelled_and_a_second_cancel_is_acknowledged() {
    // No worker: the task stays queued until canceled.
    let serve = Serve::start(&["--no-worker"]).await;
    let (token, client, upload_id) = signed_in(&serve).await;

    let created = handle(client.call_tool_once(call("digest", json!({"upload_id": upload_id}))).await.unwrap());
    let id = created.task.task_id.clone();
    let queued = client.get_task(GetTaskParams::new(id.clone())).await.unwrap().task;
    assert_eq!(queued.status(), TaskStatus::Working, "{queued:?}");
    assert_eq!(rest_task(&serve, &token, &id).await["status"], "queued");

    client.cancel_task(CancelTaskParams::new(id.clone())).await.unwrap();
    let ended = client.get_task(GetTaskParams::new(id.clone())).await.unwrap().task;
    assert_eq!(ended.payload, TaskPayload::Cancelled, "{ended:?}");
    assert_eq!(rest_task(&serve, &token, &id).await["status"], "canceled");
    // The task has ended: cancelling it again is an acknowledgement, not an error.
    client.cancel_task(CancelTaskParams::new(id.clone())).await.unwrap();
    assert_eq!(client.get_task(GetTaskParams::new(id)).await.unwrap().task.payload, TaskPayload::Cancelled);
    client.cancel().await.unwrap();
    serve.cleanup().await;
}

/// 0.005 of the local chain's 6-decimal test token.
const HTTP_PRICE: u128 = 5_000;

/// tests/mcp/catalog.toml (a free and a paid digest on the local chain) and
/// a paid `http` kind whose endpoint is `endpoint`.
fn catalog_with_paid_echo(endpoint: &str) -> String {
    let base = std::fs::read_to_string(common::repo("tests/mcp/catalog.toml")).unwrap();
    format!(
        r#"{base}
[tasks.paid_echo]
title = "Echo, paid"
description = "POSTs the input to the test's own endpoint and answers its JSON."
executor = "http"
endpoint = "{endpoint}"
timeout_seconds = 30

[tasks.paid_echo.input_schema]
type = "object"
required = ["text"]
additionalProperties = false

[tasks.paid_echo.input_schema.properties.text]
type = "string"

[[tasks.paid_echo.accepts]]
asset = "usdc-base-sepolia"
amount = "{HTTP_PRICE}"
"#
    )
}

/// An endpoint for the `http` executor on a loopback port: it answers the
/// JSON it is sent, inside `{"echo": …}`.
async fn echo_endpoint() -> String {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/echo",
        post(|axum::Json(input): axum::Json<Value>| async move { axum::Json(json!({ "echo": input })) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/echo")
}

/// A paid `http` task called as a task, by a client that also advertises
/// x402's extension binding (`org.x402/payment`): Reeve does not offer that
/// binding (rmcp cannot send its result type), so the unpaid call answers
/// the tool-result binding's PaymentRequired; paid, the handle and the final
/// result both carry the receipt; the same payment again answers the same
/// task with its receipt, and the payer paid exactly the price once.
#[tokio::test]
async fn a_paid_http_task_carries_its_receipt_to_its_final_result() {
    let chain = ChainLock::shared().await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let endpoint = echo_endpoint().await;
    let catalog = std::env::temp_dir().join(format!("reeve-mcp-paid-echo-{}.toml", ulid::Ulid::new()));
    std::fs::write(&catalog, catalog_with_paid_echo(&endpoint)).unwrap();
    // The endpoint is plain http on loopback: allowed for this operator only.
    let vars = [("REEVE_OPERATOR_ALLOW", "127.0.0.1"), ("REEVE_OUTBOUND_ALLOW_HTTP", "1")];
    let serve = Serve::start_on(&catalog, &[], &vars).await;
    let created =
        structured(connect(&serve, None).await.call_tool_once(call("create_space", json!({}))).await.unwrap());
    let token = created["token"].as_str().unwrap().to_owned();
    let mut capabilities = ClientCapabilities::builder().enable_tasks().build();
    capabilities.extensions.get_or_insert_with(Default::default).insert("org.x402/payment".into(), Default::default());
    let client = connect_with(&serve, Some(&token), capabilities).await;
    let advertised = serde_json::to_value(client.peer_info().map(|info| info.capabilities.clone())).unwrap();
    assert!(advertised["tools"].is_object(), "{advertised}");
    assert!(!advertised.to_string().contains("org.x402/payment"), "not offered: {advertised}");
    let input = json!({"text": "paid for"});

    let before = balance(&payer.address).await;
    let unpaid = match client.call_tool_once(call("paid_echo", input.clone())).await.unwrap() {
        CallToolResponse::Complete(result) => result,
        other => panic!("an unpaid call creates no task: {other:?}"),
    };
    assert_eq!(unpaid.is_error, Some(true), "{unpaid:?}");
    let challenge = unpaid.structured_content.unwrap();
    assert_eq!(
        (challenge["x402Version"].as_u64(), challenge["resource"]["url"].as_str()),
        (Some(2), Some("mcp://tool/paid_echo"))
    );

    let signature = payer.sign(&base64::engine::general_purpose::STANDARD.encode(challenge.to_string())).await;
    let paid_call = || {
        let mut meta = rmcp::model::MetaObject::new();
        meta.insert("x402/payment".into(), json!(signature));
        let mut params = call("paid_echo", input.clone());
        params.meta = Some(rmcp::model::RequestMetaObject(meta));
        params
    };
    let created = handle(client.call_tool_once(paid_call()).await.unwrap());
    let receipt = created.meta.as_ref().and_then(|meta| meta.get("x402/payment-response")).cloned();
    let receipt = receipt.unwrap_or_else(|| panic!("the handle carries the receipt: {created:?}"));
    assert_eq!(
        (receipt["success"].as_bool(), receipt["network"].as_str()),
        (Some(true), Some("eip155:84532")),
        "{receipt}"
    );
    assert_eq!(balance(&payer.address).await, before - HTTP_PRICE, "exactly the price");

    let id = created.task.task_id.clone();
    let done = until_ended(&client, &id).await;
    let TaskPayload::Completed { result } = done.payload else { panic!("not completed: {done:?}\n{}", serve.log()) };
    let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(result.structured_content.as_ref().unwrap()["result"], json!({"echo": input}), "{result:?}");
    let final_receipt = result.meta.as_ref().and_then(|meta| meta.get("x402/payment-response"));
    assert_eq!(final_receipt, Some(&receipt), "the final result carries the receipt: {result:?}");

    // The same payment again: the task it bought, with its receipt, and nothing moves.
    let again = handle(client.call_tool_once(paid_call()).await.unwrap());
    assert_eq!(again.task.task_id, id);
    assert_eq!(again.meta.as_ref().and_then(|meta| meta.get("x402/payment-response")), Some(&receipt));
    assert_eq!(balance(&payer.address).await, before - HTTP_PRICE, "charged once");
    client.cancel().await.unwrap();
    drop(chain);
    serve.cleanup().await;
    let _ = std::fs::remove_file(catalog);
}
