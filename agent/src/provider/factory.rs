//! Building a provider from a name and settings, shared by `agentq run`, the worker and
//! the demo. Credentials come from the host's configuration, never from a session.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::provider::LlmProvider;
use crate::provider::anthropic::{AnthropicConfig, AnthropicProvider};
use crate::provider::openai::{OpenAiConfig, OpenAiProvider};
use crate::provider::scripted::ScriptedProvider;

/// Host-side provider settings: keys and default endpoints.
#[derive(Debug, Clone, Default)]
pub struct ProviderSettings {
    pub openai_base_url: Option<String>,
    pub openai_api_key: Option<String>,
    pub anthropic_base_url: Option<String>,
    pub anthropic_api_key: Option<String>,
    /// JSON script for the scripted provider; `None` plays the built-in demo script.
    pub script: Option<String>,
}

impl ProviderSettings {
    /// `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        ProviderSettings {
            openai_base_url: var("OPENAI_BASE_URL"),
            openai_api_key: var("OPENAI_API_KEY"),
            anthropic_base_url: var("ANTHROPIC_BASE_URL"),
            anthropic_api_key: var("ANTHROPIC_API_KEY"),
            script: None,
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

/// Build the named provider. `base_url` overrides the settings' endpoint.
pub fn build(
    name: &str,
    base_url: Option<&str>,
    settings: &ProviderSettings,
) -> Result<Arc<dyn LlmProvider>> {
    match name {
        "openai" => {
            let mut cfg = OpenAiConfig::from_env();
            if let Some(u) = settings.openai_base_url.as_deref() {
                cfg.base_url = u.to_string();
            }
            if let Some(u) = base_url {
                cfg.base_url = u.to_string();
            }
            if settings.openai_api_key.is_some() {
                cfg.api_key = settings.openai_api_key.clone();
            }
            Ok(Arc::new(OpenAiProvider::new(cfg)?))
        }
        "anthropic" => {
            let mut cfg = AnthropicConfig::from_env();
            if let Some(u) = settings.anthropic_base_url.as_deref() {
                cfg.base_url = u.to_string();
            }
            if let Some(u) = base_url {
                cfg.base_url = u.to_string();
            }
            if settings.anthropic_api_key.is_some() {
                cfg.api_key = settings.anthropic_api_key.clone();
            }
            Ok(Arc::new(AnthropicProvider::new(cfg)?))
        }
        "scripted" => match &settings.script {
            Some(json) => Ok(Arc::new(ScriptedProvider::from_json(json)?)),
            None => Ok(Arc::new(ScriptedProvider::demo())),
        },
        other => Err(Error::Config(format!(
            "unknown provider `{other}` (expected openai, anthropic or scripted)"
        ))),
    }
}
