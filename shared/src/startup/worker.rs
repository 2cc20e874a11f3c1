//! The event-driven functions' contexts: the worker (SQS), the sweeper
//! (its schedule and the dead-letter queue) and the upload guard (S3).

// The builders share the start-up module's helpers and imports.
use super::*;

// ---------------------------------------------------------------- worker

#[cfg(feature = "worker")]
/// The worker Lambda's context: the catalog at `REEVE_CATALOG`, Postgres on
/// first use. Exits 1 on any problem.
pub async fn lambda_worker() -> WorkerContext {
    let config = lambda_config();
    let sdk = lambda_sdk();
    or_exit(worker(&config, &sdk, Connect::Lazily).await)
}

#[cfg(feature = "worker")]
/// The worker's context (the `worker` Lambda, `reeve work`).
pub async fn worker(config: &Config, sdk: &SdkConfig, connect: Connect) -> Result<WorkerContext, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &[settings::DATABASE_URL]).await;
    let catalog = catalog_file(&config, &mut problems);
    // To prove a metered task's capture, and for the sweep that runs beside
    // a long-lived worker.
    let chains = chain_endpoints(&config, catalog.as_ref(), &mut problems);
    // To settle what a metered task used.
    let facilitator = catalog.as_ref().and_then(|catalog| {
        super::facilitator_check::facilitator_for(&config, catalog).map_err(|e| problems.push(e)).ok().flatten()
    });
    let protocol = match &catalog {
        Some(catalog) => protocol_deps(&config, sdk, catalog, &mut problems).await,
        None => ExecDeps::default_protocol(),
    };
    let (catalog, worker_settings, users, operators) = worker_parts(&config, catalog, problems)?;
    let db = postgres(&config, worker_settings.database_url.expose_str(), connect).await?;
    let redis = RedisClient::new(&worker_settings.redis_url)?;
    let clients = (aws::s3(sdk, config.s3_endpoint().is_some()), AwsClients::from_config(sdk, config.s3_endpoint()));
    let mut ctx = worker_on(catalog, db, redis, clients, worker_settings, users, operators);
    ctx.exec.protocol = protocol;
    invoke_client(&mut ctx, sdk);
    Ok(WorkerContext { chains, facilitator, ..ctx })
}

#[cfg(feature = "worker")]
/// The Lambda Invoke client, for a catalog with a `lambda` kind (on the
/// SDK's endpoint for Lambda: `AWS_ENDPOINT_URL_LAMBDA` locally). Every
/// worker is built through here: the Lambda's, `reeve work`'s and `reeve
/// serve`'s.
pub(super) fn invoke_client(ctx: &mut WorkerContext, sdk: &SdkConfig) {
    #[cfg(feature = "lambda-invoke")]
    if ctx.catalog.tasks.values().any(|spec| matches!(spec.executor, crate::domain::executors::Executor::Lambda(_))) {
        ctx.exec.lambda = Some(aws::lambda(sdk));
    }
    #[cfg(not(feature = "lambda-invoke"))]
    let _ = (ctx, sdk);
}

#[cfg(feature = "worker")]
/// What the catalog's protocol kinds (docs/executors.md) sign and link
/// their jobs with, read once: each kind's secret ([`executor_secrets`]),
/// the token key report tokens are signed with, and `REEVE_REPORT_URL`.
/// Every problem goes to `problems`; nothing is read when no kind speaks
/// the protocol.
pub(super) async fn protocol_deps(
    config: &Config,
    sdk: &SdkConfig,
    catalog: &Catalog,
    problems: &mut Vec<String>,
) -> crate::domain::executors::ProtocolDeps {
    use crate::domain::executors::{Executor, ProtocolDeps};

    let mut deps = ProtocolDeps::default();
    // A `lambda` kind's function is sent the job too, unsigned.
    let lambdas: Vec<&String> = catalog
        .tasks
        .iter()
        .filter(|(_, spec)| matches!(spec.executor, Executor::Lambda(_)))
        .map(|(kind, _)| kind)
        .collect();
    if protocol_secrets(catalog).is_empty() && lambdas.is_empty() {
        return deps;
    }
    if cfg!(not(feature = "lambda-invoke")) {
        for kind in lambdas {
            problems.push(format!(
                "tasks.{kind}.executor: this worker was built without the lambda executor (the worker's cargo \
                 feature `lambda`)"
            ));
        }
    }
    deps.keys = executor_secrets(config, async || sdk.clone(), catalog, problems).await;
    let (config, fetched) = with_secrets(config, sdk, &[settings::TOKEN_KEY]).await;
    problems.extend(fetched);
    let mut env = config.env();
    deps.token_key = env.secret(settings::TOKEN_KEY);
    deps.report_url = env.http_url(settings::REPORT_URL);
    problems.extend(env.take_problems().into_iter().map(|p| format!("{p} (a kind speaks the executor protocol)")));
    deps
}

#[cfg(feature = "worker")]
/// The `http` kinds that speak the executor protocol, with where each one's
/// signing secret is.
fn protocol_secrets(catalog: &Catalog) -> Vec<(&String, &crate::domain::executors::SecretRef)> {
    use crate::domain::executors::Executor;
    catalog
        .tasks
        .iter()
        .filter_map(|(kind, spec)| match &spec.executor {
            Executor::Http(http) => http.protocol.as_ref().map(|p| (kind, &p.secret)),
            _ => None,
        })
        .collect()
}

#[cfg(feature = "worker")]
/// Each protocol kind's signing secret, read and parsed as a `whsec_…`
/// key: from the variable its `secret` names, or the Secrets Manager secret
/// whose ARN it is. The worker's start-up reads them here, and so does
/// `reeve config check`, which thereby finds what the worker would. A
/// secret that is not set, cannot be read or is no key is a problem at the
/// kind's TOML path (`tasks.<kind>.secret`), naming the variable or ARN,
/// never the value; a secret two kinds share is read once. `sdk`: the AWS
/// configuration to reach Secrets Manager with, asked for only if an ARN is
/// named (`reeve config check` loads it then). A function, so that the
/// worker's Lambda, which has one already, links no other way to load it.
pub async fn executor_secrets(
    config: &Config,
    sdk: impl AsyncFnOnce() -> SdkConfig,
    catalog: &Catalog,
    problems: &mut Vec<String>,
) -> HashMap<crate::domain::executors::SecretRef, crate::domain::executors::protocol::JobKey> {
    use crate::domain::executors::SecretRef;
    use crate::domain::executors::protocol::JobKey;

    let mut keys = HashMap::new();
    let mut client = None;
    let mut sdk = Some(sdk);
    for (kind, secret) in protocol_secrets(catalog) {
        if keys.contains_key(secret) {
            continue;
        }
        let path = format!("tasks.{kind}.secret");
        let value = match secret {
            SecretRef::Env(name) => match config.get(name) {
                Some(value) => value,
                None => {
                    problems.push(format!("{path}: the environment variable {name} is not set"));
                    continue;
                }
            },
            SecretRef::Arn(arn) => {
                if let Some(load) = sdk.take() {
                    client = Some(aws_sdk_secretsmanager::Client::new(&load().await));
                }
                let client = client.as_ref().expect("made just above");
                match client.get_secret_value().secret_id(arn).send().await {
                    Ok(output) => match output.secret_string {
                        Some(value) => value,
                        None => {
                            problems.push(format!("{path}: the secret {arn} has no SecretString"));
                            continue;
                        }
                    },
                    Err(e) => {
                        let why = match e.as_service_error() {
                            Some(service) => service.code().unwrap_or("error").to_owned(),
                            None => DisplayErrorContext(&e).to_string(),
                        };
                        problems.push(format!("{path}: cannot read {arn} from Secrets Manager: {why}"));
                        continue;
                    }
                }
            }
        };
        match JobKey::parse(&value) {
            Ok(key) => {
                keys.insert(secret.clone(), key);
            }
            Err(why) => problems.push(format!("{path}: the value of {} {why}", secret.name())),
        }
    }
    keys
}

#[cfg(feature = "worker")]
type WorkerParts = (Catalog, crate::adapters::worker::WorkerSettings, Outbound, Outbound);

#[cfg(feature = "worker")]
/// The worker's settings and clients over `catalog` (`None`: its problems
/// are in `problems` already), every problem at once.
pub(super) fn worker_parts(
    config: &Config,
    catalog: Option<Catalog>,
    mut problems: Vec<String>,
) -> Result<WorkerParts, StartupError> {
    let mut env = config.env();
    let worker_settings = settings::worker_settings(&mut env).map_err(|e| problems.extend(e.problems)).ok();
    let (users, operators) = settings::outbound_policies(&env);
    let users = outbound(&mut problems, users, crate::infra::outbound::FETCH_ALLOW);
    let operators = outbound(&mut problems, operators, crate::infra::outbound::OPERATOR_ALLOW);
    check_urls(&mut problems, config, true);
    problems.extend(env.take_problems());
    match (catalog, worker_settings, users, operators) {
        (Some(c), Some(s), Some(u), Some(o)) if problems.is_empty() => Ok((c, s, u, o)),
        _ => Err(StartupError::Config(problems)),
    }
}

#[cfg(feature = "worker")]
pub(super) fn worker_on(
    catalog: Catalog,
    db: PgPool,
    redis: RedisClient,
    (s3, AwsClients { objects, sqs }): (aws_sdk_s3::Client, AwsClients),
    worker_settings: crate::adapters::worker::WorkerSettings,
    users: Outbound,
    operators: Outbound,
) -> WorkerContext {
    // The Lambda is handed its records, but sets a retry's visibility on
    // the queue they came from.
    let visibility =
        worker_settings.queue_url.as_ref().map(|url| crate::adapters::worker::Visibility::new(sqs, url.clone()));
    let exec = ExecDeps {
        db: db.clone(),
        objects,
        s3,
        bucket: worker_settings.bucket.clone(),
        outbound: users,
        operators,
        fetch_max_bytes: worker_settings.fetch_max_bytes,
        output_retention_days: worker_settings.output_retention_days,
        protocol: ExecDeps::default_protocol(),
        #[cfg(feature = "lambda-invoke")]
        lambda: None,
    };
    WorkerContext { visibility, ..WorkerContext::new(catalog, db, redis, exec, worker_settings) }
}

// --------------------------------------------------------------- sweeper

#[cfg(feature = "sweeper")]
/// The sweeper Lambda's context: the database URL (by ARN in a
/// deployment), Redis, the queue. Exits 1 on any problem.
pub async fn lambda_sweeper() -> Sweeper {
    let config = lambda_config();
    let sdk = lambda_sdk();
    or_exit(sweeper(&config, &sdk).await)
}

#[cfg(feature = "sweeper")]
/// The sweeper's context (the `sweeper` Lambda, `reeve sweep`).
pub async fn sweeper(config: &Config, sdk: &SdkConfig) -> Result<Sweeper, StartupError> {
    let (config, mut problems) =
        with_secrets(config, sdk, &[settings::DATABASE_URL, settings::BATCH_AUTHORIZER_KEY]).await;
    let mut env = config.env();
    let database_url = env.secret_text(settings::DATABASE_URL);
    let redis_url = env.required(settings::REDIS_URL);
    let queue_url = env.required(settings::QUEUE_URL);
    let max_attempts = settings::max_receives(&mut env);
    let older_than = settings::sweep_older_than(&mut env, crate::adapters::sweeper::DEFAULT_OLDER_THAN);
    let claim_after = settings::batch_claim_after(&mut env);
    // In AWS the sweeper sends the completion webhooks: through the users'
    // client, as `fetch` reaches users' URLs.
    let webhook_settings = settings::webhook_settings(&mut env);
    let (users, _) = settings::outbound_policies(&env);
    let users = outbound(&mut problems, users, crate::infra::outbound::FETCH_ALLOW);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    // The reconciler creates the task of a payment that landed late, if its
    // kind is still offered.
    let catalog = catalog_file(&config, &mut problems);
    let chains = chain_endpoints(&config, catalog.as_ref(), &mut problems);
    let batch_claims = batch_claimer(&config, catalog.as_ref(), claim_after, &mut problems);
    checked(problems)?;
    let database_url = database_url.expect("reported when missing");
    let db = postgres_lazily(&config, database_url.expose_str())?;
    let users = users.expect("reported when unusable");
    let webhooks = Sender::new(db.clone(), &users, webhook_settings)
        .map_err(|e| StartupError::Config(vec![format!("{}: {e}", crate::infra::outbound::FETCH_ALLOW)]))?;
    Ok(Sweeper {
        db,
        sqs: aws::sqs(sdk),
        queue_url,
        events: Publisher::new(RedisClient::new(&redis_url)?),
        max_attempts,
        older_than,
        catalog: Arc::new(catalog.expect("reported when unreadable")),
        chains,
        webhooks: Some(webhooks),
        batch_claims,
    })
}

#[cfg(all(feature = "poller", feature = "sweeper"))]
/// The sweeper a long-running worker runs beside its poller (`reeve work`,
/// `reeve serve`), on the worker's own Postgres pool and Redis doorbell. It
/// claims batch-settlement vouchers as the sweeper function does, given the
/// receiver authorizer's key.
pub async fn sweeper_beside(
    worker: &WorkerContext,
    config: &Config,
    sdk: &SdkConfig,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
) -> Result<Sweeper, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &[settings::BATCH_AUTHORIZER_KEY]).await;
    let mut env = config.env();
    let claim_after = settings::batch_claim_after(&mut env);
    problems.extend(env.take_problems());
    let batch_claims = batch_claimer(&config, Some(worker.catalog.as_ref()), claim_after, &mut problems);
    checked(problems)?;
    Ok(Sweeper {
        db: worker.db.clone(),
        sqs,
        queue_url,
        events: worker.events.clone(),
        max_attempts: worker.settings.max_receives,
        older_than: crate::adapters::sweeper::DEFAULT_OLDER_THAN,
        catalog: worker.catalog.clone(),
        chains: worker.chains.clone(),
        // A long-lived worker sends them on its own, every second
        // ([`webhooks_beside`]), not at the sweep's pace.
        webhooks: None,
        batch_claims,
    })
}

#[cfg(feature = "worker")]
/// The completion webhooks' sender a long-running worker runs beside its
/// poller (`reeve work`, `reeve serve`), on the worker's pool and its users'
/// client (`fetch`'s).
pub fn webhooks_beside(worker: &WorkerContext, config: &Config) -> Result<Sender, StartupError> {
    let mut env = config.env();
    let webhook_settings = settings::webhook_settings(&mut env);
    checked(env.take_problems())?;
    Sender::new(worker.db.clone(), &worker.exec.outbound, webhook_settings)
        .map_err(|e| StartupError::Config(vec![format!("{}: {e}", crate::infra::outbound::FETCH_ALLOW)]))
}

// ---------------------------------------------------------- upload guard

#[cfg(feature = "upload-guard")]
/// The upload guard Lambda's context. Exits 1 on any problem.
pub async fn lambda_guard() -> Guard {
    let config = lambda_config();
    let sdk = lambda_sdk();
    or_exit(guard(&config, &sdk).await)
}

#[cfg(feature = "upload-guard")]
/// The upload guard's context: Postgres (on first use), S3, the bucket and
/// the upload limit (the catalog's, capped by the deployment's; the rest of
/// the catalog is not loaded).
pub async fn guard(config: &Config, sdk: &SdkConfig) -> Result<Guard, StartupError> {
    let (config, mut problems) = with_secrets(config, sdk, &[settings::DATABASE_URL]).await;
    let mut env = config.env();
    let uploads = deployed_uploads(&config, &mut problems);
    let database_url = env.secret_text(settings::DATABASE_URL);
    let bucket = env.required(settings::BUCKET);
    check_urls(&mut problems, &config, true);
    problems.extend(env.take_problems());
    let (Some(uploads), Some(database_url), true) = (uploads, database_url, problems.is_empty()) else {
        return Err(StartupError::Config(problems));
    };
    Ok(Guard {
        db: postgres_lazily(&config, database_url.expose_str())?,
        s3: S3Objects::new(sdk, config.s3_endpoint()),
        bucket,
        max_bytes: uploads.max_bytes,
    })
}
