//! The relay binary through the one start-up path: a bad bind address, a
//! bad metrics address, a missing secret and a bad URL are reported together, and it exits 1.

use std::process::Command;

#[test]
fn every_problem_at_once_then_exit_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .env_clear()
        .env("REEVE_RELAY_BIND", "localhost:eighty")
        .env("REEVE_METRICS_BIND", "nine-ninety")
        .env("DATABASE_URL", "mysql:/not-postgres")
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for expected in [
        r#"REEVE_RELAY_BIND must be an address such as 0.0.0.0:8080, got "localhost:eighty""#,
        r#"REEVE_METRICS_BIND must be an address such as 0.0.0.0:8080, got "nine-ninety""#,
        "REEVE_TOKEN_KEY is not set",
        "DATABASE_URL is not a valid Postgres URL",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in:\n{stderr}");
    }
}
