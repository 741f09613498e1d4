//! The rules of the operator's checks: `[[hooks]]` and `[guardian]`.

use agentq_agent::guard::HookPoint;

use super::rules::{globs, invalid, range};
use crate::config::hooks::{
    GuardianSection, HookSettings, MAX_GUARDIAN_TIMEOUT_MS, MAX_HOOK_TIMEOUT_MS,
};
use crate::config::providers::PROVIDERS;
use crate::error::Result;

pub(super) fn hook_rules(i: usize, h: &HookSettings) -> Result<()> {
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
pub(super) fn webhook_url(key: &str, url: &str) -> Result<()> {
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
pub(super) fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub(super) fn guardian(g: &GuardianSection) -> Result<()> {
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
