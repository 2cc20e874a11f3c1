//! The one start-up path against real parts: secrets named by ARN are read
//! from Secrets Manager (the stack's moto, which serves every AWS service on
//! one port), a function is given only the secrets it asks for, and every
//! problem of a deployment is reported at once.

use crate::common;

use std::path::{Path, PathBuf};

use reeve_shared::auth::{self, Secret, SpaceId};
use reeve_shared::db::Connect;
use reeve_shared::settings::{self, Config, Needs};
use reeve_shared::startup::{self, StartupError};

const PEPPER: &str = "pepper-from-secrets-manager-0123456789abcdef";
const TOKEN_KEY: &str = "token-key-from-secrets-manager-0123456789ab";

fn catalog() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../reeve.dev.toml")
}

/// These variables, the shipped catalog unless they name another, and the
/// local chain's endpoint (which that catalog prices on) unless they name
/// theirs.
fn config(vars: &[(&str, String)]) -> Config {
    let config = Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let config = match config.get(settings::CATALOG) {
        Some(_) => config,
        None => config.with(settings::CATALOG, catalog().display().to_string()),
    };
    let config = match config.get(settings::CHAIN_RPC_URLS) {
        Some(_) => config,
        None => config.with(settings::CHAIN_RPC_URLS, common::chain::chain_rpc_urls()),
    };
    // That catalog sells a service kind (wordfreq): its jobs say where to report.
    let config = match config.get(settings::REPORT_URL) {
        Some(_) => config,
        None => config.with(settings::REPORT_URL, "http://127.0.0.1:8080/v1/executor/reports"),
    };
    // It publishes a receipt signer, whose key signs offers and receipts.
    match config.get(settings::RECEIPT_KEY) {
        Some(_) => config,
        None => config.with(settings::RECEIPT_KEY, common::RECEIPT_KEY),
    }
}

/// What every API function has besides its secrets.
fn plain(redis: &str) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_URL", redis.to_owned()),
        ("REEVE_BUCKET", "reeve-test".to_owned()),
        ("REEVE_QUEUE_URL", "http://127.0.0.1:5000/000000000000/q".to_owned()),
    ]
}

#[tokio::test]
async fn secrets_named_by_arn_are_read_from_secrets_manager() {
    let sdk = common::moto();
    let database_url = std::env::var("DATABASE_URL").unwrap();
    let mut vars = plain(&common::redis_url());
    vars.push(("REEVE_PEPPER_SECRET_ARN", common::create_secret(&sdk, PEPPER).await));
    vars.push(("REEVE_TOKEN_KEY_SECRET_ARN", common::create_secret(&sdk, TOKEN_KEY).await));
    vars.push(("REEVE_DATABASE_URL_SECRET_ARN", common::create_secret(&sdk, &database_url).await));

    let ctx = startup::api(&config(&vars), &sdk, Needs::AUTH, Connect::Now).await.unwrap_or_else(|e| panic!("{e}"));
    // The values are Secrets Manager's: the same keys derive the same index.
    let id = SpaceId::parse("12345678901234567890").unwrap();
    let pepper = Secret::new("REEVE_PEPPER", PEPPER.as_bytes().to_vec()).unwrap();
    assert_eq!(auth::space_index(&ctx.settings.pepper, &id), auth::space_index(&pepper, &id));
    let token_key = Secret::new("REEVE_TOKEN_KEY", TOKEN_KEY.as_bytes().to_vec()).unwrap();
    let (token, _) = auth::issue_token(&token_key, &auth::space_index(&pepper, &id), time::OffsetDateTime::now_utc());
    assert!(auth::verify_token(&ctx.settings.token_key, &token, time::OffsetDateTime::now_utc()).is_ok());
    // Connect::Now connected with the URL read from Secrets Manager.
    sqlx::query("SELECT 1").execute(&ctx.db).await.expect("connected");
    // Nothing of them is printed.
    let shown = format!("{:?}", ctx.settings);
    for value in [PEPPER, TOKEN_KEY, database_url.as_str()] {
        assert!(!shown.contains(value), "{shown}");
    }
}

#[tokio::test]
async fn a_function_without_a_secret_cannot_use_it() {
    let sdk = common::moto();
    // The catalog function: no secret at all, and it starts.
    let ctx = startup::api(&config(&plain(&common::redis_url())), &sdk, Needs::NONE, Connect::Lazily)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Its token key is random: a token made with the real key is refused.
    let real = Secret::new("REEVE_TOKEN_KEY", TOKEN_KEY.as_bytes().to_vec()).unwrap();
    let index = auth::space_index(&real, &SpaceId::parse("12345678901234567890").unwrap());
    let (token, _) = auth::issue_token(&real, &index, time::OffsetDateTime::now_utc());
    assert!(auth::verify_token(&ctx.settings.token_key, &token, time::OffsetDateTime::now_utc()).is_err());
    // And it has no database to reach.
    assert!(sqlx::query("SELECT 1").execute(&ctx.db).await.is_err());
}

#[tokio::test]
async fn every_problem_is_reported_at_once() {
    let sdk = common::moto();
    let missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:reeve-test/missing-AbCdEf";
    let vars = vec![
        // The pepper is not given at all; the token key names a secret that
        // does not exist; the database URL is not a URL.
        ("REEVE_TOKEN_KEY_SECRET_ARN", missing.to_owned()),
        ("DATABASE_URL", "mysql:/nowhere".to_owned()),
        ("REDIS_URL", "http://not-redis".to_owned()),
        ("REEVE_QUEUE_URL", "q".to_owned()),
        ("REEVE_UPLOAD_MAX_BYTES", "lots".to_owned()),
        ("REEVE_OPERATOR_ALLOW", "*.example.com".to_owned()),
    ];
    let config = config(&vars).with(settings::CATALOG, "no-such-catalog.toml");
    let err = startup::api(&config, &sdk, Needs::AUTH, Connect::Lazily).await.err().expect("start-up fails");
    assert!(matches!(err, StartupError::Config(_)));
    let problems = err.problems();
    let text = problems.join("\n");
    for expected in [
        "no-such-catalog.toml",
        "REEVE_UPLOAD_MAX_BYTES must be a positive integer",
        "REEVE_OPERATOR_ALLOW:",
        "REEVE_TOKEN_KEY_SECRET_ARN: cannot read arn:aws:secretsmanager:us-east-1:123456789012:secret:reeve-test/missing-AbCdEf from Secrets Manager: ResourceNotFoundException: ",
        "REEVE_PEPPER is not set (nor REEVE_PEPPER_SECRET_ARN",
        "REEVE_BUCKET is not set",
        "DATABASE_URL is not a valid Postgres URL",
        "REDIS_URL is not a valid Redis URL",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert_eq!(problems.len(), 8, "{text}");
    assert!(problems.iter().all(|p| p.len() < 300), "each problem is one readable line:\n{text}");
    assert!(!text.contains("REEVE_TOKEN_KEY is not set"), "a secret that failed to load is reported once:\n{text}");
}

#[tokio::test]
async fn a_secret_given_both_ways_is_refused() {
    let sdk = common::moto();
    let mut vars = plain(&common::redis_url());
    vars.push(("DATABASE_URL", std::env::var("DATABASE_URL").unwrap()));
    vars.push(("REEVE_DATABASE_URL_SECRET_ARN", "arn:aws:secretsmanager:us-east-1:1:secret:x".to_owned()));
    vars.push(("REEVE_TOKEN_KEY", TOKEN_KEY.to_owned()));
    let err = startup::api(&config(&vars), &sdk, Needs::SESSION, Connect::Lazily).await.err().unwrap();
    assert_eq!(err.problems(), ["set DATABASE_URL or REEVE_DATABASE_URL_SECRET_ARN, not both"]);
}

#[tokio::test]
async fn the_worker_and_the_guard_read_the_database_url_by_arn() {
    let sdk = common::moto();
    let database_url = std::env::var("DATABASE_URL").unwrap();
    let arn = common::create_secret(&sdk, &database_url).await;
    let vars = vec![
        ("REEVE_DATABASE_URL_SECRET_ARN", arn),
        ("REDIS_URL", common::redis_url()),
        ("REEVE_BUCKET", "reeve-test".to_owned()),
        ("REEVE_CATALOG", catalog().display().to_string()),
        // wordfreq's jobs carry report tokens, signed with the token key.
        ("REEVE_TOKEN_KEY", TOKEN_KEY.to_owned()),
    ];
    let worker = startup::worker(&config(&vars), &sdk, Connect::Now).await.unwrap_or_else(|e| panic!("{e}"));
    sqlx::query("SELECT 1").execute(&worker.db).await.expect("connected");
    let guard = startup::guard(&config(&vars), &sdk).await.unwrap_or_else(|e| panic!("{e}"));
    sqlx::query("SELECT 1").execute(&guard.db).await.expect("connected");

    // The worker without its secret, with a bad fetch allow-list: both reported.
    let vars = vec![
        ("REDIS_URL", common::redis_url()),
        ("REEVE_BUCKET", "b".to_owned()),
        ("REEVE_FETCH_ALLOW", "*.example.com".to_owned()),
        ("REEVE_TOKEN_KEY", TOKEN_KEY.to_owned()),
    ];
    let err = startup::worker(&config(&vars), &sdk, Connect::Lazily).await.err().unwrap();
    let problems = err.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("DATABASE_URL is not set"), "{problems:?}");
    assert!(problems[1].starts_with("REEVE_FETCH_ALLOW:"), "{problems:?}");
}

/// A catalog that prices in a network needs that network's chain endpoint,
/// where every payment on it is proven: each start-up that takes or proves
/// payments (every route, task create, MCP, the worker, the sweeper)
/// refuses to start without one, naming the variable and the network among
/// its other problems. Its confirmations are checked as well, and given
/// there, read on the real chain: the confirmed head is that many blocks
/// behind the latest (0 by default: the latest itself).
#[tokio::test]
async fn a_priced_network_without_a_chain_endpoint_stops_every_paying_start_up() {
    use reeve_shared::payments::{CHAIN_CONFIRMATIONS, CHAIN_RPC_URLS};
    let sdk = common::moto();
    let mut vars = plain(&common::redis_url());
    vars.push(("DATABASE_URL", std::env::var("DATABASE_URL").unwrap()));
    vars.push(("REEVE_PEPPER", PEPPER.to_owned()));
    vars.push(("REEVE_TOKEN_KEY", TOKEN_KEY.to_owned()));
    let without = config(&vars).without(CHAIN_RPC_URLS);
    let wanted = "REEVE_CHAIN_RPC_URLS has no JSON-RPC endpoint for eip155:84532, which tasks.";
    let refusals = [
        ("every route", startup::api(&without, &sdk, Needs::ALL, Connect::Lazily).await.err()),
        ("task create", startup::task_create(&without, &sdk).await.err()),
        ("mcp", startup::mcp(&without, &sdk).await.err()),
        ("worker", startup::worker(&without, &sdk, Connect::Lazily).await.err()),
        ("sweeper", startup::sweeper(&without, &sdk).await.err()),
    ];
    for (builder, refused) in refusals {
        let problems = refused.unwrap_or_else(|| panic!("{builder} started without a chain endpoint")).problems();
        assert_eq!(problems.iter().filter(|p| p.starts_with(wanted)).count(), 1, "{builder}: {problems:?}");
    }

    let out_of_range = config(&vars).with(CHAIN_CONFIRMATIONS, "eip155:84532=99");
    let problems = startup::worker(&out_of_range, &sdk, Connect::Lazily).await.err().unwrap().problems();
    assert_eq!(problems, ["REEVE_CHAIN_CONFIRMATIONS: eip155:84532: blocks must be an integer from 0 to 64"]);

    let _chain = common::chain::ChainLock::shared().await;
    for confirmations in [None, Some(0), Some(3)] {
        let given = match confirmations {
            Some(n) => config(&vars).with(CHAIN_CONFIRMATIONS, format!("eip155:84532={n}")),
            None => config(&vars),
        };
        let worker = startup::worker(&given, &sdk, Connect::Lazily).await.unwrap_or_else(|e| panic!("{e}"));
        let chain = worker.chains.get("eip155:84532").unwrap();
        assert_eq!(chain.confirmations(), confirmations.unwrap_or(0));
        // The chain mines a block a second: read the head on both sides.
        let before = chain.head().await.unwrap();
        let confirmed = chain.confirmed_head().await.unwrap();
        let after = chain.head().await.unwrap();
        let behind = confirmations.unwrap_or(0);
        assert!(
            (before.number.saturating_sub(behind)..=after.number.saturating_sub(behind)).contains(&confirmed.number),
            "{confirmations:?}: {confirmed:?} between {before:?} and {after:?}"
        );
        let block = chain.block(confirmed.number).await.unwrap();
        assert_eq!(block, confirmed, "the confirmed block's own time");
    }
}

/// A Lambda function's AWS configuration is the environment's alone: its
/// region and credentials, and each service at its own endpoint
/// (`AWS_ENDPOINT_URL_SQS` and `_KMS`, moto) over the one every other
/// service takes (`AWS_ENDPOINT_URL`, the stack's S3, which would answer
/// SQS with an error).
#[tokio::test]
async fn a_lambdas_aws_configuration_is_the_environments() {
    use aws_credential_types::provider::ProvideCredentials as _;

    let sdk = startup::lambda_sdk();
    assert_eq!(sdk.region().map(|r| r.to_string()), std::env::var("AWS_REGION").ok());
    let credentials = sdk.credentials_provider().expect("a provider").provide_credentials().await.expect("credentials");
    assert_eq!(credentials.access_key_id(), std::env::var("AWS_ACCESS_KEY_ID").unwrap());
    aws_sdk_sqs::Client::new(&sdk).list_queues().send().await.expect("SQS at AWS_ENDPOINT_URL_SQS");
    aws_sdk_kms::Client::new(&sdk).list_keys().send().await.expect("KMS at AWS_ENDPOINT_URL_KMS");
}
