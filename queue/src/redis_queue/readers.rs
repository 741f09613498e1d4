//! The reader connections of a [`super::RedisQueue`]: what blocking reads run on, checked
//! out one read at a time and returned only after a complete reply (a connection is never
//! reused with a reply in flight; see the parent module).
//!
//! On one server a reader is a connection to it. On a cluster a reader is a connection to
//! the one node that serves the read's slot, found in the slot map (`CLUSTER SLOTS`, read
//! through the command connection and read again after a redirect or a lost node): a
//! blocking read holds one connection, where a cluster connection would hold one to every
//! node. A `MOVED` answer (the slot moved) reads the map again and tries the new owner; an
//! `ASK` answer (the slot is moving and the key already left) asks the node named, as a
//! cluster client does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, RedisError, RedisResult,
    Value,
};

use redis::cluster_async::ClusterConnection;

/// How long a blocking read may take beyond its `BLOCK` before the reader gives up on the
/// connection (a half-open TCP connection would otherwise hang it forever).
pub const READ_GRACE: Duration = Duration::from_secs(5);
/// Connect timeout of every connection.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Response timeout of the shared command connections. Longer than redis-rs's 500 ms so a
/// busy server or a large pipeline does not fail spuriously.
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle reader connections kept for reuse.
const MAX_IDLE_READERS: usize = 32;
/// Redirects one blocking read follows before it fails (a slot moves once per reshard).
const MAX_REDIRECTS: usize = 3;
/// The slots of a cluster (`CLUSTER SLOTS`, `CLUSTER KEYSLOT`).
const SLOTS: u16 = 16_384;

/// A reader connection and the node it is connected to (empty on one server).
pub(super) struct Reader {
    node: String,
    conn: MultiplexedConnection,
    /// The connection's `CLIENT ID` on a cluster's node, where a read that is no longer
    /// wanted is ended with `CLIENT UNBLOCK` (see `read.rs`); `None` on one server, whose
    /// reads end with their connection, and where a node would not say.
    id: Option<i64>,
}

impl Reader {
    /// The node and the `CLIENT ID` that end a read on this reader ([`Readers::unblock`]).
    pub(super) fn blocked_as(&self) -> Option<(String, i64)> {
        self.id.map(|id| (self.node.clone(), id))
    }
}

/// Where readers connect.
enum Nodes {
    Single(Client),
    Cluster {
        /// The first seed's settings (password, TLS), given each node's address.
        seed: ConnectionInfo,
        /// The command connection, for `CLUSTER SLOTS`.
        commands: ClusterConnection,
        /// Slot ranges and the master serving each; empty until first read, and again
        /// after a redirect or a lost node.
        slots: Mutex<Vec<(u16, u16, String)>>,
    },
}

/// The reader connections: cheap to share, and what each blocking read holds.
pub(super) struct Readers {
    nodes: Nodes,
    idle: Mutex<Vec<Reader>>,
    /// A shared connection per cluster node for pipelines over many slots of one node
    /// (the cluster client routes a pipeline by one slot). Each node's is connected in its
    /// own cell, outside the map's lock: a node slow to answer (up to [`CONNECT_TIMEOUT`])
    /// delays only the pipelines bound for it.
    shared: Mutex<HashMap<String, Arc<SharedConn>>>,
}

/// One node's shared connection, connected by the first pipeline that needs it.
type SharedConn = tokio::sync::OnceCell<MultiplexedConnection>;

impl Readers {
    pub(super) fn single(client: Client) -> Arc<Readers> {
        Arc::new(Readers {
            nodes: Nodes::Single(client),
            idle: Mutex::new(Vec::new()),
            shared: Default::default(),
        })
    }

    pub(super) fn cluster(seed: ConnectionInfo, commands: ClusterConnection) -> Arc<Readers> {
        Arc::new(Readers {
            nodes: Nodes::Cluster {
                seed,
                commands,
                slots: Mutex::new(Vec::new()),
            },
            idle: Mutex::new(Vec::new()),
            shared: Default::default(),
        })
    }

    /// Run a blocking command over `key` (the one key, or the slot's keys, it reads) on a
    /// reader within `block` + [`READ_GRACE`]; see [`Readers::blocking_on`].
    pub(super) async fn blocking(
        &self,
        key: &str,
        cmd: &Cmd,
        block: Duration,
    ) -> RedisResult<Value> {
        let first = self.checkout_for(key).await?;
        self.blocking_on(first, key, cmd, block).await
    }

    /// A reader on the node serving `key` (`true`: it was idle and may have gone stale).
    /// A read that must not begin late (its caller's deadline runs from now) checks its
    /// reader out first and then runs [`Readers::blocking_on`].
    pub(super) async fn checkout_for(&self, key: &str) -> RedisResult<(Reader, bool)> {
        let node = self.node_of(key).await?;
        self.checkout(&node).await
    }

    /// Run a blocking command over `key` on `first`, a reader checked out for it. A
    /// connection that was idle and turns out dead (Redis restarted meanwhile) is replaced
    /// once; redirects are followed.
    pub(super) async fn blocking_on(
        &self,
        first: (Reader, bool),
        key: &str,
        cmd: &Cmd,
        block: Duration,
    ) -> RedisResult<Value> {
        let mut first = Some(first);
        let mut tried_fresh = false;
        let mut asking: Option<String> = None;
        let mut redirects = 0;
        loop {
            let (reader, pooled) = match (first.take(), &asking) {
                (Some(first), _) => first,
                (None, Some(node)) => self.checkout(node).await?,
                (None, None) => self.checkout_for(key).await?,
            };
            let node = reader.node.clone();
            tried_fresh |= !pooled;
            let result = self.run_on(reader, cmd, asking.is_some(), block).await;
            match result {
                Err(e) if redirects < MAX_REDIRECTS && e.redirect_node().is_some() => {
                    redirects += 1;
                    asking = match e.kind() {
                        redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => {
                            e.redirect_node().map(|(to, _)| to.to_string())
                        }
                        _ => {
                            self.forget_slots();
                            None
                        }
                    };
                }
                Err(e) if pooled && !tried_fresh && e.is_connection_dropped() => {
                    tracing::debug!(error = %e, "idle redis reader connection was dead; reconnecting");
                    // The other idle readers of that node share its fate.
                    self.idle
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|r| r.node != node);
                    self.forget_slots();
                    tried_fresh = true;
                }
                Err(e) => {
                    if broken(&e) {
                        // A node gone may have been failed over: read the map again.
                        self.forget_slots();
                    }
                    return Err(e);
                }
                ok => return ok,
            }
        }
    }

    /// `cmd` on `reader` (after `ASKING` when `asking`) within `block` + [`READ_GRACE`];
    /// the connection goes back to the idle list only after a complete reply (data or a
    /// server error such as `NOGROUP` or `MOVED`).
    async fn run_on(
        &self,
        mut reader: Reader,
        cmd: &Cmd,
        asking: bool,
        block: Duration,
    ) -> RedisResult<Value> {
        let query = async {
            if asking {
                let mut pipe = redis::pipe();
                pipe.cmd("ASKING").ignore().add_command(cmd.clone());
                let mut replies: Vec<Value> = pipe.query_async(&mut reader.conn).await?;
                Ok(replies.pop().unwrap_or(Value::Nil))
            } else {
                cmd.query_async(&mut reader.conn).await
            }
        };
        let result = within(
            block + READ_GRACE,
            "blocking read got no reply within its block + grace",
            query,
        )
        .await;
        // A server error leaves the connection in a clean state.
        if !result.as_ref().is_err_and(broken) {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < MAX_IDLE_READERS {
                idle.push(reader);
            }
        }
        result
    }

    /// The `count` commands of `pipe` on `node` (`host:port`), however many slots of it
    /// they span, on the node's shared connection: a result per command, a server error
    /// (`MOVED`) for one whose slot the node no longer serves. A connection that fails is
    /// dropped (the next call connects again), and so is the slot map.
    pub(super) async fn pipeline_on(
        &self,
        node: &str,
        pipe: &redis::Pipeline,
        count: usize,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        let cell = Arc::clone(
            self.shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(node.to_string())
                .or_default(),
        );
        // A failed connect leaves the cell empty: the next pipeline tries again.
        let connected = cell
            .get_or_try_init(|| self.connect(node, Some(COMMAND_TIMEOUT)))
            .await;
        let replies = match connected {
            Ok(conn) => {
                redis::aio::ConnectionLike::req_packed_commands(&mut conn.clone(), pipe, 0, count)
                    .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = &replies
            && broken(e)
        {
            // Only this connection: another pipeline may already have put a new one.
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if shared.get(node).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                shared.remove(node);
            }
            drop(shared);
            self.forget_slots();
        }
        let mut replies = replies?.into_iter();
        Ok((0..count)
            .map(|_| match replies.next() {
                Some(Value::ServerError(e)) => Err(e.into()),
                Some(v) => Ok(v),
                None => Err(RedisError::from((
                    redis::ErrorKind::Client,
                    "a node answered fewer replies than the pipeline's commands",
                ))),
            })
            .collect())
    }

    /// End the blocking reads of the connections `ids` on `node` as their blocks' ends
    /// would (`CLIENT UNBLOCK`), on the node's shared connection: a read the server has
    /// not served yet answers with nothing, one it has served answers with its entries.
    /// A read that is no longer blocked (it answered meanwhile) is left alone.
    pub(super) async fn unblock(&self, node: &str, ids: &[i64]) -> RedisResult<()> {
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("CLIENT").arg("UNBLOCK").arg(*id);
        }
        for reply in self.pipeline_on(node, &pipe, ids.len()).await? {
            reply?;
        }
        Ok(())
    }

    /// A new connection to `node` (empty on one server).
    async fn connect(
        &self,
        node: &str,
        response_timeout: Option<Duration>,
    ) -> RedisResult<MultiplexedConnection> {
        let client = match &self.nodes {
            Nodes::Single(client) => client.clone(),
            Nodes::Cluster { seed, .. } => Client::open(node_info(seed, node)?)?,
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(response_timeout);
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// An idle reader on `node` (`true`: it may have gone stale), else a new one.
    async fn checkout(&self, node: &str) -> RedisResult<(Reader, bool)> {
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.iter()
                .rposition(|r| r.node == node)
                .map(|i| idle.swap_remove(i))
        };
        if let Some(reader) = idle {
            return Ok((reader, true));
        }
        // Blocking reads outlast any fixed response timeout; `run_on` puts its own
        // deadline around each one.
        let mut conn = self.connect(node, None).await?;
        let id = match self.nodes {
            Nodes::Single(_) => None,
            Nodes::Cluster { .. } => client_id(&mut conn).await?,
        };
        Ok((
            Reader {
                node: node.to_string(),
                conn,
                id,
            },
            false,
        ))
    }

    /// The node serving `key`'s slot (empty on one server).
    pub(super) async fn node_of(&self, key: &str) -> RedisResult<String> {
        let Nodes::Cluster {
            seed,
            commands,
            slots,
        } = &self.nodes
        else {
            return Ok(String::new());
        };
        let slot = key_slot(key.as_bytes());
        let find = |map: &[(u16, u16, String)]| {
            map.iter()
                .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
                .map(|(_, _, node)| node.clone())
        };
        if let Some(node) = find(&slots.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(node);
        }
        let reply = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut commands.clone())
            .await?;
        let map = slot_map(reply, &seed_host(seed));
        let node = find(&map);
        *slots.lock().unwrap_or_else(|e| e.into_inner()) = map;
        node.ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::Client,
                "no node of the cluster serves the slot",
                format!("slot {slot} of key {key}"),
            ))
        })
    }

    /// Read the slot map again before the next use (a slot moved, or a node went away).
    pub(super) fn forget_slots(&self) {
        if let Nodes::Cluster { slots, .. } = &self.nodes {
            slots.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

/// The `CLIENT ID` of a new reader connection; `None` from a node that refuses the
/// command (its reads then end at their blocks).
async fn client_id(conn: &mut MultiplexedConnection) -> RedisResult<Option<i64>> {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("ID");
    let asked = within(
        COMMAND_TIMEOUT,
        "a new reader connection did not answer CLIENT ID",
        cmd.query_async::<i64>(conn),
    );
    match asked.await {
        Ok(id) => Ok(Some(id)),
        Err(e) if !broken(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `query`'s answer, or once `limit` passed, a timeout (an I/O error: the connection is
/// then out of step) saying `what` did not answer.
pub(super) async fn within<T>(
    limit: Duration,
    what: &'static str,
    query: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    tokio::time::timeout(limit, query)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                what,
            )))
        })
}

/// Whether `e` leaves its connection untrustworthy (gone, timed out, out of step), as a
/// server's error answer does not.
fn broken(e: &RedisError) -> bool {
    e.is_io_error() || e.is_unrecoverable_error() || e.is_timeout()
}

/// The seed's settings at `node` (`host:port`, as `CLUSTER SLOTS` and redirects name it).
fn node_info(seed: &ConnectionInfo, node: &str) -> RedisResult<ConnectionInfo> {
    let bad = || {
        RedisError::from((
            redis::ErrorKind::Client,
            "a cluster node's address is not host:port",
            node.to_string(),
        ))
    };
    let (host, port) = node.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = host.to_string();
    let addr = match seed.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    Ok(seed.clone().set_addr(addr))
}

/// The host of the seed node, for a node that does not know its own address.
fn seed_host(seed: &ConnectionInfo) -> String {
    match seed.addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
        _ => "127.0.0.1".to_string(),
    }
}

/// `CLUSTER SLOTS`'s answer as slot ranges and their masters' `host:port`; entries it
/// cannot read are left out (the read then finds no node and fails, and the map is read
/// again next time). A node that does not know its own address (one never introduced to
/// another: a cluster of one) is named with an empty host or `?`: `unknown_host` stands
/// for it, the seed's, which is the only node such a cluster has.
fn slot_map(reply: Value, unknown_host: &str) -> Vec<(u16, u16, String)> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let int = |v: &Value| match v {
        Value::Int(i) => u16::try_from(*i).ok(),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(parts) = range else {
                return None;
            };
            let (lo, hi) = (int(parts.first()?)?, int(parts.get(1)?)?);
            let Value::Array(master) = parts.get(2)? else {
                return None;
            };
            let (host, port) = (text(master.first()?)?, int(master.get(1)?)?);
            let host = match host.as_str() {
                "" | "?" => unknown_host,
                known => known,
            };
            Some((lo, hi, format!("{host}:{port}")))
        })
        .collect()
}

/// The cluster slot of a key: CRC16 (XMODEM) of its hash tag (the first non-empty `{…}`),
/// or of the whole key, modulo the slots.
fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// CRC16 with the XMODEM parameters (polynomial 0x1021, initial 0), as Redis Cluster
/// hashes keys.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for b in bytes {
        crc ^= u16::from(*b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots Redis's own documentation and `CLUSTER KEYSLOT` give.
    #[test]
    fn key_slots_are_the_clusters() {
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn slot_map_reads_cluster_slots() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("10.0.0.2", 7001),
                node("10.0.0.3", 7002),
            ]),
            Value::Int(3),
        ]);
        assert_eq!(
            slot_map(reply, "127.0.0.1"),
            vec![
                (0, 5460, "127.0.0.1:7000".to_string()),
                (5461, 16383, "10.0.0.2:7001".to_string())
            ]
        );
        assert!(slot_map(Value::Nil, "h").is_empty());
    }

    /// A node that accepts connections and never answers keeps its pipelines waiting for
    /// the connect timeout, and only those: a pipeline to another node goes on at once
    /// (the map of shared connections was locked across a connect).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::expect_used, clippy::unwrap_used)]
    async fn a_silent_node_delays_only_its_own_pipelines() {
        use redis::IntoConnectionInfo;
        let cluster = agentq_testkit::services::RedisCluster::start(1).expect("a cluster");
        let seed = cluster.url().into_connection_info().unwrap();
        let commands = redis::cluster::ClusterClient::new(vec![seed.clone()])
            .unwrap()
            .get_async_connection()
            .await
            .unwrap();
        let readers = Readers::cluster(seed, commands);
        let live = readers.node_of("k").await.unwrap();

        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_node = silent.local_addr().unwrap().to_string();
        let (accepted_tx, accepted) = tokio::sync::oneshot::channel();
        let holder = tokio::spawn(async move {
            let (stream, _) = silent.accept().await.unwrap();
            let _ = accepted_tx.send(());
            // Held open, never answered, until the test ends.
            std::future::pending::<()>().await;
            drop(stream);
        });

        let mut ping = redis::pipe();
        ping.cmd("PING");
        let stuck = {
            let (readers, node, ping) = (Arc::clone(&readers), silent_node.clone(), ping.clone());
            tokio::spawn(async move { readers.pipeline_on(&node, &ping, 1).await })
        };
        accepted
            .await
            .expect("the pipeline connects to the silent node");
        let replies = readers.pipeline_on(&live, &ping, 1).await.unwrap();
        assert!(matches!(&replies[..], [Ok(Value::SimpleString(s))] if s == "PONG"));
        assert!(
            !stuck.is_finished(),
            "the silent node's pipeline ended before the live node's"
        );
        let stuck = stuck.await.unwrap();
        assert!(stuck.is_err_and(|e| broken(&e)));
        // The failed connect left nothing behind: the next pipeline connects again.
        assert!(readers.shared.lock().unwrap().get(&silent_node).is_none());
        holder.abort();
    }
}
