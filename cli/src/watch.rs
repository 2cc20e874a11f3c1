//! `reeve task watch ID` (and `task create --watch`): follows a task's event
//! stream with a progress bar, prints its log lines and result, and returns
//! its terminal status, which the caller turns into the exit code: 0 for
//! `completed`, 1 for `failed`, 2 for `canceled`, so scripts can chain on it.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use reeve_shared::ids::Id;
use reeve_shared::tasks::{EventType, TaskStatus};

use crate::follow::{FollowError, follow};

/// Above the bar on a terminal; a plain line when piped (the bar is hidden
/// then, and indicatif would swallow its printouts).
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() { println!("{line}") } else { bar.println(line) }
}

/// How a watched task ended.
pub struct Watched {
    pub status: TaskStatus,
    /// Its result named output files (a service kind's `outputs`), whose
    /// links only a read of the task signs.
    pub files: bool,
}

/// `quiet`: print nothing (for `--json`, whose caller prints the task).
pub async fn watch(
    http: &reqwest::Client,
    endpoint: &str,
    token: &str,
    task: Id,
    quiet: bool,
) -> Result<Watched, FollowError> {
    let files = std::cell::Cell::new(false);
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(1000) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:40}] {percent:>3}% {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let status = follow(http, endpoint, token, task, |event| {
        if matches!(event.kind, EventType::Result) && event.data["outputs"].as_array().is_some_and(|o| !o.is_empty()) {
            files.set(true);
        }
        if quiet {
            return;
        }
        match event.kind {
            EventType::Progress => {
                let fraction = event.data["fraction"].as_f64().map(|f| f.clamp(0.0, 1.0));
                if let Some(fraction) = fraction {
                    bar.set_position((fraction * 1000.0) as u64);
                }
                // A service says where it is in its own words ("400 lines
                // read"): beside the bar, or a line of its own when piped.
                if let Some(message) = event.data["message"].as_str().filter(|m| !m.is_empty()) {
                    if bar.is_hidden() {
                        println!("progress {:.0}%: {message}", fraction.unwrap_or(0.0) * 100.0);
                    } else {
                        bar.set_message(format!("running: {message}"));
                    }
                }
            }
            EventType::Log => say(&bar, format!("log: {}", event.data["line"].as_str().unwrap_or_default())),
            EventType::Status => {
                let status = event.data["status"].as_str().unwrap_or_default();
                let shown = if event.data["cancel_requested"] == true { "cancel requested" } else { status };
                bar.set_message(shown.to_owned());
                if bar.is_hidden() {
                    println!("status: {shown}");
                }
            }
            EventType::Result => say(&bar, format!("result: {}", event.data)),
            EventType::Error => say(
                &bar,
                format!(
                    "error: {} ({})",
                    event.data["message"].as_str().unwrap_or_default(),
                    event.data["code"].as_str().unwrap_or_default()
                ),
            ),
            EventType::CreditUsed => say(
                &bar,
                format!("paid with a credit: {} atomic units", event.data["amount"].as_str().unwrap_or_default()),
            ),
            EventType::LeaseLost => say(
                &bar,
                format!(
                    "attempt {}'s worker stopped renewing its lease; the task runs again",
                    event.data["attempt"].as_i64().unwrap_or_default()
                ),
            ),
            EventType::PaymentSettledLate => say(
                &bar,
                format!(
                    "payment landed after the request was answered: {} atomic units, transaction {}",
                    event.data["amount"].as_str().unwrap_or_default(),
                    event.data["transaction"].as_str().unwrap_or("unknown")
                ),
            ),
        }
    })
    .await;
    let status = status.inspect_err(|_| bar.abandon())?;
    if status == TaskStatus::Completed {
        bar.set_position(1000);
    }
    bar.finish_with_message(status.as_str());
    Ok(Watched { status, files: files.get() })
}
