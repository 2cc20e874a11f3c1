//! `/metrics` on the real `reeve relay` process, which starts as the
//! Fargate relay does: on a listener of its own (`--metrics-bind`), never on
//! the relay's port, which a load balancer forwards whole.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TOKEN_KEY: &str = "0123456789abcdef0123456789abcdef";

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn wait_for(port: u16) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing listens on {port}");
}

fn relay(args: &[&str]) -> Process {
    let database_url = std::env::var("DATABASE_URL").expect("DATABASE_URL: load the stack's .env");
    let redis_url = std::env::var("REDIS_URL").expect("REDIS_URL: load the stack's .env");
    let child = Command::new(env!("CARGO_BIN_EXE_reeve"))
        .current_dir(std::env::temp_dir())
        .arg("relay")
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("REDIS_URL", redis_url)
        .env("REEVE_TOKEN_KEY", TOKEN_KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Process(child)
}

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[test]
fn metrics_on_the_relay_port_are_refused_at_start() {
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_reeve"))
        .current_dir(std::env::temp_dir())
        .args(["relay", "--bind", &bind, "--metrics-bind", &bind])
        .env("DATABASE_URL", "postgres://reeve@127.0.0.1:1/reeve")
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .env("REEVE_TOKEN_KEY", TOKEN_KEY)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("must not be the relay's port"), "{stderr}");
}

#[tokio::test]
async fn metrics_are_on_their_own_listener_and_not_on_the_relay_address() {
    let (port, metrics_port) = (free_port(), free_port());
    let _relay =
        relay(&["--bind", &format!("127.0.0.1:{port}"), "--metrics-bind", &format!("127.0.0.1:{metrics_port}")]);
    wait_for(port).await;
    wait_for(metrics_port).await;
    assert_eq!(get(&format!("http://127.0.0.1:{port}/healthz")).await.0, 200);
    let (status, body) = get(&format!("http://127.0.0.1:{port}/metrics")).await;
    assert_eq!(status, 404, "not on the public address any more: {body}");
    assert!(body.contains("\"not_found\""), "the usual envelope: {body}");
    let (status, page) = get(&format!("http://127.0.0.1:{metrics_port}/metrics")).await;
    assert_eq!(status, 200);
    assert!(page.contains(r#"route="/healthz""#), "{page}");
    // The miss above is counted without its raw path becoming a series.
    assert!(page.contains(r#"route="unmatched",status="404""#), "{page}");
}
