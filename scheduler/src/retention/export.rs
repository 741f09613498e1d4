//! The export retention writes before it deletes: JSON Lines, one line per session
//! (`{"session": <the stored row>, "transcript": [<messages>]}`), one file per batch of
//! trees, to a directory (written under a temporary name, fsynced, renamed, the
//! directory fsynced) or to the `[workspace.s3]` bucket under `retention/` (a PUT
//! answered 2xx is durable). Only then is the batch deleted.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use agentq_agent::schema::Message;
use agentq_core::blob::s3::S3Blobs;
use agentq_core::config::{ExportTarget, RetentionSection, WorkspaceSection};
use agentq_core::{Error, SessionRow, Store};

use super::RetentionError;

/// One line of the export.
#[derive(Serialize)]
struct Line<'a> {
    session: &'a SessionRow,
    transcript: &'a [Message],
}

/// Where a batch goes.
pub enum Exporter {
    Dir(PathBuf),
    S3(Arc<S3Blobs>),
}

impl Exporter {
    /// The export `[retention] export` names, if any.
    pub fn from_settings(
        cfg: &RetentionSection,
        workspace: &WorkspaceSection,
    ) -> agentq_core::Result<Option<Self>> {
        let target = cfg
            .export_target()
            .map_err(|why| Error::Config(format!("`retention.export`: {why}")))?;
        Ok(match target {
            None => None,
            Some(ExportTarget::Dir(p)) => Some(Exporter::Dir(p)),
            Some(ExportTarget::S3) => Some(Exporter::S3(Arc::new(S3Blobs::from_settings(
                &workspace.s3,
            )?))),
        })
    }

    /// Write the trees of `roots` (every session, root first, with its transcript) as
    /// one durable file named after `now`; returns how many sessions it holds.
    pub async fn export(
        &self,
        store: &dyn Store,
        roots: &[String],
        now: DateTime<Utc>,
    ) -> Result<u64, RetentionError> {
        let mut body = Vec::new();
        let mut sessions = 0u64;
        for root in roots {
            for id in store.tree_ids(root).await? {
                // Deleted meanwhile (by another pass): nothing to keep.
                let Some(row) = store.get(&id).await? else {
                    continue;
                };
                let transcript = match store.messages(&id).await {
                    Ok(m) => m,
                    Err(Error::NotFound(_)) => continue,
                    Err(e) => return Err(e.into()),
                };
                serde_json::to_writer(
                    &mut body,
                    &Line {
                        session: &row,
                        transcript: &transcript,
                    },
                )
                .map_err(Error::from)?;
                body.push(b'\n');
                sessions += 1;
            }
        }
        // Time-ordered and unique per batch: the first root is a time-ordered id.
        let first = roots.first().map_or("none", String::as_str);
        let name = format!(
            "agentq-retention-{}-{}.jsonl",
            now.format("%Y%m%dt%H%M%S%6fz"),
            first.to_ascii_lowercase()
        );
        match self {
            Exporter::Dir(dir) => {
                write_durably(dir, &name, &body)
                    .await
                    .map_err(|source| RetentionError::Export {
                        path: dir.join(&name).display().to_string(),
                        source,
                    })?
            }
            Exporter::S3(o) => o.put_export(&name, body).await?,
        }
        Ok(sessions)
    }
}

/// `body` as `dir/name`, on disk before this returns: written under a temporary name,
/// fsynced, renamed, and the directory fsynced (so the name survives a crash too).
async fn write_durably(dir: &Path, name: &str, body: &[u8]) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    let part = dir.join(format!(".{name}.part"));
    let mut f = tokio::fs::File::create(&part).await?;
    f.write_all(body).await?;
    f.sync_all().await?;
    drop(f);
    tokio::fs::rename(&part, dir.join(name)).await?;
    tokio::fs::File::open(dir).await?.sync_all().await
}
