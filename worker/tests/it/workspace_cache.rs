//! The worker's local workspace is a cache of the committed manifest: restored cold,
//! checked cheaply warm, cleaned of everything never committed (links and hard links
//! included, without writing through them), and the changes of tools and of other
//! processes found for the next commit. On the embedded store (a temporary file).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use agentq_agent::spec::SessionSpec;
use agentq_agent::tools::{Workspace, WriteLimits};
use agentq_core::sqlite::SqliteStore;
use agentq_core::workspace::InputFile;
use agentq_core::{NewSession, Store};
use agentq_worker::workspace::{TreeSync, materialise};

async fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("db")).await.unwrap();
    store.migrate().await.unwrap();
    (dir, Arc::new(store))
}

async fn tree(store: &dyn Store, files: &[(&str, &[u8])]) -> String {
    let mut new = NewSession::root(SessionSpec::new("ws"), "default");
    new.files = files
        .iter()
        .map(|(p, d)| InputFile {
            path: p.to_string(),
            data: d.to_vec(),
        })
        .collect();
    store.create_session(&new).await.unwrap().0.root_id
}

const LIMITS: WriteLimits = WriteLimits {
    max_file_bytes: 1 << 20,
    quota_bytes: 1 << 24,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_is_restored_cold_checked_warm_and_cleaned() {
    let (_d, store) = store().await;
    let root = tree(&*store, &[("a.txt", b"alpha"), ("dir/b.txt", b"beta")]).await;
    let disk = tempfile::tempdir().unwrap();
    let dir = disk.path().join(&root);
    let index = disk.path().join("index.json");

    let cold = materialise(&*store, &root, &dir, &index).await.unwrap();
    assert_eq!((cold.files, cold.fetched, cold.deleted), (2, 2, 0));
    assert_eq!(std::fs::read(dir.join("dir/b.txt")).unwrap(), b"beta");
    let warm = materialise(&*store, &root, &dir, &index).await.unwrap();
    assert_eq!((warm.files, warm.fetched, warm.deleted), (2, 0, 0));

    // What was never committed goes, a changed file comes back as committed, and links
    // are removed without writing through them.
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, b"outside").unwrap();
    std::fs::write(dir.join("uncommitted.txt"), b"x").unwrap();
    std::fs::write(dir.join("a.txt"), b"changed, not committed").unwrap();
    std::fs::remove_file(dir.join("dir/b.txt")).unwrap();
    std::fs::hard_link(&secret, dir.join("dir/b.txt")).unwrap();
    std::os::unix::fs::symlink(&secret, dir.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.join("linked-dir")).unwrap();
    let again = materialise(&*store, &root, &dir, &index).await.unwrap();
    assert_eq!(again.fetched, 2, "{again:?}");
    // The extra file, both links, and the hard-linked name (then fetched afresh).
    assert_eq!(again.deleted, 4, "{again:?}");
    assert_eq!(std::fs::read(dir.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(std::fs::read(dir.join("dir/b.txt")).unwrap(), b"beta");
    assert!(!dir.join("uncommitted.txt").exists());
    assert!(std::fs::symlink_metadata(dir.join("link")).is_err());
    assert!(std::fs::symlink_metadata(dir.join("linked-dir")).is_err());
    assert_eq!(std::fs::read(&secret).unwrap(), b"outside");

    // A directory where a committed file belongs gives way to it.
    std::fs::remove_file(dir.join("a.txt")).unwrap();
    std::fs::create_dir_all(dir.join("a.txt/inner")).unwrap();
    std::fs::write(dir.join("a.txt/inner/x"), b"x").unwrap();
    materialise(&*store, &root, &dir, &index).await.unwrap();
    assert_eq!(std::fs::read(dir.join("a.txt")).unwrap(), b"alpha");

    // An index that lies is only a cost: the file is checked against the manifest.
    std::fs::write(&index, b"not json").unwrap();
    let lied = materialise(&*store, &root, &dir, &index).await.unwrap();
    assert_eq!(lied.fetched, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_found_for_the_next_commit() {
    let (_d, store) = store().await;
    let root = tree(&*store, &[("keep.txt", b"k"), ("gone.txt", b"g")]).await;
    let disk = tempfile::tempdir().unwrap();
    let workspaces = std::fs::canonicalize(disk.path()).unwrap();
    let (sync, ws) = TreeSync::open(store.clone(), &workspaces, &root, 64, true)
        .await
        .unwrap();
    assert_eq!(std::fs::read(ws.root().join("keep.txt")).unwrap(), b"k");
    // Nothing changed: nothing to commit, nothing asked of the store.
    assert!(sync.collect().await.unwrap().changes.is_empty());

    ws.write("tool.txt", b"by a tool", LIMITS).await.unwrap();
    let p = sync.collect().await.unwrap();
    let paths: Vec<_> = p.changes.iter().map(|c| c.path.clone()).collect();
    assert_eq!(paths, vec!["tool.txt"]);
    // A small content rides on the commit: nothing is uploaded before it.
    let key = p.changes[0].blob.clone().unwrap().sha256;
    assert_eq!(p.blobs.len(), 1);
    assert_eq!(p.blobs[0].0, key);
    assert_eq!(p.blobs[0].1.as_slice(), b"by a tool");
    assert!(store.get_blob(&key).await.unwrap().is_none());
    sync.committed(p);

    // A shell command changed things behind the tools' back: a rescan finds them. A file
    // over the size cap, a link and a hard-linked file are not committed.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"outside").unwrap();
    std::fs::write(ws.root().join("shell.txt"), b"by a shell").unwrap();
    std::fs::remove_file(ws.root().join("gone.txt")).unwrap();
    std::fs::write(ws.root().join("big.bin"), vec![0u8; 65]).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), ws.root().join("link")).unwrap();
    std::fs::hard_link(outside.path().join("secret"), ws.root().join("hard")).unwrap();
    ws.forget_usage();
    let p = sync.collect().await.unwrap();
    let mut got: Vec<(String, bool)> = p
        .changes
        .iter()
        .map(|c| (c.path.clone(), c.blob.is_some()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![("gone.txt".into(), false), ("shell.txt".into(), true)]
    );
    sync.not_committed(p);
    // Not committed: taken again by the next commit.
    let p = sync.collect().await.unwrap();
    assert_eq!(p.changes.len(), 2);
    sync.committed(p);
    // Committed: nothing left, and a rescan with nothing new finds nothing.
    ws.forget_usage();
    assert!(sync.collect().await.unwrap().changes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_carries_a_bounded_number_of_contents() {
    let (_d, store) = store().await;
    let root = tree(&*store, &[]).await;
    let disk = tempfile::tempdir().unwrap();
    let workspaces = std::fs::canonicalize(disk.path()).unwrap();
    let (sync, ws) = TreeSync::open(store.clone(), &workspaces, &root, 64, true)
        .await
        .unwrap();
    // A command wrote many tiny files: some ride on the commit, the rest are uploaded
    // before it, and every one is in the change set.
    std::fs::create_dir_all(ws.root()).unwrap();
    for i in 0..300 {
        std::fs::write(ws.root().join(format!("f{i}.txt")), format!("{i}")).unwrap();
    }
    ws.forget_usage();
    let p = sync.collect().await.unwrap();
    assert_eq!(p.changes.len(), 300);
    assert_eq!(p.blobs.len(), 256);
    let carried: std::collections::BTreeSet<&str> =
        p.blobs.iter().map(|(k, _)| k.as_str()).collect();
    let mut uploaded = 0;
    for c in &p.changes {
        let key = &c.blob.as_ref().unwrap().sha256;
        if !carried.contains(key.as_str()) {
            assert!(store.get_blob(key).await.unwrap().is_some());
            uploaded += 1;
        }
    }
    assert_eq!(uploaded, 44);
}

/// Commit `p`'s changes to the store as the session's next checkpoint, as its worker's
/// checkpointer does.
async fn commit(
    store: &dyn Store,
    lease: &agentq_core::Lease,
    state: &mut agentq_agent::state::SessionState,
    p: &agentq_worker::workspace::Pending,
) {
    let from = state.messages.len();
    state
        .messages
        .push(agentq_agent::schema::Message::assistant("x"));
    let cp = agentq_core::Checkpoint::new(lease, state, from)
        .unwrap()
        .with_files(p.changes.clone(), p.blobs.clone());
    for r in store.checkpoint_batch(&[&cp]).await.unwrap() {
        r.unwrap();
    }
}

/// One tree open on two machines (two workspace roots), and a lease on its root session to
/// commit what either changes, as its workers' checkpointers do.
struct TwoMachines {
    lease: agentq_core::Lease,
    state: agentq_agent::state::SessionState,
    a: TreeSync,
    wa: agentq_agent::tools::LocalWorkspace,
    b: TreeSync,
    wb: agentq_agent::tools::LocalWorkspace,
    /// Machine A's workspace root (to open another session of the tree there).
    a_root: std::path::PathBuf,
    _disks: (tempfile::TempDir, tempfile::TempDir),
}

async fn two_machines(store: &Arc<dyn Store>, root: &str) -> TwoMachines {
    let (lease, state) = match store
        .claim(root, "b", std::time::Duration::from_secs(30), 10)
        .await
        .unwrap()
    {
        agentq_core::Claim::Acquired { lease, state, .. } => (lease, *state),
        other => panic!("{other:?}"),
    };
    let disks = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a_root = std::fs::canonicalize(disks.0.path()).unwrap();
    let b_root = std::fs::canonicalize(disks.1.path()).unwrap();
    let (a, wa) = TreeSync::open(store.clone(), &a_root, root, 1 << 20, true)
        .await
        .unwrap();
    let (b, wb) = TreeSync::open(store.clone(), &b_root, root, 1 << 20, true)
        .await
        .unwrap();
    TwoMachines {
        lease,
        state,
        a,
        wa,
        b,
        wb,
        a_root,
        _disks: disks,
    }
}

/// Two machines of one tree: what one commits reaches the other's running session when it
/// refreshes (changed, added and deleted files), while a change made on the refreshing
/// machine and not committed yet is left as it is, on a path both changed too; a second
/// session of the tree opened on that machine brings in the news the same way, without
/// undoing the first one's work. A tree nobody changed elsewhere costs no file operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_session_brings_in_what_another_machine_committed() {
    use agentq_worker::workspace::Refreshed;
    let (_d, store) = store().await;
    let root = tree(
        &*store,
        &[
            ("shared.txt", b"v1"),
            ("doomed.txt", b"d"),
            ("both.txt", b"b1"),
            ("sub/gone.txt", b"g"),
        ],
    )
    .await;
    let TwoMachines {
        lease,
        mut state,
        a,
        wa,
        b,
        wb,
        a_root,
        _disks,
    } = two_machines(&store, &root).await;
    assert_eq!(a.refresh().await.unwrap(), Refreshed::default());

    // Machine B changes, adds and deletes, and commits.
    wb.write("shared.txt", b"v2 from b", LIMITS).await.unwrap();
    wb.write("new/from_b.txt", b"new from b", LIMITS)
        .await
        .unwrap();
    wb.write("both.txt", b"b from b", LIMITS).await.unwrap();
    std::fs::remove_file(wb.root().join("doomed.txt")).unwrap();
    std::fs::remove_file(wb.root().join("sub/gone.txt")).unwrap();
    wb.forget_usage();
    let p = b.collect().await.unwrap();
    assert_eq!(p.changes.len(), 5);
    commit(&*store, &lease, &mut state, &p).await;
    b.committed(p);

    // Machine A's session changed a path B changed too, and wrote one of its own; neither
    // is committed yet.
    wa.write("both.txt", b"b from a", LIMITS).await.unwrap();
    wa.write("local.txt", b"mine", LIMITS).await.unwrap();
    let r = a.refresh().await.unwrap();
    assert_eq!(
        r,
        Refreshed {
            fetched: 2,
            deleted: 2,
            kept_local: 1
        }
    );
    let on_a = |p: &str| std::fs::read(a_root.join(&root).join(p)).ok();
    assert_eq!(on_a("shared.txt").unwrap(), b"v2 from b");
    assert_eq!(on_a("new/from_b.txt").unwrap(), b"new from b");
    assert_eq!(on_a("both.txt").unwrap(), b"b from a");
    assert_eq!(on_a("local.txt").unwrap(), b"mine");
    assert!(on_a("doomed.txt").is_none());
    assert!(!a_root.join(&root).join("sub").exists());
    // What was brought in is not a change of A's: only its own are left to commit, and
    // the path both changed becomes A's, the last writer.
    let p = a.collect().await.unwrap();
    let mut paths: Vec<_> = p.changes.iter().map(|c| c.path.clone()).collect();
    paths.sort();
    assert_eq!(paths, vec!["both.txt", "local.txt"]);
    commit(&*store, &lease, &mut state, &p).await;
    a.committed(p);
    assert_eq!(a.refresh().await.unwrap(), Refreshed::default());

    // B commits again while A's first session has a change of its own pending; a second
    // session of the tree opened on A brings the news in and leaves that change alone.
    wb.write("shared.txt", b"v3 from b", LIMITS).await.unwrap();
    let p = b.collect().await.unwrap();
    commit(&*store, &lease, &mut state, &p).await;
    b.committed(p);
    wa.write("pending.txt", b"not committed", LIMITS)
        .await
        .unwrap();
    let (_a2, _wa2) = TreeSync::open(store.clone(), &a_root, &root, 1 << 20, true)
        .await
        .unwrap();
    assert_eq!(on_a("shared.txt").unwrap(), b"v3 from b");
    assert_eq!(on_a("pending.txt").unwrap(), b"not committed");
    let p = a.collect().await.unwrap();
    let paths: Vec<_> = p.changes.iter().map(|c| c.path.clone()).collect();
    assert_eq!(paths, vec!["pending.txt"]);
}

/// A command on one machine planted links in the shared directory (a subdirectory, then
/// the tree's directory itself, pointing outside). Bringing in another machine's commits
/// never writes or deletes through them, a rescan commits nothing reached through them,
/// and the next claim replaces the linked directory with a real one, leaving the target
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_planted_in_the_workspace_are_never_written_through() {
    use agentq_worker::workspace::Refreshed;
    let (_d, store) = store().await;
    let root = tree(&*store, &[("sub/kept.txt", b"k")]).await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("kept.txt"), b"k").unwrap();
    let TwoMachines {
        lease,
        mut state,
        a,
        wa,
        b,
        wb,
        a_root,
        _disks,
    } = two_machines(&store, &root).await;

    // On A, `sub` becomes a link outside; B changes and adds files under `sub`.
    let a_dir = wa.root().to_path_buf();
    std::fs::remove_dir_all(a_dir.join("sub")).unwrap();
    std::os::unix::fs::symlink(outside.path(), a_dir.join("sub")).unwrap();
    wb.write("sub/new.txt", b"from b", LIMITS).await.unwrap();
    std::fs::remove_file(wb.root().join("sub/kept.txt")).unwrap();
    wb.forget_usage();
    let p = b.collect().await.unwrap();
    commit(&*store, &lease, &mut state, &p).await;
    b.committed(p);
    let r = a.refresh().await.unwrap();
    assert_eq!(
        r,
        Refreshed {
            fetched: 0,
            deleted: 0,
            kept_local: 2
        }
    );
    assert!(!outside.path().join("new.txt").exists());
    assert_eq!(
        std::fs::read(outside.path().join("kept.txt")).unwrap(),
        b"k"
    );

    // The tree's directory itself replaced by a link: a rescan commits nothing of what
    // it points to, only that the tree's files are gone.
    std::fs::remove_file(a_dir.join("sub")).unwrap();
    std::fs::remove_dir_all(&a_dir).unwrap();
    std::os::unix::fs::symlink(outside.path(), &a_dir).unwrap();
    wa.forget_usage();
    let p = a.collect().await.unwrap();
    let got: Vec<(String, bool)> = p
        .changes
        .iter()
        .map(|c| (c.path.clone(), c.blob.is_some()))
        .collect();
    assert_eq!(got, vec![("sub/kept.txt".to_string(), false)]);
    a.not_committed(p);
    drop((a, wa));
    // The next claim here makes it a real directory again, from the manifest.
    let (_a, wa) = TreeSync::open(store.clone(), &a_root, &root, 1 << 20, true)
        .await
        .unwrap();
    assert!(std::fs::symlink_metadata(wa.root()).unwrap().is_dir());
    assert_eq!(
        std::fs::read(wa.root().join("sub/new.txt")).unwrap(),
        b"from b"
    );
    assert_eq!(
        std::fs::read(outside.path().join("kept.txt")).unwrap(),
        b"k"
    );
    assert!(!outside.path().join("new.txt").exists());
}

/// A command planted a link (and a hard link) where a refresh puts its temporary file
/// (`.agentq-<name>.tmp`, beside the path): bringing in another machine's commit of that
/// path writes neither the link's target nor the hard-linked file outside the workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_never_writes_through_a_link_planted_at_its_temporary_file() {
    use agentq_worker::workspace::Refreshed;
    let (_d, store) = store().await;
    let root = tree(&*store, &[("a.txt", b"a1"), ("b.txt", b"b1")]).await;
    let TwoMachines {
        lease,
        mut state,
        a,
        wa,
        b,
        wb,
        a_root,
        _disks,
    } = two_machines(&store, &root).await;
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim.txt");
    // Beside the tree's directory, outside it.
    let hard = a_root.join("hard.txt");
    std::fs::write(&victim, b"untouched").unwrap();
    std::fs::write(&hard, b"untouched").unwrap();

    // On A, a command plants a link and a hard link at the temporary names.
    let a_dir = wa.root().to_path_buf();
    std::os::unix::fs::symlink(&victim, a_dir.join(".agentq-a.txt.tmp")).unwrap();
    std::fs::hard_link(&hard, a_dir.join(".agentq-b.txt.tmp")).unwrap();
    wb.write("a.txt", b"a2 from b", LIMITS).await.unwrap();
    wb.write("b.txt", b"b2 from b", LIMITS).await.unwrap();
    let p = b.collect().await.unwrap();
    commit(&*store, &lease, &mut state, &p).await;
    b.committed(p);

    let r = a.refresh().await.unwrap();
    assert_eq!(
        r,
        Refreshed {
            fetched: 2,
            deleted: 0,
            kept_local: 0
        }
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"untouched");
    assert_eq!(std::fs::read(&hard).unwrap(), b"untouched");
    assert_eq!(std::fs::read(a_dir.join("a.txt")).unwrap(), b"a2 from b");
    assert_eq!(std::fs::read(a_dir.join("b.txt")).unwrap(), b"b2 from b");
}

/// While a refresh fetches many files another machine committed, this machine's session
/// writes one of them (the last fetched): that write, made after the refresh looked at the
/// disk, is still a local change and is not overwritten by the older committed contents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_leaves_alone_a_path_written_here_while_it_fetched() {
    let (_d, store) = store().await;
    let mut files: Vec<(String, Vec<u8>)> = (0..1500)
        .map(|i| (format!("f{i:04}.txt"), b"old".to_vec()))
        .collect();
    files.push(("zzz.txt".to_string(), b"old".to_vec()));
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, d)| (p.as_str(), d.as_slice()))
        .collect();
    let root = tree(&*store, &refs).await;
    let TwoMachines {
        lease,
        mut state,
        a,
        wa,
        b,
        wb,
        a_root: _,
        _disks,
    } = two_machines(&store, &root).await;
    for (p, _) in &files {
        wb.write(p, format!("{p} from b").as_bytes(), LIMITS)
            .await
            .unwrap();
    }
    let p = b.collect().await.unwrap();
    commit(&*store, &lease, &mut state, &p).await;
    b.committed(p);

    let a = Arc::new(a);
    let refreshing = tokio::spawn({
        let a = a.clone();
        async move { a.refresh().await.unwrap() }
    });
    // Spun on, yielding to the runtime between looks, not waited for with a backoff: the
    // write must land while the refresh still fetches the 1,500 others. Nothing announces
    // the first file's placement, and the spin ends with it. A refresh that failed ends
    // the spin too (its error is reported below).
    let first = wa.root().join("f0000.txt");
    while std::fs::read(&first).unwrap() == b"old" && !refreshing.is_finished() {
        tokio::task::yield_now().await;
    }
    wa.write("zzz.txt", b"mine", LIMITS).await.unwrap();
    let r = refreshing.await.unwrap();
    assert_eq!(std::fs::read(wa.root().join("zzz.txt")).unwrap(), b"mine");
    assert_eq!(r.kept_local, 1);
    let p = a.collect().await.unwrap();
    let got: Vec<_> = p.changes.iter().map(|c| c.path.clone()).collect();
    assert_eq!(got, vec!["zzz.txt"]);
}
