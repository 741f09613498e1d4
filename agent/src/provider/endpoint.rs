//! Provider endpoints: which base URLs are acceptable at all, when two spellings name the
//! same endpoint (the rule that decides whether a configured key may be sent), the error a
//! redirect answer becomes (providers follow none), and what a 401 says of the key.

use reqwest::Url;

use crate::error::{Error, Result};

/// Longest `Location` quoted in a redirect error.
const MAX_LOCATION: usize = 300;

/// Whether `url` may be a provider's base URL: absolute http(s) with a host, and no
/// userinfo, query or fragment. A query or fragment would survive the path the provider
/// appends (`?x=` turns `/chat/completions` into a parameter), so the request, with its
/// key, could reach any path of the host; userinfo would send credentials nobody
/// configured as a key. The message says what is wrong, for the caller to name the field.
pub fn check_base_url(url: &str) -> std::result::Result<Url, String> {
    let text = url.trim();
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    let parsed = Url::parse(text).map_err(|e| format!("`{text}` is not an absolute URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "scheme `{}` is not allowed (http or https only)",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{text}` has no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("must not carry a user name or password".into());
    }
    // `Url` drops an empty `?` or `#`, so the text is checked as written too.
    if parsed.query().is_some() || text.contains('?') {
        return Err("must not have a query string".into());
    }
    if parsed.fragment().is_some() || text.contains('#') {
        return Err("must not have a fragment".into());
    }
    Ok(parsed)
}

/// The endpoint a base URL names, as one string: the parts that decide where a request
/// lands — scheme, lower-case host without a trailing dot, port (only when it is not the
/// scheme's default: the parser drops a default one) and path without trailing slashes —
/// so that two spellings of one endpoint give the same text. Refused as
/// [`check_base_url`] refuses.
pub fn canonical(url: &str) -> std::result::Result<String, String> {
    let parsed = check_base_url(url)?;
    let host = parsed
        .host_str()
        .unwrap_or_default()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let path = parsed.path().trim_end_matches('/');
    Ok(format!("{}://{host}{port}{path}", parsed.scheme()))
}

/// Whether two base URLs name the same endpoint. Either one failing
/// [`check_base_url`] makes them different, so a malformed URL never inherits a key.
pub fn same_endpoint(a: &str, b: &str) -> bool {
    match (canonical(a), canonical(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Where a provider sends its requests and the key it may send there: the configured
/// endpoint (`configured`, the host's setting or the provider's default) with its key, or
/// the session's `requested` URL, with the key only when that is the configured endpoint.
/// Any other URL gets no key at all: a key is bound to the endpoint it was configured for.
pub fn resolve<'k>(
    provider: &str,
    configured: &str,
    requested: Option<&str>,
    key: Option<&'k str>,
) -> Result<(String, Option<&'k str>)> {
    check_base_url(configured)
        .map_err(|why| Error::Config(format!("configured {provider} base URL: {why}")))?;
    let Some(requested) = requested else {
        return Ok((configured.trim().to_string(), key));
    };
    check_base_url(requested).map_err(|why| Error::Config(format!("base_url: {why}")))?;
    let key = key.filter(|_| same_endpoint(configured, requested));
    Ok((requested.trim().to_string(), key))
}

/// The error for a redirect answer from `url`: fatal, since the same request gets the same
/// answer, and worded so the operator knows to configure the final endpoint.
pub(crate) fn redirect_error(url: &str, resp: &reqwest::Response) -> Error {
    let location: String = resp
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("(none)")
        .chars()
        .take(MAX_LOCATION)
        .collect();
    Error::Http {
        status: resp.status().as_u16(),
        message: format!(
            "{url} answered a redirect to {location}; provider requests follow no \
             redirects (configure the final endpoint as the base URL)"
        ),
        code: Some("redirect_refused".into()),
        retry_after: None,
        limits: None,
    }
}

/// A 401 says where the key comes from, the operator's next step: `var` (or a tenant's
/// own key variable) when a key was sent, else that none was.
pub(crate) fn name_the_key(err: Error, var: &str, keyed: bool) -> Error {
    match err {
        Error::Http {
            status: 401,
            message,
            code,
            retry_after,
            limits,
        } => Error::Http {
            status: 401,
            message: if keyed {
                format!(
                    "{message} (the key sent is {var}, or the tenant's own variable \
                     `providers.tenants.<name>.*_key_env`: check it)"
                )
            } else {
                format!("{message} (no key was sent: set {var})")
            },
            code,
            retry_after,
            limits,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn base_urls_must_be_plain_http() {
        for ok in [
            "https://api.openai.com/v1",
            "http://127.0.0.1:8000/v1/",
            "http://[::1]:11434",
        ] {
            assert!(check_base_url(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("ftp://host/v1", "scheme"),
            ("file:///etc", "scheme"),
            ("http://user:pw@host/v1", "user name"),
            ("http://user@host/v1", "user name"),
            ("http://host/v1?x=", "query"),
            ("http://host/v1?", "query"),
            ("http://host/v1#frag", "fragment"),
            ("http://host/v1#", "fragment"),
            ("/v1", "absolute"),
            ("", "empty"),
        ] {
            let e = check_base_url(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn same_endpoint_compares_scheme_host_port_and_path() {
        assert!(same_endpoint(
            "https://api.openai.com/v1",
            "HTTPS://API.OpenAI.com:443/v1/"
        ));
        assert!(same_endpoint("http://h.test", "http://h.test:80/"));
        assert!(!same_endpoint("https://h.test/v1", "http://h.test/v1"));
        assert!(!same_endpoint(
            "https://h.test/v1",
            "https://h.test:8443/v1"
        ));
        assert!(!same_endpoint("https://h.test/v1", "https://h.test/v2"));
        assert!(!same_endpoint(
            "https://h.test/v1",
            "https://h.test.evil/v1"
        ));
        assert!(!same_endpoint("https://h.test/v1", "https://h.test/v1?x="));
        assert!(!same_endpoint("https://h.test/v1", "https://u@h.test/v1"));
    }

    #[test]
    fn a_key_goes_only_to_its_endpoint() {
        let cfg = "http://llm.test/v1";
        let (url, key) = resolve("openai", cfg, None, Some("sk")).unwrap();
        assert_eq!((url.as_str(), key), (cfg, Some("sk")));
        let (_, key) = resolve("openai", cfg, Some("http://llm.test/v1/"), Some("sk")).unwrap();
        assert_eq!(key, Some("sk"));
        let (url, key) = resolve("openai", cfg, Some("http://other.test/v1"), Some("sk")).unwrap();
        assert_eq!((url.as_str(), key), ("http://other.test/v1", None));
        let e = resolve("openai", cfg, Some("http://llm.test/v1?a"), Some("sk")).unwrap_err();
        assert!(e.to_string().contains("base_url"), "{e}");
        let e = resolve("openai", "ftp://x", None, Some("sk")).unwrap_err();
        assert!(e.to_string().contains("configured openai base URL"), "{e}");
    }
}
