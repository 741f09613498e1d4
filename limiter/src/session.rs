//! One session's admission ([`Admission`] for its tenant, provider and key): holds first,
//! then the configured rules, then what the key announces, else a probe of a key nothing
//! is known of; and the settlement of each call with what its answer reported.

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::driver::{Admission, Admit, CallAsk, CallReport, Permit};
use agentq_agent::provider::LlmProvider;
use async_trait::async_trait;
use tokio::sync::Notify;

use crate::clock::{jitter, now_ms};
use crate::fleet::CLOSED_RETRY;
use crate::keys::{Keys, tag_of};
use crate::limiter::{Limiter, Live, Probe, Settlement, forget_quiet};
use crate::rule::Rule;
use crate::script::Ask;
use agentq_types::config::OnUnavailable;

/// Waiters on a hold wake spread over up to this long, not all in one instant.
const HOLD_JITTER_MS: u64 = 200;
/// The hold after a refusal that named no wait.
const DEFAULT_HOLD: Duration = Duration::from_secs(1);
/// The permit of a call that probes a key nothing is known of.
const PROBE: &str = "probe";
/// The longest a call waits for another's probe before going anyway.
const PROBE_WAIT: Duration = Duration::from_secs(5);

impl Limiter {
    /// The admission of one session's calls: its tenant and its provider (name and key).
    pub fn for_session(
        self: &Arc<Self>,
        tenant: &str,
        provider: &dyn LlmProvider,
    ) -> Arc<dyn Admission> {
        let limit_key = provider.limit_key();
        let tag = tag_of(self.cluster, &limit_key);
        Arc::new(SessionLimiter {
            limiter: self.clone(),
            tenant: tenant.to_string(),
            provider: provider.name().to_string(),
            prefix: Keys::of(&tag).prefix,
            tag,
            limit_key,
        })
    }
}

/// One session's view of the limiter.
struct SessionLimiter {
    limiter: Arc<Limiter>,
    tenant: String,
    provider: String,
    limit_key: String,
    /// The hash tag of the key's Redis keys, and their prefix.
    tag: String,
    prefix: String,
}

impl SessionLimiter {
    fn rules(&self, model: &str) -> Vec<&Rule> {
        self.limiter
            .rules
            .iter()
            .filter(|r| r.matches(&self.provider, model, &self.tenant))
            .collect()
    }

    /// Joined, not formatted: every call and every settlement asks for it.
    fn field(&self, model: &str) -> String {
        [self.limit_key.as_str(), "|", model].concat()
    }

    /// A call on a key with no rule whose answers announce their limits: it goes while
    /// what they last said is left (requests, and tokens for its estimate) lasts, and
    /// waits for the reset otherwise. One round trip.
    async fn reserve_learned(&self, field: &str, ask: &CallAsk<'_>) -> Admit {
        let tokens = ask.input_tokens.saturating_add(ask.max_output_tokens);
        match self
            .limiter
            .round_trip(&self.tag, Ask::Learned { field, tokens }, "reserve")
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
        // The script scores the booking by this worker's clock when it is sent, which is
        // no earlier than this (a trip that first carries another tag's settlements only
        // makes the call's latest start earlier: it asks again sooner, never later).
        let asked = tokio::time::Instant::now();
        let answer = self
            .limiter
            .round_trip(
                &self.tag,
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
            // Redis is configured and could not be reached.
            return match self.limiter.on_unavailable {
                OnUnavailable::Closed if self.limiter.conn.is_some() => Admit::Wait {
                    after: CLOSED_RETRY
                        .saturating_add(Duration::from_millis(jitter(HOLD_JITTER_MS))),
                    reason: "limiter",
                },
                _ => Admit::Go(Permit::default()),
            };
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
            .map(|r| r.key(&self.prefix, &self.limit_key))
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
            start_by: rules
                .iter()
                .map(|r| r.lateness())
                .filter(|l| !l.is_zero())
                .min()
                .and_then(|l| asked.checked_add(Duration::from_millis(delay).saturating_add(l))),
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
                .map(|r| r.key(&self.prefix, &self.limit_key))
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
            tag: self.tag.clone(),
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
            unsent: report.unsent,
        };
        match probe {
            // A probe's answer is recorded before the calls waiting for it go, so that
            // they count against what it announced (once per key and worker).
            Some(found) => {
                self.limiter.defer(settlement, false);
                self.limiter
                    .round_trip(&self.tag, Ask::Nothing, "settle")
                    .await;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

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
