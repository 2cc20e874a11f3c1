//! `GET /v1/tasks/{task}/events`: the relay's SSE stream. The relay yields
//! domain events; this module makes them SSE frames.
//!
//! EventSource cannot set headers, so the stream opens either with the
//! session token as `Authorization: Bearer`, or with a stream ticket
//! (`?ticket=`, from `POST /v1/tasks/{id}/ticket`): good for this one task,
//! read-only, 60 s to connect. A session token in the URL is `401
//! token_in_url`. The resume point may come as `last_event_id`. Every
//! refusal happens before the stream starts, as an error envelope.

use std::convert::Infallible;
use std::time::Duration;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::response::sse::{self, KeepAlive, Sse};
use axum::routing::get;
use axum::{Extension, Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;

use super::error::{self, ApiError, ApiResult, db_error};
use super::extract::{bearer_token, checked_session};
use super::health::{self, Health};
use crate::domain::auth::{self, SpaceIndex};
use crate::domain::error::TokenRefusal;
use crate::domain::ids::Id;
use crate::domain::relay::{self, Delivery, StreamRefused, TaskPosition};
use crate::domain::sessions;
use crate::domain::tasks::{Event, TaskStatus};
use crate::infra::client_addr::{client_ip, client_key};
use time::OffsetDateTime;

pub use super::relay_context::{RelayContext, RelayCtx, RelayLimits};

/// How long a client should wait before reconnecting (the SSE `retry:` hint).
pub const RETRY_HINT: Duration = Duration::from_secs(2);

fn frame(event: &Event) -> sse::Event {
    sse::Event::default()
        .id(event.seq.to_string())
        .event(event.kind.as_str())
        .json_data(event)
        .expect("events serialise")
}

/// SSE frames for the relay's deliveries: the first carries the `retry:`
/// hint, and an interruption is a bare `retry:` so the client reconnects
/// with its `Last-Event-ID` rather than waiting on a silent stream.
fn frames(
    deliveries: impl futures_util::Stream<Item = Delivery> + Send + 'static,
) -> impl futures_util::Stream<Item = Result<sse::Event, Infallible>> + Send + 'static {
    let mut first = true;
    deliveries.map(move |delivery| {
        Ok(match delivery {
            Delivery::Event(event) => {
                let frame = frame(&event);
                if std::mem::take(&mut first) { frame.retry(RETRY_HINT) } else { frame }
            }
            Delivery::Interrupted => sse::Event::default().retry(RETRY_HINT).comment("interrupted; reconnect"),
        })
    })
}

/// The relay's routes with the error envelope — the event stream and the
/// small watch page at `/` — ready to merge into `reeve serve`'s app.
pub fn routes(ctx: RelayCtx) -> Router {
    Router::new()
        .route("/v1/tasks/{task}/events", get(task_events))
        .route("/", get(watch_page))
        .layer(axum::middleware::from_fn(super::no_token_in_url::refuse))
        .layer(axum::middleware::from_fn(error::envelope))
        .with_state(ctx)
}

/// The relay as its own service: [`routes`] plus `/healthz` for the load
/// balancer.
pub fn router(ctx: RelayCtx) -> Router {
    let health = Router::new()
        .route("/healthz", get(healthz))
        .layer(axum::middleware::from_fn(error::envelope))
        .with_state(ctx.clone());
    routes(ctx).merge(health)
}

/// The load balancer's check: the relay is useless without Postgres
/// (`503`), but without its Redis connection it still serves every stream
/// from Postgres, a few seconds late: `200`, `degraded`, so the relay is kept
/// and its streams with it.
async fn healthz(State(ctx): State<RelayCtx>) -> ApiResult<Json<Health>> {
    let postgres = tokio::time::timeout(HEALTH_TIMEOUT, sqlx::query("SELECT 1").execute(&ctx.db)).await;
    health::answer(matches!(postgres, Ok(Ok(_))), ctx.hub.is_connected())
}

/// Under the load balancer's health check timeout.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

/// The console page, calling the API the relay was configured with.
async fn watch_page(State(ctx): State<RelayCtx>) -> axum::response::Response {
    super::console::page(ctx.api_origin.as_deref())
}

#[derive(Deserialize)]
struct StreamQuery {
    ticket: Option<String>,
    last_event_id: Option<String>,
}

async fn task_events(
    State(ctx): State<RelayCtx>,
    Path(task): Path<String>,
    Query(query): Query<StreamQuery>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, StreamFailure> {
    // A malformed id, a missing task and another space's task look the same.
    let task_id: Option<Id> = task.parse().ok();
    let space = match (bearer_token(&headers)?, query.ticket.as_deref()) {
        (Some(token), _) => checked_session(&ctx.db, &ctx.token_key, token).await?.space,
        (None, Some(ticket)) => {
            let Some(task) = task_id else { return Err(ApiError::task_not_found().into()) };
            checked_ticket(&ctx, ticket, task).await?
        }
        (None, None) => {
            let why = "send Authorization: Bearer <token>, or ?ticket= from POST /v1/tasks/{id}/ticket";
            return Err(ApiError::refused_saying(&TokenRefusal::Missing, why).into());
        }
    };

    let last_header = headers.get("last-event-id").map(|v| v.to_str().unwrap_or("-"));
    let after = match last_header.or(query.last_event_id.as_deref()) {
        None => 0,
        Some(raw) => raw.trim().parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            ApiError::bad_request("invalid_last_event_id", "Last-Event-ID must be a non-negative event number")
        })?,
    };

    let task = task_id.ok_or_else(ApiError::task_not_found)?;

    // The caps come before any read: a refused stream costs no Postgres.
    let ip =
        client_ip(&headers, peer.map(|Extension(ConnectInfo(addr))| addr.ip()), ctx.limits.proxy_hops).map(client_key);
    let slot = ctx.hub.open_stream(ctx.limits.caps, space, ip).map_err(|refused| {
        crate::infra::metrics::relay_stream_refused(refused.label());
        StreamFailure::Refused(refused)
    })?;
    let row: Option<(String, i64)> = {
        let _turn = slot.read_turn().await;
        sqlx::query_as("SELECT status, last_seq FROM tasks WHERE id = $1 AND space_idx = $2")
            .bind(task)
            .bind(space.as_bytes())
            .fetch_optional(&ctx.db)
            .await
            .map_err(db_error)?
    };
    let Some((status, last_seq)) = row else {
        return Err(ApiError::task_not_found().into());
    };
    let position = TaskPosition { last_seq, finished: TaskStatus::parse(&status).is_some_and(TaskStatus::is_terminal) };

    let deliveries = relay::events(ctx.db.clone(), ctx.hub.clone(), slot, task, after, position).await;
    Ok(Sse::new(frames(deliveries)).keep_alive(KeepAlive::new().interval(ctx.keepalive)))
}

/// The Space a stream ticket for `task` opens: signed, for this task, within
/// its 60 s to connect, and from a session that was not ended since.
async fn checked_ticket(ctx: &RelayContext, ticket: &str, task: Id) -> Result<SpaceIndex, ApiError> {
    let now = OffsetDateTime::now_utc();
    let refused = |why: &dyn std::fmt::Display| {
        tracing::debug!(reason = %why, "ticket refused");
        ApiError::refused(&TokenRefusal::Ticket)
    };
    let ticket = auth::verify_ticket(&ctx.token_key, ticket, task.to_bytes(), now).map_err(|e| refused(&e))?;
    if sessions::ticket_is_ended(&ctx.db, &ticket).await.map_err(db_error)? {
        return Err(refused(&"its session was ended"));
    }
    Ok(ticket.space)
}

/// Why a stream did not start: an error envelope, or a cap (`429
/// too_many_streams` with `Retry-After`).
enum StreamFailure {
    Api(ApiError),
    Refused(StreamRefused),
}

impl From<ApiError> for StreamFailure {
    fn from(error: ApiError) -> Self {
        StreamFailure::Api(error)
    }
}

impl IntoResponse for StreamFailure {
    fn into_response(self) -> axum::response::Response {
        match self {
            StreamFailure::Api(error) => error.into_response(),
            StreamFailure::Refused(refused) => {
                let wait = relay::RETRY_AFTER.as_secs();
                let message = format!("{refused} on this relay; close one, or try again in {wait} s");
                let mut response =
                    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_streams", message).into_response();
                response.headers_mut().insert(header::RETRY_AFTER, wait.into());
                response
            }
        }
    }
}
