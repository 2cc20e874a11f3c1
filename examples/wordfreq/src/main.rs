//! The `wordfreq` Lambda function: each event is a job from Reeve, worked
//! on by [`wordfreq::work`]. `cargo lambda watch -p wordfreq` serves it
//! locally behind an emulated Invoke API.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).without_time().init();
    let every = wordfreq::Settings::from_env();
    reeve_executor::lambda::run(|job, reporter| wordfreq::work(job, reporter, every)).await
}
