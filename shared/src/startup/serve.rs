//! `reeve serve`: every route, the relay and a worker in one process.

// The builders share the start-up module's helpers and imports.
use super::http::{api_parts, offer_refunds};
use super::relay::{relay_limits, relay_on};
use super::worker::{invoke_client, protocol_deps, worker_on, worker_parts};
use super::*;

// ---------------------------------------------------------------- serve

#[cfg(all(feature = "api", feature = "relay", feature = "worker"))]
/// Everything `reeve serve` runs in one process: every API route, the
/// relay's routes and (unless it serves only) a worker, all on one Postgres
/// pool, one Redis client and one SDK configuration.
pub struct Serve {
    pub api: Ctx,
    pub relay: RelayCtx,
    pub cors: CorsOrigins,
    pub worker: Option<WorkerContext>,
    /// `POST /mcp`, beside the API on its stores.
    #[cfg(feature = "mcp")]
    pub mcp: Arc<McpContext>,
}

#[cfg(all(feature = "api", feature = "relay", feature = "worker"))]
/// `reeve serve`'s contexts, every problem of all of them at once.
pub async fn serve(config: &Config, sdk: &SdkConfig, with_worker: bool) -> Result<Serve, StartupError> {
    let mut wanted = receipt_key_too(Needs::ALL);
    // A channel's cooperative refund is signed with it (and the sweep
    // beside claims with it).
    wanted.push(settings::BATCH_AUTHORIZER_KEY);
    let (config, problems) = with_secrets(config, sdk, &wanted).await;
    let api = api_parts(&config, sdk, Needs::ALL, problems).await;
    // The worker runs the API's catalog: loaded and checked once.
    let catalog = api.as_ref().ok().map(|(catalog, ..)| catalog.clone());
    let mut protocol = crate::domain::executors::ExecDeps::default_protocol();
    let worker = match (with_worker, catalog) {
        (false, _) => Ok(None),
        (true, Some(catalog)) => {
            let mut problems = Vec::new();
            protocol = protocol_deps(&config, sdk, &catalog, &mut problems).await;
            worker_parts(&config, Some(catalog), problems).map(Some)
        }
        (true, None) => worker_parts(&config, None, vec![]).map(Some).or_else(|e| match e {
            // The catalog's own problems are the API's to report.
            StartupError::Config(problems) if problems.is_empty() => Ok(None),
            other => Err(other),
        }),
    };
    let mut env = config.env();
    let keepalive = Duration::from_secs(env.number(settings::KEEPALIVE, DEFAULT_KEEPALIVE.as_secs(), 1, 300));
    let api_origin = env.origin(settings::API_ORIGIN);
    let limits = relay_limits(&mut env);
    let cors = settings::cors_origins(&mut env);
    let mut problems = env.take_problems();
    // The key's problems listed with every other.
    let catalog = api.as_ref().ok().map(|(catalog, ..)| catalog);
    let refunds = batch_claimer(&config, catalog, Duration::ZERO, &mut problems).map(Arc::new);
    let rest = checked(problems);
    let ((catalog, api_settings, operators, chains), (worker, ())) = both(api, both(worker, rest))?;
    let db = postgres(&config, api_settings.database_url.expose_str(), Connect::Now).await?;
    let redis_url = api_settings.redis_url.clone();
    let aws = AwsClients::from_config(sdk, config.s3_endpoint());
    let relay = relay_on(
        db.clone(),
        redis_client::open(&redis_url)?,
        api_settings.token_key.clone(),
        keepalive,
        api_origin,
        limits,
    );
    let mut worker = match worker {
        Some((catalog, worker_settings, users, operators)) => {
            let redis = RedisClient::new(&redis_url)?;
            let clients = (aws::s3(sdk, config.s3_endpoint().is_some()), aws.clone());
            let mut ctx = worker_on(catalog, db.clone(), redis, clients, worker_settings, users, operators);
            ctx.chains = chains.clone();
            ctx.exec.protocol = protocol;
            invoke_client(&mut ctx, sdk);
            Some(ctx)
        }
        None => None,
    };
    let redis = RedisClient::new(&redis_url)?;
    let mut api = ApiContext::with_operators(catalog, db, redis, aws, api_settings, operators, chains);
    offer_refunds(&mut api, refunds);
    // The worker settles metered tasks through the API's facilitator (one
    // client, one `/supported` answer for the process).
    if let Some(ctx) = worker.as_mut() {
        ctx.facilitator = api.task_create.facilitator.clone();
    }
    // A long-lived process may ask the facilitator before it serves; a
    // Lambda asks on its first priced request instead (payments::supported).
    let source = config.catalog_path().display().to_string();
    facilitator_check::announce_unsettled_prices(&api.catalog, api.task_create.facilitator.as_ref(), &source).await;
    // Its replies stream from here, so waiting tools send progress.
    #[cfg(feature = "mcp")]
    let mcp = mcp_beside(&api, settings::mcp_settings(&config.env(), true));
    Ok(Serve {
        api,
        relay,
        cors,
        worker,
        #[cfg(feature = "mcp")]
        mcp,
    })
}
