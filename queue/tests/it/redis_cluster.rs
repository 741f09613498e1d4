//! `RedisQueue` on a private 3-master Redis Cluster, beyond the contract suite (which runs
//! there too, one partition per queue): queues split into partitions, each read by its
//! own blocking reader; no command a node refuses (`INFO commandstats`); a master killed
//! and restarted, and slots moved, while sessions flow.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentq_queue::queue::Delivery;
use agentq_queue::redis_queue::RedisQueue;
use agentq_queue::{EventStreams, QueueHealth, Signals, WorkQueue};
use agentq_testkit::services::RedisCluster;
use agentq_types::config::RedisSection;
use agentq_types::model::EnqueueReason;

use crate::common::{Q, completion, queues, sessions};

/// A queue on `cluster` with `partitions` partitions per queue.
pub async fn connect(cluster: &RedisCluster, partitions: u32) -> RedisQueue {
    let settings = RedisSection {
        cluster: true,
        partitions: Some(partitions),
    };
    RedisQueue::connect_with(&cluster.url(), &settings)
        .await
        .expect("connect to the cluster")
}

/// Two queues of 8 partitions on the cluster: an enqueue of many lands on many partitions
/// (so on several nodes), four consumers reading both queues at once get every entry
/// exactly once, a dead letter and events of many sessions work across slots, and no node
/// refused or failed a single command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_queues_and_no_node_refuses_a_command() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster");
    let q = connect(&cluster, 8).await;
    let qs = vec!["a".to_string(), "b".to_string()];
    // As the scheduler and the workers do at start: a read of a partition without its
    // group would be refused (and healed).
    for name in qs.iter().chain([&Q.to_string()]) {
        q.ensure_queue(name).await.unwrap();
    }
    let items = |prefix: &str, n: usize| -> Vec<(String, EnqueueReason)> {
        (0..n)
            .map(|i| (format!("{prefix}{i:03}"), EnqueueReason::New))
            .collect()
    };
    let (want_a, want_b) = (items("a", 120), items("b", 40));
    let seen_all = std::sync::atomic::AtomicUsize::new(0);
    let readers = futures::future::join_all((0..4).map(|c| {
        let (q, qs, seen_all) = (&q, &qs, &seen_all);
        async move {
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            while seen_all.load(Ordering::SeqCst) < 160 && Instant::now() < deadline {
                let ds = q
                    .read(qs, &format!("c{c}"), 5, Duration::from_millis(300))
                    .await
                    .unwrap();
                for d in &ds {
                    q.ack(&d.queue, std::slice::from_ref(&d.entry_id))
                        .await
                        .unwrap();
                }
                seen_all.fetch_add(ds.len(), Ordering::SeqCst);
                got.extend(ds);
            }
            got
        }
    }));
    let producer = async {
        q.enqueue_many("a", &want_a).await.unwrap();
        q.enqueue_many("b", &want_b).await.unwrap();
    };
    let (per_consumer, ()) = tokio::join!(readers, producer);
    let all: Vec<Delivery> = per_consumer.into_iter().flatten().collect();
    let mut seen: Vec<&str> = sessions(&all);
    seen.sort();
    let mut want: Vec<&str> = want_a
        .iter()
        .chain(&want_b)
        .map(|(s, _)| s.as_str())
        .collect();
    want.sort();
    assert_eq!(seen, want, "every entry exactly once");
    let partitions: BTreeSet<&str> = all
        .iter()
        .filter_map(|d| d.entry_id.split_once('/').map(|(p, _)| p))
        .collect();
    assert!(partitions.len() >= 4, "{partitions:?}");
    for name in &qs {
        let st = q.stats(name).await.unwrap();
        assert_eq!((st.pending, st.lag), (0, Some(0)), "{name}: {st:?}");
    }
    assert_eq!(q.stats("a").await.unwrap().length, 120);

    // A dead letter: its XADD and XACK in one MULTI on the partition's slot.
    q.enqueue(Q, "doomed", EnqueueReason::Retry).await.unwrap();
    let ds = q
        .read(&queues(), "w", 10, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(sessions(&ds), ["doomed"]);
    q.dead_letter(&ds[0], "delivered 5 times").await.unwrap();
    assert_eq!(q.stats(Q).await.unwrap().pending, 0);
    let (p, _) = ds[0].entry_id.split_once('/').unwrap();
    let len = cluster
        .cli(
            cluster.nodes()[0].port(),
            &["-c", "XLEN", &format!("agentq:dead:{{{Q}:{p}}}")],
        )
        .unwrap();
    assert_eq!(len.trim(), "1");

    // Events of sessions on different slots, read in one call; completions published.
    let mut done = q.subscribe_completion("s1").await.unwrap();
    let events: Vec<_> = (0..6)
        .map(|i| agentq_queue::queue::EventRecord {
            session_id: format!("s{i}"),
            id: String::new(),
            seq: 1,
            epoch: 1,
            data: "{}".to_string(),
        })
        .collect();
    q.append_events(&events).await.unwrap();
    let from: Vec<(String, String)> = (0..6).map(|i| (format!("s{i}"), "0".to_string())).collect();
    assert_eq!(q.read_events_many(&from, 10, None).await.unwrap().len(), 6);
    q.publish_completion(&completion("s1")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut done))
        .await
        .unwrap();
    assert_eq!(got, Some(completion("s1")));

    assert_eq!(cluster.command_errors().unwrap(), Vec::<String>::new());
}

/// Clients connected to the cluster's nodes, all together, leaving out the `redis-cli`
/// that asks.
fn connected_clients(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            let info = cluster.cli(n.port(), &["INFO", "clients"]).unwrap();
            let count: u64 = info
                .lines()
                .find_map(|l| l.trim().strip_prefix("connected_clients:"))
                .unwrap_or_else(|| panic!("{info}"))
                .parse()
                .unwrap();
            count - 1
        })
        .sum()
}

/// A blocking read of a queue of 8 partitions on a 3-master cluster holds one connection
/// per partition, to the node serving it (a cluster connection per reader would hold one
/// to every node: 24), besides the command connection's one per node; reads again reuse
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_read_holds_one_connection_per_partition() {
    blocking_reads_on(3).await;
}

/// The same on a cluster of one node, which names itself with no address in `CLUSTER
/// SLOTS` (it was never introduced to another): its readers still find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_one_node_serves_blocking_reads() {
    blocking_reads_on(1).await;
}

async fn blocking_reads_on(masters: usize) {
    let cluster = RedisCluster::start(masters).expect("start a redis cluster");
    let before = connected_clients(&cluster);
    let q = connect(&cluster, 8).await;
    q.ensure_queue(Q).await.unwrap();
    for round in 0..3 {
        let got = q
            .read(&[Q.to_string()], "c", 5, Duration::from_millis(100))
            .await
            .unwrap();
        assert!(got.is_empty(), "{got:?}");
        let held = connected_clients(&cluster) - before;
        let most = u64::try_from(masters).unwrap() + 8;
        assert!(held <= most, "round {round}: {held} connections");
    }
    // The readers read: an entry enqueued now is delivered by a blocking read.
    let queues = [Q.to_string()];
    let reading = q.read(&queues, "c", 5, Duration::from_secs(30));
    let enqueue = async {
        tokio::task::yield_now().await;
        q.enqueue_many(Q, &[("late".to_string(), EnqueueReason::New)])
            .await
            .unwrap();
    };
    let (got, ()) = tokio::join!(reading, enqueue);
    let got = got.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(cluster.command_errors().unwrap(), Vec::<String>::new());
}

/// A blocking read that one partition answers ends its other partitions' reads before it
/// returns: a consumer that reads no more after it (a worker draining) holds nothing, and
/// entries enqueued afterwards are the other consumers' at once, not taken by a read left
/// running, to wait in the stopped consumer's pending list for the reclaimer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_read_leaves_no_read_running() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster");
    let q = Arc::new(connect(&cluster, 8).await);
    q.ensure_queue(Q).await.unwrap();
    let queues = [Q.to_string()];
    // A block far longer than the bounds below: only its end in Redis unblocks a read.
    let reader = q.clone();
    let reading = tokio::spawn(async move {
        let queues = [Q.to_string()];
        reader
            .read(&queues, "draining", 5, Duration::from_secs(600))
            .await
    });
    tokio::task::block_in_place(|| cluster.wait_for_blocked(Duration::from_secs(10), |b| b >= 8))
        .unwrap();
    q.enqueue(Q, "first", EnqueueReason::New).await.unwrap();
    assert_eq!(sessions(&reading.await.unwrap().unwrap()), ["first"]);
    tokio::task::block_in_place(|| {
        cluster.wait_for_blocked(Duration::from_secs(10), |blocked| blocked == 0)
    })
    .expect("reads of the other partitions still block");

    let later: Vec<(String, EnqueueReason)> = (0..40)
        .map(|i| (format!("later{i:02}"), EnqueueReason::New))
        .collect();
    q.enqueue_many(Q, &later).await.unwrap();
    let mut taken = BTreeSet::new();
    for _ in 0..8 {
        let got = q.read(&queues, "other", 40, Duration::ZERO).await.unwrap();
        taken.extend(got.into_iter().map(|d| d.session_id));
    }
    assert_eq!(taken.len(), 40, "{taken:?}");
    let held = q.read_own_pending(&queues, "draining", 50).await.unwrap();
    assert_eq!(sessions(&held), ["first"]);
}

/// A read of a busy queue of 8 partitions is one command: it looks at one partition first,
/// each in its turn, and at the others only when that one did not fill it. Sixteen reads
/// of one entry each take 16 `XREADGROUP`s (not 128) and take entries from every
/// partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_a_busy_queue_is_one_command() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster");
    let q = connect(&cluster, 8).await;
    q.ensure_queue(Q).await.unwrap();
    let items: Vec<(String, EnqueueReason)> = (0..400)
        .map(|i| (format!("busy{i:03}"), EnqueueReason::New))
        .collect();
    q.enqueue_many(Q, &items).await.unwrap();
    let before = cluster.command_calls("xreadgroup").unwrap();
    let mut partitions = BTreeSet::new();
    for _ in 0..16 {
        let got = q
            .read(&[Q.to_string()], "c", 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        let (p, _) = got[0].entry_id.split_once('/').unwrap();
        partitions.insert(p.to_string());
    }
    let reads = cluster.command_calls("xreadgroup").unwrap() - before;
    assert_eq!(reads, 16);
    assert_eq!(partitions.len(), 8, "{partitions:?}");
}

/// Events of many sessions on a cluster are one pipeline and one `XREAD` per event bucket,
/// not per session: 300 sessions' events appended in one call land on every node and are
/// read back with at most one `XREAD` per bucket; a blocking read over them all returns an
/// event appended while it waits; no node refused a command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_many_sessions_are_read_one_command_per_bucket() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster");
    let q = connect(&cluster, 1).await;
    let record = |session_id: String, seq: u64| agentq_queue::queue::EventRecord {
        session_id,
        id: String::new(),
        seq,
        epoch: 1,
        data: "{}".to_string(),
    };
    let ids: Vec<String> = (0..300).map(|i| format!("sess-{i:03}")).collect();
    let events: Vec<_> = ids.iter().map(|s| record(s.clone(), 1)).collect();
    q.append_events(&events).await.unwrap();
    for n in cluster.nodes() {
        let keys = cluster.cli(n.port(), &["DBSIZE"]).unwrap();
        assert!(
            keys.trim().parse::<u64>().unwrap() > 0,
            "node {}: {keys}",
            n.port()
        );
    }

    let from: Vec<(String, String)> = ids.iter().map(|s| (s.clone(), "0".into())).collect();
    let before = cluster.command_calls("xread").unwrap();
    let got = q.read_events_many(&from, 10, None).await.unwrap();
    let reads = cluster.command_calls("xread").unwrap() - before;
    let mut sessions: Vec<&str> = got.iter().map(|e| e.session_id.as_str()).collect();
    sessions.sort_unstable();
    assert_eq!(sessions, ids.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        (2..=u64::from(agentq_queue::redis_queue::EVENT_BUCKETS)).contains(&reads),
        "{reads} XREADs for 300 sessions"
    );

    // Past every entry read, a blocking read waits; an event appended meanwhile ends it.
    let after: Vec<(String, String)> = got
        .iter()
        .map(|e| (e.session_id.clone(), e.id.clone()))
        .collect();
    let waiting = q.read_events_many(&after, 10, Some(Duration::from_secs(30)));
    let append = async {
        tokio::task::yield_now().await;
        q.append_events(&[record(ids[123].clone(), 2)])
            .await
            .unwrap();
    };
    let (woken, ()) = tokio::join!(waiting, append);
    let woken = woken.unwrap();
    assert_eq!(woken.len(), 1, "{woken:?}");
    assert_eq!(
        (woken[0].session_id.as_str(), woken[0].seq),
        (ids[123].as_str(), 2)
    );
    assert_eq!(cluster.command_errors().unwrap(), Vec::<String>::new());
}

/// Events appended after slots moved to another node, with the queue's slot map from
/// before: the old node refuses them (`MOVED`), and they go again to the new one; every
/// session's stream holds each event once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_appended_after_slots_moved_land_once() {
    let cluster = RedisCluster::start(3).expect("start a redis cluster");
    let q = connect(&cluster, 1).await;
    let ids: Vec<String> = (0..200).map(|i| format!("moved-{i:03}")).collect();
    let append = |seq: u64| {
        let events: Vec<_> = ids
            .iter()
            .map(|s| agentq_queue::queue::EventRecord {
                session_id: s.clone(),
                id: String::new(),
                seq,
                epoch: 1,
                data: "{}".to_string(),
            })
            .collect();
        let q = &q;
        async move { q.append_events(&events).await.unwrap() }
    };
    append(1).await;
    // Most of node 0's slots (so most of its buckets) move to node 1.
    cluster.reshard(0, 1, 5000).unwrap();
    append(2).await;
    append(3).await;
    for id in &ids {
        let seqs: Vec<u64> = q
            .last_events(id, 10)
            .await
            .unwrap()
            .iter()
            .rev()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3], "{id}");
    }
}

/// What a fault in the middle of a run may cost: sessions flow (a producer enqueueing in
/// chunks, three consumers reading, acking what they got) while `fault` runs. Every
/// command that fails is retried, as the processes do (the scheduler's sweeper re-adds a
/// queued session; a worker reads again). Afterwards every session was delivered, and
/// one delivered twice only if its enqueue was retried (an `XADD` whose answer was lost);
/// nothing stays pending.
async fn survives(url: &str, fault: impl FnOnce() + Send + 'static) {
    let settings = RedisSection {
        cluster: true,
        partitions: Some(4),
    };
    let q = RedisQueue::connect_with(url, &settings).await.unwrap();
    q.ensure_queue(Q).await.unwrap();
    let total = 200;
    let retried: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let produced = AtomicBool::new(false);
    // Half the sessions are in when the fault comes: mid-run whatever the machine's pace.
    let half_in = tokio::sync::Notify::new();
    let producer = async {
        let ids: Vec<String> = (0..total).map(|i| format!("s{i:03}")).collect();
        for (n, chunk) in ids.chunks(5).enumerate() {
            if n * 5 == total / 2 {
                half_in.notify_one();
            }
            let items: Vec<(String, EnqueueReason)> = chunk
                .iter()
                .map(|s| (s.clone(), EnqueueReason::New))
                .collect();
            let deadline = Instant::now() + Duration::from_secs(30);
            while let Err(e) = q.enqueue_many(Q, &items).await {
                assert!(Instant::now() < deadline, "enqueue kept failing: {e}");
                retried.lock().unwrap().extend(chunk.iter().cloned());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        produced.store(true, Ordering::SeqCst);
    };
    let consumers = futures::future::join_all((0..3).map(|c| {
        let (q, produced) = (&q, &produced);
        async move {
            let me = format!("c{c}");
            let mut got = Vec::new();
            let mut idle = 0;
            let deadline = Instant::now() + Duration::from_secs(40);
            while idle < 3 && Instant::now() < deadline {
                let ds = match q.read(&queues(), &me, 10, Duration::from_millis(200)).await {
                    Ok(ds) => ds,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        // A read whose answer was lost left its entries pending to us.
                        q.read_own_pending(&queues(), &me, 100)
                            .await
                            .unwrap_or_default()
                    }
                };
                if ds.is_empty() && produced.load(Ordering::SeqCst) {
                    idle += 1;
                }
                let ids: Vec<String> = ds.iter().map(|d| d.entry_id.clone()).collect();
                while q.ack(Q, &ids).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                got.extend(ds.into_iter().map(|d| d.session_id));
            }
            // Anything delivered to us whose answer we never saw.
            let left = q.read_own_pending(&queues(), &me, 1000).await.unwrap();
            let ids: Vec<String> = left.iter().map(|d| d.entry_id.clone()).collect();
            q.ack(Q, &ids).await.unwrap();
            got.extend(left.into_iter().map(|d| d.session_id));
            got
        }
    }));
    let fault = async {
        half_in.notified().await;
        assert!(
            !produced.load(Ordering::SeqCst),
            "the fault must come mid-run"
        );
        tokio::task::spawn_blocking(fault).await.unwrap();
    };
    let ((), per_consumer, ()) = tokio::join!(producer, consumers, fault);
    let mut count: std::collections::BTreeMap<String, usize> = Default::default();
    for s in per_consumer.into_iter().flatten() {
        *count.entry(s).or_default() += 1;
    }
    let retried = retried.into_inner().unwrap();
    for i in 0..total {
        let s = format!("s{i:03}");
        match count.get(&s).copied().unwrap_or(0) {
            0 => panic!("{s} was never delivered"),
            1 => {}
            n => assert!(
                retried.contains(&s),
                "{s} delivered {n} times, never re-enqueued"
            ),
        }
    }
    assert_eq!(q.stats(Q).await.unwrap().pending, 0);
}

/// A master SIGKILLed mid-run and restarted: its append-only file (fsync always) brings
/// back its streams and groups, and the run goes on (no replicas: the restarted master is
/// its own failover).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_and_restarted_mid_run_loses_nothing() {
    let cluster = Arc::new(Mutex::new(
        RedisCluster::start(3).expect("start a redis cluster"),
    ));
    let url = cluster.lock().unwrap().url();
    let c = cluster.clone();
    survives(&url, move || {
        let mut cl = c.lock().unwrap();
        cl.node_mut(0).kill();
        std::thread::sleep(Duration::from_millis(300));
        cl.node_mut(0).restart().unwrap();
        cl.wait_ok().unwrap();
    })
    .await;
}

/// Slots moved from one master to another (`redis-cli --cluster reshard`) mid-run: the
/// clients follow `MOVED`/`ASK`, and nothing is lost or delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_resharded_mid_run_lose_nothing() {
    let cluster = Arc::new(Mutex::new(
        RedisCluster::start(3).expect("start a redis cluster"),
    ));
    let url = cluster.lock().unwrap().url();
    let c = cluster.clone();
    survives(&url, move || {
        c.lock().unwrap().reshard(0, 1, 600).unwrap();
    })
    .await;
}
