//! Payment by URL elicitation (issue 40): an MCP client without x402 that
//! declares URL elicitation calls a priced tool, is given a pay link, a
//! person pays it on the console's page (`GET`/`POST /v1/pay-link`), and the
//! retried call answers that task. Against the real stack and the local
//! chain: every payment is signed by x402's Python SDK and read back from
//! the chain. The endpoint is the `mcp` Lambda's router beside the API's, on
//! one context, driven with raw JSON-RPC as each protocol version sends it:
//! 2025-11-25 (an `initialize`, then the `-32042` error and a retry with the
//! same arguments) and 2026-07-28 (capabilities in `_meta`, an
//! `input_required` result and a retry with its `requestState`). The
//! official TypeScript SDK does the 2025-11-25 round with a headless
//! browser paying the page in tests/console/console.test.mjs.

use crate::common;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use common::chain::{ChainLock, Payer, balance, charges_to, fresh_address};
use common::{Reply, TestQueue, new_session, send};
use reeve_shared::http::{Ctx, app};
use reeve_shared::mcp::{self, McpSettings};
use reeve_shared::payments::CHAIN_RPC_URLS;
use reeve_shared::settings;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

/// 0.01 of the local 6-decimal token.
const PRICE: u128 = 10_000;
/// A fetch metered per KiB (x402's `upto`), authorized up to this.
const METERED: &str = "metered_fetch";
const CEILING: u128 = 1_000;
const LEGACY: &str = "2025-11-25";
const MODERN: &str = "2026-07-28";

fn catalog(pay_to: &str) -> String {
    let tasks = format!(
        r#"
        [tasks.fetch]
        title = "Fetch"
        description = "Fetch a URL"
        executor = "fetch"
        [tasks.fetch.input_schema]
        type = "object"
        required = ["url"]
        [tasks.fetch.input_schema.properties.url]
        type = "string"
        {}
        "#,
        common::cent_on_mainnet_then_local("fetch")
    ) + &format!(
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
        rate = "7"
        amount = "{CEILING}"
        "#
    );
    let facilitator = std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into());
    common::signing_receipts(&common::paid_catalog_text(pay_to, &facilitator, 300, &tasks))
}

/// The API and the MCP endpoint on one context, no worker: a paid task
/// stays queued.
struct Shop {
    app: Router,
    mcp: Router,
    token: String,
    pay_to: String,
    queue: TestQueue,
    pool: PgPool,
}

impl Shop {
    async fn new(pool: &PgPool) -> Shop {
        let pay_to = fresh_address();
        let queue = TestQueue::new().await;
        let config = common::with_catalog(common::config(pool), &catalog(&pay_to))
            .with(settings::QUEUE_URL, &queue.url)
            .with(CHAIN_RPC_URLS, common::chain::chain_rpc_urls());
        let api: Ctx = common::api(&config).await;
        let settings = McpSettings { allowed_hosts: vec![], allowed_origins: vec![], progress: false };
        let mcp = mcp::router(reeve_shared::startup::mcp_beside(&api, settings));
        let app = app(api);
        let token = new_session(&app).await.1;
        Shop { app, mcp, token, pay_to, queue, pool: pool.clone() }
    }

    /// One JSON-RPC POST to `/mcp`: its status, headers and body.
    async fn rpc(&self, headers: &[(&str, &str)], body: Value) -> (StatusCode, HeaderMap, Value) {
        let mut request = Request::post(mcp::PATH)
            .header("host", "127.0.0.1:8080")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let reply = send(&self.mcp, request.body(Body::from(body.to_string())).unwrap()).await;
        (reply.status, reply.headers, reply.body)
    }

    /// A 2025-11-25 `initialize` declaring `capabilities`: the
    /// `Mcp-Session-Id` it is answered with, if any.
    async fn initialize(&self, capabilities: Value) -> Option<String> {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": capabilities,
            "clientInfo": { "name": "pay-link-test", "version": "1" } } });
        let (status, headers, answer) = self.rpc(&[], body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["result"]["protocolVersion"], LEGACY, "{answer}");
        headers.get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned())
    }

    /// A 2025-11-25 `tools/call` of `fetch` with `session` (the sealed
    /// declaration), by the Space of `token`: the JSON-RPC answer.
    async fn legacy_call(&self, token: &str, session: Option<&str>, url: &str) -> Value {
        self.legacy_call_of("fetch", token, session, url).await
    }

    async fn legacy_call_of(&self, tool: &str, token: &str, session: Option<&str>, url: &str) -> Value {
        let bearer = format!("Bearer {token}");
        let mut headers = vec![("mcp-protocol-version", LEGACY), ("authorization", bearer.as_str())];
        if let Some(session) = session {
            headers.push(("mcp-session-id", session));
        }
        let body = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": tool, "arguments": { "url": url } } });
        let (status, _, answer) = self.rpc(&headers, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    /// A 2026-07-28 `tools/call` of `fetch`, its capabilities in `_meta`,
    /// with `state` as its `requestState` if given.
    async fn modern_call(&self, token: &str, url: &str, state: Option<&str>) -> Value {
        let bearer = format!("Bearer {token}");
        let headers = [
            ("mcp-protocol-version", MODERN),
            ("mcp-method", "tools/call"),
            ("mcp-name", "fetch"),
            ("authorization", bearer.as_str()),
        ];
        let mut params = json!({ "name": "fetch", "arguments": { "url": url }, "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": { "elicitation": { "url": {} } },
            "io.modelcontextprotocol/clientInfo": { "name": "pay-link-test", "version": "1" } } });
        if let Some(state) = state {
            params["requestState"] = json!(state);
            params["inputResponses"] = json!({ "reeve/pay": { "action": "accept" } });
        }
        let body = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params });
        let (status, _, answer) = self.rpc(&headers, body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    /// `/v1/pay-link` with `token` as the pay page sends it.
    async fn pay_link(&self, method: &str, token: &str, payment: Option<&str>) -> Reply {
        let mut request = Request::builder().method(method).uri("/v1/pay-link");
        request = request.header("authorization", format!("PayLink {token}"));
        if let Some(payment) = payment {
            request = request.header("payment-signature", payment);
        }
        send(&self.app, request.body(Body::empty()).unwrap()).await
    }

    /// Pays the link `token` from `payer`, as the page does: the challenge,
    /// then the signed payment. The task's id.
    async fn pay(&self, token: &str, payer: &Payer) -> String {
        let paid = self.pay_reply(token, payer).await;
        assert!(paid.headers.contains_key("payment-response"), "a receipt of the settlement");
        paid.body["id"].as_str().unwrap().to_owned()
    }

    /// The page's payment's answer: the challenge, then the signed payment.
    async fn pay_reply(&self, token: &str, payer: &Payer) -> Reply {
        let asked = self.pay_link("POST", token, None).await;
        assert_eq!(asked.status, StatusCode::PAYMENT_REQUIRED, "{}", asked.body);
        let challenge = asked.headers["payment-required"].to_str().unwrap().to_owned();
        let paid = self.pay_link("POST", token, Some(&payer.sign(&challenge).await)).await;
        assert_eq!(paid.status, StatusCode::ACCEPTED, "{}", paid.body);
        paid
    }

    async fn tasks(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&self.pool).await.unwrap()
    }

    async fn done(self) {
        self.queue.delete().await;
    }
}

/// The elicitation of a `-32042` answer.
fn elicitation(answer: &Value) -> &Value {
    assert_eq!(answer["error"]["code"], -32042, "{answer}");
    let elicitations = answer["error"]["data"]["elicitations"].as_array().expect("data.elicitations");
    assert_eq!(elicitations.len(), 1, "{answer}");
    &elicitations[0]
}

/// The pay link's token in a URL (`…/#pay=<token>`).
fn token_in(url: &str) -> String {
    url.split_once("#pay=").unwrap_or_else(|| panic!("no #pay= in {url}")).1.to_owned()
}

/// A tool result's error code.
fn tool_error(answer: &Value) -> String {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    answer["result"]["structuredContent"]["error"]["code"].as_str().unwrap_or_else(|| panic!("{answer}")).to_owned()
}

/// x402's tool-result binding: the `PaymentRequired` as a tool error; its
/// `error`.
fn payment_required(answer: &Value) -> String {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let challenge = &answer["result"]["structuredContent"];
    assert_eq!(challenge["x402Version"], 2, "{answer}");
    challenge["error"].as_str().unwrap().to_owned()
}

fn sha256_of(input: &Value) -> String {
    hex::encode(Sha256::digest(input.to_string().as_bytes()))
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_client_that_declares_url_elicitation_gets_a_pay_link_and_its_retry_answers_the_task_paid_there(
    pool: PgPool,
) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let url = "http://127.0.0.1:1/paid-by-a-person";

    // Without URL elicitation declared (or with the declaration altered):
    // today's payment requirements, whose message names both ways to pay.
    assert_eq!(shop.initialize(json!({ "elicitation": {} })).await, None, "a form-only client gets no session id");
    let session = shop.initialize(json!({ "elicitation": { "url": {} } })).await.expect("a sealed declaration");
    let mut forged = session.clone().into_bytes();
    let at = forged.len() - 1;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    for session in [None, Some(String::from_utf8(forged).unwrap())] {
        let answer = shop.legacy_call(&shop.token, session.as_deref(), url).await;
        let why = payment_required(&answer);
        assert!(why.contains("x402") && why.contains("URL elicitation"), "{why}");
    }
    // An x402 client that also declares URL elicitation pays with x402.
    let both = shop.initialize(json!({ "elicitation": { "url": {} }, "extensions": { "org.x402/payment": {} } })).await;
    payment_required(&shop.legacy_call(&shop.token, both.as_deref(), url).await);

    // Declared: the -32042 error with the link, the same link when asked again.
    let first = shop.legacy_call(&shop.token, Some(&session), url).await;
    let asked = elicitation(&first).clone();
    assert_eq!(asked["mode"], "url");
    let link = asked["url"].as_str().unwrap().to_owned();
    assert!(link.starts_with("http://127.0.0.1:8080/#pay="), "the console beside the endpoint: {link}");
    assert!(!link.contains(&shop.token), "no session token in the link");
    assert!(asked["message"].as_str().unwrap().contains("again with the same arguments"), "{asked}");
    assert_eq!(elicitation(&shop.legacy_call(&shop.token, Some(&session), url).await)["url"], link.as_str());
    let token = token_in(&link);

    // The page reads the offer: the kind, the agent's input, its digest, the price.
    let offer = shop.pay_link("GET", &token, None).await;
    assert_eq!(offer.status, StatusCode::OK, "{}", offer.body);
    assert_eq!((&offer.body["kind"], &offer.body["input"]), (&json!("fetch"), &json!({ "url": url })));
    assert_eq!(offer.body["input_sha256"], sha256_of(&json!({ "url": url })));
    let accepts = offer.body["payment_required"]["accepts"].as_array().unwrap();
    assert!(accepts.iter().any(|a| a["amount"] == PRICE.to_string()), "{}", offer.body);
    assert_eq!(shop.tasks().await, 0, "reading the offer creates nothing");

    // A person pays it: one task in the agent's Space, one charge.
    let before = balance(&payer.address).await;
    let task = shop.pay(&token, &payer).await;
    assert_eq!(balance(&payer.address).await, before - PRICE);

    // Its signed receipt names what was paid for: the pay link.
    let receipt = send(&shop.app, common::get_authed(&format!("/v1/tasks/{task}/receipt"), &shop.token)).await;
    assert_eq!(receipt.status, StatusCode::OK, "{}", receipt.body);
    let receipt: reeve_shared::payments::offer_receipt::Signed = serde_json::from_value(receipt.body).unwrap();
    let signer = common::receipt_signer().parse().unwrap();
    let receipt = reeve_shared::payments::offer_receipt::verify(&receipt, Some(signer)).unwrap().payload;
    assert!(receipt["resourceUrl"].as_str().unwrap().ends_with("/v1/pay-link"), "{receipt}");
    assert_eq!(receipt["payer"].as_str().map(str::to_ascii_lowercase), Some(payer.address.to_ascii_lowercase()));

    // The agent's retried call, with the same arguments: that task.
    for _ in 0..2 {
        let retried = shop.legacy_call(&shop.token, Some(&session), url).await;
        let result = &retried["result"];
        assert_ne!(result["isError"], true, "{retried}");
        assert_eq!(result["structuredContent"]["id"], task.as_str(), "{retried}");
        assert_eq!(result["_meta"]["x402/payment-response"]["success"], true, "with its receipt: {retried}");
    }

    // Reused: refused, nothing charged; the page's read says so too.
    let again = shop.pay_link("POST", &token, Some(&payer.sign(&offer_header(&offer.body)).await)).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "pay_link_used"), "{}", again.body);
    let read = shop.pay_link("GET", &token, None).await;
    assert_eq!((read.status, read.code()), (StatusCode::CONFLICT, "pay_link_used"), "{}", read.body);
    assert_eq!(shop.tasks().await, 1, "one task");
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1, "one charge");
    assert_eq!(balance(&payer.address).await, before - PRICE);
    shop.done().await;
}

/// The challenge of an offer as its `PAYMENT-REQUIRED` header would carry it.
fn offer_header(offer: &Value) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(offer["payment_required"].to_string())
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_2026_client_retries_with_its_request_state_and_a_forged_changed_or_foreign_one_is_refused(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let url = "http://127.0.0.1:1/asked-in-2026";

    let first = shop.modern_call(&shop.token, url, None).await;
    let result = &first["result"];
    assert_eq!(result["resultType"], "input_required", "{first}");
    let request = &result["inputRequests"]["reeve/pay"];
    assert_eq!((&request["method"], &request["params"]["mode"]), (&json!("elicitation/create"), &json!("url")));
    let state = result["requestState"].as_str().unwrap().to_owned();
    assert_eq!(token_in(request["params"]["url"].as_str().unwrap()), state, "the state names the link");

    // Retried before it is paid: the same link again.
    let unpaid = shop.modern_call(&shop.token, url, Some(&state)).await;
    assert_eq!(unpaid["result"]["requestState"], state.as_str(), "{unpaid}");

    // A forged state, another input, another Space: each refused.
    let mut forged = state.clone().into_bytes();
    let at = forged.len() - 1;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let answer = shop.modern_call(&shop.token, url, Some(&forged)).await;
    assert_eq!(tool_error(&answer), "invalid_request_state", "{answer}");
    let answer = shop.modern_call(&shop.token, "http://127.0.0.1:1/another-input", Some(&state)).await;
    assert_eq!(tool_error(&answer), "pay_link_input_changed", "{answer}");
    let other = new_session(&shop.app).await.1;
    let answer = shop.modern_call(&other, url, Some(&state)).await;
    assert_eq!(tool_error(&answer), "pay_link_other_space", "{answer}");
    assert_eq!(shop.tasks().await, 0);

    // Paid on the page: the retry with its state answers that task.
    let task = shop.pay(&state, &payer).await;
    let paid = shop.modern_call(&shop.token, url, Some(&state)).await;
    assert_eq!(paid["result"]["structuredContent"]["id"], task.as_str(), "{paid}");
    // Still refused for another Space, which learns nothing of the task.
    let answer = shop.modern_call(&other, url, Some(&state)).await;
    assert_eq!(tool_error(&answer), "pay_link_other_space", "{answer}");
    assert_eq!(shop.tasks().await, 1);
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1);
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn an_expired_altered_or_missing_pay_link_is_refused_and_charges_nothing(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let url = "http://127.0.0.1:1/too-late";
    let session = shop.initialize(json!({ "elicitation": { "url": {} } })).await.unwrap();
    let link =
        elicitation(&shop.legacy_call(&shop.token, Some(&session), url).await)["url"].as_str().unwrap().to_owned();
    let token = token_in(&link);
    let offer = shop.pay_link("GET", &token, None).await;
    assert_eq!(offer.status, StatusCode::OK, "{}", offer.body);
    let signature = payer.sign(&offer_header(&offer.body)).await;

    // Altered, or none at all.
    let (id, mac) = token.split_once('.').unwrap();
    let flipped = match mac.strip_prefix('A') {
        Some(rest) => format!("B{rest}"),
        None => format!("A{}", &mac[1..]),
    };
    for bad in [format!("{id}.{flipped}"), id.to_owned(), String::new()] {
        let reply = shop.pay_link("POST", &bad, Some(&signature)).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::NOT_FOUND, "pay_link_invalid"), "{bad:?}");
    }

    // Past its 15 minutes: refused to read and to pay, with the signature.
    sqlx::query("UPDATE pay_links SET expires_at = now() - interval '1 second'").execute(&pool).await.unwrap();
    let before = balance(&payer.address).await;
    for method in ["GET", "POST"] {
        let reply = shop.pay_link(method, &token, Some(&signature)).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::CONFLICT, "pay_link_expired"), "{method}");
    }
    assert_eq!(balance(&payer.address).await, before, "nothing charged");
    assert_eq!(shop.tasks().await, 0);
    // The agent's state says so; calling again without it makes a new link.
    let modern = shop.modern_call(&shop.token, url, Some(&token)).await;
    assert_eq!(tool_error(&modern), "pay_link_expired", "{modern}");
    let fresh =
        elicitation(&shop.legacy_call(&shop.token, Some(&session), url).await)["url"].as_str().unwrap().to_owned();
    assert_ne!(fresh, link, "a new link");
    assert_eq!(shop.pay_link("GET", &token_in(&fresh), None).await.status, StatusCode::OK);
    // A Space keeps only its last hour's links: an older one is gone once
    // another is made.
    sqlx::query("UPDATE pay_links SET created_at = now() - interval '2 hours' WHERE expires_at < now()")
        .execute(&pool)
        .await
        .unwrap();
    elicitation(&shop.legacy_call(&shop.token, Some(&session), "http://127.0.0.1:1/another").await);
    let gone = shop.pay_link("GET", &token, None).await;
    assert_eq!((gone.status, gone.code()), (StatusCode::NOT_FOUND, "pay_link_invalid"), "{}", gone.body);
    assert_eq!(shop.pay_link("GET", &token_in(&fresh), None).await.status, StatusCode::OK, "the last hour's stay");
    assert!(charges_to(&shop.pay_to).await.is_empty());
    shop.done().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_metered_kind_paid_by_link_is_authorized_up_to_its_ceiling_and_the_retry_answers_its_task(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let url = "http://127.0.0.1:1/metered";
    let session = shop.initialize(json!({ "elicitation": { "url": {} } })).await.unwrap();
    let asked = shop.legacy_call_of(METERED, &shop.token, Some(&session), url).await;
    let link = elicitation(&asked)["url"].as_str().unwrap().to_owned();
    assert!(elicitation(&asked)["message"].as_str().unwrap().contains("up to"), "the ceiling in words: {asked}");
    let token = token_in(&link);
    let offer = shop.pay_link("GET", &token, None).await;
    let accepts = &offer.body["payment_required"]["accepts"];
    assert_eq!((&accepts[0]["scheme"], &accepts[0]["amount"]), (&json!("upto"), &json!(CEILING.to_string())));

    // Paid on the page: authorized up to the ceiling, nothing charged yet.
    let before = balance(&payer.address).await;
    let paid = shop.pay_reply(&token, &payer).await;
    let payment = &paid.body["payment"];
    assert_eq!((&payment["scheme"], &payment["status"]), (&json!("upto"), &json!("authorized")), "{}", paid.body);
    assert_eq!(payment["authorized"], CEILING.to_string());
    assert_eq!(balance(&payer.address).await, before, "charged only when the task ends");

    // The agent's retry: that task, its payment authorized.
    let retried = shop.legacy_call_of(METERED, &shop.token, Some(&session), url).await;
    let task = &retried["result"]["structuredContent"];
    assert_eq!(task["id"], paid.body["id"], "{retried}");
    assert_eq!(task["payment"]["status"], "authorized", "{retried}");
    assert_eq!(shop.tasks().await, 1);
    shop.done().await;
}
