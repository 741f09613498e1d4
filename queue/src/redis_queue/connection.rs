//! The connections of a [`RedisQueue`]: the shared command connection and the reader
//! connections that blocking reads check out one read at a time (see the parent module's
//! docs for why a reader is never reused with a reply in flight).

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::io::tcp::TcpSettings;
use redis::io::tcp::socket2::TcpKeepalive;
use redis::{
    AsyncConnectionConfig, Client, Cmd, IntoConnectionInfo, RedisError, RedisResult, Value,
};

use agentq_error::Result;

/// How long a blocking read may take beyond its `BLOCK` before the reader gives up on the
/// connection (a half-open TCP connection would otherwise hang it forever).
pub const READ_GRACE: Duration = Duration::from_secs(5);

/// Connect timeout of every connection.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Response timeout of the shared command connection. Longer than redis-rs's 500 ms so a
/// busy server or a large pipeline does not fail spuriously.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Reconnect attempts of the command connection before a command fails: kept small so
/// commands fail fast (retryably) while Redis is down; the next command tries again.
const COMMAND_RECONNECT_RETRIES: usize = 2;
/// Idle reader connections kept for reuse.
const MAX_IDLE_READERS: usize = 8;

/// The [`crate::queue::Queue`] on Redis Streams. Cheap to share behind an `Arc`; see the docs of
/// [`crate::redis_queue`].
pub struct RedisQueue {
    pub(super) client: Client,
    conn: ConnectionManager,
    /// Idle reader connections for blocking reads (no response timeout).
    readers: Mutex<Vec<MultiplexedConnection>>,
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueue")
            .field("server", &self.client.get_connection_info().addr())
            .finish_non_exhaustive()
    }
}

impl RedisQueue {
    /// Open the shared command connection to `url` (`redis://[:password@]host:port[/db]`).
    /// Fails when Redis cannot be reached now; once connected, the queue survives Redis
    /// restarts without being re-created.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = Client::open(url.into_connection_info()?.set_tcp_settings(tcp_settings()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(COMMAND_RECONNECT_RETRIES)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| unreachable(&client, e))?;
        Ok(RedisQueue {
            client,
            conn,
            readers: Mutex::new(Vec::new()),
        })
    }

    pub(super) fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    pub(super) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        cmd.query_async(&mut self.conn()).await
    }

    /// A reader connection: an idle one if any (`true`: it may have gone stale), else a
    /// new one.
    async fn checkout_reader(&self) -> RedisResult<(MultiplexedConnection, bool)> {
        let idle = self.readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(conn) = idle {
            return Ok((conn, true));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            // Blocking reads outlast any fixed response timeout; `blocking_query` puts its
            // own deadline around each one.
            .set_response_timeout(None);
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok((conn, false))
    }

    fn return_reader(&self, conn: MultiplexedConnection) {
        let mut idle = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }

    /// Run a blocking command on a reader connection. A connection that was idle in the
    /// list and turns out dead (Redis restarted meanwhile) is replaced once.
    pub(super) async fn blocking_query(&self, cmd: &Cmd, block: Duration) -> RedisResult<Value> {
        let mut tried_fresh = false;
        loop {
            let (mut conn, pooled) = self.checkout_reader().await?;
            tried_fresh |= !pooled;
            let result =
                match tokio::time::timeout(block + READ_GRACE, cmd.query_async(&mut conn)).await {
                    Ok(r) => r,
                    Err(_) => Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "blocking read got no reply within its block + grace",
                    ))),
                };
            match result {
                Ok(v) => {
                    self.return_reader(conn);
                    return Ok(v);
                }
                // A server error (e.g. NOGROUP) leaves the connection in a clean state.
                Err(e) if !e.is_io_error() && !e.is_unrecoverable_error() => {
                    self.return_reader(conn);
                    return Err(e);
                }
                Err(e) if pooled && !tried_fresh && e.is_connection_dropped() => {
                    tracing::debug!(error = %e, "idle redis reader connection was dead; reconnecting");
                    drop(conn);
                    // Drain the other idle readers too: they share the dead server.
                    self.readers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clear();
                    tried_fresh = true;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// TCP settings of every connection: no Nagle delay on small request/response
/// exchanges, and keepalive probes plus (on Linux) a user timeout so that a half-open
/// connection (peer gone without a FIN, e.g. a partition) is closed by the kernel and then
/// replaced, instead of timing out command after command or blocking a reader forever.
fn tcp_settings() -> TcpSettings {
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    let settings = TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive);
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(Duration::from_secs(60));
    settings
}

/// A failed first connection as the operator should read it: a server that cannot be
/// reached is said once, with its address and cause (not the client's retries); any other
/// refusal (a wrong password) is Redis's own error.
fn unreachable(client: &Client, e: RedisError) -> agentq_error::Error {
    let cause = if e.is_connection_refusal() {
        "connection refused".to_string()
    } else if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_io_error() {
        e.to_string()
    } else {
        return e.into();
    };
    agentq_error::Error::Unreachable {
        service: "Redis",
        address: client.get_connection_info().addr().to_string(),
        cause,
    }
}
