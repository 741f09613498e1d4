//! The filesystem work every part of the workspace shares: running it off the executor
//! ([`blocking`]), listing a tree's directory without following links ([`walk`]), and the
//! modification time the index compares.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::error::{Error, io};

/// Entries a walk of the directory visits at most.
const WALK_MAX_ENTRIES: usize = 200_000;

pub(super) fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Data(format!("workspace task failed: {e}")))?
}

/// Every entry under `dir` that is not a directory, by relative path (`/`-separated);
/// symlinks are not followed.
pub(super) fn walk(dir: &Path) -> Result<Vec<(String, std::fs::Metadata)>, Error> {
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
