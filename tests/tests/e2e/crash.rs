//! A worker SIGKILLed at each point of a turn, and a worker frozen past its lease: the
//! session resumes from its last checkpoint and ends exactly as an uninterrupted run.

use std::time::Duration;

use agentq_core::{SessionStatus, Signals};
use futures::StreamExt;

use crate::common::{Cluster, ClusterOpts, Script, ToolUse, Turn, WorkerOpts, eventually};

const T: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillPoint {
    /// While turn 1's answer is streaming (nothing of turn 1 committed yet).
    LlmStream,
    /// While turn 0's only tool runs (turn 0's answer committed, write-ahead).
    ToolRunning,
    /// Between turn 1's two parallel tool results: `fast` committed, `slow` in flight.
    BetweenResults,
}

/// Script [`Script::three_turns`]: turn 0 GETs `t0a`; turn 1 GETs `fast` and `slow` in
/// parallel; turn 2 answers.
async fn sigkill_resumes_exactly(point: KillPoint, opts: ClusterOpts) {
    let mut c = Cluster::start_with(opts).await;
    let a = c.spawn_ready_worker(&WorkerOpts::default()).await;

    // The reference: the same script, run without interruption.
    let reference = c.submit(Script::three_turns()).await;
    let ref_row = c
        .wait_all_terminal(std::slice::from_ref(&reference.id), T)
        .await
        .remove(0);
    assert_eq!(ref_row.status, SessionStatus::Completed, "{ref_row:?}");
    let expected = c.transcript(&reference).await;
    // user, assistant(t0a), t0a, assistant(fast, slow), fast, slow, answer
    assert_eq!(expected.len(), 7, "{expected:#?}");

    let mut script = Script::three_turns();
    match point {
        // ~9 chunks at 700 ms: the stream lasts ~6 s; the kill comes within milliseconds.
        KillPoint::LlmStream => {
            script.slow_once.insert(1, Duration::from_millis(700));
        }
        KillPoint::ToolRunning => {
            script.block_tool_once.insert("t0a".into());
        }
        KillPoint::BetweenResults => {
            script.block_tool_once.insert("slow".into());
        }
    }
    let victim = c.submit(script).await;

    match point {
        KillPoint::LlmStream => {
            eventually("worker A requested turn 1", T, async || {
                c.llm_requests(&victim, 1) == 1
            })
            .await;
            c.kill_worker(a);
            // Killed before the answer was complete: user, assistant 0, t0a only.
            assert_eq!(c.message_count(&victim.id).await, 3);
        }
        KillPoint::ToolRunning => {
            eventually("t0a hit by worker A", T, async || {
                c.tool_hits(&victim, "t0a") == 1
            })
            .await;
            c.kill_worker(a);
            // Write-ahead: the answer asking for the tool was committed before it started.
            let t = c.transcript(&victim).await;
            assert_eq!(t.len(), 2, "{t:#?}");
            assert_eq!(t[1]["tool_calls"][0]["id"], "call_0_0");
        }
        KillPoint::BetweenResults => {
            eventually("fast committed while slow is in flight", T, async || {
                c.tool_hits(&victim, "slow") == 1 && c.message_count(&victim.id).await == 5
            })
            .await;
            c.kill_worker(a);
            let t = c.transcript(&victim).await;
            assert_eq!(t.len(), 5, "{t:#?}");
            assert_eq!(t[4]["tool_call_id"], "call_1_0", "the fast result: {t:#?}");
        }
    }

    // A second worker resumes it (its reclaimer re-queues A's sessions from the store once
    // A's liveness row has expired), saying so with the default log filter.
    let b = c.spawn_worker(&WorkerOpts {
        default_log: true,
        ..WorkerOpts::default()
    });
    let row = c
        .wait_all_terminal(std::slice::from_ref(&victim.id), T)
        .await
        .remove(0);
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    assert_eq!(row.takeovers, 1, "{row:?}");
    let log = c.worker_log(b);
    assert!(
        log.lines()
            .any(|l| l.contains("taking over a session a dead worker left")
                && l.contains(&victim.id)),
        "{log}"
    );
    assert_eq!(c.transcript(&victim).await, expected);
    // Nothing counted twice, nothing lost.
    assert_eq!(row.iteration, ref_row.iteration);
    assert_eq!(row.usage, ref_row.usage);
    // Each claim bumps the lease epoch (the crash count in `attempts` is reset by the
    // resumed run's progress).
    assert!(
        row.lease_epoch >= 2,
        "resumed by a second claim: epoch {}",
        row.lease_epoch
    );

    // What was asked again: only the turn that was not committed, and the tool that was
    // in flight (a GET: at least once). Committed answers and results never.
    let (llm, tools): ([usize; 3], [(&str, usize); 3]) = match point {
        KillPoint::LlmStream => ([1, 2, 1], [("t0a", 1), ("fast", 1), ("slow", 1)]),
        KillPoint::ToolRunning => ([1, 1, 1], [("t0a", 2), ("fast", 1), ("slow", 1)]),
        KillPoint::BetweenResults => ([1, 1, 1], [("t0a", 1), ("fast", 1), ("slow", 2)]),
    };
    for (turn, n) in llm.iter().enumerate() {
        assert_eq!(
            c.llm_requests(&victim, turn),
            *n,
            "LLM requests for turn {turn} ({point:?}): {:#?}",
            c.hits()
        );
    }
    for (name, n) in tools {
        assert_eq!(
            c.tool_hits(&victim, name),
            n,
            "hits of tool {name} ({point:?}): {:#?}",
            c.hits()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_llm_stream_resumes_exactly() {
    sigkill_resumes_exactly(KillPoint::LlmStream, ClusterOpts::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_tool_runs_resumes_exactly() {
    sigkill_resumes_exactly(KillPoint::ToolRunning, ClusterOpts::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_tool_results_resumes_exactly() {
    sigkill_resumes_exactly(KillPoint::BetweenResults, ClusterOpts::default()).await;
}

/// The same on the scale-out layout: the worker's sessions in partitions of a Redis
/// Cluster, the session on one of two Postgres shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_tool_runs_on_a_redis_cluster_and_two_shards_resumes_exactly() {
    sigkill_resumes_exactly(KillPoint::ToolRunning, ClusterOpts::scaled_out()).await;
}

/// An unsafe call (a POST) in flight at the crash is not repeated: the resumed session
/// gets an "outcome unknown" error result for it, and the model goes on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_post_runs_does_not_repeat_it() {
    let mut c = Cluster::start().await;
    let a = c.spawn_ready_worker(&WorkerOpts::default()).await;
    let mut script = Script::new(vec![
        Turn {
            text: "Charging the card.".into(),
            tools: vec![ToolUse {
                name: "charge".into(),
                post: true,
                spawn: None,
                read: false,
                call: None,
            }],
        },
        Turn::text("I could not tell whether the charge went through."),
    ]);
    script.block_tool_once.insert("charge".into());
    let victim = c.submit(script).await;
    eventually("the POST hit by worker A", T, async || {
        c.tool_hits(&victim, "charge") == 1
    })
    .await;
    c.kill_worker(a);
    assert_eq!(c.message_count(&victim.id).await, 2, "write-ahead");

    c.spawn_worker(&WorkerOpts::default());
    let row = c
        .wait_all_terminal(std::slice::from_ref(&victim.id), T)
        .await
        .remove(0);
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    assert_eq!(
        c.tool_hits(&victim, "charge"),
        1,
        "a POST whose outcome is unknown was sent again"
    );
    let t = c.transcript(&victim).await;
    assert_eq!(t.len(), 4, "{t:#?}");
    assert_eq!(t[2]["tool_call_id"], "call_0_0");
    assert_eq!(t[2]["is_error"], true, "{t:#?}");
    let content = t[2]["content"].as_str().unwrap_or_default();
    assert!(content.contains("outcome unknown"), "{content:?}");
    assert_eq!(c.llm_requests(&victim, 0), 1);
    assert_eq!(c.llm_requests(&victim, 1), 1);
}

/// Worker A freezes (SIGSTOP) mid-stream; B takes the session over and finishes it; A
/// thaws and must find out at its next heartbeat or write that the lease is gone — and
/// write nothing, publish nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_worker_cannot_write_after_wakeup() {
    let mut c = Cluster::start().await;
    let a = c.spawn_ready_worker(&WorkerOpts::default()).await;
    let script = || {
        Script::new(vec![
            Turn::gets("Fetching the page.", &["page"]),
            Turn::text("Finished, whoever ran me."),
        ])
    };
    let reference = c.submit(script()).await;
    c.wait_all_terminal(std::slice::from_ref(&reference.id), T)
        .await;
    let expected = c.transcript(&reference).await;
    assert_eq!(expected.len(), 4, "{expected:#?}");

    let done_all = c.count_done_messages().await;
    let mut s = script();
    // 6 chunks at 800 ms: A is frozen a few ms into a ~5 s stream, which the fake keeps
    // sending into A's socket; A reads the rest when it thaws.
    s.slow_once.insert(1, Duration::from_millis(800));
    let victim = c.submit(s).await;
    let mut done_one = c.queue.subscribe_completion(&victim.id).await.unwrap();

    eventually("worker A requested turn 1", T, async || {
        c.llm_requests(&victim, 1) == 1
    })
    .await;
    let held = c.row(&victim.id).await;
    assert_eq!(held.status, SessionStatus::Running);
    c.pause_worker(a);

    c.spawn_worker(&WorkerOpts::default());
    let finished = c
        .wait_all_terminal(std::slice::from_ref(&victim.id), T)
        .await
        .remove(0);
    assert_eq!(finished.status, SessionStatus::Completed, "{finished:?}");
    assert!(
        finished.lease_epoch > held.lease_epoch,
        "B claimed it: epoch {} -> {}",
        held.lease_epoch,
        finished.lease_epoch
    );
    let by_b = c.transcript(&victim).await;
    assert_eq!(by_b, expected);
    let completion = tokio::time::timeout(Duration::from_secs(10), done_one.next())
        .await
        .expect("B published the completion")
        .unwrap();
    assert_eq!(completion.status, SessionStatus::Completed);

    c.resume_worker(a);
    // A thaws, reads the rest of its stream and heartbeats: it must find the lease gone.
    // (Checked last, so that a zombie that did write fails on what it wrote.)
    let noticed = c
        .log_appears(a, "lease lost", Duration::from_secs(20))
        .await;
    // Whatever else it would try, it has tried once it has stopped: it is told to, and
    // its exit waited for.
    c.term_worker(a);
    assert!(
        c.wait_exit(a, Duration::from_secs(30)).await.is_some(),
        "A did not stop:\n{}",
        c.worker_log(a)
    );

    assert_eq!(
        c.transcript(&victim).await,
        by_b,
        "the zombie wrote to the history"
    );
    let row = c.row(&victim.id).await;
    assert_eq!(row.status, SessionStatus::Completed);
    assert_eq!(row.iteration, finished.iteration);
    assert_eq!(row.lease_epoch, finished.lease_epoch);
    assert_eq!(
        row.updated_at, finished.updated_at,
        "the zombie wrote to the row"
    );
    assert_eq!(row.finished_at, finished.finished_at);
    // Published once, by B.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), done_one.next())
            .await
            .is_err(),
        "a second completion was published on agentq:done:<id>"
    );
    assert_eq!(
        done_all
            .lock()
            .unwrap()
            .get(&victim.id)
            .copied()
            .unwrap_or(0),
        1,
        "messages on agentq:done"
    );
    assert_eq!(
        c.completion_entries().await.get(&victim.id).copied(),
        Some(1),
        "entries in agentq:completions"
    );
    assert_eq!(c.llm_requests(&victim, 0), 1);
    assert_eq!(c.tool_hits(&victim, "page"), 1);
    assert!(
        noticed,
        "A never logged the lost lease:\n{}",
        c.worker_log(a)
    );
}

/// Open the FIFO `path` for writing once a reader has it open (without one, a
/// non-blocking open fails with ENXIO): proof that a `read_file` call is in it.
async fn writer_once_read(path: &std::path::Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    const O_NONBLOCK: i32 = 0o4000;
    let mut file = None;
    eventually("a reader in the pipe", T, async || {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(O_NONBLOCK)
            .open(path)
        {
            Ok(f) => file = Some(f),
            Err(e) if e.raw_os_error() == Some(6) => {}
            Err(e) => panic!("opening {}: {e}", path.display()),
        }
        file.is_some()
    })
    .await;
    file.unwrap()
}

/// A worker SIGKILLed while a read-only call runs whose response it had not committed
/// (the response was waiting to share one commit with the call's result): nothing of the
/// turn is stored, the resumed session asks the model again for it, and the session ends
/// with one answer and one result, as an uninterrupted run would. The second worker, with
/// the default grace, commits the response at the grace while the same call blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_a_held_response_reads_asks_the_model_again() {
    let mut c = Cluster::start().await;
    let a = c
        .spawn_ready_worker(&WorkerOpts {
            write_ahead_grace_ms: Some(60_000),
            ..WorkerOpts::default()
        })
        .await;
    let mut script = Script::new(vec![
        Turn::reads("Reading the pipe.", &["pipe"]),
        Turn::text("The pipe says hello."),
    ]);
    // Time to make the pipe before the call comes (9 chunks at 300 ms).
    script.slow_once.insert(0, Duration::from_millis(300));
    let victim = c.submit(script).await;
    let dir = c.workspace(&victim.id);
    std::fs::create_dir_all(&dir).unwrap();
    let pipe = dir.join("pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .unwrap();
    assert!(made.success());

    // Worker A is inside the read: its response is held, not stored.
    let reader = writer_once_read(&pipe).await;
    assert_eq!(c.llm_requests(&victim, 0), 1);
    assert_eq!(
        c.message_count(&victim.id).await,
        1,
        "only the prompt is stored"
    );
    c.kill_worker(a);
    drop(reader);
    assert_eq!(c.message_count(&victim.id).await, 1);

    // Worker B asks the model again, commits that response at the grace while its read
    // blocks, and then stores the result once the pipe speaks.
    c.spawn_worker(&WorkerOpts::default());
    let writer = writer_once_read(&pipe).await;
    assert_eq!(c.llm_requests(&victim, 0), 2);
    eventually(
        "the response committed while its call runs",
        T,
        async || c.message_count(&victim.id).await == 2,
    )
    .await;
    {
        use std::io::Write;
        let mut w = writer;
        w.write_all(b"hello\n").unwrap();
    }
    let row = c
        .wait_all_terminal(std::slice::from_ref(&victim.id), T)
        .await
        .remove(0);
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    let t = c.transcript(&victim).await;
    assert_eq!(t.len(), 4, "{t:#?}");
    assert_eq!(t[1]["tool_calls"][0]["id"], "call_0_0");
    assert_eq!(t[2]["tool_call_id"], "call_0_0");
    assert!(
        t[2]["content"].as_str().unwrap().contains("hello"),
        "{t:#?}"
    );
    assert_eq!(t[3]["content"], "The pipe says hello.");
    assert_eq!(row.iteration, 2);
    assert_eq!(c.llm_requests(&victim, 1), 1);
}
