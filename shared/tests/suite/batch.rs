//! x402's `batch-settlement` scheme on the local chain: the escrow and its
//! ERC-3009 deposit collector scripts/payments.sh places (our Solidity,
//! written against what `@x402/evm` calls), and the local facilitator
//! settling the scheme, driven by the official packages on every side
//! (scripts/payments/batch-check.mjs, scripts/payments/batch-flow.mjs).

use std::process::Stdio;

use serde_json::{Value, json};

use crate::common::chain::{self, ChainLock, Payer};

/// `@x402/evm`'s `BATCH_SETTLEMENT_ADDRESS`: the escrow.
const ESCROW: &str = "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003";

fn facilitator_url() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

/// Runs `node scripts/payments/<script> <args>` with `env`, off the runtime;
/// answers its stdout, or fails the test with its stderr.
async fn node(script: &str, args: Vec<String>, env: Vec<(&'static str, String)>) -> String {
    let path = chain::root().join("scripts/payments").join(script);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg(path)
            .args(args)
            .envs(env)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("node: {e}; run scripts/payments.sh up"))
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Two `uint128` words the escrow answers to `signature` called with
/// `words` (each 32 bytes, hex).
async fn read_pair(signature: &str, words: &[String]) -> (u128, u128) {
    let selector = &alloy_primitives::keccak256(signature)[..4];
    let data = format!("0x{}{}", hex::encode(selector), words.concat());
    let answer = chain::rpc("eth_call", json!([{"to": ESCROW, "data": data}, "latest"])).await;
    let words = answer.as_str().unwrap().trim_start_matches("0x");
    let word = |i: usize| u128::from_str_radix(&words[64 * i..64 * (i + 1)], 16).unwrap();
    (word(0), word(1))
}

/// The escrow's `channels(channelId)`: `(balance, totalClaimed)`.
async fn channel(id: &str) -> (u128, u128) {
    read_pair("channels(bytes32)", &[id.trim_start_matches("0x").to_owned()]).await
}

/// The escrow's `receivers(receiver, token)`: `(totalClaimed, totalSettled)`.
async fn receiver(address: &str) -> (u128, u128) {
    read_pair("receivers(address,address)", &[chain::word(address), chain::word(chain::TOKEN)]).await
}

#[tokio::test]
async fn the_escrow_at_x402s_address_answers_every_call_and_hash_as_the_official_package_makes_them() {
    // The pinned ABI copy against the package's own, and the escrow's
    // channel id, voucher, refund and claim-batch hashes against the
    // package's EIP-712 types: a mismatch is named on stderr.
    let said = node("batch-check.mjs", vec![chain::rpc_url()], vec![]).await;
    assert!(said.contains("agree with @x402/evm"), "{said}");
}

#[tokio::test]
async fn a_buyer_pays_ten_requests_by_batch_settlement_and_gets_the_rest_back_to_the_unit() {
    let chain = ChainLock::shared().await;
    const PRICE: u128 = 1_000;
    const DEPOSIT: u128 = 4_000;
    const FUNDS: u128 = 50_000;
    let payer = Payer::new(&chain, FUNDS).await;
    let seller = chain::fresh_address();

    let out = node(
        "batch-flow.mjs",
        vec![facilitator_url(), seller.clone(), PRICE.to_string(), "10".into(), DEPOSIT.to_string()],
        vec![("REEVE_WALLET_KEY", payer.key.clone())],
    )
    .await;
    let flow: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));

    // A deposit whenever the channel no longer covers the next request
    // (4,000 covers four), a voucher otherwise: three deposits, seven
    // vouchers, all ten answered.
    let kinds: Vec<&str> = flow["payments"].as_array().unwrap().iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["deposit", "voucher", "voucher", "voucher", "deposit", "voucher", "voucher", "voucher", "deposit", "voucher"],
        "{flow}"
    );
    assert_eq!(flow["refund"]["success"], true, "{flow}");
    assert!(flow["settle"]["transaction"].as_str().is_some_and(|t| t.starts_with("0x")), "{flow}");

    // The books, to the unit: the seller has exactly ten prices, the buyer
    // exactly its funds less ten prices (the refund returned the 2,000
    // units deposited and never charged). The escrow owes neither of them
    // anything more: the channel holds 12,000 deposited less 2,000
    // refunded, all of it claimed, and all the seller claimed is settled.
    assert_eq!(chain::balance(&seller).await, 10 * PRICE);
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE);
    assert_eq!(channel(flow["channelId"].as_str().unwrap()).await, (10 * PRICE, 10 * PRICE));
    assert_eq!(receiver(&seller).await, (10 * PRICE, 10 * PRICE));
    // The buyer never held gas: the facilitator paid for every deposit.
    assert_eq!(chain::eth_balance(&payer.address).await, 0);
}
