//! The durable workspace of a session tree, as the API and the CLI see it: the files a
//! request brings in and the files a tree's sessions committed. Files are stored by
//! content (sha256), once however many trees hold them; a tree's manifest maps its paths
//! to contents and is written with the checkpoint of the tool result that changed it.

use serde::{Deserialize, Serialize};

/// A file a request brings into its session's workspace. `path` is relative to the
/// workspace root, already checked against the path rules; `data` the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    pub path: String,
    pub data: Vec<u8>,
}

/// One file of a tree's committed workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileEntry {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Lower-case hex of the content's SHA-256.
    pub sha256: String,
    /// The history position (message seq) of the step whose commit last changed it;
    /// 0 for a file that came with the request or from `workspace_from`.
    pub modified_at_seq: i64,
}

/// The lower-case hex SHA-256 of `data`: a blob's key.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(data);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether `s` is a blob key as [`sha256_hex`] writes it.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| HEX.contains(&b))
}

/// One change a checkpoint commits to its tree's manifest, the blob uploaded before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    /// The new content (its key and size); `None` when the file was deleted.
    pub blob: Option<BlobRef>,
}

/// A content by its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRef {
    pub sha256: String,
    pub size: u64,
}

/// Largest committed path, in bytes: a manifest row's key.
pub const MAX_PATH_BYTES: usize = 4096;

/// Whether `path` may be a manifest key: relative, `/`-separated, no empty, `.` or `..`
/// component, no NUL or backslash, at most [`MAX_PATH_BYTES`]. Every path a manifest
/// holds passed this, so materialising it can never leave the workspace.
pub fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= MAX_PATH_BYTES
        && !path.contains('\0')
        && !path.contains('\\')
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}
