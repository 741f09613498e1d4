//! The Redis a test's processes run on, [`Redis`]: one server or a Redis Cluster, and
//! what the processes and the test's own clients are given for either; and what a test
//! reads of a key there ([`pttl`]).

use agentq_fixtures::{RedisCluster, RedisServer};
use agentq_types::config::RedisSection;

/// The Redis a test's processes run on: one server, or a Redis Cluster.
pub enum Redis {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Redis {
    /// What `--redis-url` takes: the server, or every seed node comma-separated.
    pub fn url(&self) -> String {
        match self {
            Redis::Single(r) => r.url(),
            Redis::Cluster(c) => c.url(),
        }
    }

    /// `[redis]` as the processes are configured for it.
    pub fn settings(&self) -> RedisSection {
        RedisSection {
            cluster: matches!(self, Redis::Cluster(_)),
            ..RedisSection::default()
        }
    }

    /// Every node's URL: the server's alone, or each node of the cluster's.
    pub fn node_urls(&self) -> Vec<String> {
        match self {
            Redis::Single(r) => vec![r.url()],
            Redis::Cluster(c) => c.nodes().iter().map(RedisServer::url).collect(),
        }
    }

    /// Where the processes publish (the first seed node of a cluster), to subscribe to.
    pub fn publish_url(&self) -> String {
        match self {
            Redis::Single(r) => r.url(),
            Redis::Cluster(c) => c.nodes()[0].url(),
        }
    }

    /// The one server, for a test that kills or restarts it.
    pub fn server(&mut self) -> &mut RedisServer {
        match self {
            Redis::Single(r) => r,
            Redis::Cluster(_) => panic!("this test restarts one Redis; it runs on a cluster"),
        }
    }

    pub fn log_tail(&self) -> String {
        match self {
            Redis::Single(r) => r.log_tail(),
            Redis::Cluster(c) => c.nodes().iter().map(RedisServer::log_tail).collect(),
        }
    }
}

/// The milliseconds before `key` expires on the server at `url` (`PTTL`: -1 without an
/// expiry, -2 if the key is missing).
pub async fn pttl(url: &str, key: &str) -> anyhow::Result<i64> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    Ok(redis::cmd("PTTL").arg(key).query_async(&mut conn).await?)
}
