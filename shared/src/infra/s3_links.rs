//! Presigned S3 GET links, signed with `aws-sigv4` alone.
//!
//! A function that only hands out download links (task-status signs one
//! each time a result is read) has no other use for S3. The SDK's presigner
//! comes with the whole S3 client, `aws_smithy_types` and its endpoint
//! rules, about 1 MiB of a Lambda binary (BENCHMARKS.md, "Cold start and
//! binary size"); a presigned GET is one SigV4 signature over a URL, which
//! this module computes from the SDK configuration's credentials and region.
//!
//! The signature is S3's query-string form: `UNSIGNED-PAYLOAD`, the path
//! taken as written (S3 neither normalises `.`/`..` segments nor decodes the
//! path twice, so the signer must not either), `host` the only signed
//! header, and a session token, when the credentials have one (Lambda's
//! always do), signed into the query as S3 requires.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::SdkConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{
    PercentEncodingMode, SessionTokenMode, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// What SigV4 leaves as it is in a URI: the unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
/// In an object key, `/` separates segments and stays.
const KEY: &AsciiSet = &UNRESERVED.remove(b'/');

/// Signs GET links to a bucket's objects, on the SDK configuration's
/// credentials and region. Cheap to clone: clones share their credentials.
#[derive(Clone, Debug)]
pub struct S3Links {
    credentials: Option<SharedCredentialsProvider>,
    region: Option<String>,
    /// A local S3 (SeaweedFS), addressed path-style: it has no per-bucket
    /// DNS names. `None` is AWS's S3, addressed by virtual host.
    endpoint: Option<String>,
    /// The last credentials the provider gave. The SDK caches them inside
    /// each client; a signer without a client keeps its own, so a provider
    /// that calls out (a container's or an instance's role) is asked again
    /// only when they are about to expire.
    cached: Arc<Mutex<Option<Credentials>>>,
}

impl S3Links {
    /// `endpoint`: the S3 endpoint when it is not AWS's (`Config::s3_endpoint`).
    pub fn new(config: &SdkConfig, endpoint: Option<String>) -> Self {
        S3Links {
            credentials: config.credentials_provider(),
            region: config.region().map(|region| region.to_string()),
            endpoint: endpoint.map(|url| url.trim_end_matches('/').to_owned()),
            cached: Arc::default(),
        }
    }

    /// A link that GETs `key` from `bucket`, valid from `start` for
    /// `lifetime` (whole seconds), with `query` (unsigned names and values,
    /// such as `response-content-disposition`) signed into it.
    pub async fn get(
        &self,
        bucket: &str,
        key: &str,
        query: &[(&str, &str)],
        start: SystemTime,
        lifetime: Duration,
    ) -> Result<String, String> {
        let region = self.region.as_deref().ok_or("no AWS region is configured")?;
        let credentials = self.credentials(start + lifetime).await?;
        let key = utf8_percent_encode(key, KEY);
        let url = match &self.endpoint {
            Some(endpoint) => format!("{endpoint}/{bucket}/{key}"),
            None => format!("{}/{key}", aws_host(bucket, region)),
        };
        presign_get(&url, query, &credentials, region, start, lifetime)
    }

    /// Credentials that last until `needed_until` if the provider can give
    /// such: a link cannot outlive the session token it was signed with.
    async fn credentials(&self, needed_until: SystemTime) -> Result<Credentials, String> {
        let lasting = |c: &Credentials| c.expiry().is_none_or(|expiry| expiry >= needed_until);
        if let Some(cached) = self.cached.lock().expect("not poisoned").as_ref().filter(|c| lasting(c)) {
            return Ok(cached.clone());
        }
        let provider = self.credentials.as_ref().ok_or("no AWS credentials are configured")?;
        let fresh = provider.provide_credentials().await.map_err(|e| format!("AWS credentials: {e}"))?;
        *self.cached.lock().expect("not poisoned") = Some(fresh.clone());
        Ok(fresh)
    }
}

/// `https://<bucket>.s3.<region>.amazonaws.com`, or path-style on the
/// regional endpoint for a bucket name with a dot, which no wildcard
/// certificate covers (as the SDK does).
fn aws_host(bucket: &str, region: &str) -> String {
    let domain = if region.starts_with("cn-") { "amazonaws.com.cn" } else { "amazonaws.com" };
    if bucket.contains('.') {
        format!("https://s3.{region}.{domain}/{bucket}")
    } else {
        format!("https://{bucket}.s3.{region}.{domain}")
    }
}

/// `url` (scheme, host and an already encoded path) with `query` and the
/// SigV4 query parameters of a presigned GET appended.
pub fn presign_get(
    url: &str,
    query: &[(&str, &str)],
    credentials: &Credentials,
    region: &str,
    start: SystemTime,
    lifetime: Duration,
) -> Result<String, String> {
    let mut unsigned = url.to_owned();
    for (i, (name, value)) in query.iter().enumerate() {
        let separator = if i == 0 { '?' } else { '&' };
        let _ = write!(
            unsigned,
            "{separator}{}={}",
            utf8_percent_encode(name, UNRESERVED),
            utf8_percent_encode(value, UNRESERVED)
        );
    }
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(lifetime);
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.session_token_mode = SessionTokenMode::Include;
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("s3")
        .time(start)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let request = SignableRequest::new("GET", unsigned.as_str(), std::iter::empty(), SignableBody::UnsignedPayload)
        .map_err(|e| e.to_string())?;
    let (instructions, _) = sign(request, &params).map_err(|e| e.to_string())?.into_parts();
    let mut signed = unsigned;
    for (i, (name, value)) in instructions.params().iter().enumerate() {
        let separator = if i == 0 && query.is_empty() { '?' } else { '&' };
        let _ = write!(signed, "{separator}{name}={}", utf8_percent_encode(value, UNRESERVED));
    }
    Ok(signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's published example of a presigned GET ("Authenticating Requests:
    /// Using Query Parameters (AWS Signature Version 4)", S3 API Reference):
    /// `test.txt` in `examplebucket`, signed on 24 May 2013 for 86400 s with
    /// the documentation's example key, no session token.
    #[test]
    fn signs_aws_documented_example() {
        let credentials = Credentials::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "the S3 documentation",
        );
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600); // 2013-05-24T00:00:00Z
        let url = presign_get(
            "https://examplebucket.s3.amazonaws.com/test.txt",
            &[],
            &credentials,
            "us-east-1",
            start,
            Duration::from_secs(86400),
        )
        .unwrap();
        assert_eq!(
            url,
            "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256\
             &X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request\
             &X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host\
             &X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
        );
    }

    /// A session token is signed into the query (S3 refuses one added
    /// after), and the extra query and the key are encoded once.
    #[test]
    fn session_token_and_query_are_signed() {
        let credentials = Credentials::new("AKID", "secret", Some("token/with+chars".into()), None, "test");
        let url = presign_get(
            "https://b.s3.eu-west-1.amazonaws.com/outputs/a%20b/body",
            &[("response-content-disposition", "attachment")],
            &credentials,
            "eu-west-1",
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            Duration::from_secs(900),
        )
        .unwrap();
        assert!(
            url.starts_with(
                "https://b.s3.eu-west-1.amazonaws.com/outputs/a%20b/body?response-content-disposition=attachment&"
            ),
            "{url}"
        );
        assert!(url.contains("&X-Amz-Security-Token=token%2Fwith%2Bchars"), "{url}");
        assert!(url.contains("&X-Amz-SignedHeaders=host&"), "{url}");
        assert!(url.contains("&X-Amz-Expires=900&"), "{url}");
    }

    #[test]
    fn aws_buckets_by_virtual_host_unless_dotted() {
        assert_eq!(aws_host("reeve-out", "eu-west-1"), "https://reeve-out.s3.eu-west-1.amazonaws.com");
        assert_eq!(aws_host("a.b", "us-east-1"), "https://s3.us-east-1.amazonaws.com/a.b");
        assert_eq!(aws_host("x", "cn-north-1"), "https://x.s3.cn-north-1.amazonaws.com.cn");
    }
}
