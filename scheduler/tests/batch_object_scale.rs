//! A large batch object through the real API on Postgres, uploaded as JSON Lines (20,000
//! sessions in the suite, 10,000 and 100,000 for the benchmark figure): read as a stream, checked into the spool and created a chunk at a time, it takes
//! a bounded amount of the scheduler's memory whatever its size (a batch held whole would
//! take hundreds of megabytes). Measured as this process's peak resident size (the
//! kernel's high-water mark, reset through `/proc/self/clear_refs`), with the client in
//! this process generating the upload as it is sent; the binary holds this one test so
//! that nothing else allocates meanwhile. The figures it prints (time, memory) are the
//! ones docs/benchmarks.md quotes; only the memory bound is asserted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use agentq_core::WorkQueue;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

use common::{reset_peak, status_kb};

const ADMIN_KEY: &str = "batch-scale-admin-key";
/// Lines generated per piece of the upload.
const LINES_PER_PIECE: usize = 500;

/// The upload of `items` sessions of about 200 bytes each, generated as it is sent.
fn upload(items: usize) -> reqwest::Body {
    let pieces = (0..items.div_ceil(LINES_PER_PIECE)).map(move |p| {
        let mut piece = String::with_capacity(LINES_PER_PIECE * 220);
        for i in p * LINES_PER_PIECE..((p + 1) * LINES_PER_PIECE).min(items) {
            piece.push_str(
                &serde_json::json!({
                    "custom_id": format!("row-{i}"),
                    "prompt": format!("Summarise ticket {i}: the printer on floor {} is on fire again", i % 7),
                    "max_iterations": 5,
                    "metadata": {"ticket": i},
                })
                .to_string(),
            );
            piece.push('\n');
        }
        Ok::<_, std::io::Error>(piece.into_bytes())
    });
    reqwest::Body::wrap_stream(futures::stream::iter(pieces))
}

/// 20,000 sessions (a few seconds in a debug build) in the suite; bound: far below the
/// upload (4 MB) plus the sessions parsed (some 40 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_streams_through_in_bounded_memory() {
    measure(&[20_000], 24 * 1024).await;
}

/// The figures of docs/benchmarks.md, too long for the suite in a debug build; each in a
/// process of its own, so that one's memory is not the other's baseline: `cargo test
/// --release -p agentq-scheduler --test batch_object_scale -- --ignored --nocapture ten_`
/// (then `hundred_`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark figure: run it alone with --ignored"]
async fn ten_thousand_items() {
    measure(&[10_000], 24 * 1024).await;
}

/// See [`ten_thousand_items`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark figure: run it alone with --ignored"]
async fn hundred_thousand_items() {
    measure(&[100_000], 24 * 1024).await;
}

/// Submit a batch of each of `sizes`, printing the time and the memory each took; the
/// last one's peak above the baseline must stay under `bound_kb`.
async fn measure(sizes: &[usize], bound_kb: u64) {
    let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&db_url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
    queue.ensure_queue("default").await.unwrap();
    let mut settings = SchedulerSettings::default();
    settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
    let state = Scheduler::new(Arc::new(store), queue, settings);
    // As deployed: a dispatcher runs, so a large batch waits in the store for it.
    let stop = CancellationToken::new();
    let dispatcher = state.spawn_dispatcher(stop.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    let http = reqwest::Client::new();

    let mut peak = 0;
    for &items in sizes {
        let before = reset_peak();
        let t0 = Instant::now();
        let r = http
            .post(format!("http://{addr}/v1/batches?max_running=50"))
            .bearer_auth(ADMIN_KEY)
            .header("content-type", "application/x-ndjson")
            .body(upload(items))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let answer: serde_json::Value = r.json().await.unwrap();
        let took = t0.elapsed();
        let added = status_kb("VmHWM:").saturating_sub(before);
        assert_eq!(status, 201, "{answer}");
        assert_eq!(answer["total"], items);
        let counted = shared_postgres()
            .unwrap()
            .psql(
                &db_url,
                &format!(
                    "SELECT count(*) FROM sessions WHERE batch_id = '{}' AND custom_id IS NOT NULL",
                    answer["id"].as_str().unwrap()
                ),
            )
            .unwrap();
        assert_eq!(counted, items.to_string());
        eprintln!(
            "batch of {items}: submitted in {:.2} s ({:.0} items/s), peak memory {} MB above \
             the {} MB before",
            took.as_secs_f64(),
            items as f64 / took.as_secs_f64(),
            added / 1024,
            before / 1024,
        );
        peak = added;
    }
    // About 200 bytes of upload and 2 kB as a parsed session per item: a batch held
    // whole would show here. Streamed, the scheduler holds a line, a chunk of 1,000
    // sessions, and the buffers of its connections.
    assert!(
        peak < bound_kb,
        "the last batch peaked {peak} kB above the baseline (bound {bound_kb} kB)"
    );
    stop.cancel();
    dispatcher.await.unwrap();
}
