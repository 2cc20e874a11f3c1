//! The login limits (issue 25): Spaces created and sessions opened per
//! client address, one budget in Postgres for every path that makes them.
//! REST (`POST /v1/spaces`, `POST /v1/sessions`, the `auth` Lambda's
//! router) and MCP (`create_space`, `login`, the `mcp` Lambda's) are driven
//! with the `events/` samples through lambda_http, as in Lambda, each from
//! an address of the test's own as API Gateway's `sourceIp`; one test runs
//! them on a real listener with the peer address, as `reeve serve` does.
//! Over the budget: `429 rate_limited` with `Retry-After` and the envelope
//! on REST, the tool error `rate_limited` with `retry_after_seconds` on MCP, and
//! nothing made.

use crate::common;
use crate::lambda_events::{Answer, through_lambda};
use crate::mcp::sample_event;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use common::chain::root;
use reeve_shared::http::{self, ApiContext, AuthContext, Ctx};
use reeve_shared::login_limits::{Action, Budget, LoginLimits, SPACES};
use reeve_shared::mcp::{self, McpSettings};
use reeve_shared::startup::settings;
use serde_json::{Value, json};
use sqlx::PgPool;

/// An address of this test's own, in a documentation range.
/// A client address no other call in this run has had, from two
/// documentation ranges. Drawn at random from them, two of one test's three
/// clients coincided about once in 170 runs, and the pruning test counted
/// two live rows for three clients.
fn address() -> IpAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let host = (n % 254) as u8 + 1;
    match n / 254 {
        0 => IpAddr::from([203, 0, 113, host]),
        1 => IpAddr::from([198, 51, 100, host]),
        _ => panic!("the limit tests ran out of their 508 client addresses"),
    }
}

/// The two Lambdas' routers (`auth` and `mcp`), on one context whose login
/// budgets are `limits`, as their `main.rs` build them.
struct Functions {
    auth: Router,
    mcp: Router,
    api: Ctx,
}

async fn functions(pool: PgPool, limits: LoginLimits) -> Functions {
    functions_on(with_limits(common::ctx(pool).await, limits))
}

/// The two routers on `api`, with the budgets it was built with.
fn functions_on(api: Ctx) -> Functions {
    let settings = McpSettings { allowed_hosts: vec![], allowed_origins: vec![], progress: false };
    let mcp = mcp::router(reeve_shared::startup::mcp_beside(&api, settings));
    Functions { auth: http::auth_app(api.auth.clone()), mcp, api }
}

/// `api` with its login routes' budgets replaced. Fault: budgets of the
/// test's own, small enough to spend in a test (no setting moves them).
fn with_limits(api: Ctx, limits: LoginLimits) -> Ctx {
    let mut api: ApiContext = Arc::try_unwrap(api).ok().expect("a fresh context");
    let auth = &api.auth;
    api.auth = Arc::new(AuthContext {
        db: auth.db.clone(),
        settings: auth.settings.clone(),
        argon2: auth.argon2.clone(),
        limits,
    });
    Arc::new(api)
}

/// An `events/` sample as API Gateway sends it from `from`.
fn from(event: String, from: IpAddr) -> String {
    let mut event: Value = serde_json::from_str(&event).unwrap();
    event["requestContext"]["http"]["sourceIp"] = json!(from.to_string());
    event["headers"]["x-forwarded-for"] = json!(from.to_string());
    event.to_string()
}

fn sample(stem: &str) -> String {
    std::fs::read_to_string(root().join(format!("events/{stem}.json"))).unwrap()
}

impl Functions {
    async fn create_space(&self, ip: IpAddr) -> Answer {
        through_lambda(self.auth.clone(), &from(sample("auth-create-space"), ip)).await
    }

    async fn open_session(&self, ip: IpAddr) -> Answer {
        through_lambda(self.auth.clone(), &from(sample("auth-open-session"), ip)).await
    }

    /// `POST /v1/space/rotate` with `token` and `space_id` in the body.
    async fn rotate(&self, ip: IpAddr, token: &str, space_id: &str) -> Answer {
        let mut event: Value = serde_json::from_str(&from(sample("auth-rotate-space"), ip)).unwrap();
        let body = json!({ "space_id": space_id }).to_string();
        event["headers"]["authorization"] = json!(format!("Bearer {token}"));
        event["headers"]["content-length"] = json!(body.len().to_string());
        event["body"] = json!(body);
        through_lambda(self.auth.clone(), &event.to_string()).await
    }

    async fn tool(&self, ip: IpAddr, name: &str, arguments: Value) -> Value {
        let event = sample_event("mcp-tools-call-task", None, |params| {
            params["name"] = json!(name);
            params["arguments"] = arguments;
        });
        let answer = through_lambda(self.mcp.clone(), &from(event, ip)).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.body["result"].clone()
    }

    async fn spaces(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM spaces").fetch_one(&self.api.db).await.unwrap()
    }
}

/// The REST refusal: `429 rate_limited`, the envelope, `Retry-After` within
/// `range` (seconds), which it returns.
fn rest_refused(answer: &Answer, range: std::ops::RangeInclusive<u64>, what: &str) -> u64 {
    assert_eq!(answer.status, 429, "{what}: {}", answer.body);
    assert_eq!(answer.body["error"]["code"], "rate_limited", "{what}: {}", answer.body);
    assert!(answer.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {}", answer.body);
    let retry_after = answer.retry_after.unwrap_or_else(|| panic!("{what}: no Retry-After"));
    assert!(range.contains(&retry_after), "{what}: Retry-After {retry_after}, not in {range:?}");
    retry_after
}

/// The MCP refusal: a tool error `rate_limited` with `retry_after_seconds` within
/// `range`.
fn mcp_refused(result: &Value, range: std::ops::RangeInclusive<u64>, what: &str) {
    assert_eq!(result["isError"], true, "{what}: {result}");
    let error = &result["structuredContent"]["error"];
    assert_eq!(error["code"], "rate_limited", "{what}: {result}");
    let retry_after =
        error["retry_after_seconds"].as_u64().unwrap_or_else(|| panic!("{what}: no retry_after_seconds: {result}"));
    assert!(range.contains(&retry_after), "{what}: retry_after {retry_after}, not in {range:?}");
}

fn mcp_ok(result: &Value, what: &str) {
    assert_ne!(result["isError"], true, "{what}: {result}");
}

/// The shipped budget (a burst of 10 Spaces, then one a minute), spent
/// partly over REST and partly over MCP: the 11th is refused on both, no
/// Space is made for it, and another address is unaffected.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn spaces_share_one_budget_per_address_over_rest_and_mcp(pool: PgPool) {
    let f = functions(pool, LoginLimits::default()).await;
    let greedy = address();
    for i in 0..SPACES.burst {
        if i % 2 == 0 {
            let made = f.create_space(greedy).await;
            assert_eq!(made.status, 201, "space {i} over REST: {}", made.body);
        } else {
            let made = f.tool(greedy, "create_space", json!({})).await;
            mcp_ok(&made, &format!("space {i} over MCP"));
            assert!(made["structuredContent"]["token"].is_string(), "{made}");
        }
    }
    assert_eq!(f.spaces().await, i64::from(SPACES.burst));

    let refused = f.create_space(greedy).await;
    rest_refused(&refused, 50..=60, "the 11th over REST");
    assert!(!refused.body["error"]["request_id"].as_str().unwrap_or_default().is_empty(), "{}", refused.body);
    mcp_refused(&f.tool(greedy, "create_space", json!({})).await, 50..=60, "the 11th over MCP");
    assert_eq!(f.spaces().await, i64::from(SPACES.burst), "a refused create makes no Space");

    // Another address is another client, on either path.
    let other = address();
    let other = if other == greedy { IpAddr::from([192, 0, 2, 1]) } else { other };
    assert_eq!(f.create_space(other).await.status, 201);
    mcp_ok(&f.tool(other, "create_space", json!({})).await, "another address over MCP");
    // Every address of one IPv6 /64 is one client (of one /56: see
    // `a_client_is_a_network_and_its_budget_a_setting`).
    let net = ulid::Ulid::new().random() as u16;
    let v6 = |host: u16| IpAddr::from([0x2001, 0xdb8, net, 7, host, 0, 0, 1]);
    for i in 0..SPACES.burst {
        assert_eq!(f.create_space(v6(i as u16)).await.status, 201, "v6 space {i}");
    }
    rest_refused(&f.create_space(v6(999)).await, 50..=60, "another host of the /64");
    assert_eq!(f.spaces().await, i64::from(SPACES.burst) * 2 + 2);
}

/// A client is a network, and its budget is a setting: built through
/// start-up as the `auth` Lambda is, with `REEVE_SPACES_BURST=3`, exactly 3
/// Spaces are made per client over REST, the 4th refused. Two addresses of
/// one client (one IPv4 address; two /64s of one IPv6 /56) share the 3; an
/// address of another client (the next IPv4 address; the next /56) has 3
/// of its own.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_client_is_a_network_and_its_budget_a_setting(pool: PgPool) {
    let config = common::config(&pool).with(settings::SPACES_BURST, "3");
    let f = functions_on(common::api(&config).await);
    let v4 = address();
    let IpAddr::V4(octets) = v4 else { unreachable!() };
    let [a, b, c, d] = octets.octets();
    let net = ulid::Ulid::new().random() as u16;
    let v6 = |subnet: u16, host: u16| IpAddr::from([0x2001, 0xdb8, net, subnet, 0, 0, 0, host]);
    // (an address, another of the same client, one of another client)
    let cases = [(v4, v4, IpAddr::from([a, b, c, d ^ 1])), (v6(0x0700, 1), v6(0x07ff, 2), v6(0x0800, 1))];
    let mut made = 0;
    for (first, same, other) in cases {
        for (i, from) in [first, first, same].into_iter().enumerate() {
            let answer = f.create_space(from).await;
            assert_eq!(answer.status, 201, "space {i} from {from}: {}", answer.body);
        }
        rest_refused(&f.create_space(first).await, 50..=60, &format!("the 4th from {first}"));
        rest_refused(&f.create_space(same).await, 50..=60, &format!("the 4th from {same}, of {first}'s client"));
        for i in 0..3 {
            assert_eq!(f.create_space(other).await.status, 201, "space {i} from {other}, another client");
        }
        rest_refused(&f.create_space(other).await, 50..=60, &format!("the 4th from {other}"));
        made += 6;
    }
    assert_eq!(f.spaces().await, made, "a refused create makes no Space");
}

/// A rotation mints a Space ID as a creation does, and spends the same
/// budget: on a budget of 3, a Space made over REST, one over MCP and a
/// rotation spend it, and then both a rotation (right ID and all) and a
/// creation are refused, with nothing changed; another client still rotates.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_rotation_spends_the_space_budget(pool: PgPool) {
    let spaces = Budget { burst: 3, every: Duration::from_secs(60) };
    let f = functions(pool, LoginLimits { spaces, ..LoginLimits::default() }).await;
    let ip = address();
    let made = f.create_space(ip).await;
    assert_eq!(made.status, 201, "{}", made.body);
    let by_mcp = f.tool(ip, "create_space", json!({})).await;
    mcp_ok(&by_mcp, "a Space over MCP");
    let (space_id, token) = (
        by_mcp["structuredContent"]["space_id"].as_str().unwrap().to_owned(),
        by_mcp["structuredContent"]["token"].as_str().unwrap().to_owned(),
    );
    let rotated = f.rotate(ip, &token, &space_id).await;
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    let (space_id, token) =
        (rotated.body["space_id"].as_str().unwrap().to_owned(), rotated.body["token"].as_str().unwrap().to_owned());

    rest_refused(&f.rotate(ip, &token, &space_id).await, 50..=60, "a rotation over the budget");
    rest_refused(&f.create_space(ip).await, 50..=60, "a creation over the budget");
    assert_eq!(f.spaces().await, 2);
    let session = through_lambda(f.auth.clone(), &{
        let mut event: Value = serde_json::from_str(&from(sample("auth-open-session"), address())).unwrap();
        event["body"] = json!(json!({ "space_id": space_id }).to_string());
        event.to_string()
    })
    .await;
    assert_eq!(session.status, 200, "the refused rotation changed nothing: {}", session.body);

    // `address()` is never in 192.0.2.0/24.
    let rotated = f.rotate(IpAddr::from([192, 0, 2, 1]), &token, &space_id).await;
    assert_eq!(rotated.status, 200, "another client's budget: {}", rotated.body);
}

/// Behind the CloudFront edge every request comes from CloudFront's address,
/// and the viewer's is in `X-Reeve-Viewer-Address` (the edge's function
/// writes it): with the edge's secret in `X-Reeve-Edge-Secret` that viewer
/// is the client (an IPv6 one grouped by /56), on REST and MCP alike; without the secret, or with a wrong one, the header is a
/// forgery and the request counts against its source address. Started as
/// the `auth` function is, with `REEVE_EDGE_SECRET` and a budget of 2.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn behind_the_edge_the_viewer_is_the_client_only_beside_its_secret(pool: PgPool) {
    const SECRET: &str = "the-edge-secret-cloudfront-sends-0123456789";
    let config = common::config(&pool).with(settings::SPACES_BURST, "2").with(settings::EDGE_SECRET, SECRET);
    let f = functions_on(common::api(&config).await);
    let cloudfront = IpAddr::from([130, 176, 0, 7]);
    // `sample`'s event from CloudFront, with these headers added.
    let event = |stem: &str, headers: &[(&str, &str)]| {
        let mut event: Value = serde_json::from_str(&from(sample(stem), cloudfront)).unwrap();
        for (name, value) in headers {
            event["headers"][*name] = json!(value);
        }
        event.to_string()
    };
    let create = |headers: &[(&str, &str)]| {
        let (app, event) = (f.auth.clone(), event("auth-create-space", headers));
        async move { through_lambda(app, &event).await }
    };
    let viewer = |address: &'static str| (reeve_shared::http::VIEWER_ADDRESS_HEADER, address);
    let (secret, wrong) =
        (("x-reeve-edge-secret", SECRET), ("x-reeve-edge-secret", "the-edge-secret-cloudfront-sends-0123456780"));

    // Forged: each request names another viewer, but without the secret (or
    // with a wrong one) all count against CloudFront's address.
    assert_eq!(create(&[viewer("203.0.113.1")]).await.status, 201);
    assert_eq!(create(&[viewer("203.0.113.2"), wrong]).await.status, 201);
    rest_refused(&create(&[viewer("203.0.113.3")]).await, 50..=60, "a forged viewer, no secret");
    rest_refused(&create(&[viewer("203.0.113.4"), wrong]).await, 50..=60, "a forged viewer, a wrong secret");
    rest_refused(&create(&[]).await, 50..=60, "CloudFront's own address");

    // With the secret, the viewer is the client: its own budget of 2.
    for address in ["198.51.100.23", " 198.51.100.23 "] {
        assert_eq!(create(&[viewer(address), secret]).await.status, 201, "an IPv4 viewer from {address}");
    }
    rest_refused(&create(&[viewer("198.51.100.23"), secret]).await, 50..=60, "the IPv4 viewer's third");
    // IPv6 viewers: one /56 is one client.
    assert_eq!(create(&[viewer("2001:db8:a:b00::1"), secret]).await.status, 201);
    assert_eq!(create(&[viewer("2001:db8:a:bff:1:2:3:4"), secret]).await.status, 201);
    rest_refused(&create(&[viewer("2001:db8:a:b42::9"), secret]).await, 50..=60, "the same /56's third");

    // MCP's create_space counts the same viewer, beside the same secret.
    let tool = |headers: &[(&str, &str)]| {
        let mut event: Value = serde_json::from_str(&from(
            sample_event("mcp-tools-call-task", None, |params| {
                params["name"] = json!("create_space");
                params["arguments"] = json!({});
            }),
            cloudfront,
        ))
        .unwrap();
        for (name, value) in headers {
            event["headers"][*name] = json!(value);
        }
        let (app, event) = (f.mcp.clone(), event.to_string());
        async move { through_lambda(app, &event).await }
    };
    let answered = tool(&[viewer("192.0.2.55"), secret]).await;
    mcp_ok(&answered.body["result"], "a new viewer over MCP");
    let forged = tool(&[viewer("192.0.2.56")]).await;
    mcp_refused(&forged.body["result"], 50..=60, "a forged viewer over MCP");

    let clients: Vec<String> =
        sqlx::query_scalar("SELECT client FROM login_limits ORDER BY client").fetch_all(&f.api.db).await.unwrap();
    assert_eq!(clients, ["130.176.0.7/32", "192.0.2.55/32", "198.51.100.23/32", "2001:db8:a:b00::/56"]);
}

/// Sessions the same way, on a budget of 3 then one a minute (the shipped
/// one refills in half a second, too fast to test without a race): REST's
/// `POST /v1/sessions` and MCP's `login` spend it together, an unknown
/// Space included (its Argon2id run is spent either way).
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn sessions_share_one_budget_per_address_over_rest_and_mcp(pool: PgPool) {
    let sessions = Budget { burst: 3, every: Duration::from_secs(60) };
    let f = functions(pool, LoginLimits { spaces: SPACES, sessions, ..LoginLimits::default() }).await;
    let ip = address();
    let unknown = json!({ "space_id": "00000000000000000000" });

    assert_eq!(f.open_session(ip).await.body["error"]["code"], "invalid_space");
    let login = f.tool(ip, "login", unknown.clone()).await;
    assert_eq!(login["structuredContent"]["error"]["code"], "invalid_space", "{login}");
    assert_eq!(f.open_session(ip).await.body["error"]["code"], "invalid_space");

    mcp_refused(&f.tool(ip, "login", unknown.clone()).await, 55..=60, "the 4th over MCP");
    rest_refused(&f.open_session(ip).await, 55..=60, "the 5th over REST");

    // Spaces are a budget of their own, and another address is unaffected.
    assert_eq!(f.create_space(ip).await.status, 201);
    let other = address();
    let other = if other == ip { IpAddr::from([192, 0, 2, 1]) } else { other };
    assert_eq!(f.open_session(other).await.body["error"]["code"], "invalid_space");
}

/// Requests at once never take more than the budget: 24 creates from one
/// address, half over REST and half over MCP, make exactly 10 Spaces; and
/// 40 spends at once on the limiter itself let exactly its burst through.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn requests_at_once_never_pass_the_budget(pool: PgPool) {
    let f = Arc::new(functions(pool.clone(), LoginLimits::default()).await);
    let ip = address();
    let calls = (0..24).map(|i| {
        let f = f.clone();
        tokio::spawn(async move {
            if i % 2 == 0 {
                f.create_space(ip).await.status == 201
            } else {
                f.tool(ip, "create_space", json!({})).await["isError"] != true
            }
        })
    });
    let made = futures_util::future::join_all(calls).await.into_iter().filter(|ok| *ok.as_ref().unwrap()).count();
    assert_eq!(made, SPACES.burst as usize);
    assert_eq!(f.spaces().await, i64::from(SPACES.burst));

    let limits =
        LoginLimits { sessions: Budget { burst: 7, every: Duration::from_secs(60) }, ..LoginLimits::default() };
    let ip = address();
    let spends = (0..40).map(|_| {
        let (pool, limits) = (pool.clone(), limits.clone());
        tokio::spawn(async move { limits.spend(&pool, ip, Action::Session).await.unwrap().is_ok() })
    });
    let passed = futures_util::future::join_all(spends).await.into_iter().filter(|ok| *ok.as_ref().unwrap()).count();
    assert_eq!(passed, 7);
}

/// A budget refills one request per period, and the rows of idle addresses
/// are deleted by later spends.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_budget_refills_and_idle_rows_are_pruned(pool: PgPool) {
    let limits =
        LoginLimits { sessions: Budget { burst: 2, every: Duration::from_millis(600) }, ..LoginLimits::default() };
    let ip = address();
    let spend = || limits.spend(&pool, ip, Action::Session);
    assert!(spend().await.unwrap().is_ok());
    assert!(spend().await.unwrap().is_ok());
    let limited = spend().await.unwrap().expect_err("over the burst");
    assert!(limited.retry_after <= Duration::from_millis(600), "{limited:?}");
    assert_eq!(limited.seconds(), 1);
    tokio::time::sleep(limited.retry_after + Duration::from_millis(50)).await;
    assert!(spend().await.unwrap().is_ok(), "one more after the period");
    assert!(spend().await.unwrap().is_err(), "and only one");

    // Rows of addresses whose budget is whole again go with later spends.
    sqlx::query(
        "INSERT INTO login_limits (client, action, tat, allowed) \
         SELECT '192.0.2.' || n, 'space', now() - interval '1 hour', true FROM generate_series(1, 40) n",
    )
    .execute(&pool)
    .await
    .unwrap();
    let idle = || async {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM login_limits WHERE tat < now()").fetch_one(&pool).await.unwrap();
        n
    };
    let prune = reeve_shared::login_limits::PRUNE;
    for spends in 1..=2 {
        assert!(limits.spend(&pool, address(), Action::Space).await.unwrap().is_ok());
        assert_eq!(idle().await, 40 - spends * prune, "a spend deletes {prune} idle rows");
    }
    assert!(limits.spend(&pool, address(), Action::Space).await.unwrap().is_ok());
    assert_eq!(idle().await, 0);
    // The live rows stay: the three addresses' Spaces.
    let live: i64 =
        sqlx::query_scalar("SELECT count(*) FROM login_limits WHERE action = 'space'").fetch_one(&pool).await.unwrap();
    assert_eq!(live, 3);
}

/// As `reeve serve` runs them: the API and `POST /mcp` on one listener
/// served with the peer address, clients on loopback addresses of their
/// own. The sessions budget is spent over REST and refused over MCP.
#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn on_a_listener_the_peer_address_is_the_client(pool: PgPool) {
    let sessions = Budget { burst: 2, every: Duration::from_secs(60) };
    let api = with_limits(common::ctx(pool).await, LoginLimits { spaces: SPACES, sessions, ..LoginLimits::default() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let settings = McpSettings { allowed_hosts: vec![], allowed_origins: vec![], progress: false };
    let mcp = mcp::router_at(reeve_shared::startup::mcp_beside(&api, settings), addr);
    let routes = http::app(api).layer(axum::middleware::from_fn(http::envelope)).merge(mcp);
    tokio::spawn(async move {
        axum::serve(listener, routes.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap()
    });
    let bits = ulid::Ulid::new().random();
    let local = |last: u8| IpAddr::from([127, (bits >> 8) as u8 | 1, (bits >> 16) as u8, last]);
    let client = |ip: IpAddr| reqwest::Client::builder().local_address(ip).build().unwrap();
    let (greedy, other) = (client(local(1)), client(local(2)));

    let session = |c: &reqwest::Client| {
        c.post(format!("http://{addr}/v1/sessions"))
            .header("content-type", "application/json")
            .body(json!({ "space_id": "00000000000000000000" }).to_string())
            .send()
    };
    for _ in 0..2 {
        assert_eq!(session(&greedy).await.unwrap().status(), 401, "an unknown space, not yet limited");
    }
    let refused = session(&greedy).await.unwrap();
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((55..=60).contains(&retry_after), "{retry_after}");
    assert!(refused.headers().contains_key("x-request-id"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(!body["error"]["request_id"].as_str().unwrap().is_empty(), "{body}");

    // The same address over MCP: the same budget.
    let login = |c: &reqwest::Client| {
        let event: Value = serde_json::from_str(&sample_event("mcp-tools-call-task", None, |params| {
            params["name"] = json!("login");
            params["arguments"] = json!({ "space_id": "00000000000000000000" });
        }))
        .unwrap();
        let mut request = c.post(format!("http://{addr}{}", mcp::PATH));
        for (name, value) in event["headers"].as_object().unwrap() {
            if !["host", "content-length"].contains(&name.as_str()) && !name.starts_with("x-") {
                request = request.header(name, value.as_str().unwrap());
            }
        }
        request.body(event["body"].as_str().unwrap().to_owned()).send()
    };
    let answer: Value = login(&greedy).await.unwrap().json().await.unwrap();
    mcp_refused(&answer["result"], 55..=60, "login over MCP from the same peer");
    // Another peer address: its own budget, on both paths.
    let answer: Value = login(&other).await.unwrap().json().await.unwrap();
    assert_eq!(answer["result"]["structuredContent"]["error"]["code"], "invalid_space", "{answer}");
    assert_eq!(session(&other).await.unwrap().status(), 401);
    // Other routes are not limited.
    assert_eq!(greedy.get(format!("http://{addr}/v1/catalog")).send().await.unwrap().status(), 200);
}
