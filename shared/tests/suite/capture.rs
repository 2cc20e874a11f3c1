//! A metered capture is decided by its own authorization, from the payer's
//! side, on the real local chain and facilitator: a settle is believed only
//! when the chain shows this authorization's nonce and witness settled
//! through x402's upto proxy, and "nothing charged" only when Permit2's
//! nonce, read past the signed deadline, says so. A slow settle whose answer
//! was lost, a second settle that reverts, a facilitator that names another
//! task's transaction, and a payer who pulls its money during the run each
//! end with the books balanced and no capture looping.
//!
//! The harness is [`super::metered`]'s `Shop`; a [`ScriptedFacilitator`]
//! in front of a real facilitator plays the slow, lost or lying one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::Notify;

use super::metered::{
    FUNDS, RATE, SHORT_QUEUE, Shop, assert_books_balance, decode, events, file_of, id_of, output_of, stored,
};
use crate::common::chain::{
    ChainLock, OWN_FACILITATOR_ACCOUNT, OwnFacilitator, Payer, ScriptedFacilitator, Settle, UPTO_PROXY, balance,
    chain_time, charges_to, fresh_address, rpc, wait_pending_from,
};
use crate::common::{get_authed, post_json, send};
use reeve_shared::ids::Id;
use reeve_shared::payments::RESOLVE_MARGIN;
use reeve_shared::worker::{Outcome, WorkerContext, process};

fn shared_facilitator() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

/// The `kind` message of task `id`, delivered for the `receive_count`th time.
async fn deliver(worker: &WorkerContext, id: Id, kind: &str, receive_count: u32) -> Outcome {
    process(worker, &json!({"task_id": id, "kind": kind}).to_string(), receive_count).await
}

/// The signed Permit2 deadline of a payment header.
fn deadline_of(signature: &str) -> u64 {
    let document = decode(signature);
    document["payload"]["permit2Authorization"]["deadline"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("a deadline in {document}"))
}

/// Waits until the chain is past `deadline` by the margin after which the
/// nonce decides an open capture.
async fn wait_past(deadline: u64) {
    while chain_time().await <= deadline + RESOLVE_MARGIN.as_secs() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A mined transaction's receipt status (`0x1` succeeded, `0x0` reverted).
async fn receipt_status(transaction: &str) -> Value {
    rpc("eth_getTransactionReceipt", json!([transaction])).await["status"].clone()
}

/// The first settle is slow and its answer lost; a second settle of the
/// same authorization is sent while the first is still pending, and
/// reverts once both are mined (Permit2 lets a nonce be used once). The
/// facilitator names the reverted one. Charged once, delivered once: the
/// revert is not taken for "nothing charged", and the chain shows the first.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_slow_first_settle_that_pays_and_a_second_that_reverts_charge_once_and_deliver_once(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    // The facilitator answers `settlement_pending` 2 s after broadcasting.
    let own = OwnFacilitator::start(Duration::from_secs(2)).await;
    let scripted = ScriptedFacilitator::start(&own.url).await;
    let shop = Shop::settling_through(&pool, 600, &scripted.url).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = file_of(5 * 1024).await;
    let signature = payer.sign(&shop.challenge("metered").await).await;
    let reply = shop.create("metered", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    let used = 5 * RATE;
    let worker = shop.worker().await;

    chain.pause().await;
    scripted.then([Settle::ForwardLost]);
    assert!(matches!(deliver(&worker, id, "metered", 1).await, Outcome::Retry(_)), "the settle's answer was lost");
    assert_eq!(shop.task(id).await["payment"]["status"], "capturing");
    let first = wait_pending_from(OWN_FACILITATOR_ACCOUNT).await;

    // A second settle of the same authorization, from the facilitator's own
    // account, queued behind the first: it reverts once both are mined.
    let sent = rpc("eth_getTransactionByHash", json!([first])).await;
    let second = rpc(
        "eth_sendTransaction",
        json!([{"from": OWN_FACILITATOR_ACCOUNT, "to": UPTO_PROXY, "data": sent["input"], "gas": "0x100000"}]),
    )
    .await;
    let second = second.as_str().unwrap().to_owned();
    scripted.then([Settle::Answer(json!({
        "success": false, "errorReason": "transaction_failed", "transaction": second,
        "network": "eip155:84532", "payer": payer.address,
    }))]);
    // Mined only once the resumed capture has been handed the second.
    let settles = scripted.settles.clone();
    let miner = tokio::spawn(async move {
        while settles.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        rpc("evm_mine", json!([])).await;
    });
    assert_eq!(deliver(&worker, id, "metered", 2).await, Outcome::Done);
    miner.await.unwrap();
    chain.resume().await;
    assert_eq!(receipt_status(&first).await, "0x1", "the first settle paid");
    assert_eq!(receipt_status(&second).await, "0x0", "the second reverted");

    let task = shop.task(id).await;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["result"]["size"], 5 * 1024, "the held result is delivered: {task}");
    assert_eq!(task["payment"]["status"], "charged", "{task}");
    assert_eq!(task["payment"]["transaction"], first.to_ascii_lowercase(), "the transaction that paid: {task}");
    assert_eq!(task["payment"]["charged"], used.to_string());
    assert_eq!(balance(&payer.address).await, FUNDS - used, "charged once");
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1);
    assert_eq!(deliver(&worker, id, "metered", 3).await, Outcome::Done, "nothing more to do");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// A facilitator that answers every settle with another task's (real,
/// successful) transaction of the same payer, `payTo` and amount: that
/// transaction is never this capture's. The capture stays open, and once
/// the chain is past its deadline the nonce decides, once: unused, so
/// nothing was charged. The task ends; no capture loops.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_facilitator_naming_another_tasks_transaction_is_not_believed_and_the_nonce_decides_once(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let scripted = ScriptedFacilitator::start(&shared_facilitator()).await;
    let shop = Shop::settling_through(&pool, SHORT_QUEUE, &scripted.url).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let site = file_of(2048).await;
    let input = json!({"url": format!("http://{site}/file")});
    let worker = shop.worker().await;
    let used = 2 * RATE;

    // Task A is charged for real.
    let first = shop.create("short", &input, Some(&payer.sign(&shop.challenge("short").await).await)).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let a = id_of(&first);
    assert_eq!(deliver(&worker, a, "short", 1).await, Outcome::Done);
    let paid = shop.task(a).await;
    assert_eq!(paid["payment"]["status"], "charged", "{paid}");
    let other = paid["payment"]["transaction"].as_str().unwrap().to_owned();

    // Task B's settles all name A's transaction.
    let signature = payer.sign(&shop.challenge("short").await).await;
    let deadline = deadline_of(&signature);
    let second = shop.create("short", &input, Some(&signature)).await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{}", second.body);
    let b = id_of(&second);
    let lie = json!({"success": true, "transaction": other, "network": "eip155:84532", "payer": payer.address});
    scripted.then(std::iter::repeat_n(Settle::Answer(lie), 20));
    let before = scripted.settles.load(std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(deliver(&worker, b, "short", 1).await, Outcome::Retry(_)), "not believed: still open");
    let task = shop.task(b).await;
    assert_eq!((&task["status"], &task["payment"]["status"]), (&json!("queued"), &json!("capturing")), "{task}");
    assert!(task["result"].is_null(), "{task}");

    wait_past(deadline).await;
    assert_eq!(deliver(&worker, b, "short", 2).await, Outcome::Failed("payment_not_captured"));
    let settled = scripted.settles.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(settled, before + 1, "past the deadline the nonce decides: no settle is sent again");
    assert_eq!(deliver(&worker, b, "short", 3).await, Outcome::Done, "decided for good: no loop");
    let task = shop.task(b).await;
    assert_eq!(task["status"], "failed", "{task}");
    assert_eq!(task["payment"]["status"], "not_captured", "{task}");
    assert_eq!(task["payment"]["reason"], "authorization_expired", "{task}");
    assert!(task["result"].is_null(), "{task}");
    assert_eq!(shop.attempt(b).await, ("failed".into(), Some("authorization_expired".into())));
    assert_eq!(balance(&payer.address).await, FUNDS - used, "only task A was charged");
    assert_eq!(charges_to(&shop.pay_to).await.len(), 1);
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// Serves `bytes` bytes at `/file`, only once `release` is notified;
/// `asked` is notified when the request arrives: the test acts while a
/// task's run is under way.
async fn gated_file_of(bytes: usize) -> (SocketAddr, Arc<Notify>, Arc<Notify>) {
    let (asked, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (on_ask, gate) = (asked.clone(), release.clone());
    let router = Router::new().route(
        "/file",
        axum::routing::get(move || {
            let (on_ask, gate) = (on_ask.clone(), gate.clone());
            async move {
                on_ask.notify_one();
                gate.notified().await;
                vec![b'r'; bytes]
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, asked, release)
}

/// What a payer holding its own keys can do to the money while its task
/// runs.
#[derive(Debug, Clone, Copy)]
enum Pull {
    /// `approve(Permit2, 0)`.
    RevokeApproval,
    /// Transfers all its tokens to another address of its own.
    MoveFunds,
    /// `invalidateUnorderedNonces` over the authorization's nonce.
    InvalidateNonce,
}

async fn pull(chain: &ChainLock, payer: &Payer, how: Pull, signature: &str) {
    match how {
        Pull::RevokeApproval => payer.approve_permit2(chain, 0).await,
        Pull::MoveFunds => payer.transfer(chain, &fresh_address(), FUNDS).await,
        Pull::InvalidateNonce => {
            let nonce = decode(signature)["payload"]["permit2Authorization"]["nonce"].as_str().unwrap().to_owned();
            payer.invalidate_permit2_nonce(chain, &nonce).await;
        }
    }
}

/// The payer pulls its money while its task runs: revokes Permit2's
/// approval, moves its funds away, or spends the authorization's nonce. The
/// capture is refused, stays open (a refusal proves nothing), and once the
/// chain is past the deadline the nonce decides: nothing charged, the
/// output deleted, the task `payment_not_captured` with the reason the
/// chain shows.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payer_who_pulls_its_money_during_the_run_is_charged_nothing_and_gets_nothing(pool: PgPool) {
    let chain = ChainLock::shared().await;
    let shop = Shop::settling_through(&pool, SHORT_QUEUE, &shared_facilitator()).await;
    let worker = Arc::new(shop.worker().await);
    let cases = [
        (Pull::RevokeApproval, "authorization_expired", FUNDS),
        (Pull::MoveFunds, "authorization_expired", 0),
        (Pull::InvalidateNonce, "authorization_spent", FUNDS),
    ];
    let mut runs = Vec::new();
    let mut last_deadline = 0;
    for (how, reason, left) in cases {
        let payer = Payer::new(&chain, FUNDS).await;
        payer.approve_permit2(&chain, u128::MAX).await;
        let (site, asked, release) = gated_file_of(2048).await;
        let signature = payer.sign(&shop.challenge("short").await).await;
        last_deadline = last_deadline.max(deadline_of(&signature));
        let reply = shop.create("short", &json!({"url": format!("http://{site}/file")}), Some(&signature)).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{how:?}: {}", reply.body);
        let id = id_of(&reply);
        let running = {
            let worker = worker.clone();
            tokio::spawn(async move { deliver(&worker, id, "short", 1).await })
        };
        asked.notified().await;
        pull(&chain, &payer, how, &signature).await;
        release.notify_one();
        let outcome = running.await.unwrap();
        assert!(matches!(outcome, Outcome::Retry(_)), "{how:?}: the refused capture stays open: {outcome:?}");
        let task = shop.task(id).await;
        assert_eq!(task["payment"]["status"], "capturing", "{how:?}: {task}");
        let key = output_of(&pool, id).await;
        assert!(stored(&worker, &key).await, "{how:?}: the run stored its output, held: {key}");
        runs.push((how, reason, left, payer, id));
    }

    wait_past(last_deadline).await;
    for (how, reason, left, payer, id) in runs {
        assert_eq!(deliver(&worker, id, "short", 2).await, Outcome::Failed("payment_not_captured"), "{how:?}");
        let task = shop.task(id).await;
        assert_eq!(task["status"], "failed", "{how:?}: {task}");
        assert_eq!(task["error"]["code"], "payment_not_captured", "{how:?}: {task}");
        assert!(task["error"]["message"].as_str().unwrap().contains("output was deleted"), "{how:?}: {task}");
        assert_eq!((&task["payment"]["status"], &task["payment"]["reason"]), (&json!("not_captured"), &json!(reason)));
        assert!(task["result"].is_null(), "{how:?}: nothing delivered: {task}");
        let key = output_of(&pool, id).await;
        assert!(!stored(&worker, &key).await, "{how:?}: the output of an unpaid task is deleted: {key}");
        assert_eq!(balance(&payer.address).await, left, "{how:?}: nothing was taken");
    }
    assert!(charges_to(&shop.pay_to).await.is_empty(), "nothing reached payTo");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}

/// Uploads `bytes` as a text file through the API; answers its upload id.
async fn upload(shop: &Shop, bytes: &[u8]) -> String {
    let body = json!({"filename": "words.txt", "content_type": "text/plain", "size": bytes.len()});
    let reply = send(&shop.app, post_json("/v1/uploads", Some(&shop.token), &body)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let mut put = reqwest::Client::new().put(reply.body["url"].as_str().unwrap()).body(bytes.to_vec());
    for (name, value) in reply.body["headers"].as_object().unwrap() {
        if name != "content-length" {
            put = put.header(name, value.as_str().unwrap());
        }
    }
    assert!(put.send().await.unwrap().status().is_success());
    reply.body["upload_id"].as_str().unwrap().to_owned()
}

/// Everything a buyer can read of task `id`: its event log (what every
/// stream replays), its view and the task list.
async fn everything_readable(shop: &Shop, id: Id) -> String {
    let events = events(&shop.pool, id).await;
    let view = shop.task(id).await;
    let list = send(&shop.app, get_authed("/v1/tasks", &shop.token)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    format!("{}\n{view}\n{}", serde_json::to_string(&events).unwrap(), list.body)
}

/// A metered `digest`'s answer is its SHA-256, which it also logs while it
/// runs. Until the capture is proven, the hash is nowhere a buyer can read
/// (its progress shows how far it got, its log lines are held); once
/// charged, the held log line and
/// the result are published in their order, and the event sequence has no
/// gap.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_metered_digest_shows_its_hash_nowhere_before_the_capture_is_proven(pool: PgPool) {
    use sha2::Digest as _;
    let chain = ChainLock::shared().await;
    let scripted = ScriptedFacilitator::start(&shared_facilitator()).await;
    let shop = Shop::settling_through(&pool, 600, &scripted.url).await;
    let payer = Payer::new(&chain, FUNDS).await;
    payer.approve_permit2(&chain, u128::MAX).await;
    let bytes = b"the quick brown fox\n".repeat(300);
    let sha = hex::encode(sha2::Sha256::digest(&bytes));
    let upload_id = upload(&shop, &bytes).await;
    let input = json!({"upload_id": upload_id});
    let challenge = shop.create("hashed", &input, None).await;
    assert_eq!(challenge.status, StatusCode::PAYMENT_REQUIRED, "{}", challenge.body);
    let signature = payer.sign(challenge.headers["payment-required"].to_str().unwrap()).await;
    let reply = shop.create("hashed", &input, Some(&signature)).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = id_of(&reply);
    let worker = shop.worker().await;

    // The run ends; its capture's answer is lost, so it is not proven yet.
    scripted.then([Settle::Answer(json!({"success": false, "errorReason": "unexpected_settle_error",
                                          "network": "eip155:84532", "payer": payer.address}))]);
    assert!(matches!(deliver(&worker, id, "hashed", 1).await, Outcome::Retry(_)));
    let seen = everything_readable(&shop, id).await;
    assert!(!seen.contains(&sha), "the hash before the capture: {seen}");
    let progress: Vec<Value> =
        events(&pool, id).await.into_iter().filter(|e| e.kind.as_str() == "progress").map(|e| e.data).collect();
    assert!(!progress.is_empty(), "how far it got is shown");
    for shown in &progress {
        let keys: Vec<&String> = shown.as_object().unwrap().keys().collect();
        assert!(keys.iter().all(|k| ["fraction", "bytes"].contains(&k.as_str())), "no stage detail: {shown}");
    }
    let executors_lines: Vec<Value> = events(&pool, id)
        .await
        .into_iter()
        .filter(|e| e.data["line"].as_str().is_some_and(|l| l.contains(&upload_id)))
        .map(|e| e.data)
        .collect();
    assert!(executors_lines.is_empty(), "the executor's log lines are held: {executors_lines:?}");

    assert_eq!(deliver(&worker, id, "hashed", 2).await, Outcome::Done);
    let task = shop.task(id).await;
    assert_eq!(task["payment"]["status"], "charged", "{task}");
    assert_eq!(task["result"]["sha256"], sha.as_str(), "{task}");
    let events = events(&pool, id).await;
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "no gap for Last-Event-ID");
    let logged = events.iter().position(|e| e.data["line"].as_str().is_some_and(|l| l.contains(&sha)));
    let result = events.iter().position(|e| e.kind.as_str() == "result");
    assert!(matches!((logged, result), (Some(l), Some(r)) if l < r), "the held line, then the result: {events:?}");
    assert_books_balance(&pool, &shop.pay_to).await;
    shop.done().await;
}
