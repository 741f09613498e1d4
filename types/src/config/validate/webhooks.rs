//! The rules of `[webhooks]`.

use super::rules::{invalid, range};
use crate::config::webhooks::WebhooksSection;
use crate::error::Result;

/// A week: past it a retry window or a backoff is a typo (and the arithmetic of the
/// delivery loop's times stays far from overflowing).
const WEEK_SECS: u64 = 7 * 86_400;

pub(super) fn webhooks(w: &WebhooksSection) -> Result<()> {
    for (i, entry) in w.allowed_hosts.iter().enumerate() {
        if !is_host_entry(entry) {
            return Err(invalid(
                "webhooks.allowed_hosts",
                format!(
                    "entry {i} ({entry:?}) must be a host or host:port (`hooks.internal`, \
                     `10.0.0.7:8443`, `[::1]:9000`), without a scheme or path"
                ),
            ));
        }
    }
    if w.key_env.trim().is_empty() {
        return Err(invalid("webhooks.key_env", "must name a variable"));
    }
    range("webhooks.timeout_secs", w.timeout_secs, 1, 300)?;
    range(
        "webhooks.max_response_bytes",
        w.max_response_bytes,
        1,
        16 * 1024 * 1024,
    )?;
    range("webhooks.retry_for_secs", w.retry_for_secs, 1, 30 * 86_400)?;
    range(
        "webhooks.max_backoff_secs",
        w.max_backoff_secs,
        1,
        WEEK_SECS,
    )?;
    range(
        "webhooks.disable_after_secs",
        w.disable_after_secs,
        1,
        365 * 86_400,
    )?;
    range("webhooks.max_in_flight", w.max_in_flight, 1, 10_000)?;
    range(
        "webhooks.max_in_flight_per_endpoint",
        w.max_in_flight_per_endpoint,
        1,
        1_000,
    )?;
    range("webhooks.max_endpoints", w.max_endpoints, 1, 10_000)?;
    range(
        "webhooks.retention_secs",
        w.retention_secs,
        60,
        365 * 86_400,
    )?;
    range("webhooks.poll_interval_ms", w.poll_interval_ms, 10, 60_000)?;
    Ok(())
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`, or a bare IPv6 address.
fn is_host_entry(entry: &str) -> bool {
    let e = entry.trim();
    if e.is_empty() || e.contains(['/', '?', '#', '@', ' ']) {
        return false;
    }
    if e.parse::<std::net::Ipv6Addr>().is_ok() {
        return true;
    }
    let (host, port) = if let Some(rest) = e.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            p => {
                return p
                    .strip_prefix(':')
                    .is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
            }
        }
    } else {
        match e.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (e, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    host_ok && port_ok
}

#[cfg(test)]
mod tests {
    use super::is_host_entry;

    #[test]
    fn host_entries() {
        for ok in [
            "localhost",
            "10.0.0.7:8443",
            "[::1]:9000",
            "::1",
            "hooks.internal",
            "[::1]",
        ] {
            assert!(is_host_entry(ok), "{ok}");
        }
        for bad in [
            "", "http://x", "x:0", "x:99999", "a/b", "[::1", "[zz]:1", "x y", "x:",
        ] {
            assert!(!is_host_entry(bad), "{bad}");
        }
    }
}
