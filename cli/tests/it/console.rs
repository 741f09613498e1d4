//! The browser console (`/console`) served by `agentq dev`: its files are public and carry
//! a strict Content-Security-Policy while the API behind them still needs the key; and the
//! console itself in a real browser (Debian's `chromium`, driven headless by npm's
//! `playwright-core`, both installed by `scripts/test`), on the scripted model: the key
//! typed in, a live answer, a filter, a retry, an approval from the inbox, a download, a
//! child in the tree, keyboard use, labels, a narrow window, and hostile text that never
//! runs (`tests/browser/console.mjs`).
//!
//! `AGENTQ_UPDATE_SCREENSHOTS=1` writes the browser test's screenshots into
//! `docs/console/` (else into a temporary directory).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use common::{Dev, agentq, text};

const ADMIN_KEY: &str = "console-admin-key-0123456789abcdef";

/// What the scheduler answers for the console's files.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'; require-trusted-types-for 'script'; trusted-types 'none'";

fn dev(dir: &Path, admin_key: Option<&str>, script: Option<&Path>) -> Dev {
    let mut cmd = agentq();
    cmd.args(["dev", "--addr", "127.0.0.1:0", "--workers", "4", "--db"])
        .arg(dir.join("agentq.db"))
        .arg("--workspace-root")
        .arg(dir.join("ws"))
        .env(
            "AGENTQ_POLICY_TOOLS",
            "read_file,list_dir,glob,grep,write_file,spawn_agent",
        );
    if let Some(script) = script {
        cmd.arg("--script").arg(script);
    }
    if let Some(key) = admin_key {
        cmd.env("AGENTQ_ADMIN_KEY", key);
    }
    Dev::spawn(&mut cmd)
}

async fn get(url: &str) -> reqwest::Response {
    reqwest::get(url).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_files_are_public_and_locked_down_and_the_api_still_needs_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dev(tmp.path(), Some(ADMIN_KEY), None);

    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/session.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let r = get(&format!("{}{path}", d.url)).await;
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers();
        let header = |n: &str| h.get(n).unwrap().to_str().unwrap().to_string();
        assert!(header("content-type").starts_with(kind), "{path}");
        assert_eq!(header("content-security-policy"), POLICY, "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{path}");
    }
    // The page loads only its own modules and style sheet: no inline script or style.
    let page = get(&format!("{}/console", d.url))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#"<script type="module" src="/console/app.js"></script>"#));
    assert_eq!(page.matches("<script").count(), 1, "{page}");
    assert!(!page.contains("style="), "{page}");
    assert!(!page.contains("http://") && !page.contains("https://"));

    // Nothing else is served from there: not a file of the disk, not a made-up name.
    for path in [
        "/console/nope.js",
        "/console/..%2F..%2FCargo.toml",
        "/console/%2Fetc%2Fpasswd",
        "/console/index.html/x",
    ] {
        let r = get(&format!("{}{path}", d.url)).await;
        assert_eq!(r.status(), 404, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "not_found", "{path}: {v}");
    }

    // The page is public; what it reads is not.
    let r = get(&format!("{}/v1/sessions", d.url)).await;
    assert_eq!(r.status(), 401);
    let r = reqwest::Client::new()
        .get(format!("{}/v1/sessions", d.url))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The OpenAPI document describes the console's routes as open.
    let doc: Value = get(&format!("{}/openapi.json", d.url))
        .await
        .json()
        .await
        .unwrap();
    assert!(doc["paths"]["/console"]["get"]["security"].is_null());
    assert_eq!(doc["paths"]["/console"]["get"]["tags"], json!(["console"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyless_dev_serves_the_console_and_its_api_without_a_key() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dev(tmp.path(), None, None);
    let r = get(&format!("{}/console", d.url)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(get(&format!("{}/v1/sessions", d.url)).await.status(), 200);
    // A write from the console's own origin passes the keyless server's cross-site
    // defence (the page sends JSON with its own Origin); another origin's does not.
    let post = |origin: String| {
        let url = d.url.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{url}/v1/sessions"))
                .header("Origin", origin)
                .json(&json!({"prompt": "from the console"}))
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(post(d.url.clone()).await, 201);
    assert_eq!(post("http://evil.example".into()).await, 403);
}

/// Where the test setup installs `playwright-core` (`scripts/test`), as
/// `tests/src/python.rs` finds the test cache.
fn playwright_modules() -> PathBuf {
    let dir = std::env::var_os("AGENTQ_PLAYWRIGHT_MODULES").map_or_else(
        || agentq_testkit::python::cache_dir().join("playwright/npm/node_modules"),
        PathBuf::from,
    );
    assert!(
        dir.join("playwright-core").is_dir(),
        "{} has no playwright-core: scripts/test installs it (npm install playwright-core), \
         or set AGENTQ_PLAYWRIGHT_MODULES",
        dir.display()
    );
    dir
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("AGENTQ_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.is_file(),
        "{} not found: scripts/test installs Debian's chromium (or set AGENTQ_CHROMIUM)",
        path.display()
    );
    path
}

/// The scripted model of the browser test: a variant per kind of session, chosen by a
/// marker in its prompt.
fn script(hostile: &str) -> Value {
    json!({
        "turns": [{"text": "done"}],
        "variants": [
            {"when_prompt_contains": "live:", "turns": [
                {"text": "Saving a note first.", "tool_calls": [{"id": "call_n1",
                    "name": "write_file", "arguments": {
                        "path": format!("{hostile}.txt"), "content": hostile}}]},
                {"text": "The answer is 42, and it arrives a few characters at a time.",
                 "chunk_chars": 4, "chunk_delay_ms": 40, "delay_ms": 300}
            ]},
            {"when_prompt_contains": "hold:", "turns": [
                {"text": "writing", "tool_calls": [{"id": "call_w1", "name": "write_file",
                    "arguments": {"path": "report.txt",
                                  "content": format!("report body {hostile}")}}]},
                {"text": "written"}
            ]},
            {"when_prompt_contains": "fail:", "turns": [
                {"text": "recovered on the retry",
                 "fail": [{"status": 400, "message": "scripted refusal"}]}
            ]},
            {"when_prompt_contains": "parent:", "turns": [
                {"text": "asking", "tool_calls": [{"id": "call_s1", "name": "spawn_agent",
                    "arguments": {"prompt": "child: help", "wait": true}}]},
                {"text": "the helper said {{last_tool_result}}"}
            ]},
            {"when_prompt_contains": "child:", "turns": [{"text": "helped"}]},
            // Runs for as long as the test does: a worker holds its lease meanwhile.
            {"when_prompt_contains": "slow:", "turns": [{"text": "at last", "delay_ms": 600_000}]}
        ]
    })
}

#[test]
fn the_console_in_a_browser() {
    let modules = playwright_modules();
    let chromium = chromium();
    let tmp = tempfile::tempdir().unwrap();
    let hostile =
        r#"<img src=x onerror="window.__pwned=3"></script><script>window.__pwned=4</script>"#;
    let script_path = tmp.path().join("script.json");
    std::fs::write(&script_path, script(hostile).to_string()).unwrap();
    let d = dev(tmp.path(), Some(ADMIN_KEY), Some(&script_path));

    // The script imports `playwright-core` from beside itself.
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::os::unix::fs::symlink(&modules, run.join("node_modules")).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/console.mjs");
    std::fs::copy(&src, run.join("console.mjs")).unwrap();
    let shots = if std::env::var_os("AGENTQ_UPDATE_SCREENSHOTS").is_some() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/console")
    } else {
        tmp.path().join("shots")
    };
    let out = Command::new("node")
        .arg(run.join("console.mjs"))
        .arg(&d.url)
        .arg(ADMIN_KEY)
        .arg(&shots)
        .env("AGENTQ_CHROMIUM", &chromium)
        .output()
        .unwrap();
    let log = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{log}");
    assert!(log.contains("console.mjs: ok"), "{log}");
}
