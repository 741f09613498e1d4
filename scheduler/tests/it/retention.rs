//! Retention as the scheduler runs it, on both stores (Postgres with Redis, SQLite with
//! the in-process queue), its clock forty days ahead (a `ManualClock`: nothing waits): a
//! pass takes an old finished tree and exports it first, while a batch runs beside it on
//! the scripted model and none of its sessions is touched until the whole batch has
//! finished; what the tenant spent is unchanged; the metrics count what went. With
//! `keep = "result"`, `GET /v1/sessions/{id}` still answers with the final answer and no
//! transcript. Exported to the object store, a batch is an object of the bucket and the
//! tree's contents leave the bucket. The task stops when told.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_core::config::{RetentionSection, WorkspaceSection};
use agentq_core::metrics::Metrics;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::report::CostFilter;
use agentq_core::retention::Keep;
use agentq_core::sqlite::SqliteStore;
use agentq_core::{Claim, EnqueueReason, NewSession, Queue, SessionStatus, Store};
use agentq_scheduler::SchedulerSettings;
use agentq_scheduler::retention::Retention;
use agentq_scheduler::webhooks::ManualClock;
use agentq_testkit::{RedisServer, shared_postgres};
use agentq_worker::{Worker, WorkerSettings};

use common::{ADMIN_KEY, Served, wait_until};

const ITEMS: usize = 6;

/// Run `id` to its end with some usage, as a worker would.
async fn finish(store: &dyn Store, id: &str) {
    let Claim::Acquired {
        lease, mut state, ..
    } = store
        .claim(id, "w", Duration::from_secs(30), 5)
        .await
        .unwrap()
    else {
        panic!("not acquired")
    };
    let from = state.messages.len();
    let mut answer = Message::assistant("old answer");
    answer.usage = Some(Usage {
        input_tokens: 120,
        output_tokens: 30,
        ..Usage::default()
    });
    state.push_assistant(answer);
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("old answer".into()),
        error: None,
    });
    store.checkpoint(&lease, &state, from).await.unwrap();
}

/// A finished tree of `tenant` (a root and a sub-agent); returns both ids.
async fn old_tree(store: &dyn Store, tenant: &str) -> (String, String) {
    let mut root = NewSession::root(SessionSpec::new("old"), "default").with_tenant(tenant);
    root.files = vec![agentq_core::workspace::InputFile {
        path: "notes.txt".into(),
        data: format!("notes of {tenant}").into_bytes(),
    }];
    let root = store.create_session(&root).await.unwrap().0;
    let mut child = NewSession::root(SessionSpec::new("old child"), "default").with_tenant(tenant);
    child.root_id = root.id.clone();
    child.parent_id = Some(root.id.clone());
    child.depth = 1;
    let child = store.create_session(&child).await.unwrap().0;
    finish(store, &child.id).await;
    finish(store, &root.id).await;
    (root.id, child.id)
}

fn costs_of(tenant: &str) -> CostFilter {
    CostFilter {
        tenant: Some(tenant.into()),
        since: Utc::now() - TimeDelta::days(1),
        until: Utc::now() + TimeDelta::days(1),
        limit: 100,
    }
}

fn retention(store: Arc<dyn Store>, cfg: RetentionSection, metrics: &'static Metrics) -> Retention {
    let workspace = WorkspaceSection {
        blob_grace_secs: 0,
        ..WorkspaceSection::default()
    };
    let clock = Arc::new(ManualClock::new(Utc::now() + TimeDelta::days(40)));
    Retention::new(store, cfg, workspace, clock, metrics).unwrap()
}

async fn beside_a_live_batch(store: Arc<dyn Store>, queue: Arc<dyn Queue>) {
    let (old, old_child) = old_tree(store.as_ref(), "archive").await;
    let spent = store.costs(&costs_of("archive")).await.unwrap();
    assert!(!spent.is_empty());

    // The batch: items the worker runs, and one on a queue no worker reads, so the batch
    // is unfinished until the test cancels it.
    let mut items = Vec::new();
    for i in 0..=ITEMS {
        let queue = if i == ITEMS { "parked" } else { "default" };
        let mut s = NewSession::root(SessionSpec::new(format!("item {i}")), queue);
        s.sched.batch_id = Some("batch_live".into());
        items.push(s);
    }
    let created = store.create_sessions(&items).await.unwrap();
    let ids: Vec<String> = created.iter().map(|(r, _)| r.id.clone()).collect();
    let (running, parked) = ids.split_at(ITEMS);
    let entries: Vec<(String, EnqueueReason)> = running
        .iter()
        .map(|id| (id.clone(), EnqueueReason::New))
        .collect();
    queue.enqueue_many("default", &entries).await.unwrap();
    store.mark_enqueued(running).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let mut cfg = WorkerSettings {
        consumer: format!("w-{}", agentq_core::new_session_id()),
        workspace_root: dir.path().join("work"),
        read_block: Duration::from_millis(100),
        ..WorkerSettings::default()
    };
    cfg.default_provider = Some("scripted".into());
    cfg.providers.script = Some(json!({"turns": [{"text": "item done"}]}).to_string());
    let worker = Worker::new(store.clone(), queue.clone(), cfg);
    let worker = tokio::spawn({
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });

    let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
    let export = dir.path().join("export");
    let cfg = RetentionSection {
        days: Some(30),
        export: Some(format!("dir:{}", export.display())),
        batch: 2,
        pause_ms: 0,
        ..RetentionSection::default()
    };
    let r = Arc::new(retention(store.clone(), cfg, metrics));
    // Passes, back to back, for as long as the batch runs.
    let passes = tokio::spawn({
        let (r, stop) = (r.clone(), stop.clone());
        async move {
            let mut total = 0;
            while !stop.is_cancelled() {
                total += r.pass(&stop).await.unwrap().trees;
                tokio::task::yield_now().await;
            }
            total
        }
    });
    for id in running {
        let store = store.clone();
        wait_until(format!("{id} completed"), Duration::from_secs(30), || {
            let store = store.clone();
            let id = id.clone();
            async move {
                let row = store
                    .get(&id)
                    .await
                    .unwrap()
                    .expect("a live session was deleted");
                (row.status == SessionStatus::Completed).then_some(row)
            }
        })
        .await;
    }
    stop.cancel();
    assert_eq!(passes.await.unwrap(), 1, "only the old tree is taken");
    worker.await.unwrap().unwrap();

    // The old tree went, exported first; the tenant's spending stands.
    assert!(store.get(&old).await.unwrap().is_none());
    assert!(store.get(&old_child).await.unwrap().is_none());
    assert!(store.workspace_files(&old).await.unwrap().is_empty());
    assert_eq!(store.costs(&costs_of("archive")).await.unwrap(), spent);
    let lines: Vec<serde_json::Value> = std::fs::read_dir(&export)
        .unwrap()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["session"]["id"], json!(old));
    assert_eq!(lines[0]["session"]["result"], json!("old answer"));
    assert!(lines[0]["transcript"].as_array().unwrap().len() >= 2);
    assert_eq!(lines[1]["session"]["id"], json!(old_child));
    assert_eq!(
        metrics.retention_trees.with_label_values(&["none"]).get(),
        1
    );
    assert_eq!(
        metrics
            .retention_sessions
            .with_label_values(&["none"])
            .get(),
        2
    );
    assert!(metrics.retention_messages.get() >= 2);
    assert_eq!(
        metrics.retention_blob_bytes.get(),
        "notes of archive".len() as u64
    );

    // Every item of the batch is there with its answer, the parked one still queued.
    for id in running {
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!(row.result.as_deref(), Some("item done"));
    }
    assert_eq!(
        store.get(&parked[0]).await.unwrap().unwrap().status,
        SessionStatus::Queued
    );
    // Once the batch has finished, its trees are due like any other.
    store.request_cancel(&parked[0]).await.unwrap();
    let report = r.pass(&CancellationToken::new()).await.unwrap();
    assert_eq!(report.trees, ITEMS as u64 + 1);
    for id in &ids {
        assert!(store.get(id).await.unwrap().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_beside_a_live_batch() {
    let url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&url, 8).await.unwrap();
    store.migrate().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let queue = RedisQueue::connect(&redis.url()).await.unwrap();
    beside_a_live_batch(Arc::new(store), Arc::new(queue)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_beside_a_live_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let queue = agentq_core::mem_queue::MemQueue::new();
    beside_a_live_batch(Arc::new(store), Arc::new(queue)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_result_still_answers() {
    let served = Served::start(SchedulerSettings::default()).await;
    let (store, base) = (served.store.clone(), served.base.clone());
    let (old, _) = old_tree(store.as_ref(), "default").await;
    let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
    let cfg = RetentionSection {
        days: Some(30),
        keep: Keep::Result,
        ..RetentionSection::default()
    };
    // A dry run says what would go and takes nothing.
    let r = retention(store.clone(), cfg, metrics);
    let plan = r.plan().await.unwrap();
    assert_eq!(plan.len(), 1);
    assert_eq!(
        (plan[0].trees, plan[0].sessions, plan[0].keep),
        (1, 2, "result")
    );
    assert_eq!(store.messages(&old).await.unwrap().len(), 2);
    let report = r.pass(&CancellationToken::new()).await.unwrap();
    assert_eq!((report.trees, report.sessions, report.pruned), (1, 0, 2));
    // Taken once: the next pass finds nothing.
    assert_eq!(r.pass(&CancellationToken::new()).await.unwrap().trees, 0);

    let http = common::bearer_client(ADMIN_KEY);
    let (status, v) = common::read(
        http.get(format!("{base}/v1/sessions/{old}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"], json!("old answer"));
    assert_eq!(v["status"], json!("completed"));
    let (status, v) = common::read(
        http.get(format!("{base}/v1/sessions/{old}/messages"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    // The prompt (kept with the spec) at most: the transcript went.
    assert!(v["messages"].as_array().map_or(0, Vec::len) <= 1, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_stops_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
    let cfg = RetentionSection {
        days: Some(1),
        ..RetentionSection::default()
    };
    let r = retention(Arc::new(store), cfg, metrics);
    assert_eq!(r.rules().await.unwrap().len(), 1);
    let stop = CancellationToken::new();
    let task = tokio::spawn(r.run(stop.clone()));
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

/// `export = "s3"`: each batch is an object under `retention/` in the workspace's bucket
/// before the delete commits, and the tree's contents are deleted from the bucket too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_to_the_object_store() {
    let moto = agentq_testkit::MotoServer::start()
        .expect("moto_server (pip install 'moto[server]'; scripts/test installs it)");
    let s3 = agentq_core::config::S3Section {
        bucket: format!("agentq-retention-{}", std::process::id()),
        endpoint: moto.endpoint(),
        prefix: "agentq/".into(),
        ..Default::default()
    };
    let objects =
        Arc::new(agentq_core::blob::s3::S3Blobs::new(&s3, "test".into(), "test".into()).unwrap());
    objects.create_bucket().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .unwrap()
        .with_objects(objects.clone());
    store.migrate().await.unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    let (old, _) = old_tree(store.as_ref(), "acme").await;
    let content = agentq_core::workspace::sha256_hex(b"notes of acme");
    assert!(objects.exists(&content).await.unwrap());
    let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
    let cfg = RetentionSection {
        days: Some(30),
        ..RetentionSection::default()
    };
    let r = retention(store.clone(), cfg, metrics).with_export_to(objects.clone());
    let report = r.pass(&CancellationToken::new()).await.unwrap();
    assert_eq!(
        (report.trees, report.exported, report.blobs_collected),
        (1, 2, 1)
    );
    assert!(store.get(&old).await.unwrap().is_none());
    assert!(!objects.exists(&content).await.unwrap());
    // The export, listed and read back from the bucket.
    let list = reqwest::get(format!(
        "{}/{}?list-type=2&prefix=agentq/retention/",
        s3.endpoint, s3.bucket
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    let key = list
        .split("<Key>")
        .nth(1)
        .and_then(|k| k.split("</Key>").next())
        .unwrap_or_else(|| panic!("no export in {list}"));
    assert!(key.ends_with(".jsonl"), "{key}");
    // Its bytes (the lines the directory case reads back) were stored whole.
    let size: u64 = list
        .split("<Size>")
        .nth(1)
        .and_then(|n| n.split("</Size>").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {list}"));
    assert!(size > 100, "{list}");
    assert!(key.contains(&old.to_ascii_lowercase()), "{key}");
}
