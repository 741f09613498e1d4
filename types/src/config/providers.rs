//! `[providers]`: the endpoints, the scripted provider's script and the keys (read from
//! the environment only), shared and per tenant; how calls travel to the endpoints; and
//! the names of the providers.

use std::collections::BTreeMap;
use std::path::PathBuf;

use agentq_agent::provider::transport::{DEFAULT_STREAMS_PER_CONNECTION, HttpVersion, Transport};
use serde::{Deserialize, Serialize};

use super::section::section;
use super::values::Secret;

/// The providers a session (or `default_provider`) may name.
pub const PROVIDERS: &[&str] = &["openai", "anthropic", "scripted"];

/// Why a session that names no provider cannot run when
/// [`Settings::default_provider`](super::Settings::default_provider) is `None`, and how to
/// configure one: said at a worker's start and as the session's error.
pub const NO_MODEL: &str = "no model configured: set OPENAI_API_KEY (and OPENAI_BASE_URL \
     for another OpenAI-compatible server) or ANTHROPIC_API_KEY, or name a provider with \
     AGENTQ_DEFAULT_PROVIDER (--default-provider; `scripted` plays a script, no model)";

section! {
    /// `[providers]`: endpoints and the scripted provider's script from the file or the
    /// environment; keys from the environment only (never serialised, never read from the
    /// file); how calls travel to the endpoints.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ProvidersSection {
        pub openai_base_url: Option<String> = None,
        pub anthropic_base_url: Option<String> = None,
        /// A JSON script file for the scripted provider; `None` plays its built-in demo.
        pub script: Option<PathBuf> = None,
        /// The HTTP version of every provider's calls: HTTP/2 where an endpoint's TLS
        /// handshake agrees to it (`auto`), HTTP/1.1 only (`http1`), or HTTP/2 without
        /// asking (`http2`, for a plain-`http` endpoint known to speak it).
        pub http: HttpVersion = HttpVersion::Auto,
        /// Most calls one HTTP/2 connection carries at a time before another is opened: no
        /// more than the endpoint allows (calls past its limit wait).
        pub streams_per_connection: u32 = DEFAULT_STREAMS_PER_CONNECTION,
        #[serde(skip)]
        pub openai_api_key: Option<Secret> = None,
        #[serde(skip)]
        pub anthropic_api_key: Option<Secret> = None,
        /// Tenants with keys of their own (`[providers.tenants.<name>]`): their sessions use
        /// these endpoints and keys, never the shared ones above.
        pub tenants: BTreeMap<String, TenantProviders> = BTreeMap::new(),
    }
}

impl ProvidersSection {
    /// How calls travel, for the provider factory.
    pub fn transport(&self) -> Transport {
        Transport {
            http: self.http,
            streams_per_connection: self.streams_per_connection,
        }
    }
}

/// `[providers.tenants.<name>]`: one tenant's provider endpoints and the environment
/// variables holding its keys. A key this table names no variable for is no key: the
/// tenant's sessions never fall back to the shared keys. An endpoint left unset is the
/// shared one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantProviders {
    pub openai_base_url: Option<String>,
    pub anthropic_base_url: Option<String>,
    /// The environment variable that holds this tenant's OpenAI key.
    pub openai_key_env: Option<String>,
    /// The environment variable that holds this tenant's Anthropic key.
    pub anthropic_key_env: Option<String>,
    #[serde(skip)]
    pub openai_api_key: Option<Secret>,
    #[serde(skip)]
    pub anthropic_api_key: Option<Secret>,
}

impl TenantProviders {
    /// Each named variable that is unset or empty, with the setting naming it.
    pub fn missing_keys(&self) -> Vec<(&'static str, &str)> {
        [
            ("openai_key_env", &self.openai_key_env, &self.openai_api_key),
            (
                "anthropic_key_env",
                &self.anthropic_key_env,
                &self.anthropic_api_key,
            ),
        ]
        .into_iter()
        .filter_map(|(field, var, key)| match (var, key) {
            (Some(var), None) => Some((field, var.as_str())),
            _ => None,
        })
        .collect()
    }
}
