//! `[workspace]`: how long durable workspaces are kept, their collection, and where the
//! bytes of their contents live (`[workspace.s3]`).

use serde::{Deserialize, Serialize};

use super::section::section;

section! {
    /// `[workspace]`: how long the durable workspaces of finished trees are kept, and the
    /// collection of contents no workspace holds any more (run by the scheduler).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct WorkspaceSection {
        /// A tree's files are deleted this long after its root finished (unless it runs
        /// again first); 0 keeps them for as long as the session.
        pub ttl_secs: u64 = 30 * 24 * 3600,
        /// A content no workspace holds is collected once nothing touched it for this
        /// long. Longer than any commit may take after its uploads (a worker gives a
        /// commit up after ten lease times).
        pub blob_grace_secs: u64 = 3600,
        /// How often the scheduler expires workspaces and collects contents.
        pub gc_interval_secs: u64 = 60,
        /// Trees expired, and contents collected, per statement at most.
        pub gc_batch: u32 = 500,
        /// Where the bytes of contents live: `database` (the `blobs` table) or `s3` (an
        /// S3-compatible bucket, `[workspace.s3]`; the database keeps the index).
        pub blob_store: BlobStoreKind = BlobStoreKind::Database,
        pub s3: S3Section = S3Section::default(),
    }
}

/// `[workspace] blob_store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlobStoreKind {
    #[default]
    Database,
    S3,
}

section! {
    /// `[workspace.s3]`: the bucket of `blob_store = "s3"`, addressed path-style (as
    /// S3-compatible servers expect). The credentials are read from the environment
    /// variables named here, never from the file.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct S3Section {
        pub bucket: String = String::new(),
        /// `http(s)://host[:port]`, e.g. `https://s3.eu-west-1.amazonaws.com`.
        pub endpoint: String = String::new(),
        pub region: String = "us-east-1".to_string(),
        /// Prepended to each object's key (the content's SHA-256 in hex), e.g. `agentq/`.
        pub prefix: String = String::new(),
        pub access_key_env: String = "AWS_ACCESS_KEY_ID".to_string(),
        pub secret_key_env: String = "AWS_SECRET_ACCESS_KEY".to_string(),
    }
}
