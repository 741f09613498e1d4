//! `[webhooks]`: how the scheduler delivers signed webhooks to tenants' endpoints (where
//! they may go, how long a delivery may take, how long it is retried), each field with its
//! default.

use serde::{Deserialize, Serialize};

use super::section::section;

section! {
    /// `[webhooks]`: the delivery of signed webhooks (`/v1/webhooks`).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct WebhooksSection {
        /// Destinations an endpoint may name although they are private, loopback or
        /// link-local (`host` or `host:port`: `hooks.internal`, `10.0.0.7:8443`,
        /// `[::1]:9000`). Every other destination must resolve to public addresses only,
        /// checked when the endpoint is created and again at every delivery.
        pub allowed_hosts: Vec<String> = Vec::new(),
        /// The environment variable holding the key every endpoint's signing secret is
        /// derived from (at least 32 bytes). Without it the secrets are derived from the
        /// database alone, so a reader of the database could sign.
        pub key_env: String = "AGENTQ_WEBHOOKS_KEY".to_string(),
        /// Seconds one attempt may take, from connecting to the end of the answer.
        pub timeout_secs: u64 = 15,
        /// Bytes of an endpoint's answer read at most (the rest is not waited for).
        pub max_response_bytes: usize = 64 * 1024,
        /// Seconds a delivery is retried (with exponential backoff and jitter) after its
        /// event before it becomes a dead letter.
        pub retry_for_secs: u64 = 86_400,
        /// Longest wait between two attempts of one delivery, in seconds.
        pub max_backoff_secs: u64 = 3_600,
        /// Seconds an endpoint may fail continuously (no attempt succeeding) before it is
        /// disabled; its owner sees why and may enable it again.
        pub disable_after_secs: u64 = 432_000,
        /// Attempts in flight at once per scheduler, and per endpoint.
        pub max_in_flight: usize = 64,
        pub max_in_flight_per_endpoint: usize = 4,
        /// Endpoints one tenant may have.
        pub max_endpoints: u32 = 20,
        /// Seconds delivered deliveries and dead letters are kept and listed.
        pub retention_secs: u64 = 604_800,
        /// How often the delivery loop looks for due deliveries, in milliseconds.
        pub poll_interval_ms: u64 = 1_000,
    }
}
