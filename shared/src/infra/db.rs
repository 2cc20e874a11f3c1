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
    #[error("reading the applied migrations failed: {}", short_cause(.0))]
    Query(#[from] sqlx::Error),
}

/// `host:port/database`, never the password: this ends up in logs.
fn describe(options: &PgConnectOptions) -> String {
    format!("{}:{}/{}", options.get_host(), options.get_port(), options.get_database().unwrap_or(""))
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

/// A connection used this recently is handed out without a ping first.
/// sqlx pings every connection before handing it out: a round trip before
/// each query, a third of the worker's claim. A connection that just
/// answered is almost surely alive; one that sat idle (a Lambda frozen
/// between invocations, a failover meanwhile) is checked, as HikariCP does
/// with its 500 ms `aliveBypassWindowMs`.
pub const PING_AFTER_IDLE: Duration = Duration::from_millis(500);

fn pool_options() -> PgPoolOptions {
    // Lambdas serve one request at a time; a handful of connections is plenty
    // and keeps a scaled-out fleet under Postgres's connection limit.
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Connects now, so a wrong URL or a stopped server fails at start-up with a
/// message that says what to fix.
pub async fn connect(url: &str) -> Result<PgPool, DbError> {
    let options = options(url)?;
    let target = describe(&options);
    pool_options().connect_with(options).await.map_err(|e| DbError::Unreachable { target, cause: short_cause(&e) })
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

/// Where one migration stands, comparing the database with this binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationState {
    /// Applied, with the checksum this binary has.
    Applied,
    /// In this binary, not yet in the database: `reeve migrate` applies it.
    Pending,
    /// Applied from different SQL than this binary carries: someone edited
    /// a migration after it ran, or the binary is from another branch.
    ChecksumMismatch { applied: String },
    /// Recorded as started but not successful; the schema may be half-changed.
    Failed,
    /// In the database but unknown to this binary: the database is ahead,
    /// so this binary is older than the schema it would run against.
    Unknown,
}

#[derive(Debug, Clone)]
pub struct MigrationEntry {
    pub version: i64,
    pub description: String,
    /// SHA-384 of the SQL as hex: this binary's, or the database's for an
    /// `Unknown` entry.
    pub checksum: String,
    pub state: MigrationState,
}

/// Every migration either side knows, in version order.
#[derive(Debug, Clone)]
pub struct MigrationReport {
    pub entries: Vec<MigrationEntry>,
}

impl MigrationReport {
    pub fn pending(&self) -> impl Iterator<Item = &MigrationEntry> {
        self.entries.iter().filter(|e| e.state == MigrationState::Pending)
    }

    /// Entries that make `reeve migrate` refuse to run and that an operator
    /// must resolve by hand (see docs/operations.md).
    pub fn problems(&self) -> impl Iterator<Item = &MigrationEntry> {
        self.entries.iter().filter(|e| !matches!(e.state, MigrationState::Applied | MigrationState::Pending))
    }

    pub fn is_consistent(&self) -> bool {
        self.problems().next().is_none()
    }
}

/// Compares the migrations in `migrator` with those recorded in the
/// database. Read-only: unlike `Migrator::run` it never creates the
/// bookkeeping table, so it is safe against a database nobody migrated yet.
pub async fn migration_status(pool: &PgPool, migrator: &Migrator) -> Result<MigrationReport, DbError> {
    let table = migrator.table_name.as_ref();
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL").bind(table).fetch_one(pool).await?;
    let applied: Vec<(i64, String, Vec<u8>, bool)> = if exists {
        // The table name is sqlx's own constant, not input.
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT version, description, checksum, success FROM {table} ORDER BY version"
        )))
        .fetch_all(pool)
        .await?
    } else {
        Vec::new()
    };

    let mut entries: Vec<MigrationEntry> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| {
            let checksum = hex::encode(&m.checksum);
            let state = match applied.iter().find(|(v, ..)| *v == m.version) {
                None => MigrationState::Pending,
                Some((.., false)) => MigrationState::Failed,
                Some((_, _, sum, true)) if sum.as_slice() != m.checksum.as_ref() => {
                    MigrationState::ChecksumMismatch { applied: hex::encode(sum) }
                }
                Some(_) => MigrationState::Applied,
            };
            MigrationEntry { version: m.version, description: m.description.to_string(), checksum, state }
        })
        .collect();
    for (version, description, sum, _) in &applied {
        if !migrator.version_exists(*version) {
            entries.push(MigrationEntry {
                version: *version,
                description: description.clone(),
                checksum: hex::encode(sum),
                state: MigrationState::Unknown,
            });
        }
    }
    entries.sort_by_key(|e| e.version);
    Ok(MigrationReport { entries })
}

fn short_cause(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::PoolTimedOut => "timed out".into(),
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    }
}
