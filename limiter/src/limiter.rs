//! [`Limiter`]: what one worker process knows of the fleet's limits (the compiled rules,
//! the holds and announced keys as last read, the probes, the settlements not yet written
//! and the slots of running calls), and how that knowledge changes. Talking to Redis is
//! [`crate::script`] (one round trip) and [`crate::fleet`] (the background tasks).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use prometheus::IntCounter;
use redis::Script;
use tokio::sync::Notify;

use agentq_error::Result;
use agentq_types::config::{LimitSettings, OnUnavailable};

use crate::clock::now_ms;
use crate::conn::Conn;
use crate::keys::MAX_FIELDS;
use crate::metric::errors;
use crate::rule::Rule;

/// At most one warning about an unreachable Redis this often.
const WARN_EVERY_MS: i64 = 10_000;
/// Settlements kept for the next round trip at most; past this the oldest are dropped
/// (their tokens stay counted as reserved, their slots expire).
const MAX_PENDING: usize = 10_000;

/// The limiter one worker process shares among its sessions.
pub struct Limiter {
    pub(crate) rules: Vec<Rule>,
    /// `None`: no Redis (the embedded mode): nothing is enforced.
    pub(crate) conn: Option<Conn>,
    /// Whether Redis is a cluster: each provider key's keys then carry a tag of their own.
    pub(crate) cluster: bool,
    /// What a call under a configured rule does while Redis cannot be reached.
    pub(crate) on_unavailable: OnUnavailable,
    /// The tags this worker has announced in `TAGS_KEY`, and when.
    pub(crate) tags: Mutex<HashMap<String, i64>>,
    /// When this worker last renewed the keys of the tags listed (ms).
    pub(crate) tags_kept: AtomicI64,
    /// The fleet's holds as last read (and as this worker learned them since).
    pub(crate) holds: RwLock<HashMap<String, i64>>,
    /// The keys (and models) whose answers announce their limits: their calls go
    /// through what those announced left (`SessionLimiter::reserve_learned`).
    pub(crate) announced: RwLock<HashSet<String>>,
    /// Keys nothing is known of yet: one call at a time probes what the provider says.
    pub(crate) probes: Mutex<HashMap<String, Probe>>,
    /// Settlements not yet written: the next round trip carries them.
    pub(crate) pending: Mutex<Vec<Settlement>>,
    /// Wakes the writer of settlements; `urgent` says not to wait for a reservation.
    pub(crate) flush: Arc<Notify>,
    pub(crate) urgent: AtomicBool,
    /// Reservations under a concurrency limit not yet settled: renewed while their call
    /// runs, so that a call longer than `reservation_ttl_secs` keeps its slot.
    pub(crate) live: Mutex<HashMap<String, Live>>,
    /// [`errors`], as the process's registry exports it.
    pub(crate) errors: &'static IntCounter,
    pub(crate) last_warning: AtomicI64,
    pub(crate) script: Script,
}

/// What this worker knows of a key that has no rule.
pub(crate) enum Probe {
    /// A call is out to find out; the others wait for it (a bounded while).
    InFlight(Arc<Notify>),
    /// Its answers announce no limits: calls go without a round trip.
    Quiet,
}

/// A reservation holding calls-in-flight slots.
pub(crate) struct Live {
    /// The rule prefixes whose slots it holds.
    pub(crate) keys: Vec<String>,
    pub(crate) ttl_ms: i64,
    /// When to push its expiry out again.
    pub(crate) renew_at: i64,
    /// The rules were more than half full when it was admitted: its slot is wanted back
    /// at once, not with the next reservation.
    pub(crate) tight: bool,
}

/// One finished call, as the script's settle part takes it.
pub(crate) struct Settlement {
    /// The tag of its provider key's keys: it goes with a round trip on that tag.
    pub(crate) tag: String,
    pub(crate) id: String,
    pub(crate) used: i64,
    pub(crate) out: i64,
    pub(crate) field: String,
    pub(crate) hold: i64,
    /// Requests left and their reset, tokens left and their reset, the limits of
    /// requests and of tokens (-1: not announced).
    pub(crate) announced: [i64; 6],
    pub(crate) keys: Vec<String>,
    /// The call never went out: its place in the windows is given back.
    pub(crate) unsent: bool,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.rules.len())
            .field("redis", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl Limiter {
    pub(crate) fn new(limits: &[LimitSettings], conn: Option<Conn>) -> Result<Limiter> {
        Ok(Limiter::with_rules(Rule::compile_all(limits)?, conn))
    }

    pub(crate) fn with_rules(rules: Vec<Rule>, conn: Option<Conn>) -> Limiter {
        let cluster = matches!(conn, Some(Conn::Cluster(_)));
        Limiter {
            rules,
            conn,
            cluster,
            on_unavailable: OnUnavailable::default(),
            tags: Mutex::new(HashMap::new()),
            tags_kept: AtomicI64::new(0),
            holds: RwLock::new(HashMap::new()),
            announced: RwLock::new(HashSet::new()),
            probes: Mutex::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
            flush: Arc::new(Notify::new()),
            urgent: AtomicBool::new(false),
            live: Mutex::new(HashMap::new()),
            errors: errors(),
            last_warning: AtomicI64::new(i64::MIN),
            script: Script::new(include_str!("admit.lua")),
        }
    }

    /// A limiter that enforces nothing (hosts without Redis).
    pub fn disabled() -> Arc<Limiter> {
        Arc::new(Limiter::with_rules(Vec::new(), None))
    }

    /// Whether any rule is configured.
    pub fn has_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    pub(crate) fn is_announced(&self, field: &str) -> bool {
        self.announced
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(field)
    }

    /// The probe of `field` is over: record what it found (`None`: nothing, the next
    /// call probes again) and wake the calls waiting for it.
    pub(crate) fn end_probe(&self, field: &str, found: Option<Probe>) {
        let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        let was = probes.remove(field);
        if let Some(f) = found {
            forget_quiet(&mut probes);
            probes.insert(field.to_string(), f);
        }
        if let Some(Probe::InFlight(n)) = was {
            n.notify_waiters();
        }
    }

    pub(crate) fn note_announced(&self, field: &str) {
        let mut a = self.announced.write().unwrap_or_else(|e| e.into_inner());
        if !a.contains(field) {
            // Bounded like the fleet's own record of it: the next read of the holds
            // brings back the fields still in use.
            if a.len() >= 2 * MAX_FIELDS {
                a.clear();
            }
            a.insert(field.to_string());
        }
    }

    pub(crate) fn hold(&self, field: &str) -> Option<i64> {
        self.holds
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(field)
            .copied()
    }

    pub(crate) fn note_hold(&self, field: &str, until: i64) {
        let mut holds = self.holds.write().unwrap_or_else(|e| e.into_inner());
        let cur = holds.entry(field.to_string()).or_insert(until);
        *cur = (*cur).max(until);
    }

    /// Redis failed: say so (not too often) and count it. Whether the call goes is the
    /// caller's (`on_unavailable`).
    pub(crate) fn failed_open(&self, what: &str, err: &redis::RedisError) {
        self.errors.inc();
        let now = now_ms();
        let last = self.last_warning.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= WARN_EVERY_MS
            && self
                .last_warning
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let then = match self.on_unavailable {
                OnUnavailable::Open => "letting calls through",
                OnUnavailable::Closed => "calls under configured rules wait",
            };
            tracing::warn!(error = %err, "rate limiter {what} failed; {then}");
        }
    }

    /// Keep a settlement for the next round trip; wake the writer (at once if `urgent`).
    pub(crate) fn defer(&self, s: Settlement, urgent: bool) {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if pending.len() >= MAX_PENDING {
                pending.remove(0);
            }
            pending.push(s);
        }
        if urgent {
            self.urgent.store(true, Ordering::Relaxed);
        }
        self.flush.notify_one();
    }

    pub(crate) fn take_pending(&self) -> Vec<Settlement> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Put back settlements a failed round trip carried, before any that came since.
    pub(crate) fn restore_pending(&self, mut back: Vec<Settlement>) {
        if back.is_empty() {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        back.append(&mut pending);
        let over = back.len().saturating_sub(MAX_PENDING);
        back.drain(..over);
        *pending = back;
    }

    /// The reservations whose calls-in-flight slots are due to be pushed out, marked
    /// renewed: (id, rule prefixes, new expiry).
    pub(crate) fn due_renewals(&self, now: i64) -> Vec<(String, Vec<String>, i64)> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.iter_mut()
            .filter(|(_, l)| l.renew_at <= now)
            .map(|(id, l)| {
                l.renew_at = now.saturating_add(l.ttl_ms / 3);
                (id.clone(), l.keys.clone(), now.saturating_add(l.ttl_ms))
            })
            .collect()
    }
}

/// Keep the probes' record bounded (a session names its model): at [`MAX_FIELDS`] the
/// keys found quiet are forgotten, and probed again when next called.
pub(crate) fn forget_quiet(probes: &mut HashMap<String, Probe>) {
    if probes.len() >= MAX_FIELDS {
        probes.retain(|_, p| matches!(p, Probe::InFlight(_)));
    }
}
