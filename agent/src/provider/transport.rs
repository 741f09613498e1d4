//! How a provider's calls reach its endpoint: which HTTP version it speaks
//! ([`HttpVersion`]), and the clients that carry the calls ([`HttpPool`]), so that no call
//! waits for another's stream to end while the endpoint could take it.
//!
//! The HTTP client's own pool keeps one HTTP/2 connection per origin and queues the
//! requests past the server's concurrent-stream limit on it (commonly 100 to 250) instead
//! of opening a second connection: a worker with thousands of sessions in flight would
//! have only that many calls at a time per provider. [`HttpPool`] holds clients
//! ("lanes"), each with a pool of its own, and gives a call the first lane with fewer
//! than [`Transport::streams_per_connection`] calls in flight, opening a lane when every
//! one is full. On HTTP/2 a lane is one connection, so calls in flight cost a stream
//! each instead of a connection each (about 25 KB of buffers, channel and task per
//! HTTP/1.1 connection, more with TLS: docs/benchmarks.md).

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{Stream, StreamExt};
use reqwest::redirect;
use serde::{Deserialize, Serialize};

use super::HttpTimeouts;
use super::sse::error_chain;
use crate::error::{Error, Result};

/// The HTTP version a provider speaks to its endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HttpVersion {
    /// HTTP/2 where the endpoint's TLS handshake agrees to it (ALPN), else HTTP/1.1: every
    /// plain-`http` endpoint speaks HTTP/1.1.
    #[default]
    Auto,
    /// HTTP/1.1 only, a connection per call in flight.
    Http1,
    /// HTTP/2 only, without asking first ("prior knowledge"): for a plain-`http` endpoint
    /// known to speak it. One that does not fails every call.
    Http2,
}

impl HttpVersion {
    pub const NAMES: &'static str = "auto, http1 or http2";
}

impl FromStr for HttpVersion {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "auto" => Ok(HttpVersion::Auto),
            "http1" => Ok(HttpVersion::Http1),
            "http2" => Ok(HttpVersion::Http2),
            other => Err(format!("{other:?} is not {}", Self::NAMES)),
        }
    }
}

/// The default [`Transport::streams_per_connection`]: the least concurrent-stream limit
/// the HTTP/2 specification recommends a server to allow.
pub const DEFAULT_STREAMS_PER_CONNECTION: u32 = 100;

/// The most [`Transport::streams_per_connection`] may be: past this, one connection's
/// flow control and its one TCP stream carry more calls than they serve well.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 10_000;

/// How a provider's calls travel: the HTTP version, and the most calls one connection
/// carries at a time before another is opened (set it no higher than what the endpoint
/// allows, its `SETTINGS_MAX_CONCURRENT_STREAMS`: calls past that limit wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transport {
    pub http: HttpVersion,
    pub streams_per_connection: u32,
}

impl Default for Transport {
    fn default() -> Self {
        Transport {
            http: HttpVersion::Auto,
            streams_per_connection: DEFAULT_STREAMS_PER_CONNECTION,
        }
    }
}

/// How often a quiet HTTP/2 connection is pinged, and how long its answer may take before
/// the connection is closed (with its calls, which fail as retryable transport errors).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The clients of one provider, each a lane with its own connection pool; see the module
/// docs.
pub(crate) struct HttpPool {
    timeouts: HttpTimeouts,
    http: HttpVersion,
    /// Calls a lane takes at once; unbounded where calls never share a connection (and
    /// made so when an `auto` endpoint answers in HTTP/1.1).
    per_lane: AtomicUsize,
    lanes: RwLock<Vec<Arc<Lane>>>,
}

struct Lane {
    client: reqwest::Client,
    calls: AtomicUsize,
}

impl Lane {
    /// Count one more call on this lane if it has room.
    fn try_take(&self, limit: usize) -> bool {
        self.calls
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }
}

/// One call's place on a lane, held until its answer has been read (or dropped).
pub(crate) struct Call {
    lane: Arc<Lane>,
}

impl Call {
    /// A POST to `url` on this call's lane.
    pub(crate) fn post(&self, url: &str) -> reqwest::RequestBuilder {
        self.lane.client.post(url)
    }

    /// `events` (an answer's), holding this call's place on its lane until they are
    /// dropped: the answer's stream is the call's use of the connection.
    pub(crate) fn hold<S>(self, events: S) -> impl Stream<Item = S::Item> + Send + 'static
    where
        S: Stream + Send + 'static,
    {
        events.map(move |event| {
            let _place = &self;
            event
        })
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.lane.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

impl HttpPool {
    /// A pool for calls to `url`, with its first lane built, so that a client that cannot
    /// be built is a configuration error at the provider's construction, not at a call.
    pub(crate) fn new(
        timeouts: HttpTimeouts,
        transport: Transport,
        url: &reqwest::Url,
    ) -> Result<Self> {
        // Over HTTP/1.1 every call has a connection of its own whichever lane it takes: one
        // lane, whose pool keeps the idle ones for the next calls. `auto` asks for HTTP/2
        // only in a TLS handshake, so a plain endpoint gets HTTP/1.1.
        let plain = url.scheme() == "http";
        let per_lane = match transport.http {
            HttpVersion::Http1 => usize::MAX,
            HttpVersion::Auto if plain => usize::MAX,
            _ => usize::try_from(transport.streams_per_connection.max(1)).unwrap_or(usize::MAX),
        };
        let first = Arc::new(Lane {
            client: http_client(timeouts, transport.http)?,
            calls: AtomicUsize::new(0),
        });
        Ok(HttpPool {
            timeouts,
            http: transport.http,
            per_lane: AtomicUsize::new(per_lane),
            lanes: RwLock::new(vec![first]),
        })
    }

    /// Send `request` (to `url`, made by a [`Call::post`]) and wait for the answer's head, at most
    /// `idle`: the wait is silence before the first chunk, bounded like every later one. A
    /// request the endpoint never answers (or one queued behind a server's stream limit)
    /// fails as a retryable transport error instead of holding its session.
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
        idle: Duration,
    ) -> Result<reqwest::Response> {
        match tokio::time::timeout(idle, request.send()).await {
            Ok(Ok(resp)) => {
                self.answered(resp.version());
                Ok(resp)
            }
            Ok(Err(e)) => Err(Error::Transport(format!("POST {url}: {}", error_chain(&e)))),
            Err(_) => Err(Error::Transport(format!(
                "POST {url}: no response within {idle:?}"
            ))),
        }
    }

    /// An `auto` endpoint that answers in HTTP/1.1 (its TLS handshake did not agree to
    /// HTTP/2) gives every call a connection of its own: calls then keep to one lane, whose
    /// pool reuses the idle connections, instead of spreading over lanes that would each
    /// keep their own.
    fn answered(&self, version: reqwest::Version) {
        if self.http == HttpVersion::Auto && version < reqwest::Version::HTTP_2 {
            self.per_lane.store(usize::MAX, Ordering::Release);
        }
    }

    /// A place for one call: on the first lane with room, else on a new lane.
    pub(crate) fn call(&self) -> Result<Call> {
        let taken = {
            let lanes = self.lanes.read().unwrap_or_else(|e| e.into_inner());
            self.take(&lanes).map(|(at, call)| (at, call, lanes.len()))
        };
        if let Some((at, call, len)) = taken {
            // Calls gather on the first lanes: two past this one mean the load fell.
            if at.saturating_add(2) < len {
                self.prune();
            }
            return Ok(call);
        }
        // Built before the lock, which blocks its thread: a client takes a while to make.
        let client = http_client(self.timeouts, self.http)?;
        let mut lanes = self.lanes.write().unwrap_or_else(|e| e.into_inner());
        // Another call may have opened a lane, or ended, since the read.
        if let Some((_, call)) = self.take(&lanes) {
            return Ok(call);
        }
        let lane = Arc::new(Lane {
            client,
            calls: AtomicUsize::new(1),
        });
        lanes.push(lane.clone());
        Ok(Call { lane })
    }

    /// The first lane with room (its index, and the place), filled in order so that calls
    /// gather on few connections.
    fn take(&self, lanes: &[Arc<Lane>]) -> Option<(usize, Call)> {
        let limit = self.per_lane.load(Ordering::Acquire);
        lanes
            .iter()
            .enumerate()
            .find(|(_, lane)| lane.try_take(limit))
            .map(|(at, lane)| (at, Call { lane: lane.clone() }))
    }

    /// Drop the idle lanes at the end but one (kept for the next rise), and with them
    /// their clients and idle connections: a burst's lanes do not outlive it. Skipped when
    /// another call holds the lanes; a later call prunes. A lane is only taken under the
    /// read lock, so one without calls here stays without; a call that ends after its
    /// lane is dropped counts down on its own reference to it.
    fn prune(&self) {
        let Ok(mut lanes) = self.lanes.try_write() else {
            return;
        };
        let idle =
            |lane: Option<&Arc<Lane>>| lane.is_some_and(|l| l.calls.load(Ordering::Acquire) == 0);
        while lanes.len() > 2 && idle(lanes.last()) && idle(lanes.iter().rev().nth(1)) {
            lanes.pop();
        }
    }

    #[cfg(test)]
    fn lanes(&self) -> Vec<usize> {
        let lanes = self.lanes.read().unwrap_or_else(|e| e.into_inner());
        lanes
            .iter()
            .map(|l| l.calls.load(Ordering::Acquire))
            .collect()
    }
}

/// One lane's HTTP client. Redirects are never followed: a redirect would carry the
/// request (the client keeps custom headers such as `x-api-key` across origins) to a
/// place nobody configured. Only a connect timeout: a total timeout would kill long but
/// healthy streams (the idle timeout is enforced per chunk). An HTTP/2 connection is
/// pinged when quiet: one that died silently (a dropped NAT entry, a half-open TCP
/// connection) would otherwise take every new call of its lane, each waiting out the idle
/// timeout, where on HTTP/1.1 it would have failed one call.
fn http_client(timeouts: HttpTimeouts, http: HttpVersion) -> Result<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .connect_timeout(timeouts.connect)
        .redirect(redirect::Policy::none())
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true);
    let builder = match http {
        HttpVersion::Auto => builder,
        HttpVersion::Http1 => builder.http1_only(),
        HttpVersion::Http2 => builder.http2_prior_knowledge(),
    };
    builder
        .build()
        .map_err(|e| Error::Config(format!("HTTP client: {}", error_chain(&e))))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn pool(http: HttpVersion, streams: u32) -> HttpPool {
        pool_for("https://llm.example/v1", http, streams)
    }

    fn pool_for(url: &str, http: HttpVersion, streams: u32) -> HttpPool {
        HttpPool::new(
            HttpTimeouts::default(),
            Transport {
                http,
                streams_per_connection: streams,
            },
            &reqwest::Url::parse(url).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn calls_fill_the_first_lane_with_room_and_open_one_when_all_are_full() {
        let p = pool(HttpVersion::Http2, 2);
        let a = p.call().unwrap();
        let b = p.call().unwrap();
        assert_eq!(p.lanes(), [2]);
        let c = p.call().unwrap();
        assert_eq!(p.lanes(), [2, 1]);
        assert!(!Arc::ptr_eq(&a.lane, &c.lane) && Arc::ptr_eq(&a.lane, &b.lane));
        // A place freed on the first lane is taken before the second lane's.
        drop(a);
        assert_eq!(p.lanes(), [1, 1]);
        let d = p.call().unwrap();
        assert_eq!(p.lanes(), [2, 1]);
        drop((b, c, d));
        assert_eq!(p.lanes(), [0, 0]);
    }

    #[test]
    fn over_http1_every_call_takes_the_one_lane() {
        for p in [
            pool(HttpVersion::Http1, 1),
            // `auto` on a plain endpoint is HTTP/1.1.
            pool_for("http://127.0.0.1:8000/v1", HttpVersion::Auto, 1),
            pool_for("HTTP://llm/v1", HttpVersion::Auto, 1),
        ] {
            let calls: Vec<Call> = (0..500).map(|_| p.call().unwrap()).collect();
            assert_eq!(p.lanes(), [500]);
            drop(calls);
            assert_eq!(p.lanes(), [0]);
        }
        // Told to speak HTTP/2 there, it keeps to the limit.
        let p = pool_for("http://127.0.0.1:8000/v1", HttpVersion::Http2, 1);
        let calls: Vec<Call> = (0..3).map(|_| p.call().unwrap()).collect();
        assert_eq!(p.lanes(), [1, 1, 1]);
        drop(calls);
    }

    #[test]
    fn an_auto_endpoint_that_answers_in_http1_keeps_its_calls_on_one_lane() {
        let p = pool(HttpVersion::Auto, 2);
        let held: Vec<Call> = (0..3).map(|_| p.call().unwrap()).collect();
        assert_eq!(p.lanes(), [2, 1]);
        // HTTP/2 answers change nothing.
        p.answered(reqwest::Version::HTTP_2);
        let more = p.call().unwrap();
        assert_eq!(p.lanes(), [2, 2]);
        p.answered(reqwest::Version::HTTP_11);
        let rest: Vec<Call> = (0..10).map(|_| p.call().unwrap()).collect();
        assert_eq!(p.lanes(), [12, 2]);
        drop((held, more, rest));
        // Told to speak HTTP/2, a pool keeps its limit whatever it hears.
        let p = pool(HttpVersion::Http2, 2);
        p.answered(reqwest::Version::HTTP_11);
        let held: Vec<Call> = (0..3).map(|_| p.call().unwrap()).collect();
        assert_eq!(p.lanes(), [2, 1]);
        drop(held);
    }

    #[test]
    fn a_bursts_lanes_are_dropped_once_it_is_over_but_one_spare() {
        let p = pool(HttpVersion::Http2, 2);
        let burst: Vec<Call> = (0..10).map(|_| p.call().unwrap()).collect();
        assert_eq!(p.lanes(), [2, 2, 2, 2, 2]);
        drop(burst);
        let a = p.call().unwrap();
        assert_eq!(p.lanes(), [1, 0]);
        // A lane still in use is kept, with the idle one after it.
        let held: Vec<Call> = (0..5).map(|_| p.call().unwrap()).collect();
        assert_eq!(p.lanes(), [2, 2, 2]);
        drop(a);
        drop(held);
        let b = p.call().unwrap();
        assert_eq!(p.lanes(), [1, 0]);
        drop(b);
    }

    #[test]
    fn concurrent_calls_never_overfill_a_lane() {
        let p = Arc::new(pool(HttpVersion::Auto, 3));
        let held: Vec<Vec<Call>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let p = p.clone();
                    s.spawn(move || (0..25).map(|_| p.call().unwrap()).collect::<Vec<_>>())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let lanes = p.lanes();
        assert_eq!(lanes.iter().sum::<usize>(), 200);
        assert!(lanes.iter().all(|&n| n <= 3), "{lanes:?}");
        // No lane is opened while another has room: all but possibly the last are full.
        assert_eq!(lanes.len(), 67, "{lanes:?}");
        drop(held);
        assert!(p.lanes().iter().all(|&n| n == 0));
    }

    #[test]
    fn a_version_is_named_as_configured_and_nothing_else_is_one() {
        assert_eq!("http2".parse(), Ok(HttpVersion::Http2));
        assert_eq!(" auto ".parse(), Ok(HttpVersion::Auto));
        let e = "h2".parse::<HttpVersion>().unwrap_err();
        assert!(e.contains("auto, http1 or http2"), "{e}");
    }
}
