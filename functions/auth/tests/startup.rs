//! A Lambda through the one start-up path: before it ever asks the Lambda
//! runtime for work, every problem of its environment is logged at once and
//! the init fails with exit code 1.

use std::process::Command;

#[test]
fn every_problem_at_once_then_exit_1() {
    let catalog = concat!(env!("CARGO_MANIFEST_DIR"), "/../../reeve.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_auth"))
        .env_clear()
        .env("REEVE_CATALOG", catalog)
        .env("REEVE_PEPPER", "too-short")
        .env("DATABASE_URL", "postgres://reeve@127.0.0.1:5432/reeve")
        .env("REDIS_URL", "not a url")
        .env("REEVE_BUCKET", "b")
        .env("REEVE_QUEUE_URL", "q")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for expected in [
        "REEVE_PEPPER must be at least 32 bytes (got 9)",
        "REEVE_TOKEN_KEY is not set (nor REEVE_TOKEN_KEY_SECRET_ARN",
        "REDIS_URL is not a valid Redis URL",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("too-short"), "the secret's value was logged:\n{stderr}");
}
