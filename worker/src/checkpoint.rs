//! The worker's `Checkpointer`: hands each step to the worker's group commit, fenced by
//! the lease. Rides out short store outages by retrying (a checkpoint is idempotent),
//! stops the run at once when the lease is gone, and stops it right after a durable
//! checkpoint when the worker is draining. A checkpoint the store refuses for its data
//! (never retried: it would fail the same way) stops the run with
//! [`CheckpointFailure::Refused`], so that the session can be failed with the reason. The
//! final checkpoint's commit hands back the finished row as the step's [`Receipt`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use agentq_agent::CheckpointFailure;
use agentq_agent::driver::{Checkpointer, Receipt};
use agentq_agent::state::SessionState;
use agentq_core::{Checkpoint, Lease, SessionRow};

use crate::backoff::Backoff;
use crate::group_commit::GroupCommit;
use crate::workspace::{Pending, TreeSync};

pub struct StoreCheckpointer {
    pub commits: GroupCommit,
    pub lease: Lease,
    pub draining: CancellationToken,
    /// How long to keep retrying a store that does not answer.
    pub give_up_after: Duration,
    pub metrics: &'static agentq_core::metrics::Metrics,
    /// What this run last committed ([`Checkpoint::committed`]: without what is stored).
    /// The loop checkpoints at every boundary, and some boundaries (after a tool round
    /// with nothing to inject, say) change nothing: such a step is already durable, and
    /// writing it again would cost a commit per iteration.
    pub last: Mutex<Option<Checkpoint>>,
    /// The tree's durable workspace: the file changes each step commits.
    pub workspace: Option<Arc<TreeSync>>,
    /// The model the run calls, stored with its checkpoints (the spec may name none).
    pub model_used: Option<String>,
}

impl StoreCheckpointer {
    pub fn new(
        commits: GroupCommit,
        lease: Lease,
        draining: CancellationToken,
        give_up_after: Duration,
        metrics: &'static agentq_core::metrics::Metrics,
    ) -> Self {
        StoreCheckpointer {
            commits,
            lease,
            draining,
            give_up_after,
            metrics,
            last: Mutex::new(None),
            workspace: None,
            model_used: None,
        }
    }

    /// The file changes since the last commit, uploaded; none when there is no workspace
    /// or nothing changed. A store outage is retried like a commit; anything else (a file
    /// that changed while it was read, a disk error) leaves the changes for the next
    /// commit, so a step is never held up by its files.
    async fn collect_files(&self, session_id: &str, started: Instant) -> Pending {
        let Some(sync) = &self.workspace else {
            return Pending::default();
        };
        let mut backoff = Backoff::new();
        loop {
            match sync.collect().await {
                Ok(p) => return p,
                Err(e) if e.is_retryable() && started.elapsed() < self.give_up_after => {
                    let wait = backoff.next();
                    warn!(%session_id, error = %e, ?wait, "uploading workspace changes failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    warn!(%session_id, error = %e, "workspace changes are left for the next commit");
                    return Pending::default();
                }
            }
        }
    }

    /// The finished session's row from a [`save`](Checkpointer::save)'s receipt: the
    /// final checkpoint's commit brings it back on a store that returns it (otherwise the
    /// caller reads it).
    pub fn finished_row(receipt: Receipt) -> Option<SessionRow> {
        receipt.take::<SessionRow>().map(|row| *row)
    }

    /// How much of the history this run has committed (`None` before its first commit).
    pub fn committed_len(&self) -> Option<usize> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|cp| {
                usize::try_from(cp.from)
                    .ok()?
                    .checked_add(cp.messages.len())
            })
    }

    fn already_durable(&self, cp: &Checkpoint) -> bool {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|prev| cp.changes_nothing_after(prev))
    }

    /// A checkpoint that can never be stored: the run stops, and the session fails with
    /// the store's reason.
    fn refuse(state: &SessionState, from: usize, e: &agentq_core::Error) -> agentq_agent::Error {
        warn!(session_id = %state.session_id, error = %e, "checkpoint cannot be stored; stopping the run");
        agentq_agent::Error::Checkpoint(CheckpointFailure::Refused {
            reason: e.to_string(),
            durable: from,
        })
    }

    fn files_committed(&self, files: Pending) {
        if let Some(sync) = &self.workspace {
            sync.committed(files);
        }
    }

    fn files_not_committed(&self, files: Pending) {
        if let Some(sync) = &self.workspace {
            sync.not_committed(files);
        }
    }

    /// A draining worker stops each run right after a durable checkpoint.
    fn after_commit(
        &self,
        state: &SessionState,
        receipt: Receipt,
    ) -> agentq_agent::Result<Receipt> {
        if self.draining.is_cancelled() && state.outcome.is_none() {
            return Err(agentq_agent::Error::Stopped);
        }
        Ok(receipt)
    }
}

#[async_trait]
impl Checkpointer for StoreCheckpointer {
    /// The receipt of a commit that finished the session holds its row
    /// ([`StoreCheckpointer::finished_row`]), when the store returned it.
    async fn save(&self, state: &SessionState, from: usize) -> agentq_agent::Result<Receipt> {
        let started = Instant::now();
        let cp = match Checkpoint::new(&self.lease, state, from) {
            Ok(cp) => cp,
            // A state no row can hold (a count out of the column's range): as final as a
            // value the database refuses.
            Err(e) => return Err(Self::refuse(state, from, &e)),
        };
        let mut files = self.collect_files(&state.session_id, started).await;
        let cp = Arc::new(
            cp.with_files(
                std::mem::take(&mut files.changes),
                std::mem::take(&mut files.blobs),
            )
            .with_model(self.model_used.clone()),
        );
        if self.already_durable(&cp) {
            self.files_committed(files);
            return self.after_commit(state, Receipt::none());
        }
        let mut backoff = Backoff::new();
        let receipt = loop {
            let t = Instant::now();
            match self.commits.commit(cp.clone()).await {
                Ok(row) => {
                    self.files_committed(std::mem::take(&mut files));
                    self.metrics.observe_checkpoint(t.elapsed());
                    // The writer let go of it before answering, so this takes it
                    // without a copy.
                    let kept = Arc::unwrap_or_clone(cp).committed();
                    *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(kept);
                    break row.map_or_else(Receipt::none, Receipt::new);
                }
                Err(agentq_core::Error::LeaseLost(_)) => {
                    self.files_not_committed(files);
                    return Err(agentq_agent::Error::LeaseLost);
                }
                Err(agentq_core::Error::Stopped) => {
                    self.files_not_committed(files);
                    return Err(agentq_agent::Error::Stopped);
                }
                Err(e) if e.is_retryable() && started.elapsed() < self.give_up_after => {
                    let wait = backoff.next();
                    warn!(session_id = %state.session_id, error = %e, ?wait, "checkpoint failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    // Another session of the tree running here commits them instead.
                    self.files_not_committed(files);
                    if e.is_data() {
                        return Err(Self::refuse(state, from, &e));
                    }
                    return Err(agentq_agent::Error::Checkpoint(
                        CheckpointFailure::Unavailable(e.to_string()),
                    ));
                }
            }
        };
        self.after_commit(state, receipt)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use agentq_agent::schema::Message;
    use agentq_agent::spec::ExitReason;
    use agentq_agent::state::Outcome;
    use agentq_agent::state::SessionState;
    use agentq_core::metrics::Metrics;
    use agentq_core::sqlite::SqliteStore;
    use agentq_core::{Lease, SessionStore};

    use super::*;
    use crate::group_commit::tests::{batches, leased, start_writer, store};

    /// One claimed session's run: its checkpointer on a writer of its own.
    struct Run {
        _dir: tempfile::TempDir,
        store: Arc<SqliteStore>,
        lease: Lease,
        state: SessionState,
        cp: StoreCheckpointer,
        m: &'static Metrics,
        stop: CancellationToken,
        w: tokio::task::JoinHandle<()>,
    }

    async fn run(draining: CancellationToken) -> Run {
        let (_dir, store) = store().await;
        let (lease, state) = leased(&*store, 1, Duration::from_secs(30)).await.remove(0);
        let (commits, rx) = GroupCommit::channel();
        let (m, stop, w) = start_writer(store.clone(), rx, 16, 1);
        let cp =
            StoreCheckpointer::new(commits, lease.clone(), draining, Duration::from_secs(5), m);
        Run {
            _dir,
            store,
            lease,
            state,
            cp,
            m,
            stop,
            w,
        }
    }

    impl Run {
        /// The store holds the state's whole history.
        async fn assert_history_stored(&self) {
            assert_eq!(
                self.store.messages(&self.lease.session_id).await.unwrap(),
                self.state.messages
            );
        }

        async fn finish(self) {
            self.stop.cancel();
            self.w.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_step_that_changes_nothing_is_not_written_again() {
        let draining = CancellationToken::new();
        let mut r = run(draining.clone()).await;

        // The first step of a run is always written, even with nothing new.
        r.cp.save(&r.state, r.state.messages.len()).await.unwrap();
        assert_eq!(batches(r.m).0, 1);
        let from = r.state.messages.len();
        r.state.messages.push(Message::assistant("hello"));
        r.cp.save(&r.state, from).await.unwrap();
        assert_eq!(batches(r.m).0, 2);

        // Nothing new since: already durable.
        r.cp.save(&r.state, r.state.messages.len()).await.unwrap();
        assert_eq!(batches(r.m).0, 2);

        // A scalar alone is a change.
        r.state.bg_cursor += 1;
        r.cp.save(&r.state, r.state.messages.len()).await.unwrap();
        assert_eq!(batches(r.m).0, 3);
        let stored = r.store.get(&r.lease.session_id).await.unwrap().unwrap();
        assert_eq!(stored.status.as_str(), "running");

        // A skipped step still stops a draining worker's run, as a written one would.
        draining.cancel();
        assert!(matches!(
            r.cp.save(&r.state, r.state.messages.len()).await,
            Err(agentq_agent::Error::Stopped)
        ));
        assert_eq!(batches(r.m).0, 3);

        // The outcome is a change too, and the final step is written even while draining.
        r.state.outcome = Some(Outcome::new(ExitReason::Stop));
        r.cp.save(&r.state, r.state.messages.len()).await.unwrap();
        assert_eq!(batches(r.m).0, 4);
        let stored = r.store.get(&r.lease.session_id).await.unwrap().unwrap();
        assert!(stored.status.is_terminal(), "{:?}", stored.status);
        r.assert_history_stored().await;
        r.finish().await;
    }

    /// A run keeps its last commit's values until its next commit, not the step's
    /// messages: a tool's large output is held once, in the history.
    #[tokio::test]
    async fn what_a_run_keeps_of_its_last_commit_holds_no_message() {
        let mut r = run(CancellationToken::new()).await;
        let from = r.state.messages.len();
        r.state.messages.push(Message::assistant("reading"));
        r.state.messages.push(Message::tool_result(
            "c1",
            "read_file",
            "x".repeat(1 << 20),
            false,
        ));
        r.cp.save(&r.state, from).await.unwrap();
        {
            let last = r.cp.last.lock().unwrap();
            let last = last.as_ref().expect("the commit is kept");
            assert!(last.messages.is_empty(), "{} kept", last.messages.len());
            assert!(last.messages.capacity() == 0);
        }
        assert_eq!(r.cp.committed_len(), Some(r.state.messages.len()));
        r.assert_history_stored().await;
        // What is kept still tells a step with nothing new from one with a message.
        r.cp.save(&r.state, r.state.messages.len()).await.unwrap();
        assert_eq!(batches(r.m).0, 1);
        let from = r.state.messages.len();
        r.state.messages.push(Message::assistant("done"));
        r.cp.save(&r.state, from).await.unwrap();
        assert_eq!(batches(r.m).0, 2);
        assert_eq!(r.cp.committed_len(), Some(r.state.messages.len()));
        r.finish().await;
    }

    #[tokio::test]
    async fn a_state_no_row_can_hold_is_refused_with_what_is_durable() {
        let mut r = run(CancellationToken::new()).await;
        let from = r.state.messages.len();
        r.state.messages.push(Message::assistant("hello"));
        r.state.iteration = u32::MAX;
        let err = r.cp.save(&r.state, from).await.unwrap_err();
        assert!(
            matches!(
                &err,
                agentq_agent::Error::Checkpoint(CheckpointFailure::Refused { durable, .. })
                    if *durable == from
            ),
            "{err:?}"
        );
        assert!(!err.is_retryable());
        assert_eq!(batches(r.m).0, 0);
        r.finish().await;
    }
}
