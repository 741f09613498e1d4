//! The steps the workspace cases are written in: sessions created with input files, a
//! child in its parent's tree, contents uploaded or carried by a checkpoint, steps that
//! commit file changes, a worker fenced off, and the tree's files read back.

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::schema::Message;
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::SessionState;
use agentq_store::Checkpoint;
use agentq_store::store::Store;
use agentq_types::model::{Lease, NewSession, SessionRow};
use agentq_types::workspace::{BlobRef, FileChange, InputFile, sha256_hex};

use crate::common::{Backend, TTL, acquire};

pub fn input(path: &str, data: &[u8]) -> InputFile {
    InputFile {
        path: path.into(),
        data: data.to_vec(),
    }
}

pub fn with_files(prompt: &str, tenant: &str, files: Vec<InputFile>) -> NewSession {
    let mut s = NewSession::root(SessionSpec::new(prompt), "default").with_tenant(tenant);
    s.files = files;
    s
}

/// A root session of the default tenant with `files`, created.
pub async fn create_with_files(
    store: &dyn Store,
    prompt: &str,
    files: Vec<InputFile>,
) -> SessionRow {
    store
        .create_session(&with_files(prompt, "default", files))
        .await
        .unwrap()
        .0
}

/// A root session without files and a child of it: one tree, one workspace.
pub async fn parent_and_child(store: &dyn Store) -> (SessionRow, SessionRow) {
    let parent = create_with_files(store, "parent", vec![]).await;
    let mut child = NewSession::root(SessionSpec::new("child"), "default");
    child.root_id = parent.root_id.clone();
    child.parent_id = Some(parent.id.clone());
    child.depth = 1;
    let (child, _) = store.create_session(&child).await.unwrap();
    (parent, child)
}

/// Upload `data` (as a worker does before its commit) and the change naming it.
pub async fn put(store: &dyn Store, path: &str, data: &[u8]) -> FileChange {
    let key = sha256_hex(data);
    store
        .put_blobs(&[(key.clone(), data.to_vec())])
        .await
        .unwrap();
    FileChange {
        path: path.into(),
        blob: Some(BlobRef {
            sha256: key,
            size: data.len() as u64,
        }),
    }
}

/// A change whose content the checkpoint carries, not stored before.
pub fn carried(path: &str, data: &[u8]) -> (FileChange, (String, Arc<Vec<u8>>)) {
    let key = sha256_hex(data);
    (
        FileChange {
            path: path.into(),
            blob: Some(BlobRef {
                sha256: key.clone(),
                size: data.len() as u64,
            }),
        },
        (key, Arc::new(data.to_vec())),
    )
}

pub fn delete(path: &str) -> FileChange {
    FileChange {
        path: path.into(),
        blob: None,
    }
}

/// A step of `state` that adds one message and commits `files`; the batch's answer.
pub async fn step(
    store: &dyn Store,
    lease: &Lease,
    state: &mut SessionState,
    files: Vec<FileChange>,
) -> agentq_error::Result<()> {
    let from = state.messages.len();
    state
        .messages
        .push(Message::assistant(format!("step {from}")));
    let cp = Checkpoint::new(lease, state, from)
        .unwrap()
        .with_files(files, vec![]);
    store
        .checkpoint_batch(&[&cp])
        .await?
        .pop()
        .unwrap()
        .map(|_| ())
}

/// What one session of a group commit writes: its lease and state, the changes and the
/// contents it carries.
pub type Commit<'a> = (
    &'a Lease,
    &'a mut SessionState,
    Vec<FileChange>,
    Vec<(String, Arc<Vec<u8>>)>,
);

/// One group commit of a step (one message each) per session, every one of which lands.
pub async fn commit_together(store: &dyn Store, commits: Vec<Commit<'_>>) {
    let mut cps = Vec::new();
    for (lease, state, files, blobs) in commits {
        let from = state.messages.len();
        state.messages.push(Message::assistant("x"));
        cps.push(
            Checkpoint::new(lease, state, from)
                .unwrap()
                .with_files(files, blobs),
        );
    }
    let refs: Vec<&Checkpoint> = cps.iter().collect();
    for r in store.checkpoint_batch(&refs).await.unwrap() {
        r.unwrap();
    }
}

/// `lease`'s holder stalls until its lease runs out and `owner` claims the session `id`:
/// the new holder's lease and state.
pub async fn fence_off(
    store: &dyn Backend,
    lease: &Lease,
    id: &str,
    owner: &str,
) -> (Lease, SessionState) {
    store
        .heartbeat(
            &lease.owner,
            std::slice::from_ref(lease),
            Duration::from_millis(1),
        )
        .await
        .unwrap();
    // Past the claim's own expiry too, which covers it until a first heartbeat.
    store.pass(TTL + Duration::from_millis(20)).await;
    acquire(store, id, owner, TTL).await
}

pub async fn paths(store: &dyn Store, root: &str) -> Vec<(String, u64, i64)> {
    store
        .workspace_files(root)
        .await
        .unwrap()
        .into_iter()
        .map(|f| (f.path, f.size, f.modified_at_seq))
        .collect()
}

pub async fn bytes(store: &dyn Store, root: &str, path: &str) -> Option<Vec<u8>> {
    store
        .workspace_file(root, path)
        .await
        .unwrap()
        .map(|(_, data)| data)
}
