//! A session's side of its tree's workspace ([`TreeSync`]): opened on claim (materialised,
//! or refreshed when another session of the tree runs here), and at each checkpoint the
//! changes since the last one found, their contents uploaded, and the index updated once
//! they are committed ([`Pending`]).

use std::path::Path;
use std::sync::Arc;

use tracing::warn;

use agentq_agent::tools::{Changes, LocalWorkspace};
use agentq_core::Store;
use agentq_core::workspace::{BlobRef, FileChange};

use super::changes::{Found, find_changes};
use super::disk::blocking;
use super::error::{Error, io};
use super::index::{Indexed, Opened, TreeCache, open_cache};
use super::materialise::materialise_into;
use super::refresh::{Refreshed, refresh};
use super::upload::upload;

/// A session's side of its tree's workspace: the changes to commit with its checkpoints.
pub struct TreeSync {
    store: Arc<dyn Store>,
    root_id: String,
    workspace: LocalWorkspace,
    cache: Arc<TreeCache>,
    max_file_bytes: u64,
}

/// Changes found and uploaded, to commit with a checkpoint.
#[derive(Debug, Default)]
pub struct Pending {
    pub changes: Vec<FileChange>,
    /// Contents of `changes` the commit carries itself (not uploaded before it).
    pub blobs: Vec<(String, Arc<Vec<u8>>)>,
    /// The index as it will be once the changes are committed (the paths they touch).
    index: Vec<(String, Option<Indexed>)>,
    /// What was taken from the workspace's record, put back if the commit fails.
    taken: Changes,
}

impl TreeSync {
    /// The workspace of `root_id` for a session claimed here: materialised from the
    /// committed manifest unless another session of the tree runs here already (then the
    /// directory is in use, with changes of that session not committed yet).
    /// `committed`: whether the claim saw committed files in the tree. Without any, and
    /// with nothing on this disk either, there is nothing to restore or undo, and the
    /// manifest is not read (the common case costs no statement).
    pub async fn open(
        store: Arc<dyn Store>,
        workspaces: &Path,
        root_id: &str,
        max_file_bytes: u64,
        committed: bool,
    ) -> Result<(Self, LocalWorkspace), Error> {
        let workspace = LocalWorkspace::lazy(workspaces, root_id).map_err(io(workspaces))?;
        let (cache, opened) = open_cache(workspaces, root_id, committed);
        let sync = TreeSync {
            store,
            root_id: root_id.to_string(),
            workspace: workspace.clone(),
            cache,
            max_file_bytes,
        };
        if opened == Opened::InUse {
            // Another session of the tree runs here: its uncommitted changes stay, and
            // only what sessions elsewhere committed since is brought in.
            sync.refresh().await?;
        } else if opened == Opened::Loaded {
            let done = materialise_into(sync.store.as_ref(), root_id, &sync.cache).await?;
            if done.files > 0 || done.deleted > 0 {
                workspace.mark_made();
            }
            // Whatever the directory held that the manifest does not is undone: nothing
            // is left to commit.
            drop(workspace.take_changes());
        }
        Ok((sync, workspace))
    }

    /// Bring in what sessions of the tree on other machines committed since this cache
    /// last matched the manifest (a background sub-agent's files, when its result
    /// arrives), without touching a change made here and not committed yet, by this
    /// session or by another of the tree running here: a path is replaced or deleted only
    /// where the disk still holds what the index says was committed there (or nothing,
    /// for a path the index does not know). A path changed on both sides keeps the local
    /// change, which its next commit makes the last writer. One manifest read, and no
    /// filesystem call, when nothing changed elsewhere.
    pub async fn refresh(&self) -> Result<Refreshed, Error> {
        refresh(
            self.store.as_ref(),
            &self.root_id,
            &self.cache,
            &self.workspace,
        )
        .await
    }

    /// The changes since the last commit, their new contents uploaded (and every one
    /// touched, so the collector spares them until the commit). Nothing to do, and no
    /// call of any kind, when no tool changed anything.
    pub async fn collect(&self) -> Result<Pending, Error> {
        let taken = self.workspace.take_changes();
        if taken.is_empty() {
            return Ok(Pending::default());
        }
        let found = {
            let dir = self.cache.dir.clone();
            let index = self.cache.index().clone();
            let taken = taken.clone();
            let max = self.max_file_bytes;
            blocking(move || find_changes(&dir, &index, &taken, max)).await
        };
        let found = match found {
            Ok(f) => f,
            Err(e) => {
                self.workspace.restore_changes(taken);
                return Err(e);
            }
        };
        let blobs = match upload(self.store.as_ref(), &self.cache.dir, &found).await {
            Ok(b) => b,
            Err(e) => {
                self.workspace.restore_changes(taken);
                return Err(e);
            }
        };
        let mut pending = Pending {
            taken,
            blobs,
            ..Pending::default()
        };
        for (path, found) in found {
            match found {
                Found::Gone => {
                    pending.changes.push(FileChange {
                        path: path.clone(),
                        blob: None,
                    });
                    pending.index.push((path, None));
                }
                Found::Same(i) => pending.index.push((path, Some(i))),
                Found::Changed(i) => {
                    pending.changes.push(FileChange {
                        path: path.clone(),
                        blob: Some(BlobRef {
                            sha256: i.sha256.clone(),
                            size: i.size,
                        }),
                    });
                    pending.index.push((path, Some(i)));
                }
            }
        }
        Ok(pending)
    }

    /// The changes are committed: the index says so.
    pub fn committed(&self, pending: Pending) {
        if pending.index.is_empty() {
            return;
        }
        let mut index = self.cache.index();
        for (path, entry) in pending.index {
            match entry {
                Some(e) => index.insert(path, e),
                None => index.remove(&path),
            };
        }
        let snapshot = index.clone();
        drop(index);
        if let Err(e) = self.cache.save(&snapshot) {
            warn!(error = %e, "saving the workspace index failed; the next claim checks every file");
        }
    }

    /// The commit did not happen: the changes are taken again by the next one.
    pub fn not_committed(&self, pending: Pending) {
        self.workspace.restore_changes(pending.taken);
    }
}
