//! Who is calling: the one check every route of the API passes through.
//!
//! [`require`] runs on every matched route (a `route_layer` of the router). It looks the
//! route up in the access table the router is built from (`routes`): a route
//! missing from the table is refused, so a new route cannot be served unchecked. An open
//! route (`/healthz`, `/readyz`) passes; any other needs `Authorization: Bearer <key>`
//! naming a key that exists, is neither expired nor revoked, and holds the route's scope
//! (a route of [`Access::Key`], `/mcp`, takes any valid key and checks the scope of each
//! operation it serves with [`require_scope`]).
//! The [`Caller`] it runs as goes into the request's extensions, where handlers take it
//! with the [`Auth`] extractor and scope every read and write by its tenant.
//!
//! Keys are checked without a database round trip once seen: a key's row is cached for
//! `key_cache_secs` (a revoked key is refused at most that long after the revocation;
//! its expiry is checked on every request), and ids that name no key are remembered in a
//! bounded negative cache, so a flood of made-up keys does not cost a query each.
//!
//! An answer still being sent when its key is revoked (an event stream, a download) is
//! cut within `key_cache_secs` of the revocation (not before 250 ms), and at the key's
//! expiry: while it is open, its key's row is read again every half cache life (shared
//! through the cache by every answer of the key). What the connection was handed before
//! the cut (its buffers, and at most one 64 KiB piece) still reaches the client.
//!
//! [`loopback_hosts`] is the DNS-rebinding defence of `agentq dev`: a browser page whose
//! name was rebound to 127.0.0.1 still sends its own name as `Host`.
//! [`same_origin_writes`] is its cross-site defence: a keyless server takes writes only
//! as JSON and never from a page of another origin.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use agentq_core::Store;
use agentq_core::auth::{self, ApiKey, Caller, KeyRejected, Scope};

use crate::error::ApiError;

/// Ids that named no key, remembered at most this many at once (then forgotten all
/// together: garbage must not grow the process).
const MAX_NEGATIVE: usize = 10_000;
/// Keys whose rows are cached at most this many at once.
const MAX_POSITIVE: usize = 10_000;

/// What a route requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Served to anyone (liveness and readiness probes).
    Open,
    /// A key holding this scope (or `admin`).
    Scope(Scope),
    /// Any valid key, whatever its scopes: the route serves several operations and its
    /// handler checks the scope of each (`/mcp`, whose tools need what their REST routes
    /// need).
    Key,
}

/// How the API authenticates.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// SHA-256 (hex) of the operator's admin key (`AGENTQ_ADMIN_KEY`), if one is set.
    pub admin_key_hash: Option<String>,
    /// A request without a key runs as [`Caller::local`] (a loopback `agentq dev`); a
    /// presented key is still checked.
    pub keyless: bool,
    /// Serve only requests whose `Host` is a loopback name.
    pub loopback_hosts_only: bool,
    /// How long a key's row is trusted without reading it again.
    pub cache_ttl: Duration,
}

impl Default for AuthSettings {
    fn default() -> Self {
        AuthSettings {
            admin_key_hash: None,
            keyless: false,
            loopback_hosts_only: false,
            cache_ttl: Duration::from_secs(30),
        }
    }
}

impl AuthSettings {
    /// Accept `key` as the admin key.
    pub fn with_admin_key(mut self, key: &str) -> Self {
        self.admin_key_hash = Some(auth::hash_key(key));
        self
    }
}

#[derive(Default)]
struct Cache {
    /// Key id → its row and when it was read.
    known: HashMap<String, (ApiKey, Instant)>,
    /// Key ids that named no row, and when that was found.
    unknown: HashMap<String, Instant>,
}

/// The key check and its cache. Cheap to clone (shared).
#[derive(Clone)]
pub struct Authenticator {
    keys: Arc<dyn Store>,
    settings: Arc<AuthSettings>,
    /// (method, path pattern, what it requires): the router's own table.
    table: Arc<Vec<(Method, &'static str, Access)>>,
    cache: Arc<Mutex<Cache>>,
}

impl Authenticator {
    pub fn new(
        keys: Arc<dyn Store>,
        settings: AuthSettings,
        table: impl IntoIterator<Item = (Method, &'static str, Access)>,
    ) -> Self {
        Authenticator {
            keys,
            settings: Arc::new(settings),
            table: Arc::new(table.into_iter().collect()),
            cache: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the route of `method` and `path` (its pattern) requires; `None`: not in the
    /// table.
    fn access(&self, method: &Method, path: &str) -> Option<Access> {
        // axum answers HEAD with the GET handler: it needs what GET needs.
        let method = if method == Method::HEAD {
            &Method::GET
        } else {
            method
        };
        self.table
            .iter()
            .find(|(m, p, _)| m == method && *p == path)
            .map(|(_, _, a)| *a)
    }

    /// The caller `key` authenticates, or why not.
    pub async fn authenticate(&self, key: &str) -> Result<Caller, ApiError> {
        if let Some(admin) = &self.settings.admin_key_hash
            && auth::matches_hash(key, admin)
        {
            return Ok(Caller::admin());
        }
        let Some(id) = auth::key_id(key) else {
            return Err(unauthorized(&KeyRejected::Unknown.to_string()));
        };
        let row = self.key_row(id).await?;
        auth::verify(key, row.as_ref(), chrono::Utc::now())
            .map_err(|e| unauthorized(&e.to_string()))
    }

    /// The row of key `id`, from the cache when fresh.
    async fn key_row(&self, id: &str) -> Result<Option<ApiKey>, ApiError> {
        self.key_row_within(id, self.settings.cache_ttl).await
    }

    /// The row of key `id`, from the cache when read less than `max_age` ago (a read
    /// refreshes the cache for every request of the key).
    async fn key_row_within(
        &self,
        id: &str,
        max_age: Duration,
    ) -> Result<Option<ApiKey>, ApiError> {
        let ttl = self.settings.cache_ttl;
        let fresh = max_age.min(ttl);
        {
            let cache = self.lock();
            if let Some((row, at)) = cache.known.get(id)
                && at.elapsed() < fresh
            {
                return Ok(Some(row.clone()));
            }
            if let Some(at) = cache.unknown.get(id)
                && at.elapsed() < fresh
            {
                return Ok(None);
            }
        }
        let row = self.keys.key(id).await?;
        let mut cache = self.lock();
        let now = Instant::now();
        match &row {
            Some(r) => {
                if cache.known.len() >= MAX_POSITIVE {
                    cache.known.retain(|_, (_, at)| at.elapsed() < ttl);
                    if cache.known.len() >= MAX_POSITIVE {
                        cache.known.clear();
                    }
                }
                cache.known.insert(id.to_string(), (r.clone(), now));
                cache.unknown.remove(id);
            }
            None => {
                if cache.unknown.len() >= MAX_NEGATIVE {
                    cache.unknown.clear();
                }
                cache.unknown.insert(id.to_string(), now);
            }
        }
        Ok(row)
    }

    /// How often a long-lived answer of a key reads the key's row again: half the
    /// cache's life, so that a revocation ends it within `key_cache_secs` (a check sees
    /// a row at most half a life old, and the next check comes half a life later), but
    /// not more often than [`MIN_RECHECK`] (a cache of 0 s would otherwise mean a read
    /// per answer per poll).
    fn recheck_every(&self) -> Duration {
        (self.settings.cache_ttl / 2).max(MIN_RECHECK)
    }

    /// Resolves once key `id` may no longer be used: revoked (seen within
    /// [`Self::recheck_every`] of a re-read), expired (at its expiry), or gone. A
    /// database that cannot be read ends it too: the answer it bounds is cut, and the
    /// client's reconnect (event streams resume with `Last-Event-ID`) is checked afresh.
    async fn until_unusable(self, id: String) {
        let every = self.recheck_every();
        loop {
            let row = match self.key_row_within(&id, every).await {
                Ok(Some(row)) => row,
                Ok(None) => return,
                Err(_) => {
                    tracing::warn!(key_id = %id, "cannot re-read an API key; ending its open answer");
                    return;
                }
            };
            let now = chrono::Utc::now();
            if let Some(why) = row.unusable(now) {
                tracing::info!(key_id = %id, why, "ending an open answer of an unusable API key");
                return;
            }
            let mut wait = every;
            if let Some(left) = row.expires_at.and_then(|t| (t - now).to_std().ok()) {
                wait = wait.min(left);
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// The shortest interval between re-reads of a key for its long-lived answers.
const MIN_RECHECK: Duration = Duration::from_millis(250);

/// An answer's body that ends (as a failure: the connection is cut, so a download is
/// never taken for complete) once its key may no longer be used. Only a body still being
/// sent is watched: the watch starts the first time the body has nothing ready, or once
/// more than [`PIECE_BYTES`] of it were handed on. A large frame (a file read whole) is
/// handed on in pieces of at most that: the connection asks for the next piece only as
/// the client takes the last ones, so each ask is a chance to cut it; handed on whole, a
/// slow client read it to its end however long after the revocation.
struct KeyBound {
    inner: axum::body::Body,
    watch: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    /// What is left of the frame being handed on in pieces.
    rest: axum::body::Bytes,
    /// The watch has started.
    watching: bool,
}

/// The largest piece of an answer handed on at once (see [`KeyBound`]).
const PIECE_BYTES: usize = 64 * 1024;

impl KeyBound {
    fn new(
        inner: axum::body::Body,
        watch: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ) -> Self {
        KeyBound {
            inner,
            watch,
            rest: axum::body::Bytes::new(),
            watching: false,
        }
    }

    /// The next piece of `rest`; the watch starts when more is left after it.
    fn piece(&mut self) -> http_body::Frame<axum::body::Bytes> {
        let n = self.rest.len().min(PIECE_BYTES);
        let piece = self.rest.split_to(n);
        if !self.rest.is_empty() {
            self.watching = true;
        }
        http_body::Frame::data(piece)
    }
}

impl http_body::Body for KeyBound {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        let unusable = || {
            Poll::Ready(Some(Err(
                "the API key of this answer may no longer be used".into(),
            )))
        };
        if this.watching && this.watch.as_mut().poll(cx).is_ready() {
            return unusable();
        }
        if !this.rest.is_empty() {
            return Poll::Ready(Some(Ok(this.piece())));
        }
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.len() > PIECE_BYTES => {
                    this.rest = data;
                    Poll::Ready(Some(Ok(this.piece())))
                }
                Ok(data) => Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(other) => Poll::Ready(other.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                this.watching = true;
                if this.watch.as_mut().poll(cx).is_ready() {
                    return unusable();
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

fn unauthorized(why: &str) -> ApiError {
    ApiError::Unauthorized(format!(
        "{why}: send `Authorization: Bearer <key>` with a key from `agentq keys create`"
    ))
}

/// The key of an `Authorization: Bearer <key>` header; `Ok(None)` without the header.
fn bearer(value: Option<&HeaderValue>) -> Result<Option<&str>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| unauthorized("the Authorization header is not text"))?;
    let (scheme, key) = value
        .split_once(' ')
        .ok_or_else(|| unauthorized("the Authorization header is not `Bearer <key>`"))?;
    if !scheme.eq_ignore_ascii_case("bearer") || key.trim().is_empty() {
        return Err(unauthorized(
            "the Authorization header is not `Bearer <key>`",
        ));
    }
    Ok(Some(key.trim()))
}

/// The check of every route (see the module docs).
pub async fn require(State(a): State<Authenticator>, mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let authorization = req.headers().get(header::AUTHORIZATION).cloned();
    match check(&a, &method, path.as_deref(), authorization.as_ref()).await {
        Ok(Some(caller)) => {
            // Count the connection against the key (see `serve`); one over the key's cap
            // is closed after the answer, freeing the slot it took.
            let conn = req.extensions().get::<crate::serve::Connection>();
            if let (Some(key), Some(conn)) = (caller.key_id.as_deref(), conn)
                && let Err(e) = conn.bind(key)
            {
                let mut resp = e.into_response();
                resp.headers_mut().insert(
                    header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
                return resp;
            }
            // Authenticated: no longer a connection a newer one may displace (`serve`).
            if let Some(conn) = conn {
                conn.authenticated();
            }
            let key_id = caller.key_id.clone();
            req.extensions_mut().insert(caller);
            let resp = next.run(req).await;
            match key_id {
                // A key checked once would otherwise keep an event stream (or any answer
                // still being sent) for as long as it lasts, revoked or expired.
                Some(id) => resp.map(|inner| {
                    axum::body::Body::new(KeyBound::new(
                        inner,
                        Box::pin(a.clone().until_unusable(id)),
                    ))
                }),
                None => resp,
            }
        }
        Ok(None) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// The caller of `req`; `None` for an open route.
async fn check(
    a: &Authenticator,
    method: &Method,
    path: Option<&str>,
    authorization: Option<&HeaderValue>,
) -> Result<Option<Caller>, ApiError> {
    let access = path.and_then(|p| a.access(method, p));
    let scope = match access {
        Some(Access::Open) => return Ok(None),
        Some(Access::Scope(scope)) => Some(scope),
        Some(Access::Key) => None,
        None => {
            tracing::error!(%method, path = ?path, "route missing from the access table");
            return Err(ApiError::Forbidden {
                field: None,
                message: "this route is not open to any key".into(),
            });
        }
    };
    let caller = match bearer(authorization)? {
        Some(key) => a.authenticate(key).await?,
        None if a.settings.keyless => Caller::local(),
        None => return Err(unauthorized("no API key")),
    };
    if let Some(scope) = scope {
        require_scope(&caller, scope)?;
    }
    Ok(Some(caller))
}

/// A 403 naming `scope` unless `caller` holds it.
pub fn require_scope(caller: &Caller, scope: Scope) -> Result<(), ApiError> {
    if caller.allows(scope) {
        return Ok(());
    }
    Err(ApiError::Forbidden {
        field: None,
        message: format!("the API key lacks the scope `{scope}`"),
    })
}

/// Whether `host` (a `Host` header: a name or address, maybe with a port) is loopback.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // `[::1]` or `[::1]:7700`
        match rest.split_once(']') {
            Some((addr, "")) => addr,
            Some((addr, port)) if port.strip_prefix(':').is_some_and(valid_port) => addr,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if valid_port(port) => name,
            Some(_) => return false,
            None => host,
        }
    };
    name.eq_ignore_ascii_case("localhost")
        || name == "127.0.0.1"
        || name
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback())
}

fn valid_port(p: &str) -> bool {
    !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
}

/// Refuse a request whose `Host` is not loopback (when so configured), before anything
/// else (the fallback included).
pub async fn loopback_hosts(State(a): State<Authenticator>, req: Request, next: Next) -> Response {
    if a.settings.loopback_hosts_only {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        if !host.is_some_and(is_loopback_host) {
            return ApiError::Forbidden {
                field: Some("Host".into()),
                message: format!(
                    "the Host header {:?} is not a loopback name (localhost, 127.0.0.1, [::1]): \
                     this server answers local clients only",
                    host.unwrap_or("")
                ),
            }
            .into_response();
        }
    }
    next.run(req).await
}

/// Whether `method` may change state (anything but a read).
fn is_write(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Refuse, on a keyless server, a write a web page on another origin could have sent
/// (see [`same_origin_writes`]); `None` lets the request through.
fn cross_site_write(method: &Method, headers: &axum::http::HeaderMap) -> Option<ApiError> {
    if !is_write(method) {
        return None;
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        // A page of this server is `http://` + the `Host` it was loaded from, which is a
        // loopback name here; `null` (a sandboxed frame, a file) is nobody's.
        let same = origin
            .strip_prefix("http://")
            .zip(host)
            .is_some_and(|(o, h)| o.eq_ignore_ascii_case(h) && is_loopback_host(o));
        if !same {
            return Some(ApiError::Forbidden {
                field: Some("Origin".into()),
                message: format!(
                    "a state-changing request from the web page {:?} is refused: this keyless \
                     server takes writes only from local clients and its own pages",
                    origin.chars().take(200).collect::<String>()
                ),
            });
        }
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // A JSON Lines upload needs a preflight as JSON does.
    if !(crate::http::body::is_json_content_type(ct)
        || crate::http::body::is_jsonl_content_type(ct))
    {
        return Some(ApiError::Forbidden {
            field: Some("Content-Type".into()),
            message: format!(
                "a state-changing request must be sent as `Content-Type: application/json` \
                 (a body of `{{}}` when there is nothing to send), got {}: a web page can \
                 send other types to this keyless server from any site",
                if ct.is_empty() { "none" } else { ct }
            ),
        });
    }
    None
}

/// The cross-site defence of a keyless server (`agentq dev` on loopback, where the
/// browser's own machine is trusted): every request that may change state (not GET,
/// HEAD, OPTIONS) must be JSON (or JSON Lines) and, when a browser says where it comes from (`Origin`),
/// come from a page of this server. A page elsewhere can make a browser send a form or a
/// `text/plain` POST anywhere without asking, but not a JSON one (that needs a CORS
/// preflight, which this API never grants), and a browser always names the page's
/// origin on a cross-origin write. Servers that require keys need neither: a browser
/// never adds an `Authorization` header on its own.
pub async fn same_origin_writes(
    State(a): State<Authenticator>,
    req: Request,
    next: Next,
) -> Response {
    if a.settings.keyless
        && let Some(refused) = cross_site_write(req.method(), req.headers())
    {
        return refused.into_response();
    }
    next.run(req).await
}

/// The authenticated caller of a request (put there by [`require`]). A handler that
/// takes it on a route that did not authenticate answers 500: fail closed.
#[derive(Debug, Clone)]
pub struct Auth(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Caller>() {
            Some(c) => Ok(Auth(c.clone())),
            None => {
                tracing::error!("a handler needs a caller on a route that did not authenticate");
                Err(ApiError::Internal)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_apart() {
        for ok in [
            "localhost",
            "localhost:7700",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:7700",
            "[::1]",
            "[::1]:7700",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "attacker.example",
            "attacker.example:7700",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "10.0.0.1:7700",
            "[::2]:7700",
            "localhost:x",
            "[::1]x",
            "",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
