//! A session's files: the list of its tree's committed workspace (`GET
//! /v1/sessions/{id}/files`, or with `?format=tar` every file in one tar, streamed a file
//! at a time) and one file's
//! bytes (`GET /v1/sessions/{id}/files/{path}`). Read like every other read of a session:
//! the caller's tenant only (another tenant's session is the same 404 as a missing one).
//!
//! The bytes were written by a model's tools, so they are hostile to a browser that
//! opens the API's URL: every answer says `X-Content-Type-Options: nosniff` and a
//! sandboxing `Content-Security-Policy`, and anything a browser would render as a page
//! (HTML, SVG, XML, scripts) is served as plain text and as an attachment.

use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use agentq_api::FileList;
use agentq_core::workspace::FileEntry;
use agentq_core::workspace_path::normalize;

use crate::actions::{self, ANY_PATH, FileRead};
use crate::error::ApiError;
use crate::http::body::no_nul;
use crate::http::{ApiResult, Auth, MAX_ID_LEN, not_found, respond};
use crate::state::Scheduler;

/// Query of `GET /v1/sessions/{id}/files`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    format: Option<String>,
}

/// List a session's files
///
/// Every committed file of the session's tree (a sub-agent shares its root's), sorted by
/// path; with `?format=tar`, one tar of them instead.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files",
    operation_id = "list_files",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("format" = Option<String>, Query, description = "`json` (the default) or `tar`."),
    ),
    responses((status = 200, description = "The files", content(
        (FileList = "application/json"),
        ("application/x-tar"),
    ))),
)]
pub(super) async fn list(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let id = crate::http::check_id(id)?;
    let Query(q) = query.map_err(|e| ApiError::InvalidQuery(e.body_text()))?;
    let tar = match q.format.as_deref() {
        None | Some("" | "json") => false,
        Some("tar") => true,
        Some(other) => {
            no_nul("format", other)?;
            return Err(ApiError::invalid(
                "format",
                format!("unknown format {other:?} (expected json or tar)"),
            ));
        }
    };
    let (root_id, list) = actions::list_files(&s, &caller, &id).await?;
    if !tar {
        return respond(StatusCode::OK, &list);
    }
    let body = Body::from_stream(tar_stream(s.clone(), root_id, list.files));
    let mut resp = (StatusCode::OK, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    attachment(h, &format!("{}.tar", ascii_name(&id)));
    hostile_headers(h);
    Ok(resp)
}

/// The end of a tar: two zero blocks.
const TAR_END: usize = 1024;

/// One file's tar entry — its header (and a long name's records), its bytes and their
/// padding — without the archive's end: a regular file, mode 0644, no owner and the
/// epoch as its time, so the same workspace always gives the same bytes.
fn tar_entry(path: &str, data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    let mut head = tar::Header::new_gnu();
    head.set_entry_type(tar::EntryType::Regular);
    head.set_mode(0o644);
    head.set_mtime(0);
    head.set_size(u64::try_from(data.len()).unwrap_or(u64::MAX));
    b.append_data(&mut head, path, data)?;
    let mut out = b.into_inner()?;
    out.truncate(out.len().saturating_sub(TAR_END));
    Ok(out)
}

/// Every file of `files`, read one at a time and sent as its tar entry, then the end of
/// the archive: the scheduler holds one file at a time, whatever the workspace's size. A
/// failure past the first byte can only cut the answer short, which leaves a tar without
/// its end (an unpacker reports it).
fn tar_stream(
    s: Scheduler,
    root_id: String,
    files: Vec<FileEntry>,
) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    struct At {
        s: Scheduler,
        root_id: String,
        files: std::vec::IntoIter<FileEntry>,
        done: bool,
    }
    let start = At {
        s,
        root_id,
        files: files.into_iter(),
        done: false,
    };
    futures::stream::unfold(start, |mut at| async move {
        if at.done {
            return None;
        }
        loop {
            let Some(f) = at.files.next() else {
                at.done = true;
                return Some((Ok(Bytes::from(vec![0u8; TAR_END])), at));
            };
            // A path the rules refuse cannot have been committed; should one be stored
            // anyway it stays out of the tar rather than reach an unpacker.
            if normalize(&f.path, &ANY_PATH).as_deref() != Ok(f.path.as_str()) {
                tracing::warn!(root_id = %at.root_id, path = %f.path.escape_debug(), "skipping a stored path that breaks the path rules");
                continue;
            }
            let entry = match at.s.store.workspace_file(&at.root_id, &f.path).await {
                // Gone since the listing (a concurrent commit): the tar holds what is.
                Ok(None) => continue,
                Ok(Some((_, data))) => tar_entry(&f.path, &data),
                Err(e) => {
                    tracing::warn!(root_id = %at.root_id, error = %e, "cannot read a workspace file for a tar");
                    Err(std::io::Error::other("cannot read the workspace"))
                }
            };
            at.done = entry.is_err();
            return Some((entry.map(Bytes::from), at));
        }
    })
}

/// Read a session's file
///
/// The bytes of one committed file of the session's tree. The path may hold `/` (and
/// `%2F`); it is held to the same rules as a request's files, so `..` or an absolute path
/// is a 422 naming `path`, never a file outside the tree. A type a browser would render
/// (HTML, SVG, scripts) is served as plain text and as an attachment.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files/{path}",
    operation_id = "get_file",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "The file's path in the workspace"),
    ),
    responses((status = 200, description = "The file's bytes, typed by its extension",
        content_type = "*/*")),
)]
pub(super) async fn get(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    params: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult<Response> {
    let (id, asked) = match params {
        Ok(Path(p)) => p,
        // Undecodable (not UTF-8 once percent-decoded): no file has such a name.
        Err(_) => return Err(ApiError::NotFound("file not found".into())),
    };
    no_nul("id", &id)?;
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(not_found(&id.chars().take(MAX_ID_LEN).collect::<String>()));
    }
    let FileRead { entry, data } = actions::read_file(&s, &caller, &id, &asked, "path").await?;
    let (content_type, render_risk) = content_type(&entry.path);
    let mut resp = (StatusCode::OK, Body::from(data)).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", entry.sha256)) {
        h.insert(header::ETAG, v);
    }
    if render_risk {
        let name = entry.path.rsplit('/').next().unwrap_or("file");
        attachment(h, &ascii_name(name));
    }
    hostile_headers(h);
    Ok(resp)
}

/// What no answer holding a model's bytes goes without: no sniffing a type, and no
/// script, style or frame of the API's origin should a browser render it anyway.
fn hostile_headers(h: &mut axum::http::HeaderMap) {
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
}

fn attachment(h: &mut axum::http::HeaderMap, name: &str) {
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
}

/// `name` with anything but `A-Z a-z 0-9 . _ -` replaced, for a header's quoted string.
fn ascii_name(name: &str) -> String {
    let n: String = name
        .chars()
        .take(128)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() { "file".into() } else { n }
}

/// The content type of a path by its extension, and whether a browser would render it
/// as a document of the API's origin (those are served as text, as an attachment).
fn content_type(path: &str) -> (&'static str, bool) {
    const TEXT: &str = "text/plain; charset=utf-8";
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => ext.to_ascii_lowercase(),
        _ => return ("application/octet-stream", false),
    };
    match ext.as_str() {
        "html" | "htm" | "xhtml" | "shtml" | "svg" | "svgz" | "xml" | "xsl" | "xslt" | "js"
        | "mjs" | "css" | "mht" | "mhtml" | "swf" => (TEXT, true),
        "txt" | "md" | "markdown" | "rst" | "log" | "csv" | "tsv" | "ini" | "toml" | "yaml"
        | "yml" | "cfg" | "conf" | "rs" | "py" | "go" | "c" | "h" | "cpp" | "hpp" | "java"
        | "ts" | "tsx" | "jsx" | "sh" | "sql" | "rb" | "diff" | "patch" => (TEXT, false),
        "json" => ("application/json", false),
        "jsonl" | "ndjson" => ("application/x-ndjson", false),
        "png" => ("image/png", false),
        "jpg" | "jpeg" => ("image/jpeg", false),
        "gif" => ("image/gif", false),
        "webp" => ("image/webp", false),
        // A PDF viewer runs scripts: downloaded, not shown.
        "pdf" => ("application/pdf", true),
        "zip" => ("application/zip", false),
        "gz" | "tgz" => ("application/gzip", false),
        "tar" => ("application/x-tar", false),
        "wasm" => ("application/wasm", false),
        _ => ("application/octet-stream", false),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn entries_and_the_end_make_one_tar() {
        let long = format!("{}/f.txt", "d".repeat(150));
        let mut t = tar_entry("a.txt", b"hi").unwrap();
        assert_eq!(t.len() % 512, 0);
        t.extend(tar_entry(&long, b"x").unwrap());
        t.extend([0u8; TAR_END]);
        let mut a = tar::Archive::new(t.as_slice());
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.txt".to_string(), long]);
    }

    #[test]
    fn types_by_extension_and_what_a_browser_must_not_render() {
        assert_eq!(
            content_type("a/b.txt"),
            ("text/plain; charset=utf-8", false)
        );
        assert_eq!(content_type("x.JSON"), ("application/json", false));
        assert_eq!(
            content_type("page.html"),
            ("text/plain; charset=utf-8", true)
        );
        assert_eq!(
            content_type("d/logo.SVG"),
            ("text/plain; charset=utf-8", true)
        );
        assert_eq!(content_type("r.pdf"), ("application/pdf", true));
        assert_eq!(
            content_type("Makefile"),
            ("application/octet-stream", false)
        );
        assert_eq!(content_type(".bashrc"), ("application/octet-stream", false));
        assert_eq!(
            content_type("a.html/b"),
            ("application/octet-stream", false)
        );
        assert_eq!(ascii_name("r\u{e9}sum\u{e9} \"x\".html"), "r_sum___x_.html");
        assert_eq!(ascii_name(""), "file");
    }
}
