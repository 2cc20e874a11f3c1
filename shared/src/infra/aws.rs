//! S3 and SQS clients, configured from the standard AWS environment. Locally
//! `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL_SQS` point them at SeaweedFS and
//! moto; the SDK reads those itself.

#[derive(Clone, Debug)]
pub struct AwsClients {
    pub s3: aws_sdk_s3::Client,
    pub sqs: aws_sdk_sqs::Client,
}

/// The variables that move S3 off AWS (a local server).
pub const S3_ENDPOINT_VARIABLES: [&str; 2] = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"];

impl AwsClients {
    /// For tests and tools: the SDK's configuration from the process
    /// environment (binaries start through [`crate::startup`] instead).
    pub async fn from_env() -> Self {
        let config = aws_config::load_from_env().await;
        let env = crate::settings::Env::process();
        Self::from_config(&config, S3_ENDPOINT_VARIABLES.iter().any(|name| env.optional(name).is_some()))
    }

    /// `custom_endpoint`: S3 is a local server, which has no per-bucket DNS
    /// names, so addressing is path-style.
    pub fn from_config(config: &aws_config::SdkConfig, custom_endpoint: bool) -> Self {
        let s3 = aws_sdk_s3::config::Builder::from(config).force_path_style(custom_endpoint).build();
        AwsClients { s3: aws_sdk_s3::Client::from_conf(s3), sqs: aws_sdk_sqs::Client::new(config) }
    }
}
