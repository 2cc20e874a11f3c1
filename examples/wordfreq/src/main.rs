//! The `wordfreq` Lambda function: each event is a job from Reeve, worked
//! on by [`wordfreq::work`]. `cargo lambda watch -p wordfreq` serves it
//! locally behind an emulated Invoke API.

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // `RUST_LOG` as `level` and `target=level` directives; info without one.
    let filter = std::env::var("RUST_LOG").ok().and_then(|directives| directives.parse().ok());
    let filter = filter.unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO));
    let fmt = tracing_subscriber::fmt::layer().without_time();
    tracing_subscriber::registry().with(filter).with(fmt).init();
    let every = wordfreq::Settings::from_env();
    reeve_executor::lambda::run(|job, reporter| wordfreq::work(job, reporter, every)).await
}
