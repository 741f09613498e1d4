//! Batches through the real `agentq` binary against `agentq dev` (the embedded store, the
//! scripted model): `submit --each GLOB` (one session per file, that file as its input,
//! one batch id, the fields' flags), `--wait` with its progress line (plain, no escape
//! codes, off a terminal), `sessions --batch --status failed` with the reason and error
//! columns, `retry --batch`, `cancel --batch`, and the errors that name a flag or a line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use common::{Dev, text, wait_until};

/// Sessions whose prompt names this file fail (a refused model call, once: a retry
/// succeeds); those naming
/// `slow` wait long enough to be cancelled; the rest answer at once.
fn write_script(dir: &Path) -> std::path::PathBuf {
    let script = dir.join("script.json");
    std::fs::write(
        &script,
        json!({
            "turns": [{"text": "Summary: done.",
                       "usage": {"input_tokens": 10, "output_tokens": 5}}],
            "variants": [
                {"when_prompt_contains": "bad.txt",
                 "turns": [{"text": "never", "fail": [{"status": 400, "message": "model refused the ticket"}]}]},
                {"when_prompt_contains": "slow",
                 "turns": [{"text": "late", "delay_ms": 600_000}]},
            ],
        })
        .to_string(),
    )
    .unwrap();
    script
}

fn start_dev(dir: &Path, script: &Path) -> Dev {
    Dev::spawn(
        common::agentq()
            .env(
                "AGENTQ_POLICY_TOOLS",
                "read_file,list_dir,glob,grep,write_file",
            )
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(dir.join("agentq.db"))
            .args(["--default-provider", "scripted", "--script"])
            .arg(script)
            .arg("--workspace-root")
            .arg(dir.join("ws")),
    )
}

/// The client, run in `dir` (where the globs are relative to).
fn client(api: &str, dir: &Path, args: &[&str]) -> Output {
    common::agentq()
        .current_dir(dir)
        .env("AGENTQ_API_URL", api)
        .args(args)
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn each_file_is_a_session_of_one_batch_followed_retried_and_cancelled() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("tickets")).unwrap();
    for (name, body) in [
        ("b.txt", "printer on fire"),
        ("a.txt", "cannot log in"),
        ("bad.txt", "???"),
        ("notes.md", "not a ticket"),
    ] {
        std::fs::write(dir.join("tickets").join(name), body).unwrap();
    }
    let script = write_script(dir);
    let dev = start_dev(dir, &script);

    let out = client(
        &dev.url,
        dir,
        &[
            "submit",
            "--each",
            "tickets/*.txt",
            "Summarise the ticket",
            "--metadata",
            "team=support",
            "--metadata",
            "run=nightly=1",
            "--token-budget",
            "50000",
            "--timeout-secs",
            "600",
            "--max-running",
            "2",
            "--priority",
            "7",
            "--tools",
            "read_file,write_file",
            "--sensitive-tools",
            "write_file",
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
    // The ids, each with its file, in the glob's (sorted) order.
    let submitted: Vec<(&str, &str)> = stdout
        .lines()
        .take(3)
        .map(|l| l.split_once('\t').unwrap())
        .collect();
    let files: Vec<&str> = submitted.iter().map(|(_, f)| *f).collect();
    assert_eq!(files, ["tickets/a.txt", "tickets/b.txt", "tickets/bad.txt"]);
    let batch = batch_of(&stderr);
    assert!(
        stderr.contains(&format!("agentq sessions --batch {batch}")),
        "{stderr}"
    );
    // The final progress line: everything done, one failed, the tokens spent.
    let last = stderr
        .lines()
        .rfind(|l| l.starts_with(&format!("batch {batch}: 3/3 done")))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(last.contains("1 failed · 0 running · 30 tokens"), "{last}");
    assert!(stderr.contains("2/3 completed"), "{stderr}");

    // Each session: its file as input, the flags' fields, the batch.
    let (a, _) = submitted[0];
    let view = json_of(&client(&dev.url, dir, &["status", a]));
    assert_eq!(view["batch_id"], batch.as_str());
    assert_eq!(
        view["metadata"],
        json!({"team": "support", "run": "nightly=1", "file": "tickets/a.txt"})
    );
    assert_eq!(
        (
            &view["token_budget"],
            &view["timeout_secs"],
            &view["priority"]
        ),
        (&json!(50000), &json!(600), &json!(7))
    );
    assert_eq!(view["sensitive_tools"], json!(["write_file"]));
    assert!(
        view["prompt"]
            .as_str()
            .unwrap()
            .ends_with("The input file is `tickets/a.txt` in your workspace."),
        "{view}"
    );
    let out = client(&dev.url, dir, &["files", a, "tickets/a.txt"]);
    assert_eq!(text(&out.stdout), "cannot log in", "{}", text(&out.stderr));

    // The failed one, with why.
    let (bad, _) = submitted[2];
    let out = client(
        &dev.url,
        dir,
        &["sessions", "--batch", &batch, "--status", "failed"],
    );
    let table = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "ID", "STATUS", "REASON", "ITER", "TOKENS", "CREATED", "(UTC)", "ERROR"
        ]
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 1, "{table}");
    assert!(
        rows[0].starts_with(bad) && rows[0].contains("failed  error"),
        "{table}"
    );
    assert!(rows[0].contains("model refused the ticket"), "{table}");

    // Retried by the batch: the failed one only.
    let out = client(&dev.url, dir, &["retry", "--batch", &batch]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let retried: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(retried.len(), 1, "{retried:?}");
    assert!(
        retried[0].starts_with(&format!("retried {bad}")),
        "{retried:?}"
    );

    // A batch that runs long, cancelled as a whole.
    let out = client(
        &dev.url,
        dir,
        &["submit", "--each", "tickets/[ab].txt", "slow: {file}"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let slow = batch_of(&text(&out.stderr));
    let out = client(&dev.url, dir, &["cancel", "--batch", &slow]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with(&format!("batch {slow}: cancelled ")),
        "{}",
        text(&out.stdout)
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(wait_until(
        "the slow batch cancelled",
        Duration::from_secs(60),
        || async { in_batch(&dev.url, dir, &slow, "cancelled") == 2 },
    ));
    let out = client(&dev.url, dir, &["cancel", "--batch", &slow]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("has no unfinished session"),
        "{}",
        text(&out.stderr)
    );
    // The first batch is untouched by the second's cancel: its retried session (the
    // script fails it once) completes too.
    rt.block_on(wait_until(
        "the retried session completed",
        Duration::from_secs(60),
        || async { in_batch(&dev.url, dir, &batch, "completed") == 3 },
    ));
}

/// The batch id `submit` printed on stderr (`batch ID: …`).
fn batch_of(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| Some(l.strip_prefix("batch ")?.split(':').next()?.to_string()))
        .unwrap_or_else(|| panic!("no batch line: {stderr}"))
}

/// How many sessions of `batch` have `status`, as `agentq sessions --json` lists them.
fn in_batch(url: &str, dir: &Path, batch: &str, status: &str) -> usize {
    let args = ["sessions", "--batch", batch, "--status", status, "--json"];
    let page = json_of(&client(url, dir, &args));
    page["sessions"].as_array().unwrap().len()
}

fn usage_error(out: &Output, needle: &str) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(needle), "{needle}: {err}");
    err
}

#[test]
fn bad_flags_and_lines_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let script = write_script(dir);
    let dev = start_dev(dir, &script);
    let run = |args: &[&str]| client(&dev.url, dir, args);

    let err = usage_error(&run(&["submit", "--each", "tickets/*.txt", "p"]), "--each");
    assert!(err.contains("no file matches"), "{err}");
    usage_error(&run(&["submit", "--metadata", "team", "p"]), "--metadata");
    usage_error(
        &run(&["submit", "--max-running", "3", "p"]),
        "--max-running",
    );
    usage_error(&run(&["submit", "--priority", "12", "p"]), "--priority");
    usage_error(&run(&["cancel"]), "--batch");
    usage_error(&run(&["retry", "--since", "1h"]), "--since");

    // A refused line is named by its line, from 1, as the reader's own errors are.
    let file = dir.join("tasks.jsonl");
    std::fs::write(
        &file,
        "{\"prompt\": \"one\"}\n\n{\"prompt\": \"two\", \"mode\": \"turbo\"}\n",
    )
    .unwrap();
    let err = usage_error(
        &run(&["submit", "--file", "tasks.jsonl"]),
        "tasks.jsonl:3: ",
    );
    assert!(
        err.contains("(field `mode`)") && !err.contains("[2]"),
        "{err}"
    );
    std::fs::write(&file, "{\"prompt\": \"one\"}\n\n[2]\n").unwrap();
    usage_error(
        &run(&["submit", "--file", "tasks.jsonl"]),
        "tasks.jsonl:3: expected a JSON object",
    );
    // Nothing was created by the refused batch.
    let page = json_of(&run(&["sessions", "--json"]));
    assert_eq!(page["sessions"], json!([]), "{page}");

    // Every command's help shows examples and the new flags.
    for (cmd, flags) in [
        (
            "submit",
            &[
                "--each",
                "--sensitive-tools",
                "--metadata",
                "--token-budget",
                "--timeout-secs",
                "--max-running",
                "--queue",
                "--priority",
            ][..],
        ),
        ("sessions", &["--batch", "--status"][..]),
        ("cancel", &["--batch"][..]),
        ("retry", &["--batch", "--failed"][..]),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
            .args([cmd, "--help"])
            .output()
            .unwrap();
        let help = text(&out.stdout);
        assert!(help.contains("Examples:\n  agentq "), "{cmd}: {help}");
        for f in flags {
            assert!(help.contains(f), "{cmd} {f}: {help}");
        }
    }
}
