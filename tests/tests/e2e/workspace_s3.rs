//! Durable workspaces with `blob_store = "s3"`, on the real worker binary and a real
//! S3-compatible server (moto): the bytes of a file a session writes go to the bucket and
//! only its index row to Postgres; a worker with another workspace root (another
//! machine) gets them back from the bucket; the collector deletes the objects of expired
//! workspaces.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use agentq_agent::spec::SessionSpec;
use agentq_core::blob::s3::S3Blobs;
use agentq_core::config::{S3Section, WorkspaceSection};
use agentq_core::{EnqueueReason, NewSession, SessionStatus, Store, WorkQueue};
use agentq_testkit::MotoServer;

use crate::common::{Cluster, Script, ToolUse, Turn, WorkerOpts, eventually};

const T: Duration = Duration::from_secs(90);

/// A session of `script` (forking `from`'s files when given), created through `store`.
async fn submit(c: &Cluster, store: &dyn Store, script: Script, from: Option<&str>) -> String {
    let token = c.register(script);
    let mut spec = SessionSpec::new(format!("Follow the e2e script <<{token}>>."));
    spec.tools = Some(vec!["read_file".into(), "write_file".into()]);
    let mut new = NewSession::root(spec, "default");
    new.workspace_from = from.map(str::to_string);
    let (row, _) = store.create_session(&new).await.unwrap();
    c.queue
        .enqueue("default", &row.id, EnqueueReason::New)
        .await
        .unwrap();
    store
        .mark_enqueued(std::slice::from_ref(&row.id))
        .await
        .unwrap();
    row.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_live_in_the_bucket_and_follow_the_session() {
    let moto = MotoServer::start()
        .expect("moto_server (pip install 'moto[server]'; scripts/test installs it)");
    let mut c = Cluster::start().await;
    let section = S3Section {
        bucket: "agentq-e2e".into(),
        endpoint: moto.endpoint(),
        prefix: "ws/".into(),
        access_key_env: "E2E_S3_KEY".into(),
        secret_key_env: "E2E_S3_SECRET".into(),
        ..S3Section::default()
    };
    let objects = Arc::new(S3Blobs::new(&section, "test".into(), "test".into()).unwrap());
    objects.create_bucket().await.unwrap();
    let config = c.dir("s3.toml");
    std::fs::write(
        &config,
        format!(
            "[workspace]\nblob_store = \"s3\"\n\n[workspace.s3]\nbucket = \"agentq-e2e\"\n\
             endpoint = \"{}\"\nprefix = \"ws/\"\naccess_key_env = \"E2E_S3_KEY\"\n\
             secret_key_env = \"E2E_S3_SECRET\"\n",
            moto.endpoint()
        ),
    )
    .unwrap();
    let env = vec![
        ("AGENTQ_CONFIG".to_string(), config.display().to_string()),
        ("E2E_S3_KEY".to_string(), "test".to_string()),
        ("E2E_S3_SECRET".to_string(), "test".to_string()),
    ];
    // Every shard's store with the bucket: a session's files are indexed on its tree's.
    let store = c
        .open_store_with(2, |shard| shard.with_objects(objects.clone()))
        .await;

    // Machine A writes a file.
    let disk_a = c.dir("machine-a");
    let a = c
        .spawn_ready_worker(&WorkerOpts {
            workspace_root: Some(disk_a.clone()),
            env: env.clone(),
            ..WorkerOpts::default()
        })
        .await;
    let first = submit(
        &c,
        &*store,
        Script::new(vec![
            Turn {
                text: "Writing.".into(),
                tools: vec![ToolUse::call(
                    "write_file",
                    json!({"path": "out/result.txt", "content": "kept in the bucket"}),
                )],
            },
            Turn::text("Done."),
        ]),
        None,
    )
    .await;
    let rows = c.wait_all_terminal(std::slice::from_ref(&first), T).await;
    assert_eq!(rows[0].status, SessionStatus::Completed, "{:?}", rows[0]);
    c.kill_worker(a);

    let files = store.workspace_files(&first).await.unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    let sha = files[0].sha256.clone();
    assert!(objects.exists(&sha).await.unwrap());
    // The database holds the index only: a store without the bucket cannot read it.
    assert!(
        c.store
            .workspace_file(&first, "out/result.txt")
            .await
            .is_err()
    );
    let (_, data) = store
        .workspace_file(&first, "out/result.txt")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(data, b"kept in the bucket");

    // Machine B, another disk, works on a fork of those files: it materialises them from
    // the bucket.
    let disk_b = c.dir("machine-b");
    c.spawn_worker(&WorkerOpts {
        workspace_root: Some(disk_b.clone()),
        env: env.clone(),
        ..WorkerOpts::default()
    });
    let second = submit(
        &c,
        &*store,
        Script::new(vec![
            Turn {
                text: "Reading.".into(),
                tools: vec![ToolUse::call(
                    "read_file",
                    json!({"path": "out/result.txt"}),
                )],
            },
            Turn::text("Done."),
        ]),
        Some(&first),
    )
    .await;
    let rows = c.wait_all_terminal(std::slice::from_ref(&second), T).await;
    assert_eq!(rows[0].status, SessionStatus::Completed, "{:?}", rows[0]);
    assert_eq!(
        std::fs::read_to_string(disk_b.join(&second).join("out/result.txt")).unwrap(),
        "kept in the bucket"
    );
    assert!(!disk_a.join(&second).exists());

    // Both workspaces expire (a second after their trees ended, by the store's clock);
    // the collector deletes the index row and the object.
    let cfg = WorkspaceSection {
        ttl_secs: 1,
        blob_grace_secs: 0,
        ..WorkspaceSection::default()
    };
    eventually("a collection to expire both trees", T, async || {
        agentq_scheduler::workspace_gc::gc_pass(&*store, &cfg).await;
        store.workspace_files(&first).await.unwrap().is_empty()
            && store.workspace_files(&second).await.unwrap().is_empty()
    })
    .await;
    assert!(!objects.exists(&sha).await.unwrap());
}
