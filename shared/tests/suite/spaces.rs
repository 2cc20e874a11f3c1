//! Spaces and sessions through the router, against real Postgres.

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{ctx, get, get_authed, new_session, post_json, send};
use reeve_shared::auth;
use reeve_shared::http::app;
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_space_is_created_with_a_fresh_20_digit_id_that_is_not_stored(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let a = send(&app, Request::post("/v1/spaces").body(Body::empty()).unwrap()).await;
    let b = send(&app, Request::post("/v1/spaces").body(Body::empty()).unwrap()).await;
    assert_eq!(a.status, StatusCode::CREATED);
    let id = a.body["space_id"].as_str().unwrap();
    assert_eq!(id.len(), 20);
    assert!(id.bytes().all(|c| c.is_ascii_digit()), "{id}");
    assert_ne!(a.body["space_id"], b.body["space_id"]);
    OffsetDateTime::parse(a.body["created_at"].as_str().unwrap(), &Rfc3339).expect("RFC 3339");

    let rows: Vec<(Vec<u8>, String)> = sqlx::query_as("SELECT idx, hash FROM spaces").fetch_all(&pool).await.unwrap();
    assert_eq!(rows.len(), 2);
    let space_id = auth::SpaceId::parse(id).unwrap();
    let idx = auth::space_index(&ctx.settings.pepper, &space_id);
    let (stored_idx, hash) =
        rows.iter().find(|(i, _)| i.as_slice() == idx.as_bytes()).expect("row keyed by the HMAC index");
    assert_eq!(stored_idx.len(), 16);
    assert!(hash.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{hash}");
    assert!(!hash.contains(id), "no plaintext copy of the id");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_session_token_is_issued_for_the_right_id_and_lasts_15_minutes(pool: PgPool) {
    let ctx = ctx(pool).await;
    let app = app(ctx.clone());
    let (space_id, token) = new_session(&app).await;
    let idx = auth::verify_token(&ctx.settings.token_key, &token, OffsetDateTime::now_utc()).expect("a valid token");
    assert_eq!(idx, auth::space_index(&ctx.settings.pepper, &auth::SpaceId::parse(&space_id).unwrap()));

    let again = send(&app, post_json("/v1/sessions", None, &json!({ "space_id": space_id }))).await;
    let expires = OffsetDateTime::parse(again.body["expires_at"].as_str().unwrap(), &Rfc3339).unwrap();
    let ttl = expires - OffsetDateTime::now_utc();
    assert!(ttl > time::Duration::minutes(14) && ttl <= time::Duration::minutes(15), "{ttl}");
    assert_eq!(again.body["token_type"], "Bearer");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn wrong_unknown_and_malformed_ids_get_the_same_401(pool: PgPool) {
    let app = app(ctx(pool).await);
    let (space_id, _) = new_session(&app).await;
    // Change one digit: a well-formed id that exists nowhere.
    let last = space_id.as_bytes()[19];
    let wrong = format!("{}{}", &space_id[..19], if last == b'9' { '0' } else { (last + 1) as char });

    let mut bodies = Vec::new();
    for candidate in [wrong.as_str(), "00000000000000000000", "1234", "abcdefghijabcdefghij", &format!(" {space_id}")] {
        let reply = send(&app, post_json("/v1/sessions", None, &json!({ "space_id": candidate }))).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{candidate:?}");
        assert_eq!(reply.code(), "invalid_space", "{candidate:?}");
        bodies.push(reply.body["error"]["message"].clone());
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "one message for every failure: {bodies:?}");
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn session_requests_with_bad_bodies_get_clear_codes(pool: PgPool) {
    let app = app(ctx(pool).await);
    let raw = |content_type: &str, body: &str| {
        Request::post("/v1/sessions").header("content-type", content_type).body(Body::from(body.to_owned())).unwrap()
    };
    for (request, status, code) in [
        (raw("application/json", "{\"space_id\": "), StatusCode::BAD_REQUEST, "invalid_json"),
        (raw("application/json", "{\"space_id\": 12345678901234567890}"), StatusCode::BAD_REQUEST, "invalid_request"),
        (raw("application/json", "{}"), StatusCode::BAD_REQUEST, "invalid_request"),
        (raw("application/json", "{\"space_id\": \"1\", \"extra\": 1}"), StatusCode::BAD_REQUEST, "invalid_request"),
        (raw("text/plain", "{\"space_id\": \"1\"}"), StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
        (
            raw("application/json", &format!("{{\"space_id\": \"{}\"}}", "1".repeat(100_000))),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
    ] {
        let reply = send(&app, request).await;
        assert_eq!((reply.status, reply.code()), (status, code), "{}", reply.body);
    }
    let reply = send(&app, raw("application/json", "{\"space_id\": ")).await;
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("line 1 column"), "the serde position is given: {message}");
}

/// Clients that post and disconnect must not get unbounded parallel Argon2:
/// a cancelled request's blocking hash keeps running, so it must keep its
/// permit until the hash is done.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn argon2_stays_within_its_bound_under_a_flood_of_cancelled_requests(pool: PgPool) {
    let ctx = ctx(pool).await;
    let app = app(ctx.clone());
    // A request arrives every 2 ms and gives up after 5 to 95 ms: most of
    // them long before their hash (tens of milliseconds) is done.
    let mut flood = Vec::new();
    for i in 0..60 {
        let app = app.clone();
        let patience = std::time::Duration::from_millis(5 + (i % 10) * 10);
        flood.push(tokio::spawn(async move {
            let request = post_json("/v1/sessions", None, &json!({ "space_id": "12345678901234567890" }));
            let _ = tokio::time::timeout(patience, send(&app, request)).await;
        }));
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    for request in flood {
        request.await.unwrap();
    }
    // Wait for every hash that was started to run to its end (each holds a
    // permit until then); one patient client makes sure Argon2 ran at all.
    let argon2 = ctx.auth.argon2.clone();
    common::wait_until("every started hash ends", std::time::Duration::from_secs(30), || {
        let argon2 = argon2.clone();
        async move { argon2.busy() == 0 }
    })
    .await;
    let patient = send(&app, post_json("/v1/sessions", None, &json!({ "space_id": "12345678901234567890" }))).await;
    assert_eq!(patient.status, StatusCode::UNAUTHORIZED);
    let (peak, bound) = (ctx.auth.argon2.peak(), ctx.auth.argon2.bound());
    assert!(peak >= 1, "the flood ran some Argon2");
    assert!(peak <= bound, "{peak} Argon2 runs at once, over the bound of {bound}");
}

fn delete_session(token: &str) -> Request<Body> {
    Request::delete("/v1/sessions/current")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap()
}

/// `DELETE /v1/sessions/current` ends the session at once, on every route
/// that takes one, and only that session: another of the same Space goes on.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_session_ended_by_logout_is_refused_at_once_and_the_others_go_on(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (space_id, ended) = new_session(&app).await;
    let other = send(&app, post_json("/v1/sessions", None, &json!({ "space_id": space_id }))).await;
    let other = other.body["token"].as_str().unwrap().to_owned();
    assert_ne!(ended, other);
    assert_eq!(send(&app, get_authed("/v1/space", &ended)).await.status, StatusCode::OK);

    let reply = send(&app, delete_session(&ended)).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM revoked_sessions").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 1);

    // The token still verifies by its signature; the routes refuse it.
    assert!(auth::verify_token(&ctx.settings.token_key, &ended, OffsetDateTime::now_utc()).is_ok());
    let refused = [
        get_authed("/v1/space", &ended),
        get_authed("/v1/tasks", &ended),
        get_authed(&format!("/v1/tasks/{}", reeve_shared::ids::Id::new()), &ended),
        post_json("/v1/uploads", Some(&ended), &json!({"filename": "a.txt", "size": 1, "content_type": "text/plain"})),
        post_json("/v1/tasks/digest", Some(&ended), &json!({})),
        delete_session(&ended),
    ];
    for request in refused {
        let what = format!("{} {}", request.method(), request.uri());
        let reply = send(&app, request).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{what}: {}", reply.body);
        assert_eq!(reply.code(), "invalid_token", "{what}");
    }
    assert_eq!(send(&app, get_authed("/v1/space", &other)).await.status, StatusCode::OK);
    let again = send(&app, post_json("/v1/sessions", None, &json!({ "space_id": space_id }))).await;
    assert_eq!(again.status, StatusCode::OK);
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn logout_needs_a_live_session(pool: PgPool) {
    let app = app(ctx(pool.clone()).await);
    let none = send(&app, Request::delete("/v1/sessions/current").body(Body::empty()).unwrap()).await;
    assert_eq!((none.status, none.code()), (StatusCode::UNAUTHORIZED, "missing_token"));
    let forged = send(&app, delete_session("forged")).await;
    assert_eq!((forged.status, forged.code()), (StatusCode::UNAUTHORIZED, "invalid_token"));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM revoked_sessions").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 0);
}

/// An ended session's row is kept only while its token could still be
/// sent: each new ending deletes rows past their expiry.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn ended_sessions_past_their_expiry_are_forgotten(pool: PgPool) {
    sqlx::query(
        "INSERT INTO revoked_sessions (session_id, space_idx, expires_at)
         VALUES ('\\x000000000000000000000001', '\\x00000000000000000000000000000001', now() - interval '1 second')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let app = app(ctx(pool.clone()).await);
    let (_, token) = new_session(&app).await;
    assert_eq!(send(&app, delete_session(&token)).await.status, StatusCode::NO_CONTENT);
    let left: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT session_id FROM revoked_sessions").fetch_all(&pool).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_ne!(left[0], [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
}

/// A task of the Space `token` belongs to, straight into the table.
async fn task_of(pool: &PgPool, ctx: &reeve_shared::http::Ctx, token: &str) -> reeve_shared::ids::Id {
    let space = auth::verify_token(&ctx.settings.token_key, token, OffsetDateTime::now_utc()).unwrap();
    let id = reeve_shared::ids::Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input) VALUES ($1, $2, 'digest', '{}')")
        .bind(id)
        .bind(space.as_bytes().as_slice())
        .execute(pool)
        .await
        .unwrap();
    id
}

/// `POST /v1/tasks/{id}/ticket` gives a ticket for the Space's own task, good
/// for 60 s, and nothing for another Space's; the ticket is no session.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_stream_ticket_is_for_one_own_task_and_is_no_session(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (_, token) = new_session(&app).await;
    let (_, stranger) = new_session(&app).await;
    let task = task_of(&pool, &ctx, &token).await;
    let ticket_of = |token: &str, task: &str| post_json(&format!("/v1/tasks/{task}/ticket"), Some(token), &json!({}));

    let reply = send(&app, ticket_of(&token, &task.to_string())).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let ticket = reply.body["ticket"].as_str().unwrap().to_owned();
    let expires = OffsetDateTime::parse(reply.body["expires_at"].as_str().unwrap(), &Rfc3339).unwrap();
    let ttl = expires - OffsetDateTime::now_utc();
    assert!(ttl > time::Duration::seconds(55) && ttl <= time::Duration::seconds(60), "{ttl}");
    assert!(auth::verify_ticket(&ctx.settings.token_key, &ticket, task.to_bytes(), OffsetDateTime::now_utc()).is_ok());

    for (what, request, status, code) in [
        ("another Space's task", ticket_of(&stranger, &task.to_string()), StatusCode::NOT_FOUND, "task_not_found"),
        (
            "no task",
            ticket_of(&token, &reeve_shared::ids::Id::new().to_string()),
            StatusCode::NOT_FOUND,
            "task_not_found",
        ),
        ("not a task id", ticket_of(&token, "nope"), StatusCode::NOT_FOUND, "task_not_found"),
        ("a ticket for a ticket", ticket_of(&ticket, &task.to_string()), StatusCode::UNAUTHORIZED, "invalid_token"),
        (
            "the ticket as a bearer token",
            get_authed(&format!("/v1/tasks/{task}"), &ticket),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ),
        (
            "the ticket on another route",
            get(&format!("/v1/tasks/{task}?ticket={ticket}")),
            StatusCode::UNAUTHORIZED,
            "missing_token",
        ),
    ] {
        let reply = send(&app, request).await;
        assert_eq!((reply.status, reply.code()), (status, code), "{what}: {}", reply.body);
    }
}

/// A session token in any query string is `401 token_in_url`, on every
/// route, before its handler: `access_token` whatever its value, any other
/// parameter when it holds a session token.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_session_token_in_a_url_is_refused_everywhere(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (_, token) = new_session(&app).await;
    for uri in [
        format!("/v1/space?access_token={token}"),
        "/v1/space?access_token=anything".to_owned(),
        format!("/v1/tasks?after={token}"),
        format!("/v1/catalog?token={token}"),
        format!("/v1/no-such-route?x={token}"),
    ] {
        let reply = send(&app, get_authed(&uri, &token)).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{uri}: {}", reply.body);
        assert_eq!(reply.code(), "token_in_url", "{uri}");
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("Authorization: Bearer") && message.contains("ticket"), "{message}");
        assert!(!message.contains(&token), "the message never echoes the token");
    }
    // A session token in the header and a harmless query are fine.
    assert_eq!(send(&app, get_authed("/v1/tasks?limit=5", &token)).await.status, StatusCode::OK);
}
