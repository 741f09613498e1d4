//! One round trip to the limiter's Lua script (`admit.lua`): the settlements it carries,
//! then what it asks for (nothing more, a call under configured rules, or a call on a key
//! paced by what it announces), and the script's answer.

use std::collections::HashMap;

use agentq_agent::driver::CallAsk;

use crate::clock::now_ms;
use crate::keys::{Keys, MAX_FIELDS, MAX_TAGS, TAG_IDLE_MS, TAG_RENEW_MS, TAGS_KEY};
use crate::limiter::{Limiter, Settlement};
use crate::rule::Rule;

impl Settlement {
    pub(crate) fn push_args(&self, inv: &mut redis::ScriptInvocation<'_>) {
        inv.arg(&self.id)
            .arg(self.used)
            .arg(self.out)
            .arg(&self.field)
            .arg(self.hold)
            .arg(i32::from(self.unsent))
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
    /// One round trip on `tag`: the pending settlements of that tag, then `ask`; the
    /// pending settlements of other tags go in round trips of their own (a script call is
    /// one slot). On failure the settlements are kept for the next one.
    pub(crate) async fn round_trip(&self, tag: &str, ask: Ask<'_>, what: &str) -> Option<Answer> {
        self.conn.as_ref()?;
        let mut mine = Vec::new();
        let mut others: Vec<(String, Vec<Settlement>)> = Vec::new();
        for s in self.take_pending() {
            if s.tag == tag {
                mine.push(s);
            } else {
                match others.iter_mut().find(|(t, _)| *t == s.tag) {
                    Some((_, v)) => v.push(s),
                    None => others.push((s.tag.clone(), vec![s])),
                }
            }
        }
        for (t, settlements) in others {
            self.invoke(&t, settlements, Ask::Nothing, "settle").await;
        }
        self.invoke(tag, mine, ask, what).await
    }

    /// Every pending settlement, one round trip per tag.
    pub(crate) async fn settle_all(&self) {
        let mut by_tag: Vec<(String, Vec<Settlement>)> = Vec::new();
        for s in self.take_pending() {
            match by_tag.iter_mut().find(|(t, _)| *t == s.tag) {
                Some((_, v)) => v.push(s),
                None => by_tag.push((s.tag.clone(), vec![s])),
            }
        }
        for (t, settlements) in by_tag {
            self.invoke(&t, settlements, Ask::Nothing, "settle").await;
        }
    }

    async fn invoke(
        &self,
        tag: &str,
        settlements: Vec<Settlement>,
        ask: Ask<'_>,
        what: &str,
    ) -> Option<Answer> {
        let mut conn = self.conn.clone()?;
        if settlements.is_empty() && matches!(ask, Ask::Nothing) {
            return None;
        }
        self.announce_tag(tag).await;
        let keys = Keys::of(tag);
        let mut inv = self.script.prepare_invoke();
        inv.key(&keys.averages)
            .key(&keys.index)
            .key(&keys.holds)
            .key(&keys.announced)
            .key(&keys.fields)
            .arg(now_ms())
            .arg(&keys.prefix)
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
                    inv.arg(r.key(&keys.prefix, limit_key))
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

    /// On a cluster, list `tag` in `TAGS_KEY` the first time this worker uses it, and
    /// again every [`TAG_RENEW_MS`] while it does, so that every worker's read of the holds
    /// and the admin view find its keys. The listing trims the tags idle past
    /// [`TAG_IDLE_MS`] (and the oldest beyond [`MAX_TAGS`]); the read of the holds keeps
    /// the keys of the tags listed (`fleet.rs`).
    async fn announce_tag(&self, tag: &str) {
        let Some(mut conn) = self.conn.clone() else {
            return;
        };
        let now = now_ms();
        let due = |tags: &HashMap<String, i64>| {
            tags.get(tag)
                .is_none_or(|at| now.saturating_sub(*at) >= TAG_RENEW_MS)
        };
        if !self.cluster || !due(&self.tags.lock().unwrap_or_else(|e| e.into_inner())) {
            return;
        }
        let mut listing = redis::pipe();
        listing
            .cmd("ZADD")
            .arg(TAGS_KEY)
            .arg(now)
            .arg(tag)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(TAGS_KEY)
            .arg("-inf")
            .arg(format!("({}", now.saturating_sub(TAG_IDLE_MS)))
            .ignore()
            .cmd("ZREMRANGEBYRANK")
            .arg(TAGS_KEY)
            .arg(0)
            .arg(-1 - i64::try_from(MAX_TAGS).unwrap_or(i64::MAX - 1))
            .ignore();
        let listed: redis::RedisResult<()> = listing.query_async(&mut conn).await;
        if listed.is_ok() {
            let mut tags = self.tags.lock().unwrap_or_else(|e| e.into_inner());
            // Forgetting what was announced costs only announcing it again.
            if tags.len() >= MAX_TAGS {
                tags.clear();
            }
            tags.insert(tag.to_string(), now);
        }
    }
}
