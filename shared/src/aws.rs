//! S3 and SQS clients, configured from the standard AWS environment. Locally
//! `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL_SQS` point them at SeaweedFS and
//! moto; the SDK reads those itself.

#[derive(Clone, Debug)]
pub struct AwsClients {
    pub s3: aws_sdk_s3::Client,
    pub sqs: aws_sdk_sqs::Client,
}

impl AwsClients {
    pub async fn from_env() -> Self {
        let config = aws_config::load_from_env().await;
        // A local S3 server has no per-bucket DNS names: use path-style
        // addressing whenever the endpoint is overridden.
        let custom_endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
        let s3 = aws_sdk_s3::config::Builder::from(&config).force_path_style(custom_endpoint).build();
        AwsClients { s3: aws_sdk_s3::Client::from_conf(s3), sqs: aws_sdk_sqs::Client::new(&config) }
    }
}
