//! Tracing, set up here and nowhere else. Logs are JSON in Lambda and on
//! Fargate, where CloudWatch indexes the fields (the request id and task id
//! are span fields); a terminal gets the readable format unless
//! `REEVE_LOG_FORMAT=json`. Logs go to stderr, so stdout in Lambda carries
//! only the EMF metric lines (`crate::infra::metrics`, installed by `startup`).
//!
//! This is the one read of the environment outside `startup`, and on
//! purpose: it runs first, so that a start-up problem is logged in the
//! format the platform indexes (`RUST_LOG`, `REEVE_LOG_FORMAT`, and whether
//! Lambda or ECS runs the process).

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// `json` for JSON logs where nothing else asks for them.
pub const LOG_FORMAT: &str = "REEVE_LOG_FORMAT";

/// The log filter: `level` and `target=level` directives, comma-separated
/// (`info,sqlx=warn`).
pub const LOG_FILTER: &str = "RUST_LOG";

/// The filter is tracing-subscriber's `Targets`, not its `EnvFilter`: the
/// same `target=level` directives, without the span and field filters
/// `EnvFilter` parses with a regex engine. That engine was 0.4 MiB of each
/// function's bootstrap, and 0.8 MiB as `sam build` links them: it unifies
/// the Unicode tables the schema compiler asks of `regex-syntax` into every
/// function (bench/NOTES.md).
pub fn init() {
    let (filter, refused) = filter(std::env::var(LOG_FILTER).ok().as_deref());
    let json = std::env::var(LOG_FORMAT).is_ok_and(|v| v == "json")
        || std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some()
        || std::env::var_os("ECS_CONTAINER_METADATA_URI_V4").is_some();
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    // A second init (tests, or a binary that calls it twice) is harmless.
    let _ =
        if json { registry.with(fmt.json().with_current_span(true)).try_init() } else { registry.with(fmt).try_init() };
    if let Some(error) = refused {
        tracing::warn!(%error, "{LOG_FILTER} is not a list of level or target=level directives; logging at info");
    }
}

/// The directives in `RUST_LOG`, else `info`; what it held and why it was
/// refused, to be logged once logging works.
fn filter(directives: Option<&str>) -> (Targets, Option<String>) {
    let info = || Targets::new().with_default(LevelFilter::INFO);
    match directives.map(str::trim) {
        None | Some("") => (info(), None),
        Some(directives) => match directives.parse::<Targets>() {
            Ok(targets) => (targets, None),
            Err(e) => (info(), Some(format!("{directives:?}: {e}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn directives_set_levels_per_target_and_a_bad_filter_falls_back_to_info() {
        let (targets, refused) = filter(Some("warn,sqlx=error,reeve_shared::domain=debug"));
        assert!(refused.is_none());
        assert!(targets.would_enable("reeve_shared::domain::tasks", &Level::DEBUG));
        assert!(!targets.would_enable("reeve_shared::startup", &Level::INFO));
        assert!(targets.would_enable("reeve_shared::startup", &Level::WARN));
        assert!(!targets.would_enable("sqlx::query", &Level::WARN));

        let (unset, refused) = filter(None);
        assert!(refused.is_none());
        assert!(unset.would_enable("anything", &Level::INFO) && !unset.would_enable("anything", &Level::DEBUG));

        let (fallback, refused) = filter(Some("sqlx=loud"));
        assert!(fallback.would_enable("sqlx", &Level::INFO) && !fallback.would_enable("sqlx", &Level::DEBUG));
        assert!(refused.unwrap().contains("sqlx=loud"));
    }
}
