//! `fetch` holds about one upload part in memory, whatever the download's
//! size: a worker runs several records at once in 512 MB, so a 100 MiB body
//! buffered whole could take other users' tasks down with it.
//!
//! This binary counts every allocation (a global allocator of its own) and
//! runs its tests one at a time, so the peak it sees is the fetch's. The
//! body is served from this process in static chunks (no allocation per
//! chunk) and stored in the stack's real S3.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::routing::get;
use futures_util::stream;
use reeve_shared::auth::SpaceIndex;
use reeve_shared::catalog::Catalog;
use reeve_shared::db::Connect;
use reeve_shared::executors::{self, ExecDeps, ExecError, Job, codes};
use reeve_shared::ids::Id;
use reeve_shared::outbound::{Outbound, OutboundPolicy};
use reeve_shared::settings::{self, Config};
use reeve_shared::startup;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc};

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One test at a time: the counters are process-wide.
static SERIAL: Mutex<()> = Mutex::const_new(());

const MIB: usize = 1024 * 1024;
const DEV_CATALOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../reeve.dev.toml");
static CHUNK: [u8; 64 * 1024] = [b'r'; 64 * 1024];

/// Serves `/body`: `mib` MiB of static chunks, without a Content-Length.
async fn server(mib: usize) -> String {
    let router = Router::new().route(
        "/body",
        get(move || async move {
            let chunks = stream::iter((0..mib * 16).map(|_| Ok::<_, std::io::Error>(Bytes::from_static(&CHUNK))));
            Body::from_stream(chunks)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://127.0.0.1:{port}/body")
}

/// The executors' dependencies as the worker binary builds them, allowed to
/// reach this process's server on loopback. One change: the users' client
/// waits up to 120 s, not 30, so a slow run under load is never cut short
/// before its peak is measured.
async fn deps(pool: PgPool, max_bytes: u64) -> ExecDeps {
    let config = Config::from_env()
        .with(settings::CATALOG, DEV_CATALOG)
        .with_pool(pool)
        .without(settings::QUEUE_URL)
        .with(settings::FETCH_ALLOW, "127.0.0.1")
        .with(settings::ALLOW_HTTP, "1")
        .with(settings::FETCH_MAX_BYTES, max_bytes.to_string());
    let sdk = startup::sdk().await;
    let built = startup::worker(&config, &sdk, Connect::Lazily).await.unwrap_or_else(|e| panic!("{e}")).exec;
    let patient = OutboundPolicy { timeout: Duration::from_secs(120), ..built.outbound.policy.clone() };
    ExecDeps { outbound: Outbound::new(patient).unwrap(), ..built }
}

/// Runs `fetch` on `url`; the result and the peak extra memory meanwhile.
async fn fetch(deps: &ExecDeps, task_id: Id, url: &str) -> (Result<Value, ExecError>, usize) {
    let catalog = Catalog::load(std::path::Path::new(DEV_CATALOG)).unwrap();
    let spec = catalog.tasks["fetch"].clone();
    let input = json!({ "url": url });
    let (tx, mut rx) = mpsc::channel(64);
    let job = Job {
        task_id,
        attempt: 1,
        kind: "fetch",
        space: SpaceIndex::from_array([9; 16]),
        input: &input,
        spec: &spec,
        reports: tx,
    };
    let drain = async move { while rx.recv().await.is_some() {} };
    let before = NOW.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let (result, ()) = tokio::join!(executors::run(deps, job), drain);
    (result, PEAK.load(Ordering::Relaxed).saturating_sub(before))
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn a_48_mib_download_is_streamed_to_storage_in_a_few_mib(pool: PgPool) {
    let _one = SERIAL.lock().await;
    let deps = deps(pool, 64 * MIB as u64).await;
    let url = server(48).await;
    let task_id = Id::new();
    let (result, peak) = fetch(&deps, task_id, &url).await;
    let result = result.expect("the fetch succeeds");

    let mut expected = Sha256::new();
    for _ in 0..48 * 16 {
        expected.update(CHUNK);
    }
    assert_eq!(result["size"], 48 * MIB);
    assert_eq!(result["sha256"], hex::encode(expected.finalize()));
    let head = deps.s3.head_object().bucket(&deps.bucket).key(result["key"].as_str().unwrap()).send().await.unwrap();
    assert_eq!(head.content_length(), Some(48 * MIB as i64), "the whole body was stored");
    println!("peak extra memory for a 48 MiB fetch: {:.1} MiB", peak as f64 / MIB as f64);
    assert!(peak < 16 * MIB, "a 48 MiB fetch took {:.1} MiB of memory", peak as f64 / MIB as f64);
    deps.s3.delete_object().bucket(&deps.bucket).key(result["key"].as_str().unwrap()).send().await.unwrap();
}

#[sqlx::test(migrator = "reeve_shared::db::MIGRATOR")]
async fn the_cap_holds_while_streaming_and_nothing_is_left_behind(pool: PgPool) {
    let _one = SERIAL.lock().await;
    // No Content-Length: only counting while streaming can catch it.
    let deps = deps(pool, 12 * MIB as u64).await;
    let url = server(48).await;
    let task_id = Id::new();
    let (result, peak) = fetch(&deps, task_id, &url).await;
    match result {
        Err(ExecError::Permanent { code, .. }) => assert_eq!(code, codes::TOO_LARGE),
        other => panic!("expected too_large, got {other:?}"),
    }
    assert!(peak < 16 * MIB, "{:.1} MiB", peak as f64 / MIB as f64);
    let key = reeve_shared::executors::output_key(&SpaceIndex::from_array([9; 16]), task_id);
    let head = deps.s3.head_object().bucket(&deps.bucket).key(&key).send().await;
    assert!(head.is_err(), "no object was stored for a refused download");
}
