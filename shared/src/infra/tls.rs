//! The roots of trust every TLS client of a Reeve process uses: Mozilla's
//! CA set, compiled in (`webpki-roots`), and built once per process.
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
/// outbound clients, the AWS SDK's): Mozilla's roots as trust anchors,
/// nothing parsed, no file read. reqwest sets the ALPN protocols itself.
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

#[cfg(test)]
mod tests {
    #[test]
    fn reqwest_sets_the_alpn_protocols() {
        assert!(super::client_config().alpn_protocols.is_empty(), "reqwest sets them");
    }
}
