//! Loading: the file (refused when it names a credential), then the environment layer
//! (every variable of [`SETTINGS`], the provider keys and the secrets other settings name),
//! then a command's flags; and what the provider factory is handed from the result.

use std::collections::BTreeMap;
use std::path::Path;

use agentq_agent::provider::factory::ProviderSettings;

use super::providers::ProvidersSection;
use super::registry::{KEYS, SETTINGS, describe};
use super::settings::{DEFAULT_FILE, Settings};
use super::values::Secret;
use crate::error::{Error, Result};

impl Settings {
    /// [`Settings::load_with`] on the process environment.
    pub fn load(path: Option<&Path>) -> Result<Settings> {
        Self::load_with(path, |k| std::env::var(k).ok())
    }

    /// The file (`path`, an error if it does not exist; else `./agentq.toml` when
    /// present), then the environment given as a lookup function. Not validated: a
    /// command adds its flags first ([`Settings::resolve`]).
    pub fn load_with(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings> {
        let mut settings = match path {
            Some(p) => Self::from_file(p)?,
            None => {
                let p = Path::new(DEFAULT_FILE);
                if p.is_file() {
                    Self::from_file(p)?
                } else {
                    Settings::default()
                }
            }
        };
        settings.apply_env(env, None)?;
        Ok(settings)
    }

    /// The file, then the environment of only the settings named in `keys` (file keys,
    /// e.g. `api_url`): for a command that needs a few settings, so that a variable meant
    /// for another command (`AGENTQ_WORKER_CONCURRENCY=auto`) cannot stop it. Not
    /// validated.
    pub fn load_only(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        keys: &[&str],
    ) -> Result<Settings> {
        let mut settings = Self::load_with(path, |_| None)?;
        settings.apply_env(env, Some(keys))?;
        Ok(settings)
    }

    /// What every command that runs something builds its settings with: the file, the
    /// environment, then `flags` (the command's own overrides), validated.
    pub fn resolve(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        flags: impl FnOnce(&mut Settings),
    ) -> Result<Settings> {
        let mut settings = Self::load_with(path, env)?;
        flags(&mut settings);
        settings.validate()?;
        Ok(settings)
    }

    /// Parse a TOML file (no environment applied).
    pub fn from_file(path: &Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parse TOML text (no environment applied).
    pub fn from_toml(text: &str) -> Result<Settings> {
        // Checked before parsing so the message says why, not just "unknown field".
        let raw: toml::Table =
            toml::from_str(text).map_err(|e| Error::Config(e.to_string().trim().to_string()))?;
        if let Some(field) = credential_key(&raw, "") {
            return Err(Error::Config(format!(
                "`{field}` is not allowed in the config file: provider keys are read only \
                 from the environment (OPENAI_API_KEY, ANTHROPIC_API_KEY)"
            )));
        }
        toml::from_str(text).map_err(|e| Error::Config(e.to_string().trim().to_string()))
    }

    /// The environment over the settings; `only`: just the settings with these keys, and
    /// no provider keys.
    fn apply_env(
        &mut self,
        env: impl Fn(&str) -> Option<String>,
        only: Option<&[&str]>,
    ) -> Result<()> {
        // An empty variable counts as unset (a common result of `FOO= cmd` or templating).
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        for s in SETTINGS {
            let (Some(name), Some(apply)) = (s.env, s.apply) else {
                continue;
            };
            if only.is_some_and(|keys| !keys.contains(&s.key)) {
                continue;
            }
            if let Some(v) = var(name) {
                apply(self, &v)
                    .map_err(|why| Error::Config(format!("{name} (`{}`): {why}", s.key)))?;
            }
        }
        if only.is_none() {
            self.apply_secrets(var);
        }
        Ok(())
    }

    /// The secrets, each from the variable that holds it: the provider keys, the hooks'
    /// headers, the MCP servers' variables and headers, and the tenants' keys.
    fn apply_secrets(&mut self, var: impl Fn(&str) -> Option<String>) {
        for (name, set) in KEYS {
            set(&mut self.providers, var(name).map(Secret::new));
        }
        for hook in &mut self.hooks {
            if let Some(name) = &hook.header_env {
                hook.header_value = var(name).map(Secret::new);
            }
        }
        for server in &mut self.mcp.servers {
            server.env_values = server
                .env
                .iter()
                .filter_map(|n| var(n).map(|v| (n.clone(), Secret::new(v))))
                .collect();
            server.header_values = server
                .headers
                .iter()
                .filter_map(|(h, n)| var(n).map(|v| (h.clone(), Secret::new(v.trim()))))
                .collect();
        }
        for t in self.providers.tenants.values_mut() {
            let read = |name: &Option<String>| {
                name.as_deref()
                    .and_then(|n| var(n.trim()))
                    .map(|v| Secret::new(v.trim()))
            };
            t.openai_api_key = read(&t.openai_key_env);
            t.anthropic_api_key = read(&t.anthropic_key_env);
        }
    }

    /// The provider of sessions that name none: `worker.default_provider` when set; else
    /// `scripted` when a script is given (choosing a script is choosing that provider);
    /// else the provider the environment configures, OpenAI before Anthropic (a key or an
    /// endpoint); else none, and such sessions fail with
    /// [`NO_MODEL`](super::providers::NO_MODEL). A fake model is never the default: its
    /// answers look real.
    pub fn default_provider(&self) -> Option<&str> {
        let p = &self.providers;
        if let Some(explicit) = &self.worker.default_provider {
            Some(explicit)
        } else if p.script.is_some() {
            Some("scripted")
        } else if p.openai_api_key.is_some() || p.openai_base_url.is_some() {
            Some("openai")
        } else if p.anthropic_api_key.is_some() || p.anthropic_base_url.is_some() {
            Some("anthropic")
        } else {
            None
        }
    }

    /// What the agent's provider factory needs: endpoints and keys (the script is read
    /// separately, by [`ProvidersSection::read_script`]).
    pub fn provider_settings(&self) -> ProviderSettings {
        let p = &self.providers;
        let key = |k: &Option<Secret>| k.as_ref().map(|s| s.expose().to_string());
        ProviderSettings {
            openai_base_url: p.openai_base_url.clone(),
            openai_api_key: key(&p.openai_api_key),
            anthropic_base_url: p.anthropic_base_url.clone(),
            anthropic_api_key: key(&p.anthropic_api_key),
            script: None,
            transport: p.transport(),
        }
    }

    /// [`Settings::provider_settings`] of each tenant with a `[providers.tenants.<name>]`
    /// table: its own keys, its endpoints or else the shared ones.
    pub fn tenant_provider_settings(&self) -> BTreeMap<String, ProviderSettings> {
        let p = &self.providers;
        let key = |k: &Option<Secret>| k.as_ref().map(|s| s.expose().to_string());
        p.tenants
            .iter()
            .map(|(name, t)| {
                let own = ProviderSettings {
                    openai_base_url: t
                        .openai_base_url
                        .clone()
                        .or_else(|| p.openai_base_url.clone()),
                    openai_api_key: key(&t.openai_api_key),
                    anthropic_base_url: t
                        .anthropic_base_url
                        .clone()
                        .or_else(|| p.anthropic_base_url.clone()),
                    anthropic_api_key: key(&t.anthropic_api_key),
                    script: None,
                    transport: p.transport(),
                };
                (name.clone(), own)
            })
            .collect()
    }
}

impl ProvidersSection {
    /// The scripted provider's script, read from [`ProvidersSection::script`].
    pub fn read_script(&self) -> Result<Option<String>> {
        let Some(path) = &self.script else {
            return Ok(None);
        };
        std::fs::read_to_string(path).map(Some).map_err(|e| {
            Error::Config(format!(
                "{}: cannot read {}: {e}",
                describe("providers.script"),
                path.display()
            ))
        })
    }
}

/// The dotted name of the first key anywhere in `table` that looks like a credential.
fn credential_key(table: &toml::Table, prefix: &str) -> Option<String> {
    for (k, v) in table {
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if is_credential_name(k) && !names_a_variable(k, v) {
            return Some(name);
        }
        if let toml::Value::Table(t) = v
            && let Some(found) = credential_key(t, &name)
        {
            return Some(found);
        }
    }
    None
}

/// A `…_env` setting whose value is an environment variable's name (such as
/// `workspace.s3.secret_key_env = "AWS_SECRET_ACCESS_KEY"`) names where a secret is, and
/// holds none; any other value of it is refused like a secret.
fn names_a_variable(k: &str, v: &toml::Value) -> bool {
    k.ends_with("_env")
        && v.as_str().is_some_and(|s| {
            !s.is_empty()
                && s.len() <= 128
                && !s.starts_with(|c: char| c.is_ascii_digit())
                && s.bytes()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
        })
}

/// Whether a field name looks like it holds a secret (`api_key`, `openai_api_key`,
/// `apiKey`, `secret`, `password`, `access_token`…). Shared with the HTTP API, which
/// refuses such fields in a session request.
pub fn is_credential_name(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    n.contains("apikey")
        || n.contains("secret")
        || n.contains("password")
        || n.contains("accesstoken")
        || n.contains("authtoken")
        || n.contains("bearertoken")
        || n == "authorization"
        || n == "token"
        || n == "key"
}
