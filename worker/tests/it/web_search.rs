//! The provider's own web search end to end, on real Postgres and Redis against a fake
//! Anthropic endpoint: a session that lists `web_search` (and whose tenant's policy allows
//! it) gets Anthropic's server tool; what the search ran is stored in its transcript and
//! sent back as it came; the searches are priced into the session's, tree's and tenant's
//! spend; a worker that dies mid-session leaves a transcript the next one replays without
//! running any of it; and a session asking for the search where it is not allowed, or of
//! a provider that cannot run it, fails naming the tool before any request is made.
//!
//! No recording of a web search is at hand: the answers here (the fixture
//! `anthropic_stream_web_search.written.chunks.jsonl` and the ones built below) are written
//! by hand in the shape Anthropic's documentation gives for the Messages stream.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use agentq_agent::provider::factory::ProviderSettings;
use agentq_agent::schema::{Role, ServerBlock};
use agentq_agent::spec::{SessionSpec, WEB_SEARCH_TOOL, WebSearch};
use agentq_core::budget::{BudgetStore, OnBudget, Period, PriceEntry, Prices, TenantBudget};
use agentq_core::config::PolicySection;
use agentq_core::policy::Policy;
use agentq_core::{EnqueueReason, NewSession, SessionStatus, SessionStore, WorkQueue};
use agentq_testkit::anthropic::{self, block, fixture_events, server_use, text_block};
use agentq_testkit::{FakeLlm, FakeResponse};
use agentq_worker::{Worker, WorkerSettings};

use common::{Cluster, TENANT, read_entry, run_one, setup, start, wait_terminal};

const MODEL: &str = "claude-sonnet-4-5";
const FIXTURE: &str = "anthropic_stream_web_search.written.chunks.jsonl";

// --- answers ------------------------------------------------------------------------------

/// An Anthropic stream of these events, in small chunks.
fn stream(events: &[Value]) -> FakeResponse {
    anthropic::stream(events, 16)
}

fn search_result(index: usize, tool_use_id: &str) -> Vec<Value> {
    block(
        index,
        json!({"type": "web_search_tool_result", "tool_use_id": tool_use_id, "content": [
            {"type": "web_search_result", "title": "A page", "url": "https://a.example/",
             "encrypted_content": format!("written-{tool_use_id}"), "page_age": null}
        ]}),
        &[],
    )
}

fn answer(
    blocks: Vec<Vec<Value>>,
    stop: &str,
    input: u64,
    output: u64,
    searches: u64,
) -> Vec<Value> {
    let spent = anthropic::Spent {
        input,
        output,
        searches,
    };
    anthropic::answer(MODEL, blocks, stop, spent)
}

fn final_answer(text: &str) -> Vec<Value> {
    answer(vec![text_block(0, text)], "end_turn", 100, 20, 0)
}

/// The blocks of an answer as its events start them, with each use's streamed input and
/// each text's streamed text and citations filled in: what the API wants sent back.
fn blocks_of(events: &[Value]) -> Vec<Value> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut inputs: Vec<String> = Vec::new();
    for e in events {
        let i = e["index"].as_u64().unwrap_or_default() as usize;
        match e["type"].as_str().unwrap_or_default() {
            "content_block_start" => {
                let mut b = e["content_block"].clone();
                if b["type"] == "text" {
                    b.as_object_mut().unwrap().remove("citations");
                }
                blocks.push(b);
                inputs.push(String::new());
            }
            "content_block_delta" => {
                let d = &e["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        let t = blocks[i]["text"].as_str().unwrap().to_string();
                        blocks[i]["text"] = json!(t + d["text"].as_str().unwrap());
                    }
                    "input_json_delta" => inputs[i].push_str(d["partial_json"].as_str().unwrap()),
                    "citations_delta" => {
                        let c = blocks[i]
                            .as_object_mut()
                            .unwrap()
                            .entry("citations")
                            .or_insert(json!([]));
                        c.as_array_mut().unwrap().push(d["citation"].clone());
                    }
                    other => panic!("{other}"),
                }
            }
            _ => {}
        }
    }
    for (b, input) in blocks.iter_mut().zip(inputs) {
        if !input.is_empty() {
            b["input"] = serde_json::from_str(&input).unwrap();
        }
    }
    blocks
}

// --- workers ------------------------------------------------------------------------------

/// A policy allowing the read-only tools, spawning, and `extra`.
fn allowing(extra: &[&str]) -> Arc<Policy> {
    let mut section = PolicySection::default();
    section.tools.extend(extra.iter().map(|t| t.to_string()));
    Arc::new(Policy::from_section(&section).unwrap())
}

fn prices() -> Arc<Prices> {
    // No `web_search` price: Anthropic's list price, $10 per 1,000 searches, applies.
    Arc::new(
        Prices::new(&[PriceEntry {
            model: "claude-*".into(),
            input: 3.0,
            output: 15.0,
            ..Default::default()
        }])
        .unwrap(),
    )
}

/// Anthropic (and OpenAI) at `fake`, the search allowed with `extra` tools.
fn anthropic_at(cfg: &mut WorkerSettings, fake: &FakeLlm, extra: &[&str]) {
    cfg.providers = ProviderSettings {
        anthropic_base_url: Some(fake.url.clone()),
        anthropic_api_key: Some("sk-ant-test".into()),
        openai_base_url: Some(format!("{}/v1", fake.url)),
        openai_api_key: Some("sk-test".into()),
        script: None,
        transport: Default::default(),
    };
    cfg.default_provider = Some("anthropic".into());
    let mut tools = vec![WEB_SEARCH_TOOL];
    tools.extend_from_slice(extra);
    cfg.policy = allowing(&tools);
    cfg.prices = prices();
}

fn search_spec(prompt: &str, tools: &[&str], max_uses: u32) -> SessionSpec {
    let mut s = SessionSpec::new(prompt);
    s.provider = Some("anthropic".into());
    s.model = Some(MODEL.into());
    s.tools = Some(tools.iter().map(|t| t.to_string()).collect());
    s.web_search = Some(WebSearch {
        max_uses: Some(max_uses),
        ..WebSearch::default()
    });
    s.max_iterations = 5;
    s
}

/// Through the API and a worker of the distributed stack: the scheduler's policy refuses
/// the search where it does not allow it and where the named provider cannot run it; a
/// session whose tenant may search runs with the server tool, keeps what it ran in its
/// transcript, sends it back as it came, and is charged for the search in its cost and its
/// tenant's spend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_session_runs_through_the_stack_and_pays_for_its_searches() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(stream(&fixture_events(FIXTURE)));
    fake.push(stream(&final_answer("July 25, 2024.")));
    let c = Cluster::start(json!({"turns": []}), 1, 2, |cfg| {
        anthropic_at(cfg, &fake, &[]);
        cfg.budgets = vec![TenantBudget {
            tenant: TENANT.into(),
            period: Period::Day,
            tokens: None,
            usd_nanos: Some(1_000_000_000_000),
            on_budget: OnBudget::Fail,
        }];
    })
    .await;

    // The scheduler's policy (the default one) does not allow the search: refused naming
    // it, and so is asking it of a provider that cannot run it, whatever the policy.
    let (status, body) = c
        .post(
            "/v1/sessions",
            json!({"prompt": "p", "tools": ["read_file", "web_search"]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "tools[1]", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`web_search`"),
        "{body}"
    );
    let (status, body) = c
        .post(
            "/v1/sessions",
            json!({"prompt": "p", "provider": "openai", "tools": ["web_search"]}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "tools[0]", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("openai"),
        "{body}"
    );
    let (status, body) = c
        .post(
            "/v1/sessions",
            json!({"prompt": "p", "web_search": {"max_uses": 51}}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "web_search.max_uses", "{body}");
    assert_eq!(fake.request_count(), 0);

    let id = c
        .submit(
            "When did Rust 1.80 ship?",
            &["read_file", WEB_SEARCH_TOOL],
            |s| {
                let searching = search_spec("", &[], 2);
                s.provider = searching.provider;
                s.model = searching.model;
                s.web_search = searching.web_search;
            },
        )
        .await;
    let rows = c
        .wait_terminal(std::slice::from_ref(&id), Duration::from_secs(30))
        .await;
    let done = &rows[0];
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.result.as_deref(), Some("July 25, 2024."));
    assert_eq!(done.usage.web_search_requests, 1);
    assert_eq!(
        (done.usage.input_tokens, done.usage.output_tokens),
        (7104 + 100, 171 + 20)
    );

    // Offered as the server tool, within the session's options, on every call; the
    // second call carries the first answer back block for block.
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        let tools = r.body["tools"].as_array().unwrap();
        assert_eq!(
            tools.last().unwrap(),
            &json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 2})
        );
        assert!(tools.iter().filter(|t| t["name"] == "web_search").count() == 1);
    }
    let sent = &requests[1].body["messages"][1];
    assert_eq!(sent["role"], "assistant");
    assert_eq!(
        sent["content"],
        Value::Array(blocks_of(&fixture_events(FIXTURE)))
    );

    // Stored in the transcript (read back from Postgres) as the provider's, not as calls.
    let messages = c.store.messages(&id).await.unwrap();
    let answer = messages.iter().find(|m| m.role == Role::Assistant).unwrap();
    assert_eq!(answer.tool_calls.len(), 1);
    assert_eq!(answer.tool_calls[0].name, "read_file");
    assert!(
        answer
            .server_content
            .iter()
            .any(|b| b.is_use_of(WEB_SEARCH_TOOL))
    );
    assert!(answer.server_content.iter().any(
        |b| matches!(b, ServerBlock::ToolResult { kind, .. } if kind == "web_search_tool_result")
    ));

    // Priced: 7204 input tokens at $3/M, 191 output at $15/M and one search at $10 per
    // 1,000: $0.034477, in the session's cost, its tree's and its tenant's spend.
    let (status, view) = c.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["usage"]["web_search_requests"], 1, "{view}");
    let cost = view["cost_usd"].as_f64().unwrap();
    assert!((cost - 0.034477).abs() < 1e-9, "{view}");
    let tree = view["tree_cost"]["cost_usd"].as_f64().unwrap();
    assert!((tree - 0.034477).abs() < 1e-9, "{view}");
    let today = agentq_core::budget::day_key(chrono::Utc::now().date_naive());
    let spend = c.store.tenant_spend(TENANT, &today, &today).await.unwrap();
    assert_eq!(spend.cost_nanos, 34_477_000);
    assert_eq!(
        spend.tokens,
        7104 + 171 + 100 + 20,
        "searches are no tokens"
    );
    c.shutdown().await;
}

/// A tool that is not read-only (so the answer that called it is committed before it
/// runs) but safe to run again, whose first call never returns: the crash point.
struct Hang {
    calls: Arc<AtomicUsize>,
    entered: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl agentq_agent::tools::Tool for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn description(&self) -> &str {
        "hangs the first time"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    fn side_effect(&self, _args: &Value) -> agentq_agent::tools::SideEffect {
        agentq_agent::tools::SideEffect::Idempotent
    }
    async fn call(
        &self,
        _args: Value,
        _ctx: &agentq_agent::tools::ToolContext,
    ) -> Result<agentq_agent::tools::ToolOutput, agentq_agent::tools::ToolError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.entered.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(agentq_agent::tools::ToolOutput::ok("done hanging"))
    }
}

/// A worker dies while the model's own call runs, after an answer in which the provider
/// searched and (a hostile answer) "used" a server tool named like that local tool. The
/// next worker resumes from the stored transcript: the model's call runs again (it was
/// unfinished), the server tool never runs in either, the searches are counted once, and
/// the next request carries what the provider ran back exactly as it came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_replays_what_the_search_ran_and_runs_none_of_it() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLlm::start().await.unwrap();
    let first_answer = answer(
        vec![
            text_block(0, "Searching."),
            server_use(1, "srvtoolu_s", WEB_SEARCH_TOOL, &json!({"query": "q"})),
            search_result(2, "srvtoolu_s"),
            server_use(3, "srvtoolu_h", "hang", &json!({"why": "run me locally"})),
            search_result(4, "srvtoolu_h"),
            text_block(5, "Now waiting."),
            block(
                6,
                json!({"type": "tool_use", "id": "toolu_hang", "name": "hang", "input": {}}),
                &[],
            ),
        ],
        "tool_use",
        500,
        40,
        1,
    );
    fake.push(stream(&first_answer));
    fake.push(stream(&final_answer("Found it.")));
    let calls = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(tokio::sync::Notify::new());
    let cfg = || {
        let mut cfg = WorkerSettings {
            concurrency: 2,
            read_block: Duration::from_millis(200),
            heartbeat_interval: Duration::from_millis(300),
            lease_ttl: Duration::from_secs(2),
            reclaim_min_idle: Duration::from_secs(2),
            reclaim_interval: Duration::from_millis(500),
            workspace_root: dir.path().to_path_buf(),
            ..WorkerSettings::default()
        };
        anthropic_at(&mut cfg, &fake, &["hang"]);
        cfg.tools.register(Arc::new(Hang {
            calls: calls.clone(),
            entered: entered.clone(),
        }));
        cfg
    };
    let spec = search_spec("search, then hang", &["hang", WEB_SEARCH_TOOL], 3);
    let (row, _) = store
        .create_session(&NewSession::root(spec, "default"))
        .await
        .unwrap();
    queue
        .enqueue("default", &row.id, EnqueueReason::New)
        .await
        .unwrap();

    let first = Worker::new(store.clone(), queue.clone(), cfg());
    let d = read_entry(&queue, first.consumer(), &row.id).await;
    let crashing = tokio::spawn({
        let first = first.clone();
        async move { first.process(d).await }
    });
    tokio::time::timeout(Duration::from_secs(20), entered.notified())
        .await
        .unwrap();
    crashing.abort();
    assert!(crashing.await.unwrap_err().is_cancelled());
    let mid = store.get(&row.id).await.unwrap().unwrap();
    assert_eq!(mid.status, SessionStatus::Running, "{mid:?}");
    assert_eq!(mid.iteration, 1, "the answer is committed");
    assert_eq!(mid.usage.web_search_requests, 1);
    let stored = store.messages(&row.id).await.unwrap();
    let uses: Vec<&str> = stored[1]
        .server_content
        .iter()
        .filter_map(|b| match b {
            ServerBlock::ToolUse { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(uses, [WEB_SEARCH_TOOL, "hang"]);

    let second = start(&store, &queue, cfg());
    wait_terminal(
        &store,
        &queue,
        std::slice::from_ref(&row.id),
        Duration::from_secs(30),
    )
    .await;
    second.stop().await;
    let done = store.get(&row.id).await.unwrap().unwrap();
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.result.as_deref(), Some("Found it."));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the model's unfinished call ran again; the provider's never ran"
    );
    assert_eq!(done.usage.web_search_requests, 1, "counted once");
    assert_eq!(done.usage.input_tokens, 500 + 100);

    let requests = fake.requests();
    assert_eq!(
        requests.len(),
        2,
        "the committed answer was not asked for again"
    );
    let sent = &requests[1].body["messages"];
    assert_eq!(sent[1]["content"], Value::Array(blocks_of(&first_answer)));
    assert_eq!(
        sent[2]["content"],
        json!([{"type": "tool_result", "tool_use_id": "toolu_hang", "content": "done hanging"}])
    );
    let tools = requests[1].body["tools"].as_array().unwrap();
    assert_eq!(
        tools.last().unwrap(),
        &json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 3})
    );
}

/// Off unless allowed, and never without the provider's own search: a stored session
/// (what the API would have refused) is held to its tenant's policy again by the worker,
/// and one left to a provider that cannot search fails naming the tool, with no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_may_not_or_cannot_search_fails_naming_the_tool() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLlm::start().await.unwrap();
    let cfg = |extra: &[&str], policy_allows: bool| {
        let mut cfg = WorkerSettings {
            read_block: Duration::from_millis(200),
            workspace_root: dir.path().to_path_buf(),
            ..WorkerSettings::default()
        };
        anthropic_at(&mut cfg, &fake, extra);
        if !policy_allows {
            cfg.policy = allowing(extra);
        }
        cfg
    };

    let spec = search_spec("search", &["read_file", WEB_SEARCH_TOOL], 2);
    let (refused, _) = run_one(&store, &queue, cfg(&[], false), spec).await;
    assert_eq!(refused.status, SessionStatus::Failed, "{refused:?}");
    let error = refused.error.unwrap_or_default();
    assert!(
        error.contains("tools[1]") && error.contains("`web_search`"),
        "{error}"
    );
    assert!(error.contains("not allowed by policy"), "{error}");

    // Named provider that cannot search (a row the API would have refused).
    let mut spec = search_spec("search", &[WEB_SEARCH_TOOL], 2);
    spec.provider = Some("openai".into());
    spec.model = Some("gpt-4o-search-preview".into());
    let (cannot, _) = run_one(&store, &queue, cfg(&[], true), spec).await;
    assert_eq!(cannot.status, SessionStatus::Failed, "{cannot:?}");
    let error = cannot.error.unwrap_or_default();
    assert!(
        error.contains("tools[0]") && error.contains("openai"),
        "{error}"
    );

    // Left to the worker's default provider, which cannot search.
    let mut spec = search_spec("search", &[WEB_SEARCH_TOOL], 2);
    spec.provider = None;
    spec.model = None;
    let mut default_openai = cfg(&[], true);
    default_openai.default_provider = Some("openai".into());
    let (cannot, _) = run_one(&store, &queue, default_openai, spec).await;
    assert_eq!(cannot.status, SessionStatus::Failed, "{cannot:?}");
    let error = cannot.error.unwrap_or_default();
    assert!(
        error.contains("tools[0]") && error.contains("`openai`"),
        "{error}"
    );
    assert_eq!(fake.request_count(), 0, "no request was made");
}

/// A sub-agent searches within its parent's options: the parent's domain filter and
/// `max_uses` go with the search to every session of its tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_searches_within_its_parents_options() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLlm::start().await.unwrap();
    let spawn = answer(
        vec![block(
            0,
            json!({"type": "tool_use", "id": "toolu_spawn", "name": "spawn_agent",
                   "input": {"prompt": "find it", "tools": [WEB_SEARCH_TOOL], "wait": true}}),
            &[],
        )],
        "tool_use",
        50,
        10,
        0,
    );
    fake.push(stream(&spawn));
    fake.push(stream(&final_answer("child: found")));
    fake.push(stream(&final_answer("parent: done")));
    let mut cfg = WorkerSettings {
        read_block: Duration::from_millis(200),
        workspace_root: dir.path().to_path_buf(),
        ..WorkerSettings::default()
    };
    anthropic_at(&mut cfg, &fake, &[]);
    let mut spec = search_spec("delegate", &["spawn_agent", WEB_SEARCH_TOOL], 2);
    spec.web_search = Some(WebSearch {
        max_uses: Some(2),
        allowed_domains: vec!["docs.rs".into()],
        blocked_domains: Vec::new(),
    });
    let (done, _) = run_one(&store, &queue, cfg, spec).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.result.as_deref(), Some("parent: done"));
    let requests = fake.requests();
    assert_eq!(requests.len(), 3);
    let child = &requests[1];
    assert_eq!(child.body["messages"][0]["content"], "find it");
    let expected = json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 2,
                          "allowed_domains": ["docs.rs"]});
    for r in &requests {
        assert_eq!(
            r.body["tools"].as_array().unwrap().last().unwrap(),
            &expected
        );
    }
}
