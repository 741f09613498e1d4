//! The API's listener: the accept loop and each connection's HTTP/1.1 server, with the
//! limits that keep hostile or broken clients from holding the process's connections
//! and file descriptors.
//!
//! - At most `max_connections` connections are served at once, and at most
//!   `max_connections_per_peer` from one peer (an IPv4 address, an IPv6 /64: one host
//!   commonly holds a whole /64). A connection is *unauthenticated* until one of its
//!   requests passes the key check, and again after a request that does not (one of a
//!   key revoked since, or one needing no key such as `/healthz`): a place is kept only
//!   by going on using a key that may still be used. A new connection past either cap closes the oldest
//!   unauthenticated connection (of the same peer, when the peer is at its cap) and takes
//!   its place; only when there is none (every connection authenticated) is it answered
//!   503 with `Retry-After` and a JSON body, and closed. A connection that carried a
//!   request of an API key counts against that key's `max_connections_per_key` until it
//!   closes; a request past it is answered 503 and its connection closed. Running out of
//!   file descriptors on `accept` pauses the loop briefly instead of ending it.
//!
//!   The worst case, for a key holder. Connections that never send a keyed request (from
//!   any number of addresses) cannot keep it out: its new connection takes the place of
//!   the oldest of them, and is itself closed only if `max_connections` less the
//!   authenticated connections newer connections arrive before its first request is
//!   checked (about one round trip) — thousands within a few milliseconds, sustained, and
//!   even then each retry of the key holder gets the same chance. From one address an
//!   attacker only displaces its own connections. What can keep a key holder out is
//!   authenticated connections: `max_connections / max_connections_per_key` keys' worth
//!   (16 with the defaults), each sending requests with a usable key at least every
//!   `header_read_timeout` (an idle one is closed after it).
//! - A client has `header_read_timeout` to send a request's headers, counted from when
//!   the server starts waiting for them, so an idle keep-alive connection is closed after
//!   as long too; and `body_read_timeout` for the whole body from the request's start
//!   (not per chunk: a body trickled a byte at a time is cut all the same), answered 408.
//! - A write may wait `write_timeout` for the client to take bytes; a client that stops
//!   reading (an event stream it no longer reads, answers to pipelined requests it never
//!   reads) is disconnected then, as hyper itself never gives up on a write.
//! - A request line longer than [`MAX_URI_BYTES`] is a 414 and headers larger than
//!   [`MAX_HEADER_BYTES`] a 431, both with the API's JSON error body; a request head
//!   hyper itself refuses (past its read buffer) gets the same bodies.
//! - On shutdown the loop stops accepting and every connection finishes its requests
//!   in flight (event streams end as the scheduler drains), within a bounded grace.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use agentq_api::{ErrorBody, ErrorDetail};
use agentq_core::config::SchedulerSection;

use crate::error::ApiError;

/// Longest request target (path and query) served; session ids are UUIDs.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Largest request head (all header names and values) served.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Connections being refused at once (each is answered and closed within
/// [`REFUSE_WITHIN`]); past it a connection over the cap is closed without an answer.
const MAX_REFUSING: usize = 64;
const REFUSE_WITHIN: Duration = Duration::from_secs(1);
/// Seconds a client refused for the connection cap is told to wait.
const RETRY_AFTER_SECS: u64 = 1;
/// How long shutdown waits for connections to finish their requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Pause of the accept loop when the process is out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The listener's limits (from `[scheduler]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    pub max_connections: usize,
    /// Open connections at most that carried a request of one API key.
    pub max_connections_per_key: usize,
    /// Open connections at most from one peer (see the module docs).
    pub max_connections_per_peer: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub write_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        let c = SchedulerSection::default();
        ServeLimits {
            max_connections: c.max_connections,
            max_connections_per_key: c.max_connections_per_key,
            max_connections_per_peer: c.max_connections_per_peer,
            header_read_timeout: Duration::from_secs(c.header_read_timeout_secs),
            body_read_timeout: Duration::from_secs(c.body_read_timeout_secs),
            write_timeout: Duration::from_secs(c.write_timeout_secs),
        }
    }
}

/// Serve `app` on `listener` until `shutdown` is cancelled (see the module docs), then
/// wait for the connections to finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let slots = Arc::new(Slots {
        max_total: limits.max_connections.max(1),
        max_per_peer: limits.max_connections_per_peer.max(1),
        state: Mutex::default(),
    });
    let keys = Arc::new(KeyConnections {
        max_per_key: limits.max_connections_per_key.max(1),
        open: Mutex::new(HashMap::new()),
    });
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let conns = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.cancelled() => break,
        };
        let (stream, from) = match accepted {
            Ok(a) => a,
            Err(e) if is_per_connection(&e) => continue,
            Err(e) => {
                // EMFILE/ENFILE and the like: connections in flight free some up.
                tracing::warn!(error = %e, "cannot accept a connection; pausing");
                tokio::select! {
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    _ = shutdown.cancelled() => break,
                }
                continue;
            }
        };
        // Events are small writes that should go out at once.
        let _ = stream.set_nodelay(true);
        match slots.admit(Peer::of(from)) {
            Ok(slot) => {
                let app = app.clone();
                let shutdown = shutdown.clone();
                let evicted = slot.evicted.clone();
                let tag = Connection::new(keys.clone(), slots.clone(), slot.id);
                conns.spawn(async move {
                    serve_connection(stream, app, limits, tag, evicted, shutdown).await;
                    drop(slot);
                });
            }
            Err(full) => {
                if let Ok(permit) = refusing.clone().try_acquire_owned() {
                    conns.spawn(async move {
                        let _ = tokio::time::timeout(REFUSE_WITHIN, refuse(stream, full)).await;
                        drop(permit);
                    });
                }
            }
        }
    }
    conns.close();
    // A client that stops reading its answer would hold the connection, and with it the
    // shutdown, for ever: past the grace the remaining connections are left to the
    // process's exit.
    if tokio::time::timeout(SHUTDOWN_GRACE, conns.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            left = conns.len(),
            "connections still open after the shutdown grace; leaving them"
        );
    }
    Ok(())
}

/// Errors of one connection that `accept` reports: the next accept works.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Where a connection comes from, for `max_connections_per_peer`: an IPv4 address (an
/// IPv4-mapped IPv6 one counts as it), or the /64 of an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Peer {
    V4(Ipv4Addr),
    V6(u64),
}

impl Peer {
    fn of(addr: SocketAddr) -> Peer {
        match addr.ip() {
            IpAddr::V4(a) => Peer::V4(a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Peer::V4(v4),
                None => Peer::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Full {
    /// `max_connections`, every one authenticated.
    Total,
    /// `max_connections_per_peer`, every one of the peer's authenticated.
    Peer,
}

/// The listener's connections against `max_connections` and `max_connections_per_peer`,
/// and which of them have not authenticated a request (see the module docs).
#[derive(Debug)]
struct Slots {
    max_total: usize,
    max_per_peer: usize,
    state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    next_id: u64,
    /// Every open connection by id (ids grow with each accept, so lower is older).
    open: HashMap<u64, Open>,
    /// The unauthenticated ones, oldest first.
    unauthenticated: BTreeSet<u64>,
    peers: HashMap<Peer, PeerSlots>,
}

#[derive(Debug)]
struct Open {
    peer: Peer,
    /// Cancelled to close the connection for a newer one.
    evicted: CancellationToken,
}

#[derive(Debug, Default)]
struct PeerSlots {
    open: usize,
    unauthenticated: BTreeSet<u64>,
}

/// A connection's place; dropping it (when the connection ends) frees it.
struct Slot {
    slots: Arc<Slots>,
    id: u64,
    evicted: CancellationToken,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection from `peer`, closing the oldest unauthenticated
    /// connection (the peer's own when the peer is at its cap) if that is what it takes.
    fn admit(self: &Arc<Self>, peer: Peer) -> Result<Slot, Full> {
        let mut st = self.lock();
        let peer_open = st.peers.get(&peer).map_or(0, |p| p.open);
        if peer_open >= self.max_per_peer {
            let victim = st
                .peers
                .get(&peer)
                .and_then(|p| p.unauthenticated.first().copied())
                .ok_or(Full::Peer)?;
            st.evict(victim);
        }
        if st.open.len() >= self.max_total {
            let victim = st.unauthenticated.first().copied().ok_or(Full::Total)?;
            st.evict(victim);
        }
        let id = st.next_id;
        st.next_id = st.next_id.wrapping_add(1);
        let evicted = CancellationToken::new();
        st.open.insert(
            id,
            Open {
                peer,
                evicted: evicted.clone(),
            },
        );
        st.unauthenticated.insert(id);
        let p = st.peers.entry(peer).or_default();
        p.open = p.open.saturating_add(1);
        p.unauthenticated.insert(id);
        Ok(Slot {
            slots: self.clone(),
            id,
            evicted,
        })
    }

    /// Connection `id` carried a request that did not pass the key check: it may be
    /// closed for a newer one again (the oldest such first: its id).
    fn unauthenticated(&self, id: u64) {
        let mut st = self.lock();
        let Some(peer) = st.open.get(&id).map(|o| o.peer) else {
            return;
        };
        st.unauthenticated.insert(id);
        if let Some(p) = st.peers.get_mut(&peer) {
            p.unauthenticated.insert(id);
        }
    }

    /// Connection `id` carried a request that passed the key check: it is not closed for
    /// a newer one while its requests go on passing it.
    fn authenticated(&self, id: u64) {
        let mut st = self.lock();
        let Some(peer) = st.open.get(&id).map(|o| o.peer) else {
            return;
        };
        st.unauthenticated.remove(&id);
        if let Some(p) = st.peers.get_mut(&peer) {
            p.unauthenticated.remove(&id);
        }
    }
}

impl SlotState {
    /// Forget connection `id` (its place is free at once) and tell it to close.
    fn evict(&mut self, id: u64) {
        if let Some(o) = self.remove(id) {
            tracing::debug!(peer = ?o.peer, "closing an unauthenticated connection for a new one");
            o.evicted.cancel();
        }
    }

    fn remove(&mut self, id: u64) -> Option<Open> {
        let o = self.open.remove(&id)?;
        self.unauthenticated.remove(&id);
        if let Some(p) = self.peers.get_mut(&o.peer) {
            p.open = p.open.saturating_sub(1);
            p.unauthenticated.remove(&id);
            if p.open == 0 {
                self.peers.remove(&o.peer);
            }
        }
        Some(o)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Gone already when it was evicted.
        self.slots.lock().remove(self.id);
    }
}

/// Most distinct API keys one connection may carry requests of: each counts the
/// connection against its own cap, so switching keys on one connection buys nothing.
const MAX_KEYS_PER_CONNECTION: usize = 16;

/// Connections per API key, across the listener: a connection counts once for every key
/// that authenticated a request on it, until it closes. A key is only known after its
/// first request, so this caps what one key holds; the total cap bounds the rest.
#[derive(Debug)]
struct KeyConnections {
    max_per_key: usize,
    open: Mutex<HashMap<String, usize>>,
}

/// The connection a request came on (a request extension): the authentication layer
/// counts it against the caller's key with [`Connection::bind`].
#[derive(Clone, Debug)]
pub struct Connection(Arc<ConnectionKeys>);

#[derive(Debug)]
struct ConnectionKeys {
    registry: Arc<KeyConnections>,
    keys: Mutex<Vec<String>>,
    slots: Arc<Slots>,
    id: u64,
    /// The request being served passed the key check (HTTP/1.1 serves a connection's
    /// requests one at a time).
    passed: AtomicBool,
}

impl Connection {
    fn new(registry: Arc<KeyConnections>, slots: Arc<Slots>, id: u64) -> Self {
        Connection(Arc::new(ConnectionKeys {
            registry,
            keys: Mutex::new(Vec::new()),
            slots,
            id,
            passed: AtomicBool::new(false),
        }))
    }

    /// A request on this connection passed the key check: the connection is no longer
    /// one a newer connection may take the place of.
    pub fn authenticated(&self) {
        self.0.passed.store(true, Ordering::Relaxed);
        self.0.slots.authenticated(self.0.id);
    }

    /// A request starts: it has not passed the key check yet.
    fn request_started(&self) {
        self.0.passed.store(false, Ordering::Relaxed);
    }

    /// A request was answered (its head): one that did not pass the key check leaves the
    /// connection one a newer connection may take the place of. Otherwise an attacker
    /// keeps connections it authenticated once for good, past its key's revocation,
    /// with requests that need no key every `header_read_timeout`.
    fn request_answered(&self) {
        if !self.0.passed.load(Ordering::Relaxed) {
            self.0.slots.unauthenticated(self.0.id);
        }
    }

    /// Count this connection for `key`, once; a 503 when the key already holds its cap
    /// of connections or the connection has carried too many keys (the caller then
    /// closes it).
    pub fn bind(&self, key: &str) -> Result<(), ApiError> {
        let mut keys = self.0.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.iter().any(|k| k == key) {
            return Ok(());
        }
        let overloaded = |message: String| ApiError::Overloaded {
            message,
            retry_after: RETRY_AFTER_SECS,
        };
        if keys.len() >= MAX_KEYS_PER_CONNECTION {
            return Err(overloaded(format!(
                "one connection carries the requests of at most {MAX_KEYS_PER_CONNECTION} API keys"
            )));
        }
        let registry = &self.0.registry;
        let mut open = registry.open.lock().unwrap_or_else(|e| e.into_inner());
        let held = open.get(key).copied().unwrap_or(0);
        if held >= registry.max_per_key {
            return Err(overloaded(format!(
                "this API key holds {} open connections, the most it may \
                 (scheduler.max_connections_per_key); close one or retry later",
                registry.max_per_key
            )));
        }
        open.insert(key.to_string(), held + 1);
        keys.push(key.to_string());
        Ok(())
    }
}

impl Drop for ConnectionKeys {
    fn drop(&mut self) {
        let keys = std::mem::take(self.keys.get_mut().unwrap_or_else(|e| e.into_inner()));
        let mut open = self.registry.open.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            crate::events::caps::release(&mut open, &key);
        }
    }
}

/// Answer a connection over the cap with a 503 and close it.
async fn refuse(mut stream: TcpStream, full: Full) {
    let message = match full {
        Full::Total => "too many open connections; retry later",
        Full::Peer => {
            "too many open connections from your address \
             (scheduler.max_connections_per_peer); close one or retry later"
        }
    };
    let err = ApiError::Overloaded {
        message: message.into(),
        retry_after: RETRY_AFTER_SECS,
    };
    let resp = raw_response(&err, &[("retry-after", &RETRY_AFTER_SECS.to_string())]);
    if stream.write_all(&resp).await.is_ok() {
        let _ = stream.shutdown().await;
        // Read what the client sent, so closing does not reset the connection before
        // the client has read the answer.
        let mut sink = [0u8; 4096];
        while matches!(tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await, Ok(n) if n > 0)
        {
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: ServeLimits,
    tag: Connection,
    evicted: CancellationToken,
    shutdown: CancellationToken,
) {
    let io = TokioIo::new(WriteDeadline::new(
        JsonParseErrors::new(stream),
        limits.write_timeout,
    ));
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(tag.clone());
        let (app, tag) = (app.clone(), tag.clone());
        async move {
            tag.request_started();
            let resp = handle(app, limits.body_read_timeout, req).await;
            tag.request_answered();
            resp
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = http.serve_connection(io, service);
    tokio::pin!(conn);
    let served = tokio::select! {
        r = conn.as_mut() => r,
        // Dropped at once, whatever it was doing: it never authenticated.
        _ = evicted.cancelled() => return,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// One request: the size checks, then the router with the body under its deadline.
async fn handle(
    app: Router,
    body_timeout: Duration,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let uri_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri_len > MAX_URI_BYTES {
        return Ok(closing(ApiError::UriTooLong(format!(
            "the request target is {uri_len} bytes; at most {MAX_URI_BYTES} are read"
        ))));
    }
    let header_bytes = req.headers().iter().fold(0usize, |n, (k, v)| {
        n.saturating_add(k.as_str().len())
            .saturating_add(v.len())
            .saturating_add(4)
    });
    if header_bytes > MAX_HEADER_BYTES {
        return Ok(closing(ApiError::HeadersTooLarge(format!(
            "the request headers are {header_bytes} bytes; at most {MAX_HEADER_BYTES} are read"
        ))));
    }
    let timed_out = Arc::new(AtomicBool::new(false));
    let deadline = tokio::time::Instant::now() + body_timeout;
    let req = req.map(|b| Body::new(DeadlineBody::new(b, deadline, timed_out.clone())));
    let resp = match app.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    if timed_out.load(Ordering::Relaxed) {
        return Ok(closing(ApiError::Timeout(format!(
            "the request body was not received within {} s",
            body_timeout.as_secs()
        ))));
    }
    Ok(resp)
}

/// `err` as the answer, closing the connection after it (what follows on it cannot be
/// trusted to be the next request).
fn closing(err: ApiError) -> Response<Body> {
    let mut resp = err.into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// A whole HTTP/1.1 response of `err` (for answers written outside hyper).
fn raw_response(err: &ApiError, extra: &[(&str, &str)]) -> Vec<u8> {
    let body = ErrorBody {
        error: ErrorDetail {
            code: err.code().to_string(),
            message: err.to_string(),
            field: None,
        },
    };
    // Through a `Value`, like every answer of the API (sorted keys).
    let body = serde_json::to_value(&body)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let status = err.status();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

/// The request body, failing once `deadline` has passed.
struct DeadlineBody {
    inner: Incoming,
    deadline: tokio::time::Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl DeadlineBody {
    fn new(inner: Incoming, deadline: tokio::time::Instant, timed_out: Arc<AtomicBool>) -> Self {
        DeadlineBody {
            inner,
            deadline,
            sleep: None,
            timed_out,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        // The timer only exists for bodies that are waited for.
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(Box::new(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request body was not received in time",
            )))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's socket, answering with the API's JSON body where hyper itself
/// refuses a request head (414, 431) with an empty one.
///
/// hyper writes such an answer as one buffer holding only a head with
/// `content-length: 0`, and closes the connection after it. A buffer like that is
/// recognised whole and replaced; nothing else can match it, since the API's answers
/// are JSON (no raw line breaks) and writes are not vectored (so a head is never split
/// from its buffer's start).
struct JsonParseErrors<S> {
    inner: S,
    /// A replacement answer still to be written, and how much of it was.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonParseErrors<S> {
    fn new(inner: S) -> Self {
        JsonParseErrors {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// The JSON answer for a head hyper wrote for a request it could not parse, if `buf`
/// is one.
fn replacement(buf: &[u8]) -> Option<Vec<u8>> {
    if buf.len() > 512 {
        return None;
    }
    let head = std::str::from_utf8(buf).ok()?;
    let rest = head.strip_prefix("HTTP/1.1 ")?;
    if !head.ends_with("\r\n\r\n")
        || !head
            .to_ascii_lowercase()
            .contains("\r\ncontent-length: 0\r\n")
    {
        return None;
    }
    let err = match rest.get(..4)? {
        "414 " => ApiError::UriTooLong(format!(
            "the request target is too long; at most {MAX_URI_BYTES} bytes are read"
        )),
        "431 " => ApiError::HeadersTooLarge(format!(
            "the request head is too large; at most {MAX_HEADER_BYTES} bytes of headers are read"
        )),
        _ => return None,
    };
    Some(raw_response(&err, &[]))
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some(answer) = replacement(buf) {
            this.pending = answer;
            // Taken whole: what is left goes out with the next write, flush or shutdown.
            if let Poll::Ready(Err(e)) = this.poll_pending(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// A connection whose writes fail once one has waited `limit` for the peer to take bytes
/// (the wait is counted from the first write that could not proceed; any progress ends
/// it), so that the connection and its slot are given up.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// `poll` as a write: pending past the deadline is an error.
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut S, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll(&mut self.inner, cx) {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let sleep = self.stalled.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(
                        tokio::time::Instant::now()
                            .checked_add(limit)
                            .unwrap_or_else(tokio::time::Instant::now),
                    ))
                });
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client took no bytes within the write timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .guard(cx, |s, cx| Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().guard(cx, |s, cx| Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .guard(cx, |s, cx| Pin::new(s).poll_shutdown(cx))
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn only_hyper_parse_error_heads_are_replaced() {
        let date = "date: Tue, 01 Dec 2026 14:00:00 GMT\r\n";
        let head = format!(
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n{date}\r\n"
        );
        let got = String::from_utf8(replacement(head.as_bytes()).unwrap()).unwrap();
        assert!(got.starts_with("HTTP/1.1 431 "), "{got}");
        assert!(got.contains("\"code\":\"headers_too_large\""), "{got}");
        let head = format!("HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n{date}\r\n");
        assert!(replacement(head.as_bytes()).is_some());
        // An answer with a body, another status, or part of one: left alone.
        let with_body =
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 2\r\n\r\n{}";
        assert!(replacement(with_body.as_bytes()).is_none());
        let other = format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{date}\r\n");
        assert!(replacement(other.as_bytes()).is_none());
        assert!(replacement(b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n").is_none());
    }
}
