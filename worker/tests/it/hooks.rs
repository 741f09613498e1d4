//! The operator's hooks and guardian, configured in `agentq.toml` and run by the worker
//! against real Postgres and Redis: webhooks (a local HTTP server standing for the
//! operator's service), a command hook, and the LLM guardian on the scripted provider.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentq_agent::schema::Role;
use agentq_agent::spec::SessionSpec;
use agentq_core::config::Settings;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    EnqueueReason, InboxStore, NewSession, SessionRow, SessionStatus, SessionStore, WorkQueue,
};
use agentq_testkit::{FakeLlm, FakeResponse, RecordedRequest};
use agentq_worker::{Worker, WorkerSettings};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use common::{setup, wait_status, wait_terminal, wait_until};

/// The session writes `out.txt`, then reports what the call came back with.
const SCRIPT: &str = r#"{"turns":[
  {"text":"writing","tool_calls":[{"name":"write_file","arguments":{"path":"out.txt","content":"hello"}}]},
  {"text":"result: {{last_tool_result}}"}
]}"#;

/// A worker configured by `toml` (an `agentq.toml`) with only `env` in its environment.
fn config(dir: &Path, toml: &str, env: &[(&str, &str)]) -> WorkerSettings {
    let file = dir.join("agentq.toml");
    // The sessions here write: the tenant's policy must allow it.
    let toml = format!(
        "{toml}\n[policy]\ntools = [\"read_file\", \"list_dir\", \"glob\", \"grep\", \"write_file\"]\n"
    );
    std::fs::write(&file, toml).unwrap();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let settings = Settings::load_with(Some(&file), |k| {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    })
    .unwrap();
    let mut cfg = WorkerSettings::from_settings(&settings).unwrap();
    cfg.concurrency = 4;
    cfg.read_block = Duration::from_millis(200);
    cfg.workspace_root = dir.join("ws");
    // The scripted model is opted into, never the default.
    cfg.default_provider = Some("scripted".into());
    cfg.providers.script = Some(SCRIPT.into());
    cfg
}

fn spec(prompt: &str) -> SessionSpec {
    let mut spec = SessionSpec::new(prompt);
    spec.tools = Some(vec!["write_file".into()]);
    spec
}

/// Run one session to its end on a worker with `cfg`; its row and tool results.
async fn run_one(
    store: &Arc<PgStore>,
    queue: &Arc<RedisQueue>,
    cfg: WorkerSettings,
    spec: SessionSpec,
) -> (SessionRow, Vec<String>) {
    let (done, _) = common::run_one(store, queue, cfg, spec).await;
    let results = store
        .messages(&done.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content)
        .collect();
    (done, results)
}

fn written(dir: &Path, row: &SessionRow) -> bool {
    dir.join("ws").join(&row.root_id).join("out.txt").exists()
}

/// Requests at `event`, waiting for the first of fire-and-forget ones.
async fn events_at(hook: &FakeLlm, event: &str) -> Vec<RecordedRequest> {
    wait_until(
        format_args!("a request at {event}"),
        Duration::from_secs(10),
        || async {
            let seen: Vec<RecordedRequest> = hook
                .requests()
                .into_iter()
                .filter(|r| r.body["event"] == event)
                .collect();
            if seen.is_empty() {
                Err(hook.requests().len())
            } else {
                Ok(seen)
            }
        },
    )
    .await
}

fn verdict(behavior: &str, reason: &str) -> FakeResponse {
    FakeResponse::json(
        200,
        json!({"behavior": behavior, "reason": reason}).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_denies_a_call_and_the_tool_does_not_run() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let hook = FakeLlm::start().await.unwrap();
    hook.set_handler(|_| Some(verdict("deny", "no writes on a Tuesday")));
    let toml = format!(
        r#"
[[hooks]]
on = "pre_tool_use"
url = "{}/check?tag=1"
tools = ["write_*"]
header = "Authorization"
header_env = "HOOK_TOKEN"
"#,
        hook.url
    );
    let cfg = config(dir.path(), &toml, &[("HOOK_TOKEN", "Bearer hook-s3cret")]);
    let (row, results) = run_one(&store, &queue, cfg, spec("write a greeting")).await;

    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    assert_eq!(
        results,
        vec!["Tool call denied by PreToolUse hook: no writes on a Tuesday"]
    );
    assert!(!written(dir.path(), &row), "the denied call ran");

    let asked = hook.requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let req = &asked[0];
    assert_eq!(req.path, "/check");
    assert_eq!(req.header("authorization"), Some("Bearer hook-s3cret"));
    assert_eq!(req.body["event"], "pre_tool_use");
    assert_eq!(req.body["session_id"], row.id.as_str());
    assert_eq!(req.body["tenant"], "default");
    assert_eq!(req.body["iteration"], 1);
    assert_eq!(req.body["tool"]["name"], "write_file");
    assert_eq!(req.body["tool"]["arguments"]["path"], "out.txt");
    assert!(
        req.body["tool"]["id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );

    let denied = agentq_core::metrics::global()
        .hook_calls
        .with_label_values(&["pre_tool_use", "deny"])
        .get();
    assert!(denied >= 1);
}

/// A hook that cannot answer: no answer in time gets `on_timeout`, a failure (a non-2xx,
/// a redirect, which is never followed) or a non-verdict gets `on_error`; both deny
/// unless configured otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_cannot_answer_gets_its_configured_behaviour() {
    let (store, queue, _redis) = setup().await;
    type Answer = fn() -> FakeResponse;
    let cases: [(&str, &str, Answer, Option<&str>); 5] = [
        (
            "timeout, default deny",
            "",
            slow_allow,
            Some("Tool call denied by PreToolUse hook: the hook did not answer within 300 ms"),
        ),
        ("timeout, allow", "on_timeout = \"allow\"", slow_allow, None),
        (
            "500, default deny",
            "",
            || FakeResponse::json(500, "{}"),
            Some("Tool call denied by PreToolUse hook: the hook failed"),
        ),
        (
            "redirect to an allow",
            "",
            || FakeResponse::json(302, r#"{"behavior":"allow"}"#).with_header("location", "/allow"),
            Some("Tool call denied by PreToolUse hook: the hook failed"),
        ),
        (
            "not a verdict, allow",
            "on_error = \"allow\"",
            || FakeResponse::json(200, "OK"),
            None,
        ),
    ];
    for (case, extra, answer, denial) in cases {
        let dir = tempfile::tempdir().unwrap();
        let hook = FakeLlm::start().await.unwrap();
        hook.set_handler(move |r| {
            if r.path == "/allow" {
                return Some(verdict("allow", ""));
            }
            Some(answer())
        });
        let toml = format!(
            "[[hooks]]\non = \"pre_tool_use\"\nurl = \"{}/check\"\ntimeout_ms = 300\n{extra}\n",
            hook.url
        );
        let cfg = config(dir.path(), &toml, &[]);
        let (row, results) = run_one(&store, &queue, cfg, spec("write")).await;
        assert_eq!(row.status, SessionStatus::Completed, "{case}: {row:?}");
        match denial {
            Some(text) => {
                assert_eq!(results, vec![text.to_string()], "{case}");
                assert!(!written(dir.path(), &row), "{case}: the call ran");
            }
            None => {
                assert_eq!(results.len(), 1, "{case}");
                assert!(!results[0].contains("denied"), "{case}: {results:?}");
                assert!(written(dir.path(), &row), "{case}: the call did not run");
            }
        }
        assert!(
            hook.requests().iter().all(|r| r.path == "/check"),
            "{case}: a redirect was followed"
        );
    }
}

fn slow_allow() -> FakeResponse {
    verdict("allow", "too late").with_delay(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_hook_decides_from_the_event_on_stdin() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("seen");
    std::fs::create_dir(&out).unwrap();
    let script = r#"cat > "$1/event.json"; env > "$1/env.txt"; printf '{"behavior":"deny","reason":"the command says no"}'"#;
    let toml = format!(
        "[[hooks]]\non = \"pre_tool_use\"\ncommand = [\"sh\", \"-c\", {}, \"hook\", {}]\n",
        toml_str(script),
        toml_str(out.to_str().unwrap())
    );
    let cfg = config(dir.path(), &toml, &[]);
    let (row, results) = run_one(&store, &queue, cfg, spec("write")).await;
    assert_eq!(
        results,
        vec!["Tool call denied by PreToolUse hook: the command says no"]
    );
    assert!(!written(dir.path(), &row));

    let event: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("event.json")).unwrap()).unwrap();
    assert_eq!(event["event"], "pre_tool_use");
    assert_eq!(event["session_id"], row.id.as_str());
    assert_eq!(event["tool"]["name"], "write_file");
    // Nothing of the worker's environment but PATH and LANG (the shell adds its own few).
    let env = std::fs::read_to_string(out.join("env.txt")).unwrap();
    let names: Vec<&str> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, _)| k)
        .collect();
    assert!(names.contains(&"PATH"), "{env}");
    for name in &names {
        assert!(
            ["PATH", "LANG", "PWD", "SHLVL", "_", "OLDPWD"].contains(name),
            "the command hook inherited {name}: {env}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observing_hooks_see_the_output_and_the_session_start_and_end() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let hook = FakeLlm::start().await.unwrap();
    hook.set_handler(|_| Some(FakeResponse::json(204, "")));
    let toml = format!(
        r#"
[[hooks]]
on = "session_start"
url = "{0}/start"

[[hooks]]
on = "post_tool_use"
url = "{0}/post"

[[hooks]]
on = "session_end"
url = "{0}/end"
"#,
        hook.url
    );
    let cfg = config(dir.path(), &toml, &[]);
    let (row, results) = run_one(&store, &queue, cfg, spec("write a greeting")).await;
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    assert!(written(dir.path(), &row), "observers never block a call");

    let post = events_at(&hook, "post_tool_use").await;
    assert_eq!(post.len(), 1, "{post:?}");
    assert_eq!(post[0].path, "/post");
    assert_eq!(post[0].body["tool"]["name"], "write_file");
    assert_eq!(post[0].body["output"], results[0].as_str());
    assert_eq!(post[0].body["is_error"], false);

    let start = events_at(&hook, "session_start").await;
    assert_eq!(start.len(), 1, "{start:?}");
    assert_eq!(start[0].body["session_id"], row.id.as_str());
    assert_eq!(start[0].body["prompt"], "write a greeting");
    let end = events_at(&hook, "session_end").await;
    assert_eq!(end.len(), 1, "{end:?}");
    assert_eq!(end[0].body["reason"], "stop");
    assert_eq!(end[0].body["iteration"], 2);
    // Each hook saw only its own point.
    for r in hook.requests() {
        let event = r.body["event"].as_str().unwrap().to_string();
        let expected = match event.as_str() {
            "session_start" => "/start",
            "post_tool_use" => "/post",
            _ => "/end",
        };
        assert_eq!(r.path, expected, "{event}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guardian_denies_through_the_scripted_provider() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("guardian.json");
    std::fs::write(
        &script,
        json!({
            "turns": [{"text": "{\"behavior\":\"deny\",\"reason\":\"writing files is not part of the task\"}"}],
            "repeat_last": true,
            "variants": [
                {"when_prompt_contains": "prose please", "turns": [{"text": "Looks fine to me."}], "repeat_last": true},
                {"when_prompt_contains": "allow please", "turns": [{"text": "{\"behavior\":\"allow\"}"}], "repeat_last": true}
            ]
        })
        .to_string(),
    )
    .unwrap();
    let toml = format!(
        "[guardian]\nprovider = \"scripted\"\nscript = {}\n",
        toml_str(script.to_str().unwrap())
    );
    let cases = [
        (
            "only say hello",
            Some("Tool call denied by guardian: writing files is not part of the task"),
        ),
        (
            "prose please",
            Some("Tool call denied by guardian: the guardian could not review the call"),
        ),
        ("allow please", None),
    ];
    for (prompt, denial) in cases {
        let cfg = config(dir.path(), &toml, &[]);
        let (row, results) = run_one(&store, &queue, cfg, spec(prompt)).await;
        assert_eq!(row.status, SessionStatus::Completed, "{prompt}: {row:?}");
        match denial {
            Some(text) => {
                assert_eq!(results, vec![text.to_string()], "{prompt}");
                assert!(!written(dir.path(), &row), "{prompt}: the call ran");
            }
            None => assert!(written(dir.path(), &row), "{prompt}: {results:?}"),
        }
    }
}

/// A string as a TOML basic string (JSON's escapes are TOML's).
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// A session that suspends for an approval and resumes (on any worker) is the same
/// session: SessionStart and SessionEnd fire once each, and the held call, checked again
/// when it finally runs, passes the PreToolUse hook again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_starts_and_ends_once() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let hook = FakeLlm::start().await.unwrap();
    hook.set_handler(|r| {
        Some(match r.body["event"].as_str() {
            Some("pre_tool_use") => verdict("allow", ""),
            _ => FakeResponse::json(200, "{}"),
        })
    });
    let toml = format!(
        "[[hooks]]\non = \"session_start\"\nurl = \"{0}/s\"\n\n[[hooks]]\non = \"session_end\"\nurl = \"{0}/e\"\n\n[[hooks]]\non = \"pre_tool_use\"\nurl = \"{0}/p\"\n",
        hook.url
    );
    let cfg = config(dir.path(), &toml, &[]);
    let mut s = spec("write after approval");
    s.sensitive_tools = vec!["write_file".into()];
    let (row, _) = store
        .create_session(&NewSession::root(s, "default"))
        .await
        .unwrap();
    queue
        .enqueue("default", &row.id, EnqueueReason::New)
        .await
        .unwrap();
    let worker = Worker::new(store.clone(), queue.clone(), cfg);
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let (w, s) = (worker.clone(), stop.clone());
        async move { w.run(s).await }
    });
    wait_status(
        &store,
        &row.id,
        &[SessionStatus::AwaitingApproval],
        Duration::from_secs(30),
    )
    .await;
    let call = store.messages(&row.id).await.unwrap()[1].tool_calls[0]
        .id
        .clone();
    match store
        .decide_approval(&row.id, &call, true, None, None)
        .await
        .unwrap()
    {
        agentq_core::ApprovalRecorded::Recorded {
            woken, queue: q, ..
        } => {
            assert!(woken);
            agentq_core::lifecycle::enqueue_woken(store.as_ref(), queue.as_ref(), &row.id, &q)
                .await;
        }
        other => panic!("{other:?}"),
    }
    let done = wait_terminal(
        &store,
        &queue,
        std::slice::from_ref(&row.id),
        Duration::from_secs(30),
    )
    .await
    .remove(0);
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), handle)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert!(written(dir.path(), &done));
    let count = |event: &str| {
        hook.requests()
            .iter()
            .filter(|r| r.body["event"] == event)
            .count()
    };
    assert_eq!(count("session_start"), 1);
    assert_eq!(count("session_end"), 1);
    assert_eq!(
        count("pre_tool_use"),
        2,
        "once before the approval, once after"
    );
}
