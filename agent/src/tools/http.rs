//! The `http_fetch` tool and its network policy: which addresses a fetch may reach
//! ([`is_forbidden_ip`]) and how the vetted address is pinned so that DNS cannot swap it
//! between the check and the connection.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{Method, Url, redirect};
use serde_json::{Value, json};

use super::fs::{Args, snippet};
use super::{SideEffect, Tool, ToolContext, ToolError, ToolOutput, ToolSettings};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `ip` is an address a fetch must not reach by default: anything not publicly
/// routable, where internal services and cloud metadata endpoints live.
pub fn is_forbidden_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_forbidden_v4(v4),
        IpAddr::V6(v6) => is_forbidden_v6(v6),
    }
}

fn is_forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        // 0.0.0.0/8 "this network": connecting to 0.x reaches the local host on Linux.
        || a == 0
        // 100.64.0.0/10 carrier-grade NAT (also used by some clouds internally).
        || (a == 100 && (b & 0xc0) == 64)
        // 192.0.0.0/24 IETF protocol assignments.
        || (a == 192 && b == 0 && c == 0)
        // 198.18.0.0/15 benchmarking.
        || (a == 198 && (b & 0xfe) == 18)
        // 240.0.0.0/4 reserved.
        || a >= 240
}

fn is_forbidden_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_forbidden_v4(v4);
    }
    let seg = ip.segments();
    let v4 = |x: u16, y: u16| Ipv4Addr::new((x >> 8) as u8, x as u8, (y >> 8) as u8, y as u8);
    // ::ffff:0:0/96 IPv4-translated (SIIT): a stateless translator on the path turns it
    // into the embedded IPv4 address, like the IPv4-mapped form above.
    if seg[..6] == [0, 0, 0, 0, 0xffff, 0] {
        return is_forbidden_v4(v4(seg[6], seg[7]));
    }
    // 64:ff9b::/96 NAT64 embeds an IPv4 address that the gateway will reach for us.
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_forbidden_v4(v4(seg[6], seg[7]));
    }
    // 64:ff9b:1::/48 is for local NAT64 prefixes of any length, so the embedded address
    // may sit at any of several places: none of it is publicly routable anyway.
    if seg[..3] == [0x64, 0xff9b, 1] {
        return true;
    }
    // An ISATAP interface id (`0:5efe` or `200:5efe`, the u bit aside) names the IPv4
    // address the site's router tunnels to.
    if (seg[4] & !0x0200) == 0 && seg[5] == 0x5efe && is_forbidden_v4(v4(seg[6], seg[7])) {
        return true;
    }
    // 2002::/16 6to4 embeds the IPv4 address of the relay that delivers the packet.
    if seg[0] == 0x2002 && is_forbidden_v4(v4(seg[1], seg[2])) {
        return true;
    }
    // 2001::/32 Teredo: the server's IPv4 address, and the client's inverted.
    if seg[0] == 0x2001
        && seg[1] == 0
        && (is_forbidden_v4(v4(seg[2], seg[3])) || is_forbidden_v4(v4(!seg[6], !seg[7])))
    {
        return true;
    }
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // ::/96 IPv4-compatible (deprecated) addresses, never legitimately public.
        || seg[..6] == [0, 0, 0, 0, 0, 0]
        // fe80::/10 link-local and fec0::/10 deprecated site-local.
        || (seg[0] & 0xffc0) == 0xfe80
        || (seg[0] & 0xffc0) == 0xfec0
        // fc00::/7 unique local.
        || (seg[0] & 0xfe00) == 0xfc00
        // 2001:db8::/32 documentation.
        || (seg[0] == 0x2001 && seg[1] == 0x0db8)
}

/// The host of `url` as written in allow and deny lists: lowercase, without IPv6 brackets
/// or a trailing dot.
pub fn url_host(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

/// `allowed_hosts` entries are a host (`localhost`, `10.0.0.5`, `::1`) or a host and port
/// (`127.0.0.1:8080`, `[::1]:8080`).
fn host_allowed(settings: &ToolSettings, host: &str, port: u16) -> bool {
    let with_port = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    settings.allowed_hosts.iter().any(|entry| {
        let entry = entry.trim().to_ascii_lowercase();
        let bare = entry
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&entry);
        bare == host || entry == with_port
    })
}

/// Where a request may connect (for `http_fetch` and any other client held to its network
/// policy, such as an MCP server's): `None` when no pinning is needed (the host is an IP
/// literal, or policy lets it go anywhere), otherwise the vetted addresses of the host.
pub async fn vet(
    settings: &ToolSettings,
    url: &Url,
) -> Result<Option<(String, Vec<SocketAddr>)>, ToolError> {
    let host = url_host(url)
        .filter(|h| !h.is_empty())
        .ok_or_else(|| ToolError::InvalidArguments("field `url` has no host".into()))?;
    let port = url
        .port_or_known_default()
        .ok_or_else(|| ToolError::InvalidArguments("field `url` has no port".into()))?;
    if settings.allow_private_network || host_allowed(settings, &host, port) {
        return Ok(None);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        if is_forbidden_ip(ip) {
            return Err(ToolError::Denied(format!(
                "{host} is a private, loopback, link-local or reserved address; \
                 http_fetch may not reach it (allow it in allowed_hosts)"
            )));
        }
        return Ok(None);
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| ToolError::Failed(format!("cannot resolve {host}: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(ToolError::Failed(format!("{host} resolves to no address")));
    }
    // One bad address condemns the host: the client could pick any of them.
    if let Some(bad) = addrs.iter().find(|a| is_forbidden_ip(a.ip())) {
        return Err(ToolError::Denied(format!(
            "{host} resolves to {}, a private, loopback, link-local or reserved address; \
             http_fetch may not reach it (allow it in allowed_hosts)",
            bad.ip()
        )));
    }
    // The host string must be the URL's own spelling, which the client matches on.
    let url_host = url.host_str().unwrap_or_default().to_string();
    Ok(Some((url_host, addrs)))
}

fn parse_headers(headers: Option<&serde_json::Map<String, Value>>) -> Result<HeaderMap, ToolError> {
    let mut map = HeaderMap::new();
    for (k, v) in headers.into_iter().flatten() {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
            ToolError::InvalidArguments(format!("field `headers`: invalid header name `{k}`"))
        })?;
        let value = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                return Err(ToolError::InvalidArguments(format!(
                    "field `headers`: the value of `{k}` must be a string"
                )));
            }
        };
        let value = HeaderValue::from_str(&value).map_err(|_| {
            ToolError::InvalidArguments(format!("field `headers`: invalid value for `{k}`"))
        })?;
        map.insert(name, value);
    }
    Ok(map)
}

/// `http_fetch {url, method?, body?, headers?}`.
///
/// `side_effect` is `Unsafe` although a GET is pure: the declaration cannot see the
/// arguments, and re-running a POST whose result was lost could repeat an action.
pub struct HttpFetch;

#[async_trait]
impl Tool for HttpFetch {
    fn name(&self) -> &str {
        "http_fetch"
    }

    fn description(&self) -> &str {
        "Fetch a URL over HTTP(S). Returns `HTTP <status>`, the content type, a blank line \
         and the body (truncated past a size cap). Redirects are not followed: the Location \
         is reported so you can fetch it. Private and local network addresses are refused."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "Absolute http:// or https:// URL."},
                "method": {"type": "string", "enum": ["GET", "POST"], "description": "Default GET."},
                "body": {"type": "string", "description": "Request body (POST only)."},
                "headers": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Extra request headers."
                }
            },
            "required": ["url"],
            "additionalProperties": false
        })
    }

    /// A GET only reads, so repeating one after a crash is harmless; any other method may
    /// change something remotely.
    fn side_effect(&self, args: &Value) -> SideEffect {
        let method = args.get("method").and_then(Value::as_str).unwrap_or("GET");
        if method.eq_ignore_ascii_case("GET") {
            SideEffect::Idempotent
        } else {
            SideEffect::Unsafe
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let fetch = Fetch::parse(&args)?;
        let pinned = vet(&ctx.settings, &fetch.url).await?;
        let client = client(pinned.as_ref())?;
        let url = fetch.url.clone();
        let mut request = client
            .request(fetch.method, fetch.url)
            .headers(fetch.headers);
        if let Some(body) = fetch.body {
            request = request.body(body);
        }
        let cap = ctx.settings.http_max_bytes;
        let fetched = tokio::select! {
            r = Fetched::read(request, &url, cap) => r?,
            _ = ctx.cancel.cancelled() => return Err(ToolError::Failed("cancelled".into())),
        };
        Ok(fetched.output(cap))
    }
}

/// The request `http_fetch` was asked to make, its arguments checked.
struct Fetch {
    method: Method,
    url: Url,
    body: Option<String>,
    headers: HeaderMap,
}

impl Fetch {
    fn parse(args: &Value) -> Result<Fetch, ToolError> {
        let a = Args::parse(args, &["url", "method", "body", "headers"])?;
        let url_text = a.str("url")?;
        let method = match a
            .opt_str("method")?
            .unwrap_or("GET")
            .to_ascii_uppercase()
            .as_str()
        {
            "GET" => Method::GET,
            "POST" => Method::POST,
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "field `method` must be GET or POST, got `{other}`"
                )));
            }
        };
        let body = a.opt_str("body")?;
        if body.is_some() && method == Method::GET {
            return Err(ToolError::InvalidArguments(
                "field `body` is only allowed with method POST".into(),
            ));
        }
        let headers = parse_headers(a.opt_object("headers")?)?;
        let url = Url::parse(url_text)
            .map_err(|e| ToolError::InvalidArguments(format!("field `url`: {e}")))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(ToolError::InvalidArguments(format!(
                "field `url`: scheme `{}` is not allowed (http or https only)",
                url.scheme()
            )));
        }
        Ok(Fetch {
            method,
            url,
            body: body.map(str::to_string),
            headers,
        })
    }
}

/// A client that follows no redirect and, when the host was vetted, connects only to the
/// addresses it was vetted at.
fn client(pinned: Option<&(String, Vec<SocketAddr>)>) -> Result<reqwest::Client, ToolError> {
    // Proxies are disabled: a proxy would resolve the host itself, undoing the vetting.
    let mut builder = reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .no_proxy()
        .timeout(TIMEOUT);
    if let Some((host, addrs)) = pinned {
        builder = builder.resolve_to_addrs(host, addrs);
    }
    builder
        .build()
        .map_err(|e| ToolError::Failed(format!("cannot build HTTP client: {e}")))
}

/// What came back: the status, the headers the model is shown, and the body up to the
/// cap.
struct Fetched {
    status: reqwest::StatusCode,
    content_type: String,
    location: Option<String>,
    body: Vec<u8>,
    truncated: bool,
}

impl Fetched {
    async fn read(
        request: reqwest::RequestBuilder,
        url: &Url,
        cap: usize,
    ) -> Result<Fetched, ToolError> {
        let mut resp = request
            .send()
            .await
            .map_err(|e| ToolError::Failed(format!("request to {url} failed: {e}")))?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| ToolError::Failed(format!("reading the body from {url} failed: {e}")))?
        {
            let room = cap - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Fetched {
            status,
            content_type,
            location,
            body,
            truncated,
        })
    }

    /// `HTTP <status>`, the content type, the unfollowed redirect's target, a blank line
    /// and the body; an error result for a 4xx or 5xx.
    fn output(self, cap: usize) -> ToolOutput {
        let Fetched {
            status,
            content_type,
            location,
            body,
            truncated,
        } = self;
        let mut out = format!("HTTP {}\n{content_type}\n", status.as_u16());
        if status.is_redirection()
            && let Some(loc) = location
        {
            out.push_str(&format!(
                "[redirect not followed; Location: {}]\n",
                snippet(&loc, 2000)
            ));
        }
        out.push('\n');
        out.push_str(&String::from_utf8_lossy(&body));
        if truncated {
            out.push_str(&format!(
                "\n[body truncated at {cap} bytes (http_max_bytes)]"
            ));
        }
        ToolOutput {
            content: out,
            is_error: status.is_client_error() || status.is_server_error(),
            ..Default::default()
        }
    }
}
