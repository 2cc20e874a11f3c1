//! What every benchmark stands on: a database of its own (created and
//! dropped here), a `redis-server` of its own on a free port (so its
//! connection counts are the relay's alone), and child processes with the
//! open-file limit raised.

use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
// The names are the harness's own (a fixed prefix and the pid), never input.
use sqlx::{AssertSqlSafe, ConnectOptions, PgPool};
use tokio::process::{Child, Command};

/// Raises this process's open-file limit (soft and, as root, hard) so
/// tens of thousands of sockets fit; children inherit it.
pub fn raise_fd_limit(wanted: u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    let raised = libc::rlimit { rlim_cur: wanted, rlim_max: wanted.max(limit.rlim_max) };
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        limit.rlim_cur = limit.rlim_max;
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    }
}

/// This process's open-file limit (soft, after [`raise_fd_limit`]).
pub fn fd_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    limit.rlim_cur
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub async fn wait_for_port(port: u16) -> anyhow::Result<()> {
    wait_for_port_within(port, Duration::from_secs(5)).await
}

pub async fn wait_for_port_within(port: u16, limit: Duration) -> anyhow::Result<()> {
    let tries = limit.as_millis() / 25;
    for _ in 0..tries {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("nothing listens on {port}")
}

/// A database of the benchmark's own, migrated; dropped by [`BenchDb::drop_now`].
pub struct BenchDb {
    admin: PgConnectOptions,
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl BenchDb {
    pub async fn create(tag: &str) -> anyhow::Result<BenchDb> {
        let base = std::env::var("DATABASE_URL").context("DATABASE_URL (source .env)")?;
        let admin = PgConnectOptions::from_str(&base)?;
        let name = format!("reeve_bench_{tag}_{}", std::process::id());
        let mut conn = admin.connect().await?;
        sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}"))).execute(&mut conn).await?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await?;
        let options = admin.clone().database(&name);
        let url = options.to_url_lossy().to_string();
        let pool = PgPoolOptions::new().max_connections(8).connect_with(options).await?;
        reeve_shared::db::MIGRATOR.run(&pool).await?;
        Ok(BenchDb { admin, name, url, pool })
    }

    pub async fn drop_now(self) -> anyhow::Result<()> {
        self.pool.close().await;
        let mut conn = self.admin.connect().await?;
        sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)))
            .execute(&mut conn)
            .await?;
        Ok(())
    }
}

/// The loopback addresses the harness's `redis-server` listens on. The
/// baseline spreads its one-per-client connections over them: each
/// destination address has its own ephemeral-port space, so 10,000 and more
/// Redis connections from one host fit.
const REDIS_ADDRESSES: u8 = 8;

/// A `redis-server` of the benchmark's own.
pub struct OwnRedis {
    pub port: u16,
    child: Child,
}

impl OwnRedis {
    pub async fn start() -> anyhow::Result<OwnRedis> {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .arg("--bind")
            .args((1..=REDIS_ADDRESSES).map(|a| format!("127.0.0.{a}")))
            .args(["--maxclients", "120000"])
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("redis-server (installed by scripts/stack.sh)")?;
        wait_for_port(port).await?;
        Ok(OwnRedis { port, child })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// One URL per listening address, comma-separated.
    pub fn urls(&self) -> String {
        (1..=REDIS_ADDRESSES).map(|a| format!("redis://127.0.0.{a}:{}", self.port)).collect::<Vec<_>>().join(",")
    }

    /// Connections as Redis sees them, without the benchmark's own (named
    /// `bench`): (all, subscribed).
    pub async fn connections(&self) -> anyhow::Result<(usize, usize)> {
        let mut conn = redis::Client::open(self.url())?.get_multiplexed_async_connection().await?;
        let list: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut conn).await?;
        let others: Vec<&str> =
            list.lines().filter(|l| !l.contains("cmd=client") && !l.contains("name=bench")).collect();
        let subscribed = others.iter().filter(|l| l.split(' ').any(|f| f.starts_with("sub=") && f != "sub=0")).count();
        Ok((others.len(), subscribed))
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A `moto_server` of the benchmark's own (the local stack's SQS, started
/// again on a free port): what the benchmark measures is then its own
/// traffic, not every other test run's on the shared one.
pub struct OwnMoto {
    pub url: String,
    child: Child,
}

impl OwnMoto {
    pub async fn start() -> anyhow::Result<OwnMoto> {
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("moto_server (the project virtualenv's, on PATH: scripts/stack.sh installs it)")?;
        wait_for_port_within(port, Duration::from_secs(30)).await?;
        Ok(OwnMoto { url: format!("http://127.0.0.1:{port}"), child })
    }

    /// An SQS client with the SDK configuration every Reeve binary loads
    /// (`startup::sdk`), on this server.
    pub async fn sqs(&self) -> aws_sdk_sqs::Client {
        let sdk = reeve_shared::startup::sdk().await;
        aws_sdk_sqs::Client::from_conf(aws_sdk_sqs::config::Builder::from(&sdk).endpoint_url(&self.url).build())
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

/// One line about the machine for the report.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|k| k.parse::<u64>().ok()))
        .map_or(0, |k| k / 1024 / 1024);
    format!("{cpu}, {cores} cores, {mem} GiB")
}
