//! [`ApiContext`]: what every handler may need, built once per process —
//! by `reeve serve`, by each Lambda's `main`, and by the tests.

use std::path::Path;
use std::sync::Arc;

use axum::body::Bytes;
use sqlx::PgPool;
use tokio::sync::Semaphore;

use crate::aws::AwsClients;
use crate::catalog::Catalog;
use crate::db;
use crate::redis_client::RedisClient;
use crate::settings::{ApiSettings, StartupError};

pub struct ApiContext {
    pub catalog: Arc<Catalog>,
    /// The catalog's public JSON, rendered once: it cannot change at run time.
    pub catalog_json: Bytes,
    /// The OpenAPI document this catalog makes, rendered once too.
    pub openapi_json: Bytes,
    pub db: PgPool,
    pub redis: RedisClient,
    pub aws: AwsClients,
    pub settings: ApiSettings,
    /// Each Argon2id run takes 19 MiB and tens of milliseconds of one core;
    /// a burst of sessions must queue here rather than exhaust the process.
    pub argon2: Semaphore,
}

pub type Ctx = Arc<ApiContext>;

/// How to reach Postgres at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    /// Connect now and fail at once: the long-lived server.
    Now,
    /// Connect on first use: Lambdas, whose cold start must stay cheap.
    Lazily,
}

impl ApiContext {
    pub fn new(catalog: Catalog, db: PgPool, redis: RedisClient, aws: AwsClients, settings: ApiSettings) -> Ctx {
        let catalog_json = serde_json::to_vec(&catalog.public_view()).expect("JSON values serialise").into();
        let openapi_json = serde_json::to_vec(&super::openapi(&catalog)).expect("JSON values serialise").into();
        let permits = std::thread::available_parallelism().map_or(2, |n| n.get());
        Arc::new(ApiContext {
            catalog: Arc::new(catalog),
            catalog_json,
            openapi_json,
            db,
            redis,
            aws,
            settings,
            argon2: Semaphore::new(permits),
        })
    }

    /// For a Lambda's `main`: the context from `REEVE_CATALOG` and the
    /// environment, connecting lazily. lambda_runtime reports nothing for an
    /// error before `run`, and an `Err` from `main` prints its Debug form, so
    /// every problem is logged readably (JSON in Lambda) and the init fails.
    pub async fn for_lambda() -> Ctx {
        match Self::from_env(&crate::settings::catalog_path(), Connect::Lazily).await {
            Ok(ctx) => ctx,
            Err(e) => {
                tracing::error!("cannot start: {e}");
                std::process::exit(1);
            }
        }
    }

    /// Reads the catalog and the environment, reporting the problems of both
    /// together, then opens the stores.
    pub async fn from_env(catalog: &Path, connect: Connect) -> Result<Ctx, StartupError> {
        // The deployment may lower the catalog's upload limit (the template's
        // `UploadMaxBytes`), for presign and the upload guard alike.
        let cap = crate::upload_guard::upload_limit_from(&crate::settings::Env::process());
        let (mut catalog, settings, cap) = match (Catalog::load(catalog), ApiSettings::from_env(), cap) {
            (Ok(c), Ok(s), Ok(cap)) => (c, s, cap),
            (c, s, cap) => {
                let mut problems = Vec::new();
                if let Err(e) = c {
                    problems.push(e.to_string());
                }
                if let Err(e) = s {
                    problems.extend(e.problems);
                }
                if let Err(e) = cap {
                    problems.push(e);
                }
                return Err(StartupError::Config(problems));
            }
        };
        catalog.uploads.max_bytes = crate::upload_guard::effective_max_bytes(&catalog.uploads, cap);
        let db = match connect {
            Connect::Now => db::connect(&settings.database_url).await?,
            Connect::Lazily => db::connect_lazy(&settings.database_url)?,
        };
        let redis = RedisClient::new(&settings.redis_url)?;
        let aws = AwsClients::from_env().await;
        Ok(ApiContext::new(catalog, db, redis, aws, settings))
    }
}
