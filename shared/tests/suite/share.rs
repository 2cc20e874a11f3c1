//! Share links (issue 39): `POST /v1/tasks/{id}/share` makes a token that
//! gets stream tickets of that one task (`Authorization: Share` on
//! `POST /v1/tasks/{id}/ticket`) for 24 hours, and opens nothing else: not
//! another task, not the Space, not any route that takes a session. The
//! tickets it gets open that task's stream on the relay, and only it.

use crate::common;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::{Reply, get_authed, new_session, post_json, send};
use reeve_shared::auth::{self, Secret, SpaceIndex};
use reeve_shared::http::app;
use reeve_shared::http::stream::router as relay_router;
use reeve_shared::ids::Id;
use reeve_shared::tasks::{EventType, append_event};
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A task of the Space `token` belongs to, straight into the table,
/// finished after two events (so its stream runs to the end).
async fn task_of(pool: &PgPool, token: &str) -> Id {
    let space = auth::verify_token(&key(), token, OffsetDateTime::now_utc()).unwrap();
    let id = Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input, status) VALUES ($1, $2, 'digest', '{}', 'completed')")
        .bind(id)
        .bind(space.as_bytes().as_slice())
        .execute(pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    append_event(&mut conn, id, EventType::Status, &json!({"status": "running"})).await.unwrap();
    append_event(&mut conn, id, EventType::Status, &json!({"status": "completed"})).await.unwrap();
    id
}

fn key() -> Secret {
    Secret::new("REEVE_TOKEN_KEY", common::TOKEN_KEY.as_bytes().to_vec()).unwrap()
}

/// `POST /v1/tasks/{task}/ticket` with `Authorization: <credential>`.
async fn ticket_with(app: &Router, task: &str, credential: &str) -> Reply {
    let request = Request::post(format!("/v1/tasks/{task}/ticket"))
        .header("authorization", credential)
        .body(Body::empty())
        .unwrap();
    send(app, request).await
}

async fn share_of(app: &Router, token: &str, task: Id) -> Reply {
    send(app, post_json(&format!("/v1/tasks/{task}/share"), Some(token), &json!({}))).await
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_share_link_gets_tickets_of_its_one_task_for_a_day_and_opens_nothing_else(pool: PgPool) {
    let ctx = common::ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (space_id, token) = new_session(&app).await;
    let (_, stranger) = new_session(&app).await;
    let (task, other) = (task_of(&pool, &token).await, task_of(&pool, &token).await);

    // The link: a share token for a day, in the fragment of the console's
    // page, and no session token anywhere in it.
    let reply = share_of(&app, &token, task).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let share = reply.body["share"].as_str().unwrap().to_owned();
    assert_eq!(reply.body["url"], format!("/#task={task}&share={share}"));
    assert!(!reply.body.to_string().contains(&token), "the link never carries the session token");
    let expires = OffsetDateTime::parse(reply.body["expires_at"].as_str().unwrap(), &Rfc3339).unwrap();
    let ttl = expires - OffsetDateTime::now_utc();
    assert!(ttl > time::Duration::hours(24) - time::Duration::seconds(5) && ttl <= time::Duration::hours(24), "{ttl}");

    // It gets a ticket of its task, as often as asked, each for 60 s.
    for _ in 0..2 {
        let reply = ticket_with(&app, &task.to_string(), &format!("Share {share}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let ticket = reply.body["ticket"].as_str().unwrap();
        assert!(auth::verify_ticket(&key(), ticket, task.to_bytes(), OffsetDateTime::now_utc()).is_ok());
        let expires = OffsetDateTime::parse(reply.body["expires_at"].as_str().unwrap(), &Rfc3339).unwrap();
        assert!(expires - OffsetDateTime::now_utc() <= auth::TICKET_TTL);
    }
    // The scheme is matched without regard to case, as HTTP's are.
    assert_eq!(ticket_with(&app, &task.to_string(), &format!("share {share}")).await.status, StatusCode::OK);

    // Refused: another task, no task, expired, tampered, another key's, and
    // the wrong kind of pass in the Share scheme.
    let space: SpaceIndex = auth::verify_token(&key(), &token, OffsetDateTime::now_utc()).unwrap();
    let long_ago = OffsetDateTime::now_utc() - auth::SHARE_TTL - time::Duration::seconds(1);
    let expired = auth::issue_share(&key(), &space, task.to_bytes(), long_ago).0;
    let mut bytes = URL_SAFE_NO_PAD.decode(&share).unwrap();
    bytes[20] ^= 1;
    let tampered = URL_SAFE_NO_PAD.encode(&bytes);
    let stranger_key = Secret::new("REEVE_TOKEN_KEY", vec![7; 32]).unwrap();
    let forged = auth::issue_share(&stranger_key, &space, task.to_bytes(), OffsetDateTime::now_utc()).0;
    let ticket = ticket_with(&app, &task.to_string(), &format!("Share {share}")).await.body["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    for (what, on, share) in [
        ("another task of the Space", other.to_string(), share.as_str()),
        ("no task at all", Id::new().to_string(), &share),
        ("not a task id", "nope".to_owned(), &share),
        ("expired", task.to_string(), &expired),
        ("tampered", task.to_string(), &tampered),
        ("signed with another key", task.to_string(), &forged),
        ("a stream ticket", task.to_string(), &ticket),
        ("a session token", task.to_string(), &token),
        ("empty", task.to_string(), ""),
    ] {
        let reply = ticket_with(&app, &on, &format!("Share {share}")).await;
        assert_eq!((reply.status, reply.code()), (StatusCode::UNAUTHORIZED, "invalid_share"), "{what}: {}", reply.body);
        assert!(!reply.body.to_string().contains(&token));
    }

    // Only a session shares: a stranger's, none, or a share token in its place.
    let reply = share_of(&app, &stranger, task).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::NOT_FOUND, "task_not_found"), "{}", reply.body);
    let reply = send(&app, post_json(&format!("/v1/tasks/{task}/share"), None, &json!({}))).await;
    assert_eq!(reply.code(), "missing_token");

    // The share token is no session: every route that takes one refuses it,
    // as a bearer token and in its own scheme alike.
    let routes: Vec<(&str, String, Option<serde_json::Value>)> = vec![
        ("GET", format!("/v1/tasks/{task}"), None),
        ("GET", "/v1/tasks".to_owned(), None),
        ("POST", format!("/v1/tasks/{task}/cancel"), Some(json!({}))),
        ("POST", format!("/v1/tasks/{task}/share"), Some(json!({}))),
        ("GET", "/v1/space".to_owned(), None),
        ("POST", "/v1/space/rotate".to_owned(), Some(json!({ "space_id": space_id }))),
        (
            "POST",
            "/v1/uploads".to_owned(),
            Some(json!({"filename": "a.bin", "size": 1, "content_type": "application/octet-stream"})),
        ),
        ("POST", "/v1/tasks/digest".to_owned(), Some(json!({"input": {}}))),
        ("DELETE", "/v1/sessions/current".to_owned(), None),
        ("GET", format!("/v1/tasks/{task}/webhooks"), None),
    ];
    for (method, uri, body) in routes {
        for credential in [format!("Bearer {share}"), format!("Share {share}")] {
            let mut request = Request::builder().method(method).uri(&uri).header("authorization", &credential);
            let body = match &body {
                Some(body) => {
                    request = request.header("content-type", "application/json");
                    Body::from(body.to_string())
                }
                None => Body::empty(),
            };
            let reply = send(&app, request.body(body).unwrap()).await;
            assert_eq!(
                (reply.status, reply.code()),
                (StatusCode::UNAUTHORIZED, "invalid_token"),
                "{method} {uri} with {credential:.12}…: {}",
                reply.body
            );
        }
    }
    // Nothing was spent or ended: the session still reads its Space.
    assert_eq!(send(&app, get_authed("/v1/space", &token)).await.status, StatusCode::OK);

    // Ending the session that made the link does not end the link: it is
    // meant to outlive a 15-minute session.
    let ended = send(
        &app,
        Request::delete("/v1/sessions/current")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT, "{}", ended.body);
    assert_eq!(ticket_with(&app, &task.to_string(), &format!("Share {share}")).await.status, StatusCode::OK);

    // A rotation of the Space ID ends every link made before it; one made
    // after it works.
    let session = send(&app, post_json("/v1/sessions", None, &json!({ "space_id": space_id }))).await;
    let fresh = session.body["token"].as_str().unwrap().to_owned();
    let rotated = send(&app, post_json("/v1/space/rotate", Some(&fresh), &json!({ "space_id": space_id }))).await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    let reply = ticket_with(&app, &task.to_string(), &format!("Share {share}")).await;
    assert_eq!((reply.status, reply.code()), (StatusCode::UNAUTHORIZED, "invalid_share"), "{}", reply.body);
    let given = rotated.body["token"].as_str().unwrap();
    let after = share_of(&app, given, task).await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.body);
    let reply = ticket_with(&app, &task.to_string(), &format!("Share {}", after.body["share"].as_str().unwrap())).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// What a shared page does: trade the share token for a ticket at the API,
/// then open the stream on the relay with it. The ticket opens that task's
/// stream and no other; the share token itself opens no stream.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_share_link_s_ticket_opens_its_task_s_stream_on_the_relay_and_nothing_else(pool: PgPool) {
    let config = common::config(&pool);
    let app = app(common::api(&config).await);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = format!("http://{}", listener.local_addr().unwrap());
    let service = relay_router(common::relay(&config)).into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });

    let (_, token) = new_session(&app).await;
    let (task, other) = (task_of(&pool, &token).await, task_of(&pool, &token).await);
    let share = share_of(&app, &token, task).await.body["share"].as_str().unwrap().to_owned();
    let reply = ticket_with(&app, &task.to_string(), &format!("Share {share}")).await;
    let ticket = reply.body["ticket"].as_str().unwrap().to_owned();

    let events = |task: &str, ticket: &str| format!("{relay}/v1/tasks/{task}/events?ticket={ticket}");
    let response = reqwest::get(events(&task.to_string(), &ticket)).await.unwrap();
    assert_eq!(response.status(), 200);
    let frames = tokio::time::timeout(std::time::Duration::from_secs(30), common::sse_messages(response))
        .await
        .expect("the stream ends after the terminal status");
    let kinds: Vec<_> = frames.iter().filter_map(|f| f.event.clone()).collect();
    assert_eq!(kinds, ["status", "status"], "the whole stream, to its end");
    assert!(frames.last().unwrap().data.as_deref().unwrap().contains("completed"));

    let client = reqwest::Client::new();
    for (what, request, status, code) in [
        ("the ticket on another task", client.get(events(&other.to_string(), &ticket)), 401, "invalid_ticket"),
        ("the share token as a ticket", client.get(events(&task.to_string(), &share)), 401, "invalid_ticket"),
        (
            "the share token as a bearer token",
            client.get(format!("{relay}/v1/tasks/{task}/events")).bearer_auth(&share),
            401,
            "invalid_token",
        ),
        (
            "the share token in its own scheme",
            client.get(format!("{relay}/v1/tasks/{task}/events")).header("authorization", format!("Share {share}")),
            401,
            "invalid_token",
        ),
    ] {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{what}");
        let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(body["error"]["code"], code, "{what}");
    }
}
