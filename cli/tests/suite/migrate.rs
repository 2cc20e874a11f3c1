//! `reeve migrate`, `migrate --dry-run` and `migrate status` against a real
//! Postgres: each test makes a database of its own and drops it after.

use std::path::PathBuf;
use std::process::{Command, Output};

use sqlx::{Connection, PgConnection};

use crate::common::FreshDb;

fn reeve(args: &[&str], database_url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reeve"))
        // No `.env` here, so the URL below is the only database it knows.
        .current_dir(std::env::temp_dir())
        .args(args)
        .env("DATABASE_URL", database_url)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("reeve runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The migration files shipped in the repository: `(version, description)`.
fn shipped() -> Vec<(i64, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let mut out: Vec<(i64, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| {
            let stem = n.strip_suffix(".sql")?;
            let (v, d) = stem.split_once('_')?;
            Some((v.parse().ok()?, d.replace('_', " ")))
        })
        .collect();
    out.sort();
    out
}

/// A database of the test's own, with what these tests ask of it.
struct Db(FreshDb);

impl std::ops::Deref for Db {
    type Target = FreshDb;
    fn deref(&self) -> &FreshDb {
        &self.0
    }
}

impl Db {
    async fn empty() -> Db {
        Db(FreshDb::empty("reeve_migrate").await)
    }

    async fn migrated() -> Db {
        Db(FreshDb::migrated("reeve_migrate").await)
    }

    async fn exec(&self, sql: &str) {
        let mut conn = PgConnection::connect(&self.url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut conn).await.unwrap();
        conn.close().await.unwrap();
    }

    async fn scalar(&self, sql: &str) -> i64 {
        let mut conn = PgConnection::connect(&self.url).await.unwrap();
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&mut conn).await.unwrap();
        conn.close().await.unwrap();
        n
    }

    async fn drop(self) {
        self.0.drop().await;
    }
}

#[tokio::test]
async fn dry_run_on_an_empty_database_lists_every_migration_and_changes_nothing() {
    let db = Db::empty().await;
    let out = reeve(&["migrate", "--dry-run"], &db.url);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let all = shipped();
    assert!(stdout.contains(&format!("would apply {} migration(s)", all.len())), "{stdout}");
    for (v, d) in &all {
        assert!(
            stdout.contains(&format!("{v:04}  pending")) && stdout.contains(d.as_str()),
            "{v} {d} missing:\n{stdout}"
        );
    }
    // Not even sqlx's bookkeeping table was created.
    assert_eq!(db.scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").await, 0);
    db.drop().await;
}

#[tokio::test]
async fn dry_run_lists_only_what_is_pending_and_nothing_once_up_to_date() {
    let db = Db::migrated().await;
    let out = reeve(&["migrate", "--dry-run"], &db.url);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("nothing to apply"), "{}", text(&out.stdout));

    // Forget the newest migration: it is then the one that would be applied.
    let (last, desc) = shipped().pop().unwrap();
    db.exec(&format!("DELETE FROM _sqlx_migrations WHERE version = {last}")).await;
    let out = reeve(&["migrate", "--dry-run"], &db.url);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("would apply 1 migration(s)"), "{stdout}");
    assert!(stdout.contains(&format!("{last:04}  pending")) && stdout.contains(&desc), "{stdout}");
    assert_eq!(
        db.scalar(&format!("SELECT count(*) FROM _sqlx_migrations WHERE version = {last}")).await,
        0,
        "dry run applied nothing"
    );
    db.drop().await;
}

#[tokio::test]
async fn status_shows_applied_and_pending_with_checksums() {
    let db = Db::migrated().await;
    let (last, _) = shipped().pop().unwrap();
    let checksum: String = {
        let mut conn = PgConnection::connect(&db.url).await.unwrap();
        let sum: Vec<u8> = sqlx::query_scalar("SELECT checksum FROM _sqlx_migrations WHERE version = $1")
            .bind(last)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        sum.iter().map(|b| format!("{b:02x}")).collect()
    };
    db.exec(&format!("DELETE FROM _sqlx_migrations WHERE version = {last}")).await;

    let out = reeve(&["migrate", "status"], &db.url);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "pending alone is not an error: {}", text(&out.stderr));
    let all = shipped();
    for (v, _) in &all[..all.len() - 1] {
        assert!(stdout.contains(&format!("{v:04}  applied")), "{stdout}");
    }
    let pending_line = stdout.lines().find(|l| l.starts_with(&format!("{last:04}"))).unwrap();
    assert!(pending_line.contains("pending"), "{pending_line}");
    assert!(pending_line.contains(&checksum[..16]), "the binary's checksum is shown: {pending_line}");
    assert!(stdout.contains(&format!("{} applied, 1 pending", all.len() - 1)), "{stdout}");
    db.drop().await;
}

#[tokio::test]
async fn status_fails_when_the_database_is_ahead_of_the_binary() {
    let db = Db::migrated().await;
    db.exec("INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (9999, 'from a newer release', true, '\\xdeadbeef', 1)").await;
    let out = reeve(&["migrate", "status"], &db.url);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(stdout.contains("9999  UNKNOWN TO THIS BINARY") && stdout.contains("deadbeef"), "{stdout}");
    assert!(
        stderr.contains("migration 9999 (from a newer release)") && stderr.contains("the database is ahead"),
        "{stderr}"
    );

    // And `reeve migrate` itself refuses, with the same explanation.
    let out = reeve(&["migrate"], &db.url);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("the database is ahead"), "{}", text(&out.stderr));
    db.drop().await;
}

#[tokio::test]
async fn status_and_dry_run_fail_when_a_checksum_differs() {
    let db = Db::migrated().await;
    db.exec("UPDATE _sqlx_migrations SET checksum = '\\x00ff' WHERE version = 1").await;
    for args in [&["migrate", "status"][..], &["migrate", "--dry-run"][..]] {
        let out = reeve(args, &db.url);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("migration 0001") && stderr.contains("different SQL"), "{args:?}: {stderr}");
        assert!(stderr.contains("database: 00ff"), "both checksums are shown: {stderr}");
    }
    let out = reeve(&["migrate", "status"], &db.url);
    assert!(text(&out.stdout).contains("0001  CHECKSUM MISMATCH"), "{}", text(&out.stdout));
    db.drop().await;
}

#[tokio::test]
async fn status_names_an_unreachable_database_without_its_password() {
    let out = reeve(&["migrate", "status"], "postgres://reeve:hunter2@127.0.0.1:1/reeve");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("cannot connect to Postgres at 127.0.0.1:1/reeve"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}
