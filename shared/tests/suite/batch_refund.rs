//! A payer's cooperative refund of its batch-settlement channel, on the
//! real local chain and facilitator: the official TypeScript client
//! (`@x402/evm`'s batch-settlement client, `refund(url)`, in
//! scripts/payments/batch-refund.mjs) asks a served Reeve at
//! `GET /v1/refund/{kind}`; Reeve claims what it charged and returns the
//! rest in one transaction. Every refund asked wrongly (another key,
//! another channel, an unknown one, twice, with the facilitator out of
//! reach) is answered as the scheme says, with nothing moved.

use alloy_primitives::{Address, B256};
use alloy_signer::k256::ecdsa::SigningKey;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine;
use reeve_shared::payments::batch::{self, ChannelConfig, OnChain};
use reeve_shared::settings;
use serde_json::{Value, json};
use sqlx::PgPool;

use super::batch_create::{CHAIN, Channel, FUNDS, PRICE, Shop, assert_channel_books, authorizer_key, refused};
use crate::common::chain::{self, ChainLock, Client, Payer};
use crate::common::{Reply, send};

fn facilitator_url() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

fn key() -> String {
    format!("0x{}", hex::encode(authorizer_key().to_bytes()))
}

/// A shop that signs refunds (the receiver authorizer's key given), its
/// facilitator `facilitator` for claims and refunds.
async fn refunding(pool: &PgPool, pay_to: &str, facilitator: &str) -> Shop {
    let settings = [(settings::BATCH_AUTHORIZER_KEY, key()), ("REEVE_FACILITATOR_URL", facilitator.to_owned())];
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Shop::serving(pool, pay_to, &facilitator_url(), &chain::rpc_url(), &settings).await
}

/// The escrow's state of `channel`, now.
async fn escrow(channel: &str) -> OnChain {
    let chains = reeve_shared::payments::Chains::parse(&chain::chain_rpc_urls()).unwrap();
    batch::read(chains.get("eip155:84532").unwrap(), channel.parse().unwrap()).await.unwrap()
}

/// The official TypeScript client asking `shop` for its refund (all, or
/// `amount`).
async fn official_client_refunds(shop: &Shop, payer: &Payer, amount: Option<u128>) -> Value {
    client_refunds(Client::TypeScript, shop, payer, amount).await
}

/// The same by `client`'s official SDK, its batch-settlement client's
/// `refund(url)` (scripts/payments/batch-refund.mjs, batch-refund.py).
async fn client_refunds(client: Client, shop: &Shop, payer: &Payer, amount: Option<u128>) -> Value {
    let script = match client {
        Client::TypeScript => "batch-refund.mjs",
        Client::Python => "batch-refund.py",
    };
    let url = format!("http://{}/v1/refund/job", shop.addr);
    let mut args = vec![chain::rpc_url(), url];
    args.extend(amount.map(|a| a.to_string()));
    let out = client.run(script, args, vec![("REEVE_WALLET_KEY", payer.key.clone())]).await;
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `GET /v1/refund/job` with `payment` in `PAYMENT-SIGNATURE`, if any.
async fn ask(shop: &Shop, payment: Option<&str>) -> Reply {
    let mut request = Request::get("/v1/refund/job");
    if let Some(payment) = payment {
        request = request.header("payment-signature", payment);
    }
    send(&shop.app, request.body(Body::empty()).unwrap()).await
}

fn decoded(reply: &Reply, header: &str) -> Value {
    let value = reply.headers[header].to_str().unwrap();
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(value).unwrap()).unwrap()
}

/// A `refund` payload on `config`'s channel (named `channel_id`), its
/// voucher of `ceiling` signed by `key`, paying `offer`.
fn refund(offer: &Value, config: &ChannelConfig, channel_id: B256, ceiling: u128, key: &SigningKey) -> String {
    let voucher = Channel::voucher(offer, config, channel_id, ceiling, key);
    let mut document: Value =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(voucher).unwrap()).unwrap();
    document["payload"]["type"] = json!("refund");
    base64::engine::general_purpose::STANDARD.encode(document.to_string())
}

/// What Reeve keeps of a channel: its refund count and what it holds.
async fn kept(pool: &PgPool, channel: &str) -> (i64, String) {
    sqlx::query_as("SELECT refund_nonce, balance::TEXT FROM batch_channels WHERE channel_id = $1")
        .bind(channel)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The official client refunds a channel Reeve charged three tasks on:
/// the payer gets back exactly the seven prices never charged, Reeve keeps
/// exactly the three (claimed in the same transaction and paid to
/// `payTo`), and the channel's refund count moves to 1 everywhere the
/// payer can read it. The same request again answers the same refund and
/// moves nothing; the channel is paid from again afterwards (a new
/// deposit), and the books balance.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_official_client_gets_back_exactly_what_was_not_charged_once(pool: PgPool) {
    gets_back_exactly_what_was_not_charged_once(pool, Client::TypeScript).await;
}

/// The same, asked by coinbase's x402 Python SDK (the tasks bought by the
/// TypeScript client: one payer, two SDKs on one channel).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_python_sdk_gets_back_exactly_what_was_not_charged_once(pool: PgPool) {
    gets_back_exactly_what_was_not_charged_once(pool, Client::Python).await;
}

async fn gets_back_exactly_what_was_not_charged_once(pool: PgPool, client: Client) {
    let _chain = ChainLock::shared().await;
    let shop = refunding(&pool, &chain::fresh_address(), &facilitator_url()).await;
    let payer = Payer::new(&_chain, FUNDS).await;
    let channel = Channel::of(&payer, &shop.pay_to);
    let paid = shop.official_client_creates(&payer, 3, "a").await;
    assert!(paid.iter().all(|c| c["status"] == 202), "{paid:?}");
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE, "one deposit of ten prices");

    // A new process, with no state of its channel: it reads the chain
    // (nothing claimed yet), is told by Reeve's 402 what was charged, and
    // asks again.
    let asked = client_refunds(client, &shop, &payer, None).await;
    let settled = &asked["settled"];
    assert_eq!(settled["success"], true, "{asked}");
    assert_eq!(asked["statuses"], json!([402, 402, 200]), "probe, resynchronised, refunded: {asked}");
    let transaction = settled["transaction"].as_str().unwrap().to_owned();
    assert!(transaction.starts_with("0x"), "{asked}");
    let state = &settled["extra"]["channelState"];
    assert_eq!(state["refundNonce"], "1", "{asked}");
    assert_eq!(state["chargedCumulativeAmount"], (3 * PRICE).to_string());
    assert_eq!((state["balance"].clone(), state["totalClaimed"].clone()), (json!("3000"), json!("3000")));

    assert_eq!(chain::balance(&payer.address).await, FUNDS - 3 * PRICE, "the payer has all but three prices");
    assert_eq!(chain::balance(&shop.pay_to).await, 3 * PRICE, "the seller has the three prices");
    let on_chain = escrow(&channel.id()).await;
    assert_eq!(
        on_chain,
        OnChain { balance: 3 * PRICE, total_claimed: 3 * PRICE, withdraw_requested_at: 0, refund_nonce: 1 }
    );
    assert_eq!(kept(&pool, &channel.id()).await, (1, (3 * PRICE).to_string()));

    // What an operator sees.
    let all = batch::claim::channels(&pool, std::time::Duration::ZERO, true, 10).await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!((all[0].refunds, all[0].refunded.as_str(), all[0].unclaimed.as_str()), (1, "7000", "0"));

    // The same request again: the same refund, nothing moved.
    let again = ask(&shop, Some(asked["header"].as_str().unwrap())).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["refundedAmount"], "7000");
    assert_eq!(decoded(&again, "payment-response")["transaction"], transaction.as_str());
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 3 * PRICE);
    assert_eq!(escrow(&channel.id()).await.refund_nonce, 1, "never refunded twice");
    // The official client asking again is told nothing is left.
    let empty = client_refunds(client, &shop, &payer, None).await;
    assert!(empty["error"].as_str().is_some_and(|e| e.contains("no remaining balance")), "{empty}");

    // The channel works on: the next task deposits again, and Reeve's
    // channel state names the escrow's refund count.
    let more = shop.official_client_creates(&payer, 2, "b").await;
    assert!(more.iter().all(|c| c["status"] == 202), "{more:?}");
    assert_eq!(more[0]["type"], "deposit", "{more:?}");
    assert_eq!(assert_channel_books(&pool, &channel.id()).await, 5 * PRICE);
    let offer = shop.offer("job").await;
    let next = shop.create("job", &json!({"n": "c"}), Some(&channel.pay(&offer, 6 * PRICE))).await;
    assert_eq!(next.status, StatusCode::ACCEPTED, "{}", next.body);
    let response = decoded(&next, "payment-response");
    assert_eq!(response["extra"]["channelState"]["refundNonce"], "1", "{response}");
    assert_eq!(response["extra"]["channelState"]["chargedCumulativeAmount"], (6 * PRICE).to_string());
    shop.queue.delete().await;
}

/// Refunds asked wrongly, each refunding nothing: signed by a key that is
/// not the payer's, for a voucher on another channel than its
/// configuration, for a channel Reeve never took a voucher on, for less
/// than was charged (resynchronising), a voucher sent here, no refund key,
/// and the facilitator out of reach (then the same request goes through).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn refunds_asked_wrongly_refund_nothing_and_an_unreachable_facilitator_can_be_retried(pool: PgPool) {
    let _chain = ChainLock::shared().await;
    let pay_to = chain::fresh_address();
    let shop = refunding(&pool, &pay_to, &facilitator_url()).await;
    let payer = Payer::new(&_chain, FUNDS).await;
    let channel = Channel::of(&payer, &pay_to);
    let paid = shop.official_client_creates(&payer, 2, "a").await;
    assert!(paid.iter().all(|c| c["status"] == 202), "{paid:?}");
    let offer = shop.offer("job").await;
    let id = channel.config.id(CHAIN);
    let charged = 2 * PRICE;

    // Without a payment: the kind's batch offer, the channel's terms.
    let probe = ask(&shop, None).await;
    assert_eq!(probe.status, StatusCode::PAYMENT_REQUIRED, "{}", probe.body);
    let offers = probe.body["accepts"].as_array().unwrap();
    assert!(offers.iter().all(|o| o["scheme"] == "batch-settlement") && !offers.is_empty(), "{}", probe.body);

    let stranger = SigningKey::from_slice(&[0x77; 32]).unwrap();
    let unknown = ChannelConfig { salt: B256::repeat_byte(9), ..channel.config.clone() };
    let other: Address = chain::fresh_address().parse().unwrap();
    let elsewhere = ChannelConfig { receiver: other, ..channel.config.clone() };
    let cases: Vec<(&str, String, StatusCode, &str)> = vec![
        (
            "signed by another key",
            refund(&offer, &channel.config, id, charged, &stranger),
            StatusCode::PAYMENT_REQUIRED,
            "invalid_batch_settlement_evm_voucher_signature",
        ),
        (
            "a voucher of another channel than its configuration",
            refund(&offer, &channel.config, unknown.id(CHAIN), charged, &channel.key),
            StatusCode::PAYMENT_REQUIRED,
            "invalid_batch_settlement_evm_channel_id_mismatch",
        ),
        (
            "a channel paying someone else",
            refund(&offer, &elsewhere, elsewhere.id(CHAIN), charged, &channel.key),
            StatusCode::PAYMENT_REQUIRED,
            "invalid_batch_settlement_evm_receiver_mismatch",
        ),
        (
            "a channel Reeve never took a voucher on",
            refund(&offer, &unknown, unknown.id(CHAIN), 0, &channel.key),
            StatusCode::PAYMENT_REQUIRED,
            "invalid_batch_settlement_evm_missing_channel",
        ),
        (
            "less than was charged",
            refund(&offer, &channel.config, id, PRICE, &channel.key),
            StatusCode::PAYMENT_REQUIRED,
            "invalid_batch_settlement_evm_cumulative_amount_mismatch",
        ),
        ("a voucher, not a refund", channel.pay(&offer, charged), StatusCode::BAD_REQUEST, "invalid_payment"),
        ("not base64", "%%%".into(), StatusCode::BAD_REQUEST, "invalid_payment"),
    ];
    for (case, payment, status, code) in &cases {
        let reply = ask(&shop, Some(payment)).await;
        assert_eq!(reply.status, *status, "{case}: {}", reply.body);
        assert_eq!(reply.code(), *code, "{case}: {}", reply.body);
        if *status == StatusCode::PAYMENT_REQUIRED {
            refused(&reply, code);
        }
        let text = reply.body.to_string();
        assert!(!text.contains("sqlx") && !text.contains("127.0.0.1"), "{case}: no internals: {text}");
    }
    // The resynchronising answer tells the channel as Reeve keeps it.
    let behind = ask(&shop, Some(&refund(&offer, &channel.config, id, PRICE, &channel.key))).await;
    let challenge = refused(&behind, "invalid_batch_settlement_evm_cumulative_amount_mismatch");
    let state = &challenge["accepts"][0]["extra"]["channelState"];
    assert_eq!((state["chargedCumulativeAmount"].clone(), state["refundNonce"].clone()), (json!("2000"), json!("0")));

    // A deployment without the refund key offers none.
    let keyless = Shop::serving(&pool, &pay_to, &facilitator_url(), &chain::rpc_url(), &[]).await;
    let reply = ask(&keyless, Some(&refund(&offer, &channel.config, id, charged, &channel.key))).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::SERVICE_UNAVAILABLE, "batch_refund_unavailable"));

    // The facilitator out of reach: a clear 503, nothing moved, and the
    // same request sent again later goes through.
    let cut = refunding(&pool, &pay_to, "http://127.0.0.1:1").await;
    let payment = refund(&offer, &channel.config, id, charged, &channel.key);
    let reply = ask(&cut, Some(&payment)).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::SERVICE_UNAVAILABLE, "facilitator_unavailable"));
    assert!(reply.headers.contains_key("retry-after"));
    assert!(!reply.body.to_string().contains("127.0.0.1"), "{}", reply.body);

    // Nothing moved by any of them.
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE);
    assert_eq!(chain::balance(&pay_to).await, 0);
    assert_eq!(
        escrow(&channel.id()).await,
        OnChain { balance: 10 * PRICE, total_claimed: 0, withdraw_requested_at: 0, refund_nonce: 0 }
    );
    assert_eq!(kept(&pool, &channel.id()).await.0, 0);

    let reply = ask(&shop, Some(&payment)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["refundedAmount"], (8 * PRICE).to_string());
    assert_eq!(chain::balance(&payer.address).await, FUNDS - charged);
    assert_eq!(chain::balance(&pay_to).await, charged);
    super::batch_faults::assert_batch_books(&pool, &pay_to).await;
    for shop in [shop, keyless, cut] {
        shop.queue.delete().await;
    }
}

/// A partial refund (the official client's `amount`) returns that much and
/// claims what was charged; the same request again returns nothing more;
/// the rest comes back with a refund of all, the refund count at 2.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_partial_refund_returns_its_amount_once_and_the_rest_comes_back_after(pool: PgPool) {
    let _chain = ChainLock::shared().await;
    let shop = refunding(&pool, &chain::fresh_address(), &facilitator_url()).await;
    let payer = Payer::new(&_chain, FUNDS).await;
    let channel = Channel::of(&payer, &shop.pay_to);
    let paid = shop.official_client_creates(&payer, 1, "a").await;
    assert!(paid.iter().all(|c| c["status"] == 202), "{paid:?}");

    let part = official_client_refunds(&shop, &payer, Some(2 * PRICE)).await;
    assert_eq!(part["settled"]["success"], true, "{part}");
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE + 2 * PRICE);
    assert_eq!(chain::balance(&shop.pay_to).await, PRICE, "what was charged is claimed with it");
    let again = ask(&shop, Some(part["header"].as_str().unwrap())).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(decoded(&again, "payment-response")["transaction"], part["settled"]["transaction"]);
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 8 * PRICE, "the same request refunds once");

    let rest = official_client_refunds(&shop, &payer, None).await;
    assert_eq!(rest["settled"]["success"], true, "{rest}");
    assert_eq!(rest["settled"]["extra"]["channelState"]["refundNonce"], "2", "{rest}");
    assert_eq!(chain::balance(&payer.address).await, FUNDS - PRICE, "all but the one price charged");
    assert_eq!(chain::balance(&shop.pay_to).await, PRICE);
    assert_eq!(
        escrow(&channel.id()).await,
        OnChain { balance: PRICE, total_claimed: PRICE, withdraw_requested_at: 0, refund_nonce: 2 }
    );
    let refunded: Vec<(i64, String)> =
        sqlx::query_as("SELECT refund_nonce, amount::TEXT FROM batch_refunds WHERE channel_id = $1 ORDER BY 1")
            .bind(channel.id())
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(refunded, [(0, (2 * PRICE).to_string()), (1, (7 * PRICE).to_string())]);
    super::batch_faults::assert_batch_books(&pool, &shop.pay_to).await;
    shop.queue.delete().await;
}
