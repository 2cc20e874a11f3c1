//! The roots of trust every TLS client of a Reeve process uses: Mozilla's
//! CA set, compiled in (`webpki-roots` as trust anchors, `webpki-root-certs`
//! as whole certificates for the AWS SDK, which takes nothing else), and
//! built once per process.
//!
//! Why compiled in rather than the system's store: each client used to load
//! the system store on its own at start-up (the AWS SDK's, and each reqwest
//! client through the platform verifier), so a function scanned
//! `/etc/ssl/certs` up to three times before its first request; a compiled
//! set costs no file at all, is the same on every machine and in every
//! Lambda image, and is the set sqlx and the Redis client already trust.
//! What it gives up is an operator's own CA in the system store: Postgres
//! takes one in its URL (`sslrootcert=`, which RDS's CA needs, since RDS is
//! not in Mozilla's set, nor in Amazon Linux's), and every other host Reeve
//! calls (AWS's endpoints, ElastiCache, a public facilitator, a URL a user
//! fetches) is publicly trusted.

use std::sync::{Arc, OnceLock};

/// The rustls configuration of every reqwest client (the SSRF-guarded
/// outbound clients): Mozilla's roots as trust anchors, nothing parsed, no
/// file read. reqwest sets the ALPN protocols itself.
#[cfg(feature = "outbound")]
pub fn client_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("aws-lc-rs supports rustls' default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// Mozilla's roots as PEM, for the AWS SDK's trust store (which takes PEM
/// and parses it when it opens its first connection).
#[cfg(feature = "aws")]
pub fn roots_pem() -> Vec<u8> {
    let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().map(|der| pem::Pem::new("CERTIFICATE", der.to_vec()));
    pem::encode_many(&roots.collect::<Vec<_>>()).into_bytes()
}

#[cfg(all(test, feature = "aws", feature = "outbound"))]
mod tests {
    /// The AWS SDK and the other clients trust the same roots: each trust
    /// anchor's subject is the subject of one of the whole certificates.
    #[test]
    fn both_forms_are_the_same_set() {
        let certs = webpki_root_certs::TLS_SERVER_ROOT_CERTS;
        let anchors = webpki_roots::TLS_SERVER_ROOTS;
        assert_eq!(anchors.len(), certs.len(), "webpki-roots and webpki-root-certs are from different snapshots");
        for anchor in anchors {
            let subject: &[u8] = anchor.subject.as_ref();
            assert!(
                certs.iter().any(|cert| cert.as_ref().windows(subject.len()).any(|w| w == subject)),
                "a trust anchor without its certificate"
            );
        }
        let pem = String::from_utf8(super::roots_pem()).unwrap();
        assert_eq!(pem.matches("-----BEGIN CERTIFICATE-----").count(), certs.len());
        assert!(super::client_config().alpn_protocols.is_empty(), "reqwest sets them");
    }
}
