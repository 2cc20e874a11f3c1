//! The relay's page as a watcher in a real browser: headless Chromium loads
//! it with a task and a stream ticket in the fragment (a link that connects
//! once; share links, which renew their tickets, are in tests/console),
//! follows the stream through EventSource, and the page ends showing
//! `completed` with a full progress bar and readable log lines. The whole
//! console, from a file picker to a result, is tests/console (run by
//! scripts/console-test.sh).

use crate::common;

use std::process::Command;

use reeve_shared::auth::{self, SpaceIndex};
use reeve_shared::http::stream::routes;
use reeve_shared::ids::Id;
use reeve_shared::tasks::{EventType, append_event};
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_page_shows_a_task_reach_completed_with_a_full_bar(pool: PgPool) {
    let space = [5u8; 16];
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space).execute(&pool).await.unwrap();
    let task = Id::new();
    sqlx::query("INSERT INTO tasks (id, space_idx, kind, input, status) VALUES ($1, $2, 'digest', '{}', 'completed')")
        .bind(task)
        .bind(space)
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    append_event(&mut conn, task, EventType::Status, &json!({"status": "running"})).await.unwrap();
    for fraction in [0.25, 0.5, 0.75] {
        append_event(&mut conn, task, EventType::Progress, &json!({"fraction": fraction})).await.unwrap();
    }
    append_event(&mut conn, task, EventType::Log, &json!({"line": "hashing done"})).await.unwrap();
    append_event(&mut conn, task, EventType::Status, &json!({"status": "completed"})).await.unwrap();
    drop(conn);

    let ctx = common::relay(&common::config(&pool));
    let now = OffsetDateTime::now_utc();
    let (token, _) = auth::issue_token(&ctx.token_key, &SpaceIndex::from_array(space), now);
    let session = auth::verify_session(&ctx.token_key, &token, now).unwrap();
    let (ticket, _) = auth::issue_ticket(&ctx.token_key, &session, task.to_bytes(), now);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/#task={task}&ticket={ticket}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, routes(ctx)).await.unwrap() });

    let profile = std::env::temp_dir().join(format!("reeve-chromium-{}", Id::new()));
    let dom = tokio::task::spawn_blocking(move || {
        let out = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                &format!("--user-data-dir={}", profile.display()),
                "--virtual-time-budget=10000",
                "--dump-dom",
                &url,
            ])
            .output()
            .expect("chromium is installed by scripts/stack.sh");
        let _ = std::fs::remove_dir_all(&profile);
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap();

    assert!(dom.contains(r#"<span id="status" class="status-completed">completed</span>"#), "{dom}");
    assert!(dom.contains(r#"<progress id="bar" max="1" value="1"></progress>"#), "the bar is full: {dom}");
    assert!(dom.contains(r#"<span id="percent" class="mono">100%</span>"#), "{dom}");
    assert!(dom.contains("#2 progress 25%"), "progress reads as a percentage: {dom}");
    assert!(dom.contains("#5 log hashing done"), "the log shows the events: {dom}");
    assert!(dom.contains("#6 status completed"), "every event is listed: {dom}");
}
