//! The connections of a [`RedisQueue`]: the shared command connection, to one server or to
//! a Redis Cluster ([`Conn`] is either, so every command is written once), and the reader
//! connections that blocking reads check out one read at a time (`readers.rs`).

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::io::tcp::socket2::TcpKeepalive;
use redis::{
    Client, Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult, Value,
};

use agentq_error::Result;
use agentq_types::config::RedisSection;

use super::layout::Layout;
use super::readers::{COMMAND_TIMEOUT, CONNECT_TIMEOUT, Readers};

/// Reconnect attempts of the command connection before a command fails: kept small so
/// commands fail fast (retryably) while Redis is down; the next command tries again.
const COMMAND_RECONNECT_RETRIES: usize = 2;

/// A connection to one server or to a cluster. A cluster connection routes each command
/// (and each pipeline, whose commands must then share a slot) to the node serving its
/// keys, follows `MOVED`/`ASK` while slots migrate and reconnects to nodes that restart.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Where the queue's Redis is: one server, or a cluster found from its seed nodes.
#[derive(Clone)]
pub(super) enum Target {
    Single(Client),
    Cluster {
        /// One client per seed node, for subscriptions (a `PUBLISH` reaches every node).
        seeds: Vec<Client>,
        addrs: Vec<String>,
    },
}

/// The [`crate::queue::Queue`] on Redis Streams. Cheap to share behind an `Arc`; see the docs of
/// [`crate::redis_queue`].
pub struct RedisQueue {
    pub(super) target: Target,
    conn: Conn,
    /// Connections for blocking reads (no response timeout).
    pub(super) readers: Arc<Readers>,
    pub(super) layout: Layout,
    /// Which partition a cluster's read of new entries looks at first, taken in turn
    /// (see `read.rs`).
    pub(super) turn: AtomicUsize,
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let server = match &self.target {
            Target::Single(c) => c.get_connection_info().addr().to_string(),
            Target::Cluster { addrs, .. } => addrs.join(","),
        };
        f.debug_struct("RedisQueue")
            .field("server", &server)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl RedisQueue {
    /// Open the shared command connection to `url` (`redis://[:password@]host:port[/db]`),
    /// one server, each queue one stream (`[redis]` at its defaults). Fails when Redis
    /// cannot be reached now; once connected, the queue survives Redis restarts without
    /// being re-created.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &RedisSection::default()).await
    }

    /// As [`RedisQueue::connect`], as `[redis]` says: on a cluster, `url` is one or more
    /// seed nodes, comma-separated; each queue is split into `partitions` streams.
    pub async fn connect_with(url: &str, settings: &RedisSection) -> Result<Self> {
        let layout = Layout::new(settings.cluster, settings.partitions());
        let (target, conn, readers) = if settings.cluster {
            connect_cluster(url).await?
        } else {
            let client =
                Client::open(url.into_connection_info()?.set_tcp_settings(tcp_settings()))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(COMMAND_TIMEOUT))
                .set_number_of_retries(COMMAND_RECONNECT_RETRIES)
                .set_max_delay(Duration::from_millis(500));
            let conn = ConnectionManager::new_with_config(client.clone(), config)
                .await
                .map_err(|e| unreachable(&client.get_connection_info().addr().to_string(), e))?;
            let readers = Readers::single(client.clone());
            (Target::Single(client), Conn::Single(conn), readers)
        };
        Ok(RedisQueue {
            target,
            conn,
            readers,
            layout,
            turn: AtomicUsize::new(0),
        })
    }

    /// The keys of `queue`'s streams, one per partition, as this queue names them: for a
    /// reader of the keys themselves (an operator's `redis-cli`, a test) on either layout.
    pub fn stream_keys(&self, queue: &str) -> Vec<String> {
        self.layout
            .all()
            .map(|p| self.layout.stream(queue, p))
            .collect()
    }

    /// The keys of `queue`'s dead letters, as [`RedisQueue::stream_keys`] (one server with
    /// one partition keeps the shared `agentq:dead`).
    pub fn dead_letter_keys(&self, queue: &str) -> Vec<String> {
        self.layout
            .all()
            .map(|p| self.layout.dead(queue, p))
            .collect()
    }

    pub(super) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster { .. })
    }

    pub(super) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        cmd.query_async(&mut self.conn()).await
    }

    /// Run a blocking command over `key` on a reader connection (see `readers.rs`).
    pub(super) async fn blocking_query(
        &self,
        key: &str,
        cmd: &Cmd,
        block: Duration,
    ) -> RedisResult<Value> {
        self.readers.blocking(key, cmd, block).await
    }
}

/// The cluster's command connection, its readers, and the clients its subscriptions use.
async fn connect_cluster(urls: &str) -> Result<(Target, Conn, Arc<Readers>)> {
    let mut infos = Vec::new();
    for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        infos.push(url.into_connection_info()?);
    }
    let addrs: Vec<String> = infos.iter().map(|i| i.addr().to_string()).collect();
    let builder = |infos: Vec<redis::ConnectionInfo>| {
        ClusterClientBuilder::new(infos)
            .connection_timeout(CONNECT_TIMEOUT)
            .tcp_settings(tcp_settings())
    };
    let commands = builder(infos.clone())
        .response_timeout(COMMAND_TIMEOUT)
        .retries(u32::try_from(COMMAND_RECONNECT_RETRIES).unwrap_or(2) + 1)
        .build()?;
    let Some(first) = infos.first().cloned() else {
        return Err(agentq_error::Error::invalid(
            "redis_url",
            "a cluster needs at least one seed node",
        ));
    };
    let seeds = infos
        .into_iter()
        .map(Client::open)
        .collect::<RedisResult<Vec<_>>>()?;
    let cluster = commands
        .get_async_connection()
        .await
        .map_err(|e| unreachable(&addrs.join(","), e))?;
    let readers = Readers::cluster(first.set_tcp_settings(tcp_settings()), cluster.clone());
    Ok((
        Target::Cluster { seeds, addrs },
        Conn::Cluster(cluster),
        readers,
    ))
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
fn unreachable(address: &str, e: RedisError) -> agentq_error::Error {
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
        address: address.to_string(),
        cause,
    }
}
