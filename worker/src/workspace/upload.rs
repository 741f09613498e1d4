//! The contents of a checkpoint's changes: small ones read to ride on the commit itself,
//! the others uploaded before it (those the store does not hold yet), in batches; each
//! checked to still hash to what was found.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use agentq_core::Store;
use agentq_core::workspace::sha256_hex;

use super::changes::Found;
use super::disk::blocking;
use super::error::{Error, io};

/// Bytes of contents one commit carries at most (`Pending::blobs`); past this, changed
/// files are uploaded before the commit.
const INLINE_COMMIT_BYTES: u64 = 256 * 1024;
/// Contents one commit carries at most, however small (a command that writes thousands of
/// tiny files uploads most of them first, in batches, instead of growing one statement).
const INLINE_COMMIT_FILES: usize = 256;

/// Bytes of blobs uploaded in one call, at most (more than one file's worth only when
/// files are small).
const UPLOAD_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// The changed contents for the commit to carry (small ones, up to the store's
/// [`inline limit`](agentq_core::blob::BlobStore::inline_limit) and
/// [`INLINE_COMMIT_BYTES`] in all), read here; and the others uploaded now, those the
/// store does not hold yet.
pub(super) async fn upload(
    store: &dyn Store,
    dir: &Path,
    found: &[(String, Found)],
) -> Result<Vec<(String, Arc<Vec<u8>>)>, Error> {
    let limit = store.inline_limit();
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
        let data = read_checked(dir, path, &i.sha256).await?;
        carried_bytes = carried_bytes.saturating_add(i.size);
        carried_keys.insert(i.sha256.clone());
        carried.push((i.sha256.clone(), Arc::new(data)));
    }
    let keys: Vec<String> = keys.into_iter().collect();
    if keys.is_empty() {
        return Ok(carried);
    }
    let missing: BTreeSet<String> = store.missing_blobs(&keys).await?.into_iter().collect();
    let mut batch: Vec<(String, Vec<u8>)> = Vec::new();
    let mut bytes = 0usize;
    let mut sent = BTreeSet::new();
    for (path, f) in found {
        let Found::Changed(i) = f else { continue };
        if !missing.contains(&i.sha256) || !sent.insert(i.sha256.clone()) {
            continue;
        }
        let data = read_checked(dir, path, &i.sha256).await?;
        bytes = bytes.saturating_add(data.len());
        batch.push((i.sha256.clone(), data));
        if bytes >= UPLOAD_BATCH_BYTES {
            store.put_blobs(&batch).await?;
            batch.clear();
            bytes = 0;
        }
    }
    if !batch.is_empty() {
        store.put_blobs(&batch).await?;
    }
    Ok(carried)
}

/// The bytes of `path`, which must still hash to `sha256`.
async fn read_checked(dir: &Path, path: &str, sha256: &str) -> Result<Vec<u8>, Error> {
    let abs = dir.join(path);
    let data = blocking(move || std::fs::read(&abs).map_err(io(&abs))).await?;
    if sha256_hex(&data) != sha256 {
        // Changed again since it was hashed: its later state is the next commit's.
        return Err(Error::Data(format!(
            "{path} changed while it was committed"
        )));
    }
    Ok(data)
}
