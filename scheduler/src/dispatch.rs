//! The dispatcher: each queue's Redis stream is a short delivery buffer, and the store is
//! the fair queue behind it. While a queue's buffer has room (fewer than
//! `scheduling.buffer` sessions in it that no worker claimed yet) and nothing waits behind
//! it, a new session is enqueued at once, as it always was. Past that, and always for a
//! tenant or batch with a cap on running sessions, it is stored `held` (queued, no entry),
//! and every `dispatch_interval` (or sooner, when a request held some) the dispatcher
//! refills each buffer from the held sessions, chosen by
//! [`agentq_core::scheduling::choose`]: priority, then weighted fair share across tenants
//! and across each tenant's batches, never past a cap.
//!
//! A session created under a cap is `capped` for good, and so are the sub-agents of its
//! tree: whenever one of them goes back to the queue after a wait (a child's result, a
//! decision, the end of a rate-limit wait, a raised budget, a follow-up, a retry) it is
//! held again rather than enqueued by whoever woke it. Waiting sessions are not counted
//! against a cap, so without this a cap's worth of sessions suspended for a rate limit,
//! replaced meanwhile by as many more, would all come back at once past it.
//!
//! What is buffered is read from the store (queued and not held), not from Redis, so a
//! Redis restart changes nothing here: the entries it lost are the sweeper's to re-add
//! (`recover_lost`), the held sessions stay held until their turn. A session released
//! from the hold whose `XADD` failed is queued without an entry, which the sweeper adds.
//! Several schedulers may each run a dispatcher: a held row is released once
//! ([`agentq_core::SweepStore::release_held`]), so none is handed out twice.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use agentq_core::config::SchedulingSection;
use agentq_core::scheduling::{ActiveCount, choose};
use agentq_core::{EnqueueReason, Queue, Store};

use crate::queues::QueueRegistry;

/// Held sessions read per tick at most, whatever the room (the choice is in memory).
const MAX_CANDIDATES: u32 = 10_000;

/// How long a queue found blocked (every held session at its cap) is not read again while
/// nothing active changed. Sessions can join the held ones without a nudge reaching this
/// process (a capped sub-agent spawned by a worker, a capped session woken there), and
/// one of them may be of a tenant with room: it waits this long at most.
const BLOCKED_RECHECK: Duration = Duration::from_secs(1);

/// The submit path's view of the buffers, refreshed by each dispatcher tick. Cheap to
/// clone (shared).
#[derive(Debug, Clone)]
pub struct Dispatch {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: SchedulingSection,
    /// Set while a dispatcher runs for this process: without one, nothing may be held.
    running: AtomicBool,
    /// Per queue: how many more sessions may be enqueued at once before the next tick.
    room: Mutex<HashMap<String, i64>>,
    /// Per queue whose held sessions are all capped: the [`fingerprint`] of what was
    /// active (in every queue) when that was found, and when. Until it changes, a request
    /// holds new sessions, or [`BLOCKED_RECHECK`] passes, the queue is not read again.
    blocked: Mutex<HashMap<String, (u64, Instant)>>,
    wake: Notify,
}

impl Dispatch {
    pub fn new(settings: SchedulingSection) -> Self {
        Dispatch {
            inner: Arc::new(Inner {
                settings,
                running: AtomicBool::new(false),
                room: Mutex::new(HashMap::new()),
                blocked: Mutex::new(HashMap::new()),
                wake: Notify::new(),
            }),
        }
    }

    pub fn settings(&self) -> &SchedulingSection {
        &self.inner.settings
    }

    /// Whether `n` new sessions of `tenant` on `queue` (of a batch capped at `batch_cap`)
    /// wait in the store for the dispatcher rather than being enqueued now. Without a
    /// running dispatcher, never. Counts the ones let through against the room, so a
    /// burst between two ticks cannot overfill the buffer.
    pub fn hold(&self, queue: &str, tenant: &str, n: usize, batch_cap: Option<u32>) -> bool {
        if !self.inner.running.load(Ordering::Acquire) {
            return false;
        }
        if self.capped(tenant, batch_cap) {
            return true;
        }
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let mut room = self.inner.room.lock().unwrap_or_else(|e| e.into_inner());
        // A queue no tick has measured yet starts with a whole buffer of room.
        let left = room
            .entry(queue.to_string())
            .or_insert_with(|| i64::from(self.inner.settings.buffer));
        if *left >= n {
            *left = left.saturating_sub(n);
            false
        } else {
            true
        }
    }

    /// Whether sessions of `tenant` (of a batch capped at `batch_cap`) are under a cap on
    /// running sessions the dispatcher keeps: they are held whenever they are queued (see
    /// [`agentq_core::SessionRow::capped`]). Without a running dispatcher, never.
    pub fn capped(&self, tenant: &str, batch_cap: Option<u32>) -> bool {
        self.inner.running.load(Ordering::Acquire)
            && (batch_cap.is_some() || self.inner.settings.share(tenant).max_running.is_some())
    }

    /// A dispatcher is about to run (or the caller drives [`dispatch_once`] itself): new
    /// sessions may be held from now on.
    pub fn mark_running(&self) {
        self.inner.running.store(true, Ordering::Release);
    }

    /// Whether a dispatcher runs for this process.
    pub fn is_running(&self) -> bool {
        self.inner.running.load(Ordering::Acquire)
    }

    /// Ask for a tick soon (sessions were held).
    pub fn nudge(&self) {
        self.inner
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.inner.wake.notify_one();
    }

    fn block(&self, queue: &str, active: u64) {
        self.inner
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(queue.to_string(), (active, Instant::now()));
    }

    fn forget_blocked(&self, queue: &str) {
        self.inner
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(queue);
    }

    fn still_blocked(&self, queue: &str, active: u64) -> bool {
        self.inner
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .is_some_and(|(was, at)| *was == active && at.elapsed() < BLOCKED_RECHECK)
    }

    fn set_room(&self, queue: &str, left: i64) {
        self.inner
            .room
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(queue.to_string(), left);
    }
}

/// What is active, as one number that changes when any group's counts do (whatever
/// order the store answers in).
fn fingerprint(load: &[ActiveCount]) -> u64 {
    use std::hash::{Hash, Hasher};
    load.iter().fold(0u64, |acc, a| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&a.queue, &a.tenant, &a.batch_id, a.running, a.buffered).hash(&mut h);
        acc.wrapping_add(h.finish())
    })
}

/// One tick: refill every queue's buffer from its held sessions. Returns how many were
/// handed out. A queue whose `XADD` fails is left to the sweeper (the released rows are
/// queued without an entry).
///
/// With nothing held anywhere (no cap, no full buffer) the tick reads one index entry and
/// stops: the load it would count is every session in flight, which at scale is the
/// costliest read of the fleet. The room submissions spend ([`Dispatch::hold`]) is then
/// not refilled; once it runs out a submission is held, and the next tick counts the load
/// and hands it out.
pub async fn dispatch_once(
    store: &dyn Store,
    queue: &dyn Queue,
    queues: &QueueRegistry,
    dispatch: &Dispatch,
) -> agentq_core::Result<usize> {
    if !store.any_held(None).await? {
        return Ok(0);
    }
    let mut load = store.dispatch_load().await?;
    let mut names: BTreeSet<String> = queues.names().into_iter().collect();
    let mut buffered: HashMap<String, u64> = HashMap::new();
    for a in &load {
        names.insert(a.queue.clone());
        let b = buffered.entry(a.queue.clone()).or_default();
        *b = b.saturating_add(a.buffered);
    }
    let settings = dispatch.settings();
    let buffer = u64::from(settings.buffer);
    // Refill once half a buffer is free, not after every claim: reading the held
    // sessions costs about one pass over their index entries, which a large backlog makes
    // worth sharing among many sessions.
    let refill_at = (buffer / 2).max(1);
    // Of what the store answered, before this tick hands anything out.
    let active = fingerprint(&load);
    let mut total = 0usize;
    for q in &names {
        let room = buffer.saturating_sub(buffered.get(q).copied().unwrap_or(0));
        if !store.any_held(Some(q)).await? {
            dispatch.set_room(q, i64::try_from(room).unwrap_or(i64::MAX));
            dispatch.forget_blocked(q);
            continue;
        }
        // Sessions wait: every new one waits behind them until none is left.
        dispatch.set_room(q, 0);
        if room < refill_at || dispatch.still_blocked(q, active) {
            continue;
        }
        let room_u32 = u32::try_from(room).unwrap_or(u32::MAX);
        let held = store
            .held(q, room_u32, room_u32.saturating_mul(4).min(MAX_CANDIDATES))
            .await?;
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        let owners: HashMap<String, (String, Option<String>)> = held
            .iter()
            .map(|c| (c.id.clone(), (c.tenant.clone(), c.batch_id.clone())))
            .collect();
        let chosen = choose(held, &load, |t| settings.share(t), room);
        if chosen.is_empty() {
            // Every waiting session is of a tenant or batch at its cap: nothing can go
            // until something active ends (or new sessions arrive), so the held index is
            // not read again until then.
            dispatch.block(q, active);
            continue;
        }
        let released = store.release_held(&chosen).await?;
        if released.is_empty() {
            continue;
        }
        // The store answers in its own order: hand them out in the chosen one, since a
        // stream is read in order.
        let released: BTreeSet<String> = released.into_iter().collect();
        let ordered: Vec<String> = chosen
            .into_iter()
            .filter(|id| released.contains(id))
            .collect();
        // What this tick handed out counts against the caps of the queues after this one.
        for id in &ordered {
            if let Some((tenant, batch_id)) = owners.get(id) {
                load.push(ActiveCount {
                    queue: q.clone(),
                    tenant: tenant.clone(),
                    batch_id: batch_id.clone(),
                    running: 0,
                    buffered: 1,
                });
            }
        }
        queues.ensure(queue, q).await;
        let items: Vec<(String, EnqueueReason)> = ordered
            .iter()
            .map(|id| (id.clone(), EnqueueReason::New))
            .collect();
        if let Err(e) = queue.enqueue_many(q, &items).await {
            tracing::warn!(queue = %q, sessions = ordered.len(), error = %e, "dispatcher: XADD failed; the sweeper will enqueue these sessions");
            continue;
        }
        if let Err(e) = store.mark_enqueued(&ordered).await {
            // The entries exist; the sweeper may add duplicates, which the lease absorbs.
            tracing::warn!(queue = %q, sessions = ordered.len(), error = %e, "dispatcher: cannot mark sessions enqueued");
        }
        tracing::debug!(queue = %q, sessions = ordered.len(), "dispatcher: handed out held sessions");
        total = total.saturating_add(ordered.len());
    }
    Ok(total)
}

/// Run [`dispatch_once`] every `scheduling.dispatch_interval_ms`, or sooner when nudged,
/// until `cancel`. A failed tick is logged and the next one tries again; the loop stops
/// within one tick of the cancel (a tick in flight is abandoned: its effects are safe to
/// stop between any two steps).
pub async fn run_dispatcher(
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    queues: QueueRegistry,
    dispatch: Dispatch,
    cancel: CancellationToken,
) {
    dispatch.mark_running();
    let interval = Duration::from_millis(dispatch.settings().dispatch_interval_ms.max(1));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = dispatch_once(store.as_ref(), queue.as_ref(), &queues, &dispatch) => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "dispatcher: tick failed; retrying");
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
            _ = dispatch.inner.wake.notified() => {}
        }
    }
    // Without a dispatcher, new sessions go straight to their queue again.
    dispatch.inner.running.store(false, Ordering::Release);
}
