//! Durable workspaces across machines: two workers with their own workspace roots (two
//! disks). A session reads its input files at its first step, writes a file and changes
//! one with `shell`; its worker is SIGKILLed while a `shell` command that changed a file
//! still runs (its change not committed); the other worker resumes it with exactly the committed files (the lost
//! change undone, every committed one there), which the model's next request shows.

use std::time::Duration;

use serde_json::json;

use agentq_core::SessionStatus;
use agentq_core::workspace::InputFile;

use crate::common::{Cluster, Script, ToolUse, Turn, WorkerOpts, eventually};

const T: Duration = Duration::from_secs(90);

fn turn(text: &str, tools: Vec<ToolUse>) -> Turn {
    Turn {
        text: text.into(),
        tools,
    }
}

fn read(path: &str) -> ToolUse {
    ToolUse::call("read_file", json!({ "path": path }))
}

fn shell(command: &str) -> ToolUse {
    ToolUse::call("shell", json!({ "command": command }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_files_follow_a_session_to_another_machine() {
    let mut c = Cluster::start().await;
    let disk_a = c.dir("machine-a");
    let disk_b = c.dir("machine-b");
    let script = Script::new(vec![
        turn(
            "Reading the input, writing notes.",
            vec![
                read("input.txt"),
                ToolUse::call(
                    "write_file",
                    json!({"path": "notes/a.txt", "content": "written on the first machine"}),
                ),
            ],
        ),
        turn(
            "A shell change.",
            vec![shell("echo from-shell > shell.txt")],
        ),
        // Its worker dies while it runs: the file is on the first machine's disk, the
        // call's outcome is unknown and nothing of it is committed.
        turn(
            "A change that never commits.",
            vec![shell("echo lost > lost.txt && sleep 20")],
        ),
        turn(
            "Reading everything back.",
            vec![
                read("notes/a.txt"),
                read("shell.txt"),
                read("lost.txt"),
                read("input.txt"),
            ],
        ),
        Turn::text("Done."),
    ]);
    let a = c
        .spawn_ready_worker(&WorkerOpts {
            workspace_root: Some(disk_a.clone()),
            enable_shell: true,
            ..WorkerOpts::default()
        })
        .await;
    let sub = c
        .submit_with_files(
            script,
            &["read_file", "write_file", "shell", "http_fetch"],
            vec![InputFile {
                path: "input.txt".into(),
                data: b"the input of the session".to_vec(),
            }],
        )
        .await;
    let root = sub.id.clone();
    eventually(
        "the first machine runs turn 2's shell command",
        T,
        async || disk_a.join(&root).join("lost.txt").exists(),
    )
    .await;
    // The input was there at the first step.
    let first = c.llm_bodies(&sub, 1).join("\n");
    assert!(first.contains("the input of the session"), "{first}");
    // Committed so far: the input, the written file and the first shell change.
    let committed: Vec<String> = c
        .store
        .workspace_files(&root)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert_eq!(committed, vec!["input.txt", "notes/a.txt", "shell.txt"]);

    c.kill_worker(a);
    c.spawn_worker(&WorkerOpts {
        workspace_root: Some(disk_b.clone()),
        enable_shell: true,
        ..WorkerOpts::default()
    });
    let row = c.wait_all_terminal(std::slice::from_ref(&sub.id), T).await;
    assert_eq!(row[0].status, SessionStatus::Completed, "{:?}", row[0]);

    // The model's request after the reads shows the committed files, read on the second
    // machine, and not the change whose commit never happened.
    let last = c.llm_bodies(&sub, 4);
    assert_eq!(last.len(), 1, "turn 4 asked once");
    let last = &last[0];
    assert!(last.contains("written on the first machine"), "{last}");
    assert!(last.contains("from-shell"), "{last}");
    assert!(last.contains("the input of the session"), "{last}");
    assert!(last.contains("lost.txt: no such file"), "{last}");
    // The unsafe call that was interrupted was not run again: its outcome is unknown.
    assert!(
        last.contains("unknown") || last.contains("interrupted"),
        "{last}"
    );
    assert!(!disk_b.join(&root).join("lost.txt").exists());
    assert_eq!(
        std::fs::read_to_string(disk_b.join(&root).join("notes/a.txt")).unwrap(),
        "written on the first machine"
    );
    let (_, shell_out) = c
        .store
        .workspace_file(&root, "shell.txt")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(shell_out, b"from-shell\n");
    assert!(
        c.store
            .workspace_file(&root, "lost.txt")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_workspace_is_a_tool_error() {
    let mut c = Cluster::start().await;
    let script = Script::new(vec![
        turn(
            "Writing too much.",
            vec![ToolUse::call(
                "write_file",
                // 512 bytes are in the workspace already: 800 more are over the quota.
                json!({"path": "big.txt", "content": "x".repeat(800)}),
            )],
        ),
        turn(
            "Writing a little.",
            vec![ToolUse::call(
                "write_file",
                json!({"path": "small.txt", "content": "fits"}),
            )],
        ),
        Turn::text("Done."),
    ]);
    c.spawn_ready_worker(&WorkerOpts {
        workspace_quota_bytes: Some(1024),
        ..WorkerOpts::default()
    })
    .await;
    let sub = c
        .submit_with_files(
            script,
            &["read_file", "write_file"],
            vec![InputFile {
                path: "seed.txt".into(),
                data: vec![b'y'; 512],
            }],
        )
        .await;
    let row = c.wait_all_terminal(std::slice::from_ref(&sub.id), T).await;
    assert_eq!(row[0].status, SessionStatus::Completed, "{:?}", row[0]);
    let after = c.llm_bodies(&sub, 1).join("\n");
    assert!(after.contains("worker.workspace_quota_bytes"), "{after}");
    let files: Vec<String> = c
        .store
        .workspace_files(&sub.id)
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.path)
        .collect();
    assert_eq!(files, vec!["seed.txt", "small.txt"]);
}
