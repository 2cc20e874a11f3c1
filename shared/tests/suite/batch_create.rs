//! Paying Reeve's REST create by x402's `batch-settlement` scheme, on the
//! real local chain and facilitator: each official client (`@x402/evm`'s
//! batch-settlement client under `@x402/core`'s HTTP client,
//! scripts/payments/batch-tasks.mjs; coinbase's x402 Python SDK's, under its
//! sync HTTP client, scripts/payments/batch-tasks.py) pays
//! `POST /v1/tasks/{kind}` on a served Reeve, one deposit then vouchers over
//! one channel; and every
//! voucher an attacker (or a confused client) could send instead is
//! answered as the scheme says, with nothing charged.

use std::net::SocketAddr;
use std::time::Duration;

use alloy_primitives::aliases::U40;
use alloy_primitives::{Address, B256};
use alloy_signer::k256::ecdsa::SigningKey;
use alloy_sol_types::{SolCall, SolStruct, sol};
use axum::http::{HeaderValue, StatusCode};
use base64::Engine;
use reeve_shared::http::app;
use reeve_shared::ids::Id;
use reeve_shared::payments::CHAIN_RPC_URLS;
use reeve_shared::payments::batch::{self, ChannelConfig};
use reeve_shared::payments::offer_receipt;
use reeve_shared::settings::{self, Config};
use reeve_shared::startup;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::common::chain::{self, ChainLock, Client, Payer};
use crate::common::{self, Reply, TestQueue, new_session, post_json, send};

pub(super) const PRICE: u128 = 1_000;
/// A second kind's price, more than a first deposit (10 prices) holds.
const BIG: u128 = 20_000;
pub(super) const FUNDS: u128 = 50_000;
pub(super) const WITHDRAW_DELAY: u64 = 900;
pub(super) const CHAIN: u64 = 84532;

fn facilitator_url() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

/// The receiver authorizer's key: the test signs Reeve's claims with it.
pub(super) fn authorizer_key() -> SigningKey {
    SigningKey::from_slice(&[0x42; 32]).unwrap()
}

pub(super) fn authorizer() -> Address {
    alloy_signer::utils::public_key_to_address(authorizer_key().verifying_key())
}

/// Two kinds paid per task by batch settlement in the local token.
/// The catalog: two kinds priced by batch settlement, its deployment
/// signing receipts.
fn catalog(pay_to: &str, facilitator: &str) -> String {
    let kind = |name: &str, price: u128| {
        format!(
            r#"
[tasks.{name}]
title = "Job"
description = "A job paid by batch settlement"
executor = "fetch"
input_schema = {{ type = "object" }}
[[tasks.{name}.accepts]]
asset = "local"
scheme = "batch"
amount = "{price}"
"#
        )
    };
    common::signing_receipts(&format!(
        r#"
[payments]
pay_to = "{pay_to}"
facilitator_url = "{facilitator}"
batch_receiver_authorizer = "{authorizer:#x}"
batch_withdraw_delay_seconds = {WITHDRAW_DELAY}

[assets.local]
network = "eip155:84532"
contract = "{token}"
decimals = 6
usd_peg = true
name = "USDC"
version = "2"
{job}
{big}
"#,
        token = chain::TOKEN,
        authorizer = authorizer(),
        job = kind("job", PRICE),
        big = kind("big", BIG),
    ))
}

/// Reeve, served on a loopback port as `reeve serve` serves it, and the
/// Space that buys.
pub(super) struct Shop {
    pub(super) app: axum::Router,
    pub(super) addr: SocketAddr,
    pub(super) token: String,
    pub(super) pay_to: String,
    pub(super) queue: TestQueue,
    pub(super) pool: PgPool,
    pub(super) config: Config,
}

impl Shop {
    pub(super) async fn new(pool: &PgPool) -> Shop {
        Shop::with(pool, &chain::fresh_address(), &facilitator_url(), &chain::rpc_url()).await
    }

    /// A shop selling to `pay_to` through `facilitator`, reading the chain
    /// at `rpc`.
    async fn with(pool: &PgPool, pay_to: &str, facilitator: &str, rpc: &str) -> Shop {
        Shop::serving(pool, pay_to, facilitator, rpc, &[]).await
    }

    /// The same, with `settings` added to its environment.
    pub(super) async fn serving(
        pool: &PgPool,
        pay_to: &str,
        facilitator: &str,
        rpc: &str,
        settings: &[(&str, &str)],
    ) -> Shop {
        let queue = TestQueue::new().await;
        let pay_to = pay_to.to_owned();
        let mut config = common::with_catalog(common::config(pool), &catalog(&pay_to, facilitator))
            .with(settings::QUEUE_URL, &queue.url)
            .with(CHAIN_RPC_URLS, chain::chain_rpc_urls_at(rpc));
        for (name, value) in settings {
            config = config.with(name, *value);
        }
        let app = app(common::api(&config).await);
        let config = config.clone();
        let token = new_session(&app).await.1;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = app.clone();
        tokio::spawn(async move { axum::serve(listener, served).await.unwrap() });
        Shop { app, addr, token, pay_to, queue, pool: pool.clone(), config }
    }

    /// The official TypeScript client, in a process of its own, creating
    /// `count` tasks of `job` with inputs `{"n": "<label>-<i>"}`.
    pub(super) async fn official_client_creates(&self, payer: &Payer, count: usize, label: &str) -> Vec<Value> {
        self.client_creates(Client::TypeScript, payer, count, label).await
    }

    /// The same by `client`'s official SDK: its batch-settlement buyer
    /// (scripts/payments/batch-tasks.mjs, batch-tasks.py), one entry per
    /// task, as both print.
    pub(super) async fn client_creates(&self, client: Client, payer: &Payer, count: usize, label: &str) -> Vec<Value> {
        let script = match client {
            Client::TypeScript => "batch-tasks.mjs",
            Client::Python => "batch-tasks.py",
        };
        let url = format!("http://{}/v1/tasks/job", self.addr);
        let args = vec![chain::rpc_url(), url, self.token.clone(), count.to_string(), label.to_owned()];
        let out = client.run(script, args, vec![("REEVE_WALLET_KEY", payer.key.clone())]).await;
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    pub(super) async fn create(&self, kind: &str, input: &Value, payment: Option<&str>) -> Reply {
        let mut request = post_json(&format!("/v1/tasks/{kind}"), Some(&self.token), &json!({ "input": input }));
        if let Some(payment) = payment {
            request.headers_mut().insert("payment-signature", HeaderValue::from_str(payment).unwrap());
        }
        send(&self.app, request).await
    }

    /// `kind`'s batch-settlement offer, as its `402` makes it.
    pub(super) async fn offer(&self, kind: &str) -> Value {
        let reply = self.create(kind, &json!({"n": "ask"}), None).await;
        assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
        reply.body["accepts"].as_array().unwrap().iter().find(|o| o["scheme"] == "batch-settlement").unwrap().clone()
    }

    async fn tasks(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&self.pool).await.unwrap()
    }

    /// What Reeve counts its channel was charged.
    pub(super) async fn charged(&self, channel: &str) -> u128 {
        let charged: String = sqlx::query_scalar("SELECT charged::TEXT FROM batch_channels WHERE channel_id = $1")
            .bind(channel)
            .fetch_one(&self.pool)
            .await
            .unwrap();
        charged.parse().unwrap()
    }
}

/// The payer's channel to the shop, as the official client opens it (its
/// own key as payer authorizer, salt 0), and the payer's key, to sign
/// vouchers on it by hand.
pub(super) struct Channel {
    pub(super) key: SigningKey,
    pub(super) config: ChannelConfig,
}

impl Channel {
    pub(super) fn of(payer: &Payer, pay_to: &str) -> Channel {
        let key = SigningKey::from_slice(&hex::decode(payer.key.trim_start_matches("0x")).unwrap()).unwrap();
        let address: Address = payer.address.parse().unwrap();
        let config = ChannelConfig {
            payer: address,
            payerAuthorizer: address,
            receiver: pay_to.parse().unwrap(),
            receiverAuthorizer: authorizer(),
            token: chain::TOKEN.parse().unwrap(),
            withdrawDelay: U40::from(WITHDRAW_DELAY),
            salt: B256::ZERO,
        };
        Channel { key, config }
    }

    pub(super) fn id(&self) -> String {
        format!("{:#x}", self.config.id(CHAIN))
    }

    /// A `PAYMENT-SIGNATURE` paying `offer` with a voucher of `ceiling` on
    /// `config`'s channel (named `channel_id`), signed by `key`.
    pub(super) fn voucher(
        offer: &Value,
        config: &ChannelConfig,
        channel_id: B256,
        ceiling: u128,
        key: &SigningKey,
    ) -> String {
        let voucher = batch::voucher::Voucher { channelId: channel_id, maxClaimableAmount: ceiling };
        let digest = voucher.eip712_signing_hash(&batch::voucher::domain(CHAIN));
        let (signature, recovery) = key.sign_prehash_recoverable(digest.as_slice()).unwrap();
        let mut bytes = signature.to_bytes().to_vec();
        bytes.push(27 + recovery.to_byte());
        let document = json!({
            "x402Version": 2,
            "accepted": offer,
            "payload": {
                "type": "voucher",
                "channelConfig": {
                    "payer": format!("{:#x}", config.payer),
                    "payerAuthorizer": format!("{:#x}", config.payerAuthorizer),
                    "receiver": format!("{:#x}", config.receiver),
                    "receiverAuthorizer": format!("{:#x}", config.receiverAuthorizer),
                    "token": format!("{:#x}", config.token),
                    "withdrawDelay": config.withdrawDelay.to::<u64>(),
                    "salt": format!("{:#x}", config.salt),
                },
                "voucher": {
                    "channelId": format!("{channel_id:#x}"),
                    "maxClaimableAmount": ceiling.to_string(),
                    "signature": format!("0x{}", hex::encode(bytes)),
                },
            },
        });
        base64::engine::general_purpose::STANDARD.encode(document.to_string())
    }

    /// The payer's own voucher of `ceiling` on this channel, paying `offer`.
    pub(super) fn pay(&self, offer: &Value, ceiling: u128) -> String {
        Self::voucher(offer, &self.config, self.config.id(CHAIN), ceiling, &self.key)
    }
}

sol! {
    struct EscrowConfig {
        address payer;
        address payerAuthorizer;
        address receiver;
        address receiverAuthorizer;
        address token;
        uint40 withdrawDelay;
        bytes32 salt;
    }
    function initiateWithdraw(EscrowConfig config, uint128 amount) external;
    function finalizeWithdraw(EscrowConfig config) external;

    struct EscrowVoucher {
        EscrowConfig channel;
        uint128 maxClaimableAmount;
    }
    struct VoucherClaim {
        EscrowVoucher voucher;
        bytes signature;
        uint128 totalClaimed;
    }
    function getClaimBatchDigest(VoucherClaim[] voucherClaims) external view returns (bytes32);
}

impl EscrowConfig {
    pub(super) fn of(config: &ChannelConfig) -> EscrowConfig {
        EscrowConfig {
            payer: config.payer,
            payerAuthorizer: config.payerAuthorizer,
            receiver: config.receiver,
            receiverAuthorizer: config.receiverAuthorizer,
            token: config.token,
            withdrawDelay: config.withdrawDelay,
            salt: config.salt,
        }
    }
}

/// The `402` a refused voucher answers: its code, and the challenge in
/// `PAYMENT-REQUIRED` with the same code as its `error`.
pub(super) fn refused(reply: &Reply, code: &str) -> Value {
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED, "{}", reply.body);
    assert_eq!(reply.code(), code, "{}", reply.body);
    let header = reply.headers["payment-required"].to_str().unwrap();
    let challenge: Value =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header).unwrap()).unwrap();
    assert_eq!(challenge["error"], code);
    challenge
}

/// The books of one channel, to the unit: every voucher Reeve took is one
/// task, each the previous ceiling plus that task's price; what Reeve counts
/// the channel charged is the last ceiling; the escrow holds all of it, and
/// has let nothing be claimed beyond it. Answers what was charged.
pub(super) async fn assert_channel_books(pool: &PgPool, channel: &str) -> u128 {
    let vouchers: Vec<(String, String, Option<Id>)> = sqlx::query_as(
        "SELECT ceiling::TEXT, price::TEXT, task_id FROM batch_vouchers WHERE channel_id = $1 ORDER BY ceiling",
    )
    .bind(channel)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut total = 0u128;
    let mut tasks = std::collections::BTreeSet::new();
    for (ceiling, price, task) in &vouchers {
        total += price.parse::<u128>().unwrap();
        assert_eq!(ceiling.parse::<u128>().unwrap(), total, "each voucher is the last one plus its task's price");
        let task = task.unwrap_or_else(|| panic!("the voucher of {ceiling} bought no task"));
        assert!(tasks.insert(task), "one task per voucher");
        let stored: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = $1").bind(task).fetch_one(pool).await.unwrap();
        assert_eq!(stored, 1, "the task of {ceiling} exists");
    }
    let charged: String = sqlx::query_scalar("SELECT charged::TEXT FROM batch_channels WHERE channel_id = $1")
        .bind(channel)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(charged.parse::<u128>().unwrap(), total, "the channel is charged what its vouchers bought");
    let chains = reeve_shared::payments::Chains::parse(&chain::chain_rpc_urls()).unwrap();
    let on_chain = batch::read(chains.get("eip155:84532").unwrap(), channel.parse().unwrap()).await.unwrap();
    assert!(on_chain.total_claimed <= total, "nothing is claimed beyond the vouchers");
    assert!(on_chain.balance >= total, "the escrow holds what every voucher bought");
    total
}

/// What every official client does over a new channel to the shop, on the
/// chain: one process pays 4 tasks (a deposit of ten prices, the offer's
/// `minDeposit`, sent by the facilitator; then three vouchers Reeve checks
/// itself), a second process knowing nothing of the channel pays 2 more
/// (it resynchronises from Reeve's `402` and deposits nothing). Six tasks,
/// each bought once (the last voucher sent again buys the same task), one
/// deposit, no gas held by the payer, nothing moved to the seller, and the
/// channel's books balance. Answers both processes' entries.
async fn pays_six_tasks_over_one_channel(
    shop: &Shop,
    payer: &Payer,
    channel: &Channel,
    client: Client,
) -> (Vec<Value>, Vec<Value>) {
    let first = shop.client_creates(client, payer, 4, "a").await;
    let kinds: Vec<&str> = first.iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["deposit", "voucher", "voucher", "voucher"], "{client:?}: {first:?}");
    assert!(first.iter().all(|c| c["status"] == 202 && c["recovered"] == false), "{client:?}: {first:?}");
    let ids: std::collections::BTreeSet<&str> = first.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 4, "four tasks: {first:?}");
    // The deposit is the payer's ERC-3009 authorization (for the deposit
    // collector), of the offer's minDeposit.
    let header = base64::engine::general_purpose::STANDARD.decode(first[0]["header"].as_str().unwrap()).unwrap();
    let deposit = &serde_json::from_slice::<Value>(&header).unwrap()["payload"]["deposit"];
    assert_eq!(deposit["amount"], (10 * PRICE).to_string(), "{client:?}: {deposit}");
    assert!(deposit["authorization"]["erc3009Authorization"]["signature"].is_string(), "{client:?}: {deposit}");
    assert_eq!(shop.tasks().await, 4);
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE, "one deposit of ten prices");
    assert_eq!(shop.charged(&channel.id()).await, 4 * PRICE);

    // Another process of the same payer knows nothing of the channel: it
    // reads the escrow (a balance, nothing claimed), signs one price, is
    // told by the resynchronising 402 that four were charged, and pays the
    // fifth; never a second deposit.
    let second = shop.client_creates(client, payer, 2, "b").await;
    assert_eq!(second[0]["recovered"], true, "{client:?}: {second:?}");
    assert!(second.iter().all(|c| c["status"] == 202 && c["type"] == "voucher"), "{client:?}: {second:?}");
    assert_eq!(shop.tasks().await, 6);
    assert_eq!(shop.charged(&channel.id()).await, 6 * PRICE);
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE, "still one deposit");
    // Nothing moved to the seller yet: the vouchers wait to be claimed.
    assert_eq!(chain::balance(&shop.pay_to).await, 0);
    // The buyer never held gas: the facilitator sent the deposit.
    assert_eq!(chain::eth_balance(&payer.address).await, 0);
    eprintln!(
        "{client:?} voucher-paid creates (ms): {:?}",
        first.iter().chain(&second).filter(|c| c["type"] == "voucher").map(|c| &c["ms"]).collect::<Vec<_>>()
    );

    // The same voucher sent again for the same request: the same task,
    // never a second.
    let last = &second[1];
    let again = shop.create("job", &json!({"n": "b-1"}), last["header"].as_str()).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    assert_eq!(again.body["id"], last["id"]);
    assert_eq!(shop.tasks().await, 6);
    assert_eq!(assert_channel_books(&shop.pool, &channel.id()).await, 6 * PRICE);
    (first, second)
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_official_client_pays_tasks_over_one_channel_one_deposit_then_vouchers_each_task_once(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    let channel = Channel::of(&payer, &shop.pay_to);
    let (_, second) = pays_six_tasks_over_one_channel(&shop, &payer, &channel, Client::TypeScript).await;
    let last = &second[1];

    // Its signed receipt names the voucher (its channel and cumulative
    // amount), the payer and the price; no transaction until a claim.
    let path = format!("/v1/tasks/{}/receipt", last["id"].as_str().unwrap());
    let reply = send(&shop.app, common::get_authed(&path, &shop.token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let signed: offer_receipt::Signed = serde_json::from_value(reply.body).unwrap();
    let receipt = offer_receipt::verify(&signed, Some(common::receipt_signer().parse().unwrap())).unwrap().payload;
    assert_eq!((receipt["scheme"].as_str(), receipt["transaction"].as_str()), (Some("batch-settlement"), Some("")));
    assert_eq!(receipt["amount"], PRICE.to_string());
    assert_eq!(receipt["voucher"], json!({ "channelId": channel.id(), "cumulativeAmount": (6 * PRICE).to_string() }));
    assert_eq!(receipt["payer"].as_str().map(str::to_ascii_lowercase), Some(payer.address.to_ascii_lowercase()));
    assert_eq!(receipt["payTo"].as_str().map(str::to_ascii_lowercase), Some(shop.pay_to.to_ascii_lowercase()));
    // The same voucher for another request: spent, and the buyer is told
    // where its channel stands (six prices charged, and its own last
    // voucher), from which the official client signs the next one.
    let offer = shop.offer("job").await;
    let replayed = shop.create("job", &json!({"n": "other"}), last["header"].as_str()).await;
    let challenge = refused(&replayed, "invalid_batch_settlement_evm_cumulative_amount_mismatch");
    let extra = &challenge["accepts"][0]["extra"];
    assert_eq!(extra["channelState"]["chargedCumulativeAmount"], (6 * PRICE).to_string(), "{challenge}");
    assert_eq!(extra["channelState"]["balance"], (10 * PRICE).to_string());
    assert_eq!(extra["voucherState"]["signedMaxClaimable"], (6 * PRICE).to_string());

    // Below what was charged, or skipping a charge: refused.
    for ceiling in [6 * PRICE - PRICE / 2, 8 * PRICE] {
        let reply = shop.create("job", &json!({"n": "c"}), Some(&channel.pay(&offer, ceiling))).await;
        refused(&reply, "invalid_batch_settlement_evm_cumulative_amount_mismatch");
    }
    // Signed by another key.
    let thief = SigningKey::random(&mut alloy_signer::k256::elliptic_curve::rand_core::OsRng);
    let forged = Channel::voucher(&offer, &channel.config, channel.config.id(CHAIN), 7 * PRICE, &thief);
    refused(
        &shop.create("job", &json!({"n": "c"}), Some(&forged)).await,
        "invalid_batch_settlement_evm_voucher_signature",
    );
    // For another channel: one paying someone else, or named by another
    // channel's id.
    let elsewhere = ChannelConfig { receiver: Address::repeat_byte(9), ..channel.config.clone() };
    let other = Channel::voucher(&offer, &elsewhere, elsewhere.id(CHAIN), 7 * PRICE, &channel.key);
    refused(
        &shop.create("job", &json!({"n": "c"}), Some(&other)).await,
        "invalid_batch_settlement_evm_receiver_mismatch",
    );
    let salted = ChannelConfig { salt: B256::repeat_byte(1), ..channel.config.clone() };
    let misnamed = Channel::voucher(&offer, &channel.config, salted.id(CHAIN), 7 * PRICE, &channel.key);
    refused(
        &shop.create("job", &json!({"n": "c"}), Some(&misnamed)).await,
        "invalid_batch_settlement_evm_channel_id_mismatch",
    );
    // The next voucher, for a task the channel's balance does not cover.
    let big = shop.offer("big").await;
    let reply = shop.create("big", &json!({"n": "c"}), Some(&channel.pay(&big, 6 * PRICE + BIG))).await;
    let challenge = refused(&reply, "invalid_batch_settlement_evm_cumulative_exceeds_balance");
    assert_eq!(challenge["accepts"][0]["extra"]["channelState"]["chargedCumulativeAmount"], (6 * PRICE).to_string());
    assert_eq!(shop.tasks().await, 6, "no refused voucher made a task");
    assert_eq!(shop.charged(&channel.id()).await, 6 * PRICE);

    // The payer asks to withdraw. A voucher Reeve decides on its read of
    // the channel from before (within a minute) is still taken: the escrow
    // keeps it claimable for the withdraw delay (15 minutes here). Once
    // that read is too old, the channel is read again and buys nothing more.
    let config = EscrowConfig::of(&channel.config);
    // Reeve read the channel just before the payer asked (on a busy channel
    // every minute).
    sqlx::query("UPDATE batch_channels SET read_at = now()").execute(&pool).await.unwrap();
    let call = initiateWithdrawCall { config, amount: PRICE }.abi_encode();
    payer.send(&chain, &format!("{:#x}", batch::ESCROW), &format!("0x{}", hex::encode(call))).await;
    let taken = shop.create("job", &json!({"n": "d"}), Some(&channel.pay(&offer, 7 * PRICE))).await;
    assert_eq!(taken.status, StatusCode::ACCEPTED, "{}", taken.body);
    sqlx::query("UPDATE batch_channels SET read_at = now() - interval '61 seconds'").execute(&pool).await.unwrap();
    let late = shop.create("job", &json!({"n": "e"}), Some(&channel.pay(&offer, 8 * PRICE))).await;
    let challenge = refused(&late, "batch_withdraw_requested");
    assert!(challenge["accepts"][0]["extra"]["channelState"]["withdrawRequestedAt"].as_u64().unwrap() > 0);

    // Seven tasks, seven vouchers, charged seven prices, all in escrow.
    assert_eq!(shop.tasks().await, 7);
    assert_eq!(assert_channel_books(&pool, &channel.id()).await, 7 * PRICE);

    // A voucher-paid task canceled before it runs leaves a credit of its
    // price, as an `exact` one does.
    let canceled = send(
        &shop.app,
        post_json(&format!("/v1/tasks/{}/cancel", last["id"].as_str().unwrap()), Some(&shop.token), &json!({})),
    )
    .await;
    assert_eq!(canceled.status, StatusCode::OK, "{}", canceled.body);
    let credits: Vec<(String, String)> =
        sqlx::query_as("SELECT amount, asset FROM credits").fetch_all(&pool).await.unwrap();
    assert_eq!(credits, [(PRICE.to_string(), chain::TOKEN.to_owned())]);
    shop.queue.delete().await;
}

/// coinbase's x402 Python SDK pays as the TypeScript client does: its own
/// batch-settlement client under its HTTP client, the same deposit rule
/// (the offer's `minDeposit`, by ERC-3009 through the deposit collector),
/// the same resynchronisation from Reeve's `402`.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_python_sdk_pays_tasks_over_one_channel_one_deposit_then_vouchers_each_task_once(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(&pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    let channel = Channel::of(&payer, &shop.pay_to);
    pays_six_tasks_over_one_channel(&shop, &payer, &channel, Client::Python).await;
    shop.queue.delete().await;
}

/// A Python SDK process that cannot read the chain takes the payer's old
/// channel for a new one: the SDK (2.25) treats a failed read as no channel
/// and signs a deposit of ten prices with a voucher of one price, where the
/// TypeScript client stops. Reeve decides a deposit's voucher before it has
/// the deposit settled, as the scheme has servers do: one price on a channel
/// charged two is refused with the resynchronising `402`, the facilitator is
/// never asked, and the SDK, unable to read the chain to resynchronise,
/// stops. No second deposit, no task.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_python_sdk_blind_to_the_chain_signs_a_second_deposit_that_is_refused_before_money_moves(pool: PgPool) {
    use std::sync::atomic::Ordering::SeqCst;
    let chain = ChainLock::shared().await;
    let facilitator = chain::ScriptedFacilitator::start(&facilitator_url()).await;
    let shop = Shop::serving(&pool, &chain::fresh_address(), &facilitator.url, &chain::rpc_url(), &[]).await;
    let payer = Payer::new(&chain, FUNDS).await;
    let channel = Channel::of(&payer, &shop.pay_to);
    let paid = shop.client_creates(Client::Python, &payer, 2, "a").await;
    assert!(paid.iter().all(|c| c["status"] == 202), "{paid:?}");
    assert_eq!(facilitator.settles.load(SeqCst), 1, "the first deposit");

    let url = format!("http://{}/v1/tasks/job", shop.addr);
    let args = vec!["http://127.0.0.1:1".to_owned(), url, shop.token.clone(), "1".to_owned(), "b".to_owned()];
    let env = vec![("REEVE_WALLET_KEY", payer.key.clone())];
    let out = Client::Python.output("batch-tasks.py", args, env).await;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    // It sent a deposit, was refused, and stopped resynchronising from
    // Reeve's answer.
    assert!(said.contains("task 0: a deposit payment, answered 402"), "{said}");
    assert!(said.contains("process_corrective_payment_required"), "{said}");
    assert_eq!(facilitator.settles.load(SeqCst), 1, "no second deposit was sent");
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE);
    assert_eq!(shop.tasks().await, 2);
    assert_eq!(assert_channel_books(&pool, &channel.id()).await, 2 * PRICE);
    shop.queue.delete().await;
}

/// While the facilitator and the chain are out of reach, vouchers go on
/// being taken on Reeve's own check, as long as its last read of the
/// channel is recent enough; then `503 chain_unavailable`, nothing charged.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn vouchers_are_taken_without_facilitator_or_chain_within_the_staleness_bound_then_503(pool: PgPool) {
    let (_chain, shop, _payer, channel) = bought_over_a_channel(&pool, 2).await;

    // The same seller, with its facilitator and its chain endpoint down
    // (nothing listens on port 1).
    let cut = Shop::with(&pool, &shop.pay_to, "http://127.0.0.1:1", "http://127.0.0.1:1").await;
    let offer = cut.offer("job").await;
    let taken = cut.create("job", &json!({"n": "b"}), Some(&channel.pay(&offer, 3 * PRICE))).await;
    assert_eq!(taken.status, StatusCode::ACCEPTED, "{}", taken.body);
    assert_eq!(cut.tasks().await, 3);

    // Reeve's read of the channel grows older than the bound.
    sqlx::query("UPDATE batch_channels SET read_at = now() - interval '61 seconds'").execute(&pool).await.unwrap();
    let late = cut.create("job", &json!({"n": "c"}), Some(&channel.pay(&offer, 4 * PRICE))).await;
    assert_eq!(late.status, StatusCode::SERVICE_UNAVAILABLE, "{}", late.body);
    assert_eq!(late.code(), "chain_unavailable");
    assert_eq!(cut.tasks().await, 3, "nothing charged, no task");
    assert_eq!(cut.charged(&channel.id()).await, 3 * PRICE);

    // The chain back: the same voucher is taken.
    let back = shop.create("job", &json!({"n": "c"}), Some(&channel.pay(&offer, 4 * PRICE))).await;
    assert_eq!(back.status, StatusCode::ACCEPTED, "{}", back.body);
    assert_eq!(assert_channel_books(&pool, &channel.id()).await, 4 * PRICE);
    shop.queue.delete().await;
    cut.queue.delete().await;
}

/// The chain held shared, a shop, and a payer that opened a channel to it
/// with the official client and bought `tasks` tasks over it.
pub(super) async fn bought_over_a_channel(pool: &PgPool, tasks: usize) -> (ChainLock, Shop, Payer, Channel) {
    let chain = ChainLock::shared().await;
    let shop = Shop::new(pool).await;
    let payer = Payer::new(&chain, FUNDS).await;
    let channel = Channel::of(&payer, &shop.pay_to);
    let paid = shop.official_client_creates(&payer, tasks, "a").await;
    assert!(paid.iter().all(|c| c["status"] == 202), "{paid:?}");
    (chain, shop, payer, channel)
}

/// The claims that are due, the digest the receiver authorizer signs for
/// them (the escrow's own `getClaimBatchDigest`), and the claim payload:
/// sent through the facilitator's `/settle`, it claims exactly what the
/// vouchers bought, and the `settle` payload then pays it to `payTo`, as
/// the sweep sends them.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_claim_due_is_the_last_voucher_and_the_facilitator_claims_exactly_what_it_bought(pool: PgPool) {
    use batch::claim;

    let (_chain, shop, payer, channel) = bought_over_a_channel(&pool, 3).await;

    // Taken a moment ago, with 15 minutes of withdraw delay: not due within
    // an hour's policy (a quarter of the delay is under four minutes away),
    // due at once with none.
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(claim::due(&mut conn, Duration::from_secs(3600), 10).await.unwrap(), []);
    let due = claim::due(&mut conn, Duration::ZERO, 10).await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!((due[0].ceiling, due[0].total), (3 * PRICE, 3 * PRICE));
    assert_eq!(format!("{:#x}", due[0].channel_id), channel.id());

    // The digest is the escrow's.
    let signature: alloy_primitives::Bytes = due[0].signature.parse().unwrap();
    let entry = VoucherClaim {
        voucher: EscrowVoucher { channel: EscrowConfig::of(&channel.config), maxClaimableAmount: 3 * PRICE },
        signature: signature.clone(),
        totalClaimed: 3 * PRICE,
    };
    let call = getClaimBatchDigestCall { voucherClaims: vec![entry] }.abi_encode();
    let escrow = format!("{:#x}", batch::ESCROW);
    let answer =
        chain::rpc("eth_call", json!([{"to": escrow, "data": format!("0x{}", hex::encode(call))}, "latest"])).await;
    let digest = claim::digest(CHAIN, &due);
    assert_eq!(answer.as_str().unwrap(), format!("{digest:#x}"));

    // Signed by the receiver authorizer, claimed and settled through the
    // facilitator, as `@x402/evm`'s channel manager sends them.
    let (signed, recovery) = authorizer_key().sign_prehash_recoverable(digest.as_slice()).unwrap();
    let mut bytes = signed.to_bytes().to_vec();
    bytes.push(27 + recovery.to_byte());
    let requirements = json!({
        "scheme": "batch-settlement", "network": "eip155:84532", "asset": chain::TOKEN, "amount": "0",
        "payTo": shop.pay_to, "maxTimeoutSeconds": 0, "extra": {},
    });
    let settle = |payload: Value| {
        let body = json!({
            "x402Version": 2,
            "paymentPayload": {"x402Version": 2, "accepted": requirements, "payload": payload},
            "paymentRequirements": requirements,
        });
        async move {
            let answer =
                reqwest::Client::new().post(format!("{}/settle", facilitator_url())).json(&body).send().await.unwrap();
            answer.json::<Value>().await.unwrap()
        }
    };
    let claimed = settle(claim::payload(&due, &format!("0x{}", hex::encode(bytes)))).await;
    assert_eq!(claimed["success"], true, "{claimed}");
    let chains = reeve_shared::payments::Chains::parse(&chain::chain_rpc_urls()).unwrap();
    let on_chain = batch::read(chains.get("eip155:84532").unwrap(), channel.id().parse().unwrap()).await.unwrap();
    assert_eq!((on_chain.balance, on_chain.total_claimed), (10 * PRICE, 3 * PRICE));
    let moved = settle(json!({"type": "settle", "receiver": shop.pay_to, "token": chain::TOKEN})).await;
    assert_eq!(moved["success"], true, "{moved}");
    assert_eq!(chain::balance(&shop.pay_to).await, 3 * PRICE, "the seller has exactly what the vouchers bought");
    // The payer can get back the rest, and no more.
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE);
    assert_eq!(on_chain.balance - on_chain.total_claimed, 7 * PRICE);
    shop.queue.delete().await;
}

/// The sweep, given the receiver authorizer's key, claims what the vouchers
/// bought and has it paid to `payTo`, once: the sweep beside a long-running
/// worker (`reeve work`, `reeve serve`) with the key from Secrets Manager
/// by ARN, as the template gives it to the sweeper function, claims; the
/// sweeper function's own sweep after it finds the escrow claimed and sends
/// nothing. A claim the facilitator does not answer is due again. A key of
/// another address does not start, by value or by ARN.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_sweep_claims_what_the_vouchers_bought_and_pays_it_to_pay_to_once(pool: PgPool) {
    let (_chain, shop, payer, channel) = bought_over_a_channel(&pool, 3).await;

    let moto = common::moto();
    let key = format!("0x{}", hex::encode([0x42u8; 32]));
    let config = shop.config.clone().with(settings::BATCH_CLAIM_AFTER, "0");
    // What an operator sees (`reeve payments channels`): three prices
    // charged, none claimed, due at once under a policy of 0.
    let open = batch::claim::channels(&pool, Duration::ZERO, false, 10).await.unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(
        (open[0].charged.clone(), open[0].unclaimed.clone()),
        ((3 * PRICE).to_string(), (3 * PRICE).to_string())
    );
    assert_eq!(open[0].payer, payer.address.to_lowercase());

    // With the facilitator unreachable the claim fails, nothing moves, and
    // the channel stays due.
    let cut =
        config.clone().with(settings::BATCH_AUTHORIZER_KEY, &key).with("REEVE_FACILITATOR_URL", "http://127.0.0.1:1");
    let cut = startup::sweeper(&cut, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"));
    let report = cut.sweep(Duration::from_secs(300)).await.unwrap();
    assert_eq!((report.payments.channels_claimed, report.payments.claims_failed), (0, 1), "{report:?}");
    assert_eq!(chain::balance(&shop.pay_to).await, 0);
    let by_arn =
        config.clone().with(settings::BATCH_AUTHORIZER_KEY_SECRET_ARN, common::create_secret(&moto, &key).await);
    let worker = common::worker(&config).await;
    let beside = startup::sweeper_beside(&worker, &by_arn, &moto, common::aws().await.sqs, shop.queue.url.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let function = startup::sweeper(&config.clone().with(settings::BATCH_AUTHORIZER_KEY, &key), &startup::sdk().await)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The first claims the channel; the second finds nothing due.
    for (sweeper, claimed) in [(beside, 1), (function, 0)] {
        let report = sweeper.sweep(Duration::from_secs(300)).await.unwrap();
        assert_eq!((report.payments.channels_claimed, report.payments.claims_failed), (claimed, 0), "{report:?}");
        let chains = reeve_shared::payments::Chains::parse(&chain::chain_rpc_urls()).unwrap();
        let on_chain = batch::read(chains.get("eip155:84532").unwrap(), channel.id().parse().unwrap()).await.unwrap();
        assert_eq!((on_chain.balance, on_chain.total_claimed), (10 * PRICE, 3 * PRICE));
        assert_eq!(chain::balance(&shop.pay_to).await, 3 * PRICE, "paid what the vouchers bought, once");
        let kept: String = sqlx::query_scalar("SELECT total_claimed::TEXT FROM batch_channels WHERE channel_id = $1")
            .bind(channel.id())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(kept, (3 * PRICE).to_string());
    }
    assert_eq!(assert_channel_books(&pool, &channel.id()).await, 3 * PRICE);
    assert_eq!(batch::claim::channels(&pool, Duration::ZERO, false, 10).await.unwrap(), [], "nothing unclaimed");

    let other = format!("0x{}", hex::encode([0x11u8; 32]));
    let by_value = shop.config.clone().with(settings::BATCH_AUTHORIZER_KEY, &other);
    let refused = startup::sweeper(&by_value, &startup::sdk().await).await.map(|_| ()).unwrap_err().to_string();
    assert!(refused.contains("REEVE_BATCH_AUTHORIZER_KEY is the key of"), "{refused}");
    assert!(!refused.contains(&hex::encode([0x11u8; 32])), "the key is never shown: {refused}");
    let by_arn =
        shop.config.clone().with(settings::BATCH_AUTHORIZER_KEY_SECRET_ARN, common::create_secret(&moto, &other).await);
    let refused = startup::sweeper(&by_arn, &moto).await.map(|_| ()).unwrap_err().to_string();
    assert!(refused.contains("REEVE_BATCH_AUTHORIZER_KEY is the key of"), "{refused}");
    assert!(!refused.contains(&hex::encode([0x11u8; 32])), "the key is never shown: {refused}");
    shop.queue.delete().await;
}
