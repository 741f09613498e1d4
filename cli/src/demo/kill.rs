//! The demo's workers and the kill: each [`DemoWorker`] runs on a runtime of its own so
//! that killing it drops its tasks where they stand, as SIGKILL would; which worker to
//! kill; and how many of the sessions it left another worker has taken over.

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use agentq_core::{SessionStatus, Store};
use agentq_worker::Worker;

/// How long the demo's workers drain at a shutdown; the killed worker's sessions are
/// waited for past it.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the kill waits for a worker with sessions midway before taking any.
const KILL_PATIENCE: Duration = Duration::from_secs(3);

/// One demo worker: a [`Worker`] running on a runtime of its own, in a thread of its own,
/// so that it can be killed (see the module docs).
pub(super) struct DemoWorker {
    pub(super) name: String,
    pub(super) worker: Worker,
    stop: CancellationToken,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    pub(super) thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    pub(super) killed: bool,
}

impl DemoWorker {
    pub(super) fn start(
        name: String,
        worker: Worker,
        stop: CancellationToken,
    ) -> anyhow::Result<Self> {
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let (w, s) = (worker.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start a runtime: {e}"))?;
                let result = rt.block_on(async move {
                    tokio::select! {
                        r = w.run(s) => r.map(|_| ()).map_err(|e| e.to_string()),
                        // A dropped sender is not a kill: only `send` is.
                        Ok(()) = killed => Ok(()),
                    }
                });
                // After a kill this drops the worker's tasks where they stand; after a
                // graceful stop there are none left. Blocking tasks (file I/O) are not
                // waited for, as a killed process would not wait for them.
                rt.shutdown_background();
                result
            })
            .context("cannot start a worker thread")?;
        Ok(DemoWorker {
            name,
            worker,
            stop,
            kill: Some(kill),
            thread: Some(thread),
            killed: false,
        })
    }

    pub(super) fn running(&self) -> usize {
        if self.killed {
            0
        } else {
            self.worker.active_sessions().len()
        }
    }

    pub(super) fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        self.killed = true;
    }

    /// Graceful stop (drain), bounded; the thread is joined off the async runtime.
    pub(super) async fn stop(&mut self) -> Result<(), String> {
        self.stop.cancel();
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let joined = tokio::time::timeout(
            DRAIN_TIMEOUT + Duration::from_secs(20),
            tokio::task::spawn_blocking(move || thread.join()),
        )
        .await;
        match joined {
            Ok(Ok(Ok(r))) => r,
            Ok(Ok(Err(_))) => Err(format!("{} panicked", self.name)),
            Ok(Err(e)) => Err(format!("{}: {e}", self.name)),
            Err(_) => Err(format!("{} did not stop in time", self.name)),
        }
    }
}

/// The worker to kill, once it is worth it: the one with the most sessions past their
/// first step, as soon as one of them is midway (two steps checkpointed) — so the kill
/// interrupts sessions with history to resume rather than sessions that just started.
/// Past [`KILL_PATIENCE`] after the kill point, any worker that runs something will do.
pub(super) async fn pick_victim(
    store: &dyn Store,
    workers: &[DemoWorker],
    since: Instant,
) -> Option<usize> {
    let mut best: Option<(usize, usize, u32)> = None; // (worker, progressed, max iteration)
    for (i, w) in workers.iter().enumerate().filter(|(_, w)| !w.killed) {
        let (mut progressed, mut max_iter) = (0, 0);
        for id in w.worker.active_sessions() {
            // A session that just checkpointed its end is no longer running: skip it.
            if let Ok(Some(row)) = store.get(&id).await
                && row.status == SessionStatus::Running
            {
                if row.iteration >= 1 {
                    progressed += 1;
                }
                max_iter = max_iter.max(row.iteration);
            }
        }
        if w.running() > 0 && best.is_none_or(|(_, p, _)| progressed > p) {
            best = Some((i, progressed, max_iter));
        }
    }
    let (i, _, max_iter) = best?;
    (max_iter >= 2 || since.elapsed() >= KILL_PATIENCE).then_some(i)
}

/// Of the sessions the kill interrupted (with their lease epoch then), how many another
/// worker has claimed since.
pub(super) async fn taken_over(store: &dyn Store, interrupted: &[(String, i64)]) -> u64 {
    let mut n = 0;
    for (id, epoch) in interrupted {
        if let Ok(Some(row)) = store.get(id).await
            && row.lease_epoch > *epoch
        {
            n += 1;
        }
    }
    n
}
