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
    /// built alone (`cargo build --release -p reeve-fn-<name>`: only its own
    /// features), and `hello`.
    #[arg(long)]
    bin_dir: PathBuf,
    /// Where the same functions are as `sam build` links them, if built:
    /// together at the workspace root (`cargo build --release --target
    /// x86_64-unknown-linux-gnu --bin <each>`, the command cargo lambda
    /// runs for each), so with every workspace member's features unified.
    /// Measured in the same rounds, in a second table.
    #[arg(long)]
    deployed_dir: Option<PathBuf>,
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

async fn once(binary: &Binary) -> anyhow::Result<f64> {
    let (bin, name) = (&binary.path, &binary.label);
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
        .envs(binary.catalog.iter().map(|path| ("REEVE_CATALOG", path)))
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

/// One binary measured: its row's label, its file and its size goal, and
/// the catalog it starts with where not the environment's.
struct Binary {
    label: String,
    path: PathBuf,
    goal: Option<f64>,
    catalog: Option<PathBuf>,
}

/// The environment's catalog (`REEVE_CATALOG`) without its `lambda` kinds,
/// for the worker built without the Invoke client, which refuses a catalog
/// that has one at start-up: it starts as it would be deployed, for a
/// catalog without one.
fn without_lambda_kinds() -> anyhow::Result<PathBuf> {
    let path = std::env::var("REEVE_CATALOG").context("REEVE_CATALOG is unset (the local stack's .env sets it)")?;
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let mut catalog: toml::Table = text.parse().with_context(|| format!("parse {path}"))?;
    if let Some(toml::Value::Table(tasks)) = catalog.get_mut("tasks") {
        tasks.retain(|_, task| task.get("executor").and_then(toml::Value::as_str) != Some("lambda"));
    }
    let out = std::env::temp_dir().join(format!("reeve-bench-no-lambda-{}.toml", std::process::id()));
    std::fs::write(&out, toml::to_string(&catalog)?).with_context(|| format!("write {}", out.display()))?;
    Ok(out)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let at =
        |dir: &Path, name: &str, goal| Binary { label: name.to_owned(), path: dir.join(name), goal, catalog: None };
    let mut binaries = vec![at(&args.bin_dir, BASELINE, None)];
    binaries.extend(FUNCTIONS.iter().map(|(name, goal)| at(&args.bin_dir, name, *goal)));
    let without_lambda = args.bin_dir.join(WORKER_NO_LAMBDA).exists();
    if without_lambda {
        binaries.push(Binary {
            label: "worker, without `lambda`".into(),
            catalog: Some(without_lambda_kinds()?),
            ..at(&args.bin_dir, WORKER_NO_LAMBDA, None)
        });
    }
    let deployed_from = binaries.len();
    if let Some(dir) = &args.deployed_dir {
        binaries.extend(FUNCTIONS.iter().map(|(name, goal)| at(dir, name, *goal)));
    }
    let mut sizes = Vec::new();
    for binary in &binaries {
        let path = &binary.path;
        let size = std::fs::metadata(path).with_context(|| format!("{} (build it first)", path.display()))?.len();
        sizes.push(size as f64 / MIB);
    }
    // Round-robin, so load on the shared machine falls on every binary alike.
    let mut samples = vec![Vec::with_capacity(args.runs); binaries.len()];
    for _ in 0..args.runs {
        for (binary, runs) in binaries.iter().zip(&mut samples) {
            runs.push(once(binary).await?);
        }
    }
    for catalog in binaries.iter().filter_map(|binary| binary.catalog.as_ref()) {
        let _ = std::fs::remove_file(catalog);
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    let hello_ms = medians[0];
    let row = |i: usize| {
        let (size, ms, ratio) = (sizes[i], medians[i], medians[i] / hello_ms);
        let size_goal = binaries[i].goal.map_or(String::new(), |goal| format!("≤ {goal} {}", verdict(size <= goal)));
        format!(
            "| {} | {size:.1} | {size_goal} | {ms:.1} | {ratio:.2} | {} |\n",
            binaries[i].label,
            verdict(ratio <= INIT_GOAL_RATIO)
        )
    };
    let total_row = |range: std::ops::Range<usize>| {
        let total: f64 = sizes[range].iter().sum();
        format!("| all nine | {total:.1} | ≤ {TOTAL_GOAL_MIB} {} | | | |\n", verdict(total <= TOTAL_GOAL_MIB))
    };
    let header = format!(
        "| binary | size MiB | size goal | init, median ms | init ÷ hello | init goal ≤ {INIT_GOAL_RATIO}× |\n\
         |---|---|---|---|---|---|\n| {BASELINE} | {:.1} | | {hello_ms:.1} | 1.00 | |\n",
        sizes[0]
    );

    let mut out = String::from("## Cold start and binary size\n\n");
    out.push_str(&format!(
        "Init is exec to the first request to the runtime API (a local one served by the harness), \
         with the local stack's environment; median of {} rounds, each round running every binary once \
         in turn, the hello world (`bench/hello`: `lambda_runtime` answering `{{}}`, same release profile) \
         included. Goal: each function at most {INIT_GOAL_RATIO}× the hello world's init. Sizes are the \
         stripped release binaries, each function built alone with only its own features (`cargo build -p`); \
         MiB (2^20 bytes).\n\n",
        args.runs
    ));
    out.push_str(&header);
    let functions = 1..1 + FUNCTIONS.len();
    functions.clone().for_each(|i| out.push_str(&row(i)));
    out.push_str(&total_row(functions));
    if without_lambda {
        out.push_str(&row(FUNCTIONS.len() + 1));
    }
    if args.deployed_dir.is_some() {
        out.push_str(
            "\n### As `sam build` links them\n\n\
             The same functions built together at the workspace root, as `sam build` builds each \
             (`cargo lambda build --release --bin <name>`, which runs `cargo build --release --target \
             x86_64-unknown-linux-gnu --bin <name>` there): cargo unifies the features of every workspace \
             member, the CLI's `full` among them, so each links what its code reaches through features \
             it would not have alone. Linked by cargo's linker here, by zig under `sam build`. Same rounds \
             as the table above.\n\n",
        );
        out.push_str(&header);
        let deployed = deployed_from..deployed_from + FUNCTIONS.len();
        deployed.clone().for_each(|i| out.push_str(&row(i)));
        out.push_str(&total_row(deployed));
    }
    out.push('\n');
    print!("{out}");
    Ok(())
}
