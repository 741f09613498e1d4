//! The HTTP plumbing every client command shares: where the API is and which key goes
//! with it ([`ApiArgs`]), a thin client with one-line errors ([`Api`]), and what a refused
//! request says ([`ApiFailure`]).

use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use agentq_api::ErrorBody;
use agentq_core::config::Settings;

#[derive(Args, Debug, Clone)]
pub struct ApiArgs {
    /// Base URL of the HTTP API (default: `api_url` of agentq.toml, else http://127.0.0.1:7700).
    #[arg(long, env = "AGENTQ_API_URL")]
    pub api_url: Option<String>,
    /// API key, sent as `Authorization: Bearer <key>` (from `agentq keys create`).
    #[arg(long, env = "AGENTQ_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// What a refused request must tell the user: where the key comes from.
pub const KEY_HINT: &str =
    "pass an API key with --api-key or AGENTQ_API_KEY (create one with `agentq keys create`)";

impl ApiArgs {
    /// The default headers of a client of the API: the key, if one is given.
    pub fn headers(&self) -> anyhow::Result<reqwest::header::HeaderMap> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = self
            .api_key
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty())
        {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| anyhow!("--api-key (AGENTQ_API_KEY) is not a valid header value"))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        Ok(headers)
    }
}

/// A thin client of the HTTP API with one-line errors.
pub(crate) struct Api {
    base: String,
    http: reqwest::Client,
}

/// A 4xx/5xx answer, with the server's error body.
#[derive(Debug)]
pub(crate) struct ApiFailure {
    pub(crate) status: u16,
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) field: Option<String>,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(field) = &self.field {
            write!(f, " (field `{field}`)")?;
        }
        write!(f, " [HTTP {} {}]", self.status, self.code)?;
        if matches!(self.status, 401 | 403) && self.field.is_none() {
            write!(f, "; {KEY_HINT}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiFailure {}

impl ApiFailure {
    /// The failure an error answer describes: the API's error body, or (from something
    /// in front of the API) the text of a body that is not JSON.
    pub(crate) fn of(status: u16, text: &str) -> ApiFailure {
        let (code, message, field) = match serde_json::from_str::<ErrorBody>(text) {
            Ok(ErrorBody { error }) => (error.code, error.message, error.field),
            Err(_) if serde_json::from_str::<Value>(text).is_ok() => {
                ("error".to_string(), String::new(), None)
            }
            Err(_) => ("error".to_string(), text.trim().to_string(), None),
        };
        ApiFailure {
            status,
            code,
            message: if message.is_empty() {
                "no details".to_string()
            } else {
                message
            },
            field,
        }
    }
}

impl Api {
    pub(crate) fn new(args: &ApiArgs) -> anyhow::Result<Api> {
        let base = match &args.api_url {
            Some(u) if !u.trim().is_empty() => u.clone(),
            _ => Settings::load_only(None, |k| std::env::var(k).ok(), &["api_url"])?.api_url,
        };
        let http = reqwest::Client::builder()
            .default_headers(args.headers()?)
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(300))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Api {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    /// Send `req`; a 2xx answer is read as `T`, any other as an [`ApiFailure`].
    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> anyhow::Result<(u16, T)> {
        let resp = req.send().await.map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.transport_error(e))?;
        if status >= 400 {
            return Err(ApiFailure::of(status, &text).into());
        }
        let body = serde_json::from_str(&text)
            .map_err(|_| anyhow!("unexpected answer from the API: {}", text.trim()))?;
        Ok((status, body))
    }

    fn transport_error(&self, e: reqwest::Error) -> anyhow::Error {
        let cause = root_cause(&e);
        if e.is_connect() {
            anyhow!(
                "cannot reach the API at {}: {cause} (is `agentq dev` or `agentq scheduler` \
                 running there?)",
                self.base
            )
        } else if e.is_timeout() {
            anyhow!("the API at {} did not answer in time", self.base)
        } else {
            anyhow!("request to the API at {} failed: {cause}", self.base)
        }
    }

    /// The bytes of a 2xx answer to a GET of `path`, any other as an [`ApiFailure`].
    pub(crate) async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let text = resp.text().await.map_err(|e| self.transport_error(e))?;
            return Err(ApiFailure::of(status, &text).into());
        }
        resp.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| self.transport_error(e))
    }

    /// The bytes and headers of a 2xx answer to a GET of `path` (a page of a listing
    /// whose cursor is in a header), any other as an [`ApiFailure`].
    pub(crate) async fn get_page(
        &self,
        path: &str,
    ) -> anyhow::Result<(Vec<u8>, reqwest::header::HeaderMap)> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        if status >= 400 {
            let text = resp.text().await.map_err(|e| self.transport_error(e))?;
            return Err(ApiFailure::of(status, &text).into());
        }
        let body = resp.bytes().await.map_err(|e| self.transport_error(e))?;
        Ok((body.to_vec(), headers))
    }

    /// POST `body` (a stream, sent as it is read) as `content_type`; the answer as
    /// [`Api::post`] reads it.
    pub(crate) async fn post_stream<T: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: reqwest::Body,
    ) -> anyhow::Result<(u16, T)> {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body),
        )
        .await
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        Ok(self
            .send(self.http.get(format!("{}{path}", self.base)))
            .await?
            .1)
    }

    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<(u16, T)> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }
}

/// The innermost error's text, lower-cased the way a sentence continues
/// ("connection refused", not "Connection refused (os error 111)").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    if let Some(io) = cur.downcast_ref::<std::io::Error>()
        && io.kind() == std::io::ErrorKind::ConnectionRefused
    {
        return "connection refused".to_string();
    }
    let s = cur.to_string();
    let s = s.split(" (os error").next().unwrap_or(&s).to_string();
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => s,
    }
}

/// Percent-encode a query value (ids and statuses are plain, but the user typed them).
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
