//! [`RedisQueue`]: the [`crate::queue::Queue`] on Redis Streams.
//!
//! This module owns every Redis key and channel agentq uses for work and news:
//! - one stream per queue partition (`layout.rs`: `agentq:queue:<name>` with one
//!   partition on one server, else `agentq:queue:{<name>:<p>}`), read by the consumer
//!   group `agentq-workers` (created at id `0`, so entries added before the group are not
//!   lost); entries carry `session_id` and `reason`;
//! - the dead-letter stream (`agentq:dead`, or each partition's `agentq:dead:{<name>:<p>}`),
//!   the completion stream `agentq:completions`;
//! - the pub/sub channels `agentq:done`, `agentq:done:<id>` and `agentq:cancel`.
//!
//! # Redis Cluster
//! With `[redis] cluster`, the connections are cluster connections ([`connection`]'s
//! `Conn` is either kind) and no command, pipeline, `MULTI` or `XREAD` spans two slots:
//! the keys of a queue partition share a hash tag, a session's event stream is tagged with
//! its event bucket (one of [`EVENT_BUCKETS`]), a session's partition is a hash of its id, an enqueue of many is one pipeline
//! per partition, and each partition is read by a blocking reader of its own (`read.rs`).
//! Subscriptions connect to one seed node (a `PUBLISH` reaches every node's subscribers).
//!
//! # Connections
//! - Ordinary commands share one [`redis::aio::ConnectionManager`] (multiplexed, reconnects by itself
//!   after the server drops it; a command that fails while Redis is down returns a
//!   retryable error, and the next ones work once Redis is back).
//! - Blocking `XREADGROUP … BLOCK` runs on reader connections of its own, with no response
//!   timeout (redis-rs 1.x defaults to 500 ms, which would fail any longer block) but an
//!   outer deadline of `block` + [`READ_GRACE`]. A reader is checked out of a small idle
//!   list for the duration of one read and only returned after a complete reply (data or
//!   a server error such as `NOGROUP`): a read that fails, times out or is dropped
//!   mid-flight (cancelled) drops its connection, so no connection is ever reused with a
//!   reply still in flight. Entries a dropped read had already been delivered stay pending
//!   for the consumer: `read_own_pending` (ID `0`) or the reclaimer gets them back.
//! - Each subscription has a dedicated pub/sub connection; the returned stream reconnects
//!   and re-subscribes with backoff when the connection is lost (messages published while
//!   it is down are missed: pub/sub is fire-and-forget, the completion stream is the
//!   durable record). It pings the server periodically so a silently dead connection is
//!   noticed. The stream ends only when dropped.
//!
//! # Healing after a Redis restart without persistence
//! The streams and the group are gone then. `XADD … NOMKSTREAM` tells the enqueuer (nil
//! reply) that the stream is missing, so it re-creates stream and group before adding —
//! a stream never exists without its group, which KEDA's lag scaler needs. Reads, claims
//! and touches that get `NOGROUP` re-create the group (and retry, for reads).
//!
//! # Trimming
//! `XADD` to a queue stream trims nothing: `MAXLEN` would drop the oldest entries whether
//! or not they are acked, and the entry of a session that runs for hours is the oldest
//! one pending; once it is gone, a touch (`XCLAIM`) drops it from the pending list and a
//! dead worker's session is reclaimed by nobody. Acked history is dropped instead by
//! [`crate::queue::WorkQueue::trim`] (the scheduler's sweeper, past a length it is
//! configured with): `XTRIM MINID` at the oldest entry that is pending or not yet
//! delivered, read before the trim (an entry delivered meanwhile is newer than the group's
//! cursor read first, so it is kept). Entries are never `XDEL`eted, and the trim never passes the group's cursor, so
//! the group's `lag` stays known. The dead-letter and completion streams are capped at
//! [`HISTORY_MAXLEN`].

mod connection;
mod events;
mod health;
mod layout;
mod read;
mod readers;
mod reply;
mod signals;
mod subscription;
mod work;

pub use connection::RedisQueue;
pub use events::CLUSTER_POLL;
pub use layout::EVENT_BUCKETS;
pub use readers::READ_GRACE;

/// Approximate cap on `agentq:dead` and `agentq:completions`.
pub const HISTORY_MAXLEN: usize = 100_000;
/// Cap of each session's event stream: text deltas make it long; the transcript in the
/// store is the record, this is for following a session live.
pub const EVENTS_MAXLEN: usize = 20_000;
