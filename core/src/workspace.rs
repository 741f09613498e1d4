//! The durable workspace of a session tree, as the API and the CLI see it: the files a
//! request brings in and the files a tree's sessions committed. Files are stored by
//! content (sha256), once however many trees hold them; a tree's manifest maps its paths
//! to contents and is written with the checkpoint of the tool result that changed it.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// A file a request brings into its session's workspace. `path` is relative to the
/// workspace root, already checked against the path rules; `data` the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    pub path: String,
    pub data: Vec<u8>,
}

/// One file of a tree's committed workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// Reading a tree's committed workspace (the API's and the CLI's side).
#[async_trait]
pub trait WorkspaceStore: Send + Sync {
    /// Every committed file of the tree `root_id`, sorted by path.
    async fn workspace_files(&self, root_id: &str) -> Result<Vec<FileEntry>>;

    /// One committed file and its bytes; `None` when the tree holds no such path.
    async fn workspace_file(
        &self,
        root_id: &str,
        path: &str,
    ) -> Result<Option<(FileEntry, Vec<u8>)>>;
}
