//! Marks of finished sessions announced, from this process, taken together: each is one
//! deletion from `unannounced` and, alone, one commit. Sessions end in bursts (a worker's
//! group commit finishes many at once), so the marks that arrive while one round of them
//! is in flight go together in the next round: one statement and one commit for all.
//! A mark that finds nothing in flight goes at once.
//!
//! The rounds run on a task of their own, so a caller that gives up waiting never leaves
//! the others behind a round nobody runs.

use std::sync::{Arc, Mutex};

use sqlx::postgres::PgPool;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

const MARK_MANY: &str = "DELETE FROM unannounced WHERE id = ANY($1)";

type Waiter = (String, oneshot::Sender<Result<()>>);

/// The marks waiting for the next round; `None` while no round is in flight.
#[derive(Default)]
pub(crate) struct AnnounceRounds {
    waiting: Mutex<Option<Vec<Waiter>>>,
}

impl std::fmt::Debug for AnnounceRounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnnounceRounds").finish_non_exhaustive()
    }
}

impl AnnounceRounds {
    /// Mark `id` announced, in the next round.
    pub(crate) async fn mark(self: &Arc<Self>, pool: &PgPool, id: &str) -> Result<()> {
        let (done, answer) = oneshot::channel();
        let start = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            match waiting.as_mut() {
                Some(marks) => {
                    marks.push((id.to_string(), done));
                    false
                }
                None => {
                    *waiting = Some(vec![(id.to_string(), done)]);
                    true
                }
            }
        };
        if start {
            let (rounds, pool) = (self.clone(), pool.clone());
            tokio::spawn(async move { rounds.run(&pool).await });
        }
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// Rounds until nothing waits: each takes every mark queued since the last.
    async fn run(&self, pool: &PgPool) {
        loop {
            let marks = {
                let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
                match waiting.as_mut() {
                    Some(marks) if !marks.is_empty() => std::mem::take(marks),
                    _ => {
                        *waiting = None;
                        return;
                    }
                }
            };
            let ids: Vec<&str> = marks.iter().map(|(id, _)| id.as_str()).collect();
            let result = sqlx::query(MARK_MANY).bind(&ids).execute(pool).await;
            match result {
                Ok(_) => {
                    for (_, done) in marks {
                        let _ = done.send(Ok(()));
                    }
                }
                Err(e) => {
                    let e = Arc::new(Error::from(e));
                    for (_, done) in marks {
                        let _ = done.send(Err(Error::Shared(e.clone())));
                    }
                }
            }
        }
    }
}
