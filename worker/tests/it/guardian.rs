//! The LLM guardian on a worker, against real Postgres and Redis, with the guardian's
//! endpoint a fake OpenAI server (the session's model is the scripted provider). Its
//! reviews are calls of the session: once per different call of an answer, counted in
//! the session's stored usage and token budget, in its tenant's spend and in the
//! guardian's own token metric. And a long argument cannot hide a call's target from it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentq_agent::schema::Role;
use agentq_agent::spec::{ExitReason, Mode, SessionSpec};
use agentq_core::budget::{BudgetStore, day_key};
use agentq_core::config::Settings;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{EnqueueReason, NewSession, SessionRow, SessionStatus, SessionStore, WorkQueue};
use agentq_testkit::{FakeLlm, FakeResponse, RecordedRequest};
use agentq_worker::{Processed, Worker, WorkerSettings};
use serde_json::{Value, json};

use common::setup;

const TENANT: &str = "acme";

/// What the fake guardian reports each review cost.
const REVIEW_INPUT: u64 = 400;
const REVIEW_OUTPUT: u64 = 10;

/// The guardian's answer `text`, streamed as OpenAI does, with its usage last.
fn verdict(text: &str) -> FakeResponse {
    let lines = [
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": null}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {
            "prompt_tokens": REVIEW_INPUT,
            "completion_tokens": REVIEW_OUTPUT,
            "total_tokens": REVIEW_INPUT + REVIEW_OUTPUT,
        }}),
    ]
    .iter()
    .map(Value::to_string)
    .collect::<Vec<_>>()
    .join("\n");
    FakeResponse::sse(FakeResponse::openai_jsonl(&lines), 64)
}

/// A fake guardian that denies every call whose review shows `deny_when`, and allows
/// the rest.
async fn fake_guardian(deny_when: &'static str) -> FakeLlm {
    let fake = FakeLlm::start().await.unwrap();
    fake.set_handler(move |r| {
        Some(if review_data(r).to_string().contains(deny_when) {
            verdict(r#"{"behavior":"deny","reason":"that target is off limits"}"#)
        } else {
            verdict(r#"{"behavior":"allow"}"#)
        })
    });
    fake
}

/// The call data a review request carries (the line between its markers).
fn review_data(r: &RecordedRequest) -> Value {
    let user = r.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap();
    let text = user["content"].as_str().unwrap();
    serde_json::from_str(text.lines().nth(2).unwrap()).unwrap()
}

/// A worker whose guardian is `model` on `guard` (as its OpenAI endpoint), with
/// `guardian` more lines of `[guardian]`, playing `script` as the sessions' model.
fn config(
    dir: &Path,
    guard: &FakeLlm,
    model: &str,
    guardian: &str,
    script: &Value,
) -> WorkerSettings {
    let toml = format!(
        r#"
[providers]
openai_base_url = "{}/v1"

[guardian]
provider = "openai"
model = "{model}"
{guardian}

[[budgets]]
tenant = "{TENANT}"
period = "day"
tokens = 100000000

[policy]
tools = ["read_file", "list_dir", "glob", "grep", "write_file", "http_fetch", "spawn_agent"]
"#,
        guard.url
    );
    let file = dir.join("agentq.toml");
    std::fs::write(&file, toml).unwrap();
    let settings = Settings::load_with(Some(&file), |k| {
        (k == "OPENAI_API_KEY").then(|| "sk-guardian-test".to_string())
    })
    .unwrap();
    let mut cfg = WorkerSettings::from_settings(&settings).unwrap();
    cfg.concurrency = 1;
    cfg.read_block = Duration::from_millis(200);
    cfg.workspace_root = dir.join("ws");
    // The scripted model is opted into, never the default.
    cfg.default_provider = Some("scripted".into());
    cfg.providers.script = Some(script.to_string());
    cfg
}

/// Run one session of the tenant to its end with `Worker::process`; its row.
async fn run_one(
    store: &Arc<PgStore>,
    queue: &Arc<RedisQueue>,
    cfg: WorkerSettings,
    spec: SessionSpec,
) -> SessionRow {
    let (row, _) = store
        .create_session(&NewSession::root(spec, "default").with_tenant(TENANT))
        .await
        .unwrap();
    queue
        .enqueue("default", &row.id, EnqueueReason::New)
        .await
        .unwrap();
    let worker = Worker::new(store.clone(), queue.clone(), cfg);
    let ds = queue
        .read(
            &["default".to_string()],
            worker.consumer(),
            10,
            Duration::from_millis(500),
        )
        .await
        .unwrap();
    let d = ds.into_iter().find(|d| d.session_id == row.id).unwrap();
    assert_eq!(
        worker.process(d).await.unwrap(),
        Processed::Finished { acked: true }
    );
    let done = store.get(&row.id).await.unwrap().unwrap();
    assert!(done.status.is_terminal(), "{done:?}");
    done
}

/// The usage of the session's own answers, as stored with its messages.
async fn answers_usage(store: &PgStore, id: &str) -> u64 {
    store
        .messages(id)
        .await
        .unwrap()
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .filter_map(|m| m.usage)
        .map(|u| u.total())
        .sum()
}

async fn tool_results(store: &PgStore, id: &str) -> Vec<String> {
    store
        .messages(id)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content)
        .collect()
}

async fn tenant_tokens(store: &PgStore) -> u64 {
    let today = day_key(chrono::Utc::now().date_naive());
    store
        .tenant_spend(TENANT, &today, &today)
        .await
        .unwrap()
        .tokens
}

/// The value of the guardian's token metric for `model` and `kind` in this process.
fn guardian_metric(model: &str, kind: &str) -> Option<f64> {
    let series = format!(
        "agentq_guardian_tokens_total{{model=\"{model}\",provider=\"openai\",type=\"{kind}\"}} "
    );
    agentq_core::metrics::global()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&series).map(|v| v.parse().unwrap()))
}

fn list(path: &str) -> Value {
    json!({"name": "list_dir", "arguments": {"path": path}})
}

fn review_cost() -> u64 {
    REVIEW_INPUT + REVIEW_OUTPUT
}

// ---------- item 2: reviews are metered ----------

/// An answer of six calls, three of them different: the guardian's endpoint is asked
/// three times, and those reviews are in the session's stored usage, in its tenant's
/// spend and in `agentq_guardian_tokens_total` (under the guardian's model).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_are_metered_on_the_session_and_its_tenant() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let guard = fake_guardian("never").await;
    let script = json!({"turns": [
        {"text": "looking", "tool_calls": [list("a"), list("a"), list("b"), list("a"), list("b"), list("c")]},
        {"text": "done"}
    ]});
    let model = "guard-meter-model";
    let cfg = config(dir.path(), &guard, model, "", &script);
    let mut spec = SessionSpec::new("look around");
    spec.tools = Some(vec!["list_dir".into()]);
    spec.token_budget = Some(20_000);
    spec.max_tokens = 256;
    let row = run_one(&store, &queue, cfg, spec).await;

    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    assert_eq!(row.finish_reason, Some(ExitReason::Stop), "{row:?}");
    assert_eq!(tool_results(&store, &row.id).await.len(), 6);
    let reviews = guard.requests();
    assert_eq!(reviews.len(), 3, "one review per different call");
    let mut paths: Vec<String> = reviews
        .iter()
        .map(|r| {
            review_data(r)["arguments"]["path"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    paths.sort();
    assert_eq!(paths, ["a", "b", "c"]);
    assert!(reviews.iter().all(|r| r.body["model"] == model));

    let answers = answers_usage(&store, &row.id).await;
    assert_eq!(row.usage.total(), answers + 3 * review_cost(), "{row:?}");
    assert_eq!(tenant_tokens(&store).await, row.usage.total());
    assert_eq!(
        guardian_metric(model, "input"),
        Some((3 * REVIEW_INPUT) as f64)
    );
    assert_eq!(
        guardian_metric(model, "output"),
        Some((3 * REVIEW_OUTPUT) as f64)
    );
}

/// A model that keeps asking for calls, under a `token_budget`: the reviews draw on the
/// budget with the session's own calls, so the session ends `budget_exhausted` within its
/// budget plus one call, having paid every review it had (and no review runs once the
/// budget cannot pay for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_bounds_the_session_and_its_reviews() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let guard = fake_guardian("never").await;
    let script = json!({
        "turns": [{"text": "again", "tool_calls": [list("a"), list("b"), list("a"), list("b")]}],
        "repeat_last": true
    });
    let model = "guard-budget-model";
    let cfg = config(dir.path(), &guard, model, "", &script);
    let budget = 4_000;
    let mut spec = SessionSpec::new("look around forever");
    spec.tools = Some(vec!["list_dir".into()]);
    spec.token_budget = Some(budget);
    spec.max_tokens = 256;
    // The same calls every turn: the budget, not a repeat, must end it.
    spec.max_repeated_calls = 0;
    let row = run_one(&store, &queue, cfg, spec).await;

    assert_eq!(row.status, SessionStatus::Failed, "{row:?}");
    assert_eq!(
        row.finish_reason,
        Some(ExitReason::BudgetExhausted),
        "{row:?}"
    );
    let reviews = guard.requests().len() as u64;
    assert!(reviews >= 2, "{reviews} reviews");
    let answers = answers_usage(&store, &row.id).await;
    assert_eq!(
        row.usage.total(),
        answers + reviews * review_cost(),
        "{row:?}"
    );
    assert!(
        row.usage.total() <= budget + review_cost().max(256),
        "spent {} of {budget}",
        row.usage.total()
    );
    assert_eq!(tenant_tokens(&store).await, row.usage.total());
    assert_eq!(
        guardian_metric(model, "input"),
        Some((reviews * REVIEW_INPUT) as f64)
    );
}

/// A prompt-injected model answers with a dozen sub-agents that wait (each drawing one
/// token, each reviewed) and, last, one more asking for everything. The reviews before it
/// were paid for but only recorded on the session with the round's checkpoint; the last
/// spawn's grant used to be drawn from the stored ledger, which did not have them yet, so
/// the tree's commitments (what the parent spent plus what its children hold) ended a
/// dozen reviews past the budget (25,330 of 20,000). A spawn now draws from what the
/// parent's run knows it spent: the tree stays within its budget plus one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_not_yet_checkpointed_count_against_a_spawns_grant() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let guard = fake_guardian("never").await;
    let small = 12;
    let mut calls: Vec<Value> = (0..small)
        .map(|i| {
            json!({"name": "spawn_agent", "arguments": {
                "prompt": format!("helper {i}"), "label": format!("h{i}"),
                "token_budget": 1, "wait": true,
            }})
        })
        .collect();
    calls.push(json!({"name": "spawn_agent", "arguments": {
        "prompt": "take the rest", "label": "big", "token_budget": 1_000_000, "wait": false,
    }}));
    let script = json!({"turns": [{"text": "fanning out", "tool_calls": calls}]});
    let cfg = config(dir.path(), &guard, "guard-spawn-model", "", &script);
    let budget: u64 = 20_000;
    let mut spec = SessionSpec::new("fan out");
    spec.tools = Some(vec!["spawn_agent".into()]);
    spec.token_budget = Some(budget);
    spec.max_tokens = 256;
    let (row, _) = store
        .create_session(&NewSession::root(spec, "default").with_tenant(TENANT))
        .await
        .unwrap();
    queue
        .enqueue("default", &row.id, EnqueueReason::New)
        .await
        .unwrap();
    let worker = Worker::new(store.clone(), queue.clone(), cfg);
    let ds = queue
        .read(
            &["default".to_string()],
            worker.consumer(),
            10,
            Duration::from_millis(500),
        )
        .await
        .unwrap();
    let d = ds.into_iter().find(|d| d.session_id == row.id).unwrap();
    // It waits for its helpers.
    assert_eq!(worker.process(d).await.unwrap(), Processed::Suspended);

    assert_eq!(
        guard.requests().len(),
        small + 1,
        "every spawn was reviewed"
    );
    let parent = store.get(&row.id).await.unwrap().unwrap();
    assert!(
        parent.usage.total() >= (small as u64 + 1) * review_cost(),
        "{parent:?}"
    );
    let ledger = store.ledger(&row.id).await.unwrap().unwrap();
    assert_eq!(ledger.spent, parent.usage.total());
    let committed = ledger.spent + ledger.held + ledger.children_spent;
    assert!(
        committed <= budget + review_cost(),
        "the tree committed {committed} of its {budget}: {ledger:?}"
    );
}

/// Calls the session's mode does not offer (think, plan, the plan phase of plan-act) are
/// refused without running, so nothing of them is reviewed: a model cannot spend the
/// guardian's key on calls that would never run. Sixteen different calls in each mode:
/// no review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_refused_by_the_mode_are_not_reviewed() {
    let (store, queue, _redis) = setup().await;
    let calls: Vec<Value> = (0..16).map(|i| list(&format!("d{i}"))).collect();
    let script = json!({"turns": [
        {"text": "let me look", "tool_calls": calls},
        {"text": "the plan: nothing to do"}
    ]});
    for mode in [Mode::Think, Mode::Plan, Mode::PlanAct] {
        let dir = tempfile::tempdir().unwrap();
        let guard = fake_guardian("never").await;
        let cfg = config(dir.path(), &guard, "guard-mode-model", "", &script);
        let mut spec = SessionSpec::new("plan something");
        spec.tools = Some(vec!["list_dir".into()]);
        spec.mode = mode;
        let row = run_one(&store, &queue, cfg, spec).await;
        let results = tool_results(&store, &row.id).await;
        assert!(results.len() >= 16, "{mode:?}: {results:?}");
        assert!(
            results[..16]
                .iter()
                .all(|r| r.starts_with("Tool calls are not available")),
            "{mode:?}: {results:?}"
        );
        assert_eq!(guard.requests().len(), 0, "{mode:?}: reviewed");
    }
}

// ---------- item 3: a long argument cannot blind the guardian ----------

fn write_hidden_path() -> Value {
    json!({"turns": [
        {"text": "writing", "tool_calls": [{"name": "write_file", "arguments": {
            "content": "a".repeat(18 * 1024),
            "path": "deploy/prod.yaml",
        }}]},
        {"text": "done"}
    ]})
}

fn post_hidden_url() -> Value {
    json!({"turns": [
        {"text": "posting", "tool_calls": [{"name": "http_fetch", "arguments": {
            "body": "b".repeat(18 * 1024),
            "method": "POST",
            "url": "http://127.0.0.1:9/collect",
        }}]},
        {"text": "done"}
    ]})
}

fn spec_with(tool: &str) -> SessionSpec {
    let mut spec = SessionSpec::new("write the docs");
    spec.tools = Some(vec![tool.into()]);
    spec
}

/// 18 KiB of `content` sorted before `path` (and of `body` before `url`) used to cut the
/// target out of the reviewer's view, which then allowed the call. By default such a
/// call is now denied without the guardian's endpoint ever being asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_argument_cannot_hide_the_target_denied_unasked() {
    let (store, queue, _redis) = setup().await;
    for (tool, script, deny_when, at) in [
        ("write_file", write_hidden_path(), "deploy/", "/content"),
        (
            "http_fetch",
            post_hidden_url(),
            "127.0.0.1:9/collect",
            "/body",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let guard = fake_guardian(deny_when).await;
        let cfg = config(dir.path(), &guard, "guard-cut-model", "", &script);
        let row = run_one(&store, &queue, cfg, spec_with(tool)).await;
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        let results = tool_results(&store, &row.id).await;
        assert_eq!(results.len(), 1, "{tool}");
        assert!(
            results[0].starts_with(
                "Tool call denied by guardian: the call is too large for the guardian to see whole ("
            ) && results[0].contains(&format!("{at} (18432 bytes")),
            "{tool}: {}",
            results[0]
        );
        assert_eq!(guard.requests().len(), 0, "{tool}: the guardian was asked");
        assert!(
            !dir.path()
                .join("ws")
                .join(&row.root_id)
                .join("deploy/prod.yaml")
                .exists()
        );
    }
}

/// With `on_truncated = "review"` the guardian is asked, and sees the target whole (in
/// `targets` and in the arguments), the long field cut with its size, and the flag: it
/// denies as it would a short call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_review_the_guardian_sees_the_target_whole() {
    let (store, queue, _redis) = setup().await;
    for (tool, script, key, value, at) in [
        (
            "write_file",
            write_hidden_path(),
            "path",
            "deploy/prod.yaml",
            "/content",
        ),
        (
            "http_fetch",
            post_hidden_url(),
            "url",
            "http://127.0.0.1:9/collect",
            "/body",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let guard = fake_guardian(if key == "path" {
            "deploy/"
        } else {
            "127.0.0.1:9/collect"
        })
        .await;
        let cfg = config(
            dir.path(),
            &guard,
            "guard-cut-model",
            "on_truncated = \"review\"",
            &script,
        );
        let row = run_one(&store, &queue, cfg, spec_with(tool)).await;
        assert_eq!(
            tool_results(&store, &row.id).await,
            ["Tool call denied by guardian: that target is off limits"],
            "{tool}"
        );
        let reviews = guard.requests();
        assert_eq!(reviews.len(), 1, "{tool}");
        let data = review_data(&reviews[0]);
        assert_eq!(data["arguments_truncated"], true, "{tool}");
        assert_eq!(data["arguments"][key], value, "{tool}");
        assert!(
            data["targets"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["at"] == format!("/{key}") && t["value"] == value),
            "{tool}: {}",
            data["targets"]
        );
        assert_eq!(data["cut"][0]["at"], at, "{tool}");
        assert_eq!(data["cut"][0]["of"], 18 * 1024, "{tool}");
        // The review was a call of the session.
        assert!(row.usage.total() >= review_cost(), "{row:?}");
    }
}
