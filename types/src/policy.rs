//! The operator's policy over sessions: which providers, models, endpoints and tools a
//! tenant's sessions may use, and the upper bounds of their limits. Built once from
//! `[policy]` ([`Policy::from_section`]); the scheduler holds each request to it and the
//! worker holds each stored row to it again before running it, both through
//! [`TenantPolicy::check_request`] ([`request`], with the rest of a request's checks), so
//! a row written by an older or compromised scheduler cannot escalate. Pure: no I/O.
//!
//! A bound applies to what the client sent and to what it left at the default alike: a
//! value the client sent above the bound is refused naming the field; a default above it
//! becomes the bound (a client that says nothing gets what the operator allows, not an
//! error). `token_budget` and `timeout_secs` have no default: a session that sets none
//! gets the bound. A stored row counts as having sent everything ([`Sent::Stored`]).

use std::collections::BTreeSet;

use globset::{Glob, GlobSet, GlobSetBuilder};

use agentq_agent::provider::endpoint;
use agentq_agent::spec::{DEFAULT_WEB_SEARCH_MAX_USES, SessionSpec};

use crate::config::{PROVIDERS, PolicySection};
use crate::error::{Error, Result};
use crate::workspace_path::FileLimits;

pub use crate::auth::DEFAULT_TENANT;

/// A request beyond policy: the field it names and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyViolation {
    pub field: String,
    pub message: String,
}

fn violation(field: impl Into<String>, message: impl Into<String>) -> PolicyViolation {
    PolicyViolation {
        field: field.into(),
        message: message.into(),
    }
}

/// Which fields of the spec the client sent; the others hold their defaults.
#[derive(Debug, Clone, Copy)]
pub enum Sent<'a> {
    /// A request's top-level keys.
    Fields(&'a BTreeSet<String>),
    /// A stored spec: nothing in it can be told from a default, so every value counts as
    /// asked for.
    Stored,
}

impl Sent<'_> {
    fn has(&self, field: &str) -> bool {
        match self {
            Sent::Fields(f) => f.contains(field),
            Sent::Stored => true,
        }
    }
}

/// Where in a tree the session being admitted sits.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpawnContext {
    /// 0 for a root session.
    pub depth: u32,
}

/// A list of globs, with its text kept for messages.
#[derive(Debug, Clone)]
struct Globs {
    set: GlobSet,
    text: Vec<String>,
}

impl Globs {
    fn new(key: &str, patterns: &[String]) -> Result<Globs> {
        let mut b = GlobSetBuilder::new();
        for p in patterns {
            let glob = Glob::new(p.trim())
                .map_err(|e| Error::Config(format!("`{key}`: bad pattern `{p}`: {e}")))?;
            b.add(glob);
        }
        let set = b
            .build()
            .map_err(|e| Error::Config(format!("`{key}`: {e}")))?;
        Ok(Globs {
            set,
            text: patterns.to_vec(),
        })
    }

    fn matches(&self, name: &str) -> bool {
        self.set.is_match(name)
    }

    fn describe(&self) -> String {
        if self.text.is_empty() {
            "none".to_string()
        } else {
            self.text.join(", ")
        }
    }
}

/// The upper bounds of a tenant's limits; `None`: no bound beyond the API's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bounds {
    pub max_iterations: Option<u32>,
    pub max_tokens: Option<u32>,
    pub token_budget: Option<u64>,
    pub tool_timeout_secs: Option<u64>,
    pub approval_timeout_secs: Option<u64>,
    pub timeout_secs: Option<u64>,
    pub max_children: Option<usize>,
    pub max_depth: Option<u32>,
    pub max_tree_sessions: Option<u64>,
    pub max_web_search_uses: Option<u32>,
}

/// One tenant's rules, compiled.
#[derive(Debug, Clone)]
pub struct TenantPolicy {
    providers: Vec<String>,
    models: Globs,
    /// Normalised ([`normalize_base_url`]).
    base_urls: Vec<String>,
    tools: Globs,
    queues: Globs,
    pub bounds: Bounds,
    /// What a request's `files` may hold.
    pub files: FileLimits,
}

/// The global policy and each tenant's.
#[derive(Debug, Clone)]
pub struct Policy {
    global: TenantPolicy,
    tenants: std::collections::BTreeMap<String, TenantPolicy>,
}

impl Default for Policy {
    fn default() -> Self {
        // The default section always compiles (a unit test holds it).
        Policy::from_section(&PolicySection::default()).unwrap_or_else(|_| Policy::deny_all())
    }
}

impl Policy {
    /// Allows nothing: what a process falls back to when its section does not compile.
    pub fn deny_all() -> Policy {
        Policy {
            global: TenantPolicy::deny_all(),
            tenants: Default::default(),
        }
    }

    /// Compile `[policy]`; an error names the setting (`policy.tenants.acme.models`).
    pub fn from_section(section: &PolicySection) -> Result<Policy> {
        let global = TenantPolicy::compile(section, "policy")?;
        let mut tenants = std::collections::BTreeMap::new();
        for name in section.tenants.keys() {
            let key = format!("policy.tenants.{name}");
            tenants.insert(
                name.clone(),
                TenantPolicy::compile(&section.tenant(name), &key)?,
            );
        }
        Ok(Policy { global, tenants })
    }

    /// The rules for `tenant`: its override, or the global policy.
    pub fn for_tenant(&self, tenant: &str) -> &TenantPolicy {
        self.tenants.get(tenant).unwrap_or(&self.global)
    }

    /// The policy without tenant overrides.
    /// The tenants with rules of their own.
    pub fn tenant_names(&self) -> impl Iterator<Item = String> + '_ {
        self.tenants.keys().cloned()
    }

    pub fn global(&self) -> &TenantPolicy {
        &self.global
    }

    /// The most bytes of files any tenant's request may bring: what the body limit of
    /// `POST /v1/sessions` must make room for.
    pub fn max_input_bytes(&self) -> u64 {
        std::iter::once(&self.global)
            .chain(self.tenants.values())
            .map(|t| t.files.max_bytes)
            .max()
            .unwrap_or(0)
    }

    /// The models the policy names literally (not patterns), for every tenant: the
    /// models the operator configured, which the metrics may label by name.
    pub fn named_models(&self) -> Vec<String> {
        std::iter::once(&self.global)
            .chain(self.tenants.values())
            .flat_map(|t| t.models.text.iter())
            .map(|m| m.trim())
            .filter(|m| !m.is_empty() && !m.contains(['*', '?', '[', ']', '{', '}', '\\']))
            .map(str::to_string)
            .collect()
    }
}

impl TenantPolicy {
    fn deny_all() -> TenantPolicy {
        let empty = Globs {
            set: GlobSet::empty(),
            text: Vec::new(),
        };
        TenantPolicy {
            providers: Vec::new(),
            models: empty.clone(),
            base_urls: Vec::new(),
            tools: empty.clone(),
            queues: empty,
            bounds: Bounds::default(),
            files: FileLimits {
                max_files: 0,
                max_bytes: 0,
                ..FileLimits::DEFAULT
            },
        }
    }

    fn compile(s: &PolicySection, key: &str) -> Result<TenantPolicy> {
        for p in &s.providers {
            if !PROVIDERS.contains(&p.as_str()) {
                return Err(Error::Config(format!(
                    "`{key}.providers`: unknown provider `{p}` (expected {})",
                    PROVIDERS.join(", ")
                )));
            }
        }
        let base_urls = s
            .base_urls
            .iter()
            .map(|u| {
                normalize_base_url(u)
                    .map_err(|why| Error::Config(format!("`{key}.base_urls`: `{u}` {why}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(TenantPolicy {
            providers: s.providers.clone(),
            models: Globs::new(&format!("{key}.models"), &s.models)?,
            base_urls,
            tools: Globs::new(&format!("{key}.tools"), &s.tools)?,
            queues: Globs::new(&format!("{key}.queues"), &s.queues)?,
            bounds: Bounds {
                max_iterations: s.max_iterations,
                max_tokens: s.max_tokens,
                token_budget: s.token_budget,
                tool_timeout_secs: s.tool_timeout_secs,
                approval_timeout_secs: s.approval_timeout_secs,
                timeout_secs: s.timeout_secs,
                max_children: s.max_children,
                max_depth: s.max_depth,
                max_tree_sessions: s.max_tree_sessions,
                max_web_search_uses: s.max_web_search_uses,
            },
            files: FileLimits {
                max_files: s.max_input_files,
                max_bytes: s.max_input_bytes,
                max_path_bytes: s.max_path_bytes,
                max_path_depth: s.max_path_depth,
            },
        })
    }

    pub fn allows_provider(&self, name: &str) -> bool {
        self.providers.iter().any(|p| p == name)
    }

    pub fn allows_model(&self, name: &str) -> bool {
        self.models.matches(name)
    }

    pub fn allows_tool(&self, name: &str) -> bool {
        self.tools.matches(name)
    }

    /// Whether a session may send its requests to `url` (normalised before comparing; a
    /// URL that does not normalise is never allowed).
    pub fn allows_base_url(&self, url: &str) -> bool {
        normalize_base_url(url).is_ok_and(|n| self.base_urls.contains(&n))
    }

    /// The provider a session runs with (named, or the host's default) is allowed.
    pub fn check_provider(&self, name: &str) -> std::result::Result<(), PolicyViolation> {
        if self.allows_provider(name) {
            return Ok(());
        }
        Err(violation(
            "provider",
            format!(
                "`{name}` is not allowed by policy (allowed: {})",
                list_or_none(&self.providers)
            ),
        ))
    }

    /// The model a session runs with (named, or the host's default) is allowed.
    pub fn check_model(&self, name: &str) -> std::result::Result<(), PolicyViolation> {
        if self.allows_model(name) {
            return Ok(());
        }
        Err(violation(
            "model",
            format!(
                "`{name}` is not allowed by policy (allowed: {})",
                self.models.describe()
            ),
        ))
    }

    /// The first of `tools` the policy does not allow, as a violation of `tools[i]` (an
    /// MCP server's tools, `mcp__<server>__*`, are allowed like any other name).
    pub fn check_tools(&self, tools: &[String]) -> std::result::Result<(), PolicyViolation> {
        match tools.iter().enumerate().find(|(_, t)| !self.allows_tool(t)) {
            None => Ok(()),
            Some((i, t)) => Err(violation(
                format!("tools[{i}]"),
                format!(
                    "tool `{t}` is not allowed by policy (allowed: {})",
                    self.tools.describe()
                ),
            )),
        }
    }

    /// The queue a session is put on (named, or the default) is allowed: the queue picks
    /// the worker pool that runs it.
    pub fn check_queue(&self, name: &str) -> std::result::Result<(), PolicyViolation> {
        if self.queues.matches(name) {
            return Ok(());
        }
        Err(violation(
            "queue",
            format!(
                "`{name}` is not allowed by policy (allowed: {})",
                self.queues.describe()
            ),
        ))
    }

    /// Of `tools` (the host's defaults for a session that names none), those allowed.
    pub fn allowed_tools<'a>(&self, tools: &'a [String]) -> Vec<&'a String> {
        tools.iter().filter(|t| self.allows_tool(t)).collect()
    }

    /// The lower of the host's nesting limit and the policy's.
    pub fn max_depth(&self, host: u32) -> u32 {
        self.bounds.max_depth.map_or(host, |b| b.min(host))
    }

    /// Sessions one tree may create, its root included.
    pub fn max_tree_sessions(&self) -> u64 {
        self.bounds
            .max_tree_sessions
            .unwrap_or(crate::budget::DEFAULT_MAX_TREE_SESSIONS)
    }

    /// The lower of the host's sub-agent limit and the policy's.
    pub fn max_children(&self, host: usize) -> usize {
        self.bounds.max_children.map_or(host, |b| b.min(host))
    }

    /// Hold `spec` to this policy: every value the client sent is within it, every
    /// default above a bound is lowered to the bound, and an unset `token_budget` or
    /// `timeout_secs` gets the bound. What the spec leaves to the host (no provider, no
    /// model, no tools) is checked where the host's defaults are known: the worker.
    pub fn apply(
        &self,
        spec: &mut SessionSpec,
        sent: Sent<'_>,
        at: SpawnContext,
    ) -> std::result::Result<(), PolicyViolation> {
        if let Some(p) = &spec.provider {
            self.check_provider(p)?;
        }
        if let Some(m) = &spec.model {
            self.check_model(m)?;
        }
        if let Some(u) = &spec.base_url
            && !self.allows_base_url(u)
        {
            return Err(violation(
                "base_url",
                format!(
                    "`{u}` is not allowed by policy (allowed: {})",
                    list_or_none(&self.base_urls)
                ),
            ));
        }
        if let Some(tools) = &spec.tools {
            self.check_tools(tools)?;
        }
        let b = &self.bounds;
        bound(
            "max_iterations",
            &mut spec.max_iterations,
            b.max_iterations,
            sent,
        )?;
        bound("max_tokens", &mut spec.max_tokens, b.max_tokens, sent)?;
        bound(
            "tool_timeout_secs",
            &mut spec.tool_timeout_secs,
            b.tool_timeout_secs,
            sent,
        )?;
        bound(
            "approval_timeout_secs",
            &mut spec.approval_timeout_secs,
            b.approval_timeout_secs,
            sent,
        )?;
        bound_unset("token_budget", &mut spec.token_budget, b.token_budget)?;
        bound_unset("timeout_secs", &mut spec.timeout_secs, b.timeout_secs)?;
        bound_web_search(spec, b.max_web_search_uses)?;
        if let Some(max) = b.max_depth
            && at.depth > max
        {
            return Err(violation(
                "depth",
                format!(
                    "sub-agents may nest {max} levels deep by policy; this one is at depth {}",
                    at.depth
                ),
            ));
        }
        Ok(())
    }
}

/// `web_search.max_uses`: a value above the bound is refused; a session that may search
/// (it names the tool, or names no tools and leaves them to the host) and sets none gets
/// the bound when the default is above it.
fn bound_web_search(
    spec: &mut SessionSpec,
    max: Option<u32>,
) -> std::result::Result<(), PolicyViolation> {
    let Some(max) = max else {
        return Ok(());
    };
    match spec.web_search.as_ref().and_then(|w| w.max_uses) {
        Some(n) if n > max => Err(violation(
            "web_search.max_uses",
            format!("must be at most {max} by policy, not {n}"),
        )),
        Some(_) => Ok(()),
        None => {
            let may_search = spec.tools.is_none() || spec.web_search_index().is_some();
            if may_search && DEFAULT_WEB_SEARCH_MAX_USES > max {
                spec.web_search
                    .get_or_insert_with(Default::default)
                    .max_uses = Some(max);
            }
            Ok(())
        }
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

/// A limit with a default: a sent value above the bound is refused, a default above it
/// becomes the bound.
fn bound<T: Copy + PartialOrd + std::fmt::Display>(
    field: &'static str,
    value: &mut T,
    max: Option<T>,
    sent: Sent<'_>,
) -> std::result::Result<(), PolicyViolation> {
    let Some(max) = max else {
        return Ok(());
    };
    if *value <= max {
        return Ok(());
    }
    if sent.has(field) {
        return Err(violation(
            field,
            format!("must be at most {max} by policy, not {value}"),
        ));
    }
    *value = max;
    Ok(())
}

/// A limit without a default (unset means unlimited): unset becomes the bound, a value
/// above it is refused.
fn bound_unset<T: Copy + PartialOrd + std::fmt::Display>(
    field: &'static str,
    value: &mut Option<T>,
    max: Option<T>,
) -> std::result::Result<(), PolicyViolation> {
    let Some(max) = max else {
        return Ok(());
    };
    match *value {
        None => {
            *value = Some(max);
            Ok(())
        }
        Some(v) if v <= max => Ok(()),
        Some(v) => Err(violation(
            field,
            format!("must be at most {max} by policy, not {v}"),
        )),
    }
}

/// `base_url` as compared with the allowed ones: the endpoint it names, spelled one way
/// ([`endpoint::canonical`], the rule that also decides where a provider key may go).
/// Refused (the reason is returned): anything but http(s), a missing host, userinfo, a
/// query or a fragment — an allowed endpoint must not be a prefix that reaches elsewhere.
pub fn normalize_base_url(raw: &str) -> std::result::Result<String, String> {
    endpoint::canonical(raw)
}

pub mod request;

#[cfg(test)]
#[path = "policy/tests.rs"]
mod tests;
