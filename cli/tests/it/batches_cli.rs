//! `agentq batch` through the real binary against `agentq dev` (the embedded store, the
//! scripted model): a JSON Lines file submitted as one batch (`--max-running`,
//! `--metadata`, `--wait` with its progress line off a terminal), its status, its results
//! written in order with their custom ids, the listing; a batch read from stdin, its
//! results stopping at an unfinished session, its cancel; and the errors that name a line
//! of the file or a flag.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use common::{Dev, poll_until, text};

/// Sessions whose prompt holds `bad` fail (a refused model call); those holding `slow`
/// run long enough to be cancelled; the rest answer at once.
fn start_dev(dir: &Path) -> Dev {
    let script = dir.join("script.json");
    std::fs::write(
        &script,
        json!({
            "turns": [{"text": "Summary: done.",
                       "usage": {"input_tokens": 10, "output_tokens": 5}}],
            "variants": [
                {"when_prompt_contains": "bad",
                 "turns": [{"text": "never", "fail": [{"status": 400, "message": "model refused it"}]}]},
                {"when_prompt_contains": "slow",
                 "turns": [{"text": "late", "delay_ms": 600_000}]},
            ],
        })
        .to_string(),
    )
    .unwrap();
    Dev::spawn(
        common::agentq()
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(dir.join("agentq.db"))
            .args(["--default-provider", "scripted", "--script"])
            .arg(&script)
            .arg("--workspace-root")
            .arg(dir.join("ws")),
    )
}

fn client(api: &str, dir: &Path, args: &[&str]) -> Output {
    common::agentq()
        .current_dir(dir)
        .env("AGENTQ_API_URL", api)
        .args(args)
        .output()
        .unwrap()
}

/// `client` with `input` on its stdin.
fn client_stdin(api: &str, dir: &Path, args: &[&str], input: &str) -> Output {
    let mut child = common::agentq()
        .current_dir(dir)
        .env("AGENTQ_API_URL", api)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn lines(items: &[Value]) -> String {
    items.iter().map(|v| format!("{v}\n")).collect()
}

#[test]
fn a_file_is_one_batch_followed_read_listed_and_cancelled() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir);
    std::fs::write(
        dir.join("tasks.jsonl"),
        lines(&[
            json!({"custom_id": "t-1", "prompt": "Summarise ticket 1"}),
            json!({"custom_id": "t-2", "prompt": "Summarise the bad ticket"}),
            json!({"custom_id": "t-3", "prompt": "Summarise ticket 3", "priority": 7}),
        ]),
    )
    .unwrap();
    let out = client(
        &dev.url,
        dir,
        &[
            "batch",
            "submit",
            "tasks.jsonl",
            "--max-running",
            "2",
            "--metadata",
            "team=qa",
            "--wait",
            "--wait-timeout",
            "120",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // One session failed: exit 1.
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "no escape codes off a terminal: {stderr:?}"
    );
    let id = stdout.lines().next().unwrap().trim().to_string();
    let last = stderr
        .lines()
        .rfind(|l| l.starts_with(&format!("batch {id}: 3/3 done")))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(last.contains("1 failed · 0 running · 30 tokens"), "{last}");
    assert!(
        stderr.contains(&format!("agentq batch results {id}")),
        "{stderr}"
    );

    let view = json_of(&client(&dev.url, dir, &["batch", "status", &id]));
    assert_eq!(view["status"], "completed");
    assert_eq!(view["total"], 3);
    assert_eq!(
        (
            view["counts"]["completed"].clone(),
            view["counts"]["failed"].clone()
        ),
        (json!(2), json!(1))
    );
    assert_eq!(view["finish_reasons"], json!({"error": 1, "stop": 2}));
    assert_eq!(view["metadata"], json!({"team": "qa"}));
    assert_eq!(view["max_running"], 2);
    assert!(
        view["finished_at"].is_string() && view["eta_secs"].is_null(),
        "{view}"
    );

    // The results, in id order (the order of the file), each with its custom id.
    let out = client(&dev.url, dir, &["batch", "results", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let customs: Vec<&str> = results
        .iter()
        .map(|r| r["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(customs, ["t-1", "t-2", "t-3"]);
    assert_eq!(results[0]["status"], "completed");
    assert_eq!(results[0]["result"], "Summary: done.");
    assert_eq!(results[0]["usage"]["output_tokens"], 5);
    assert_eq!(results[1]["status"], "failed");
    assert!(
        results[1]["error"]
            .as_str()
            .unwrap()
            .contains("model refused it")
    );
    // Resumed after the first: the other two.
    let first = results[0]["id"].as_str().unwrap();
    let out = client(&dev.url, dir, &["batch", "results", &id, "--after", first]);
    assert_eq!(
        text(&out.stdout).lines().count(),
        2,
        "{}",
        text(&out.stderr)
    );

    // A batch from stdin that runs long: its results stop at the unfinished session.
    let slow = lines(&[
        json!({"custom_id": "s-1", "prompt": "slow one"}),
        json!({"custom_id": "s-2", "prompt": "slow two"}),
    ]);
    let out = client_stdin(&dev.url, dir, &["batch", "submit", "-"], &slow);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let slow_id = text(&out.stdout).trim().to_string();
    let out = client(&dev.url, dir, &["batch", "results", &slow_id]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert_eq!(text(&out.stdout), "");
    assert!(
        text(&out.stderr).contains("0 results written; the next session has not finished"),
        "{}",
        text(&out.stderr)
    );
    // Listed, newest first.
    let out = client(&dev.url, dir, &["batch", "list"]);
    let table = text(&out.stdout);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert!(
        rows[0].starts_with(&slow_id) && rows[1].starts_with(&id),
        "{table}"
    );
    assert!(
        rows[1].contains("completed") && rows[1].contains("3/3"),
        "{table}"
    );

    // Cancelled: at once what waits, the running one at its next step.
    let out = client(&dev.url, dir, &["batch", "cancel", &slow_id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(view["cancelled_at"].is_string(), "{view}");
    poll_until("the slow batch cancelled", Duration::from_secs(60), || {
        let v = json_of(&client(&dev.url, dir, &["batch", "status", &slow_id]));
        (v["status"] == "cancelled" && v["counts"]["cancelled"] == 2).then_some(())
    });
    let out = client(&dev.url, dir, &["batch", "results", &slow_id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 2);
}

#[test]
fn errors_name_the_line_of_the_file_or_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let dev = start_dev(dir);
    std::fs::write(
        dir.join("bad.jsonl"),
        lines(&[
            json!({"prompt": "fine"}),
            json!({"prompt": "x", "mode": "sideways"}),
        ]),
    )
    .unwrap();
    let out = client(&dev.url, dir, &["batch", "submit", "bad.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("bad.jsonl:2: "), "{err}");
    assert!(err.contains("(field `mode`)"), "{err}");
    std::fs::write(
        dir.join("torn.jsonl"),
        "{\"prompt\": \"a\"}\n\n{\"prompt\": \n",
    )
    .unwrap();
    let err = text(&client(&dev.url, dir, &["batch", "submit", "torn.jsonl"]).stderr);
    assert!(err.contains("torn.jsonl:3: invalid JSON"), "{err}");
    std::fs::write(
        dir.join("dup.jsonl"),
        lines(&[
            json!({"prompt": "a", "custom_id": "same"}),
            json!({"prompt": "b", "custom_id": "same"}),
        ]),
    )
    .unwrap();
    let err = text(&client(&dev.url, dir, &["batch", "submit", "dup.jsonl"]).stderr);
    assert!(
        err.contains("dup.jsonl:2: ") && err.contains("(field `custom_id`)"),
        "{err}"
    );
    std::fs::write(dir.join("ok.jsonl"), lines(&[json!({"prompt": "a"})])).unwrap();
    // A bad flag: refused by the client, or by the server and named as the flag.
    let out = client(
        &dev.url,
        dir,
        &["batch", "submit", "ok.jsonl", "--max-running", "0"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("'--max-running <N>'"),
        "{}",
        text(&out.stderr)
    );
    for _ in 0..5 {
        // Refused before the server reads the upload: still answered, not cut off.
        let out = client(
            &dev.url,
            dir,
            &["batch", "submit", "ok.jsonl", "--metadata", "api_key=sk-1"],
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("--metadata: ") && err.contains("credential"),
            "{err}"
        );
    }
    let err = text(&client(&dev.url, dir, &["batch", "submit", "missing.jsonl"]).stderr);
    assert!(err.contains("cannot read missing.jsonl"), "{err}");
    let err = text(&client(&dev.url, dir, &["batch", "status", "no-such-batch"]).stderr);
    assert!(err.contains("batch no-such-batch not found"), "{err}");
    // Nothing of the refused files was created.
    let out = client(&dev.url, dir, &["batch", "list", "--json"]);
    assert_eq!(json_of(&out)["batches"], json!([]));
}
