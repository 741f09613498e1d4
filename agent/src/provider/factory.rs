//! Building a provider from a name and settings, shared by `agentq run`, the worker and
//! the demo. Credentials come from the settings the caller passes, never from a session
//! and never from the environment: only a caller that means to (`agentq run`, through
//! [`ProviderSettings::from_env`]) puts the environment's keys into them.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::provider::anthropic::{self, AnthropicConfig, AnthropicProvider};
use crate::provider::endpoint;
use crate::provider::openai::{self, OpenAiConfig, OpenAiProvider};
use crate::provider::scripted::ScriptedProvider;
use crate::provider::transport::Transport;
use crate::provider::{HttpTimeouts, LlmProvider};

/// Host-side provider settings: keys and the endpoints they belong to. An endpoint left
/// `None` is the provider's public API, and its key goes there.
#[derive(Clone, Default)]
pub struct ProviderSettings {
    pub openai_base_url: Option<String>,
    pub openai_api_key: Option<String>,
    pub anthropic_base_url: Option<String>,
    pub anthropic_api_key: Option<String>,
    /// JSON script for the scripted provider; `None` plays the built-in demo script.
    pub script: Option<String>,
    /// How the HTTP providers' calls travel to their endpoints.
    pub transport: Transport,
}

impl std::fmt::Debug for ProviderSettings {
    // By hand so a key never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = |k: &Option<String>| k.as_ref().map(|_| "<redacted>");
        f.debug_struct("ProviderSettings")
            .field("openai_base_url", &self.openai_base_url)
            .field("openai_api_key", &key(&self.openai_api_key))
            .field("anthropic_base_url", &self.anthropic_base_url)
            .field("anthropic_api_key", &key(&self.anthropic_api_key))
            .field("script", &self.script.as_ref().map(|s| s.len()))
            .field("transport", &self.transport)
            .finish()
    }
}

impl ProviderSettings {
    /// Read from the process environment, for a caller that runs on the operator's own
    /// behalf (`agentq run`): `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        ProviderSettings {
            openai_base_url: var("OPENAI_BASE_URL"),
            openai_api_key: var("OPENAI_API_KEY"),
            anthropic_base_url: var("ANTHROPIC_BASE_URL"),
            anthropic_api_key: var("ANTHROPIC_API_KEY"),
            script: None,
            transport: Transport::default(),
        }
    }
}

/// The model used when a session names none.
pub fn default_model(provider: &str) -> &'static str {
    match provider {
        "anthropic" => "claude-sonnet-4-5",
        "scripted" => "scripted",
        _ => "gpt-4o-mini",
    }
}

/// Whether the named provider runs a web search itself ([`LlmProvider::web_search`]),
/// known from the name alone, for a check made before any provider is built (a request
/// naming its provider).
pub fn searches_the_web(provider: &str) -> bool {
    provider == "anthropic"
}

/// Build the named provider from `settings` alone; nothing here reads the environment.
/// `base_url` (a session's) replaces the configured endpoint; the configured key goes
/// with it only when it names that same endpoint ([`endpoint::resolve`]), so a session
/// cannot have the host's key sent anywhere else. A malformed `base_url` (not http(s), or
/// with userinfo, a query or a fragment) is refused.
pub fn build(
    name: &str,
    base_url: Option<&str>,
    settings: &ProviderSettings,
) -> Result<Arc<dyn LlmProvider>> {
    match name {
        "openai" => {
            let configured = settings
                .openai_base_url
                .as_deref()
                .unwrap_or(openai::DEFAULT_BASE_URL);
            let (url, key) = endpoint::resolve(
                "openai",
                configured,
                base_url,
                settings.openai_api_key.as_deref(),
            )?;
            Ok(Arc::new(OpenAiProvider::new(OpenAiConfig {
                base_url: url,
                api_key: key.map(str::to_string),
                timeouts: HttpTimeouts::default(),
                transport: settings.transport,
                extra_headers: Vec::new(),
            })?))
        }
        "anthropic" => {
            let configured = settings
                .anthropic_base_url
                .as_deref()
                .unwrap_or(anthropic::DEFAULT_BASE_URL);
            let (url, key) = endpoint::resolve(
                "anthropic",
                configured,
                base_url,
                settings.anthropic_api_key.as_deref(),
            )?;
            Ok(Arc::new(AnthropicProvider::new(AnthropicConfig {
                base_url: url,
                api_key: key.map(str::to_string),
                transport: settings.transport,
                ..AnthropicConfig::default()
            })?))
        }
        "scripted" => match &settings.script {
            Some(json) => Ok(Arc::new(ScriptedProvider::shared(json)?)),
            None => Ok(Arc::new(ScriptedProvider::demo())),
        },
        other => Err(Error::Config(format!(
            "unknown provider `{other}` (expected openai, anthropic or scripted)"
        ))),
    }
}
