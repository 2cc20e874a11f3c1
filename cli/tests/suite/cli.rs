//! The `reeve` binary as an operator meets it: exit codes and messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::FreshDb;

/// A chain endpoint for every network the shipped catalogs price in (Base
/// mainnet's public one, never reached here), as their start-up insists.
const CHAIN_RPC_URLS: &str = "eip155:8453=https://mainnet.base.org,eip155:84532=http://127.0.0.1:8545";

fn reeve(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reeve"));
    // Run where no `.env` can be picked up, so each test controls the
    // environment it starts with.
    cmd.current_dir(std::env::temp_dir()).args(args).env_remove("RUST_BACKTRACE");
    cmd.env("REEVE_CHAIN_RPC_URLS", CHAIN_RPC_URLS);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("reeve runs")
}

fn repo(path: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path).to_string_lossy().into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn config_check_accepts_both_shipped_catalogs_without_a_warning() {
    for file in ["reeve.toml", "reeve.dev.toml"] {
        let out = reeve(&["config", "check", "--file", &repo(file)], &[]);
        assert!(out.status.success(), "{file}: {}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("ok"), "{stdout}");
        assert!(stdout.contains("tasks"), "a summary is printed: {stdout}");
        assert_eq!(stderr(&out), "", "{file} prices only what it is for");
    }
}

/// `reeve --help` names each command once, each with one sentence (a
/// command whose doc comment had two lines showed both run together), under
/// its group's heading: the client's groups, then the operations.
#[test]
fn help_lists_each_command_once_with_one_sentence() {
    let out = reeve(&["--help"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    let commands: Vec<&str> = help
        .lines()
        .take_while(|l| !l.starts_with("Options:"))
        .filter(|l| l.starts_with("  ") && l.chars().nth(2).is_some_and(|c| c.is_ascii_lowercase()))
        .collect();
    assert!(commands.iter().any(|l| l.trim_start().starts_with("space ")), "{help}");
    let headings: Vec<&str> = help.lines().filter(|l| l.ends_with("):")).collect();
    assert_eq!(headings.len(), 4, "space, upload, task and operations:\n{help}");
    let under = |command: &str, heading: &str| {
        let at = |s: &str| help.find(s).unwrap_or_else(|| panic!("{s:?} missing:\n{help}"));
        let next = headings.iter().map(|h| at(h)).filter(|&h| h > at(heading)).min().unwrap_or(usize::MAX);
        (at(heading)..next).contains(&at(&format!("\n  {command} ")))
    };
    assert!(under("login", "Space (client"), "{help}");
    assert!(under("upload", "Upload (client)"), "{help}");
    assert!(under("task", "Task (client)"), "{help}");
    assert!(under("serve", "Operations (") && under("sweep", "Operations ("), "{help}");
    for line in &commands {
        let about = line.trim_start().split_once(' ').map_or("", |(_, about)| about.trim());
        assert_eq!(about.matches(". ").count(), 0, "one sentence per command: {line}");
    }
    let mut names: Vec<&str> = commands.iter().filter_map(|l| l.split_whitespace().next()).collect();
    let count = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), count, "a command listed twice:\n{help}");
}

/// The client's flags (`--endpoint`, `--relay`, `--profile`, `--json`,
/// `--config-home`) are shown and taken by the client commands, at every
/// level below them, and by no operation: `reeve serve --json` is a usage
/// error that names the flag, not a flag quietly ignored.
#[test]
fn client_flags_belong_to_client_commands_only() {
    const CLIENT_FLAGS: [&str; 5] = ["--endpoint", "--relay", "--profile", "--json", "--config-home"];
    let help = |args: &[&str]| {
        let out = reeve(args, &[]);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for command in
        [&["space"][..], &["space", "create"], &["login"], &["catalog"], &["upload"], &["task"], &["task", "create"]]
    {
        let page = help(&[command, &["--help"][..]].concat());
        for flag in CLIENT_FLAGS {
            assert!(page.contains(flag), "{command:?} --help lacks {flag}:\n{page}");
        }
    }
    for command in [&["serve"][..], &["work"], &["relay"], &["migrate"], &["sweep"], &["config", "check"], &["storage"]]
    {
        let page = help(&[command, &["--help"][..]].concat());
        for flag in CLIENT_FLAGS {
            assert!(!page.contains(flag), "{command:?} --help lists the client's {flag}:\n{page}");
        }
    }
    let out = reeve(&["serve", "--json"], &[]);
    assert_eq!(out.status.code(), Some(4), "a usage error: {}", stderr(&out));
    assert!(stderr(&out).contains("--json"), "{}", stderr(&out));
    let top = help(&["--help"]);
    assert!(!top.contains("--endpoint"), "the top level lists a client flag:\n{top}");
}

/// The production catalog with a Base Sepolia price added, as an operator
/// copying from the development catalog might: still valid, but warned
/// about at that price's TOML path.
#[test]
fn config_check_warns_about_a_testnet_price_in_a_production_catalog() {
    let shipped = std::fs::read_to_string(repo("reeve.toml")).unwrap();
    assert!(shipped.contains("network_kind = \"mainnet\""));
    let with_testnet = format!(
        "{shipped}\n[assets.usdc-base-sepolia]\nnetwork = \"eip155:84532\"\n\
         contract = \"0x036CbD53842c5426634e7929541eC2318f3dCF7e\"\ndecimals = 6\nusd_peg = true\n\
         name = \"USDC\"\nversion = \"2\"\n\n[[tasks.fetch.accepts]]\nasset = \"usdc-base-sepolia\"\n\
         amount_usd = \"0.01\"\n"
    );
    let dir = std::env::temp_dir().join(format!("reeve-cli-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("reeve.toml");
    std::fs::write(&file, with_testnet).unwrap();
    let out = reeve(&["config", "check", "--file", file.to_str().unwrap()], &[]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success(), "a warning, not an error: {}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("warning: "), "{err}");
    assert!(err.contains("tasks.fetch.accepts[1].asset"), "the offending price's path: {err}");
    assert!(err.contains("eip155:84532") && err.contains("testnet"), "{err}");
}

/// The local facilitator (scripts/payments.sh) settles eip155:84532 only.
fn local_facilitator() -> String {
    std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into())
}

/// `--facilitator` asks the facilitator's `GET /supported`: the production
/// catalog (Base mainnet) is refused by the local one, each price at its
/// TOML path; the development catalog passes; a facilitator that does not
/// answer is an error too, since nothing could be told.
#[test]
fn config_check_asks_the_facilitator_whether_it_settles_every_price() {
    let local = local_facilitator();
    let out = reeve(
        &["config", "check", "--facilitator", "--file", &repo("reeve.toml")],
        &[("REEVE_FACILITATOR_URL", &local)],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    for path in ["tasks.fetch.accepts[0]", "tasks.http.accepts[0]"] {
        assert!(err.contains(&format!("reeve.toml: {path}: ")), "missing {path} in:\n{err}");
    }
    assert!(err.contains("eip155:8453") && err.contains("it lists: eip155:84532"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ok"), "a refused catalog is not ok");

    let out = reeve(
        &["config", "check", "--facilitator", "--file", &repo("reeve.dev.toml")],
        &[("REEVE_FACILITATOR_URL", &local)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("settles every price (eip155:84532)"), "{stdout}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let out = reeve(
        &["config", "check", "--facilitator", "--file", &repo("reeve.dev.toml")],
        &[("REEVE_FACILITATOR_URL", &nobody)],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains(&format!("cannot ask {nobody}/supported")), "{}", stderr(&out));
}

/// At start-up `reeve serve` asks too, and names each price it will not
/// offer; it still starts, for the free tasks.
#[test]
fn serve_names_at_start_up_each_price_its_facilitator_does_not_settle() {
    use std::io::{BufRead, BufReader};
    let Ok(database_url) = std::env::var("DATABASE_URL") else {
        panic!("DATABASE_URL: run the tests with scripts/test.sh");
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_reeve"))
        .current_dir(std::env::temp_dir())
        .args(["serve", "--no-worker", "--catalog", &repo("reeve.toml"), "--bind", "127.0.0.1:0"])
        .env("REEVE_FACILITATOR_URL", local_facilitator())
        .env("REEVE_CHAIN_RPC_URLS", CHAIN_RPC_URLS)
        .env("DATABASE_URL", database_url)
        .env("REEVE_LOG_FORMAT", "text")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (sender, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let mut log = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut named = 0;
    while named < 2 && std::time::Instant::now() < deadline {
        let Ok(line) = seen.recv_timeout(std::time::Duration::from_secs(1)) else { continue };
        if line.contains("tasks.fetch.accepts[0]") || line.contains("tasks.http.accepts[0]") {
            assert!(line.contains("eip155:8453") && line.contains("not offered"), "{line}");
            named += 1;
        }
        log.push(line);
    }
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(named, 2, "both prices are named:\n{}", log.join("\n"));
    assert!(still_running, "serve starts anyway:\n{}", log.join("\n"));
}

#[test]
fn config_check_lists_every_mistake_with_its_path_and_exits_1() {
    let out = reeve(&["config", "check", "--file", &repo("shared/tests/fixtures/catalog/three-mistakes.toml")], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("3 problems"), "{err}");
    for path in ["tasks.fetch.accepts[0].asset", "tasks.fetch.accepts[1]", "tasks.convert.executor"] {
        assert!(err.contains(path), "missing {path} in:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// A kind whose timeout, plus the worker's 30 s margin, does not fit in the
/// worker's time limit could never be claimed: refused at its TOML path,
/// as every start-up refuses it. The limit is the worker's Timeout, 360 s
/// as shipped, or what `REEVE_WORKER_TIMEOUT_SECONDS` says.
#[test]
fn config_check_refuses_a_task_timeout_the_worker_cannot_fit_at_its_toml_path() {
    let shipped = std::fs::read_to_string(repo("reeve.toml")).unwrap();
    let long = shipped.replacen("\ntimeout_seconds = 300", "\ntimeout_seconds = 600", 1);
    assert_ne!(long, shipped, "reeve.toml's digest has timeout_seconds = 300");
    let dir = std::env::temp_dir().join(format!("reeve-cli-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("reeve.toml");
    std::fs::write(&file, long).unwrap();
    let check = |env: &[(&str, &str)]| reeve(&["config", "check", "--file", file.to_str().unwrap()], env);

    let out = check(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "tasks.digest.timeout_seconds: 600 s plus the worker's 30 s margin is more than the worker's time limit \
             (360 s, its function's Timeout): at most 330"
        ),
        "{err}"
    );
    // A worker given Lambda's longest Timeout fits it.
    let out = check(&[("REEVE_WORKER_TIMEOUT_SECONDS", "900")]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A limit no Lambda has is a problem of its own.
    let out = check(&[("REEVE_WORKER_TIMEOUT_SECONDS", "3600")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("REEVE_WORKER_TIMEOUT_SECONDS must be an integer from 31 to 900"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_check_reports_a_missing_file_in_one_line() {
    let out = reeve(&["config", "check", "--file", "/nonexistent/reeve.toml"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/reeve.toml"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn config_check_reports_a_syntax_error_with_line_and_column() {
    let dir = std::env::temp_dir().join(format!("reeve-cli-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("reeve.toml");
    std::fs::write(&file, "[uploads]\nmax_bytes = 10\n\n[tasks.digest\ntitle = \"x\"\n").unwrap();
    let out = reeve(&["config", "check", "--file", file.to_str().unwrap()], &[]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(":4:"), "line 4 is named: {err}");
}

const LONG: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn serve_refuses_to_start_with_a_short_secret_and_names_it() {
    let out = reeve(
        &["serve", "--catalog", &repo("reeve.dev.toml"), "--bind", "127.0.0.1:0"],
        &[
            ("REEVE_PEPPER", "too-short"),
            ("REEVE_TOKEN_KEY", LONG),
            ("DATABASE_URL", "postgres://reeve:x@127.0.0.1:1/reeve"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("REEVE_PEPPER must be at least 32 bytes"), "{err}");
    assert!(!err.contains("too-short"), "the secret must not be echoed: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn serve_lists_every_missing_variable_and_a_broken_catalog_together() {
    let out = reeve(
        &["serve", "--catalog", &repo("shared/tests/fixtures/catalog/three-mistakes.toml")],
        &[("REEVE_PEPPER", ""), ("REEVE_TOKEN_KEY", ""), ("DATABASE_URL", ""), ("REDIS_URL", "")],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    for needle in [
        "REEVE_PEPPER is not set",
        "REEVE_TOKEN_KEY is not set",
        "DATABASE_URL is not set",
        "REDIS_URL is not set",
        "tasks.convert.executor",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
}

#[test]
fn serve_names_an_unreachable_postgres_without_its_password() {
    let out = reeve(
        &["serve", "--catalog", &repo("reeve.dev.toml"), "--bind", "127.0.0.1:0"],
        &[
            ("REEVE_PEPPER", LONG),
            ("REEVE_TOKEN_KEY", LONG),
            ("DATABASE_URL", "postgres://reeve:hunter2@127.0.0.1:1/reeve"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("cannot connect to Postgres at 127.0.0.1:1/reeve"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[tokio::test]
async fn migrate_creates_the_schema_and_is_safe_to_run_twice() {
    use sqlx::Connection;
    let db = FreshDb::empty("reeve_cli").await;

    for run in 1..=2 {
        let out = reeve(&["migrate"], &[("DATABASE_URL", &db.url)]);
        assert!(out.status.success(), "run {run}: {}", stderr(&out));
    }
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let applied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success").fetch_one(&mut conn).await.unwrap();
    assert_eq!(applied, reeve_migration_count());
    conn.close().await.unwrap();
    db.drop().await;
}

fn reeve_migration_count() -> i64 {
    std::fs::read_dir(repo("migrations"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "sql"))
        .count() as i64
}

/// A `reeve relay` process, killed on drop.
struct RelayProcess(std::process::Child, String);

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_relay(database_url: &str) -> RelayProcess {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_reeve"))
        .current_dir(std::env::temp_dir())
        .args(["relay", "--bind", &format!("127.0.0.1:{port}")])
        .env("DATABASE_URL", database_url)
        .env("REEVE_TOKEN_KEY", LONG)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return RelayProcess(child, format!("http://127.0.0.1:{port}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("reeve relay did not start");
}

#[tokio::test]
async fn task_watch_follows_a_task_to_its_end_and_exits_with_its_outcome() {
    use reeve_shared::auth::{Secret, SpaceIndex, issue_token};
    use reeve_shared::ids::Id;
    use reeve_shared::tasks::{EventType, append_event};
    use sqlx::Connection;

    let db = FreshDb::migrated("reeve_cli").await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let space = [3u8; 16];
    sqlx::query("INSERT INTO spaces (idx, hash) VALUES ($1, 'x')").bind(space).execute(&mut conn).await.unwrap();
    let mut tasks = Vec::new();
    for outcome in ["completed", "failed", "canceled"] {
        let id = Id::new();
        sqlx::query("INSERT INTO tasks (id, space_idx, kind, input, status) VALUES ($1, $2, 'digest', '{}', $3)")
            .bind(id)
            .bind(space)
            .bind(outcome)
            .execute(&mut conn)
            .await
            .unwrap();
        append_event(&mut conn, id, EventType::Status, &serde_json::json!({"status": "running"})).await.unwrap();
        append_event(&mut conn, id, EventType::Progress, &serde_json::json!({"fraction": 0.5})).await.unwrap();
        append_event(&mut conn, id, EventType::Log, &serde_json::json!({"line": "half way"})).await.unwrap();
        append_event(&mut conn, id, EventType::Status, &serde_json::json!({"status": outcome})).await.unwrap();
        tasks.push((id, outcome));
    }
    let relay = start_relay(&db.url);
    let key = Secret::new("REEVE_TOKEN_KEY", LONG.as_bytes().to_vec()).unwrap();
    let (token, _) = issue_token(&key, &SpaceIndex::from_array(space), time::OffsetDateTime::now_utc());

    for (id, outcome) in tasks {
        let out = reeve(&["task", "watch", &id.to_string(), "--endpoint", &relay.1], &[("REEVE_TOKEN", &token)]);
        let expected = match outcome {
            "completed" => 0,
            "failed" => 1,
            _ => 2,
        };
        assert_eq!(out.status.code(), Some(expected), "{outcome}: {}", stderr(&out));
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(all.contains("half way"), "log lines are printed: {all}");
        assert!(all.contains(outcome), "{all}");
    }

    let out = reeve(&["task", "watch", &Id::new().to_string(), "--endpoint", &relay.1], &[("REEVE_TOKEN", &token)]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("task_not_found"), "the server's code is shown: {}", stderr(&out));

    drop(relay);
    conn.close().await.unwrap();
    db.drop().await;
}

/// The wallet key is a secret: with `REEVE_WALLET_KEY` set, no help page
/// shows its value, and the key typed as an argument (where `ps` and shell
/// history keep it) is refused without being repeated.
#[test]
fn the_wallet_key_is_read_from_the_environment_and_never_shown() {
    const KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
    let env = [("REEVE_WALLET_KEY", KEY)];
    for args in [&["--help"][..], &["task", "--help"], &["task", "create", "--help"], &["task", "create", "-h"]] {
        let out = reeve(args, &env);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let shown = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert!(!shown.contains(KEY), "{args:?} shows the key:\n{shown}");
        if args.starts_with(&["task", "create"]) {
            assert!(shown.contains("REEVE_WALLET_KEY"), "the help names where the key comes from:\n{shown}");
        }
    }
    let typed = "0x1111111111111111111111111111111111111111111111111111111111111111";
    let out = reeve(&["task", "create", "fetch", "--pay", "--wallet-key", typed], &env);
    assert_eq!(out.status.code(), Some(4), "a usage error: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("never an argument") && err.contains("REEVE_WALLET_KEY"), "{err}");
    assert!(!err.contains(typed) && !err.contains(KEY), "{err}");
}

/// The credentials file is `$XDG_CONFIG_HOME/reeve/credentials.toml`
/// (`--config-home` over it), else `$HOME/.config/reeve/credentials.toml`;
/// a blank `XDG_CONFIG_HOME` counts as unset. A file that does not parse
/// is refused by its path, before anything is sent, which shows the path
/// the client chose.
#[test]
fn the_credentials_file_is_under_xdg_config_home_else_home() {
    let dir = std::env::temp_dir().join(format!("reeve-cli-{}", ulid::Ulid::new()));
    let (home, xdg, flag) = (dir.join("home"), dir.join("xdg"), dir.join("flag"));
    for base in [home.join(".config"), xdg.clone(), flag.clone()] {
        std::fs::create_dir_all(base.join("reeve")).unwrap();
        std::fs::write(base.join("reeve/credentials.toml"), "not = [toml").unwrap();
    }
    let refused = |args: &[&str], xdg: Option<&Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_reeve"));
        cmd.current_dir(std::env::temp_dir()).args(args).env("HOME", &home).env_remove("XDG_CONFIG_HOME");
        if let Some(xdg) = xdg {
            cmd.env("XDG_CONFIG_HOME", xdg);
        }
        let out = cmd.output().expect("reeve runs");
        assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
        stderr(&out)
    };
    let named = |err: &str, base: &Path| {
        err.contains(&format!("{} is not a valid", base.join("reeve/credentials.toml").display()))
    };
    let err = refused(&["catalog"], None);
    assert!(named(&err, &home.join(".config")), "{err}");
    let err = refused(&["catalog"], Some(Path::new("")));
    assert!(named(&err, &home.join(".config")), "blank is unset: {err}");
    let err = refused(&["catalog"], Some(&xdg));
    assert!(named(&err, &xdg), "{err}");
    let err = refused(&["catalog", "--config-home", flag.to_str().unwrap()], Some(&xdg));
    assert!(named(&err, &flag), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A kind of `protocol = 1` named `kind`, signing with the secret `secret` names.
fn protocol_kind(kind: &str, secret: &str) -> String {
    format!(
        "\n[tasks.{kind}]\ntitle = \"A service\"\ndescription = \"Speaks the executor protocol.\"\n\
         executor = \"http\"\nendpoint = \"https://service.example/run\"\nprotocol = 1\nsecret = {secret:?}\n\
         [tasks.{kind}.input_schema]\ntype = \"object\"\n"
    )
}

/// Creates a secret holding `value` in the stack's moto (which serves every
/// AWS service on one port): its ARN.
fn stored_secret(moto: &str, value: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(reeve_shared::aws_http::http_client())
            .region(aws_config::Region::new("us-east-1"))
            .endpoint_url(moto)
            .credentials_provider(aws_sdk_secretsmanager::config::Credentials::new("test", "test", None, None, "test"))
            .load()
            .await;
        let client = aws_sdk_secretsmanager::Client::new(&sdk);
        let name = format!("reeve-test/{}", ulid::Ulid::new());
        let created = client.create_secret().name(name).secret_string(value).send().await.expect("moto serves it");
        created.arn().expect("an ARN").to_owned()
    })
}

/// Each kind that speaks the executor protocol signs its jobs with its
/// endpoint's secret, which the worker reads at start-up from the variable
/// or the Secrets Manager ARN its `secret` names. `reeve config check`
/// reads each one the same way, so a secret that is not set, cannot be read
/// or is no `whsec_…` key is found before the deploy: named at its kind's
/// TOML path, beside the catalog's other problems, never with its value,
/// and the check exits 1. Usable ones, by variable or ARN, pass.
#[test]
fn config_check_reads_each_protocol_kind_s_secret_and_names_every_unusable_one_at_its_toml_path() {
    let moto = std::env::var("AWS_ENDPOINT_URL_SQS").expect("the stack's .env is loaded (moto)");
    let key = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let stored = stored_secret(&moto, key);
    let missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:reeve-test/missing-AbCdEf";
    let shipped = std::fs::read_to_string(repo("reeve.toml")).unwrap();
    let usable = format!(
        "{shipped}{}{}",
        protocol_kind("by-variable", "REEVE_TEST_GOOD_SECRET"),
        protocol_kind("by-arn", &stored)
    );
    let unusable = format!(
        "{usable}{}{}{}",
        protocol_kind("unset", "REEVE_TEST_UNSET_SECRET"),
        protocol_kind("garbled", "REEVE_TEST_GARBLED_SECRET"),
        protocol_kind("gone", missing)
    );
    let dir = std::env::temp_dir().join(format!("reeve-cli-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let (usable_file, unusable_file) = (dir.join("usable.toml"), dir.join("unusable.toml"));
    std::fs::write(&usable_file, usable).unwrap();
    std::fs::write(&unusable_file, unusable).unwrap();
    let env = [
        ("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto.as_str()),
        ("REEVE_TEST_GOOD_SECRET", key),
        ("REEVE_TEST_GARBLED_SECRET", "hunter2-not-a-key"),
    ];
    let check = |file: &Path, chains: &str| {
        let mut env = env.to_vec();
        env.push(("REEVE_CHAIN_RPC_URLS", chains));
        reeve(&["config", "check", "--file", file.to_str().unwrap()], &env)
    };

    // Beside another problem: Base mainnet, which the catalog prices on, has no chain endpoint.
    let out = check(&unusable_file, "eip155:84532=http://127.0.0.1:8545");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    for expected in [
        "tasks.unset.secret: the environment variable REEVE_TEST_UNSET_SECRET is not set",
        "tasks.garbled.secret: the value of REEVE_TEST_GARBLED_SECRET is not a Standard Webhooks secret",
        &format!("tasks.gone.secret: cannot read {missing} from Secrets Manager: ResourceNotFoundException"),
        "REEVE_CHAIN_RPC_URLS has no JSON-RPC endpoint for eip155:8453",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    assert!(!err.contains("by-variable") && !err.contains("by-arn"), "usable secrets are no problem:\n{err}");
    assert!(!err.contains("hunter2"), "a secret's value is never shown:\n{err}");

    let out = check(&usable_file, CHAIN_RPC_URLS);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    std::fs::remove_dir_all(&dir).unwrap();
}
