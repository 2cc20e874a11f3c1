//! The generated bucket policy on the local SeaweedFS: a fresh bucket gets
//! the statements that make sense over plain http ([`Rule::LOCAL`]), and a
//! PUT outside the upload and outputs prefixes is then refused with 403,
//! while one inside is allowed, by header auth and by presigned URL alike.
//!
//! Left out locally: `DenyInsecureTransport`. The local S3 endpoint is plain
//! http, so `aws:SecureTransport` is false for every request and the
//! statement would refuse them all, the bucket owner's included (SeaweedFS
//! does evaluate it). On AWS every request uses TLS and it applies as written.

use std::time::{Duration, SystemTime};

use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use reeve_shared::storage_policy::{self, PolicyParams, Rule};

struct TestBucket {
    s3: aws_sdk_s3::Client,
    name: String,
}

impl TestBucket {
    async fn new() -> TestBucket {
        let s3 = crate::common::s3().await;
        let name = format!("reeve-policy-{}", ulid::Ulid::new().to_string().to_lowercase());
        s3.create_bucket().bucket(&name).send().await.expect("SeaweedFS is up (scripts/stack.sh up)");
        TestBucket { s3, name }
    }

    /// PUT with the stack's credentials (header auth): the HTTP status.
    async fn put(&self, key: &str) -> u16 {
        let result = self
            .s3
            .put_object()
            .bucket(&self.name)
            .key(key)
            .content_type("text/plain")
            .body(ByteStream::from_static(b"hello"))
            .send()
            .await;
        match result {
            Ok(_) => 200,
            Err(e) => e.raw_response().map_or(0, |r| r.status().as_u16()),
        }
    }

    /// PUT through a presigned URL signed at `start`: the HTTP status.
    async fn put_presigned(&self, key: &str, start: SystemTime, expires_in: Duration) -> u16 {
        let config = PresigningConfig::builder().start_time(start).expires_in(expires_in).build().unwrap();
        let presigned = self
            .s3
            .put_object()
            .bucket(&self.name)
            .key(key)
            .content_length(5)
            .content_type("text/plain")
            .presigned(config)
            .await
            .unwrap();
        let mut request = reqwest::Client::new().put(presigned.uri()).body("hello");
        for (name, value) in presigned.headers() {
            request = request.header(name, value);
        }
        request.send().await.expect("S3 answers").status().as_u16()
    }

    async fn delete(self) {
        let _ = self.s3.delete_bucket_policy().bucket(&self.name).send().await;
        let listed = self.s3.list_objects_v2().bucket(&self.name).send().await.unwrap();
        for object in listed.contents() {
            self.s3.delete_object().bucket(&self.name).key(object.key().unwrap()).send().await.unwrap();
        }
        self.s3.delete_bucket().bucket(&self.name).send().await.unwrap();
    }
}

#[tokio::test]
async fn put_outside_the_upload_prefixes_is_denied_on_seaweedfs() {
    let bucket = TestBucket::new().await;
    // Before the policy, anything goes.
    assert_eq!(bucket.put("elsewhere/before.txt").await, 200);

    let policy = storage_policy::document(&PolicyParams::new(&bucket.name), &Rule::LOCAL).unwrap();
    storage_policy::apply(&bucket.s3, &bucket.name, &policy).await.unwrap();
    let stored = bucket.s3.get_bucket_policy().bucket(&bucket.name).send().await.unwrap();
    let stored: serde_json::Value = serde_json::from_str(stored.policy().unwrap()).unwrap();
    assert_eq!(stored["Statement"], policy["Statement"], "SeaweedFS keeps the policy as given");

    // Header-signed PUTs.
    assert_eq!(bucket.put("elsewhere/after.txt").await, 403, "outside the prefixes");
    assert_eq!(bucket.put("top-level.txt").await, 403, "at the top level");
    assert_eq!(bucket.put("incomingX/look-alike.txt").await, 403, "a look-alike prefix");
    assert_eq!(bucket.put("incoming/tasks/ab/01J/in.txt").await, 200, "inside the upload prefix");
    assert_eq!(bucket.put("outputs/01J/out.txt").await, 200, "inside the outputs prefix");

    // Presigned PUTs, as clients send them.
    let now = SystemTime::now();
    let fifteen = Duration::from_secs(900);
    assert_eq!(bucket.put_presigned("elsewhere/p.txt", now, fifteen).await, 403);
    assert_eq!(bucket.put_presigned("incoming/tasks/ab/01J/p.txt", now, fifteen).await, 200);

    bucket.delete().await;
}

/// `s3:signatureAge` on SeaweedFS: it accepts and stores the statement, but
/// does not evaluate the key, so a presigned URL signed 20 minutes ago (and
/// still within its own expiry) is let through. On AWS S3 the same statement
/// refuses it. This test pins what SeaweedFS does, so a change shows up here.
#[tokio::test]
async fn seaweedfs_stores_the_signature_age_rule_but_does_not_enforce_it() {
    let bucket = TestBucket::new().await;
    // 1 ms: a 20-minute-old signature is over it in any unit.
    let params = PolicyParams { max_signature_age_ms: 1, ..PolicyParams::new(&bucket.name) };
    let policy = storage_policy::document(&params, &[Rule::DenyStalePresignedRequests]).unwrap();
    storage_policy::apply(&bucket.s3, &bucket.name, &policy).await.unwrap();

    let fresh = bucket.put_presigned("incoming/fresh.txt", SystemTime::now(), Duration::from_secs(900)).await;
    assert_eq!(fresh, 200);
    let twenty_minutes_ago = SystemTime::now() - Duration::from_secs(20 * 60);
    let stale = bucket.put_presigned("incoming/stale.txt", twenty_minutes_ago, Duration::from_secs(3600)).await;
    assert_eq!(stale, 200, "SeaweedFS now enforces s3:signatureAge: make this test expect 403");

    bucket.delete().await;
}

#[test]
fn the_tls_rule_is_left_out_only_where_the_endpoint_is_plain_http() {
    // The stack's endpoint is http://127.0.0.1:8333.
    assert!(
        storage_policy::endpoint_is_plain_http(reeve_shared::settings::Config::from_env().s3_endpoint().as_deref()),
        "the local stack's S3 endpoint is plain http"
    );
    assert!(!Rule::LOCAL.contains(&Rule::DenyInsecureTransport));
    assert!(Rule::ALL.contains(&Rule::DenyInsecureTransport));
}
