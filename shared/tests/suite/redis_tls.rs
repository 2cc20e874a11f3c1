//! `rediss://` against a real Redis with TLS: a `redis-server` of this
//! test's own on a `tls-port`, with a certificate the test signs with a CA
//! it makes. The client verifies the certificate: trusted through the CA it
//! works (the connection manager every process uses, Pub/Sub included), and
//! without it the connection is refused rather than made in clear.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use redis::{AsyncCommands, TlsCertificates};
use reeve_shared::redis_client::RedisClient;

struct TlsRedis {
    child: Child,
    dir: PathBuf,
    port: u16,
    ca_pem: String,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and a
/// `redis-server` serving TLS only (`port 0`) with them.
fn start() -> TlsRedis {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "reeve test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap().signed_by(&key, &ca).unwrap();

    let dir = std::env::temp_dir().join(format!("reeve-redis-tls-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();

    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", "0", "--bind", "127.0.0.1", "--tls-port", &port.to_string()])
        .arg("--tls-cert-file")
        .arg(dir.join("server.pem"))
        .arg("--tls-key-file")
        .arg(dir.join("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(dir.join("ca.pem"))
        .args(["--tls-auth-clients", "no", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (Debian's is built with TLS)");
    let redis = TlsRedis { child, dir, port, ca_pem: ca.pem() };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not open its TLS port");
        std::thread::sleep(Duration::from_millis(50));
    }
    redis
}

#[tokio::test]
async fn rediss_works_against_a_tls_redis_and_verifies_its_certificate() {
    let server = start();
    let url = format!("rediss://127.0.0.1:{}/", server.port);

    // Trusting the test's CA: the process's shared connection works.
    let trusted = redis::Client::build_with_tls(
        url.as_str(),
        TlsCertificates { client_tls: None, root_cert: Some(server.ca_pem.clone().into_bytes()) },
    )
    .unwrap();
    let client = RedisClient::from_client(trusted.clone());
    client.ping().await.expect("PING over TLS");
    let mut conn = client.connection().await.unwrap();
    let _: () = conn.set("reeve:tls", "over tls").await.unwrap();
    let got: String = conn.get("reeve:tls").await.unwrap();
    assert_eq!(got, "over tls");

    // Pub/Sub (the relay's doorbell) over the same TLS.
    let mut pubsub = trusted.get_async_pubsub().await.expect("a TLS Pub/Sub connection");
    pubsub.subscribe("reeve:tls:bell").await.unwrap();
    let _: i64 = conn.publish("reeve:tls:bell", "ding").await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), futures_util::StreamExt::next(&mut pubsub.on_message()))
        .await
        .expect("the message arrives")
        .unwrap();
    assert_eq!(message.get_payload::<String>().unwrap(), "ding");

    // A `rediss://` URL as a deployment gives it, and a certificate no
    // public CA signed: refused, never sent in clear.
    let untrusted = RedisClient::new(&url).expect("rediss:// is a valid URL now");
    let err = untrusted.ping().await.expect_err("an unknown issuer is refused");
    let text = err.to_string().to_lowercase();
    assert!(text.contains("certificate") || text.contains("issuer"), "{err}");

    // Plain redis:// to the TLS port gets nowhere either.
    let plain = RedisClient::new(&format!("redis://127.0.0.1:{}/", server.port)).unwrap();
    assert!(plain.ping().await.is_err());
}
