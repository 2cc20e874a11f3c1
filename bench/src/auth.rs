//! Auth: opening a session as the spaces table grows (the lookup is one
//! primary-key probe on the HMAC index, so it should not grow), one Argon2id
//! verify, and one bearer-token check.

use std::time::Instant;

use anyhow::Context;
use reeve_shared::auth::{self, Secret};
use reeve_shared::spaces;
use time::OffsetDateTime;

use crate::median;
use crate::stack::BenchDb;

#[derive(clap::Args)]
pub struct Args {
    /// Sessions opened per table size.
    #[arg(long, default_value_t = 20)]
    sessions: usize,
}

fn secret(name: &'static str) -> anyhow::Result<Secret> {
    Ok(Secret::new(name, std::env::var(name).with_context(|| name.to_owned())?.into_bytes())?)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let db = BenchDb::create("auth").await?;
    let pepper = secret("REEVE_PEPPER")?;
    let key = secret("REEVE_TOKEN_KEY")?;
    let limit = spaces::Argon2Limit::new(2);
    let space = spaces::create(&db.pool, &pepper, &limit).await?;
    let id = space.space_id.as_str().to_owned();
    let idx = auth::space_index(&pepper, &space.space_id);

    let mut rows = Vec::new();
    let mut have = 1i64;
    for size in [1_000i64, 100_000, 1_000_000] {
        sqlx::query(
            "INSERT INTO spaces (idx, hash) SELECT decode(md5(random()::text || g::text), 'hex'), 'filler' \
             FROM generate_series(1, $1) g ON CONFLICT DO NOTHING",
        )
        .bind(size - have)
        .execute(&db.pool)
        .await?;
        have = size;
        sqlx::query("VACUUM ANALYZE spaces").execute(&db.pool).await?;
        // Warm the cache the way a running service has it.
        for _ in 0..3 {
            spaces::open_session(&db.pool, &pepper, &key, &limit, &id).await?;
        }
        let mut sessions = Vec::new();
        for _ in 0..args.sessions {
            let start = Instant::now();
            spaces::open_session(&db.pool, &pepper, &key, &limit, &id).await?;
            sessions.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        let mut lookups = Vec::new();
        for _ in 0..2000 {
            let start = Instant::now();
            let _: Option<String> = sqlx::query_scalar("SELECT hash FROM spaces WHERE idx = $1")
                .bind(idx.as_bytes())
                .fetch_optional(&db.pool)
                .await?;
            lookups.push(start.elapsed().as_secs_f64() * 1e6);
        }
        rows.push((size, median(sessions), median(lookups)));
    }

    let hash: String =
        sqlx::query_scalar("SELECT hash FROM spaces WHERE idx = $1").bind(idx.as_bytes()).fetch_one(&db.pool).await?;
    let mut verifies = Vec::new();
    for _ in 0..10 {
        let (sid, h) = (space.space_id.clone(), hash.clone());
        let start = Instant::now();
        let ok = tokio::task::spawn_blocking(move || auth::verify_space_id(&sid, Some(&h))).await?;
        verifies.push(start.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(ok, "the space's own id verifies");
    }
    let (token, _) = auth::issue_token(&key, &idx, OffsetDateTime::now_utc());
    let mut checks = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        for _ in 0..10_000 {
            std::hint::black_box(
                auth::verify_token(&key, std::hint::black_box(&token), OffsetDateTime::now_utc()).is_ok(),
            );
        }
        checks.push(start.elapsed().as_secs_f64() * 1e6 / 10_000.0);
    }
    db.drop_now().await?;

    let mut out = String::from("## Auth\n\n");
    out.push_str(
        "Opening a session (`spaces::open_session`: HMAC index, one primary-key lookup, one Argon2id verify, \
         one token) with the spaces table at each size, medians; and the lookup alone.\n\n",
    );
    out.push_str("| spaces in the table | open session, median ms | lookup alone, median µs |\n|---|---|---|\n");
    for (size, session, lookup) in &rows {
        out.push_str(&format!("| {size} | {session:.1} | {lookup:.0} |\n"));
    }
    let (small, large) = (&rows[0], &rows[rows.len() - 1]);
    out.push_str(&format!(
        "\nRatio 1M ÷ 1k: open session **{:.2}** (goal ≤ 1.1), lookup alone {:.2}.\n\n",
        large.1 / small.1,
        large.2 / small.2
    ));
    out.push_str(&format!(
        "One Argon2id verify (the stored parameters): median **{:.1} ms** of 10.\n\n",
        median(verifies)
    ));
    out.push_str(&format!(
        "One bearer-token check (`auth::verify_token`: decode, HMAC-SHA256, constant-time compare, expiry): \
         median **{:.2} µs** (goal ≤ 50 µs), 20 batches of 10,000.\n\n",
        median(checks)
    ));
    print!("{out}");
    Ok(())
}
