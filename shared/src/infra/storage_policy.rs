//! The bucket policy (docs/architecture.md#the-bucket-policy), generated from the same parameters the
//! SAM template's `AWS::S3::BucketPolicy` uses. `shared/tests/suite/template.rs`
//! checks that the template holds exactly [`document`]'s statements.
//!
//! Only condition keys that S3 supports are used. There is no
//! `s3:content-length` key for PUT: S3 rejects a policy that uses it as
//! malformed, and so do S3-compatible servers. Sizes are enforced by the
//! signed `Content-Length` of each presigned PUT, the upload guard and the
//! HEAD checks of task create and the worker (see `uploads`).

#[cfg(feature = "storage")]
use aws_sdk_s3::error::DisplayErrorContext;
use serde_json::{Value, json};

/// Where the upload guard watches and presigned PUTs land (the template's
/// `UploadPrefix` default). Upload keys start with `incoming/tasks/`.
pub const DEFAULT_UPLOAD_PREFIX: &str = "incoming/";
/// Where the worker stores what tasks produce (the `fetch` executor).
pub const DEFAULT_OUTPUTS_PREFIX: &str = "outputs/";
/// A presigned URL's signature older than this is refused: 15 minutes, the
/// longest upload URL expiry Reeve hands out by default.
pub const DEFAULT_MAX_SIGNATURE_AGE_MS: u64 = 15 * 60 * 1000;

/// One statement of the policy, by its `Sid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Deny every request that does not use TLS (`aws:SecureTransport`).
    DenyInsecureTransport,
    /// Deny presigned requests whose signature is older than the maximum
    /// age (`s3:authType` = `REST-QUERY-STRING`, `s3:signatureAge` in ms).
    DenyStalePresignedRequests,
    /// Deny `s3:PutObject` anywhere but the upload and outputs prefixes.
    DenyPutOutsideUploadPrefixes,
}

impl Rule {
    pub const ALL: [Rule; 3] =
        [Rule::DenyInsecureTransport, Rule::DenyStalePresignedRequests, Rule::DenyPutOutsideUploadPrefixes];

    /// The rules that make sense on a plain-http local S3 server: the TLS
    /// rule would refuse every request there, the bucket owner's included.
    pub const LOCAL: [Rule; 2] = [Rule::DenyStalePresignedRequests, Rule::DenyPutOutsideUploadPrefixes];

    pub fn sid(self) -> &'static str {
        match self {
            Rule::DenyInsecureTransport => "DenyInsecureTransport",
            Rule::DenyStalePresignedRequests => "DenyStalePresignedRequests",
            Rule::DenyPutOutsideUploadPrefixes => "DenyPutOutsideUploadPrefixes",
        }
    }
}

/// What the policy is made from; the template's parameters of the same names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyParams {
    pub bucket: String,
    /// The AWS partition of the bucket's ARN (`aws`, `aws-cn`, `aws-us-gov`).
    pub partition: String,
    pub upload_prefix: String,
    pub outputs_prefix: String,
    pub max_signature_age_ms: u64,
}

impl PolicyParams {
    pub fn new(bucket: impl Into<String>) -> Self {
        PolicyParams {
            bucket: bucket.into(),
            partition: "aws".to_owned(),
            upload_prefix: DEFAULT_UPLOAD_PREFIX.to_owned(),
            outputs_prefix: DEFAULT_OUTPUTS_PREFIX.to_owned(),
            max_signature_age_ms: DEFAULT_MAX_SIGNATURE_AGE_MS,
        }
    }

    fn bucket_arn(&self) -> String {
        format!("arn:{}:s3:::{}", self.partition, self.bucket)
    }

    fn objects_arn(&self, prefix: &str) -> String {
        format!("{}/{prefix}*", self.bucket_arn())
    }
}

/// Why parameters cannot make a policy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("bucket name {0:?} is not a valid S3 bucket name")]
    BadBucket(String),
    #[error("{what} {value:?} must be non-empty, end with '/', and not contain '*', '?' or '$'")]
    BadPrefix { what: &'static str, value: String },
    #[error("the maximum signature age must be positive")]
    BadAge,
}

fn check(params: &PolicyParams) -> Result<(), PolicyError> {
    let b = &params.bucket;
    let bucket_ok = (3..=63).contains(&b.len())
        && b.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && b.starts_with(|c: char| c.is_ascii_alphanumeric())
        && b.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !bucket_ok {
        return Err(PolicyError::BadBucket(b.clone()));
    }
    for (what, value) in [("upload prefix", &params.upload_prefix), ("outputs prefix", &params.outputs_prefix)] {
        if value.is_empty() || !value.ends_with('/') || value.contains(['*', '?', '$']) || value.starts_with('/') {
            return Err(PolicyError::BadPrefix { what, value: value.clone() });
        }
    }
    if params.max_signature_age_ms == 0 {
        return Err(PolicyError::BadAge);
    }
    Ok(())
}

/// One statement, exactly as the template writes it.
pub fn statement(params: &PolicyParams, rule: Rule) -> Value {
    match rule {
        Rule::DenyInsecureTransport => json!({
            "Sid": rule.sid(),
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [params.bucket_arn(), params.objects_arn("")],
            "Condition": { "Bool": { "aws:SecureTransport": "false" } }
        }),
        Rule::DenyStalePresignedRequests => json!({
            "Sid": rule.sid(),
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": params.objects_arn(""),
            "Condition": {
                "StringEquals": { "s3:authType": "REST-QUERY-STRING" },
                "NumericGreaterThan": { "s3:signatureAge": params.max_signature_age_ms.to_string() }
            }
        }),
        Rule::DenyPutOutsideUploadPrefixes => json!({
            "Sid": rule.sid(),
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:PutObject",
            "NotResource": [
                params.objects_arn(&params.upload_prefix),
                params.objects_arn(&params.outputs_prefix)
            ]
        }),
    }
}

/// The policy document with the given rules, in [`Rule::ALL`]'s order.
pub fn document(params: &PolicyParams, rules: &[Rule]) -> Result<Value, PolicyError> {
    check(params)?;
    let statements: Vec<Value> =
        Rule::ALL.iter().filter(|rule| rules.contains(rule)).map(|&rule| statement(params, rule)).collect();
    Ok(json!({ "Version": "2012-10-17", "Statement": statements }))
}

#[cfg(feature = "storage")]
/// Puts `policy` on `bucket`, replacing any policy it had.
pub async fn apply(s3: &aws_sdk_s3::Client, bucket: &str, policy: &Value) -> Result<(), String> {
    s3.put_bucket_policy()
        .bucket(bucket)
        .policy(policy.to_string())
        .send()
        .await
        .map(drop)
        .map_err(|e| format!("put-bucket-policy on {bucket}: {}", DisplayErrorContext(&e)))
}

/// True when S3 is at a plain http `endpoint` (a local server), where
/// [`Rule::DenyInsecureTransport`] would lock everyone out.
pub fn endpoint_is_plain_http(endpoint: Option<&str>) -> bool {
    endpoint.is_some_and(|url| url.trim().to_ascii_lowercase().starts_with("http://"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_policy_has_the_three_rules_and_no_size_key() {
        let doc = document(&PolicyParams::new("reeve-prod"), &Rule::ALL).unwrap();
        let text = doc.to_string();
        let sids: Vec<&str> = doc["Statement"].as_array().unwrap().iter().map(|s| s["Sid"].as_str().unwrap()).collect();
        assert_eq!(sids, ["DenyInsecureTransport", "DenyStalePresignedRequests", "DenyPutOutsideUploadPrefixes"]);
        assert!(text.contains(r#""aws:SecureTransport":"false""#), "{text}");
        assert!(text.contains(r#""s3:signatureAge":"900000""#), "{text}");
        assert!(text.contains("arn:aws:s3:::reeve-prod/incoming/*"), "{text}");
        assert!(text.contains("arn:aws:s3:::reeve-prod/outputs/*"), "{text}");
        assert!(!text.contains("content-length"), "S3 has no s3:content-length key: {text}");
    }

    #[test]
    fn local_rules_leave_out_tls_and_keep_the_order() {
        let doc = document(
            &PolicyParams::new("reeve-local"),
            &[Rule::DenyPutOutsideUploadPrefixes, Rule::DenyStalePresignedRequests],
        )
        .unwrap();
        let sids: Vec<&str> = doc["Statement"].as_array().unwrap().iter().map(|s| s["Sid"].as_str().unwrap()).collect();
        assert_eq!(sids, ["DenyStalePresignedRequests", "DenyPutOutsideUploadPrefixes"]);
        assert!(!Rule::LOCAL.contains(&Rule::DenyInsecureTransport));
    }

    #[test]
    fn parameters_flow_into_the_statements() {
        let params = PolicyParams {
            partition: "aws-cn".into(),
            upload_prefix: "in/".into(),
            outputs_prefix: "out/".into(),
            max_signature_age_ms: 60_000,
            ..PolicyParams::new("b-1.example")
        };
        let put = statement(&params, Rule::DenyPutOutsideUploadPrefixes);
        assert_eq!(
            put["NotResource"],
            json!(["arn:aws-cn:s3:::b-1.example/in/*", "arn:aws-cn:s3:::b-1.example/out/*"])
        );
        let stale = statement(&params, Rule::DenyStalePresignedRequests);
        assert_eq!(stale["Condition"]["NumericGreaterThan"]["s3:signatureAge"], "60000");
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(matches!(document(&PolicyParams::new("Bad_Bucket"), &Rule::ALL), Err(PolicyError::BadBucket(_))));
        let no_slash = PolicyParams { upload_prefix: "incoming".into(), ..PolicyParams::new("reeve") };
        assert!(matches!(document(&no_slash, &Rule::ALL), Err(PolicyError::BadPrefix { .. })));
        let wildcard = PolicyParams { outputs_prefix: "*/".into(), ..PolicyParams::new("reeve") };
        assert!(matches!(document(&wildcard, &Rule::ALL), Err(PolicyError::BadPrefix { .. })));
        let zero = PolicyParams { max_signature_age_ms: 0, ..PolicyParams::new("reeve") };
        assert_eq!(document(&zero, &Rule::ALL), Err(PolicyError::BadAge));
    }
}
