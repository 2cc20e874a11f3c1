//! The whole client journey against the real stack, as a user would take it:
//! space → session → catalog → presign → PUT to S3 → create a digest task →
//! 202, the task is in the queue and its snapshot says `queued`.

use crate::common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{TestQueue, get, get_authed, new_session, post_json, send};
use reeve_shared::http::app;
use reeve_shared::settings;
use serde_json::json;
use sqlx::PgPool;

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_client_uploads_a_file_and_queues_a_digest_of_it(pool: PgPool) {
    let queue = TestQueue::new().await;
    let ctx = common::api(&common::config(&pool).with(settings::QUEUE_URL, &queue.url)).await;
    let app = app(ctx);

    let (_, token) = new_session(&app).await;

    let catalog = send(&app, get("/v1/catalog")).await;
    let digest =
        catalog.body["tasks"].as_array().unwrap().iter().find(|t| t["kind"] == "digest").expect("digest is sold");
    assert_eq!(digest["free"], true);

    let bytes = b"hello, reeve\n".repeat(1000);
    let upload = send(
        &app,
        post_json(
            "/v1/uploads",
            Some(&token),
            &json!({"filename": "hello.txt", "content_type": "text/plain", "size": bytes.len()}),
        ),
    )
    .await;
    assert_eq!(upload.status, StatusCode::CREATED, "{}", upload.body);
    let url = upload.body["url"].as_str().unwrap();
    let put = |body: Vec<u8>| {
        let mut request = reqwest::Client::new().put(url).body(body);
        for (name, value) in upload.body["headers"].as_object().unwrap() {
            if name != "content-length" {
                request = request.header(name, value.as_str().unwrap());
            }
        }
        request.send()
    };

    // A body of another length than declared is refused by S3 itself.
    let wrong = put(bytes[..bytes.len() - 1].to_vec()).await.unwrap();
    assert_eq!(wrong.status(), reqwest::StatusCode::FORBIDDEN);
    let right = put(bytes.clone()).await.unwrap();
    assert_eq!(right.status(), reqwest::StatusCode::OK, "{:?}", right.text().await);

    let created = send(
        &app,
        post_json("/v1/tasks/digest", Some(&token), &json!({"input": {"upload_id": upload.body["upload_id"]}})),
    )
    .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
    let id = created.body["id"].as_str().unwrap();
    assert_eq!(created.body["status"], "queued");
    assert_eq!(created.body["events_url"], format!("/v1/tasks/{id}/events"));

    assert_eq!(queue.drain().await, [json!({"task_id": id, "kind": "digest"})]);

    let snapshot = send(&app, get_authed(&format!("/v1/tasks/{id}"), &token)).await;
    assert_eq!(snapshot.status, StatusCode::OK);
    assert_eq!(snapshot.body["status"], "queued");
    assert_eq!(snapshot.body["kind"], "digest");

    // The request id header is on every answer, success included.
    let reply = send(&app, Request::get("/v1/catalog").body(Body::empty()).unwrap()).await;
    assert!(reply.headers.contains_key("x-request-id"));
    queue.delete().await;
}
