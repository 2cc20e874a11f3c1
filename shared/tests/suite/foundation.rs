//! The foundation against the real stack: ids through Postgres, migrations,
//! `/healthz` naming what is down, `/v1/catalog`, and the error envelope.

use crate::common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::{ctx, ctx_with_redis, get, send};
use reeve_shared::db;
use reeve_shared::http::app;
use reeve_shared::ids::Id;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn ids_round_trip_through_postgres_as_16_bytes(pool: PgPool) {
    let space = [7u8; 16];
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space).execute(&pool).await.unwrap();
    let id = Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input) VALUES ($1, $2, 'digest', '{}')")
        .bind(id)
        .bind(space)
        .execute(&pool)
        .await
        .unwrap();

    let (back, len): (Id, i32) =
        sqlx::query_as("SELECT id, octet_length(id) FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(back, id);
    assert_eq!(len, 16);
    let found: Option<Id> =
        sqlx::query_scalar("SELECT id FROM tasks WHERE id = $1").bind(id).fetch_optional(&pool).await.unwrap();
    assert_eq!(found, Some(id), "lookup by id must use the same 16 bytes");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn ids_of_any_other_length_are_refused_by_the_schema(pool: PgPool) {
    let err = sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')")
        .bind(vec![1u8; 15])
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("check constraint"), "{err}");
}

/// A failover, or Postgres restarting, ends the pool's connections while
/// they sit idle. The pool pings a connection idle for `PING_AFTER_IDLE`
/// before handing it out, so the first query after the pause finds the dead
/// one, drops it, and runs on a new connection instead of failing.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_connection_that_died_while_idle_is_replaced_before_a_query_uses_it(pool: PgPool) {
    let app_pool = db::connect(&common::database_url(&pool)).await.unwrap();
    let before: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&app_pool).await.unwrap();

    let ended: bool =
        sqlx::query_scalar("SELECT pg_terminate_backend($1)").bind(before).fetch_one(&pool).await.unwrap();
    assert!(ended, "the pool's connection was ended from outside");
    tokio::time::sleep(db::PING_AFTER_IDLE + std::time::Duration::from_millis(100)).await;

    let after: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&app_pool)
        .await
        .expect("the query after the pause runs on a new connection");
    assert_ne!(after, before);
    app_pool.close().await;
}

/// An operator's `sslmode=require` (RDS) must get TLS, which sqlx has only
/// when built with it (Cargo.toml turns it on through `sqlx-core`, not
/// `sqlx`, so the query macros are built without it). The local Postgres
/// offers no TLS: a build with TLS asks for it and is told no; one without
/// would refuse before asking.
#[tokio::test]
async fn a_database_url_that_requires_tls_is_answered_over_tls_or_refused() {
    let url = std::env::var(reeve_shared::settings::DATABASE_URL).expect("the stack's DATABASE_URL");
    let separator = if url.contains('?') { '&' } else { '?' };
    let err =
        db::connect(&format!("{url}{separator}sslmode=require")).await.expect_err("the local Postgres has no TLS");
    let message = err.to_string();
    assert!(message.contains("server does not support TLS"), "{message}");
    assert!(!message.contains("password"), "{message}");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn migrating_again_is_a_no_op(pool: PgPool) {
    db::migrate(&pool).await.expect("second run");
    db::migrate(&pool).await.expect("third run");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        tables,
        [
            "_sqlx_migrations",
            "batch_channels",
            "batch_payouts",
            "batch_refunds",
            "batch_vouchers",
            "credits",
            "executor_reports",
            "login_limits",
            "pay_links",
            "payment_attempts",
            "payments",
            "revoked_sessions",
            "space_webhooks",
            "spaces",
            "task_events",
            "tasks",
            "uploads",
            "webhook_attempts",
            "webhook_deliveries",
            "webhook_disabled",
            "webhook_secrets"
        ]
    );
}

/// Upto attempts stored before payment numbers had one spelling are brought
/// to it (`0012_canonical_payment_numbers.sql`): a nonce written `"0…"`
/// takes its canonical decimal, so a new payment of the same nonce collides
/// with it; where the old bug already stored two spellings of one nonce, one
/// takes the canonical form and the other keeps its text as history.
#[sqlx::test(migrations = false)]
async fn stored_upto_nonces_are_brought_to_their_canonical_decimal(pool: PgPool) {
    db::MIGRATOR.run_to(11, &pool).await.unwrap();
    let space = [9u8; 16];
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space).execute(&pool).await.unwrap();
    let rows = [
        ("upto", "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", "000123", 1),
        ("upto", "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", "0123", 2),
        ("upto", "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", "00", 3),
        ("upto", "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", "77", 4),
        ("upto", "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", "077", 5),
        ("upto", "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc", "0123", 6),
        ("exact", "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc", "0x00ab", 7),
    ];
    for (scheme, payer, nonce, at) in rows {
        sqlx::query(
            "INSERT INTO payment_attempts (id, network, payer, nonce, payload_hash, space_idx, kind, request_hash,
                                           asset, amount, scheme, status, created_at)
             VALUES ($1, 'eip155:84532', $2, $3, $4, $5, 'metered', $4, '0xToken', '1000', $6, 'released',
                     now() - make_interval(secs => 100 - $7))",
        )
        .bind(Id::new())
        .bind(payer)
        .bind(nonce)
        .bind([0u8; 32].as_slice())
        .bind(space)
        .bind(scheme)
        .bind(f64::from(at))
        .execute(&pool)
        .await
        .unwrap();
    }
    db::migrate(&pool).await.unwrap();
    let nonces: Vec<(String, String)> =
        sqlx::query_as("SELECT payer, nonce FROM payment_attempts ORDER BY created_at").fetch_all(&pool).await.unwrap();
    let nonces: Vec<&str> = nonces.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(
        nonces,
        ["123", "0123", "0", "77", "077", "123", "0x00ab"],
        "the earliest spelling of each nonce takes its canonical form, unless one holds it; exact is untouched"
    );
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn healthz_is_ok_when_both_stores_answer(pool: PgPool) {
    let reply = send(&app(ctx(pool).await), get("/healthz")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["status"], "ok");
    assert_eq!(reply.body["postgres"], "ok");
    assert_eq!(reply.body["redis"], "ok");
}

// Port 1 on loopback: nothing listens there, so connecting fails at once.
const DEAD_REDIS: &str = "redis://127.0.0.1:1";

/// Without Redis the API still serves (events reach their streams from
/// Postgres), so a load balancer must keep it: `200`, `degraded`.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn healthz_is_degraded_when_redis_is_down(pool: PgPool) {
    let reply = send(&app(ctx_with_redis(pool, DEAD_REDIS).await), get("/healthz")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.body["status"], "degraded");
    assert_eq!(reply.body["postgres"], "ok");
    assert_eq!(reply.body["redis"], "unavailable");
}

#[tokio::test]
async fn healthz_names_postgres_when_postgres_is_down() {
    let dead = PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy("postgres://reeve:x@127.0.0.1:1/reeve")
        .unwrap();
    let reply = send(&app(ctx(dead).await), get("/healthz")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body["error"]["message"], "postgres is unavailable");
}

#[tokio::test]
async fn healthz_names_both_when_both_are_down() {
    let dead = PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy("postgres://reeve:x@127.0.0.1:1/reeve")
        .unwrap();
    let reply = send(&app(ctx_with_redis(dead, DEAD_REDIS).await), get("/healthz")).await;
    assert_eq!(reply.body["error"]["message"], "postgres and redis are unavailable");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn catalog_lists_tasks_with_atomic_string_prices(pool: PgPool) {
    let reply = send(&app(ctx(pool).await), get("/v1/catalog")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "application/json");
    let text = reply.body.to_string();
    assert!(text.contains("\"digest\""), "{text}");
    assert!(text.contains("\"10000\""), "fetch costs 0.01 USDC = 10000 atomic units: {text}");
    assert!(!text.contains("endpoint"), "operator details must not leak: {text}");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn unknown_routes_and_methods_get_the_envelope_with_a_request_id(pool: PgPool) {
    let app = app(ctx(pool).await);

    let reply = send(&app, get("/v1/nope")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.code(), "not_found");
    let id = reply.headers["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(reply.body["error"]["request_id"], id.as_str());
    assert_eq!(id.len(), 26, "our own request ids are ULIDs");

    let reply =
        send(&app, Request::builder().method(Method::DELETE).uri("/v1/catalog").body(Body::empty()).unwrap()).await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(reply.code(), "method_not_allowed");
    assert_eq!(reply.headers["allow"], "GET,HEAD");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_callers_request_id_is_kept_and_a_hostile_one_replaced(pool: PgPool) {
    let app = app(ctx(pool).await);
    let with = |id: &str| Request::get("/v1/nope").header("x-request-id", id).body(Body::empty()).unwrap();

    let reply = send(&app, with("gw-1234")).await;
    assert_eq!(reply.headers["x-request-id"], "gw-1234");
    assert_eq!(reply.body["error"]["request_id"], "gw-1234");

    let reply = send(&app, with(&"x".repeat(500))).await;
    assert_eq!(reply.headers["x-request-id"].len(), 26);
}
