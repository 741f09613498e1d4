//! The rules of what tenants may ask for and spend: `[policy]` (and the worker's defaults
//! within it), `[[prices]]` and `[[budgets]]`.

use super::rules::{invalid, names, range};
use crate::config::policy::{BudgetSettings, PolicySection, TenantPolicySection};
use crate::config::registry::describe;
use crate::config::worker::WorkerSection;
use crate::error::Result;
use crate::policy::Policy;

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
    if let Some(v) = p.max_web_search_uses {
        use agentq_agent::spec::MAX_WEB_SEARCH_MAX_USES;
        range(&k("max_web_search_uses"), v, 1, MAX_WEB_SEARCH_MAX_USES)?;
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
pub(super) fn policy(
    p: &PolicySection,
    w: &WorkerSection,
    default_provider: Option<&str>,
) -> Result<()> {
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
        max_web_search_uses: p.max_web_search_uses,
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
    if let Some(p) = default_provider
        && !g.allows_provider(p)
    {
        return Err(invalid(
            "worker.default_provider",
            format!("`{p}` is not allowed by {}", describe("policy.providers")),
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

/// Each price is a finite, non-negative number of dollars per million tokens, for a model
/// glob that compiles.
pub(super) fn prices(list: &[crate::budget::PriceEntry]) -> Result<()> {
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
        if let Some(v) = p.web_search
            && !(v.is_finite() && (0.0..=1_000_000.0).contains(&v))
        {
            return Err(invalid(
                &format!("prices[{i}].web_search"),
                format!("must be dollars per 1000 searches from 0 to 1000000, not {v}"),
            ));
        }
    }
    Ok(())
}

/// A tenant budget names a tenant and at least one bound, once per tenant and period.
pub(super) fn budgets(list: &[BudgetSettings]) -> Result<()> {
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
