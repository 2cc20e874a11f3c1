//! Rotating a Space ID (issue 39, `POST /v1/space/rotate`), and ended
//! sessions on MCP: the old ID opens nothing from the rotation on, every
//! session issued before it is refused on REST and on `/mcp`, the Space
//! keeps its tasks, and a wrong Space ID in the body changes nothing.

use crate::common;
use crate::lambda_events::through_lambda;
use crate::mcp::sample_event;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{Reply, ctx, get_authed, new_session, post_json, send};
use reeve_shared::auth;
use reeve_shared::http::{Ctx, app};
use reeve_shared::ids::Id;
use reeve_shared::mcp::{self, McpSettings};
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

const ROTATE: &str = "/v1/space/rotate";

async fn rotate(app: &Router, token: &str, space_id: &str) -> Reply {
    send(app, post_json(ROTATE, Some(token), &json!({ "space_id": space_id }))).await
}

async fn login(app: &Router, space_id: &str) -> Reply {
    send(app, post_json("/v1/sessions", None, &json!({ "space_id": space_id }))).await
}

/// A task of the Space `token` belongs to, straight into the table.
async fn task_of(pool: &PgPool, ctx: &Ctx, token: &str) -> Id {
    let space = auth::verify_token(&ctx.settings.token_key, token, OffsetDateTime::now_utc()).unwrap();
    let id = Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input) VALUES ($1, $2, 'digest', '{}')")
        .bind(id)
        .bind(space.as_bytes().as_slice())
        .execute(pool)
        .await
        .unwrap();
    id
}

/// The ids of the tasks `GET /v1/tasks` lists for `token`.
async fn listed(app: &Router, token: &str) -> Vec<String> {
    let reply = send(app, get_authed("/v1/tasks", token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
}

/// The `mcp` Lambda's router beside `ctx`, as its `main` builds it.
fn mcp_router(ctx: &Ctx) -> Router {
    let settings = McpSettings { allowed_hosts: vec![], allowed_origins: vec![], progress: false };
    mcp::router(reeve_shared::startup::mcp_beside(ctx, settings))
}

/// `list_tasks` on `/mcp` with `token`: the tool result.
async fn mcp_list_tasks(mcp: &Router, token: &str) -> Value {
    let event = sample_event("mcp-tools-call-task", Some(token), |params| {
        params["name"] = json!("list_tasks");
        params["arguments"] = json!({});
    });
    let answer = through_lambda(mcp.clone(), &event).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    answer.body["result"].clone()
}

/// A rotation needs the Space's current ID beside the session: another
/// Space's ID, one digit off, a malformed one and none at all are each
/// `403 wrong_space_id`, and nothing changes: the session and the ID go on.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_rotation_with_a_wrong_space_id_is_refused_and_changes_nothing(pool: PgPool) {
    let app = app(ctx(pool.clone()).await);
    let (space_id, token) = new_session(&app).await;
    let (stranger, _) = new_session(&app).await;
    let last = space_id.as_bytes()[19];
    let near = format!("{}{}", &space_id[..19], if last == b'9' { '0' } else { (last + 1) as char });
    let hashes = || sqlx::query_scalar::<_, String>("SELECT hash FROM spaces ORDER BY idx").fetch_all(&pool);
    let before = hashes().await.unwrap();

    let mut messages = Vec::new();
    for wrong in [stranger.as_str(), near.as_str(), "1234", "", &format!(" {space_id}")] {
        let reply = rotate(&app, &token, wrong).await;
        assert_eq!(
            (reply.status, reply.code()),
            (StatusCode::FORBIDDEN, "wrong_space_id"),
            "{wrong:?}: {}",
            reply.body
        );
        assert!(!reply.body["error"]["request_id"].as_str().unwrap().is_empty());
        messages.push(reply.body["error"]["message"].clone());
    }
    assert!(messages.windows(2).all(|w| w[0] == w[1]), "one message for every wrong id: {messages:?}");
    assert_eq!(hashes().await.unwrap(), before, "no Space changed");
    assert_eq!(send(&app, get_authed("/v1/space", &token)).await.status, StatusCode::OK, "the session goes on");
    assert_eq!(login(&app, &space_id).await.status, StatusCode::OK, "the ID goes on");
    assert_eq!(login(&app, &stranger).await.status, StatusCode::OK, "the other Space's ID goes on");

    // A body of the wrong shape, and no session at all.
    let extra = send(&app, post_json(ROTATE, Some(&token), &json!({ "space_id": space_id, "new": "x" }))).await;
    assert_eq!((extra.status, extra.code()), (StatusCode::BAD_REQUEST, "invalid_request"));
    let anonymous = send(&app, post_json(ROTATE, None, &json!({ "space_id": space_id }))).await;
    assert_eq!((anonymous.status, anonymous.code()), (StatusCode::UNAUTHORIZED, "missing_token"));
    assert_eq!(hashes().await.unwrap(), before);
}

/// After a rotation the old ID opens nothing, every session issued before
/// it (the one that asked and another) is refused on every route, and the
/// new ID (and the session the rotation answers) opens the same Space,
/// with its tasks: the Space keeps its row.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn after_a_rotation_the_old_id_and_sessions_are_refused_and_the_new_id_sees_the_tasks(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let app = app(ctx.clone());
    let (old_id, asking) = new_session(&app).await;
    let other = login(&app, &old_id).await.body["token"].as_str().unwrap().to_owned();
    let task = task_of(&pool, &ctx, &asking).await;
    let (_, stranger) = new_session(&app).await;

    let rotated = rotate(&app, &asking, &old_id).await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    let new_id = rotated.body["space_id"].as_str().unwrap().to_owned();
    assert!(new_id.len() == 20 && new_id.bytes().all(|b| b.is_ascii_digit()) && new_id != old_id, "{new_id}");
    assert_eq!(rotated.body["token_type"], "Bearer");
    let given = rotated.body["token"].as_str().unwrap().to_owned();

    // The old ID: as unknown as any other.
    let old = login(&app, &old_id).await;
    assert_eq!((old.status, old.code()), (StatusCode::UNAUTHORIZED, "invalid_space"), "{}", old.body);

    // Every session from before, on every route that takes one.
    for token in [&asking, &other] {
        let refused = [
            get_authed("/v1/space", token),
            get_authed("/v1/tasks", token),
            get_authed(&format!("/v1/tasks/{task}"), token),
            post_json(&format!("/v1/tasks/{task}/ticket"), Some(token), &json!({})),
            post_json(
                "/v1/uploads",
                Some(token),
                &json!({"filename": "a.txt", "size": 1, "content_type": "text/plain"}),
            ),
            post_json("/v1/tasks/digest", Some(token), &json!({})),
            post_json(ROTATE, Some(token), &json!({ "space_id": new_id })),
            Request::delete("/v1/sessions/current")
                .header("authorization", format!("Bearer {token}"))
                .body(Body::empty())
                .unwrap(),
        ];
        for request in refused {
            let what = format!("{} {}", request.method(), request.uri());
            let reply = send(&app, request).await;
            assert_eq!(
                (reply.status, reply.code()),
                (StatusCode::UNAUTHORIZED, "invalid_token"),
                "{what}: {}",
                reply.body
            );
        }
    }
    // Another Space's session is untouched.
    assert_eq!(send(&app, get_authed("/v1/space", &stranger)).await.status, StatusCode::OK);

    // The new ID and the rotation's session open the same Space, tasks and all.
    let fresh = login(&app, &new_id).await;
    assert_eq!(fresh.status, StatusCode::OK, "{}", fresh.body);
    let fresh = fresh.body["token"].as_str().unwrap();
    for token in [given.as_str(), fresh] {
        assert_eq!(listed(&app, token).await, [task.to_string()]);
        assert_eq!(send(&app, get_authed(&format!("/v1/tasks/{task}"), token)).await.status, StatusCode::OK);
    }
    let spaces: Vec<Vec<u8>> = sqlx::query_scalar("SELECT idx FROM spaces").fetch_all(&pool).await.unwrap();
    assert_eq!(spaces.len(), 2, "the Space kept its row; no Space was added");

    // And it can be rotated again, with the new ID only.
    let wrong = rotate(&app, fresh, &old_id).await;
    assert_eq!((wrong.status, wrong.code()), (StatusCode::FORBIDDEN, "wrong_space_id"));
    let again = rotate(&app, fresh, &new_id).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(login(&app, &new_id).await.status, StatusCode::UNAUTHORIZED);
    let third = again.body["space_id"].as_str().unwrap();
    let third = login(&app, third).await;
    assert_eq!(listed(&app, third.body["token"].as_str().unwrap()).await, [task.to_string()]);
}

/// A session opened in the very second of a rotation, after it, is good:
/// sessions are dated from the second after a rotation, never before.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn sessions_opened_right_after_a_rotation_are_good(pool: PgPool) {
    let app = app(ctx(pool).await);
    let (space_id, token) = new_session(&app).await;
    let rotated = rotate(&app, &token, &space_id).await;
    let new_id = rotated.body["space_id"].as_str().unwrap().to_owned();
    let given = rotated.body["token"].as_str().unwrap().to_owned();
    let at_once = login(&app, &new_id).await.body["token"].as_str().unwrap().to_owned();
    for token in [&given, &at_once] {
        assert_eq!(send(&app, get_authed("/v1/space", token)).await.status, StatusCode::OK);
        let ticket = send(&app, post_json(&format!("/v1/tasks/{}/ticket", Id::new()), Some(token), &json!({}))).await;
        assert_eq!(ticket.code(), "task_not_found", "the session is let in: {}", ticket.body);
    }
}

/// `/mcp` refuses an ended session as the REST routes do: one logged out,
/// one issued before a rotation of its Space's ID. Another session goes on.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn mcp_refuses_a_logged_out_or_rotated_session(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let (app, mcp) = (app(ctx.clone()), mcp_router(&ctx));
    let (space_id, live) = new_session(&app).await;
    let logged_out = login(&app, &space_id).await.body["token"].as_str().unwrap().to_owned();
    let task = task_of(&pool, &ctx, &live).await;

    let listed_over_mcp = |result: &Value| {
        assert_ne!(result["isError"], true, "{result}");
        result["structuredContent"]["tasks"].as_array().unwrap().iter().map(|t| t["id"].clone()).collect::<Vec<_>>()
    };
    let refused = |result: &Value, what: &str| {
        assert_eq!(result["isError"], true, "{what}: {result}");
        assert_eq!(result["structuredContent"]["error"]["code"], "invalid_token", "{what}: {result}");
    };
    assert_eq!(listed_over_mcp(&mcp_list_tasks(&mcp, &logged_out).await), [json!(task.to_string())]);

    let ended = send(
        &app,
        Request::delete("/v1/sessions/current")
            .header("authorization", format!("Bearer {logged_out}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT);
    refused(&mcp_list_tasks(&mcp, &logged_out).await, "a logged-out session");
    assert_eq!(listed_over_mcp(&mcp_list_tasks(&mcp, &live).await), [json!(task.to_string())], "the other goes on");

    let rotated = rotate(&app, &live, &space_id).await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    refused(&mcp_list_tasks(&mcp, &live).await, "a session from before the rotation");
    let given = rotated.body["token"].as_str().unwrap();
    assert_eq!(listed_over_mcp(&mcp_list_tasks(&mcp, given).await), [json!(task.to_string())]);
}

/// `rotate_space` over `/mcp` is the REST route's rotation: a wrong current
/// ID is `wrong_space_id` and changes nothing; the right one answers the
/// new ID (shown once) and a session on it, the old ID and the calling
/// session are refused from then on, and the new ID sees the Space's tasks.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn rotate_space_over_mcp_is_the_rest_rotation(pool: PgPool) {
    let ctx = ctx(pool.clone()).await;
    let (app, mcp) = (app(ctx.clone()), mcp_router(&ctx));
    let (space_id, token) = new_session(&app).await;
    let task = task_of(&pool, &ctx, &token).await;
    let call = |space_id: String, token: String| {
        let mcp = mcp.clone();
        async move {
            let event = sample_event("mcp-tools-call-task", Some(&token), |params| {
                params["name"] = json!("rotate_space");
                params["arguments"] = json!({ "space_id": space_id });
            });
            let answer = through_lambda(mcp, &event).await;
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
            answer.body["result"].clone()
        }
    };

    let (other_id, _) = new_session(&app).await;
    let wrong = call(other_id, token.clone()).await;
    assert_eq!(wrong["isError"], true, "{wrong}");
    assert_eq!(wrong["structuredContent"]["error"]["code"], "wrong_space_id", "{wrong}");
    assert_eq!(listed(&app, &token).await, [task.to_string()], "a refused rotation ends nothing");

    let rotated = call(space_id.clone(), token.clone()).await;
    assert_ne!(rotated["isError"], true, "{rotated}");
    let answer = &rotated["structuredContent"];
    let new_id = answer["space_id"].as_str().unwrap();
    assert!(new_id.len() == 20 && new_id != space_id, "{answer}");
    assert_eq!(login(&app, &space_id).await.status, StatusCode::UNAUTHORIZED, "the old ID opens nothing");
    assert_eq!(send(&app, get_authed("/v1/tasks", &token)).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(listed(&app, answer["token"].as_str().unwrap()).await, [task.to_string()]);
    let session = login(&app, new_id).await;
    assert_eq!(session.status, StatusCode::OK, "{}", session.body);
    assert_eq!(listed(&app, session.body["token"].as_str().unwrap()).await, [task.to_string()]);
}
