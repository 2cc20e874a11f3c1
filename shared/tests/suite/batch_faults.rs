//! Batch settlement's faults on the real local chain (issue 42): a deposit
//! that never mines, a claim whose answer is lost (dropped from the pool, or
//! landing after the sweep gave up on it), and a payer who withdraws before
//! a claim lands, so that the claim reverts. Each test holds the chain alone
//! (it stops mining) and sends through a facilitator of its own that gives
//! up on a receipt after three seconds, as a slow chain makes the official
//! one answer.
//!
//! What the seller can lose is bounded by the claim policy: a voucher is
//! claimed within a quarter of its channel's withdraw delay, and at once
//! when its payer asks to withdraw, so a payer takes back unclaimed money
//! only after claims failed for the rest of the delay; what a sweep then
//! finds missing is written off and alarmed, never claimed again.

use std::time::Duration;

use alloy_primitives::{U256, keccak256};
use alloy_sol_types::SolCall;
use axum::http::StatusCode;
use reeve_shared::payments::batch::{self, OnChain};
use reeve_shared::settings;
use reeve_shared::startup;
use reeve_shared::sweeper::Sweeper;
use serde_json::json;
use sqlx::PgPool;

use super::batch_create::{
    Channel, EscrowConfig, FUNDS, PRICE, Shop, WITHDRAW_DELAY, assert_channel_books, finalizeWithdrawCall,
    initiateWithdrawCall,
};
use crate::common::chain::{self, ChainLock, ExclusiveChain, OWN_FACILITATOR_ACCOUNT, OwnFacilitator, Payer};

/// How long the test's own facilitator waits for a receipt: long enough
/// for a block a second, short enough that a paused chain answers soon.
const CONFIRMATION: Duration = Duration::from_secs(3);

fn escrow() -> String {
    format!("{:#x}", batch::ESCROW)
}

/// The sweeper of `shop`'s deployment with the receiver authorizer's key,
/// claiming through `facilitator` under a claim policy of `after` seconds.
async fn sweeper(shop: &Shop, facilitator: &str, after: u64) -> Sweeper {
    let config = shop
        .config
        .clone()
        .with(settings::BATCH_AUTHORIZER_KEY, format!("0x{}", hex::encode([0x42u8; 32])))
        .with(settings::BATCH_CLAIM_AFTER, after.to_string())
        .with("REEVE_FACILITATOR_URL", facilitator);
    startup::sweeper(&config, &startup::sdk().await).await.unwrap_or_else(|e| panic!("{e}"))
}

/// What one sweep's claimer did: channels claimed, claims or payouts
/// failed, payouts made, channels found short, channels at risk.
async fn sweep(sweeper: &Sweeper) -> (usize, usize, usize, usize, usize) {
    let p = sweeper.sweep(Duration::from_secs(300)).await.unwrap().payments;
    (p.channels_claimed, p.claims_failed, p.paid_out, p.channels_short, p.channels_at_risk)
}

async fn on_chain(channel: &str) -> OnChain {
    let chains = reeve_shared::payments::Chains::parse(&chain::chain_rpc_urls()).unwrap();
    batch::read(chains.get("eip155:84532").unwrap(), channel.parse().unwrap()).await.unwrap()
}

/// The books of everything sold to `pay_to` by batch settlement, once the
/// claims are made: each channel's vouchers one task each and its charge
/// their last ceiling ([`assert_channel_books`], for a channel nothing was
/// written off of); the escrow shows claimed on each exactly what Reeve
/// charged it, less what Reeve wrote off; every token `pay_to` received is
/// claimed money paid out, their sum; the escrow owes it nothing more; and
/// every refund sent its payer exactly what Reeve recorded returning.
pub(super) async fn assert_batch_books(pool: &PgPool, pay_to: &str) {
    let channels: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT channel_id, charged::TEXT, written_off::TEXT FROM batch_channels \
          WHERE lower(config->>'receiver') = lower($1) ORDER BY channel_id",
    )
    .bind(pay_to)
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(!channels.is_empty(), "no channel pays {pay_to}");
    let mut claimed = 0;
    for (channel, charged, written_off) in &channels {
        let (charged, written_off) = (charged.parse::<u128>().unwrap(), written_off.parse::<u128>().unwrap());
        if written_off == 0 {
            assert_eq!(assert_channel_books(pool, channel).await, charged);
        }
        let on_chain = on_chain(channel).await;
        assert_eq!(
            on_chain.total_claimed + written_off,
            charged,
            "{channel}: claimed all it was charged but what was lost"
        );
        claimed += on_chain.total_claimed;
    }
    let received: u128 = chain::charges_to(pay_to).await.iter().map(|c| c.value).sum();
    assert_eq!(received, claimed, "{pay_to} received exactly what was claimed");
    let chains = reeve_shared::payments::Chains::parse(&chain::chain_rpc_urls()).unwrap();
    let (to, token) = (pay_to.parse().unwrap(), chain::TOKEN.parse().unwrap());
    let owed = batch::escrow::unpaid(chains.get("eip155:84532").unwrap(), to, token).await.unwrap();
    assert_eq!(owed, 0, "nothing claimed is left in the escrow");

    // Every cooperative refund sent its payer exactly what Reeve recorded
    // returning, in its own transaction, from the escrow.
    let refunds: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT r.transaction, r.amount::TEXT, c.payer FROM batch_refunds r JOIN batch_channels c USING (channel_id) \
          WHERE lower(c.config->>'receiver') = lower($1) AND r.transaction <> ''",
    )
    .bind(pay_to)
    .fetch_all(pool)
    .await
    .unwrap();
    let transfer = format!("{:#x}", alloy_primitives::keccak256("Transfer(address,address,uint256)"));
    let (from, token) = (format!("0x{}", chain::word(&escrow())), chain::TOKEN.to_ascii_lowercase());
    for (transaction, amount, payer) in refunds {
        let receipt = chain::rpc("eth_getTransactionReceipt", json!([transaction])).await;
        let to = format!("0x{}", chain::word(&payer));
        let back: u128 = receipt["logs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["address"].as_str().is_some_and(|a| a.eq_ignore_ascii_case(&token)))
            .filter(|l| {
                l["topics"][0] == transfer.as_str() && l["topics"][1] == from.as_str() && l["topics"][2] == to.as_str()
            })
            .map(|l| u128::from_str_radix(l["data"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap())
            .sum();
        assert_eq!(back.to_string(), amount, "refund {transaction}: the payer got back what Reeve recorded");
    }
}

/// A payer that opened a channel to `shop` with the official client (one
/// deposit of ten prices) and bought `tasks` tasks over it.
async fn buyer(chain: &ChainLock, shop: &Shop, tasks: usize) -> (Payer, Channel) {
    let payer = Payer::new(chain, FUNDS).await;
    let channel = Channel::of(&payer, &shop.pay_to);
    let paid = shop.official_client_creates(&payer, tasks, "a").await;
    assert!(paid.iter().all(|c| c["status"] == 202), "{paid:?}");
    (payer, channel)
}

/// `payer` asks the escrow for all ten prices of its channel back
/// (`initiateWithdraw`); answers the channel's configuration as the escrow
/// takes it.
async fn withdraws_everything(chain: &ChainLock, payer: &Payer, channel: &Channel) -> EscrowConfig {
    let config = EscrowConfig::of(&channel.config);
    let call = initiateWithdrawCall { config: config.clone(), amount: 10 * PRICE }.abi_encode();
    payer.send(chain, &escrow(), &format!("0x{}", hex::encode(call))).await;
    config
}

/// Sends `data` to the escrow from `from` (impersonated, given gas) with a
/// priority fee of `tip` wei, and answers its hash without waiting for it
/// to be mined.
async fn send_unmined(from: &str, data: Vec<u8>, tip: u128) -> String {
    chain::rpc("anvil_setBalance", json!([from, "0xde0b6b3a7640000"])).await;
    chain::rpc("anvil_impersonateAccount", json!([from])).await;
    let hash = chain::rpc(
        "eth_sendTransaction",
        json!([{
            "from": from, "to": escrow(), "data": format!("0x{}", hex::encode(data)),
            "maxPriorityFeePerGas": format!("{tip:#x}"), "maxFeePerGas": format!("{:#x}", tip * 2),
        }]),
    )
    .await;
    chain::rpc("anvil_stopImpersonatingAccount", json!([from])).await;
    hash.as_str().unwrap().to_owned()
}

/// Drops the facilitator's transaction `hash` from the pool for good: a
/// transaction of its account's takes its nonce and is mined (the paused
/// chain mines one block), so what the facilitator sends next is another
/// transaction. (Sent again as it was, anvil would keep the dropped one's
/// hash out of its blocks.)
async fn drop_for_good(chain: &ExclusiveChain, hash: &str) {
    chain::rpc("anvil_dropTransaction", json!([hash])).await;
    chain::rpc("anvil_impersonateAccount", json!([OWN_FACILITATOR_ACCOUNT])).await;
    let filler = chain::rpc(
        "eth_sendTransaction",
        json!([{"from": OWN_FACILITATOR_ACCOUNT, "to": OWN_FACILITATOR_ACCOUNT, "value": "0x0"}]),
    )
    .await;
    chain::rpc("anvil_stopImpersonatingAccount", json!([OWN_FACILITATOR_ACCOUNT])).await;
    chain.mine().await;
    assert_eq!(mined_status(filler.as_str().unwrap()).await, "0x1");
    assert!(chain::rpc("eth_getTransactionReceipt", json!([hash])).await.is_null(), "never mined");
}

/// The status of transaction `hash`'s receipt (`0x1` done, `0x0`
/// reverted), once it is mined.
async fn mined_status(hash: &str) -> String {
    for _ in 0..100 {
        let receipt = chain::rpc("eth_getTransactionReceipt", json!([hash])).await;
        if !receipt.is_null() {
            return receipt["status"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{hash} was not mined in 10 s");
}

/// Moves the escrow's record of `channel`'s pending withdrawal of `amount`
/// back by the withdraw delay, as waiting that long would: the chain's
/// clock is every test's, and its signatures' validity windows with it.
/// The record is found by its value among the escrow's mappings.
async fn backdate_withdrawal(channel: &str, amount: u128) {
    let id = hex::decode(channel.trim_start_matches("0x")).unwrap();
    let now = chain::chain_time().await;
    for slot in 0u64..16 {
        let key = keccak256([id.as_slice(), &U256::from(slot).to_be_bytes::<32>()].concat());
        let word = chain::rpc("eth_getStorageAt", json!([escrow(), format!("{key:#x}"), "latest"])).await;
        let value = U256::from_str_radix(word.as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
        let asked: u64 = (value >> 128usize).saturating_to::<u64>();
        let low = (value & U256::from(u128::MAX)).to::<u128>();
        if low == amount && asked.abs_diff(now) < 600 {
            let moved: U256 = (U256::from(asked - WITHDRAW_DELAY - 2) << 128usize) | U256::from(amount);
            let word = format!("0x{}", hex::encode(moved.to_be_bytes::<32>()));
            chain::rpc("anvil_setStorageAt", json!([escrow(), format!("{key:#x}"), word])).await;
            return;
        }
    }
    panic!("no pending withdrawal of {amount} for {channel} in the escrow's storage");
}

/// A claim that the facilitator sent but did not see mined is due again:
/// dropped from the pool, the next sweep claims it anew; landing after the
/// sweep gave up on it, the next sweep finds it claimed, sends nothing
/// again, and pays the claimed money out to `payTo`. Either way `payTo`
/// gets exactly what the vouchers bought, once.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_claim_whose_answer_is_lost_is_claimed_and_paid_out_once_whether_it_landed_or_not(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    let shop = Shop::new(&pool).await;
    let (payer, channel) = buyer(&chain, &shop, 3).await;
    let own = OwnFacilitator::start(CONFIRMATION).await;
    let sweeper = sweeper(&shop, &own.url, 0).await;

    // Sent, never mined: the claim fails, and its transaction is lost.
    chain.pause().await;
    assert_eq!(sweep(&sweeper).await, (0, 1, 0, 0, 0));
    let hash = chain::wait_pending_from(OWN_FACILITATOR_ACCOUNT).await;
    drop_for_good(&chain, &hash).await;
    chain.resume().await;
    assert_eq!(on_chain(&channel.id()).await.total_claimed, 0);
    assert_eq!(chain::balance(&shop.pay_to).await, 0);
    // Claimed anew, and paid out.
    assert_eq!(sweep(&sweeper).await, (1, 0, 1, 0, 0));
    assert_eq!(on_chain(&channel.id()).await.total_claimed, 3 * PRICE);
    assert_eq!(chain::balance(&shop.pay_to).await, 3 * PRICE);

    // Two more tasks; their claim is sent and mined only after the sweep
    // gave up on it.
    let more = shop.official_client_creates(&payer, 2, "b").await;
    assert!(more.iter().all(|c| c["status"] == 202), "{more:?}");
    chain.pause().await;
    assert_eq!(sweep(&sweeper).await, (0, 1, 0, 0, 0));
    chain::wait_pending_from(OWN_FACILITATOR_ACCOUNT).await;
    chain.mine().await;
    chain.resume().await;
    assert_eq!(on_chain(&channel.id()).await.total_claimed, 5 * PRICE);
    assert_eq!(chain::balance(&shop.pay_to).await, 3 * PRICE, "claimed, still in the escrow");
    // Found claimed: nothing claimed again, the claimed money paid out.
    assert_eq!(sweep(&sweeper).await, (1, 0, 1, 0, 0));
    assert_eq!(chain::balance(&shop.pay_to).await, 5 * PRICE);
    assert_eq!(sweep(&sweeper).await, (0, 0, 0, 0, 0), "nothing left to do");
    assert_eq!(chain::balance(&shop.pay_to).await, 5 * PRICE, "paid once");
    assert_batch_books(&pool, &shop.pay_to).await;
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 10 * PRICE);
    drop(own);
    shop.queue.delete().await;
}

/// A payer asks to withdraw everything right after buying. Reeve learns of
/// it at its next read of the channel (here, the next voucher, refused),
/// and the next sweep claims at once, whatever the claim policy: when the
/// delay is over, the payer takes back only what was not charged.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_payer_who_asks_to_withdraw_is_claimed_at_once_and_takes_back_only_what_was_not_charged(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    let shop = Shop::new(&pool).await;
    let (payer, channel) = buyer(&chain, &shop, 3).await;
    let config = withdraws_everything(&chain, &payer, &channel).await;

    // The next voucher, on a read of the channel too old to decide on.
    sqlx::query("UPDATE batch_channels SET read_at = now() - interval '61 seconds'").execute(&pool).await.unwrap();
    let offer = shop.offer("job").await;
    let late = shop.create("job", &json!({"n": "late"}), Some(&channel.pay(&offer, 4 * PRICE))).await;
    super::batch_create::refused(&late, "batch_withdraw_requested");

    // An operator's policy of an hour does not wait: the payer is leaving.
    let sweeper = sweeper(&shop, &chain_facilitator(), 3600).await;
    assert_eq!(sweep(&sweeper).await, (1, 0, 1, 0, 0));
    assert_eq!(chain::balance(&shop.pay_to).await, 3 * PRICE);

    // The delay over, the payer takes back the rest, and no more.
    backdate_withdrawal(&channel.id(), 10 * PRICE).await;
    let call = finalizeWithdrawCall { config }.abi_encode();
    payer.send(&chain, &escrow(), &format!("0x{}", hex::encode(call))).await;
    assert_eq!(chain::balance(&payer.address).await, FUNDS - 3 * PRICE, "charged exactly three tasks");
    let left = on_chain(&channel.id()).await;
    assert_eq!((left.balance, left.total_claimed), (3 * PRICE, 3 * PRICE));
    assert_batch_books(&pool, &shop.pay_to).await;
    assert_eq!(sweep(&sweeper).await, (0, 0, 0, 0, 0));
    shop.queue.delete().await;
}

fn chain_facilitator() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

/// Claims that fail past half the withdraw delay of a leaving payer are
/// counted at risk at every sweep (the `batch-deadline` alarm). The payer
/// then withdraws in the block that mines Reeve's claim, ahead of it: the
/// claim reverts, the payer has its whole deposit back, and the next sweep
/// finds the channel short, writes off what the vouchers bought, alarms,
/// and never tries to claim it again.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_claim_that_reverts_behind_a_payers_withdrawal_is_written_off_once_and_alarmed(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    let shop = Shop::new(&pool).await;
    let (payer, channel) = buyer(&chain, &shop, 3).await;
    let config = withdraws_everything(&chain, &payer, &channel).await;
    backdate_withdrawal(&channel.id(), 10 * PRICE).await;
    let own = OwnFacilitator::start(CONFIRMATION).await;
    let sweeper = sweeper(&shop, &own.url, 0).await;

    // The claim is sent and not mined: failed, and the channel at risk.
    chain.pause().await;
    assert_eq!(sweep(&sweeper).await, (0, 1, 0, 0, 1));
    let claim = chain::wait_pending_from(OWN_FACILITATOR_ACCOUNT).await;
    // The payer's withdrawal, paying a higher fee, is mined first.
    let withdrawal = send_unmined(&payer.address, finalizeWithdrawCall { config }.abi_encode(), 100_000_000_000).await;
    chain.mine().await;
    chain.resume().await;
    assert_eq!(mined_status(&withdrawal).await, "0x1");
    assert_eq!(mined_status(&claim).await, "0x0", "the claim reverts: the balance is gone");
    assert_eq!(chain::balance(&payer.address).await, FUNDS, "the payer has its deposit back");

    // Found short: written off, nothing sent, never due again.
    assert_eq!(sweep(&sweeper).await, (0, 0, 0, 1, 0));
    assert_eq!(sweep(&sweeper).await, (0, 0, 0, 0, 0));
    let all = batch::claim::channels(&pool, Duration::ZERO, true, 10).await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(
        (all[0].charged.as_str(), all[0].written_off.as_str(), all[0].unclaimed.as_str()),
        ("3000", "3000", "0")
    );
    assert_eq!(batch::claim::channels(&pool, Duration::ZERO, false, 10).await.unwrap(), [], "nothing to claim");
    assert_eq!(chain::balance(&shop.pay_to).await, 0);
    assert_batch_books(&pool, &shop.pay_to).await;
    drop(own);
    shop.queue.delete().await;
}

/// A deposit the facilitator sent but did not see mined buys nothing yet
/// (`409 payment_pending`), and nothing while it stays unmined. Sent again
/// once it landed, it buys the task without a second deposit. One that
/// never mines: a facilitator that still waits on it answers pending again;
/// restarted (its record of the transaction gone), it sends the deposit
/// anew, and the task is bought. Either way one deposit, one task.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_deposit_that_never_mines_buys_nothing_and_sent_again_buys_one_task_on_one_deposit(pool: PgPool) {
    let chain = ChainLock::exclusive().await;
    let mut own = OwnFacilitator::start(CONFIRMATION).await;
    let port: u16 = own.url.rsplit(':').next().unwrap().parse().unwrap();
    let shop = Shop::serving(&pool, &chain::fresh_address(), &own.url, &chain::rpc_url(), &[]).await;
    let ask = shop.create("job", &json!({"n": "x"}), None).await;
    assert_eq!(ask.status, StatusCode::PAYMENT_REQUIRED, "{}", ask.body);
    let required = ask.headers["payment-required"].to_str().unwrap().to_owned();

    for lost in [true, false] {
        let payer = Payer::new(&chain, FUNDS).await;
        let deposit =
            super::batch::node("batch-pay.mjs", vec![required.clone()], vec![("REEVE_WALLET_KEY", payer.key.clone())])
                .await;
        let input = json!({"n": format!("lost {lost}")});
        chain.pause().await;
        let pending = shop.create("job", &input, Some(&deposit)).await;
        assert_eq!((pending.status, pending.code()), (StatusCode::CONFLICT, "payment_pending"), "{}", pending.body);
        assert!(pending.headers.contains_key("retry-after"));
        let sent = chain::wait_pending_from(OWN_FACILITATOR_ACCOUNT).await;
        if lost {
            drop_for_good(&chain, &sent).await;
            chain.resume().await;
            let still = shop.create("job", &input, Some(&deposit)).await;
            assert_eq!(still.code(), "payment_pending", "{}", still.body);
            assert_eq!(chain::balance(&payer.address).await, FUNDS, "nothing deposited");
            own.stop();
            own = OwnFacilitator::start_on(port, CONFIRMATION).await;
        } else {
            chain.mine().await;
            chain.resume().await;
        }
        let bought = shop.create("job", &input, Some(&deposit)).await;
        assert_eq!(bought.status, StatusCode::ACCEPTED, "lost: {lost}: {}", bought.body);
        let again = shop.create("job", &input, Some(&deposit)).await;
        assert_eq!((again.status, &again.body["id"]), (StatusCode::ACCEPTED, &bought.body["id"]), "the same task");
        let deposited = FUNDS - chain::balance(&payer.address).await;
        let channel = Channel::of(&payer, &shop.pay_to);
        assert_eq!(on_chain(&channel.id()).await.balance, deposited, "one deposit (lost: {lost})");
        assert_eq!(assert_channel_books(&pool, &channel.id()).await, PRICE);
    }
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(tasks, 2, "one task per payer");
    drop(own);
    shop.queue.delete().await;
}
