//! The workspace file tools act on: the [`Workspace`] trait (kept small so a durable,
//! remote-backed workspace can implement it later), the local-directory implementation
//! [`LocalWorkspace`], and the path confinement every implementation must apply
//! ([`normalize_relative`] lexically, [`LocalWorkspace::resolve`] against symlinks, and
//! hard-linked files refused where they are read or written), and the limits on what a
//! write may put there ([`WriteLimits`]: a cap per file and a quota for the whole tree,
//! both checked before anything is written), and the record of what changed since the
//! last commit ([`Changes`]) that a durable workspace commits.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::error::ToolError;
use super::settings::ToolSettings;

/// Directories a workspace walk never descends into: version-control data and build or
/// dependency trees are huge and almost never what a search is after.
pub const SKIPPED_DIRS: &[&str] = &[".git", "target", "node_modules"];

/// What an entry of a directory listing is. Symlinks are not followed, so a link to a
/// directory is reported as a link, never descended into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One entry of [`Workspace::list`]: a bare name, not a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub kind: EntryKind,
}

/// The result of [`Workspace::walk`]: files under a directory, as paths relative to the
/// workspace root with `/` separators, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalkResult {
    pub files: Vec<String>,
    /// The walk stopped at its entry limit; `files` is incomplete.
    pub truncated: bool,
}

/// Entries a measure of the workspace's size visits at most: a tree with more cannot be
/// measured cheaply, so nothing more is written to it.
pub const MEASURE_MAX_ENTRIES: usize = 200_000;

/// What one write may put in the workspace. Both bounds are checked before anything is
/// written, and a write over either is a [`ToolError`] naming the setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteLimits {
    /// Largest file, in bytes.
    pub max_file_bytes: u64,
    /// Most bytes all files of the workspace together may hold.
    pub quota_bytes: u64,
}

impl WriteLimits {
    pub fn of(settings: &ToolSettings) -> Self {
        WriteLimits {
            max_file_bytes: settings.max_file_bytes,
            quota_bytes: settings.workspace_quota_bytes,
        }
    }

    /// Refuse a file of `len` bytes (`None`: more than any count) before it is built.
    pub fn check_file(&self, rel: &str, len: Option<u64>) -> Result<(), ToolError> {
        match len {
            Some(n) if n <= self.max_file_bytes => Ok(()),
            _ => Err(ToolError::Failed(format!(
                "{}: the file would be {} bytes, over the cap of {} bytes per file \
                 (worker.max_file_bytes); nothing was written",
                shown(rel),
                len.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string()),
                self.max_file_bytes
            ))),
        }
    }
}

/// A directory tree the file tools read and write. Every method takes a path relative to
/// the root (absolute paths inside the root are accepted too) and must refuse a path that
/// escapes the root, lexically, through a symlink or through a hard link, with
/// [`ToolError::Denied`].
#[async_trait]
pub trait Workspace: Send + Sync {
    /// The root directory; also the working directory of the `shell` tool.
    fn root(&self) -> &Path;

    /// The absolute path `rel` designates, once proven to stay inside the root.
    fn resolve(&self, rel: &str) -> Result<PathBuf, ToolError>;

    /// At most `max_bytes` bytes from the start of the file. Callers that need to know
    /// whether the file was longer ask for one byte more than they will show.
    async fn read(&self, rel: &str, max_bytes: usize) -> Result<Vec<u8>, ToolError>;

    /// Replace the file's content, creating it and its parent directories as needed,
    /// unless the file would be over `limits.max_file_bytes` or the workspace would then
    /// hold more than `limits.quota_bytes` (a write that does not grow the file is
    /// allowed even then, so space can be freed): refused before anything is written.
    async fn write(&self, rel: &str, data: &[u8], limits: WriteLimits) -> Result<(), ToolError>;

    /// Something other than [`Workspace::write`] may have changed the tree (a `shell`
    /// command): a workspace that keeps a running total of its size measures it again
    /// before the next write.
    fn forget_usage(&self) {}

    /// The entries of a directory, sorted by name.
    async fn list(&self, rel: &str) -> Result<Vec<DirEntry>, ToolError>;

    /// Regular files under `rel` (or `rel` itself when it is a file), skipping
    /// [`SKIPPED_DIRS`] and never following symlinked directories, visiting at most
    /// `max_entries` entries.
    async fn walk(&self, rel: &str, max_entries: usize) -> Result<WalkResult, ToolError>;

    /// Make sure the root exists on disk, for work that needs a real directory (the
    /// `shell` tool's working directory). A workspace that makes its root only when first
    /// written to makes it here.
    async fn ensure(&self) -> Result<(), ToolError> {
        Ok(())
    }
}

/// Lexically turn `p` into a path relative to `root`: relative paths are taken as is,
/// absolute paths must lie under `root`; `.` is dropped and `..` pops a component. A path
/// that climbs above the root is refused. The empty result designates the root itself.
pub fn normalize_relative(root: &Path, p: &str) -> Result<PathBuf, ToolError> {
    if p.contains('\0') {
        return Err(ToolError::InvalidArguments(format!(
            "path `{}` contains a NUL byte",
            p.escape_debug()
        )));
    }
    let path = Path::new(p);
    if path.is_absolute() {
        // Normalise the absolute path first, so `/root/a/../b` is judged by where it lands.
        let mut abs = PathBuf::new();
        for c in path.components() {
            match c {
                Component::Prefix(_) | Component::RootDir => abs.push(c.as_os_str()),
                Component::CurDir => {}
                Component::ParentDir => {
                    abs.pop();
                }
                Component::Normal(n) => abs.push(n),
            }
        }
        let inside = abs.strip_prefix(root).map_err(|_| {
            ToolError::Denied(format!(
                "path `{p}` is outside the workspace ({})",
                root.display()
            ))
        })?;
        return Ok(inside.to_path_buf());
    }
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(ToolError::Denied(format!(
                        "path `{p}` escapes the workspace through `..`"
                    )));
                }
            }
            Component::Normal(n) => out.push(n),
            // Unreachable for a relative path on Unix; a Windows drive-relative path
            // (`C:foo`) lands here and is refused rather than guessed at.
            Component::Prefix(_) | Component::RootDir => {
                return Err(ToolError::Denied(format!(
                    "path `{p}` is outside the workspace"
                )));
            }
        }
    }
    Ok(out)
}

/// Resolve `rel` under the canonical `root`, refusing symlinks that lead outside it.
///
/// The deepest ancestor that exists (as a directory entry, links included) is
/// canonicalized and must stay inside the root; the components below it do not exist yet,
/// so they cannot be links. A dangling link is refused since writing through it would
/// create its target wherever it points. A link swapped in between this check and the
/// actual open is not caught (TOCTOU); the workspace is not a hostile multi-tenant
/// filesystem.
fn resolve_under(root: &Path, rel: &str, may_be_absent: bool) -> Result<PathBuf, ToolError> {
    let relative = normalize_relative(root, rel)?;
    let joined = root.join(&relative);
    if may_be_absent && std::fs::symlink_metadata(root).is_err() {
        // A root not made yet (`LocalWorkspace::lazy`) holds nothing, so no link either.
        return Ok(joined);
    }
    let mut existing = joined.as_path();
    let mut missing: Vec<&std::ffi::OsStr> = Vec::new();
    while std::fs::symlink_metadata(existing).is_err() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                missing.push(name);
                existing = parent;
            }
            // Reached the filesystem root without finding anything: the root itself
            // vanished.
            _ => {
                return Err(ToolError::Failed(format!(
                    "workspace root {} does not exist",
                    root.display()
                )));
            }
        }
    }
    let canonical = std::fs::canonicalize(existing).map_err(|e| {
        ToolError::Denied(format!(
            "path `{rel}` goes through a link that cannot be resolved: {e}"
        ))
    })?;
    if !canonical.starts_with(root) {
        return Err(ToolError::Denied(format!(
            "path `{rel}` leads outside the workspace through a symlink"
        )));
    }
    let mut out = canonical;
    for name in missing.iter().rev() {
        out.push(name);
    }
    Ok(out)
}

/// Refuse a file with more than one name. A hard link made inside the workspace (by the
/// `shell` tool, say) to a file outside it is an ordinary file by every path check, but
/// reading or writing it reaches the outside file; and which of its names is the original
/// cannot be told, so every multiply-linked file is refused.
fn refuse_hard_link(rel: &str, meta: &std::fs::Metadata) -> Result<(), ToolError> {
    use std::os::unix::fs::MetadataExt;
    if meta.is_file() && meta.nlink() > 1 {
        return Err(ToolError::Denied(format!(
            "{} has {} hard links; a file with several names may be one outside the \
             workspace, so it is not read or written",
            shown(rel),
            meta.nlink()
        )));
    }
    Ok(())
}

/// A workspace that is a directory on the local disk.
#[derive(Debug, Clone)]
pub struct LocalWorkspace {
    root: PathBuf,
    /// The root is known to exist. One made by [`LocalWorkspace::lazy`] starts without
    /// its directory and makes it on the first write; until then it reads as empty.
    made: Arc<AtomicBool>,
    /// Bytes the tree holds: measured before the first write (and again after
    /// [`Workspace::forget_usage`]), then kept up to date by each write, which holds the
    /// lock from its check to its end so that concurrent calls cannot both fit. Shared
    /// by every handle on the same root in this process ([`shared_usage`]): the sessions
    /// of one tree running at once write to one directory under one quota.
    usage: Usage,
    /// What changed in the tree since its changes were last taken
    /// ([`LocalWorkspace::take_changes`]), shared like `usage`: whichever session of the
    /// tree commits next commits them.
    changes: Arc<Mutex<Changes>>,
}

/// The changes of a tree not yet taken for a commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Files written through [`Workspace::write`], relative to the root, `/`-separated.
    pub written: std::collections::BTreeSet<String>,
    /// Something else (a `shell` command) may have changed anything: the whole tree must
    /// be compared with what was last committed.
    pub rescan: bool,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.written.is_empty() && !self.rescan
    }

    fn absorb(&mut self, other: Changes) {
        self.written.extend(other.written);
        self.rescan |= other.rescan;
    }
}

/// The value of each root some live handle holds, one per root: the handles of a root
/// share it. Roots no handle holds any more are forgotten as new ones come, all at once
/// when the map has doubled since the last time, so a new root costs the same however
/// many sessions' workspaces are open.
struct PerRoot<T> {
    live: std::collections::HashMap<PathBuf, std::sync::Weak<Mutex<T>>>,
    /// The size at which the map is next swept.
    sweep_at: usize,
}

/// The least size at which [`PerRoot`] is swept.
const PER_ROOT_SWEEP: usize = 64;

impl<T> PerRoot<T> {
    fn new() -> Mutex<Self> {
        Mutex::new(PerRoot {
            live: std::collections::HashMap::new(),
            sweep_at: PER_ROOT_SWEEP,
        })
    }

    /// The value of `root`, and whether a live handle held it already (else `make`'s).
    fn of(this: &Mutex<Self>, root: &Path, make: impl FnOnce() -> T) -> (Arc<Mutex<T>>, bool) {
        let mut all = this.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = all.live.get(root).and_then(std::sync::Weak::upgrade) {
            return (held, true);
        }
        if all.live.len() >= all.sweep_at {
            all.live.retain(|_, v| v.strong_count() > 0);
            all.sweep_at = all.live.len().saturating_mul(2).max(PER_ROOT_SWEEP);
        }
        let value = Arc::new(Mutex::new(make()));
        all.live.insert(root.to_path_buf(), Arc::downgrade(&value));
        (value, false)
    }
}

/// The change set of `root`, the one every live handle on it holds.
fn shared_changes(root: &Path) -> Arc<Mutex<Changes>> {
    static CHANGES: std::sync::LazyLock<Mutex<PerRoot<Changes>>> =
        std::sync::LazyLock::new(PerRoot::new);
    PerRoot::of(&CHANGES, root, Changes::default).0
}

/// A workspace's byte count, `None` until measured.
type Usage = Arc<Mutex<Option<u64>>>;

/// The usage count of `root`, the one every live handle on it holds. A new handle (a
/// session starting on the tree) has it measured again at the next write, so what was
/// written meanwhile by other means is counted.
fn shared_usage(root: &Path) -> Usage {
    static USAGE: std::sync::LazyLock<Mutex<PerRoot<Option<u64>>>> =
        std::sync::LazyLock::new(PerRoot::new);
    let (usage, held) = PerRoot::of(&USAGE, root, || None);
    if held {
        *usage.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
    usage
}

impl LocalWorkspace {
    /// The root is canonicalized once here, so every later containment check compares
    /// canonical paths.
    pub fn new(root: impl AsRef<Path>) -> std::io::Result<Self> {
        let root = std::fs::canonicalize(root)?;
        if !root.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("workspace root {} is not a directory", root.display()),
            ));
        }
        Ok(LocalWorkspace {
            usage: shared_usage(&root),
            changes: shared_changes(&root),
            root,
            made: Arc::new(AtomicBool::new(true)),
        })
    }

    /// The directory `name` under `parent`, made only when something is first written
    /// to it (or [`Workspace::ensure`]d): a session that never writes a file costs no
    /// directory, and no filesystem call when it starts. `parent` must be canonical
    /// (containment checks compare canonical paths); `name` must be one plain path
    /// component.
    pub fn lazy(parent: &Path, name: &str) -> std::io::Result<Self> {
        let mut parts = Path::new(name).components();
        if !parent.is_absolute()
            || !matches!(
                (parts.next(), parts.next()),
                (Some(Component::Normal(_)), None)
            )
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "workspace {name:?} under {}: needs an absolute parent and a plain name",
                    parent.display()
                ),
            ));
        }
        let root = parent.join(name);
        Ok(LocalWorkspace {
            usage: shared_usage(&root),
            changes: shared_changes(&root),
            root,
            made: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The changes since they were last taken, leaving none.
    pub fn take_changes(&self) -> Changes {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Put taken changes back (their commit failed): the next commit takes them again.
    pub fn restore_changes(&self, changes: Changes) {
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .absorb(changes);
    }

    /// Whether another handle on this root is alive in this process (another session of
    /// the tree runs here), whose uncommitted changes the directory may hold.
    pub fn shared_with_others(&self) -> bool {
        Arc::strong_count(&self.changes) > 1
    }

    /// Files were placed here by someone else than a tool (brought in from the store):
    /// the size is measured again before the next write, without a rescan for changes
    /// (what was placed is no change to commit).
    pub fn forget_size(&self) {
        *self.usage.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The root is there now (made by someone else than a write, such as a restore).
    pub fn mark_made(&self) {
        self.made.store(true, Ordering::Release);
    }

    /// Run blocking filesystem work off the async executor, making the root first when
    /// `write` asks for it. `f` learns whether the root may still be missing.
    async fn blocking<T, F>(&self, write: bool, f: F) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce(&Path, bool) -> Result<T, ToolError> + Send + 'static,
    {
        let root = self.root.clone();
        let made = self.made.clone();
        tokio::task::spawn_blocking(move || {
            if write && !made.load(Ordering::Acquire) {
                std::fs::create_dir_all(&root).map_err(|e| {
                    ToolError::Failed(format!("workspace root {}: {e}", root.display()))
                })?;
                made.store(true, Ordering::Release);
            }
            f(&root, !made.load(Ordering::Acquire))
        })
        .await
        .map_err(|e| ToolError::Failed(format!("workspace task failed: {e}")))?
    }
}

/// The bytes of every file under `root` (links not followed, skipped directories
/// included: they take space too), visiting at most [`MEASURE_MAX_ENTRIES`] entries.
fn measure(root: &Path) -> Result<u64, ToolError> {
    let mut total = 0u64;
    let mut visited = 0usize;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            visited += 1;
            if visited > MEASURE_MAX_ENTRIES {
                return Err(ToolError::Failed(format!(
                    "the workspace holds more than {MEASURE_MAX_ENTRIES} files and directories; \
                     its size cannot be checked against its quota \
                     (worker.workspace_quota_bytes), so nothing more is written to it"
                )));
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
    }
    Ok(total)
}

/// Reading the root of a workspace whose directory is not made yet reads an empty one.
fn absent_root(e: &std::io::Error, path: &Path, root: &Path, may_be_absent: bool) -> bool {
    may_be_absent && e.kind() == std::io::ErrorKind::NotFound && path == root
}

/// `rel` for messages: the model's own spelling, or `.` for the root.
fn shown(rel: &str) -> &str {
    if rel.is_empty() { "." } else { rel }
}

fn io_context(rel: &str, e: std::io::Error) -> ToolError {
    let what = match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => e.to_string(),
    };
    ToolError::Failed(format!("{}: {what}", shown(rel)))
}

fn kind_of(ft: std::fs::FileType) -> EntryKind {
    if ft.is_symlink() {
        EntryKind::Symlink
    } else if ft.is_dir() {
        EntryKind::Dir
    } else if ft.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    }
}

/// The path of `abs` relative to `root` with `/` separators, as tools print it.
fn display_relative(root: &Path, abs: &Path) -> String {
    let rel = abs.strip_prefix(root).unwrap_or(abs);
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

#[async_trait]
impl Workspace for LocalWorkspace {
    fn root(&self) -> &Path {
        &self.root
    }

    fn resolve(&self, rel: &str) -> Result<PathBuf, ToolError> {
        resolve_under(&self.root, rel, !self.made.load(Ordering::Acquire))
    }

    async fn read(&self, rel: &str, max_bytes: usize) -> Result<Vec<u8>, ToolError> {
        let rel = rel.to_string();
        self.blocking(false, move |root, may_be_absent| {
            let path = resolve_under(root, &rel, may_be_absent)?;
            let meta = std::fs::metadata(&path).map_err(|e| io_context(&rel, e))?;
            if meta.is_dir() {
                return Err(ToolError::Failed(format!(
                    "{} is a directory (use list_dir)",
                    shown(&rel)
                )));
            }
            refuse_hard_link(&rel, &meta)?;
            let file = std::fs::File::open(&path).map_err(|e| io_context(&rel, e))?;
            // The file opened may not be the one checked if it was swapped in between.
            let opened = file.metadata().map_err(|e| io_context(&rel, e))?;
            refuse_hard_link(&rel, &opened)?;
            let mut buf = Vec::with_capacity(max_bytes.min(meta.len() as usize).min(1 << 20));
            file.take(max_bytes as u64)
                .read_to_end(&mut buf)
                .map_err(|e| io_context(&rel, e))?;
            Ok(buf)
        })
        .await
    }

    async fn write(&self, rel: &str, data: &[u8], limits: WriteLimits) -> Result<(), ToolError> {
        // Before the copy below: a file over the cap is never even duplicated.
        limits.check_file(rel, u64::try_from(data.len()).ok())?;
        let rel = rel.to_string();
        let data = data.to_vec();
        let usage = self.usage.clone();
        let changes = self.changes.clone();
        self.blocking(true, move |root, may_be_absent| {
            let path = resolve_under(root, &rel, may_be_absent)?;
            if path == root {
                return Err(ToolError::InvalidArguments(
                    "path: the workspace root is a directory, not a file".into(),
                ));
            }
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_context(&rel, e))?;
            }
            let old = match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => {
                    return Err(ToolError::Failed(format!("{} is a directory", shown(&rel))));
                }
                Ok(meta) => {
                    refuse_hard_link(&rel, &meta)?;
                    meta.len()
                }
                Err(_) => 0,
            };
            let mut usage = usage.lock().unwrap_or_else(|e| e.into_inner());
            let total = match *usage {
                Some(total) => total,
                None => measure(root)?,
            };
            let new = data.len() as u64;
            let after = total.saturating_sub(old).saturating_add(new);
            if new > old && after > limits.quota_bytes {
                *usage = Some(total);
                return Err(ToolError::Failed(format!(
                    "{}: writing {new} bytes would bring the workspace to {after} bytes, over \
                     its quota of {} bytes (worker.workspace_quota_bytes); nothing was \
                     written. Delete or shrink files first",
                    shown(&rel),
                    limits.quota_bytes
                )));
            }
            let written = std::fs::write(&path, &data);
            // Recorded even when the write failed: part of it may have landed.
            changes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .written
                .insert(display_relative(root, &path));
            match written {
                Ok(()) => {
                    *usage = Some(after);
                    Ok(())
                }
                Err(e) => {
                    // How much of it landed is unknown: measure again next time.
                    *usage = None;
                    Err(io_context(&rel, e))
                }
            }
        })
        .await
    }

    fn forget_usage(&self) {
        *self.usage.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rescan = true;
    }

    async fn list(&self, rel: &str) -> Result<Vec<DirEntry>, ToolError> {
        let rel = rel.to_string();
        self.blocking(false, move |root, may_be_absent| {
            let path = resolve_under(root, &rel, may_be_absent)?;
            let mut out = Vec::new();
            let entries = match std::fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) if absent_root(&e, &path, root, may_be_absent) => return Ok(out),
                Err(e) => return Err(io_context(&rel, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_context(&rel, e))?;
                let kind = entry.file_type().map(kind_of).unwrap_or(EntryKind::Other);
                out.push(DirEntry {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    kind,
                });
            }
            out.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(out)
        })
        .await
    }

    async fn walk(&self, rel: &str, max_entries: usize) -> Result<WalkResult, ToolError> {
        let rel = rel.to_string();
        self.blocking(false, move |root, may_be_absent| {
            let base = resolve_under(root, &rel, may_be_absent)?;
            let mut result = WalkResult::default();
            let meta = match std::fs::metadata(&base) {
                Ok(meta) => meta,
                Err(e) if absent_root(&e, &base, root, may_be_absent) => return Ok(result),
                Err(e) => return Err(io_context(&rel, e)),
            };
            if !meta.is_dir() {
                result.files.push(display_relative(root, &base));
                return Ok(result);
            }
            let mut stack = vec![base];
            let mut visited = 0usize;
            'walk: while let Some(dir) = stack.pop() {
                // An unreadable subdirectory is skipped rather than failing the search.
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    visited += 1;
                    if visited > max_entries {
                        result.truncated = true;
                        break 'walk;
                    }
                    let Ok(ft) = entry.file_type() else { continue };
                    let path = entry.path();
                    if ft.is_dir() {
                        let name = entry.file_name();
                        if !SKIPPED_DIRS.iter().any(|s| name == *s) {
                            stack.push(path);
                        }
                    } else if ft.is_file()
                        || (ft.is_symlink() && std::fs::metadata(&path).is_ok_and(|m| m.is_file()))
                    {
                        // Symlinked files are listed; reading them goes through
                        // `resolve`, which refuses those pointing outside.
                        result.files.push(display_relative(root, &path));
                    }
                }
            }
            result.files.sort();
            Ok(result)
        })
        .await
    }

    async fn ensure(&self) -> Result<(), ToolError> {
        if self.made.load(Ordering::Acquire) {
            return Ok(());
        }
        self.blocking(true, |_, _| Ok(())).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Handles of one root share its value while any lives; roots no handle holds are
    /// forgotten as new ones come, so the map stays bounded by the live roots, not by
    /// every root ever opened.
    #[test]
    fn per_root_shares_a_live_value_and_forgets_dead_roots() {
        let roots = PerRoot::<u32>::new();
        let (kept, held) = PerRoot::of(&roots, Path::new("/kept"), || 7);
        assert!(!held);
        for i in 0..1000 {
            let root = PathBuf::from(format!("/gone/{i}"));
            let (_, held) = PerRoot::of(&roots, &root, || 0);
            assert!(!held);
        }
        assert!(roots.lock().unwrap().live.len() <= PER_ROOT_SWEEP);
        let (again, held) = PerRoot::of(&roots, Path::new("/kept"), || 0);
        assert!(held);
        assert!(Arc::ptr_eq(&kept, &again));
        assert_eq!(*again.lock().unwrap(), 7);
        drop((kept, again));
        let (fresh, held) = PerRoot::of(&roots, Path::new("/kept"), || 9);
        assert!(!held, "the last handle gone, the root starts afresh");
        assert_eq!(*fresh.lock().unwrap(), 9);
    }
}
