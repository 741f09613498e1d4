//! `[scheduler]` (the HTTP API and the sweeper) and `[scheduling]` (how the dispatcher
//! shares each queue among tenants and batches), each field with its default.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::section::section;

section! {
    /// `[scheduler]`: the HTTP API and the sweeper.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct SchedulerSection {
        /// How often the sweeper looks for queued sessions without a stream entry.
        pub sweep_interval_secs: u64 = 5,
        /// Only sessions older than this are swept (younger ones may be between the insert
        /// and the `XADD` of a live request).
        pub sweep_age_secs: u64 = 10,
        pub max_prompt_bytes: usize = 1_000_000,
        /// Items of one `POST /v1/sessions/batch`, and of one `POST /v1/batches` with a
        /// JSON body.
        pub max_batch: usize = 10_000,
        /// Items of one `POST /v1/batches` uploaded as JSON Lines (read as a stream: the
        /// scheduler holds a line and a chunk of items at a time, whatever the count).
        pub max_batch_items: usize = 100_000,
        /// Queues whose consumer group is created at start.
        pub queues: Vec<String> = vec!["default".to_string()],
        /// Most queues there may be, the configured ones and those an admin creates: each
        /// is a Redis stream and a label value of the metrics.
        pub max_queues: usize = 64,
        /// A queue stream longer than this has its acked history trimmed by the sweeper
        /// (entries pending or not yet delivered are kept whatever the length).
        pub stream_max_len: u64 = 1_000_000,
        /// How long a verified API key is trusted without asking the database again: a
        /// revoked key is refused at most this long after `agentq keys revoke`, and its
        /// open event streams (and other answers still being sent) are cut as soon.
        pub key_cache_secs: u64 = 30,
        /// Open client connections at most; past it a new one is answered 503 and closed.
        pub max_connections: usize = 4096,
        /// Open connections at most that carried a request of one API key; past it a
        /// request with that key is answered 503 and its connection closed.
        pub max_connections_per_key: usize = 256,
        /// Open connections at most from one peer (an IPv4 address, an IPv6 /64). A new
        /// connection past it (or past `max_connections`) closes the oldest connection
        /// that has not authenticated a request yet (the peer's own, past this cap); only
        /// when every connection authenticated is the new one answered 503.
        pub max_connections_per_peer: usize = 256,
        /// Bytes of `POST /v1/sessions/batch` bodies read and decoded at once, across all
        /// requests (a batch takes about four times its body while it is created), one
        /// tenant's at most half of them; a batch whose body would go past either is
        /// answered 503 with `Retry-After`, one larger than half of it 413.
        pub batch_decode_bytes: usize = 64 * 1024 * 1024,
        /// Open event streams (`GET /v1/sessions/{id}/events`) at most, in all.
        pub max_event_streams: usize = 2048,
        /// Open event streams at most per tenant.
        pub max_event_streams_per_tenant: usize = 512,
        /// Open event streams at most per API key.
        pub max_event_streams_per_key: usize = 128,
        /// Seconds a client has to send a request's headers; also how long an idle
        /// keep-alive connection stays open.
        pub header_read_timeout_secs: u64 = 10,
        /// Seconds a client has to send a request's whole body.
        pub body_read_timeout_secs: u64 = 60,
        /// Seconds a write to a client may wait for it to take bytes; a client that reads
        /// nothing for as long (a stalled event stream, pipelined requests never read) is
        /// disconnected, so it cannot hold a connection forever.
        pub write_timeout_secs: u64 = 60,
    }
}

section! {
    /// `[scheduling]`: how the scheduler's dispatcher shares each queue among tenants and
    /// batches. A queue's stream is a short delivery buffer: past `buffer` sessions in it,
    /// new sessions wait in the store, and the dispatcher moves them in as it drains, by
    /// priority, then by weighted fair share across tenants and across each tenant's
    /// batches.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct SchedulingSection {
        /// Sessions of one queue in its stream and not yet claimed, at most, before new
        /// ones wait in the store for their turn.
        pub buffer: u32 = 1000,
        /// How often the dispatcher refills the buffers.
        pub dispatch_interval_ms: u64 = 100,
        /// Sessions of one tenant running or in a buffer at most, for a tenant without its
        /// own `max_running`. Unset: no cap.
        pub tenant_max_running: Option<u32> = None,
        /// `[scheduling.tenants.<name>]`: a tenant's weight and cap.
        pub tenants: BTreeMap<String, TenantScheduling> = BTreeMap::new(),
    }
}

impl SchedulingSection {
    /// How `tenant` is scheduled.
    pub fn share(&self, tenant: &str) -> crate::scheduling::TenantShare {
        let t = self.tenants.get(tenant);
        crate::scheduling::TenantShare {
            weight: t.map_or(1, |t| t.weight.max(1)),
            max_running: t.and_then(|t| t.max_running).or(self.tenant_max_running),
        }
    }
}

section! {
    /// One tenant's share of the queues.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct TenantScheduling {
        /// Its share relative to other tenants' (each has 1 unless set).
        pub weight: u32 = 1,
        /// Its sessions running or in a buffer at most.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_running: Option<u32> = None,
    }
}
