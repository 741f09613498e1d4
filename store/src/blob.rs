//! The blob store: file contents by their SHA-256, stored once however many trees (of
//! however many tenants) hold them. Nothing outside a store reads a blob by its key from
//! a request: the API reads a tree's manifest and then the blobs that manifest names, so a
//! tenant can only reach contents its own trees hold, and cannot learn whether another
//! tenant's content exists.
//!
//! The database is the blob store by default (a `bytea` column on Postgres, a `BLOB` on
//! SQLite), in the `blobs` table that is also the index the collector reads.
//!
//! Collection is safe against a commit that references a blob being collected by age: a
//! blob is collected only when no manifest references it and it was not touched (uploaded,
//! or found present by [`BlobStore::missing`]) for the collector's grace period; a worker
//! touches every blob of a change right before the commit that references it, and gives
//! a commit up long before the grace period ends.

pub mod s3;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::workspace::sha256_hex;

#[async_trait]
pub trait BlobStore: Send + Sync {
    /// Store each `(key, bytes)` that is not stored yet, and touch every one. A key that
    /// is not the SHA-256 of its bytes is refused ([`Error::Invalid`]) before anything is
    /// written: a wrong key would serve other trees the wrong content.
    async fn put_blobs(&self, blobs: &[(String, Vec<u8>)]) -> Result<()>;

    /// The bytes of one blob; `None` when it is not stored.
    async fn get_blob(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// Of `keys`, those not stored (in the order given); those stored are touched, so a
    /// commit that references them right after is safe from the collector.
    async fn missing_blobs(&self, keys: &[String]) -> Result<Vec<String>>;

    /// Delete these blobs (unknown keys are ignored). The collector's last step; nothing
    /// else deletes a blob.
    async fn delete_blobs(&self, keys: &[String]) -> Result<()>;

    /// The largest content a checkpoint may carry itself ([`crate::Checkpoint::blobs`]),
    /// stored by the commit's own statement instead of uploaded before it; 0 when
    /// contents live elsewhere (an object store) and are always uploaded first.
    fn inline_limit(&self) -> u64 {
        0
    }
}

/// [`BlobStore::inline_limit`] of a store that keeps contents in the database: small
/// files, the common case of a tool round, ride on the commit; larger ones are uploaded
/// first (checked for presence, so a content stored already is not sent again).
pub const INLINE_BLOB_BYTES: u64 = 64 * 1024;

/// Refuse a blob whose key is not its content's hash.
pub(crate) fn check_keys(blobs: &[(String, Vec<u8>)]) -> Result<()> {
    for (key, data) in blobs {
        if sha256_hex(data) != *key {
            return Err(Error::invalid(
                "blob",
                format!("key {key} is not the SHA-256 of its bytes"),
            ));
        }
    }
    Ok(())
}
