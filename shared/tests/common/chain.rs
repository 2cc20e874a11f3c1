//! The local payment stack as tests use it (`scripts/payments.sh up`): anvil
//! with the EIP-3009 test token, read and minted over JSON-RPC, and payers
//! whose signatures come from coinbase's x402 Python SDK
//! (`scripts/payments/pay.py`), as a real client's would.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reeve_shared::ids::Id;
use serde_json::{Value, json};

/// The local chain's test token (6 decimals).
pub const TOKEN: &str = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
/// anvil's default account 9 (unlocked): mints the tests' tokens.
pub const MINTER: &str = "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720";

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn rpc_url() -> String {
    std::env::var("REEVE_CHAIN_RPC_URL").unwrap_or_else(|_| "http://127.0.0.1:8545".into())
}

/// The project's Python (scripts/stack.sh installs the x402 SDK into it).
pub fn python() -> PathBuf {
    std::env::var_os("REEVE_PAYER_PYTHON").map(PathBuf::from).unwrap_or_else(|| root().join(".venv/bin/python"))
}

pub async fn rpc(method: &str, params: Value) -> Value {
    let bytes = reqwest::Client::new()
        .post(rpc_url())
        .header("content-type", "application/json")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("the local chain is down ({e}): run scripts/payments.sh up"))
        .bytes()
        .await
        .unwrap();
    let answer: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(answer.get("error").is_none(), "{method}: {answer}");
    answer["result"].clone()
}

pub fn word(address: &str) -> String {
    format!("{:0>64}", address.trim_start_matches("0x").to_ascii_lowercase())
}

/// The token balance of `address`, read from the chain.
pub async fn balance(address: &str) -> u128 {
    let data = format!("0x70a08231{}", word(address));
    let result = rpc("eth_call", json!([{"to": TOKEN, "data": data}, "latest"])).await;
    u128::from_str_radix(result.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// anvil picks the nonce of an `eth_sendTransaction` from the minter's
/// pending count, so two tests minting at once can be given the same nonce
/// and the second is refused as an underpriced replacement. One send at a
/// time (the lock is released before mining, so mints still share blocks).
static MINTER_NONCE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn mint(address: &str, amount: u128) {
    let data = format!("0x40c10f19{}{:064x}", word(address), amount);
    let hash = {
        let _one_at_a_time = MINTER_NONCE.lock().await;
        rpc("eth_sendTransaction", json!([{"from": MINTER, "to": TOKEN, "data": data}])).await
    };
    // The chain mines a block a second.
    for _ in 0..100 {
        let receipt = rpc("eth_getTransactionReceipt", json!([hash])).await;
        if !receipt.is_null() {
            assert_eq!(receipt["status"], "0x1", "mint failed: {receipt}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("mint {hash} was not mined in 10 s");
}

/// A fresh address that nobody else pays into.
pub fn fresh_address() -> String {
    format!("0x{}", hex::encode(Id::new().to_string().as_bytes())[..40].to_owned())
}

/// A fresh key, funded with `funds` tokens; it signs with the x402 SDK.
pub struct Payer {
    pub key: String,
    pub address: String,
}

impl Payer {
    pub async fn new(funds: u128) -> Payer {
        let out = std::process::Command::new(python())
            .args(["-c", "from eth_account import Account; a = Account.create(); print(a.key.hex(), a.address)"])
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}; run scripts/stack.sh up", python().display()));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let (key, address) = text.trim().split_once(' ').unwrap();
        let key = if key.starts_with("0x") { key.to_owned() } else { format!("0x{key}") };
        let payer = Payer { key, address: address.to_owned() };
        if funds > 0 {
            mint(&payer.address, funds).await;
        }
        payer
    }

    /// The `PAYMENT-SIGNATURE` for a 402's `PAYMENT-REQUIRED` header, made
    /// by coinbase's x402 SDK (it parses the challenge and picks the
    /// requirement of the one network it has registered, the local chain).
    pub async fn sign(&self, challenge_header: &str) -> String {
        let (key, challenge) = (self.key.clone(), challenge_header.to_owned());
        let out = tokio::task::spawn_blocking(move || {
            let mut child = std::process::Command::new(python())
                .arg(root().join("scripts/payments/pay.py"))
                .env("REEVE_WALLET_KEY", key)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(challenge.as_bytes()).unwrap();
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap();
        assert!(out.status.success(), "pay.py: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}
