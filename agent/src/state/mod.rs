//! The loop's state between steps, and the pure logic that makes every decision of the
//! loop. It does no I/O: the driver performs the [`Step`] that [`SessionState::decide`]
//! names and feeds the results back through the state's methods (which return a small
//! decision when something follows from them: [`Drain`], [`AfterTools`]). The state is
//! exactly what a checkpoint stores, so resuming a session is "load the state, keep
//! stepping".

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::bounds;
use crate::provider::LlmRequest;
use crate::schema::{Arguments, FinishReason, Message, Role, ToolCall, ToolSpec, Usage};
use crate::spec::{ExitReason, Mode, SessionSpec, WebSearch};

mod repeat;
mod think;
mod view;

pub use repeat::{REPEAT_LOOKBACK, Stuck};
pub use think::{Piece, ThinkSplitter, strip_think};
pub use view::{INTERRUPTED_RESULT, normalize_history, request_view, truncate_output};

/// The default system prompt: behaviour rules rather than a persona, because what makes an
/// autonomous run go well is when to use tools and when to stop, not a character.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are an autonomous agent working in a workspace.\n\
- If your knowledge is enough to answer, answer directly without tools.\n\
- If the answer depends on workspace files or the network, gather what you need with tools, then answer.\n\
- Keep tool use restrained: call only what is needed. Independent calls may be made in parallel.\n\
- For irreversible operations (deleting or overwriting), state the impact first.\n\
- Finish with a short summary of what you did.";

const PLAN_INSTRUCTIONS: &str = "You are in planning mode: tools are not available. Produce a concise, numbered plan of the steps needed; do not carry them out.";
const THINK_INSTRUCTIONS: &str =
    "Tools are not available in this mode: answer from your own knowledge and reasoning.";
/// Sent when a plan-act session moves from its plan phase to its act phase.
pub const PLAN_TO_ACT: &str =
    "The plan above is accepted. Now carry it out step by step, using the tools available.";

/// Which half of a `plan-act` session is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Plan,
    #[default]
    Act,
}

/// How a session (or one run of it) ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub reason: ExitReason,
    /// The final answer (or the yielding tool's output).
    pub result: Option<String>,
    /// Why it failed, in words a user can act on.
    pub error: Option<String>,
}

impl Outcome {
    pub fn new(reason: ExitReason) -> Self {
        Outcome {
            reason,
            result: None,
            error: None,
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        Outcome {
            reason: ExitReason::Error,
            result: None,
            error: Some(message.into()),
        }
    }
}

/// What the driver must do next. Every control decision of the loop is one of these; the
/// driver performs the I/O a step names and records the results back into the state.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CallLlm,
    /// Run these calls of the last assistant message: they have no result yet.
    RunTools(Vec<ToolCall>),
    /// The model called tools the current mode does not offer (think, plan, or the plan
    /// phase of plan-act): answer each with a refusal ([`SessionState::refuse_calls`]).
    RefuseTools(Vec<ToolCall>),
    /// The last assistant message made more calls than one answer may run: answer those
    /// past the limit with a refusal ([`SessionState::refuse_excess_calls`]) before
    /// any runs.
    RefuseExcessCalls(Vec<ToolCall>),
    /// The model made the same call `max_repeated_calls` times in a row, getting the same
    /// result each time: answer the open calls without running them and end the session
    /// `stuck` ([`SessionState::end_stuck`]).
    Stuck(Stuck),
    /// The plan phase of a plan-act session produced its plan: switch to acting
    /// ([`SessionState::start_act`]).
    StartAct,
    /// The model answered without tool calls and may still get background results: take
    /// those that arrived (waiting for running children if none did) and hand them to
    /// [`SessionState::drain`].
    DrainBackground,
    /// The run was cancelled: [`SessionState::cancel`] closes it.
    Cancel,
    Done(Outcome),
}

/// What follows a final answer once the background results in (if any) are known.
#[derive(Debug, Clone, PartialEq)]
pub enum Drain {
    /// Results were injected into the history: the model gets to answer them, on a free
    /// iteration.
    Injected,
    /// The session is over (the answer stands, or the run was cancelled while waiting).
    Finished(Outcome),
    /// Children are still running and this host cannot wait for them in-process.
    Suspended(SuspendReason),
}

/// What follows a finished tool round.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterTools {
    /// Some calls wait for an approval or for children: give the session up.
    Suspend(SuspendReason),
    /// A tool yielded the loop: the session ends with its output.
    Finished(Outcome),
    /// Go on (a cancelled run is closed by the next step).
    Continue,
}

/// Why a run stopped without finishing the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuspendReason {
    /// Waiting for background children.
    Children,
    /// Waiting for a human to approve a tool call.
    Approval { tool_call_id: String },
    /// An LLM call would wait longer than the host lets a session hold its slot for a
    /// rate limit: woken at `until`, when capacity is expected back.
    RateLimit { until: DateTime<Utc> },
    /// A budget of the session's tree or tenant is spent and its policy parks the session
    /// until the budget is raised or its period turns over.
    Budget { message: String },
}

/// A background sub-agent's final result, to be injected into its parent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The user message the parent sees. It names the child and how it ended, so the
    /// model can tell several children's results apart and treat a failure as one.
    pub fn render(&self) -> String {
        format!(
            "[Background agent \"{}\" ({}) {}] {}",
            self.label, self.id, self.outcome, self.result
        )
    }
}

/// The result a call gets when the session is cancelled before it finished.
pub const CANCELLED_RESULT: &str = "interrupted: the session was cancelled";
/// The result a call gets when the user interrupted the turn before it finished.
pub const INTERRUPTED_BY_USER_RESULT: &str =
    "interrupted: the user sent a new message before this call finished";

/// A session's whole state. History is append-only; everything else is small scalars, so
/// a checkpoint writes the new messages plus one row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    pub session_id: String,
    pub spec: SessionSpec,
    /// The conversation: the user prompt first, then assistant and tool messages. The
    /// system prompt is not part of it.
    pub messages: Vec<Message>,
    /// LLM responses that counted against `max_iterations`.
    pub iteration: u32,
    pub usage: Usage,
    /// Consecutive background drains since the last real tool call.
    pub drain_rounds: u32,
    /// The next LLM response does not consume an iteration (it follows a drain).
    #[serde(default)]
    pub free_iteration: bool,
    #[serde(default)]
    pub phase: Phase,
    /// When the session first started running; the deadline counts from here.
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub outcome: Option<Outcome>,
    /// Calls that were stopped before they ran (waiting for an approval): on resume they
    /// are not "possibly started", so even an unsafe tool may run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_started: Vec<String>,
    /// `iteration` when the current turn began: `max_iterations` applies per turn, so a
    /// follow-up message gets a fresh allowance.
    #[serde(default)]
    pub turn_base: u32,
    /// Inbox positions already delivered into the history: background results and
    /// steering messages. Advanced by the checkpoint that records the delivery.
    #[serde(default)]
    pub bg_cursor: u64,
    #[serde(default)]
    pub msg_cursor: u64,
}

impl SessionState {
    pub fn new(session_id: impl Into<String>, spec: SessionSpec) -> Self {
        let phase = if spec.mode == Mode::PlanAct {
            Phase::Plan
        } else {
            Phase::Act
        };
        let messages = vec![Message::user(spec.prompt.clone())];
        SessionState {
            session_id: session_id.into(),
            spec,
            messages,
            iteration: 0,
            usage: Usage::default(),
            drain_rounds: 0,
            free_iteration: false,
            phase,
            started_at: None,
            outcome: None,
            not_started: Vec::new(),
            turn_base: 0,
            bg_cursor: 0,
            msg_cursor: 0,
        }
    }

    /// Start a new turn on a finished session with the user's follow-up message; the full
    /// history is kept.
    pub fn follow_up(&mut self, text: impl Into<String>) {
        self.outcome = None;
        self.drain_rounds = 0;
        self.free_iteration = false;
        self.turn_base = self.iteration;
        self.messages.push(Message::user(text));
    }

    /// Iterations used by the current turn.
    pub fn turn_iterations(&self) -> u32 {
        self.iteration.saturating_sub(self.turn_base)
    }

    /// Whether the model may be offered tools right now.
    pub fn tools_enabled(&self) -> bool {
        match self.spec.mode {
            Mode::Act => true,
            Mode::Think | Mode::Plan => false,
            Mode::PlanAct => self.phase == Phase::Act,
        }
    }

    /// When the session's time is up. A timeout too large for the clock is clamped
    /// ([`crate::bounds`]), so the deadline is far off rather than an overflow.
    pub fn deadline(&self) -> Option<DateTime<Utc>> {
        let secs = self.spec.timeout_secs?;
        let start = self.started_at?;
        Some(crate::bounds::after(start, secs))
    }

    /// The calls of the last assistant turn that have no result yet, in call order.
    pub fn pending_calls(&self) -> Vec<ToolCall> {
        self.unanswered_calls(0)
    }

    /// The unanswered calls of the last assistant message past
    /// [`bounds::MAX_TOOL_CALLS_PER_RESPONSE`] in its order.
    fn excess_calls(&self) -> Vec<ToolCall> {
        self.unanswered_calls(bounds::MAX_TOOL_CALLS_PER_RESPONSE)
    }

    /// The calls of the last assistant turn from its `skip`th on that have no result yet,
    /// in call order. Asked at every step: nothing is gathered when there are no such
    /// calls, and the answered ids, a handful, are sorted and searched, not hashed.
    fn unanswered_calls(&self, skip: usize) -> Vec<ToolCall> {
        let Some(pos) = self
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
        else {
            return Vec::new();
        };
        let calls = self.messages[pos]
            .tool_calls
            .get(skip..)
            .unwrap_or_default();
        if calls.is_empty() {
            return Vec::new();
        }
        let mut answered: Vec<&str> = self.messages[pos + 1..]
            .iter()
            .filter(|m| m.role == Role::Tool)
            .filter_map(|m| m.tool_call_id.as_deref())
            .collect();
        answered.sort_unstable();
        calls
            .iter()
            .filter(|c| answered.binary_search(&c.id.as_str()).is_err())
            .cloned()
            .collect()
    }

    /// [`Step::RefuseExcessCalls`]: answer each call past the limit with a refusal.
    pub fn refuse_excess_calls(&mut self, calls: Vec<ToolCall>) {
        let max = bounds::MAX_TOOL_CALLS_PER_RESPONSE;
        for c in calls {
            let text = format!(
                "Not run: one response may make at most {max} tool calls, and `{}` came \
                 after them. Make fewer calls at once.",
                c.name
            );
            self.messages
                .push(Message::tool_result(c.id, c.name, text, true));
        }
    }

    /// Decide the next step of a run that is not cancelled.
    pub fn next_step(&self, now: DateTime<Utc>) -> Step {
        self.decide(now, false)
    }

    /// Decide the next step. Cancellation is not state: the driver says whether the run
    /// was cancelled.
    ///
    /// A final answer is settled before a cancellation is looked at: the answer is in, and
    /// settling it (finishing, or injecting results already there) loses nothing.
    /// Refusals likewise come first: they run nothing.
    pub fn decide(&self, now: DateTime<Utc>, cancelled: bool) -> Step {
        if let Some(o) = &self.outcome {
            return Step::Done(o.clone());
        }
        if let Some(answer) = self.unsettled_answer() {
            if self.spec.mode == Mode::PlanAct && self.phase == Phase::Plan {
                return Step::StartAct;
            }
            if self.drain_rounds < self.spec.max_background_drain_rounds {
                return Step::DrainBackground;
            }
            return Step::Done(Outcome {
                reason: ExitReason::Stop,
                result: Some(answer.to_string()),
                error: None,
            });
        }
        let pending = self.pending_calls();
        if !pending.is_empty() && !self.tools_enabled() {
            return Step::RefuseTools(pending);
        }
        if cancelled {
            return Step::Cancel;
        }
        let excess = self.excess_calls();
        if !excess.is_empty() {
            return Step::RefuseExcessCalls(excess);
        }
        if !pending.is_empty() {
            if let Some(stuck) = self.stuck(&pending) {
                return Step::Stuck(stuck);
            }
            return Step::RunTools(pending);
        }
        if let Some(d) = self.deadline()
            && now >= d
        {
            return Step::Done(Outcome {
                reason: ExitReason::Timeout,
                result: None,
                error: Some(format!(
                    "session deadline of {}s reached",
                    self.spec.timeout_secs.unwrap_or(0)
                )),
            });
        }
        if let Some(budget) = self.spec.token_budget
            && self.usage.total() >= budget
        {
            return Step::Done(Outcome {
                reason: ExitReason::BudgetExhausted,
                result: None,
                error: Some(format!(
                    "token budget of {budget} spent ({} used)",
                    self.usage.total()
                )),
            });
        }
        if self.turn_iterations() >= self.spec.max_iterations && !self.free_iteration {
            return Step::Done(Outcome {
                reason: ExitReason::MaxIterations,
                result: None,
                error: Some(format!(
                    "stopped after {} iterations without a final answer",
                    self.iteration
                )),
            });
        }
        Step::CallLlm
    }

    /// The text of the model's final answer when nothing has acted on it yet (no plan→act
    /// switch, no drain, no outcome): the last message is an assistant turn without calls
    /// that the provider did not pause (a paused turn is no answer yet: the next call,
    /// sent it as it is, goes on with it).
    fn unsettled_answer(&self) -> Option<&str> {
        if self.outcome.is_some() {
            return None;
        }
        let last = self.messages.last()?;
        (last.role == Role::Assistant
            && last.tool_calls.is_empty()
            && last.finish_reason != Some(FinishReason::Paused))
        .then_some(&*last.content)
    }

    /// [`Step::StartAct`]: the plan stands; the act phase begins with tools.
    pub fn start_act(&mut self) {
        self.phase = Phase::Act;
        self.messages.push(Message::user(PLAN_TO_ACT));
    }

    /// [`Step::RefuseTools`]: answer each call with a refusal that tells the model to
    /// answer without tools. The refusals are the messages from the old history length on.
    pub fn refuse_calls(&mut self, calls: Vec<ToolCall>) {
        let mode = if self.spec.mode == Mode::PlanAct {
            "the plan phase".to_string()
        } else {
            format!("{} mode", self.spec.mode)
        };
        for c in calls {
            let text = format!(
                "Tool calls are not available in {mode}: `{}` was not run. Answer without tools.",
                c.name
            );
            self.messages
                .push(Message::tool_result(c.id, c.name, text, true));
        }
    }

    /// [`Step::DrainBackground`], once the results that arrived are known (after waiting,
    /// if children were running): inject them, or let the answer stand.
    pub fn drain(&mut self, results: &[BackgroundResult]) -> Drain {
        if !results.is_empty() {
            self.drain_rounds = self.drain_rounds.saturating_add(1);
            self.free_iteration = true;
            self.deliver_background(results);
            return Drain::Injected;
        }
        let outcome = Outcome {
            reason: ExitReason::Stop,
            result: self.unsettled_answer().map(str::to_string),
            error: None,
        };
        self.outcome = Some(outcome.clone());
        Drain::Finished(outcome)
    }

    /// [`Step::DrainBackground`] when children are running but the host could not wait
    /// for them: a cancelled run ends, any other suspends until a result arrives.
    pub fn drain_unavailable(&mut self, cancelled: bool) -> Drain {
        if cancelled {
            let outcome = Outcome::new(ExitReason::Interrupted);
            self.outcome = Some(outcome.clone());
            return Drain::Finished(outcome);
        }
        Drain::Suspended(SuspendReason::Children)
    }

    /// Add background results to the history as one user message, recording how far the
    /// inbox was delivered. Nothing when there are none.
    pub fn deliver_background(&mut self, results: &[BackgroundResult]) {
        if results.is_empty() {
            return;
        }
        for r in results {
            self.bg_cursor = self.bg_cursor.max(r.seq);
        }
        let text = results
            .iter()
            .map(BackgroundResult::render)
            .collect::<Vec<_>>()
            .join("\n\n");
        self.messages.push(Message::user(text));
    }

    /// Add steering messages (with their inbox positions) before the next LLM call.
    /// Whether there were any.
    pub fn inject_messages(&mut self, injected: Vec<(u64, String)>) -> bool {
        let any = !injected.is_empty();
        for (seq, text) in injected {
            self.msg_cursor = self.msg_cursor.max(seq);
            self.messages.push(Message::user(text));
        }
        any
    }

    /// [`Step::Cancel`]: close the calls still open and end the session as interrupted.
    pub fn cancel(&mut self) {
        self.close_pending(CANCELLED_RESULT);
        self.outcome = Some(Outcome::new(ExitReason::Interrupted));
    }

    /// The LLM call ended the session (error, deadline, cancel). A cancel closes the calls
    /// still open, so the history stays replayable.
    pub fn end_with(&mut self, outcome: Outcome) {
        if outcome.reason == ExitReason::Interrupted {
            self.close_pending(CANCELLED_RESULT);
        }
        self.outcome = Some(outcome);
    }

    /// The user interrupted a tool round: the calls still running are abandoned, and none
    /// is waiting for an approval any more.
    pub fn interrupt_tools(&mut self) {
        self.close_pending(INTERRUPTED_BY_USER_RESULT);
        self.not_started.clear();
    }

    /// Give every call still without a result an explicit result, so the history stays
    /// replayable.
    pub fn close_pending(&mut self, text: &str) {
        for c in self.pending_calls() {
            self.messages
                .push(Message::tool_result(c.id, c.name, text, true));
        }
    }

    /// A call was held back for an approval: on resume it is known not to have started.
    pub fn hold_for_approval(&mut self, call_id: &str) {
        if !self.not_started.iter().any(|id| id == call_id) {
            self.not_started.push(call_id.to_string());
        }
    }

    /// Record a call's result (already truncated).
    pub fn push_tool_result(&mut self, call: ToolCall, mut content: String, is_error: bool) {
        self.not_started.retain(|id| id != &call.id);
        // Kept for the session's life: without the room the output's growth left spare.
        content.shrink_to_fit();
        self.messages
            .push(Message::tool_result(call.id, call.name, content, is_error));
    }

    /// The result just pushed ran with arguments a person edited: the transcript keeps
    /// them beside the model's call.
    pub fn mark_edited(&mut self, arguments: Arguments) {
        if let Some(m) = self.messages.last_mut() {
            m.edited_arguments = Some(arguments);
        }
    }

    /// A tool round is over: put its results in call order and decide what follows. A
    /// suspension wins (its calls must not be lost), then a cancel (the next step closes
    /// the run), then a yield (the first yielding call's output, in finishing order).
    pub fn end_tool_round(
        &mut self,
        suspend: Option<SuspendReason>,
        yielded: Option<String>,
        cancelled: bool,
    ) -> AfterTools {
        self.order_tool_results();
        if let Some(reason) = suspend {
            return AfterTools::Suspend(reason);
        }
        if cancelled {
            return AfterTools::Continue;
        }
        if let Some(result) = yielded {
            let outcome = Outcome {
                reason: ExitReason::Yielded,
                result: Some(result),
                error: None,
            };
            self.outcome = Some(outcome.clone());
            return AfterTools::Finished(outcome);
        }
        AfterTools::Continue
    }

    /// Record an assistant response. Counts the iteration and the usage.
    pub fn push_assistant(&mut self, msg: Message) {
        if self.free_iteration {
            self.free_iteration = false;
        } else {
            self.iteration = self.iteration.saturating_add(1);
        }
        if let Some(u) = &msg.usage {
            self.usage.add(u);
        }
        if !msg.tool_calls.is_empty() {
            self.drain_rounds = 0;
        }
        self.messages.push(msg);
    }

    /// Put the trailing tool results of the last assistant turn in call order. Results are
    /// stored as they finish (parallel calls finish in any order); history is replayed in
    /// call order.
    pub fn order_tool_results(&mut self) {
        if let Some(pos) = self
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
        {
            normalize_history(&mut self.messages[pos..]);
        }
    }

    /// Bring a history loaded from storage into canonical order: every turn's tool
    /// results in call order.
    pub fn normalize(&mut self) {
        normalize_history(&mut self.messages);
    }

    /// The system prompt sent with every request: the session's own (or the default),
    /// plus the instructions of the current mode.
    pub fn system_prompt(&self) -> Cow<'_, str> {
        let base = self.spec.system.as_deref().unwrap_or(DEFAULT_SYSTEM_PROMPT);
        match (self.spec.mode, self.phase) {
            (Mode::Plan, _) | (Mode::PlanAct, Phase::Plan) => {
                Cow::Owned(format!("{base}\n\n{PLAN_INSTRUCTIONS}"))
            }
            (Mode::Think, _) => Cow::Owned(format!("{base}\n\n{THINK_INSTRUCTIONS}")),
            _ => Cow::Borrowed(base),
        }
    }

    /// The request for the next LLM call: the history repaired, windowed and compacted.
    /// The stored history is never changed by this. The request borrows the history and
    /// the tool specs (it is built every iteration, and the history can be long): only a
    /// message the view changes (a synthesized result, a compacted output) is a copy.
    /// `web_search` (the provider's own search, when the session has it) is offered
    /// whenever tools are.
    pub fn request<'a>(
        &'a self,
        model: &str,
        tools: &'a [ToolSpec],
        web_search: Option<&WebSearch>,
    ) -> LlmRequest<'a> {
        LlmRequest {
            model: model.to_string(),
            system: Some(self.system_prompt()),
            messages: request_view(
                &self.messages,
                self.spec.history_window,
                self.spec.context_budget_chars,
            ),
            tools: if self.tools_enabled() {
                Cow::Borrowed(tools)
            } else {
                Cow::Borrowed(&[])
            },
            temperature: self.spec.temperature,
            max_tokens: self.spec.max_tokens,
            session_id: self.session_id.clone(),
            web_search: web_search.filter(|_| self.tools_enabled()).cloned(),
        }
    }
}
