//! The HTTP functions' contexts (auth, catalog, presign, task create and
//! status) and the whole API's, which `reeve serve` and the tests use.

// The builders share the start-up module's helpers and imports.
use super::*;

// ------------------------------------------------------- HTTP functions
//
// Each function's context holds what its routes use and no more, and its
// builder reads only the variables and secrets those need: the `catalog`
// function is given no secret and opens no store; `auth` loads no catalog.
// Postgres is reached on first use, so a cold start opens nothing.

#[cfg(feature = "api-auth")]
/// The `auth` function's context. Exits 1 on any problem.
pub async fn lambda_auth() -> Arc<AuthContext> {
    let config = lambda_config();
    or_exit(auth(&config, &lambda_sdk()).await)
}

#[cfg(feature = "api-auth")]
/// Creating Spaces and opening sessions: the pepper, the token key, Postgres,
/// and the login budgets.
pub async fn auth(config: &Config, sdk: &SdkConfig) -> Result<Arc<AuthContext>, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &edge_too(Needs::AUTH)).await;
    let mut env = config.env();
    let pepper = env.secret(settings::PEPPER);
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let limits = settings::login_limits(&mut env);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let (Some(pepper), Some(token_key), Some(database_url), true) =
        (pepper, token_key, database_url, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    Ok(AuthContext::new(postgres_lazily(&config, database_url.expose_str())?, pepper, token_key, limits))
}

#[cfg(feature = "api-catalog")]
/// The `catalog` function's context. Exits 1 on any problem.
pub async fn lambda_catalog() -> Arc<CatalogContext> {
    or_exit(catalog(&lambda_config()))
}

#[cfg(feature = "api-catalog")]
/// The catalog and its OpenAPI document: the catalog file, nothing else.
pub fn catalog(config: &Config) -> Result<Arc<CatalogContext>, StartupError> {
    let mut problems = Vec::new();
    let catalog = deployed_catalog(config, catalog_file(config, &mut problems), &mut problems);
    match catalog {
        Some(catalog) if problems.is_empty() => Ok(CatalogContext::new(Arc::new(catalog))),
        _ => Err(StartupError::Config(problems)),
    }
}

#[cfg(feature = "api-uploads")]
/// The `presign` function's context. Exits 1 on any problem.
pub async fn lambda_presign() -> Arc<UploadsContext> {
    let config = lambda_config();
    let sdk = lambda_sdk();
    or_exit(presign(&config, &sdk).await)
}

#[cfg(feature = "api-uploads")]
/// Presigned uploads: the token key, Postgres, S3, the bucket and the
/// upload policy.
pub async fn presign(config: &Config, sdk: &SdkConfig) -> Result<Arc<UploadsContext>, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &Needs::SESSION.secrets()).await;
    let mut env = config.env();
    let uploads = deployed_uploads(&config, &mut problems);
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let bucket = env.required(settings::BUCKET);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let (Some(uploads), Some(token_key), Some(database_url), true) =
        (uploads, token_key, database_url, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    Ok(Arc::new(UploadsContext {
        db: postgres_lazily(&config, database_url.expose_str())?,
        token_key,
        s3: S3Objects::new(sdk, config.s3_endpoint()),
        bucket,
        uploads,
    }))
}

#[cfg(feature = "api-tasks")]
/// The `task-create` function's context. Exits 1 on any problem.
pub async fn lambda_task_create() -> Arc<TaskCreateContext> {
    let config = lambda_config();
    let sdk = lambda_sdk();
    or_exit(task_create(&config, &sdk).await)
}

#[cfg(feature = "api-tasks")]
/// Creating tasks: the catalog, the token key, Postgres, S3 (the uploads an
/// input names), SQS and the facilitator.
pub async fn task_create(config: &Config, sdk: &SdkConfig) -> Result<Arc<TaskCreateContext>, StartupError> {
    let mut wanted = receipt_key_too(Needs::SESSION);
    wanted.push(settings::BATCH_AUTHORIZER_KEY);
    let (config, mut problems) = with_secrets(config, sdk, &wanted).await;
    let mut env = config.env();
    let catalog = deployed_catalog(&config, compiled_catalog_file(&config, &mut problems), &mut problems);
    let batch_authorizer = batch_claimer(&config, catalog.as_ref(), Duration::ZERO, &mut problems).map(Arc::new);
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let bucket = env.required(settings::BUCKET);
    let queue_url = env.required(settings::QUEUE_URL);
    // The report route (`POST /v1/executor/reports`) publishes events and
    // renews leases as the worker holds them.
    let redis_url = env.required(settings::REDIS_URL);
    let lease = Duration::from_secs(env.number(settings::LEASE, TaskCreateContext::DEFAULT_LEASE.as_secs(), 2, 300));
    let max_attempts = settings::max_receives(&mut env);
    // A service's output files say when the bucket deletes them.
    let output_retention_days = settings::output_retention_days(&mut env);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let chains = chain_endpoints(&config, catalog.as_ref(), &mut problems);
    let seller = seller_key(&config, sdk, catalog.as_ref(), &mut problems).await;
    let (Some(catalog), Some(token_key), Some(database_url), true) =
        (catalog, token_key, database_url, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    let db = postgres_lazily(&config, database_url.expose_str())?;
    let api_settings = crate::adapters::http::ApiSettings {
        pepper: Secret::withheld(settings::PEPPER),
        token_key,
        database_url,
        redis_url,
        bucket,
        queue_url,
        // Task create spends no login budget.
        limits: Default::default(),
        seller,
        output_retention_days,
    };
    let aws = AwsClients::from_config(sdk, config.s3_endpoint());
    let ctx = TaskCreateContext::new(Arc::new(catalog), db, aws, api_settings, chains);
    Ok(Arc::new(TaskCreateContext {
        lease,
        max_attempts,
        batch_authorizer,
        ..Arc::into_inner(ctx).expect("just built")
    }))
}

#[cfg(feature = "api-task-status")]
/// The `task-status` function's context. Exits 1 on any problem.
pub async fn lambda_task_status() -> Arc<TaskStatusContext> {
    let config = lambda_config();
    let sdk = lambda_sdk();
    or_exit(task_status(&config, &sdk).await)
}

#[cfg(feature = "api-task-status")]
/// Reading, listing and canceling tasks, and `GET /v1/space`: the token key,
/// Postgres, the Redis doorbell, the catalog for the free kinds' quotas, and
/// the bucket whose outputs a result's link is signed for.
pub async fn task_status(config: &Config, sdk: &SdkConfig) -> Result<Arc<TaskStatusContext>, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &receipt_key_too(Needs::SESSION)).await;
    let catalog = deployed_catalog(&config, catalog_file(&config, &mut problems), &mut problems);
    let seller = seller_key(&config, sdk, catalog.as_ref(), &mut problems).await;
    let mut env = config.env();
    let token_key = env.secret(settings::TOKEN_KEY);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let redis_url = env.required(settings::REDIS_URL);
    let bucket = env.required(settings::BUCKET);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let (Some(token_key), Some(database_url), Some(catalog), true) =
        (token_key, database_url, catalog, problems.is_empty())
    else {
        return Err(StartupError::Config(problems));
    };
    Ok(Arc::new(TaskStatusContext {
        db: postgres_lazily(&config, database_url.expose_str())?,
        redis: RedisClient::new(&redis_url)?,
        token_key,
        catalog: Arc::new(catalog),
        links: crate::domain::tasks::OutputLinks::new(S3Objects::new(sdk, config.s3_endpoint()), bucket),
        seller,
    }))
}

// ------------------------------------------------------------- whole API

#[cfg(feature = "api")]
/// The API's context: the catalog at `REEVE_CATALOG`, the secrets `needs`
/// asks for, the stores.
pub async fn api(config: &Config, sdk: &SdkConfig, needs: Needs, connect: Connect) -> Result<Ctx, StartupError> {
    let mut wanted = receipt_key_too(needs);
    wanted.push(settings::BATCH_AUTHORIZER_KEY);
    let (config, problems) = with_secrets(config, sdk, &wanted).await;
    let parts = api_parts(&config, sdk, needs, problems).await;
    // The key's problems listed with every other.
    let mut problems = Vec::new();
    let catalog = parts.as_ref().ok().map(|(catalog, ..)| catalog);
    let batch_authorizer = batch_claimer(&config, catalog, Duration::ZERO, &mut problems).map(Arc::new);
    let ((catalog, settings, operators, chains), ()) = both(parts, checked(problems))?;
    let db = if needs.database {
        postgres(&config, settings.database_url.expose_str(), connect).await?
    } else {
        db::unconfigured()
    };
    let redis = RedisClient::new(&settings.redis_url)?;
    let aws = AwsClients::from_config(sdk, config.s3_endpoint());
    let mut ctx = ApiContext::with_operators(catalog, db, redis, aws, settings, operators, chains);
    offer_refunds(&mut ctx, batch_authorizer);
    Ok(ctx)
}

#[cfg(feature = "api")]
/// Gives the API's create routes the receiver authorizer that signs a
/// batch-settlement channel's cooperative refund (none: refunds answer
/// `503 batch_refund_unavailable`). Called on a context just built, which
/// nothing else holds yet.
pub(super) fn offer_refunds(ctx: &mut Ctx, authorizer: Option<Arc<crate::domain::payments::batch::claim::Claimer>>) {
    match Arc::get_mut(ctx).and_then(|ctx| Arc::get_mut(&mut ctx.task_create)) {
        Some(create) => create.batch_authorizer = authorizer,
        None => tracing::error!("the task-create context is shared before start-up ends: refunds are not offered"),
    }
}

#[cfg(feature = "api")]
/// The API's catalog, settings, operators' client and chain endpoints, every
/// problem at once.
pub(super) async fn api_parts(
    config: &Config,
    sdk: &SdkConfig,
    needs: Needs,
    mut problems: Vec<String>,
) -> Result<(Catalog, crate::adapters::http::ApiSettings, Outbound, Chains), StartupError> {
    let catalog = deployed_catalog(config, compiled_catalog_file(config, &mut problems), &mut problems);
    let chains = chain_endpoints(config, catalog.as_ref(), &mut problems);
    let mut env = config.env();
    let (_, operators) = settings::outbound_policies(&env);
    let operators = outbound(&mut problems, operators, crate::infra::outbound::OPERATOR_ALLOW);
    check_urls(&mut problems, config, needs.database);
    let mut api_settings = settings::api_settings(&mut env, needs).map_err(|e| problems.extend(e.problems)).ok();
    problems.extend(env.take_problems());
    let seller = seller_key(config, sdk, catalog.as_ref(), &mut problems).await;
    if let Some(api_settings) = api_settings.as_mut() {
        api_settings.seller = seller;
    }
    match (catalog, api_settings, operators) {
        (Some(catalog), Some(api_settings), Some(operators)) if problems.is_empty() => {
            Ok((catalog, api_settings, operators, chains))
        }
        _ => Err(StartupError::Config(problems)),
    }
}
