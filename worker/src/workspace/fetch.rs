//! Bringing committed contents onto the disk: fetched from the store a few at a time,
//! checked against their hash, and placed through a temporary file and a rename, never
//! written through whatever a command left at the path.

use std::path::Path;
use std::sync::Arc;

use tracing::warn;

use agentq_core::Store;
use agentq_core::workspace::{FileEntry, sha256_hex, valid_path};

use super::disk::{blocking, mtime_ns};
use super::error::{Error, io};
use super::index::Indexed;

/// Blobs fetched at once while materialising.
const FETCH_CONCURRENCY: usize = 8;

/// Fetch `entries` from the store, [`FETCH_CONCURRENCY`] at a time, and place each under
/// `dir` that `may_place` still allows just before its write (checked off the executor,
/// with the write). The index entries of the files placed, and how many `may_place`
/// refused.
pub(super) async fn fetch_and_place<F>(
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
