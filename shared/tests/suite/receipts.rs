//! Signed offers and receipts (x402 `offer-receipt`) on the real payment
//! stack: the `402` carries offers signed with the seller's key, a paid
//! create's `PAYMENT-RESPONSE` its receipt, and `GET /v1/tasks/{id}/receipt`
//! the final one with proof of delivery. The official TypeScript package
//! (`@x402/extensions`, through `scripts/payments/verify-receipt.mjs`)
//! verifies them, and refuses a changed byte; a receipt signed by another
//! key verifies only as that key's, not the published signer's.

use crate::common;

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;

use aws_sdk_kms::types::{KeySpec, KeyUsageType};
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use base64::Engine;
use common::chain::{ChainLock, Payer, fresh_address};
use common::{Reply, TestQueue, get_authed, new_session, post_json, send};
use reeve_shared::http::app;
use reeve_shared::ids::Id;
use reeve_shared::kms::KmsKey;
use reeve_shared::payments::offer_receipt::{self, SellerKey, Signed, VerifyError};
use reeve_shared::settings::{self, Config};
use reeve_shared::worker::{Outcome, process};
use serde_json::{Value, json};
use sqlx::PgPool;

/// The development key's address (reeve.dev.toml's `receipt_signer`).
fn signer() -> String {
    common::receipt_signer()
}

fn decode(header: &str) -> Value {
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap()
}

/// A `fetch` priced a cent on the local chain, one metered per KiB
/// (x402 `upto`), and a free one, under a
/// catalog that publishes the development signer.
fn catalog(pay_to: &str) -> String {
    let tasks = r#"
        [tasks.fetch]
        title = "Fetch"
        description = "Fetch a URL"
        executor = "fetch"
        [tasks.fetch.input_schema]
        type = "object"
        required = ["url"]
        [tasks.fetch.input_schema.properties.url]
        type = "string"
        [[tasks.fetch.accepts]]
        asset = "local"
        amount_usd = "0.01"
        [tasks.metered]
        title = "Metered fetch"
        description = "Fetch a URL, paid per KiB"
        executor = "fetch"
        [tasks.metered.input_schema]
        type = "object"
        required = ["url"]
        [[tasks.metered.accepts]]
        asset = "local"
        scheme = "upto"
        unit = "KiB"
        rate = "7"
        amount = "1000"
        [tasks.free]
        title = "Free fetch"
        description = "Fetch a URL for nothing"
        executor = "fetch"
        [tasks.free.input_schema]
        type = "object"
    "#;
    let facilitator = std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into());
    common::signing_receipts(&common::paid_catalog_text(pay_to, &facilitator, 300, tasks))
}

struct Shop {
    app: Router,
    token: String,
    queue: TestQueue,
    config: Config,
}

impl Shop {
    async fn new(pool: &PgPool) -> Shop {
        let config = common::with_catalog(common::config(pool), &catalog(&fresh_address()))
            .with(settings::RECEIPT_KEY, common::RECEIPT_KEY);
        Shop::with(config).await
    }

    /// Signing with the KMS key `key_id`, whose address `signer` the
    /// catalog publishes.
    async fn in_kms(pool: &PgPool, key_id: &str, signer: &str) -> Shop {
        let catalog = catalog(&fresh_address()).replace(&self::signer(), signer);
        let config = common::with_catalog(common::config(pool), &catalog)
            .without(settings::RECEIPT_KEY)
            .with(settings::RECEIPT_KMS_KEY, key_id);
        Shop::with(config).await
    }

    async fn with(config: Config) -> Shop {
        let queue = TestQueue::new().await;
        let config = config.with(settings::QUEUE_URL, &queue.url);
        let app = app(common::api(&config).await);
        let token = new_session(&app).await.1;
        Shop { app, token, queue, config }
    }

    async fn create(&self, kind: &str, input: &Value, payment: Option<&str>) -> Reply {
        let mut r = post_json(&format!("/v1/tasks/{kind}"), Some(&self.token), &json!({ "input": input }));
        if let Some(p) = payment {
            r.headers_mut().insert("payment-signature", HeaderValue::from_str(p).unwrap());
        }
        send(&self.app, r).await
    }

    /// `fetch` of `input` paid by `payer` for the `402` `challenge`: the
    /// reply, the task's id, the settlement and the receipt it carries.
    async fn pay(&self, input: &Value, challenge: &str, payer: &Payer) -> (Reply, String, Value, Signed) {
        let reply = self.create("fetch", input, Some(&payer.sign(challenge).await)).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        let id = reply.body["id"].as_str().unwrap().to_owned();
        let settlement = decode(reply.headers["payment-response"].to_str().unwrap());
        let receipt = offer_receipt::receipt_in(&settlement).expect("the settlement carries the receipt");
        (reply, id, settlement, receipt)
    }

    async fn receipt(&self, id: &str) -> Reply {
        send(&self.app, get_authed(&format!("/v1/tasks/{id}/receipt"), &self.token)).await
    }

    async fn run(&self, id: &str) {
        let config = common::loopback_outbound(
            self.config.clone().without(settings::QUEUE_URL).with(settings::WORKER_CONCURRENCY, "1"),
        );
        let worker = common::worker(&config).await;
        self.queue.drain().await;
        assert_eq!(process(&worker, &json!({"task_id": id, "kind": "fetch"}).to_string(), 1).await, Outcome::Done);
    }
}

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// What `@x402/extensions` makes of `input` (scripts/payments/verify-receipt.mjs).
fn typescript_verifies(input: &Value) -> Value {
    let mut child = std::process::Command::new("node")
        .arg(common::chain::root().join("scripts/payments/verify-receipt.mjs"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("node: {e}; run scripts/payments.sh up"));
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "verify-receipt.mjs: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `signed` with one byte of its JWS payload changed (a digit of a number
/// or a hex digit: still valid base64url and JSON).
fn one_byte_changed(signed: &Signed) -> Signed {
    let parts: Vec<&str> = signed.signature.split('.').collect();
    let text = String::from_utf8(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    let at = text.find("\"amount\":\"").unwrap() + "\"amount\":\"".len();
    let mut bytes = text.into_bytes();
    bytes[at] = if bytes[at] == b'9' { b'8' } else { bytes[at] + 1 };
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    Signed { signature: format!("{}.{payload}.{}", parts[0], parts[2]), ..signed.clone() }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_paid_task_s_offer_and_receipts_are_signed_and_the_typescript_package_verifies_them(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let site = serve(Router::new().route("/page", axum::routing::get(|| async { "paid for" }))).await;
    let input = json!({"url": format!("http://{site}/page")});
    let published = signer();
    let address: alloy_primitives::Address = published.parse().unwrap();

    // The 402: one offer per `accepts` entry, signed, naming this request.
    let reply = shop.create("fetch", &input, None).await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
    let header = reply.headers["payment-required"].to_str().unwrap().to_owned();
    let challenge = decode(&header);
    assert_eq!(challenge, reply.body, "the header and the body are one document");
    let extension = &challenge["extensions"]["offer-receipt"];
    assert_eq!(extension["info"]["signer"]["address"], published.as_str());
    let offers: Vec<Signed> = serde_json::from_value(extension["info"]["offers"].clone()).unwrap();
    assert_eq!(offers.len(), challenge["accepts"].as_array().unwrap().len());
    let offer = offer_receipt::verify(&offers[0], Some(address)).unwrap().payload;
    let accepted = &challenge["accepts"][0];
    for (field, value) in [("scheme", "scheme"), ("network", "network"), ("asset", "asset"), ("payTo", "payTo")] {
        assert_eq!(offer[field], accepted[value], "{field}");
    }
    assert_eq!(offer["amount"], "10000");
    assert_eq!(offer["kind"], "fetch");
    assert_eq!(offer["inputSha256"], offer_receipt::sha256_json(&input));
    assert_eq!(offers[0].accept_index, Some(0));

    // Paid: the PAYMENT-RESPONSE carries the receipt, before any delivery.
    let (reply, id, settlement, first) = shop.pay(&input, &header, &payer).await;
    let paid = offer_receipt::verify(&first, Some(address)).unwrap().payload;
    assert_eq!(paid["task"], id.as_str());
    assert_eq!(paid["transaction"], settlement["transaction"]);
    assert_eq!(paid["payer"], settlement["payer"]);
    assert_eq!((paid["amount"].as_str(), paid["scheme"].as_str()), (Some("10000"), Some("exact")));
    assert_eq!(paid["inputSha256"], offer["inputSha256"]);
    assert_eq!(paid["resourceUrl"], challenge["resource"]["url"]);
    assert!(paid.get("delivery").is_none(), "not delivered yet: {paid}");
    let again = shop.receipt(&id).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body, serde_json::to_value(&first).unwrap(), "the same receipt until the task ends");

    // Delivered: the final receipt hashes the result and the stored body.
    shop.run(&id).await;
    let task = send(&shop.app, get_authed(&format!("/v1/tasks/{id}"), &shop.token)).await.body;
    assert_eq!(task["status"], "completed", "{task}");
    let last = shop.receipt(&id).await;
    assert_eq!(last.status, StatusCode::OK, "{}", last.body);
    let last: Signed = serde_json::from_value(last.body).unwrap();
    let delivered = offer_receipt::verify(&last, Some(address)).unwrap().payload;
    assert_eq!(delivered["delivery"]["status"], "completed");
    assert_eq!(delivered["delivery"]["resultSha256"], offer_receipt::result_sha256(&task["result"]));
    let body_sha256 = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b"paid for"))
    };
    assert_eq!(delivered["delivery"]["outputs"], json!([{"name": "body", "size": 8, "sha256": body_sha256}]));
    assert_eq!(shop.receipt(&id).await.body, serde_json::to_value(&last).unwrap(), "final, and stable");

    // The key is in no answer.
    let key_hex = common::RECEIPT_KEY.trim_start_matches("0x");
    for text in [header.clone(), reply.body.to_string(), settlement.to_string(), serde_json::to_string(&last).unwrap()]
    {
        assert!(!text.contains(key_hex), "the receipt key leaked");
    }

    // The official TypeScript package: the offer and both receipts verify,
    // and each names the published signer; a changed byte is refused; a
    // receipt signed by another key verifies as that key's only.
    let other = SellerKey::from_hex(&"42".repeat(32)).unwrap();
    let forged = other.sign(&delivered).await.unwrap();
    let checked = typescript_verifies(&json!({
        "paymentRequired": challenge,
        "receipts": [settlement, last, one_byte_changed(&last), forged],
    }));
    let offer_ts = &checked["offers"][0];
    assert_eq!(offer_ts["ok"], true, "{checked}");
    assert_eq!(offer_ts["signer"], published.as_str());
    assert_eq!(offer_ts["payload"], offer);
    assert_eq!(offer_ts["accepts"], *accepted, "the offer matches its accepts entry");
    let receipts = checked["receipts"].as_array().unwrap();
    assert_eq!((receipts[0]["ok"].as_bool(), receipts[0]["signer"].as_str()), (Some(true), Some(published.as_str())));
    assert_eq!(receipts[0]["payload"], paid);
    assert_eq!((receipts[1]["ok"].as_bool(), receipts[1]["signer"].as_str()), (Some(true), Some(published.as_str())));
    assert_eq!(receipts[1]["payload"], delivered);
    assert_eq!(receipts[2]["ok"], false, "a changed byte: {}", receipts[2]);
    assert_eq!(receipts[3]["ok"], true, "another key's own signature holds");
    assert_ne!(receipts[3]["signer"], published.as_str(), "but it is not the published signer's");
    // Reeve's own check refuses both.
    assert_eq!(offer_receipt::verify(&one_byte_changed(&last), Some(address)), Err(VerifyError::BadSignature));
    assert!(matches!(offer_receipt::verify(&forged, Some(address)), Err(VerifyError::WrongSigner { .. })));
    shop.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_task_without_a_payment_of_its_own_has_no_receipt(pool: PgPool) {
    let shop = Shop::new(&pool).await;
    let reply = shop.create("free", &json!({}), None).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let free = shop.receipt(reply.body["id"].as_str().unwrap()).await;
    assert_eq!(free.status, StatusCode::NOT_FOUND);
    assert_eq!(free.body["error"]["code"], "no_receipt", "{}", free.body);
    assert!(free.body["error"]["message"].as_str().unwrap().contains("free"), "{}", free.body);
    // No such task, not a task id, another Space's: the one 404.
    for id in [Id::new().to_string(), "nope".to_owned()] {
        let missing = shop.receipt(&id).await;
        assert_eq!(
            (missing.status, missing.body["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("task_not_found"))
        );
    }
    let (_, stranger) = new_session(&shop.app).await;
    let request = Request::get(format!("/v1/tasks/{}/receipt", reply.body["id"].as_str().unwrap()))
        .header("authorization", format!("Bearer {stranger}"))
        .body(Body::empty())
        .unwrap();
    let theirs = send(&shop.app, request).await;
    assert_eq!(theirs.body["error"]["code"], "task_not_found", "{}", theirs.body);
    // Without a session: 401.
    let anonymous = send(&shop.app, Request::get("/v1/tasks/x/receipt").body(Body::empty()).unwrap()).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    shop.queue.delete().await;
}

/// A task a credit paid for has a receipt too: scheme `credit`, naming the
/// credit and the canceled task that left it, with the payer and the
/// transaction of the payment the credit was owed for; the TypeScript
/// package verifies it under the published signer.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_task_paid_with_a_credit_has_a_receipt_naming_the_credit_and_the_payment_behind_it(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let address: alloy_primitives::Address = signer().parse().unwrap();
    let input = json!({"url": "http://127.0.0.1:1/credited"});

    // Paid, then canceled before it ran: the Space holds a credit.
    let asked = shop.create("fetch", &input, None).await;
    assert_eq!(asked.status, StatusCode::PAYMENT_REQUIRED, "{}", asked.body);
    let challenge = asked.headers["payment-required"].to_str().unwrap().to_owned();
    let paid = shop.create("fetch", &input, Some(&payer.sign(&challenge).await)).await;
    assert_eq!(paid.status, StatusCode::ACCEPTED, "{}", paid.body);
    let canceled = paid.body["id"].as_str().unwrap().to_owned();
    let settlement = decode(paid.headers["payment-response"].to_str().unwrap());
    let cancel = post_json(&format!("/v1/tasks/{canceled}/cancel"), Some(&shop.token), &json!({}));
    assert_eq!(send(&shop.app, cancel).await.status, StatusCode::OK);

    // The next task of that price is paid by the credit, with no payment.
    let credited = shop.create("fetch", &input, None).await;
    assert_eq!(credited.status, StatusCode::ACCEPTED, "{}", credited.body);
    assert!(credited.headers.get("payment-response").is_none(), "no settlement of its own");
    let id = credited.body["id"].as_str().unwrap().to_owned();
    let reply = shop.receipt(&id).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let signed: Signed = serde_json::from_value(reply.body).unwrap();
    let receipt = offer_receipt::verify(&signed, Some(address)).unwrap().payload;
    assert_eq!((receipt["task"].as_str(), receipt["scheme"].as_str()), (Some(id.as_str()), Some("credit")));
    assert_eq!(receipt["amount"], "10000");
    assert_eq!(receipt["transaction"], settlement["transaction"], "the payment the credit came from");
    assert_eq!(receipt["payer"], settlement["payer"]);
    assert_eq!(receipt["credit"]["sourceTask"], canceled.as_str());
    assert_eq!(receipt["credit"]["reason"], "canceled");
    let space = send(&shop.app, get_authed("/v1/space", &shop.token)).await.body;
    assert_eq!(receipt["credit"]["id"], space["credits"][0]["id"], "the credit the Space lists: {space}");
    assert_eq!(receipt["inputSha256"], offer_receipt::sha256_json(&input));

    // The canceled task's own receipt still names its own payment.
    let own: Signed = serde_json::from_value(shop.receipt(&canceled).await.body).unwrap();
    let own = offer_receipt::verify(&own, Some(address)).unwrap().payload;
    assert_eq!((own["scheme"].as_str(), own.get("credit")), (Some("exact"), None));

    let checked = typescript_verifies(&json!({ "receipts": [signed] }));
    let verified = &checked["receipts"][0];
    assert_eq!((verified["ok"].as_bool(), verified["signer"].as_str()), (Some(true), Some(signer().as_str())));
    assert_eq!(verified["payload"], receipt);
    shop.queue.delete().await;
}

/// A catalog that publishes a signer needs that signer's key: start-up
/// refuses a missing or another key, naming the variable, never its value.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn start_up_refuses_a_missing_or_wrong_receipt_key(pool: PgPool) {
    let config = common::with_catalog(common::config(&pool), &catalog(&fresh_address()));
    let sdk = reeve_shared::startup::sdk().await;
    let wrong = "0x".to_owned() + &"42".repeat(32);
    for (key, expected) in [
        (None, "REEVE_RECEIPT_KEY is not set"),
        (Some(wrong.as_str()), "REEVE_RECEIPT_KEY is the key of"),
        (Some("0x1234"), "REEVE_RECEIPT_KEY must be 32 bytes"),
    ] {
        let config = match key {
            Some(key) => config.clone().with(settings::RECEIPT_KEY, key),
            None => config.clone().without(settings::RECEIPT_KEY),
        };
        let problems = match reeve_shared::startup::task_status(&config, &sdk).await {
            Ok(_) => panic!("started with {key:?}"),
            Err(e) => e.problems().join("\n"),
        };
        assert!(problems.contains(expected), "{problems}");
        assert!(!problems.contains(&"42".repeat(32)), "the key is never quoted: {problems}");
    }
}

/// MCP's `tasks/get` answers a paid task's final result with its final
/// signed receipt (the proof of delivery: the result's SHA-256 and the
/// stored body's) in the settlement's `offer-receipt` extension, where the
/// paid call's handle had its first one: for a task paid its price
/// (`exact`) and one charged what it used (`upto`). It is the receipt
/// `GET /v1/tasks/{id}/receipt` answers, but for the resource, which names
/// the tool the call paid for, as the call's first receipt did.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn mcp_tasks_get_carries_the_final_receipt_of_an_exact_and_a_metered_task_naming_what_was_paid(pool: PgPool) {
    use crate::lambda_events::through_lambda;
    use crate::mcp::sample_event;
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = serve(Router::new().route("/page", axum::routing::get(|| async { "paid for" }))).await;
    let input = json!({"url": format!("http://{site}/page")});
    let address: alloy_primitives::Address = signer().parse().unwrap();
    let sdk = reeve_shared::startup::sdk().await;
    let deployed = shop.config.clone().with(settings::MCP_ALLOWED_HOSTS, "*");
    let mcp =
        reeve_shared::mcp::router(reeve_shared::startup::mcp(&deployed, &sdk).await.unwrap_or_else(|e| panic!("{e}")));
    let call = |kind: &str, payment: Option<String>| {
        sample_event("mcp-tools-call-task", Some(&shop.token), |params| {
            params["name"] = json!(kind);
            params["arguments"] = input.clone();
            if let Some(payment) = payment {
                params["_meta"]["x402/payment"] = json!(payment);
            }
        })
    };
    for (kind, scheme) in [("fetch", "exact"), ("metered", "upto")] {
        let unpaid = through_lambda(mcp.clone(), &call(kind, None)).await;
        let challenge = &unpaid.body["result"]["structuredContent"];
        assert_eq!(challenge["accepts"][0]["scheme"], scheme, "{}", unpaid.body);
        let signature = payer.sign(&challenge.to_string()).await;
        let handle = through_lambda(mcp.clone(), &call(kind, Some(signature))).await.body["result"].clone();
        assert_eq!(handle["resultType"], "task", "{handle}");
        let id = handle["taskId"].as_str().unwrap().to_owned();
        shop.run_to_end(&id, kind).await;

        let get = sample_event("mcp-tasks-get", Some(&shop.token), |params| params["taskId"] = json!(id));
        let done = through_lambda(mcp.clone(), &get).await.body["result"].clone();
        assert_eq!(done["status"], "completed", "{kind}: {done}");
        let settlement = &done["result"]["_meta"]["x402/payment-response"];
        let carried = offer_receipt::receipt_in(settlement).unwrap_or_else(|| panic!("{kind}: no receipt in {done}"));
        let carried = offer_receipt::verify(&carried, Some(address)).unwrap().payload;
        let task = &done["result"]["structuredContent"];
        assert_eq!(carried["delivery"]["status"], "completed", "{kind}: {carried}");
        assert_eq!(carried["delivery"]["resultSha256"], offer_receipt::result_sha256(&task["result"]), "{kind}");
        let body_sha256 = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(b"paid for"))
        };
        assert_eq!(carried["delivery"]["outputs"], json!([{"name": "body", "size": 8, "sha256": body_sha256}]));
        assert_eq!((carried["task"].as_str(), carried["scheme"].as_str()), (Some(id.as_str()), Some(scheme)));
        assert_eq!(carried["resourceUrl"], format!("mcp://tool/{kind}"), "the tool paid for: {carried}");
        assert_eq!(carried["transaction"], settlement["transaction"], "{kind}: {done}");
        if scheme == "upto" {
            assert_eq!(carried["amount"], task["payment"]["charged"], "what it used: {carried}");
            assert_eq!(carried["metered"]["unit"], "KiB", "{carried}");
        }
        // The REST route answers the same receipt: it names the tool that
        // was paid, not the route that reads it.
        let rest: Signed = serde_json::from_value(shop.receipt(&id).await.body).unwrap();
        let rest = offer_receipt::verify(&rest, Some(address)).unwrap().payload;
        assert_eq!(rest, carried, "{kind}");
    }

    // A paid call, not as a task, that waits for its task's end (a worker
    // runs it meanwhile): its result carries the final receipt, with the
    // proof of delivery, not the one signed when it was paid.
    let waiting = |payment: Option<String>| {
        sample_event("mcp-tools-call-task", Some(&shop.token), |params| {
            params["name"] = json!("fetch");
            params["arguments"] = input.clone();
            params["arguments"]["wait_seconds"] = json!(20);
            if let Some(payment) = payment {
                params["_meta"]["x402/payment"] = json!(payment);
            }
            params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
        })
    };
    let unpaid = through_lambda(mcp.clone(), &waiting(None)).await;
    let challenge = unpaid.body["result"]["structuredContent"].to_string();
    let call = waiting(Some(payer.sign(&challenge).await));
    let worker = common::worker(&common::loopback_outbound(shop.config.clone())).await;
    let done = std::sync::atomic::AtomicBool::new(false);
    let (waited, ()) = tokio::join!(
        async {
            let answer = through_lambda(mcp.clone(), &call).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            answer
        },
        async {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                for message in shop.queue.drain().await {
                    let _ = process(&worker, &message.to_string(), 1).await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    );
    let waited = &waited.body["result"];
    assert_eq!(waited["structuredContent"]["status"], "completed", "{waited}");
    let settlement = &waited["_meta"]["x402/payment-response"];
    let last = offer_receipt::receipt_in(settlement).unwrap_or_else(|| panic!("no receipt in {waited}"));
    let last = offer_receipt::verify(&last, Some(address)).unwrap().payload;
    assert_eq!(last["delivery"]["status"], "completed", "the final receipt: {last}");
    assert_eq!(last["delivery"]["resultSha256"], offer_receipt::result_sha256(&waited["structuredContent"]["result"]));

    // And the other way: a task paid through REST still names the REST
    // resource when MCP's tasks/get reads its receipt.
    let unpaid = shop.create("fetch", &input, None).await;
    assert_eq!(unpaid.status, StatusCode::PAYMENT_REQUIRED, "{}", unpaid.body);
    let header = unpaid.headers["payment-required"].to_str().unwrap().to_owned();
    let paid_for = decode(&header)["resource"]["url"].clone();
    assert!(paid_for.as_str().unwrap().ends_with("/v1/tasks/fetch"), "{paid_for}");
    let reply = shop.create("fetch", &input, Some(&payer.sign(&header).await)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = reply.body["id"].as_str().unwrap().to_owned();
    shop.run_to_end(&id, "fetch").await;
    let get = sample_event("mcp-tasks-get", Some(&shop.token), |params| params["taskId"] = json!(id));
    let done = through_lambda(mcp.clone(), &get).await.body["result"].clone();
    let settlement = &done["result"]["_meta"]["x402/payment-response"];
    let carried = offer_receipt::receipt_in(settlement).unwrap_or_else(|| panic!("no receipt in {done}"));
    let carried = offer_receipt::verify(&carried, Some(address)).unwrap().payload;
    assert_eq!(carried["resourceUrl"], paid_for, "the route paid for: {carried}");
    let rest: Signed = serde_json::from_value(shop.receipt(&id).await.body).unwrap();
    assert_eq!(offer_receipt::verify(&rest, Some(address)).unwrap().payload, carried);
    shop.queue.delete().await;
}

impl Shop {
    /// Runs task `id` of `kind` to its end, as the worker does: its run, and
    /// for a metered task the capture after it, through the queue.
    async fn run_to_end(&self, id: &str, kind: &str) {
        let config = common::loopback_outbound(self.config.clone().with(settings::WORKER_CONCURRENCY, "1"));
        let worker = common::worker(&config).await;
        self.queue.drain().await;
        let _ = process(&worker, &json!({"task_id": id, "kind": kind}).to_string(), 1).await;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let task = send(&self.app, get_authed(&format!("/v1/tasks/{id}"), &self.token)).await.body;
            if task["status"] != "running" && task["status"] != "queued" {
                return;
            }
            for message in self.queue.drain().await {
                let _ = process(&worker, &message.to_string(), 1).await;
            }
            assert!(std::time::Instant::now() < until, "task {id} is still {} after 120 s", task["status"]);
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
}

/// A key made in the stack's KMS (moto): its ARN.
async fn kms_key(kms: &aws_sdk_kms::Client, spec: KeySpec, usage: KeyUsageType) -> String {
    let made = kms.create_key().key_spec(spec).key_usage(usage).send().await.expect("moto makes KMS keys");
    made.key_metadata().unwrap().arn().unwrap().to_owned()
}

/// The seller's key in KMS, where it never leaves: start-up reads its
/// public half, and offers and receipts are signed by KMS, every signature
/// with a low `s` (KMS's own are either), each verifying as the published
/// signer's in Reeve and in the official TypeScript package, though KMS
/// signs the same payload differently each time. With KMS out of reach a
/// `402` goes without offers, still payable, and a receipt answers
/// `503 signer_unavailable` with a `Retry-After`, until KMS is back.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_seller_key_in_kms_signs_offers_and_receipts_that_verify_as_the_published_signer(pool: PgPool) {
    let sdk = reeve_shared::startup::sdk().await;
    let kms = aws_sdk_kms::Client::new(&sdk);
    let arn = kms_key(&kms, KeySpec::EccSecgP256K1, KeyUsageType::SignVerify).await;
    let seller = SellerKey::in_kms(KmsKey::new(&sdk, &arn)).await.unwrap();
    let (address, published) = (seller.address(), seller.address().to_checksum(None));
    assert!(format!("{seller:?}").contains(&arn), "its Debug names the key's id: {seller:?}");

    // KMS signs: each signature verifies, with a low `s`; not deterministic.
    let payload = json!({"version": 1, "task": "t", "amount": "10000"});
    let mut seen = std::collections::HashSet::new();
    for _ in 0..16 {
        let signed = seller.sign(&payload).await.unwrap();
        assert_eq!(offer_receipt::verify(&signed, Some(address)).unwrap().payload, payload);
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(signed.signature.rsplit('.').next().unwrap())
            .unwrap();
        let signature = alloy_signer::k256::ecdsa::Signature::from_slice(&raw).unwrap();
        assert!(signature.normalize_s().is_none(), "a high s, which noble refuses: {}", signed.signature);
        seen.insert(signed.signature);
    }
    assert!(seen.len() > 1, "KMS's ECDSA is randomised, not RFC 6979");

    // The API, started with the key's id: its 402 offers and the paid
    // task's receipts are KMS's.
    let chain = ChainLock::shared().await;
    let shop = Shop::in_kms(&pool, &arn, &published).await;
    let payer = Payer::new(&chain, 1_000_000).await;
    let input = json!({"url": "http://127.0.0.1:1/kms"});
    let reply = shop.create("fetch", &input, None).await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
    let header = reply.headers["payment-required"].to_str().unwrap().to_owned();
    let challenge = decode(&header);
    assert_eq!(challenge["extensions"]["offer-receipt"]["info"]["signer"]["address"], published.as_str());
    let offers: Vec<Signed> =
        serde_json::from_value(challenge["extensions"]["offer-receipt"]["info"]["offers"].clone()).unwrap();
    let offer = offer_receipt::verify(&offers[0], Some(address)).unwrap().payload;
    assert_eq!(offer["inputSha256"], offer_receipt::sha256_json(&input));
    let (_, id, settlement, first) = shop.pay(&input, &header, &payer).await;
    let paid = offer_receipt::verify(&first, Some(address)).unwrap().payload;
    assert_eq!(
        (paid["task"].as_str(), paid["transaction"].clone()),
        (Some(id.as_str()), settlement["transaction"].clone())
    );
    let again = shop.receipt(&id).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    let again: Signed = serde_json::from_value(again.body).unwrap();
    assert_eq!(offer_receipt::verify(&again, Some(address)).unwrap().payload, paid, "the same receipt, signed again");
    let checked = typescript_verifies(&json!({
        "paymentRequired": challenge,
        "receipts": [settlement, again, one_byte_changed(&again)],
    }));
    assert_eq!(
        (checked["offers"][0]["ok"].as_bool(), checked["offers"][0]["signer"].as_str()),
        (Some(true), Some(published.as_str())),
        "{checked}"
    );
    let receipts = checked["receipts"].as_array().unwrap();
    for receipt in &receipts[..2] {
        assert_eq!(
            (receipt["ok"].as_bool(), receipt["signer"].as_str()),
            (Some(true), Some(published.as_str())),
            "{checked}"
        );
        assert_eq!(receipt["payload"], paid);
    }
    assert_eq!(receipts[2]["ok"], false, "a changed byte: {}", receipts[2]);

    // KMS out of reach: the task-create and task-status functions, their
    // key reached through a proxy this test cuts.
    let moto: url::Url = common::env("AWS_ENDPOINT_URL_KMS").parse().unwrap();
    let proxy = common::cuttable::Cuttable::to((moto.host_str().unwrap().to_owned(), moto.port().unwrap())).await;
    let through =
        aws_sdk_kms::config::Builder::from(&sdk).endpoint_url(format!("http://127.0.0.1:{}", proxy.port)).build();
    let cut_off =
        Arc::new(SellerKey::in_kms(KmsKey::with_client(aws_sdk_kms::Client::from_conf(through), &arn)).await.unwrap());
    let mut create = reeve_shared::startup::task_create(&shop.config, &sdk).await.unwrap_or_else(|e| panic!("{e}"));
    Arc::get_mut(&mut create).unwrap().settings.seller = Some(cut_off.clone());
    let mut status = reeve_shared::startup::task_status(&shop.config, &sdk).await.unwrap_or_else(|e| panic!("{e}"));
    Arc::get_mut(&mut status).unwrap().seller = Some(cut_off);
    let (create, status) = (reeve_shared::http::task_create_app(create), reeve_shared::http::task_status_app(status));
    let challenge_of = |reply: &Reply| decode(reply.headers["payment-required"].to_str().unwrap());
    let create_request = || post_json("/v1/tasks/fetch", Some(&shop.token), &json!({ "input": input }));
    let receipt_request = || get_authed(&format!("/v1/tasks/{id}/receipt"), &shop.token);

    proxy.cut();
    let unsigned = send(&create, create_request()).await;
    assert_eq!(unsigned.status, StatusCode::PAYMENT_REQUIRED, "{}", unsigned.body);
    let unsigned = challenge_of(&unsigned);
    assert_eq!(unsigned["accepts"], challenge["accepts"], "still payable");
    assert!(unsigned["extensions"].get("offer-receipt").is_none(), "no offers: {unsigned}");
    let refused = send(&status, receipt_request()).await;
    assert_eq!(
        (refused.status, refused.code()),
        (StatusCode::SERVICE_UNAVAILABLE, "signer_unavailable"),
        "{}",
        refused.body
    );
    assert_eq!(refused.headers["retry-after"], "5");
    assert!(!refused.body.to_string().contains("127.0.0.1"), "no endpoint in the answer: {}", refused.body);

    proxy.restore();
    let signed = challenge_of(&send(&create, create_request()).await);
    let offers: Vec<Signed> =
        serde_json::from_value(signed["extensions"]["offer-receipt"]["info"]["offers"].clone()).unwrap();
    assert!(offer_receipt::verify(&offers[0], Some(address)).is_ok());
    let back = send(&status, receipt_request()).await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.body);
    let back: Signed = serde_json::from_value(back.body).unwrap();
    assert_eq!(offer_receipt::verify(&back, Some(address)).unwrap().payload, paid);
    shop.queue.delete().await;
}

/// Start-up takes a KMS key only when it is a secp256k1 signing key whose
/// address is the catalog's signer, and only one key: every other case is
/// a problem naming the variable and KMS's own reason.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn start_up_refuses_a_kms_key_that_is_not_the_published_secp256k1_signer(pool: PgPool) {
    let sdk = reeve_shared::startup::sdk().await;
    let kms = aws_sdk_kms::Client::new(&sdk);
    let config = common::with_catalog(common::config(&pool), &catalog(&fresh_address())).without(settings::RECEIPT_KEY);
    let symmetric = kms_key(&kms, KeySpec::SymmetricDefault, KeyUsageType::EncryptDecrypt).await;
    let p256 = kms_key(&kms, KeySpec::EccNistP256, KeyUsageType::SignVerify).await;
    // A secp256k1 key, but not the published signer's.
    let another = kms_key(&kms, KeySpec::EccSecgP256K1, KeyUsageType::SignVerify).await;
    for (key, receipt_key, expected) in [
        (symmetric.as_str(), None, "is not a secp256k1 signing key"),
        (p256.as_str(), None, "its KeySpec is ECC_NIST_P256"),
        (another.as_str(), None, "REEVE_RECEIPT_KMS_KEY_ID is the key of"),
        ("alias/reeve-no-such-key", None, "cannot use the KMS key alias/reeve-no-such-key: NotFoundException"),
        (another.as_str(), Some(common::RECEIPT_KEY), "set REEVE_RECEIPT_KEY or REEVE_RECEIPT_KMS_KEY_ID, not both"),
    ] {
        let mut config = config.clone().with(settings::RECEIPT_KMS_KEY, key);
        if let Some(receipt_key) = receipt_key {
            config = config.with(settings::RECEIPT_KEY, receipt_key);
        }
        let problems = match reeve_shared::startup::task_status(&config, &sdk).await {
            Ok(_) => panic!("started with the KMS key {key}"),
            Err(e) => e.problems().join("\n"),
        };
        assert!(problems.contains(expected), "{key}: {problems}");
    }
}

/// `reeve config check` with a KMS key in the environment: a key of
/// another address than the published signer is a problem naming the
/// key's own address (how an operator learns what to publish); without any
/// key in the environment the check leaves the signer alone.
#[tokio::test]
async fn the_config_check_names_the_address_of_a_kms_key_that_is_not_the_published_signer() {
    let sdk = reeve_shared::startup::sdk().await;
    let arn = kms_key(&aws_sdk_kms::Client::new(&sdk), KeySpec::EccSecgP256K1, KeyUsageType::SignVerify).await;
    let address = SellerKey::in_kms(KmsKey::new(&sdk, &arn)).await.unwrap().address();
    let catalog = reeve_shared::catalog::Catalog::parse(&catalog(&fresh_address())).unwrap();
    let without_keys = Config::from_env().without(settings::RECEIPT_KEY).without(settings::RECEIPT_KEY_SECRET_ARN);

    let mut problems = Vec::new();
    reeve_shared::startup::receipt_key_check(&without_keys, &catalog, &mut problems).await;
    assert_eq!(problems, Vec::<String>::new());

    let mut problems = Vec::new();
    let with_kms = without_keys.with(settings::RECEIPT_KMS_KEY, &arn);
    reeve_shared::startup::receipt_key_check(&with_kms, &catalog, &mut problems).await;
    let expected = format!(
        "REEVE_RECEIPT_KMS_KEY_ID is the key of {address}, not of the catalog's [payments] receipt_signer {}",
        signer()
    );
    assert_eq!(problems, [expected]);
}
