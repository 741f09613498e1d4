//! `agentq submit --input/--input-dir/--workspace-from` and `agentq files` against a real
//! scheduler on Postgres and Redis: the files given at submit are listed, printed and
//! saved byte for byte (one, and all through the tar), symbolic links in an input
//! directory are skipped, a fork sees its source's files, and bad flags and refused
//! files are one-line errors naming the flag or the field. The inputs are in the
//! workspace from the moment the session is created, so those need no worker; then, with
//! a real `agentq worker` (the scripted provider), a session reads its inputs at its
//! first step and its outputs come out, and a fork's changes stay in the fork; and the
//! same on the embedded `agentq dev`, whose files outlive a SIGKILL and reach a dev with
//! another workspace root (an empty cache).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::{Command, Output, Stdio};

use agentq_testkit::RedisServer;

use common::{Dev, Procs, migrated_db, text};

const ADMIN_KEY: &str = "files-cli-admin-key-0123456789abcdef";

/// `agentq` as the operator: the schedulers here accept that key.
fn agentq() -> Command {
    let mut c = common::agentq();
    c.env("AGENTQ_API_KEY", ADMIN_KEY);
    c
}

/// The tools the end-to-end case's sessions use (and the workers' defaults).
const ALLOWED_TOOLS: &str = "read_file,list_dir,glob,grep,write_file";

fn start_scheduler(db: &str, redis: &str) -> Dev {
    Dev::spawn(
        agentq()
            .env("AGENTQ_POLICY_TOOLS", ALLOWED_TOOLS)
            .args([
                "scheduler",
                "--addr",
                "127.0.0.1:0",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .env("AGENTQ_ADMIN_KEY", ADMIN_KEY)
            .env("AGENTQ_DATABASE_URL", db)
            .env("AGENTQ_REDIS_URL", redis),
    )
}

fn client(api: &str, args: &[&str]) -> Output {
    agentq()
        .env("AGENTQ_API_URL", api)
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn inputs_in_and_files_out() {
    let db = migrated_db();
    let redis = RedisServer::start().unwrap();
    let s = start_scheduler(&db, &redis.url());
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("data/nested")).unwrap();
    let binary: Vec<u8> = (0..=255u8).collect();
    std::fs::write(src.join("notes.md"), "# notes\n").unwrap();
    std::fs::write(src.join("data/nested/table.bin"), &binary).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("data/passwd")).unwrap();
    let single = tmp.path().join("single.txt");
    std::fs::write(&single, "one file").unwrap();

    let out = client(
        &s.url,
        &[
            "submit",
            "--input-dir",
            src.to_str().unwrap(),
            "--input",
            single.to_str().unwrap(),
            "work on the files",
        ],
    );
    let id = ok(&out).trim().to_string();
    assert!(
        text(&out.stderr).contains("skipped 1 symbolic links"),
        "{}",
        text(&out.stderr)
    );

    // The list, as a table and as the API's JSON.
    let list = ok(&client(&s.url, &["files", &id]));
    for p in ["notes.md", "data/nested/table.bin", "single.txt"] {
        assert!(list.contains(p), "{list}");
    }
    assert!(!list.contains("passwd"), "{list}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&client(&s.url, &["files", &id, "--json"]))).unwrap();
    assert_eq!(json["files"].as_array().unwrap().len(), 3, "{json}");

    // One file to stdout, byte for byte.
    let out = client(&s.url, &["files", &id, "data/nested/table.bin"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, binary);
    // One file, and then everything, into a directory.
    let one = tmp.path().join("one");
    ok(&client(
        &s.url,
        &["files", &id, "notes.md", "-o", one.to_str().unwrap()],
    ));
    assert_eq!(
        std::fs::read_to_string(one.join("notes.md")).unwrap(),
        "# notes\n"
    );
    let all = tmp.path().join("all");
    ok(&client(
        &s.url,
        &["files", &id, "-o", all.to_str().unwrap()],
    ));
    assert_eq!(
        std::fs::read(all.join("data/nested/table.bin")).unwrap(),
        binary
    );
    assert_eq!(
        std::fs::read_to_string(all.join("single.txt")).unwrap(),
        "one file"
    );
    assert!(!all.join("data/passwd").exists());

    // A fork starts with its source's files.
    let fork = ok(&client(
        &s.url,
        &["submit", "--workspace-from", &id, "fork"],
    ))
    .trim()
    .to_string();
    let list = ok(&client(&s.url, &["files", &fork]));
    assert!(list.contains("data/nested/table.bin"), "{list}");

    // Errors name the flag, the argument or the field.
    let out = client(&s.url, &["submit", "--input", "/no/such/file", "p"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--input /no/such/file"),
        "{}",
        text(&out.stderr)
    );
    let out = client(
        &s.url,
        &["submit", "--input-dir", single.to_str().unwrap(), "p"],
    );
    assert!(
        text(&out.stderr).contains("--input-dir"),
        "{}",
        text(&out.stderr)
    );
    let out = client(&s.url, &["files", &id, "../../etc/passwd"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("PATH \"../../etc/passwd\""),
        "{}",
        text(&out.stderr)
    );
    let out = client(&s.url, &["files", &id, "missing.txt"]);
    assert!(
        text(&out.stderr).contains("HTTP 404"),
        "{}",
        text(&out.stderr)
    );
    let deep = tmp.path().join("deep");
    let mut at = deep.clone();
    for _ in 0..40 {
        at.push("d");
    }
    std::fs::create_dir_all(&at).unwrap();
    std::fs::write(at.join("f"), "x").unwrap();
    let out = client(
        &s.url,
        &["submit", "--input-dir", deep.to_str().unwrap(), "p"],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("(field `files[\"d/d/d"), "{err}");
    assert!(err.contains("HTTP 422"), "{err}");
    let out = client(
        &s.url,
        &[
            "submit",
            "--workspace-from",
            "00000000-0000-7000-8000-000000000000",
            "p",
        ],
    );
    assert!(
        text(&out.stderr).contains("field `workspace_from`"),
        "{}",
        text(&out.stderr)
    );
}

/// The messages of a session, as the API sends them.
fn messages(api: &str, id: &str) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        reqwest::Client::new()
            .get(format!("{api}/v1/sessions/{id}/messages"))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
}

/// The scripted model of the end-to-end cases: a session reads `in/data.txt` and writes
/// `out/result.txt`; a fork (prompt with `FORK`) reads that, changes it and adds a file.
fn write_script(dir: &std::path::Path) -> std::path::PathBuf {
    let script = dir.join("script.json");
    let call = |id: &str, name: &str, args: serde_json::Value| serde_json::json!({"text": "", "tool_calls": [{"id": id, "name": name, "arguments": args}]});
    std::fs::write(
        &script,
        serde_json::json!({
            "turns": [
                call("c1", "read_file", serde_json::json!({"path": "in/data.txt"})),
                call("c2", "write_file", serde_json::json!({"path": "out/result.txt", "content": "the result"})),
                {"text": "done"},
            ],
            "variants": [{"when_prompt_contains": "FORK", "turns": [
                call("f1", "read_file", serde_json::json!({"path": "out/result.txt"})),
                call("f2", "write_file", serde_json::json!({"path": "out/result.txt", "content": "changed by the fork"})),
                call("f3", "write_file", serde_json::json!({"path": "fork-only.txt", "content": "f"})),
                {"text": "fork done"},
            ]}],
        })
        .to_string(),
    )
    .unwrap();
    script
}

#[test]
fn a_session_reads_its_inputs_and_its_outputs_come_out() {
    let db = migrated_db();
    let redis = RedisServer::start().unwrap();
    let s = start_scheduler(&db, &redis.url());
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(tmp.path());
    let _worker = Procs(vec![
        agentq()
            .arg("worker")
            .args(["--database-url", &db])
            .args(["--redis-url", &redis.url()])
            .args(["--default-provider", "scripted"])
            .arg("--script")
            .arg(&script)
            .arg("--workspace-root")
            .arg(tmp.path().join("ws"))
            .env("AGENTQ_METRICS_ADDR", "127.0.0.1:0")
            .env("AGENTQ_POLICY_TOOLS", ALLOWED_TOOLS)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ]);
    let inputs = tmp.path().join("in");
    std::fs::create_dir_all(&inputs).unwrap();
    std::fs::write(inputs.join("data.txt"), "hello input 42").unwrap();

    // `--input in/data.txt` from the temp dir keeps its relative place.
    let out = agentq()
        .env("AGENTQ_API_URL", &s.url)
        .current_dir(tmp.path())
        .args([
            "submit",
            "--wait",
            "--wait-timeout",
            "120",
            "--tools",
            "read_file,write_file",
        ])
        .args(["--input", "in/data.txt", "source task"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "done");
    let id = text(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("submitted "))
        .unwrap()
        .trim()
        .to_string();
    // The first step read the input.
    let transcript = messages(&s.url, &id);
    assert!(transcript.contains("hello input 42"), "{transcript}");

    // The outputs, as one file and as a tar unpacked into a directory.
    let one = client(&s.url, &["files", &id, "out/result.txt"]);
    assert_eq!(ok(&one), "the result");
    let list: serde_json::Value =
        serde_json::from_str(&ok(&client(&s.url, &["files", &id, "--json"]))).unwrap();
    let result = list["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "out/result.txt")
        .unwrap()
        .clone();
    assert!(result["modified_at_seq"].as_i64().unwrap() > 0, "{list}");
    let all = tmp.path().join("all");
    ok(&client(
        &s.url,
        &["files", &id, "-o", all.to_str().unwrap()],
    ));
    assert_eq!(
        std::fs::read_to_string(all.join("in/data.txt")).unwrap(),
        "hello input 42"
    );
    assert_eq!(
        std::fs::read_to_string(all.join("out/result.txt")).unwrap(),
        "the result"
    );

    // A fork sees the source's outputs; its own changes stay in the fork.
    let out = client(
        &s.url,
        &[
            "submit",
            "--wait",
            "--wait-timeout",
            "120",
            "--tools",
            "read_file,write_file",
            "--workspace-from",
            &id,
            "FORK task",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "fork done");
    let fork = text(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("submitted "))
        .unwrap()
        .trim()
        .to_string();
    assert!(messages(&s.url, &fork).contains("the result"));
    assert_eq!(
        ok(&client(&s.url, &["files", &fork, "out/result.txt"])),
        "changed by the fork"
    );
    assert_eq!(ok(&client(&s.url, &["files", &fork, "fork-only.txt"])), "f");
    assert_eq!(
        ok(&client(&s.url, &["files", &id, "out/result.txt"])),
        "the result"
    );
    let out = client(&s.url, &["files", &id, "fork-only.txt"]);
    assert!(
        text(&out.stderr).contains("HTTP 404"),
        "{}",
        text(&out.stderr)
    );
}

/// `agentq dev` on its embedded file, without keys on loopback.
fn dev(db: &std::path::Path, ws: &std::path::Path, script: &std::path::Path) -> Dev {
    Dev::spawn(
        agentq()
            .env_remove("AGENTQ_API_KEY")
            .env("AGENTQ_POLICY_TOOLS", ALLOWED_TOOLS)
            .env("AGENTQ_METRICS_ADDR", "127.0.0.1:0")
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(db)
            .arg("--script")
            .arg(script)
            .arg("--workspace-root")
            .arg(ws),
    )
}

fn dev_client(api: &str, args: &[&str]) -> Output {
    agentq()
        .env_remove("AGENTQ_API_KEY")
        .env("AGENTQ_API_URL", api)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_embedded_mode_keeps_files_across_a_killed_dev_and_another_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(tmp.path());
    let db = tmp.path().join("agentq.db");
    let input = tmp.path().join("data.txt");
    std::fs::write(&input, "embedded input 7").unwrap();
    let mut first = dev(&db, &tmp.path().join("ws-a"), &script);
    let out = dev_client(
        &first.url,
        &[
            "submit",
            "--wait",
            "--wait-timeout",
            "120",
            "--tools",
            "read_file,write_file",
            "--input-dir",
            tmp.path().join("in-dir").to_str().unwrap(),
            "source task",
        ],
    );
    // An input directory that does not exist is refused naming the flag.
    assert!(
        text(&out.stderr).contains("--input-dir"),
        "{}",
        text(&out.stderr)
    );
    std::fs::create_dir_all(tmp.path().join("in-dir/in")).unwrap();
    std::fs::copy(&input, tmp.path().join("in-dir/in/data.txt")).unwrap();
    let out = dev_client(
        &first.url,
        &[
            "submit",
            "--wait",
            "--wait-timeout",
            "120",
            "--tools",
            "read_file,write_file",
            "--input-dir",
            tmp.path().join("in-dir").to_str().unwrap(),
            "source task",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "done");
    let id = text(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("submitted "))
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        ok(&dev_client(&first.url, &["files", &id, "out/result.txt"])),
        "the result"
    );

    // SIGKILL, then a dev with another workspace root (another machine's cache).
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let second = dev(&db, &tmp.path().join("ws-b"), &script);
    assert_eq!(
        ok(&dev_client(&second.url, &["files", &id, "in/data.txt"])),
        "embedded input 7"
    );
    assert_eq!(
        ok(&dev_client(&second.url, &["files", &id, "out/result.txt"])),
        "the result"
    );
    let out = dev_client(
        &second.url,
        &[
            "submit",
            "--wait",
            "--wait-timeout",
            "120",
            "--tools",
            "read_file,write_file",
            "--workspace-from",
            &id,
            "FORK task",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let fork = text(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("submitted "))
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        ok(&dev_client(
            &second.url,
            &["files", &fork, "out/result.txt"]
        )),
        "changed by the fork"
    );
    assert_eq!(
        ok(&dev_client(&second.url, &["files", &id, "out/result.txt"])),
        "the result"
    );
    let all = tmp.path().join("all");
    ok(&dev_client(
        &second.url,
        &["files", &fork, "-o", all.to_str().unwrap()],
    ));
    assert_eq!(
        std::fs::read_to_string(all.join("in/data.txt")).unwrap(),
        "embedded input 7"
    );
    assert_eq!(
        std::fs::read_to_string(all.join("fork-only.txt")).unwrap(),
        "f"
    );
}
