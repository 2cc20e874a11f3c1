//! x402's `upto` scheme on the local chain (`scripts/payments.sh up`):
//! Permit2 and x402's upto proxy at their canonical addresses, the token's
//! EIP-2612 permit, Multicall3, and the facilitator's upto scheme, paid by
//! the official client SDKs and settled through the facilitator's own
//! `POST /settle`, the way a seller settles what a task used.
//!
//! The facts a metered task relies on, asserted on the chain:
//! - a settle takes the actual amount as `paymentRequirements.amount`, while
//!   the payload keeps the signed ceiling, and moves exactly that amount;
//! - 0 answers success with no transaction and moves nothing, and does not
//!   use up the authorization;
//! - above the ceiling is refused, and so is a second settle of a used one;
//! - a payer that never approved Permit2 is refused, unless the 402 offers
//!   gas sponsoring: then its client signs the token's permit instead, and
//!   it pays without holding any gas;
//! - only the facilitator the payer named may settle.

use crate::common;

use alloy_sol_types::{SolCall, SolError, sol};
use base64::Engine;
use common::chain::{
    ChainLock, Client, PERMIT2, Payer, TOKEN, UPTO_PROXY, allowance, balance, charges_to, eth_balance, fresh_address,
    rpc_url,
};
use serde_json::{Value, json};

/// A task's ceiling: 1 token of 6 decimals.
const CEILING: u128 = 1_000_000;
const FUNDS: u128 = 10_000_000;

fn facilitator_url() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

async fn facilitator(method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut request = reqwest::Client::new().request(method, format!("{}{path}", facilitator_url()));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.unwrap_or_else(|e| panic!("the facilitator is down ({e})"));
    assert!(answer.status().is_success(), "{path}: {}", answer.status());
    answer.json().await.unwrap()
}

/// The address a payer must name as its upto facilitator, from `/supported`.
async fn facilitator_address() -> String {
    let supported = facilitator(reqwest::Method::GET, "/supported", None).await;
    let upto = supported["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["scheme"] == "upto" && k["network"] == "eip155:84532")
        .unwrap_or_else(|| panic!("the facilitator does not settle upto: {supported}; run scripts/payments.sh up"));
    upto["extra"]["facilitatorAddress"].as_str().unwrap().to_owned()
}

/// An upto requirement for `ceiling` to `pay_to`, as a seller offers it.
fn requirement(pay_to: &str, ceiling: u128, facilitator: &str) -> Value {
    json!({
        "scheme": "upto",
        "network": "eip155:84532",
        "amount": ceiling.to_string(),
        "asset": TOKEN,
        "payTo": pay_to,
        "maxTimeoutSeconds": 300,
        "extra": {"name": "USDC", "version": "2", "facilitatorAddress": facilitator},
    })
}

/// The 402 challenge (its `PAYMENT-REQUIRED` header value) for one
/// requirement, offering EIP-2612 gas sponsoring or not.
fn challenge(requirement: &Value, sponsored: bool) -> String {
    let mut required = json!({
        "x402Version": 2,
        "error": "payment required",
        "resource": {"url": "http://127.0.0.1/v1/tasks", "description": "a metered task"},
        "accepts": [requirement],
    });
    if sponsored {
        required["extensions"] = json!({"eip2612GasSponsoring": {
            "info": {"description": "The facilitator accepts an EIP-2612 permit for Permit2.", "version": "1"},
            "schema": {},
        }});
    }
    base64::engine::general_purpose::STANDARD.encode(required.to_string())
}

fn decode(header: &str) -> Value {
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap()
}

async fn verify(payload: &Value, requirement: &Value) -> Value {
    let body = json!({"x402Version": 2, "paymentPayload": payload, "paymentRequirements": requirement});
    facilitator(reqwest::Method::POST, "/verify", Some(body)).await
}

/// Settles `amount` of a signed upto payload: the amount goes in the
/// requirement, the payload keeps its signed ceiling.
async fn settle(payload: &Value, requirement: &Value, amount: u128) -> Value {
    let mut requirement = requirement.clone();
    requirement["amount"] = json!(amount.to_string());
    let body = json!({"x402Version": 2, "paymentPayload": payload, "paymentRequirements": requirement});
    facilitator(reqwest::Method::POST, "/settle", Some(body)).await
}

#[tokio::test]
async fn each_official_client_pays_what_was_used_up_to_its_ceiling() {
    let chain = ChainLock::shared().await;
    let facilitator = facilitator_address().await;
    for client in [Client::Python, Client::TypeScript] {
        let payer = Payer::new(&chain, FUNDS).await;
        payer.approve_permit2(&chain, u128::MAX).await;
        let pay_to = fresh_address();
        let offered = requirement(&pay_to, CEILING, &facilitator);
        let payload = decode(&payer.sign_with(client, &challenge(&offered, false)).await);
        assert_eq!(payload["accepted"]["scheme"], "upto", "{client:?}: {payload}");
        let authorization = &payload["payload"]["permit2Authorization"];
        assert_eq!(authorization["permitted"]["amount"], CEILING.to_string(), "{client:?} signs the ceiling");
        assert_eq!(authorization["spender"].as_str().unwrap().to_lowercase(), UPTO_PROXY.to_lowercase());
        let verified = verify(&payload, &offered).await;
        assert_eq!(verified["isValid"], true, "{client:?}: {verified}");

        // Above the ceiling: refused, nothing moves.
        let over = settle(&payload, &offered, CEILING + 1).await;
        assert_eq!(over["success"], false, "{client:?}: {over}");
        assert_eq!(over["errorReason"], "invalid_upto_evm_payload_settlement_exceeds_amount");
        // Nothing used: success with no transaction, and the authorization
        // is still good afterwards.
        let nothing = settle(&payload, &offered, 0).await;
        assert_eq!((&nothing["success"], &nothing["transaction"]), (&json!(true), &json!("")), "{nothing}");
        assert_eq!(balance(&payer.address).await, FUNDS, "{client:?}: a 0 settle moves nothing");
        // What was used, below the ceiling: exactly that, in one transfer.
        let used = 437_123;
        let charged = settle(&payload, &offered, used).await;
        assert_eq!(charged["success"], true, "{client:?}: {charged}");
        assert_eq!(charged["amount"], used.to_string());
        let transaction = charged["transaction"].as_str().unwrap();
        assert!(transaction.len() == 66, "{client:?}: {charged}");
        assert_eq!(balance(&payer.address).await, FUNDS - used, "{client:?}: the payer paid what was used");
        let charges = charges_to(&pay_to).await;
        assert_eq!(charges.iter().map(|c| c.value).collect::<Vec<_>>(), [used], "{client:?}: one transfer");
        // The authorization is spent: a second settle is refused, as the
        // facilitator reports it (only as a failed simulation).
        let again = settle(&payload, &offered, used).await;
        assert_eq!(again["success"], false, "{client:?}: {again}");
        assert_eq!(again["errorReason"], "permit2_simulation_failed");
        assert_eq!(balance(&pay_to).await, used, "{client:?}: nothing more moved");
    }
}

#[tokio::test]
async fn a_payer_without_permit2_approval_pays_only_through_the_offered_permit() {
    let chain = ChainLock::shared().await;
    let facilitator = facilitator_address().await;
    let payer = Payer::new(&chain, FUNDS).await;
    assert_eq!(eth_balance(&payer.address).await, 0, "a fresh payer holds no gas");
    let pay_to = fresh_address();
    let offered = requirement(&pay_to, CEILING, &facilitator);

    // No sponsoring offered: the client signs Permit2 alone, and the
    // facilitator says why it cannot be paid.
    let unsponsored = decode(&payer.sign(&challenge(&offered, false)).await);
    assert!(unsponsored.get("extensions").is_none_or(|e| e.get("eip2612GasSponsoring").is_none()), "{unsponsored}");
    let refused = verify(&unsponsored, &offered).await;
    assert_eq!((&refused["isValid"], &refused["invalidReason"]), (&json!(false), &json!("permit2_allowance_required")));

    // Offered: the client signs the token's permit for Permit2 too, and the
    // settlement applies it. The payer never sends a transaction.
    for client in [Client::Python, Client::TypeScript] {
        let payload = decode(&payer.sign_with(client, &challenge(&offered, true)).await);
        let permit = &payload["extensions"]["eip2612GasSponsoring"]["info"];
        assert_eq!(permit["spender"].as_str().unwrap().to_lowercase(), PERMIT2.to_lowercase(), "{client:?}: {payload}");
        assert_eq!(permit["amount"], CEILING.to_string(), "{client:?}: the permit approves the ceiling");
        let verified = verify(&payload, &offered).await;
        assert_eq!(verified["isValid"], true, "{client:?}: {verified}");
        let before = balance(&payer.address).await;
        let charged = settle(&payload, &offered, 250_000).await;
        assert_eq!(charged["success"], true, "{client:?}: {charged}");
        assert_eq!(balance(&payer.address).await, before - 250_000);
        // The permit approved the ceiling; the settle used part of it.
        assert_eq!(allowance(&payer.address, PERMIT2).await, CEILING - 250_000);
    }
    assert_eq!(eth_balance(&payer.address).await, 0, "the payer spent no gas");
    assert_eq!(charges_to(&pay_to).await.iter().map(|c| c.value).sum::<u128>(), 500_000);
}

#[tokio::test]
async fn a_payment_names_its_facilitator_and_no_one_else_can_settle_it() {
    let chain = ChainLock::shared().await;
    let facilitator = facilitator_address().await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let pay_to = fresh_address();

    // Signed for another facilitator: this one refuses to settle it.
    let elsewhere = requirement(&pay_to, CEILING, &fresh_address());
    let payload = decode(&payer.sign(&challenge(&elsewhere, false)).await);
    let refused = verify(&payload, &elsewhere).await;
    assert_eq!((&refused["isValid"], &refused["invalidReason"]), (&json!(false), &json!("upto_facilitator_mismatch")));

    // Signed for this one: the proxy itself refuses anybody else who sends
    // it, so a stranger holding the signature cannot choose the amount.
    let offered = requirement(&pay_to, CEILING, &facilitator);
    let payload = decode(&payer.sign(&challenge(&offered, false)).await);
    let call = settle_call(&payload["payload"], CEILING);
    for (from, expected) in [(fresh_address(), false), (facilitator.clone(), true)] {
        let answer = reqwest::Client::new()
            .post(rpc_url())
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "eth_call",
                          "params": [{"from": from, "to": UPTO_PROXY, "data": call}, "latest"]}))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        assert_eq!(answer.get("error").is_none(), expected, "settle sent by {from}: {answer}");
        if !expected {
            let selector = alloy_primitives::hex::encode_prefixed(UnauthorizedFacilitator::SELECTOR);
            assert!(answer["error"]["data"].as_str().unwrap_or_default().starts_with(&selector), "{answer}");
        }
    }
    assert!(charges_to(&pay_to).await.is_empty(), "a call is not a transaction");
}

sol! {
    struct TokenPermissions { address token; uint256 amount; }
    struct PermitTransferFrom { TokenPermissions permitted; uint256 nonce; uint256 deadline; }
    struct Witness { address to; address facilitator; uint256 validAfter; }
    function settle(PermitTransferFrom permit, uint256 amount, address owner, Witness witness, bytes signature);
    error UnauthorizedFacilitator();
}

/// The proxy's `settle` calldata for a signed upto payload and an amount.
fn settle_call(signed: &Value, amount: u128) -> String {
    use alloy_primitives::{Address, Bytes, U256};
    let authorization = &signed["permit2Authorization"];
    let address = |v: &Value| v.as_str().unwrap().parse::<Address>().unwrap();
    let number = |v: &Value| v.as_str().unwrap().parse::<U256>().unwrap();
    let call = settleCall {
        permit: PermitTransferFrom {
            permitted: TokenPermissions {
                token: address(&authorization["permitted"]["token"]),
                amount: number(&authorization["permitted"]["amount"]),
            },
            nonce: number(&authorization["nonce"]),
            deadline: number(&authorization["deadline"]),
        },
        amount: U256::from(amount),
        owner: address(&authorization["from"]),
        witness: Witness {
            to: address(&authorization["witness"]["to"]),
            facilitator: address(&authorization["witness"]["facilitator"]),
            validAfter: number(&authorization["witness"]["validAfter"]),
        },
        signature: signed["signature"].as_str().unwrap().parse::<Bytes>().unwrap(),
    };
    alloy_primitives::hex::encode_prefixed(call.abi_encode())
}
