//! The operator's hooks (`[[hooks]]`) and guardian (`[guardian]`), built from the
//! settings once per process and shared by every session it runs: the worker, `agentq
//! dev` and `agentq run` put them in each session's guard pipeline.

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::guard::{
    DEFAULT_GUARDIAN_PROMPT, ExternalHook, Guardian, GuardianOptions, Guards, Hook, HookOptions,
    HookTarget, LlmGuardian,
};
use agentq_agent::observe::{LlmCallInfo, Observer};
use agentq_agent::provider::{LlmProvider, factory};

use crate::config::{Settings, describe};
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Most tokens the guardian may answer with: a verdict is one short JSON object, and
/// reasoning models spend some before it.
const GUARDIAN_MAX_TOKENS: u32 = 1_024;

/// What the operator configured for every session's pipeline.
#[derive(Clone, Default)]
pub struct OperatorGuards {
    pub hooks: Vec<Arc<dyn Hook>>,
    pub guardian: Option<Arc<dyn Guardian>>,
    /// The provider the guardian's reviews go to: a host admits them under its endpoint,
    /// key and the guardian's model, not the session's.
    pub guardian_provider: Option<Arc<dyn LlmProvider>>,
    /// The model the guardian asks (operator-configured: a metrics label of its own).
    pub guardian_model: Option<String>,
}

impl std::fmt::Debug for OperatorGuards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorGuards")
            .field("hooks", &self.hooks.len())
            .field("guardian", &self.guardian.is_some())
            .finish()
    }
}

/// Counts hook calls, and the guardian's tokens, in the process's registry.
struct HookMetrics(&'static Metrics);

impl Observer for HookMetrics {
    fn hook_call(&self, point: &str, outcome: &str) {
        self.0.hook_calls.with_label_values(&[point, outcome]).inc();
    }

    fn guardian_call(&self, info: &LlmCallInfo<'_>) {
        if let Some(usage) = &info.usage {
            self.0.guardian_spent(info.provider, info.model, usage);
        }
    }
}

fn invalid(key: &str, why: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {why}", describe(key)))
}

impl OperatorGuards {
    /// Build every hook and the guardian from validated settings, counting their calls in
    /// `metrics`. Fails, naming the setting, on what only building can find: a header's
    /// variable that is not set, a bad glob, the guardian's script or provider.
    pub fn from_settings(settings: &Settings, metrics: &'static Metrics) -> Result<Self> {
        let observer: Arc<dyn Observer> = Arc::new(HookMetrics(metrics));
        let mut hooks: Vec<Arc<dyn Hook>> = Vec::with_capacity(settings.hooks.len());
        for (i, h) in settings.hooks.iter().enumerate() {
            let key = |field: &str| format!("hooks[{i}].{field}");
            let target = match (&h.url, &h.command) {
                (Some(url), _) => {
                    let header = match (&h.header, &h.header_env) {
                        (Some(name), Some(var)) => {
                            let value = h.header_value.as_ref().ok_or_else(|| {
                                invalid(
                                    &key("header_env"),
                                    format!("the environment variable {var} is not set"),
                                )
                            })?;
                            Some((name.clone(), value.expose().to_string()))
                        }
                        _ => None,
                    };
                    HookTarget::Webhook {
                        url: url.clone(),
                        header,
                    }
                }
                (None, Some(argv)) => HookTarget::Command { argv: argv.clone() },
                (None, None) => return Err(invalid(&format!("hooks[{i}]"), "no url or command")),
            };
            let hook = ExternalHook::new(
                HookOptions {
                    point: h.on,
                    target,
                    timeout: Duration::from_millis(h.timeout_ms),
                    on_timeout: h.timeout_behavior(),
                    on_error: h.error_behavior(),
                    tools: h.tools.clone(),
                },
                observer.clone(),
            )
            .map_err(|e| invalid(&format!("hooks[{i}]"), e))?;
            hooks.push(Arc::new(hook));
        }
        let (guardian, guardian_provider, guardian_model) = match &settings.guardian.provider {
            None => (None, None, None),
            Some(provider) => {
                let reviewer = guardian(settings, provider, observer)?;
                let llm = reviewer.provider().clone();
                let model = reviewer.model().to_string();
                (Some(reviewer as Arc<dyn Guardian>), Some(llm), Some(model))
            }
        };
        Ok(OperatorGuards {
            hooks,
            guardian,
            guardian_provider,
            guardian_model,
        })
    }

    /// Put them in a session's pipeline (after any hooks it has already).
    pub fn apply(&self, guards: &mut Guards) {
        guards.hooks.extend(self.hooks.iter().cloned());
        if self.guardian.is_some() {
            guards.guardian = self.guardian.clone();
        }
    }
}

/// The guardian, on the process's own provider settings (never a session's endpoint).
fn guardian(
    settings: &Settings,
    provider: &str,
    observer: Arc<dyn Observer>,
) -> Result<Arc<LlmGuardian>> {
    let g = &settings.guardian;
    let mut providers = settings.provider_settings();
    providers.script = match &g.script {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
            invalid(
                "guardian.script",
                format!("cannot read {}: {e}", path.display()),
            )
        })?),
        None if provider == "scripted" => {
            return Err(invalid(
                "guardian.script",
                "a scripted guardian needs a script of its verdicts",
            ));
        }
        None => None,
    };
    let llm =
        factory::build(provider, None, &providers).map_err(|e| invalid("guardian.provider", e))?;
    let model = g
        .model
        .clone()
        .unwrap_or_else(|| factory::default_model(provider).to_string());
    let reviewer = LlmGuardian::new(
        llm,
        GuardianOptions {
            model,
            prompt: g
                .prompt
                .clone()
                .unwrap_or_else(|| DEFAULT_GUARDIAN_PROMPT.to_string()),
            timeout: Duration::from_millis(g.timeout_ms),
            on_error: g.on_error,
            on_truncated: g.on_truncated,
            tools: g.tools.clone(),
            max_tokens: GUARDIAN_MAX_TOKENS,
        },
        observer,
    )
    .map_err(|e| invalid("guardian.tools", e))?;
    Ok(Arc::new(reviewer))
}
