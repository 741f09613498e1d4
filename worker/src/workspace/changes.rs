//! Change detection at a checkpoint: of the paths the file tools wrote, and after a
//! `shell` command of every file whose size or time differs from the index, what is gone,
//! what is as committed, and what changed (hashed); a file that may not be committed is
//! left out with a warning.

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tracing::warn;

use agentq_agent::tools::Changes;
use agentq_core::workspace::valid_path;

use super::disk::{mtime_ns, walk};
use super::error::Error;
use super::index::{Index, Indexed};

/// What a changed path is now.
#[derive(Debug)]
pub(super) enum Found {
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
pub(super) fn find_changes(
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
