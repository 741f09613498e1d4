//! The limiter's layout in Redis: every key it reads or writes, and the bound on the
//! `limit_key|model` fields they hold. The Lua script (`admit.lua`) is handed these names.

/// Every key of the limiter carries the hash tag `{limit}`: a Redis Cluster keeps them in
/// one slot, as the script that touches several of them at once needs.
pub(crate) const PREFIX: &str = "agentq:{limit}:";
/// The set of every rule key in use (the admin view lists them).
pub const INDEX_KEY: &str = "agentq:{limit}:keys";
/// Hash: `limit_key|model` → hold until (ms since the epoch).
pub const HOLDS_KEY: &str = "agentq:{limit}:holds";
/// Hash: `limit_key|model` → when an answer last announced its limits (ms).
pub(crate) const ANNOUNCED_KEY: &str = "agentq:{limit}:holds:announced";
/// The prefix of the counters a key and model announce (what is left until the reset,
/// and the limits), which the script names from the field.
pub(crate) const FIELD_PREFIX: &str = "agentq:{limit}:";

/// Hash: `limit_key|model` → the learned average of output tokens.
pub(crate) const AVERAGES_KEY: &str = "agentq:{limit}:avg";
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
