//! The SSE relay's start-up: its listeners, limits and the run loop the
//! Fargate service and `reeve relay` share.

// The builders share the start-up module's helpers and imports.
use super::*;

// ----------------------------------------------------------------- relay

#[cfg(feature = "relay")]
/// Where the relay listens when `REEVE_RELAY_BIND` is not set: in a
/// container it must listen beyond loopback.
pub const DEFAULT_RELAY_BIND: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8080);

#[cfg(feature = "relay")]
/// Where the relay serves `/metrics` when `REEVE_METRICS_BIND` is not set:
/// loopback, so a relay started by hand shows its metrics to nobody else.
/// The image and the template set `0.0.0.0:9090` for the scraper.
pub const DEFAULT_RELAY_METRICS_BIND: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9090);

#[cfg(feature = "relay")]
/// The relay's two listeners: the SSE routes (behind the load balancer) and
/// Prometheus `/metrics`, which must be on another port, since the load
/// balancer forwards every path of the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayListeners {
    pub relay: SocketAddr,
    pub metrics: SocketAddr,
}

#[cfg(feature = "relay")]
/// Everything the relay process needs: its context, its listeners and the
/// browser origins it answers.
pub struct Relay {
    pub ctx: RelayCtx,
    pub listeners: RelayListeners,
    pub cors: CorsOrigins,
}

#[cfg(feature = "relay")]
/// The relay (the Fargate service and `reeve relay`): Postgres, Redis and
/// the token key, both listen addresses and the CORS origins, every problem
/// of them at once. `REEVE_KEEPALIVE_SECONDS` moves the keep-alive interval,
/// and [`relay_limits`] reads the caps.
/// Its secrets are plain variables: ECS puts their values in its
/// environment.
pub fn relay(config: &Config) -> Result<Relay, StartupError> {
    let mut problems = Vec::new();
    let mut env = config.env();
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.required(settings::DATABASE_URL);
    let redis_url = env.required(settings::REDIS_URL);
    let keepalive = Duration::from_secs(env.number(settings::KEEPALIVE, DEFAULT_KEEPALIVE.as_secs(), 1, 300));
    let api_origin = env.origin(settings::API_ORIGIN);
    let limits = relay_limits(&mut env);
    let relay_bind = env.socket_addr(settings::RELAY_BIND, DEFAULT_RELAY_BIND);
    let metrics_bind = env.socket_addr(settings::METRICS_BIND, DEFAULT_RELAY_METRICS_BIND);
    let cors = settings::cors_origins(&mut env);
    check_urls(&mut problems, config, true);
    problems.extend(env.take_problems());
    if shares_a_port(relay_bind, metrics_bind) {
        problems.push(format!(
            "{} ({metrics_bind}) must not be the relay's port ({relay_bind}): the load balancer forwards every path there",
            settings::METRICS_BIND
        ));
    }
    let (Some(token_key), true) = (token_key, problems.is_empty()) else {
        return Err(StartupError::Config(problems));
    };
    let db = postgres_lazily(config, &database_url)?;
    let ctx = relay_on(db, redis_client::open(&redis_url)?, token_key, keepalive, api_origin, limits);
    Ok(Relay { ctx, listeners: RelayListeners { relay: relay_bind, metrics: metrics_bind }, cors })
}

#[cfg(feature = "relay")]
/// The relay's caps on open streams (`REEVE_RELAY_STREAMS_PER_SPACE`,
/// `REEVE_RELAY_STREAMS_PER_IP`) and how many proxies in front of it append
/// the client's address to `X-Forwarded-For` (`REEVE_TRUSTED_PROXY_HOPS`;
/// the template's load balancer is 1; unset, the TCP peer is the client).
pub(super) fn relay_limits<F: Fn(&str) -> Option<String>>(env: &mut Env<F>) -> RelayLimits {
    let caps = StreamCaps {
        per_space: env.number(settings::RELAY_STREAMS_PER_SPACE, StreamCaps::DEFAULT_PER_SPACE as u64, 1, 1_000_000)
            as usize,
        per_ip: env.number(settings::RELAY_STREAMS_PER_IP, StreamCaps::DEFAULT_PER_IP as u64, 1, 1_000_000) as usize,
    };
    RelayLimits { caps, proxy_hops: env.number(settings::TRUSTED_PROXY_HOPS, 0, 0, 10) as usize }
}

#[cfg(feature = "relay")]
pub(super) fn relay_on(
    db: PgPool,
    redis: redis::Client,
    token_key: Secret,
    keepalive: Duration,
    api_origin: Option<String>,
    limits: RelayLimits,
) -> RelayCtx {
    Arc::new(RelayContext { db, token_key, hub: Hub::start(redis), keepalive, api_origin, limits })
}

#[cfg(feature = "relay")]
/// Whether two listeners would claim the same port on some address.
fn shares_a_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

#[cfg(feature = "relay")]
/// Why a running relay stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Metrics(#[from] crate::infra::metrics::MountError),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("relay stopped: {0}")]
    Serve(std::io::Error),
}

#[cfg(feature = "relay")]
/// Runs the relay until `shutdown` resolves: Prometheus `/metrics` on its
/// own listener, never on the relay's port (the load balancer forwards every
/// path of that port to the internet), then the SSE routes with `/healthz`.
/// The Fargate service and `reeve relay` both run it.
pub async fn run_relay(
    relay: Relay,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RelayError> {
    let Relay { ctx, listeners, cors } = relay;
    let handle = crate::infra::metrics::install_prometheus().map_err(crate::infra::metrics::MountError::from)?;
    crate::infra::metrics::serve(listeners.metrics, handle)
        .await
        .map_err(|e| crate::infra::metrics::MountError::Bind(listeners.metrics, e))?;
    let listener =
        tokio::net::TcpListener::bind(listeners.relay).await.map_err(|e| RelayError::Listen(listeners.relay, e))?;
    tracing::info!(bind = %listeners.relay, "relay serving");
    // The peer address is the client when no proxy is trusted: the
    // per-address stream cap counts by it.
    let service = crate::adapters::http::with_cors(crate::adapters::http::relay_app(ctx), &cors)
        .into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, service).with_graceful_shutdown(shutdown).await.map_err(RelayError::Serve)
}
