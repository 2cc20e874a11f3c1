//! S3 and SQS clients on the SDK's configuration (which the SDK reads from
//! the standard AWS environment itself: region, credentials, and locally
//! `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL_SQS` for SeaweedFS and moto).
//! A process builds only the clients it uses.

#[cfg(all(feature = "s3", feature = "sqs"))]
#[derive(Clone, Debug)]
pub struct AwsClients {
    pub s3: aws_sdk_s3::Client,
    pub sqs: aws_sdk_sqs::Client,
    /// Download links to the same S3, signed without the client.
    pub s3_links: crate::infra::s3_links::S3Links,
}

#[cfg(all(feature = "s3", feature = "sqs"))]
impl AwsClients {
    /// Both clients; `s3_endpoint` is S3's when it is not AWS's (then
    /// addressed path-style, as for [`s3`]).
    pub fn from_config(config: &aws_config::SdkConfig, s3_endpoint: Option<String>) -> Self {
        AwsClients {
            s3: s3(config, s3_endpoint.is_some()),
            sqs: sqs(config),
            s3_links: crate::infra::s3_links::S3Links::new(config, s3_endpoint),
        }
    }
}

#[cfg(feature = "s3")]
/// `custom_endpoint`: S3 is a local server, which has no per-bucket DNS
/// names, so addressing is path-style.
pub fn s3(config: &aws_config::SdkConfig, custom_endpoint: bool) -> aws_sdk_s3::Client {
    let s3 = aws_sdk_s3::config::Builder::from(config).force_path_style(custom_endpoint).build();
    aws_sdk_s3::Client::from_conf(s3)
}

#[cfg(feature = "sqs")]
pub fn sqs(config: &aws_config::SdkConfig) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(config)
}
