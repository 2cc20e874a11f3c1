//! Cold start: each function binary exec'd against a small Lambda runtime
//! API served here; the figure is the time from exec to its first
//! `GET /2018-06-01/runtime/invocation/next`, i.e. everything its `main`
//! does before it can take a request. The binaries' sizes go in the same
//! table.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::process::Command;

use crate::median;

#[derive(clap::Args)]
pub struct Args {
    /// Where the release binaries are (target/release).
    #[arg(long)]
    bin_dir: PathBuf,
    #[arg(long, default_value_t = 7)]
    runs: usize,
}

const FUNCTIONS: [&str; 7] = ["auth", "catalog", "presign", "task-create", "task-status", "upload-guard", "worker"];

async fn once(bin: &PathBuf, name: &str) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let api = listener.local_addr()?.to_string();
    let start = Instant::now();
    let mut child = Command::new(bin)
        .env("AWS_LAMBDA_RUNTIME_API", &api)
        .env("AWS_LAMBDA_FUNCTION_NAME", name)
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "bench")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("exec {}", bin.display()))?;
    let (mut socket, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .with_context(|| format!("{name} never asked the runtime API for work"))??;
    let mut request = vec![0u8; 1024];
    let n = socket.read(&mut request).await?;
    let elapsed = start.elapsed().as_secs_f64() * 1000.0;
    let _ = child.kill().await;
    if !request[..n].starts_with(b"GET /2018-06-01/runtime/invocation/next") {
        bail!("{name} sent {:?}", String::from_utf8_lossy(&request[..n.min(80)]));
    }
    Ok(elapsed)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut out = String::from("## Cold start and binary size\n\n");
    out.push_str(&format!(
        "Exec to the first request to the runtime API (a local one served by the harness), median of {} runs, \
         with the local stack's environment; goal ≤ 20 ms. Sizes are the stripped release binaries \
         (the `bootstrap` SAM packages); goal ≤ 12 MB each.\n\n",
        args.runs
    ));
    out.push_str("| function | cold start, median ms | size MB |\n|---|---|---|\n");
    let mut total = 0u64;
    for name in FUNCTIONS {
        let bin = args.bin_dir.join(name);
        let size = std::fs::metadata(&bin).with_context(|| format!("{} (build it first)", bin.display()))?.len();
        total += size;
        let mut runs = Vec::new();
        for _ in 0..args.runs {
            runs.push(once(&bin, name).await?);
        }
        out.push_str(&format!("| {name} | {:.1} | {:.1} |\n", median(runs), size as f64 / 1e6));
    }
    out.push_str(&format!("| all seven | | {:.1} |\n\n", total as f64 / 1e6));
    print!("{out}");
    Ok(())
}
