//! The services under test, started for a test and ended with it: the
//! example under `cargo lambda watch`, and the Python service. Included by
//! path (`#[path = …] mod harness;`) by examples/wordfreq/tests/protocol.rs
//! and shared/tests/suite/service_kinds.rs, which test them from both
//! sides of the protocol.

#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The repository's root: the first directory above the crate's own that
/// holds tests/executors/.
pub fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("tests/executors/service.py").is_file())
        .unwrap_or_else(|| panic!("no tests/executors/ above {}", manifest.display()))
        .to_path_buf()
}

/// `cargo lambda watch` serving examples/wordfreq on a free loopback port,
/// reporting every `report_every` lines, in a process group of its own (it
/// runs `cargo run` and the function under it), ended with the test.
pub struct Watch {
    pub url: String,
    child: Child,
}

impl Watch {
    pub async fn start(report_every: u64) -> Watch {
        use std::os::unix::process::CommandExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("cargo")
            // The whole workspace, as the README's loop runs it, not `-p
            // wordfreq`: selected alone, wordfreq's dependencies resolve
            // other features, and watch would rebuild them beside the tests.
            .args(["lambda", "watch", "-A", "127.0.0.1", "-P", &port.to_string()])
            .args(["--concurrency", "2", "--env-var", &format!("WORDFREQ_REPORT_EVERY={report_every}")])
            .current_dir(root())
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cargo lambda watch: {e}; cargo-lambda comes with scripts/stack.sh up"));
        let watch = Watch { url: format!("http://127.0.0.1:{port}"), child };
        let until = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < until, "cargo lambda watch did not listen on port {port} within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        watch
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["--", &group]).status();
        let _ = self.child.wait();
    }
}

/// tests/executors/service.py, listening on a free loopback port with the
/// signing secret `secret` and `args`; every line it prints after the
/// first is kept in `said`. Ended with the test, however it ends.
pub struct PythonService {
    pub endpoint: String,
    said: Arc<Mutex<Vec<String>>>,
    child: Child,
}

impl PythonService {
    pub async fn start(secret: &str, args: &[&str]) -> PythonService {
        let python = std::env::var_os("REEVE_PAYER_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join(".venv/bin/python"));
        let mut child = Command::new(&python)
            .arg(root().join("tests/executors/service.py"))
            .args(["--port", "0"])
            .args(args)
            .env("WORDFREQ_SECRET", secret)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}; run scripts/stack.sh up", python.display()));
        let stdout = child.stdout.take().unwrap();
        let said = Arc::new(Mutex::new(Vec::new()));
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        let kept = said.clone();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            let _ = first_tx.send(lines.next().and_then(Result::ok).unwrap_or_default());
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        // Built first, so that it is ended should the wait below fail.
        let mut service = PythonService { endpoint: String::new(), said, child };
        let first = tokio::time::timeout(Duration::from_secs(20), first_rx).await.unwrap().unwrap();
        let endpoint =
            first.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("service.py said {first:?}"));
        service.endpoint = endpoint.to_owned();
        service
    }

    /// What it printed after its first line, so far.
    pub fn said(&self) -> Vec<String> {
        self.said.lock().unwrap().clone()
    }
}

impl Drop for PythonService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
