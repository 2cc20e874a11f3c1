//! The MCP function's context, alone (its Lambda) or beside the API
//! (`reeve serve`).

// The builders share the start-up module's helpers and imports.
use super::*;

// ------------------------------------------------------------------- MCP

/// The `mcp` function's context. Exits 1 on any problem.
#[cfg(feature = "mcp")]
pub async fn lambda_mcp() -> Arc<McpContext> {
    let config = lambda_config();
    or_exit(mcp(&config, &lambda_sdk()).await)
}

/// `POST /mcp` alone: what auth, presign, task-create and task-status use
/// together (its tools do what they do): both secrets, the catalog, Postgres,
/// Redis, the bucket, the queue and the login budgets. A Lambda's reply is buffered whole, so
/// it sends no progress notifications.
#[cfg(feature = "mcp")]
pub async fn mcp(config: &Config, sdk: &SdkConfig) -> Result<Arc<McpContext>, StartupError> {
    let mut wanted = edge_too(Needs::AUTH);
    wanted.push(settings::RECEIPT_KEY);
    let (config, mut problems) = with_secrets(config, sdk, &wanted).await;
    let mut env = config.env();
    let catalog = deployed_catalog(&config, compiled_catalog_file(&config, &mut problems), &mut problems);
    let seller = seller_key(&config, sdk, catalog.as_ref(), &mut problems).await;
    let pepper = env.secret(settings::PEPPER);
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let redis_url = env.required(settings::REDIS_URL);
    let bucket = env.required(settings::BUCKET);
    let queue_url = env.required(settings::QUEUE_URL);
    let mcp_settings = settings::mcp_settings(&env, false);
    let console_url = env.optional(settings::CONSOLE_URL);
    let limits = settings::login_limits(&mut env);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let chains = chain_endpoints(&config, catalog.as_ref(), &mut problems);
    let (Some(catalog), Some(pepper), Some(token_key), Some(database_url), true) =
        (catalog, pepper, token_key, database_url, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    let stores = McpStores {
        db: postgres_lazily(&config, database_url.expose_str())?,
        redis: RedisClient::new(&redis_url)?,
        aws: AwsClients::from_config(sdk, config.s3_endpoint()),
        bucket,
        queue_url,
        chains,
    };
    // One Argon2id run per core at a time, as the auth function allows.
    let argon2 = Argon2Limit::new(std::thread::available_parallelism().map_or(2, |n| n.get()));
    let mut ctx = McpContext::new(Arc::new(catalog), stores, (pepper, token_key), argon2, mcp_settings);
    // The same budgets as the `auth` function's (one Postgres row per client).
    if let Some(fresh) = Arc::get_mut(&mut ctx) {
        fresh.limits = limits;
        fresh.seller = seller;
        fresh.console_url = console_url;
    }
    Ok(ctx)
}

/// The MCP endpoint beside the API, on its catalog, secrets and stores
/// (`reeve serve`, and tests).
#[cfg(all(feature = "mcp", feature = "api"))]
pub fn mcp_beside(api: &ApiContext, settings: crate::adapters::mcp::McpSettings) -> Arc<McpContext> {
    let stores = McpStores {
        db: api.db.clone(),
        redis: api.redis.clone(),
        aws: api.aws.clone(),
        bucket: api.settings.bucket.clone(),
        queue_url: api.settings.queue_url.clone(),
        chains: api.task_create.chains.clone(),
    };
    let secrets = (api.settings.pepper.clone(), api.settings.token_key.clone());
    let mut ctx = McpContext::new(api.catalog.clone(), stores, secrets, api.auth.argon2.clone(), settings);
    // The same budgets as the API's login routes (one Postgres row per address).
    if let Some(fresh) = Arc::get_mut(&mut ctx) {
        fresh.limits = api.auth.limits.clone();
        fresh.seller = api.settings.seller.clone();
    }
    ctx
}
