//! Bringing in what the tree's sessions elsewhere committed while a session runs here
//! ([`refresh`]), without touching a change made here and not committed yet.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use tracing::warn;

use agentq_agent::tools::LocalWorkspace;
use agentq_core::Store;
use agentq_core::workspace::{FileEntry, valid_path};

use super::disk::{blocking, mtime_ns};
use super::error::Error;
use super::fetch::fetch_and_place;
use super::index::{Index, Indexed, TreeCache};

/// What a refresh (`TreeSync::refresh`) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// Files committed elsewhere, fetched and placed here.
    pub fetched: usize,
    /// Files deleted elsewhere, deleted here.
    pub deleted: usize,
    /// Paths changed elsewhere that were left as they are here (changed here too).
    pub kept_local: usize,
}

/// The work of `TreeSync::refresh` on the tree `root_id`, whose cache here is `cache` and
/// whose session's workspace is `workspace`.
pub(super) async fn refresh(
    store: &dyn Store,
    root_id: &str,
    cache: &Arc<TreeCache>,
    workspace: &LocalWorkspace,
) -> Result<Refreshed, Error> {
    // The index first: a commit here between the two reads then looks like a local
    // change (kept), never like a stale entry to overwrite with the older manifest.
    let index = cache.index().clone();
    let manifest = store.workspace_files(root_id).await?;
    let wanted: BTreeMap<&str, &FileEntry> =
        manifest.iter().map(|f| (f.path.as_str(), f)).collect();
    let updates: Vec<FileEntry> = manifest
        .iter()
        .filter(|f| index.get(&f.path).is_none_or(|i| i.sha256 != f.sha256))
        .cloned()
        .collect();
    let deletes: Vec<(String, Indexed)> = index
        .iter()
        .filter(|(p, _)| !wanted.contains_key(p.as_str()))
        .map(|(p, i)| (p.clone(), i.clone()))
        .collect();
    if updates.is_empty() && deletes.is_empty() {
        return Ok(Refreshed::default());
    }
    let (fetch, deleted, mut kept_local) = {
        let dir = cache.dir.clone();
        let index = index.clone();
        blocking(move || Ok(refresh_plan(&dir, &index, updates, deletes))).await?
    };
    // Checked again just before each write: the fetch takes time, and this session's
    // tools and the tree's other sessions here (their commands, their commits) may
    // have changed the path (or planted a link on the way) meanwhile; such a change is
    // theirs to commit.
    let was: Index = fetch
        .iter()
        .filter_map(|f| index.get(&f.path).map(|i| (f.path.clone(), i.clone())))
        .collect();
    let (placed, changed_here) = fetch_and_place(store, &cache.dir, &fetch, move |dir, f| {
        as_indexed(dir, &f.path, was.get(&f.path))
    })
    .await?;
    kept_local = kept_local.saturating_add(changed_here);
    let fetched = placed.len();
    let snapshot = {
        // An entry a commit here changed meanwhile is that commit's.
        let mut now = cache.index();
        for (path, entry) in placed {
            if now.get(&path) == index.get(&path) {
                now.insert(path, entry);
            }
        }
        for path in &deleted {
            if now.get(path) == index.get(path) {
                now.remove(path);
            }
        }
        now.clone()
    };
    if fetched > 0 {
        workspace.mark_made();
        workspace.forget_size();
    }
    let cache = cache.clone();
    if let Err(e) = blocking(move || cache.save(&snapshot)).await {
        warn!(error = %e, "saving the workspace index failed; the next claim checks every file");
    }
    Ok(Refreshed {
        fetched,
        deleted: deleted.len(),
        kept_local,
    })
}

/// Of the paths the manifest changed (`updates`) or dropped (`deletes`) since the index,
/// those the disk still holds as indexed: the entries to fetch, and the paths deleted here
/// (done). The rest were changed here and are left alone; how many is the third answer.
fn refresh_plan(
    dir: &Path,
    index: &Index,
    updates: Vec<FileEntry>,
    deletes: Vec<(String, Indexed)>,
) -> (Vec<FileEntry>, Vec<String>, usize) {
    let mut kept_local = 0usize;
    let mut fetch = Vec::new();
    for f in updates {
        if valid_path(&f.path) && as_indexed(dir, &f.path, index.get(&f.path)) {
            fetch.push(f);
        } else {
            kept_local = kept_local.saturating_add(1);
        }
    }
    let mut deleted = Vec::new();
    for (rel, i) in deletes {
        let path = dir.join(&rel);
        if valid_path(&rel)
            && as_indexed(dir, &rel, Some(&i))
            && std::fs::remove_file(&path).is_ok()
        {
            if let Some(parent) = path.parent()
                && parent != dir
            {
                // A directory emptied by the deletion goes too (as on the other machine).
                let _ = std::fs::remove_dir(parent);
            }
            deleted.push(rel);
        } else {
            kept_local = kept_local.saturating_add(1);
        }
    }
    (fetch, deleted, kept_local)
}

/// Whether the disk holds at `rel` what the index says was committed there (`indexed`),
/// or nothing for a path the index does not know, reached through real directories only
/// (through a link a command made here, `sub -> /elsewhere`, a path would name a file
/// outside the workspace).
fn as_indexed(dir: &Path, rel: &str, indexed: Option<&Indexed>) -> bool {
    if !real_dirs_to(dir, rel) {
        return false;
    }
    let meta = std::fs::symlink_metadata(dir.join(rel));
    match (meta, indexed) {
        (Err(e), None) => e.kind() == std::io::ErrorKind::NotFound,
        (Ok(m), Some(i)) => {
            m.file_type().is_file()
                && m.nlink() == 1
                && m.len() == i.size
                && mtime_ns(&m) == i.mtime_ns
        }
        _ => false,
    }
}

/// Whether every directory on the way from `dir` (itself included) to `rel` is a real
/// directory or not there yet: no link (nor file) stands where one of them belongs.
fn real_dirs_to(dir: &Path, rel: &str) -> bool {
    let mut at = dir.to_path_buf();
    let parents = rel.rsplit_once('/').map_or("", |(p, _)| p);
    let steps = std::iter::once("").chain(parents.split('/').filter(|s| !s.is_empty()));
    for step in steps {
        if !step.is_empty() {
            at.push(step);
        }
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            _ => return false,
        }
    }
    true
}
