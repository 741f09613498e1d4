//! Workspace reads and rules both stores share: a tree's manifest and one file with its
//! bytes, a blob's bytes (from the table, or from the object store when the table holds
//! only its index row), and the checks on a new session's input files. Generic over the
//! database; the listing's text (whose byte order each dialect spells its own way) is
//! passed in.

use std::collections::BTreeMap;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::blob::s3::S3Blobs;
use crate::error::{Error, Result};
use crate::model::NewSession;
use crate::rowconv::{bad_data, to_i64, to_u64};
use crate::workspace::{FileEntry, sha256_hex, valid_path};

/// One file of a tree with its bytes, if stored in the table.
const FILE: &str = "SELECT w.path, w.size, w.sha256, w.modified_at_seq, b.data \
     FROM workspace_files w LEFT JOIN blobs b ON b.sha256 = w.sha256 \
     WHERE w.root_id = $1 AND w.path = $2";

const GET_BLOB: &str = "SELECT data, size FROM blobs WHERE sha256 = $1";

/// (path, size, sha256, modified_at_seq)
type FileRow = (String, i64, String, i64);

/// A file's row with its bytes (NULL when they are in the object store).
type FileWithData = (String, i64, String, i64, Option<Vec<u8>>);

fn entry((path, size, sha256, seq): FileRow) -> Result<FileEntry> {
    Ok(FileEntry {
        path,
        size: to_u64(size, "workspace_files.size")?,
        sha256,
        modified_at_seq: seq,
    })
}

/// The manifest of a tree, by `sql` (the dialect's listing in byte order of paths).
pub(crate) async fn files<DB>(pool: &Pool<DB>, sql: &str, root_id: &str) -> Result<Vec<FileEntry>>
where
    DB: Database,
    for<'r> FileRow: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<FileRow> = sqlx::query_as::<DB, FileRow>(sql)
        .bind(root_id)
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(entry).collect()
}

/// One file of a tree and its bytes; a file whose content is missing is bad data.
pub(crate) async fn file<DB>(
    pool: &Pool<DB>,
    objects: Option<&S3Blobs>,
    root_id: &str,
    path: &str,
) -> Result<Option<(FileEntry, Vec<u8>)>>
where
    DB: Database,
    for<'r> FileWithData: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let row: Option<FileWithData> = sqlx::query_as::<DB, FileWithData>(FILE)
        .bind(root_id)
        .bind(path)
        .fetch_optional(pool)
        .await?;
    let Some((p, size, sha, seq, data)) = row else {
        return Ok(None);
    };
    let data = match (data, objects) {
        (Some(d), _) => Some(d),
        (None, Some(o)) => o.get(&sha, to_u64(size, "workspace_files.size")?).await?,
        (None, None) => None,
    };
    let data = data.ok_or_else(|| bad_data(format_args!("blob {sha} of {p} is missing")))?;
    Ok(Some((entry((p, size, sha, seq))?, data)))
}

/// A blob's bytes, if it is stored.
pub(crate) async fn blob<DB>(
    pool: &Pool<DB>,
    objects: Option<&S3Blobs>,
    key: &str,
) -> Result<Option<Vec<u8>>>
where
    DB: Database,
    for<'r> (Option<Vec<u8>>, i64): FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let row: Option<(Option<Vec<u8>>, i64)> =
        sqlx::query_as::<DB, (Option<Vec<u8>>, i64)>(GET_BLOB)
            .bind(key)
            .fetch_optional(pool)
            .await?;
    match (row, objects) {
        (Some((Some(d), _)), _) => Ok(Some(d)),
        (Some((None, size)), Some(o)) => o.get(key, to_u64(size, "blobs.size")?).await,
        _ => Ok(None),
    }
}

/// The largest content a store keeps inline: none when the bytes go to an object store.
pub(crate) fn inline_limit(objects: Option<&S3Blobs>) -> u64 {
    if objects.is_some() {
        0
    } else {
        crate::blob::INLINE_BLOB_BYTES
    }
}

/// A new session's input files, checked: each path's content key and size (the last one
/// wins for a path given twice), and the contents to store, in the order given.
pub(crate) struct Inputs<'a> {
    pub by_path: BTreeMap<&'a str, (String, i64)>,
    pub blobs: Vec<(String, Vec<u8>)>,
}

/// [`Inputs`] of `s`; a path outside the workspace is invalid input.
pub(crate) fn inputs(s: &NewSession) -> Result<Inputs<'_>> {
    let mut by_path = BTreeMap::new();
    let mut blobs = Vec::with_capacity(s.files.len());
    for f in &s.files {
        if !valid_path(&f.path) {
            return Err(Error::invalid(
                "files",
                format!(
                    "path {:?} is not a relative path inside the workspace",
                    f.path
                ),
            ));
        }
        let key = sha256_hex(&f.data);
        by_path.insert(
            f.path.as_str(),
            (key.clone(), to_i64(f.data.len() as u64, "files")?),
        );
        blobs.push((key, f.data.clone()));
    }
    Ok(Inputs { by_path, blobs })
}
