//! Helpers the CLI's process tests share: the stack's environment, a
//! database of the test's own, and `reeve` processes that die with the test.
#![allow(dead_code)] // each test binary uses its own part of the harness

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// A path in the repository.
pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// A variable of the stack's `.env`, which the tests need loaded.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests with the stack's .env loaded"))
}

/// `url` pointing at database `name` instead, its query kept.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let base = &base[..base.rfind('/').expect("a database in DATABASE_URL")];
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// `reeve` with the stack's environment, this test's database and queue.
pub fn reeve(db: &str, queue: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reeve"));
    cmd.current_dir(std::env::temp_dir()).env("DATABASE_URL", db).env("REEVE_QUEUE_URL", queue);
    cmd
}

/// A `reeve work` process, killed on drop.
pub struct Worker(pub std::process::Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn json_of(response: reqwest::Response) -> Value {
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}
