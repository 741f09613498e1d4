//! One round trip to the limiter's Lua script (`admit.lua`): the settlements it carries,
//! then what it asks for (nothing more, a call under configured rules, or a call on a key
//! paced by what it announces), and the script's answer.

use agentq_agent::driver::CallAsk;

use crate::clock::now_ms;
use crate::keys::{
    ANNOUNCED_KEY, AVERAGES_KEY, FIELD_PREFIX, FIELDS_KEY, HOLDS_KEY, INDEX_KEY, MAX_FIELDS,
};
use crate::limiter::{Limiter, Settlement};
use crate::rule::Rule;

impl Settlement {
    pub(crate) fn push_args(&self, inv: &mut redis::ScriptInvocation<'_>) {
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
pub(crate) enum Ask<'a> {
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
pub(crate) type Answer = (i64, u64, u64, i64, String);

impl Limiter {
    /// One round trip: the pending settlements, then `ask`. On failure the settlements
    /// are kept for the next one.
    pub(crate) async fn round_trip(&self, ask: Ask<'_>, what: &str) -> Option<Answer> {
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
}
