//! One tool call: its arguments decoded as a REST body is (an unknown or bad field is
//! named), the scope checked, then the function the matching REST route calls.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use agentq_api::bounds::MAX_APPROVALS_LIMIT;
use agentq_api::de;
use agentq_core::auth::Caller;

use super::tools::{DEFAULT_READ_BYTES, MAX_READ_BYTES, Name, SUBMIT_FIELDS};
use super::wait;
use crate::actions::{self, Created, FileRead};
use crate::error::ApiError;
use crate::http::auth::require_scope;
use crate::http::body::{decode_json, no_nul, path, scan};
use crate::http::{ApiResult, MAX_ID_LEN, decode_fields, not_found};
use crate::state::Scheduler;

/// The arguments of a tool that names one session.
#[derive(Debug, Deserialize)]
struct One {
    #[serde(deserialize_with = "de::required_string")]
    session_id: String,
}

#[derive(Debug, Deserialize)]
struct WaitArgs {
    #[serde(deserialize_with = "de::required_string")]
    session_id: String,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ReadArgs {
    #[serde(deserialize_with = "de::required_string")]
    session_id: String,
    #[serde(deserialize_with = "de::required_string")]
    path: String,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    max_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ListApprovalsArgs {
    #[serde(default, deserialize_with = "de::optional_string")]
    session_id: Option<String>,
}

/// The session id of an argument: refused naming `session_id` when it holds a NUL, the
/// same "not found" as a missing session when it cannot be an id.
fn check_session_id(id: &str) -> ApiResult<()> {
    no_nul("session_id", id)?;
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(not_found(&id.chars().take(MAX_ID_LEN).collect::<String>()));
    }
    Ok(())
}

fn to_value<T: Serialize>(v: &T) -> ApiResult<Value> {
    serde_json::to_value(v).map_err(|e| {
        tracing::error!(error = %e, "cannot encode a tool result");
        ApiError::Internal
    })
}

/// Run tool `name` with `args` as `caller`: its answer, or the error a REST route would
/// have answered.
pub(super) async fn call(
    s: &Scheduler,
    caller: &Caller,
    name: Name,
    args: Map<String, Value>,
    cancel: &CancellationToken,
) -> ApiResult<Value> {
    require_scope(caller, name.scope())?;
    // The arguments are a body like any other: a NUL character anywhere is refused
    // naming its field, as the REST routes' scan refuses it.
    let bytes = serde_json::to_vec(&args).map_err(|_| ApiError::Internal)?;
    scan(&bytes)?;
    drop(bytes);
    match name {
        Name::Submit => submit(s, caller, args).await,
        Name::Get => {
            let One { session_id } = decode_fields(args)?;
            check_session_id(&session_id)?;
            to_value(&actions::session_detail(s, caller, &session_id).await?)
        }
        Name::Wait => {
            let WaitArgs {
                session_id,
                timeout_secs,
            } = decode_fields(args)?;
            check_session_id(&session_id)?;
            let timeout = wait::timeout(timeout_secs)?;
            let (ended, detail) =
                wait::wait_session(s, caller, &session_id, timeout, cancel).await?;
            Ok(json!({"ended": ended, "session": to_value(&detail)?}))
        }
        Name::ListFiles => {
            let One { session_id } = decode_fields(args)?;
            check_session_id(&session_id)?;
            let (_, list) = actions::list_files(s, caller, &session_id).await?;
            to_value(&list)
        }
        Name::ReadFile => read_file(s, caller, args).await,
        Name::ListApprovals => list_approvals(s, caller, args).await,
        Name::DecideApproval => {
            let mut args = args;
            let id = args.remove("session_id");
            let One { session_id } = decode_fields(Map::from_iter([(
                "session_id".to_string(),
                id.unwrap_or(Value::Null),
            )]))?;
            check_session_id(&session_id)?;
            let answer =
                actions::decide_approval(s, caller, &session_id, Value::Object(args)).await?;
            to_value(&answer)
        }
        Name::Cancel => {
            let One { session_id } = decode_fields(args)?;
            check_session_id(&session_id)?;
            to_value(&actions::cancel_session(s, caller, &session_id).await?)
        }
    }
}

/// `submit_session`: the arguments become a `POST /v1/sessions` body (`files`, a list of
/// `{path, content}`, the API's object of path → content) and go through that route's
/// decoding and checks, from the scan of its bytes on.
async fn submit(s: &Scheduler, caller: &Caller, mut args: Map<String, Value>) -> ApiResult<Value> {
    if let Some(k) = args.keys().find(|k| !SUBMIT_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::Invalid {
            code: "unknown_field",
            field: Some(path("", k)),
            message: format!(
                "unknown field `{k}` (expected one of {})",
                SUBMIT_FIELDS.join(", ")
            ),
        });
    }
    if let Some(files) = args.remove("files") {
        args.insert("files".into(), files_object(files)?);
    }
    let bytes = serde_json::to_vec(&Value::Object(args)).map_err(|_| ApiError::Internal)?;
    let body = decode_json(&bytes)?;
    let Created { session, created } = actions::create_session(s, caller, body).await?;
    Ok(json!({"id": session.id, "status": session.status, "created": created}))
}

/// `[{path, content}]` as the API's `files` object; a path named twice is refused.
fn files_object(files: Value) -> ApiResult<Value> {
    let list = match files {
        Value::Null => return Ok(Value::Null),
        Value::Array(list) => list,
        _ => {
            return Err(ApiError::invalid(
                "files",
                "expected a list of {path, content}",
            ));
        }
    };
    let mut out = Map::new();
    for (i, item) in list.into_iter().enumerate() {
        let field = format!("files[{i}]");
        let Value::Object(mut item) = item else {
            return Err(ApiError::invalid(
                field,
                "expected an object {path, content}",
            ));
        };
        if let Some(k) = item
            .keys()
            .find(|k| !matches!(k.as_str(), "path" | "content"))
        {
            return Err(ApiError::invalid(
                format!("{field}.{k}"),
                "unknown field (expected path and content)",
            ));
        }
        let Some(Value::String(p)) = item.remove("path") else {
            return Err(ApiError::invalid(
                format!("{field}.path"),
                "is required: a string",
            ));
        };
        let Some(content @ Value::String(_)) = item.remove("content") else {
            return Err(ApiError::invalid(
                format!("{field}.content"),
                "is required: a string",
            ));
        };
        if out.contains_key(&p) {
            return Err(ApiError::invalid(
                format!("{field}.path"),
                format!("names {p:?} a second time"),
            ));
        }
        out.insert(p, content);
    }
    Ok(Value::Object(out))
}

/// `read_file`: at most `max_bytes` of the file from `offset`, as text when those bytes
/// are UTF-8 (a cut inside a character ends the text before it); `next_offset` says where
/// the rest begins.
async fn read_file(s: &Scheduler, caller: &Caller, args: Map<String, Value>) -> ApiResult<Value> {
    let ReadArgs {
        session_id,
        path,
        offset,
        max_bytes,
    } = decode_fields(args)?;
    check_session_id(&session_id)?;
    let max = max_bytes.unwrap_or(DEFAULT_READ_BYTES);
    if !(1..=MAX_READ_BYTES).contains(&max) {
        return Err(ApiError::invalid(
            "max_bytes",
            format!("must be between 1 and {MAX_READ_BYTES}, got {max}"),
        ));
    }
    let FileRead { entry, data } =
        actions::read_file(s, caller, &session_id, &path, "path").await?;
    let offset = offset.unwrap_or(0);
    let start = usize::try_from(offset)
        .ok()
        .filter(|o| *o <= data.len())
        .ok_or_else(|| {
            ApiError::invalid(
                "offset",
                format!("is past the end of the file ({} bytes)", data.len()),
            )
        })?;
    let end = start
        .saturating_add(usize::try_from(max).unwrap_or(usize::MAX))
        .min(data.len());
    let cut = end < data.len();
    let mut piece = data;
    piece.truncate(end);
    piece.drain(..start);
    let (encoding, content, taken) = match String::from_utf8(piece) {
        Ok(text) => {
            let n = text.len();
            ("utf-8", text, n)
        }
        Err(e) if cut && e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            ("utf-8", String::from_utf8(bytes).unwrap_or_default(), valid)
        }
        Err(e) => {
            let bytes = e.into_bytes();
            let n = bytes.len();
            let text = base64::engine::general_purpose::STANDARD.encode(bytes);
            ("base64", text, n)
        }
    };
    let next = start.saturating_add(taken);
    Ok(json!({
        "path": entry.path,
        "size": entry.size,
        "sha256": entry.sha256,
        "encoding": encoding,
        "content": content,
        "offset": start,
        "truncated": cut,
        "next_offset": cut.then_some(next),
    }))
}

/// `list_approvals`: the calls one session holds, or those of the caller's sessions
/// awaiting approval (the first page of `GET /v1/approvals`, oldest session first).
async fn list_approvals(
    s: &Scheduler,
    caller: &Caller,
    args: Map<String, Value>,
) -> ApiResult<Value> {
    let ListApprovalsArgs { session_id } = decode_fields(args)?;
    if let Some(id) = &session_id {
        check_session_id(id)?;
    }
    let q = actions::ApprovalQuery {
        session_id,
        limit: MAX_APPROVALS_LIMIT as usize,
        ..Default::default()
    };
    let page = actions::list_approvals(s, caller, &q).await?;
    Ok(json!({"approvals": to_value(&page.approvals)?}))
}
