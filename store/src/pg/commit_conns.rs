//! The group commit's own connections, held outside any pool.
//!
//! A pooled connection is pinged each time it goes back to its pool (sqlx's release
//! check: a `Sync` and its answer), so every commit cost a second round trip, a task and
//! a backend's wake-up beside the commit itself. For the statement every session in flight
//! waits on, that was a tenth of one session's time per step. These connections are
//! taken and given back by the commit alone; a connection whose statement failed, or
//! whose commit was dropped part-way, is closed instead of given back, which is all the
//! release check established. One idle long enough to have outlived a database restart
//! is pinged before use, as the pools do.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Executor};

use crate::error::Result;

use super::{KEYED_PLANS, PING_IF_IDLE_FOR};

/// How long opening a connection may take: as long as an acquire from the pools may
/// wait, so that an outage is the same retryable error here.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection put down after a commit, and since when.
struct Idle {
    conn: PgConnection,
    since: Instant,
}

/// The idle commit connections of one store, at most `keep` of them (the commits a worker
/// runs at once); a commit beyond them opens a connection of its own and closes it after.
pub(super) struct CommitConnections {
    options: Arc<PgConnectOptions>,
    keep: usize,
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for CommitConnections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitConnections")
            .field("keep", &self.keep)
            .field("idle", &self.idle().len())
            .finish()
    }
}

impl CommitConnections {
    pub(super) fn new(options: Arc<PgConnectOptions>, keep: usize) -> Self {
        Self {
            options,
            keep: keep.max(1),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Idle>> {
        // A panic while the lock is held leaves a plain vector behind: nothing to repair.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A live connection: the most recently used idle one (a ping first if it sat idle
    /// long), else a new one with keyed plans.
    pub(super) async fn take(&self) -> Result<PgConnection> {
        loop {
            let Some(Idle { mut conn, since }) = self.idle().pop() else {
                break;
            };
            if since.elapsed() < PING_IF_IDLE_FOR || conn.ping().await.is_ok() {
                return Ok(conn);
            }
            // Dead (a restart, a terminated backend): the next one, or a new one.
        }
        self.open().await
    }

    /// Open every connection kept, so that the first commits after a start do not wait
    /// for one.
    pub(super) async fn fill(&self) -> Result<()> {
        let opened = futures::future::try_join_all((0..self.keep).map(|_| self.open())).await?;
        for conn in opened {
            self.give_back(conn);
        }
        Ok(())
    }

    async fn open(&self) -> Result<PgConnection> {
        let open = async {
            let mut conn = PgConnection::connect_with(&self.options).await?;
            conn.execute(KEYED_PLANS).await?;
            Ok::<_, sqlx::Error>(conn)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, open).await {
            Ok(conn) => Ok(conn?),
            Err(_) => Err(sqlx::Error::PoolTimedOut.into()),
        }
    }

    /// Put down a connection whose statement succeeded; one beyond `keep` is closed.
    pub(super) fn give_back(&self, conn: PgConnection) {
        let extra = {
            let mut idle = self.idle();
            if idle.len() < self.keep {
                idle.push(Idle {
                    conn,
                    since: Instant::now(),
                });
                None
            } else {
                Some(conn)
            }
        };
        if let Some(conn) = extra {
            close_soon(conn);
        }
    }

    /// Close the idle connections (a store shutting down). A commit still running keeps
    /// its connection until it ends, and then closes it or puts it down as usual.
    pub(super) async fn close(&self) {
        let idle = std::mem::take(&mut *self.idle());
        for i in idle {
            let _ = i.conn.close().await;
        }
    }

    /// How many connections are idle (tests).
    #[cfg(test)]
    pub(super) fn idle_count(&self) -> usize {
        self.idle().len()
    }

    /// Put down a connection as if idle since `since` (tests).
    #[cfg(test)]
    pub(super) fn put_idle_since(&self, conn: PgConnection, since: Instant) {
        self.idle().push(Idle { conn, since });
    }
}

/// Close a connection without waiting for it, saying goodbye to the server, where a
/// runtime is there to do it; else it is dropped (the socket closes all the same).
fn close_soon(conn: PgConnection) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = conn.close().await;
        });
    }
}
