//! `reeve storage policy`: the bucket policy the SAM template puts on the
//! bucket, generated from the same parameters (docs/architecture.md#the-bucket-policy). It prints the
//! document; `--apply` puts it on the bucket.

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use reeve_shared::settings::Config;
use reeve_shared::storage_policy::{self, DEFAULT_OUTPUTS_PREFIX, DEFAULT_UPLOAD_PREFIX, PolicyParams, Rule};
use reeve_shared::{aws, startup};

#[derive(Subcommand)]
pub enum StorageCommand {
    /// Print the bucket policy (JSON); with --apply, put it on the bucket.
    Policy(PolicyArgs),
}

#[derive(Args)]
pub struct PolicyArgs {
    /// The bucket.
    #[arg(long, env = reeve_shared::settings::BUCKET)]
    bucket: String,
    /// Prefix of the presigned uploads (the template's UploadPrefix).
    #[arg(long, default_value = DEFAULT_UPLOAD_PREFIX)]
    upload_prefix: String,
    /// Prefix the worker writes task outputs under.
    #[arg(long, default_value = DEFAULT_OUTPUTS_PREFIX)]
    outputs_prefix: String,
    /// Refuse presigned requests whose signature is older than this.
    #[arg(long, default_value_t = 900)]
    max_signature_age_seconds: u64,
    /// AWS partition of the bucket ARN (aws, aws-cn, aws-us-gov).
    #[arg(long, default_value = "aws")]
    partition: String,
    /// Leave out the TLS rule, for a plain-http S3 server such as the local
    /// stack's, where it would refuse every request.
    #[arg(long)]
    local: bool,
    /// Put the policy on the bucket (replacing its policy) instead of only printing it.
    #[arg(long)]
    apply: bool,
}

pub async fn run(command: StorageCommand) -> anyhow::Result<()> {
    match command {
        StorageCommand::Policy(args) => policy(args).await,
    }
}

async fn policy(args: PolicyArgs) -> anyhow::Result<()> {
    let params = PolicyParams {
        bucket: args.bucket,
        partition: args.partition,
        upload_prefix: args.upload_prefix,
        outputs_prefix: args.outputs_prefix,
        max_signature_age_ms: args.max_signature_age_seconds.saturating_mul(1000),
    };
    let rules: &[Rule] = if args.local { &Rule::LOCAL } else { &Rule::ALL };
    let document = storage_policy::document(&params, rules)?;
    println!("{document:#}");
    if !args.apply {
        return Ok(());
    }
    let config = Config::from_env();
    if !args.local && storage_policy::endpoint_is_plain_http(config.s3_endpoint().as_deref()) {
        bail!(
            "the S3 endpoint is plain http: the DenyInsecureTransport rule would lock everyone out of {}, \
             the bucket owner included; use --local to leave it out",
            params.bucket
        );
    }
    let s3 = aws::s3(&startup::sdk().await, config.s3_endpoint().is_some());
    storage_policy::apply(&s3, &params.bucket, &document)
        .await
        .map_err(anyhow::Error::msg)
        .context("applying the bucket policy")?;
    eprintln!("applied {} statement(s) to bucket {}", rules.len(), params.bucket);
    Ok(())
}
