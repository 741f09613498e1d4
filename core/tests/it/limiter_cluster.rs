//! The fleet's rate limiter on a Redis Cluster (each provider key's keys on a hash tag of
//! their own, every script call one slot, no command a node refuses), and what it does
//! while Redis cannot be reached: by default (`on_unavailable = "closed"`) a call under a
//! configured rule waits, so a `concurrency = 1` rule never lets a second call run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentq_agent::driver::{Admit, CallAsk};
use agentq_agent::provider::HttpTimeouts;
use agentq_agent::provider::openai::{OpenAiConfig, OpenAiProvider};
use agentq_core::admission::{Limiter, MAX_TAGS, TAG_IDLE_MS, TAGS_KEY, read_state};
use agentq_core::config::{LimitSettings, LimiterSection};
use agentq_testkit::services::{RedisCluster, RedisServer};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::limiter::call_counted;

fn provider(key: &str) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiConfig {
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: Some(key.into()),
        timeouts: HttpTimeouts::default(),
        transport: Default::default(),
        extra_headers: Vec::new(),
    })
    .unwrap()
}

fn limit(toml: &str) -> LimitSettings {
    toml::from_str(toml).unwrap()
}

/// A worker's limiter on `cluster` under `rules`.
async fn on_cluster(cluster: &RedisCluster, rules: &[LimitSettings]) -> Arc<Limiter> {
    Limiter::connect_with(
        &cluster.url(),
        true,
        &LimiterSection::default(),
        rules,
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

fn ask() -> CallAsk<'static> {
    CallAsk {
        model: "gpt-4o",
        input_tokens: 10,
        max_output_tokens: 10,
        web_searches: 0,
        max_wait: Duration::ZERO,
    }
}

/// Three workers on a 3-master cluster, two provider keys under one `concurrency = 2`
/// rule: each key keeps its own count (never more than 2 in flight), on its own tag, and
/// no node refused or failed a command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_each_provider_keys_count_on_its_own_tag() {
    let cluster = RedisCluster::start(3).unwrap();
    let rules = [limit("provider = \"openai\"\nconcurrency = 2")];
    let mut limiters = Vec::new();
    for _ in 0..3 {
        limiters.push(on_cluster(&cluster, &rules).await);
    }
    let in_flight: Arc<HashMap<&str, AtomicUsize>> =
        Arc::new([("k1", AtomicUsize::new(0)), ("k2", AtomicUsize::new(0))].into());
    let most: Arc<HashMap<&str, AtomicUsize>> =
        Arc::new([("k1", AtomicUsize::new(0)), ("k2", AtomicUsize::new(0))].into());
    let mut tasks = Vec::new();
    for i in 0..40 {
        let key = if i % 2 == 0 { "k1" } else { "k2" };
        let gate = limiters[i % 3].for_session("t", &provider(key));
        let (in_flight, most) = (in_flight.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            call_counted(&*gate, &ask(), &in_flight[key], &most[key]).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for key in ["k1", "k2"] {
        let m = most[key].load(Ordering::SeqCst);
        assert!((1..=2).contains(&m), "{key}: {m} in flight at once");
    }
    let client =
        redis::cluster::ClusterClient::new(cluster.url().split(',').collect::<Vec<_>>()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let tags: Vec<String> = redis::cmd("ZRANGE")
        .arg(TAGS_KEY)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(tags.len(), 2, "one tag per provider key: {tags:?}");
    let state = read_state(&mut conn).await.unwrap();
    assert_eq!(state.rules.len(), 2, "{state:?}");
    assert!(state.rules.iter().all(|r| r.concurrency == 2));
    assert_eq!(cluster.command_errors().unwrap(), Vec::<String>::new());
}

/// The list of tags in use on a cluster is bounded: a tag no worker announced within a
/// day is neither read (the admin view, each worker's read of the holds) nor kept (the
/// next announcement trims it, and past [`MAX_TAGS`] the oldest go), and the keys of a
/// tag still listed are given that day to live, so a tag's keys go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_forgets_the_tags_no_worker_used_for_a_day() {
    let cluster = RedisCluster::start(1).unwrap();
    let client =
        redis::cluster::ClusterClient::new(cluster.url().split(',').collect::<Vec<_>>()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    // A tag last announced a day and a minute ago, with a hold still in the future.
    let dead = "{limit:dead}";
    let _: () = redis::cmd("ZADD")
        .arg(TAGS_KEY)
        .arg(now - TAG_IDLE_MS - 60_000)
        .arg(dead)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(format!("agentq:{dead}:holds"))
        .arg("openai|x|k|gpt-4o")
        .arg(now + 3_600_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let state = read_state(&mut conn).await.unwrap();
    assert!(state.holds.is_empty(), "a dead tag was read: {state:?}");
    // As many recent tags as the list keeps, all older than the next announcement.
    let mut fill = redis::cmd("ZADD");
    fill.arg(TAGS_KEY);
    for i in 0..MAX_TAGS {
        fill.arg(now - 1_000 - i64::try_from(i).unwrap())
            .arg(format!("{{limit:fill{i}}}"));
    }
    let _: () = fill.query_async(&mut conn).await.unwrap();

    let rules = [limit("provider = \"openai\"\nconcurrency = 2")];
    let limiter = on_cluster(&cluster, &rules).await;
    let gate = limiter.for_session("t", &provider("k1"));
    assert!(matches!(gate.reserve(&ask()).await, Admit::Go(_)));

    let listed: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(TAGS_KEY)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(listed.len(), MAX_TAGS);
    let names: Vec<&str> = listed.iter().map(|(t, _)| t.as_str()).collect();
    assert!(!names.contains(&dead));
    // The oldest of the recent ones made room for the new one.
    assert!(!names.contains(&format!("{{limit:fill{}}}", MAX_TAGS - 1).as_str()));
    assert!(names.contains(&"{limit:fill0}"));
    let (newest, at) = listed.last().unwrap();
    assert!(*at >= now, "{newest} announced at {at}, before {now}");
    // Its keys are kept for a day by a worker's read of the holds: waited for as the
    // node announces the expiry set on the tag's index (a worker started now reads the
    // tags listed, this one among them, within its first refresh).
    let index = format!("agentq:{newest}:keys");
    let node = redis::Client::open(cluster.nodes()[0].url()).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Kg")
        .query_async(&mut node.get_multiplexed_async_connection().await.unwrap())
        .await
        .unwrap();
    let mut events = node.get_async_pubsub().await.unwrap();
    events
        .subscribe(format!("__keyspace@0__:{index}"))
        .await
        .unwrap();
    let _reader = on_cluster(&cluster, &rules).await;
    let mut events = events.on_message();
    let kept = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(m) = events.next().await {
            if m.get_payload::<String>().is_ok_and(|e| e == "expire") {
                return;
            }
        }
    })
    .await;
    assert!(kept.is_ok(), "no worker gave {index} a time to live");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&index)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= TAG_IDLE_MS, "{index}: ttl {ttl}");
    assert_eq!(cluster.command_errors().unwrap(), Vec::<String>::new());
}

/// The default: Redis gone, a call under a `concurrency = 1` rule waits (reason
/// `limiter`) while the first still holds the slot, however often it asks; a call on a
/// key no rule names still goes.
#[tokio::test]
async fn redis_gone_admits_no_second_call_under_a_rule_by_default() {
    let mut server = RedisServer::start().unwrap();
    let rules = [limit(
        "provider = \"openai\"\nmodel = \"gpt-4o*\"\nconcurrency = 1",
    )];
    let limiter = Limiter::connect(&server.url(), &rules, CancellationToken::new())
        .await
        .unwrap();
    let gate = limiter.for_session("t", &provider("k"));
    let first = gate.reserve(&ask()).await;
    assert!(
        matches!(&first, Admit::Go(p) if !p.id.is_empty()),
        "{first:?}"
    );
    let errors = agentq_core::metrics::global().limiter_errors.get();
    server.kill();
    for _ in 0..3 {
        match gate.reserve(&ask()).await {
            Admit::Wait { after, reason } => {
                assert_eq!(reason, "limiter");
                assert!(after >= Duration::from_secs(1), "{after:?}");
            }
            other => panic!("a second call went while Redis was down: {other:?}"),
        }
    }
    assert!(agentq_core::metrics::global().limiter_errors.get() >= errors + 3);
    // A model no rule names: nothing configured to keep, so it goes.
    let unruled = CallAsk {
        model: "other-model",
        ..ask()
    };
    assert!(matches!(gate.reserve(&unruled).await, Admit::Go(_)));
}
