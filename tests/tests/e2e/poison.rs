//! Sessions that can never succeed end, with a reason, without holding up the others:
//! a provider that always fails, and an entry that kills every worker that runs it.

use std::time::Duration;

use agentq_agent::spec::ExitReason;
use agentq_core::SessionStatus;

use crate::common::{Cluster, Script, WorkerOpts, eventually};

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_always_500_ends_error() {
    let mut c = Cluster::start().await;
    c.spawn_ready_worker(&WorkerOpts::default()).await;
    let mut bad = Script::two_turns();
    bad.fail_500 = true;
    let mut scripts = vec![bad];
    scripts.extend((0..3).map(|_| Script::two_turns()));
    let subs = c.submit_many(scripts).await;
    let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
    let rows = c.wait_all_terminal(&ids, T).await;

    let failed = &rows[0];
    assert_eq!(failed.status, SessionStatus::Failed, "{failed:?}");
    assert_eq!(failed.finish_reason, Some(ExitReason::Error));
    let error = failed.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("500") && error.contains("upstream exploded (e2e)"),
        "the error names the status and the provider's message: {error:?}"
    );
    // One call and the spec's two retries (max_llm_retries = 2), then it gives up.
    assert_eq!(c.llm_requests_all(&subs[0]), 3, "{:#?}", c.hits());
    assert_eq!(c.transcript(&subs[0]).await.len(), 1, "only the prompt");

    let expected = c.transcript(&subs[1]).await;
    assert_eq!(expected.len(), 4, "{expected:#?}");
    for (sub, row) in subs.iter().zip(&rows).skip(1) {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert_eq!(c.transcript(sub).await, expected);
    }
    // The failure is a completion like any other.
    let completions = c.completion_entries().await;
    for id in &ids {
        assert_eq!(completions.get(id).copied(), Some(1), "completions of {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_looping_entry_is_dead_lettered() {
    let mut c = Cluster::start().await;
    let opts = WorkerOpts {
        max_attempts: 3,
        ..WorkerOpts::default()
    };
    let mut w = c.spawn_ready_worker(&opts).await;
    // The poison session's LLM request never answers: the test answers it by SIGKILLing
    // the worker that sent it.
    let mut poison = Script::two_turns();
    poison.hang = true;
    let mut scripts = vec![poison];
    scripts.extend((0..4).map(|_| Script::two_turns()));
    let subs = c.submit_many(scripts).await;
    let p = &subs[0];
    let others: Vec<String> = subs[1..].iter().map(|s| s.id.clone()).collect();

    for round in 1..=3u32 {
        eventually(
            &format!("LLM request #{round} of the poison session"),
            T,
            async || c.llm_requests_all(p) == round as usize,
        )
        .await;
        if round == 1 {
            // The others, submitted with it, are not held up by it.
            let rows = c.wait_all_terminal(&others, T).await;
            assert!(rows.iter().all(|r| r.status == SessionStatus::Completed));
        }
        assert_eq!(c.row(&p.id).await.attempts, round);
        c.kill_worker(w);
        w = c.spawn_ready_worker(&opts).await;
    }

    // The 4th claim finds 3 failed attempts behind it: dead-lettered, not run.
    let row = c
        .wait_all_terminal(std::slice::from_ref(&p.id), T)
        .await
        .remove(0);
    assert_eq!(row.status, SessionStatus::Failed, "{row:?}");
    assert_eq!(row.finish_reason, Some(ExitReason::Error));
    assert_eq!(row.attempts, 4);
    let error = row.error.clone().unwrap_or_default();
    assert!(error.contains("delivered 4 times"), "{error:?}");
    assert_eq!(c.llm_requests_all(p), 3, "the 4th claim must not run it");

    let dead = c.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1.get("session_id"), Some(&p.id));
    let reason = dead[0].1.get("reason").cloned().unwrap_or_default();
    assert!(reason.contains("delivered 4 times"), "{reason:?}");
    eventually("the failure published", T, async || {
        c.completion_entries().await.get(&p.id) == Some(&1)
    })
    .await;

    // The worker that dead-lettered it goes on working.
    let more = c
        .submit_many((0..3).map(|_| Script::two_turns()).collect())
        .await;
    let more_ids: Vec<String> = more.iter().map(|s| s.id.clone()).collect();
    let rows = c.wait_all_terminal(&more_ids, T).await;
    assert!(
        rows.iter().all(|r| r.status == SessionStatus::Completed),
        "{rows:?}"
    );
    assert_eq!(c.dead_letters().await.len(), 1);
}

/// A dead letter that cannot be written (here its stream's key holds a string, so `XADD`
/// fails) leaves the session as it was, not failed with a reason that names an entry
/// nobody wrote; once the stream can be written, the session's next claim dead-letters it
/// and fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_failed_only_once_its_dead_letter_is_written() {
    let mut c = Cluster::start().await;
    let opts = WorkerOpts {
        max_attempts: 1,
        ..WorkerOpts::default()
    };
    let w = c.spawn_ready_worker(&opts).await;
    let mut poison = Script::two_turns();
    poison.hang = true;
    let p = c.submit(poison).await;
    eventually("the poison session's LLM request", T, async || {
        c.llm_requests_all(&p) == 1
    })
    .await;
    let dead_keys = c.queue.dead_letter_keys("default");
    let mut conn = c.redis_conn().await;
    for key in &dead_keys {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("not a stream")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    c.kill_worker(w);
    let w = c.spawn_ready_worker(&opts).await;

    // The second claim finds the first run dead: exhausted, and its dead letter refused.
    c.wait_log(w, "dead-lettering failed", T).await;
    let row = c.row(&p.id).await;
    assert!(!row.status.is_terminal(), "{row:?}");
    assert_eq!(row.error, None, "{row:?}");

    for key in &dead_keys {
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let row = c
        .wait_all_terminal(std::slice::from_ref(&p.id), T)
        .await
        .remove(0);
    assert_eq!(row.status, SessionStatus::Failed, "{row:?}");
    let error = row.error.clone().unwrap_or_default();
    assert!(error.contains("dead-letter stream"), "{error:?}");
    assert_eq!(
        c.llm_requests_all(&p),
        1,
        "an exhausted session must not run again"
    );
    let dead = c.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].1.get("session_id"), Some(&p.id));
}
