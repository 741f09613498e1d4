//! agentq-limiter (`agentq_core::admission`): the fleet-wide rate limiter, the
//! [`Admission`](agentq_agent::driver::Admission) every worker's LLM calls pass, kept in Redis so that all workers share one
//! count per provider endpoint and key.
//!
//! # Configured limits (`[[limits]]`)
//! A call falls under every rule whose provider, model glob and tenant match. Each rule
//! keeps, per provider endpoint and key ([`LlmProvider::limit_key`](agentq_agent::provider::LlmProvider::limit_key)), sliding-window
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
//! keeps it. A call that never went out
//! ([`CallReport::unsent`](agentq_agent::driver::CallReport::unsent)) gives its place in
//! the windows back; the loop sends that report for a call that would start later than
//! its booking allows ([`Permit::start_by`](agentq_agent::driver::Permit::start_by): half
//! the window's arrival guard after its booked start) and asks again.
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
//!   others wait (at most `PROBE_WAIT`) for what its answer says, so that a batch does
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
//! reservation took within `SETTLE_DELAY` — at once for what the fleet must hear now (a
//! hold; for a key no rule governs, what the provider announced is left) or a slot of a
//! rule more than half full. So a call under configured rules costs one round trip, and
//! one on a key paced by what it announces two (its admission, and the news of what is
//! left). A limiter that cannot reach Redis lets
//! calls through, with a warning and the `agentq_admission_limiter_errors_total` metric:
//! a limiter outage never fails sessions (settlements it could not write are kept for the
//! next round trip).
//!
//! # Modules
//! `rule` compiles the configured rules, `limiter` holds what a worker knows, `session`
//! admits and settles one session's calls, `script` is the round trip to `admit.lua`
//! whose Redis layout is `keys`, `fleet` the background exchange with the fleet, `state`
//! the admin view, `metric` the failures counted.

mod clock;
mod conn;
mod fleet;
mod keys;
mod limiter;
mod metric;
mod rule;
mod script;
mod session;
mod state;

pub use agentq_types::limiter::{HoldState, LimiterState, RuleState};
pub use fleet::{CLOSED_RETRY, HOLD_REFRESH};
pub use keys::{FIELDS_KEY, HOLDS_KEY, INDEX_KEY, MAX_FIELDS, MAX_TAGS, TAG_IDLE_MS, TAGS_KEY};
pub use limiter::Limiter;
pub use metric::{ERRORS_HELP, ERRORS_METRIC, errors};
pub use state::read_state;
