//! A tree's durable workspace on this worker: its local directory
//! (`workspace_root/<root_id>`) is only a cache of the tree's committed manifest. On claim
//! the directory is made to match the manifest ([`materialise`]: fetch what is missing or
//! different, delete what the manifest does not hold, so a change whose commit never
//! happened is undone); at each checkpoint the changes made since the last one are found
//! ([`TreeSync::collect`]: the paths the file tools wrote, and after a `shell` command a
//! rescan of the whole tree), their blobs uploaded, and they ride on that checkpoint.
//!
//! A local index beside the directory (`workspace_root/.index/<root_id>.json`) records
//! each file's size, modification time and hash as last committed or materialised, so a
//! warm cache is checked by `stat` alone and a rescan hashes only the files whose size or
//! time changed.
//!
//! Sessions of one tree share its workspace. On one worker they share the directory (a
//! claim does not rebuild a directory another session of the tree is using here); on two
//! workers each claim starts from the latest committed manifest, a running session brings
//! in what the others committed when a sub-agent's result reaches it
//! ([`TreeSync::refresh`], which leaves uncommitted local changes alone), and each commit
//! replaces the paths it changed: the last writer of a path wins.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};
use tracing::warn;

use agentq_agent::tools::{Changes, LocalWorkspace};
use agentq_core::Store;
use agentq_core::workspace::{BlobRef, FileChange, FileEntry, sha256_hex, valid_path};

/// Entries a walk of the directory visits at most.
const WALK_MAX_ENTRIES: usize = 200_000;

/// Bytes of contents one commit carries at most ([`Pending::blobs`]); past this, changed
/// files are uploaded before the commit.
const INLINE_COMMIT_BYTES: u64 = 256 * 1024;
/// Contents one commit carries at most, however small (a command that writes thousands of
/// tiny files uploads most of them first, in batches, instead of growing one statement).
const INLINE_COMMIT_FILES: usize = 256;

/// Bytes of blobs uploaded in one call, at most (more than one file's worth only when
/// files are small).
const UPLOAD_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Blobs fetched at once while materialising.
const FETCH_CONCURRENCY: usize = 8;

/// What went wrong with a workspace: the store (retryable when it is an outage), the local
/// disk, or the stored data itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] agentq_core::Error),
    #[error("workspace {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The manifest names content the store does not hold (or holds other bytes for).
    #[error("workspace: {0}")]
    Data(String),
}

impl Error {
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Store(e) => e.is_retryable(),
            Error::Io { .. } | Error::Data(_) => false,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// What the index knows of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Indexed {
    size: u64,
    mtime_ns: i64,
    sha256: String,
}

type Index = BTreeMap<String, Indexed>;

fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

/// The cache of one tree in this process, shared by every session of the tree that runs
/// here.
#[derive(Debug)]
pub struct TreeCache {
    dir: PathBuf,
    index_path: PathBuf,
    index: Mutex<Index>,
}

impl TreeCache {
    fn load(dir: PathBuf, index_path: PathBuf) -> Self {
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

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write the index next to the directory (through a rename, so a crash leaves the old
    /// one or the new one).
    fn save(&self, index: &Index) -> Result<(), Error> {
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

/// The live caches of this process, by directory.
fn registry() -> &'static Mutex<BTreeMap<PathBuf, Weak<TreeCache>>> {
    static TREES: std::sync::LazyLock<Mutex<BTreeMap<PathBuf, Weak<TreeCache>>>> =
        std::sync::LazyLock::new(Mutex::default);
    &TREES
}

/// The cache of the tree `root_id` under `workspaces` (canonical), and whether another
/// session of the tree holds it already in this process.
fn open_cache(workspaces: &Path, root_id: &str) -> (Arc<TreeCache>, bool) {
    let dir = workspaces.join(root_id);
    let mut all = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cache) = all.get(&dir).and_then(Weak::upgrade) {
        return (cache, true);
    }
    all.retain(|_, c| c.strong_count() > 0);
    let index_path = workspaces.join(".index").join(format!("{root_id}.json"));
    let cache = Arc::new(TreeCache::load(dir.clone(), index_path));
    all.insert(dir, Arc::downgrade(&cache));
    (cache, false)
}

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

/// What [`TreeSync::refresh`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refreshed {
    /// Files committed elsewhere, fetched and placed here.
    pub fetched: usize,
    /// Files deleted elsewhere, deleted here.
    pub deleted: usize,
    /// Paths changed elsewhere that were left as they are here (changed here too).
    pub kept_local: usize,
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

/// Fetch `entries` from the store, [`FETCH_CONCURRENCY`] at a time, and place each under
/// `dir` that `may_place` still allows just before its write (checked off the executor,
/// with the write). The index entries of the files placed, and how many `may_place`
/// refused.
async fn fetch_and_place<F>(
    store: &dyn Store,
    dir: &Path,
    entries: &[FileEntry],
    may_place: F,
) -> Result<(Vec<(String, Indexed)>, usize), Error>
where
    F: Fn(&Path, &FileEntry) -> bool + Send + Sync + 'static,
{
    let may_place = Arc::new(may_place);
    let mut placed = Vec::new();
    let mut refused = 0usize;
    for chunk in entries.chunks(FETCH_CONCURRENCY) {
        let blobs =
            futures::future::try_join_all(chunk.iter().map(|f| fetch_checked(store, f.clone())))
                .await?;
        let dir = dir.to_path_buf();
        let may_place = may_place.clone();
        let (written, skipped) = blocking(move || {
            let mut out = Vec::with_capacity(blobs.len());
            let mut skipped = 0usize;
            for (f, data) in blobs {
                if !may_place(&dir, &f) {
                    skipped = skipped.saturating_add(1);
                    continue;
                }
                if let Some(entry) = place(&dir, &f, &data)? {
                    out.push((f.path, entry));
                }
            }
            Ok((out, skipped))
        })
        .await?;
        placed.extend(written);
        refused = refused.saturating_add(skipped);
    }
    Ok((placed, refused))
}

/// The content of `f` from the store, which must hash to what the manifest says.
async fn fetch_checked(store: &dyn Store, f: FileEntry) -> Result<(FileEntry, Vec<u8>), Error> {
    let data = store.get_blob(&f.sha256).await?.ok_or_else(|| {
        Error::Data(format!(
            "the content of {} ({}) is not stored",
            f.path, f.sha256
        ))
    })?;
    if sha256_hex(&data) != f.sha256 {
        return Err(Error::Data(format!(
            "the stored content of {} is not {}",
            f.path, f.sha256
        )));
    }
    Ok((f, data))
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

async fn materialise_into(
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

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Data(format!("workspace task failed: {e}")))?
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

/// Every entry under `dir` that is not a directory, by relative path (`/`-separated);
/// symlinks are not followed.
fn walk(dir: &Path) -> Result<Vec<(String, std::fs::Metadata)>, Error> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    let mut visited = 0usize;
    while let Some((abs, rel)) = stack.pop() {
        let entries = match std::fs::read_dir(&abs) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&abs)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io(&abs))?;
            visited = visited.saturating_add(1);
            if visited > WALK_MAX_ENTRIES {
                return Err(Error::Data(format!(
                    "{} holds more than {WALK_MAX_ENTRIES} entries",
                    dir.display()
                )));
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let meta = std::fs::symlink_metadata(entry.path()).map_err(io(&entry.path()))?;
            if meta.is_dir() {
                stack.push((entry.path(), child));
            } else {
                out.push((child, meta));
            }
        }
    }
    Ok(out)
}

/// Write one fetched file through a temporary file and a rename (never through whatever
/// is at the path: a hard link would carry the write outside); its index entry.
fn place(dir: &Path, f: &FileEntry, data: &[u8]) -> Result<Option<Indexed>, Error> {
    if !valid_path(&f.path) {
        warn!(path = %f.path.escape_debug(), "a committed path is not a plain relative path; not materialised");
        return Ok(None);
    }
    let path = dir.join(&f.path);
    if let Some(parent) = path.parent()
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        // A file where a directory should be (inputs `a` and `a/b`): the first one wins.
        warn!(path = %f.path, error = %e, "a committed file cannot be placed");
        return Ok(None);
    }
    // A directory left where the file goes (what it held is deleted already): an empty
    // one gives way; one that still holds committed files keeps them.
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
        remove_empty_dirs(&path);
    }
    let tmp = path.with_file_name(format!(
        ".agentq-{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    // Whatever a command left at the temporary name (a link, a hard link to a file
    // elsewhere) goes first, and the file is made new there: never written through.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!(path = %f.path, error = %e, "a committed file cannot be placed");
            return Ok(None);
        }
    }
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut file| std::io::Write::write_all(&mut file, data));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        warn!(path = %f.path, error = %e, "a committed file cannot be placed");
        return Ok(None);
    }
    if let Err(e) = std::fs::rename(&tmp, &path) {
        let _ = std::fs::remove_file(&tmp);
        warn!(path = %f.path, error = %e, "a committed file cannot be placed");
        return Ok(None);
    }
    let meta = std::fs::symlink_metadata(&path).map_err(io(&path))?;
    Ok(Some(Indexed {
        size: meta.len(),
        mtime_ns: mtime_ns(&meta),
        sha256: f.sha256.clone(),
    }))
}

/// Remove `dir` and the directories under it, bottom up, as far as they are empty (links
/// are not followed: a link is an entry, so its directory stays).
fn remove_empty_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

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
        let (cache, in_use) = open_cache(workspaces, root_id);
        let nothing = !committed && std::fs::symlink_metadata(&cache.dir).is_err();
        let sync = TreeSync {
            store,
            root_id: root_id.to_string(),
            workspace: workspace.clone(),
            cache,
            max_file_bytes,
        };
        if in_use {
            // Another session of the tree runs here: its uncommitted changes stay, and
            // only what sessions elsewhere committed since is brought in.
            sync.refresh().await?;
        } else if !nothing {
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
        // The index first: a commit here between the two reads then looks like a local
        // change (kept), never like a stale entry to overwrite with the older manifest.
        let index = self.cache.index().clone();
        let manifest = self.store.workspace_files(&self.root_id).await?;
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
            let dir = self.cache.dir.clone();
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
        let (placed, changed_here) = fetch_and_place(
            self.store.as_ref(),
            &self.cache.dir,
            &fetch,
            move |dir, f| as_indexed(dir, &f.path, was.get(&f.path)),
        )
        .await?;
        kept_local = kept_local.saturating_add(changed_here);
        let fetched = placed.len();
        let snapshot = {
            // An entry a commit here changed meanwhile is that commit's.
            let mut now = self.cache.index();
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
            self.workspace.mark_made();
            self.workspace.forget_size();
        }
        let cache = self.cache.clone();
        if let Err(e) = blocking(move || cache.save(&snapshot)).await {
            warn!(error = %e, "saving the workspace index failed; the next claim checks every file");
        }
        Ok(Refreshed {
            fetched,
            deleted: deleted.len(),
            kept_local,
        })
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
        let blobs = match self.upload(&found).await {
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

    /// The changed contents for the commit to carry (small ones, up to the store's
    /// [`inline limit`](agentq_core::blob::BlobStore::inline_limit) and
    /// [`INLINE_COMMIT_BYTES`] in all), read here; and the others uploaded now, those the
    /// store does not hold yet.
    async fn upload(
        &self,
        found: &[(String, Found)],
    ) -> Result<Vec<(String, Arc<Vec<u8>>)>, Error> {
        let limit = self.store.inline_limit();
        let mut carried: Vec<(String, Arc<Vec<u8>>)> = Vec::new();
        let mut carried_keys = BTreeSet::new();
        let mut carried_bytes = 0u64;
        let mut keys = BTreeSet::new();
        for (path, f) in found {
            let Found::Changed(i) = f else { continue };
            if keys.contains(&i.sha256) || carried_keys.contains(&i.sha256) {
                continue;
            }
            let fits = i.size <= limit
                && carried.len() < INLINE_COMMIT_FILES
                && carried_bytes.saturating_add(i.size) <= INLINE_COMMIT_BYTES;
            if !fits {
                keys.insert(i.sha256.clone());
                continue;
            }
            let data = self.read_checked(path, &i.sha256).await?;
            carried_bytes = carried_bytes.saturating_add(i.size);
            carried_keys.insert(i.sha256.clone());
            carried.push((i.sha256.clone(), Arc::new(data)));
        }
        let keys: Vec<String> = keys.into_iter().collect();
        if keys.is_empty() {
            return Ok(carried);
        }
        let missing: BTreeSet<String> =
            self.store.missing_blobs(&keys).await?.into_iter().collect();
        let mut batch: Vec<(String, Vec<u8>)> = Vec::new();
        let mut bytes = 0usize;
        let mut sent = BTreeSet::new();
        for (path, f) in found {
            let Found::Changed(i) = f else { continue };
            if !missing.contains(&i.sha256) || !sent.insert(i.sha256.clone()) {
                continue;
            }
            let data = self.read_checked(path, &i.sha256).await?;
            bytes = bytes.saturating_add(data.len());
            batch.push((i.sha256.clone(), data));
            if bytes >= UPLOAD_BATCH_BYTES {
                self.store.put_blobs(&batch).await?;
                batch.clear();
                bytes = 0;
            }
        }
        if !batch.is_empty() {
            self.store.put_blobs(&batch).await?;
        }
        Ok(carried)
    }

    /// The bytes of `path`, which must still hash to `sha256`.
    async fn read_checked(&self, path: &str, sha256: &str) -> Result<Vec<u8>, Error> {
        let abs = self.cache.dir.join(path);
        let data = blocking(move || std::fs::read(&abs).map_err(io(&abs))).await?;
        if sha256_hex(&data) != sha256 {
            // Changed again since it was hashed: its later state is the next commit's.
            return Err(Error::Data(format!(
                "{path} changed while it was committed"
            )));
        }
        Ok(data)
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

/// What a changed path is now.
#[derive(Debug)]
enum Found {
    /// Deleted (or no longer a regular file).
    Gone,
    /// As committed (its time changed only).
    Same(Indexed),
    Changed(Indexed),
}

/// The paths `taken` names, and after a rescan every file whose size or time differs from
/// the index and every indexed file that is gone; each hashed. A file that may not be
/// committed (over `max_file_bytes`, several hard links, a path the manifest cannot hold,
/// reached through a link) is left out, with a warning.
fn find_changes(
    dir: &Path,
    index: &Index,
    taken: &Changes,
    max_file_bytes: u64,
) -> Result<Vec<(String, Found)>, Error> {
    if std::fs::symlink_metadata(dir).is_ok_and(|m| !m.is_dir()) {
        // A command replaced the tree's directory with a link (or a file): what is
        // reached through it is not the tree's, and the tree's files are gone.
        warn!(dir = %dir.display(), "the workspace directory is no longer a directory; its files are gone");
        return Ok(index.keys().map(|k| (k.clone(), Found::Gone)).collect());
    }
    let mut candidates: BTreeSet<String> = taken.written.clone();
    if taken.rescan {
        let on_disk = walk(dir)?;
        let present: BTreeSet<&str> = on_disk.iter().map(|(p, _)| p.as_str()).collect();
        for (rel, meta) in &on_disk {
            let same = index
                .get(rel)
                .is_some_and(|i| i.size == meta.len() && i.mtime_ns == mtime_ns(meta));
            if !same {
                candidates.insert(rel.clone());
            }
        }
        for rel in index.keys() {
            if !present.contains(rel.as_str()) {
                candidates.insert(rel.clone());
            }
        }
    }
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut out = Vec::new();
    for rel in candidates {
        if !valid_path(&rel) {
            warn!(path = %rel.escape_debug(), "a file whose path a manifest cannot hold is not committed");
            continue;
        }
        let abs = dir.join(&rel);
        let inside = abs
            .parent()
            .and_then(|p| std::fs::canonicalize(p).ok())
            .is_some_and(|p| p.starts_with(&canonical) && p == canonical.join(parent_of(&rel)));
        let meta = if inside {
            std::fs::symlink_metadata(&abs).ok()
        } else {
            None
        };
        let Some(meta) = meta.filter(|m| m.file_type().is_file()) else {
            if index.contains_key(&rel) {
                out.push((rel, Found::Gone));
            }
            continue;
        };
        if meta.nlink() > 1 {
            warn!(path = %rel, "a file with several hard links is not committed");
            continue;
        }
        if meta.len() > max_file_bytes {
            warn!(path = %rel, size = meta.len(), max_file_bytes, "a file over worker.max_file_bytes is not committed");
            continue;
        }
        let sha256 = match hash_file(&abs, max_file_bytes) {
            Ok(h) => h,
            Err(e) => {
                warn!(path = %rel, error = %e, "a changed file cannot be read; not committed");
                continue;
            }
        };
        let entry = Indexed {
            size: meta.len(),
            mtime_ns: mtime_ns(&meta),
            sha256,
        };
        let found = match index.get(&rel) {
            Some(i) if i.sha256 == entry.sha256 => Found::Same(entry),
            _ => Found::Changed(entry),
        };
        out.push((rel, found));
    }
    Ok(out)
}

fn parent_of(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(p, _)| p)
}

fn hash_file(path: &Path, max: u64) -> std::io::Result<String> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut file = std::fs::File::open(path)?.take(max.saturating_add(1));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest = hasher.finalize();
    Ok(digest.iter().fold(String::with_capacity(64), |mut s, b| {
        use std::fmt::Write as _;
        let _ = write!(s, "{b:02x}");
        s
    }))
}
