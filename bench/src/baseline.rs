//! The baseline the relay is measured against: the relay written the
//! seed's way with one dedicated Redis Pub/Sub connection per client (and
//! one pump task and a 64-frame buffer per client). Same routes, same token
//! check, same Postgres replay, same frames; it exists only to be measured.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{self, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::StreamExt;
use reeve_shared::auth::{self, Secret};
use reeve_shared::ids::Id;
use reeve_shared::relay::{self, is_terminal};
use reeve_shared::tasks::{Event, events_after};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use time::OffsetDateTime;
use tokio::sync::mpsc;

#[derive(clap::Args)]
pub struct Args {}

struct Baseline {
    db: PgPool,
    /// The same `redis-server` at several loopback addresses
    /// (`BENCH_REDIS_URLS`), taken in turn, so that one Pub/Sub connection
    /// per client does not run out of ephemeral ports.
    redis: Vec<redis::Client>,
    next: AtomicUsize,
    key: Secret,
}

pub async fn serve(_: Args) -> anyhow::Result<()> {
    let db = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(&std::env::var("DATABASE_URL")?)?;
    let urls = std::env::var("BENCH_REDIS_URLS").or_else(|_| std::env::var("REDIS_URL"))?;
    let redis = urls.split(',').map(redis::Client::open).collect::<Result<Vec<_>, _>>()?;
    let key = Secret::new("REEVE_TOKEN_KEY", std::env::var("REEVE_TOKEN_KEY")?.into_bytes())?;
    let bind: SocketAddr = std::env::var("REEVE_RELAY_BIND")?.parse().context("REEVE_RELAY_BIND")?;
    let app = Router::new().route("/v1/tasks/{task}/events", get(events)).with_state(Arc::new(Baseline {
        db,
        redis,
        next: AtomicUsize::new(0),
        key,
    }));
    axum::serve(tokio::net::TcpListener::bind(bind).await?, app).await?;
    Ok(())
}

fn frame(event: &Event) -> sse::Event {
    sse::Event::default().id(event.seq.to_string()).event(event.kind.as_str()).json_data(event).expect("serialises")
}

async fn events(State(ctx): State<Arc<Baseline>>, Path(task): Path<String>, headers: HeaderMap) -> Response {
    let token =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let Some(space) = token.and_then(|t| auth::verify_token(&ctx.key, t, OffsetDateTime::now_utc()).ok()) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let Ok(task) = task.parse::<Id>() else { return StatusCode::NOT_FOUND.into_response() };
    let owned: Result<bool, _> =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1 AND space_idx = $2)")
            .bind(task)
            .bind(space.as_bytes())
            .fetch_one(&ctx.db)
            .await;
    if !matches!(owned, Ok(true)) {
        return StatusCode::NOT_FOUND.into_response();
    }
    // The seed's way: a Pub/Sub connection of this client's own.
    let redis = &ctx.redis[ctx.next.fetch_add(1, Ordering::Relaxed) % ctx.redis.len()];
    let Ok(mut pubsub) = redis.get_async_pubsub().await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    if pubsub.subscribe(relay::channel(task)).await.is_err() {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let (tx, rx) = mpsc::channel::<sse::Event>(64);
    let db = ctx.db.clone();
    tokio::spawn(async move {
        let mut last = 0i64;
        let mut replay = true;
        let mut live = pubsub.into_on_message();
        loop {
            if replay {
                let Ok(mut conn) = db.acquire().await else { return };
                let Ok(events) = events_after(&mut conn, task, last).await else { return };
                drop(conn);
                for event in events {
                    last = event.seq;
                    if tx.send(frame(&event)).await.is_err() || is_terminal(&event) {
                        return;
                    }
                }
                replay = false;
            }
            let Some(message) = live.next().await else { return };
            let Ok(event) = serde_json::from_slice::<Event>(message.get_payload_bytes()) else { continue };
            if event.seq <= last {
                continue;
            }
            if event.seq != last + 1 {
                replay = true;
                continue;
            }
            last = event.seq;
            if tx.send(frame(&event)).await.is_err() || is_terminal(&event) {
                return;
            }
        }
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (Ok::<_, Infallible>(frame), rx))
    });
    Sse::new(frames).into_response()
}
