//! The rules every setting must follow, checked once, after all the layers, by
//! [`Settings::validate`]: each error names the setting with its variable and flag.

use agentq_agent::guard::HookPoint;
use agentq_agent::provider::endpoint::check_base_url;

use super::{
    GuardianSection, HookSettings, MAX_GUARDIAN_TIMEOUT_MS, MAX_HOOK_TIMEOUT_MS, PROVIDERS,
    PolicySection, ProvidersSection, SchedulerSection, SchedulingSection, Secs, Settings,
    TenantPolicySection, WorkerSection, WorkspaceSection, describe,
};
use crate::error::{Error, Result};
use crate::policy::Policy;

/// The longest any timing setting may be: past a day it is a typo, and durations that
/// large would overflow the arithmetic of the timers built from them.
const MAX_TIMING_SECS: f64 = 86_400.0;
/// The largest file cap or workspace quota: 1 TiB.
const MAX_WORKSPACE_BYTES: u64 = 1 << 40;
/// Timers shorter than a millisecond would spin.
const MIN_TIMING_SECS: f64 = 0.001;

fn invalid(key: &str, why: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {why}", describe(key)))
}

impl Settings {
    /// Every rule the settings must follow, checked once after all the layers; the error
    /// names the setting with its variable and flag.
    pub fn validate(&self) -> Result<()> {
        worker_timings(&self.worker)?;
        worker_limits(&self.worker)?;
        scheduler(&self.scheduler)?;
        scheduling(&self.scheduling)?;
        policy(&self.policy, &self.worker)?;
        for (i, hook) in self.hooks.iter().enumerate() {
            hook_rules(i, hook)?;
        }
        guardian(&self.guardian)?;
        for (i, l) in self.limits.iter().enumerate() {
            limit_rules(i, l)?;
        }
        workspace(&self.workspace, &self.worker)?;
        providers(&self.providers)?;
        prices(&self.prices)?;
        budgets(&self.budgets)?;
        for (key, addr) in [
            ("api_addr", &self.api_addr),
            ("metrics_addr", &self.metrics_addr),
            ("api_url", &self.api_url),
        ] {
            if addr.trim().is_empty() {
                return Err(invalid(key, "must not be empty"));
            }
        }
        Ok(())
    }
}

fn timing(key: &str, v: Secs, min: f64, max: f64) -> Result<()> {
    if v.0.is_finite() && (min..=max).contains(&v.0) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("must be a number of seconds from {min} to {max}, not {v}"),
    ))
}

fn worker_timings(w: &WorkerSection) -> Result<()> {
    for (key, v) in [
        ("worker.lease_ttl_secs", w.lease_ttl_secs),
        ("worker.heartbeat_secs", w.heartbeat_secs),
        ("worker.reclaim_min_idle_secs", w.reclaim_min_idle_secs),
        ("worker.reclaim_interval_secs", w.reclaim_interval_secs),
        ("worker.drain_timeout_secs", w.drain_timeout_secs),
    ] {
        timing(key, v, MIN_TIMING_SECS, MAX_TIMING_SECS)?;
    }
    // 0 never suspends; at most an hour of holding a slot.
    timing(
        "worker.rate_limit_suspend_secs",
        w.rate_limit_suspend_secs,
        0.0,
        3_600.0,
    )?;
    // Kept for following a finished session afterwards: a second at least, 30 days at most.
    timing("worker.event_ttl_secs", w.event_ttl_secs, 1.0, 2_592_000.0)?;
    if w.heartbeat_secs >= w.lease_ttl_secs {
        return Err(invalid(
            "worker.heartbeat_secs",
            format!(
                "{} must be shorter than {} ({}), or leases expire between heartbeats and \
                 running sessions are taken over",
                w.heartbeat_secs,
                describe("worker.lease_ttl_secs"),
                w.lease_ttl_secs
            ),
        ));
    }
    if w.reclaim_min_idle_secs <= w.heartbeat_secs {
        return Err(invalid(
            "worker.reclaim_min_idle_secs",
            format!(
                "{} must be longer than {} ({}): a live worker touches its entries every \
                 heartbeat, so a shorter idle time takes over sessions that are running",
                w.reclaim_min_idle_secs,
                describe("worker.heartbeat_secs"),
                w.heartbeat_secs
            ),
        ));
    }
    Ok(())
}

fn worker_limits(w: &WorkerSection) -> Result<()> {
    range("worker.concurrency", w.concurrency, 1, 100_000)?;
    range("worker.max_attempts", w.max_attempts, 1, 10_000)?;
    range("worker.read_block_ms", w.read_block_ms, 1, 60_000)?;
    range(
        "worker.checkpoint_batch_max",
        w.checkpoint_batch_max,
        1,
        10_000,
    )?;
    range("worker.checkpoint_writers", w.checkpoint_writers, 1, 64)?;
    range(
        "worker.write_ahead_grace_ms",
        w.write_ahead_grace_ms,
        0,
        60_000,
    )?;
    range("worker.max_depth", w.max_depth, 0, 64)?;
    range("worker.max_llm_retries", w.max_llm_retries, 0, 100)?;
    range(
        "worker.max_file_bytes",
        w.max_file_bytes,
        1,
        MAX_WORKSPACE_BYTES,
    )?;
    range(
        "worker.workspace_quota_bytes",
        w.workspace_quota_bytes,
        1,
        MAX_WORKSPACE_BYTES,
    )?;
    if w.max_file_bytes > w.workspace_quota_bytes {
        return Err(invalid(
            "worker.max_file_bytes",
            format!(
                "{} must not be larger than {} ({}): no file that size could be written",
                w.max_file_bytes,
                describe("worker.workspace_quota_bytes"),
                w.workspace_quota_bytes
            ),
        ));
    }
    range("worker.max_children", w.max_children, 0, 10_000)?;
    names("worker.queues", &w.queues)?;
    if let Some(tools) = &w.default_tools {
        names("worker.default_tools", tools)?;
    }
    if !PROVIDERS.contains(&w.default_provider.as_str()) {
        return Err(invalid(
            "worker.default_provider",
            format!(
                "unknown provider `{}` (expected {})",
                w.default_provider,
                PROVIDERS.join(", ")
            ),
        ));
    }
    if w.default_model
        .as_deref()
        .is_some_and(|m| m.trim().is_empty())
    {
        return Err(invalid("worker.default_model", "must not be empty"));
    }
    Ok(())
}

fn scheduler(s: &SchedulerSection) -> Result<()> {
    range(
        "scheduler.sweep_interval_secs",
        s.sweep_interval_secs,
        1,
        86_400,
    )?;
    range("scheduler.sweep_age_secs", s.sweep_age_secs, 0, 86_400)?;
    range(
        "scheduler.max_prompt_bytes",
        s.max_prompt_bytes,
        1,
        usize::MAX,
    )?;
    range("scheduler.max_batch", s.max_batch, 1, 1_000_000)?;
    range("scheduler.key_cache_secs", s.key_cache_secs, 0, 3_600)?;
    range("scheduler.max_connections", s.max_connections, 1, 1_000_000)?;
    range(
        "scheduler.max_connections_per_key",
        s.max_connections_per_key,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.max_connections_per_peer",
        s.max_connections_per_peer,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.batch_decode_bytes",
        s.batch_decode_bytes,
        1024 * 1024,
        usize::MAX,
    )?;
    range(
        "scheduler.max_event_streams",
        s.max_event_streams,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.max_event_streams_per_tenant",
        s.max_event_streams_per_tenant,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.max_event_streams_per_key",
        s.max_event_streams_per_key,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.header_read_timeout_secs",
        s.header_read_timeout_secs,
        1,
        3_600,
    )?;
    range(
        "scheduler.body_read_timeout_secs",
        s.body_read_timeout_secs,
        1,
        3_600,
    )?;
    range(
        "scheduler.write_timeout_secs",
        s.write_timeout_secs,
        1,
        3_600,
    )?;
    range("scheduler.max_queues", s.max_queues, 1, 10_000)?;
    range(
        "scheduler.stream_max_len",
        s.stream_max_len,
        0,
        1_000_000_000,
    )?;
    if s.queues.len() > s.max_queues {
        return Err(invalid(
            "scheduler.queues",
            format!(
                "names {} queues, more than scheduler.max_queues ({})",
                s.queues.len(),
                s.max_queues
            ),
        ));
    }
    names("scheduler.queues", &s.queues)
}

/// The bounds of `[policy]` (or of one tenant, `key` naming it) are within what the API
/// accepts at all, so a bound can always be met.
fn policy_bounds(key: &str, p: &TenantPolicySection) -> Result<()> {
    let k = |f: &str| format!("{key}.{f}");
    if let Some(v) = p.max_iterations {
        range(&k("max_iterations"), v, 1, 10_000)?;
    }
    if let Some(v) = p.max_tokens {
        range(&k("max_tokens"), v, 1, 1_000_000)?;
    }
    // The API's hard bounds (`agentq_api::bounds`): a default lowered to a policy bound
    // is stored, so a bound beyond them would store what no client may send.
    const MAX_TIMEOUT_SECS: u64 = 30 * 24 * 3600;
    for (f, v, max) in [
        ("token_budget", p.token_budget, 1_000_000_000),
        ("tool_timeout_secs", p.tool_timeout_secs, MAX_TIMEOUT_SECS),
        (
            "approval_timeout_secs",
            p.approval_timeout_secs,
            MAX_TIMEOUT_SECS,
        ),
        ("timeout_secs", p.timeout_secs, MAX_TIMEOUT_SECS),
    ] {
        if let Some(v) = v {
            range(&k(f), v, 1, max)?;
        }
    }
    if let Some(v) = p.max_children {
        range(&k("max_children"), v, 0, 10_000)?;
    }
    if let Some(v) = p.max_depth {
        range(&k("max_depth"), v, 0, 64)?;
    }
    if let Some(v) = p.max_tree_sessions {
        range(&k("max_tree_sessions"), v, 1, 10_000_000)?;
    }
    input_bounds(&k, p)?;
    for (f, list) in [
        ("providers", &p.providers),
        ("models", &p.models),
        ("base_urls", &p.base_urls),
        ("tools", &p.tools),
    ] {
        if let Some(list) = list {
            names(&k(f), list)?;
        }
    }
    Ok(())
}

/// The bounds of a request's files are within the API's hard ones: a request of at most
/// [`MAX_INPUT_FILES`](crate::workspace_path::MAX_INPUT_FILES) files (what one JSON
/// object of the body may hold) and [`MAX_INPUT_BYTES`](crate::workspace_path::MAX_INPUT_BYTES)
/// (what fits, base64-encoded, in the largest body the API reads).
fn input_bounds(k: &dyn Fn(&str) -> String, p: &TenantPolicySection) -> Result<()> {
    use crate::workspace_path as wp;
    if let Some(v) = p.max_input_files {
        range(&k("max_input_files"), v, 0, wp::MAX_INPUT_FILES)?;
    }
    if let Some(v) = p.max_input_bytes {
        range(&k("max_input_bytes"), v, 0, wp::MAX_INPUT_BYTES)?;
    }
    if let Some(v) = p.max_path_bytes {
        range(&k("max_path_bytes"), v, 1, wp::MAX_PATH_BYTES)?;
    }
    if let Some(v) = p.max_path_depth {
        range(&k("max_path_depth"), v, 1, wp::MAX_PATH_DEPTH)?;
    }
    Ok(())
}

/// `[policy]` compiles, and the worker's own defaults are within the global policy: a
/// worker whose default provider or tools its policy forbids would fail every session
/// that relies on them.
fn policy(p: &PolicySection, w: &WorkerSection) -> Result<()> {
    let global = TenantPolicySection {
        providers: Some(p.providers.clone()),
        models: Some(p.models.clone()),
        base_urls: Some(p.base_urls.clone()),
        tools: Some(p.tools.clone()),
        queues: Some(p.queues.clone()),
        max_iterations: p.max_iterations,
        max_tokens: p.max_tokens,
        token_budget: p.token_budget,
        tool_timeout_secs: p.tool_timeout_secs,
        approval_timeout_secs: p.approval_timeout_secs,
        timeout_secs: p.timeout_secs,
        max_children: p.max_children,
        max_depth: p.max_depth,
        max_tree_sessions: p.max_tree_sessions,
        max_input_files: Some(p.max_input_files),
        max_input_bytes: Some(p.max_input_bytes),
        max_path_bytes: Some(p.max_path_bytes),
        max_path_depth: Some(p.max_path_depth),
    };
    policy_bounds("policy", &global)?;
    for (name, t) in &p.tenants {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(
                "policy.tenants",
                format!("tenant name {name:?} must be non-empty, without spaces"),
            ));
        }
        policy_bounds(&format!("policy.tenants.{name}"), t)?;
    }
    let compiled = Policy::from_section(p)?;
    let g = compiled.global();
    if !g.allows_provider(&w.default_provider) {
        return Err(invalid(
            "worker.default_provider",
            format!(
                "`{}` is not allowed by {}",
                w.default_provider,
                describe("policy.providers")
            ),
        ));
    }
    if let Some(m) = &w.default_model
        && !g.allows_model(m)
    {
        return Err(invalid(
            "worker.default_model",
            format!("`{m}` is not allowed by {}", describe("policy.models")),
        ));
    }
    let implicit: Vec<String>;
    let tools = match &w.default_tools {
        Some(t) => t,
        None => {
            implicit = agentq_agent::tools::READ_ONLY_TOOLS
                .iter()
                .map(|s| s.to_string())
                .collect();
            &implicit
        }
    };
    if let Some(t) = tools.iter().find(|t| !g.allows_tool(t)) {
        return Err(invalid(
            "worker.default_tools",
            format!(
                "`{t}` is not allowed by {}{}",
                describe("policy.tools"),
                if w.default_tools.is_none() {
                    " (the default is the read-only set: set worker.default_tools to what the policy allows)"
                } else {
                    ""
                }
            ),
        ));
    }
    Ok(())
}

fn scheduling(s: &SchedulingSection) -> Result<()> {
    range("scheduling.buffer", s.buffer, 1, 1_000_000)?;
    range(
        "scheduling.dispatch_interval_ms",
        s.dispatch_interval_ms,
        10,
        60_000,
    )?;
    if let Some(cap) = s.tenant_max_running {
        range("scheduling.tenant_max_running", cap, 1, 1_000_000)?;
    }
    for (name, t) in &s.tenants {
        range(
            &format!("scheduling.tenants.{name}.weight"),
            t.weight,
            1,
            1_000,
        )?;
        if let Some(cap) = t.max_running {
            range(
                &format!("scheduling.tenants.{name}.max_running"),
                cap,
                1,
                1_000_000,
            )?;
        }
    }
    Ok(())
}

fn range<T: PartialOrd + std::fmt::Display>(key: &str, v: T, min: T, max: T) -> Result<()> {
    if v < min || v > max {
        return Err(invalid(
            key,
            format!("must be from {min} to {max}, not {v}"),
        ));
    }
    Ok(())
}

fn names(key: &str, list: &[String]) -> Result<()> {
    if key.ends_with("queues") && list.is_empty() {
        return Err(invalid(key, "must name at least one queue"));
    }
    if list.iter().any(|n| n.trim().is_empty()) {
        return Err(invalid(key, "names must not be empty"));
    }
    Ok(())
}

fn hook_rules(i: usize, h: &HookSettings) -> Result<()> {
    let key = |field: &str| format!("hooks[{i}].{field}");
    match (&h.url, &h.command) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                &key("url"),
                "a hook is either a webhook (`url`) or a command (`command`), not both",
            ));
        }
        (None, None) => {
            return Err(invalid(
                &format!("hooks[{i}]"),
                "needs a `url` (webhook) or a `command`",
            ));
        }
        (Some(url), None) => webhook_url(&key("url"), url)?,
        (None, Some(argv)) => {
            if argv.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(invalid(
                    &key("command"),
                    "must name a program: [\"prog\", \"arg\"…]",
                ));
            }
        }
    }
    range(&key("timeout_ms"), h.timeout_ms, 1, MAX_HOOK_TIMEOUT_MS)?;
    if h.on != HookPoint::PreToolUse {
        for (field, set) in [
            ("on_timeout", h.on_timeout.is_some()),
            ("on_error", h.on_error.is_some()),
        ] {
            if set {
                return Err(invalid(
                    &key(field),
                    format!(
                        "only pre_tool_use hooks decide; a {} hook only observes",
                        h.on
                    ),
                ));
            }
        }
    }
    if let Some(tools) = &h.tools {
        if !matches!(h.on, HookPoint::PreToolUse | HookPoint::PostToolUse) {
            return Err(invalid(
                &key("tools"),
                format!("only tool hooks see tools, not {}", h.on),
            ));
        }
        globs(&key("tools"), tools)?;
    }
    match (&h.header, &h.header_env) {
        (Some(name), Some(var)) => {
            if h.command.is_some() {
                return Err(invalid(&key("header"), "only a webhook sends headers"));
            }
            if name.is_empty() || !name.bytes().all(is_token_byte) {
                return Err(invalid(
                    &key("header"),
                    format!("`{name}` is not a header name"),
                ));
            }
            if var.is_empty() || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(invalid(
                    &key("header_env"),
                    format!("`{var}` is not an environment variable name"),
                ));
            }
        }
        (Some(_), None) => {
            return Err(invalid(
                &key("header_env"),
                "`header` needs `header_env`, the environment variable its value is read from \
                 (secrets are never written in the file)",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                &key("header"),
                "`header_env` needs `header`, the name of the header it sets",
            ));
        }
        (None, None) => {}
    }
    Ok(())
}

/// An http(s) URL with a host and no credentials (they belong in a header read from the
/// environment).
fn webhook_url(key: &str, url: &str) -> Result<()> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| invalid(key, format!("`{url}` must start with http:// or https://")))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(invalid(
            key,
            "must not carry credentials: name a `header` and its `header_env` instead",
        ));
    }
    if authority.is_empty() || url.chars().any(char::is_whitespace) {
        return Err(invalid(key, format!("`{url}` is not a URL with a host")));
    }
    Ok(())
}

/// `tchar` of RFC 9110: what a header name may be made of.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn globs(key: &str, list: &[String]) -> Result<()> {
    if list.is_empty() {
        return Err(invalid(key, "must list at least one tool (or be left out)"));
    }
    names(key, list)
}

fn guardian(g: &GuardianSection) -> Result<()> {
    if let Some(p) = &g.provider
        && !PROVIDERS.contains(&p.as_str())
    {
        return Err(invalid(
            "guardian.provider",
            format!("unknown provider `{p}` (expected {})", PROVIDERS.join(", ")),
        ));
    }
    for (key, v) in [("guardian.model", &g.model), ("guardian.prompt", &g.prompt)] {
        if v.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err(invalid(
                key,
                "must not be empty (leave it out for the default)",
            ));
        }
    }
    range(
        "guardian.timeout_ms",
        g.timeout_ms,
        1,
        MAX_GUARDIAN_TIMEOUT_MS,
    )?;
    if let Some(tools) = &g.tools {
        globs("guardian.tools", tools)?;
    }
    Ok(())
}

/// Every configured endpoint is one a key may be sent to: plain http(s), no userinfo,
/// query or fragment. Each tenant's table names variables that could hold a key.
fn providers(p: &ProvidersSection) -> Result<()> {
    let url = |key: &str, v: &Option<String>| match v {
        Some(u) => check_base_url(u).map(drop).map_err(|why| invalid(key, why)),
        None => Ok(()),
    };
    url("providers.openai_base_url", &p.openai_base_url)?;
    url("providers.anthropic_base_url", &p.anthropic_base_url)?;
    for (name, t) in &p.tenants {
        let at = |field: &str| format!("providers.tenants.{name}.{field}");
        if name.trim().is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(
                "providers.tenants",
                format!("tenant name {name:?} must be non-empty, without spaces"),
            ));
        }
        url(&at("openai_base_url"), &t.openai_base_url)?;
        url(&at("anthropic_base_url"), &t.anthropic_base_url)?;
        for (field, var) in [
            ("openai_key_env", &t.openai_key_env),
            ("anthropic_key_env", &t.anthropic_key_env),
        ] {
            if let Some(var) = var
                && (var.trim().is_empty()
                    || !var
                        .trim()
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_'))
            {
                return Err(invalid(
                    &at(field),
                    format!("{var:?} is not an environment variable name"),
                ));
            }
        }
    }
    Ok(())
}

/// Each price is a finite, non-negative number of dollars per million tokens, for a model
/// glob that compiles.
fn prices(list: &[crate::budget::PriceEntry]) -> Result<()> {
    for (i, p) in list.iter().enumerate() {
        if p.model.trim().is_empty() {
            return Err(invalid(&format!("prices[{i}].model"), "must not be empty"));
        }
        if let Err(e) = globset::Glob::new(&p.model) {
            return Err(invalid(&format!("prices[{i}].model"), e));
        }
        for (f, v) in [
            ("input", p.input),
            ("output", p.output),
            ("cache_read", p.cache_read),
            ("cache_write", p.cache_write),
        ] {
            if !(v.is_finite() && (0.0..=1_000_000.0).contains(&v)) {
                return Err(invalid(
                    &format!("prices[{i}].{f}"),
                    format!("must be dollars per million tokens from 0 to 1000000, not {v}"),
                ));
            }
        }
    }
    Ok(())
}

/// A tenant budget names a tenant and at least one bound, once per tenant and period.
fn budgets(list: &[super::BudgetSettings]) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, b) in list.iter().enumerate() {
        let k = |f: &str| format!("budgets[{i}].{f}");
        if b.tenant.is_empty()
            || b.tenant
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid(
                &k("tenant"),
                "must be a tenant name, without spaces",
            ));
        }
        if b.tokens.is_none() && b.usd.is_none() {
            return Err(invalid(&k("tokens"), "a budget sets tokens, usd or both"));
        }
        if let Some(t) = b.tokens {
            range(&k("tokens"), t, 1, u64::MAX / 4)?;
        }
        if let Some(u) = b.usd
            && !(u.is_finite() && u > 0.0 && u <= 1e9)
        {
            return Err(invalid(
                &k("usd"),
                format!("must be dollars above 0 and at most 1e9, not {u}"),
            ));
        }
        if !seen.insert((b.tenant.clone(), b.period)) {
            return Err(invalid(
                &k("tenant"),
                format!("{} has two budgets per {}", b.tenant, b.period.as_str()),
            ));
        }
    }
    Ok(())
}

fn limit_rules(i: usize, l: &super::LimitSettings) -> Result<()> {
    let key = |field: &str| format!("limits[{i}].{field}");
    if !matches!(l.provider.as_str(), "openai" | "anthropic" | "scripted") {
        return Err(invalid(
            &key("provider"),
            format!(
                "must be openai, anthropic or scripted, not {:?}",
                l.provider
            ),
        ));
    }
    if let Err(e) = globset::Glob::new(&l.model) {
        return Err(invalid(&key("model"), format!("not a glob: {e}")));
    }
    if l.tenant.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(invalid(&key("tenant"), "must not be empty"));
    }
    if l.rpm.is_none() && l.tpm.is_none() && l.concurrency.is_none() {
        return Err(invalid(
            &key("rpm"),
            "a limit needs at least one of rpm, tpm and concurrency",
        ));
    }
    for (field, v) in [
        ("rpm", l.rpm),
        ("tpm", l.tpm),
        ("concurrency", l.concurrency),
    ] {
        if let Some(v) = v {
            range(&key(field), v, 1, 1_000_000_000)?;
        }
    }
    range(&key("window_secs"), l.window_secs, 1, 60)?;
    range(
        &key("reservation_ttl_secs"),
        l.reservation_ttl_secs,
        1,
        86_400,
    )?;
    Ok(())
}

fn workspace(w: &WorkspaceSection, worker: &WorkerSection) -> Result<()> {
    if w.gc_interval_secs == 0 {
        return Err(invalid("workspace.gc_interval_secs", "must be at least 1"));
    }
    if w.gc_batch == 0 {
        return Err(invalid("workspace.gc_batch", "must be at least 1"));
    }
    // A worker uploads a change's contents, then commits it, retrying for up to ten lease
    // times: a content must not be collected before its commit had every chance.
    let commit_window = worker.lease_ttl_secs.0 * 10.0;
    if (w.blob_grace_secs as f64) <= commit_window {
        return Err(invalid(
            "workspace.blob_grace_secs",
            format!(
                "{} must be longer than ten lease times ({commit_window} s, \
                 worker.lease_ttl_secs): a commit may follow its uploads that late",
                w.blob_grace_secs
            ),
        ));
    }
    if w.blob_store == super::BlobStoreKind::S3 {
        s3(&w.s3)?;
    }
    Ok(())
}

/// `[workspace.s3]`, checked only when it is the blob store; the credentials' variables
/// are read when the store is opened.
fn s3(s: &super::S3Section) -> Result<()> {
    // Bucket names per S3's rules; nothing else can reach a path-style URL unescaped.
    let b = &s.bucket;
    if b.len() < 3
        || b.len() > 63
        || !b
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
    {
        return Err(invalid(
            "workspace.s3.bucket",
            format!("{b:?} is not a bucket name (3 to 63 of a-z, 0-9, '-', '.')"),
        ));
    }
    let scheme_ok = s.endpoint.starts_with("http://") || s.endpoint.starts_with("https://");
    if !scheme_ok || s.endpoint.contains(['?', '#']) || s.endpoint.contains(char::is_whitespace) {
        return Err(invalid(
            "workspace.s3.endpoint",
            format!("{:?} is not an http(s) URL", s.endpoint),
        ));
    }
    if s.region.is_empty()
        || !s
            .region
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-')
    {
        return Err(invalid(
            "workspace.s3.region",
            format!("{:?} is not a region name", s.region),
        ));
    }
    if s.prefix.len() > 512
        || s.prefix.starts_with('/')
        || !s
            .prefix
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-_./".contains(&c))
    {
        return Err(invalid(
            "workspace.s3.prefix",
            "must be at most 512 of a-z, A-Z, 0-9, '-', '_', '.', '/' and not start with '/'",
        ));
    }
    for (key, v) in [
        ("workspace.s3.access_key_env", &s.access_key_env),
        ("workspace.s3.secret_key_env", &s.secret_key_env),
    ] {
        let name_like = !v.is_empty()
            && v.len() <= 128
            && !v.starts_with(|c: char| c.is_ascii_digit())
            && v.bytes()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_');
        if !name_like {
            return Err(invalid(
                key,
                "must name an environment variable (A-Z, 0-9, '_'); the credentials are never in the file",
            ));
        }
    }
    Ok(())
}
