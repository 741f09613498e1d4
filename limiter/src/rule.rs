//! A `[[limits]]` rule, compiled: which calls it governs, the Redis prefix of its
//! counters and its allowances scaled to its window.

use std::time::Duration;

use agentq_error::{Error, Result};
use agentq_types::config::LimitSettings;

/// A `[[limits]]` rule, compiled.
pub(crate) struct Rule {
    pub(crate) settings: LimitSettings,
    glob: globset::GlobMatcher,
}

impl Rule {
    /// Compile the configured rules (a model glob that does not parse is a configuration
    /// error).
    pub(crate) fn compile_all(limits: &[LimitSettings]) -> Result<Vec<Rule>> {
        limits
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
            .collect()
    }

    pub(crate) fn matches(&self, provider: &str, model: &str, tenant: &str) -> bool {
        self.settings.provider == provider
            && self.glob.is_match(model)
            && self.settings.tenant.as_deref().is_none_or(|t| t == tenant)
    }

    /// The Redis prefix of this rule's counters for one provider key (and tenant), under
    /// `prefix`, that key's (`Keys::prefix`).
    pub(crate) fn key(&self, prefix: &str, limit_key: &str) -> String {
        let s = &self.settings;
        match &s.tenant {
            Some(t) => format!("{prefix}{}:{}:{t}|{limit_key}", s.provider, s.model),
            None => format!("{prefix}{}:{}:*|{limit_key}", s.provider, s.model),
        }
    }

    /// The window the counts are kept over: the configured one, plus [`Rule::guard_ms`].
    pub(crate) fn window_ms(&self) -> u64 {
        self.configured_ms().saturating_add(self.guard_ms())
    }

    fn configured_ms(&self) -> u64 {
        self.settings.window_secs.clamp(1, 60).saturating_mul(1000)
    }

    /// A guard for the time between admitting a call and its request reaching the
    /// provider. Callers waiting on a full window all wake when its oldest call leaves
    /// it, so the next window's calls leave in a burst; without the guard, the provider
    /// (which counts at arrival) sees the late arrivals of one burst and the early ones
    /// of the next in one of its windows.
    fn guard_ms(&self) -> u64 {
        (self.configured_ms() / 20).clamp(50, 250)
    }

    /// How late after its booked start a call under this rule may still go (zero: any
    /// time, for a rule of calls in flight only): half the guard, the other half left
    /// for its request's way to the provider. A call later than that could arrive in one
    /// window of the provider's with calls booked a window after it.
    pub(crate) fn lateness(&self) -> Duration {
        if self.settings.rpm.is_none() && self.settings.tpm.is_none() {
            return Duration::ZERO;
        }
        Duration::from_millis(self.guard_ms() / 2)
    }

    /// A per-minute allowance scaled to the rule's window (at least 1).
    pub(crate) fn per_window(&self, per_minute: Option<u64>) -> u64 {
        per_minute.map_or(0, |m| {
            (m.saturating_mul(self.settings.window_secs.clamp(1, 60)) / 60).max(1)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn rule(toml: &str) -> Rule {
        let s: LimitSettings = toml::from_str(toml).unwrap();
        Rule::compile_all(&[s]).unwrap().remove(0)
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
        assert_ne!(
            t.key("p:", "k"),
            r.key("p:", "k"),
            "a tenant's rule counts on its own"
        );
        assert_ne!(r.key("p:", "k1"), r.key("p:", "k2"), "per provider key");
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
    fn a_call_may_start_late_by_half_the_arrival_guard() {
        let r = rule("provider = \"openai\"\nrpm = 600\nwindow_secs = 4");
        assert_eq!(r.lateness(), Duration::from_millis(100));
        let r = rule("provider = \"openai\"\ntpm = 6000");
        assert_eq!(r.lateness(), Duration::from_millis(125));
        let r = rule("provider = \"openai\"\nrpm = 600\nwindow_secs = 1");
        assert_eq!(r.lateness(), Duration::from_millis(25));
        let r = rule("provider = \"openai\"\nconcurrency = 4");
        assert_eq!(
            r.lateness(),
            Duration::ZERO,
            "a slot in flight is not booked ahead"
        );
    }
}
