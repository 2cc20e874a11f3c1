//! S3 and SQS clients on the SDK's configuration (which the SDK reads from
//! the standard AWS environment itself: region, credentials, and locally
//! `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL_SQS` for SeaweedFS and moto,
//! `AWS_ENDPOINT_URL_LAMBDA` for `cargo lambda watch`).
//! A process builds only the clients it uses.

#[cfg(all(feature = "s3-objects", feature = "sqs"))]
/// The API's: S3's objects (signed without the S3 client) and SQS.
#[derive(Clone, Debug)]
pub struct AwsClients {
    pub objects: crate::infra::s3_objects::S3Objects,
    pub sqs: aws_sdk_sqs::Client,
}

#[cfg(all(feature = "s3-objects", feature = "sqs"))]
impl AwsClients {
    /// Both; `s3_endpoint` is S3's when it is not AWS's (then addressed
    /// path-style, as for [`s3`]).
    pub fn from_config(config: &aws_config::SdkConfig, s3_endpoint: Option<String>) -> Self {
        AwsClients { objects: crate::infra::s3_objects::S3Objects::new(config, s3_endpoint), sqs: sqs(config) }
    }
}

#[cfg(feature = "s3")]
/// `custom_endpoint`: S3 is a local server, which has no per-bucket DNS
/// names, so addressing is path-style.
pub fn s3(config: &aws_config::SdkConfig, custom_endpoint: bool) -> aws_sdk_s3::Client {
    let s3 = aws_sdk_s3::config::Builder::from(config).force_path_style(custom_endpoint).build();
    aws_sdk_s3::Client::from_conf(s3)
}

#[cfg(feature = "lambda-invoke")]
/// The `lambda` executor's Invoke client.
pub fn lambda(config: &aws_config::SdkConfig) -> aws_sdk_lambda::Client {
    aws_sdk_lambda::Client::new(config)
}

#[cfg(feature = "sqs")]
pub fn sqs(config: &aws_config::SdkConfig) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(config)
}
