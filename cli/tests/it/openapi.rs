//! `agentq dev` against its own OpenAPI document. The document is served at
//! `/openapi.json` without a key (on a server that requires keys everywhere else) and is
//! the committed copy, byte for byte. Then schemathesis (pinned, installed into the test
//! cache on first use) generates a bounded number of requests for every operation,
//! following the document's links from a created session to the operations on it, valid
//! and invalid ones alike, and holds every answer to the document: no 5xx, every status,
//! content type, header and body as described. `/metrics`, on its own listener, is
//! checked the same way.
//!
//! The sessions it creates run on the scripted model (a file written, then an answer), so
//! their messages, files and events are real ones.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;

use serde_json::json;

use common::{Dev, agentq};

/// The admin key the server requires (it takes every scope).
const KEY: &str = "openapi-test-admin-key-0123456789abcdef";

/// Requests generated per operation and phase: enough to reach every answer of the
/// common paths, few enough for the run to stay within a minute.
const MAX_EXAMPLES: &str = "25";

/// The generator's seed, fixed so that a failure replays; `AGENTQ_SCHEMATHESIS_SEED`
/// explores others.
const SEED: &str = "20261203";

/// Every check of an answer against the document (not `positive_data_acceptance`: a
/// request valid by the schema may still name a session that does not exist).
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance";

fn start_dev(dir: &Path) -> Dev {
    let script = dir.join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"text": "Writing.", "tool_calls": [{"name": "write_file",
                "arguments": {"path": "notes/out.txt", "content": "written"}}]},
            {"text": "Done."},
        ]})
        .to_string(),
    )
    .unwrap();
    Dev::spawn(
        agentq()
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(dir.join("dev.db"))
            .arg("--script")
            .arg(&script)
            .env("AGENTQ_ADMIN_KEY", KEY),
    )
}

/// Run schemathesis on the document at `api` against `base`, with `extra` arguments;
/// panics with its report unless every check passed.
fn schemathesis(dir: &Path, api: &str, base: &str, extra: &[&str]) {
    let seed = std::env::var("AGENTQ_SCHEMATHESIS_SEED").unwrap_or_else(|_| SEED.into());
    let out = agentq_testkit::python::schemathesis()
        .expect("schemathesis from PyPI, in the test cache (needs python3 with venv)")
        .current_dir(dir)
        .args(["run", &format!("{api}/openapi.json"), "--url", base])
        .args(["--header", &format!("Authorization: Bearer {KEY}")])
        .args(["--checks", CHECKS])
        .args(["--max-examples", MAX_EXAMPLES, "--seed", &seed])
        .args(["--request-timeout", "10", "--generation-database", "none"])
        .args(["--no-color", "--output-truncate", "false"])
        .args(extra)
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "schemathesis found answers that break the document ({}); replay with \
         AGENTQ_SCHEMATHESIS_SEED={seed}:\n{report}",
        out.status
    );
    // Its summary: `N generated, N passed`.
    let generated = report.lines().find_map(|l| {
        let (n, _) = l.trim().split_once(" generated, ")?;
        n.parse::<u64>().ok()
    });
    assert!(
        generated.is_some_and(|n| n > 0),
        "schemathesis ran no case:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn dev_answers_as_its_document_says() {
    // Installed first (once per cache): the server is not kept waiting for it.
    tokio::task::spawn_blocking(agentq_testkit::python::schemathesis)
        .await
        .unwrap()
        .expect("schemathesis from PyPI, in the test cache (needs python3 with venv)");
    let dir = tempfile::tempdir().unwrap();
    let dev = start_dev(dir.path());
    let http = reqwest::Client::new();

    // Served to anyone, exactly the committed document; the rest needs the key.
    let resp = http
        .get(format!("{}/openapi.json", dev.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let served = resp.text().await.unwrap();
    let committed =
        std::fs::read_to_string(agentq_testkit::repo_root().join("api/openapi.json")).unwrap();
    assert!(served == committed, "/openapi.json is not api/openapi.json");
    let refused = http
        .get(format!("{}/v1/sessions", dev.url))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    let metrics = dev
        .started
        .lines()
        .find_map(|l| l.split("/metrics on ").nth(1))
        .unwrap()
        .trim()
        .to_string();
    let at = dir.path().to_path_buf();
    let api = dev.url.clone();
    tokio::task::spawn_blocking(move || {
        schemathesis(&at, &api, &api, &["--exclude-path", "/metrics"]);
        // No link leads to it: nothing for the stateful phase.
        let alone = ["--include-path", "/metrics", "--phases", "coverage,fuzzing"];
        schemathesis(&at, &api, &metrics, &alone);
    })
    .await
    .unwrap();
}
