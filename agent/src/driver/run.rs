//! The run loop: ask the state for the next [`Step`], perform the I/O it names, record
//! the results, checkpoint, repeat — until the session finishes or suspends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span};

use super::llm::Attempt;
use super::stream::Assembled;
use super::tools::RoundIo;
use super::{Agent, Held, Receipt, RunEnd, Saved};
use crate::error::Result;
use crate::event::AgentEvent;
use crate::observe::Observer;
use crate::schema::{ToolCall, ToolSpec};
use crate::state::{Drain, SessionState, Step};

/// Spare room left in a history before each call: an answer and its calls' results.
const HISTORY_SPARE: usize = 4;

/// What one run keeps between steps.
struct Run {
    saved: Saved,
    /// Calls pending when this run started that a run that died may have started.
    maybe_started: Vec<String>,
    /// Shared with every other run that offers the same tools.
    specs: Arc<[ToolSpec]>,
    /// What `specs` add to every call's input estimate, counted once.
    specs_bytes: usize,
    overhead: Overhead,
}

/// Per-iteration overhead ([`Observer::iteration_overhead`]): the time from an LLM
/// response to the next request (or to the final checkpoint), less the time spent waiting
/// on tools and background children.
#[derive(Default)]
struct Overhead {
    since_response: Option<Instant>,
    waited: Duration,
}

impl Overhead {
    /// Report the overhead of the iteration whose response arrived last (if not yet).
    fn report(&mut self, observer: &dyn Observer) {
        if let Some(t) = self.since_response.take() {
            let waited = std::mem::take(&mut self.waited);
            observer.iteration_overhead(t.elapsed().saturating_sub(waited));
        }
    }
}

impl Agent {
    pub(super) async fn run_inner(
        &self,
        state: &mut SessionState,
        cancel: &CancellationToken,
    ) -> Result<(RunEnd, Receipt)> {
        let mut run = self.start(state).await;
        loop {
            let end = match state.decide(chrono::Utc::now(), cancel.is_cancelled()) {
                Step::Done(outcome) => {
                    if state.outcome.is_none() {
                        state.outcome = Some(outcome.clone());
                    }
                    self.checkpoint(state, &mut run.saved).await?;
                    run.overhead.report(&*self.observer);
                    self.finish_events(state, &outcome).await;
                    Some(RunEnd::Finished(outcome))
                }
                Step::Cancel => {
                    state.cancel();
                    None
                }
                Step::RunTools(calls) => self.tool_round(state, &mut run, calls, cancel).await?,
                Step::RefuseTools(calls) => {
                    let from = state.messages.len();
                    state.refuse_calls(calls);
                    self.emit_results(state, from);
                    self.checkpoint(state, &mut run.saved).await?;
                    None
                }
                Step::RefuseExcessCalls(calls) => {
                    let from = state.messages.len();
                    state.refuse_excess_calls(calls);
                    self.emit_results(state, from);
                    self.checkpoint(state, &mut run.saved).await?;
                    None
                }
                Step::Stuck(stuck) => {
                    let from = state.messages.len();
                    state.end_stuck(stuck);
                    self.emit_results(state, from);
                    self.checkpoint(state, &mut run.saved).await?;
                    None
                }
                Step::StartAct => {
                    state.start_act();
                    self.checkpoint(state, &mut run.saved).await?;
                    None
                }
                Step::DrainBackground => self.drain(state, &mut run, cancel).await?,
                Step::CallLlm => self.iterate(state, &mut run, cancel).await?,
            };
            if let Some(end) = end {
                return Ok((end, std::mem::take(&mut run.saved.receipt)));
            }
        }
    }

    /// Set up a run: a fresh session starts its clock and its hooks; a resumed one notes
    /// which pending calls may have been started by the run that died.
    async fn start(&self, state: &mut SessionState) -> Run {
        state.normalize();
        let fresh = state.started_at.is_none();
        if fresh {
            state.started_at = Some(chrono::Utc::now());
            let ctx = self.hook_context(state);
            for h in &self.guards.hooks {
                h.session_start(&ctx).await;
            }
        }
        // Calls held back for an approval were known not to have started.
        let maybe_started = if fresh {
            Vec::new()
        } else {
            state
                .pending_calls()
                .into_iter()
                .map(|c| c.id)
                .filter(|id| !state.not_started.contains(id))
                .collect()
        };
        let (specs, specs_bytes) = crate::tools::shared_specs::share_registry(&self.tools);
        Run {
            saved: Saved {
                upto: state.messages.len(),
                run_from: state.messages.len(),
                held: None,
                receipt: Receipt::none(),
            },
            maybe_started,
            specs_bytes,
            specs,
            overhead: Overhead::default(),
        }
    }

    /// Emit a `ToolResult` event for each message from `from` on (results just added).
    fn emit_results(&self, state: &SessionState, from: usize) {
        for (seq, m) in state.messages.iter().enumerate().skip(from) {
            self.events.emit(
                seq,
                AgentEvent::ToolResult {
                    id: m.tool_call_id.clone().unwrap_or_default(),
                    name: m.name.clone().unwrap_or_default(),
                    content: m.content.clone(),
                    is_error: m.is_error,
                },
            );
        }
    }

    /// [`Step::RunTools`], then whatever background results arrived meanwhile.
    async fn tool_round(
        &self,
        state: &mut SessionState,
        run: &mut Run,
        calls: Vec<ToolCall>,
        cancel: &CancellationToken,
    ) -> Result<Option<RunEnd>> {
        let uncertain = std::mem::take(&mut run.maybe_started);
        let io = RoundIo {
            saved: &mut run.saved,
            waited: &mut run.overhead.waited,
            uncertain: &uncertain,
        };
        if let Some(end) = self.run_tools(state, calls, io, cancel).await? {
            return Ok(Some(end));
        }
        if state.outcome.is_none() {
            let results = self.background.take().await;
            state.deliver_background(&results);
            self.checkpoint(state, &mut run.saved).await?;
        }
        Ok(None)
    }

    /// [`Step::DrainBackground`]: take the results that arrived, waiting for running
    /// children when none did, and let the state decide.
    async fn drain(
        &self,
        state: &mut SessionState,
        run: &mut Run,
        cancel: &CancellationToken,
    ) -> Result<Option<RunEnd>> {
        let started = Instant::now();
        let mut results = self.background.take().await;
        let mut decision = None;
        if results.is_empty() && self.background.outstanding() > 0 {
            if self.background.wait(cancel).await {
                results = self.background.take().await;
            } else {
                decision = Some(state.drain_unavailable(cancel.is_cancelled()));
            }
        }
        let decision = decision.unwrap_or_else(|| state.drain(&results));
        run.overhead.waited += started.elapsed();
        self.checkpoint(state, &mut run.saved).await?;
        match decision {
            Drain::Injected => Ok(None),
            Drain::Finished(outcome) => {
                run.overhead.report(&*self.observer);
                self.finish_events(state, &outcome).await;
                Ok(Some(RunEnd::Finished(outcome)))
            }
            Drain::Suspended(reason) => {
                run.overhead.report(&*self.observer);
                Ok(Some(RunEnd::Suspended(reason)))
            }
        }
    }

    /// [`Step::CallLlm`]: deliver steering messages, call the model, record its answer.
    async fn iterate(
        &self,
        state: &mut SessionState,
        run: &mut Run,
        cancel: &CancellationToken,
    ) -> Result<Option<RunEnd>> {
        let injected = self.background.take_injections().await;
        if state.inject_messages(injected) {
            self.checkpoint(state, &mut run.saved).await?;
        }
        let iteration = state
            .iteration
            .saturating_add(u32::from(!state.free_iteration));
        let seq = state.messages.len();
        self.events
            .emit(seq, AgentEvent::IterationStarted { iteration });
        let model = self.model(state);
        // The history is held through the call's whole latency, and a vector's doubling
        // can leave as many spare messages (288 bytes each) as it holds; a few spare slots
        // take the turn the answer adds without growing it again.
        let spare = state.messages.len().saturating_add(HISTORY_SPARE);
        state.messages.shrink_to(spare);
        let request = state.request(&model, &run.specs, self.web_search.as_ref());
        run.overhead.report(&*self.observer);
        let span = info_span!("iteration", iteration);
        let (attempt, abandoned) = self
            .call_with_retry(state, &request, run.specs_bytes, cancel)
            .instrument(span)
            .await;
        drop(request);
        // Recorded with the next checkpoint (the interrupting message's, or the end's).
        if let Some(u) = &abandoned {
            state.usage.add(u);
        }
        match attempt {
            Attempt::Interrupted => Ok(None),
            Attempt::Ended(outcome) => {
                state.end_with(outcome);
                Ok(None)
            }
            Attempt::Suspended(reason) => {
                // Nothing of the call is in the state; what came before it is made
                // durable (a response held back for its grace, injected messages) so
                // the resumed run starts from exactly here.
                if run.saved.held.is_some() || run.saved.upto < state.messages.len() {
                    self.checkpoint(state, &mut run.saved).await?;
                }
                run.overhead.report(&*self.observer);
                Ok(Some(RunEnd::Suspended(reason)))
            }
            Attempt::Got(response) => {
                self.record_response(state, run, *response, seq, model)
                    .await?;
                Ok(None)
            }
        }
    }

    /// Record an LLM answer and write it ahead of anything it leads to — unless its
    /// checkpoint may be held back (see [`Agent::write_ahead_grace`]).
    async fn record_response(
        &self,
        state: &mut SessionState,
        run: &mut Run,
        response: Assembled,
        seq: usize,
        requested_model: String,
    ) -> Result<()> {
        run.overhead = Overhead {
            since_response: Some(Instant::now()),
            waited: Duration::ZERO,
        };
        let msg = response.message;
        let usage = msg.usage.unwrap_or_default();
        let has_calls = !msg.tool_calls.is_empty();
        let model = msg.model.clone().unwrap_or(requested_model);
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
        // A final answer with nothing to wait for is followed at once by the checkpoint
        // that finishes the session (or switches plan to act, or injects results already
        // in): one commit carries both.
        let hold = if has_calls {
            self.may_hold(state, &msg.tool_calls)
        } else {
            !self.write_ahead_grace.is_zero() && self.background.outstanding() == 0
        };
        state.push_assistant(msg);
        run.saved.held = Some(Held {
            due: crate::bounds::instant_after(Instant::now(), self.write_ahead_grace),
            seq,
            iteration: state.iteration,
            usage,
            model,
            counted,
        });
        // Write-ahead: the response is durable before any call that could change
        // something runs, and before any wait.
        if !hold {
            self.checkpoint(state, &mut run.saved).await?;
        }
        Ok(())
    }
}
