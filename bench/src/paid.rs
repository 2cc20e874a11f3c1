//! Paid as fast as free (issue 42, "Measured"): from a buyer's create to its
//! task's `running`, for a free task, one paid by x402 `exact` and one paid
//! by x402 `batch-settlement`, side by side in one run; and the transactions
//! each paid side put on the chain per 100 tasks.
//!
//! The buyer is the release `reeve` CLI, one process per task as a person or
//! a script runs it: `reeve task create KIND --json`, with `--pay` (an
//! EIP-3009 authorization, which Reeve has the facilitator settle before it
//! queues the task) or `--pay --channel` (one deposit, then a voucher per
//! task that Reeve checks itself). Every side pays the same process start
//! and round trips; what differs is the payment. Reeve is `reeve serve
//! --no-worker` and `reeve work` on a database, a queue and a
//! `redis-server` of the harness's own, with the local stack's chain and
//! facilitator; the kinds' `http` executor POSTs to an endpoint the harness
//! answers at once. `running` is the task's status event as it reaches
//! Redis.
//!
//! Transactions are counted from the chain's logs over the run's blocks, so
//! that nothing else using the chain counts: for `exact`, the token's
//! transfers from the payer to `payTo` (one per settlement); for batch
//! settlement, the transactions in which the escrow logged the payer's
//! channel (its deposit, its claim) or a payout to `payTo`, after the one
//! sweep at the end that claims what the vouchers bought and pays it out.
//! The payee must then hold exactly what both paid sides were charged.
//!
//! Sides alternate within each round, each round in another order, so the
//! shared machine's noise falls on all three.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::stack::{BenchDb, OwnMoto, OwnRedis, free_port};
use crate::worker::{Env, Tracker, follow_events, ms, tail, verdict};

#[derive(clap::Args)]
pub struct Args {
    /// The release `reeve` binary (server and client).
    #[arg(long)]
    reeve: PathBuf,
    /// Tasks per side, over `rounds` alternating rounds.
    #[arg(long, default_value_t = 100)]
    tasks: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

/// Every paid kind's price, in the local token's atomic units (0.001 USDC).
const PRICE: u128 = 1_000;
/// The local chain (Base Sepolia's id) and the catalog's withdraw delay.
const CHAIN_ID: u64 = 84532;
const WITHDRAW_DELAY: u64 = 900;
/// The batch side's one deposit: every task of the run, and one to spare.
fn deposit(tasks: usize) -> u128 {
    PRICE * (tasks as u128 + 1)
}
/// The stack's test USDC, and the anvil account that may mint it.
const TOKEN: &str = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
const MINTER: &str = "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720";
/// The receiver authorizer's key for the run's channel (a bench-only key
/// on the local chain): the closing sweep signs the claim with it.
const AUTHORIZER_KEY: &str = "0x4242424242424242424242424242424242424242424242424242424242424242";
/// How long one task may take before the run is called broken.
const TASK_LIMIT: Duration = Duration::from_secs(60);
/// Goals (issue 42): batch p50 at most this many times free's, and at most
/// this many transactions per 100 batch-paid tasks.
const GOAL_RATIO: f64 = 1.5;
const GOAL_TRANSACTIONS: f64 = 5.0;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Free,
    Exact,
    Batch,
}

impl Side {
    const ALL: [Side; 3] = [Side::Free, Side::Exact, Side::Batch];

    fn kind(self) -> &'static str {
        match self {
            Side::Free => "free",
            Side::Exact => "exact",
            Side::Batch => "batch",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Side::Free => "free",
            Side::Exact => "`exact` (`--pay`)",
            Side::Batch => "`batch-settlement` (`--pay --channel`)",
        }
    }
}

/// The development catalog, paying to `pay_to` with batch-settlement terms,
/// and the three kinds.
fn catalog(endpoint: &str, pay_to: &str, authorizer: &str) -> anyhow::Result<String> {
    const PAY_TO: &str = "pay_to = \"0x209693Bc6afc0C5328bA36FaF03C514EF312287C\"";
    let shipped = include_str!("../../reeve.dev.toml");
    ensure!(shipped.contains(PAY_TO) && shipped.contains("[payments]\n"), "reeve.dev.toml's [payments] changed");
    let shipped = shipped.replacen(PAY_TO, &format!("pay_to = \"{pay_to}\""), 1).replacen(
        "[payments]\n",
        &format!("[payments]\nbatch_receiver_authorizer = \"{authorizer}\"\nbatch_withdraw_delay_seconds = {WITHDRAW_DELAY}\n"),
        1,
    );
    // A free kind has a quota (the largest), a priced one its payment.
    let kind = |name: &str, price: Option<&str>| {
        let limit = price.map_or_else(
            || format!("[tasks.{name}.quota]\nper_hour = 1000000\nat_once = 10000\n"),
            |scheme| {
                format!(
                    "[[tasks.{name}.accepts]]\nasset = \"usdc-base-sepolia\"\nscheme = \"{scheme}\"\n\
                     amount = \"{PRICE}\"\n"
                )
            },
        );
        format!(
            "\n[tasks.{name}]\ntitle = \"Bench {name}\"\nexecutor = \"http\"\nendpoint = \"{endpoint}\"\n\
             timeout_seconds = 30\ninput_schema = {{ type = \"object\" }}\n{limit}"
        )
    };
    Ok(format!("{shipped}{}{}{}", kind("free", None), kind("exact", Some("exact")), kind("batch", Some("batch"))))
}

/// A JSON-RPC call to the local chain.
async fn rpc(http: &reqwest::Client, url: &str, method: &str, params: Value) -> anyhow::Result<Value> {
    let answer: Value = http
        .post(url)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await?
        .json()
        .await?;
    answer.get("result").cloned().with_context(|| format!("{method}: {answer}"))
}

fn hex_u128(value: &Value) -> anyhow::Result<u128> {
    let text = value.as_str().context("a hex quantity")?;
    Ok(u128::from_str_radix(text.trim_start_matches("0x"), 16)?)
}

/// `Transfer(address,address,uint256)`'s topic.
const TRANSFER: &str = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef";

/// An address as a log topic.
fn topic(address: &str) -> String {
    format!("0x{:0>64}", address.trim_start_matches("0x").to_lowercase())
}

/// The local chain, as the harness reads and funds it.
struct Chain {
    http: reqwest::Client,
    url: String,
}

impl Chain {
    async fn block(&self) -> anyhow::Result<u128> {
        hex_u128(&rpc(&self.http, &self.url, "eth_blockNumber", json!([])).await?)
    }

    /// The distinct transactions with a log of `address` matching `topics`
    /// from block `from` on.
    async fn transactions(&self, from: u128, address: &str, topics: Value) -> anyhow::Result<usize> {
        let filter =
            json!({"fromBlock": format!("{from:#x}"), "toBlock": "latest", "address": address, "topics": topics});
        let logs = rpc(&self.http, &self.url, "eth_getLogs", json!([filter])).await?;
        let hashes: std::collections::BTreeSet<&str> = logs
            .as_array()
            .context("eth_getLogs answers a list")?
            .iter()
            .filter_map(|l| l["transactionHash"].as_str())
            .collect();
        Ok(hashes.len())
    }

    async fn balance(&self, address: &str) -> anyhow::Result<u128> {
        let data = format!("0x70a08231{:0>64}", address.trim_start_matches("0x").to_lowercase());
        hex_u128(&rpc(&self.http, &self.url, "eth_call", json!([{"to": TOKEN, "data": data}, "latest"])).await?)
    }

    /// Mints `amount` of the token to `address`, and waits for it.
    async fn mint(&self, address: &str, amount: u128) -> anyhow::Result<()> {
        let data = format!("0x40c10f19{:0>64}{amount:064x}", address.trim_start_matches("0x").to_lowercase());
        let hash =
            rpc(&self.http, &self.url, "eth_sendTransaction", json!([{"from": MINTER, "to": TOKEN, "data": data}]))
                .await?;
        for _ in 0..100 {
            let receipt = rpc(&self.http, &self.url, "eth_getTransactionReceipt", json!([hash])).await?;
            if !receipt.is_null() {
                ensure!(receipt["status"] == "0x1", "the mint failed: {receipt}");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the mint was not mined in 10 s")
    }
}

/// A fresh key and its address.
fn fresh_key() -> (String, String) {
    let seed = [reeve_shared::ids::Id::new().to_bytes(), reeve_shared::ids::Id::new().to_bytes()].concat();
    let secret = alloy_primitives::keccak256(seed);
    let key = alloy_signer::k256::ecdsa::SigningKey::from_slice(secret.as_slice()).expect("a valid secp256k1 key");
    let address = alloy_signer::utils::public_key_to_address(key.verifying_key()).to_checksum(None);
    (format!("{secret:#x}"), address)
}

fn address_of(key: &str) -> anyhow::Result<String> {
    let key = alloy_signer::k256::ecdsa::SigningKey::from_slice(&hex::decode(key.trim_start_matches("0x"))?)?;
    Ok(alloy_signer::utils::public_key_to_address(key.verifying_key()).to_checksum(None))
}

/// The buyer: the `reeve` CLI with its own credentials directory.
struct Buyer {
    reeve: PathBuf,
    endpoint: String,
    home: PathBuf,
    key: String,
}

impl Buyer {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.reeve);
        command
            .args(args)
            .env("REEVE_ENDPOINT", &self.endpoint)
            .env("XDG_CONFIG_HOME", &self.home)
            .env("REEVE_WALLET_KEY", &self.key)
            .env_remove("REEVE_TOKEN")
            .env_remove("REEVE_PROFILE")
            .kill_on_drop(true);
        command
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<Value> {
        let output = self.command(args).output().await.with_context(|| format!("running {}", self.reeve.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        ensure!(
            output.status.success(),
            "reeve {} exited {}: {stdout}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_str(&stdout).with_context(|| format!("reeve {}: not JSON: {stdout}", args.join(" ")))
    }

    /// One task of `side`, from the command's start to the task's
    /// `running`, in µs.
    async fn create(&self, side: Side, n: usize, tracker: &Tracker, deposit: u128) -> anyhow::Result<u64> {
        let input = format!("n={n}");
        let deposit = deposit.to_string();
        let mut args = vec!["task", "create", side.kind(), "--input", &input, "--json"];
        match side {
            Side::Free => {}
            Side::Exact => args.push("--pay"),
            Side::Batch => args.extend(["--pay", "--channel", "--deposit", &deposit]),
        }
        let start = Instant::now();
        let task = self.run(&args).await?;
        let id = task["id"].as_str().context("the created task's id")?;
        let seen = tracker.ended(id, TASK_LIMIT).await?;
        let running = seen.running.context("no running event")?;
        Ok(running.duration_since(start).as_micros() as u64)
    }
}

struct Measured {
    samples: [Vec<u64>; 3],
    /// `exact`'s transactions, and batch settlement's before and after the
    /// closing sweep.
    exact_transactions: usize,
    batch_transactions: usize,
    claim_transactions: usize,
    paid_to: u128,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    ensure!(args.rounds > 0 && args.tasks >= args.rounds, "--tasks must be at least --rounds");
    let db = BenchDb::create("paid").await?;
    let redis = OwnRedis::start().await?;
    let moto = OwnMoto::start().await?;
    let measured = measure(&args, &db, &redis, &moto).await;
    redis.stop().await;
    moto.stop().await;
    db.drop_now().await?;
    print!("{}", report(&args, &measured?));
    Ok(())
}

async fn measure(args: &Args, db: &BenchDb, redis: &OwnRedis, moto: &OwnMoto) -> anyhow::Result<Measured> {
    let chain_url = std::env::var("REEVE_CHAIN_RPC_URL").unwrap_or_else(|_| "http://127.0.0.1:8545".into());
    let chain = Chain { http: reqwest::Client::new(), url: chain_url };

    let sqs = moto.sqs().await;
    let queue_url = sqs
        .create_queue()
        .queue_name(format!("reeve-bench-paid-{}", std::process::id()))
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .send()
        .await
        .context("creating the harness's SQS queue")?
        .queue_url()
        .context("a queue url")?
        .to_owned();
    let (endpoint, endpoint_server) = crate::worker::endpoint().await?;
    let (_, pay_to) = fresh_key();
    let (payer_key, payer) = fresh_key();
    let per_side = args.tasks.div_ceil(args.rounds) * args.rounds;
    chain.mint(&payer, PRICE * per_side as u128 + deposit(per_side)).await?;
    let authorizer = address_of(AUTHORIZER_KEY)?;
    // The payer's channel to the run's seller, as `--channel` opens it.
    let channel = reeve_shared::payments::batch::ChannelConfig {
        payer: payer.parse()?,
        payerAuthorizer: payer.parse()?,
        receiver: pay_to.parse()?,
        receiverAuthorizer: authorizer.parse()?,
        token: TOKEN.parse()?,
        withdrawDelay: alloy_primitives::aliases::U40::from(WITHDRAW_DELAY),
        salt: alloy_primitives::B256::ZERO,
    }
    .id(CHAIN_ID);
    let first_block = chain.block().await?;

    let env = Env::harness("paid", db, redis, moto, &queue_url, &catalog(&endpoint, &pay_to, &authorizer)?)?;
    let logs = env.logs.clone();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let tracker = Arc::new(Tracker::default());
    let events = follow_events(&redis.url(), tracker.clone()).await?;
    let buyer = Buyer { reeve: args.reeve.clone(), endpoint: base.clone(), home: logs.join("config"), key: payer_key };

    let mut serve =
        env.spawn(&args.reeve, "serve", &["serve", "--no-worker", "--bind", &format!("127.0.0.1:{port}")]).await?;
    let outcome = async {
        let api = crate::worker::Api { http: reqwest::Client::new(), base, token: Arc::from("") };
        api.healthy(&mut serve).await?;
        let mut work = env.spawn(&args.reeve, "work", &["work"]).await?;
        buyer.run(&["space", "create", "--json"]).await?;
        // Warm the path every side shares (connections, the worker's poll).
        buyer.create(Side::Free, 0, &tracker, 0).await.map_err(|e| e.context(work.exited().unwrap_or_default()))?;

        let per_round = per_side / args.rounds;
        let mut samples: [Vec<u64>; 3] = Default::default();
        let mut n = 1;
        for round in 0..args.rounds {
            for offset in 0..Side::ALL.len() {
                let (i, side) = ((round + offset) % 3, Side::ALL[(round + offset) % 3]);
                for _ in 0..per_round {
                    let sample = buyer.create(side, n, &tracker, deposit(per_side)).await;
                    samples[i].push(sample.map_err(|e| e.context(work.exited().unwrap_or_default()))?);
                    n += 1;
                }
            }
            eprintln!("paid bench: round {} of {} measured", round + 1, args.rounds);
        }
        work.stop().await;
        let exact_transactions =
            chain.transactions(first_block, TOKEN, json!([TRANSFER, topic(&payer), topic(&pay_to)])).await?;
        let batch_logs = json!([null, [format!("{channel:#x}"), topic(&pay_to)]]);
        let escrow = format!("{:#x}", reeve_shared::payments::batch::ESCROW);
        let batch_transactions = chain.transactions(first_block, &escrow, batch_logs.clone()).await?;

        // What the vouchers bought, claimed and paid to payTo by one sweep
        // given the receiver authorizer's key.
        let sweep = Command::new(&args.reeve)
            .args(["sweep", "--once", "--catalog"])
            .arg(env.catalog())
            .envs(env.vars.iter().map(|(k, v)| (k, v)))
            .env("REEVE_BATCH_AUTHORIZER_KEY", AUTHORIZER_KEY)
            .env("REEVE_BATCH_CLAIM_AFTER_SECONDS", "0")
            .output()
            .await?;
        ensure!(sweep.status.success(), "reeve sweep: {}", String::from_utf8_lossy(&sweep.stderr));
        let claim_transactions = chain.transactions(first_block, &escrow, batch_logs).await? - batch_transactions;
        let paid_to = chain.balance(&pay_to).await?;
        anyhow::Ok(Measured { samples, exact_transactions, batch_transactions, claim_transactions, paid_to })
    }
    .await;
    serve.stop().await;
    events.abort();
    endpoint_server.abort();
    let measured = outcome.map_err(|e| e.context(format!("reeve serve's log:\n{}", tail(&serve_log(&logs)))))?;
    let charged = PRICE * (measured.samples[1].len() + measured.samples[2].len()) as u128;
    ensure!(
        measured.paid_to == charged,
        "payTo holds {}, not the {charged} both paid sides were charged",
        measured.paid_to
    );
    if std::env::var("REEVE_BENCH_KEEP_LOGS").is_err() {
        let _ = std::fs::remove_dir_all(&logs);
    }
    Ok(measured)
}

fn serve_log(logs: &Path) -> PathBuf {
    logs.join("serve.log")
}

fn report(args: &Args, m: &Measured) -> String {
    let sorted: Vec<Vec<u64>> = m
        .samples
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.sort_unstable();
            s
        })
        .collect();
    let p50 = |i: usize| ms(&sorted[i], 0.5);
    let batch_transactions = m.batch_transactions + m.claim_transactions;
    let per_100 = |transactions: usize, i: usize| transactions as f64 * 100.0 / sorted[i].len() as f64;
    let ratio = p50(2) / p50(0);
    let mut out = String::new();
    out.push_str("## Paid as fast as free: create to running, free, `exact` and `batch-settlement`\n\n");
    out.push_str(&format!(
        "One buyer (the release `reeve` CLI, a process per task: `reeve task create KIND --json`, with `--pay` or \
         `--pay --channel --deposit {}`) creates {} tasks per side, one after another, over {} rounds in which the \
         three sides take turns; each task's figure is from the command's start to the task's `running` event \
         reaching Redis. `reeve serve --no-worker` and `reeve work` run on the harness's own database, queue and \
         Redis, with the local stack's chain (a block a second) and x402 facilitator. Transactions, from the \
         run's logs: `exact`'s transfers from the payer to `payTo`; batch settlement's with the escrow's logs of \
         the payer's channel or of a payout to `payTo`, the closing sweep's claim and payout included. The payee \
         then held exactly what both paid sides were charged.\n\n",
        deposit(sorted[2].len()),
        sorted[0].len(),
        args.rounds,
    ));
    out.push_str("| side | p50 | p90 | p50 / free | transactions | per 100 tasks |\n|---|---|---|---|---|---|\n");
    for (i, side) in Side::ALL.iter().enumerate() {
        let transactions = match side {
            Side::Free => 0,
            Side::Exact => m.exact_transactions,
            Side::Batch => batch_transactions,
        };
        out.push_str(&format!(
            "| {} | {:.0} ms | {:.0} ms | {:.2} | {} | {:.1} |\n",
            side.name(),
            p50(i),
            ms(&sorted[i], 0.9),
            p50(i) / p50(0),
            transactions,
            per_100(transactions, i),
        ));
    }
    out.push_str(&format!(
        "\nBatch settlement's transactions: {} at create (the deposit), {} at the closing sweep (claim and \
         payout).\n\n| goal | measured | |\n|---|---|---|\n\
         | batch p50 ≤ {GOAL_RATIO}× free | {ratio:.2}× | {} |\n\
         | ≤ {GOAL_TRANSACTIONS} transactions per 100 batch-paid tasks (against 100 for `exact`) | {:.1} | {} |\n\n",
        m.batch_transactions,
        m.claim_transactions,
        verdict(ratio <= GOAL_RATIO),
        per_100(batch_transactions, 2),
        verdict(per_100(batch_transactions, 2) <= GOAL_TRANSACTIONS),
    ));
    out
}
