//! x402's `batch-settlement` scheme on the local chain: the escrow and its
//! ERC-3009 deposit collector scripts/payments.sh places (our Solidity,
//! written against what `@x402/evm` calls), and the local facilitator
//! settling the scheme, driven by the official packages on every side
//! (scripts/payments/batch-check.mjs, scripts/payments/batch-flow.mjs).

use serde_json::{Value, json};

use crate::common::chain::{self, ChainLock, Payer};

/// `@x402/evm`'s `BATCH_SETTLEMENT_ADDRESS`: the escrow.
const ESCROW: &str = "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003";

fn facilitator_url() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

/// Runs `node scripts/payments/<script> <args>` with `env`, off the runtime;
/// answers its stdout, or fails the test with its stderr.
pub(crate) async fn node(script: &str, args: Vec<String>, env: Vec<(&'static str, String)>) -> String {
    chain::Client::TypeScript.run(script, args, env).await
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
    let id = flow["channelId"].as_str().unwrap();
    assert_eq!(channel(id).await, (10 * PRICE, 10 * PRICE));
    // Reeve's own read of the escrow (what it checks vouchers against)
    // says the same.
    let chains = reeve_shared::payments::Chains::parse(&chain::chain_rpc_urls()).unwrap();
    let read = reeve_shared::payments::batch::read(chains.get("eip155:84532").unwrap(), id.parse().unwrap()).await;
    let expected = reeve_shared::payments::batch::OnChain {
        balance: 10 * PRICE,
        total_claimed: 10 * PRICE,
        withdraw_requested_at: 0,
        // One cooperative refund, the buyer's.
        refund_nonce: 1,
    };
    assert_eq!(read.unwrap(), expected);
    assert_eq!(receiver(&seller).await, (10 * PRICE, 10 * PRICE));
    // The buyer never held gas: the facilitator paid for every deposit.
    assert_eq!(chain::eth_balance(&payer.address).await, 0);
}

// ------------------------------------------------------------ the seller
//
// Reeve's own check of a voucher (`payments::batch`): each decision against
// a channel kept in Postgres, with vouchers signed as the official client
// signs them (EIP-712 under the escrow's domain).

mod seller {
    use std::time::Duration;

    use alloy_primitives::aliases::U40;
    use alloy_primitives::{Address, B256, address};
    use alloy_signer::k256::ecdsa::SigningKey;
    use alloy_sol_types::SolStruct;
    use reeve_shared::ids::Id;
    use reeve_shared::payments::batch::{
        self, ChannelConfig, Decision, OnChain, Purchase, Refusal, SignatureError, Terms, VoucherIn,
    };
    use sqlx::PgPool;

    const CHAIN: u64 = 84532;
    const PRICE: u128 = 1_000;
    const FRESH: Duration = Duration::from_secs(30);
    const RECEIVER: Address = address!("0x3333333333333333333333333333333333333333");
    const AUTHORIZER: Address = address!("0x4444444444444444444444444444444444444444");
    const TOKEN: Address = address!("0x036CbD53842c5426634e7929541eC2318f3dCF7e");

    fn terms() -> Terms<'static> {
        Terms {
            network: "eip155:84532",
            chain_id: CHAIN,
            receiver: RECEIVER,
            receiver_authorizer: AUTHORIZER,
            token: TOKEN,
            withdraw_delay: 900,
        }
    }

    /// A buyer: its key, and the channel it pays Reeve through.
    struct Buyer {
        key: SigningKey,
        config: ChannelConfig,
    }

    impl Buyer {
        fn new() -> Buyer {
            let key = SigningKey::random(&mut rand_core());
            let address = alloy_signer::utils::public_key_to_address(key.verifying_key());
            let config = ChannelConfig {
                payer: address,
                payerAuthorizer: address,
                receiver: RECEIVER,
                receiverAuthorizer: AUTHORIZER,
                token: TOKEN,
                withdrawDelay: U40::from(900),
                salt: B256::ZERO,
            };
            Buyer { key, config }
        }

        /// Its signature of a voucher for `ceiling` on `config`'s channel.
        fn sign(&self, config: &ChannelConfig, ceiling: u128) -> Vec<u8> {
            let voucher = batch::voucher::Voucher { channelId: config.id(CHAIN), maxClaimableAmount: ceiling };
            let digest = voucher.eip712_signing_hash(&batch::voucher::domain(CHAIN));
            let (signature, recovery) = self.key.sign_prehash_recoverable(digest.as_slice()).unwrap();
            let mut bytes = signature.to_bytes().to_vec();
            bytes.push(27 + recovery.to_byte());
            bytes
        }
    }

    fn rand_core() -> impl alloy_signer::k256::elliptic_curve::rand_core::CryptoRngCore {
        alloy_signer::k256::elliptic_curve::rand_core::OsRng
    }

    const DEPOSITED: OnChain =
        OnChain { balance: 4 * PRICE, total_claimed: 0, withdraw_requested_at: 0, refund_nonce: 0 };

    /// `decide` for `buyer`'s voucher of `ceiling` (signed by `buyer`) on
    /// `config`, with `read` as the escrow's answer.
    async fn decide(
        pool: &PgPool,
        buyer: &Buyer,
        config: &ChannelConfig,
        ceiling: u128,
        read: Option<OnChain>,
    ) -> Result<Decision, Refusal> {
        let signature = buyer.sign(config, ceiling);
        let voucher = VoucherIn { config, channel_id: config.id(CHAIN), ceiling, signature: &signature };
        let mut conn = pool.acquire().await.unwrap();
        match batch::decide(&mut conn, &terms(), &voucher, PRICE, read, FRESH).await {
            Ok(decision) => Ok(decision),
            Err(batch::DecideError::Refused(refusal)) => Err(refusal),
            Err(batch::DecideError::Db(e)) => panic!("{e}"),
        }
    }

    /// A task to buy, in a space of its own.
    async fn task(pool: &PgPool) -> Id {
        let space = Id::new().to_bytes();
        sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x') ON CONFLICT DO NOTHING")
            .bind(space)
            .execute(pool)
            .await
            .unwrap();
        let task = Id::new();
        sqlx::query("INSERT INTO tasks (id, space_idx, kind, input, status) VALUES ($1, $2, 'digest', '{}', 'queued')")
            .bind(task)
            .bind(space)
            .execute(pool)
            .await
            .unwrap();
        task
    }

    const SPACE: [u8; 16] = [7; 16];
    const REQUEST: [u8; 32] = [9; 32];

    /// Who buys in these tests: one Space, one request.
    fn purchase() -> Purchase<'static> {
        Purchase { space: &SPACE, request_hash: &REQUEST, asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e" }
    }

    /// Records the voucher `decision` bought `task` with.
    async fn record(pool: &PgPool, buyer: &Buyer, decision: Decision, task: Id) {
        let Decision::Buys { channel, ceiling, .. } = decision else { panic!("{decision:?}") };
        let signature = buyer.sign(&buyer.config, ceiling);
        let mut conn = pool.acquire().await.unwrap();
        batch::record(&mut conn, (&channel, ceiling), PRICE, &signature, (task, &purchase())).await.unwrap();
    }

    /// `buyer` pays `n` tasks, each voucher the next one.
    async fn buy(pool: &PgPool, buyer: &Buyer, n: u128) {
        for i in 1..=n {
            let decision = decide(pool, buyer, &buyer.config, i * PRICE, Some(DEPOSITED)).await.unwrap();
            record(pool, buyer, decision, task(pool).await).await;
        }
    }

    /// Whether `decision` is the voucher sent again, answering `task` to
    /// the Space and request that bought it.
    fn again(decision: &Result<Decision, Refusal>, task: Id) -> bool {
        matches!(decision, Ok(Decision::Again { task: Some(t), space, request_hash, .. })
            if *t == task && space == &SPACE && request_hash == &REQUEST)
    }

    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_voucher_buys_one_task_and_sent_again_finds_that_task_never_a_second(pool: PgPool) {
        let buyer = Buyer::new();
        let decision = decide(&pool, &buyer, &buyer.config, PRICE, Some(DEPOSITED)).await.unwrap();
        let Decision::Buys { channel, ceiling, on_chain } = &decision else { panic!("{decision:?}") };
        assert_eq!((channel.clone(), *ceiling), (format!("{:#x}", buyer.config.id(CHAIN)), PRICE));
        assert_eq!(*on_chain, DEPOSITED);
        let bought = task(&pool).await;
        record(&pool, &buyer, decision, bought).await;
        // Sent again, with or without a fresh read: the same task.
        assert!(again(&decide(&pool, &buyer, &buyer.config, PRICE, None).await, bought));
        assert!(again(&decide(&pool, &buyer, &buyer.config, PRICE, Some(DEPOSITED)).await, bought));
        // The next voucher is the next price up.
        assert!(matches!(
            decide(&pool, &buyer, &buyer.config, 2 * PRICE, None).await,
            Ok(Decision::Buys { ceiling, .. }) if ceiling == 2 * PRICE
        ));
    }

    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_voucher_below_or_beyond_what_was_charged_plus_the_price_is_refused_with_the_channel_state(pool: PgPool) {
        let buyer = Buyer::new();
        buy(&pool, &buyer, 2).await;
        // Below: a ceiling already bought is a replay, one under it buys
        // nothing; beyond: it would let the next voucher skip a charge.
        for ceiling in [2 * PRICE + 1, 2 * PRICE + PRICE / 2, 4 * PRICE] {
            let refused = decide(&pool, &buyer, &buyer.config, ceiling, Some(DEPOSITED)).await;
            let Err(Refusal::NotNext { got, expected, state }) = refused else { panic!("{ceiling}: {refused:?}") };
            assert_eq!((got, expected, state.charged), (ceiling, 3 * PRICE, 2 * PRICE));
            assert_eq!(state.on_chain, DEPOSITED);
        }
        let refused = decide(&pool, &buyer, &buyer.config, 2 * PRICE - 1, None).await;
        assert!(matches!(refused, Err(Refusal::NotNext { expected, .. }) if expected == 3 * PRICE), "{refused:?}");
    }

    /// A buyer that lost count (it signed one task behind) is answered the
    /// `402` `@x402/evm`'s client resynchronises from: the cumulative
    /// mismatch code, and on the batch offer what the channel was charged
    /// and the last voucher Reeve accepted, which is its own signature of
    /// that amount (what the client checks before it trusts the state).
    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_buyer_behind_its_channel_is_told_where_it_stands_with_its_own_last_voucher(pool: PgPool) {
        use reeve_shared::payments::PaymentRequired;
        use serde_json::json;

        let buyer = Buyer::new();
        buy(&pool, &buyer, 2).await;
        let again = decide(&pool, &buyer, &buyer.config, 2 * PRICE, Some(DEPOSITED)).await;
        assert!(matches!(again, Ok(Decision::Again { .. })), "a replay finds its task: {again:?}");
        let refusal = decide(&pool, &buyer, &buyer.config, 2 * PRICE - 1, None).await.unwrap_err();
        assert_eq!(refusal.code(), "invalid_batch_settlement_evm_cumulative_amount_mismatch");

        let channel = format!("{:#x}", buyer.config.id(CHAIN));
        let mut conn = pool.acquire().await.unwrap();
        let last = batch::last_voucher(&mut conn, &channel).await.unwrap();
        let offer = |scheme: &str| {
            json!({"scheme": scheme, "network": "eip155:84532", "amount": PRICE.to_string(),
                   "asset": format!("{TOKEN:#x}"), "payTo": format!("{RECEIVER:#x}"), "maxTimeoutSeconds": 300,
                   "extra": {"name": "USDC", "version": "2"}})
        };
        let challenge: PaymentRequired = serde_json::from_value(json!({
            "x402Version": 2, "error": "PAYMENT-SIGNATURE header is required",
            "resource": {"url": "http://127.0.0.1/v1/tasks/digest", "description": "D", "mimeType": "application/json"},
            "accepts": [offer("exact"), offer("batch-settlement")],
        }))
        .unwrap();
        let answer = batch::resynchronising(&challenge, "eip155:84532", &refusal, last);
        let answer = serde_json::to_value(&answer).unwrap();
        assert_eq!(answer["error"], "invalid_batch_settlement_evm_cumulative_amount_mismatch");
        assert!(answer["accepts"][0]["extra"].get("channelState").is_none(), "only the batch offer: {answer}");
        let extra = &answer["accepts"][1]["extra"];
        assert_eq!(extra["channelState"]["channelId"], channel.as_str());
        assert_eq!(extra["channelState"]["chargedCumulativeAmount"], (2 * PRICE).to_string());
        assert_eq!(extra["channelState"]["balance"], (4 * PRICE).to_string());
        assert_eq!(extra["voucherState"]["signedMaxClaimable"], (2 * PRICE).to_string());
        let signature: alloy_primitives::Bytes = extra["voucherState"]["signature"].as_str().unwrap().parse().unwrap();
        assert_eq!(batch::check_signature(&buyer.config, CHAIN, 2 * PRICE, &signature), Ok(()));

        // A refusal that knows no channel state (a foreign signature) is its
        // code alone.
        let stranger = Buyer::new();
        let signature = stranger.sign(&buyer.config, 3 * PRICE);
        let voucher = VoucherIn {
            config: &buyer.config,
            channel_id: buyer.config.id(CHAIN),
            ceiling: 3 * PRICE,
            signature: &signature,
        };
        let Err(batch::DecideError::Refused(foreign)) =
            batch::decide(&mut conn, &terms(), &voucher, PRICE, None, FRESH).await
        else {
            panic!("a stranger's voucher was taken")
        };
        let answer = batch::resynchronising(&challenge, "eip155:84532", &foreign, None);
        assert_eq!(answer.error, "invalid_batch_settlement_evm_voucher_signature");
        assert!(answer.accepts[1].extra.channel_state.is_none());
    }

    /// A channel Reeve first sees with claims on it (its own, before a
    /// database was restored) starts charged what was claimed: a voucher
    /// below it could never be claimed.
    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_channel_first_seen_with_claims_on_it_starts_at_what_was_claimed(pool: PgPool) {
        let buyer = Buyer::new();
        let claimed =
            OnChain { balance: 4 * PRICE, total_claimed: 2 * PRICE, withdraw_requested_at: 0, refund_nonce: 0 };
        let refused = decide(&pool, &buyer, &buyer.config, PRICE, Some(claimed)).await;
        assert!(matches!(refused, Err(Refusal::NotNext { expected, .. }) if expected == 3 * PRICE), "{refused:?}");
        let taken = decide(&pool, &buyer, &buyer.config, 3 * PRICE, Some(claimed)).await;
        assert!(matches!(taken, Ok(Decision::Buys { ceiling, .. }) if ceiling == 3 * PRICE), "{taken:?}");
    }

    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_voucher_the_balance_does_not_cover_is_refused(pool: PgPool) {
        let buyer = Buyer::new();
        buy(&pool, &buyer, 4).await;
        let refused = decide(&pool, &buyer, &buyer.config, 5 * PRICE, Some(DEPOSITED)).await;
        assert!(
            matches!(refused, Err(Refusal::AboveBalance { ceiling, balance, .. }) if ceiling == 5 * PRICE && balance == 4 * PRICE),
            "{refused:?}"
        );
        // A deposit later, read from the escrow: covered.
        let topped = OnChain { balance: 8 * PRICE, ..DEPOSITED };
        assert!(matches!(
            decide(&pool, &buyer, &buyer.config, 5 * PRICE, Some(topped)).await,
            Ok(Decision::Buys { .. })
        ));
    }

    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_voucher_for_another_channel_is_refused(pool: PgPool) {
        let buyer = Buyer::new();
        let cases = [
            (ChannelConfig { receiver: Address::repeat_byte(9), ..buyer.config.clone() }, "receiver"),
            (
                ChannelConfig { receiverAuthorizer: Address::repeat_byte(9), ..buyer.config.clone() },
                "receiverAuthorizer",
            ),
            (ChannelConfig { token: Address::repeat_byte(9), ..buyer.config.clone() }, "token"),
            (ChannelConfig { withdrawDelay: U40::from(901), ..buyer.config.clone() }, "withdrawDelay"),
        ];
        for (config, field) in cases {
            let refused = decide(&pool, &buyer, &config, PRICE, Some(DEPOSITED)).await;
            assert_eq!(refused, Err(Refusal::WrongChannel(field)));
        }
        // The payer's own channel, named by another channel's id.
        let other = ChannelConfig { salt: B256::repeat_byte(1), ..buyer.config.clone() };
        let signature = buyer.sign(&buyer.config, PRICE);
        let voucher =
            VoucherIn { config: &buyer.config, channel_id: other.id(CHAIN), ceiling: PRICE, signature: &signature };
        let mut conn = pool.acquire().await.unwrap();
        let refused = batch::decide(&mut conn, &terms(), &voucher, PRICE, Some(DEPOSITED), FRESH).await;
        assert!(matches!(refused, Err(batch::DecideError::Refused(Refusal::WrongChannel("channelId")))), "{refused:?}");
    }

    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_voucher_signed_by_another_key_is_refused(pool: PgPool) {
        let (buyer, thief) = (Buyer::new(), Buyer::new());
        // The thief signs a voucher on the buyer's channel.
        let refused = decide(&pool, &thief, &buyer.config, PRICE, Some(DEPOSITED)).await;
        assert!(
            matches!(refused, Err(Refusal::Signature(SignatureError::AnotherKey { expected, .. })) if expected == buyer.config.payer),
            "{refused:?}"
        );
        // Nothing of the channel was charged for it.
        assert!(matches!(
            decide(&pool, &buyer, &buyer.config, PRICE, Some(DEPOSITED)).await,
            Ok(Decision::Buys { .. })
        ));
    }

    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_voucher_after_the_payer_asked_to_withdraw_is_refused(pool: PgPool) {
        let buyer = Buyer::new();
        buy(&pool, &buyer, 1).await;
        let withdrawing = OnChain { withdraw_requested_at: 1_700_000_000, ..DEPOSITED };
        let refused = decide(&pool, &buyer, &buyer.config, 2 * PRICE, Some(withdrawing)).await;
        assert!(matches!(refused, Err(Refusal::Withdrawing { at: 1_700_000_000, .. })), "{refused:?}");
    }

    #[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
    async fn a_voucher_on_a_balance_read_too_long_ago_waits_for_a_fresh_read(pool: PgPool) {
        let buyer = Buyer::new();
        // Never read: the caller must read the escrow first.
        assert_eq!(decide(&pool, &buyer, &buyer.config, PRICE, None).await, Err(Refusal::Unread));
        buy(&pool, &buyer, 1).await;
        // Read within the bound: no read needed.
        assert!(matches!(decide(&pool, &buyer, &buyer.config, 2 * PRICE, None).await, Ok(Decision::Buys { .. })));
        // The read grows old.
        sqlx::query("UPDATE batch_channels SET read_at = now() - interval '31 seconds'").execute(&pool).await.unwrap();
        assert_eq!(decide(&pool, &buyer, &buyer.config, 2 * PRICE, None).await, Err(Refusal::Unread));
    }
}

/// Reeve's offer of a kind priced `scheme = "batch"`, as the official
/// client reads it: no chain, no database.
mod offer {
    use alloy_primitives::aliases::U40;
    use alloy_primitives::{Address, B256, Bytes};
    use base64::Engine;
    use reeve_shared::catalog::{Catalog, CatalogError};
    use reeve_shared::payments::batch::{ChannelConfig, check_signature};
    use reeve_shared::payments::{PaymentRequired, payment_required};
    use serde_json::Value;

    const PAY_TO: &str = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C";
    const AUTHORIZER: &str = "0x4444444444444444444444444444444444444444";

    /// A catalog with one kind `t` priced 1,000 per task by batch
    /// settlement in the local token, `payments` spliced into `[payments]`.
    fn catalog_text(payments: &str, price: &str) -> String {
        format!(
            r#"
[payments]
pay_to = "{PAY_TO}"
facilitator_url = "http://127.0.0.1:4021"
network_kind = "testnet"
{payments}

[assets.usdc]
network = "eip155:84532"
contract = "{token}"
decimals = 6
usd_peg = true
name = "USDC"
version = "2"

[assets.sol]
network = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
contract = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU"
decimals = 6
name = "USDC"
version = "2"

[tasks.t]
title = "T"
executor = "fetch"
input_schema = {{ type = "object" }}
[[tasks.t.accepts]]
{price}
"#,
            token = super::chain::TOKEN,
        )
    }

    fn problems(text: &str) -> Vec<String> {
        match Catalog::parse(text) {
            Err(CatalogError::Invalid { problems, .. }) => problems.iter().map(ToString::to_string).collect(),
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn a_batch_price_is_refused_at_its_toml_path_without_a_receiver_authorizer_or_off_evm() {
        let batch = "asset = \"usdc\"\nscheme = \"batch\"\namount = \"1000\"";
        assert_eq!(
            problems(&catalog_text("", batch)),
            ["tasks.t.accepts[0].scheme: a batch price needs [payments] batch_receiver_authorizer, the address that \
              authorizes Reeve's claims on the payer's channel"]
        );
        let authorizer = format!("batch_receiver_authorizer = \"{AUTHORIZER}\"");
        let solana = "asset = \"sol\"\nscheme = \"batch\"\namount = \"1000\"";
        assert_eq!(
            problems(&catalog_text(&authorizer, solana)),
            ["tasks.t.accepts[0].scheme: asset \"sol\" is not on an EVM network; batch pays through an EVM escrow"]
        );
        let short = format!("{authorizer}\nbatch_withdraw_delay_seconds = 60");
        let shown = problems(&catalog_text(&short, batch));
        assert!(
            shown.len() == 1 && shown[0].starts_with("payments.batch_withdraw_delay_seconds: must be from 900 to"),
            "{shown:?}"
        );
        let metered = "asset = \"usdc\"\nscheme = \"batch\"\namount = \"1000\"\nunit = \"byte\"\nrate = \"1\"";
        let shown = problems(&catalog_text(&authorizer, metered));
        assert!(shown.iter().all(|p| p.contains("only a metered price")), "{shown:?}");
    }

    /// The offer carries the channel terms `@x402/evm`'s batch-settlement
    /// client builds a channel from, and the official client pays it: a
    /// deposit of at least the offer's `minDeposit` into a channel naming
    /// Reeve's receiver, receiver authorizer, token and withdraw delay, with
    /// a first voucher of one task's price that Reeve's own check takes.
    #[tokio::test]
    async fn the_official_client_opens_a_channel_on_reeves_terms_from_a_batch_offer() {
        let payments = format!("batch_receiver_authorizer = \"{AUTHORIZER}\"\nbatch_withdraw_delay_seconds = 3600");
        let catalog =
            Catalog::parse(&catalog_text(&payments, "asset = \"usdc\"\nscheme = \"batch\"\namount = \"1000\""))
                .unwrap_or_else(|e| panic!("{e}"));
        let task = catalog.task("t").unwrap();
        assert_eq!(task.accepts[0].scheme(), "batch-settlement");
        let challenge: PaymentRequired =
            payment_required(&catalog, task, "http://127.0.0.1/v1/tasks/t", "payment_required").unwrap();
        let offer = serde_json::to_value(&challenge.accepts[0]).unwrap();
        assert_eq!(offer["scheme"], "batch-settlement");
        assert_eq!(offer["amount"], "1000");
        assert_eq!(offer["extra"]["receiverAuthorizer"], AUTHORIZER);
        assert_eq!(offer["extra"]["withdrawDelay"], 3600);
        assert_eq!(offer["extra"]["minDeposit"], "10000");
        assert_eq!(offer["extra"]["name"], "USDC");

        // anvil's well-known development account 1: a key with no secret.
        let key = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
        let required = base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&challenge).unwrap());
        let header = super::node("batch-pay.mjs", vec![required], vec![("REEVE_WALLET_KEY", key.into())]).await;
        let payment: Value =
            serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(header.trim()).unwrap()).unwrap();
        assert_eq!(payment["accepted"]["scheme"], "batch-settlement", "{payment}");
        let raw = &payment["payload"];
        assert_eq!(raw["type"], "deposit", "{payment}");
        let deposit: u128 = raw["deposit"]["amount"].as_str().unwrap().parse().unwrap();
        assert!(deposit >= 10_000, "{payment}");

        let text = |v: &Value| v.as_str().unwrap_or_else(|| panic!("{payment}")).to_owned();
        let address = |v: &Value| text(v).parse::<Address>().unwrap();
        let c = &raw["channelConfig"];
        let config = ChannelConfig {
            payer: address(&c["payer"]),
            payerAuthorizer: address(&c["payerAuthorizer"]),
            receiver: address(&c["receiver"]),
            receiverAuthorizer: address(&c["receiverAuthorizer"]),
            token: address(&c["token"]),
            withdrawDelay: U40::from(c["withdrawDelay"].as_u64().unwrap()),
            salt: text(&c["salt"]).parse::<B256>().unwrap(),
        };
        assert_eq!(config.receiver, PAY_TO.parse::<Address>().unwrap());
        assert_eq!(config.receiverAuthorizer, AUTHORIZER.parse::<Address>().unwrap());
        assert_eq!(config.token, super::chain::TOKEN.parse::<Address>().unwrap());
        assert_eq!(config.withdrawDelay, U40::from(3600));
        assert_eq!(text(&raw["voucher"]["channelId"]).parse::<B256>().unwrap(), config.id(84532));
        assert_eq!(text(&raw["voucher"]["maxClaimableAmount"]), "1000");
        let signature: Bytes = text(&raw["voucher"]["signature"]).parse().unwrap();
        assert_eq!(check_signature(&config, 84532, 1000, &signature), Ok(()));
    }
}
