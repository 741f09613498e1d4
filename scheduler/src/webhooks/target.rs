//! Where a delivery may go: the URL rules of an endpoint, and the address check of
//! `http_fetch` (`agentq_agent::tools::http::vet`, reused, not copied) with the operator's
//! `[webhooks] allowed_hosts` in place of the worker's. The check runs when the endpoint
//! is created and again before every attempt, whose connection is pinned to the addresses
//! just checked (a name that resolves elsewhere later, DNS rebinding, gains nothing).

use std::net::SocketAddr;

use reqwest::Url;

use agentq_agent::tools::ToolSettings;
use agentq_agent::tools::http::vet;

/// Longest URL (bytes), as the API bounds it.
pub use agentq_api::MAX_WEBHOOK_URL;

/// What [`check_url`] refuses, said so that the owner can fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// The network rules of deliveries: `http_fetch`'s, with these hosts allowed.
#[derive(Debug, Clone)]
pub struct Destinations {
    tools: ToolSettings,
}

impl Destinations {
    pub fn new(allowed_hosts: Vec<String>) -> Self {
        Destinations {
            tools: ToolSettings {
                allow_private_network: false,
                allowed_hosts,
                ..ToolSettings::default()
            },
        }
    }

    /// The URL's shape, then its destination: `None` when the connection needs no pinning
    /// (an address literal, an allowed host), else the vetted addresses of its host.
    pub async fn check(&self, url: &Url) -> Result<Option<(String, Vec<SocketAddr>)>, Refused> {
        vet(&self.tools, url)
            .await
            .map_err(|e| Refused(e.to_string().replace("http_fetch", "a webhook")))
    }
}

/// The URL of a new endpoint, parsed: `http` or `https`, a host, no credentials, no
/// fragment, at most [`MAX_WEBHOOK_URL`] bytes.
pub fn parse_url(raw: &str) -> Result<Url, Refused> {
    if raw.len() > MAX_WEBHOOK_URL {
        return Err(Refused(format!("is longer than {MAX_WEBHOOK_URL} bytes")));
    }
    let url = Url::parse(raw).map_err(|e| Refused(format!("is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Refused(format!(
            "scheme `{}` is not allowed (http or https only)",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Refused("has no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refused(
            "must not carry credentials (the signature authenticates deliveries)".into(),
        ));
    }
    if url.fragment().is_some() {
        return Err(Refused("must not have a fragment".into()));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(parse_url("https://hooks.example.com/in?x=1").is_ok());
        for bad in [
            "ftp://x.test/",
            "https://user:pw@x.test/",
            "https://x.test/#frag",
            "not a url",
            "file:///etc/passwd",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn private_addresses_are_refused_unless_allowed() {
        let none = Destinations::new(vec![]);
        for url in [
            "http://127.0.0.1:9/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.1.2.3/",
            "http://[::1]/",
            "http://localhost:9/",
        ] {
            let u = parse_url(url).unwrap_or_else(|e| panic!("{url}: {e:?}"));
            assert!(none.check(&u).await.is_err(), "{url}");
        }
        let some = Destinations::new(vec!["127.0.0.1:9".into()]);
        let u = parse_url("http://127.0.0.1:9/").unwrap_or_else(|e| panic!("{e:?}"));
        assert!(some.check(&u).await.is_ok());
        let other_port = parse_url("http://127.0.0.1:10/").unwrap_or_else(|e| panic!("{e:?}"));
        assert!(some.check(&other_port).await.is_err());
    }
}
