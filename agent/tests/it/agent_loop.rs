#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Loop behaviours, driven through the real driver with the scripted provider (wrapped to
//! record requests) and test tools.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentq_agent::driver::{
    Agent, BackgroundResult, BackgroundSource, Checkpointer, NoBackground, Receipt, RunEnd,
    SuspendReason,
};
use agentq_agent::event::AgentEvent;
use agentq_agent::guard::{Guards, Hook, HookContext, HookDecision};
use agentq_agent::provider::scripted::{
    Script, ScriptedCall, ScriptedFailure, ScriptedProvider, Turn,
};
use agentq_agent::provider::{LlmProvider, LlmRequest, LlmStream};
use agentq_agent::schema::{Message, Role, ToolCall, Usage};
use agentq_agent::spec::{ExitReason, Mode, SessionSpec};
use agentq_agent::state::{INTERRUPTED_RESULT, Outcome, SessionState};
use agentq_agent::tools::{
    LocalWorkspace, SideEffect, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry,
    ToolSettings,
};

use crate::support;
use support::{BackgroundInbox, Changes};

// ---------- test doubles ----------

struct Recording {
    inner: ScriptedProvider,
    requests: Mutex<Vec<LlmRequest<'static>>>,
}

#[async_trait]
impl LlmProvider for Recording {
    fn name(&self) -> &str {
        "scripted"
    }
    async fn stream(&self, request: &LlmRequest<'_>) -> agentq_agent::Result<LlmStream> {
        self.requests
            .lock()
            .unwrap()
            .push(request.clone().into_owned());
        self.inner.stream(request).await
    }
}

/// A tool with programmable behaviour that counts its calls.
type Behave = fn(Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>>;

struct TestTool {
    name: &'static str,
    effect: SideEffect,
    calls: Arc<Mutex<Vec<Value>>>,
    changes: Changes,
    behave: Behave,
}

#[async_trait]
impl Tool for TestTool {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "test tool"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    fn side_effect(&self, _args: &Value) -> SideEffect {
        self.effect
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        self.calls.lock().unwrap().push(args.clone());
        self.changes.bump();
        (self.behave)(args).await
    }
}

fn echo(args: Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
    Box::pin(async move { Ok(ToolOutput::ok(format!("echo {args}"))) })
}

/// A call that never ends by itself: only a timeout or a cancel ends it.
fn slow(_: Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
    Box::pin(std::future::pending())
}

fn huge(_: Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
    Box::pin(async move { Ok(ToolOutput::ok("x".repeat(60_000))) })
}

fn yielding(_: Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
    Box::pin(async move {
        Ok(ToolOutput {
            content: "handing over".into(),
            is_error: false,
            yield_loop: true,
            ..Default::default()
        })
    })
}

fn failing(_: Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
    Box::pin(async move { Err(ToolError::Failed("disk on fire".into())) })
}

static BARRIER: std::sync::OnceLock<tokio::sync::Barrier> = std::sync::OnceLock::new();

/// Returns only once two calls are inside it at the same time: proves concurrency
/// without timing.
fn rendezvous(_: Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
    Box::pin(async move {
        let b = BARRIER.get_or_init(|| tokio::sync::Barrier::new(2));
        match tokio::time::timeout(Duration::from_secs(10), b.wait()).await {
            Ok(_) => Ok(ToolOutput::ok("met")),
            Err(_) => Ok(ToolOutput::error(
                "never met the other call: calls ran sequentially",
            )),
        }
    })
}

#[derive(Default)]
struct RecordingCheckpointer {
    /// (number of messages persisted in total, roles of the new messages, outcome set?)
    saves: Mutex<Vec<(usize, Vec<Role>, bool)>>,
    changes: Changes,
}

#[async_trait]
impl Checkpointer for RecordingCheckpointer {
    async fn save(&self, state: &SessionState, from: usize) -> agentq_agent::Result<Receipt> {
        let roles = state.messages[from..].iter().map(|m| m.role).collect();
        self.saves
            .lock()
            .unwrap()
            .push((state.messages.len(), roles, state.outcome.is_some()));
        self.changes.bump();
        Ok(Receipt::none())
    }
}

struct Harness {
    agent: Agent,
    provider: Arc<Recording>,
    events: Arc<Mutex<Vec<AgentEvent>>>,
    calls: Arc<Mutex<Vec<Value>>>,
    checkpoints: Arc<RecordingCheckpointer>,
    /// Bumped by the tools, the event sink and the checkpointer as they record.
    changes: Changes,
    _dir: tempfile::TempDir,
}

struct Sink(Arc<Mutex<Vec<AgentEvent>>>, Changes);
impl agentq_agent::event::EventSink for Sink {
    fn emit(&self, _seq: usize, e: AgentEvent) {
        self.0.lock().unwrap().push(e);
        self.1.bump();
    }
}

fn harness(script: Script, tools: Vec<(&'static str, SideEffect, Behave)>) -> Harness {
    let provider = Arc::new(Recording {
        inner: ScriptedProvider::new(script),
        requests: Mutex::new(Vec::new()),
    });
    let calls = Arc::new(Mutex::new(Vec::new()));
    let changes = Changes::default();
    let mut reg = ToolRegistry::new();
    for (name, effect, behave) in tools {
        reg.register(Arc::new(TestTool {
            name,
            effect,
            calls: calls.clone(),
            changes: changes.clone(),
            behave,
        }));
    }
    let dir = tempfile::tempdir().unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let checkpoints = Arc::new(RecordingCheckpointer {
        changes: changes.clone(),
        ..Default::default()
    });
    let agent = Agent {
        provider: provider.clone(),
        default_model: "test-model".into(),
        tools: reg,
        web_search: None,
        guards: Guards::default(),
        events: Arc::new(Sink(events.clone(), changes.clone())),
        checkpointer: checkpoints.clone(),
        background: Arc::new(NoBackground),
        workspace: Arc::new(LocalWorkspace::new(dir.path()).unwrap()),
        settings: Arc::new(ToolSettings::default()),
        observer: Arc::new(agentq_agent::observe::NoObserver),
        interrupter: agentq_agent::driver::Interrupter::new(),
        admission: Arc::new(agentq_agent::driver::NoAdmission),
        max_llm_retries: agentq_agent::spec::DEFAULT_MAX_LLM_RETRIES,
        suspend_after: agentq_agent::driver::DEFAULT_SUSPEND_AFTER,
        write_ahead_grace: agentq_agent::driver::DEFAULT_WRITE_AHEAD_GRACE,
    };
    Harness {
        agent,
        provider,
        events,
        calls,
        checkpoints,
        changes,
        _dir: dir,
    }
}

fn text_turn(t: &str) -> Turn {
    Turn {
        text: t.into(),
        usage: Some(Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn call_turn(calls: &[(&str, Value)]) -> Turn {
    Turn {
        tool_calls: calls
            .iter()
            .map(|(n, a)| ScriptedCall {
                name: n.to_string(),
                arguments: a.clone(),
                ..Default::default()
            })
            .collect(),
        usage: Some(Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn spec() -> SessionSpec {
    let mut s = SessionSpec::new("do the task");
    s.retry_delay_ms = 1;
    s
}

async fn run(h: &Harness, spec: SessionSpec) -> (SessionState, RunEnd) {
    let mut state = SessionState::new("s1", spec);
    let end = h
        .agent
        .run(&mut state, &CancellationToken::new())
        .await
        .unwrap();
    (state, end)
}

fn finished(end: &RunEnd) -> &Outcome {
    match end {
        RunEnd::Finished(o) => o,
        other => panic!("expected finished, got {other:?}"),
    }
}

/// Every assistant tool call is followed by its results, ids paired one to one.
fn assert_paired<M: std::borrow::Borrow<Message>>(messages: &[M]) {
    let mut i = 0;
    while i < messages.len() {
        let m: &Message = messages[i].borrow();
        if m.role == Role::Assistant && !m.tool_calls.is_empty() {
            for (k, c) in m.tool_calls.iter().enumerate() {
                let r: &Message = messages[i + 1 + k].borrow();
                assert_eq!(r.role, Role::Tool);
                assert_eq!(r.tool_call_id.as_deref(), Some(c.id.as_str()));
            }
            i += 1 + m.tool_calls.len();
        } else {
            assert_ne!(m.role, Role::Tool, "orphan tool result at {i}");
            i += 1;
        }
    }
}

// ---------- tests ----------

/// Two parallel `echo` calls, then the answer "all done".
fn two_calls_then_done() -> Script {
    Script {
        turns: vec![
            call_turn(&[("echo", json!({"a": 1})), ("echo", json!({"b": 2}))]),
            text_turn("all done"),
        ],
        repeat_last: false,
        ..Default::default()
    }
}

#[tokio::test]
async fn simple_stop_with_tool_round_and_write_ahead_checkpoints() {
    let h = harness(
        two_calls_then_done(),
        vec![("echo", SideEffect::Idempotent, echo)],
    );
    let (state, end) = run(&h, spec()).await;
    let o = finished(&end);
    assert_eq!(o.reason, ExitReason::Stop);
    assert_eq!(o.result.as_deref(), Some("all done"));
    assert_eq!(state.iteration, 2);
    assert_eq!(state.usage.input_tokens, 20);
    assert_eq!(h.calls.lock().unwrap().len(), 2);
    assert_paired(&state.messages);
    // Write-ahead: the assistant response is saved alone, before any result of a call
    // that may change something; then one save per result.
    let saves = h.checkpoints.saves.lock().unwrap().clone();
    assert_eq!(saves[0].1, vec![Role::Assistant]);
    assert_eq!(saves[1].1, vec![Role::Tool]);
    assert_eq!(saves[2].1, vec![Role::Tool]);
    assert!(saves.last().unwrap().2, "final save carries the outcome");
    // Second request carries both results, in call order, after the assistant turn.
    let reqs = h.provider.requests.lock().unwrap();
    assert_eq!(reqs.len(), 2);
    let m = &reqs[1].messages;
    assert_eq!(m[0].role, Role::User);
    assert_eq!(m[1].tool_calls.len(), 2);
    assert_eq!(
        m[2].tool_call_id.as_deref(),
        Some(m[1].tool_calls[0].id.as_str())
    );
    assert_eq!(
        m[3].tool_call_id.as_deref(),
        Some(m[1].tool_calls[1].id.as_str())
    );
    assert_eq!(reqs[0].temperature, 0.1);
    assert_eq!(reqs[0].max_tokens, 8192);
    assert_eq!(reqs[0].tools.len(), 1);
    // Events in order.
    let kinds = kinds(&h);
    assert_eq!(kinds.first().unwrap(), "iteration_started");
    assert!(kinds.contains(&"tool_call".to_string()));
    assert!(kinds.contains(&"tool_result".to_string()));
    assert_eq!(kinds.last().unwrap(), "session_completed");
}

/// The `type` of every event emitted so far, in order.
fn kinds(h: &Harness) -> Vec<String> {
    h.events
        .lock()
        .unwrap()
        .iter()
        .map(|e| {
            serde_json::to_value(e).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn position(kinds: &[String], kind: &str) -> usize {
    kinds.iter().position(|k| k == kind).unwrap()
}

#[tokio::test]
async fn pure_calls_share_one_checkpoint_with_their_response() {
    let h = harness(
        two_calls_then_done(),
        vec![("echo", SideEffect::Pure, echo)],
    );
    let (state, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    assert_eq!(h.calls.lock().unwrap().len(), 2);
    assert_paired(&state.messages);
    // Nothing of the round is saved until the response and both results go together;
    // the final answer goes with the outcome.
    let saves = h.checkpoints.saves.lock().unwrap().clone();
    assert_eq!(
        saves,
        vec![
            (4, vec![Role::Assistant, Role::Tool, Role::Tool], false),
            (5, vec![Role::Assistant], true),
        ]
    );
    assert_eq!(
        state.messages[2].tool_call_id,
        state.messages[1].tool_calls[0].id.clone().into()
    );
    // The iteration is announced once, when it is durable: after its results.
    let kinds = kinds(&h);
    let completed = kinds.iter().filter(|k| *k == "iteration_completed").count();
    assert_eq!(completed, 2, "{kinds:?}");
    assert!(
        position(&kinds, "tool_result") < position(&kinds, "iteration_completed"),
        "{kinds:?}"
    );
}

static GATE: std::sync::OnceLock<tokio::sync::Notify> = std::sync::OnceLock::new();

/// A read-only call that returns only once the test opens the gate.
fn gated(_: Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
    Box::pin(async move {
        GATE.get_or_init(tokio::sync::Notify::new).notified().await;
        Ok(ToolOutput::ok("opened"))
    })
}

#[tokio::test(start_paused = true)]
async fn pure_calls_past_the_grace_have_their_response_committed_while_they_run() {
    let mut h = harness(
        Script {
            turns: vec![call_turn(&[("gated", json!({}))]), text_turn("done")],
            repeat_last: false,
            ..Default::default()
        },
        vec![("gated", SideEffect::Pure, gated)],
    );
    h.agent.write_ahead_grace = Duration::from_millis(20);
    let agent = h.agent.clone();
    let running = tokio::spawn(async move {
        let mut state = SessionState::new("s1", spec());
        let end = agent.run(&mut state, &CancellationToken::new()).await;
        (state, end)
    });
    let started = tokio::time::Instant::now();
    h.changes
        .until("the response saved while its call runs", || {
            !h.checkpoints.saves.lock().unwrap().is_empty()
        })
        .await;
    // Saved alone at the grace, the call still running (it cannot end before the gate).
    assert!(started.elapsed() >= h.agent.write_ahead_grace);
    assert_eq!(
        h.checkpoints.saves.lock().unwrap()[0],
        (2, vec![Role::Assistant], false)
    );
    assert_eq!(h.calls.lock().unwrap().len(), 1);
    assert!(kinds(&h).contains(&"iteration_completed".to_string()));
    GATE.get_or_init(tokio::sync::Notify::new).notify_one();
    let (state, end) = running.await.unwrap();
    assert_eq!(finished(&end.unwrap()).reason, ExitReason::Stop);
    assert_paired(&state.messages);
    let saves = h.checkpoints.saves.lock().unwrap().clone();
    assert_eq!(saves[1], (3, vec![Role::Tool], false));
    let kinds = kinds(&h);
    assert!(
        position(&kinds, "iteration_completed") < position(&kinds, "tool_result"),
        "{kinds:?}"
    );
}

#[tokio::test]
async fn a_call_that_could_change_something_keeps_the_write_ahead() {
    type Setup = fn(&mut Harness, &mut SessionSpec);
    let cases: [(&str, &[&str], Setup); 5] = [
        ("no grace", &["echo"], |h, _| {
            h.agent.write_ahead_grace = Duration::ZERO;
        }),
        ("beside an idempotent call", &["echo", "idem"], |_, _| {}),
        ("with a hook", &["echo"], |h, _| {
            h.agent.guards.hooks.push(Arc::new(Lifecycle::default()));
        }),
        ("sensitive", &["echo"], |_, s| {
            s.sensitive_tools = vec!["echo".into()];
        }),
        ("unknown", &["nope"], |_, _| {}),
    ];
    for (case, names, setup) in cases {
        let calls: Vec<(&str, Value)> = names.iter().map(|n| (*n, json!({}))).collect();
        let mut h = harness(
            Script {
                turns: vec![call_turn(&calls), text_turn("done")],
                repeat_last: false,
                ..Default::default()
            },
            vec![
                ("echo", SideEffect::Pure, echo),
                ("idem", SideEffect::Idempotent, echo),
            ],
        );
        let mut s = spec();
        setup(&mut h, &mut s);
        let (state, _) = run(&h, s).await;
        assert_paired(&state.messages);
        let saves = h.checkpoints.saves.lock().unwrap().clone();
        assert_eq!(saves[0], (2, vec![Role::Assistant], false), "{case}");
    }
}

#[tokio::test]
async fn parallel_calls_run_concurrently() {
    let h = harness(
        Script {
            turns: vec![
                call_turn(&[("meet", json!({})), ("meet", json!({}))]),
                text_turn("ok"),
            ],
            repeat_last: false,
            ..Default::default()
        },
        vec![("meet", SideEffect::Pure, rendezvous)],
    );
    let (state, _) = run(&h, spec()).await;
    let results: Vec<&str> = state
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results, vec!["met", "met"]);
}

#[tokio::test]
async fn max_iterations_stops_the_loop() {
    let h = harness(
        Script {
            turns: vec![call_turn(&[("echo", json!({}))])],
            repeat_last: true,
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    let mut s = spec();
    s.max_iterations = 3;
    let (state, end) = run(&h, s).await;
    assert_eq!(finished(&end).reason, ExitReason::MaxIterations);
    assert_eq!(state.iteration, 3);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 3);
    assert_paired(&state.messages);
}

#[tokio::test(start_paused = true)]
async fn cancellation_mid_tool_interrupts_and_keeps_history_paired() {
    let h = harness(
        Script {
            turns: vec![call_turn(&[("slow", json!({}))]), text_turn("never")],
            repeat_last: false,
            ..Default::default()
        },
        vec![("slow", SideEffect::Pure, slow)],
    );
    let mut state = SessionState::new("s1", spec());
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    let (calls, changes) = (h.calls.clone(), h.changes.clone());
    tokio::spawn(async move {
        changes
            .until("the call to start", || !calls.lock().unwrap().is_empty())
            .await;
        c2.cancel();
    });
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    assert_eq!(finished(&end).reason, ExitReason::Interrupted);
    assert_paired(&state.messages);
    let last = state.messages.last().unwrap();
    assert!(last.content.contains("interrupted"), "{}", last.content);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn tool_timeout_becomes_the_result() {
    let h = harness(
        Script {
            turns: vec![call_turn(&[("slow", json!({}))]), text_turn("fine")],
            repeat_last: false,
            ..Default::default()
        },
        vec![("slow", SideEffect::Pure, slow)],
    );
    let mut s = spec();
    s.tool_timeout_secs = 1;
    let (state, end) = run(&h, s).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    let r = state
        .messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .unwrap();
    assert!(r.is_error);
    assert!(r.content.contains("timed out after 1s"), "{}", r.content);
}

#[tokio::test]
async fn tool_errors_become_text_and_outputs_are_truncated() {
    let h = harness(
        Script {
            turns: vec![
                call_turn(&[
                    ("huge", json!({})),
                    ("fail", json!({})),
                    ("nope", json!({})),
                ]),
                text_turn("fine"),
            ],
            repeat_last: false,
            ..Default::default()
        },
        vec![
            ("huge", SideEffect::Pure, huge),
            ("fail", SideEffect::Pure, failing),
        ],
    );
    let (state, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    let results: Vec<&Message> = state
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect();
    assert!(results[0].content.starts_with(&"x".repeat(50_000)));
    assert!(
        results[0]
            .content
            .ends_with("[output truncated: 10000 of 60000 characters omitted]"),
        "{}",
        &results[0].content[50_000..]
    );
    assert!(results[1].is_error && results[1].content.contains("disk on fire"));
    assert!(results[2].is_error && results[2].content.contains("Unknown tool `nope`"));
}

fn enormous(_: Value) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
    Box::pin(async move { Ok(ToolOutput::ok("y".repeat(1_500_000))) })
}

/// A session whose own limit on tool output is anything (a stored row the API never
/// bounded) still gets at most the hard ceiling of one result in its transcript.
#[tokio::test]
async fn a_tool_result_never_exceeds_the_hard_ceiling() {
    let h = harness(
        Script {
            turns: vec![call_turn(&[("enormous", json!({}))]), text_turn("fine")],
            repeat_last: false,
            ..Default::default()
        },
        vec![("enormous", SideEffect::Pure, enormous)],
    );
    let mut spec = spec();
    spec.tool_output_max_chars = usize::MAX;
    let (state, end) = run(&h, spec).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    let result = state
        .messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .unwrap();
    let max = agentq_agent::bounds::TOOL_OUTPUT_HARD_MAX_CHARS;
    assert!(result.content.starts_with(&"y".repeat(max)));
    assert!(
        result
            .content
            .ends_with("[output truncated: 500000 of 1500000 characters omitted]"),
        "{}",
        &result.content[max..]
    );
}

#[tokio::test]
async fn a_tool_can_yield() {
    let h = harness(
        Script {
            turns: vec![call_turn(&[("yield", json!({}))]), text_turn("never")],
            repeat_last: false,
            ..Default::default()
        },
        vec![("yield", SideEffect::Pure, yielding)],
    );
    let (state, end) = run(&h, spec()).await;
    let o = finished(&end);
    assert_eq!(o.reason, ExitReason::Yielded);
    assert_eq!(o.result.as_deref(), Some("handing over"));
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);
    assert_paired(&state.messages);
}

#[tokio::test]
async fn malformed_arguments_go_back_to_the_model_as_raw() {
    let mut turn = call_turn(&[("echo", json!({}))]);
    turn.tool_calls[0].raw_arguments = Some("{\"path\": \"a.txt\"".into());
    let h = harness(
        Script {
            turns: vec![turn, text_turn("fixed")],
            repeat_last: false,
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    let (state, _) = run(&h, spec()).await;
    assert_eq!(
        h.calls.lock().unwrap()[0],
        json!({"_raw": "{\"path\": \"a.txt\""})
    );
    assert_eq!(
        state.messages[1].tool_calls[0].arguments,
        json!({"_raw": "{\"path\": \"a.txt\""})
    );
    let reqs = h.provider.requests.lock().unwrap();
    assert_eq!(
        reqs[1].messages[1].tool_calls[0].arguments.value()["_raw"],
        "{\"path\": \"a.txt\""
    );
}

#[tokio::test]
async fn think_splitting_keeps_reasoning_out_of_the_answer() {
    let h = harness(
        Script {
            turns: vec![Turn {
                text: "<think>let me reason</think>The answer is 4.".into(),
                chunk_chars: 3,
                ..Default::default()
            }],
            repeat_last: false,
            ..Default::default()
        },
        vec![],
    );
    let (state, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).result.as_deref(), Some("The answer is 4."));
    assert_eq!(state.messages[1].thinking[0].text, "let me reason");
    let ev = h.events.lock().unwrap();
    let text: String = ev
        .iter()
        .filter_map(|e| match e {
            AgentEvent::TextDelta { text } => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "The answer is 4.");
}

#[tokio::test]
async fn think_and_plan_modes_expose_no_tools_and_refuse_calls() {
    for mode in [Mode::Think, Mode::Plan] {
        let h = harness(
            Script {
                turns: vec![call_turn(&[("echo", json!({}))]), text_turn("1. do it")],
                repeat_last: false,
                ..Default::default()
            },
            vec![("echo", SideEffect::Pure, echo)],
        );
        let mut s = spec();
        s.mode = mode;
        let (state, end) = run(&h, s).await;
        assert_eq!(finished(&end).reason, ExitReason::Stop);
        assert!(h.calls.lock().unwrap().is_empty(), "{mode}: tool ran");
        let reqs = h.provider.requests.lock().unwrap();
        assert!(reqs.iter().all(|r| r.tools.is_empty()));
        let refusal = &state.messages[2];
        assert_eq!(refusal.role, Role::Tool);
        assert!(
            refusal.content.contains("not available"),
            "{}",
            refusal.content
        );
        assert_paired(&state.messages);
    }
}

#[tokio::test]
async fn plan_act_plans_without_tools_then_acts_with_them() {
    let h = harness(
        Script {
            turns: vec![
                text_turn("1. echo\n2. report"),
                call_turn(&[("echo", json!({"x": 1}))]),
                text_turn("done"),
            ],
            repeat_last: false,
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    let mut s = spec();
    s.mode = Mode::PlanAct;
    let (state, end) = run(&h, s).await;
    assert_eq!(finished(&end).result.as_deref(), Some("done"));
    let reqs = h.provider.requests.lock().unwrap();
    assert!(reqs[0].tools.is_empty());
    assert!(reqs[0].system.as_deref().unwrap().contains("planning mode"));
    assert_eq!(reqs[1].tools.len(), 1);
    assert_eq!(h.calls.lock().unwrap().len(), 1);
    assert_eq!(state.messages[2].role, Role::User);
}

#[tokio::test]
async fn background_results_are_drained_at_most_three_rounds_in_a_row() {
    let mut h = harness(
        Script {
            turns: vec![text_turn("answer")],
            repeat_last: true,
            ..Default::default()
        },
        vec![],
    );
    let inbox = BackgroundInbox::new();
    for i in 0..5 {
        inbox.started();
        inbox.push(BackgroundResult {
            label: format!("job{i}"),
            id: format!("id{i}"),
            outcome: "completed".into(),
            result: format!("result {i}"),
            seq: i + 1,
        });
    }
    // Results arrive one per drain: deliver them lazily.
    struct OneAtATime(Arc<BackgroundInbox>, Mutex<Vec<BackgroundResult>>);
    #[async_trait]
    impl BackgroundSource for OneAtATime {
        async fn take(&self) -> Vec<BackgroundResult> {
            let fresh = self.0.take().await;
            let mut q = self.1.lock().unwrap();
            q.extend(fresh);
            if q.is_empty() {
                vec![]
            } else {
                vec![q.remove(0)]
            }
        }
        fn outstanding(&self) -> usize {
            0
        }
        async fn wait(&self, _c: &CancellationToken) -> bool {
            false
        }
    }
    h.agent.background = Arc::new(OneAtATime(inbox, Mutex::new(Vec::new())));
    let (state, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    // 1 answer + 3 drains → 4 LLM calls, only the first counted as an iteration.
    assert_eq!(h.provider.requests.lock().unwrap().len(), 4);
    assert_eq!(state.iteration, 1);
    let injected: Vec<&Message> = state
        .messages
        .iter()
        .filter(|m| m.role == Role::User && m.content.starts_with("[Background agent"))
        .collect();
    assert_eq!(injected.len(), 3);
    // The delivered positions are recorded with the history they were injected into.
    assert_eq!(state.bg_cursor, 3);
    assert_eq!(
        injected[0].content,
        "[Background agent \"job0\" (id0) completed] result 0"
    );
}

#[tokio::test]
async fn a_real_tool_call_resets_the_drain_count() {
    let mut h = harness(
        Script {
            turns: vec![
                text_turn("a1"),
                text_turn("a2"),
                call_turn(&[("echo", json!({}))]),
                text_turn("a3"),
                text_turn("a4"),
                text_turn("a5"),
            ],
            repeat_last: true,
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    struct Endless;
    #[async_trait]
    impl BackgroundSource for Endless {
        async fn take(&self) -> Vec<BackgroundResult> {
            vec![BackgroundResult {
                label: "l".into(),
                id: "i".into(),
                outcome: "completed".into(),
                result: "r".into(),
                seq: 0,
            }]
        }
        fn outstanding(&self) -> usize {
            0
        }
        async fn wait(&self, _c: &CancellationToken) -> bool {
            false
        }
    }
    h.agent.background = Arc::new(Endless);
    let (state, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    // a1 (drain 1), a2 (drain 2), tool call (reset; results injected after it),
    // a3 (drain 1), a4 (drain 2), a5 (drain 3), a5 again → stop.
    assert_eq!(finished(&end).result.as_deref(), Some("a5"));
    assert_eq!(state.drain_rounds, 3);
}

#[tokio::test]
async fn running_children_suspend_when_the_host_cannot_wait() {
    /// Children still running: records what was saved when the loop began to wait on them.
    struct Running(Arc<RecordingCheckpointer>, Mutex<Option<usize>>);
    #[async_trait]
    impl BackgroundSource for Running {
        async fn take(&self) -> Vec<BackgroundResult> {
            vec![]
        }
        fn outstanding(&self) -> usize {
            2
        }
        async fn wait(&self, _c: &CancellationToken) -> bool {
            let saved = self.0.saves.lock().unwrap().last().map(|s| s.0);
            *self.1.lock().unwrap() = saved;
            false
        }
    }
    let mut h = harness(
        Script {
            turns: vec![text_turn("waiting on kids")],
            repeat_last: true,
            ..Default::default()
        },
        vec![],
    );
    let running = Arc::new(Running(h.checkpoints.clone(), Mutex::new(None)));
    h.agent.background = running.clone();
    let (_, end) = run(&h, spec()).await;
    assert_eq!(end, RunEnd::Suspended(SuspendReason::Children));
    // A final answer is committed before any wait, never held for the finishing commit.
    assert_eq!(
        *running.1.lock().unwrap(),
        Some(2),
        "the answer was not saved before the wait"
    );
}

#[tokio::test]
async fn retries_transient_failures_then_succeeds() {
    let mut turn = text_turn("made it");
    turn.fail = vec![
        ScriptedFailure {
            status: 500,
            message: "boom".into(),
            ..Default::default()
        },
        ScriptedFailure {
            empty_error_finish: true,
            ..Default::default()
        },
    ];
    let h = harness(
        Script {
            turns: vec![turn],
            repeat_last: false,
            ..Default::default()
        },
        vec![],
    );
    let (_, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).result.as_deref(), Some("made it"));
    assert_eq!(h.provider.requests.lock().unwrap().len(), 3);
    let retries = h
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, AgentEvent::Error { retrying: true, .. }))
        .count();
    assert_eq!(retries, 2);
}

#[tokio::test]
async fn gives_up_after_two_retries_with_the_providers_message() {
    let mut turn = text_turn("never");
    turn.fail = vec![
        ScriptedFailure {
            status: 503,
            message: "overloaded".into(),
            ..Default::default()
        };
        3
    ];
    let h = harness(
        Script {
            turns: vec![turn],
            repeat_last: false,
            ..Default::default()
        },
        vec![],
    );
    let (_, end) = run(&h, spec()).await;
    let o = finished(&end);
    assert_eq!(o.reason, ExitReason::Error);
    assert!(o.error.as_deref().unwrap().contains("overloaded"), "{o:?}");
    assert!(o.error.as_deref().unwrap().contains("3 attempts"), "{o:?}");
    assert_eq!(h.provider.requests.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn no_retry_on_client_errors() {
    let mut turn = text_turn("never");
    turn.fail = vec![ScriptedFailure {
        status: 400,
        message: "bad request".into(),
        ..Default::default()
    }];
    let h = harness(
        Script {
            turns: vec![turn],
            repeat_last: false,
            ..Default::default()
        },
        vec![],
    );
    let (_, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).reason, ExitReason::Error);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_and_cancel_interrupts_the_wait() {
    let mut turn = text_turn("never");
    turn.fail = vec![ScriptedFailure {
        status: 429,
        message: "slow down".into(),
        retry_after_ms: Some(60_000),
        ..Default::default()
    }];
    let mut h = harness(
        Script {
            turns: vec![turn],
            repeat_last: false,
            ..Default::default()
        },
        vec![],
    );
    // Held in the slot, not suspended: the wait is the one to interrupt.
    h.agent.suspend_after = Duration::ZERO;
    let mut state = SessionState::new("s1", spec());
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    let (events, changes) = (h.events.clone(), h.changes.clone());
    tokio::spawn(async move {
        changes
            .until("the wait the provider asked for", || {
                events.lock().unwrap().iter().any(|e| {
                    matches!(e, AgentEvent::RateLimited { wait_ms: 60_000, reason } if reason == "provider")
                })
            })
            .await;
        c2.cancel();
    });
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    assert_eq!(finished(&end).reason, ExitReason::Interrupted);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn token_budget_and_deadline_end_the_session() {
    let h = harness(
        Script {
            turns: vec![call_turn(&[("echo", json!({}))])],
            repeat_last: true,
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    let mut s = spec();
    s.token_budget = Some(30);
    let (_, end) = run(&h, s).await;
    assert_eq!(finished(&end).reason, ExitReason::BudgetExhausted);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 2);

    let mut slow_turn = call_turn(&[("echo", json!({}))]);
    slow_turn.delay_ms = 400;
    let h = harness(
        Script {
            turns: vec![slow_turn],
            repeat_last: true,
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    let mut s = spec();
    s.timeout_secs = Some(1);
    let (_, end) = run(&h, s).await;
    assert_eq!(finished(&end).reason, ExitReason::Timeout);
}

#[tokio::test]
async fn resume_repairs_history_and_reruns_only_safe_calls() {
    // A session whose worker died after the assistant response was saved and after one
    // of three results: a pure and an unsafe call are still open.
    let h = harness(
        Script {
            turns: vec![text_turn("unused"), text_turn("recovered")],
            repeat_last: false,
            ..Default::default()
        },
        vec![
            ("pure", SideEffect::Pure, echo),
            ("unsafe", SideEffect::Unsafe, echo),
            ("done", SideEffect::Pure, echo),
        ],
    );
    let mut state = SessionState::new("s1", spec());
    state.started_at = Some(chrono::Utc::now());
    let mut assistant = Message::assistant("");
    assistant.tool_calls = vec![
        ToolCall {
            id: "c1".into(),
            name: "pure".into(),
            arguments: json!({}).into(),
        },
        ToolCall {
            id: "c2".into(),
            name: "unsafe".into(),
            arguments: json!({}).into(),
        },
        ToolCall {
            id: "c3".into(),
            name: "done".into(),
            arguments: json!({}).into(),
        },
    ];
    state.push_assistant(assistant);
    state
        .messages
        .push(Message::tool_result("c3", "done", "already done", false));

    // The request view repairs the gap without touching the stored history.
    let view = state.request("m", &[], None).messages;
    assert_paired(&view);
    assert_eq!(view[2].content, INTERRUPTED_RESULT);
    assert_eq!(view[4].content, "already done");
    assert_eq!(state.messages.len(), 3);

    let end = h
        .agent
        .run(&mut state, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(finished(&end).result.as_deref(), Some("recovered"));
    let calls = h.calls.lock().unwrap();
    assert_eq!(calls.len(), 1, "only the pure call re-ran");
    assert_paired(&state.messages);
    assert_eq!(state.messages[2].tool_call_id.as_deref(), Some("c1"));
    assert!(state.messages[3].content.contains("outcome unknown"));
    assert_eq!(state.messages[4].content, "already done");
    // The LLM was asked once, for the next turn: never again for the saved response.
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn compaction_shortens_old_tool_outputs_in_the_request_only() {
    let mut big = |_: Value| -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>> {
        Box::pin(async move { Ok(ToolOutput::ok("y".repeat(5_000))) })
    };
    let _ = &mut big;
    let h = harness(
        Script {
            turns: vec![
                call_turn(&[("big", json!({}))]),
                call_turn(&[("big", json!({}))]),
                call_turn(&[("big", json!({}))]),
                text_turn("done"),
            ],
            repeat_last: false,
            ..Default::default()
        },
        vec![("big", SideEffect::Pure, big)],
    );
    let mut s = spec();
    s.context_budget_chars = Some(8_000);
    // The same call three times: no repeat note, so that every stored output is the tool's.
    s.warn_repeated_calls = 0;
    let (state, _) = run(&h, s).await;
    let reqs = h.provider.requests.lock().unwrap();
    let last = &reqs[3].messages;
    let tool_lens: Vec<usize> = last
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.len())
        .collect();
    assert!(tool_lens[0] < 400, "{tool_lens:?}");
    assert_eq!(tool_lens[2], 5_000);
    assert!(
        last[2]
            .content
            .contains("omitted to fit the context budget")
    );
    // Stored history untouched.
    assert!(
        state
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .all(|m| m.content.len() == 5_000)
    );
}

#[tokio::test]
async fn history_window_keeps_the_task_and_cuts_at_a_turn_boundary() {
    let mut history = vec![Message::user("the task")];
    for i in 0..20 {
        let mut a = Message::assistant("");
        a.tool_calls = vec![ToolCall {
            id: format!("c{i}"),
            name: "t".into(),
            arguments: json!({}).into(),
        }];
        history.push(a);
        history.push(Message::tool_result(format!("c{i}"), "t", "r", false));
    }
    let view = agentq_agent::state::request_view(&history, 10, None);
    assert!(view.len() <= 10);
    assert_eq!(view[0].content, "the task");
    assert_eq!(view[1].role, Role::Assistant);
    assert_paired(&view);
}

struct DenyHook;
#[async_trait]
impl Hook for DenyHook {
    async fn pre_tool_use(&self, _ctx: &HookContext<'_>, call: &ToolCall) -> HookDecision {
        if call.name == "echo" {
            HookDecision::Deny("echo is banned".into())
        } else {
            HookDecision::Allow
        }
    }
}

#[tokio::test]
async fn guards_deny_with_the_stage_named() {
    let mut h = harness(
        Script {
            turns: vec![
                call_turn(&[
                    ("echo", json!({})),
                    ("other", json!({})),
                    ("native", json!({})),
                ]),
                text_turn("ok"),
            ],
            repeat_last: false,
            ..Default::default()
        },
        vec![
            ("echo", SideEffect::Pure, echo),
            ("other", SideEffect::Pure, echo),
            ("native", SideEffect::Pure, echo),
        ],
    );
    h.agent.guards.hooks.push(Arc::new(DenyHook));
    h.agent.guards.native_tools.insert("native".into());
    h.agent.guards.sensitive_tools.insert("other".into());
    let (state, _) = run(&h, spec()).await;
    let r: Vec<&Message> = state
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .collect();
    assert!(
        r[0].content
            .contains("denied by PreToolUse hook: echo is banned"),
        "{}",
        r[0].content
    );
    assert!(
        r[1].content.contains("denied by approval"),
        "{}",
        r[1].content
    );
    assert!(r[2].content.contains("natively"), "{}", r[2].content);
    assert!(h.calls.lock().unwrap().is_empty());
}

#[derive(Default)]
struct Lifecycle {
    seen: Mutex<Vec<String>>,
    changes: Changes,
}

#[async_trait]
impl Hook for Lifecycle {
    async fn session_start(&self, ctx: &HookContext<'_>) {
        self.seen
            .lock()
            .unwrap()
            .push(format!("start {}", ctx.session_id));
    }
    async fn session_end(&self, _ctx: &HookContext<'_>, reason: ExitReason) {
        self.seen.lock().unwrap().push(format!("end {reason}"));
    }
    async fn post_tool_use(&self, _ctx: &HookContext<'_>, call: &ToolCall, output: &ToolOutput) {
        self.seen
            .lock()
            .unwrap()
            .push(format!("post {} {}", call.name, output.content));
        self.changes.bump();
    }
}

#[tokio::test]
async fn lifecycle_hooks_fire_once_each() {
    let mut h = harness(
        Script {
            turns: vec![call_turn(&[("echo", json!({"x": 1}))]), text_turn("done")],
            repeat_last: false,
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    let hook = Arc::new(Lifecycle::default());
    h.agent.guards.hooks.push(hook.clone());
    let (_, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    // PostToolUse is fire and forget: wait for its task.
    hook.changes
        .until("PostToolUse", || {
            hook.seen
                .lock()
                .unwrap()
                .iter()
                .any(|s| s.starts_with("post"))
        })
        .await;
    let seen = hook.seen.lock().unwrap().clone();
    assert_eq!(seen.first().unwrap(), "start s1");
    assert!(seen.contains(&"end stop".to_string()), "{seen:?}");
    assert!(
        seen.contains(&"post echo echo {\"x\":1}".to_string()),
        "{seen:?}"
    );
    assert_eq!(seen.iter().filter(|s| s.starts_with("start")).count(), 1);
    assert_eq!(seen.iter().filter(|s| s.starts_with("end")).count(), 1);
}

/// An approver that knows the decisions recorded so far and has the session suspend for
/// the others, as a worker's does.
#[derive(Default)]
struct Decisions(Mutex<Vec<(String, bool)>>);

#[async_trait]
impl agentq_agent::guard::Approver for Decisions {
    async fn approve(
        &self,
        _session_id: &str,
        call: &ToolCall,
        _timeout: Duration,
    ) -> agentq_agent::guard::ApprovalDecision {
        use agentq_agent::guard::ApprovalDecision;
        match self.0.lock().unwrap().iter().find(|(id, _)| *id == call.id) {
            Some((_, true)) => ApprovalDecision::Approved,
            Some((_, false)) => ApprovalDecision::Denied("no".into()),
            None => ApprovalDecision::Suspend,
        }
    }
}

/// Events with their positions.
struct SeqSink(Arc<Mutex<Vec<(usize, AgentEvent)>>>);
impl agentq_agent::event::EventSink for SeqSink {
    fn emit(&self, seq: usize, e: AgentEvent) {
        self.0.lock().unwrap().push((seq, e));
    }
}

fn approval_requests(events: &Mutex<Vec<(usize, AgentEvent)>>) -> Vec<(usize, String, Value)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(seq, e)| match e {
            AgentEvent::ApprovalRequested {
                id,
                name,
                arguments,
            } => Some((*seq, format!("{name}:{id}"), arguments.value())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn held_calls_are_announced_once_at_their_response() {
    let turn = |calls: &[(&str, &str, Value)]| Turn {
        tool_calls: calls
            .iter()
            .map(|(id, name, arguments)| ScriptedCall {
                id: Some(id.to_string()),
                name: name.to_string(),
                arguments: arguments.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let mut h = harness(
        Script {
            turns: vec![
                turn(&[
                    ("w1", "write", json!({"path": "a"})),
                    ("r1", "echo", json!({"x": 1})),
                    ("w2", "write", json!({"path": "b"})),
                ]),
                text_turn("both written"),
            ],
            repeat_last: false,
            ..Default::default()
        },
        vec![
            ("write", SideEffect::Unsafe, echo),
            ("echo", SideEffect::Pure, echo),
        ],
    );
    let decisions = Arc::new(Decisions::default());
    h.agent.guards.approver = Some(decisions.clone());
    let events = Arc::new(Mutex::new(Vec::new()));
    h.agent.events = Arc::new(SeqSink(events.clone()));
    let mut s = spec();
    s.sensitive_tools = vec!["write".into()];

    let mut state = SessionState::new("s1", s);
    let cancel = CancellationToken::new();
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    assert!(
        matches!(end, RunEnd::Suspended(SuspendReason::Approval { .. })),
        "{end:?}"
    );
    // Both held calls, at the position of the response that made them (1), as its
    // `ToolCall`s are; the unheld one ran.
    let mut asked = approval_requests(&events);
    asked.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        asked,
        [
            (1, "write:w1".to_string(), json!({"path": "a"})),
            (1, "write:w2".to_string(), json!({"path": "b"})),
        ]
    );
    assert_eq!(state.not_started.len(), 2);

    // A resumed run that holds them again does not announce them again.
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    assert!(matches!(end, RunEnd::Suspended(_)), "{end:?}");
    assert_eq!(approval_requests(&events).len(), 2);

    // Decided: both run, nothing more is asked.
    decisions
        .0
        .lock()
        .unwrap()
        .extend([("w1".into(), true), ("w2".into(), true)]);
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    assert_eq!(finished(&end).result.as_deref(), Some("both written"));
    assert_eq!(approval_requests(&events).len(), 2);
    assert_eq!(h.calls.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_hold_after_a_handover_is_announced_no_earlier_than_the_run_began() {
    // The response was committed by a run that died before its calls were checked: the
    // run that holds them started later in the history. (An idempotent tool: an unsafe
    // one that may have started is answered "outcome unknown" instead.)
    let h0 = harness(
        Script {
            turns: vec![text_turn("done")],
            repeat_last: false,
            ..Default::default()
        },
        vec![
            ("write", SideEffect::Idempotent, echo),
            ("echo", SideEffect::Pure, echo),
        ],
    );
    let mut h = h0;
    h.agent.guards.approver = Some(Arc::new(Decisions::default()));
    let events = Arc::new(Mutex::new(Vec::new()));
    h.agent.events = Arc::new(SeqSink(events.clone()));
    let mut s = spec();
    s.sensitive_tools = vec!["write".into()];
    let mut state = SessionState::new("s1", s);
    state.started_at = Some(chrono::Utc::now());
    let mut reply = Message::assistant("");
    reply.tool_calls = vec![
        ToolCall {
            id: "r1".into(),
            name: "echo".into(),
            arguments: json!({}).into(),
        },
        ToolCall {
            id: "w1".into(),
            name: "write".into(),
            arguments: json!({"path": "a"}).into(),
        },
    ];
    state.push_assistant(reply);
    state.push_tool_result(
        ToolCall {
            id: "r1".into(),
            name: "echo".into(),
            arguments: json!({}).into(),
        },
        "echo {}".into(),
        false,
    );
    let end = h
        .agent
        .run(&mut state, &CancellationToken::new())
        .await
        .unwrap();
    assert!(matches!(end, RunEnd::Suspended(_)), "{end:?}");
    assert_eq!(
        approval_requests(&events),
        [(3, "write:w1".to_string(), json!({"path": "a"}))]
    );
}

/// A provider that streams without end (a broken or hostile endpoint) cannot make one
/// answer grow past the response cap: the call fails, not the worker's memory.
#[tokio::test]
async fn an_answer_past_the_response_cap_fails_the_session() {
    let size = 33 * 1024 * 1024;
    let h = harness(
        Script {
            turns: vec![text_turn(&"z".repeat(size))],
            repeat_last: false,
            ..Default::default()
        },
        vec![],
    );
    let (state, end) = run(&h, spec()).await;
    let outcome = finished(&end);
    assert_eq!(outcome.reason, ExitReason::Error, "{:?}", outcome.error);
    assert!(
        outcome.error.as_deref().unwrap_or("").contains("bytes"),
        "{:?}",
        outcome.error
    );
    assert!(state.messages.iter().all(|m| m.content.len() < size));
}

/// An endpoint that ignores `max_tokens` cannot make an answer longer than the tokens
/// could be: past `answer_bytes(max_tokens)` the call fails (not retried), while an
/// answer within it, however long, is taken whole.
#[tokio::test]
async fn an_answer_longer_than_its_max_tokens_allows_fails_the_session() {
    let limit = agentq_agent::bounds::answer_bytes(8_192);
    let answer = |size: usize| {
        harness(
            Script {
                turns: vec![text_turn(&"z".repeat(size))],
                repeat_last: false,
                ..Default::default()
            },
            vec![],
        )
    };
    let mut s = spec();
    s.max_tokens = 8_192;
    let (_, end) = run(&answer(limit - 1), s.clone()).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    let (state, end) = run(&answer(limit + 1), s).await;
    let outcome = finished(&end);
    assert_eq!(outcome.reason, ExitReason::Error, "{:?}", outcome.error);
    assert!(
        outcome
            .error
            .as_deref()
            .unwrap_or("")
            .contains("max_tokens"),
        "{:?}",
        outcome.error
    );
    assert!(state.messages.iter().all(|m| m.content.len() <= limit));
}

/// A model that makes far more calls in one answer than a round runs: the first
/// `MAX_TOOL_CALLS_PER_RESPONSE` run, the rest are answered with a refusal, every call
/// has its result, and the session goes on to its answer.
#[tokio::test]
async fn calls_past_the_per_response_limit_are_refused_not_run() {
    let max = agentq_agent::bounds::MAX_TOOL_CALLS_PER_RESPONSE;
    let many: Vec<(&str, Value)> = (0..max + 50).map(|i| ("echo", json!({ "i": i }))).collect();
    let h = harness(
        Script {
            turns: vec![call_turn(&many), text_turn("done")],
            repeat_last: false,
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    let mut spec = spec();
    // The scripted model counts its answers in what it is sent: send it all.
    spec.history_window = 1_000;
    let (state, end) = run(&h, spec).await;
    assert_eq!(finished(&end).reason, ExitReason::Stop);
    assert_eq!(h.calls.lock().unwrap().len(), max);
    assert_paired(&state.messages);
    let refused = state
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool && m.is_error && m.content.starts_with("Not run"))
        .count();
    assert_eq!(refused, 50);
}

// ---------- admission and rate limits ----------

use agentq_agent::driver::{Admission, Admit, CallAsk, CallReport, Permit};
use agentq_agent::provider::RateLimitInfo;

/// Answers `reserve` from a script (then `Go`), and records every ask and settle.
#[derive(Default)]
struct ScriptedAdmission {
    script: crate::support::AdmissionScript,
    asks: Mutex<Vec<(String, u64, u64)>>,
    max_waits: Mutex<Vec<Duration>>,
    settled: Mutex<Vec<(Permit, CallReport)>>,
    granted: std::sync::atomic::AtomicUsize,
}

impl ScriptedAdmission {
    fn new(answers: Vec<Admit>) -> Arc<Self> {
        Arc::new(ScriptedAdmission {
            script: crate::support::AdmissionScript::new(answers),
            ..Default::default()
        })
    }
    fn settled(&self) -> Vec<(Permit, CallReport)> {
        self.settled.lock().unwrap().clone()
    }
}

#[async_trait]
impl Admission for ScriptedAdmission {
    async fn reserve(&self, ask: &CallAsk<'_>) -> Admit {
        self.asks.lock().unwrap().push((
            ask.model.to_string(),
            ask.input_tokens,
            ask.max_output_tokens,
        ));
        self.max_waits.lock().unwrap().push(ask.max_wait);
        if let Some(a) = self.script.next().await {
            return a;
        }
        let n = self
            .granted
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Admit::Go(Permit {
            id: format!("p{n}"),
            reserved_tokens: ask.input_tokens + ask.max_output_tokens,
            ..Permit::default()
        })
    }
    async fn settle(&self, _ask: &CallAsk<'_>, permit: Permit, report: &CallReport) {
        self.settled.lock().unwrap().push((permit, report.clone()));
    }
}

fn wait(ms: u64, reason: &'static str) -> Admit {
    Admit::Wait {
        after: Duration::from_millis(ms),
        reason,
    }
}

fn rate_limited_events(h: &Harness) -> Vec<(u64, String)> {
    h.events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::RateLimited { wait_ms, reason } => Some((*wait_ms, reason.clone())),
            _ => None,
        })
        .collect()
}

fn one_turn(turn: Turn) -> Script {
    Script {
        turns: vec![turn],
        ..Default::default()
    }
}

#[tokio::test]
async fn admission_waits_do_not_spend_the_retry_allowance() {
    let mut turn = text_turn("made it");
    turn.fail = vec![
        ScriptedFailure {
            status: 500,
            message: "boom".into(),
            ..Default::default()
        };
        2
    ];
    let mut h = harness(one_turn(turn), vec![]);
    // Three waits before the first try, two before the second: more waits than the
    // two retries the session has, and the two real failures still get their retries.
    let admission =
        ScriptedAdmission::new(vec![wait(1, "rpm"), wait(0, "tpm"), wait(2, "concurrency")]);
    h.agent.admission = admission.clone();
    let mut spec = spec();
    spec.max_llm_retries = Some(2);
    spec.max_tokens = 512;
    let (state, end) = run(&h, spec).await;
    assert_eq!(finished(&end).result.as_deref(), Some("made it"));
    assert_eq!(h.provider.requests.lock().unwrap().len(), 3);
    assert_eq!(
        rate_limited_events(&h),
        // Waits under 5 ms (a limiter's "wait 0") are floored, so the loop never spins
        // on its round trips.
        vec![
            (5, "rpm".to_string()),
            (5, "tpm".to_string()),
            (5, "concurrency".to_string()),
        ]
    );
    // Asked once per wait and once per try; settled once per try, with the same permit.
    let asks = admission.asks.lock().unwrap().clone();
    assert_eq!(asks.len(), 3 + 3);
    assert!(
        asks.iter()
            .all(|(m, input, max)| m == "test-model" && *input > 0 && *max == 512)
    );
    let settled = admission.settled();
    assert_eq!(
        settled
            .iter()
            .map(|(p, _)| p.id.as_str())
            .collect::<Vec<_>>(),
        ["p0", "p1", "p2"]
    );
    assert!(settled[..2].iter().all(|(_, r)| r.usage.is_none()));
    assert_eq!(
        settled[2]
            .1
            .usage
            .map(|u| (u.input_tokens, u.output_tokens)),
        Some((10, 5)),
        "the answer's usage is reported"
    );
    assert!(state.outcome.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_429_waits_for_its_reset_without_spending_retries() {
    let limits = RateLimitInfo {
        limit_requests: Some(40),
        remaining_requests: Some(0),
        reset_requests: Some(Duration::from_millis(3)),
        ..Default::default()
    };
    let mut turn = text_turn("through");
    // Five refusals in a row with no retry allowance at all: none is a failure.
    turn.fail = vec![
        ScriptedFailure {
            status: 429,
            message: "slow down".into(),
            retry_after_ms: Some(1),
            ..Default::default()
        },
        ScriptedFailure {
            status: 429,
            message: "slow down".into(),
            limits: Some(limits.clone()),
            ..Default::default()
        },
        ScriptedFailure {
            status: 529,
            message: "overloaded".into(),
            ..Default::default()
        },
    ];
    turn.limits = Some(RateLimitInfo {
        limit_requests: Some(40),
        remaining_requests: Some(39),
        ..Default::default()
    });
    let mut h = harness(one_turn(turn), vec![]);
    let admission = ScriptedAdmission::new(vec![]);
    h.agent.admission = admission.clone();
    h.agent.max_llm_retries = 0;
    let (_, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).result.as_deref(), Some("through"));
    assert_eq!(h.provider.requests.lock().unwrap().len(), 4);
    let reports: Vec<CallReport> = admission.settled().into_iter().map(|(_, r)| r).collect();
    assert_eq!(reports.len(), 4);
    assert_eq!(
        reports[0].rate_limited,
        Some(Some(Duration::from_millis(1)))
    );
    assert_eq!(reports[1].rate_limited, Some(None));
    assert_eq!(reports[1].limits.as_ref(), Some(&limits));
    assert_eq!(reports[2].rate_limited, Some(None), "529 is a refusal");
    assert_eq!(reports[3].rate_limited, None);
    assert_eq!(
        reports[3].limits.as_ref().unwrap().remaining_requests,
        Some(39)
    );
    // The waits honour the server: the header's reset, else the doubling floor.
    let waits = rate_limited_events(&h);
    assert_eq!(waits.len(), 3);
    assert!(waits.iter().all(|(_, r)| r == "provider"));
    assert_eq!(
        waits.iter().map(|(w, _)| *w).collect::<Vec<_>>(),
        [100, 200, 400]
    );
    // No failure was announced as one.
    assert!(
        !h.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, AgentEvent::Error { .. }))
    );
}

#[tokio::test]
async fn real_failures_use_the_hosts_retry_count_unless_the_spec_sets_one() {
    let failing_turn = || {
        let mut turn = text_turn("never");
        turn.fail = vec![
            ScriptedFailure {
                status: 502,
                message: "bad gateway".into(),
                ..Default::default()
            };
            5
        ];
        turn
    };
    let mut h = harness(one_turn(failing_turn()), vec![]);
    h.agent.max_llm_retries = 0;
    let (_, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).reason, ExitReason::Error);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);

    let mut h = harness(one_turn(failing_turn()), vec![]);
    h.agent.max_llm_retries = 0;
    let mut s = spec();
    s.max_llm_retries = Some(3);
    let (_, end) = run(&h, s).await;
    assert!(
        finished(&end)
            .error
            .as_deref()
            .unwrap()
            .contains("4 attempts")
    );
    assert_eq!(h.provider.requests.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn a_long_admission_wait_suspends_without_recording_the_call() {
    let mut h = harness(
        Script {
            turns: vec![call_turn(&[("echo", json!({"x": 1}))]), text_turn("done")],
            ..Default::default()
        },
        vec![("echo", SideEffect::Pure, echo)],
    );
    // The first call goes through; the second would wait ten minutes.
    let admission = ScriptedAdmission::new(vec![]);
    h.agent.admission = admission.clone();
    let mut state = SessionState::new("s1", spec());
    let cancel = CancellationToken::new();
    // First run: one call, its tool round; then the wait.
    admission
        .script
        .answers
        .lock()
        .unwrap()
        .extend([Admit::Go(Permit::default()), wait(600_000, "tpm")]);
    let before = chrono::Utc::now();
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    let RunEnd::Suspended(SuspendReason::RateLimit { until }) = end else {
        panic!("expected a rate-limit suspension, got {end:?}")
    };
    assert!(until >= before + chrono::Duration::seconds(599), "{until}");
    assert!(until <= chrono::Utc::now() + chrono::Duration::seconds(601));
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);
    // The history ends with the tool result, committed; nothing of the second call.
    let roles: Vec<Role> = state.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles.last(), Some(&Role::Tool));
    assert!(state.outcome.is_none());
    let saves = h.checkpoints.saves.lock().unwrap().clone();
    assert_eq!(saves.last().unwrap().0, state.messages.len());
    assert_eq!(rate_limited_events(&h), vec![(600_000, "tpm".to_string())]);

    // Resumed (the wait is over): the session finishes where it stopped.
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    assert_eq!(finished(&end).result.as_deref(), Some("done"));
    assert_eq!(h.provider.requests.lock().unwrap().len(), 2);
    assert_eq!(
        state
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count(),
        2
    );
}

#[tokio::test]
async fn a_429_asking_for_a_long_wait_suspends_and_zero_never_does() {
    let refused = || {
        let mut turn = text_turn("later");
        turn.fail = vec![ScriptedFailure {
            status: 429,
            message: "slow down".into(),
            retry_after_ms: Some(120_000),
            ..Default::default()
        }];
        turn
    };
    let h = harness(one_turn(refused()), vec![]);
    let (state, end) = run(&h, spec()).await;
    assert!(
        matches!(end, RunEnd::Suspended(SuspendReason::RateLimit { .. })),
        "{end:?}"
    );
    assert!(state.outcome.is_none());
    assert_eq!(state.messages.len(), 1, "only the task");

    // A deadline that falls before the reset ends the session instead of suspending it.
    let h = harness(one_turn(refused()), vec![]);
    let mut s = spec();
    s.timeout_secs = Some(60);
    let (_, end) = run(&h, s).await;
    let o = finished(&end);
    assert_eq!(o.reason, ExitReason::Timeout);
    assert!(o.error.as_deref().unwrap().contains("rate limit"), "{o:?}");
}

#[tokio::test]
async fn a_spent_budget_fails_or_parks_the_session() {
    let mut h = harness(one_turn(text_turn("never")), vec![]);
    h.agent.admission = ScriptedAdmission::new(vec![Admit::Exhausted {
        message: "tenant acme's daily budget is spent".into(),
        park: false,
    }]);
    let (_, end) = run(&h, spec()).await;
    let o = finished(&end);
    assert_eq!(o.reason, ExitReason::BudgetExhausted);
    assert_eq!(
        o.error.as_deref(),
        Some("tenant acme's daily budget is spent")
    );
    assert_eq!(h.provider.requests.lock().unwrap().len(), 0);

    let mut h = harness(one_turn(text_turn("later")), vec![]);
    let admission = ScriptedAdmission::new(vec![Admit::Exhausted {
        message: "the tree's budget is spent".into(),
        park: true,
    }]);
    h.agent.admission = admission.clone();
    let (state, end) = run(&h, spec()).await;
    assert_eq!(
        end,
        RunEnd::Suspended(SuspendReason::Budget {
            message: "the tree's budget is spent".into()
        })
    );
    assert!(state.outcome.is_none());
    assert_eq!(h.provider.requests.lock().unwrap().len(), 0);
    assert!(
        admission.settled().is_empty(),
        "no permit, nothing to settle"
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_an_admission_wait() {
    let mut h = harness(one_turn(text_turn("never")), vec![]);
    h.agent.admission = ScriptedAdmission::new(vec![wait(20_000, "rpm")]);
    let mut state = SessionState::new("s1", spec());
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    let (events, changes) = (h.events.clone(), h.changes.clone());
    tokio::spawn(async move {
        changes
            .until("the wait to be announced", || {
                events
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|e| matches!(e, AgentEvent::RateLimited { .. }))
            })
            .await;
        c2.cancel();
    });
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    assert_eq!(finished(&end).reason, ExitReason::Interrupted);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 0);
}

fn booked(ms: u64, waits_for: &'static str) -> Admit {
    Admit::Go(Permit {
        id: "booked".into(),
        start_after: Duration::from_millis(ms),
        waits_for,
        ..Permit::default()
    })
}

#[tokio::test(start_paused = true)]
async fn a_booked_start_is_waited_for_without_asking_again() {
    let mut h = harness(one_turn(text_turn("on time")), vec![]);
    let admission = ScriptedAdmission::new(vec![booked(40, "rpm")]);
    h.agent.admission = admission.clone();
    h.agent.suspend_after = Duration::from_secs(7);
    let started = tokio::time::Instant::now();
    let (_, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).result.as_deref(), Some("on time"));
    assert!(started.elapsed() >= Duration::from_millis(40));
    // One ask, one settle of the booked permit, and the wait shows as a rate limit.
    assert_eq!(admission.asks.lock().unwrap().len(), 1);
    let settled = admission.settled();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].0.id, "booked");
    assert!(settled[0].1.usage.is_some());
    assert_eq!(rate_limited_events(&h), vec![(40, "rpm".to_string())]);
    // The admission may book no later start than the wait that would suspend the session.
    assert_eq!(
        *admission.max_waits.lock().unwrap(),
        vec![Duration::from_secs(7)]
    );
}

#[tokio::test]
async fn a_deadline_bounds_the_bookable_wait() {
    let mut h = harness(one_turn(text_turn("ok")), vec![]);
    let admission = ScriptedAdmission::new(vec![]);
    h.agent.admission = admission.clone();
    h.agent.suspend_after = Duration::ZERO;
    let mut spec = spec();
    spec.timeout_secs = Some(20);
    let _ = run(&h, spec).await;
    let waits = admission.max_waits.lock().unwrap().clone();
    assert_eq!(waits.len(), 1);
    assert!(waits[0] <= Duration::from_secs(20) && waits[0] > Duration::from_secs(15));
}

#[tokio::test(start_paused = true)]
async fn cancel_during_a_booked_start_settles_the_permit_and_calls_nothing() {
    let mut h = harness(one_turn(text_turn("never")), vec![]);
    let admission = ScriptedAdmission::new(vec![booked(20_000, "tpm")]);
    h.agent.admission = admission.clone();
    let mut state = SessionState::new("s1", spec());
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    let (events, changes) = (h.events.clone(), h.changes.clone());
    tokio::spawn(async move {
        changes
            .until("the wait to be announced", || {
                events
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|e| matches!(e, AgentEvent::RateLimited { .. }))
            })
            .await;
        c2.cancel();
    });
    let end = h.agent.run(&mut state, &cancel).await.unwrap();
    assert_eq!(finished(&end).reason, ExitReason::Interrupted);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 0);
    let settled = admission.settled();
    assert_eq!(settled.len(), 1, "the booked place is given back");
    assert_eq!(settled[0].0.id, "booked");
    assert_eq!(settled[0].1, CallReport::UNSENT);
}

/// Counts the calls given back late, as the worker's metric does.
#[derive(Default)]
struct LateCounter(std::sync::atomic::AtomicUsize);

impl agentq_agent::observe::Observer for LateCounter {
    fn admission_late(&self, _provider: &str, _model: &str) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn late(id: &str, start_ms: u64) -> Admit {
    Admit::Go(Permit {
        id: id.into(),
        start_after: Duration::from_millis(start_ms),
        waits_for: if start_ms > 0 { "rpm" } else { "" },
        ..Permit::default()
    })
}

/// A call whose admission answered for a start it can no longer make (the answer came
/// slowly: a starved worker) gives the booking back and asks again, so that calls booked
/// a window apart never reach the provider within one; a booked start waited out on
/// time goes.
#[tokio::test(start_paused = true)]
async fn a_call_too_late_for_its_booking_gives_it_back_and_asks_again() {
    let mut h = harness(one_turn(text_turn("on time")), vec![]);
    let admission = ScriptedAdmission::new(vec![late("a", 0), late("b", 40), late("c", 40)]);
    admission.script.slow.lock().unwrap().extend([
        Duration::from_millis(11),
        Duration::from_millis(30),
        Duration::from_millis(5),
    ]);
    *admission.script.late_after.lock().unwrap() = Some(Duration::from_millis(10));
    h.agent.admission = admission.clone();
    let counted = Arc::new(LateCounter::default());
    h.agent.observer = counted.clone();
    let (_, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).result.as_deref(), Some("on time"));
    assert_eq!(counted.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(admission.asks.lock().unwrap().len(), 3);
    let settled = admission.settled();
    let ids: Vec<&str> = settled.iter().map(|(p, _)| p.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(settled[0].1, CallReport::UNSENT);
    assert_eq!(settled[1].1, CallReport::UNSENT);
    assert!(settled[2].1.usage.is_some() && !settled[2].1.unsent);
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);
}

/// Lateness asks again a bounded number of times: past that the call goes late (a
/// refusal it may meet is waited out like any other).
#[tokio::test(start_paused = true)]
async fn a_call_late_again_and_again_goes_after_a_bounded_number_of_asks() {
    let mut h = harness(one_turn(text_turn("late")), vec![]);
    let n = agentq_agent::driver::MAX_LATE_ASKS as usize + 1;
    let ids: Vec<String> = (0..n).map(|i| format!("late{i}")).collect();
    let admission = ScriptedAdmission::new(ids.iter().map(|id| late(id, 0)).collect());
    admission
        .script
        .slow
        .lock()
        .unwrap()
        .extend(std::iter::repeat_n(Duration::from_millis(50), n));
    *admission.script.late_after.lock().unwrap() = Some(Duration::from_millis(10));
    h.agent.admission = admission.clone();
    let (_, end) = run(&h, spec()).await;
    assert_eq!(finished(&end).result.as_deref(), Some("late"));
    let settled = admission.settled();
    assert_eq!(settled.len(), n);
    assert!(
        settled[..n - 1]
            .iter()
            .all(|(_, r)| *r == CallReport::UNSENT)
    );
    assert_eq!(settled[n - 1].0.id, ids[n - 1]);
    assert!(settled[n - 1].1.usage.is_some());
    assert_eq!(h.provider.requests.lock().unwrap().len(), 1);
}
