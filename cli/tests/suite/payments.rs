//! `reeve payments channels`: the batch-settlement channels an operator
//! watches, as the binary reads them over `DATABASE_URL`. The vouchers are
//! written as the payment path records them (the shared suite's
//! `batch_create` tests buy them with the official client); here it is what
//! the command shows of them: what is unclaimed, when its claim falls due
//! under the claim policy, and a payer's withdrawal.

use crate::common;

use serde_json::Value;

use common::reeve;

fn channels(db: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = reeve(db, "");
    command.args(["payments", "channels"]).args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "reeve payments channels {args:?}:\n{stdout}{stderr}");
    stdout.into_owned()
}

/// A channel of `payer` with a withdraw delay of 900 s, its vouchers bought
/// `ages` seconds ago, each for 10 units; `claimed` of them claimed.
async fn channel(pool: &sqlx::PgPool, id: char, payer: char, ages: &[i64], claimed: i64, withdraw_asked: i64) {
    let channel = format!("0x{}", id.to_string().repeat(64));
    let config = serde_json::json!({"receiver": format!("0x{}", "b".repeat(40)), "token": format!("0x{}", "c".repeat(40)), "withdrawDelay": 900});
    sqlx::query(
        "INSERT INTO batch_channels (channel_id, network, payer, config, charged, balance, total_claimed,
                                     withdraw_requested_at, read_at)
         VALUES ($1, 'eip155:84532', $2, $3, $4, 1000, $5, $6, now())",
    )
    .bind(&channel)
    .bind(format!("0x{}", payer.to_string().repeat(40)))
    .bind(&config)
    .bind(10 * ages.len() as i64)
    .bind(10 * claimed)
    .bind(withdraw_asked)
    .execute(pool)
    .await
    .unwrap();
    for (n, age) in ages.iter().enumerate() {
        sqlx::query(
            "INSERT INTO batch_vouchers (channel_id, ceiling, price, signature, created_at, space_idx, request_hash, asset)
             VALUES ($1, $2, 10, $3, now() - make_interval(secs => $4), $5, $6, 'local')",
        )
        .bind(&channel)
        .bind(10 * (n as i64 + 1))
        .bind(format!("0x{}", "1".repeat(130)))
        .bind(*age as f64)
        .bind([7u8; 16].as_slice())
        .bind([n as u8; 32].as_slice())
        .execute(pool)
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn an_operator_sees_what_is_unclaimed_and_when_it_is_claimed() {
    let db = common::FreshDb::migrated("reeve_channels").await;
    let pool = db.pool().await;
    assert_eq!(channels(&db.url, &[], &[]).trim(), "no voucher waits to be claimed");

    // Two vouchers bought 100 and 50 s ago, one claimed; three bought 10 s
    // ago on a channel whose payer asked to withdraw; one claimed in full.
    channel(&pool, 'a', 'd', &[100, 50], 1, 0).await;
    let asked = time::OffsetDateTime::now_utc().unix_timestamp() - 5;
    channel(&pool, 'e', 'f', &[10, 10, 10], 0, asked).await;
    channel(&pool, '9', 'd', &[3000], 1, 0).await;

    // The withdrawing channel first (due at the next sweep), then the other,
    // due a quarter of its 900 s delay after its oldest unclaimed voucher
    // (the policy's hour being longer); the claimed one only with --all.
    let listed: Value = serde_json::from_str(&channels(&db.url, &["--json"], &[])).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "{listed:#?}");
    assert_eq!(listed[0]["channel_id"], format!("0x{}", "e".repeat(64)));
    assert_eq!((&listed[0]["unclaimed"], &listed[1]["unclaimed"]), (&Value::from("30"), &Value::from("10")));
    assert_eq!(listed[1]["claimed"], "10");
    let time = |v: &Value| {
        time::OffsetDateTime::parse(v.as_str().unwrap(), &time::format_description::well_known::Rfc3339).unwrap()
    };
    let (oldest, due) = (time(&listed[1]["oldest_unclaimed_at"]), time(&listed[1]["claim_due_at"]));
    assert_eq!((due - oldest).whole_seconds(), 225, "{:#?}", listed[1]);
    assert_eq!((time(&listed[0]["withdrawable_at"]) - time(&listed[0]["withdraw_requested_at"])).whole_seconds(), 900);
    // A shorter policy (REEVE_BATCH_CLAIM_AFTER_SECONDS) moves the claim up.
    let sooner: Value =
        serde_json::from_str(&channels(&db.url, &["--json"], &[("REEVE_BATCH_CLAIM_AFTER_SECONDS", "60")])).unwrap();
    assert_eq!((time(&sooner[1]["claim_due_at"]) - oldest).whole_seconds(), 60);

    let all: Value = serde_json::from_str(&channels(&db.url, &["--json", "--all"], &[])).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 3);
    assert_eq!((&all[2]["unclaimed"], &all[2]["claim_due_at"]), (&Value::from("0"), &Value::Null));

    // In words: the withdrawal, and the claims' times.
    let text = channels(&db.url, &[], &[]);
    assert!(text.contains("claim due at the next sweep"), "{text}");
    assert!(text.contains("withdrawal asked") && text.contains("what is unclaimed is the payer's from"), "{text}");
    assert!(text.contains("charged 20  claimed 10  unclaimed 10"), "{text}");
    pool.close().await;
    db.drop().await;
}
