//! The smallest useful Lambda: `lambda_runtime` answering every event with
//! `{}`. `reeve-bench coldstart` runs it beside each of Reeve's functions,
//! so their init is read as a multiple of this one's, built alike and timed
//! in the same run.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(|_: LambdaEvent<Value>| async { Ok::<_, Error>(json!({})) })).await
}
