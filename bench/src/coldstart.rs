//! Cold start: each function binary exec'd against a small Lambda runtime
//! API served here; the figure is the time from exec to its first
//! `GET /2018-06-01/runtime/invocation/next`, i.e. everything its `main`
//! does before it can take a request. A hello-world `lambda_runtime` binary
//! (bench/hello), built with the same profile, is exec'd in the same rounds,
//! so each function's init reads as a multiple of it. The binaries' sizes go
//! in the same table.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::process::Command;

use crate::median;

#[derive(clap::Args)]
pub struct Args {
    /// Where the release binaries are (target/release): each function's,
    /// built alone (`cargo build --release -p reeve-fn-<name>`, as `sam build`
    /// builds it), and `hello`.
    #[arg(long)]
    bin_dir: PathBuf,
    /// Rounds; each round execs every binary once, in turn.
    #[arg(long, default_value_t = 21)]
    runs: usize,
}

const MIB: f64 = 1024.0 * 1024.0;

/// Every function of template.yaml, with its size goal in MiB where one was
/// set (issue 19's; issue 38's for mcp).
const FUNCTIONS: [(&str, Option<f64>); 9] = [
    ("auth", Some(10.0)),
    ("catalog", Some(6.0)),
    ("presign", Some(10.0)),
    ("task-create", Some(12.0)),
    ("task-status", Some(10.0)),
    ("worker", Some(12.0)),
    ("upload-guard", None),
    ("sweeper", None),
    ("mcp", Some(12.0)),
];
/// The worker built without its default `lambda` feature (`cargo build -p
/// reeve-fn-worker --no-default-features`: no Lambda Invoke client, for a
/// catalog without a `lambda` kind), measured beside the others when
/// scripts/bench.sh built it; not in the total, which counts the worker as
/// the template deploys it (default features).
const WORKER_NO_LAMBDA: &str = "worker-no-lambda";
const TOTAL_GOAL_MIB: f64 = 70.0;
/// Init goal: at most this many times the hello world's, same run.
const INIT_GOAL_RATIO: f64 = 2.0;
const BASELINE: &str = "hello";

async fn once(bin: &Path, name: &str) -> anyhow::Result<f64> {
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
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("exec {}", bin.display()))?;
    let accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await;
    let Ok(accepted) = accepted else {
        let _ = child.start_kill();
        let output = child.wait_with_output().await?;
        bail!("{name} never asked the runtime API for work; it wrote:\n{}", String::from_utf8_lossy(&output.stderr));
    };
    let (mut socket, _) = accepted?;
    let mut request = vec![0u8; 1024];
    let n = socket.read(&mut request).await?;
    let elapsed = start.elapsed().as_secs_f64() * 1000.0;
    let _ = child.kill().await;
    if !request[..n].starts_with(b"GET /2018-06-01/runtime/invocation/next") {
        bail!("{name} sent {:?}", String::from_utf8_lossy(&request[..n.min(80)]));
    }
    Ok(elapsed)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let without_lambda = args.bin_dir.join(WORKER_NO_LAMBDA).exists();
    let names: Vec<&str> = std::iter::once(BASELINE)
        .chain(FUNCTIONS.iter().map(|(name, _)| *name))
        .chain(without_lambda.then_some(WORKER_NO_LAMBDA))
        .collect();
    let mut sizes = Vec::new();
    for name in &names {
        let bin = args.bin_dir.join(name);
        let size = std::fs::metadata(&bin).with_context(|| format!("{} (build it first)", bin.display()))?.len();
        sizes.push(size as f64 / MIB);
    }
    // Round-robin, so load on the shared machine falls on every binary alike.
    let mut samples = vec![Vec::with_capacity(args.runs); names.len()];
    for _ in 0..args.runs {
        for (name, runs) in names.iter().zip(&mut samples) {
            runs.push(once(&args.bin_dir.join(name), name).await?);
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    let hello_ms = medians[0];

    let mut out = String::from("## Cold start and binary size\n\n");
    out.push_str(&format!(
        "Init is exec to the first request to the runtime API (a local one served by the harness), \
         with the local stack's environment; median of {} rounds, each round running every binary once \
         in turn, the hello world (`bench/hello`: `lambda_runtime` answering `{{}}`, same release profile) \
         included. Goal: each function at most {INIT_GOAL_RATIO}× the hello world's init. Sizes are the \
         stripped release binaries, each function built alone with only its own features (`cargo build -p`; \
         `sam build` resolves the workspace's features together, so its bootstraps link more); MiB \
         (2^20 bytes).\n\n",
        args.runs
    ));
    out.push_str(&format!(
        "| binary | size MiB | size goal | init, median ms | init ÷ hello | init goal ≤ {INIT_GOAL_RATIO}× |\n\
         |---|---|---|---|---|---|\n| {BASELINE} | {:.1} | | {hello_ms:.1} | 1.00 | |\n",
        sizes[0]
    ));
    let mut total = 0.0;
    for (i, (name, goal)) in FUNCTIONS.iter().enumerate() {
        let (size, ms) = (sizes[i + 1], medians[i + 1]);
        total += size;
        let size_goal = goal.map_or(String::new(), |goal| format!("≤ {goal} {}", verdict(size <= goal)));
        let ratio = ms / hello_ms;
        out.push_str(&format!(
            "| {name} | {size:.1} | {size_goal} | {ms:.1} | {ratio:.2} | {} |\n",
            verdict(ratio <= INIT_GOAL_RATIO)
        ));
    }
    out.push_str(&format!(
        "| all nine | {total:.1} | ≤ {TOTAL_GOAL_MIB} {} | | | |\n",
        verdict(total <= TOTAL_GOAL_MIB)
    ));
    if without_lambda {
        let i = FUNCTIONS.len() + 1;
        out.push_str(&format!(
            "| worker, without `lambda` | {:.1} | | {:.1} | {:.2} | {} |\n",
            sizes[i],
            medians[i],
            medians[i] / hello_ms,
            verdict(medians[i] / hello_ms <= INIT_GOAL_RATIO)
        ));
    }
    out.push('\n');
    print!("{out}");
    Ok(())
}
