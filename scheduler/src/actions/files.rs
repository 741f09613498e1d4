//! A session's committed workspace: its list (`GET /v1/sessions/{id}/files`, the MCP
//! tool `list_files`) and one file's bytes (`GET /v1/sessions/{id}/files/{path}`,
//! `read_file`). A path asked for is held to the same rules as a request's files, so
//! `..` or an absolute path is refused naming `path`, never a file outside the tree.

use agentq_api::FileList;
use agentq_core::auth::Caller;
use agentq_core::workspace::FileEntry;
use agentq_core::workspace_path::{FileLimits, MAX_PATH_BYTES, MAX_PATH_DEPTH, normalize};

use crate::error::ApiError;
use crate::http::body::no_nul;
use crate::http::{ApiResult, get_row};
use crate::state::Scheduler;

/// The longest and deepest path asked for: the hard bounds, whatever the policy.
pub(crate) const ANY_PATH: FileLimits = FileLimits {
    max_path_bytes: MAX_PATH_BYTES,
    max_path_depth: MAX_PATH_DEPTH,
    ..FileLimits::DEFAULT
};

/// The files of the workspace of session `id`'s tree, and the tree's root (whose
/// workspace it is).
pub(crate) async fn list_files(
    s: &Scheduler,
    caller: &Caller,
    id: &str,
) -> ApiResult<(String, FileList)> {
    let row = get_row(s, caller, id).await?;
    let files = s.store.workspace_files(&row.root_id).await?;
    Ok((row.root_id, FileList { files }))
}

/// One file of a workspace: its entry and its bytes.
pub(crate) struct FileRead {
    pub entry: FileEntry,
    pub data: Vec<u8>,
}

/// The file at `asked` in the workspace of session `id`'s tree; `field` names the path in
/// an error (`path`).
pub(crate) async fn read_file(
    s: &Scheduler,
    caller: &Caller,
    id: &str,
    asked: &str,
    field: &str,
) -> ApiResult<FileRead> {
    let row = get_row(s, caller, id).await?;
    no_nul(field, asked)?;
    let path = normalize(asked, &ANY_PATH).map_err(|m| ApiError::invalid(field, m))?;
    let Some((entry, data)) = s.store.workspace_file(&row.root_id, &path).await? else {
        return Err(ApiError::NotFound(format!(
            "session {id} has no file {}",
            serde_json::to_string(&path.chars().take(256).collect::<String>()).unwrap_or_default()
        )));
    };
    Ok(FileRead { entry, data })
}
