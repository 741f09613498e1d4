//! The driver: performs the I/O the state machine asks for — LLM calls with retry and
//! streaming, tool calls through the guard pipeline — and checkpoints after each LLM
//! response and each tool result through the [`Checkpointer`] it is handed (a response
//! whose calls have no effect anywhere may share one checkpoint with their results; see
//! [`Agent::write_ahead_grace`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span};

use crate::error::{Error, ErrorClass, Result};
use crate::event::{AgentEvent, EventSink};
use crate::guard::{Guards, Verdict};
use crate::observe::{LlmCallInfo, Observer, outcome_of};
use crate::provider::{LlmEvent, LlmProvider, LlmRequest};
use crate::schema::{FinishReason, Message, Role, ThinkingBlock, ToolCall, Usage};
use crate::spec::{ExitReason, Mode};
use crate::state::{
    Outcome, PLAN_TO_ACT, Phase, Piece, SessionState, Step, ThinkSplitter, truncate_output,
};
use crate::tools::{SideEffect, ToolContext, ToolOutput, ToolRegistry, ToolSettings, Workspace};

/// Persists the state after each step. `from` is the index of the first message not yet
/// persisted; the scalar fields (iteration, usage, outcome…) are written every time.
/// Returning [`Error::LeaseLost`] stops the run at once, without any further write.
#[async_trait]
pub trait Checkpointer: Send + Sync {
    async fn save(&self, state: &SessionState, from: usize) -> Result<()>;
}

/// Keeps nothing: `agentq run` and tests that do not care.
pub struct NoCheckpoint;

#[async_trait]
impl Checkpointer for NoCheckpoint {
    async fn save(&self, _state: &SessionState, _from: usize) -> Result<()> {
        Ok(())
    }
}

/// A background sub-agent's final result, to be injected into its parent.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BackgroundResult {
    pub label: String,
    pub id: String,
    /// `completed`, `failed`, `cancelled`…
    pub outcome: String,
    pub result: String,
    /// Position in the host's inbox; injecting the result records it in the state
    /// (`bg_cursor`) with the same checkpoint, so a result is delivered exactly once.
    #[serde(default)]
    pub seq: u64,
}

impl BackgroundResult {
    /// Seed 001's injection format.
    pub fn render(&self) -> String {
        format!(
            "[Background agent \"{}\" ({}) {}] {}",
            self.label, self.id, self.outcome, self.result
        )
    }
}

/// Where background results come from. The host pushes them in; the loop drains them.
#[async_trait]
pub trait BackgroundSource: Send + Sync {
    /// Results that arrived and were not injected yet. Taking them consumes them.
    async fn take(&self) -> Vec<BackgroundResult>;
    /// Background children still running.
    fn outstanding(&self) -> usize;
    /// Wait for the next result. `false` when this host cannot wait in-process: the
    /// session then suspends and is resumed when a result arrives.
    async fn wait(&self, cancel: &CancellationToken) -> bool;
    /// User messages to add at the next iteration boundary (steering: `inject`), with
    /// their inbox positions (recorded in `msg_cursor` by the same checkpoint).
    async fn take_injections(&self) -> Vec<(u64, String)> {
        Vec::new()
    }
}

/// Stops the current turn without ending the session (steering: `interrupt`): the LLM
/// call or the tools in flight are abandoned, and the loop goes on with whatever was
/// injected meanwhile.
#[derive(Default)]
pub struct Interrupter {
    current: std::sync::Mutex<CancellationToken>,
}

impl Interrupter {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The token of the step about to run.
    pub fn token(&self) -> CancellationToken {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Interrupt the step in flight (if any).
    pub fn interrupt(&self) {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        cur.cancel();
        *cur = CancellationToken::new();
    }
}

/// No background agents.
pub struct NoBackground;

#[async_trait]
impl BackgroundSource for NoBackground {
    async fn take(&self) -> Vec<BackgroundResult> {
        Vec::new()
    }
    fn outstanding(&self) -> usize {
        0
    }
    async fn wait(&self, _cancel: &CancellationToken) -> bool {
        false
    }
}

/// An in-process inbox: anything can push results; the loop drains them.
#[derive(Default)]
pub struct BackgroundInbox {
    results: std::sync::Mutex<Vec<BackgroundResult>>,
    outstanding: std::sync::atomic::AtomicUsize,
    notify: tokio::sync::Notify,
}

impl BackgroundInbox {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A child was started.
    pub fn started(&self) {
        self.outstanding
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A child finished with this result.
    pub fn push(&self, r: BackgroundResult) {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
        let _ = self.outstanding.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| Some(n.saturating_sub(1)),
        );
        self.notify.notify_one();
    }
}

#[async_trait]
impl BackgroundSource for BackgroundInbox {
    async fn take(&self) -> Vec<BackgroundResult> {
        std::mem::take(&mut *self.results.lock().unwrap_or_else(|e| e.into_inner()))
    }
    fn outstanding(&self) -> usize {
        self.outstanding.load(std::sync::atomic::Ordering::SeqCst)
    }
    async fn wait(&self, cancel: &CancellationToken) -> bool {
        if !self
            .results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return true;
        }
        tokio::select! {
            _ = self.notify.notified() => true,
            _ = cancel.cancelled() => false,
        }
    }
}

/// Why a run stopped without finishing the session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuspendReason {
    /// Waiting for background children.
    Children,
    /// Waiting for a human to approve a tool call.
    Approval { tool_call_id: String },
}

/// How one run of the driver ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEnd {
    Finished(Outcome),
    Suspended(SuspendReason),
}

/// Everything a session runs with. Cheap to clone (all shared).
#[derive(Clone)]
pub struct Agent {
    pub provider: Arc<dyn LlmProvider>,
    /// The model used when the session does not name one.
    pub default_model: String,
    /// The tools this session may use (already narrowed to its `tools` list).
    pub tools: ToolRegistry,
    pub guards: Guards,
    pub events: Arc<dyn EventSink>,
    pub checkpointer: Arc<dyn Checkpointer>,
    pub background: Arc<dyn BackgroundSource>,
    pub workspace: Arc<dyn Workspace>,
    pub settings: Arc<ToolSettings>,
    pub observer: Arc<dyn Observer>,
    pub interrupter: Arc<Interrupter>,
    /// How long a response may wait for its checkpoint when every call it makes is
    /// `Pure` and passes no hook or approval: the calls run at once, and if they are all
    /// done within this time, the response and their results are committed together (one
    /// commit per tool round instead of two). Re-running such calls changes nothing, so
    /// all a crash in that window can cost is the LLM call, which the resumed session makes
    /// again. A final answer with nothing to wait for likewise goes with the checkpoint
    /// that finishes the session. Zero commits every response on its own, first.
    pub write_ahead_grace: Duration,
}

/// [`Agent::write_ahead_grace`] unless configured.
pub const DEFAULT_WRITE_AHEAD_GRACE: Duration = Duration::from_millis(250);

/// How far a run's messages are durable, and a response whose checkpoint is held back.
struct Saved {
    /// Messages before this index are committed.
    upto: usize,
    held: Option<Held>,
}

/// A response not committed yet. Its iteration is announced (metric and
/// `IterationCompleted`) only once it is, so that a crash never counts it twice.
struct Held {
    /// Committed by then at the latest, whether or not its calls are done.
    due: Instant,
    seq: usize,
    iteration: u32,
    usage: Usage,
    model: String,
    counted: bool,
}

/// The result of one streamed LLM call, assembled.
struct Response {
    message: Message,
    /// The model answered with an `error` finish and no content: retry it.
    empty_error: bool,
}

enum Attempt {
    Got(Response),
    Ended(Outcome),
    /// The user interrupted the turn: drop the call, keep looping.
    Interrupted,
}

impl Agent {
    fn model(&self, state: &SessionState) -> String {
        state
            .spec
            .model
            .clone()
            .unwrap_or_else(|| self.default_model.clone())
    }

    async fn checkpoint(&self, state: &SessionState, saved: &mut Saved) -> Result<()> {
        self.checkpointer.save(state, saved.upto).await?;
        saved.upto = state.messages.len();
        if let Some(h) = saved.held.take() {
            if h.counted {
                self.observer.iteration(self.provider.name(), &h.model);
            }
            self.events.emit(
                h.seq,
                AgentEvent::IterationCompleted {
                    iteration: h.iteration,
                    usage: h.usage,
                },
            );
        }
        Ok(())
    }

    /// Whether the write-ahead checkpoint of a response making `calls` may wait for their
    /// results (see [`Agent::write_ahead_grace`]).
    fn may_hold(&self, state: &SessionState, calls: &[ToolCall]) -> bool {
        !self.write_ahead_grace.is_zero()
            && !calls.is_empty()
            && state.tools_enabled()
            && calls.iter().all(|c| {
                self.tools
                    .get(&c.name)
                    .is_some_and(|t| t.side_effect(&c.arguments) == SideEffect::Pure)
                    && !self
                        .guards
                        .reaches_out(&c.name, &state.spec.sensitive_tools)
            })
    }

    /// Run the session until it finishes or suspends. `Err` only when checkpointing
    /// failed (including a lost lease): the run must stop without further writes.
    pub async fn run(
        &self,
        state: &mut SessionState,
        cancel: &CancellationToken,
    ) -> Result<RunEnd> {
        let span =
            info_span!("session", session_id = %state.session_id, model = %self.model(state));
        self.run_inner(state, cancel).instrument(span).await
    }

    async fn run_inner(
        &self,
        state: &mut SessionState,
        cancel: &CancellationToken,
    ) -> Result<RunEnd> {
        state.normalize();
        let mut saved = Saved {
            upto: state.messages.len(),
            held: None,
        };
        let fresh = state.started_at.is_none();
        if fresh {
            state.started_at = Some(chrono::Utc::now());
            for h in &self.guards.hooks {
                h.session_start(&state.session_id).await;
            }
        }
        // Calls pending when this run starts may have been started by a run that died,
        // unless they were held back for an approval.
        let mut maybe_started: Vec<String> = if fresh {
            Vec::new()
        } else {
            state
                .pending_calls()
                .into_iter()
                .map(|c| c.id)
                .filter(|id| !state.not_started.contains(id))
                .collect()
        };
        let specs = self.tools.specs();
        // A run that stopped right after the model's final answer (suspended to wait for
        // background children, or died before the next checkpoint) resumes where the
        // answer left it: the plan→act switch, or the drain — never a new LLM call.
        if !fresh
            && state.outcome.is_none()
            && let Some(last) = state.messages.last()
            && last.role == Role::Assistant
            && last.tool_calls.is_empty()
        {
            let answer = last.content.clone();
            if state.spec.mode == Mode::PlanAct && state.phase == Phase::Plan {
                state.phase = Phase::Act;
                state.messages.push(Message::user(PLAN_TO_ACT));
                self.checkpoint(state, &mut saved).await?;
            } else {
                match self.drain_or_finish(state, answer, cancel).await {
                    Some(end) => {
                        self.checkpoint(state, &mut saved).await?;
                        if let RunEnd::Finished(o) = &end {
                            self.finish_events(state, o).await;
                        }
                        return Ok(end);
                    }
                    None => self.checkpoint(state, &mut saved).await?,
                }
            }
        }
        // Per-iteration overhead (Observer::iteration_overhead): the time from an LLM
        // response to the next request (or to the final checkpoint), less the time spent
        // waiting on tools and background children.
        let mut since_response: Option<Instant> = None;
        let mut waited = Duration::ZERO;
        loop {
            if state.outcome.is_none() && cancel.is_cancelled() {
                self.close_pending(state, "interrupted: the session was cancelled");
                state.outcome = Some(Outcome::new(ExitReason::Interrupted));
            }
            match state.next_step(chrono::Utc::now()) {
                Step::Done(outcome) => {
                    if state.outcome.is_none() {
                        state.outcome = Some(outcome.clone());
                    }
                    self.checkpoint(state, &mut saved).await?;
                    self.report_overhead(&mut since_response, &mut waited);
                    self.finish_events(state, &outcome).await;
                    return Ok(RunEnd::Finished(outcome));
                }
                Step::RunTools(calls) => {
                    let uncertain = std::mem::take(&mut maybe_started);
                    match self
                        .run_tools(state, calls, &uncertain, cancel, &mut saved, &mut waited)
                        .await?
                    {
                        Some(end) => return Ok(end),
                        None => {
                            if state.outcome.is_none() {
                                self.inject_background(state).await;
                                self.checkpoint(state, &mut saved).await?;
                            }
                        }
                    }
                }
                Step::CallLlm => {
                    let injected = self.background.take_injections().await;
                    if !injected.is_empty() {
                        for (seq, text) in injected {
                            state.msg_cursor = state.msg_cursor.max(seq);
                            state.messages.push(Message::user(text));
                        }
                        self.checkpoint(state, &mut saved).await?;
                    }
                    let iteration = state.iteration + u32::from(!state.free_iteration);
                    let seq = state.messages.len();
                    self.events
                        .emit(seq, AgentEvent::IterationStarted { iteration });
                    let request = state.request(&self.model(state), &specs);
                    self.report_overhead(&mut since_response, &mut waited);
                    let span = info_span!("iteration", iteration);
                    let attempt = self
                        .call_with_retry(state, &request, cancel)
                        .instrument(span)
                        .await;
                    let response = match attempt {
                        Attempt::Interrupted => continue,
                        Attempt::Ended(outcome) => {
                            if outcome.reason == ExitReason::Interrupted {
                                self.close_pending(state, "interrupted: the session was cancelled");
                            }
                            state.outcome = Some(outcome);
                            continue;
                        }
                        Attempt::Got(r) => r,
                    };
                    since_response = Some(Instant::now());
                    waited = Duration::ZERO;
                    let msg = response.message;
                    let usage = msg.usage.unwrap_or_default();
                    let has_calls = !msg.tool_calls.is_empty();
                    let answer = msg.content.clone();
                    let model = msg.model.clone().unwrap_or_else(|| request.model.clone());
                    for c in &msg.tool_calls {
                        self.events.emit(
                            seq,
                            AgentEvent::ToolCall {
                                id: c.id.clone(),
                                name: c.name.clone(),
                                arguments: c.arguments.clone(),
                            },
                        );
                    }
                    let counted = !state.free_iteration;
                    // A final answer with nothing to wait for is followed at once by the
                    // checkpoint that finishes the session (or switches plan to act, or
                    // injects results already in): one commit carries both.
                    let hold = if has_calls {
                        self.may_hold(state, &msg.tool_calls)
                    } else {
                        !self.write_ahead_grace.is_zero() && self.background.outstanding() == 0
                    };
                    state.push_assistant(msg);
                    saved.held = Some(Held {
                        due: Instant::now() + self.write_ahead_grace,
                        seq,
                        iteration: state.iteration,
                        usage,
                        model,
                        counted,
                    });
                    // Write-ahead: the response is durable before any call that could
                    // change something runs, and before any wait.
                    if !hold {
                        self.checkpoint(state, &mut saved).await?;
                    }
                    if has_calls && !state.tools_enabled() {
                        // Think/plan: the model called tools it was not offered.
                        self.refuse_calls(state);
                        self.checkpoint(state, &mut saved).await?;
                    }
                    if !has_calls {
                        if state.spec.mode == Mode::PlanAct && state.phase == Phase::Plan {
                            state.phase = Phase::Act;
                            state.messages.push(Message::user(PLAN_TO_ACT));
                            self.checkpoint(state, &mut saved).await?;
                            continue;
                        }
                        let drain_started = Instant::now();
                        let drained = self.drain_or_finish(state, answer, cancel).await;
                        waited += drain_started.elapsed();
                        match drained {
                            Some(end) => {
                                self.checkpoint(state, &mut saved).await?;
                                self.report_overhead(&mut since_response, &mut waited);
                                if let RunEnd::Finished(o) = &end {
                                    self.finish_events(state, o).await;
                                }
                                return Ok(end);
                            }
                            None => self.checkpoint(state, &mut saved).await?,
                        }
                    }
                }
            }
        }
    }

    /// Report the overhead of the iteration whose response arrived at `since` (if any).
    fn report_overhead(&self, since: &mut Option<Instant>, waited: &mut Duration) {
        if let Some(t) = since.take() {
            let waited = std::mem::take(waited);
            self.observer
                .iteration_overhead(t.elapsed().saturating_sub(waited));
        }
    }

    async fn finish_events(&self, state: &SessionState, outcome: &Outcome) {
        for h in &self.guards.hooks {
            h.session_end(&state.session_id, outcome.reason).await;
        }
        self.events.emit(
            state.messages.len(),
            AgentEvent::SessionCompleted {
                finish_reason: outcome.reason,
                result: outcome.result.clone(),
                error: outcome.error.clone(),
                iterations: state.iteration,
                usage: state.usage,
            },
        );
    }

    /// The model answered without tool calls: inject pending background results (at most
    /// `max_background_drain_rounds` times in a row), wait for running children, or finish.
    /// `None` means "keep looping".
    async fn drain_or_finish(
        &self,
        state: &mut SessionState,
        answer: String,
        cancel: &CancellationToken,
    ) -> Option<RunEnd> {
        let can_drain = state.drain_rounds < state.spec.max_background_drain_rounds;
        if can_drain {
            let mut results = self.background.take().await;
            if results.is_empty() && self.background.outstanding() > 0 {
                if !self.background.wait(cancel).await {
                    if cancel.is_cancelled() {
                        state.outcome = Some(Outcome::new(ExitReason::Interrupted));
                        return Some(RunEnd::Finished(Outcome::new(ExitReason::Interrupted)));
                    }
                    return Some(RunEnd::Suspended(SuspendReason::Children));
                }
                results = self.background.take().await;
            }
            if !results.is_empty() {
                state.drain_rounds += 1;
                state.free_iteration = true;
                record_results(state, &results);
                return None;
            }
        }
        let outcome = Outcome {
            reason: ExitReason::Stop,
            result: Some(answer),
            error: None,
        };
        state.outcome = Some(outcome.clone());
        Some(RunEnd::Finished(outcome))
    }

    /// After a tool round: inject whatever background results arrived meanwhile.
    async fn inject_background(&self, state: &mut SessionState) {
        let results = self.background.take().await;
        if !results.is_empty() {
            record_results(state, &results);
        }
    }

    fn refuse_calls(&self, state: &mut SessionState) {
        let mode = if state.spec.mode == Mode::PlanAct {
            "the plan phase".to_string()
        } else {
            format!("{} mode", state.spec.mode)
        };
        for c in state.pending_calls() {
            let text = format!(
                "Tool calls are not available in {mode}: `{}` was not run. Answer without tools.",
                c.name
            );
            self.events.emit(
                state.messages.len(),
                AgentEvent::ToolResult {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    content: text.clone(),
                    is_error: true,
                },
            );
            state
                .messages
                .push(Message::tool_result(c.id, c.name, text, true));
        }
    }

    /// Give every call still without a result an explicit result, so the history stays
    /// replayable after a cancel.
    fn close_pending(&self, state: &mut SessionState, text: &str) {
        for c in state.pending_calls() {
            state
                .messages
                .push(Message::tool_result(c.id, c.name, text, true));
        }
    }

    /// LLM call with seed 001's retry policy.
    async fn call_with_retry(
        &self,
        state: &SessionState,
        request: &LlmRequest<'_>,
        cancel: &CancellationToken,
    ) -> Attempt {
        let seq = state.messages.len();
        let max_retries = state.spec.max_llm_retries;
        let base = Duration::from_millis(state.spec.retry_delay_ms);
        let provider = self.provider.name().to_string();
        let interrupt = self.interrupter.token();
        let mut attempt: u32 = 0;
        loop {
            if cancel.is_cancelled() {
                return Attempt::Ended(Outcome::new(ExitReason::Interrupted));
            }
            if interrupt.is_cancelled() {
                return Attempt::Interrupted;
            }
            let deadline = state.deadline();
            let span = info_span!(
                "chat",
                otel.name = %format!("chat {}", request.model),
                gen_ai.operation.name = "chat",
                gen_ai.provider.name = %provider,
                gen_ai.request.model = %request.model,
                gen_ai.usage.input_tokens = tracing::field::Empty,
                gen_ai.usage.output_tokens = tracing::field::Empty,
                attempt,
            );
            let started = Instant::now();
            let ttft = std::sync::Mutex::new(None::<Duration>);
            let call = async {
                tokio::select! {
                    r = self.call_once(seq, request, cancel, started, &ttft) => Some(r),
                    _ = interrupt.cancelled() => None,
                }
            }
            .instrument(span.clone());
            let result = match deadline {
                Some(d) => {
                    let left = (d - chrono::Utc::now()).to_std().unwrap_or(Duration::ZERO);
                    match tokio::time::timeout(left, call).await {
                        Ok(r) => r,
                        Err(_) => {
                            return Attempt::Ended(Outcome {
                                reason: ExitReason::Timeout,
                                result: None,
                                error: Some("session deadline reached during an LLM call".into()),
                            });
                        }
                    }
                }
                None => call.await,
            };
            let Some(result) = result else {
                return Attempt::Interrupted;
            };
            let first_token = *ttft.lock().unwrap_or_else(|e| e.into_inner());
            let err = match result {
                Ok(r) if !r.empty_error => {
                    let usage = r.message.usage;
                    if let Some(u) = &usage {
                        span.record("gen_ai.usage.input_tokens", u.input_tokens);
                        span.record("gen_ai.usage.output_tokens", u.output_tokens);
                    }
                    self.observer.llm_call(&LlmCallInfo {
                        provider: &provider,
                        model: r.message.model.as_deref().unwrap_or(&request.model),
                        outcome: "ok",
                        duration: started.elapsed(),
                        time_to_first_token: first_token,
                        usage,
                    });
                    return Attempt::Got(r);
                }
                Ok(_) => Error::Stream {
                    message: "the model returned an error finish with no content".into(),
                    code: None,
                    retryable: true,
                },
                Err(Error::Cancelled) => {
                    self.observer.llm_call(&LlmCallInfo {
                        provider: &provider,
                        model: &request.model,
                        outcome: "cancelled",
                        duration: started.elapsed(),
                        time_to_first_token: first_token,
                        usage: None,
                    });
                    return Attempt::Ended(Outcome::new(ExitReason::Interrupted));
                }
                Err(e) => e,
            };
            let label = match &err {
                Error::Stream { code: None, .. } => "empty_error",
                e => outcome_of(e),
            };
            self.observer.llm_call(&LlmCallInfo {
                provider: &provider,
                model: &request.model,
                outcome: label,
                duration: started.elapsed(),
                time_to_first_token: first_token,
                usage: None,
            });
            let class = err.class();
            let retry_after = match class {
                ErrorClass::Retryable { after } if attempt < max_retries => after,
                _ => {
                    let message = if attempt > 0 {
                        format!("LLM call failed after {} attempts: {err}", attempt + 1)
                    } else {
                        format!("LLM call failed: {err}")
                    };
                    self.events.emit(
                        seq,
                        AgentEvent::Error {
                            message: message.clone(),
                            retrying: false,
                        },
                    );
                    return Attempt::Ended(Outcome::error(message));
                }
            };
            self.observer.llm_retry(&provider, label);
            let delay = (base * (attempt + 1)).max(retry_after.unwrap_or(Duration::ZERO));
            tracing::info!(error = %err, attempt, ?delay, "LLM call failed; retrying");
            self.events.emit(
                seq,
                AgentEvent::Error {
                    message: format!("{err} (retrying in {:.1}s)", delay.as_secs_f64()),
                    retrying: true,
                },
            );
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = cancel.cancelled() => return Attempt::Ended(Outcome::new(ExitReason::Interrupted)),
                _ = interrupt.cancelled() => return Attempt::Interrupted,
            }
            attempt += 1;
        }
    }

    /// One streamed call, assembled into an assistant message. Text and thinking deltas
    /// are emitted as they arrive.
    async fn call_once(
        &self,
        seq: usize,
        request: &LlmRequest<'_>,
        cancel: &CancellationToken,
        started: Instant,
        first_token: &std::sync::Mutex<Option<Duration>>,
    ) -> Result<Response> {
        let mark_first = || {
            let mut f = first_token.lock().unwrap_or_else(|e| e.into_inner());
            if f.is_none() {
                *f = Some(started.elapsed());
            }
        };
        let mut stream = tokio::select! {
            s = self.provider.stream(request) => s?,
            _ = cancel.cancelled() => return Err(Error::Cancelled),
        };
        let mut text = String::new();
        let mut splitter = ThinkSplitter::default();
        let mut thinking: Vec<ThinkingBlock> = Vec::new();
        let mut open_thinking = false;
        let mut calls: BTreeMap<usize, (String, String, String)> = BTreeMap::new();
        let mut usage = Usage::default();
        let mut model: Option<String> = None;
        let mut finish: Option<FinishReason> = None;
        let think_piece = |thinking: &mut Vec<ThinkingBlock>, open: &mut bool, s: &str| {
            if !*open {
                thinking.push(ThinkingBlock::default());
                *open = true;
            }
            if let Some(b) = thinking.last_mut() {
                b.text.push_str(s);
            }
        };
        loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = cancel.cancelled() => return Err(Error::Cancelled),
            };
            let Some(ev) = ev else { break };
            let ev = ev?;
            if matches!(
                ev,
                LlmEvent::TextDelta(_)
                    | LlmEvent::ThinkingDelta(_)
                    | LlmEvent::ToolCallDelta { .. }
            ) {
                mark_first();
            }
            match ev {
                LlmEvent::TextDelta(t) => {
                    for piece in splitter.push(&t) {
                        match piece {
                            Piece::Text(s) => {
                                text.push_str(&s);
                                self.events.emit(seq, AgentEvent::TextDelta { text: s });
                            }
                            Piece::Thinking(s) => {
                                think_piece(&mut thinking, &mut open_thinking, &s);
                                self.events.emit(seq, AgentEvent::ThinkingDelta { text: s });
                            }
                        }
                    }
                }
                LlmEvent::ThinkingDelta(t) => {
                    if t.is_empty() {
                        continue;
                    }
                    think_piece(&mut thinking, &mut open_thinking, &t);
                    self.events.emit(seq, AgentEvent::ThinkingDelta { text: t });
                }
                LlmEvent::ThinkingSignature(sig) => {
                    if !open_thinking {
                        thinking.push(ThinkingBlock::default());
                    }
                    if let Some(b) = thinking.last_mut() {
                        b.signature = Some(sig);
                    }
                    open_thinking = false;
                }
                LlmEvent::RedactedThinking(data) => {
                    thinking.push(ThinkingBlock {
                        text: String::new(),
                        signature: None,
                        redacted: Some(data),
                    });
                    open_thinking = false;
                }
                LlmEvent::ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                } => {
                    let entry = calls.entry(index).or_default();
                    if let Some(id) = id.filter(|s| !s.is_empty())
                        && entry.0.is_empty()
                    {
                        entry.0 = id;
                    }
                    if let Some(n) = name.filter(|s| !s.is_empty())
                        && entry.1.is_empty()
                    {
                        entry.1 = n;
                    }
                    entry.2.push_str(&arguments);
                }
                LlmEvent::Usage(u) => usage = u,
                LlmEvent::Model(m) => model = Some(m),
                LlmEvent::Done(f) => finish = Some(f),
            }
        }
        for piece in splitter.finish() {
            match piece {
                Piece::Text(s) => {
                    text.push_str(&s);
                    self.events.emit(seq, AgentEvent::TextDelta { text: s });
                }
                Piece::Thinking(s) => {
                    think_piece(&mut thinking, &mut open_thinking, &s);
                    self.events.emit(seq, AgentEvent::ThinkingDelta { text: s });
                }
            }
        }
        let tool_calls: Vec<ToolCall> = calls
            .into_values()
            .filter(|(_, name, _)| !name.is_empty())
            .map(|(id, name, args)| ToolCall {
                id: if id.is_empty() {
                    format!("call_{}", uuid::Uuid::new_v4().simple())
                } else {
                    id
                },
                name,
                arguments: ToolCall::parse_arguments(&args),
            })
            .collect();
        let empty_error =
            finish == Some(FinishReason::Error) && text.trim().is_empty() && tool_calls.is_empty();
        let mut message = Message::assistant(text);
        message.thinking = thinking;
        message.tool_calls = tool_calls;
        message.usage = Some(usage);
        message.model = model.or_else(|| Some(request.model.clone()));
        message.finish_reason = finish;
        Ok(Response {
            message,
            empty_error,
        })
    }

    /// Run the pending calls concurrently; commit each result as it finishes.
    /// `Some(end)` when the run must stop (yield, cancel, suspension).
    async fn run_tools(
        &self,
        state: &mut SessionState,
        calls: Vec<ToolCall>,
        uncertain: &[String],
        cancel: &CancellationToken,
        saved: &mut Saved,
        waited: &mut Duration,
    ) -> Result<Option<RunEnd>> {
        let approval_timeout = Duration::from_secs(state.spec.approval_timeout_secs);
        let tool_timeout = Duration::from_secs(state.spec.tool_timeout_secs);
        let sensitive = state.spec.sensitive_tools.clone();
        let max_chars = state.spec.tool_output_max_chars;
        let session_id = state.session_id.clone();
        let mut running = FuturesUnordered::new();
        for call in calls {
            let this = self.clone();
            let sensitive = sensitive.clone();
            let session_id = session_id.clone();
            let cancel = cancel.clone();
            let was_started = uncertain.contains(&call.id);
            running.push(async move {
                let span = info_span!(
                    "execute_tool",
                    otel.name = %format!("execute_tool {}", call.name),
                    gen_ai.operation.name = "execute_tool",
                    gen_ai.tool.name = %call.name,
                    gen_ai.tool.call.id = %call.id,
                );
                let out = this
                    .execute_one(
                        &session_id,
                        &call,
                        was_started,
                        &sensitive,
                        approval_timeout,
                        tool_timeout,
                        &cancel,
                    )
                    .instrument(span)
                    .await;
                (call, out)
            });
        }
        let mut yielded: Option<String> = None;
        let mut suspend: Option<SuspendReason> = None;
        let interrupt = self.interrupter.token();
        loop {
            let wait_started = Instant::now();
            let next = tokio::select! {
                n = running.next() => n,
                _ = interrupt.cancelled() => {
                    // Abandon what is still running; the new user message takes over.
                    drop(running);
                    self.close_pending(state, "interrupted: the user sent a new message before this call finished");
                    state.not_started.clear();
                    self.checkpoint(state, saved).await?;
                    return Ok(None);
                }
                _ = due(saved.held.as_ref().map(|h| h.due)) => {
                    // Calls that outlast the grace: their response is committed now (with
                    // any results so far) while they go on.
                    *waited += wait_started.elapsed();
                    self.checkpoint(state, saved).await?;
                    continue;
                }
            };
            *waited += wait_started.elapsed();
            let Some((call, out)) = next else { break };
            let out = match out {
                Some(o) if o.suspend => {
                    suspend.get_or_insert(SuspendReason::Children);
                    continue;
                }
                Some(o) => o,
                None => {
                    if !state.not_started.contains(&call.id) {
                        state.not_started.push(call.id.clone());
                    }
                    suspend.get_or_insert(SuspendReason::Approval {
                        tool_call_id: call.id.clone(),
                    });
                    continue;
                }
            };
            state.not_started.retain(|id| id != &call.id);
            let content = truncate_output(out.content.clone(), max_chars);
            self.events.emit(
                state.messages.len(),
                AgentEvent::ToolResult {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    content: content.clone(),
                    is_error: out.is_error,
                },
            );
            if out.yield_loop && yielded.is_none() {
                yielded = Some(content.clone());
            }
            state.messages.push(Message::tool_result(
                call.id.clone(),
                call.name.clone(),
                content,
                out.is_error,
            ));
            // A held response is committed with all its results, in call order, by the
            // caller's checkpoint after the round.
            if saved.held.is_none() {
                self.checkpoint(state, saved).await?;
            }
        }
        state.order_tool_results();
        if let Some(reason) = suspend {
            // Persist which calls never started before giving the session up.
            self.checkpoint(state, saved).await?;
            return Ok(Some(RunEnd::Suspended(reason)));
        }
        if cancel.is_cancelled() {
            return Ok(None);
        }
        if let Some(result) = yielded {
            let outcome = Outcome {
                reason: ExitReason::Yielded,
                result: Some(result),
                error: None,
            };
            state.outcome = Some(outcome.clone());
            self.checkpoint(state, saved).await?;
            self.finish_events(state, &outcome).await;
            return Ok(Some(RunEnd::Finished(outcome)));
        }
        Ok(None)
    }

    /// One call through the guard pipeline. `None` means "suspend for approval".
    #[allow(clippy::too_many_arguments)]
    async fn execute_one(
        &self,
        session_id: &str,
        call: &ToolCall,
        was_started: bool,
        sensitive: &[String],
        approval_timeout: Duration,
        tool_timeout: Duration,
        cancel: &CancellationToken,
    ) -> Option<ToolOutput> {
        if cancel.is_cancelled() {
            return Some(ToolOutput::error("interrupted: the session was cancelled"));
        }
        let Some(tool) = self.tools.get(&call.name).cloned() else {
            if self.guards.native_tools.contains(&call.name) {
                return Some(ToolOutput::ok(
                    "Skipped: this tool is executed natively by the provider.",
                ));
            }
            return Some(ToolOutput::error(format!(
                "Unknown tool `{}`. Available tools: {}",
                call.name,
                self.tools.names().join(", ")
            )));
        };
        if was_started && tool.side_effect(&call.arguments) == SideEffect::Unsafe {
            return Some(ToolOutput::error(
                "interrupted before completion; outcome unknown. This call may or may not have taken effect: check before repeating it.",
            ));
        }
        match self
            .guards
            .check(session_id, call, tool.as_ref(), sensitive, approval_timeout)
            .await
        {
            Verdict::Run => {}
            Verdict::Result(out) => {
                self.observer
                    .tool_call(&call.name, "denied", Duration::ZERO);
                return Some(out);
            }
            Verdict::Suspend => return None,
        }
        let started = Instant::now();
        let ctx = ToolContext {
            session_id: session_id.to_string(),
            tool_call_id: call.id.clone(),
            idempotency_key: format!("{session_id}:{}", call.id),
            workspace: self.workspace.clone(),
            settings: self.settings.clone(),
            cancel: cancel.child_token(),
        };
        debug!(tool = %call.name, "executing tool");
        let fut = tool.call(call.arguments.clone(), &ctx);
        let (out, outcome) = tokio::select! {
            r = tokio::time::timeout(tool_timeout, fut) => match r {
                Ok(Ok(o)) => {
                    let label = if o.is_error { "error" } else { "ok" };
                    (o, label)
                }
                Ok(Err(e)) => (ToolOutput::error(format!("Error: {e}")), "error"),
                Err(_) => (
                    ToolOutput::error(format!(
                        "Error: tool `{}` timed out after {}s",
                        call.name,
                        tool_timeout.as_secs_f64()
                    )),
                    "timeout",
                ),
            },
            _ = cancel.cancelled() => {
                ctx.cancel.cancel();
                (
                    ToolOutput::error("interrupted: the session was cancelled while this tool ran"),
                    "cancelled",
                )
            }
        };
        self.observer
            .tool_call(&call.name, outcome, started.elapsed());
        self.guards.post_tool_use(session_id, call, &out);
        Some(out)
    }
}

fn record_results(state: &mut SessionState, results: &[BackgroundResult]) {
    for r in results {
        state.bg_cursor = state.bg_cursor.max(r.seq);
    }
    state.messages.push(Message::user(render_results(results)));
}

fn render_results(results: &[BackgroundResult]) -> String {
    results
        .iter()
        .map(BackgroundResult::render)
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The role of the last message, for hosts deciding how to resume.
pub fn last_role(state: &SessionState) -> Option<Role> {
    state.messages.last().map(|m| m.role)
}

/// Resolves at `at`, or never.
async fn due(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
