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

mod answer;
mod keys;
mod slots;
mod transport;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use agentq_core::config::SchedulerSection;

use crate::error::ApiError;

use answer::{REFUSE_WITHIN, refuse};
use keys::KeyConnections;
use slots::{Peer, Slots};
use transport::{DeadlineBody, JsonParseErrors, WriteDeadline};

pub use answer::{MAX_HEADER_BYTES, MAX_URI_BYTES};
pub use keys::Connection;

/// Connections being refused at once (each is answered and closed within
/// [`REFUSE_WITHIN`]); past it a connection over the cap is closed without an answer.
const MAX_REFUSING: usize = 64;
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
) -> std::io::Result<()> {
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
        match slots.take_slot(Peer::of(from)) {
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
fn is_per_connection(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
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
