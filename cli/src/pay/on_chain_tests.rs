//! The `upto` payments `--pay` signs, against the local stack's real x402
//! facilitator and chain (`scripts/payments.sh up`): `/verify` accepts them,
//! `/settle` of part of the ceiling moves exactly that part, and a payer
//! that never approved Permit2 and holds no gas pays through the token's
//! permit when the 402 offers gas sponsoring. The payment is built the way
//! `shared/tests/suite/upto.rs` builds the official clients', and compared
//! with `@x402/evm`'s own for the same challenge.

use base64::Engine;
use serde_json::{Value, json};

use super::{PaymentRequired, payment_header};

/// The local chain harness the shared crate's tests use: its locks hold
/// across every test process on the machine.
#[allow(dead_code)]
#[path = "../../../shared/tests/common/chain.rs"]
mod chain;

use chain::{ChainLock, Client, PERMIT2, Payer, TOKEN, UPTO_PROXY, allowance, balance, charges_to, eth_balance};

/// A task's ceiling: 1 token of 6 decimals, of which 250000 is used.
const CEILING: u128 = 1_000_000;
const USED: u128 = 250_000;
const FUNDS: u128 = 10_000_000;

fn facilitator_url() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

async fn facilitator(path: &str, body: Option<Value>) -> Value {
    let http = reqwest::Client::new();
    let request = match body {
        Some(body) => http
            .post(format!("{}{path}", facilitator_url()))
            .header("content-type", "application/json")
            .body(body.to_string()),
        None => http.get(format!("{}{path}", facilitator_url())),
    };
    let answer = request.send().await.unwrap_or_else(|e| panic!("the facilitator is down ({e})"));
    assert!(answer.status().is_success(), "{path}: {}", answer.status());
    serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap()
}

/// The address a payer must name as its upto facilitator, from `/supported`.
async fn facilitator_address() -> String {
    let supported = facilitator("/supported", None).await;
    let upto = supported["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["scheme"] == "upto" && k["network"] == "eip155:84532")
        .unwrap_or_else(|| panic!("the facilitator does not settle upto: {supported}; run scripts/payments.sh up"));
    upto["extra"]["facilitatorAddress"].as_str().unwrap().to_owned()
}

/// An upto requirement for the ceiling to `pay_to`, as a seller offers it.
fn requirement(pay_to: &str, facilitator: &str) -> Value {
    json!({
        "scheme": "upto",
        "network": "eip155:84532",
        "amount": CEILING.to_string(),
        "asset": TOKEN,
        "payTo": pay_to,
        "maxTimeoutSeconds": 300,
        "extra": {"name": "USDC", "version": "2", "facilitatorAddress": facilitator},
    })
}

/// The 402 body for one requirement, offering EIP-2612 gas sponsoring or not.
fn challenge(requirement: &Value, sponsored: bool) -> Value {
    let mut required = json!({
        "x402Version": 2,
        "error": "payment required",
        "resource": {"url": "http://127.0.0.1/v1/tasks", "description": "a metered task", "mimeType": "application/json"},
        "accepts": [requirement],
    });
    if sponsored {
        required["extensions"] = json!({"eip2612GasSponsoring": {
            "info": {"description": "The facilitator accepts an EIP-2612 permit for Permit2.", "version": "1"},
            "schema": {},
        }});
    }
    required
}

/// What `reeve task create --pay` sends for `challenge`: the decoded
/// payment, and the note it prints.
async fn pay(payer: &Payer, challenge: &Value, chain_rpc: Option<&str>) -> (Value, Option<String>) {
    let challenge: PaymentRequired = serde_json::from_value(challenge.clone()).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let signed = payment_header(&challenge, &payer.key, now, chain_rpc).await.unwrap();
    let bytes = base64::engine::general_purpose::STANDARD.decode(&signed.header).unwrap();
    (serde_json::from_slice(&bytes).unwrap(), signed.note)
}

async fn verify(payload: &Value, requirement: &Value) -> Value {
    facilitator(
        "/verify",
        Some(json!({"x402Version": 2, "paymentPayload": payload, "paymentRequirements": requirement})),
    )
    .await
}

/// Settles `amount` of a signed upto payload, as a seller settles what a
/// task used: the amount goes in the requirement, the payload keeps its
/// signed ceiling.
async fn settle(payload: &Value, requirement: &Value, amount: u128) -> Value {
    let mut requirement = requirement.clone();
    requirement["amount"] = json!(amount.to_string());
    facilitator(
        "/settle",
        Some(json!({"x402Version": 2, "paymentPayload": payload, "paymentRequirements": requirement})),
    )
    .await
}

/// The JSON object keys of `v`, recursively, as `a.b` paths: the shape of
/// a document, without its values.
fn shape(v: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Some(object) = v.as_object() {
        for (key, value) in object {
            let path = format!("{prefix}{key}");
            out.push(path.clone());
            shape(value, &format!("{path}."), out);
        }
    }
    out.sort();
}

fn shape_of(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    shape(v, "", &mut out);
    out
}

#[tokio::test]
async fn an_approved_payer_is_verified_and_charged_only_what_was_used() {
    let chain = ChainLock::shared().await;
    let facilitator = facilitator_address().await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let pay_to = chain::fresh_address();
    let offered = requirement(&pay_to, &facilitator);

    let (payload, note) = pay(&payer, &challenge(&offered, false), Some(&chain::rpc_url())).await;
    assert_eq!(note, None, "an approved payer needs nothing more");
    let authorization = &payload["payload"]["permit2Authorization"];
    assert_eq!(authorization["permitted"]["amount"], CEILING.to_string(), "the ceiling is signed");
    assert_eq!(authorization["spender"].as_str().unwrap().to_lowercase(), UPTO_PROXY.to_lowercase());
    // The same document as the official TypeScript client's for the same
    // challenge, but for its random nonce, its signature and its clock.
    let official = decode(&payer.sign_with(Client::TypeScript, &encode(&challenge(&offered, false))).await);
    assert_eq!(shape_of(&payload), shape_of(&official), "{payload}\n{official}");
    let (mut ours, mut theirs) = (authorization.clone(), official["payload"]["permit2Authorization"].clone());
    for field in ["nonce", "deadline"] {
        ours[field] = Value::Null;
        theirs[field] = Value::Null;
    }
    assert_eq!(ours, theirs);
    assert_eq!(payload["accepted"], official["accepted"]);

    let verified = verify(&payload, &offered).await;
    assert_eq!(verified["isValid"], true, "{verified}");
    assert_eq!(verified["payer"].as_str().unwrap().to_lowercase(), payer.address.to_lowercase());

    let charged = settle(&payload, &offered, USED).await;
    assert_eq!(charged["success"], true, "{charged}");
    assert_eq!(charged["amount"], USED.to_string());
    assert_eq!(balance(&payer.address).await, FUNDS - USED, "the payer paid what was used");
    assert_eq!(balance(&pay_to).await, USED);
    assert_eq!(charges_to(&pay_to).await.iter().map(|c| c.value).collect::<Vec<_>>(), [USED], "one transfer");
}

#[tokio::test]
async fn a_payer_that_never_approved_permit2_pays_through_the_offered_permit_without_gas() {
    let chain = ChainLock::shared().await;
    let facilitator = facilitator_address().await;
    let payer = Payer::new(&chain, FUNDS).await;
    assert_eq!(eth_balance(&payer.address).await, 0, "a fresh payer holds no gas");
    assert_eq!(allowance(&payer.address, PERMIT2).await, 0, "and never approved Permit2");
    let pay_to = chain::fresh_address();
    let offered = requirement(&pay_to, &facilitator);
    let sponsored = challenge(&offered, true);

    // Without the chain's endpoint: Permit2 alone, which the facilitator
    // refuses for want of an allowance, and the note says what to do.
    let (blind, note) = pay(&payer, &sponsored, None).await;
    assert!(blind.get("extensions").is_none(), "{blind}");
    assert!(note.is_some_and(|n| n.contains("approve(0x000000000022D473030F116dDEE9F6B43aC78BA3, max)")));
    let refused = verify(&blind, &offered).await;
    assert_eq!((&refused["isValid"], &refused["invalidReason"]), (&json!(false), &json!("permit2_allowance_required")));

    // Not offered: no permit, even knowing the allowance is short.
    let (unsponsored, note) = pay(&payer, &challenge(&offered, false), Some(&chain::rpc_url())).await;
    assert!(unsponsored.get("extensions").is_none(), "{unsponsored}");
    assert!(note.is_some_and(|n| n.contains("no gas sponsoring")));

    // Offered, with the endpoint: the token's permit for Permit2 too.
    let (payload, note) = pay(&payer, &sponsored, Some(&chain::rpc_url())).await;
    assert!(note.is_some_and(|n| n.contains("EIP-2612 permit")));
    let permit = &payload["extensions"]["eip2612GasSponsoring"]["info"];
    assert_eq!(permit["spender"].as_str().unwrap().to_lowercase(), PERMIT2.to_lowercase(), "{payload}");
    assert_eq!(permit["amount"], CEILING.to_string(), "the permit approves the ceiling");
    assert_eq!(permit["deadline"], payload["payload"]["permit2Authorization"]["deadline"]);
    // The official client's permit has the same fields (its core client
    // also echoes the server's `description` and `schema`).
    let official = decode(&payer.sign_with(Client::TypeScript, &encode(&sponsored)).await);
    let theirs = &official["extensions"]["eip2612GasSponsoring"]["info"];
    let mut ours = shape_of(permit);
    ours.push("description".into());
    ours.sort();
    assert_eq!(ours, shape_of(theirs), "{permit}\n{theirs}");
    for field in ["from", "asset", "spender", "amount", "nonce", "version"] {
        assert_eq!(permit[field], theirs[field], "{field}");
    }

    let verified = verify(&payload, &offered).await;
    assert_eq!(verified["isValid"], true, "{verified}");
    let charged = settle(&payload, &offered, USED).await;
    assert_eq!(charged["success"], true, "{charged}");
    assert_eq!(balance(&payer.address).await, FUNDS - USED);
    assert_eq!(charges_to(&pay_to).await.iter().map(|c| c.value).collect::<Vec<_>>(), [USED]);
    // The permit approved the ceiling; the settle used part of it.
    assert_eq!(allowance(&payer.address, PERMIT2).await, CEILING - USED);
    assert_eq!(eth_balance(&payer.address).await, 0, "the payer spent no gas");
}

fn encode(challenge: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(challenge.to_string())
}

fn decode(header: &str) -> Value {
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap()
}
