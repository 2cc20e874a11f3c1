//! The local payment stack as tests use it (`scripts/payments.sh up`): anvil
//! with the test token (EIP-3009 and EIP-2612), Permit2 and x402's upto
//! proxy, read and minted over JSON-RPC, and payers whose signatures come
//! from coinbase's x402 Python SDK (`scripts/payments/pay.py`) or its
//! TypeScript client (`pay.mjs`), as a real client's would.

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
/// Permit2 at its canonical address: an `upto` payer approves it once.
pub const PERMIT2: &str = "0x000000000022D473030F116dDEE9F6B43aC78BA3";
/// x402's upto proxy (`x402UptoPermit2ProxyAddress`), the spender an upto
/// payer signs for.
pub const UPTO_PROXY: &str = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002";

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn rpc_url() -> String {
    std::env::var("REEVE_CHAIN_RPC_URL").unwrap_or_else(|_| "http://127.0.0.1:8545".into())
}

/// Base mainnet's public JSON-RPC endpoint: what `REEVE_CHAIN_RPC_URLS`
/// names for `common::USDC_BASE`'s network. No local client pays there (the
/// local facilitator does not settle it), so no test ever reaches it.
pub const BASE_RPC: &str = "https://mainnet.base.org";

/// `REEVE_CHAIN_RPC_URLS` for the tests' catalogs: the local chain, and Base
/// mainnet, which start-up insists on for a catalog that prices there.
pub fn chain_rpc_urls() -> String {
    chain_rpc_urls_at(&rpc_url())
}

/// [`chain_rpc_urls`] with the local network's endpoint at `local`.
pub fn chain_rpc_urls_at(local: &str) -> String {
    format!("eip155:84532={local},eip155:8453={BASE_RPC}")
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

// ------------------------------------------------------------------ locks
//
// One anvil serves every test process on the machine (several engineers',
// and each test binary's). Two locks keep them from breaking each other, both
// `flock`s on files in the temp directory keyed by the chain's address, so
// they hold across processes as well as between the tests of one process
// (each acquisition opens the file anew, and flock locks of two open files
// conflict even within one process).

/// A shared hold on the chain: every test that pays or mints keeps one for
/// its whole run, so a test that pauses mining never stalls it midway.
/// Minting and paying take a `&ChainLock`, so a test cannot forget it.
pub struct ChainLock {
    _file: std::fs::File,
}

/// The chain's lock files: one per role, per chain.
fn lock_path(role: &str) -> PathBuf {
    let chain: String = rpc_url().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    std::env::temp_dir().join(format!("reeve-chain-{chain}.{role}.lock"))
}

/// Opens the lock file `role` and waits (on a blocking thread) for a
/// shared or an exclusive `flock` on it, released when the file is dropped.
async fn flock(role: &'static str, exclusive: bool) -> std::fs::File {
    let path = lock_path(role);
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .or_else(|_| std::fs::File::open(&path))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let locked = if exclusive { file.lock() } else { file.lock_shared() };
        locked.unwrap_or_else(|e| panic!("flock {}: {e}", path.display()));
        file
    })
    .await
    .unwrap()
}

/// A writer-first turnstile: a test waiting for the exclusive lock holds it,
/// so new shared holders queue behind that test instead of starving it
/// (Linux grants shared flocks while an exclusive one waits).
async fn through_turnstile(exclusive: bool) -> std::fs::File {
    let turnstile = flock("turnstile", true).await;
    let file = flock("chain", exclusive).await;
    drop(turnstile);
    file
}

/// The chain's mining interval when nobody pauses it (scripts/payments.sh
/// starts anvil with `--block-time 1`).
const BLOCK_SECONDS: u64 = 1;

impl ChainLock {
    /// Holds the chain shared, for a test that pays or mints.
    pub async fn shared() -> ChainLock {
        let lock = ChainLock { _file: through_turnstile(false).await };
        // Nobody holds it exclusive now, so the chain must be mining; an
        // exclusive holder killed before its guard ran would leave it paused.
        if rpc("anvil_getIntervalMining", json!([])).await != json!(BLOCK_SECONDS) {
            rpc("evm_setIntervalMining", json!([BLOCK_SECONDS])).await;
        }
        lock
    }

    /// Holds the chain exclusive, for a test that pauses mining: it waits
    /// until no other test on the machine pays or mints. Never call it while
    /// this test already holds the lock shared: it would wait for itself.
    pub async fn exclusive() -> ExclusiveChain {
        ExclusiveChain { lock: ChainLock { _file: through_turnstile(true).await } }
    }
}

/// The chain held exclusive. [`ExclusiveChain::pause`] stops mining; the
/// guard restores interval mining when dropped, also when the test panics,
/// and only then releases the lock.
pub struct ExclusiveChain {
    lock: ChainLock,
}

impl ExclusiveChain {
    /// Stops mining: transactions wait in the pool until [`Self::mine`].
    pub async fn pause(&self) {
        rpc("evm_setIntervalMining", json!([0])).await;
        rpc("evm_setAutomine", json!([false])).await;
    }

    /// Mines one block with whatever the pool holds.
    pub async fn mine(&self) {
        rpc("evm_mine", json!([])).await;
    }

    /// Mining again, a block a second.
    pub async fn resume(&self) {
        rpc("evm_setIntervalMining", json!([BLOCK_SECONDS])).await;
    }
}

impl std::ops::Deref for ExclusiveChain {
    type Target = ChainLock;
    fn deref(&self) -> &ChainLock {
        &self.lock
    }
}

impl Drop for ExclusiveChain {
    fn drop(&mut self) {
        // Drop cannot await, and a runtime cannot block inside itself: the
        // restoring call runs on a thread of its own with its own runtime.
        let restored = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(rpc("evm_setIntervalMining", json!([BLOCK_SECONDS])))
        })
        .join();
        if restored.is_err() && !std::thread::panicking() {
            panic!("could not restore the chain's interval mining");
        }
    }
}

/// anvil picks the nonce of an `eth_sendTransaction` from the minter's
/// pending count, so two mints at once (from any test process) can be given
/// the same nonce and the second is refused as an underpriced replacement.
/// One send at a time, machine-wide; the lock is released before mining, so
/// mints still share blocks.
pub async fn mint(_chain: &ChainLock, address: &str, amount: u128) {
    let data = format!("0x40c10f19{}{:064x}", word(address), amount);
    let hash = {
        let _one_at_a_time = flock("mint", true).await;
        rpc("eth_sendTransaction", json!([{"from": MINTER, "to": TOKEN, "data": data}])).await
    };
    wait_mined(&hash).await;
}

/// The native (gas) balance of `address`, in wei.
pub async fn eth_balance(address: &str) -> u128 {
    let result = rpc("eth_getBalance", json!([address, "latest"])).await;
    u128::from_str_radix(result.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// How much of `owner`'s token `spender` may move.
pub async fn allowance(owner: &str, spender: &str) -> u128 {
    let data = format!("0xdd62ed3e{}{}", word(owner), word(spender));
    let result = rpc("eth_call", json!([{"to": TOKEN, "data": data}, "latest"])).await;
    u128::from_str_radix(result.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// Waits for `hash`'s receipt and asserts it succeeded (the chain mines a
/// block a second unless a test holds it paused).
pub async fn wait_mined(hash: &Value) -> Value {
    for _ in 0..100 {
        let receipt = rpc("eth_getTransactionReceipt", json!([hash])).await;
        if !receipt.is_null() {
            assert_eq!(receipt["status"], "0x1", "transaction failed: {receipt}");
            return receipt;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{hash} was not mined in 10 s");
}

/// A fresh address that nobody else pays into.
pub fn fresh_address() -> String {
    format!("0x{}", hex::encode(Id::new().to_string().as_bytes())[..40].to_owned())
}

/// A fresh key, funded with `funds` tokens; it signs with the x402 SDK.
/// Funding it mints, so it takes the test's hold on the chain.
pub struct Payer {
    pub key: String,
    pub address: String,
}

impl Payer {
    pub async fn new(chain: &ChainLock, funds: u128) -> Payer {
        // Two ULIDs' 160 random bits, hashed: a key no other test holds,
        // made here rather than by a Python process per payer (a second of
        // CPU each, for a key).
        let seed = [Id::new().to_bytes(), Id::new().to_bytes()].concat();
        let secret = alloy_primitives::keccak256(seed);
        let key = alloy_signer::k256::ecdsa::SigningKey::from_slice(secret.as_slice()).expect("a valid secp256k1 key");
        let address = alloy_signer::utils::public_key_to_address(key.verifying_key()).to_checksum(None);
        let payer = Payer { key: format!("{secret:#x}"), address };
        if funds > 0 {
            mint(chain, &payer.address, funds).await;
        }
        payer
    }

    /// Sets the token allowance of Permit2 (what an `upto` payer does once,
    /// `approve(Permit2, max)`; 0 revokes it). anvil sends the transaction
    /// as the payer (impersonated) after giving it the gas: the chain sees
    /// exactly what the payer's own wallet would send.
    pub async fn approve_permit2(&self, chain: &ChainLock, amount: u128) {
        let data = format!("0x095ea7b3{}{:064x}", word(PERMIT2), amount);
        self.send(chain, TOKEN, &data).await;
    }

    /// Moves `amount` of its tokens to `to` (`transfer`), from its own
    /// account: what a payer that empties its wallet sends.
    pub async fn transfer(&self, chain: &ChainLock, to: &str, amount: u128) {
        let data = format!("0xa9059cbb{}{:064x}", word(to), amount);
        self.send(chain, TOKEN, &data).await;
    }

    /// Invalidates its Permit2 nonce `nonce` (decimal), as a payer that
    /// takes back a signature it gave sends to Permit2:
    /// `invalidateUnorderedNonces(nonce >> 8, 1 << (nonce & 0xff))`.
    pub async fn invalidate_permit2_nonce(&self, chain: &ChainLock, nonce: &str) {
        let nonce: alloy_primitives::U256 = nonce.parse().unwrap();
        let (word_pos, bit) = (nonce >> 8, nonce & alloy_primitives::U256::from(0xff));
        let mask = alloy_primitives::U256::from(1) << bit;
        let data = format!("0x3ff9dcb1{word_pos:064x}{mask:064x}");
        self.send(chain, PERMIT2, &data).await;
    }

    /// Sends `data` to `to` as the payer: anvil sends it impersonated,
    /// after giving it the gas, so the chain sees exactly what the payer's
    /// own wallet would send.
    pub async fn send(&self, _chain: &ChainLock, to: &str, data: &str) {
        rpc("anvil_setBalance", json!([self.address, "0xde0b6b3a7640000"])).await;
        rpc("anvil_impersonateAccount", json!([self.address])).await;
        let hash = rpc("eth_sendTransaction", json!([{"from": self.address, "to": to, "data": data}])).await;
        rpc("anvil_stopImpersonatingAccount", json!([self.address])).await;
        wait_mined(&hash).await;
    }

    /// The `PAYMENT-SIGNATURE` for a 402's `PAYMENT-REQUIRED` header, made
    /// by coinbase's x402 SDK (it parses the challenge and picks the
    /// requirement of the one network it has registered, the local chain).
    /// It reads the chain for an `upto` payment, to sign the token's permit
    /// when the 402 offers gas sponsoring and Permit2 is not approved.
    pub async fn sign(&self, challenge_header: &str) -> String {
        self.sign_with(Client::Python, challenge_header).await
    }

    /// The same, made by `client`.
    pub async fn sign_with(&self, client: Client, challenge_header: &str) -> String {
        let (key, challenge) = (self.key.clone(), challenge_header.to_owned());
        if let Client::Python = client {
            return tokio::task::spawn_blocking(move || PythonSigner::sign(&key, &challenge)).await.unwrap();
        }
        let out = tokio::task::spawn_blocking(move || {
            let mut child = std::process::Command::new("node")
                .arg(root().join(client.script()))
                .arg(rpc_url())
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
        assert!(out.status.success(), "{}: {}", client.script(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

/// `scripts/payments/pay.py --serve`, one for the test binary, started on
/// the first signature: each Python start imports the SDK again, over a
/// second of CPU, and the suites sign some two hundred payments. It reads
/// the payer's key from its stdin with each challenge, never from an
/// argument, and ends when the binary does (its stdin closes).
struct PythonSigner {
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    _child: std::process::Child,
}

static PYTHON_SIGNER: std::sync::Mutex<Option<PythonSigner>> = std::sync::Mutex::new(None);

impl PythonSigner {
    fn start() -> PythonSigner {
        let mut child = std::process::Command::new(python())
            .arg(root().join(Client::Python.script()))
            .args(["--serve", &rpc_url()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", python().display()));
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        PythonSigner { stdin, stdout: std::io::BufReader::new(stdout), _child: child }
    }

    /// One signature; the signer is started again if the last one died.
    fn sign(key: &str, challenge: &str) -> String {
        use std::io::BufRead as _;
        let mut signer = PYTHON_SIGNER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let running = signer.get_or_insert_with(PythonSigner::start);
        let request = json!({ "key": key, "challenge": challenge }).to_string() + "\n";
        let mut line = String::new();
        let asked = running.stdin.write_all(request.as_bytes()).and_then(|()| running.stdin.flush());
        let answered = asked.and_then(|()| running.stdout.read_line(&mut line));
        if !matches!(answered, Ok(n) if n > 0) {
            *signer = None;
            panic!("scripts/payments/pay.py --serve stopped answering: {answered:?}");
        }
        let answer: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("pay.py answered {line:?}: {e}"));
        match answer["header"].as_str() {
            Some(header) => header.to_owned(),
            None => panic!("pay.py: {}", answer["error"]),
        }
    }
}

/// An official x402 client SDK that signs payments.
#[derive(Debug, Clone, Copy)]
pub enum Client {
    /// coinbase's `x402` Python SDK (`scripts/payments/pay.py`).
    Python,
    /// `@x402/core`'s client with `@x402/evm`'s schemes (`scripts/payments/pay.mjs`).
    TypeScript,
}

impl Client {
    fn script(self) -> &'static str {
        match self {
            Client::Python => "scripts/payments/pay.py",
            Client::TypeScript => "scripts/payments/pay.mjs",
        }
    }

    /// What runs this client's scripts: the project's Python, or node.
    fn program(self) -> PathBuf {
        match self {
            Client::Python => python(),
            Client::TypeScript => PathBuf::from("node"),
        }
    }

    /// Runs this client's `scripts/payments/<script> <args>` with `env`, in
    /// a process of its own, off the runtime; answers its stdout, or fails
    /// the test with its output.
    pub async fn run(self, script: &str, args: Vec<String>, env: Vec<(&'static str, String)>) -> String {
        let out = self.output(script, args, env).await;
        assert!(
            out.status.success(),
            "{script}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The same, answering how it ended, failed or not.
    pub async fn output(
        self,
        script: &str,
        args: Vec<String>,
        env: Vec<(&'static str, String)>,
    ) -> std::process::Output {
        let (program, path) = (self.program(), root().join("scripts/payments").join(script));
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(&program)
                .arg(path)
                .args(args)
                .envs(env)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("{}: {e}; run scripts/payments.sh up", program.display()))
        })
        .await
        .unwrap()
    }
}

/// The Python that signs an EIP-3009 `TransferWithAuthorization` with the
/// payer's key and prints the token call that uses it (the `bytes signature`
/// form): what a payer holding its key can send itself.
const SPEND_NONCE_PY: &str = r#"
import os, sys
from eth_abi import encode
from eth_account import Account
from eth_utils import keccak
token, to, value, valid_before, nonce = sys.argv[1:]
key = os.environ["REEVE_WALLET_KEY"]
payer = Account.from_key(key).address
fields = [("from", "address"), ("to", "address"), ("value", "uint256"), ("validAfter", "uint256"),
          ("validBefore", "uint256"), ("nonce", "bytes32")]
typed = {
    "types": {
        "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                         {"name": "chainId", "type": "uint256"}, {"name": "verifyingContract", "type": "address"}],
        "TransferWithAuthorization": [{"name": n, "type": t} for n, t in fields],
    },
    "primaryType": "TransferWithAuthorization",
    "domain": {"name": "USDC", "version": "2", "chainId": 84532, "verifyingContract": token},
    "message": {"from": payer, "to": to, "value": int(value), "validAfter": 0, "validBefore": int(valid_before),
                "nonce": bytes.fromhex(nonce[2:])},
}
signature = Account.sign_typed_data(key, full_message=typed).signature
selector = keccak(text="transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes)")[:4]
args = [payer, to, int(value), 0, int(valid_before), bytes.fromhex(nonce[2:]), bytes(signature)]
print("0x" + (selector + encode([t for _, t in fields] + ["bytes"], args)).hex())
"#;

impl Payer {
    /// The payer spends an authorization's `nonce` itself: it signs its own
    /// `transferWithAuthorization` with that nonce, of `value` to `to`, and
    /// sends it from its own account (anvil lends it the gas). `urgent`
    /// bids a priority fee far above any facilitator's, so that in a block
    /// with both, it goes first. Answers the transaction's hash, not waiting
    /// for it to be mined (a test may hold the chain).
    pub async fn spend_nonce(&self, _chain: &ChainLock, nonce: &str, to: &str, value: u128, urgent: bool) -> String {
        let valid_before = (chain_time().await + 3600).to_string();
        let (key, args) =
            (self.key.clone(), [TOKEN.to_owned(), to.to_owned(), value.to_string(), valid_before, nonce.to_owned()]);
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(python())
                .arg("-c")
                .arg(SPEND_NONCE_PY)
                .args(args)
                .env("REEVE_WALLET_KEY", key)
                .output()
        })
        .await
        .unwrap()
        .unwrap();
        assert!(out.status.success(), "signing the payer's own transfer: {}", String::from_utf8_lossy(&out.stderr));
        let data = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        rpc("anvil_setBalance", json!([self.address, "0xDE0B6B3A7640000"])).await;
        rpc("anvil_impersonateAccount", json!([self.address])).await;
        let mut transaction = json!({"from": self.address, "to": TOKEN, "data": data, "gas": "0x30000"});
        if urgent {
            transaction["maxPriorityFeePerGas"] = json!("0x174876E800"); // 100 gwei
            transaction["maxFeePerGas"] = json!("0x2540BE4000"); // 160 gwei
        }
        let hash = rpc("eth_sendTransaction", json!([transaction])).await;
        rpc("anvil_stopImpersonatingAccount", json!([self.address])).await;
        hash.as_str().unwrap().to_owned()
    }
}

/// The latest block's timestamp (unix seconds).
pub async fn chain_time() -> u64 {
    let block = rpc("eth_getBlockByNumber", json!(["latest", false])).await;
    u64::from_str_radix(block["timestamp"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// The development mnemonic's account 8: it pays the gas of a test's own
/// facilitator, so that it never races the shared one's account 0 (nor the
/// console test's account 2) for a nonce.
pub const OWN_FACILITATOR_ACCOUNT: &str = "0x23618e81E3f5cdF7f54C3d65f7FBc0aBf5B21E8f";

/// A facilitator of the test's own (`scripts/payments/facilitator.mjs`, the
/// same code as the shared one on 4021), on a port of its own, so the test
/// may stop it or make it wait for receipts. Killed when dropped.
pub struct OwnFacilitator {
    child: Option<std::process::Child>,
    pub url: String,
}

impl OwnFacilitator {
    /// Started and answering; a settle waits `confirmation` for its receipt
    /// before it answers `settlement_pending` with the broadcast hash.
    pub async fn start(confirmation: Duration) -> OwnFacilitator {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Self::start_on(port, confirmation).await
    }

    /// [`OwnFacilitator::start`] on `port`: the same facilitator (the same
    /// account, so the same address a payer names) started again.
    pub async fn start_on(port: u16, confirmation: Duration) -> OwnFacilitator {
        let child = std::process::Command::new("node")
            .arg(root().join("scripts/payments/facilitator.mjs"))
            .args([rpc_url(), "127.0.0.1".to_owned(), port.to_string(), "8".to_owned()])
            .arg(confirmation.as_millis().to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("node: {e}; run scripts/payments.sh up"));
        let own = OwnFacilitator { child: Some(child), url: format!("http://127.0.0.1:{port}") };
        for _ in 0..200 {
            if let Ok(answer) = reqwest::get(format!("{}/supported", own.url)).await
                && answer.status().is_success()
            {
                return own;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the test's own facilitator did not start in 20 s");
    }

    /// Kills it at once (no answer to whatever it is doing).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnFacilitator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until a transaction from `from` is in the pool (sent, not mined).
pub async fn wait_pending_from(from: &str) -> String {
    for _ in 0..200 {
        let pool = rpc("txpool_content", json!([])).await;
        let by_sender = pool["pending"].as_object().cloned().unwrap_or_default();
        if let Some((_, txs)) = by_sender.iter().find(|(a, _)| a.eq_ignore_ascii_case(from))
            && let Some((_, tx)) = txs.as_object().and_then(|t| t.iter().next())
        {
            return tx["hash"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no transaction from {from} reached the pool in 20 s");
}

const TRANSFER: &str = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef";
const AUTHORIZATION_USED: &str = "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5";

/// One transfer of the token to an address, as the chain has it.
#[derive(Debug, Clone)]
pub struct Charge {
    /// The transaction's hash, lowercase.
    pub transaction: String,
    pub value: u128,
    /// The EIP-3009 authorization it used: `(authorizer, nonce)`, lowercase.
    pub authorization: Option<(String, String)>,
}

/// Every `Transfer` of the token to `to`, with the authorization each used
/// (its `AuthorizationUsed` event, in the same transaction).
pub async fn charges_to(to: &str) -> Vec<Charge> {
    let topic = format!("0x{}", word(to));
    let logs = rpc(
        "eth_getLogs",
        json!([{"address": TOKEN, "fromBlock": "0x0", "toBlock": "latest", "topics": [TRANSFER, null, topic]}]),
    )
    .await;
    let mut charges = Vec::new();
    for log in logs.as_array().unwrap() {
        let transaction = log["transactionHash"].as_str().unwrap().to_owned();
        let value = u128::from_str_radix(log["data"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        let receipt = rpc("eth_getTransactionReceipt", json!([transaction])).await;
        let authorization =
            receipt["logs"].as_array().unwrap().iter().find(|l| l["topics"][0] == AUTHORIZATION_USED).map(|l| {
                let authorizer = format!("0x{}", &l["topics"][1].as_str().unwrap()[26..]);
                (authorizer.to_ascii_lowercase(), l["topics"][2].as_str().unwrap().to_ascii_lowercase())
            });
        charges.push(Charge { transaction: transaction.to_ascii_lowercase(), value, authorization });
    }
    charges
}

/// What a [`ScriptedFacilitator`] does with one `/settle`.
#[derive(Debug, Clone)]
pub enum Settle {
    /// Passed to the real facilitator, and its answer returned.
    Forward,
    /// Passed to the real facilitator, which goes on (its transaction
    /// lands), but the caller gets a `502` at once: a slow settle whose
    /// answer was lost.
    ForwardLost,
    /// Not passed on: this JSON is the answer.
    Answer(Value),
}

/// A facilitator in front of a real one whose `/settle` answers follow a
/// script, one [`Settle`] per call (then [`Settle::Forward`]): what a slow,
/// lost or lying facilitator does, against the real chain. Every other route
/// (`/supported`, `/verify`) is the real one's.
pub struct ScriptedFacilitator {
    pub url: String,
    script: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Settle>>>,
    /// How many `/settle` calls it took.
    pub settles: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ScriptedFacilitator {
    pub async fn start(real: &str) -> ScriptedFacilitator {
        use axum::body::Bytes;
        use axum::http::{Method, StatusCode, Uri};
        use std::sync::atomic::Ordering;
        let script = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let settles = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (real, queued, counter) = (real.to_owned(), script.clone(), settles.clone());
        let handler = move |method: Method, uri: Uri, body: Bytes| {
            let (real, queued, counter) = (real.clone(), queued.clone(), counter.clone());
            async move {
                let settle = uri.path() == "/settle";
                let forward = async move {
                    let url = format!("{real}{}", uri.path());
                    let request = match method {
                        Method::GET => reqwest::Client::new().get(url),
                        _ => reqwest::Client::new().post(url).header("content-type", "application/json").body(body),
                    };
                    match request.send().await {
                        Ok(answer) => (
                            StatusCode::from_u16(answer.status().as_u16()).unwrap(),
                            answer.bytes().await.unwrap_or_default(),
                        ),
                        Err(_) => (StatusCode::BAD_GATEWAY, Bytes::new()),
                    }
                };
                if !settle {
                    return forward.await;
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let step = queued.lock().unwrap().pop_front().unwrap_or(Settle::Forward);
                match step {
                    Settle::Forward => forward.await,
                    Settle::ForwardLost => {
                        tokio::spawn(forward);
                        (StatusCode::BAD_GATEWAY, Bytes::from_static(b"lost"))
                    }
                    Settle::Answer(answer) => (StatusCode::OK, Bytes::from(answer.to_string())),
                }
            }
        };
        let router = axum::Router::new().fallback(handler);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        ScriptedFacilitator { url, script, settles }
    }

    /// The next `/settle` calls do these, in order.
    pub fn then(&self, steps: impl IntoIterator<Item = Settle>) {
        self.script.lock().unwrap().extend(steps);
    }
}
