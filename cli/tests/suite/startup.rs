//! `reeve serve` and `reeve work` through the one start-up path: every
//! problem of the catalog and the environment at once, exit code 1.

use std::process::Command;

fn reeve(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reeve"));
    // Where no `.env` is, with nothing inherited but PATH.
    cmd.current_dir(std::env::temp_dir()).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    cmd.args(args).envs(env.iter().copied());
    let out = cmd.output().expect("reeve runs");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn serve_reports_every_problem_once_and_exits_1() {
    let (code, err) = reeve(
        &["serve", "--catalog", "no-such-reeve.toml"],
        &[
            ("DATABASE_URL", "mysql:/not-postgres"),
            ("REDIS_URL", "http://not-redis"),
            ("REEVE_TOKEN_KEY", "short"),
            ("REEVE_BATCH_AUTHORIZER_KEY", "not-a-key"),
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    for expected in [
        "no-such-reeve.toml",
        "REEVE_BATCH_AUTHORIZER_KEY must be 32 bytes as 64 hex digits",
        "REEVE_PEPPER is not set (nor REEVE_PEPPER_SECRET_ARN",
        "REEVE_TOKEN_KEY must be at least 32 bytes",
        "REEVE_BUCKET is not set",
        "REEVE_QUEUE_URL is not set",
        "DATABASE_URL is not a valid Postgres URL",
        "REDIS_URL is not a valid Redis URL",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    // The API's and the relay's builders both find the token key too short:
    // it is reported once.
    assert_eq!(err.matches("REEVE_TOKEN_KEY must be at least 32 bytes").count(), 1, "{err}");
    assert!(!err.contains("short\""), "{err}");
    assert!(!err.contains("not-a-key"), "a key is never shown: {err}");
}

#[test]
fn work_reports_every_problem_and_exits_1() {
    let (code, err) = reeve(
        &["work", "--catalog", "no-such-reeve.toml"],
        &[("REDIS_URL", "redis://127.0.0.1:1"), ("REEVE_OPERATOR_ALLOW", "*.example.com")],
    );
    assert_eq!(code, Some(1), "{err}");
    for expected in
        ["no-such-reeve.toml", "DATABASE_URL is not set", "REEVE_BUCKET is not set", "REEVE_OPERATOR_ALLOW:"]
    {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
}

/// A catalog that prices in a network needs a chain endpoint for it, where
/// every payment on it is proven: without one `reeve serve`, `reeve work`
/// and `reeve config check` refuse it, naming the variable and the network
/// (the development catalog prices on eip155:84532).
#[test]
fn a_priced_network_without_a_chain_endpoint_is_refused_with_the_variable_s_name() {
    let catalog = concat!(env!("CARGO_MANIFEST_DIR"), "/../reeve.dev.toml");
    let wanted = "REEVE_CHAIN_RPC_URLS has no JSON-RPC endpoint for eip155:84532, which tasks.";
    for command in
        [&["serve", "--catalog", catalog][..], &["work", "--catalog", catalog], &["config", "check", "--file", catalog]]
    {
        let (code, err) = reeve(command, &[]);
        assert_eq!(code, Some(1), "{command:?}: {err}");
        assert!(err.contains(wanted), "{command:?}: missing {wanted:?} in:\n{err}");
        assert_eq!(err.matches(wanted).count(), 1, "{command:?}: once, with every price on it:\n{err}");
    }
    let (code, err) = reeve(
        &["config", "check", "--file", catalog],
        &[("REEVE_CHAIN_RPC_URLS", "eip155:84532=http://127.0.0.1:8545")],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = reeve(
        &["config", "check", "--file", catalog],
        &[
            ("REEVE_CHAIN_RPC_URLS", "eip155:84532=http://127.0.0.1:8545"),
            ("REEVE_CHAIN_CONFIRMATIONS", "eip155:8453=3"),
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("REEVE_CHAIN_CONFIRMATIONS: eip155:8453 has no endpoint"), "{err}");
}
