//! The rules of `[retention]`.

use super::rules::{invalid, range};
use crate::config::retention::{ExportTarget, RetentionSection};
use crate::config::workspace::{BlobStoreKind, WorkspaceSection};
use crate::error::Result;
use crate::retention::MAX_RETENTION_DAYS as MAX_DAYS;

pub(super) fn retention(r: &RetentionSection, w: &WorkspaceSection) -> Result<()> {
    if let Some(d) = r.days {
        range("retention.days", d, 1, MAX_DAYS)?;
    }
    for (kind, map) in [("tenants", &r.tenants), ("queues", &r.queues)] {
        for (name, o) in map {
            let key = format!("retention.{kind}.{name}.days");
            if name.trim().is_empty() {
                return Err(invalid(
                    &format!("retention.{kind}"),
                    "names must not be empty",
                ));
            }
            if let Some(d) = o.days {
                range(&key, d, 1, MAX_DAYS)?;
            }
        }
    }
    match r.export_target() {
        Err(why) => return Err(invalid("retention.export", why)),
        Ok(Some(ExportTarget::S3)) if w.blob_store != BlobStoreKind::S3 => {
            return Err(invalid(
                "retention.export",
                "`s3` needs [workspace] blob_store = \"s3\" (its bucket is the target)",
            ));
        }
        Ok(_) => {}
    }
    range("retention.batch", r.batch, 1, 10_000)?;
    range("retention.max_batches", r.max_batches, 1, 10_000)?;
    range("retention.pause_ms", r.pause_ms, 0, 60_000)?;
    range("retention.interval_secs", r.interval_secs, 1, 7 * 86_400)?;
    Ok(())
}
