//! S3 objects read, written and linked to with `aws-sigv4` alone: a HEAD,
//! a PUT of a small body, a DELETE, and presigned GET and PUT links.
//!
//! The API functions ask S3 for nothing more: presign signs upload links,
//! task-create and MCP check that an upload is there (a HEAD) and delete
//! one that is not what was declared, MCP stores an inline file, the report
//! route signs a service's output PUT and HEADs what it wrote, task-status
//! signs download links. The SDK's S3 client, with its endpoint rules,
//! checksum machinery and XML codecs, was about 1.3 MiB of each of those
//! binaries (BENCHMARKS.md, "Cold start and binary size"); each call here is
//! one signed request over the same reqwest client the SDK's others use
//! ([`crate::infra::aws_http`]). The worker keeps the client for what needs
//! its codecs: streamed GETs and multipart uploads.
//!
//! Signatures are S3's: the path taken as written (S3 neither normalises
//! `.`/`..` segments nor decodes the path twice, so the signer must not
//! either), and a session token, when the credentials have one (Lambda's
//! always do), signed in. A request carries its body's SHA-256 as
//! `x-amz-content-sha256`, which S3 checks; a presigned link is
//! `UNSIGNED-PAYLOAD`, bound instead to the headers it is signed with.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::SdkConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SessionTokenMode, SignableBody, SignableRequest, SignatureLocation,
    SigningSettings, UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;

/// What SigV4 leaves as it is in a URI: the unreserved characters.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
/// In an object key, `/` separates segments and stays.
const KEY: &AsciiSet = &UNRESERVED.remove(b'/');

/// Attempts per request, as the SDK's standard retry strategy makes.
const ATTEMPTS: u32 = 3;
/// The SDK's default connect timeout, when the configuration sets none.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(3100);
/// How long a request may wait for the next bytes of its answer, when the
/// configuration sets no read timeout: the SDK's client waited forever, and
/// a function would stall until Lambda ended it.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// No region or credentials, or a request that cannot be signed.
    #[error("{0}")]
    Setup(String),
    /// No answer, after every attempt.
    #[error("S3 did not answer: {0}")]
    Unreachable(String),
    /// An answer that is not a success (after every attempt, if it was one
    /// worth retrying), with S3's error code when its body has one.
    #[error("S3 answered {status}{}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
    Refused { status: u16, code: Option<String> },
}

/// An object as a HEAD shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub size: Option<i64>,
    pub content_type: Option<String>,
    pub last_modified: Option<SystemTime>,
    /// `x-amz-checksum-sha256` (base64), asked for with
    /// `x-amz-checksum-mode: ENABLED`: the digest S3 verified the body
    /// against when it was written, if its PUT carried one.
    pub checksum_sha256: Option<String>,
}

/// Signs requests to a bucket's objects, and links to them, on the SDK
/// configuration's credentials and region. Cheap to clone: clones share
/// their credentials and connections.
#[derive(Clone, Debug)]
pub struct S3Objects {
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
    http: reqwest::Client,
}

impl S3Objects {
    /// `endpoint`: the S3 endpoint when it is not AWS's (`Config::s3_endpoint`).
    /// The timeouts are the configuration's, as the SDK's clients take them.
    pub fn new(config: &SdkConfig, endpoint: Option<String>) -> Self {
        let timeouts = config.timeout_config();
        let connect = timeouts.and_then(|t| t.connect_timeout()).unwrap_or(CONNECT_TIMEOUT);
        let read = timeouts.and_then(|t| t.read_timeout()).unwrap_or(READ_TIMEOUT);
        S3Objects {
            credentials: config.credentials_provider(),
            region: config.region().map(|region| region.to_string()),
            endpoint: endpoint.map(|url| url.trim_end_matches('/').to_owned()),
            cached: Arc::default(),
            http: crate::infra::aws_http::reqwest_client(Some(connect), Some(read)),
        }
    }

    /// A link that GETs `key` from `bucket`, valid from `start` for
    /// `lifetime` (whole seconds), with `query` (unsigned names and values,
    /// such as `response-content-disposition`) signed into it.
    pub async fn presigned_get(
        &self,
        bucket: &str,
        key: &str,
        query: &[(&str, &str)],
        start: SystemTime,
        lifetime: Duration,
    ) -> Result<String, S3Error> {
        self.presigned("GET", bucket, key, &[], query, start, lifetime).await
    }

    /// A link that PUTs `key` in `bucket`, valid from `start` for
    /// `lifetime`, bound to `headers` (names in lower case): the PUT must
    /// carry exactly these, or S3 refuses it (`403 SignatureDoesNotMatch`).
    pub async fn presigned_put(
        &self,
        bucket: &str,
        key: &str,
        headers: &[(&str, &str)],
        start: SystemTime,
        lifetime: Duration,
    ) -> Result<String, S3Error> {
        self.presigned("PUT", bucket, key, headers, &[], start, lifetime).await
    }

    #[allow(clippy::too_many_arguments)] // Each is one part of the signature.
    async fn presigned(
        &self,
        method: &str,
        bucket: &str,
        key: &str,
        headers: &[(&str, &str)],
        query: &[(&str, &str)],
        start: SystemTime,
        lifetime: Duration,
    ) -> Result<String, S3Error> {
        let (url, region) = self.url(bucket, key)?;
        let credentials = self.credentials(start + lifetime).await?;
        presign(method, &url, headers, query, &credentials, region, start, lifetime).map_err(S3Error::Setup)
    }

    /// The object under `key`, or `None` when there is none (`404`). With
    /// `checksum`, asks for its SHA-256 checksum too.
    pub async fn head(&self, bucket: &str, key: &str, checksum: bool) -> Result<Option<Head>, S3Error> {
        let mode: &[(&str, &str)] = if checksum { &[("x-amz-checksum-mode", "ENABLED")] } else { &[] };
        let response = match self.send(Method::HEAD, bucket, key, mode, Bytes::new()).await {
            Ok(response) => response,
            Err(S3Error::Refused { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        Ok(Some(Head {
            // Not `content_length()`: a HEAD's body is empty whatever the
            // header says.
            size: header("content-length").and_then(|v| v.parse().ok()),
            content_type: header("content-type"),
            last_modified: header("last-modified").and_then(|v| httpdate::parse_http_date(&v).ok()),
            checksum_sha256: header("x-amz-checksum-sha256"),
        }))
    }

    /// The object's body as it streams in, or `None` when there is none.
    pub async fn get(
        &self,
        bucket: &str,
        key: &str,
    ) -> Result<Option<impl futures_util::Stream<Item = Result<Bytes, reqwest::Error>> + use<>>, S3Error> {
        match self.send(Method::GET, bucket, key, &[], Bytes::new()).await {
            Ok(response) => Ok(Some(response.bytes_stream())),
            Err(S3Error::Refused { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `body` under `key`, with its type.
    pub async fn put(&self, bucket: &str, key: &str, content_type: &str, body: Bytes) -> Result<(), S3Error> {
        self.send(Method::PUT, bucket, key, &[("content-type", content_type)], body).await.map(drop)
    }

    /// Deletes the object under `key`; none there is no error, as in S3.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<(), S3Error> {
        self.send(Method::DELETE, bucket, key, &[], Bytes::new()).await.map(drop)
    }

    /// One signed request, signed anew for each attempt: a connection that
    /// fails, a timeout, a `5xx` or a `429` is tried again after a jittered
    /// backoff, as the SDK's standard strategy does; any other answer that
    /// is not a success is [`S3Error::Refused`].
    async fn send(
        &self,
        method: Method,
        bucket: &str,
        key: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<reqwest::Response, S3Error> {
        let (url, region) = self.url(bucket, key)?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let now = SystemTime::now();
            // Credentials that outlast the request by a margin for its clock.
            let credentials = self.credentials(now + Duration::from_secs(60)).await?;
            let signed = sign_headers(method.as_str(), &url, headers, &body, &credentials, region, now)
                .map_err(S3Error::Setup)?;
            let mut request = self.http.request(method.clone(), &url).body(body.clone());
            for (name, value) in headers.iter().copied().chain(signed.iter().map(|(n, v)| (n.as_str(), v.as_str()))) {
                request = request.header(name, value);
            }
            let retry = match request.send().await {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => {
                    let status = response.status().as_u16();
                    let transient = status >= 500 || status == 429;
                    if !transient || attempt == ATTEMPTS {
                        let code = error_code(&response.text().await.unwrap_or_default());
                        return Err(S3Error::Refused { status, code });
                    }
                    format!("status {status}")
                }
                Err(e) if attempt < ATTEMPTS && (e.is_connect() || e.is_timeout() || e.is_request()) => e.to_string(),
                Err(e) => return Err(S3Error::Unreachable(e.to_string())),
            };
            let backoff = jittered(Duration::from_secs(1) * 2u32.pow(attempt - 1));
            tracing::debug!(%method, key, attempt, error = %retry, ?backoff, "S3 request failed; trying again");
            tokio::time::sleep(backoff).await;
        }
    }

    /// The object's URL (its key encoded once) and the region to sign for.
    fn url(&self, bucket: &str, key: &str) -> Result<(String, &str), S3Error> {
        let region = self.region.as_deref().ok_or_else(|| S3Error::Setup("no AWS region is configured".into()))?;
        let key = utf8_percent_encode(key, KEY);
        let url = match &self.endpoint {
            Some(endpoint) => format!("{endpoint}/{bucket}/{key}"),
            None => format!("{}/{key}", aws_host(bucket, region)),
        };
        Ok((url, region))
    }

    /// Credentials that last until `needed_until` if the provider can give
    /// such: a link cannot outlive the session token it was signed with.
    async fn credentials(&self, needed_until: SystemTime) -> Result<Credentials, S3Error> {
        let lasting = |c: &Credentials| c.expiry().is_none_or(|expiry| expiry >= needed_until);
        if let Some(cached) = self.cached.lock().expect("not poisoned").as_ref().filter(|c| lasting(c)) {
            return Ok(cached.clone());
        }
        let provider =
            self.credentials.as_ref().ok_or_else(|| S3Error::Setup("no AWS credentials are configured".into()))?;
        let fresh =
            provider.provide_credentials().await.map_err(|e| S3Error::Setup(format!("AWS credentials: {e}")))?;
        *self.cached.lock().expect("not poisoned") = Some(fresh.clone());
        Ok(fresh)
    }
}

/// A duration between half of `ceiling` and all of it: clients that failed
/// together do not all come back at once.
fn jittered(ceiling: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let _ = getrandom::fill(&mut byte);
    ceiling / 2 + ceiling / 2 * u32::from(byte[0]) / 255
}

/// The `<Code>` of S3's XML error body, if it has one: a short name such as
/// `AccessDenied`, never the body itself (which may quote the request).
fn error_code(body: &str) -> Option<String> {
    let start = body.find("<Code>")? + "<Code>".len();
    let code = &body[start..start + body[start..].find("</Code>")?];
    (code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| code.to_owned())
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

/// S3's signing settings, with the signature in `location`.
fn settings(location: SignatureLocation) -> SigningSettings {
    let mut settings = SigningSettings::default();
    settings.signature_location = location;
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.session_token_mode = SessionTokenMode::Include;
    settings
}

/// The headers that sign a request of `body` to `url` (scheme, host and an
/// already encoded path) carrying `headers`: `authorization`,
/// `x-amz-date`, `x-amz-content-sha256`, and a session token's.
fn sign_headers(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    credentials: &Credentials,
    region: &str,
    time: SystemTime,
) -> Result<Vec<(String, String)>, String> {
    let mut settings = settings(SignatureLocation::Headers);
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let identity = credentials.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("s3")
        .time(time)
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let request = SignableRequest::new(method, url, headers.iter().copied(), SignableBody::Bytes(body))
        .map_err(|e| e.to_string())?;
    let (instructions, _) = sign(request, &params).map_err(|e| e.to_string())?.into_parts();
    Ok(instructions.headers().map(|(name, value)| (name.to_owned(), value.to_owned())).collect())
}

/// `url` (scheme, host and an already encoded path) with `query` and the
/// SigV4 query parameters of a presigned `method` appended, bound to
/// `headers` besides `host`.
#[allow(clippy::too_many_arguments)] // Each is one part of the signature.
pub fn presign(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
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
    let mut settings = settings(SignatureLocation::QueryParams);
    settings.expires_in = Some(lifetime);
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
    let request =
        SignableRequest::new(method, unsigned.as_str(), headers.iter().copied(), SignableBody::UnsignedPayload)
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
        let url = presign(
            "GET",
            "https://examplebucket.s3.amazonaws.com/test.txt",
            &[],
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
        let url = presign(
            "GET",
            "https://b.s3.eu-west-1.amazonaws.com/outputs/a%20b/body",
            &[],
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

    /// AWS's published example of a signed request ("Signature Calculations
    /// for the Authorization Header: Transferring Payload in a Single
    /// Chunk", S3 API Reference): a GET of `test.txt`'s first ten bytes,
    /// the same day and key as above. (The signer separates the header's
    /// parts with ", " where the example has ","; S3 reads both.)
    #[test]
    fn signs_aws_documented_header_example() {
        let credentials = Credentials::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "the S3 documentation",
        );
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600);
        let url = "https://examplebucket.s3.amazonaws.com/test.txt";
        let signed = sign_headers("GET", url, &[("range", "bytes=0-9")], b"", &credentials, "us-east-1", time).unwrap();
        let header = |name: &str| signed.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(
            header("authorization"),
            Some(
                "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
                 SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
                 Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
            )
        );
        assert_eq!(
            header("x-amz-content-sha256"),
            Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        );
    }

    #[test]
    fn error_codes_are_names_only() {
        let body = "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>no</Message></Error>";
        assert_eq!(error_code(body).as_deref(), Some("AccessDenied"));
        assert_eq!(error_code("<Code>a b</Code>"), None);
        assert_eq!(error_code("<html>bad gateway</html>"), None);
    }

    #[test]
    fn aws_buckets_by_virtual_host_unless_dotted() {
        assert_eq!(aws_host("reeve-out", "eu-west-1"), "https://reeve-out.s3.eu-west-1.amazonaws.com");
        assert_eq!(aws_host("a.b", "us-east-1"), "https://s3.us-east-1.amazonaws.com/a.b");
        assert_eq!(aws_host("x", "cn-north-1"), "https://x.s3.cn-north-1.amazonaws.com.cn");
    }
}
