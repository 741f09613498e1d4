//! The local index of a tree's files (`workspace_root/.index/<root_id>.json`: each file's
//! size, modification time and hash as last committed or materialised), and the cache of
//! each tree in this process ([`TreeCache`]), shared by every session of the tree that
//! runs here.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};

use super::error::{Error, io};

/// What the index knows of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Indexed {
    pub(super) size: u64,
    pub(super) mtime_ns: i64,
    pub(super) sha256: String,
}

pub(super) type Index = BTreeMap<String, Indexed>;

/// The cache of one tree in this process, shared by every session of the tree that runs
/// here.
#[derive(Debug)]
pub struct TreeCache {
    pub(super) dir: PathBuf,
    index_path: PathBuf,
    index: Mutex<Index>,
}

impl TreeCache {
    pub(super) fn load(dir: PathBuf, index_path: PathBuf) -> Self {
        // An unreadable index is an empty one: every file is then checked by its hash.
        let index = std::fs::read(&index_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        TreeCache {
            dir,
            index_path,
            index: Mutex::new(index),
        }
    }

    /// A cache whose index is empty, without reading the one on disk.
    fn empty(dir: PathBuf, index_path: PathBuf) -> Self {
        TreeCache {
            dir,
            index_path,
            index: Mutex::new(Index::new()),
        }
    }

    pub(super) fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write the index next to the directory (through a rename, so a crash leaves the old
    /// one or the new one).
    pub(super) fn save(&self, index: &Index) -> Result<(), Error> {
        if let Some(parent) = self.index_path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let tmp = self.index_path.with_extension("json.tmp");
        let bytes = serde_json::to_vec(index).map_err(|e| Error::Data(e.to_string()))?;
        std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &self.index_path).map_err(io(&self.index_path))?;
        Ok(())
    }
}

impl Drop for TreeCache {
    /// The last session of the tree here is gone: its entry leaves the registry, which so
    /// holds live trees only without a sweep over all of them at every session's start.
    fn drop(&mut self) {
        let mut all = registry().lock().unwrap_or_else(|e| e.into_inner());
        // A cache loaded outside the registry (materialising for another process) may share
        // the directory of a live one: only a dead entry goes.
        if all
            .get(self.dir.as_os_str())
            .is_some_and(|c| c.strong_count() == 0)
        {
            all.remove(self.dir.as_os_str());
        }
    }
}

/// The live caches of this process, by directory: its bytes, which compare as bytes
/// (a path compares component by component, parsing both at every step of a search).
fn registry() -> &'static Mutex<BTreeMap<OsString, Weak<TreeCache>>> {
    static TREES: std::sync::LazyLock<Mutex<BTreeMap<OsString, Weak<TreeCache>>>> =
        std::sync::LazyLock::new(Mutex::default);
    &TREES
}

/// How a session finds its tree's cache when it opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Opened {
    /// Another session of the tree holds it already in this process.
    InUse,
    /// Nothing on this disk and nothing committed: there is nothing to restore or undo.
    Nothing,
    /// Loaded from this disk, to be brought to what is committed.
    Loaded,
}

/// The cache of the tree `root_id` under `workspaces` (canonical), and how it was found.
/// `committed`: whether the tree has committed files. Without any, and without the
/// directory, the index on disk is not read: with nothing committed it can only be empty
/// or left over, and a session that writes nothing (the most) pays one file-system call.
pub(super) fn open_cache(
    workspaces: &Path,
    root_id: &str,
    committed: bool,
) -> (Arc<TreeCache>, Opened) {
    let dir = workspaces.join(root_id);
    let mut all = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cache) = all.get(dir.as_os_str()).and_then(Weak::upgrade) {
        return (cache, Opened::InUse);
    }
    let index_path = workspaces.join(".index").join([root_id, ".json"].concat());
    let (cache, opened) = if !committed && std::fs::symlink_metadata(&dir).is_err() {
        (TreeCache::empty(dir.clone(), index_path), Opened::Nothing)
    } else {
        (TreeCache::load(dir.clone(), index_path), Opened::Loaded)
    };
    let cache = Arc::new(cache);
    all.insert(dir.into_os_string(), Arc::downgrade(&cache));
    (cache, opened)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn registered(dir: &Path) -> bool {
        registry().lock().unwrap().contains_key(dir.as_os_str())
    }

    #[test]
    fn a_tree_leaves_the_registry_with_its_last_session() {
        let root = tempfile::tempdir().unwrap();
        let (first, found) = open_cache(root.path(), "tree-a", false);
        assert_eq!(found, Opened::Nothing);
        let (second, found) = open_cache(root.path(), "tree-a", false);
        assert_eq!(found, Opened::InUse);
        assert!(Arc::ptr_eq(&first, &second));
        let dir = root.path().join("tree-a");
        // Another copy of the directory's cache, outside the registry, leaves it alone.
        drop(TreeCache::load(dir.clone(), root.path().join("other.json")));
        drop(first);
        assert!(registered(&dir));
        drop(second);
        assert!(!registered(&dir));
        // Opened again, it is a fresh cache, registered again.
        let (again, found) = open_cache(root.path(), "tree-a", true);
        assert_eq!(found, Opened::Loaded);
        assert!(registered(&dir));
        drop(again);
        assert!(!registered(&dir));
    }

    /// With nothing committed and no directory, an index left on disk is not read (it
    /// could only name files that are not there); with committed files it is.
    #[test]
    fn a_tree_with_nothing_committed_and_no_directory_starts_empty() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join(".index")).unwrap();
        let left: Index = [(
            "a.txt".to_string(),
            Indexed {
                size: 1,
                mtime_ns: 1,
                sha256: "x".into(),
            },
        )]
        .into();
        std::fs::write(
            root.path().join(".index").join("tree-b.json"),
            serde_json::to_vec(&left).unwrap(),
        )
        .unwrap();
        let (cache, found) = open_cache(root.path(), "tree-b", false);
        assert_eq!(found, Opened::Nothing);
        assert!(cache.index().is_empty());
        drop(cache);
        let (cache, found) = open_cache(root.path(), "tree-b", true);
        assert_eq!(found, Opened::Loaded);
        assert_eq!(*cache.index(), left);
    }
}
