//! agentq-limiter (`agentq_core::admission`): the fleet-wide rate limiter, the
//! [`Admission`] every worker's LLM calls pass, kept in Redis so that all workers share one
//! count per provider endpoint and key.
//!
//! # Configured limits (`[[limits]]`)
//! A call falls under every rule whose provider, model glob and tenant match. Each rule
//! keeps, per provider endpoint and key ([`LlmProvider::limit_key`]), sliding-window
//! logs of requests and tokens and a set of calls in flight, and one Lua script
//! (`admit.lua`, run with `EVALSHA`) checks and records a call under all of its rules
//! in one atomic round trip: the call goes, or goes later at a start the script booked
//! for it in the first window with room (when the session takes that wait: it then never
//! asks twice), or the script says how long until the rule that binds lets it. A call
//! reserves its prompt estimate plus `max_tokens`, or a learned average of its model's
//! output (kept in Redis) when that is smaller; its settlement corrects the tokens by the
//! usage the provider reported and frees the slot. A reservation of a worker that died is
//! scored by its expiry and purged by the next reserve after `reservation_ttl_secs`; a
//! live call's slot is pushed out every third of that while it runs, so a long call
//! keeps it.
//!
//! # Learned (nothing configured)
//! - A provider's refusal (429, 529) or an answer announcing a spent window (`remaining`
//!   at 0) holds the key and model until the reset it named: the settle records the hold
//!   in Redis, every worker reads the holds every [`HOLD_REFRESH`], and all of them wait
//!   instead of each finding out with a refusal of its own (waiters wake spread over a
//!   short jitter).
//! - An answer announcing what is left (`x-ratelimit-remaining-*`,
//!   `anthropic-ratelimit-*-remaining`) sets fleet-wide counters of requests and tokens
//!   left, expiring at the announced resets; calls on that key then go while they last
//!   (one round trip), never more of them within the announced window than its announced
//!   limit of requests (a log of the fleet's own calls, for providers that count over a
//!   sliding window), and wait for the reset otherwise: the fleet goes at
//!   the provider's own pace, as its answers report it.
//! - A key nothing is known of yet is probed: one call per worker goes first and the
//!   others wait (at most [`PROBE_WAIT`]) for what its answer says, so that a batch does
//!   not open with a burst the key cannot take. A key whose answers announce nothing
//!   (local servers) is then left alone.
//!
//! # Bounded by the fleet, not by callers
//! A session names its model, so the records kept per key and model (learned averages,
//! holds, what was announced, the probes of a worker) are kept to the [`MAX_FIELDS`]
//! used most recently, in Redis and in each worker: a caller naming a new model on every
//! call cycles through them instead of growing them.
//!
//! # Cost
//! With no rule matching a call, no hold on its key and no limits announced for it, a call
//! costs no Redis round trip at all (the holds and the keys that announce limits come
//! from the periodic read, not from the call). With rules, a call costs one round trip
//! before it starts. Its settlement is not a round trip of its own: the next reservation
//! of the same worker carries it, in the same script call, or a writer sends what no
//! reservation took within [`SETTLE_DELAY`] — at once for what the fleet must hear now (a
//! hold; for a key no rule governs, what the provider announced is left) or a slot of a
//! rule more than half full. So a call under configured rules costs one round trip, and
//! one on a key paced by what it announces two (its admission, and the news of what is
//! left). A limiter that cannot reach Redis lets
//! calls through, with a warning and the `agentq_admission_limiter_errors_total` metric:
//! a limiter outage never fails sessions (settlements it could not write are kept for the
//! next round trip).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

use agentq_agent::driver::{Admission, Admit, CallAsk, CallReport, Permit};
use agentq_agent::provider::LlmProvider;
use async_trait::async_trait;
use prometheus::IntCounter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo, Script};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use agentq_error::{Error, Result};
use agentq_types::config::LimitSettings;
pub use agentq_types::limiter::{HoldState, LimiterState, RuleState};

/// How often a worker reads the fleet's learned holds.
pub const HOLD_REFRESH: Duration = Duration::from_millis(250);
/// Waiters on a hold wake spread over up to this long, not all in one instant.
const HOLD_JITTER_MS: u64 = 200;
/// The hold after a refusal that named no wait.
const DEFAULT_HOLD: Duration = Duration::from_secs(1);
/// Redis answers a limiter waits for; past this the call goes (fail open).
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// At most one warning about an unreachable Redis this often.
const WARN_EVERY_MS: i64 = 10_000;

/// Every key of the limiter carries the hash tag `{limit}`: a Redis Cluster keeps them in
/// one slot, as the script that touches several of them at once needs.
const PREFIX: &str = "agentq:{limit}:";
/// The set of every rule key in use (the admin view lists them).
pub const INDEX_KEY: &str = "agentq:{limit}:keys";
/// Hash: `limit_key|model` → hold until (ms since the epoch).
pub const HOLDS_KEY: &str = "agentq:{limit}:holds";
/// Hash: `limit_key|model` → when an answer last announced its limits (ms).
const ANNOUNCED_KEY: &str = "agentq:{limit}:holds:announced";
/// The prefix of the counters a key and model announce (what is left until the reset,
/// and the limits), which the script names from the field.
const FIELD_PREFIX: &str = "agentq:{limit}:";
/// The permit of a call that probes a key nothing is known of.
const PROBE: &str = "probe";
/// The longest a call waits for another's probe before going anyway.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// Hash: `limit_key|model` → the learned average of output tokens.
const AVERAGES_KEY: &str = "agentq:{limit}:avg";
/// Sorted set: every `limit_key|model` the hashes above may hold a field of, scored by
/// its last settlement (ms).
pub const FIELDS_KEY: &str = "agentq:{limit}:fields";
/// The most `limit_key|model` fields the limiter keeps in Redis (and each worker in
/// memory). A session names its model, so without a bound every model string a caller
/// ever tried would stay in every hash above for good (and in every worker's periodic
/// read of the holds); past it the fields settled least recently are forgotten. A field
/// forgotten while in use loses only what was learned of it (a hold, an average, what
/// the provider announced), which its next answers teach again.
pub const MAX_FIELDS: usize = 4096;

/// A settlement waits this long for the next reservation of its worker to carry it
/// (so that a call costs one round trip, not two) before it is written on its own. What
/// waits is only a correction of counted tokens and of the learned output size; a slot
/// wanted back, a hold and what the provider announced go at once.
const SETTLE_DELAY: Duration = Duration::from_secs(1);
/// Settlements kept for the next round trip at most; past this the oldest are dropped
/// (their tokens stay counted as reserved, their slots expire).
const MAX_PENDING: usize = 10_000;

/// The name and help of [`errors`].
pub const ERRORS_METRIC: &str = "agentq_admission_limiter_errors_total";
pub const ERRORS_HELP: &str =
    "Rate-limiter round trips that failed (Redis down or erroring); the call was let through.";

/// Round trips that failed, in this process: every [`Limiter`] counts here, and
/// `agentq_core::metrics::global` exports this counter as `limiter_errors` (the limiter
/// needs no metrics registry of its own, and counts even before one exists).
pub fn errors() -> &'static IntCounter {
    static ERRORS: OnceLock<IntCounter> = OnceLock::new();
    ERRORS.get_or_init(|| {
        // A constant name and help: a failure is a programming error, caught by every
        // test that builds a limiter.
        IntCounter::new(ERRORS_METRIC, ERRORS_HELP)
            .unwrap_or_else(|e| panic!("metric {ERRORS_METRIC}: {e}"))
    })
}

/// A `[[limits]]` rule, compiled.
struct Rule {
    settings: LimitSettings,
    glob: globset::GlobMatcher,
}

impl Rule {
    fn matches(&self, provider: &str, model: &str, tenant: &str) -> bool {
        self.settings.provider == provider
            && self.glob.is_match(model)
            && self.settings.tenant.as_deref().is_none_or(|t| t == tenant)
    }

    /// The Redis prefix of this rule's counters for one provider key (and tenant).
    fn key(&self, limit_key: &str) -> String {
        let s = &self.settings;
        match &s.tenant {
            Some(t) => format!("{PREFIX}{}:{}:{t}|{limit_key}", s.provider, s.model),
            None => format!("{PREFIX}{}:{}:*|{limit_key}", s.provider, s.model),
        }
    }

    /// The window the counts are kept over: the configured one, plus a guard for the
    /// time between admitting a call and its request reaching the provider. Callers
    /// waiting on a full window all wake when its oldest call leaves it, so the next
    /// window's calls leave in a burst; without the guard, the provider (which counts at
    /// arrival) sees the late arrivals of one burst and the early ones of the next in
    /// one of its windows.
    fn window_ms(&self) -> u64 {
        let window = self.settings.window_secs.clamp(1, 60).saturating_mul(1000);
        window.saturating_add((window / 20).clamp(50, 250))
    }

    /// A per-minute allowance scaled to the rule's window (at least 1).
    fn per_window(&self, per_minute: Option<u64>) -> u64 {
        per_minute.map_or(0, |m| {
            (m.saturating_mul(self.settings.window_secs.clamp(1, 60)) / 60).max(1)
        })
    }
}

/// The limiter one worker process shares among its sessions.
pub struct Limiter {
    rules: Vec<Rule>,
    /// `None`: no Redis (the embedded mode): nothing is enforced.
    conn: Option<ConnectionManager>,
    /// The fleet's holds as last read (and as this worker learned them since).
    holds: RwLock<HashMap<String, i64>>,
    /// The keys (and models) whose answers announce their limits: their calls go
    /// through what those announced left ([`SessionLimiter::reserve_learned`]).
    announced: RwLock<HashSet<String>>,
    /// Keys nothing is known of yet: one call at a time probes what the provider says.
    probes: Mutex<HashMap<String, Probe>>,
    /// Settlements not yet written: the next round trip carries them.
    pending: Mutex<Vec<Settlement>>,
    /// Wakes the writer of settlements; `urgent` says not to wait for a reservation.
    flush: Arc<Notify>,
    urgent: AtomicBool,
    /// Reservations under a concurrency limit not yet settled: renewed while their call
    /// runs, so that a call longer than `reservation_ttl_secs` keeps its slot.
    live: Mutex<HashMap<String, Live>>,
    /// [`errors`], as the process's registry exports it.
    errors: &'static IntCounter,
    last_warning: AtomicI64,
    script: Script,
}

/// What this worker knows of a key that has no rule.
enum Probe {
    /// A call is out to find out; the others wait for it (a bounded while).
    InFlight(Arc<Notify>),
    /// Its answers announce no limits: calls go without a round trip.
    Quiet,
}

/// A reservation holding calls-in-flight slots.
struct Live {
    /// The rule prefixes whose slots it holds.
    keys: Vec<String>,
    ttl_ms: i64,
    /// When to push its expiry out again.
    renew_at: i64,
    /// The rules were more than half full when it was admitted: its slot is wanted back
    /// at once, not with the next reservation.
    tight: bool,
}

/// One finished call, as the script's settle part takes it.
struct Settlement {
    id: String,
    used: i64,
    out: i64,
    field: String,
    hold: i64,
    /// Requests left and their reset, tokens left and their reset, the limits of
    /// requests and of tokens (-1: not announced).
    announced: [i64; 6],
    keys: Vec<String>,
}

impl Settlement {
    fn push_args(&self, inv: &mut redis::ScriptInvocation<'_>) {
        inv.arg(&self.id)
            .arg(self.used)
            .arg(self.out)
            .arg(&self.field)
            .arg(self.hold)
            .arg(&self.announced[..])
            .arg(self.keys.len())
            .arg(&self.keys);
    }
}

/// What a round trip asks for besides the settlements it carries.
enum Ask<'a> {
    /// Settle only.
    Nothing,
    /// A call under configured rules.
    Rules {
        id: &'a str,
        ttl_ms: u64,
        ask: &'a CallAsk<'a>,
        field: &'a str,
        rules: &'a [&'a Rule],
        limit_key: &'a str,
    },
    /// A call on a key whose answers announce its limits.
    Learned { field: &'a str, tokens: u64 },
}

/// The script's answer: go (1), reserved tokens or the wait's ms, the start delay ms,
/// whether the slot is wanted back promptly (1), and what the delay or wait waits for.
type Answer = (i64, u64, u64, i64, String);

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.rules.len())
            .field("redis", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl Limiter {
    fn new(limits: &[LimitSettings], conn: Option<ConnectionManager>) -> Result<Limiter> {
        let rules = limits
            .iter()
            .map(|l| {
                let glob = globset::Glob::new(&l.model)
                    .map_err(|e| Error::Config(format!("limits: model {:?}: {e}", l.model)))?
                    .compile_matcher();
                Ok(Rule {
                    settings: l.clone(),
                    glob,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Limiter::with_rules(rules, conn))
    }

    fn with_rules(rules: Vec<Rule>, conn: Option<ConnectionManager>) -> Limiter {
        Limiter {
            rules,
            conn,
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

    fn is_announced(&self, field: &str) -> bool {
        self.announced
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(field)
    }

    /// The probe of `field` is over: record what it found (`None`: nothing, the next
    /// call probes again) and wake the calls waiting for it.
    fn end_probe(&self, field: &str, found: Option<Probe>) {
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

    fn note_announced(&self, field: &str) {
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

    /// Connect to Redis at `url` and start reading the fleet's holds and writing this
    /// worker's settlements until `cancel` (or until the limiter is dropped).
    pub async fn connect(
        url: &str,
        limits: &[LimitSettings],
        cancel: CancellationToken,
    ) -> Result<Arc<Limiter>> {
        let client = Client::open(url.into_connection_info()?)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_with_config(client, config).await?;
        let limiter = Arc::new(Limiter::new(limits, Some(conn))?);
        // Loaded up front, so that no call's round trip is the one refused for an unknown
        // script and sent again with its text.
        if let Some(mut c) = limiter.conn.clone() {
            let loaded: redis::RedisResult<String> =
                limiter.script.prepare_invoke().load_async(&mut c).await;
            if let Err(e) = loaded {
                limiter.failed_open("loading its script", &e);
            }
        }
        tokio::spawn(refresh_holds(Arc::downgrade(&limiter), cancel.clone()));
        tokio::spawn(write_settlements(
            Arc::downgrade(&limiter),
            limiter.flush.clone(),
            cancel,
        ));
        Ok(limiter)
    }

    /// Whether any rule is configured.
    pub fn has_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    /// The admission of one session's calls: its tenant and its provider (name and key).
    pub fn for_session(
        self: &Arc<Self>,
        tenant: &str,
        provider: &dyn LlmProvider,
    ) -> Arc<dyn Admission> {
        Arc::new(SessionLimiter {
            limiter: self.clone(),
            tenant: tenant.to_string(),
            provider: provider.name().to_string(),
            limit_key: provider.limit_key(),
        })
    }

    fn hold(&self, field: &str) -> Option<i64> {
        self.holds
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(field)
            .copied()
    }

    fn note_hold(&self, field: &str, until: i64) {
        let mut holds = self.holds.write().unwrap_or_else(|e| e.into_inner());
        let cur = holds.entry(field.to_string()).or_insert(until);
        *cur = (*cur).max(until);
    }

    /// Let a call through because Redis failed: say so (not too often) and count it.
    fn failed_open(&self, what: &str, err: &redis::RedisError) {
        self.errors.inc();
        let now = now_ms();
        let last = self.last_warning.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= WARN_EVERY_MS
            && self
                .last_warning
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(error = %err, "rate limiter {what} failed; letting calls through");
        }
    }

    /// Keep a settlement for the next round trip; wake the writer (at once if `urgent`).
    fn defer(&self, s: Settlement, urgent: bool) {
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

    fn take_pending(&self) -> Vec<Settlement> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Put back settlements a failed round trip carried, before any that came since.
    fn restore_pending(&self, mut back: Vec<Settlement>) {
        if back.is_empty() {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        back.append(&mut pending);
        let over = back.len().saturating_sub(MAX_PENDING);
        back.drain(..over);
        *pending = back;
    }

    /// One round trip: the pending settlements, then `ask`. On failure the settlements
    /// are kept for the next one.
    async fn round_trip(&self, ask: Ask<'_>, what: &str) -> Option<Answer> {
        let mut conn = self.conn.clone()?;
        let settlements = self.take_pending();
        if settlements.is_empty() && matches!(ask, Ask::Nothing) {
            return None;
        }
        let mut inv = self.script.prepare_invoke();
        inv.key(AVERAGES_KEY)
            .key(INDEX_KEY)
            .key(HOLDS_KEY)
            .key(ANNOUNCED_KEY)
            .key(FIELDS_KEY)
            .arg(now_ms())
            .arg(FIELD_PREFIX)
            .arg(MAX_FIELDS)
            .arg(settlements.len());
        for s in &settlements {
            s.push_args(&mut inv);
        }
        match ask {
            Ask::Nothing => {
                inv.arg("none");
            }
            Ask::Rules {
                id,
                ttl_ms,
                ask,
                field,
                rules,
                limit_key,
            } => {
                inv.arg("rules")
                    .arg(id)
                    .arg(ttl_ms)
                    .arg(ask.input_tokens)
                    .arg(ask.max_output_tokens)
                    .arg(field)
                    .arg(u64::try_from(ask.max_wait.as_millis()).unwrap_or(u64::MAX))
                    .arg(rules.len());
                for r in rules {
                    let s = &r.settings;
                    inv.arg(r.key(limit_key))
                        .arg(r.per_window(s.rpm))
                        .arg(r.per_window(s.tpm))
                        .arg(s.concurrency.unwrap_or(0))
                        .arg(r.window_ms());
                }
            }
            Ask::Learned { field, tokens } => {
                let id = uuid::Uuid::new_v4().simple().to_string();
                inv.arg("learned").arg(field).arg(tokens).arg(id);
            }
        }
        let answer: redis::RedisResult<Answer> = inv.invoke_async(&mut conn).await;
        match answer {
            Ok(a) => Some(a),
            Err(e) => {
                self.restore_pending(settlements);
                self.failed_open(what, &e);
                None
            }
        }
    }

    /// The reservations whose calls-in-flight slots are due to be pushed out, marked
    /// renewed: (id, rule prefixes, new expiry).
    fn due_renewals(&self, now: i64) -> Vec<(String, Vec<String>, i64)> {
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

/// Read the fleet's holds every [`HOLD_REFRESH`] into the limiter, and renew the slots of
/// long calls, until cancelled or the limiter is gone.
async fn refresh_holds(limiter: Weak<Limiter>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(HOLD_REFRESH) => {}
            _ = cancel.cancelled() => return,
        }
        let Some(l) = limiter.upgrade() else { return };
        let Some(mut conn) = l.conn.clone() else {
            return;
        };
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL")
            .arg(HOLDS_KEY)
            .cmd("HGETALL")
            .arg(ANNOUNCED_KEY);
        for (id, keys, until) in l.due_renewals(now_ms()) {
            for k in keys {
                // XX: a slot already given back (or expired and taken) is not revived.
                pipe.cmd("ZADD")
                    .arg(format!("{k}:c"))
                    .arg("XX")
                    .arg("GT")
                    .arg(until)
                    .arg(&id)
                    .ignore();
            }
        }
        let read: redis::RedisResult<(HashMap<String, i64>, HashMap<String, i64>)> =
            pipe.query_async(&mut conn).await;
        match read {
            Ok((remote, announced)) => {
                {
                    let mut a = l.announced.write().unwrap_or_else(|e| e.into_inner());
                    // Past the bound, what the fleet forgot is forgotten here too (fields
                    // noted since the last write come back with their write).
                    if a.len() > MAX_FIELDS {
                        a.retain(|f| announced.contains_key(f));
                    }
                    a.extend(announced.into_keys());
                }
                let now = now_ms();
                let mut holds = l.holds.write().unwrap_or_else(|e| e.into_inner());
                holds.retain(|_, until| *until > now);
                for (k, until) in remote {
                    if until > now {
                        let cur = holds.entry(k).or_insert(until);
                        *cur = (*cur).max(until);
                    }
                }
            }
            Err(e) => l.failed_open("reading holds", &e),
        }
    }
}

/// Write the settlements no reservation carried: at once when one is urgent, else after
/// [`SETTLE_DELAY`] (an urgent one arriving meanwhile cuts the wait short). On cancel,
/// what is left is written before it returns.
async fn write_settlements(limiter: Weak<Limiter>, flush: Arc<Notify>, cancel: CancellationToken) {
    loop {
        let mut stop = tokio::select! {
            _ = flush.notified() => false,
            _ = cancel.cancelled() => true,
        };
        let deadline = tokio::time::Instant::now() + SETTLE_DELAY;
        while !stop {
            match limiter.upgrade() {
                Some(l) if l.urgent.swap(false, Ordering::Relaxed) => break,
                Some(_) => {}
                None => return,
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = flush.notified() => {}
                _ = cancel.cancelled() => stop = true,
            }
        }
        let Some(l) = limiter.upgrade() else { return };
        l.round_trip(Ask::Nothing, "settle").await;
        if stop {
            return;
        }
    }
}

/// One session's view of the limiter.
struct SessionLimiter {
    limiter: Arc<Limiter>,
    tenant: String,
    provider: String,
    limit_key: String,
}

impl SessionLimiter {
    fn rules(&self, model: &str) -> Vec<&Rule> {
        self.limiter
            .rules
            .iter()
            .filter(|r| r.matches(&self.provider, model, &self.tenant))
            .collect()
    }

    fn field(&self, model: &str) -> String {
        format!("{}|{model}", self.limit_key)
    }

    /// A call on a key with no rule whose answers announce their limits: it goes while
    /// what they last said is left (requests, and tokens for its estimate) lasts, and
    /// waits for the reset otherwise. One round trip.
    async fn reserve_learned(&self, field: &str, ask: &CallAsk<'_>) -> Admit {
        let tokens = ask.input_tokens.saturating_add(ask.max_output_tokens);
        match self
            .limiter
            .round_trip(Ask::Learned { field, tokens }, "reserve")
            .await
        {
            Some((0, wait_ms, ..)) => Admit::Wait {
                // Spread over a tenth of the wait: the first calls past the reset bring
                // back what the key really has left before the rest go.
                after: Duration::from_millis(
                    wait_ms.saturating_add(jitter((wait_ms / 10).clamp(HOLD_JITTER_MS, 1000))),
                ),
                reason: "provider",
            },
            _ => Admit::Go(Permit::default()),
        }
    }

    /// A call under configured rules: one round trip, which books a later start when
    /// the windows are full until then and the caller takes that wait.
    async fn reserve_rules(&self, field: &str, rules: &[&Rule], ask: &CallAsk<'_>) -> Admit {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let ttl_ms = rules
            .iter()
            .map(|r| r.settings.reservation_ttl_secs.saturating_mul(1000))
            .max()
            .unwrap_or(300_000);
        let answer = self
            .limiter
            .round_trip(
                Ask::Rules {
                    id: &id,
                    ttl_ms,
                    ask,
                    field,
                    rules,
                    limit_key: &self.limit_key,
                },
                "reserve",
            )
            .await;
        let Some((go, n, delay, tight, why)) = answer else {
            return Admit::Go(Permit::default());
        };
        let why = match why.as_str() {
            "rpm" => "rpm",
            "tpm" => "tpm",
            "concurrency" => "concurrency",
            _ => "",
        };
        if go != 1 {
            return Admit::Wait {
                after: Duration::from_millis(n),
                reason: if why.is_empty() { "concurrency" } else { why },
            };
        }
        let conc: Vec<String> = rules
            .iter()
            .filter(|r| r.settings.concurrency.is_some_and(|c| c > 0))
            .map(|r| r.key(&self.limit_key))
            .collect();
        if !conc.is_empty() {
            let ttl = i64::try_from(ttl_ms).unwrap_or(i64::MAX);
            let delay = i64::try_from(delay).unwrap_or(i64::MAX);
            self.limiter
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    id.clone(),
                    Live {
                        keys: conc,
                        ttl_ms: ttl,
                        renew_at: now_ms().saturating_add(delay).saturating_add(ttl / 3),
                        tight: tight == 1,
                    },
                );
        }
        Admit::Go(Permit {
            id,
            reserved_tokens: n,
            start_after: Duration::from_millis(delay),
            waits_for: why,
        })
    }
}

#[async_trait]
impl Admission for SessionLimiter {
    async fn reserve(&self, ask: &CallAsk<'_>) -> Admit {
        let field = self.field(ask.model);
        let rules = self.rules(ask.model);
        let mut waited_for_probe = false;
        loop {
            let now = now_ms();
            if let Some(until) = self.limiter.hold(&field)
                && until > now
            {
                let left = u64::try_from(until.saturating_sub(now)).unwrap_or(0);
                return Admit::Wait {
                    after: Duration::from_millis(left.saturating_add(jitter(HOLD_JITTER_MS))),
                    reason: "provider",
                };
            }
            if !rules.is_empty() {
                return self.reserve_rules(&field, &rules, ask).await;
            }
            if self.limiter.conn.is_none() {
                return Admit::Go(Permit::default());
            }
            if self.limiter.is_announced(&field) {
                return self.reserve_learned(&field, ask).await;
            }
            if waited_for_probe {
                return Admit::Go(Permit::default());
            }
            let waiting = {
                let mut probes = self
                    .limiter
                    .probes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                match probes.get(&field) {
                    Some(Probe::Quiet) => return Admit::Go(Permit::default()),
                    Some(Probe::InFlight(n)) => Some(n.clone().notified_owned()),
                    None => {
                        forget_quiet(&mut probes);
                        probes.insert(field.clone(), Probe::InFlight(Arc::new(Notify::new())));
                        None
                    }
                }
            };
            let Some(waiting) = waiting else {
                // The probe: other workers may know what the key has left.
                return match self.reserve_learned(&field, ask).await {
                    Admit::Go(_) => Admit::Go(Permit {
                        id: PROBE.to_string(),
                        ..Permit::default()
                    }),
                    other => {
                        self.limiter.end_probe(&field, None);
                        other
                    }
                };
            };
            let _ = tokio::time::timeout(PROBE_WAIT, waiting).await;
            waited_for_probe = true;
        }
    }

    async fn settle(&self, ask: &CallAsk<'_>, permit: Permit, report: &CallReport) {
        let field = self.field(ask.model);
        let live = self
            .limiter
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&permit.id);
        let hold = hold_for(report)
            .map(|d| now_ms().saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
        if let Some(until) = hold {
            self.limiter.note_hold(&field, until);
        }
        let left = report
            .limits
            .as_ref()
            .filter(|l| l.remaining_requests.is_some() || l.remaining_tokens.is_some());
        if left.is_some() {
            self.limiter.note_announced(&field);
        }
        let probe = (permit.id == PROBE)
            .then(|| (left.is_none() && report.usage.is_some()).then_some(Probe::Quiet));
        let keys: Vec<String> = if permit.id.is_empty() || permit.id == PROBE {
            Vec::new()
        } else {
            self.rules(ask.model)
                .iter()
                .map(|r| r.key(&self.limit_key))
                .collect()
        };
        if self.limiter.conn.is_none() || (keys.is_empty() && hold.is_none() && left.is_none()) {
            if let Some(found) = probe {
                self.limiter.end_probe(&field, found);
            }
            return;
        }
        let ms = |d: Option<Duration>| {
            d.map_or(-1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        };
        let count = |n: Option<u64>| n.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        let settlement = Settlement {
            id: permit.id,
            used: report.usage.map_or(-1, |u| {
                i64::try_from(u.input_tokens.saturating_add(u.output_tokens)).unwrap_or(i64::MAX)
            }),
            out: report
                .usage
                .map_or(-1, |u| i64::try_from(u.output_tokens).unwrap_or(i64::MAX)),
            field: field.clone(),
            hold: hold.unwrap_or(0),
            announced: [
                count(left.and_then(|l| l.remaining_requests)),
                ms(left.and_then(|l| l.reset_requests)),
                count(left.and_then(|l| l.remaining_tokens)),
                ms(left.and_then(|l| l.reset_tokens)),
                count(left.and_then(|l| l.limit_requests)),
                count(left.and_then(|l| l.limit_tokens)),
            ],
            keys,
        };
        match probe {
            // A probe's answer is recorded before the calls waiting for it go, so that
            // they count against what it announced (once per key and worker).
            Some(found) => {
                self.limiter.defer(settlement, false);
                self.limiter.round_trip(Ask::Nothing, "settle").await;
                self.limiter.end_probe(&field, found);
            }
            // Off the call path: the next reservation of this worker carries it, unless
            // the fleet should hear of it now (a hold; or, for a key no rule governs, what
            // the provider says is left, which paces every worker and is stale a moment
            // later) or its slot is wanted back.
            None => {
                let paces = left.is_some() && settlement.keys.is_empty();
                let urgent = hold.is_some() || paces || live.is_some_and(|l| l.tight);
                self.limiter.defer(settlement, urgent);
            }
        }
    }
}

/// How long the provider's answer says its key is spent: a refusal's `retry-after`, else
/// the reset of the window its headers say is empty.
fn hold_for(report: &CallReport) -> Option<Duration> {
    let spent = report
        .limits
        .as_ref()
        .and_then(agentq_agent::provider::RateLimitInfo::exhausted_for);
    match report.rate_limited {
        Some(after) => Some(after.or(spent).unwrap_or(DEFAULT_HOLD)),
        None => spent,
    }
    .filter(|d| !d.is_zero())
}

/// Keep the probes' record bounded (a session names its model): at [`MAX_FIELDS`] the
/// keys found quiet are forgotten, and probed again when next called.
fn forget_quiet(probes: &mut HashMap<String, Probe>) {
    if probes.len() >= MAX_FIELDS {
        probes.retain(|_, p| matches!(p, Probe::InFlight(_)));
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn jitter(max_ms: u64) -> u64 {
    let r = uuid::Uuid::new_v4().as_u128();
    u64::try_from(r % u128::from(max_ms.max(1))).unwrap_or(0)
}

/// Read the limiter's state from Redis (the admin route): every rule key in use with
/// its counts, and the holds not yet past.
pub async fn read_state<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
) -> Result<LimiterState> {
    let now = now_ms();
    let keys: Vec<String> = redis::cmd("SMEMBERS")
        .arg(INDEX_KEY)
        .query_async(conn)
        .await?;
    let mut rules = Vec::new();
    let mut gone = Vec::new();
    for k in keys {
        let cfg: HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(format!("{k}:cfg"))
            .query_async(conn)
            .await?;
        if cfg.is_empty() {
            // Expired: no call used the rule for a window and a reservation's life.
            gone.push(k);
            continue;
        }
        let window_ms = cfg.get("window_ms").copied().unwrap_or(60_000);
        let since = now.saturating_sub(i64::try_from(window_ms).unwrap_or(i64::MAX));
        let (requests, in_flight, tokens): (u64, u64, Option<i64>) = redis::pipe()
            .cmd("ZCOUNT")
            .arg(format!("{k}:r"))
            .arg(format!("({since}"))
            .arg("+inf")
            .cmd("ZCOUNT")
            .arg(format!("{k}:c"))
            .arg(format!("({now}"))
            .arg("+inf")
            .cmd("GET")
            .arg(format!("{k}:tt"))
            .query_async(conn)
            .await?;
        rules.push(RuleState {
            key: k.strip_prefix(PREFIX).unwrap_or(&k).to_string(),
            requests_per_window: cfg.get("rpm").copied().unwrap_or(0),
            tokens_per_window: cfg.get("tpm").copied().unwrap_or(0),
            concurrency: cfg.get("concurrency").copied().unwrap_or(0),
            window_ms,
            requests,
            tokens: tokens.unwrap_or(0),
            in_flight,
        });
    }
    if !gone.is_empty() {
        let _: redis::RedisResult<i64> = redis::cmd("SREM")
            .arg(INDEX_KEY)
            .arg(&gone)
            .query_async(conn)
            .await;
    }
    let held: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(HOLDS_KEY)
        .query_async(conn)
        .await?;
    let mut holds: Vec<HoldState> = held
        .into_iter()
        .filter(|(_, until)| *until > now)
        .filter_map(|(key, until)| {
            Some(HoldState {
                key,
                until: chrono::DateTime::from_timestamp_millis(until)?,
            })
        })
        .collect();
    holds.sort_by(|a, b| a.key.cmp(&b.key));
    rules.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(LimiterState { rules, holds })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn rule(toml: &str) -> Rule {
        let s: LimitSettings = toml::from_str(toml).unwrap();
        Limiter::new(&[s], None).unwrap().rules.remove(0)
    }

    #[test]
    fn rules_match_provider_model_glob_and_tenant() {
        let r = rule("provider = \"openai\"\nmodel = \"gpt-4o*\"\nrpm = 60");
        assert!(r.matches("openai", "gpt-4o-mini", "acme"));
        assert!(!r.matches("openai", "o3", "acme"));
        assert!(!r.matches("anthropic", "gpt-4o", "acme"));
        let t = rule("provider = \"openai\"\ntenant = \"acme\"\nrpm = 60");
        assert!(t.matches("openai", "anything", "acme"));
        assert!(!t.matches("openai", "anything", "other"));
        assert_ne!(t.key("k"), r.key("k"), "a tenant's rule counts on its own");
        assert_ne!(r.key("k1"), r.key("k2"), "per provider key");
    }

    #[test]
    fn allowances_scale_to_the_window() {
        let r = rule("provider = \"openai\"\nrpm = 600\ntpm = 90\nwindow_secs = 1");
        assert_eq!(r.per_window(r.settings.rpm), 10);
        assert_eq!(r.per_window(r.settings.tpm), 1, "never below one");
        assert_eq!(r.per_window(None), 0);
        assert_eq!(r.window_ms(), 1050, "with its arrival guard");
        let r = rule("provider = \"openai\"\nrpm = 600");
        assert_eq!(r.window_ms(), 60_250);
    }

    #[test]
    fn holds_come_from_refusals_and_spent_windows() {
        let limits = agentq_agent::provider::RateLimitInfo {
            remaining_requests: Some(0),
            reset_requests: Some(Duration::from_secs(7)),
            ..Default::default()
        };
        let refused = |after, limits| CallReport {
            rate_limited: Some(after),
            limits,
            ..Default::default()
        };
        assert_eq!(
            hold_for(&refused(Some(Duration::from_secs(3)), Some(limits.clone()))),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            hold_for(&refused(None, Some(limits.clone()))),
            Some(Duration::from_secs(7))
        );
        assert_eq!(hold_for(&refused(None, None)), Some(DEFAULT_HOLD));
        let answered = CallReport {
            limits: Some(limits),
            ..Default::default()
        };
        assert_eq!(hold_for(&answered), Some(Duration::from_secs(7)));
        assert_eq!(hold_for(&CallReport::default()), None);
    }
}
