//! The rules of what agentq connects to: the provider endpoints and the keys' variables
//! (`[providers]`), the fleet's rate limits (`[[limits]]`), and where workspaces' contents
//! live (`[workspace]`, `[workspace.s3]`).

use agentq_agent::provider::endpoint::check_base_url;
use agentq_agent::provider::transport::MAX_STREAMS_PER_CONNECTION;

use super::rules::{invalid, range};
use crate::config::limits::LimitSettings;
use crate::config::providers::ProvidersSection;
use crate::config::worker::WorkerSection;
use crate::config::workspace::{BlobStoreKind, S3Section, WorkspaceSection};
use crate::error::Result;

/// Every configured endpoint is one a key may be sent to: plain http(s), no userinfo,
/// query or fragment. Each tenant's table names variables that could hold a key.
pub(super) fn providers(p: &ProvidersSection) -> Result<()> {
    let url = |key: &str, v: &Option<String>| match v {
        Some(u) => check_base_url(u).map(drop).map_err(|why| invalid(key, why)),
        None => Ok(()),
    };
    url("providers.openai_base_url", &p.openai_base_url)?;
    url("providers.anthropic_base_url", &p.anthropic_base_url)?;
    range(
        "providers.streams_per_connection",
        p.streams_per_connection,
        1,
        MAX_STREAMS_PER_CONNECTION,
    )?;
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

pub(super) fn limit_rules(i: usize, l: &LimitSettings) -> Result<()> {
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

pub(super) fn workspace(w: &WorkspaceSection, worker: &WorkerSection) -> Result<()> {
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
    if w.blob_store == BlobStoreKind::S3 {
        s3(&w.s3)?;
    }
    Ok(())
}

/// `[workspace.s3]`, checked only when it is the blob store; the credentials' variables
/// are read when the store is opened.
fn s3(s: &S3Section) -> Result<()> {
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
