//! `POST /mcp` driven by the official clients, on the real stack and the
//! local chain: the MCP Python SDK and x402's MCP session
//! (tests/mcp/client.py) against the endpoint served on a loopback port,
//! with a real worker polling the test's own queue. The Python side only
//! reports what it saw; every expectation is here. Beside them, the tasks
//! extension through the `mcp` Lambda's handler with the `events/` samples;
//! rmcp's client drives it on a real `reeve serve` in
//! cli/tests/suite/mcp.rs, and the TypeScript SDK and the conformance suite
//! run in scripts/mcp-clients.sh.

use crate::common;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::TestQueue;
use common::chain::{
    ChainLock, PERMIT2, Payer, allowance, balance, charges_to, eth_balance, fresh_address, python, root, rpc_url,
};
use reeve_shared::mcp::{self, McpSettings};
use reeve_shared::payments::CHAIN_RPC_URLS;
use reeve_shared::settings;
use reeve_shared::startup;
use reeve_shared::worker::Poller;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tower::ServiceExt;

/// 0.01 of a 6-decimal token.
const PRICE: u128 = 10_000;
/// The priced kind's tool.
const PAID: &str = "paid_digest";

fn facilitator_url() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

/// The metered fetch's rate: 7 atomic units of the local token per KiB.
const RATE: u128 = 7;
/// Its ceiling per task.
const CEILING: u128 = 1_000;
/// The metered kind's tool.
const METERED: &str = "metered_fetch";

/// A free digest and a priced one; the mainnet price comes first, so the
/// SDK must choose the local one. And a fetch metered per KiB (x402's
/// `upto`), on the local chain only.
fn catalog(pay_to: &str) -> String {
    let digest = |kind: &str, prices: &str| {
        format!(
            r#"
            [tasks.{kind}]
            title = "Digest"
            description = "SHA-256 of an uploaded file"
            executor = "digest"
            [tasks.{kind}.input_schema]
            type = "object"
            required = ["upload_id"]
            additionalProperties = false
            [tasks.{kind}.input_schema.properties.upload_id]
            type = "string"
            {prices}
            "#
        )
    };
    let metered = format!(
        r#"
        [tasks.{METERED}]
        title = "Metered fetch"
        description = "Fetch a URL, paid per KiB"
        executor = "fetch"
        [tasks.{METERED}.input_schema]
        type = "object"
        required = ["url"]
        [tasks.{METERED}.input_schema.properties.url]
        type = "string"
        [[tasks.{METERED}.accepts]]
        asset = "local"
        scheme = "upto"
        unit = "KiB"
        rate = "{RATE}"
        amount = "{CEILING}"
        "#
    );
    let tasks = format!(
        r#"
        [uploads]
        max_bytes = 8388608
        content_types = ["text/plain"]
        {}
        {}
        {metered}
        "#,
        digest("digest", ""),
        digest(PAID, &common::cent_on_mainnet_then_local(PAID)),
    );
    common::paid_catalog_text(pay_to, &facilitator_url(), 300, &tasks)
}

/// The endpoint on a loopback port, on its own queue, with the worker
/// stoppable.
struct Endpoint {
    url: String,
    router: Router,
    /// The same endpoint as the `mcp` Lambda runs it, for `events/` samples.
    lambda: Router,
    pay_to: String,
    pool: PgPool,
    queue: TestQueue,
    worker: Option<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
}

impl Endpoint {
    /// As the Lambda runs it, without progress notifications (their test is
    /// cli/tests/suite/client.rs's, on a real `reeve serve`).
    async fn start(pool: &PgPool) -> Endpoint {
        let pay_to = fresh_address();
        let queue = TestQueue::new().await;
        let catalog = catalog(&pay_to);
        // The chain's RPC: the worker proves a metered capture from its receipt.
        let chain = common::chain::chain_rpc_urls();
        let config = common::with_catalog(common::config(pool), &catalog)
            .with(settings::QUEUE_URL, &queue.url)
            .with(CHAIN_RPC_URLS, &chain);
        let sdk = startup::sdk().await;
        // The Lambda's router on the same stores: any Host, as the template's
        // default McpAllowedHosts (`*`) says.
        let deployed = config.clone().with(settings::MCP_ALLOWED_HOSTS, "*");
        let lambda = mcp::router(startup::mcp(&deployed, &sdk).await.unwrap_or_else(|e| panic!("{e}")));
        let ctx = startup::mcp(&config, &sdk).await.unwrap_or_else(|e| panic!("{e}"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = mcp::router_at(ctx, addr);
        let served = router.clone();
        tokio::spawn(async move { axum::serve(listener, served).await.unwrap() });

        // Its fetch may reach the test's own file server on loopback.
        let worker_config = common::with_catalog(common::worker_config(pool), &catalog).with(CHAIN_RPC_URLS, &chain);
        let worker = common::worker(&common::loopback_outbound(worker_config)).await;
        let aws = common::aws().await;
        let mut poller = Poller::connect(Arc::new(worker), aws.sqs.clone(), queue.url.clone()).await.unwrap();
        poller.wait_time_seconds = 1;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            poller
                .run(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Endpoint {
            url: format!("http://{addr}{}", mcp::PATH),
            router,
            lambda,
            pay_to,
            pool: pool.clone(),
            queue,
            worker: Some((stop, running)),
        }
    }

    async fn stop_worker(&mut self) {
        if let Some((stop, running)) = self.worker.take() {
            let _ = stop.send(());
            running.await.unwrap();
        }
    }

    /// Runs one scenario of tests/mcp/client.py and returns what it saw.
    async fn client(&self, scenario: &str, env: &[(&str, &str)]) -> Value {
        let mut command = std::process::Command::new(python());
        command.arg(root().join("tests/mcp/client.py")).arg(scenario).env("REEVE_MCP_URL", &self.url);
        for (name, value) in env {
            command.env(name, value);
        }
        let out = tokio::task::spawn_blocking(move || command.output())
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{}: {e}", python().display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "client.py {scenario}: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("client.py {scenario} printed no JSON ({e}): {stdout}"))
    }

    /// How many tasks, and how many payment attempts, the database holds.
    async fn counts(&self) -> (i64, i64) {
        let tasks = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&self.pool).await.unwrap();
        let attempts = sqlx::query_scalar("SELECT count(*) FROM payment_attempts").fetch_one(&self.pool).await.unwrap();
        (tasks, attempts)
    }

    async fn done(mut self) {
        self.stop_worker().await;
        self.queue.delete().await;
    }
}

/// A tool result's structured content, asserting the call succeeded.
fn ok<'a>(answer: &'a Value, what: &str) -> &'a Value {
    let result = answer.get("result").unwrap_or_else(|| panic!("{what}: no result: {answer}"));
    assert_ne!(result["isError"], true, "{what}: {answer}");
    &result["structuredContent"]
}

/// A tool error's code, asserting it is one.
fn refused(answer: &Value, what: &str) -> String {
    let result = answer.get("result").unwrap_or_else(|| panic!("{what}: no tool result: {answer}"));
    assert_eq!(result["isError"], true, "{what}: {answer}");
    let structured = &result["structuredContent"];
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&text, structured, "{what}: content[0].text is the structured content as JSON");
    structured["error"]["code"]
        .as_str()
        .or_else(|| structured["error"].as_str())
        .unwrap_or_else(|| panic!("{what}: no code: {answer}"))
        .to_owned()
}

fn sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

const TEXT: &str = "hello, reeve, from an agent\n";

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_agent_creates_a_space_uploads_and_gets_a_digest_with_the_mcp_sdk(pool: PgPool) {
    let mut endpoint = Endpoint::start(&pool).await;
    let seen = endpoint.client("journey", &[("REEVE_MCP_TEXT", TEXT)]).await;

    // initialize, then one tool per catalog kind with its schema.
    assert_eq!(seen["initialize"]["serverInfo"]["name"], "reeve", "{}", seen["initialize"]);
    let tools: Vec<&Value> = seen["tools"].as_array().unwrap().iter().collect();
    let tool = |name: &str| *tools.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no {name} tool"));
    for name in [
        "create_space",
        "login",
        "create_upload",
        "get_task",
        "list_tasks",
        "cancel_task",
        "get_result",
        "rotate_space",
    ] {
        assert!(tool(name)["inputSchema"]["type"] == "object" && tool(name)["outputSchema"].is_object(), "{name}");
    }
    for kind in ["digest", PAID] {
        let schema = &tool(kind)["inputSchema"];
        assert_eq!(schema["required"], json!(["upload_id"]), "{kind}: the kind's input_schema");
        assert_eq!(schema["properties"]["upload_id"], json!({"type": "string"}));
        assert_eq!(schema["properties"]["wait_seconds"]["maximum"], mcp::MAX_WAIT_SECONDS);
        // Its result, or a tool error; a priced tool may also ask for payment.
        let branches = tool(kind)["outputSchema"]["anyOf"].as_array().unwrap();
        assert_eq!(branches[0]["properties"]["result"]["anyOf"][0]["required"], json!(["sha256", "size"]));
        let titles: Vec<&str> = branches.iter().map(|b| b["title"].as_str().unwrap()).collect();
        let expected = if kind == PAID {
            vec!["Result", "Tool error", "Payment required (x402)"]
        } else {
            vec!["Result", "Tool error"]
        };
        assert_eq!(titles, expected, "{kind}");
    }
    assert_eq!(tool("digest")["_meta"]["reeve/price"], json!({"free": true, "prices": []}));
    let price = &tool(PAID)["_meta"]["reeve/price"];
    assert_eq!(price["free"], false);
    assert_eq!(
        price["prices"][1],
        json!({"asset": "local", "network": "eip155:84532", "scheme": "exact", "amount": "10000", "amount_usd": "0.01",
               "summary": "0.01 USD (10000 atomic units of local)"})
    );
    let description = tool(PAID)["description"].as_str().unwrap();
    assert!(description.contains("Price per task: on eip155:8453, 0.01 USD"), "{description}");
    assert!(description.contains("or on eip155:84532, 0.01 USD (10000 atomic units of local)"), "{description}");

    // No token: a tool error naming the tools that give one.
    assert_eq!(refused(&seen["anonymous_list_tasks"], "anonymous"), "missing_token");
    let message = seen["anonymous_list_tasks"]["result"]["structuredContent"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("create_space") && message.contains("login"), "{message}");

    let space = ok(&seen["create_space"], "create_space");
    assert!(space["space_id"].as_str().unwrap().len() == 20 && space["token"].is_string(), "{space}");
    let upload = ok(&seen["upload"], "inline upload");
    assert_eq!(upload["uploaded"], true);
    assert_eq!(upload["size"], TEXT.len());

    // digest, waiting: its result within the call.
    let task = ok(&seen["digest"], "digest");
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["result"]["sha256"], sha256(TEXT));
    let id = task["id"].as_str().unwrap();
    assert_eq!(task["events_url"], format!("/v1/tasks/{id}/events"));
    assert_eq!(ok(&seen["get_task"], "get_task")["id"], id);
    assert_eq!(ok(&seen["get_result"], "get_result")["result"]["sha256"], sha256(TEXT));
    let listed = ok(&seen["list_tasks"], "list_tasks");
    assert_eq!(listed["tasks"].as_array().unwrap().iter().map(|t| &t["id"]).collect::<Vec<_>>(), [id]);
    assert!(ok(&seen["login"], "login")["token"].is_string());

    // With no worker, a task stays queued and cancel_task cancels it.
    endpoint.stop_worker().await;
    let seen = endpoint.client("queued", &[("REEVE_MCP_TEXT", TEXT)]).await;
    assert_eq!(ok(&seen["created"], "created")["status"], "queued");
    let canceled = ok(&seen["cancel"], "cancel_task");
    assert_eq!(canceled["status"], "canceled", "{canceled}");
    let (status,): (String,) = sqlx::query_as("SELECT status FROM tasks WHERE id = $1")
        .bind(canceled["id"].as_str().unwrap().parse::<reeve_shared::ids::Id>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "canceled");
    endpoint.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn bad_input_gets_a_stable_code_never_a_500_and_charges_nothing(pool: PgPool) {
    let endpoint = Endpoint::start(&pool).await;
    let seen = endpoint.client("bad", &[("REEVE_MCP_TEXT", TEXT), ("REEVE_MCP_KIND", PAID)]).await;

    let unknown = &seen["unknown_tool"]["error"];
    assert_eq!((unknown["code"].as_i64(), &unknown["data"]["code"]), (Some(-32602), &json!("unknown_tool")), "{seen}");
    for (case, code) in [
        ("schema", "invalid_input"),
        ("fixed_tool_schema", "invalid_arguments"),
        ("wait_too_long", "invalid_arguments"),
        ("payment_not_base64", "invalid_payment"),
        ("payment_wrong_shape", "invalid_payment"),
        ("inline_too_large", "upload_too_large"),
        ("bad_base64", "invalid_base64"),
        ("bad_token", "invalid_token"),
    ] {
        assert_eq!(refused(&seen[case], case), code, "{case}: {}", seen[case]);
    }
    // A body over the limit is refused before it is read (the 413 itself is
    // checked below, in-process): the SDK's call fails, and nothing is stored.
    assert!(seen["body_too_large"]["exception"].is_string(), "{}", seen["body_too_large"]);

    // Nothing was created or charged; the one upload is the scenario's own.
    assert_eq!(endpoint.counts().await, (0, 0));
    let uploads: i64 = sqlx::query_scalar("SELECT count(*) FROM uploads").fetch_one(&pool).await.unwrap();
    assert_eq!(uploads, 1);
    endpoint.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_wallet_alone_pays_for_a_priced_tool_with_the_x402_mcp_client(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let endpoint = Endpoint::start(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let before = (balance(&payer.address).await, balance(&endpoint.pay_to).await);

    let env = [("REEVE_MCP_TEXT", TEXT), ("REEVE_MCP_KIND", PAID), ("REEVE_WALLET_KEY", payer.key.as_str())];
    let seen = endpoint.client("pay", &env).await;
    let paid = &seen["paid"];
    assert_eq!((paid["payment_made"].as_bool(), paid["is_error"].as_bool()), (Some(true), Some(false)), "{seen}");
    let settlement = &paid["result"]["_meta"]["x402/payment-response"];
    assert_eq!(settlement["success"], true, "{paid}");
    assert_eq!(settlement["network"], "eip155:84532");
    assert_eq!(paid["payment_response"]["transaction"], settlement["transaction"]);
    let task = &paid["result"]["structuredContent"];
    assert_eq!((task["kind"].as_str(), task["status"].as_str()), (Some(PAID), Some("completed")), "{task}");
    assert_eq!(task["result"]["sha256"], sha256(TEXT));
    assert_eq!(seen["signed"], 1, "one payment signed");
    // Exactly the price moved.
    assert_eq!(balance(&payer.address).await, before.0 - PRICE);
    assert_eq!(balance(&endpoint.pay_to).await, before.1 + PRICE);

    // The same payment again (an agent whose answer was lost): the task it
    // bought, with the stored receipt; nothing moves, nothing to sign again.
    let again = ok(&seen["replayed"], "the same payment again");
    assert_eq!(again["id"], task["id"], "{again}");
    assert_eq!(seen["replayed"]["result"]["_meta"]["x402/payment-response"], *settlement);
    assert_eq!(balance(&payer.address).await, before.0 - PRICE);
    assert_eq!(endpoint.counts().await.0, 1);

    // A payment sent as base64 text is taken too; the challenge it answers is
    // the MCP one, with the tool's discovery entry.
    let env = [
        ("REEVE_MCP_KIND", PAID),
        ("REEVE_WALLET_KEY", payer.key.as_str()),
        ("REEVE_MCP_TOKEN", seen["token"].as_str().unwrap()),
        ("REEVE_MCP_UPLOAD", seen["upload_id"].as_str().unwrap()),
    ];
    let seen = endpoint.client("pay-base64", &env).await;
    let challenge = &seen["unpaid"]["result"]["structuredContent"];
    assert_eq!(challenge["resource"]["url"], format!("mcp://tool/{PAID}"));
    let discovery = &challenge["extensions"]["bazaar"]["info"]["input"];
    assert_eq!((discovery["type"].as_str(), discovery["toolName"].as_str()), (Some("mcp"), Some(PAID)), "{challenge}");
    assert_eq!(discovery["transport"], "streamable-http");
    assert_eq!(discovery["inputSchema"]["required"], json!(["upload_id"]));
    assert!(seen["unpaid"]["result"]["content"][0]["text"].as_str().unwrap().contains("\"x402Version\":2"));
    assert_eq!(ok(&seen["paid"], "paid with base64")["result"]["sha256"], sha256(TEXT));
    assert_eq!(balance(&payer.address).await, before.0 - 2 * PRICE);
    drop(chain);
    endpoint.done().await;
}

/// Serves `bytes` bytes at `/file` on a loopback port of its own: what a
/// metered fetch downloads, of a size the test knows.
async fn file_of(bytes: usize) -> String {
    let body = vec![b'r'; bytes];
    let router = Router::new().route("/file", axum::routing::get(move || async move { body.clone() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}/file")
}

/// An agent with only a wallet (tokens, no Permit2 approval, no gas) calls a
/// metered tool through x402's MCP session: it signs the upto ceiling (with
/// the token's permit the challenge offers), the call waits for the fetch,
/// and the payer is charged exactly what it downloaded, once, on chain.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_wallet_alone_pays_a_metered_tool_exactly_what_it_used_with_the_x402_mcp_client(pool: PgPool) {
    const FUNDS: u128 = 1_000_000;
    let chain = ChainLock::shared().await;
    let endpoint = Endpoint::start(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    let url = file_of(6 * 1024).await;
    let rpc = rpc_url();
    let env = [
        ("REEVE_MCP_KIND", METERED),
        ("REEVE_WALLET_KEY", payer.key.as_str()),
        ("REEVE_MCP_FETCH_URL", url.as_str()),
        ("REEVE_CHAIN_RPC_URL", rpc.as_str()),
    ];
    let seen = endpoint.client("pay-metered", &env).await;

    // The tool says what it may cost, and that a failure costs nothing.
    let summary = format!(
        "up to {CEILING} atomic units of local, charged {RATE} atomic units per KiB used; nothing if the task fails"
    );
    let description = seen["tool"]["description"].as_str().unwrap();
    assert!(description.contains(&format!("Metered price: on eip155:84532, {summary}.")), "{description}");
    let price = &seen["tool"]["_meta"]["reeve/price"]["prices"][0];
    assert_eq!((&price["scheme"], &price["unit"], &price["rate"]), (&json!("upto"), &json!("KiB"), &json!("7")));
    assert_eq!((&price["amount"], &price["summary"]), (&json!(CEILING.to_string()), &json!(summary)), "{price}");

    // Unpaid, it asks for the ceiling over upto, the resource saying "up to"
    // and the discovery entry describing the tool as listed.
    let challenge = &seen["unpaid"]["result"]["structuredContent"];
    let offered = &challenge["accepts"][0];
    assert_eq!((&offered["scheme"], &offered["amount"]), (&json!("upto"), &json!(CEILING.to_string())), "{challenge}");
    assert!(offered["extra"]["facilitatorAddress"].as_str().is_some_and(|a| a.len() == 42), "{challenge}");
    assert!(challenge["extensions"]["eip2612GasSponsoring"].is_object(), "{challenge}");
    assert_eq!(challenge["resource"]["url"], format!("mcp://tool/{METERED}"));
    assert_eq!(challenge["resource"]["description"], format!("Metered fetch: {summary}"));
    assert_eq!(challenge["extensions"]["bazaar"]["info"]["input"]["description"], description);

    // One payment signed, for the ceiling, with the permit in place of an
    // approval.
    let signed = seen["signed"].as_array().unwrap();
    assert_eq!(signed.len(), 1, "{seen}");
    assert_eq!(signed[0]["accepted"]["scheme"], "upto");
    assert_eq!(signed[0]["accepted"]["amount"], CEILING.to_string());
    assert!(signed[0]["extensions"]["eip2612GasSponsoring"]["info"]["signature"].is_string(), "{}", signed[0]);

    // The call answers the completed task, charged what it used.
    let paid = &seen["paid"];
    assert_eq!((paid["payment_made"].as_bool(), paid["is_error"].as_bool()), (Some(true), Some(false)), "{seen}");
    let task = &paid["result"]["structuredContent"];
    assert_eq!((task["kind"].as_str(), task["status"].as_str()), (Some(METERED), Some("completed")), "{task}");
    assert_eq!(task["result"]["size"], 6 * 1024, "{task}");
    let used = 6 * RATE;
    let charges = charges_to(&endpoint.pay_to).await;
    assert_eq!(charges.len(), 1, "one Transfer: {charges:?}");
    assert_eq!(charges[0].value, used);
    let payment = &task["payment"];
    assert_eq!((payment["scheme"].as_str(), payment["status"].as_str()), (Some("upto"), Some("charged")), "{task}");
    assert_eq!(payment["authorized"], CEILING.to_string());
    assert_eq!((&payment["used"], &payment["charged"]), (&json!(6 * 1024), &json!(used.to_string())), "{task}");
    assert_eq!(payment["transaction"].as_str().map(str::to_ascii_lowercase), Some(charges[0].transaction.clone()));
    assert_eq!(payment["payer"].as_str().map(str::to_ascii_lowercase), Some(payer.address.to_ascii_lowercase()));
    // x402's settle response, as the SDK read it: that transaction and amount.
    let settlement = &paid["result"]["_meta"]["x402/payment-response"];
    assert_eq!((settlement["success"].as_bool(), &settlement["amount"]), (Some(true), &json!(used.to_string())));
    assert_eq!(settlement["transaction"], payment["transaction"], "{paid}");
    assert_eq!(paid["payment_response"]["transaction"], payment["transaction"]);
    assert_eq!(paid["payment_response"]["amount"], used.to_string());

    // On chain: exactly what was used moved, and the payer spent no gas.
    assert_eq!(balance(&payer.address).await, FUNDS - used, "the payer paid exactly size × rate");
    assert_eq!(balance(&endpoint.pay_to).await, used, "payTo got the same");
    assert_eq!(allowance(&payer.address, PERMIT2).await, CEILING - used, "the permit approved the ceiling");
    assert_eq!(eth_balance(&payer.address).await, 0, "a wallet alone: no gas spent");
    assert_eq!(endpoint.counts().await, (1, 1));

    // Called as a task (the tasks extension, through the `mcp` Lambda's
    // handler): the handle settles nothing, and tasks/get's final result
    // carries the capture, with the amount used.
    let token = seen["token"].as_str().unwrap();
    let call = |payment: Option<String>| {
        let url = url.clone();
        sample_event("mcp-tools-call-task", Some(token), move |params| {
            params["name"] = json!(METERED);
            params["arguments"] = json!({ "url": url });
            if let Some(payment) = payment {
                params["_meta"]["x402/payment"] = json!(payment);
            }
        })
    };
    use crate::lambda_events::through_lambda;
    let unpaid = through_lambda(endpoint.lambda.clone(), &call(None)).await;
    let challenge = &unpaid.body["result"]["structuredContent"];
    assert_eq!(challenge["accepts"][0]["scheme"], "upto", "{}", unpaid.body);
    let signature = payer.sign(&challenge.to_string()).await;
    let handle = through_lambda(endpoint.lambda.clone(), &call(Some(signature))).await;
    let handle = &handle.body["result"];
    assert_eq!(handle["resultType"], "task", "{handle}");
    assert!(handle["_meta"].get("x402/payment-response").is_none(), "nothing settled at the call: {handle}");
    let id = handle["taskId"].as_str().unwrap().to_owned();
    let get = sample_event("mcp-tasks-get", Some(token), |params| params["taskId"] = json!(id));
    let mut done = Value::Null;
    for _ in 0..150 {
        done = through_lambda(endpoint.lambda.clone(), &get).await.body["result"].clone();
        if done["status"] != "working" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(done["status"], "completed", "{done}");
    let task = &done["result"]["structuredContent"];
    assert_eq!(
        (&task["payment"]["status"], &task["payment"]["charged"]),
        (&json!("charged"), &json!(used.to_string()))
    );
    let settlement = &done["result"]["_meta"]["x402/payment-response"];
    assert_eq!(
        (settlement["success"].as_bool(), &settlement["amount"]),
        (Some(true), &json!(used.to_string())),
        "{done}"
    );
    assert_eq!(settlement["transaction"], task["payment"]["transaction"]);
    let charges = charges_to(&endpoint.pay_to).await;
    assert_eq!(charges.len(), 2, "one Transfer per task");
    assert_eq!(balance(&payer.address).await, FUNDS - 2 * used);
    drop(chain);
    endpoint.done().await;
}

/// Refusals before any tool runs, each a JSON-RPC error with a stable code:
/// a `Host` or `Origin` outside the allow-lists (what no MCP client sends,
/// but a browser page or a DNS rebinding attack would), and a body over the
/// limit, refused on its `Content-Length` without being read. On loopback
/// the server's own names with its own port pass, as Host and as Origin.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn foreign_hosts_origins_and_oversized_bodies_are_refused_unread(pool: PgPool) {
    let endpoint = Endpoint::start(&pool).await;
    let port = endpoint.url.trim_start_matches("http://127.0.0.1:").split('/').next().unwrap().to_owned();
    let other = (port.parse::<u16>().unwrap() % 60000 + 1).to_string();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let at = |name: &str, port: &str| format!("{name}:{port}");
    let origin = |name: &str, port: &str| Some(format!("http://{name}:{port}"));
    for (host, origin, status, code) in [
        ("127.0.0.1".to_owned(), None, StatusCode::OK, None),
        // What the conformance suite's dns-rebinding check sends, and a
        // browser on a page this server served.
        (at("localhost", &port), origin("localhost", &port), StatusCode::OK, None),
        (at("127.0.0.1", &port), origin("127.0.0.1", &port), StatusCode::OK, None),
        (at("[::1]", &port), origin("[::1]", &port), StatusCode::OK, None),
        (at("localhost", &port), origin("127.0.0.1", &port), StatusCode::OK, None),
        // A rebound name, and a page of another local server.
        ("reeve.evil.example".to_owned(), None, StatusCode::FORBIDDEN, Some("host_not_allowed")),
        (at("evil.example", &port), origin("evil.example", &port), StatusCode::FORBIDDEN, Some("host_not_allowed")),
        (at("localhost", &port), origin("localhost", &other), StatusCode::FORBIDDEN, Some("origin_not_allowed")),
        (
            at("localhost", &port),
            Some("https://localhost".to_owned()),
            StatusCode::FORBIDDEN,
            Some("origin_not_allowed"),
        ),
        (
            "127.0.0.1".to_owned(),
            Some("https://evil.example".to_owned()),
            StatusCode::FORBIDDEN,
            Some("origin_not_allowed"),
        ),
    ] {
        let mut request = Request::post(mcp::PATH)
            .header("host", &host)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(origin) = &origin {
            request = request.header("origin", origin);
        }
        let response =
            endpoint.router.clone().oneshot(request.body(Body::from(initialize.to_string())).unwrap()).await.unwrap();
        assert_eq!(response.status(), status, "{host} {origin:?}");
        let body: Value =
            serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap()).unwrap();
        match code {
            Some(code) => assert_eq!(body["error"]["data"]["code"], code, "{body}"),
            None => assert_eq!(body["result"]["serverInfo"]["name"], "reeve", "{body}"),
        }
    }
    let huge = vec![b' '; mcp::MAX_BODY_BYTES + 1];
    let request = Request::post(mcp::PATH)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("content-length", huge.len())
        .body(Body::from(huge))
        .unwrap();
    let response = endpoint.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value =
        serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap()).unwrap();
    assert_eq!(
        (body["error"]["code"].as_i64(), &body["error"]["data"]["code"]),
        (Some(-32600), &json!("body_too_large"))
    );
    endpoint.done().await;
}

/// The `mcp` Lambda's start-up: its own variables read with the API's, `*`
/// for any Host (the template's default), loopback when unset, and every
/// problem at once.
#[tokio::test]
async fn the_mcp_function_starts_from_its_configuration() {
    use reeve_shared::settings::{self, Config};
    let sdk = reeve_shared::startup::sdk().await;
    let catalog = root().join("reeve.dev.toml").display().to_string();
    let chain = common::chain::chain_rpc_urls();
    let vars = |extra: &[(&str, &str)]| {
        let mut vars: Vec<(String, String)> = [
            ("REEVE_PEPPER", "test-pepper-test-pepper-test-pepper!"),
            ("REEVE_TOKEN_KEY", "test-token-key-test-token-key-test!!"),
            ("DATABASE_URL", "postgres://reeve@127.0.0.1:5432/reeve"),
            ("REDIS_URL", "redis://127.0.0.1:6379"),
            ("REEVE_BUCKET", "reeve-test"),
            ("REEVE_QUEUE_URL", "http://127.0.0.1:5000/000000000000/q"),
            (settings::CATALOG, catalog.as_str()),
            (settings::CHAIN_RPC_URLS, chain.as_str()),
            // reeve.dev.toml publishes a receipt signer: its key.
            (settings::RECEIPT_KEY, common::RECEIPT_KEY),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        vars.retain(|(k, _)| !extra.iter().any(|(e, v)| e == k && v.is_empty()));
        Config::from_vars(vars)
    };
    let any = reeve_shared::startup::mcp(&vars(&[(settings::MCP_ALLOWED_HOSTS, "*")]), &sdk).await.unwrap();
    assert!(any.settings.allowed_hosts.is_empty() && !any.settings.progress, "{:?}", any.settings);
    let local = reeve_shared::startup::mcp(&vars(&[]), &sdk).await.unwrap();
    assert_eq!(local.settings.allowed_hosts, McpSettings::LOOPBACK.map(str::to_owned));
    let pinned = vars(&[(settings::MCP_ALLOWED_HOSTS, "api.example.com, x.execute-api.eu-west-1.amazonaws.com")]);
    let pinned = reeve_shared::startup::mcp(&pinned, &sdk).await.unwrap();
    assert_eq!(pinned.settings.allowed_hosts, ["api.example.com", "x.execute-api.eu-west-1.amazonaws.com"]);

    let broken = vars(&[("REEVE_PEPPER", ""), ("REEVE_BUCKET", "")]);
    let problems = reeve_shared::startup::mcp(&broken, &sdk).await.err().expect("start-up fails").problems().join("\n");
    assert!(problems.contains("REEVE_PEPPER is not set") && problems.contains("REEVE_BUCKET is not set"), "{problems}");
}

/// An `events/` sample, as API Gateway would deliver it, carrying this
/// test's values: its session token in place of the dummy one (or none),
/// and `edit` applied to its JSON-RPC `params`.
pub(crate) fn sample_event(stem: &str, token: Option<&str>, edit: impl FnOnce(&mut Value)) -> String {
    let text = std::fs::read_to_string(root().join(format!("events/{stem}.json"))).unwrap();
    let mut event: Value = serde_json::from_str(&text).unwrap();
    let mut body: Value = serde_json::from_str(event["body"].as_str().unwrap()).unwrap();
    edit(&mut body["params"]);
    // MCP 2026-07-28's routing header names the tool, or the task.
    let name = body["params"]["name"].as_str().or_else(|| body["params"]["taskId"].as_str()).unwrap().to_owned();
    let body = body.to_string();
    let headers = event["headers"].as_object_mut().unwrap();
    headers.insert("mcp-name".into(), json!(name));
    headers.insert("content-length".into(), json!(body.len().to_string()));
    match token {
        Some(token) => headers.insert("authorization".into(), json!(format!("Bearer {token}"))),
        None => headers.remove("authorization"),
    };
    event["body"] = json!(body);
    event.to_string()
}

/// The tasks extension through the `mcp` Lambda's handler (lambda_http's
/// parsing of an API Gateway event, the router, the answer API Gateway
/// gets), from the samples in `events/`: a digest called as a task answers
/// a handle, `tasks/get` follows it to its result, and `tasks/cancel` stops
/// a queued one. Each request is an invocation of its own: nothing is kept
/// between them but the task's row.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_tasks_extension_through_the_lambda_handler_with_the_sample_events(pool: PgPool) {
    use crate::lambda_events::through_lambda;
    let mut endpoint = Endpoint::start(&pool).await;
    let lambda = || endpoint.lambda.clone();
    // The call sample names another tool: how this test gets a Space and an upload.
    let tool = |token: Option<&str>, name: &str, arguments: Value| {
        sample_event("mcp-tools-call-task", token, |params| {
            params["name"] = json!(name);
            params["arguments"] = arguments;
        })
    };
    let space = through_lambda(lambda(), &tool(None, "create_space", json!({}))).await;
    let token = space.body["result"]["structuredContent"]["token"].as_str().unwrap().to_owned();
    let inline = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, TEXT);
    let upload = through_lambda(
        lambda(),
        &tool(
            Some(&token),
            "create_upload",
            json!({"filename": "a.txt", "content_type": "text/plain", "content_base64": inline}),
        ),
    )
    .await;
    let upload_id = upload.body["result"]["structuredContent"]["upload_id"].as_str().unwrap().to_owned();
    let with_upload = |params: &mut Value| params["arguments"]["upload_id"] = json!(upload_id);

    let created = through_lambda(lambda(), &sample_event("mcp-tools-call-task", Some(&token), with_upload)).await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    assert!(created.content_type.starts_with("application/json"), "{}", created.content_type);
    let handle = &created.body["result"];
    assert_eq!((handle["resultType"].as_str(), handle["status"].as_str()), (Some("task"), Some("working")), "{handle}");
    let id = handle["taskId"].as_str().unwrap().to_owned();
    assert!(id.parse::<reeve_shared::ids::Id>().is_ok(), "{id}");

    let get = |id: String| sample_event("mcp-tasks-get", Some(&token), move |params| params["taskId"] = json!(id));
    let mut done = Value::Null;
    for _ in 0..150 {
        done = through_lambda(lambda(), &get(id.clone())).await.body["result"].clone();
        if done["status"] != "working" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["taskId"], id.as_str());
    assert_eq!(done["result"]["structuredContent"]["result"]["sha256"], sha256(TEXT), "{done}");

    // With the worker stopped a task stays queued: canceled, it ends
    // cancelled, and canceling it again is acknowledged all the same.
    endpoint.stop_worker().await;
    let lambda = || endpoint.lambda.clone();
    let queued = through_lambda(lambda(), &sample_event("mcp-tools-call-task", Some(&token), with_upload)).await;
    let queued = queued.body["result"]["taskId"].as_str().unwrap().to_owned();
    let cancel =
        |id: String| sample_event("mcp-tasks-cancel", Some(&token), move |params| params["taskId"] = json!(id));
    for round in ["queued", "already cancelled"] {
        let ack = through_lambda(lambda(), &cancel(queued.clone())).await;
        assert_eq!(ack.status, StatusCode::OK, "{round}: {}", ack.body);
        assert!(ack.body.get("error").is_none() && ack.body["result"].is_object(), "{round}: {}", ack.body);
        let ended = through_lambda(lambda(), &get(queued.clone())).await;
        assert_eq!(ended.body["result"]["status"], "cancelled", "{round}: {}", ended.body);
    }
    let (status,): (String,) = sqlx::query_as("SELECT status FROM tasks WHERE id = $1")
        .bind(queued.parse::<reeve_shared::ids::Id>().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "canceled");
    endpoint.done().await;
}
