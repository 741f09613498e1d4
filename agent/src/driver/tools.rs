//! A tool round: the pending calls of a response run concurrently, each through the guard
//! pipeline with its timeout, their outputs truncated and committed as they finish — or,
//! when the response's checkpoint is held back (see [`Agent::write_ahead_grace`]), all
//! together with the response once the round is over or the grace has run out. What the
//! guardian's reviews spent goes on the session's usage with the next of those commits.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span};

use super::{Agent, RunEnd, Saved, due};
use crate::bounds;
use crate::error::Result;
use crate::event::AgentEvent;
use crate::guard::{
    CONTEXT_PROMPT_MAX_BYTES, HookContext, ReviewGate, ReviewRound, Verdict, bounded,
};
use crate::schema::{Arguments, ToolCall};
use crate::state::{AfterTools, SessionState, SuspendReason, truncate_output};
use crate::tools::{SideEffect, ToolContext, ToolOutput};

/// What every call of one round shares.
struct RoundCtx<'a> {
    hook: HookContext<'a>,
    sensitive: &'a [String],
    approval_timeout: Duration,
    tool_timeout: Duration,
    cancel: &'a CancellationToken,
    /// The guardian's reviews of this round's calls (none without a guardian).
    reviews: Option<&'a ReviewRound>,
    /// Calls whose approval carries edited arguments that cannot be read: refused, with
    /// why (neither the model's arguments nor unreadable ones may run).
    refused: &'a HashMap<String, String>,
}

/// What a round has seen so far of the calls that finished.
#[derive(Default)]
struct RoundState {
    /// The output of the first call (in finishing order) that yields the loop.
    yielded: Option<String>,
    suspend: Option<SuspendReason>,
    /// Calls running with arguments a person edited (see [`Agent::apply_edits`]).
    edited: HashSet<String>,
}

/// How a tool result tells the model that its call ran with a person's arguments.
pub const EDITED_NOTE: &str =
    "Note: a person approved this call with edited arguments; it ran with: ";

/// The loop's bookkeeping a tool round updates.
pub(super) struct RoundIo<'a> {
    pub saved: &'a mut Saved,
    /// Time spent waiting on the tools (not the loop's own overhead).
    pub waited: &'a mut Duration,
    /// Calls a run that died may have started already.
    pub uncertain: &'a [String],
}

impl Agent {
    /// Whether the write-ahead checkpoint of a response making `calls` may wait for their
    /// results (see [`Agent::write_ahead_grace`]).
    pub(super) fn may_hold(&self, state: &SessionState, calls: &[ToolCall]) -> bool {
        !self.write_ahead_grace.is_zero()
            && !calls.is_empty()
            && state.tools_enabled()
            && calls.iter().all(|c| {
                self.tools
                    .get(&c.name)
                    .is_some_and(|t| t.side_effect(&c.arguments.value()) == SideEffect::Pure)
                    && !self
                        .guards
                        .reaches_out(&c.name, &state.spec.sensitive_tools)
            })
    }

    /// Run the pending calls concurrently; commit each result as it finishes.
    /// `Some(end)` when the run must stop (yield, suspension).
    pub(super) async fn run_tools(
        &self,
        state: &mut SessionState,
        calls: Vec<ToolCall>,
        io: RoundIo<'_>,
        cancel: &CancellationToken,
    ) -> Result<Option<RunEnd>> {
        // Copies, so the calls can run while the state takes their results.
        let session_id = state.session_id.clone();
        let sensitive = state.spec.sensitive_tools.clone();
        let prompt = bounded(&state.spec.prompt, CONTEXT_PROMPT_MAX_BYTES).to_string();
        let (calls, edited, refused) = self.apply_edits(&session_id, &sensitive, calls).await;
        let reviews = self.review_round(state, &calls, cancel);
        let ctx = RoundCtx {
            hook: HookContext {
                session_id: &session_id,
                tenant: &self.guards.tenant,
                iteration: state.iteration,
                prompt: &prompt,
            },
            sensitive: &sensitive,
            approval_timeout: bounds::secs(state.spec.approval_timeout_secs),
            tool_timeout: bounds::secs(state.spec.tool_timeout_secs),
            cancel,
            reviews: reviews.as_ref(),
            refused: &refused,
        };
        // The spec's own limit may be anything a row holds; the transcript never takes more
        // than the hard ceiling of one result.
        let max_chars = state
            .spec
            .tool_output_max_chars
            .min(bounds::TOOL_OUTPUT_HARD_MAX_CHARS);
        let mut running: FuturesUnordered<_> = calls
            .into_iter()
            .map(|call| {
                let was_started = io.uncertain.contains(&call.id);
                self.traced_call(&ctx, call, was_started)
            })
            .collect();
        let mut round = RoundState {
            edited,
            ..RoundState::default()
        };
        let interrupt = self.interrupter.token();
        loop {
            let wait_started = Instant::now();
            let next = tokio::select! {
                n = running.next() => n,
                _ = interrupt.cancelled() => {
                    // Abandon what is still running; the new user message takes over.
                    drop(running);
                    record_reviews(state, ctx.reviews);
                    state.interrupt_tools();
                    self.checkpoint(state, io.saved).await?;
                    return Ok(None);
                }
                _ = due(io.saved.held.as_ref().map(|h| h.due)) => {
                    // Calls that outlast the grace: their response is committed now (with
                    // any results so far) while they go on.
                    *io.waited += wait_started.elapsed();
                    self.checkpoint(state, io.saved).await?;
                    continue;
                }
            };
            *io.waited += wait_started.elapsed();
            let Some((call, out)) = next else { break };
            record_reviews(state, ctx.reviews);
            self.take_result(state, io.saved, &mut round, call, out, max_chars)
                .await?;
        }
        record_reviews(state, ctx.reviews);
        let after = state.end_tool_round(round.suspend, round.yielded, cancel.is_cancelled());
        match after {
            AfterTools::Suspend(reason) => {
                // Persist which calls never started before giving the session up.
                self.checkpoint(state, io.saved).await?;
                Ok(Some(RunEnd::Suspended(reason)))
            }
            AfterTools::Finished(outcome) => {
                self.checkpoint(state, io.saved).await?;
                self.finish_events(state, &outcome).await;
                Ok(Some(RunEnd::Finished(outcome)))
            }
            AfterTools::Continue => Ok(None),
        }
    }

    /// Put a person's edited arguments on the held calls approved with them, before any
    /// stage sees the calls: each then passes the whole pipeline with what it will run
    /// with. Only calls that need an approval are asked about (one read each, and only on
    /// the run after a decision). Returns the calls, the ids of those edited, and the
    /// calls whose edit cannot be read, with why.
    async fn apply_edits(
        &self,
        session_id: &str,
        sensitive: &[String],
        calls: Vec<ToolCall>,
    ) -> (Vec<ToolCall>, HashSet<String>, HashMap<String, String>) {
        let mut edited = HashSet::new();
        let mut refused = HashMap::new();
        let Some(approver) = &self.guards.approver else {
            return (calls, edited, refused);
        };
        let mut out = Vec::with_capacity(calls.len());
        for mut call in calls {
            if self.guards.needs_approval(&call.name, sensitive) {
                match approver.edited_arguments(session_id, &call).await {
                    Ok(Some(arguments)) => {
                        call.arguments = Arguments::from(arguments);
                        edited.insert(call.id.clone());
                    }
                    Ok(None) => {}
                    Err(why) => {
                        refused.insert(call.id.clone(), why);
                    }
                }
            }
            out.push(call);
        }
        (out, edited, refused)
    }

    /// The guardian's reviews of `calls`, admitted by its own gate or the session's.
    fn review_round(
        &self,
        state: &SessionState,
        calls: &[ToolCall],
        cancel: &CancellationToken,
    ) -> Option<ReviewRound> {
        self.guards.guardian.as_ref()?;
        let deadline = state.deadline().map(|d| {
            let left = (d - chrono::Utc::now()).to_std().unwrap_or_default();
            bounds::instant_after(Instant::now(), left)
        });
        let gate = ReviewGate {
            admission: self
                .guards
                .guardian_admission
                .clone()
                .unwrap_or_else(|| self.admission.clone()),
            cancel: cancel.clone(),
            deadline,
        };
        self.guards
            .review_round(calls, |name| self.tools.get(name).is_some(), gate)
    }

    /// Record one finished call. `out` is `None` when the call waits for an approval.
    async fn take_result(
        &self,
        state: &mut SessionState,
        saved: &mut Saved,
        round: &mut RoundState,
        call: ToolCall,
        out: Option<ToolOutput>,
        max_chars: usize,
    ) -> Result<()> {
        let out = match out {
            Some(o) if o.suspend => {
                round.suspend.get_or_insert(SuspendReason::Children);
                return Ok(());
            }
            Some(o) => o,
            None => {
                self.announce_hold(state, saved, &call);
                state.hold_for_approval(&call.id);
                round.suspend.get_or_insert(SuspendReason::Approval {
                    tool_call_id: call.id,
                });
                return Ok(());
            }
        };
        let mut content = state.with_repeat_note(&call, truncate_output(out.content, max_chars));
        let edited = round
            .edited
            .remove(&call.id)
            .then(|| call.arguments.clone());
        if let Some(arguments) = &edited {
            // The model sees its call ran otherwise than it asked.
            content = format!("{EDITED_NOTE}{arguments}\n\n{content}");
        }
        self.events.emit(
            state.messages.len(),
            AgentEvent::ToolResult {
                id: call.id.clone(),
                name: call.name.clone(),
                content: content.clone(),
                is_error: out.is_error,
            },
        );
        if out.yield_loop && round.yielded.is_none() {
            round.yielded = Some(content.clone());
        }
        state.push_tool_result(call, content, out.is_error);
        if let Some(arguments) = edited {
            state.mark_edited(arguments);
        }
        // A held response is committed with all its results, in call order, by the
        // caller's checkpoint after the round.
        if saved.held.is_none() {
            self.checkpoint(state, saved).await?;
        }
        Ok(())
    }

    /// Tell the session's followers that `call` waits for a human, unless a run before
    /// this one held it already (and said so). The event belongs to the response that
    /// made the call, like its `ToolCall`, so that the suspension's commit and the resumed
    /// run after it do not make it look like uncommitted work.
    fn announce_hold(&self, state: &SessionState, saved: &Saved, call: &ToolCall) {
        if state.not_started.contains(&call.id) {
            return;
        }
        let made_at = state
            .messages
            .iter()
            .rposition(|m| m.tool_calls.iter().any(|c| c.id == call.id))
            .unwrap_or(state.messages.len());
        self.events.emit(
            made_at.max(saved.run_from),
            AgentEvent::ApprovalRequested {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            },
        );
    }

    /// One call in its tracing span, paired with its outcome.
    async fn traced_call(
        &self,
        ctx: &RoundCtx<'_>,
        call: ToolCall,
        was_started: bool,
    ) -> (ToolCall, Option<ToolOutput>) {
        let span = info_span!(
            "execute_tool",
            otel.name = %format!("execute_tool {}", call.name),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %call.name,
            gen_ai.tool.call.id = %call.id,
        );
        let out = self
            .execute_one(ctx, &call, was_started)
            .instrument(span)
            .await;
        (call, out)
    }

    /// One call through the guard pipeline. `None` means "suspend for approval".
    async fn execute_one(
        &self,
        ctx: &RoundCtx<'_>,
        call: &ToolCall,
        was_started: bool,
    ) -> Option<ToolOutput> {
        if ctx.cancel.is_cancelled() {
            return Some(ToolOutput::error("interrupted: the session was cancelled"));
        }
        if let Some(why) = ctx.refused.get(&call.id) {
            return Some(crate::guard::denied("approval", why));
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
        if was_started && tool.side_effect(&call.arguments.value()) == SideEffect::Unsafe {
            return Some(ToolOutput::error(
                "interrupted before completion; outcome unknown. This call may or may not have taken effect: check before repeating it.",
            ));
        }
        match self
            .guards
            .check(
                &ctx.hook,
                call,
                tool.as_ref(),
                ctx.sensitive,
                ctx.approval_timeout,
                ctx.reviews,
            )
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
        let tool_ctx = ToolContext {
            session_id: ctx.hook.session_id.to_string(),
            tool_call_id: call.id.clone(),
            idempotency_key: format!("{}:{}", ctx.hook.session_id, call.id),
            workspace: self.workspace.clone(),
            settings: self.settings.clone(),
            cancel: ctx.cancel.child_token(),
        };
        debug!(tool = %call.name, "executing tool");
        let fut = tool.call(call.arguments.value(), &tool_ctx);
        let (out, outcome) = tokio::select! {
            r = tokio::time::timeout(ctx.tool_timeout, fut) => match r {
                Ok(Ok(o)) => {
                    let label = if o.is_error { "error" } else { "ok" };
                    (o, label)
                }
                Ok(Err(e)) => (ToolOutput::error(format!("Error: {e}")), "error"),
                Err(_) => (
                    ToolOutput::error(format!(
                        "Error: tool `{}` timed out after {}s",
                        call.name,
                        ctx.tool_timeout.as_secs_f64()
                    )),
                    "timeout",
                ),
            },
            _ = ctx.cancel.cancelled() => {
                tool_ctx.cancel.cancel();
                (
                    ToolOutput::error("interrupted: the session was cancelled while this tool ran"),
                    "cancelled",
                )
            }
        };
        self.observer
            .tool_call(&call.name, outcome, started.elapsed());
        self.guards.post_tool_use(&ctx.hook, call, &out);
        Some(out)
    }
}

/// Put what the round's reviews spent so far on the session's usage; the next checkpoint
/// records it (each review's once: taking it empties the round's count).
fn record_reviews(state: &mut SessionState, reviews: Option<&ReviewRound>) {
    if let Some(u) = reviews.and_then(ReviewRound::take_spent) {
        state.usage.add(&u);
    }
}
