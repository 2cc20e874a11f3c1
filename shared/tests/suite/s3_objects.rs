//! S3 requests and links signed with `aws-sigv4` alone
//! ([`reeve_shared::s3_objects`]), against the stack's S3 (SeaweedFS), which
//! checks SigV4 as S3 does. The SDK's own client, beside them, is the
//! independent witness: what one writes, the other reads.

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_s3::primitives::ByteStream;
use base64::Engine as _;
use futures_util::StreamExt as _;
use reeve_shared::s3_objects::{S3Error, S3Objects};
use reeve_shared::settings::Config;
use sha2::Digest as _;

use crate::common;

const ATTACHMENT: [(&str, &str); 1] = [("response-content-disposition", "attachment")];

fn key(name: &str) -> String {
    format!("outputs/objects-{}/a b+ü/{name}", ulid::Ulid::new())
}

#[tokio::test]
async fn a_signed_link_downloads_the_object_and_nothing_else() {
    let aws = common::aws().await;
    let bucket = common::bucket();
    // A key that must be encoded once in the path: a space, a `+`, non-ASCII.
    let key = key("body");
    let bytes = b"signed without the S3 client".to_vec();
    common::s3()
        .await
        .put_object()
        .bucket(&bucket)
        .key(&key)
        .body(ByteStream::from(bytes.clone()))
        .send()
        .await
        .unwrap();

    let now = SystemTime::now();
    let url = aws.objects.presigned_get(&bucket, &key, &ATTACHMENT, now, Duration::from_secs(60)).await.unwrap();
    let download = reqwest::get(&url).await.unwrap();
    assert_eq!(download.status(), 200, "{url}");
    let disposition = download.headers().get("content-disposition").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(disposition.as_deref(), Some("attachment"));
    assert_eq!(download.bytes().await.unwrap().as_ref(), bytes.as_slice());

    // Each altered part is refused: another key, the signed query dropped,
    // a longer lifetime than was signed.
    let other = url.replacen("/body?", "/other?", 1);
    let unsigned_query = url.replacen("response-content-disposition=attachment&", "", 1);
    let longer = url.replacen("X-Amz-Expires=60", "X-Amz-Expires=600", 1);
    for altered in [other, unsigned_query, longer] {
        assert_ne!(altered, url);
        assert_eq!(reqwest::get(&altered).await.unwrap().status(), 403, "{altered}");
    }

    // A link signed two minutes ago for one minute has expired.
    let past = now - Duration::from_secs(120);
    let expired = aws.objects.presigned_get(&bucket, &key, &ATTACHMENT, past, Duration::from_secs(60)).await.unwrap();
    assert_eq!(reqwest::get(&expired).await.unwrap().status(), 403, "{expired}");
}

/// PUT, HEAD, GET and DELETE, each checked by the SDK's client.
#[tokio::test]
async fn put_head_get_and_delete_an_object() {
    let objects = common::aws().await.objects;
    let sdk = common::s3().await;
    let bucket = common::bucket();
    let key = key("notes.txt");
    let bytes = bytes::Bytes::from_static(b"written by a signed PUT");

    assert_eq!(objects.head(&bucket, &key, false).await.unwrap(), None, "nothing there yet");
    assert!(objects.get(&bucket, &key).await.unwrap().is_none());

    let before = SystemTime::now() - Duration::from_secs(2);
    objects.put(&bucket, &key, "text/plain", bytes.clone()).await.unwrap();
    let stored = sdk.get_object().bucket(&bucket).key(&key).send().await.unwrap();
    assert_eq!(stored.content_type(), Some("text/plain"));
    assert_eq!(stored.body.collect().await.unwrap().into_bytes(), bytes);

    let head = objects.head(&bucket, &key, false).await.unwrap().expect("the object");
    assert_eq!(head.size, Some(bytes.len() as i64));
    assert_eq!(head.content_type.as_deref(), Some("text/plain"));
    let written = head.last_modified.expect("a Last-Modified");
    assert!(written >= before && written <= SystemTime::now() + Duration::from_secs(2), "{written:?}");

    let mut body = objects.get(&bucket, &key).await.unwrap().expect("the object");
    let mut read = Vec::new();
    while let Some(chunk) = body.next().await {
        read.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(read, bytes.as_ref());

    objects.delete(&bucket, &key).await.unwrap();
    assert!(sdk.head_object().bucket(&bucket).key(&key).send().await.is_err(), "deleted");
    assert_eq!(objects.head(&bucket, &key, false).await.unwrap(), None);
    objects.delete(&bucket, &key).await.expect("deleting nothing is no error, as in S3");
}

/// A presigned PUT bound to its length, type and SHA-256: the body that
/// hashes to it is kept, and a HEAD that asks gives the digest back; any
/// other body or header is refused.
#[tokio::test]
async fn a_presigned_put_is_bound_to_its_headers_and_checksum() {
    let objects = common::aws().await.objects;
    let bucket = common::bucket();
    let key = key("out.csv");
    let body = b"word,count\nreeve,1\n".to_vec();
    let sha256 = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&body));
    let length = body.len().to_string();
    let headers =
        [("content-length", length.as_str()), ("content-type", "text/csv"), ("x-amz-checksum-sha256", sha256.as_str())];
    let url = objects.presigned_put(&bucket, &key, &headers, SystemTime::now(), Duration::from_secs(60)).await.unwrap();
    let put = |headers: Vec<(&str, String)>, body: Vec<u8>| {
        let mut request = reqwest::Client::new().put(&url).body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let exact = || headers.iter().map(|(n, v)| (*n, v.to_string())).collect::<Vec<_>>();

    let mut other_type = exact();
    other_type[1].1 = "text/html".into();
    assert_eq!(put(other_type, body.clone()).await, 403, "another type");
    let mut other_body = body.clone();
    other_body[0] = b'W';
    assert_ne!(put(exact(), other_body).await, 200, "a body that does not hash to the signed digest");
    assert_eq!(objects.head(&bucket, &key, true).await.unwrap(), None, "nothing was stored");

    assert_eq!(put(exact(), body.clone()).await, 200);
    let head = objects.head(&bucket, &key, true).await.unwrap().expect("stored");
    assert_eq!(head.checksum_sha256.as_deref(), Some(sha256.as_str()));
    assert_eq!(head.size, Some(body.len() as i64));
    objects.delete(&bucket, &key).await.unwrap();
}

/// Wrong credentials are S3's refusal with its code; no server at all is
/// `Unreachable`, after the retries.
#[tokio::test]
async fn refusals_and_an_unreachable_s3_are_errors() {
    let config = Config::from_env();
    let sdk = reeve_shared::startup::sdk().await;
    let forged = sdk
        .to_builder()
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "forged",
            "not the key",
            None,
            None,
            "test",
        )))
        .build();
    let wrong = S3Objects::new(&forged, config.s3_endpoint());
    let bucket = common::bucket();
    match wrong.head(&bucket, &key("x"), false).await {
        Err(S3Error::Refused { status: 403, .. }) => {}
        other => panic!("a forged signature: {other:?}"),
    }
    match wrong.put(&bucket, &key("x"), "text/plain", bytes::Bytes::from_static(b"no")).await {
        Err(S3Error::Refused { status: 403, code: Some(code) }) => {
            assert!(["InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"].contains(&code.as_str()), "{code}")
        }
        other => panic!("a forged signature: {other:?}"),
    }

    let nowhere = S3Objects::new(&sdk, Some("http://127.0.0.1:9".into()));
    let error = nowhere.head(&bucket, &key("x"), false).await.unwrap_err();
    assert!(matches!(error, S3Error::Unreachable(_)), "{error:?}");
}
