//! The SSRF guard of the outbound client (docs/architecture.md#outbound-http-ssrf).
//!
//! Network rule: these tests only ever send traffic to loopback test servers.
//! Every blocked case is first checked without any I/O (`check_url` /
//! `resolve`) and only then sent, so a hole in the ranges panics before a
//! connection could be attempted; public addresses are only ever fed to the
//! resolver filter, never connected to.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use reeve_shared::outbound::{Outbound, OutboundError, OutboundPolicy};
use serde_json::{Value, json};

const MIB: usize = 1024 * 1024;

// ---------------------------------------------------------------- test server

struct Server {
    addr: SocketAddr,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn port(&self) -> u16 {
        self.addr.port()
    }
    fn hits(&self) -> usize {
        self.paths.lock().unwrap().len()
    }
    fn paths(&self) -> Vec<String> {
        self.paths.lock().unwrap().clone()
    }
    fn url(&self, path: &str) -> String {
        match self.addr {
            SocketAddr::V4(a) => format!("http://{a}{path}"),
            SocketAddr::V6(a) => format!("http://[{}]:{}{path}", a.ip(), a.port()),
        }
    }
}

fn chunked(total: usize) -> Body {
    let chunks = (0..total / (64 * 1024)).map(|_| Ok::<_, Infallible>(bytes::Bytes::from(vec![b'x'; 64 * 1024])));
    Body::from_stream(futures_util::stream::iter(chunks))
}

/// One chunk, then nothing ever again.
fn stalled(content_length: Option<usize>) -> Response {
    let first = futures_util::stream::once(async { Ok::<_, Infallible>(bytes::Bytes::from(vec![b'x'; 1024])) });
    let body = Body::from_stream(futures_util::StreamExt::chain(first, futures_util::stream::pending()));
    let mut resp = Response::new(body);
    if let Some(n) = content_length {
        resp.headers_mut().insert(header::CONTENT_LENGTH, n.into());
    }
    resp
}

async fn echo(headers: HeaderMap, body: String) -> impl IntoResponse {
    let h = |n: header::HeaderName| headers.get(n).and_then(|v| v.to_str().ok()).map(String::from);
    let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    axum::Json(json!({
        "content_type": h(header::CONTENT_TYPE),
        "accept": h(header::ACCEPT),
        "body": parsed,
    }))
}

async fn redirect(Query(q): Query<HashMap<String, String>>) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, q["to"].clone())]).into_response()
}

async fn chain(Path(n): Path<u32>) -> Response {
    if n == 0 {
        "done".into_response()
    } else {
        (StatusCode::FOUND, [(header::LOCATION, format!("/chain/{}", n - 1))]).into_response()
    }
}

async fn serve_on(bind: &str) -> Option<Server> {
    let listener = tokio::net::TcpListener::bind(bind).await.ok()?;
    let addr = listener.local_addr().unwrap();
    let paths = Arc::new(Mutex::new(Vec::new()));
    let log = paths.clone();
    let app = Router::new()
        .route("/ok", get(|| async { "hello" }))
        .route("/echo", post(echo))
        .route("/big", get(|| async { vec![b'x'; 2 * MIB] }))
        .route("/big-stream", get(|| async { chunked(2 * MIB) }))
        .route("/exact", get(|| async { vec![b'x'; MIB] }))
        .route("/exact-stream", get(|| async { chunked(MIB) }))
        .route(
            "/sleep",
            any(|| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                "late"
            }),
        )
        .route("/big-stall", get(|| async { stalled(Some(2 * MIB)) }))
        .route("/stall", get(|| async { stalled(None) }))
        .route("/redirect", get(redirect))
        .route("/chain/{n}", get(chain))
        .route("/status/{code}", get(|Path(c): Path<u16>| async move { StatusCode::from_u16(c).unwrap() }))
        .route("/close", get(|| async { ([(header::CONNECTION, "close")], "bye") }))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(req.uri().path().to_string());
                next.run(req).await
            }
        }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Some(Server { addr, paths })
}

async fn server() -> Server {
    serve_on("127.0.0.1:0").await.expect("bind 127.0.0.1")
}

// ------------------------------------------------------------------- helpers

fn policy(allow: &[&str], allow_http: bool) -> OutboundPolicy {
    OutboundPolicy {
        allow_http,
        allow: allow.iter().map(|s| s.to_string()).collect(),
        connect_timeout: Duration::from_secs(2),
        timeout: Duration::from_secs(5),
        ..OutboundPolicy::default()
    }
}

/// The test resolver: a fixed table, and a panic for anything else.
fn table(entries: &[(&str, &[&str])]) -> impl Fn(&str) -> Vec<IpAddr> + Send + Sync + 'static {
    let map: HashMap<String, Vec<IpAddr>> =
        entries.iter().map(|(h, ips)| (h.to_string(), ips.iter().map(|i| i.parse().unwrap()).collect())).collect();
    move |host: &str| map.get(host).cloned().unwrap_or_else(|| panic!("unexpected lookup of {host}"))
}

fn matrix_client() -> Outbound {
    Outbound::with_resolver(
        policy(&[], true),
        table(&[
            ("private.test", &["10.1.2.3"]),
            ("mixed.test", &["127.0.0.1", "10.0.0.1"]),
            ("loopback6.test", &["::1"]),
            ("mapped.test", &["::ffff:127.0.0.1"]),
            ("metadata.test", &["169.254.169.254"]),
        ]),
    )
    .unwrap()
}

fn assert_blocked<T: std::fmt::Debug>(r: Result<T, OutboundError>, what: &str) -> String {
    match r {
        Err(OutboundError::Blocked(msg)) => msg,
        other => panic!("{what}: expected Blocked, got {other:?}"),
    }
}

/// A URL refused from the URL alone: checked with no I/O, then sent.
async fn blocked_url(template: &str, needle: &str) {
    let srv = server().await;
    let url = template.replace("{port}", &srv.port().to_string());
    let ob = matrix_client();
    // No I/O: a hole here panics before anything could be sent.
    let why = assert_blocked(ob.check_url(&url), &url);
    assert!(why.contains(needle), "{url}: {why}");
    let msg = assert_blocked(ob.get(&url, 1024).await, &url);
    assert_eq!(msg, why, "{url}");
    assert!(!OutboundError::Blocked(msg).is_retryable());
    assert_eq!(srv.hits(), 0, "{url}: the server must receive nothing");
}

/// A hostname whose every resolution is blocked: the filter is checked alone
/// first (no connect), then the request.
async fn blocked_name(ob: Outbound, host: &str) {
    let srv = server().await;
    let msg = assert_blocked(ob.resolve(host).await, host);
    assert_eq!(msg, format!("{host} resolves only to blocked addresses"));
    let url = format!("http://{host}:{}/ok", srv.port());
    ob.check_url(&url).expect("names pass the URL check: the resolver decides");
    let msg = assert_blocked(ob.get(&url, 1024).await, &url);
    assert_eq!(msg, format!("{host} resolves only to blocked addresses"));
    assert_eq!(srv.hits(), 0);
}

// ------------------------------------------------------------ the URL matrix

macro_rules! blocked_urls {
    ($($name:ident: $url:expr => $why:expr;)*) => {$(
        #[tokio::test]
        async fn $name() {
            blocked_url($url, $why).await;
        }
    )*};
}

blocked_urls! {
    loopback_127_0_0_1: "http://127.0.0.1:{port}/ok" => "is in a blocked range";
    loopback_127_1_2_3: "http://127.1.2.3:{port}/ok" => "is in a blocked range";
    loopback_default_port: "http://127.0.0.1/" => "is in a blocked range";
    loopback_other_port: "http://127.0.0.1:8080/" => "is in a blocked range";
    loopback_over_https: "https://127.0.0.1:{port}/ok" => "is in a blocked range";
    private_10: "http://10.0.0.1:{port}/" => "is in a blocked range";
    private_172_16: "http://172.16.0.1/" => "is in a blocked range";
    private_172_31_top: "http://172.31.255.255/" => "is in a blocked range";
    private_192_168: "http://192.168.1.1/" => "is in a blocked range";
    metadata: "http://169.254.169.254/" => "is in a blocked range";
    metadata_path: "http://169.254.169.254/latest/meta-data/iam/security-credentials/" => "is in a blocked range";
    cgnat: "http://100.64.0.1/" => "is in a blocked range";
    unspecified_v4: "http://0.0.0.0:{port}/ok" => "is in a blocked range";
    ipv6_loopback: "http://[::1]:{port}/ok" => "is in a blocked range";
    ipv4_mapped_loopback: "http://[::ffff:127.0.0.1]:{port}/ok" => "is in a blocked range";
    ipv4_mapped_metadata_hex: "http://[::ffff:a9fe:a9fe]/" => "is in a blocked range";
    ipv4_mapped_private: "http://[::ffff:10.0.0.1]/" => "is in a blocked range";
    ula: "http://[fd00::1]/" => "is in a blocked range";
    ipv6_link_local: "http://[fe80::1]/" => "is in a blocked range";
    nat64_loopback: "http://[64:ff9b::7f00:1]:{port}/" => "is in a blocked range";
    unspecified_v6: "http://[::]:{port}/ok" => "is in a blocked range";
    decimal_ipv4: "http://2130706433:{port}/ok" => "is in a blocked range";
    octal_ipv4: "http://0177.0.0.1:{port}/ok" => "is in a blocked range";
    hex_short_ipv4: "http://0x7f.1:{port}/ok" => "is in a blocked range";
    hex_ipv4: "http://0x7f000001:{port}/ok" => "is in a blocked range";
    short_ipv4: "http://127.1:{port}/ok" => "is in a blocked range";
    octal_whole_ipv4: "http://017700000001:{port}/ok" => "is in a blocked range";
    trailing_dot_ipv4: "http://127.0.0.1.:{port}/ok" => "is in a blocked range";
    multicast: "http://224.0.0.1/" => "is in a blocked range";
    broadcast: "http://255.255.255.255/" => "is in a blocked range";
    benchmarking: "http://198.18.0.1/" => "is in a blocked range";
    documentation_v4: "http://192.0.2.1/" => "is in a blocked range";
    documentation_v6: "http://[2001:db8::1]/" => "is in a blocked range";
    six_to_four_loopback: "http://[2002:7f00:1::]/" => "is in a blocked range";
    userinfo: "http://user@127.0.0.1:{port}/ok" => "credentials";
    userinfo_password: "http://user:pass@127.0.0.1:{port}/ok" => "credentials";
    scheme_file: "file:///etc/passwd" => "scheme";
    scheme_gopher: "gopher://127.0.0.1:{port}/_GET%20/ok" => "scheme";
    scheme_ftp: "ftp://127.0.0.1:{port}/" => "scheme";
    scheme_data: "data:text/plain,hello" => "scheme";
}

#[tokio::test]
async fn name_resolving_private() {
    blocked_name(matrix_client(), "private.test").await;
}

#[tokio::test]
async fn name_resolving_only_to_blocked_addresses() {
    blocked_name(matrix_client(), "mixed.test").await;
}

#[tokio::test]
async fn name_resolving_ipv6_loopback() {
    blocked_name(matrix_client(), "loopback6.test").await;
}

#[tokio::test]
async fn name_resolving_ipv4_mapped() {
    blocked_name(matrix_client(), "mapped.test").await;
}

#[tokio::test]
async fn localhost_through_the_system_resolver() {
    blocked_name(Outbound::new(policy(&[], true)).unwrap(), "localhost").await;
}

#[tokio::test]
async fn blocked_message_names_the_host_only() {
    let ob = matrix_client();
    let url = "http://169.254.169.254/latest/meta-data/iam?token=SECRET";
    assert_blocked(ob.check_url(url), "metadata, no I/O");
    let msg = assert_blocked(ob.get(url, 10).await, "metadata");
    assert!(msg.contains("169.254.169.254"), "{msg}");
    assert!(!msg.contains("SECRET") && !msg.contains("meta-data"), "{msg}");
    assert_eq!(
        OutboundError::Blocked(msg).to_string(),
        "blocked: 169.254.169.254 is in a blocked range: link-local (169.254.0.0/16)"
    );
}

#[tokio::test]
async fn invalid_url() {
    let ob = matrix_client();
    assert!(matches!(ob.get("not a url", 10).await, Err(OutboundError::InvalidUrl(_))));
    assert!(matches!(ob.get("http://", 10).await, Err(OutboundError::InvalidUrl(_))));
}

#[tokio::test]
async fn other_schemes_refused_even_for_allow_listed_hosts() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1", "files.test"], true), table(&[])).unwrap();
    let port = srv.port();
    for url in [
        format!("gopher://127.0.0.1:{port}/_GET%20/ok"),
        format!("ftp://127.0.0.1:{port}/ok"),
        format!("ws://127.0.0.1:{port}/ok"),
        "file://files.test/etc/passwd".to_string(),
    ] {
        let msg = assert_blocked(ob.get(&url, 1024).await, &url);
        assert!(msg.starts_with("scheme ") && msg.ends_with(": is not allowed"), "{msg}");
    }
    assert_eq!(srv.hits(), 0);
}

// ------------------------------------------------------------------ rebinding

#[tokio::test]
async fn rebinding_to_metadata_is_blocked_on_the_next_resolution() {
    let srv = server().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), move |host: &str| {
        assert_eq!(host, "rebind.test");
        match c.fetch_add(1, Ordering::SeqCst) {
            0 => vec!["127.0.0.1".parse().unwrap()],
            _ => vec!["169.254.169.254".parse().unwrap()],
        }
    })
    .unwrap();
    // `/close` ends the connection, so the second request must resolve again.
    let url = format!("http://rebind.test:{}/close", srv.port());
    let first = ob.get(&url, 1024).await.expect("first resolution is allow-listed");
    assert_eq!((first.status, &first.body[..]), (200, &b"bye"[..]));
    // The filter alone first (no connect), then the request.
    assert_blocked(ob.resolve("rebind.test").await, "rebound, filter only");
    let msg = assert_blocked(ob.get(&url, 1024).await, "rebound");
    assert_eq!(msg, "rebind.test resolves only to blocked addresses");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(srv.paths(), vec!["/close"]);
}

#[tokio::test]
async fn resolver_answering_public_then_private() {
    // Filter only: the public address is never connected to.
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let ob = Outbound::with_resolver(policy(&[], false), move |_: &str| match c.fetch_add(1, Ordering::SeqCst) {
        0 => vec!["93.184.216.34".parse().unwrap()],
        _ => vec!["10.0.0.1".parse().unwrap()],
    })
    .unwrap();
    assert_eq!(ob.resolve("rebind.test").await.unwrap(), vec!["93.184.216.34".parse::<IpAddr>().unwrap()]);
    assert_blocked(ob.resolve("rebind.test").await, "second resolution");
}

#[tokio::test]
async fn resolver_filter_keeps_only_public_addresses() {
    // Filter only: the public addresses are never connected to.
    let ob = Outbound::with_resolver(
        policy(&[], false),
        table(&[
            ("mixed.test", &["93.184.216.34", "10.0.0.1", "169.254.169.254", "2606:4700::1111", "fd00::1"]),
            ("private.test", &["192.168.0.1", "::1"]),
        ]),
    )
    .unwrap();
    let kept = ob.resolve("mixed.test").await.unwrap();
    let want: Vec<IpAddr> = vec!["93.184.216.34".parse().unwrap(), "2606:4700::1111".parse().unwrap()];
    assert_eq!(kept, want);
    assert_blocked(ob.resolve("private.test").await, "private.test");
    // Names that are IP spellings are never looked up, and checked as IPs.
    assert_blocked(ob.resolve("0x7f.1").await, "0x7f.1");
    assert_blocked(ob.resolve("2130706433").await, "2130706433");
}

// ------------------------------------------------------------------ redirects

fn redirect_url(srv: &Server, target: &str) -> String {
    let encoded: String = target
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    srv.url(&format!("/redirect?to={encoded}"))
}

#[tokio::test]
async fn redirect_to_metadata_is_blocked() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    let target = "http://169.254.169.254/latest/meta-data/";
    assert_blocked(ob.check_url(target), "target"); // no I/O
    let msg = assert_blocked(ob.get(&redirect_url(&srv, target), 1024).await, "redirect");
    assert!(msg.starts_with("redirect refused: 169.254.169.254"), "{msg}");
    assert_eq!(srv.paths(), vec!["/redirect"]);
}

#[tokio::test]
async fn redirect_to_ipv6_loopback_is_blocked() {
    let srv = server().await;
    // A real target on [::1] when the machine has IPv6 loopback: it must stay untouched.
    let v6 = serve_on("[::1]:0").await;
    let port = v6.as_ref().map_or(srv.port(), |s| s.port());
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    let target = format!("http://[::1]:{port}/ok");
    assert_blocked(ob.check_url(&target), "target");
    let msg = assert_blocked(ob.get(&redirect_url(&srv, &target), 1024).await, "redirect");
    assert!(msg.contains("[::1]"), "{msg}");
    assert_eq!(srv.paths(), vec!["/redirect"]);
    if let Some(v6) = v6 {
        assert_eq!(v6.hits(), 0);
    }
}

#[tokio::test]
async fn redirect_to_name_resolving_to_loopback_is_blocked() {
    // The first server is allow-listed by ip:port only, so a name resolving
    // to 127.0.0.1 is not; the second server must receive nothing.
    let a = server().await;
    let b = server().await;
    let ob = Outbound::with_resolver(
        policy(&[&format!("127.0.0.1:{}", a.port())], true),
        table(&[("internal.test", &["127.0.0.1"])]),
    )
    .unwrap();
    assert_blocked(ob.resolve("internal.test").await, "internal.test");
    let target = format!("http://internal.test:{}/ok", b.port());
    let msg = assert_blocked(ob.get(&redirect_url(&a, &target), 1024).await, "redirect");
    assert_eq!(msg, "internal.test resolves only to blocked addresses");
    assert_eq!(a.paths(), vec!["/redirect"]);
    assert_eq!(b.hits(), 0);
}

#[tokio::test]
async fn redirect_to_name_resolving_private_is_blocked() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[("intranet.test", &["10.0.0.7"])])).unwrap();
    assert_blocked(ob.resolve("intranet.test").await, "intranet.test");
    let msg = assert_blocked(ob.get(&redirect_url(&srv, "http://intranet.test/admin"), 1024).await, "redirect");
    assert_eq!(msg, "intranet.test resolves only to blocked addresses");
    assert_eq!(srv.paths(), vec!["/redirect"]);
}

#[tokio::test]
async fn redirect_to_other_schemes_and_credentials_is_blocked() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    for target in ["file:///etc/passwd", "gopher://127.0.0.1:70/_x", &format!("http://u:p@127.0.0.1:{}/ok", srv.port())]
    {
        assert_blocked(ob.check_url(target), target);
        assert_blocked(ob.get(&redirect_url(&srv, target), 1024).await, target);
    }
    assert_eq!(srv.paths(), vec!["/redirect"; 3]);
}

#[tokio::test]
async fn redirect_within_the_allowed_server_is_followed() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    let r = ob.get(&redirect_url(&srv, "/ok"), 1024).await.unwrap();
    assert_eq!((r.status, &r.body[..]), (200, &b"hello"[..]));
    assert_eq!(r.final_url, srv.url("/ok"));
    assert_eq!(srv.paths(), vec!["/redirect", "/ok"]);
}

#[tokio::test]
async fn redirect_chain_of_max_redirects_is_followed() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    assert_eq!(ob.policy.max_redirects, 3);
    let r = ob.get(&srv.url("/chain/3"), 1024).await.unwrap();
    assert_eq!(&r.body[..], b"done");
    assert_eq!(r.final_url, srv.url("/chain/0"));
}

#[tokio::test]
async fn redirect_chain_longer_than_max_redirects_fails() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    let msg = assert_blocked(ob.get(&srv.url("/chain/4"), 1024).await, "chain");
    assert_eq!(msg, "more than 3 redirects");
    assert_eq!(srv.paths(), vec!["/chain/4", "/chain/3", "/chain/2", "/chain/1"]);
}

#[tokio::test]
async fn zero_max_redirects_refuses_the_first() {
    let srv = server().await;
    let ob = Outbound::with_resolver(OutboundPolicy { max_redirects: 0, ..policy(&["127.0.0.1"], true) }, table(&[]))
        .unwrap();
    assert_blocked(ob.get(&srv.url("/chain/1"), 1024).await, "chain");
    assert_eq!(srv.paths(), vec!["/chain/1"]);
}

// ------------------------------------------------------ https-only, allow-list

#[tokio::test]
async fn plain_http_refused_unless_allowed() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], false), table(&[])).unwrap();
    let msg = assert_blocked(ob.get(&srv.url("/ok"), 1024).await, "http");
    assert!(msg.contains("https only"), "{msg}");
    assert_eq!(srv.hits(), 0);
    let ob = Outbound::new(OutboundPolicy::default()).unwrap();
    assert!(!ob.policy.allow_http);
    assert_blocked(ob.get(&srv.url("/ok"), 1024).await, "default policy");
    assert_eq!(srv.hits(), 0);
}

#[tokio::test]
async fn allow_listed_ip_passes_with_allow_http() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    let r = ob.get(&srv.url("/ok"), 1024).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"hello");
    assert_eq!(r.content_type.as_deref(), Some("text/plain; charset=utf-8"));
    assert_eq!(r.final_url, srv.url("/ok"));
    // Any status comes back as a response: the caller decides what it means.
    let r = ob.get(&srv.url("/status/503"), 1024).await.unwrap();
    assert_eq!(r.status, 503);
    let r = ob.get(&srv.url("/status/404"), 1024).await.unwrap();
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn allow_listed_ip_does_not_cover_its_neighbour() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    let url = format!("http://127.0.0.2:{}/ok", srv.port());
    assert_blocked(ob.check_url(&url), "127.0.0.2");
    assert_blocked(ob.get(&url, 1024).await, "127.0.0.2");
    // The same address in another spelling is the same address.
    let r = ob.get(&format!("http://2130706433:{}/ok", srv.port()), 1024).await.unwrap();
    assert_eq!(&r.body[..], b"hello");
    assert_eq!(srv.hits(), 1);
}

#[tokio::test]
async fn allow_listed_ip_and_port_is_exact() {
    let a = server().await;
    let b = server().await;
    let ob = Outbound::with_resolver(policy(&[&format!("127.0.0.1:{}", a.port())], true), table(&[])).unwrap();
    assert_eq!(ob.get(&a.url("/ok"), 1024).await.unwrap().status, 200);
    assert_blocked(ob.get(&b.url("/ok"), 1024).await, "other port");
    assert_eq!((a.hits(), b.hits()), (1, 0));
}

#[tokio::test]
async fn allow_listed_hostname_is_exact() {
    let srv = server().await;
    let lo: &[&str] = &["127.0.0.1"];
    let ob = Outbound::with_resolver(
        policy(&["localhost"], true),
        table(&[("localhost", lo), ("localhost.", lo), ("notlocalhost", lo), ("localhost.evil.test", lo)]),
    )
    .unwrap();
    let port = srv.port();
    assert_eq!(ob.get(&format!("http://localhost:{port}/ok"), 1024).await.unwrap().status, 200);
    assert_eq!(ob.get(&format!("http://LocalHost:{port}/ok"), 1024).await.unwrap().status, 200);
    for host in ["localhost.", "notlocalhost", "localhost.evil.test"] {
        let msg = assert_blocked(ob.get(&format!("http://{host}:{port}/ok"), 1024).await, host);
        assert_eq!(msg, format!("{host} resolves only to blocked addresses"));
    }
    assert_eq!(srv.hits(), 2);
}

#[tokio::test]
async fn allow_listed_hostname_has_no_suffix_matching() {
    let srv = server().await;
    let lo: &[&str] = &["127.0.0.1"];
    let ob = Outbound::with_resolver(
        policy(&["example.com"], true),
        table(&[("example.com", lo), ("evil-example.com", lo), ("api.example.com", lo)]),
    )
    .unwrap();
    let port = srv.port();
    assert_eq!(ob.get(&format!("http://example.com:{port}/ok"), 1024).await.unwrap().status, 200);
    assert_blocked(ob.get(&format!("http://evil-example.com:{port}/ok"), 1024).await, "evil-example.com");
    assert_blocked(ob.get(&format!("http://api.example.com:{port}/ok"), 1024).await, "api.example.com");
    assert_eq!(srv.hits(), 1);
}

#[tokio::test]
async fn allow_listed_host_and_port_refuses_other_ports() {
    let a = server().await;
    let b = server().await;
    let lo: &[&str] = &["127.0.0.1"];
    let ob = Outbound::with_resolver(policy(&[&format!("svc.test:{}", a.port())], true), table(&[("svc.test", lo)]))
        .unwrap();
    assert_eq!(ob.get(&format!("http://svc.test:{}/ok", a.port()), 1024).await.unwrap().status, 200);
    let msg = assert_blocked(ob.get(&format!("http://svc.test:{}/ok", b.port()), 1024).await, "other port");
    assert!(msg.contains("only on other ports"), "{msg}");
    assert_eq!((a.hits(), b.hits()), (1, 0));
}

#[tokio::test]
async fn allow_listed_localhost_through_the_system_resolver() {
    let srv = server().await;
    let ob = Outbound::new(policy(&["localhost"], true)).unwrap();
    let r = ob.get(&format!("http://localhost:{}/ok", srv.port()), 1024).await.unwrap();
    assert_eq!(&r.body[..], b"hello");
}

// ----------------------------------------------------------- size and timeout

async fn capped(path: &str, cap: u64) -> Result<usize, OutboundError> {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    ob.get(&srv.url(path), cap).await.map(|r| r.body.len())
}

#[tokio::test]
async fn too_large_with_content_length() {
    let r = capped("/big", MIB as u64).await;
    assert!(matches!(r, Err(OutboundError::TooLarge { limit }) if limit == MIB as u64), "{r:?}");
}

#[tokio::test]
async fn too_large_streamed_without_content_length() {
    let r = capped("/big-stream", MIB as u64).await;
    assert!(matches!(r, Err(OutboundError::TooLarge { limit }) if limit == MIB as u64), "{r:?}");
}

#[tokio::test]
async fn too_large_content_length_is_refused_before_the_body() {
    // The body never finishes: only the early Content-Length check can answer.
    let start = Instant::now();
    let r = capped("/big-stall", MIB as u64).await;
    assert!(matches!(r, Err(OutboundError::TooLarge { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn exactly_the_cap_is_fine() {
    assert_eq!(capped("/exact", MIB as u64).await.unwrap(), MIB);
    assert_eq!(capped("/exact-stream", MIB as u64).await.unwrap(), MIB);
    assert!(matches!(capped("/exact-stream", MIB as u64 - 1).await, Err(OutboundError::TooLarge { .. })));
}

#[tokio::test]
async fn slow_server_times_out() {
    let srv = server().await;
    let ob = Outbound::with_resolver(
        OutboundPolicy { timeout: Duration::from_millis(300), ..policy(&["127.0.0.1"], true) },
        table(&[]),
    )
    .unwrap();
    let start = Instant::now();
    let r = ob.get(&srv.url("/sleep"), 1024).await;
    assert!(matches!(r, Err(OutboundError::Timeout)), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn stalled_body_times_out() {
    let srv = server().await;
    let ob = Outbound::with_resolver(
        OutboundPolicy { timeout: Duration::from_millis(300), ..policy(&["127.0.0.1"], true) },
        table(&[]),
    )
    .unwrap();
    let start = Instant::now();
    let r = ob.get(&srv.url("/stall"), 1024 * 1024).await;
    assert!(matches!(r, Err(OutboundError::Timeout)), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn post_json_times_out_per_request() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    let start = Instant::now();
    let r = ob.post_json(&srv.url("/sleep"), &json!({}), Duration::from_millis(300), 1024).await;
    assert!(matches!(r, Err(OutboundError::Timeout)), "{r:?}");
    assert!(r.unwrap_err().is_retryable());
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn refused_connection_is_a_retryable_connect_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    match ob.get(&format!("http://127.0.0.1:{port}/ok"), 1024).await {
        Err(e @ OutboundError::Connect(_)) => {
            assert!(e.is_retryable());
            assert!(e.to_string().starts_with("cannot connect: 127.0.0.1"), "{e}");
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

// ------------------------------------------------------------------ post_json

#[tokio::test]
async fn post_json_sends_body_and_headers() {
    let srv = server().await;
    let ob = Outbound::with_resolver(policy(&["127.0.0.1"], true), table(&[])).unwrap();
    let body = json!({"task": "http", "n": [1, 2, 3], "nested": {"ok": true}});
    let r = ob.post_json(&srv.url("/echo"), &body, Duration::from_secs(5), 4096).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    let echoed: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(echoed["content_type"], "application/json");
    assert_eq!(echoed["accept"], "application/json");
    assert_eq!(echoed["body"], body);
}

#[tokio::test]
async fn post_json_is_guarded_too() {
    let srv = server().await;
    let ob = matrix_client();
    assert_blocked(ob.resolve("private.test").await, "filter only");
    assert_blocked(ob.post_json(&srv.url("/echo"), &json!({}), Duration::from_secs(1), 1024).await, "post");
    assert_blocked(
        ob.post_json(&format!("http://private.test:{}/echo", srv.port()), &json!({}), Duration::from_secs(1), 1024)
            .await,
        "post by name",
    );
    assert_eq!(srv.hits(), 0);
}
