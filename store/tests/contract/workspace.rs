//! The workspace part of the `Store` contract, on every backend (`pg::<case>`,
//! `sqlite::<case>`): input files and forks at creation, the manifest changes a checkpoint
//! commits (fenced like the rest of it), blobs by content, expiry of finished trees'
//! workspaces and collection of unreferenced blobs.

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::schema::Message;
use agentq_agent::spec::ExitReason;
use agentq_agent::state::Outcome;
use agentq_error::Error;
use agentq_store::Checkpoint;
use agentq_store::blob::s3::S3Blobs;
use agentq_store::pg::PgStore;
use agentq_store::store::Store;
use agentq_types::config::S3Section;
use agentq_types::model::Claim;
use agentq_types::workspace::sha256_hex;

use crate::common::files::{
    bytes, carried, commit_together, create_with_files, delete, fence_off, input, parent_and_child,
    paths, put, step, with_files,
};
use crate::common::{Backend, TTL, acquire, new_session, pg_store, sqlite_store};

/// One S3-compatible server for the test binary; each store gets a bucket of its own.
fn moto() -> &'static agentq_testkit::MotoServer {
    static MOTO: std::sync::OnceLock<agentq_testkit::MotoServer> = std::sync::OnceLock::new();
    MOTO.get_or_init(|| {
        agentq_testkit::MotoServer::start()
            .expect("moto_server (pip install 'moto[server]'; scripts/test installs it)")
    })
}

async fn objects() -> Arc<S3Blobs> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let s = S3Section {
        bucket: format!("agentq-{}-{n}", std::process::id()),
        endpoint: moto().endpoint(),
        prefix: "blobs/".to_string(),
        ..S3Section::default()
    };
    let o = S3Blobs::new(&s, "test".into(), "test".into()).unwrap();
    o.create_bucket().await.unwrap();
    Arc::new(o)
}

macro_rules! workspace_contract_tests {
    ($($case:ident),* $(,)?) => {
        mod pg_s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = crate::common::pg_store().await.with_objects(super::objects().await);
                    super::$case(&store).await;
                }
            )*
        }
        mod sqlite_s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (_dir, store) = crate::common::sqlite_store().await;
                    let store = store.with_objects(super::objects().await);
                    super::$case(&store).await;
                    store.close().await;
                }
            )*
        }
        mod pg {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = crate::common::pg_store().await;
                    super::$case(&store).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (_dir, store) = crate::common::sqlite_store().await;
                    super::$case(&store).await;
                    store.close().await;
                }
            )*
        }
    };
}

workspace_contract_tests!(
    contract_input_files_and_forks,
    contract_checkpoint_commits_file_changes,
    contract_group_commit_of_one_tree,
    contract_a_commit_carries_its_contents,
    contract_blobs_by_content,
    contract_expiry_and_collection,
);

async fn contract_input_files_and_forks(store: &dyn Store) {
    let new = with_files(
        "inputs",
        "acme",
        vec![
            input("b.txt", b"bee"),
            input("dir/a.txt", b"a"),
            input("b.txt", b"bee, again"),
            input("empty", b""),
        ],
    );
    let (row, created) = store.create_session(&new).await.unwrap();
    assert!(created);
    // Sorted by path (bytes), the last of a path given twice wins.
    assert_eq!(
        paths(store, &row.root_id).await,
        vec![
            ("b.txt".into(), 10, 0),
            ("dir/a.txt".into(), 1, 0),
            ("empty".into(), 0, 0)
        ]
    );
    let (entry, data) = store
        .workspace_file(&row.root_id, "b.txt")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(data, b"bee, again");
    assert_eq!(entry.sha256, sha256_hex(b"bee, again"));
    assert_eq!(bytes(store, &row.root_id, "nope").await, None);
    // A repeat of the same session (its idempotency key) writes nothing again.
    let again = store.create_session(&new).await.unwrap();
    assert!(!again.1);

    // A fork copies the tree's files; its own inputs go over them.
    let mut fork = with_files("fork", "acme", vec![input("b.txt", b"forked")]);
    fork.workspace_from = Some(row.id.clone());
    let (forked, _) = store.create_session(&fork).await.unwrap();
    assert_eq!(
        bytes(store, &forked.root_id, "dir/a.txt").await.unwrap(),
        b"a"
    );
    assert_eq!(
        bytes(store, &forked.root_id, "b.txt").await.unwrap(),
        b"forked"
    );
    // ... and changes of the fork do not reach the tree it came from.
    let (lease, mut state) = acquire(store, &forked.id, "w", TTL).await;
    let change = put(store, "dir/a.txt", b"changed in the fork").await;
    step(store, &lease, &mut state, vec![change, delete("empty")])
        .await
        .unwrap();
    assert_eq!(bytes(store, &row.root_id, "dir/a.txt").await.unwrap(), b"a");
    assert_eq!(bytes(store, &row.root_id, "empty").await.unwrap(), b"");
    assert_eq!(
        bytes(store, &row.root_id, "b.txt").await.unwrap(),
        b"bee, again"
    );

    // Another tenant's session is unknown, and nothing of the refused request is stored.
    let mut thief = with_files("thief", "mallory", vec![input("x", b"x")]);
    thief.workspace_from = Some(row.id.clone());
    let err = store.create_session(&thief).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert!(store.get(&thief.id).await.unwrap().is_none());
    assert!(
        store
            .workspace_files(&thief.root_id)
            .await
            .unwrap()
            .is_empty()
    );
    let mut unknown = with_files("unknown", "acme", vec![]);
    unknown.workspace_from = Some(agentq_types::model::new_session_id());
    assert!(matches!(
        store.create_session(&unknown).await.unwrap_err(),
        Error::NotFound(_)
    ));

    // A path that could leave the workspace is refused, whatever let it through.
    for bad in [
        "../x",
        "/etc/passwd",
        "a/../../x",
        "a//b",
        "a\\b",
        "",
        "./a",
        "a/\0",
    ] {
        let s = with_files("bad", "acme", vec![input(bad, b"x")]);
        let err = store.create_session(&s).await.unwrap_err();
        assert!(
            matches!(&err, Error::Invalid { field, .. } if field == "files"),
            "{bad:?}: {err:?}"
        );
        assert!(store.get(&s.id).await.unwrap().is_none(), "{bad:?}");
    }

    // A batch: each item's files go to its own tree.
    let batch = vec![
        with_files("one", "acme", vec![input("one", b"1")]),
        with_files("two", "acme", vec![input("two", b"2")]),
    ];
    let rows = store.create_sessions(&batch).await.unwrap();
    assert_eq!(paths(store, &rows[0].0.root_id).await[0].0, "one");
    assert_eq!(
        paths(store, &rows[1].0.root_id).await,
        vec![("two".into(), 1, 0)]
    );
}

async fn contract_checkpoint_commits_file_changes(store: &dyn Backend) {
    let row = create_with_files(store, "cp", vec![input("keep", b"k"), input("gone", b"g")]).await;
    let root = row.root_id.clone();
    // A claim says whether the tree holds committed files (the worker then skips reading
    // an empty manifest); a tree without any says so too.
    match store.claim(&row.id, "w1", TTL, 10).await.unwrap() {
        Claim::Acquired { row, .. } => assert!(row.has_workspace, "inputs are committed"),
        other => panic!("expected Acquired, got {other:?}"),
    }
    let bare = create_with_files(store, "bare", vec![]).await;
    match store.claim(&bare.id, "w0", TTL, 10).await.unwrap() {
        Claim::Acquired { row, .. } => assert!(!row.has_workspace, "no file anywhere"),
        other => panic!("expected Acquired, got {other:?}"),
    }
    let (lease, mut state) = acquire(store, &row.id, "w1", TTL).await;
    let a = put(store, "out/a.txt", b"first").await;
    step(store, &lease, &mut state, vec![a, delete("gone")])
        .await
        .unwrap();
    let seq = i64::try_from(state.messages.len() - 1).unwrap();
    assert_eq!(
        paths(store, &root).await,
        vec![("keep".into(), 1, 0), ("out/a.txt".into(), 5, seq)]
    );
    // A step without files changes no file.
    step(store, &lease, &mut state, vec![]).await.unwrap();
    assert_eq!(paths(store, &root).await.len(), 2);
    // An overwrite, and deleting a path that is not there.
    let a2 = put(store, "out/a.txt", b"second").await;
    step(store, &lease, &mut state, vec![a2, delete("never")])
        .await
        .unwrap();
    assert_eq!(bytes(store, &root, "out/a.txt").await.unwrap(), b"second");

    // A worker fenced off by a newer claim commits no file at all.
    let (lease2, mut state2) = fence_off(store, &lease, &row.id, "w2").await;
    let stale = put(store, "out/a.txt", b"from the dead worker").await;
    let err = step(store, &lease, &mut state, vec![stale, delete("keep")])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost(_)), "{err:?}");
    assert_eq!(bytes(store, &root, "out/a.txt").await.unwrap(), b"second");
    assert_eq!(bytes(store, &root, "keep").await.unwrap(), b"k");

    // The new holder's final step commits its files with the outcome.
    let fin = put(store, "result.md", b"# done").await;
    let from = state2.messages.len();
    state2.messages.push(Message::assistant("done"));
    state2.outcome = Some(Outcome::new(ExitReason::Stop));
    let cp = Checkpoint::new(&lease2, &state2, from)
        .unwrap()
        .with_files(vec![fin], vec![]);
    store
        .checkpoint_batch(&[&cp])
        .await
        .unwrap()
        .pop()
        .unwrap()
        .unwrap();
    assert!(
        store
            .get(&row.id)
            .await
            .unwrap()
            .unwrap()
            .status
            .is_terminal()
    );
    assert_eq!(bytes(store, &root, "result.md").await.unwrap(), b"# done");
}

async fn contract_group_commit_of_one_tree(store: &dyn Store) {
    // A parent and its child: one tree, one workspace.
    let (parent, child) = parent_and_child(store).await;
    let other = create_with_files(store, "other", vec![]).await;
    let (pl, mut ps) = acquire(store, &parent.id, "w", TTL).await;
    let (cl, mut cs) = acquire(store, &child.id, "w", TTL).await;
    let (ol, mut os) = acquire(store, &other.id, "w", TTL).await;
    let p_change = put(store, "shared.txt", b"from the parent").await;
    let c_change = put(store, "shared.txt", b"from the child").await;
    let c_own = put(store, "child.txt", b"c").await;
    commit_together(
        store,
        vec![
            (&pl, &mut ps, vec![p_change], vec![]),
            (&ol, &mut os, vec![], vec![]),
            (&cl, &mut cs, vec![c_change, c_own], vec![]),
        ],
    )
    .await;
    // The later writer of a path in the batch wins.
    assert_eq!(
        bytes(store, &parent.root_id, "shared.txt").await.unwrap(),
        b"from the child"
    );
    assert_eq!(
        bytes(store, &parent.root_id, "child.txt").await.unwrap(),
        b"c"
    );
    assert!(
        store
            .workspace_files(&other.root_id)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn contract_a_commit_carries_its_contents(store: &dyn Backend) {
    let (parent, child) = parent_and_child(store).await;
    let (pl, mut ps) = acquire(store, &parent.id, "w", TTL).await;
    let (cl, mut cs) = acquire(store, &child.id, "w", TTL).await;
    // One content carried by two checkpoints of one batch (and a second, new one), and a
    // content stored already carried again: each is stored once, with its references.
    let stored = put(store, "old.txt", b"stored before").await;
    let (a, a_blob) = carried("a.txt", b"carried twice");
    let (b, b_blob) = carried("b.txt", b"carried twice");
    let (c, c_blob) = carried("c.txt", b"only here");
    let (again, again_blob) = carried("again.txt", b"stored before");
    assert_eq!(again.blob, stored.blob);
    commit_together(
        store,
        vec![
            (
                &pl,
                &mut ps,
                vec![a, again],
                vec![a_blob.clone(), again_blob],
            ),
            (&cl, &mut cs, vec![b, c], vec![b_blob, c_blob]),
        ],
    )
    .await;
    let root = &parent.root_id;
    assert_eq!(bytes(store, root, "a.txt").await.unwrap(), b"carried twice");
    assert_eq!(bytes(store, root, "b.txt").await.unwrap(), b"carried twice");
    assert_eq!(bytes(store, root, "c.txt").await.unwrap(), b"only here");
    assert_eq!(
        bytes(store, root, "again.txt").await.unwrap(),
        b"stored before"
    );
    assert_eq!(
        store.get_blob(&a_blob.0).await.unwrap().unwrap(),
        b"carried twice"
    );
    assert!(
        store
            .missing_blobs(std::slice::from_ref(&a_blob.0))
            .await
            .unwrap()
            .is_empty()
    );

    // A worker whose lease is gone commits none of its changes, carried contents or not.
    let (_pl2, _) = fence_off(store, &pl, &parent.id, "w2").await;
    let (late, late_blob) = carried("a.txt", b"from the dead worker");
    let from = ps.messages.len();
    ps.messages.push(Message::assistant("late"));
    let cp = Checkpoint::new(&pl, &ps, from)
        .unwrap()
        .with_files(vec![late], vec![late_blob]);
    let err = store
        .checkpoint_batch(&[&cp])
        .await
        .unwrap()
        .pop()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost(_)), "{err:?}");
    assert_eq!(bytes(store, root, "a.txt").await.unwrap(), b"carried twice");
}

async fn contract_blobs_by_content(store: &dyn Store) {
    let data = b"same content".to_vec();
    let key = sha256_hex(&data);
    assert_eq!(
        store
            .missing_blobs(std::slice::from_ref(&key))
            .await
            .unwrap(),
        vec![key.clone()]
    );
    // A key that is not the content's hash could serve other trees the wrong bytes.
    let forged = sha256_hex(b"something else");
    let err = store
        .put_blobs(&[(forged.clone(), data.clone())])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
    assert_eq!(store.get_blob(&forged).await.unwrap(), None);
    store
        .put_blobs(&[(key.clone(), data.clone()), (key.clone(), data.clone())])
        .await
        .unwrap();
    store
        .put_blobs(&[(key.clone(), data.clone())])
        .await
        .unwrap();
    assert_eq!(store.get_blob(&key).await.unwrap().unwrap(), data);
    assert!(
        store
            .missing_blobs(std::slice::from_ref(&key))
            .await
            .unwrap()
            .is_empty()
    );
    // Two tenants' files of one content share it; each reads it through its own tree.
    let a = store
        .create_session(&with_files("a", "acme", vec![input("f", &data)]))
        .await
        .unwrap()
        .0;
    let b = store
        .create_session(&with_files("b", "globex", vec![input("g", &data)]))
        .await
        .unwrap()
        .0;
    assert_eq!(bytes(store, &a.root_id, "f").await.unwrap(), data);
    assert_eq!(bytes(store, &b.root_id, "g").await.unwrap(), data);
    // A tree reads only its own paths.
    assert_eq!(bytes(store, &a.root_id, "g").await, None);
    // Deleting by key spares a referenced blob.
    store
        .delete_blobs(std::slice::from_ref(&key))
        .await
        .unwrap();
    assert_eq!(store.get_blob(&key).await.unwrap().unwrap(), data);
}

async fn contract_expiry_and_collection(store: &dyn Backend) {
    let done = create_with_files(store, "done", vec![input("old", b"old content")]).await;
    let live = create_with_files(store, "live", vec![input("live", b"live content")]).await;
    let (lease, mut state) = acquire(store, &done.id, "w", TTL).await;
    let from = state.messages.len();
    state.messages.push(Message::assistant("done"));
    state.outcome = Some(Outcome::new(ExitReason::Stop));
    store.checkpoint(&lease, &state, from).await.unwrap();
    // An orphan: uploaded, never committed (its worker died).
    let orphan = put(store, "unused", b"never committed").await;
    let orphan = orphan.blob.unwrap().sha256;

    // Within the grace period nothing is collected, referenced or not.
    assert_eq!(
        store
            .collect_blobs(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    // Past a TTL the finished tree's workspace goes; the live one stays.
    assert_eq!(
        store
            .expire_workspaces(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    store.pass(Duration::from_millis(5)).await;
    assert_eq!(
        store.expire_workspaces(Duration::ZERO, 100).await.unwrap(),
        1
    );
    assert!(
        store
            .workspace_files(&done.root_id)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.workspace_files(&live.root_id).await.unwrap().len(), 1);
    assert_eq!(
        store.expire_workspaces(Duration::ZERO, 100).await.unwrap(),
        0
    );

    // Collection takes the unreferenced blobs (the expired tree's, the orphan), in bounded
    // batches, and never a referenced one.
    let old = sha256_hex(b"old content");
    let first = store.collect_blobs(Duration::ZERO, 1).await.unwrap();
    assert_eq!(first, 1);
    assert_eq!(store.collect_blobs(Duration::ZERO, 100).await.unwrap(), 1);
    assert_eq!(store.collect_blobs(Duration::ZERO, 100).await.unwrap(), 0);
    assert_eq!(store.get_blob(&old).await.unwrap(), None);
    assert_eq!(store.get_blob(&orphan).await.unwrap(), None);
    assert_eq!(
        bytes(store, &live.root_id, "live").await.unwrap(),
        b"live content"
    );
    // A collected blob is missing again, so the next upload stores it again.
    assert_eq!(
        store
            .missing_blobs(std::slice::from_ref(&old))
            .await
            .unwrap(),
        vec![old]
    );
}

/// With an object store: the bytes are in the bucket, the database keeps only the index;
/// a content changed in the bucket behind the store's back is refused, never served; the
/// collector deletes the index row and the object.
async fn s3_case(
    store: &dyn Backend,
    objects: &S3Blobs,
    index_data_is_null: impl AsyncFn(&str) -> bool,
) {
    let data = b"kept in the bucket".to_vec();
    let key = sha256_hex(&data);
    store
        .put_blobs(&[(key.clone(), data.clone())])
        .await
        .unwrap();
    assert!(objects.exists(&key).await.unwrap());
    assert!(index_data_is_null(&key).await);
    assert_eq!(store.get_blob(&key).await.unwrap().unwrap(), data);
    assert!(
        store
            .missing_blobs(std::slice::from_ref(&key))
            .await
            .unwrap()
            .is_empty()
    );

    // A session's file read through the API's path is verified too.
    let s = create_with_files(store, "t", vec![input("f.txt", &data)]).await;
    assert_eq!(bytes(store, &s.root_id, "f.txt").await.unwrap(), data);

    // Someone with write access to the bucket swaps the content.
    objects.put(&key, b"evil".to_vec()).await.unwrap();
    let err = store.get_blob(&key).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::ObjectStore {
                retryable: false,
                ..
            }
        ),
        "{err:?}"
    );
    let err = store.workspace_file(&s.root_id, "f.txt").await.unwrap_err();
    assert!(matches!(err, Error::ObjectStore { .. }), "{err:?}");
    // Keys that are not hashes never reach the bucket.
    assert!(objects.get("../other-bucket/x", 10).await.is_err());
    // A larger object than the index records is refused before it is all read.
    let big = vec![7u8; 4096];
    objects.put(&key, big).await.unwrap();
    let err = store.get_blob(&key).await.unwrap_err();
    assert!(matches!(err, Error::ObjectStore { .. }), "{err:?}");

    // Collection: the orphan's index row and object both go; a referenced one stays.
    let orphan = b"nobody holds me".to_vec();
    let okey = sha256_hex(&orphan);
    store.put_blobs(&[(okey.clone(), orphan)]).await.unwrap();
    store.pass(Duration::from_millis(5)).await;
    assert_eq!(store.collect_blobs(Duration::ZERO, 100).await.unwrap(), 1);
    assert!(!objects.exists(&okey).await.unwrap());
    assert!(objects.exists(&key).await.unwrap());
    assert_eq!(store.get_blob(&okey).await.unwrap(), None);
    assert_eq!(
        store
            .missing_blobs(std::slice::from_ref(&okey))
            .await
            .unwrap(),
        vec![okey.clone()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_s3_bytes_in_the_bucket_verified_and_collected() {
    let objects = objects().await;
    let url = agentq_testkit::shared_postgres()
        .unwrap()
        .fresh_database()
        .unwrap();
    let store = PgStore::connect(&url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let store = store.with_objects(objects.clone());
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    s3_case(&store, &objects, async |k: &str| {
        let d: Option<Vec<u8>> = sqlx::query_scalar("SELECT data FROM blobs WHERE sha256 = $1")
            .bind(k)
            .fetch_one(&pool)
            .await
            .unwrap();
        d.is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_s3_bytes_in_the_bucket_verified_and_collected() {
    let objects = objects().await;
    let (dir, store) = sqlite_store().await;
    let store = store.with_objects(objects.clone());
    let path = dir.path().join("agentq.db");
    s3_case(&store, &objects, async |k: &str| {
        let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        let d: Option<Vec<u8>> = sqlx::query_scalar("SELECT data FROM blobs WHERE sha256 = $1")
            .bind(k)
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        d.is_none()
    })
    .await;
    store.close().await;
}

/// How long a write that must not wait for an upload may take before the test calls it
/// held up: a guard against a hang, not a measure of speed.
const HANG: Duration = Duration::from_secs(60);

/// An upload to a slow object store holds up no other write of the embedded store (whose
/// file lock every checkpoint of every session takes): the lock is taken only to index
/// contents already uploaded. Two uploads are never answered here, one of blobs and one
/// of a new session's input file; a session is created meanwhile, and once the uploads
/// are given up nothing of them is indexed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_s3_a_slow_upload_holds_up_no_other_write() {
    use tokio::io::AsyncReadExt;
    // An object store that takes every request and never answers (a response's headers
    // would end an upload).
    let slow = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", slow.local_addr().unwrap());
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut conn, _)) = slow.accept().await {
            let mut first = [0u8; 512];
            if conn.read(&mut first).await.unwrap_or(0) > 0 {
                let _ = arrived.send(());
            }
            held.push(conn);
        }
    });
    let s = S3Section {
        bucket: "agentq-slow".to_string(),
        endpoint,
        ..S3Section::default()
    };
    let objects = Arc::new(S3Blobs::new(&s, "test".into(), "test".into()).unwrap());
    let (_dir, sqlite) = sqlite_store().await;
    let sqlite = sqlite.with_objects(objects);
    let store: Arc<dyn Store> = Arc::new(sqlite.clone());
    let data = b"slow to upload".to_vec();
    let key = sha256_hex(&data);
    let blobs = tokio::spawn({
        let store = store.clone();
        let blobs = vec![(key.clone(), data)];
        async move { store.put_blobs(&blobs).await }
    });
    let input_file = b"slow as well";
    let inputs = tokio::spawn({
        let store = store.clone();
        let new = with_files("slow input", "acme", vec![input("a.txt", input_file)]);
        async move { store.create_session(&new).await }
    });
    // Both uploads in flight at once: neither waits for the other.
    tokio::time::timeout(HANG, async {
        for _ in 0..2 {
            arrivals.recv().await.unwrap();
        }
    })
    .await
    .expect("an upload waited for another");
    let (row, created) =
        tokio::time::timeout(HANG, store.create_session(&new_session("meanwhile")))
            .await
            .expect("a write waited for an upload")
            .unwrap();
    assert!(created);
    assert!(store.get(&row.id).await.unwrap().is_some());
    blobs.abort();
    inputs.abort();
    assert!(blobs.await.unwrap_err().is_cancelled());
    assert!(inputs.await.unwrap_err().is_cancelled());
    let keys = vec![key, sha256_hex(input_file)];
    assert_eq!(store.missing_blobs(&keys).await.unwrap(), keys);
    assert_eq!(store.list(&Default::default()).await.unwrap().len(), 1);
    sqlite.close().await;
}

/// Refused credentials are a fatal error, not one retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_unknown_bucket_is_fatal() {
    let s = S3Section {
        bucket: "no-such-bucket-here".to_string(),
        endpoint: moto().endpoint(),
        ..S3Section::default()
    };
    let o = S3Blobs::new(&s, "test".into(), "test".into()).unwrap();
    let data = b"x".to_vec();
    let err = o.put(&sha256_hex(&data), data).await.unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
}

/// The bucket's server goes away: an upload fails as retryable and leaves no index row
/// (the content is still missing, so the next try uploads it); a read is retryable too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_outage_is_retryable_and_leaves_no_index_row() {
    let moto = agentq_testkit::MotoServer::start().expect("moto_server");
    let s = S3Section {
        bucket: "agentq-outage".to_string(),
        endpoint: moto.endpoint(),
        ..S3Section::default()
    };
    let objects = Arc::new(S3Blobs::new(&s, "test".into(), "test".into()).unwrap());
    objects.create_bucket().await.unwrap();
    let kept = b"uploaded before".to_vec();
    let kkey = sha256_hex(&kept);
    objects.put(&kkey, kept).await.unwrap();
    drop(moto);
    let data = b"during the outage".to_vec();
    let key = sha256_hex(&data);
    let (_dir, sqlite) = sqlite_store().await;
    for store in [
        Box::new(pg_store().await.with_objects(objects.clone())) as Box<dyn Store>,
        Box::new(sqlite.with_objects(objects.clone())),
    ] {
        let err = store
            .put_blobs(&[(key.clone(), data.clone())])
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        assert_eq!(
            store
                .missing_blobs(std::slice::from_ref(&key))
                .await
                .unwrap(),
            vec![key.clone()]
        );
    }
    let err = objects.get(&kkey, 100).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}

/// A service's transient answers (5xx, throttling) are sent again a bounded number of
/// times and then returned as retryable; a refusal is returned at once; and a batch that
/// names one content twice writes its object once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_transient_answers_are_sent_again_a_bounded_number_of_times() {
    use agentq_testkit::{FakeLlm, FakeResponse};
    let fake = FakeLlm::start().await.unwrap();
    let s = S3Section {
        bucket: "agentq-flaky".to_string(),
        endpoint: fake.url.clone(),
        ..S3Section::default()
    };
    let o = S3Blobs::new(&s, "test".into(), "test".into())
        .unwrap()
        .with_first_wait(Duration::ZERO);
    let data = b"sent again".to_vec();
    let key = sha256_hex(&data);
    let ok = || FakeResponse::json(200, "");

    fake.push(FakeResponse::json(
        500,
        "<Error><Code>InternalError</Code></Error>",
    ));
    fake.push(FakeResponse::json(
        503,
        "<Error><Code>SlowDown</Code></Error>",
    ));
    fake.push(ok());
    o.put(&key, data.clone()).await.unwrap();
    assert_eq!(fake.request_count(), 3);
    let sent = fake.requests();
    assert!(sent.iter().all(|r| r.path.ends_with(&key)), "{sent:?}");

    for _ in 0..3 {
        fake.push(FakeResponse::json(500, ""));
    }
    let err = o.put(&key, data.clone()).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(fake.request_count(), 6, "three sends, no more");

    fake.push(FakeResponse::json(429, ""));
    fake.push(FakeResponse {
        status: 200,
        headers: vec![],
        chunks: vec![(Duration::ZERO, data.clone().into())],
        cut: false,
    });
    assert_eq!(o.get(&key, 100).await.unwrap(), Some(data.clone()));
    assert_eq!(fake.request_count(), 8, "a throttled read is sent again");

    let refused_before = fake.request_count();
    fake.push(FakeResponse::json(500, ""));
    fake.push(FakeResponse::json(
        403,
        "<Error><Code>AccessDenied</Code></Error>",
    ));
    let err = o.put(&key, data.clone()).await.unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    assert_eq!(
        fake.request_count(),
        refused_before + 2,
        "a refusal is final"
    );

    let before = fake.request_count();
    fake.push(ok());
    o.put_all(&[(key.clone(), data.clone()), (key.clone(), data.clone())])
        .await
        .unwrap();
    assert_eq!(fake.request_count(), before + 1, "one object written once");
}
