//! The limiter's layout in Redis: every key it reads or writes, and the bound on the
//! `limit_key|model` fields they hold. The Lua script (`admit.lua`) is handed these names.
//!
//! Every key one script call touches carries one hash tag, so that a Redis Cluster keeps
//! them in one slot. On one server that tag is `{limit}` for every provider key. On a
//! cluster each provider key (endpoint and API key, `LlmProvider::limit_key`) has a tag of
//! its own, `{limit:<hash of the key>}`, so that the fleet's calls spread over the shards
//! instead of all waiting on one; the tags in use are listed in [`TAGS_KEY`] (a key of
//! its own slot) for the periodic read of the holds and the admin view. A tag no worker
//! used for [`TAG_IDLE_MS`] leaves that list, and its keys expire with it: a fleet that
//! saw many provider keys come and go keeps only the ones still in use.

/// The tag of every key on one server (and of the constants below).
pub(crate) const SINGLE_TAG: &str = "{limit}";
/// The set of every rule key in use (the admin view lists them).
pub const INDEX_KEY: &str = "agentq:{limit}:keys";
/// Hash: `limit_key|model` → hold until (ms since the epoch).
pub const HOLDS_KEY: &str = "agentq:{limit}:holds";
/// Sorted set: every `limit_key|model` the hashes may hold a field of, scored by its last
/// settlement (ms).
pub const FIELDS_KEY: &str = "agentq:{limit}:fields";
/// Sorted set: every tag in use on a cluster (with its keys, one per provider key),
/// scored by when a worker last announced it (ms since the epoch). An earlier layout kept
/// a plain set, never trimmed, under `agentq:limit:tags`; this one has a name of its own
/// so that the two never meet as one key of two types.
pub const TAGS_KEY: &str = "agentq:limit:tags_seen";
/// How long a tag stays listed, and its keys kept, after a worker last announced it.
pub const TAG_IDLE_MS: i64 = 24 * 60 * 60 * 1000;
/// How often a worker announces again a tag it still uses: well within [`TAG_IDLE_MS`],
/// so a tag in use never lapses.
pub(crate) const TAG_RENEW_MS: i64 = 60 * 60 * 1000;
/// The most tags [`TAGS_KEY`] lists (and each worker's read of the holds reads): past it
/// the ones announced least recently are dropped.
pub const MAX_TAGS: usize = 4096;

/// The most `limit_key|model` fields the limiter keeps in Redis per tag (and each worker
/// in memory). A session names its model, so without a bound every model string a
/// caller ever tried would stay in every hash above for good (and in every worker's
/// periodic read of the holds); past it the fields settled least recently are forgotten.
/// A field forgotten while in use loses only what was learned of it (a hold, an average,
/// what the provider announced), which its next answers teach again.
pub const MAX_FIELDS: usize = 4096;

/// The tag of `limit_key`'s keys: [`SINGLE_TAG`] on one server, else one per key (a
/// stable hash, FNV-1a, so that every worker of every release agrees).
pub(crate) fn tag_of(cluster: bool, limit_key: &str) -> String {
    if !cluster {
        return SINGLE_TAG.to_string();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in limit_key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{{limit:{h:016x}}}")
}

/// The tag a key of [`Keys`] carries (its text up to the first `}`).
pub(crate) fn tag_in(key: &str) -> Option<&str> {
    let start = key.find('{')?;
    let end = key[start..].find('}')? + start;
    Some(&key[start..=end])
}

/// The tags listed in [`TAGS_KEY`] and announced within [`TAG_IDLE_MS`] of `now`, the
/// most recent first, at most [`MAX_TAGS`].
pub(crate) async fn live_tags<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    now: i64,
) -> redis::RedisResult<Vec<String>> {
    redis::cmd("ZREVRANGEBYSCORE")
        .arg(TAGS_KEY)
        .arg("+inf")
        .arg(now.saturating_sub(TAG_IDLE_MS))
        .arg("LIMIT")
        .arg(0)
        .arg(MAX_TAGS)
        .query_async(conn)
        .await
}

/// The keys of one tag.
pub(crate) struct Keys {
    /// The prefix of rule keys and of the per-model counters the script names.
    pub(crate) prefix: String,
    /// Set: every rule key in use.
    pub(crate) index: String,
    /// Hash: `limit_key|model` → hold until (ms).
    pub(crate) holds: String,
    /// Hash: `limit_key|model` → when an answer last announced its limits (ms).
    pub(crate) announced: String,
    /// Hash: `limit_key|model` → the learned average of output tokens.
    pub(crate) averages: String,
    /// Sorted set: the fields in use, scored by their last settlement.
    pub(crate) fields: String,
}

impl Keys {
    /// The keys that live as long as their tag is in use (the rule keys under `prefix`
    /// expire on their own).
    pub(crate) fn kept(&self) -> [&str; 5] {
        [
            &self.index,
            &self.holds,
            &self.announced,
            &self.averages,
            &self.fields,
        ]
    }

    pub(crate) fn of(tag: &str) -> Keys {
        let prefix = format!("agentq:{tag}:");
        Keys {
            index: format!("{prefix}keys"),
            holds: format!("{prefix}holds"),
            announced: format!("{prefix}holds:announced"),
            averages: format!("{prefix}avg"),
            fields: format!("{prefix}fields"),
            prefix,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn one_server_keeps_its_layout_and_a_cluster_tags_each_provider_key() {
        let one = Keys::of(&tag_of(false, "openai|https://a|k1"));
        assert_eq!(
            (one.prefix.as_str(), one.index.as_str(), one.holds.as_str()),
            ("agentq:{limit}:", INDEX_KEY, HOLDS_KEY)
        );
        assert_eq!(one.fields, FIELDS_KEY);
        let a = tag_of(true, "openai|https://a|k1");
        let b = tag_of(true, "openai|https://a|k2");
        assert_ne!(a, b);
        assert_eq!(a, tag_of(true, "openai|https://a|k1"));
        let keys = Keys::of(&a);
        for k in keys.kept() {
            assert_eq!(tag_in(k), Some(a.as_str()));
        }
    }
}
