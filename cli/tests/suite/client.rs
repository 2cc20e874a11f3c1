//! `reeve` as a client, against a real `reeve serve` process (every route,
//! the relay and a worker) on a database and a queue of the test's own:
//! each command, its `--json` output and its exit code, and the journey a
//! new user takes from a Space to a finished digest.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::Digest as _;

use common::repo;

/// The local chain harness the shared crate's tests use: its locks hold
/// across every test process on the machine.
#[allow(dead_code)]
#[path = "../../../shared/tests/common/chain.rs"]
pub(crate) mod chain;

/// A `reeve serve` of the test's own, with its database, queue and
/// credentials directory; killed and cleaned up on drop.
pub(crate) struct Serve {
    child: Option<Child>,
    pub(crate) endpoint: String,
    pub(crate) home: PathBuf,
    db: Option<common::FreshDb>,
    queue_url: String,
}

impl Serve {
    pub(crate) async fn start(args: &[&str]) -> Serve {
        Self::start_with(args, &[]).await
    }

    /// [`Serve::start`] with extra environment variables for the server.
    async fn start_with(args: &[&str], vars: &[(&str, &str)]) -> Serve {
        Self::start_on(&repo("reeve.dev.toml"), args, vars).await
    }

    /// [`Serve::start_with`] on the catalog at `catalog`.
    pub(crate) async fn start_on(catalog: &Path, args: &[&str], vars: &[(&str, &str)]) -> Serve {
        let db = common::FreshDb::migrated("reeve_client").await;
        let (name, database_url) = (db.name.clone(), db.url.clone());
        let sqs = sqs().await;
        let queue =
            sqs.create_queue().queue_name(format!("reeve-cli-{}", name.replace('_', "-"))).send().await.unwrap();
        let queue_url = queue.queue_url().unwrap().to_owned();
        let home = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&home).unwrap();

        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(home.join("serve.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_reeve"))
            .current_dir(&home)
            .args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--catalog"])
            .arg(catalog)
            .args(args)
            .env("DATABASE_URL", &database_url)
            .env("REEVE_QUEUE_URL", &queue_url)
            // A service kind's reports come back to this server, not to the
            // stack's `reeve serve` that .env names.
            .env("REEVE_REPORT_URL", format!("http://127.0.0.1:{port}/v1/executor/reports"))
            .envs(vars.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let serve =
            Serve { child: Some(child), endpoint: format!("http://127.0.0.1:{port}"), home, db: Some(db), queue_url };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "reeve serve did not start: {}", serve.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        serve
    }

    /// A pool on this server's database.
    pub(crate) async fn pool(&self) -> sqlx::PgPool {
        self.db.as_ref().expect("the server's database").pool().await
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.home.join("serve.log")).unwrap_or_default()
    }

    /// Runs `reeve ARGS` as a client of this server, with its own
    /// credentials directory.
    fn reeve(&self, args: &[&str]) -> Run {
        self.reeve_with(args, &[])
    }

    /// [`Serve::reeve`] with extra environment variables.
    fn reeve_with(&self, args: &[&str], vars: &[(&str, &str)]) -> Run {
        let output = Command::new(env!("CARGO_BIN_EXE_reeve"))
            .current_dir(&self.home)
            .args(args)
            .envs(vars.iter().copied())
            .env("REEVE_ENDPOINT", &self.endpoint)
            .env("XDG_CONFIG_HOME", self.home.join("config"))
            .env_remove("REEVE_TOKEN")
            .env_remove("REEVE_PROFILE")
            .output()
            .unwrap();
        Run(output)
    }

    fn credentials(&self) -> PathBuf {
        self.home.join("config/reeve/credentials.toml")
    }

    /// SIGTERM, then the exit status (within `limit`).
    fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(sent.success());
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("reeve serve did not stop within {limit:?}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(crate) async fn cleanup(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        sqs().await.delete_queue().queue_url(&self.queue_url).send().await.unwrap();
        if let Some(db) = self.db.take() {
            db.drop().await;
        }
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn sqs() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&reeve_shared::startup::sdk().await)
}

struct Run(Output);

impl Run {
    fn code(&self) -> i32 {
        self.0.status.code().expect("exited, not killed")
    }
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.0.stdout)
            .unwrap_or_else(|e| panic!("not one JSON document ({e}): {}", self.stdout()))
    }
    #[track_caller]
    fn expect(&self, code: i32) -> &Self {
        assert_eq!(self.code(), code, "stdout:\n{}\nstderr:\n{}", self.stdout(), self.stderr());
        self
    }
}

fn write_file(dir: &Path, name: &str, len: usize) -> (PathBuf, String) {
    let bytes: Vec<u8> = (0..len).map(|i| (i as u32).wrapping_mul(2654435761).to_be_bytes()[0]).collect();
    let path = dir.join(name);
    std::fs::write(&path, &bytes).unwrap();
    (path, hex::encode(sha2::Sha256::digest(&bytes)))
}

#[tokio::test]
async fn the_first_task_journey_from_a_new_space_to_a_digest() {
    let serve = Serve::start(&[]).await;

    // reeve space create && reeve login && reeve task create digest --file upload_id=FILE --watch
    let created = serve.reeve(&["space", "create"]);
    created.expect(0);
    let space_id = created.stdout().trim().to_owned();
    assert!(space_id.len() == 20 && space_id.bytes().all(|b| b.is_ascii_digit()), "{space_id}");
    let credentials = std::fs::read_to_string(serve.credentials()).unwrap();
    assert!(credentials.contains(&space_id), "the Space ID is kept: {credentials}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(serve.credentials()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the credentials file is the owner's alone");

    serve.reeve(&["login"]).expect(0);
    assert!(std::fs::read_to_string(serve.credentials()).unwrap().contains("token = "));

    let (file, sha256) = write_file(&serve.home, "report.bin", 3 * 1024 * 1024 + 17);
    let run = serve.reeve(&["task", "create", "digest", "--file", &format!("upload_id={}", file.display()), "--watch"]);
    run.expect(0);
    assert!(run.stdout().contains(&sha256), "the SHA-256 is printed: {}", run.stdout());

    // task list --json lists it, completed.
    let list = serve.reeve(&["task", "list", "--json"]);
    list.expect(0);
    let page = list.json();
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1, "{page}");
    let task = &page["tasks"][0];
    assert_eq!((task["kind"].as_str(), task["status"].as_str()), (Some("digest"), Some("completed")));
    assert_eq!(task["result"]["sha256"], sha256.as_str());
    let id = task["id"].as_str().unwrap().to_owned();

    // Canceling a finished task is refused with the server's code: exit 3.
    let cancel = serve.reeve(&["task", "cancel", &id]);
    cancel.expect(3);
    assert!(cancel.stderr().contains("task_finished"), "{}", cancel.stderr());
    let cancel = serve.reeve(&["task", "cancel", &id, "--json"]);
    cancel.expect(3);
    assert_eq!(cancel.json()["error"]["code"], "task_finished");
    // By filter (POST /v1/tasks/cancel): the finished task is matched and
    // left as it is, by the dry run and the real one alike.
    let dry = serve.reeve(&["task", "cancel", "--kind", "digest", "--dry-run", "--json"]);
    dry.expect(0);
    let answer = dry.json();
    assert_eq!(
        (answer["matched"].as_i64(), answer["skipped"].as_i64(), answer["dry_run"].as_bool()),
        (Some(1), Some(1), Some(true))
    );
    let bulk = serve.reeve(&["task", "cancel", "--kind", "digest", "--status", "completed"]);
    bulk.expect(0);
    assert!(
        bulk.stdout().contains("1 matched: 0 canceled, 0 running asked to stop, 1 already ended"),
        "{}",
        bulk.stdout()
    );

    // get, result and watch of the finished task.
    let get = serve.reeve(&["task", "get", &id, "--json"]);
    get.expect(0);
    assert_eq!(get.json()["status"], "completed");
    assert!(serve.reeve(&["task", "get", &id]).expect(0).stdout().contains("completed"));
    let result = serve.reeve(&["task", "result", &id]);
    result.expect(0);
    assert!(result.stdout().contains(&sha256), "{}", result.stdout());
    assert_eq!(serve.reeve(&["task", "result", &id, "--json"]).expect(0).json()["result"]["sha256"], sha256.as_str());
    serve.reeve(&["task", "watch", &id]).expect(0);

    // The human list is a table with the task in it.
    let table = serve.reeve(&["task", "list", "--status", "completed", "--kind", "digest"]);
    table.expect(0);
    assert!(table.stdout().starts_with("ID") && table.stdout().contains(&id), "{}", table.stdout());
    serve.cleanup().await;
}

/// `reeve serve` serves agents too (`POST /mcp`), and there its replies
/// stream: an MCP client (the official Python SDK, tests/mcp/client.py) whose
/// waiting digest carries a `progressToken` gets `notifications/progress`
/// before the result.
#[tokio::test]
async fn an_mcp_client_gets_progress_notifications_from_reeve_serve() {
    let serve = Serve::start(&[]).await;
    // Just over 3 MiB: the digest reports progress at each MiB.
    let (unit, times) = ("0123456789abcdef", 3 * 65536 + 1000);
    let python = std::env::var_os("REEVE_PAYER_PYTHON").map_or_else(|| repo(".venv/bin/python"), PathBuf::from);
    let out = Command::new(&python)
        .arg(repo("tests/mcp/client.py"))
        .arg("progress")
        .env("REEVE_MCP_URL", format!("{}/mcp", serve.endpoint))
        .env("REEVE_MCP_TEXT", unit)
        .env("REEVE_MCP_REPEAT", times.to_string())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "client.py: {}\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr), serve.log());
    let seen: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(seen["put_status"], 200, "{seen}");
    let digest = &seen["digest"]["result"];
    assert_eq!(digest["isError"], false, "{seen}");
    let sha256 = hex::encode(sha2::Sha256::digest(unit.repeat(times).as_bytes()));
    assert_eq!(digest["structuredContent"]["result"]["sha256"], sha256.as_str());
    let progress = seen["progress"].as_array().unwrap();
    let fractions: Vec<f64> = progress.iter().map(|p| p["progress"].as_f64().unwrap()).collect();
    // The worker folds reports that come faster than it writes them, so only
    // the last (1.0) is certain.
    assert!(!fractions.is_empty(), "no notifications/progress: {seen}");
    assert!(fractions.windows(2).all(|w| w[0] < w[1]), "increasing: {fractions:?}");
    assert_eq!(fractions.last(), Some(&1.0));
    assert!(progress.iter().all(|p| p["total"] == 1.0), "{seen}");
    serve.cleanup().await;
}

#[tokio::test]
async fn each_client_command_answers_in_json_and_with_its_exit_code() {
    // No worker: tasks stay queued until canceled.
    let serve = Serve::start(&["--no-worker"]).await;
    serve.reeve(&["space", "create", "--json"]).expect(0);
    let login = serve.reeve(&["login", "--json"]);
    login.expect(0);
    assert!(login.json()["expires_at"].is_string());

    // catalog: a table with free and priced kinds, and the JSON catalog.
    let catalog = serve.reeve(&["catalog"]);
    catalog.expect(0);
    let text = catalog.stdout();
    assert!(text.starts_with("KIND") && text.contains("digest") && text.contains("free"), "{text}");
    assert!(
        text.contains("0.01") && text.contains("10000") && text.contains("priced"),
        "human and atomic prices: {text}"
    );
    assert!(serve.reeve(&["catalog", "--json"]).expect(0).json()["tasks"].is_array());

    // upload: the upload id, or JSON.
    let (file, _) = write_file(&serve.home, "notes.txt", 1000);
    let upload = serve.reeve(&["upload", file.to_str().unwrap()]);
    upload.expect(0);
    assert_eq!(upload.stdout().trim().len(), 26, "{}", upload.stdout());
    let upload = serve.reeve(&["upload", file.to_str().unwrap(), "--json"]);
    let upload_id = upload.expect(0).json()["upload_id"].as_str().unwrap().to_owned();
    assert_eq!(upload.json()["content_type"], "text/plain");

    // task create with --input-json and an idempotency key; a replay is the same task.
    let input = format!("{{\"upload_id\":\"{upload_id}\"}}");
    let create =
        serve.reeve(&["task", "create", "digest", "--input-json", &input, "--idempotency-key", "k1", "--json"]);
    let id = create.expect(0).json()["id"].as_str().unwrap().to_owned();
    assert_eq!(create.json()["status"], "queued");
    let again = serve.reeve(&[
        "task",
        "create",
        "digest",
        "--input",
        &format!("upload_id={upload_id}"),
        "--idempotency-key",
        "k1",
        "--json",
    ]);
    assert_eq!(again.expect(0).json()["id"], id.as_str(), "the same key and input answer the same task");

    // A queued task cancels at once; watching it then ends with exit 2.
    let cancel = serve.reeve(&["task", "cancel", &id, "--json"]);
    assert_eq!(cancel.expect(0).json()["status"], "canceled");
    serve.reeve(&["task", "watch", &id]).expect(2);
    serve.reeve(&["task", "result", &id]).expect(2);
    assert_eq!(serve.reeve(&["task", "get", &id, "--json"]).expect(0).json()["status"], "canceled");

    // A queued task has no result yet: refused, exit 3.
    let queued = serve.reeve(&["task", "create", "digest", "--input", &format!("upload_id={upload_id}")]);
    let queued_id = queued.expect(0).stdout().trim().to_owned();
    assert!(serve.reeve(&["task", "result", &queued_id]).expect(3).stderr().contains("task_not_finished"));

    // list: pages and filters.
    let page = serve.reeve(&["task", "list", "--limit", "1", "--json"]).expect(0).json();
    assert_eq!(page["tasks"][0]["id"], queued_id.as_str(), "newest first");
    let next = page["next"].as_str().unwrap().to_owned();
    let rest = serve.reeve(&["task", "list", "--after", &next, "--json"]).expect(0).json();
    assert_eq!(rest["tasks"][0]["id"], id.as_str());
    assert_eq!(rest["next"], Value::Null);
    let canceled = serve.reeve(&["task", "list", "--status", "canceled", "--json"]).expect(0).json();
    assert_eq!(canceled["tasks"].as_array().unwrap().len(), 1);

    // Refusals by the server: exit 3 with its code.
    let unknown = serve.reeve(&["task", "create", "nope"]);
    assert!(unknown.expect(3).stderr().contains("unknown_task"), "{}", unknown.stderr());
    let invalid = serve.reeve(&["task", "create", "digest", "--input", "upload_id:=5", "--json"]);
    assert_eq!(invalid.expect(3).json()["error"]["code"], "invalid_input");
    let missing = serve.reeve(&["task", "get", "01JNVX5C7D9F1H3K5M7P9R1T3V"]);
    assert!(missing.expect(3).stderr().contains("task_not_found"));

    // A priced task without payment: its requirements as a table, exit 3.
    let priced = serve.reeve(&["task", "create", "fetch", "--input", "url=https://example.com/"]);
    let err = priced.expect(3).stderr();
    for needle in
        ["NETWORK", "eip155:84532", "usdc-base", "0.01", "10000", "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"]
    {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
    let priced = serve.reeve(&["task", "create", "fetch", "--input", "url=https://example.com/", "--json"]);
    let body = priced.expect(3).json();
    assert_eq!(body["error"]["code"], "payment_required");
    assert_eq!(body["error"]["payment_required"]["accepts"].as_array().unwrap().len(), 1, "the local chain's price");

    // Usage errors: exit 4, before anything is sent.
    serve.reeve(&["task", "create", "digest", "--input", "no-equals-sign"]).expect(4);
    serve.reeve(&["task", "create", "digest", "--file", "upload_id=/nonexistent/file"]).expect(4);
    serve.reeve(&["task", "create", "digest", "--input-json", "[1]"]).expect(4);
    serve.reeve(&["task", "get", "not-an-id"]).expect(4);
    serve.reeve(&["task", "list", "--limit", "500"]).expect(4);
    serve.reeve(&["task", "list", "--status", "paused"]).expect(4);
    serve.reeve(&["frobnicate"]).expect(4);
    serve.reeve(&["--help"]).expect(0);

    // An expired cached token is renewed by itself.
    let credentials = std::fs::read_to_string(serve.credentials()).unwrap();
    let expired = credentials
        .lines()
        .map(|l| {
            if l.starts_with("token_expires_at") {
                "token_expires_at = \"2020-01-01T00:00:00Z\"".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(serve.credentials(), expired).unwrap();
    serve.reeve(&["task", "list"]).expect(0);
    let renewed = std::fs::read_to_string(serve.credentials()).unwrap();
    // A session opened within the same second as the first one has the same
    // expiry, hence the same token: what must change is the cached expiry.
    assert!(
        renewed.contains("token = ") && !renewed.contains("2020-01-01T00:00:00Z"),
        "a fresh session is cached: {renewed}"
    );
    // A token the server refuses is renewed too.
    let forged = renewed
        .lines()
        .map(|l| if l.starts_with("token = ") { "token = \"forged\"".to_owned() } else { l.to_owned() })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(serve.credentials(), forged).unwrap();
    serve.reeve(&["task", "list"]).expect(0);

    // A second profile on the same endpoint keeps its own Space.
    serve.reeve(&["space", "create", "--profile", "other"]).expect(0);
    let others = serve.reeve(&["task", "list", "--profile", "other", "--json"]).expect(0).json();
    assert_eq!(others["tasks"].as_array().unwrap().len(), 0);
    serve.cleanup().await;
}

/// `reeve logout` ends the session on the server at once (issue 39): its
/// token is refused from then on, not at its expiry; the credentials file
/// forgets it and keeps the Space ID, so the next command logs in again.
#[tokio::test(flavor = "multi_thread")]
async fn logout_ends_the_session_on_the_server_and_keeps_the_space() {
    let serve = Serve::start(&["--no-worker"]).await;
    serve.reeve(&["space", "create"]).expect(0);
    serve.reeve(&["login"]).expect(0);
    let cached = |serve: &Serve| -> toml::Value {
        let file: toml::Value = toml::from_str(&std::fs::read_to_string(serve.credentials()).unwrap()).unwrap();
        file["profiles"][serve.endpoint.as_str()].clone()
    };
    let token = cached(&serve)["token"].as_str().unwrap().to_owned();
    let space_id = cached(&serve)["space_id"].as_str().unwrap().to_owned();
    let space = |token: &str| {
        reqwest::Client::new().get(format!("{}/v1/space", serve.endpoint)).bearer_auth(token.to_owned()).send()
    };
    assert_eq!(space(&token).await.unwrap().status(), 200);

    assert_eq!(serve.reeve(&["logout", "--json"]).expect(0).json()["ended"], true);
    assert_eq!(space(&token).await.unwrap().status(), 401, "the ended token is refused at once");
    let profile = cached(&serve);
    assert!(profile.get("token").is_none(), "the token is forgotten: {profile}");
    assert_eq!(profile["space_id"].as_str(), Some(space_id.as_str()));

    // Nothing left to end: no request, still a success.
    assert_eq!(serve.reeve(&["logout", "--json"]).expect(0).json()["ended"], false);
    // The next command opens a new session on the same Space.
    serve.reeve(&["space", "--json"]).expect(0);
    let renewed = cached(&serve)["token"].as_str().unwrap().to_owned();
    assert_ne!(renewed, token);
    serve.cleanup().await;
}

/// `reeve space rotate` gives the Space a new ID (issue 39): printed once,
/// kept in the credentials file with the session the answer carries, so the
/// next command goes on without a login; the old ID and the session from
/// before are refused at once, and the Space's tasks stay with it.
#[tokio::test(flavor = "multi_thread")]
async fn space_rotate_keeps_the_new_id_and_ends_the_old_one() {
    let serve = Serve::start(&["--no-worker"]).await;
    serve.reeve(&["space", "create"]).expect(0);
    let cached = |serve: &Serve| -> toml::Value {
        let file: toml::Value = toml::from_str(&std::fs::read_to_string(serve.credentials()).unwrap()).unwrap();
        file["profiles"][serve.endpoint.as_str()].clone()
    };
    let (file, _) = write_file(&serve.home, "data.bin", 64);
    let created =
        serve.reeve(&["task", "create", "digest", "--file", &format!("upload_id={}", file.display()), "--json"]);
    let task = created.expect(0).json()["id"].as_str().unwrap().to_owned();
    let old_id = cached(&serve)["space_id"].as_str().unwrap().to_owned();
    let old_token = cached(&serve)["token"].as_str().unwrap().to_owned();

    let rotated = serve.reeve(&["space", "rotate", "--json"]).expect(0).json();
    let new_id = rotated["space_id"].as_str().unwrap().to_owned();
    assert!(new_id.len() == 20 && new_id != old_id, "{rotated}");
    let profile = cached(&serve);
    assert_eq!(profile["space_id"].as_str(), Some(new_id.as_str()), "the file keeps the new ID: {profile}");
    assert_ne!(profile["token"].as_str(), Some(old_token.as_str()), "and the rotation's session");

    let http = reqwest::Client::new();
    let old_session = http.get(format!("{}/v1/space", serve.endpoint)).bearer_auth(&old_token).send().await.unwrap();
    assert_eq!(old_session.status(), 401, "the session from before is refused at once");
    let old_login = http
        .post(format!("{}/v1/sessions", serve.endpoint))
        .json(&serde_json::json!({ "space_id": old_id }))
        .send()
        .await
        .unwrap();
    assert_eq!(old_login.status(), 401, "the old ID opens nothing");

    // The same Space, with its task, on the new ID's session and after a new login.
    let listed = serve.reeve(&["task", "list", "--json"]).expect(0).json();
    assert_eq!(listed["tasks"][0]["id"], task.as_str(), "{listed}");
    serve.reeve(&["logout"]).expect(0);
    let listed = serve.reeve(&["task", "list", "--json"]).expect(0).json();
    assert_eq!(listed["tasks"][0]["id"], task.as_str(), "{listed}");

    // Human output: the new ID alone on stdout.
    let again = serve.reeve(&["space", "rotate"]);
    let printed = again.expect(0).stdout().trim().to_owned();
    assert_eq!(cached(&serve)["space_id"].as_str(), Some(printed.as_str()));
    serve.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_endpoint_exits_5_and_no_space_exits_4() {
    let home = std::env::temp_dir().join(format!("reeve-client-{}", ulid::Ulid::new()));
    let run = |args: &[&str]| {
        Run(Command::new(env!("CARGO_BIN_EXE_reeve"))
            .current_dir(std::env::temp_dir())
            .args(args)
            .env("XDG_CONFIG_HOME", &home)
            .env_remove("REEVE_ENDPOINT")
            .output()
            .unwrap())
    };
    let down = run(&["catalog", "--endpoint", "http://127.0.0.1:1"]);
    assert!(down.expect(5).stderr().contains("cannot reach http://127.0.0.1:1"), "{}", down.stderr());
    assert_eq!(
        run(&["space", "create", "--endpoint", "http://127.0.0.1:1", "--json"]).expect(5).json()["error"]["code"],
        "unreachable"
    );
    let no_space = run(&["login", "--endpoint", "http://127.0.0.1:1"]);
    assert!(no_space.expect(4).stderr().contains("reeve space create"), "{}", no_space.stderr());
    run(&["catalog", "--endpoint", "ftp://example.com"]).expect(4);
    let _ = std::fs::remove_dir_all(&home);
}

#[tokio::test]
async fn serve_stops_on_sigterm_after_finishing_what_it_is_doing() {
    let mut serve = Serve::start(&[]).await;
    serve.reeve(&["space", "create"]).expect(0);
    let (file, sha256) = write_file(&serve.home, "data.bin", 1024);
    let run = serve.reeve(&["task", "create", "digest", "--file", &format!("upload_id={}", file.display()), "--watch"]);
    assert!(run.expect(0).stdout().contains(&sha256));
    // The worker is in its long poll now; stopping waits for it, no longer.
    let started = Instant::now();
    let status = serve.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}: {}", serve.log());
    assert!(started.elapsed() < Duration::from_secs(12), "stopped in {:?}", started.elapsed());
    serve.cleanup().await;
}

#[tokio::test]
async fn serve_stops_on_sigterm_even_while_someone_watches_a_queued_task() {
    // No worker: the task stays queued, so its event stream never ends.
    let mut serve = Serve::start(&["--no-worker"]).await;
    serve.reeve(&["space", "create"]).expect(0);
    let (file, _) = write_file(&serve.home, "data.bin", 1024);
    let created = serve.reeve(&["task", "create", "digest", "--file", &format!("upload_id={}", file.display())]);
    let id = created.expect(0).stdout().trim().to_owned();
    let mut watcher = Command::new(env!("CARGO_BIN_EXE_reeve"))
        .current_dir(&serve.home)
        .args(["task", "watch", &id])
        .env("REEVE_ENDPOINT", &serve.endpoint)
        .env("XDG_CONFIG_HOME", serve.home.join("config"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(watcher.try_wait().unwrap().is_none(), "the watcher is following the task");

    let started = Instant::now();
    let status = serve.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status:?}: {}", serve.log());
    assert!(started.elapsed() < Duration::from_secs(8), "stopped in {:?}", started.elapsed());
    let _ = watcher.kill();
    let _ = watcher.wait();
    serve.cleanup().await;
}

/// anvil's well-known account 3, funded with test tokens by the stack.
const PAYER_KEY: &str = "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6";

#[tokio::test]
async fn a_priced_task_is_paid_with_pay_and_the_payment_shows_in_reeve_space() {
    let _chain = chain::ChainLock::shared().await;
    let serve = Serve::start(&["--no-worker"]).await;
    serve.reeve(&["space", "create"]).expect(0);
    let create = ["task", "create", "fetch", "--input", "url=https://example.com/"];

    // Without --pay: the requirements, exit 3, no task.
    let refused = serve.reeve(&create);
    assert!(refused.expect(3).stderr().contains("eip155:84532"), "{}", refused.stderr());
    // --pay without a key is a usage error, and nothing is paid.
    let pay: Vec<&str> = create.iter().copied().chain(["--pay", "--json"]).collect();
    let no_key = serve.reeve_with(&pay, &[("REEVE_WALLET_KEY", "")]);
    assert!(no_key.expect(4).stdout().contains("REEVE_WALLET_KEY"), "{}", no_key.stdout());

    // With the key: signed, verified and settled on the local chain; queued.
    let paid = serve.reeve_with(&pay, &[("REEVE_WALLET_KEY", PAYER_KEY)]);
    let task = paid.expect(0).json();
    assert_eq!(task["status"], "queued", "{task}");

    let space = serve.reeve(&["space", "--json"]).expect(0).json();
    let payments = space["payments"].as_array().unwrap();
    assert_eq!(payments.len(), 1, "{space}");
    assert_eq!(payments[0]["task_id"], task["id"]);
    assert_eq!(payments[0]["amount"], "10000");
    assert_eq!(payments[0]["network"], "eip155:84532");
    assert!(payments[0]["transaction"].as_str().is_some_and(|t| t.starts_with("0x")), "{space}");
    // The settlement receipt the create printed is the same transaction.
    assert_eq!(task["payment"]["success"], true, "{task}");
    assert_eq!(task["payment"]["transaction"], payments[0]["transaction"], "{task}");
    assert_eq!(task["payment"]["network"], "eip155:84532", "{task}");
    let shown = serve.reeve(&["space"]).expect(0).stdout();
    assert!(shown.contains("PAYMENTS") && shown.contains(task["id"].as_str().unwrap()), "{shown}");
    serve.cleanup().await;
}

/// A metered task (the development catalog's `fetch-metered`): `--pay` signs
/// its ceiling through Permit2, and, the payer never having approved
/// Permit2, the token's permit the 402 offers; nothing is charged at create,
/// and a task canceled before it ran releases its authorization.
#[tokio::test]
async fn a_metered_task_is_authorized_with_pay_and_released_when_canceled() {
    let chain = chain::ChainLock::shared().await;
    let payer = chain::Payer::new(&chain, 1_000_000).await;
    let serve = Serve::start(&["--no-worker"]).await;
    serve.reeve(&["space", "create"]).expect(0);
    let create = ["task", "create", "fetch-metered", "--input", "url=https://example.com/", "--pay", "--json"];
    let paid = serve.reeve_with(&create, &[("REEVE_WALLET_KEY", payer.key.as_str())]);
    let task = paid.expect(0).json();
    assert_eq!(task["status"], "queued", "{task}");
    assert_eq!(task["payment"]["status"], "authorized", "{task}");
    assert_eq!(task["payment"]["authorized"], "100000", "the ceiling, 0.10: {task}");
    assert_eq!(chain::balance(&payer.address).await, 1_000_000, "nothing charged at create");

    let id = task["id"].as_str().unwrap();
    serve.reeve(&["task", "cancel", id]).expect(0);
    let shown = serve.reeve(&["task", "get", id, "--json"]).expect(0).json();
    assert_eq!(
        (&shown["status"], &shown["payment"]["status"]),
        (&serde_json::json!("canceled"), &serde_json::json!("released")),
        "{shown}"
    );
    assert_eq!(chain::balance(&payer.address).await, 1_000_000, "nothing charged");
    serve.cleanup().await;
}

/// `--pay --channel`: tasks paid by x402 batch settlement over the payer's
/// one channel. The first create knows nothing of the channel, so its blind
/// voucher is answered with the channel as Reeve keeps it (empty), and it
/// deposits the offer's minimum (ten prices) with its voucher; every later
/// one is a voucher alone, with no transaction and nothing more taken from
/// the payer. A lost record is learnt again from Reeve's `402`, with no
/// second deposit and no task paid twice. `reeve payments refund` takes back
/// what was not charged. A kind offered no other way than `exact` is a usage
/// error with --channel.
#[tokio::test]
async fn tasks_are_paid_over_one_channel_one_deposit_then_vouchers() {
    const PRICE: u128 = 1_000;
    let chain = chain::ChainLock::shared().await;
    let payer = chain::Payer::new(&chain, 50_000).await;
    let dev = std::fs::read_to_string(repo("reeve.dev.toml")).unwrap();
    // The receiver authorizer's key: the server signs the refund with it.
    let authorizer_key = format!("0x{}", "42".repeat(32));
    let authorizer = alloy_signer::utils::public_key_to_address(
        alloy_signer::k256::ecdsa::SigningKey::from_slice(&[0x42; 32]).unwrap().verifying_key(),
    );
    let catalog = dev.replacen(
        "[payments]\n",
        &format!("[payments]\nbatch_receiver_authorizer = \"{authorizer:#x}\"\nbatch_withdraw_delay_seconds = 900\n"),
        1,
    ) + &format!(
        "\n[tasks.job]\ntitle = \"Job\"\ndescription = \"Paid by batch settlement\"\nexecutor = \"fetch\"\n\
         input_schema = {{ type = \"object\" }}\n[[tasks.job.accepts]]\nasset = \"usdc-base-sepolia\"\n\
         scheme = \"batch\"\namount = \"{PRICE}\"\n"
    );
    let dir = std::env::temp_dir().join(format!("reeve-channel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let catalog_file = dir.join("catalog.toml");
    std::fs::write(&catalog_file, catalog).unwrap();
    let serve =
        Serve::start_on(&catalog_file, &["--no-worker"], &[("REEVE_BATCH_AUTHORIZER_KEY", &authorizer_key)]).await;
    serve.reeve(&["space", "create"]).expect(0);
    let key = [("REEVE_WALLET_KEY", payer.key.as_str())];
    let create = |n: &str| {
        let input = format!("n={n}");
        serve.reeve_with(&["task", "create", "job", "--input", &input, "--pay", "--channel", "--json"], &key)
    };

    let first = create("1").expect(0).json();
    assert_eq!(first["status"], "queued", "{first}");
    assert!(first["payment"]["transaction"].as_str().is_some_and(|t| t.starts_with("0x")), "the deposit: {first}");
    assert_eq!(chain::balance(&payer.address).await, 50_000 - 10 * PRICE, "one deposit of ten prices");
    let channel = first["payment"]["channel"].as_str().unwrap().to_owned();
    let record = serve.home.join(format!("config/reeve/channels/eip155-84532/{channel}.json"));
    let kept = || -> Value { serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap() };
    assert_eq!((kept()["charged"].clone(), kept()["balance"].clone()), ("1000".into(), "10000".into()));

    let second = create("2").expect(0).json();
    assert_eq!(second["status"], "queued", "{second}");
    assert_eq!(second["payment"]["transaction"], "", "a voucher alone: {second}");
    assert_eq!(second["payment"]["channel"], channel.as_str());
    assert_eq!(kept()["charged"], "2000");

    std::fs::remove_file(&record).unwrap();
    let third = create("3").expect(0).json();
    assert_eq!(third["payment"]["transaction"], "", "learnt again, no second deposit: {third}");
    assert_eq!(kept()["charged"], "3000");
    assert_eq!(chain::balance(&payer.address).await, 50_000 - 10 * PRICE, "nothing more taken from the payer");

    let pool = serve.pool().await;
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(tasks, 3, "one task per payment");
    let charged: String = sqlx::query_scalar("SELECT charged::TEXT FROM batch_channels WHERE channel_id = $1")
        .bind(&channel)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(charged, "3000");

    // `reeve payments refund`: what was not charged comes back at once,
    // Reeve keeping the three prices it charged.
    let refund = ["payments", "refund", "job", "--json"];
    let refunded = serve.reeve_with(&refund, &key).expect(0).json();
    assert_eq!(refunded["refundedAmount"], "7000", "{refunded}");
    assert_eq!(refunded["channel"], channel.as_str());
    assert!(refunded["transaction"].as_str().is_some_and(|t| t.starts_with("0x")), "{refunded}");
    assert_eq!(chain::balance(&payer.address).await, 50_000 - 3 * PRICE, "the rest is the payer's again");
    assert_eq!((kept()["charged"].clone(), kept()["balance"].clone()), ("3000".into(), "3000".into()));
    // Asked again alike, it is the same refund, answered again: never two.
    let again = serve.reeve_with(&refund, &key).expect(0).json();
    assert_eq!(
        (&again["transaction"], &again["refundedAmount"]),
        (&refunded["transaction"], &refunded["refundedAmount"])
    );
    assert_eq!(chain::balance(&payer.address).await, 50_000 - 3 * PRICE, "nothing more moved");

    let exact_only = serve.reeve_with(
        &["task", "create", "fetch", "--input", "url=https://example.com/", "--pay", "--channel", "--json"],
        &key,
    );
    assert!(exact_only.expect(4).stdout().contains("offers no batch-settlement payment"), "{}", exact_only.stdout());
    serve.cleanup().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// `cargo lambda watch` serving examples/wordfreq on a free loopback port
/// (the development catalog's `wordfreq` kinds), in a process group of its
/// own, ended with the test: as scripts/dev.sh runs it.
struct Watch {
    url: String,
    child: Child,
}

impl Watch {
    fn start() -> Watch {
        use std::os::unix::process::CommandExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("cargo")
            // The whole workspace, as the README's loop runs it, not `-p
            // wordfreq`: selected alone, wordfreq's dependencies resolve
            // other features, and watch rebuilt them beside the tests.
            .args(["lambda", "watch", "-A", "127.0.0.1", "-P", &port.to_string()])
            .args(["--concurrency", "2", "--env-var", "WORDFREQ_REPORT_EVERY=4"])
            .current_dir(repo(""))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cargo lambda watch: {e}; cargo-lambda comes with scripts/stack.sh up"));
        let watch = Watch { url: format!("http://127.0.0.1:{port}"), child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "cargo lambda watch did not listen on port {port} within 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
        watch
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["--", &format!("-{}", self.child.id())]).status();
        let _ = self.child.wait();
    }
}

/// The README's `wordfreq` line with `--download`: the function runs under
/// `cargo lambda watch`, the command shows its progress and summary, prints
/// the CSV's link and saves the CSV; `reeve task result` saves it again
/// where `--dir` says. A directory that is not there is refused before any
/// task is created, and a file that cannot be written is a clear error.
#[tokio::test]
async fn task_create_download_saves_a_service_kinds_output_files() {
    let watch = Watch::start();
    let serve = Serve::start_with(&[], &[("AWS_ENDPOINT_URL_LAMBDA", &watch.url)]).await;
    serve.reeve(&["space", "create"]).expect(0);
    let text: String = (0..12).map(|n| format!("The cat sat on the mat, line {n}; the end.\n")).collect();
    let words = serve.home.join("words.txt");
    std::fs::write(&words, &text).unwrap();
    let file = format!("upload_id={}", words.display());

    // Nowhere to save: refused before the upload, no task.
    let missing = serve.home.join("not-there");
    let refused =
        serve.reeve(&["task", "create", "wordfreq", "--file", &file, "--download", missing.to_str().unwrap()]);
    assert!(refused.expect(4).stderr().contains("not a directory"), "{}", refused.stderr());
    assert_eq!(serve.reeve(&["task", "list", "--json"]).expect(0).json()["tasks"], serde_json::json!([]));

    let out = serve.home.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let run = serve.reeve(&["task", "create", "wordfreq", "--file", &file, "--download", out.to_str().unwrap()]);
    run.expect(0);
    let stdout = run.stdout();
    assert!(stdout.contains("12 lines read"), "the progress messages: {stdout}");
    assert!(stdout.contains("\"lines\":12"), "the summary: {stdout}");
    assert!(stdout.contains("output top-100.csv: http"), "the CSV's link: {stdout}");
    let csv = std::fs::read_to_string(out.join("top-100.csv")).unwrap();
    assert!(csv.starts_with("word,count\nthe,36\n"), "{csv}");
    assert!(run.stderr().contains("saved to"), "{}", run.stderr());
    assert!(!out.join("top-100.csv.part").exists(), "no partial file is left");

    // `task result` saves the files too, where --dir says.
    let id = serve.reeve(&["task", "list", "--json"]).expect(0).json()["tasks"][0]["id"].as_str().unwrap().to_owned();
    let again = serve.home.join("again");
    std::fs::create_dir_all(&again).unwrap();
    let result = serve.reeve(&["task", "result", &id, "--dir", again.to_str().unwrap(), "--json"]);
    let answer = result.expect(0).json();
    assert_eq!(answer["result"]["lines"], 12, "{answer}");
    assert_eq!(answer["files_saved_to"][0], again.join("top-100.csv").to_str().unwrap(), "{answer}");
    assert_eq!(std::fs::read_to_string(again.join("top-100.csv")).unwrap(), csv);

    // A directory where the file should go: the task is done, the save is
    // not, and the command says so (exit 4), leaving no partial file.
    let blocked = serve.home.join("blocked");
    std::fs::create_dir_all(blocked.join("top-100.csv")).unwrap();
    let failed = serve.reeve(&["task", "result", &id, "--dir", blocked.to_str().unwrap()]);
    assert!(failed.expect(4).stderr().contains("cannot write"), "{}", failed.stderr());
    assert!(!blocked.join("top-100.csv.part").exists(), "no partial file is left");
    drop(watch);
    serve.cleanup().await;
}

/// Proof of delivery for a service kind: `wordfreq-metered` (the function
/// under `cargo lambda watch`) paid with `--pay`, its CSV saved with
/// `--download`; the task's signed receipt names the CSV's SHA-256 (the
/// digest the bucket verified as the function wrote it), and `reeve receipt
/// verify` accepts the receipt against the downloaded file, checking the
/// signer the catalog publishes, and refuses the file with one byte changed.
#[tokio::test]
async fn a_service_kind_s_receipt_proves_the_file_it_wrote() {
    let chain = chain::ChainLock::shared().await;
    let payer = chain::Payer::new(&chain, 1_000_000).await;
    let watch = Watch::start();
    let serve = Serve::start_with(&[], &[("AWS_ENDPOINT_URL_LAMBDA", &watch.url)]).await;
    serve.reeve(&["space", "create"]).expect(0);
    let text: String = (0..12).map(|n| format!("The cat sat on the mat, line {n}; the end.\n")).collect();
    let words = serve.home.join("words.txt");
    std::fs::write(&words, &text).unwrap();
    let file = format!("upload_id={}", words.display());
    let out = serve.home.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let create = ["task", "create", "wordfreq-metered", "--file", &file, "--pay", "--download", out.to_str().unwrap()];
    serve.reeve_with(&create, &[("REEVE_WALLET_KEY", payer.key.as_str())]).expect(0);
    let csv = std::fs::read(out.join("top-100.csv")).unwrap();
    let id = serve.reeve(&["task", "list", "--json"]).expect(0).json()["tasks"][0]["id"].as_str().unwrap().to_owned();

    let receipt = serve.home.join("receipt.json");
    serve.reeve(&["receipt", "get", &id, "--out", receipt.to_str().unwrap()]).expect(0);
    let csv_path = out.join("top-100.csv");
    let verified = serve.reeve(&[
        "receipt",
        "verify",
        receipt.to_str().unwrap(),
        "--output",
        csv_path.to_str().unwrap(),
        "--json",
    ]);
    let verified = verified.expect(0).json();
    let delivered = &verified["receipt"]["delivery"];
    assert_eq!(delivered["status"], "completed", "{verified}");
    let sha256 = hex::encode(sha2::Sha256::digest(&csv));
    assert_eq!(
        delivered["outputs"],
        serde_json::json!([{ "name": "top-100.csv", "size": csv.len(), "sha256": sha256 }]),
        "the receipt names the file's digest: {verified}"
    );
    assert_eq!(verified["outputs"][0]["name"], "top-100.csv", "{verified}");
    assert_eq!(verified["receipt"]["metered"]["used"], 12, "charged for the 12 lines: {verified}");

    // The same file with one byte changed: not what was delivered (exit 3).
    let mut changed = csv.clone();
    changed[0] ^= 0x20;
    let forged = serve.home.join("top-100.csv");
    std::fs::write(&forged, &changed).unwrap();
    let refused = serve.reeve(&["receipt", "verify", receipt.to_str().unwrap(), "--output", forged.to_str().unwrap()]);
    assert!(
        refused.expect(3).stderr().contains("is not a file the receipt says was delivered"),
        "{}",
        refused.stderr()
    );
    drop(watch);
    serve.cleanup().await;
}

/// Forwards to the stack's facilitator, but loses the answer of the first
/// `/settle` (a 502 after the real one settled). Every payment document it
/// was sent is kept.
async fn lossy_facilitator() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::body::Bytes;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let real = std::env::var("REEVE_FACILITATOR_URL").unwrap_or_else(|_| "http://127.0.0.1:4021".into());
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let lost = Arc::new(AtomicBool::new(false));
    let forward = move |path: &'static str, body: Bytes, seen: Arc<Mutex<Vec<Value>>>, real: String| async move {
        let request: Value = serde_json::from_slice(&body).unwrap();
        seen.lock().unwrap().push(request["paymentPayload"].clone());
        let answer = reqwest::Client::new()
            .post(format!("{real}/{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (axum::http::StatusCode::from_u16(answer.status().as_u16()).unwrap(), answer.text().await.unwrap())
    };
    let router = axum::Router::new()
        .route(
            "/verify",
            axum::routing::post({
                let (seen, real) = (seen.clone(), real.clone());
                move |body: Bytes| forward("verify", body, seen.clone(), real.clone())
            }),
        )
        .route(
            "/settle",
            axum::routing::post({
                let (seen, real) = (seen.clone(), real.clone());
                move |body: Bytes| {
                    let (seen, real, lost) = (seen.clone(), real.clone(), lost.clone());
                    async move {
                        let answer = forward("settle", body, seen, real).await;
                        if lost.swap(true, Ordering::SeqCst) {
                            answer
                        } else {
                            (axum::http::StatusCode::BAD_GATEWAY, "lost".to_owned())
                        }
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (url, seen)
}

/// A payment whose settlement's answer was lost: the server says it is
/// pending, and `--pay` waits and sends the same signature again (never a
/// new one) until the server, reading the chain, answers its one task.
/// (Multi-threaded: the facilitator proxy answers while a blocking `reeve`
/// command runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pay_waits_out_a_pending_payment_with_the_same_signature() {
    let _chain = chain::ChainLock::shared().await;
    let (lossy, seen) = lossy_facilitator().await;
    let rpc = format!("eip155:84532={}", chain::rpc_url());
    let vars = [("REEVE_FACILITATOR_URL", lossy.as_str()), ("REEVE_CHAIN_RPC_URLS", rpc.as_str())];
    let serve = Serve::start_with(&["--no-worker"], &vars).await;
    serve.reeve(&["space", "create"]).expect(0);
    let pay = ["task", "create", "fetch", "--input", "url=https://example.com/", "--pay", "--json"];
    let paid = serve.reeve_with(&pay, &[("REEVE_WALLET_KEY", PAYER_KEY)]);
    let task = paid.expect(0).json();
    assert_eq!(task["status"], "queued", "{task}");
    assert!(paid.stderr().contains("payment pending"), "{}", paid.stderr());

    // One payment went to the facilitator, however often it was sent.
    let payloads = seen.lock().unwrap().clone();
    assert!(!payloads.is_empty());
    assert!(payloads.iter().all(|p| p == &payloads[0]), "one signature only: {payloads:?}");
    let space = serve.reeve(&["space", "--json"]).expect(0).json();
    assert_eq!(space["payments"].as_array().unwrap().len(), 1, "{space}");
    assert_eq!(space["payments"][0]["task_id"], task["id"]);
    serve.cleanup().await;
}

/// `reeve serve` wraps the routers (which carry the error envelope) in one
/// more envelope, its own: a request is still counted once, and an error
/// still answers one envelope whose id is the `x-request-id`.
#[tokio::test]
async fn serve_counts_each_request_once_and_answers_one_envelope() {
    let serve = Serve::start(&["--no-worker"]).await;
    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("{}/healthz", serve.endpoint)).send().await.unwrap().status(), 200);
    let refused = http.get(format!("{}/v1/tasks", serve.endpoint)).bearer_auth("nonsense").send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let id = refused.headers()["x-request-id"].to_str().unwrap().to_owned();
    let body: serde_json::Value = serde_json::from_slice(&refused.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "invalid_token", "{body}");
    assert_eq!(body["error"]["request_id"], id.as_str(), "{body}");

    let page = http.get(format!("{}/metrics", serve.endpoint)).send().await.unwrap().text().await.unwrap();
    for line in [
        r#"reeve_http_requests_total{method="GET",route="/healthz",status="200"} 1"#,
        r#"reeve_http_requests_total{method="GET",route="/v1/tasks",status="401"} 1"#,
    ] {
        assert!(page.lines().any(|l| l == line), "{line} in:\n{page}");
    }
    serve.cleanup().await;
}

/// The login limits on the real `reeve serve` (issue 25): the peer address
/// is the client, and `POST /v1/spaces` and MCP's `create_space` spend one
/// budget kept in Postgres. Ten Spaces from one loopback address (five each
/// way), then the 11th is `429 rate_limited` with `Retry-After` over REST
/// and the tool error `rate_limited` over MCP, and no Space is made for
/// either; another loopback address is served.
#[tokio::test]
async fn serve_limits_spaces_per_address_over_rest_and_mcp() {
    let serve = Serve::start(&["--no-worker"]).await;
    let seed = ulid::Ulid::new().random();
    let local = |last: u8| std::net::IpAddr::from([127, (seed >> 8) as u8 | 1, (seed >> 16) as u8, last]);
    let client = |ip| reqwest::Client::builder().local_address(ip).build().unwrap();
    let (greedy, other) = (client(local(1)), client(local(2)));
    let rest = |c: &reqwest::Client| c.post(format!("{}/v1/spaces", serve.endpoint)).send();
    // A tools/call of create_space, with the headers of the events/ sample.
    let sample: Value =
        serde_json::from_str(&std::fs::read_to_string(repo("events/mcp-tools-call-task.json")).unwrap()).unwrap();
    let mcp = |c: &reqwest::Client| {
        let mut body: Value = serde_json::from_str(sample["body"].as_str().unwrap()).unwrap();
        body["params"]["name"] = "create_space".into();
        body["params"]["arguments"] = serde_json::json!({});
        let mut request = c.post(format!("{}/mcp", serve.endpoint));
        for name in ["accept", "content-type", "mcp-protocol-version", "mcp-method"] {
            request = request.header(name, sample["headers"][name].as_str().unwrap());
        }
        let request = request.header("mcp-name", "create_space").body(body.to_string());
        async move { request.send().await.unwrap().json::<Value>().await.unwrap()["result"].clone() }
    };
    // The budget refills from the first Space on, so the wait left is a
    // minute less the time the ten took (argon2 hashing each: seconds on a
    // loaded machine).
    let started = std::time::Instant::now();
    for i in 0..5 {
        assert_eq!(rest(&greedy).await.unwrap().status(), 201, "space {i} over REST");
        let made = mcp(&greedy).await;
        assert!(made["structuredContent"]["space_id"].is_string(), "space {i} over MCP: {made}");
    }
    let refused = rest(&greedy).await.unwrap();
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    let earliest = 59u64.saturating_sub(started.elapsed().as_secs()).min(50);
    assert!((earliest..=60).contains(&retry_after), "the next Space in about a minute: {retry_after}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let over_mcp = mcp(&greedy).await;
    assert_eq!(over_mcp["isError"], true, "{over_mcp}");
    assert_eq!(over_mcp["structuredContent"]["error"]["code"], "rate_limited", "{over_mcp}");
    assert!(over_mcp["structuredContent"]["error"]["retry_after_seconds"].as_u64().is_some(), "{over_mcp}");

    let pool = serve.pool().await;
    let spaces: i64 = sqlx::query_scalar("SELECT count(*) FROM spaces").fetch_one(&pool).await.unwrap();
    assert_eq!(spaces, 10, "a refused create makes no Space");
    assert_eq!(rest(&other).await.unwrap().status(), 201, "another address has its own budget");
    assert!(mcp(&other).await["structuredContent"]["space_id"].is_string());
    pool.close().await;
    serve.cleanup().await;
}

/// A completion webhook end to end: `reeve space webhook-secret` prints the
/// secret once, `reeve task create --webhook` names the endpoint, and the
/// worker of `reeve serve` sends the signed call in the background; `reeve
/// task webhooks` shows the attempt.
#[tokio::test]
async fn serve_sends_a_signed_completion_webhook_named_on_the_command_line() {
    use reeve_shared::standard_webhooks::{SigningKey, verify};
    type Got = std::sync::Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, axum::body::Bytes)>>>;
    let got: Got = Default::default();
    let kept = got.clone();
    let receiver = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap().push((headers, body));
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver).await.unwrap() });
    // The users' client may reach the test's receiver on loopback.
    let serve = Serve::start_with(&[], &[("REEVE_FETCH_ALLOW", "127.0.0.1"), ("REEVE_OUTBOUND_ALLOW_HTTP", "1")]).await;
    serve.reeve(&["space", "create"]).expect(0);
    serve.reeve(&["login"]).expect(0);

    let refused = serve.reeve(&["task", "create", "digest", "--input", "upload_id=x", "--webhook", &hook]);
    refused.expect(3);
    assert!(refused.stderr().contains("webhook_secret_required"), "{}", refused.stderr());
    let made = serve.reeve(&["space", "webhook-secret"]);
    made.expect(0);
    let secret = made.stdout().trim().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert!(made.stderr().contains("shown only this once"), "{}", made.stderr());

    let (file, _) = write_file(&serve.home, "hooked.bin", 1024);
    let upload = format!("upload_id={}", file.display());
    let run = serve.reeve(&[
        "task",
        "create",
        "digest",
        "--file",
        &upload,
        "--webhook",
        &hook,
        "--webhook-event",
        "completed",
        "--json",
    ]);
    run.expect(0);
    let id = run.json()["id"].as_str().unwrap().to_owned();

    let deadline = Instant::now() + Duration::from_secs(60);
    while got.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no webhook came: {}", serve.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (headers, body) = got.lock().unwrap()[0].clone();
    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
    let key = SigningKey::parse(&secret).unwrap();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let signed =
        verify(&[key], &header("webhook-id"), &header("webhook-timestamp"), &body, &header("webhook-signature"), now);
    assert_eq!(signed, Ok(()));
    let payload: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((payload["type"].as_str(), payload["data"]["id"].as_str()), (Some("task.completed"), Some(id.as_str())));

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = serve.reeve(&["task", "webhooks", &id, "--json"]).expect(0).json();
        if listed["deliveries"][0]["status"] == "delivered" {
            assert_eq!(listed["deliveries"][0]["attempts"][0]["status_code"], 204, "{listed}");
            break;
        }
        assert!(Instant::now() < deadline, "not recorded as delivered: {listed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let table = serve.reeve(&["task", "webhooks", &id]).expect(0).stdout();
    assert!(table.contains("delivered") && table.contains("204"), "{table}");
    serve.cleanup().await;
}
