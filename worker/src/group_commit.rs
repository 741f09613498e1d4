//! Group commit: the checkpoints of all the sessions a worker runs go through one writer,
//! which commits whatever is ready together — one statement, one durable commit — and
//! acknowledges each session's step only once that commit is. A durable commit per
//! checkpoint would make the store's commit rate, not the sessions, bound a worker. A
//! lone checkpoint goes out at once (nothing waits to fill a batch); under load the next
//! batch gathers while the previous ones commit, so the commit rate, not the session
//! count, bounds the store's work. A checkpoint that finds nothing queued and a commit
//! slot free is committed by its session's own task in that slot: the writer would have
//! sent it alone all the same, one wake-up of another thread later.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use agentq_core::metrics::Metrics;
use agentq_core::{Checkpoint, Committed, Error, Store};

use crate::in_parts::in_parts;

pub(crate) struct Job {
    cp: Arc<Checkpoint>,
    reply: oneshot::Sender<agentq_core::Result<Committed>>,
}

/// The writer's side of the channel.
pub(crate) struct JobReceiver {
    rx: mpsc::UnboundedReceiver<Job>,
    shared: Arc<Shared>,
}

/// What the sessions and the writer share: the jobs queued and not yet taken, and, once
/// the writer runs, what a session needs to commit in one of its slots.
#[derive(Default)]
struct Shared {
    queued: AtomicUsize,
    direct: OnceLock<Direct>,
}

struct Direct {
    store: Arc<dyn Store>,
    slots: Arc<Semaphore>,
    metrics: &'static Metrics,
    stop: CancellationToken,
}

/// The sessions' side: hand a checkpoint to the writer and wait for its commit.
#[derive(Clone)]
pub struct GroupCommit {
    tx: mpsc::UnboundedSender<Job>,
    shared: Arc<Shared>,
}

impl GroupCommit {
    pub(crate) fn channel() -> (GroupCommit, JobReceiver) {
        // Bounded by construction: a session hands over one checkpoint and waits for its
        // commit before its next, so the queue never holds more than the worker's
        // concurrency. A bounded channel would only add a semaphore to every commit.
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        (
            GroupCommit {
                tx,
                shared: shared.clone(),
            },
            JobReceiver { rx, shared },
        )
    }

    /// `Ok` once the checkpoint is durable (with the finished row, for a final checkpoint
    /// on a store that returns it); the store's verdict on it otherwise.
    /// `Error::Stopped` when the worker has stopped its writer (hard shutdown).
    pub async fn commit(&self, cp: Arc<Checkpoint>) -> agentq_core::Result<Committed> {
        let (reply, rx) = oneshot::channel();
        let job = Job { cp, reply };
        if let Some(d) = self.shared.direct.get()
            && self.shared.queued.load(Ordering::Acquire) == 0
            && !d.stop.is_cancelled()
            && let Ok(slot) = d.slots.clone().try_acquire_owned()
        {
            commit(&*d.store, vec![job], d.metrics).await;
            drop(slot);
        } else {
            self.shared.queued.fetch_add(1, Ordering::AcqRel);
            if self.tx.send(job).is_err() {
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                return Err(Error::Stopped);
            }
        }
        rx.await.unwrap_or(Err(Error::Stopped))
    }
}

impl JobReceiver {
    async fn recv(&mut self) -> Option<Job> {
        let job = self.rx.recv().await;
        self.took(job)
    }

    fn try_recv(&mut self) -> Option<Job> {
        let job = self.rx.try_recv().ok();
        self.took(job)
    }

    fn took(&self, job: Option<Job>) -> Option<Job> {
        if job.is_some() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        job
    }
}

/// Limits of the writer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most checkpoints in one commit.
    pub max_batch: usize,
    /// Commits in flight at once (each on its own connection).
    pub in_flight: usize,
}

/// The writer: runs until `stop`, or until every `GroupCommit` is gone; then lets the
/// commits in flight finish (their sessions wait on them) and returns. Jobs still queued
/// at `stop` are answered `Error::Stopped`.
pub(crate) async fn writer(
    store: Arc<dyn Store>,
    mut rx: JobReceiver,
    limits: Limits,
    metrics: &'static Metrics,
    stop: CancellationToken,
) {
    let in_flight = limits.in_flight.max(1);
    let slots = Arc::new(Semaphore::new(in_flight));
    let _ = rx.shared.direct.set(Direct {
        store: store.clone(),
        slots: slots.clone(),
        metrics,
        stop: stop.clone(),
    });
    let max_batch = limits.max_batch.max(1);
    let mut commits = JoinSet::new();
    // A second checkpoint of a session already in the batch being built waits for the
    // next one: a batch holds at most one per session (the store's contract).
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(j) => j,
            None => tokio::select! {
                j = rx.recv() => match j { Some(j) => j, None => break },
                _ = stop.cancelled() => break,
            },
        };
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.cancelled() => {
                let _ = first.reply.send(Err(Error::Stopped));
                break;
            }
        };
        // Everything that arrived while a slot was busy goes in this commit.
        let mut batch = vec![first];
        let mut sessions: HashSet<String> = HashSet::new();
        sessions.insert(batch[0].cp.lease.session_id.clone());
        while batch.len() < max_batch {
            match rx.try_recv() {
                Some(j) if sessions.insert(j.cp.lease.session_id.clone()) => batch.push(j),
                Some(j) => {
                    carried = Some(j);
                    break;
                }
                None => break,
            }
        }
        let store = store.clone();
        commits.spawn(async move {
            commit(&*store, batch, metrics).await;
            drop(permit);
        });
        while commits.try_join_next().is_some() {}
    }
    rx.rx.close();
    if let Some(j) = carried {
        let _ = j.reply.send(Err(Error::Stopped));
    }
    while let Some(j) = rx.try_recv() {
        let _ = j.reply.send(Err(Error::Stopped));
    }
    while commits.join_next().await.is_some() {}
    // And the sessions' own commits in flight: every slot back.
    let _ = slots
        .acquire_many(u32::try_from(in_flight).unwrap_or(u32::MAX))
        .await;
}

async fn commit(store: &dyn Store, batch: Vec<Job>, metrics: &'static Metrics) {
    metrics.checkpoint_batch_size.observe(batch.len() as f64);
    in_parts(
        batch,
        "group commit",
        |job| job.cp.clone(),
        |cps| async move {
            let refs: Vec<&Checkpoint> = cps.iter().map(|c| &**c).collect();
            store.checkpoint_batch(&refs).await
        },
        |job, r| {
            // Its checkpoint let go of first: the session, woken by the answer, then
            // mostly holds the only one, and keeps what it needs of it without a copy.
            let Job { cp, reply } = job;
            drop(cp);
            let _ = reply.send(r);
        },
    )
    .await;
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use agentq_agent::schema::Message;
    use agentq_agent::spec::SessionSpec;
    use agentq_agent::state::SessionState;
    use agentq_core::sqlite::SqliteStore;
    use agentq_core::{Claim, Lease, LeaseStore, NewSession, SessionStore};

    use super::*;

    pub(crate) async fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("agentq.db"))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        (dir, Arc::new(store))
    }

    pub(crate) async fn leased(
        store: &dyn Store,
        n: usize,
        ttl: Duration,
    ) -> Vec<(Lease, SessionState)> {
        let mut out = Vec::new();
        for i in 0..n {
            let new = NewSession::root(SessionSpec::new(format!("s{i}")), "default");
            let (row, _) = store.create_session(&new).await.unwrap();
            match store.claim(&row.id, "w", ttl, 10).await.unwrap() {
                Claim::Acquired { lease, state, .. } => out.push((lease, *state)),
                other => panic!("{other:?}"),
            }
        }
        out
    }

    fn step(lease: &Lease, state: &mut SessionState, text: &str) -> Arc<Checkpoint> {
        let from = state.messages.len();
        state.messages.push(Message::assistant(text));
        Arc::new(Checkpoint::new(lease, state, from).unwrap())
    }

    fn metrics() -> &'static Metrics {
        Box::leak(Box::new(Metrics::new()))
    }

    /// Batch sizes the writer committed: (commits, checkpoints).
    pub(crate) fn batches(m: &Metrics) -> (u64, f64) {
        let h = &m.checkpoint_batch_size;
        (h.get_sample_count(), h.get_sample_sum())
    }

    /// A writer on `store` with these limits: its metrics, its stop token, its task.
    pub(crate) fn start_writer(
        store: Arc<dyn Store>,
        rx: JobReceiver,
        max_batch: usize,
        in_flight: usize,
    ) -> (
        &'static Metrics,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let m = metrics();
        let stop = CancellationToken::new();
        let limits = Limits {
            max_batch,
            in_flight,
        };
        let w = tokio::spawn(writer(store, rx, limits, m, stop.clone()));
        (m, stop, w)
    }

    /// Every session hands a step to the writer-to-be; returns the waiting commits.
    async fn hand_over(
        commits: &GroupCommit,
        sessions: &mut [(Lease, SessionState)],
        text: &str,
    ) -> Vec<tokio::task::JoinHandle<agentq_core::Result<Committed>>> {
        let mut waiting = Vec::new();
        for (lease, state) in sessions.iter_mut() {
            let (c, cp) = (commits.clone(), step(lease, state, text));
            waiting.push(tokio::spawn(async move { c.commit(cp).await }));
        }
        // Let every session hand its checkpoint over before the writer starts.
        tokio::time::sleep(Duration::from_millis(50)).await;
        waiting
    }

    #[tokio::test]
    async fn what_waits_is_committed_together_and_each_answered() {
        let (_dir, store) = store().await;
        let mut sessions = leased(&*store, 50, Duration::from_secs(30)).await;
        let (commits, rx) = GroupCommit::channel();
        let waiting = hand_over(&commits, &mut sessions, "one").await;
        let (m, stop, w) = start_writer(store.clone(), rx, 16, 1);
        for t in waiting {
            t.await.unwrap().unwrap();
        }
        // 50 waiting checkpoints, at most 16 a commit: 4 commits.
        assert_eq!(batches(m), (4, 50.0));
        for (lease, state) in &sessions {
            assert_eq!(
                store.messages(&lease.session_id).await.unwrap(),
                state.messages
            );
        }

        // A lone checkpoint does not wait for company.
        let (lease, state) = &mut sessions[0];
        commits.commit(step(lease, state, "two")).await.unwrap();
        assert_eq!(batches(m), (5, 51.0));
        stop.cancel();
        w.await.unwrap();
        // After the writer stopped, nothing more is taken.
        let (lease, state) = &mut sessions[1];
        assert!(matches!(
            commits.commit(step(lease, state, "late")).await,
            Err(Error::Stopped)
        ));
    }

    #[tokio::test]
    async fn a_lost_lease_fails_alone() {
        let (_dir, store) = store().await;
        let mut sessions = leased(&*store, 3, Duration::from_millis(100)).await;
        // The second session's lease expires and another worker takes it.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let stolen = sessions[1].0.session_id.clone();
        assert!(matches!(
            store
                .claim(&stolen, "w2", Duration::from_secs(30), 10)
                .await
                .unwrap(),
            Claim::Acquired { .. }
        ));
        let (commits, rx) = GroupCommit::channel();
        let waiting = hand_over(&commits, &mut sessions, "step").await;
        let (m, _stop, w) = start_writer(store.clone(), rx, 256, 2);
        let mut out = Vec::new();
        for t in waiting {
            out.push(t.await.unwrap());
        }
        assert_eq!(batches(m), (1, 3.0));
        assert!(out[0].is_ok() && out[2].is_ok(), "{out:?}");
        assert!(matches!(&out[1], Err(Error::LeaseLost(s)) if *s == stolen));
        assert_eq!(store.messages(&stolen).await.unwrap().len(), 1);
        assert_eq!(
            store.messages(&sessions[2].0.session_id).await.unwrap(),
            sessions[2].1.messages
        );
        drop(commits);
        // Every sender gone: the writer ends on its own.
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap()
            .unwrap();
    }

    /// A store on a fresh migrated database of the shared Postgres.
    async fn postgres() -> agentq_core::pg::PgStore {
        let url =
            agentq_testkit::migrated_database(agentq_testkit::shared_postgres().unwrap()).unwrap();
        let pg = agentq_core::pg::PgStore::connect(&url, 4).await.unwrap();
        pg.migrate().await.unwrap();
        pg
    }

    /// One checkpoint the database refuses (a raw NUL in a text column, as before the
    /// stores escaped it) among bystanders, all in one group commit on real Postgres:
    /// every bystander is committed in that round, only the poisoned one fails, with a
    /// data error, which is not retried.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_checkpoint_fails_alone_on_postgres() {
        let store: Arc<dyn Store> = Arc::new(postgres().await);
        let mut sessions = leased(&*store, 9, Duration::from_secs(30)).await;
        let (commits, rx) = GroupCommit::channel();
        let mut waiting = Vec::new();
        for (i, (lease, state)) in sessions.iter_mut().enumerate() {
            let mut cp = (*step(lease, state, "step")).clone();
            if i == 4 {
                cp.finish = Some(agentq_core::checkpoint::Finish {
                    status: agentq_core::SessionStatus::Failed,
                    reason: agentq_agent::spec::ExitReason::Error,
                    result: None,
                    error: Some("poison \0".into()),
                });
            }
            let c = commits.clone();
            waiting.push(tokio::spawn(async move { c.commit(Arc::new(cp)).await }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (m, stop, w) = start_writer(store.clone(), rx, 64, 1);
        let mut out = Vec::new();
        for t in waiting {
            out.push(t.await.unwrap());
        }
        // One group commit took them all.
        assert_eq!(batches(m), (1, 9.0));
        for (i, (r, (lease, state))) in out.iter().zip(&sessions).enumerate() {
            let stored = store.messages(&lease.session_id).await.unwrap();
            if i == 4 {
                let e = r.as_ref().unwrap_err();
                assert!(e.is_data() && !e.is_retryable(), "{e:?}");
                assert_eq!(stored.len(), 1, "the refused step wrote nothing");
            } else {
                assert!(r.is_ok(), "bystander {i}: {r:?}");
                assert_eq!(stored, state.messages, "bystander {i}");
            }
        }
        stop.cancel();
        w.await.unwrap();
    }

    /// With the writer idle, a session commits in the writer's free slot itself; a
    /// checkpoint that comes meanwhile waits for that slot, and a stop waits for the
    /// session's commit to end (real Postgres; a row lock holds the commit in flight).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_in_a_free_slot_holds_it_and_a_stop_waits_for_it() {
        let pg = postgres().await;
        let pool = pg.pool().clone();
        let store: Arc<dyn Store> = Arc::new(pg);
        let mut sessions = leased(&*store, 2, Duration::from_secs(30)).await;
        let (commits, rx) = GroupCommit::channel();
        let (_, stop, w) = start_writer(store.clone(), rx, 16, 1);
        while commits.shared.direct.get().is_none() {
            tokio::task::yield_now().await;
        }
        let mut blocker = pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
            .bind(&sessions[0].0.session_id)
            .execute(&mut *blocker)
            .await
            .unwrap();
        let (lease, state) = &mut sessions[0];
        let (c, cp) = (commits.clone(), step(lease, state, "first"));
        let first = tokio::spawn(async move { c.commit(cp).await });
        // The first commit waits on the row, in the writer's one slot.
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND datname = current_database()",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting == 1 {
                break;
            }
        }
        assert_eq!(
            commits
                .shared
                .direct
                .get()
                .unwrap()
                .slots
                .available_permits(),
            0
        );
        let (lease, state) = &mut sessions[1];
        let (c, cp) = (commits.clone(), step(lease, state, "second"));
        let second = tokio::spawn(async move { c.commit(cp).await });
        // The second is queued behind the slot; the stop answers it and then waits.
        stop.cancel();
        assert!(matches!(second.await.unwrap(), Err(Error::Stopped)));
        assert!(
            !w.is_finished(),
            "the writer waits for the session's commit"
        );
        blocker.rollback().await.unwrap();
        first.await.unwrap().unwrap();
        w.await.unwrap();
        assert_eq!(
            store.messages(&sessions[0].0.session_id).await.unwrap(),
            sessions[0].1.messages
        );
        assert_eq!(
            store
                .messages(&sessions[1].0.session_id)
                .await
                .unwrap()
                .len(),
            1
        );
    }
}
