//! Every metric Reeve records, one small function each, so a call site is
//! one line and the names are written down exactly once.
//!
//! The functions go through the `metrics` facade, so the same names reach
//! whichever exporter the process installed:
//! - `reeve serve`, `reeve work` and `reeve relay` install Prometheus
//!   ([`install_prometheus`]) and answer `GET /metrics` ([`router`]);
//! - a Lambda installs CloudWatch Embedded Metric Format ([`install_emf`],
//!   done by `telemetry::init`): values collect in memory and are written to
//!   stdout as one JSON log line per metric set at the end of a request or a
//!   batch ([`flush`]). CloudWatch Logs turns those lines into metrics, so
//!   nothing is sent over the network from the hot path.
//!
//! With no exporter installed (tests, `reeve config check`) every call is a
//! no-op.
//!
//! Names follow Prometheus conventions (`_total` for counters, `_seconds`
//! for durations); labels are few and bounded: a route template, a status
//! code, a task kind from the catalog, a stable error code.

use std::sync::OnceLock;
use std::time::Duration;

use ::metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
#[cfg(feature = "prometheus")]
use axum::Router;
#[cfg(feature = "prometheus")]
use axum::routing::get;
#[cfg(feature = "prometheus")]
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::Value;

/// The CloudWatch namespace of the EMF lines when `REEVE_METRICS_NAMESPACE`
/// is not set (a Lambda run locally). A deployment sets `Reeve/<Stage>`, the
/// namespace its dashboard and alarms read, so two stages in one account
/// never add up each other's tasks.
pub const DEFAULT_NAMESPACE: &str = "Reeve";

pub const HTTP_REQUESTS: &str = "reeve_http_requests_total";
pub const HTTP_DURATION: &str = "reeve_http_request_duration_seconds";
pub const TASKS_CREATED: &str = "reeve_tasks_created_total";
pub const TASKS_COMPLETED: &str = "reeve_tasks_completed_total";
pub const TASKS_FAILED: &str = "reeve_tasks_failed_total";
pub const TASKS_CANCELED: &str = "reeve_tasks_canceled_total";
/// Every terminal task by `status` alone: the one series a CloudWatch alarm
/// can divide (alarms cannot sum over an unknown set of kinds and codes).
pub const TASKS_FINISHED: &str = "reeve_tasks_finished_total";
pub const TASK_RUN: &str = "reeve_task_run_seconds";
pub const QUEUE_WAIT: &str = "reeve_task_queue_wait_seconds";
pub const SQS_RECEIVED: &str = "reeve_sqs_messages_received_total";
pub const SQS_DELETED: &str = "reeve_sqs_messages_deleted_total";
pub const SWEEPER_ACTIONS: &str = "reeve_sweeper_actions_total";
pub const LEASES_LOST: &str = "reeve_leases_lost_total";
pub const LEASE_RECOVERY: &str = "reeve_lease_recovery_seconds";
pub const PAYMENTS_SETTLED: &str = "reeve_payments_settled_total";
pub const PAYMENTS_FAILED: &str = "reeve_payments_failed_total";
pub const CREDITS_ISSUED: &str = "reeve_credits_issued_total";
pub const CREDITS_SPENT: &str = "reeve_credits_spent_total";
pub const RELAY_WATCHERS: &str = "reeve_relay_watchers";
pub const RELAY_TASKS: &str = "reeve_relay_subscribed_tasks";
pub const RELAY_RESYNCS: &str = "reeve_relay_resyncs_total";
pub const RELAY_RECONNECTS: &str = "reeve_relay_redis_reconnects_total";
pub const RELAY_REDIS_CONNECTED: &str = "reeve_relay_redis_connected";
pub const RELAY_STREAMS_REFUSED: &str = "reeve_relay_streams_refused_total";
pub const ARGON2_IN_FLIGHT: &str = "reeve_argon2_verifies_in_flight";

// ------------------------------------------------------------------ HTTP

/// One answered request. `route` is the matched route template
/// (`/v1/tasks/{task}`), never the raw path, so ids do not become series;
/// the method tells create (`POST`) from snapshot (`GET`) on one template.
pub fn http_request(method: &str, route: &str, status: u16, elapsed: Duration) {
    let (method, route) = (method.to_owned(), route.to_owned());
    counter!(HTTP_REQUESTS, "method" => method.clone(), "route" => route.clone(), "status" => status.to_string())
        .increment(1);
    histogram!(HTTP_DURATION, "method" => method, "route" => route).record(elapsed.as_secs_f64());
}

// ----------------------------------------------------------------- tasks

/// Called for every appended `status` event (`data` is its data); counts
/// the ones that start or end a task. `seq` tells a new task's first
/// `queued` from a requeue's.
pub fn task_status(kind: &str, seq: i64, data: &Value) {
    let kind = kind.to_owned();
    match data.get("status").and_then(Value::as_str) {
        Some("queued") if seq == 1 => counter!(TASKS_CREATED, "kind" => kind).increment(1),
        Some("completed") => {
            counter!(TASKS_COMPLETED, "kind" => kind).increment(1);
            counter!(TASKS_FINISHED, "status" => "completed").increment(1);
        }
        Some("failed") => {
            let code = data.pointer("/error/code").and_then(Value::as_str).unwrap_or("unknown").to_owned();
            counter!(TASKS_FAILED, "kind" => kind, "code" => code).increment(1);
            counter!(TASKS_FINISHED, "status" => "failed").increment(1);
        }
        Some("canceled") => {
            counter!(TASKS_CANCELED, "kind" => kind).increment(1);
            counter!(TASKS_FINISHED, "status" => "canceled").increment(1);
        }
        _ => {}
    }
}

/// How long an executor ran, whatever its outcome.
pub fn task_run(kind: &str, elapsed: Duration) {
    histogram!(TASK_RUN, "kind" => kind.to_owned()).record(elapsed.as_secs_f64());
}

/// From create to the first claim: how long work waited for a worker since
/// `created` (a task id is a ULID minted at create, so it carries the time).
pub fn queue_wait(kind: &str, created: std::time::SystemTime) {
    let waited = created.elapsed().unwrap_or_default();
    histogram!(QUEUE_WAIT, "kind" => kind.to_owned()).record(waited.as_secs_f64());
}

/// A run whose lease lapsed before it ended (its worker died, stalled, or
/// lost Postgres), counted by the claim that took the task over; `ago`,
/// from the lapse to that claim, is how long the task waited for the
/// sweeper and the queue to bring it back.
pub fn lease_lost(kind: &str, ago: Option<Duration>) {
    counter!(LEASES_LOST, "kind" => kind.to_owned()).increment(1);
    if let Some(ago) = ago {
        histogram!(LEASE_RECOVERY, "kind" => kind.to_owned()).record(ago.as_secs_f64());
    }
}

// ------------------------------------------------------------------- SQS

pub fn sqs_received(n: usize) {
    counter!(SQS_RECEIVED).increment(n as u64);
}

pub fn sqs_deleted(n: usize) {
    counter!(SQS_DELETED).increment(n as u64);
}

// --------------------------------------------------------------- sweeper

/// One thing the sweeper did, as a fixed word: `resent_queued` (a queued
/// task's message sent again), `resent_lease_expired` (a running task whose
/// worker's lease ran out), `failed_exhausted` (every attempt used),
/// `send_failed` (the queue refused a resend), `failed_dead_lettered` and
/// `dropped_unreadable` (a dead letter failed its task, or was not a task
/// message); and the payments reconciler's `payment_settled_late`,
/// `payment_credited`, `payment_not_settled`, `payment_still_open` and
/// `chain_error`; and the batch-settlement claimer's `channel_claimed`,
/// `claim_failed`, `claim_shortfall`, `claim_at_risk` and `paid_out`.
pub fn sweeper_action(action: &'static str, n: u64) {
    counter!(SWEEPER_ACTIONS, "action" => action).increment(n);
}

// -------------------------------------------------------------- payments

/// A settled payment, by CAIP-2 network and asset symbol or address.
pub fn payment_settled(network: &str, asset: &str) {
    counter!(PAYMENTS_SETTLED, "network" => network.to_owned(), "asset" => asset.to_owned()).increment(1);
}

/// A payment that did not settle; `reason` is the stable error code the
/// client got (`payment_invalid`, `payment_replayed`, a facilitator reason).
pub fn payment_failed(reason: &str) {
    counter!(PAYMENTS_FAILED, "reason" => reason.to_owned()).increment(1);
}

/// A credit left on a space; `reason` is the error code that earned it
/// (one of the ledger's fixed list) or `canceled`.
pub fn credit_issued(asset: &str, reason: &str) {
    counter!(CREDITS_ISSUED, "asset" => asset.to_owned(), "reason" => reason.to_owned()).increment(1);
}

pub fn credit_spent(asset: &str) {
    counter!(CREDITS_SPENT, "asset" => asset.to_owned()).increment(1);
}

// ----------------------------------------------------------------- relay

/// An SSE client connected (`+1`) or left (`-1`).
pub fn relay_watchers(delta: f64) {
    gauge!(RELAY_WATCHERS).increment(delta);
}

/// Tasks with at least one watcher on this instance, after a change.
pub fn relay_subscribed_tasks(n: usize) {
    gauge!(RELAY_TASKS).set(n as f64);
}

/// A lagging or reconnected client replayed from Postgres.
pub fn relay_resync() {
    counter!(RELAY_RESYNCS).increment(1);
}

/// The hub's Pub/Sub connection was re-established after a loss.
pub fn relay_redis_reconnect() {
    counter!(RELAY_RECONNECTS).increment(1);
}

/// Whether the hub's Pub/Sub connection is up: 0 is the relay's `degraded`.
pub fn relay_redis_connected(up: bool) {
    gauge!(RELAY_REDIS_CONNECTED).set(if up { 1.0 } else { 0.0 });
}

/// A stream refused at a cap: `reason` is `space` or `ip`.
pub fn relay_stream_refused(reason: &'static str) {
    counter!(RELAY_STREAMS_REFUSED, "reason" => reason).increment(1);
}

// ---------------------------------------------------------------- Argon2

/// Argon2 verifies holding a permit now (`+1` on acquire, `-1` on release).
pub fn argon2_in_flight(delta: f64) {
    gauge!(ARGON2_IN_FLIGHT).increment(delta);
}

// -------------------------------------------------------------- exporters

fn describe() {
    describe_counter!(HTTP_REQUESTS, "HTTP requests answered, by method, route template and status");
    describe_histogram!(HTTP_DURATION, Unit::Seconds, "time to answer an HTTP request, by method and route template");
    describe_counter!(TASKS_CREATED, "tasks stored and queued, by kind");
    describe_counter!(TASKS_COMPLETED, "tasks completed, by kind");
    describe_counter!(TASKS_FAILED, "tasks failed, by kind and error code");
    describe_counter!(TASKS_CANCELED, "tasks canceled, by kind");
    describe_counter!(TASKS_FINISHED, "tasks that reached a terminal status, by status");
    describe_histogram!(TASK_RUN, Unit::Seconds, "executor run time, by kind");
    describe_histogram!(QUEUE_WAIT, Unit::Seconds, "time from create to first claim, by kind");
    describe_counter!(SQS_RECEIVED, "SQS messages received by the poller");
    describe_counter!(SQS_DELETED, "SQS messages deleted by the poller after handling");
    describe_counter!(SWEEPER_ACTIONS, "sweeper actions, by action");
    describe_counter!(LEASES_LOST, "runs whose lease lapsed before they ended, by kind (counted at the takeover)");
    describe_histogram!(LEASE_RECOVERY, Unit::Seconds, "time from a lapsed lease to the claim that took over, by kind");
    describe_counter!(PAYMENTS_SETTLED, "payments settled, by network and asset");
    describe_counter!(PAYMENTS_FAILED, "payments refused or not settled, by reason");
    describe_counter!(CREDITS_ISSUED, "credits left on a space, by asset and reason");
    describe_counter!(CREDITS_SPENT, "credits spent instead of a payment, by asset");
    describe_gauge!(RELAY_WATCHERS, "SSE clients connected to this relay");
    describe_gauge!(RELAY_TASKS, "tasks this relay is subscribed to");
    describe_counter!(RELAY_RESYNCS, "clients resynchronised from Postgres");
    describe_counter!(RELAY_RECONNECTS, "Redis Pub/Sub reconnects");
    describe_gauge!(RELAY_REDIS_CONNECTED, "1 while the relay's Pub/Sub connection is up, 0 while it is degraded");
    describe_counter!(RELAY_STREAMS_REFUSED, "streams refused at a cap, by reason (space, ip)");
    describe_gauge!(ARGON2_IN_FLIGHT, "Argon2 verifies running now");
}

#[derive(Debug, thiserror::Error)]
#[error("cannot install the metrics exporter: another recorder is installed")]
pub struct InstallError;

#[cfg(feature = "prometheus")]
static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();
static EMF: OnceLock<&'static metrics_cloudwatch_embedded::Collector> = OnceLock::new();

#[cfg(feature = "prometheus")]
/// Installs the Prometheus recorder for this process and returns its
/// handle. Idempotent, so `reeve serve` and an embedded worker can both ask.
pub fn install_prometheus() -> Result<PrometheusHandle, InstallError> {
    if let Some(handle) = PROMETHEUS.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new().install_recorder().map_err(|_| InstallError)?;
    describe();
    Ok(PROMETHEUS.get_or_init(|| handle).clone())
}

#[cfg(feature = "prometheus")]
/// `GET /metrics` in the Prometheus text format. Merged into `reeve serve`
/// and `reeve relay`, or served on a listener of its own; never part of a
/// Lambda's router, so API Gateway cannot reach it.
pub fn router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                // Histograms keep their samples until upkeep folds them.
                handle.run_upkeep();
                ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render())
            }
        }),
    )
}

#[cfg(feature = "prometheus")]
/// Serves [`router`] alone on `bind` until the process ends: for
/// `reeve work`, which has no other listener, or a `--metrics-bind` that
/// moves `/metrics` off the public address.
pub async fn serve(bind: std::net::SocketAddr, handle: PrometheusHandle) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(bind).await?;
    tracing::info!(%bind, "metrics at /metrics");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(handle)).await {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(())
}

/// Installs the EMF collector writing to `namespace`; `telemetry::init`
/// calls it in Lambda.
///
/// No per-function dimension: a CloudWatch alarm needs the exact dimension
/// set of the series it reads, and a task's failure may be recorded by
/// `task-create` (queue unavailable) or by the worker. The labels are the
/// dimensions; each function's log group still tells them apart.
pub fn install_emf(namespace: &str) -> Result<(), InstallError> {
    if EMF.get().is_some() {
        return Ok(());
    }
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(namespace.to_owned())
        .init()
        .map_err(|_| InstallError)?;
    describe();
    let _ = EMF.set(collector);
    Ok(())
}

/// Writes what EMF collected since the last flush to stdout, where Lambda's
/// log stream picks it up. A no-op outside Lambda. Called once at the end of
/// each request and each SQS batch.
pub fn flush() {
    if let Some(collector) = EMF.get() {
        flush_to(collector, std::io::stdout().lock());
    }
}

fn flush_to(collector: &metrics_cloudwatch_embedded::Collector, mut writer: impl std::io::Write) {
    if let Err(e) = collector.flush(&mut writer).and_then(|()| writer.flush()) {
        tracing::warn!(error = %e, "writing the EMF metrics failed");
    }
}

#[cfg(feature = "prometheus")]
/// Installs Prometheus and puts `GET /metrics` where the operator asked:
/// merged into `routes` (the process's own address) when `elsewhere` is
/// `None`, else on a listener of its own at `elsewhere`.
pub async fn mount(routes: Router, elsewhere: Option<std::net::SocketAddr>) -> Result<Router, MountError> {
    let handle = install_prometheus()?;
    match elsewhere {
        None => Ok(routes.merge(router(handle))),
        Some(bind) => {
            serve(bind, handle).await.map_err(|e| MountError::Bind(bind, e))?;
            Ok(routes)
        }
    }
}

#[cfg(feature = "prometheus")]
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(transparent)]
    Install(#[from] InstallError),
    #[error("cannot listen for /metrics on {0}: {1}")]
    Bind(std::net::SocketAddr, #[source] std::io::Error),
}
