//! The driver: performs the I/O the state machine ([`crate::state`]) asks for — LLM calls
//! with retry and streaming, tool calls through the guard pipeline, background results —
//! and checkpoints after each LLM response and each tool result through the
//! [`Checkpointer`] it is handed (a response whose calls have no effect anywhere may share
//! one checkpoint with their results; see [`Agent::write_ahead_grace`]).
//!
//! - `run`: the loop, one [`Step`](crate::state::Step) at a time;
//! - `llm`: one LLM call with its retry policy;
//! - `stream`: assembling a streamed answer into a message (pure);
//! - `tools`: a tool round and one call through the guards.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span};

use crate::error::Result;
use crate::event::{AgentEvent, EventSink};
use crate::guard::{CONTEXT_PROMPT_MAX_BYTES, Guards, HookContext, bounded};
use crate::observe::Observer;
use crate::provider::LlmProvider;
use crate::schema::{Role, Usage};
use crate::state::{Outcome, SessionState};
use crate::tools::{ToolRegistry, ToolSettings, Workspace};

mod llm;
mod run;
mod stream;
mod tools;

pub use crate::state::{BackgroundResult, SuspendReason};
pub use tools::EDITED_NOTE;
// The admission lives beside the driver (the guardian's reviewer asks it too); its
// names stay reachable here, where hosts have always found them.
pub use crate::admission::{
    Admission, Admit, CallAsk, CallReport, MAX_LATE_ASKS, NoAdmission, Permit,
    estimate_input_tokens,
};

/// Persists the state after each step. `from` is the index of the first message not yet
/// persisted; the scalar fields (iteration, usage, outcome…) are written every time.
/// Any error stops the run at once, without any further write: a lost lease is
/// [`Error::LeaseLost`](crate::Error::LeaseLost), a store that refused or could not be
/// reached [`Error::Checkpoint`](crate::Error::Checkpoint).
#[async_trait]
pub trait Checkpointer: Send + Sync {
    /// What the host's store answered besides "durable" (see [`Receipt`]).
    async fn save(&self, state: &SessionState, from: usize) -> Result<Receipt>;
}

/// What a durable checkpoint left the host, opaque to the driver: the last one a run got
/// comes back from [`Agent::run_with_receipt`] (a worker: the row its final commit
/// returned). Most checkpoints leave none, and none costs nothing.
#[derive(Default)]
pub struct Receipt(Option<Box<dyn Any + Send + Sync>>);

impl Receipt {
    /// Nothing to hand back.
    pub const fn none() -> Self {
        Receipt(None)
    }

    /// Hand back `value`, already boxed (no allocation here).
    pub fn new<T: Any + Send + Sync>(value: Box<T>) -> Self {
        Receipt(Some(value))
    }

    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// The value, if it is a `T`.
    pub fn take<T: Any>(self) -> Option<Box<T>> {
        self.0?.downcast().ok()
    }
}

impl std::fmt::Debug for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Receipt(..)"
        } else {
            "Receipt(none)"
        })
    }
}

/// Keeps nothing: `agentq run` and tests that do not care.
pub struct NoCheckpoint;

#[async_trait]
impl Checkpointer for NoCheckpoint {
    async fn save(&self, _state: &SessionState, _from: usize) -> Result<Receipt> {
        Ok(Receipt::none())
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
    /// The provider's own web search, offered beside `tools` when set: the host sets it
    /// only for a session that has the tool, on a provider that runs it
    /// ([`LlmProvider::web_search`]). What the provider runs is never run here.
    pub web_search: Option<crate::spec::WebSearch>,
    pub guards: Guards,
    pub events: Arc<dyn EventSink>,
    pub checkpointer: Arc<dyn Checkpointer>,
    pub background: Arc<dyn BackgroundSource>,
    pub workspace: Arc<dyn Workspace>,
    pub settings: Arc<ToolSettings>,
    pub observer: Arc<dyn Observer>,
    pub interrupter: Arc<Interrupter>,
    /// Asked before every try of an LLM call, told how it went after.
    pub admission: Arc<dyn Admission>,
    /// Retries of an LLM call after real failures when the session's spec sets none.
    pub max_llm_retries: u32,
    /// The longest a call waits for a rate limit (the admission's wait, or a 429's reset)
    /// while holding the session's slot; a longer wait suspends the session until then.
    /// Zero never suspends (the call waits, bounded by the session deadline).
    pub suspend_after: Duration,
    /// How long a response may wait for its checkpoint when every call it makes is
    /// `Pure` and passes no hook or approval: the calls run at once, and if they are all
    /// done within this time, the response and their results are committed together (one
    /// commit per tool round instead of two). Re-running such calls changes nothing, so
    /// all a crash in that window can cost is the LLM call, which the resumed session makes
    /// again. A final answer with nothing to wait for likewise goes with the checkpoint
    /// that finishes the session. Zero commits every response on its own, first.
    pub write_ahead_grace: Duration,
}

/// [`Agent::suspend_after`] unless configured.
pub const DEFAULT_SUSPEND_AFTER: Duration = Duration::from_secs(30);

/// [`Agent::write_ahead_grace`] unless configured.
pub const DEFAULT_WRITE_AHEAD_GRACE: Duration = Duration::from_millis(250);

/// How far a run's messages are durable, and a response whose checkpoint is held back.
struct Saved {
    /// Messages before this index are committed.
    upto: usize,
    /// The committed length this run started from. None of its events may belong to an
    /// earlier position: a reader of the event stream takes a run's first position as
    /// where a redone step starts, and drops what older runs emitted from there on.
    run_from: usize,
    held: Option<Held>,
    /// The last receipt a checkpoint of this run handed back.
    receipt: Receipt,
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

impl Agent {
    fn model(&self, state: &SessionState) -> String {
        state
            .spec
            .model
            .clone()
            .unwrap_or_else(|| self.default_model.clone())
    }

    /// Run the session until it finishes or suspends. `Err` only when checkpointing
    /// failed (including a lost lease): the run must stop without further writes.
    pub async fn run(
        &self,
        state: &mut SessionState,
        cancel: &CancellationToken,
    ) -> Result<RunEnd> {
        self.run_with_receipt(state, cancel)
            .await
            .map(|(end, _)| end)
    }

    /// [`Agent::run`], with the last [`Receipt`] the run's checkpoints handed back: for a
    /// finished session, its final checkpoint's when that one left any.
    pub async fn run_with_receipt(
        &self,
        state: &mut SessionState,
        cancel: &CancellationToken,
    ) -> Result<(RunEnd, Receipt)> {
        let span =
            info_span!("session", session_id = %state.session_id, model = %self.model(state));
        self.run_inner(state, cancel).instrument(span).await
    }

    async fn checkpoint(&self, state: &SessionState, saved: &mut Saved) -> Result<()> {
        let receipt = self.checkpointer.save(state, saved.upto).await?;
        if !receipt.is_none() {
            saved.receipt = receipt;
        }
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

    /// Who the hooks and the guardian are told about.
    fn hook_context<'a>(&'a self, state: &'a SessionState) -> HookContext<'a> {
        HookContext {
            session_id: &state.session_id,
            tenant: &self.guards.tenant,
            iteration: state.iteration,
            prompt: bounded(&state.spec.prompt, CONTEXT_PROMPT_MAX_BYTES),
        }
    }

    async fn finish_events(&self, state: &SessionState, outcome: &Outcome) {
        let ctx = self.hook_context(state);
        for h in &self.guards.hooks {
            h.session_end(&ctx, outcome.reason).await;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Mutex;

    use super::*;
    use crate::error::{CheckpointFailure, Error, ErrorClass};
    use crate::event::NullSink;
    use crate::provider::scripted::{Script, ScriptedProvider, Turn};
    use crate::spec::{ExitReason, SessionSpec};
    use crate::tools::LocalWorkspace;

    /// Counts its saves; a save of a finished state hands back its count. Fails every
    /// save with `fail` when set.
    #[derive(Default)]
    struct Counting {
        saves: Mutex<usize>,
        fail: Option<CheckpointFailure>,
    }

    #[async_trait]
    impl Checkpointer for Counting {
        async fn save(&self, state: &SessionState, _from: usize) -> Result<Receipt> {
            if let Some(f) = &self.fail {
                return Err(Error::Checkpoint(f.clone()));
            }
            let mut saves = self.saves.lock().unwrap();
            *saves += 1;
            Ok(if state.outcome.is_some() {
                Receipt::new(Box::new(*saves))
            } else {
                Receipt::none()
            })
        }
    }

    fn agent(checkpointer: Arc<Counting>, dir: &std::path::Path) -> Agent {
        let script = Script {
            turns: vec![Turn {
                text: "done".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        Agent {
            provider: Arc::new(ScriptedProvider::new(script)),
            default_model: "test-model".into(),
            tools: ToolRegistry::new(),
            web_search: None,
            guards: Guards::default(),
            events: Arc::new(NullSink),
            checkpointer,
            background: Arc::new(NoBackground),
            workspace: Arc::new(LocalWorkspace::new(dir).unwrap()),
            settings: Arc::new(ToolSettings::default()),
            observer: Arc::new(crate::observe::NoObserver),
            interrupter: Interrupter::new(),
            admission: Arc::new(NoAdmission),
            max_llm_retries: 0,
            suspend_after: DEFAULT_SUSPEND_AFTER,
            write_ahead_grace: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn the_receipt_of_the_finishing_checkpoint_comes_back_with_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let saves = Arc::new(Counting::default());
        let mut state = SessionState::new("s1", SessionSpec::new("task"));
        let (end, receipt) = agent(saves.clone(), dir.path())
            .run_with_receipt(&mut state, &CancellationToken::new())
            .await
            .unwrap();
        assert!(matches!(end, RunEnd::Finished(ref o) if o.reason == ExitReason::Stop));
        let last = *saves.saves.lock().unwrap();
        assert!(
            last > 1,
            "the answer and the finish are two commits: {last}"
        );
        assert_eq!(receipt.take::<usize>().map(|n| *n), Some(last));
    }

    #[test]
    fn a_receipt_is_only_what_it_holds() {
        assert!(Receipt::none().is_none());
        assert_eq!(Receipt::new(Box::new(7_u32)).take::<u64>(), None);
        assert_eq!(
            Receipt::new(Box::new(7_u32)).take::<u32>(),
            Some(Box::new(7))
        );
    }

    #[tokio::test]
    async fn a_checkpoint_failure_stops_the_run_as_the_checkpointer_typed_it() {
        let dir = tempfile::tempdir().unwrap();
        for (fail, class) in [
            (
                CheckpointFailure::Refused {
                    reason: "value out of range".into(),
                    durable: 1,
                },
                ErrorClass::Fatal,
            ),
            (
                CheckpointFailure::Unavailable("connection refused".into()),
                ErrorClass::Retryable { after: None },
            ),
        ] {
            let saves = Arc::new(Counting {
                fail: Some(fail.clone()),
                ..Default::default()
            });
            let mut state = SessionState::new("s1", SessionSpec::new("task"));
            let err = agent(saves, dir.path())
                .run_with_receipt(&mut state, &CancellationToken::new())
                .await
                .unwrap_err();
            assert_eq!(err.class(), class);
            assert_eq!(err.to_string(), format!("checkpoint failed: {fail}"));
            let Error::Checkpoint(got) = err else {
                panic!("{err:?}")
            };
            assert_eq!(got, fail);
        }
    }
}
