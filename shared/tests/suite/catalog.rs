//! The catalog as operators and clients see it: what loads, what is refused
//! and with which path and message, and what `GET /v1/catalog` shows.

use std::path::Path;

use reeve_shared::catalog::{Catalog, CatalogError, Executor, NetworkKind, Problem, Quota, Uploads};
use reeve_shared::executors::{Digest, Fetch, Http};
use serde_json::json;

/// What deployments ship (the template's CatalogLayer): mainnet prices only.
const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../reeve.toml");
/// What development and the tests run on: the same tasks on the local chain.
const DEV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../reeve.dev.toml");
const THREE_MISTAKES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/catalog/three-mistakes.toml");

const PAYMENTS: &str = r#"
[payments]
pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
facilitator_url = "https://x402.org/facilitator"
"#;

/// A valid catalog around one asset `coin` (6 decimals, pegged) and one task
/// `t`, with `asset` and `task` spliced into their tables.
fn catalog_with(asset: &str, task: &str) -> String {
    format!(
        r#"{PAYMENTS}
[assets.coin]
network = "eip155:8453"
contract = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
decimals = 6
usd_peg = true
name = "USD Coin"
version = "2"
{asset}

[tasks.t]
title = "T"
input_schema = {{ type = "object" }}
{task}
"#
    )
}

fn problems(text: &str) -> Vec<Problem> {
    match Catalog::parse(text) {
        Err(CatalogError::Invalid { problems, .. }) => problems,
        Ok(_) => panic!("expected problems, but the catalog is valid:\n{text}"),
        Err(other) => panic!("expected problems, got {other}\n{text}"),
    }
}

fn parse_ok(text: &str) -> Catalog {
    Catalog::parse(text).unwrap_or_else(|error| panic!("{error}\n{text}"))
}

/// The atomic amount a one-price task `t` resolves to.
fn price_of(catalog: &Catalog) -> u128 {
    catalog.task("t").expect("task t").accepts[0].amount
}

#[test]
fn shipped_catalog_loads_with_free_and_priced_tasks() {
    let catalog = Catalog::load(Path::new(SHIPPED)).unwrap_or_else(|error| panic!("{error}"));

    let digest = catalog.task("digest").expect("digest task");
    assert!(digest.is_free());
    assert_eq!(digest.executor, Executor::Digest(Digest));

    let fetch = catalog.task("fetch").expect("fetch task");
    assert_eq!(fetch.executor, Executor::Fetch(Fetch));
    let prices: Vec<(&str, u128, Option<&str>)> =
        fetch.accepts.iter().map(|price| (price.asset.as_str(), price.amount, price.amount_usd.as_deref())).collect();
    assert_eq!(prices, [("usdc-base", 10_000, Some("0.01"))]);

    let http = catalog.task("http").expect("http task");
    assert_eq!(
        http.executor,
        Executor::Http(Http { endpoint: "https://example.com/reeve/echo".into(), protocol: None })
    );
    assert_eq!((http.accepts[0].asset.as_str(), http.accepts[0].amount), ("usdc-base", 5_000));
    assert_eq!(http.accepts[0].amount_usd, None);

    // Mainnet only: Base's USDC, nothing with test tokens.
    let assets: Vec<&str> = catalog.assets.keys().map(String::as_str).collect();
    assert_eq!(assets, ["usdc-base"]);
    let base = &catalog.assets["usdc-base"];
    assert_eq!(
        (base.network.as_str(), base.contract.as_str(), base.decimals, base.name.as_str(), base.version.as_str()),
        ("eip155:8453", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", 6, "USD Coin", "2")
    );

    let payments = catalog.payments.as_ref().expect("payments");
    assert_eq!(payments.network_kind, NetworkKind::Mainnet);
    assert_ne!(payments.facilitator_url, "https://x402.org/facilitator", "x402.org settles testnets only");
    assert!(payments.facilitator_url.starts_with("https://"), "{}", payments.facilitator_url);
    assert_eq!(catalog.warnings(), [], "the shipped catalog prices no testnet asset");
    assert_eq!(
        catalog.summary(),
        "4 tasks (digest free, fetch 1 price, fetch-metered 1 metered price, http 1 price), 1 asset, uploads up to 100 MiB"
    );
}

/// The kinds only the development catalog sells: the examples the local
/// stack runs (examples/wordfreq under `cargo lambda watch`), which a
/// deployment has no function for.
const EXAMPLE_KINDS: &[&str] = &["wordfreq", "wordfreq-metered"];

/// The development catalog sells what reeve.toml sells, so the tests run the
/// deployed tasks, but prices them on the local chain only, which the local
/// facilitator settles; and the examples besides.
#[test]
fn the_development_catalog_is_the_shipped_one_on_the_local_chain() {
    let shipped = Catalog::load(Path::new(SHIPPED)).unwrap();
    let dev = Catalog::load(Path::new(DEV)).unwrap_or_else(|error| panic!("{error}"));
    let sold: Vec<&String> = dev.tasks.keys().filter(|k| !EXAMPLE_KINDS.contains(&k.as_str())).collect();
    assert_eq!(sold, shipped.tasks.keys().collect::<Vec<_>>());
    for kind in EXAMPLE_KINDS {
        assert_eq!(dev.tasks[*kind].executor.name(), "lambda", "{kind}: an example function");
    }
    for (kind, task) in dev.tasks.iter().filter(|(k, _)| !EXAMPLE_KINDS.contains(&k.as_str())) {
        let deployed = &shipped.tasks[kind];
        assert_eq!(task.executor, deployed.executor, "{kind}");
        assert_eq!(task.timeout_seconds, deployed.timeout_seconds, "{kind}");
        assert_eq!(task.input_schema, deployed.input_schema, "{kind}");
        let amounts = |t: &reeve_shared::catalog::TaskSpec| t.accepts.iter().map(|p| p.amount).collect::<Vec<_>>();
        assert_eq!(amounts(task), amounts(deployed), "{kind}: the same prices, in the local token");
    }
    assert_eq!(dev.uploads, shipped.uploads);
    for (id, asset) in &dev.assets {
        assert_eq!(asset.network, "eip155:84532", "{id}: the local chain's id (scripts/payments.sh)");
    }
    let payments = dev.payments.as_ref().unwrap();
    assert_eq!(payments.network_kind, NetworkKind::Testnet);
    assert_eq!(payments.facilitator_url, "http://127.0.0.1:4021", "scripts/payments.sh's facilitator");
    assert_eq!(dev.warnings(), []);
}

/// A mainnet catalog (the default) that prices in a testnet asset sells work
/// for tokens without value: legal, but warned about at the price's path.
#[test]
fn a_testnet_price_in_a_mainnet_catalog_is_warned_about_at_its_path() {
    let sepolia = |kind: &str| {
        catalog_with(
            "[assets.test-coin]\nnetwork = \"eip155:84532\"\ncontract = \"0x036CbD53842c5426634e7929541eC2318f3dCF7e\"\n\
             decimals = 6\nusd_peg = true\nname = \"USDC\"\nversion = \"2\"",
            "executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount = \"1\"\n\
             [[tasks.t.accepts]]\nasset = \"test-coin\"\namount = \"1\"",
        )
        .replace("[payments]\n", &format!("[payments]\n{kind}"))
    };
    for declared in ["", "network_kind = \"mainnet\"\n"] {
        let catalog = parse_ok(&sepolia(declared));
        let warnings = catalog.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].path, "tasks.t.accepts[1].asset");
        assert!(
            warnings[0].message.contains("eip155:84532") && warnings[0].message.contains("testnet"),
            "{warnings:?}"
        );
    }
    let testnet = parse_ok(&sepolia("network_kind = \"testnet\"\n"));
    assert_eq!(testnet.payments.as_ref().unwrap().network_kind, NetworkKind::Testnet);
    assert_eq!(testnet.warnings(), [], "a catalog for testnets may price in them");

    let wrong = problems(&sepolia("network_kind = \"production\"\n"));
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert_eq!(wrong[0].path, "payments.network_kind");
    assert!(wrong[0].message.contains("mainnet") && wrong[0].message.contains("testnet"), "{wrong:?}");
}

#[test]
fn shipped_catalog_schemas_are_compiled_and_enforced() {
    let catalog = Catalog::load(Path::new(SHIPPED)).unwrap();
    let fetch = catalog.task("fetch").unwrap().input_validator.as_deref().expect("compiled at load");
    assert!(fetch.is_valid(&json!({"url": "https://example.com/a.pdf"})));
    assert!(!fetch.is_valid(&json!({"url": "http://example.com/"})), "pattern ^https://");
    assert!(!fetch.is_valid(&json!({"url": "https://exa mple.com/"})), "format uri is enforced");
    assert!(!fetch.is_valid(&json!({"url": "https://example.com/", "extra": 1})));

    let digest = catalog.task("digest").unwrap().input_validator.as_deref().expect("compiled at load");
    assert!(digest.is_valid(&json!({"upload_id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"})));
    assert!(!digest.is_valid(&json!({"upload_id": "not-a-ulid"})));
    assert!(!digest.is_valid(&json!({})));
}

/// The functions that validate no input (task-status, the worker, the
/// sweeper, the catalog) load the schemas as JSON and never compile them;
/// the loads that validate (task-create, MCP, `reeve config check`) compile
/// them and list a bad schema with every other problem at once.
#[test]
fn only_the_compiling_load_compiles_schemas_and_it_lists_their_problems_with_the_rest() {
    let path = std::env::temp_dir().join(format!("reeve-catalog-{}.toml", ulid::Ulid::new()));
    let bad_schema = "input_schema = { type = \"object\", properties = { n = { minimum = \"ten\" } } }";
    let text = catalog_with("", "executor = \"digest\"").replace("input_schema = { type = \"object\" }", bad_schema);
    std::fs::write(&path, &text).unwrap();

    let served = Catalog::load_for(&path, 900).unwrap_or_else(|error| panic!("{error}"));
    let task = served.task("t").unwrap();
    assert!(task.input_validator.is_none());
    assert_eq!(task.input_schema["properties"]["n"]["minimum"], "ten", "served as written");
    let compiled = Catalog::load_compiled_for(&path, 900).unwrap_err();
    let CatalogError::Invalid { problems, .. } = &compiled else { panic!("{compiled}") };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].path, "tasks.t.input_schema");
    assert!(problems[0].message.contains("invalid JSON Schema at /properties/n/minimum"), "{problems:?}");

    // With a second mistake elsewhere, both are listed.
    std::fs::write(&path, text.replace("decimals = 6", "decimals = \"six\"")).unwrap();
    let CatalogError::Invalid { problems, .. } = Catalog::load_compiled_for(&path, 900).unwrap_err() else {
        panic!("expected problems")
    };
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["assets.coin.decimals", "tasks.t.input_schema"], "{problems:?}");

    std::fs::remove_file(&path).unwrap();
    let good = Catalog::load_compiled_for(Path::new(SHIPPED), 900).unwrap();
    assert!(good.tasks.values().all(|task| task.input_validator.is_some()));
}

#[test]
fn catalog_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<Catalog>();
}

#[test]
fn usd_prices_convert_exactly_with_floor() {
    let cases: &[(&str, u8, u128)] = &[
        ("0.01", 6, 10_000),
        ("1", 18, 1_000_000_000_000_000_000),
        ("1.5", 0, 1),
        ("0.0000019", 6, 1),
        ("12.345678", 6, 12_345_678),
        ("007.10", 2, 710),
        ("0.000000000000000001", 18, 1),
        ("1", 36, 10u128.pow(36)),
    ];
    for &(usd, decimals, expected) in cases {
        let text = catalog_with(
            &format!(
                "[assets.coin-{decimals}]\nnetwork = \"eip155:1\"\ncontract = \"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913\"\ndecimals = {decimals}\nusd_peg = true\nname = \"C\"\nversion = \"1\""
            ),
            &format!("executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin-{decimals}\"\namount_usd = \"{usd}\""),
        );
        assert_eq!(price_of(&parse_ok(&text)), expected, "{usd} with {decimals} decimals");
    }
}

#[test]
fn usd_prices_that_are_zero_or_malformed_are_refused() {
    let cases: &[(&str, &str)] = &[
        ("0.0000001", r#"amount_usd "0.0000001" is 0 atomic units of coin (6 decimals)"#),
        ("0", r#"amount_usd "0" is 0 atomic units of coin (6 decimals)"#),
        ("1e3", r#""1e3" is not a decimal amount of US dollars"#),
        ("-1", r#""-1" is not a decimal amount of US dollars"#),
        ("", r#""" is not a decimal amount of US dollars"#),
        ("1.2.3", r#""1.2.3" is not a decimal amount of US dollars"#),
        (".5", r#"".5" is not a decimal amount of US dollars"#),
        ("1.", r#""1." is not a decimal amount of US dollars"#),
        ("1,000", r#""1,000" is not a decimal amount of US dollars"#),
        (" 1", r#"" 1" is not a decimal amount of US dollars"#),
        ("0.0000000000000000001", "has more than 18 fractional digits"),
        ("1000000000000000000000000000000000", "is too large for an asset with 6 decimals"),
    ];
    for &(usd, message) in cases {
        let text = catalog_with(
            "",
            &format!("executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount_usd = \"{usd}\""),
        );
        let found = problems(&text);
        assert_eq!(found.len(), 1, "{usd:?}: {found:?}");
        assert_eq!(found[0].path, "tasks.t.accepts[0].amount_usd", "{usd:?}");
        assert!(found[0].message.contains(message), "{usd:?}: {}", found[0].message);
    }
}

#[test]
fn atomic_amounts_are_positive_digit_strings() {
    let ok = catalog_with(
        "",
        "executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount = \"123456789012345678901234567890\"",
    );
    assert_eq!(price_of(&parse_ok(&ok)), 123_456_789_012_345_678_901_234_567_890);

    let cases: &[(&str, &str)] = &[
        (r#""0""#, "must be greater than 0"),
        (r#""-5""#, r#""-5" is not a whole number of atomic units"#),
        (r#""1.5""#, r#""1.5" is not a whole number of atomic units"#),
        (r#""""#, r#""" is not a whole number of atomic units"#),
        (r#""999999999999999999999999999999999999999999""#, "is too large"),
        ("10000", "expected a string, found integer 10000"),
    ];
    for &(amount, message) in cases {
        let text = catalog_with(
            "",
            &format!("executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount = {amount}"),
        );
        let found = problems(&text);
        assert_eq!(found.len(), 1, "{amount}: {found:?}");
        assert_eq!(found[0].path, "tasks.t.accepts[0].amount");
        assert!(found[0].message.contains(message), "{amount}: {}", found[0].message);
    }
}

#[test]
fn three_mistakes_are_all_reported_with_their_paths() {
    let error = Catalog::load(Path::new(THREE_MISTAKES)).unwrap_err();
    let CatalogError::Invalid { path, problems } = &error else {
        panic!("expected Invalid, got {error}");
    };
    assert_eq!(path, THREE_MISTAKES);
    let mut found: Vec<String> = problems.iter().map(Problem::to_string).collect();
    found.sort();
    assert_eq!(
        found,
        [
            r#"tasks.convert.executor: unknown executor "pandoc" (known: digest, fetch, http, lambda)"#,
            r#"tasks.fetch.accepts[0].asset: unknown asset "usdt""#,
            "tasks.fetch.accepts[1]: both amount and amount_usd are set; set exactly one",
        ]
    );
    let shown = error.to_string();
    assert!(shown.starts_with(&format!("{THREE_MISTAKES}: 3 problems:\n  ")), "{shown}");
    assert_eq!(shown.lines().count(), 4, "{shown}");
}

/// Each rule, broken on its own: exactly one problem, at this path, with a
/// message containing this text.
#[test]
fn each_rule_reports_one_problem_at_its_path() {
    const PRICED: &str = "executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount = \"1\"";
    // A valid free catalog with one edit.
    let edit = |from: &str, to: &str| catalog_with("", "executor = \"fetch\"").replace(from, to);
    // The task `t` with these lines added.
    let task = |lines: &str| catalog_with("", lines);
    let schema = |schema: &str| edit("{ type = \"object\" }", schema);
    let priced = |from: &str, to: &str| catalog_with("", PRICED).replace(from, to);
    let price = |lines: &str| task(&format!("executor = \"fetch\"\n[[tasks.t.accepts]]\n{lines}"));
    let uploads = |lines: &str| format!("{}\n[uploads]\n{lines}", task("executor = \"fetch\""));
    let address = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913";

    let cases: Vec<(&str, String, &str, &str)> = vec![
        // assets
        (
            "network not CAIP-2",
            edit("eip155:8453", "base"),
            "assets.coin.network",
            r#""base" is not a CAIP-2 network id"#,
        ),
        (
            "namespace upper case",
            edit("eip155:8453", "EIP155:8453"),
            "assets.coin.network",
            "is not a CAIP-2 network id",
        ),
        (
            "reference too long",
            edit("eip155:8453", &format!("cosmos:{}", "a".repeat(33))),
            "assets.coin.network",
            "is not a CAIP-2 network id",
        ),
        (
            "eip155 reference not a number",
            edit("eip155:8453", "eip155:base"),
            "assets.coin.network",
            "an eip155 reference must be a decimal chain id",
        ),
        ("contract too short", edit(address, "0x8335"), "assets.coin.contract", r#""0x8335" is not an EVM address"#),
        (
            "contract not hex",
            edit(address, &address.replace('3', "g")),
            "assets.coin.contract",
            "is not an EVM address",
        ),
        (
            "decimals wrong type",
            edit("decimals = 6", "decimals = \"six\""),
            "assets.coin.decimals",
            r#"expected an integer, found string "six""#,
        ),
        (
            "decimals too large",
            edit("decimals = 6", "decimals = 37"),
            "assets.coin.decimals",
            "must be from 0 to 36, got 37",
        ),
        (
            "usd_peg wrong type",
            edit("usd_peg = true", "usd_peg = \"yes\""),
            "assets.coin.usd_peg",
            "expected a boolean",
        ),
        ("name empty", edit("name = \"USD Coin\"", "name = \" \""), "assets.coin.name", "must not be empty"),
        ("version missing", edit("version = \"2\"", ""), "assets.coin.version", "missing required key"),
        ("asset id upper case", edit("[assets.coin]", "[assets.Coin]"), "assets.Coin", r#"invalid asset id "Coin""#),
        (
            "asset unknown key",
            edit("version = \"2\"", "version = \"2\"\nsymbol = \"USDC\""),
            "assets.coin.symbol",
            "unknown key (expected one of: network, contract",
        ),
        // tasks
        (
            "task kind with a space",
            edit("[tasks.t]", "[tasks.\"my task\"]"),
            "tasks.\"my task\"",
            r#"invalid task kind "my task""#,
        ),
        (
            "a kind named like the bulk cancel's route",
            edit("[tasks.t]", "[tasks.cancel]"),
            "tasks.cancel",
            r#"task kind "cancel" is reserved: POST /v1/tasks/cancel is another route"#,
        ),
        ("title empty", edit("title = \"T\"", "title = \"\""), "tasks.t.title", "must not be empty"),
        ("title missing", edit("title = \"T\"", ""), "tasks.t.title", "missing required key"),
        (
            "typo in an optional key",
            task("executor = \"fetch\"\ntimout_seconds = 30"),
            "tasks.t.timout_seconds",
            "unknown key (expected one of: title, description, executor, endpoint, protocol, secret, function, \
             asynchronous, timeout_seconds, input_schema, accepts, quota, running_per_space)",
        ),
        (
            "a protocol kind runs at most 12 hours",
            task(
                "executor = \"http\"\nendpoint = \"https://x.example/run\"\nprotocol = 1\nsecret = \"S\"\ntimeout_seconds = 43201",
            ),
            "tasks.t.timeout_seconds",
            "must be from 1 to 43200, got 43201",
        ),
        (
            "a secret without a protocol",
            task("executor = \"http\"\nendpoint = \"https://x.example/run\"\nsecret = \"S\""),
            "tasks.t.secret",
            "only a kind with protocol = 1 signs its jobs",
        ),
        (
            "timeout zero",
            task("executor = \"fetch\"\ntimeout_seconds = 0"),
            "tasks.t.timeout_seconds",
            "must be from 1 to 900, got 0",
        ),
        (
            "timeout over Lambda's limit",
            task("executor = \"fetch\"\ntimeout_seconds = 901"),
            "tasks.t.timeout_seconds",
            "must be from 1 to 900, got 901",
        ),
        (
            "timeout that leaves the worker no margin",
            task("executor = \"fetch\"\ntimeout_seconds = 331"),
            "tasks.t.timeout_seconds",
            "331 s plus the worker's 30 s margin is more than the worker's time limit (360 s, its function's Timeout): \
             at most 330",
        ),
        ("executor missing", task(""), "tasks.t.executor", "missing required key"),
        (
            "executor unknown",
            task("executor = \"shell\""),
            "tasks.t.executor",
            r#"unknown executor "shell" (known: digest, fetch, http, lambda)"#,
        ),
        (
            "http without endpoint",
            task("executor = \"http\""),
            "tasks.t.endpoint",
            "missing; executor \"http\" needs the URL",
        ),
        (
            "endpoint not http",
            task("executor = \"http\"\nendpoint = \"ftp://example.com/x\""),
            "tasks.t.endpoint",
            "is not an absolute http(s) URL",
        ),
        (
            "endpoint without host",
            task("executor = \"http\"\nendpoint = \"https:///x\""),
            "tasks.t.endpoint",
            "it has no valid host",
        ),
        (
            "endpoint with credentials",
            task("executor = \"http\"\nendpoint = \"https://u:p@example.com/\""),
            "tasks.t.endpoint",
            "credentials are not allowed",
        ),
        (
            "endpoint with a bad port",
            task("executor = \"http\"\nendpoint = \"https://example.com:99999/\""),
            "tasks.t.endpoint",
            "the port must be a number",
        ),
        (
            "endpoint on another executor",
            task("executor = \"digest\"\nendpoint = \"https://example.com/\""),
            "tasks.t.endpoint",
            r#"only executor "http" takes an endpoint, not "digest""#,
        ),
        (
            "schema missing",
            edit("input_schema = { type = \"object\" }", ""),
            "tasks.t.input_schema",
            "missing required key",
        ),
        ("schema not a table", schema("\"object\""), "tasks.t.input_schema", "expected a table, found string"),
        ("schema invalid", schema("{ type = \"nope\" }"), "tasks.t.input_schema", "invalid JSON Schema at /type"),
        (
            "schema invalid deep down",
            schema("{ type = \"object\", properties = { n = { minimum = \"ten\" } } }"),
            "tasks.t.input_schema",
            "invalid JSON Schema at /properties/n/minimum",
        ),
        (
            "schema bad regex",
            schema("{ type = \"object\", properties = { s = { pattern = \"([\" } } }"),
            "tasks.t.input_schema",
            "invalid JSON Schema at /properties/s/pattern: '([' is not valid regex: regex parse error: ([ ^ error: unclosed",
        ),
        (
            "schema with an unknown format",
            schema("{ type = \"object\", properties = { u = { format = \"url\" } } }"),
            "tasks.t.input_schema",
            "invalid JSON Schema at /properties/u/format: unknown format \"url\"",
        ),
        (
            "schema not an object",
            schema("{ type = \"string\" }"),
            "tasks.t.input_schema",
            "the top level must have type = \"object\"",
        ),
        (
            "schema with a datetime",
            schema("{ type = \"object\", default = 2024-01-01 }"),
            "tasks.t.input_schema",
            "datetime 2024-01-01 has no JSON equivalent",
        ),
        (
            "schema with an external ref",
            schema("{ type = \"object\", \"$ref\" = \"https://example.com/s.json\" }"),
            "tasks.t.input_schema",
            "invalid JSON Schema",
        ),
        // accepts
        (
            "accepts not an array",
            task("executor = \"fetch\"\naccepts = \"coin\""),
            "tasks.t.accepts",
            "expected an array, found string",
        ),
        (
            "accepts entry not a table",
            task("executor = \"fetch\"\naccepts = [\"coin\"]"),
            "tasks.t.accepts[0]",
            "expected a table, found string",
        ),
        (
            "unknown asset",
            price("asset = \"usdt\"\namount = \"1\""),
            "tasks.t.accepts[0].asset",
            r#"unknown asset "usdt""#,
        ),
        ("asset missing", price("amount = \"1\""), "tasks.t.accepts[0].asset", "missing required key"),
        (
            "both amounts",
            price("asset = \"coin\"\namount = \"1\"\namount_usd = \"1\""),
            "tasks.t.accepts[0]",
            "both amount and amount_usd are set; set exactly one",
        ),
        (
            "neither amount",
            price("asset = \"coin\""),
            "tasks.t.accepts[0]",
            "neither amount nor amount_usd is set; set exactly one",
        ),
        (
            "amount_usd on an unpegged asset",
            price("asset = \"coin\"\namount_usd = \"1\"").replace("usd_peg = true", "usd_peg = false"),
            "tasks.t.accepts[0].amount_usd",
            r#"asset "coin" is not marked usd_peg = true"#,
        ),
        (
            "duplicate asset",
            task(&format!("{PRICED}\n[[tasks.t.accepts]]\nasset = \"coin\"\namount_usd = \"1\"")),
            "tasks.t.accepts[1].asset",
            r#"asset "coin" is listed twice"#,
        ),
        (
            "price unknown key",
            task(&format!("{PRICED}\nnetwork = \"eip155:1\"")),
            "tasks.t.accepts[0].network",
            "unknown key (expected one of: asset, scheme, amount, amount_usd, unit, rate, rate_usd)",
        ),
        // payments
        ("priced without payments", priced(PAYMENTS, ""), "payments", "missing; priced tasks (t) need [payments]"),
        (
            "pay_to not an address",
            priced("0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "alice.eth"),
            "payments.pay_to",
            r#""alice.eth" is not an EVM address"#,
        ),
        ("pay_to missing", priced("pay_to", "#pay_to"), "payments.pay_to", "missing required key"),
        (
            "facilitator over plain http",
            priced("https://x402.org", "http://x402.org"),
            "payments.facilitator_url",
            "must use https (plain http only for 127.0.0.1, localhost or [::1])",
        ),
        (
            "facilitator not a URL",
            priced("https://x402.org/facilitator", "x402.org"),
            "payments.facilitator_url",
            "is not an absolute http(s) URL",
        ),
        (
            "payment timeout too long",
            priced("[payments]", "[payments]\nmax_timeout_seconds = 3601"),
            "payments.max_timeout_seconds",
            "must be from 1 to 3600, got 3601",
        ),
        ("payments typo", priced("[payments]", "[payments]\nmax_timeout = 30"), "payments.max_timeout", "unknown key"),
        // uploads
        (
            "uploads max_bytes zero",
            uploads("max_bytes = 0"),
            "uploads.max_bytes",
            "must be from 1 to 5368709120, got 0",
        ),
        (
            "uploads over the single PUT limit",
            uploads("max_bytes = 5368709121"),
            "uploads.max_bytes",
            "5 GiB is S3's limit for a single PUT",
        ),
        (
            "uploads no content types",
            uploads("content_types = []"),
            "uploads.content_types",
            "must list at least one content type",
        ),
        (
            "content type with parameters",
            uploads("content_types = [\"image/png\", \"text/plain; charset=utf-8\"]"),
            "uploads.content_types[1]",
            "is not a media type of the form type/subtype",
        ),
        (
            "content type not a string",
            uploads("content_types = [3]"),
            "uploads.content_types[0]",
            "expected a string, found integer 3",
        ),
        (
            "expiry over SigV4's limit",
            uploads("url_expiry_seconds = 604801"),
            "uploads.url_expiry_seconds",
            "must be from 1 to 604800, got 604801",
        ),
        (
            "uploads not a table",
            format!("uploads = 5\n{}", task("executor = \"fetch\"")),
            "uploads",
            "expected a table, found integer 5",
        ),
        // quotas: a free task's ceiling per space
        (
            "quota per_hour zero",
            task("executor = \"fetch\"\n[tasks.t.quota]\nper_hour = 0"),
            "tasks.t.quota.per_hour",
            "must be from 1 to 1000000, got 0",
        ),
        (
            "quota at_once too large",
            task("executor = \"fetch\"\n[tasks.t.quota]\nat_once = 10001"),
            "tasks.t.quota.at_once",
            "must be from 1 to 10000, got 10001",
        ),
        (
            "quota per_hour a string",
            task("executor = \"fetch\"\n[tasks.t.quota]\nper_hour = \"10\""),
            "tasks.t.quota.per_hour",
            "expected an integer, found string \"10\"",
        ),
        (
            "quota key typo",
            task("executor = \"fetch\"\n[tasks.t.quota]\nper_hours = 10"),
            "tasks.t.quota.per_hours",
            "unknown key (expected one of: per_hour, at_once)",
        ),
        (
            "quota not a table",
            task("executor = \"fetch\"\nquota = 5"),
            "tasks.t.quota",
            "expected a table, found integer 5",
        ),
        (
            "quota on a priced task",
            catalog_with("", &format!("{PRICED}\n[tasks.t.quota]\nper_hour = 5")),
            "tasks.t.quota",
            "only a free task has a quota; a priced task is limited by its payment",
        ),
        // the file as a whole
        (
            "top-level typo",
            edit("[payments]", "[payment]"),
            "payment",
            "unknown key (expected one of: payments, uploads, limits, assets, tasks)",
        ),
        ("tasks not a table", format!("tasks = [1]\n{PAYMENTS}"), "tasks", "expected a table, found an array"),
    ];
    let mut failures = Vec::new();
    for (name, text, path, message) in &cases {
        match Catalog::parse(text) {
            Err(CatalogError::Invalid { problems, .. })
                if problems.len() == 1 && problems[0].path == *path && problems[0].message.contains(message) => {}
            other => failures.push(format!("{name}: expected `{path}: …{message}…`, got {other:?}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn mistakes_in_one_table_are_all_reported() {
    let text = catalog_with(
        "",
        "executor = \"shell\"\ntimeout_seconds = 0\ncolour = \"blue\"\n[[tasks.t.accepts]]\nasset = \"nope\"",
    )
    .replace("network = \"eip155:8453\"", "network = \"base\"")
    .replace("decimals = 6", "decimals = 37");
    let mut found: Vec<String> = problems(&text).iter().map(|problem| problem.path.clone()).collect();
    found.sort();
    assert_eq!(
        found,
        [
            "assets.coin.decimals",
            "assets.coin.network",
            "tasks.t.accepts[0]",
            "tasks.t.accepts[0].asset",
            "tasks.t.colour",
            "tasks.t.executor",
            "tasks.t.timeout_seconds",
        ]
    );
}

#[test]
fn a_broken_asset_is_not_also_reported_as_unknown() {
    let text = catalog_with("", "executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount_usd = \"0.01\"")
        .replace("decimals = 6", "decimals = -1");
    let found = problems(&text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].path, "assets.coin.decimals");
}

#[test]
fn defaults_apply_when_optional_parts_are_absent() {
    let free_only = r#"
[tasks.t]
title = "T"
executor = "digest"
input_schema = { type = "object" }
"#;
    let catalog = parse_ok(free_only);
    assert_eq!(catalog.payments, None, "a free-only catalog needs no [payments]");
    assert_eq!(catalog.uploads, Uploads::default());
    assert_eq!(catalog.uploads.max_bytes, 100 * 1024 * 1024);
    assert_eq!(catalog.uploads.url_expiry_seconds, 900);
    let task = catalog.task("t").unwrap();
    assert_eq!(task.timeout_seconds, 60);
    assert_eq!(task.description, "");
    assert!(catalog.assets.is_empty());

    // Free work always has a ceiling, written or not.
    assert_eq!(task.quota, Some(Quota { per_hour: 100, at_once: 10 }));
    let set = parse_ok(&format!("{free_only}\n[tasks.t.quota]\nper_hour = 7"));
    assert_eq!(set.task("t").unwrap().quota, Some(Quota { per_hour: 7, at_once: 10 }), "each key defaults alone");

    let priced =
        parse_ok(&catalog_with("", "executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount = \"1\""));
    assert_eq!(priced.task("t").unwrap().quota, None, "payment is a priced task's limit");
    assert_eq!(priced.payments.unwrap().max_timeout_seconds, 300);
}

#[test]
fn every_listed_executor_is_accepted() {
    for &name in Executor::NAMES {
        let endpoint = required_keys(name);
        let catalog = parse_ok(&catalog_with("", &format!("executor = \"{name}\"{endpoint}")));
        assert_eq!(catalog.task("t").unwrap().executor.name(), name);
    }
}

/// The keys an executor cannot do without, as a kind's table lines.
fn required_keys(executor: &str) -> &'static str {
    match executor {
        "http" => "\nendpoint = \"https://example.com/run\"",
        "lambda" => "\nfunction = \"wordfreq\"",
        _ => "",
    }
}

/// A kind whose service may answer 202 holds the worker only for that
/// answer: it may run 12 hours, and only its wait must fit in the worker.
#[test]
fn a_protocol_kind_may_run_for_hours_since_the_worker_waits_only_for_its_answer() {
    let protocol = "executor = \"http\"\nendpoint = \"https://example.com/run\"\nprotocol = 1\nsecret = \"RUN_SECRET\"";
    let catalog = parse_ok(&catalog_with("", &format!("{protocol}\ntimeout_seconds = 43200")));
    let task = catalog.task("t").unwrap();
    assert_eq!((task.timeout_seconds, task.waited_seconds()), (43_200, 300));
    assert!(task.executor.delegates());
    let bare = parse_ok(&catalog_with("", "executor = \"http\"\nendpoint = \"https://example.com/run\""));
    assert!(!bare.task("t").unwrap().executor.delegates(), "without protocol, the call it always was");
}

/// An asynchronous `lambda` kind is invoked with `Event`, answered at once:
/// it may run 12 hours as a protocol `http` kind may. A synchronous one
/// holds the worker for the whole call, as a bare `http` kind does.
#[test]
fn an_asynchronous_lambda_kind_may_run_for_hours_a_synchronous_one_may_not() {
    let event = "executor = \"lambda\"\nfunction = \"wordfreq\"\nasynchronous = true\ntimeout_seconds = 43200";
    let catalog = parse_ok(&catalog_with("", event));
    let task = catalog.task("t").unwrap();
    assert_eq!((task.timeout_seconds, task.waited_seconds()), (43_200, 300));
    let sync = "executor = \"lambda\"\nfunction = \"wordfreq\"\ntimeout_seconds = 43200";
    let shown: Vec<String> = problems(&catalog_with("", sync)).iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(shown[0].starts_with("tasks.t.timeout_seconds: must be from 1 to"), "{shown:?}");
    let missing: Vec<String> =
        problems(&catalog_with("", "executor = \"lambda\"")).iter().map(ToString::to_string).collect();
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(missing[0].starts_with("tasks.t.function: missing;"), "{missing:?}");
}

/// Which units each executor's metered price may count, written out: a
/// registry change that lets an executor be priced in what it does not
/// measure, or stops one being priced in what it does, fails here.
#[test]
fn a_metered_price_counts_only_what_its_executor_measures() {
    let bytes = ["byte", "KiB", "MiB", "GiB"];
    let measured: [(&str, &[&str]); 4] =
        [("digest", &bytes), ("fetch", &bytes), ("http", &["second"]), ("lambda", &["second"])];
    assert_eq!(measured.map(|(name, _)| name), Executor::NAMES, "a row per registered executor");
    for (name, units) in measured {
        let endpoint = required_keys(name);
        for unit in ["byte", "KiB", "MiB", "GiB", "second"] {
            let text = catalog_with(
                "",
                &format!(
                    "executor = \"{name}\"{endpoint}\n[[tasks.t.accepts]]\nasset = \"coin\"\nscheme = \"upto\"\n\
                     unit = \"{unit}\"\nrate = \"1\"\namount = \"1000\""
                ),
            );
            if units.contains(&unit) {
                let meter = parse_ok(&text).task("t").unwrap().accepts[0].meter.clone().unwrap();
                assert_eq!(meter.unit.name(), unit);
            } else {
                let shown: Vec<String> = problems(&text).iter().map(ToString::to_string).collect();
                let want = format!(
                    "tasks.t.accepts[0].unit: executor {name:?} does not measure {unit:?}; it measures {}",
                    units.join(", ")
                );
                assert_eq!(shown, [want]);
            }
        }
    }
}

/// A unit of the service's own naming (`[a-z_]{1,32}`) is for a kind whose
/// service reports (`protocol = 1`), counted one for one; any other kind is
/// refused it, and a name outside the form is no unit.
#[test]
fn a_service_may_name_its_own_unit_and_only_a_service() {
    let kind = |executor: &str, unit: &str| {
        catalog_with(
            "",
            &format!(
                "{executor}\n[[tasks.t.accepts]]\nasset = \"coin\"\nscheme = \"upto\"\n\
                 unit = \"{unit}\"\nrate = \"1\"\namount = \"1000\""
            ),
        )
    };
    let service = "executor = \"http\"\nendpoint = \"https://example.com/run\"\nprotocol = 1\nsecret = \"RUN_SECRET\"";
    for unit in ["line", "token", "gpu_second", "page"] {
        let meter = parse_ok(&kind(service, unit)).task("t").unwrap().accepts[0].meter.clone().unwrap();
        assert_eq!((meter.unit.name(), meter.unit.base()), (unit, 1));
    }
    let bare = "executor = \"http\"\nendpoint = \"https://example.com/run\"";
    let shown: Vec<String> = problems(&kind(bare, "line")).iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["tasks.t.accepts[0].unit: executor \"http\" does not measure \"line\"; it measures second"]);
    for bad in ["Line", "lines!", "a-b", &"x".repeat(33)] {
        let shown: Vec<String> = problems(&kind(service, bad)).iter().map(ToString::to_string).collect();
        assert!(shown.len() == 1 && shown[0].contains("unknown unit"), "{bad:?}: {shown:?}");
    }
}

#[test]
fn local_facilitators_may_use_plain_http() {
    for url in ["http://127.0.0.1:4021/facilitator", "http://localhost:4021", "http://[::1]:8080/x"] {
        let text = catalog_with("", "executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount = \"1\"")
            .replace("https://x402.org/facilitator", url);
        assert_eq!(parse_ok(&text).payments.unwrap().facilitator_url, url);
    }
}

#[test]
fn syntax_errors_give_line_and_column_on_one_line() {
    let text = "[payments]\npay_to = \"0xabc\"\nmax_timeout_seconds = = 5\n";
    let error = Catalog::parse(text).unwrap_err();
    let CatalogError::Syntax { path, line, column, message } = &error else {
        panic!("expected Syntax, got {error}");
    };
    assert_eq!((path.as_str(), *line, *column), ("reeve.toml", 3, 23));
    assert!(!message.is_empty());
    let shown = error.to_string();
    assert!(shown.starts_with("reeve.toml:3:23: invalid TOML: "), "{shown}");
    assert!(!shown.contains('\n'), "{shown}");
}

#[test]
fn syntax_error_columns_count_characters_not_bytes() {
    let text = "[tasks.t]\ntitle = \"Über\" x\n";
    let CatalogError::Syntax { line, column, .. } = Catalog::parse(text).unwrap_err() else {
        panic!("expected Syntax");
    };
    assert_eq!((line, column), (2, 16));
}

#[test]
fn a_missing_file_is_a_read_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/catalog/does-not-exist.toml");
    let error = Catalog::load(&path).unwrap_err();
    assert!(matches!(&error, CatalogError::Read { path: p, .. } if p == &path), "{error:?}");
    let shown = error.to_string();
    assert!(shown.starts_with(&format!("cannot read {}: ", path.display())), "{shown}");
    assert!(!shown.contains('\n'));
}

#[test]
fn public_view_shows_prices_as_strings_and_hides_endpoints() {
    let catalog = Catalog::load(Path::new(SHIPPED)).unwrap();
    let view = catalog.public_view();

    let fetch = view["tasks"].as_array().unwrap().iter().find(|task| task["kind"] == "fetch").unwrap();
    assert_eq!(fetch["free"], false);
    assert_eq!(
        fetch["prices"],
        json!([
            {"asset": "usdc-base", "network": "eip155:8453", "scheme": "exact", "amount": "10000", "amount_usd": "0.01",
             "summary": "0.01 USD (10000 atomic units of usdc-base)"},
        ])
    );
    assert_eq!(fetch["input_schema"]["properties"]["url"]["format"], "uri");
    assert_eq!(fetch["timeout_seconds"], 120);

    let http = view["tasks"].as_array().unwrap().iter().find(|task| task["kind"] == "http").unwrap();
    assert_eq!(
        http["prices"],
        json!([{"asset": "usdc-base", "network": "eip155:8453", "scheme": "exact", "amount": "5000",
                "summary": "5000 atomic units of usdc-base"}])
    );
    let digest = view["tasks"].as_array().unwrap().iter().find(|task| task["kind"] == "digest").unwrap();
    assert_eq!((digest["free"].clone(), digest["prices"].clone()), (json!(true), json!([])));
    assert_eq!(digest["quota"], json!({"per_hour": 100, "at_once": 10}), "a free task shows its quota");
    assert!(fetch.get("quota").is_none(), "a priced one has none: {fetch}");

    assert_eq!(
        view["assets"][0],
        json!({"id": "usdc-base", "network": "eip155:8453", "contract": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
               "decimals": 6, "usd_peg": true, "eip2612": true, "name": "USD Coin", "version": "2"}),
        "a token has EIP-2612 permit unless its asset says otherwise"
    );
    assert_eq!(view["uploads"]["max_bytes"], 104_857_600);
    assert_eq!(view["uploads"]["url_expiry_seconds"], 900);

    let serialized = view.to_string();
    assert!(!serialized.contains("endpoint"), "{serialized}");
    assert!(!serialized.contains("example.com/reeve"), "{serialized}");
}

#[test]
fn public_view_keeps_amounts_beyond_json_number_precision() {
    let catalog = parse_ok(&catalog_with(
        "",
        "executor = \"fetch\"\n[[tasks.t.accepts]]\nasset = \"coin\"\namount = \"9007199254740993\"",
    ));
    assert_eq!(catalog.public_view()["tasks"][0]["prices"][0]["amount"], "9007199254740993");
}
