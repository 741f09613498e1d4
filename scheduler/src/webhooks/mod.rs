//! Signed webhooks: the delivery settings ([`WebhookSettings`], from `[webhooks]`), the
//! secrets and signatures ([`sign`]), where deliveries may go ([`target`]), the delivery
//! loop ([`deliver`]) and what the routes of `/v1/webhooks` do with endpoints
//! ([`manage`]). The outbox itself is written by the store, in the transaction of each
//! change it announces (migration 0020's triggers).

use std::time::Duration;

use agentq_core::config::{Secret, WebhooksSection};

pub mod deliver;
pub(crate) mod manage;
pub mod sign;
pub mod target;

pub use deliver::{Clock, Deliverer, ManualClock, SystemClock};
pub use sign::Signer;
pub use target::Destinations;

/// The shortest operator key accepted (bytes).
pub const MIN_KEY_BYTES: usize = 32;

/// How this process delivers webhooks (`[webhooks]`, and the operator's key).
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub destinations: Destinations,
    pub signer: Signer,
    /// One attempt, from connecting to the end of the answer.
    pub timeout: Duration,
    pub max_response_bytes: usize,
    pub retry_for: Duration,
    pub max_backoff: Duration,
    pub disable_after: Duration,
    pub max_in_flight: usize,
    pub max_in_flight_per_endpoint: usize,
    pub max_endpoints: u32,
    pub retention: Duration,
    pub poll_interval: Duration,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings::new(&WebhooksSection::default(), None)
    }
}

impl WebhookSettings {
    /// `[webhooks]` with the operator's key (`None`: see [`Signer::new`]).
    pub fn new(s: &WebhooksSection, key: Option<Secret>) -> Self {
        WebhookSettings {
            destinations: Destinations::new(s.allowed_hosts.clone()),
            signer: Signer::new(key),
            timeout: Duration::from_secs(s.timeout_secs),
            max_response_bytes: s.max_response_bytes,
            retry_for: Duration::from_secs(s.retry_for_secs),
            max_backoff: Duration::from_secs(s.max_backoff_secs),
            disable_after: Duration::from_secs(s.disable_after_secs),
            max_in_flight: s.max_in_flight.max(1),
            max_in_flight_per_endpoint: s.max_in_flight_per_endpoint.max(1),
            max_endpoints: s.max_endpoints,
            retention: Duration::from_secs(s.retention_secs),
            poll_interval: Duration::from_millis(s.poll_interval_ms.max(1)),
        }
    }

    /// `[webhooks]` with the key read from the variable `key_env` names: unset is allowed
    /// (with a warning: a reader of the database could then sign), shorter than
    /// [`MIN_KEY_BYTES`] is an error naming the variable.
    pub fn from_section(s: &WebhooksSection) -> agentq_core::Result<Self> {
        let key = match std::env::var(&s.key_env) {
            Ok(k) if k.len() >= MIN_KEY_BYTES => Some(Secret::new(k)),
            Ok(k) if k.is_empty() => None,
            Ok(_) => {
                return Err(agentq_core::Error::Config(format!(
                    "{} (webhooks.key_env) must hold at least {MIN_KEY_BYTES} bytes",
                    s.key_env
                )));
            }
            Err(_) => None,
        };
        if key.is_none() {
            tracing::warn!(
                variable = %s.key_env,
                "no webhook key: signing secrets are derived from the database alone, so a \
                 reader of the database could sign deliveries; set the variable (32 bytes or \
                 more) before registering endpoints"
            );
        }
        Ok(WebhookSettings::new(s, key))
    }
}
