//! Workspace retention as the scheduler runs it, on a real Postgres: a finished tree's
//! files expire after the TTL while a running tree's stay, and the collector takes the
//! contents nothing references any more (an upload whose commit never came included) and
//! never one a workspace still holds, however old; the task stops when told.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentq_agent::schema::Message;
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_core::blob::BlobStore;
use agentq_core::config::WorkspaceSection;
use agentq_core::pg::PgStore;
use agentq_core::workspace::{InputFile, sha256_hex};
use agentq_core::{Claim, LeaseStore, NewSession, SessionStore, Store, WorkspaceStore};
use agentq_scheduler::workspace_gc::{gc_pass, run_workspace_gc};
use agentq_testkit::shared_postgres;

use common::wait_until;

async fn store() -> PgStore {
    let url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&url, 4).await.unwrap();
    store.migrate().await.unwrap();
    store
}

async fn tree(store: &PgStore, path: &str, data: &[u8]) -> String {
    let mut new = NewSession::root(SessionSpec::new("gc"), "default");
    new.files = vec![InputFile {
        path: path.into(),
        data: data.to_vec(),
    }];
    store.create_session(&new).await.unwrap().0.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_and_collection_spare_what_is_referenced() {
    let store = store().await;
    let done = tree(&store, "old.txt", b"finished tree's file").await;
    let live = tree(&store, "live.txt", b"running tree's file").await;
    // Both trees hold this content: one expiring does not free it.
    let shared_a = tree(&store, "shared.txt", b"shared content").await;
    let _shared_b = tree(&store, "shared.txt", b"shared content").await;
    for id in [&done, &shared_a] {
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
        state.messages.push(Message::assistant("done"));
        state.outcome = Some(Outcome::new(ExitReason::Stop));
        store.checkpoint(&lease, &state, from).await.unwrap();
    }
    let Claim::Acquired { .. } = store
        .claim(&live, "w", Duration::from_secs(30), 5)
        .await
        .unwrap()
    else {
        panic!("not acquired")
    };
    let orphan = b"uploaded, never committed".to_vec();
    store
        .put_blobs(&[(sha256_hex(&orphan), orphan.clone())])
        .await
        .unwrap();

    // Everything is younger than the grace period: nothing is collected.
    let patient = WorkspaceSection {
        ttl_secs: 3600,
        ..WorkspaceSection::default()
    };
    gc_pass(&store, &patient).await;
    assert!(
        store
            .get_blob(&sha256_hex(&orphan))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(store.workspace_files(&done).await.unwrap().len(), 1);

    // Once both finished trees are a second old (the shortest TTL, by the store's clock),
    // a pass collects them.
    let eager = WorkspaceSection {
        ttl_secs: 1,
        blob_grace_secs: 0,
        gc_interval_secs: 1,
        gc_batch: 1,
        ..WorkspaceSection::default()
    };
    wait_until(
        "a pass to expire both finished trees",
        Duration::from_secs(10),
        || async {
            gc_pass(&store, &eager).await;
            store.workspace_files(&done).await.unwrap().is_empty()
                && store.workspace_files(&shared_a).await.unwrap().is_empty()
        },
    )
    .await;
    assert!(store.workspace_files(&shared_a).await.unwrap().is_empty());
    assert_eq!(store.workspace_files(&live).await.unwrap().len(), 1);
    for (content, kept) in [
        (&b"finished tree's file"[..], false),
        (&orphan[..], false),
        (&b"running tree's file"[..], true),
        (&b"shared content"[..], true),
    ] {
        assert_eq!(
            store
                .get_blob(&sha256_hex(content))
                .await
                .unwrap()
                .is_some(),
            kept,
            "{}",
            String::from_utf8_lossy(content)
        );
    }

    // The task itself, stopped by its token.
    let stop = CancellationToken::new();
    let store: Arc<dyn Store> = Arc::new(store);
    let task = tokio::spawn(run_workspace_gc(store, eager, stop.clone()));
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the collector stops when told")
        .unwrap();
}
