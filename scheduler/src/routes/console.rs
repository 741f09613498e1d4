//! `GET /console` and `GET /console/{file}`: the browser console, a page of plain ES
//! modules and CSS committed under `scheduler/console/` and embedded in the binary (no
//! build step, nothing fetched from elsewhere).
//!
//! The files are public like `/openapi.json`: they hold nothing a client could not read in
//! the repository. Everything the page shows it reads through the public API with the key
//! the person typed (none on a keyless `agentq dev`), so the console can do nothing its key
//! could not do with curl.
//!
//! Every answer carries a strict Content-Security-Policy: scripts and styles from this
//! origin only (no inline script, no `eval`, no inline style attribute), requests to this
//! origin only, never framed (`frame-ancestors 'none'`: no clickjacking of the approve
//! button), and Trusted Types required, so that even a mistaken `innerHTML` of a model's
//! output throws instead of running.

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The policy of every console answer (see the module docs).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'; require-trusted-types-for 'script'; \
     trusted-types 'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// The page itself, served at `/console`.
const INDEX: &str = include_str!("../../console/index.html");

/// Every other file of the console: (name, content type, text).
const FILES: &[(&str, &str, &str)] = &[
    ("app.js", JS, include_str!("../../console/app.js")),
    ("api.js", JS, include_str!("../../console/api.js")),
    ("dom.js", JS, include_str!("../../console/dom.js")),
    ("sse.js", JS, include_str!("../../console/sse.js")),
    ("sessions.js", JS, include_str!("../../console/sessions.js")),
    ("session.js", JS, include_str!("../../console/session.js")),
    (
        "transcript.js",
        JS,
        include_str!("../../console/transcript.js"),
    ),
    (
        "approvals.js",
        JS,
        include_str!("../../console/approvals.js"),
    ),
    ("batches.js", JS, include_str!("../../console/batches.js")),
    ("ops.js", JS, include_str!("../../console/ops.js")),
    (
        "console.css",
        CSS,
        include_str!("../../console/console.css"),
    ),
];

/// One console answer with the headers every one carries.
fn answer(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        // A new binary's files replace the old ones at once (revalidated, never stale).
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            HeaderName::from_static("cross-origin-opener-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ];
    (headers, body).into_response()
}

/// The console
///
/// The browser console's page (HTML). It reads everything through this API with the key
/// typed into it, or none on a keyless `agentq dev`.
#[utoipa::path(
    get,
    path = "/console",
    operation_id = "get_console",
    responses((status = 200, description = "The console's page", content_type = "text/html",
        body = String)),
)]
pub(super) async fn index() -> Response {
    answer(HTML, INDEX)
}

/// A file of the console
///
/// One of the console's scripts (ES modules) or its style sheet.
#[utoipa::path(
    get,
    path = "/console/{file}",
    operation_id = "get_console_file",
    params(("file" = String, Path, description = "The file's name, e.g. `app.js`")),
    responses((status = 200, description = "The file", content(
        ("text/javascript"),
        ("text/css"),
    ))),
)]
pub(super) async fn file(file: Result<Path<String>, PathRejection>) -> Result<Response, ApiError> {
    let Path(name) = file.map_err(|e| ApiError::invalid("file", e.body_text()))?;
    FILES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, ct, body)| answer(ct, body))
        .ok_or_else(|| ApiError::NotFound("no such file of the console".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_page_imports_is_served() {
        // An import of a file missing from `FILES` would fail only in a browser.
        for (_, _, text) in FILES.iter().chain([&("index.html", HTML, INDEX)]) {
            for piece in text.split(['"', '\'']) {
                let Some(name) = piece
                    .strip_prefix("./")
                    .or_else(|| piece.strip_prefix("/console/"))
                else {
                    continue;
                };
                if name.ends_with(".js") || name.ends_with(".css") {
                    assert!(
                        FILES.iter().any(|(n, _, _)| *n == name),
                        "{name} is imported but not served"
                    );
                }
            }
        }
    }
}
