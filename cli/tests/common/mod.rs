//! Helpers the CLI's process tests share: the stack's environment, a
//! database of the test's own, and `reeve` processes that die with the test.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// A path in the repository.
pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// A variable of the stack's `.env`, which the tests need loaded.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests with the stack's .env loaded"))
}

/// `url` pointing at database `name` instead, its query kept.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let base = &base[..base.rfind('/').expect("a database in DATABASE_URL")];
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// A database of the test's own on the stack's Postgres, named
/// `<prefix>_<ulid>`. `admin` is a connection to `DATABASE_URL`'s database,
/// kept to drop this one at the end ([`FreshDb::drop`]).
pub struct FreshDb {
    pub admin: sqlx::PgConnection,
    pub url: String,
    pub name: String,
}

impl FreshDb {
    /// Created and empty: not even sqlx's bookkeeping table.
    pub async fn empty(prefix: &str) -> FreshDb {
        use sqlx::Connection;
        let admin_url = env("DATABASE_URL");
        let name = format!("{prefix}_{}", ulid::Ulid::new().to_string().to_lowercase());
        let mut admin = sqlx::PgConnection::connect(&admin_url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut admin).await.unwrap();
        FreshDb { admin, url: with_database(&admin_url, &name), name }
    }

    /// Migrated by the `reeve migrate` binary, as an operator does it.
    pub async fn migrated(prefix: &str) -> FreshDb {
        let db = FreshDb::empty(prefix).await;
        let out = Command::new(env!("CARGO_BIN_EXE_reeve"))
            .current_dir(std::env::temp_dir())
            .arg("migrate")
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap();
        assert!(out.status.success(), "reeve migrate: {}", String::from_utf8_lossy(&out.stderr));
        db
    }

    /// A pool on it, migrated by the library's migrator (as the functions'
    /// start-up does).
    pub async fn pool(&self) -> sqlx::PgPool {
        let pool = reeve_shared::db::connect(&self.url).await.unwrap();
        reeve_shared::db::migrate(&pool).await.unwrap();
        pool
    }

    /// Dropped, even with connections still open on it. Tried again a few
    /// times: Postgres 15 refuses `WITH (FORCE)` to a role that is not a
    /// superuser while an autovacuum worker happens to be in the database
    /// ("must be a member of the role whose process is being terminated"),
    /// and the worker leaves within moments.
    pub async fn drop(mut self) {
        let drop = format!("DROP DATABASE {} WITH (FORCE)", self.name);
        for tries_left in (0..10).rev() {
            match sqlx::query(sqlx::AssertSqlSafe(drop.clone())).execute(&mut self.admin).await {
                Ok(_) => return,
                Err(e) if tries_left > 0 => {
                    eprintln!("dropping {}: {e}; trying again", self.name);
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                }
                Err(e) => panic!("dropping {}: {e}", self.name),
            }
        }
    }
}

/// `reeve` with the stack's environment, this test's database and queue.
pub fn reeve(db: &str, queue: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reeve"));
    cmd.current_dir(std::env::temp_dir()).env("DATABASE_URL", db).env("REEVE_QUEUE_URL", queue);
    // reeve.dev.toml's receipt_signer's key, as scripts/stack.sh writes it.
    cmd.env("REEVE_RECEIPT_KEY", DEV_RECEIPT_KEY);
    cmd
}

/// The development catalog's receipt key: public.
pub const DEV_RECEIPT_KEY: &str = "0x5ab0c95958f7c7144d59f69084444144eabb3f95c2cd0a1676be703baeddec15";

/// A `reeve work` process, killed on drop.
pub struct Worker(pub std::process::Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn json_of(response: reqwest::Response) -> Value {
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

/// Through the API at `api`, as a client would: a new space and session,
/// `bytes` uploaded with the presigned PUT, then a `digest` task of it.
/// The task's id.
pub async fn digest_task(api: &str, filename: &str, content_type: &str, bytes: &[u8]) -> reeve_shared::ids::Id {
    let http = reqwest::Client::new();
    let post = |path: &str, token: Option<&str>, body: Value| {
        let mut request =
            http.post(format!("{api}{path}")).header("content-type", "application/json").body(body.to_string());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let space = json_of(post("/v1/spaces", None, serde_json::json!({})).await.unwrap()).await;
    let session =
        json_of(post("/v1/sessions", None, serde_json::json!({"space_id": space["space_id"]})).await.unwrap()).await;
    let token = session["token"].as_str().unwrap().to_owned();
    let declared = serde_json::json!({"filename": filename, "content_type": content_type, "size": bytes.len()});
    let upload = json_of(post("/v1/uploads", Some(&token), declared).await.unwrap()).await;
    let mut put = http.put(upload["url"].as_str().unwrap()).body(bytes.to_vec());
    for (header, value) in upload["headers"].as_object().unwrap() {
        // reqwest sets the length of the body itself.
        if header != "content-length" {
            put = put.header(header, value.as_str().unwrap());
        }
    }
    assert!(put.send().await.unwrap().status().is_success());
    let input = serde_json::json!({"input": {"upload_id": upload["upload_id"]}});
    let created = post("/v1/tasks/digest", Some(&token), input).await.unwrap();
    assert_eq!(created.status().as_u16(), 202);
    json_of(created).await["id"].as_str().unwrap().parse().unwrap()
}

/// The stack's S3 and SQS, configured as every binary is (`startup`).
pub async fn aws() -> reeve_shared::aws::AwsClients {
    reeve_shared::startup::aws_clients(&reeve_shared::settings::Config::from_env()).await
}

/// The whole API as start-up builds it for `reeve serve`, from the stack's
/// variables with the tests' own secrets, the development catalog, and a
/// database and queue of the test's own: `db_url`, already open as `pool`
/// (start-up checks the URL, then takes the pool where it would open one).
pub async fn api(db_url: &str, pool: &sqlx::PgPool, queue: &str) -> reeve_shared::http::Ctx {
    use reeve_shared::settings::{self, Config, Needs};
    let config = Config::from_env()
        .with(settings::CATALOG, repo("reeve.dev.toml").display().to_string())
        .with(settings::PEPPER, "test-pepper-test-pepper-test-pepper!")
        .with(settings::TOKEN_KEY, "test-token-key-test-token-key-test!!")
        .with(settings::RECEIPT_KEY, DEV_RECEIPT_KEY)
        .with(settings::DATABASE_URL, db_url)
        .with(settings::QUEUE_URL, queue)
        .with_pool(pool.clone());
    let sdk = reeve_shared::startup::sdk().await;
    reeve_shared::startup::api(&config, &sdk, Needs::ALL, reeve_shared::db::Connect::Lazily)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}
