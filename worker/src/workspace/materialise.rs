//! Making a tree's directory hold exactly its committed files on claim ([`materialise`]):
//! a file the index and `stat` say is as committed is kept, any other is fetched, and
//! anything the manifest does not hold is deleted, so a change whose commit never happened
//! is undone.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use tracing::warn;

use agentq_core::Store;
use agentq_core::workspace::FileEntry;

use super::disk::{blocking, mtime_ns, walk};
use super::error::{Error, io};
use super::fetch::fetch_and_place;
use super::index::{Index, TreeCache};

/// What [`materialise`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Materialised {
    /// Files of the manifest.
    pub files: usize,
    /// Fetched from the store (missing or different here).
    pub fetched: usize,
    /// Deleted here (not in the manifest).
    pub deleted: usize,
}

/// Make `dir` hold exactly the committed files of the tree `root_id`: a file the index
/// and `stat` say is as committed is kept, any other is fetched, anything the manifest
/// does not hold is deleted. `index_path` is the tree's local index (read, then
/// rewritten). Public for the benchmark, which times it cold and warm.
pub async fn materialise(
    store: &dyn Store,
    root_id: &str,
    dir: &Path,
    index_path: &Path,
) -> Result<Materialised, Error> {
    let cache = Arc::new(TreeCache::load(dir.to_path_buf(), index_path.to_path_buf()));
    materialise_into(store, root_id, &cache).await
}

pub(super) async fn materialise_into(
    store: &dyn Store,
    root_id: &str,
    cache: &Arc<TreeCache>,
) -> Result<Materialised, Error> {
    let manifest = store.workspace_files(root_id).await?;
    if manifest.is_empty() && std::fs::symlink_metadata(&cache.dir).is_err() {
        // Nothing committed and nothing here: the directory is made when first written.
        return Ok(Materialised::default());
    }
    let plan = {
        let cache = cache.clone();
        let manifest = manifest.clone();
        blocking(move || plan(&cache, &manifest)).await?
    };
    let mut index = plan.kept;
    let wanted: Vec<FileEntry> = manifest
        .iter()
        .filter(|f| plan.fetch.contains(&f.path))
        .cloned()
        .collect();
    // No other session of the tree runs here: nothing changes the directory meanwhile.
    let (written, _) = fetch_and_place(store, &cache.dir, &wanted, |_, _| true).await?;
    let fetched = written.len();
    index.extend(written);
    let saved = {
        let cache = cache.clone();
        let index = index.clone();
        blocking(move || cache.save(&index)).await
    };
    if let Err(e) = saved {
        warn!(error = %e, "saving the workspace index failed; the next claim checks every file");
    }
    *cache.index() = index;
    Ok(Materialised {
        files: manifest.len(),
        fetched,
        deleted: plan.deleted,
    })
}

/// What materialising must do, found on disk.
struct Plan {
    /// The index entries of files already as committed.
    kept: Index,
    /// Paths to fetch.
    fetch: BTreeSet<String>,
    deleted: usize,
}

/// Delete the files and links the manifest does not hold (the manifest holds regular
/// files only, so afterwards no link is left to write through), and find what to fetch.
/// Special files (pipes, sockets) hold no content to commit or to undo and are left alone,
/// unless a committed file takes their place.
fn plan(cache: &TreeCache, manifest: &[FileEntry]) -> Result<Plan, Error> {
    let dir = &cache.dir;
    // A command may have put a link (or a file) where the tree's directory is: the link
    // goes, not what it points to, and a real directory takes its place.
    if std::fs::symlink_metadata(dir).is_ok_and(|m| !m.is_dir()) {
        std::fs::remove_file(dir).map_err(io(dir))?;
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let old = cache.index().clone();
    let wanted: BTreeMap<&str, &FileEntry> =
        manifest.iter().map(|f| (f.path.as_str(), f)).collect();
    let mut kept = Index::new();
    let mut deleted = 0usize;
    for (rel, meta) in walk(dir)? {
        let path = dir.join(&rel);
        let keep = meta.file_type().is_file()
            && meta.nlink() == 1
            && wanted.get(rel.as_str()).is_some_and(|f| {
                old.get(&rel).is_some_and(|i| {
                    i.sha256 == f.sha256 && i.size == meta.len() && i.mtime_ns == mtime_ns(&meta)
                })
            });
        if keep {
            if let Some(i) = old.get(&rel) {
                kept.insert(rel, i.clone());
            }
            continue;
        }
        let ft = meta.file_type();
        if !ft.is_file() && !ft.is_symlink() && !wanted.contains_key(rel.as_str()) {
            continue;
        }
        if wanted.contains_key(rel.as_str()) && meta.file_type().is_file() && meta.nlink() == 1 {
            // Replaced (through a rename) when fetched.
            continue;
        }
        std::fs::remove_file(&path).map_err(io(&path))?;
        deleted = deleted.saturating_add(1);
    }
    let fetch = manifest
        .iter()
        .filter(|f| !kept.contains_key(&f.path))
        .map(|f| f.path.clone())
        .collect();
    Ok(Plan {
        kept,
        fetch,
        deleted,
    })
}
