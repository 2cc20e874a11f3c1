//! The Postgres pool and the embedded migrations (`migrations/`).

use std::str::FromStr;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// How to reach Postgres at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    /// Connect now and fail at once: the long-lived server.
    Now,
    /// Connect on first use: Lambdas, whose cold start must stay cheap.
    Lazily,
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("DATABASE_URL is not a valid Postgres URL")]
    BadUrl,
    #[error("cannot connect to Postgres at {target} (check DATABASE_URL and that Postgres runs): {cause}")]
    Unreachable { target: String, cause: String },
    #[error("migrating the database failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// `host:port/database`, never the password: this ends up in logs.
fn describe(options: &PgConnectOptions) -> String {
    format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("")
    )
}

fn options(url: &str) -> Result<PgConnectOptions, DbError> {
    // sqlx takes any scheme; a `mysql://` URL is a mistake to report now,
    // not a connection error later.
    let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
    if !matches!(scheme.as_deref(), Some("postgres" | "postgresql")) {
        return Err(DbError::BadUrl);
    }
    PgConnectOptions::from_str(url).map_err(|_| DbError::BadUrl)
}

fn pool_options() -> PgPoolOptions {
    // Lambdas serve one request at a time; a handful of connections is plenty
    // and keeps a scaled-out fleet under Postgres's connection limit.
    PgPoolOptions::new().max_connections(8).acquire_timeout(Duration::from_secs(5))
}

/// Connects now, so a wrong URL or a stopped server fails at start-up with a
/// message that says what to fix.
pub async fn connect(url: &str) -> Result<PgPool, DbError> {
    let options = options(url)?;
    let target = describe(&options);
    pool_options().connect_with(options).await.map_err(|e| DbError::Unreachable {
        target,
        cause: short_cause(&e),
    })
}

/// Connects on first use: for Lambdas, where start-up must stay cheap and a
/// route may not touch the database at all.
pub fn connect_lazy(url: &str) -> Result<PgPool, DbError> {
    Ok(pool_options().connect_lazy_with(options(url)?))
}

/// Connects as `connect` says.
pub async fn open(url: &str, connect: Connect) -> Result<PgPool, DbError> {
    match connect {
        Connect::Now => self::connect(url).await,
        Connect::Lazily => connect_lazy(url),
    }
}

/// Whether `url` is a Postgres URL, without connecting.
pub fn check_url(url: &str) -> Result<(), DbError> {
    options(url).map(|_| ())
}

/// A pool for a process that was given no database (the `catalog`
/// function): it never connects, and a query on it fails as Postgres being
/// out of reach would (`.invalid` never resolves).
pub fn unconfigured() -> PgPool {
    pool_options().connect_lazy_with(PgConnectOptions::new_without_pgpass().host("no-database-configured.invalid"))
}

/// Applies pending migrations; already-applied ones are skipped, so running
/// it twice is safe.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

fn short_cause(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::PoolTimedOut => "timed out".into(),
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    }
}
