//! Quotas for what is free, through the API against the real stack: a free
//! kind's hour and its at-once cap each answer `429 quota_exceeded` with
//! `Retry-After` and store nothing, a burst of parallel creates cannot slip
//! past them, a priced kind is not limited by them, and `GET /v1/space` shows
//! the use and the limits.

use crate::common;

use axum::Router;
use axum::http::StatusCode;
use common::{Reply, TestQueue, get_authed, new_session, post_json, send};
use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::http::app;
use reeve_shared::ids::Id;
use reeve_shared::settings;
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

/// Two free kinds, each with one tight ceiling, and a priced kind.
const CATALOG: &str = r#"
[payments]
pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
facilitator_url = "http://127.0.0.1:4021"

[assets.coin]
network = "eip155:84532"
contract = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
decimals = 6
usd_peg = true
name = "USDC"
version = "2"

[tasks.hourly]
title = "Three an hour"
executor = "digest"
input_schema = { type = "object" }
quota = { per_hour = 3, at_once = 100 }

[tasks.narrow]
title = "Two at once"
executor = "digest"
input_schema = { type = "object" }
quota = { per_hour = 100, at_once = 2 }

[tasks.paid]
title = "Priced"
executor = "digest"
input_schema = { type = "object" }
[[tasks.paid.accepts]]
asset = "coin"
amount = "1000"
"#;

struct Api {
    app: Router,
    token: String,
    space: SpaceIndex,
    queue: TestQueue,
}

async fn api(pool: &PgPool) -> Api {
    let queue = TestQueue::new().await;
    let config = common::with_catalog(common::config(pool), CATALOG).with(settings::QUEUE_URL, &queue.url);
    let ctx = common::api(&config).await;
    let key = ctx.settings.token_key.clone();
    let app = app(ctx);
    let (_, token) = new_session(&app).await;
    let space = auth::verify_token(&key, &token, OffsetDateTime::now_utc()).unwrap();
    Api { app, token, space, queue }
}

async fn create(api: &Api, kind: &str, token: &str) -> Reply {
    send(&api.app, post_json(&format!("/v1/tasks/{kind}"), Some(token), &json!({"input": {}}))).await
}

/// The refusal every quota gives: `429 quota_exceeded`, its `Retry-After`.
fn refused(reply: &Reply) -> u64 {
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{}", reply.body);
    assert_eq!(reply.code(), "quota_exceeded");
    assert!(reply.headers.contains_key("x-request-id"));
    reply.headers["retry-after"].to_str().unwrap().parse().unwrap()
}

async fn stored(pool: &PgPool, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tasks WHERE kind = $1").bind(kind).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_hours_quota_answers_429_with_retry_after_and_slides(pool: PgPool) {
    let api = api(&pool).await;
    let mut first = None;
    for _ in 0..3 {
        let reply = create(&api, "hourly", &api.token).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        first.get_or_insert(reply.body["id"].as_str().unwrap().parse::<Id>().unwrap());
    }
    let wait = refused(&create(&api, "hourly", &api.token).await);
    assert!((3590..=3600).contains(&wait), "the oldest of the hour leaves it in an hour: {wait}");
    assert_eq!(stored(&pool, "hourly").await, 3, "a refused create stores nothing");
    // Every task of the hour counts, finished or not.
    sqlx::query("UPDATE tasks SET status = 'completed'").execute(&pool).await.unwrap();
    refused(&create(&api, "hourly", &api.token).await);

    // The quota is the Space's: another Space has its own.
    let (_, other) = new_session(&api.app).await;
    assert_eq!(create(&api, "hourly", &other).await.status, StatusCode::ACCEPTED);

    // The hour slides: once the oldest is 50 minutes old, the next may come
    // in 10; once it is an hour old, now.
    let age = |minutes: i32| {
        sqlx::query("UPDATE tasks SET created_at = now() - make_interval(mins => $2) WHERE id = $1")
            .bind(first.unwrap())
            .bind(minutes)
    };
    age(50).execute(&pool).await.unwrap();
    let wait = refused(&create(&api, "hourly", &api.token).await);
    assert!((590..=600).contains(&wait), "{wait}");
    age(61).execute(&pool).await.unwrap();
    assert_eq!(create(&api, "hourly", &api.token).await.status, StatusCode::ACCEPTED);
    refused(&create(&api, "hourly", &api.token).await);
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_at_once_cap_answers_429_and_lifts_when_a_task_ends(pool: PgPool) {
    let api = api(&pool).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let reply = create(&api, "narrow", &api.token).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        ids.push(reply.body["id"].as_str().unwrap().to_owned());
    }
    let reply = create(&api, "narrow", &api.token).await;
    assert!(refused(&reply) >= 1);
    assert!(reply.body["error"]["message"].as_str().unwrap().contains("2 narrow tasks queued or running"));
    // Running counts as much as queued.
    sqlx::query("UPDATE tasks SET status = 'running'").execute(&pool).await.unwrap();
    refused(&create(&api, "narrow", &api.token).await);
    // Other kinds have their own quota.
    assert_eq!(create(&api, "hourly", &api.token).await.status, StatusCode::ACCEPTED);

    // One ends (here: canceled through the API): there is room for one more.
    sqlx::query("UPDATE tasks SET status = 'queued' WHERE kind = 'narrow'").execute(&pool).await.unwrap();
    let cancel = send(&api.app, post_json(&format!("/v1/tasks/{}/cancel", ids[0]), Some(&api.token), &json!({}))).await;
    assert_eq!(cancel.status, StatusCode::OK, "{}", cancel.body);
    assert_eq!(create(&api, "narrow", &api.token).await.status, StatusCode::ACCEPTED);
    refused(&create(&api, "narrow", &api.token).await);
    assert_eq!(stored(&pool, "narrow").await, 3);
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_burst_of_parallel_creates_cannot_slip_past_the_cap(pool: PgPool) {
    let api = api(&pool).await;
    let burst: Vec<_> = (0..12)
        .map(|_| {
            let (app, token) = (api.app.clone(), api.token.clone());
            tokio::spawn(
                async move { send(&app, post_json("/v1/tasks/narrow", Some(&token), &json!({"input": {}}))).await },
            )
        })
        .collect();
    let mut statuses = Vec::new();
    for reply in burst {
        statuses.push(reply.await.unwrap().status.as_u16());
    }
    statuses.sort();
    assert_eq!(statuses, [[202; 2].as_slice(), &[429; 10]].concat(), "each create counted the ones before it");
    assert_eq!(stored(&pool, "narrow").await, 2);
    api.queue.delete().await;
}

/// `n` credits for one `paid` task each, left on `space` by failed paid
/// tasks: the way a priced task is paid without the chain.
async fn credits(pool: &PgPool, space: &SpaceIndex, n: usize) {
    for _ in 0..n {
        let source = Id::new();
        sqlx::query("INSERT INTO tasks (id, space_idx, kind, input, status) VALUES ($1, $2, 'paid', '{}', 'failed')")
            .bind(source)
            .bind(space.as_bytes())
            .execute(pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO credits (id, space_idx, network, asset, amount, source_task, reason)
             VALUES ($1, $2, 'eip155:84532', '0x036CbD53842c5426634e7929541eC2318f3dCF7e', '1000', $3, 'retries_exhausted')",
        )
        .bind(Id::new())
        .bind(space.as_bytes())
        .bind(source)
        .execute(pool)
        .await
        .unwrap();
    }
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_priced_kind_is_not_limited_by_the_quotas(pool: PgPool) {
    let api = api(&pool).await;
    // More than any quota of the catalog allows, at once and in the hour,
    // all queued: each is paid, and payment is a priced kind's limit.
    let n = 12;
    credits(&pool, &api.space, n).await;
    for i in 0..n {
        let reply = create(&api, "paid", &api.token).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "paid task {i}: {}", reply.body);
    }
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE kind = 'paid' AND status = 'queued'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(queued, n as i64);
    // Without a credit left it is the price, not a quota, that answers.
    assert_eq!(create(&api, "paid", &api.token).await.status, StatusCode::PAYMENT_REQUIRED);
    api.queue.delete().await;
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_space_shows_its_use_and_limits(pool: PgPool) {
    let api = api(&pool).await;
    for kind in ["hourly", "hourly", "narrow"] {
        assert_eq!(create(&api, kind, &api.token).await.status, StatusCode::ACCEPTED);
    }
    sqlx::query("UPDATE tasks SET status = 'completed' WHERE kind = 'hourly'").execute(&pool).await.unwrap();
    let space = send(&api.app, get_authed("/v1/space", &api.token)).await;
    assert_eq!(space.status, StatusCode::OK, "{}", space.body);
    assert_eq!(
        space.body["quotas"],
        json!([
            {"kind": "hourly", "per_hour": {"limit": 3, "used": 2}, "at_once": {"limit": 100, "used": 0}},
            {"kind": "narrow", "per_hour": {"limit": 100, "used": 1}, "at_once": {"limit": 2, "used": 1}},
        ]),
        "the free kinds, in the catalog's order; the priced one has no quota"
    );
    // The catalog shows the limits before any use.
    let catalog = send(&api.app, common::get("/v1/catalog")).await;
    let kinds: Vec<(Value, Value)> =
        catalog.body["tasks"].as_array().unwrap().iter().map(|t| (t["kind"].clone(), t["quota"].clone())).collect();
    assert_eq!(
        kinds,
        [
            (json!("hourly"), json!({"per_hour": 3, "at_once": 100})),
            (json!("narrow"), json!({"per_hour": 100, "at_once": 2})),
            (json!("paid"), Value::Null),
        ]
    );
    api.queue.delete().await;
}
