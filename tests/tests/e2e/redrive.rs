//! Redrive: a session that failed after committed model calls and a tool with a side
//! effect is retried through the API and continues from its checkpoint, asking nothing
//! committed of the model again and running no tool twice; `agentq retry --failed` (the
//! real binary, against the scheduler) retries exactly the failures its flags name.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use agentq_agent::spec::ExitReason;
use agentq_core::SessionStatus;

use crate::common::{Cluster, Script, ToolUse, Turn, WorkerOpts, agentq_bin};
use crate::fairshare::{Api, scheduling};

const T: Duration = Duration::from_secs(120);

/// A charge (POST: a side effect), a page read, then the answer; the model fails from the
/// third call on until healed.
fn flaky() -> Script {
    let mut s = Script::new(vec![
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
        Turn::gets("Reading the receipt.", &["receipt"]),
        Turn::text("Charged once; receipt ok."),
    ]);
    s.fail_from_turn = Some(2);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_session_resumes_from_its_checkpoint() {
    let mut c = Cluster::start().await;
    let api = Api::start(&c, scheduling(100), &["default", "other"]).await;
    c.spawn_worker(&WorkerOpts::default());
    let sub = c.submit(flaky()).await;
    let failed = c
        .wait_all_terminal(std::slice::from_ref(&sub.id), T)
        .await
        .remove(0);
    assert_eq!(failed.status, SessionStatus::Failed, "{failed:?}");
    assert_eq!(failed.finish_reason, Some(ExitReason::Error));
    let failed_calls = c.llm_requests(&sub, 2);
    assert!(failed_calls >= 1);
    assert_eq!(c.tool_hits(&sub, "charge"), 1);

    // Another tenant cannot see it, let alone retry it.
    let path = format!("/v1/sessions/{}/retry", sub.id);
    let (status, body) = api.post("other", &path, &json!({})).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(c.row(&sub.id).await.status, SessionStatus::Failed);

    c.heal(&sub.token);
    let (status, body) = api.post("default", &path, &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "queued");
    let done = c
        .wait_all_terminal(std::slice::from_ref(&sub.id), T)
        .await
        .remove(0);
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.result.as_deref(), Some("Charged once; receipt ok."));
    assert!(done.error.is_none());

    // The committed calls were not repeated: each answered turn asked once, each tool
    // run once; only the failed turn was asked again, once more.
    assert_eq!(c.llm_requests(&sub, 0), 1);
    assert_eq!(c.llm_requests(&sub, 1), 1);
    assert_eq!(c.llm_requests(&sub, 2), failed_calls + 1);
    assert_eq!(c.tool_hits(&sub, "charge"), 1);
    assert_eq!(c.tool_hits(&sub, "receipt"), 1);

    // A finished session is not failed: 409 with a JSON body, nothing changes.
    let (status, body) = api.post("default", &path, &json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "not_failed", "{body}");
    assert_eq!(c.row(&sub.id).await.status, SessionStatus::Completed);
    // A hostile id is refused as such.
    let (status, body) = api
        .post("default", "/v1/sessions/..%2F..%2Fetc/retry", &json!({}))
        .await;
    assert!(status == 400 || status == 404, "{status} {body}");
    api.stop().await;
}

fn cli(api: &Api, tenant: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(agentq_bin())
        .arg("retry")
        .args(args)
        .env("AGENTQ_API_URL", &api.url)
        .env("AGENTQ_API_KEY", &api.keys[tenant])
        .env_remove("AGENTQ_CONFIG")
        .output()
        .expect("running agentq retry");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agentq_retry_failed_retries_what_its_flags_name() {
    let mut c = Cluster::start().await;
    let api = Api::start(&c, scheduling(100), &["default"]).await;
    c.spawn_worker(&WorkerOpts::default());
    let mut always = Script::new(vec![Turn::text("finally")]);
    always.fail_500 = true;
    let failing = c
        .submit_many(vec![always.clone(), always.clone(), always])
        .await;
    // A session that completes, and (below) a dead letter with another reason.
    let fine = c.submit(Script::new(vec![Turn::text("fine")])).await;
    let mut all: Vec<String> = failing.iter().map(|s| s.id.clone()).collect();
    all.push(fine.id.clone());
    c.wait_all_terminal(&all, T).await;
    // The dead letter: on a queue no worker serves, failed from outside a run.
    let (row, _) = c
        .store
        .create_session(&agentq_core::NewSession::root(
            agentq_agent::spec::SessionSpec::new("dead letter"),
            "unserved",
        ))
        .await
        .unwrap();
    c.store
        .fail(&row.id, "delivered 5 times without finishing")
        .await
        .unwrap();
    for s in &failing {
        let r = c.row(&s.id).await;
        assert_eq!(r.status, SessionStatus::Failed, "{r:?}");
        assert!(
            r.error.as_deref().unwrap_or("").contains("exploded"),
            "{r:?}"
        );
        c.heal(&s.token);
    }

    // Bad flags are named.
    let (code, _, err) = cli(&api, "default", &[]);
    assert_ne!(code, 0);
    assert!(err.contains("--failed"), "{err}");
    let (code, _, err) = cli(&api, "default", &["--failed", "--since", "yesterday"]);
    assert_ne!(code, 0);
    assert!(err.contains("--since"), "{err}");
    // Nothing failed in the future.
    let (code, out, err) = cli(
        &api,
        "default",
        &["--failed", "--since", "2999-01-01T00:00:00Z"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no failed session matched"), "{out}");

    // Only the failures whose error names the reason, within the hour.
    let (code, out, err) = cli(
        &api,
        "default",
        &["--failed", "--since", "1h", "--reason", "exploded"],
    );
    assert_eq!(code, 0, "{out}{err}");
    for s in &failing {
        assert!(out.contains(&format!("retried {} (queued)", s.id)), "{out}");
    }
    assert!(!out.contains(&row.id), "{out}");
    assert!(!out.contains(&fine.id), "{out}");
    assert_eq!(out.lines().count(), failing.len(), "{out}");
    for r in c.wait_all_terminal(&all, T).await {
        assert_eq!(r.status, SessionStatus::Completed, "{r:?}");
    }
    assert_eq!(c.row(&row.id).await.status, SessionStatus::Failed);

    // By id: the dead letter; a completed one is refused (exit 1) and named.
    let (code, out, err) = cli(&api, "default", &[&row.id, &fine.id]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(&format!("retried {} (queued)", row.id)),
        "{out}"
    );
    assert!(
        err.contains(&fine.id) && err.contains("only a session that failed"),
        "{err}"
    );
    let r = c.row(&row.id).await;
    assert_eq!(r.status, SessionStatus::Queued);
    assert!(r.error.is_none());
    api.stop().await;
}
