//! The sessions this worker is running, and what waits for them: entries of a session
//! that arrived while it ran (run afterwards), and wake-ups that came for a session
//! before its run was registered (handed to that run). Heartbeats, the signal listener
//! and the drain find runs here.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentq_core::Lease;
use agentq_core::queue::Delivery;

use crate::inbox;

/// A session this worker is running.
pub(crate) struct Active {
    pub lease: Lease,
    pub entry_id: String,
    /// The user asked to cancel: the run ends `interrupted`.
    pub cancel: CancellationToken,
    /// The lease is gone: drop the run without writing anything.
    pub abort: CancellationToken,
    pub inbox: Arc<inbox::SessionInbox>,
    pub interrupter: Arc<agentq_agent::driver::Interrupter>,
    /// The run returned and its entry is being settled: its lease may be gone by design
    /// (a final checkpoint or a suspension gives it up), so no heartbeat.
    pub settling: Arc<std::sync::atomic::AtomicBool>,
}

/// Whether a delivery may start a run here.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// No run of its session here: start one now.
    Now,
    /// Another entry of a session running or settling here: it waits for that run.
    Deferred,
    /// This very entry is being processed here already.
    Duplicate,
}

/// How long a wake-up for a session not running here is remembered (see
/// [`Runs::register`]).
pub(crate) const MISSED_WAKE_RETENTION: Duration = Duration::from_secs(30);
/// Records are pruned by age once there are this many, at most once a second.
const MISSED_WAKES_PRUNE_AT: usize = 4096;
/// More records than this (a storm of wake-ups) are dropped all at once; runs whose claim
/// came before that then read their inboxes anyway.
const MISSED_WAKES_MAX: usize = 200_000;

/// Wake-ups for sessions that had no run here when they came (see [`Runs::register`]).
pub(crate) struct MissedWakes {
    at: HashMap<String, Instant>,
    pruned_at: Instant,
    cleared_at: Option<Instant>,
}

impl Default for MissedWakes {
    fn default() -> Self {
        MissedWakes {
            at: HashMap::new(),
            pruned_at: Instant::now(),
            cleared_at: None,
        }
    }
}

impl MissedWakes {
    fn note(&mut self, session_id: &str) {
        let now = Instant::now();
        if self.at.len() >= MISSED_WAKES_PRUNE_AT
            && now.duration_since(self.pruned_at) >= Duration::from_secs(1)
        {
            self.at
                .retain(|_, at| now.duration_since(*at) < MISSED_WAKE_RETENTION);
            self.pruned_at = now;
        }
        if self.at.len() >= MISSED_WAKES_MAX {
            self.at.clear();
            self.cleared_at = Some(now);
        }
        self.at.insert(session_id.to_string(), now);
    }

    /// Whether a wake-up for `session_id` may have come since `since`.
    fn take(&mut self, session_id: &str, since: Instant) -> bool {
        let noted = self.at.remove(session_id).is_some();
        // Pruning keeps every record younger than the retention, so a run that registers
        // within half of it after its claim finds any that came meanwhile.
        noted
            || self.cleared_at.is_some_and(|c| c >= since)
            || since.elapsed() >= MISSED_WAKE_RETENTION / 2
    }
}

pub(crate) struct Runs {
    active: Mutex<HashMap<String, Active>>,
    /// Entries of a session that arrived while this worker was still running or settling
    /// it: started once it is done (acking them could lose a wake-up).
    deferred: Mutex<HashMap<String, Vec<Delivery>>>,
    /// Wake-ups for sessions that were not running here when they came: one of them may
    /// be a session between its claim and its registration in `active`, which must not
    /// miss it (see [`Runs::register`]).
    missed_wakes: Mutex<MissedWakes>,
    /// Deferred entries whose session's run has ended, for the run loop to start.
    undeferred: mpsc::UnboundedSender<Delivery>,
    undeferred_rx: Mutex<Option<mpsc::UnboundedReceiver<Delivery>>>,
    /// Sessions with a delivery being handled here, from [`Runs::try_start`] (before its
    /// claim) to [`Runs::end_handling`] (after its settling): one delivery of a session at
    /// a time, since two would each claim it, the second taking the lease from the first
    /// after it had called the model. A session this worker owns in the store but does not
    /// handle was left by a run that could not settle it (see [`crate::heartbeat`]).
    handling: Mutex<HashSet<String>>,
    /// A run ended without settling its session: look for what this worker still owns.
    pub audit_due: std::sync::atomic::AtomicBool,
}

impl Runs {
    pub fn new() -> Self {
        // It only carries entries already held in `deferred` (entries the queue delivered
        // while their session ran here), moved once their run ends; a send must not wait,
        // since it happens while a finished run settles.
        let (undeferred, rx) = mpsc::unbounded_channel();
        Runs {
            active: Mutex::new(HashMap::new()),
            deferred: Mutex::new(HashMap::new()),
            missed_wakes: Mutex::new(MissedWakes::default()),
            undeferred,
            undeferred_rx: Mutex::new(Some(rx)),
            handling: Mutex::new(HashSet::new()),
            audit_due: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, HashMap<String, Active>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn ids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The receiver of entries to start now that their session's run has ended; there is one, for the one run loop.
    pub fn take_undeferred(&self) -> Option<mpsc::UnboundedReceiver<Delivery>> {
        self.undeferred_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The end of the handling [`Runs::try_start`] began: entries of the session that
    /// arrived meanwhile are handed on (those that came during its run were already, when
    /// it finished, and were deferred again until now).
    pub fn end_handling(&self, session_id: &str) {
        // Same lock order as `try_start`: handling, then deferred.
        let mut handling = self.handling.lock().unwrap_or_else(|e| e.into_inner());
        handling.remove(session_id);
        let waiting = self.take_deferred(session_id);
        drop(handling);
        self.hand_on(waiting);
    }

    /// Whether a delivery of `session_id` is being handled here.
    pub fn is_handling(&self, session_id: &str) -> bool {
        self.handling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(session_id)
    }

    fn take_deferred(&self, session_id: &str) -> Vec<Delivery> {
        self.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session_id)
            .unwrap_or_default()
    }

    fn hand_on(&self, waiting: Vec<Delivery>) {
        for d in waiting {
            // Without a run loop (only `Worker::process`) nobody receives them: they stay
            // pending in the queue for the reclaimer.
            let _ = self.undeferred.send(d);
        }
    }

    /// Whether `d` may start a run; a deferred one is kept until its session's run ends.
    /// [`Start::Now`] begins the session's handling here, which the caller ends with
    /// [`Runs::end_handling`] whatever becomes of the delivery.
    pub fn try_start(&self, d: &Delivery) -> Start {
        // Same lock order as `finish` and `end_handling`: active, handling, deferred.
        let active = self.lock();
        if active
            .get(&d.session_id)
            .is_some_and(|a| a.entry_id == d.entry_id)
        {
            return Start::Duplicate;
        }
        let mut handling = self.handling.lock().unwrap_or_else(|e| e.into_inner());
        if handling.insert(d.session_id.clone()) {
            return Start::Now;
        }
        // Another entry of a session this worker is claiming, running or settling: it may
        // be a wake-up that arrived after the run's last look, so run it afterwards.
        self.deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(d.session_id.clone())
            .or_default()
            .push(d.clone());
        Start::Deferred
    }

    /// Make a claimed session's run reachable by signals. Returns whether a wake-up may
    /// have come for it since its claim (`claimed_at`) and before now, when no run of it was
    /// registered to take it: the run must then read its inbox although the claimed row
    /// showed nothing new.
    pub fn register(&self, session_id: &str, run: Active, claimed_at: Instant) -> bool {
        // Same lock order as the listener: active, then missed_wakes; so a wake-up is
        // either seen by the run in `active` or recorded for it here, never neither.
        let mut active = self.lock();
        active.insert(session_id.to_string(), run);
        self.missed_wakes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(session_id, claimed_at)
    }

    /// A wake-up for a session with no run here (called with the `active` lock held).
    pub fn note_missed_wake(&self, session_id: &str) {
        self.missed_wakes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(session_id);
    }

    /// The session's run is settled: forget it, and hand on entries that waited for it.
    pub fn finish(&self, session_id: &str) {
        // Same lock order as `try_start`: active, then deferred.
        let mut active = self.lock();
        active.remove(session_id);
        let waiting = self.take_deferred(session_id);
        drop(active);
        self.hand_on(waiting);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use agentq_core::Store;
    use agentq_core::sqlite::SqliteStore;

    use super::*;

    fn active(store: Arc<dyn Store>, id: &str) -> Active {
        Active {
            lease: Lease {
                session_id: id.into(),
                root_id: id.into(),
                owner: "w".into(),
                epoch: 1,
            },
            entry_id: "0-1".into(),
            cancel: CancellationToken::new(),
            abort: CancellationToken::new(),
            inbox: inbox::SessionInbox::new(
                store,
                id,
                0,
                0,
                0,
                inbox::Approvals {
                    deadline: None,
                    held: Vec::new(),
                    events: Arc::new(agentq_agent::event::NullSink),
                    run_from: 1,
                },
            ),
            interrupter: agentq_agent::driver::Interrupter::new(),
            settling: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// A wake-up noted between a session's claim and its run's registration is handed to
    /// that run, once; a run with none noted starts clean; one that registers long after
    /// its claim assumes the worst.
    #[tokio::test]
    async fn a_wake_before_registration_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("a.db")).await.unwrap());
        let runs = Runs::new();

        let claimed = Instant::now();
        runs.note_missed_wake("early");
        assert!(runs.register("early", active(store.clone(), "early"), claimed));
        // Taken: a second run of it starts clean.
        runs.finish("early");
        assert!(!runs.register("early", active(store.clone(), "early"), Instant::now()));

        assert!(!runs.register("quiet", active(store.clone(), "quiet"), Instant::now()));

        // A registration long after its claim cannot trust that records were kept.
        let long_ago = Instant::now() - MISSED_WAKE_RETENTION;
        assert!(runs.register("slow", active(store.clone(), "slow"), long_ago));
    }

    /// Entry `entry` of session `s` on the default queue.
    fn delivery_of_s(entry: &str, reason: agentq_core::EnqueueReason) -> Delivery {
        Delivery {
            queue: "default".into(),
            entry_id: entry.into(),
            session_id: "s".into(),
            reason,
        }
    }

    /// An entry of a session running here waits for that run and is handed on when it
    /// ends; the same entry again is a duplicate, not queued twice.
    #[tokio::test]
    async fn entries_of_a_running_session_wait_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("a.db")).await.unwrap());
        let runs = Runs::new();
        let mut rx = runs.take_undeferred().unwrap();
        assert!(runs.take_undeferred().is_none());
        let delivery = |entry: &str| delivery_of_s(entry, agentq_core::EnqueueReason::New);
        assert_eq!(runs.try_start(&delivery("0-1")), Start::Now);
        runs.register("s", active(store, "s"), Instant::now());
        assert_eq!(runs.try_start(&delivery("0-1")), Start::Duplicate);
        assert_eq!(runs.try_start(&delivery("0-2")), Start::Deferred);
        assert!(rx.try_recv().is_err());
        runs.finish("s");
        assert_eq!(rx.try_recv().unwrap().entry_id, "0-2");
        // Handed on while the first delivery's handling still settles: it waits for that.
        assert_eq!(runs.try_start(&delivery("0-2")), Start::Deferred);
        runs.end_handling("s");
        assert_eq!(rx.try_recv().unwrap().entry_id, "0-2");
        assert_eq!(runs.try_start(&delivery("0-2")), Start::Now);
    }

    /// Two entries of one session delivered together (two passes re-queued it): the second
    /// waits while the first claims, instead of claiming too and taking the lease from the
    /// run the first starts; it is handed on when the first's handling ends, whatever its
    /// outcome (here none registered: the claim found the session busy or done).
    #[test]
    fn a_second_entry_waits_while_the_first_is_claimed() {
        let runs = Runs::new();
        let mut rx = runs.take_undeferred().unwrap();
        let delivery = |entry: &str| delivery_of_s(entry, agentq_core::EnqueueReason::Retry);
        assert_eq!(runs.try_start(&delivery("0-1")), Start::Now);
        assert!(runs.is_handling("s"));
        assert_eq!(runs.try_start(&delivery("0-2")), Start::Deferred);
        assert_eq!(runs.try_start(&delivery("0-1")), Start::Deferred);
        assert!(rx.try_recv().is_err());
        runs.end_handling("s");
        assert!(!runs.is_handling("s"));
        let handed: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|d| d.entry_id)
            .collect();
        assert_eq!(handed, vec!["0-2", "0-1"]);
        assert_eq!(runs.try_start(&delivery("0-2")), Start::Now);
    }

    #[test]
    fn missed_wakes_are_pruned_by_age_and_bounded() {
        let long_ago = Instant::now() - MISSED_WAKE_RETENTION;
        let mut m = MissedWakes::default();
        for i in 0..MISSED_WAKES_PRUNE_AT {
            m.at.insert(format!("old{i}"), long_ago);
        }
        // Pruned at most once a second.
        m.note("young");
        assert_eq!(m.at.len(), MISSED_WAKES_PRUNE_AT + 1);
        m.pruned_at = long_ago;
        m.note("fresh");
        assert_eq!(
            m.at.len(),
            2,
            "only the records younger than the retention stay"
        );

        // A storm of recent ones: dropped all at once, and runs claimed before then
        // cannot trust the absence of a record.
        let claimed = Instant::now();
        for i in 0..MISSED_WAKES_MAX {
            m.at.insert(format!("storm{i}"), Instant::now());
        }
        m.note("last");
        assert_eq!(m.at.len(), 1);
        assert!(m.take("unrelated", claimed));
        assert!(!m.take("unrelated", Instant::now()));
        assert!(m.take("last", Instant::now()));
    }
}
