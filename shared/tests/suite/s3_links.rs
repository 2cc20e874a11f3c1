//! Download links signed with `aws-sigv4` alone ([`reeve_shared::s3_links`]),
//! against the stack's S3 (SeaweedFS), which checks SigV4 as S3 does: an
//! object put with the SDK comes back through a link, saved as a download;
//! a link that was altered, or has expired, is refused.

use std::time::{Duration, SystemTime};

use aws_sdk_s3::primitives::ByteStream;

use crate::common;

const ATTACHMENT: [(&str, &str); 1] = [("response-content-disposition", "attachment")];

#[tokio::test]
async fn a_signed_link_downloads_the_object_and_nothing_else() {
    let aws = common::aws().await;
    let bucket = common::bucket();
    // A key that must be encoded once in the path: a space, a `+`, non-ASCII.
    let key = format!("outputs/links-{}/a b+ü/body", ulid::Ulid::new());
    let bytes = b"signed without the S3 client".to_vec();
    aws.s3.put_object().bucket(&bucket).key(&key).body(ByteStream::from(bytes.clone())).send().await.unwrap();

    let now = SystemTime::now();
    let url = aws.s3_links.get(&bucket, &key, &ATTACHMENT, now, Duration::from_secs(60)).await.unwrap();
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
    let expired = aws.s3_links.get(&bucket, &key, &ATTACHMENT, past, Duration::from_secs(60)).await.unwrap();
    assert_eq!(reqwest::get(&expired).await.unwrap().status(), 403, "{expired}");
}
