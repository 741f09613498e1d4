//! Group claim: the claims of a worker's deliveries go to the store together. A claim is
//! a durable write of one session row (a new row version and an entry in several
//! indexes), and a worker that starts many sessions at once (its first read of a full
//! queue, a batch's sessions arriving together) made as many concurrent statements, each
//! with its own commit and all of them waiting on the same few pages of `sessions`. Here
//! a claim that finds a slot free goes at once, alone (nothing waits to fill a batch);
//! the claims that arrive while every slot is busy go in the next statement together.
//!
//! There is no task of its own to start or stop: the caller that takes a free slot takes
//! the claims waiting with it and hands them to a task spawned for that one statement, so
//! that a caller dropped mid-way cannot cancel a claim another caller waits on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use agentq_core::metrics::Metrics;
use agentq_core::{Claim, Error, Store};

use crate::in_parts::in_parts;

/// Claim statements in flight at once (each on its own connection of the store's pool).
const IN_FLIGHT: usize = 2;

/// Most claims in one statement.
const MAX_BATCH: usize = 128;

struct Job {
    id: String,
    reply: oneshot::Sender<agentq_core::Result<Claim>>,
}

/// What every claim of this worker asks for: its owner name, the lease's length and the
/// most claims a session gets without finishing.
#[derive(Debug, Clone)]
pub(crate) struct ClaimTerms {
    pub owner: String,
    pub ttl: Duration,
    pub max_attempts: u32,
}

/// What takes a statement's claims: the store ([`agentq_core::LeaseStore::claim_batch`]).
#[async_trait]
pub(crate) trait Claimer: Send + Sync + 'static {
    async fn claim_batch(
        &self,
        ids: &[&str],
        terms: &ClaimTerms,
    ) -> agentq_core::Result<Vec<agentq_core::Result<Claim>>>;
}

#[async_trait]
impl Claimer for dyn Store {
    async fn claim_batch(
        &self,
        ids: &[&str],
        terms: &ClaimTerms,
    ) -> agentq_core::Result<Vec<agentq_core::Result<Claim>>> {
        agentq_core::LeaseStore::claim_batch(self, ids, &terms.owner, terms.ttl, terms.max_attempts)
            .await
    }
}

/// A worker's claims, batched.
pub(crate) struct GroupClaim {
    terms: ClaimTerms,
    metrics: &'static Metrics,
    waiting: Mutex<Vec<Job>>,
    slots: Arc<Semaphore>,
}

impl GroupClaim {
    pub(crate) fn new(terms: ClaimTerms, metrics: &'static Metrics) -> Self {
        GroupClaim {
            terms,
            metrics,
            waiting: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
        }
    }

    /// [`agentq_core::LeaseStore::claim`] of `id` on these terms, in whichever statement
    /// takes it. `Error::Stopped` if that statement's task was dropped unanswered (the
    /// runtime is shutting down).
    pub(crate) async fn claim<C: Claimer + ?Sized>(
        &self,
        store: &Arc<C>,
        id: &str,
    ) -> agentq_core::Result<Claim> {
        let (reply, mut answer) = oneshot::channel();
        self.lock().push(Job {
            id: id.to_owned(),
            reply,
        });
        loop {
            let slot = tokio::select! {
                biased;
                a = &mut answer => return a.unwrap_or(Err(Error::Stopped)),
                s = self.slots.clone().acquire_owned() => s,
            };
            let Ok(slot) = slot else {
                return Err(Error::Stopped);
            };
            let batch: Vec<Job> = {
                let mut waiting = self.lock();
                let n = waiting.len().min(MAX_BATCH);
                waiting.drain(..n).collect()
            };
            if batch.is_empty() {
                // Ours went in a statement another caller started.
                drop(slot);
                return answer.await.unwrap_or(Err(Error::Stopped));
            }
            let terms = self.terms.clone();
            tokio::spawn(run(store.clone(), terms, batch, self.metrics, slot));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Job>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One statement's claims, each answered; the slot is free again once they are. A
/// statement refused for a value is split ([`in_parts`]), so that one hostile or broken
/// entry fails only its own claim, as it would alone, and never holds back the claims it
/// came with. A half that committed before failing is claimed again by the same owner,
/// which takes its own lease again.
async fn run<C: Claimer + ?Sized>(
    store: Arc<C>,
    terms: ClaimTerms,
    batch: Vec<Job>,
    metrics: &'static Metrics,
    _slot: OwnedSemaphorePermit,
) {
    in_parts(
        batch,
        "group claim",
        |job| job.id.clone(),
        |ids| {
            let (store, terms) = (&store, &terms);
            async move {
                metrics.claim_batch_size.observe(ids.len() as f64);
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                store.claim_batch(&ids, terms).await
            }
        },
        |job, a| {
            let _ = job.reply.send(a);
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicBool, Ordering};

    use agentq_core::SessionStatus;

    use super::*;

    /// Records each statement's ids and holds it until the test lets one through; answers
    /// `NotRunnable(Waiting)` for ids starting with `w`, `NotFound` for the rest; fails
    /// the whole statement when `fail` is set (an outage), or when it holds an id starting
    /// with `poison` (a value the store refuses).
    struct Gated {
        batches: Mutex<Vec<Vec<String>>>,
        gate: Semaphore,
        fail: AtomicBool,
    }

    #[async_trait]
    impl Claimer for Gated {
        async fn claim_batch(
            &self,
            ids: &[&str],
            _terms: &ClaimTerms,
        ) -> agentq_core::Result<Vec<agentq_core::Result<Claim>>> {
            self.batches
                .lock()
                .unwrap()
                .push(ids.iter().map(|s| s.to_string()).collect());
            self.gate.acquire().await.unwrap().forget();
            if ids.iter().any(|id| id.starts_with("poison")) {
                return Err(Error::Conflict("a value the store refuses".into()));
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(Error::Pool("the statement failed".into()));
            }
            Ok(ids
                .iter()
                .map(|id| {
                    Ok(if id.starts_with('w') {
                        Claim::NotRunnable(SessionStatus::Waiting)
                    } else {
                        Claim::NotFound
                    })
                })
                .collect())
        }
    }

    fn gated() -> Arc<Gated> {
        Arc::new(Gated {
            batches: Mutex::new(Vec::new()),
            gate: Semaphore::new(0),
            fail: AtomicBool::new(false),
        })
    }

    fn group() -> Arc<GroupClaim> {
        let terms = ClaimTerms {
            owner: "w".into(),
            ttl: Duration::from_secs(30),
            max_attempts: 10,
        };
        Arc::new(GroupClaim::new(terms, agentq_core::metrics::global()))
    }

    fn started(group: &Arc<GroupClaim>, store: &Arc<Gated>, id: &str) -> Started {
        let (group, store, id) = (group.clone(), store.clone(), id.to_string());
        tokio::spawn(async move { group.claim(&store, &id).await })
    }

    async fn until(what: impl Fn() -> bool) {
        while !what() {
            tokio::task::yield_now().await;
        }
    }

    type Started = tokio::task::JoinHandle<agentq_core::Result<Claim>>;

    /// Both claim slots taken by statements the gate holds (`busy`, one claim each), then
    /// `ids` started while they are: the returned tasks, busy first, once all of `ids`
    /// wait for a slot.
    async fn while_busy(
        group: &Arc<GroupClaim>,
        store: &Arc<Gated>,
        busy: [&str; 2],
        ids: &[&str],
    ) -> (Vec<Started>, Vec<Started>) {
        let busy: Vec<_> = busy.iter().map(|id| started(group, store, id)).collect();
        until(|| store.batches.lock().unwrap().len() == 2).await;
        let waiting: Vec<_> = ids.iter().map(|id| started(group, store, id)).collect();
        until(|| group.lock().len() == ids.len()).await;
        assert_eq!(store.batches.lock().unwrap().len(), 2, "no slot was free");
        (busy, waiting)
    }

    /// A claim with a slot free goes alone and at once; those that come while both slots
    /// are busy wait and then go in one statement; each caller gets its own answer.
    #[tokio::test]
    async fn claims_that_wait_for_a_slot_go_together() {
        let (group, store) = (group(), gated());
        let ids = ["c", "w-d", "e", "w-f", "g"];
        let (busy, waiting) = while_busy(&group, &store, ["a", "w-b"], &ids).await;

        store.gate.add_permits(3);
        let [first, second] = <[Started; 2]>::try_from(busy).unwrap();
        assert!(matches!(first.await.unwrap(), Ok(Claim::NotFound)));
        assert!(matches!(
            second.await.unwrap(),
            Ok(Claim::NotRunnable(SessionStatus::Waiting))
        ));
        for (id, task) in ids.iter().zip(waiting) {
            let answer = task.await.unwrap().unwrap();
            if id.starts_with('w') {
                assert!(matches!(answer, Claim::NotRunnable(_)), "{id}: {answer:?}");
            } else {
                assert!(matches!(answer, Claim::NotFound), "{id}: {answer:?}");
            }
        }
        let batches = store.batches.lock().unwrap().clone();
        assert_eq!(batches.len(), 3, "{batches:?}");
        let mut third = batches[2].clone();
        third.sort();
        assert_eq!(third, ["c", "e", "g", "w-d", "w-f"]);
    }

    /// A statement that fails fails each of its claims (each entry is then handed out
    /// again); a caller that stops waiting leaves the others' answers to come.
    #[tokio::test]
    async fn a_failed_statement_fails_its_claims_and_a_dropped_caller_stops_nobody() {
        let (group, store) = (group(), gated());
        let (blockers, waiting) = while_busy(&group, &store, ["x", "y"], &["p", "q"]).await;
        let [leader, follower] = <[Started; 2]>::try_from(waiting).unwrap();
        store.fail.store(true, Ordering::SeqCst);
        store.gate.add_permits(1);
        until(|| store.batches.lock().unwrap().len() == 3).await;
        // Whoever took the slot started the statement for both; dropping them both now
        // does not cancel it, and it is answered when it ends.
        leader.abort();
        store.gate.add_permits(2);
        let answer = follower.await.unwrap();
        assert!(matches!(answer, Err(Error::Shared(_))), "{answer:?}");
        for b in blockers {
            assert!(matches!(b.await.unwrap(), Err(Error::Shared(_))));
        }
        let batches = store.batches.lock().unwrap().clone();
        let mut third = batches[2].clone();
        third.sort();
        assert_eq!(third, ["p", "q"]);
    }

    /// A claim the store refuses fails alone: the statement it came in is split until
    /// it is alone, and every other claim of it is answered.
    #[tokio::test]
    async fn a_refused_claim_fails_alone() {
        let (group, gate) = (group(), gated());
        // Both slots taken by claims that wait, so the next ones gather in one statement.
        let ids = ["c", "w-d", "poison-e", "f", "w-g"];
        let (busy, waiting) = while_busy(&group, &gate, ["a", "b"], &ids).await;
        gate.gate.add_permits(1_000);
        for b in busy {
            b.await.unwrap().unwrap();
        }
        for (id, task) in ids.iter().zip(waiting) {
            let answer = task.await.unwrap();
            match *id {
                "poison-e" => assert!(
                    matches!(&answer, Err(Error::Shared(e)) if matches!(**e, Error::Conflict(_))),
                    "{answer:?}"
                ),
                id if id.starts_with('w') => {
                    assert!(
                        matches!(answer, Ok(Claim::NotRunnable(_))),
                        "{id}: {answer:?}"
                    )
                }
                id => assert!(matches!(answer, Ok(Claim::NotFound)), "{id}: {answer:?}"),
            }
        }
        let batches = gate.batches.lock().unwrap().clone();
        assert_eq!(batches[2].len(), ids.len(), "{batches:?}");
        assert!(batches.iter().any(|b| b == &["poison-e".to_string()]));
    }
}
