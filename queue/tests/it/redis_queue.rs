//! `RedisQueue` against a real, private `redis-server` (one per test, no persistence).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use agentq_queue::queue::{
    COMPLETIONS_STREAM, DEAD_STREAM, DONE_CHANNEL, GROUP, QueueStats, done_channel, queue_stream,
};
use agentq_queue::redis_queue::RedisQueue;
use agentq_queue::{QueueHealth, Signals, WorkQueue};
use agentq_testkit::services::RedisServer;
use agentq_types::model::{Completion, EnqueueReason};
use agentq_types::protocol::WorkerSignal;

use crate::common;
use common::{HANG, Q, completion, queues, sessions};
use futures::StreamExt;
use redis::AsyncCommands;

async fn setup() -> (RedisServer, RedisQueue) {
    let server = RedisServer::start().expect("start redis-server");
    let queue = RedisQueue::connect(&server.url()).await.expect("connect");
    (server, queue)
}

/// A plain connection for poking at Redis behind the queue's back.
async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// `XRANGE key - +` as `(id, fields)`.
async fn xrange(server: &RedisServer, key: &str) -> Vec<(String, HashMap<String, String>)> {
    let mut c = raw(server).await;
    let reply: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    reply
        .into_iter()
        .map(|(id, kv)| (id, kv.into_iter().collect()))
        .collect()
}

/// Retry `f` until it succeeds, for at most `bound`.
async fn eventually<T, F, Fut>(bound: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = agentq_error::Result<T>>,
{
    let deadline = Instant::now() + bound;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(e.is_retryable(), "non-retryable error: {e}");
                assert!(
                    Instant::now() < deadline,
                    "still failing after {bound:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_read_ack() {
    let (_server, q) = setup().await;
    q.ensure_queue(Q).await.unwrap();
    q.ensure_queue(Q).await.unwrap(); // idempotent
    q.enqueue(Q, "s1", EnqueueReason::New).await.unwrap();
    q.enqueue_many(
        Q,
        &[
            ("s2".to_string(), EnqueueReason::Resume),
            ("s3".to_string(), EnqueueReason::Retry),
        ],
    )
    .await
    .unwrap();
    q.enqueue_many(Q, &[]).await.unwrap();

    let ds = q
        .read(&queues(), "w1", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(sessions(&ds), ["s1", "s2", "s3"]);
    assert_eq!(
        ds.iter().map(|d| d.reason).collect::<Vec<_>>(),
        [
            EnqueueReason::New,
            EnqueueReason::Resume,
            EnqueueReason::Retry
        ]
    );
    assert!(ds.iter().all(|d| d.queue == Q && !d.entry_id.is_empty()));

    // Nothing new; all three pending for w1.
    let again = q
        .read(&queues(), "w1", 10, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(again.is_empty());
    assert_eq!(q.stats(Q).await.unwrap().pending, 3);

    let ids: Vec<String> = ds.iter().map(|d| d.entry_id.clone()).collect();
    q.ack(Q, &ids).await.unwrap();
    q.ack(Q, &[]).await.unwrap();
    assert_eq!(q.stats(Q).await.unwrap().pending, 0);
    assert!(
        q.read_own_pending(&queues(), "w1", 10)
            .await
            .unwrap()
            .is_empty()
    );
    q.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_several_queues_and_count() {
    let (_server, q) = setup().await;
    for i in 0..5 {
        q.enqueue("a", &format!("a{i}"), EnqueueReason::New)
            .await
            .unwrap();
    }
    q.enqueue("b", "b0", EnqueueReason::New).await.unwrap();
    let qs = vec!["a".to_string(), "b".to_string()];
    let ds = q
        .read(&qs, "w", 2, Duration::from_millis(100))
        .await
        .unwrap();
    // COUNT applies per stream.
    let mut got: Vec<(&str, &str)> = ds
        .iter()
        .map(|d| (d.queue.as_str(), d.session_id.as_str()))
        .collect();
    got.sort();
    assert_eq!(got, [("a", "a0"), ("a", "a1"), ("b", "b0")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_added_before_the_group_are_read() {
    let (server, q) = setup().await;
    let mut c = raw(&server).await;
    let _: String = c
        .xadd(
            queue_stream(Q),
            "*",
            &[("session_id", "early"), ("reason", "new")],
        )
        .await
        .unwrap();
    q.ensure_queue(Q).await.unwrap();
    q.enqueue(Q, "late", EnqueueReason::New).await.unwrap();
    let ds = q
        .read(&queues(), "w", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(sessions(&ds), ["early", "late"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_creates_stream_and_group() {
    let (server, q) = setup().await;
    // No ensure_queue: the first enqueue must still leave a group behind (KEDA reads its lag).
    q.enqueue("fresh", "s1", EnqueueReason::New).await.unwrap();
    let mut c = raw(&server).await;
    let groups: redis::Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(queue_stream("fresh"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(format!("{groups:?}").contains(GROUP), "{groups:?}");
    assert_eq!(
        q.stats("fresh").await.unwrap(),
        QueueStats {
            length: 1,
            pending: 0,
            lag: Some(1)
        }
    );
    let ds = q
        .read(&["fresh".to_string()], "w", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(sessions(&ds), ["s1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_read_longer_than_response_timeout() {
    let (server, q) = setup().await;
    q.ensure_queue(Q).await.unwrap();

    // An entry arriving while a read is blocked on the server is returned then, without
    // error: the read returns long before its block would end.
    let q = std::sync::Arc::new(q);
    let q2 = q.clone();
    let reader = tokio::spawn(async move { q2.read(&queues(), "w", 10, 2 * HANG).await });
    tokio::task::block_in_place(|| server.wait_until_blocked(1, HANG)).unwrap();
    q.enqueue(Q, "s1", EnqueueReason::New).await.unwrap();
    let ds = tokio::time::timeout(HANG, reader)
        .await
        .expect("the read waited out its block instead of returning the entry")
        .unwrap()
        .unwrap();
    assert_eq!(sessions(&ds), ["s1"]);

    // Nothing arrives: empty after the full block, no error.
    let t = Instant::now();
    let ds = q
        .read(&queues(), "w", 10, Duration::from_secs(2))
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(ds.is_empty());
    assert!(took >= Duration::from_millis(1900), "{took:?}");

    // Concurrent blocking reads do not stall ordinary commands: they are answered while
    // the read is still blocked on the server (a command queued behind it would be
    // answered only after the read).
    let q3 = q.clone();
    let blocked =
        tokio::spawn(async move { q3.read(&queues(), "w2", 10, Duration::from_secs(60)).await });
    tokio::task::block_in_place(|| server.wait_until_blocked(1, Duration::from_secs(5))).unwrap();
    q.ping().await.unwrap();
    q.stats(Q).await.unwrap();
    assert_eq!(server.blocked_clients().unwrap(), 1);
    assert!(!blocked.is_finished());
    q.enqueue(Q, "wakes", EnqueueReason::New).await.unwrap();
    assert_eq!(sessions(&blocked.await.unwrap().unwrap()), ["wakes"]);

    // A zero block is a non-blocking read (BLOCK 0 would wait forever).
    assert!(
        tokio::time::timeout(HANG, q.read(&queues(), "w", 10, Duration::ZERO))
            .await
            .expect("a zero block waited for an entry")
            .unwrap()
            .is_empty()
    );
}

/// A blocking read its caller stopped waiting for (a draining worker's, dropped at its
/// shutdown) ends in Redis as well, its reader connection closed with it: an entry
/// enqueued afterwards is another consumer's at once, not taken by the abandoned read to
/// wait in its pending list for the reclaimer. (A cluster's read: `redis_cluster.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_blocking_read_takes_nothing() {
    let (server, q) = setup().await;
    q.ensure_queue(Q).await.unwrap();
    let q = std::sync::Arc::new(q);
    let reader = q.clone();
    // A block far longer than the bounds below: only its end in Redis unblocks it.
    let read = tokio::spawn(async move {
        reader
            .read(&queues(), "draining", 10, Duration::from_secs(600))
            .await
    });
    tokio::task::block_in_place(|| server.wait_until_blocked(1, Duration::from_secs(10))).unwrap();
    read.abort();
    assert!(read.await.unwrap_err().is_cancelled());
    tokio::task::block_in_place(|| server.wait_until_unblocked(Duration::from_secs(10)))
        .expect("the abandoned read still blocks in Redis");

    q.enqueue(Q, "s1", EnqueueReason::New).await.unwrap();
    let ds = q
        .read(&queues(), "other", 10, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(sessions(&ds), ["s1"]);
    // The abandoned consumer holds nothing.
    assert!(
        q.read_own_pending(&queues(), "draining", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn touch_protects_from_reclaim() {
    let (_server, q) = setup().await;
    q.enqueue(Q, "kept", EnqueueReason::New).await.unwrap();
    q.enqueue(Q, "lost", EnqueueReason::New).await.unwrap();
    let ds = q
        .read(&queues(), "a", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(sessions(&ds), ["kept", "lost"]);

    // Idle well past min_idle; then `a` touches one of its two entries and `b` reclaims.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    q.touch(Q, "a", &[ds[0].entry_id.clone()]).await.unwrap();
    q.touch(Q, "a", &[]).await.unwrap();
    let taken = q
        .reclaim(Q, "b", Duration::from_millis(1000), 10)
        .await
        .unwrap();
    assert_eq!(sessions(&taken), ["lost"]);
    assert_eq!(taken[0].entry_id, ds[1].entry_id);

    let a = q.read_own_pending(&queues(), "a", 10).await.unwrap();
    let b = q.read_own_pending(&queues(), "b", 10).await.unwrap();
    assert_eq!(sessions(&a), ["kept"]);
    assert_eq!(sessions(&b), ["lost"]);

    // Nothing idle enough now.
    assert!(
        q.reclaim(Q, "c", Duration::from_millis(1000), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_respects_count() {
    let (_server, q) = setup().await;
    let items: Vec<(String, EnqueueReason)> = (0..5)
        .map(|i| (format!("s{i}"), EnqueueReason::New))
        .collect();
    q.enqueue_many(Q, &items).await.unwrap();
    assert_eq!(
        q.read(&queues(), "dead-worker", 10, Duration::from_millis(100))
            .await
            .unwrap()
            .len(),
        5
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = q
        .reclaim(Q, "b", Duration::from_millis(200), 3)
        .await
        .unwrap();
    assert_eq!(sessions(&first), ["s0", "s1", "s2"]);
    let rest = q
        .reclaim(Q, "c", Duration::from_millis(200), 3)
        .await
        .unwrap();
    assert_eq!(sessions(&rest), ["s3", "s4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_moves_and_acks() {
    let (server, q) = setup().await;
    q.enqueue(Q, "doomed", EnqueueReason::Retry).await.unwrap();
    let ds = q
        .read(&queues(), "w", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(ds.len(), 1);
    q.dead_letter(&ds[0], "delivered 5 times").await.unwrap();

    let dead = xrange(&server, DEAD_STREAM).await;
    assert_eq!(dead.len(), 1);
    let f = &dead[0].1;
    assert_eq!(f["session_id"], "doomed");
    assert_eq!(f["queue"], Q);
    assert_eq!(f["entry_id"], ds[0].entry_id);
    assert_eq!(f["reason"], "delivered 5 times");
    assert_eq!(q.stats(Q).await.unwrap().pending, 0);
    assert!(
        q.read_own_pending(&queues(), "w", 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_completion_reaches_subscribers_and_stream() {
    let (server, q) = setup().await;
    let mut one = q.subscribe_completion("s1").await.unwrap();
    let mut other = q.subscribe_completion("s2").await.unwrap();

    let client = redis::Client::open(server.url()).unwrap();
    let mut all = client.get_async_pubsub().await.unwrap();
    all.subscribe(DONE_CHANNEL).await.unwrap();
    let mut per_id = client.get_async_pubsub().await.unwrap();
    per_id.subscribe(done_channel("s1")).await.unwrap();

    let c = completion("s1");
    q.publish_completion(&c).await.unwrap();

    let got = tokio::time::timeout(Duration::from_secs(5), one.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, c);
    let msg = tokio::time::timeout(Duration::from_secs(5), all.on_message().next())
        .await
        .unwrap()
        .unwrap();
    let parsed: Completion = serde_json::from_str(&msg.get_payload::<String>().unwrap()).unwrap();
    assert_eq!(parsed, c);
    let msg = tokio::time::timeout(Duration::from_secs(5), per_id.on_message().next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(msg.get_channel_name(), done_channel("s1"));

    // Not for s2.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), other.next())
            .await
            .is_err()
    );

    let stored = xrange(&server, COMPLETIONS_STREAM).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].1["session_id"], "s1");
    let parsed: Completion = serde_json::from_str(&stored[0].1["data"]).unwrap();
    assert_eq!(parsed, c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_length_pending_lag() {
    let (server, q) = setup().await;
    assert_eq!(q.stats("nothing").await.unwrap(), QueueStats::default());
    q.ensure_queue(Q).await.unwrap();
    assert_eq!(
        q.stats(Q).await.unwrap(),
        QueueStats {
            length: 0,
            pending: 0,
            lag: Some(0)
        }
    );
    for i in 0..3 {
        q.enqueue(Q, &format!("s{i}"), EnqueueReason::New)
            .await
            .unwrap();
    }
    assert_eq!(
        q.stats(Q).await.unwrap(),
        QueueStats {
            length: 3,
            pending: 0,
            lag: Some(3)
        }
    );
    let ds = q
        .read(&queues(), "w", 2, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(
        q.stats(Q).await.unwrap(),
        QueueStats {
            length: 3,
            pending: 2,
            lag: Some(1)
        }
    );
    q.ack(Q, &[ds[0].entry_id.clone()]).await.unwrap();
    assert_eq!(
        q.stats(Q).await.unwrap(),
        QueueStats {
            length: 3,
            pending: 1,
            lag: Some(1)
        }
    );

    // Lag turns nil when undelivered entries are deleted (why we never XDEL).
    let mut c = raw(&server).await;
    let last = xrange(&server, &queue_stream(Q)).await.pop().unwrap().0;
    let _: i64 = c.xdel(queue_stream(Q), &[last]).await.unwrap();
    assert_eq!(q.stats(Q).await.unwrap().lag, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_entries_are_skipped_and_acked() {
    let (server, q) = setup().await;
    q.ensure_queue(Q).await.unwrap();
    let mut c = raw(&server).await;
    let _: String = c
        .xadd(queue_stream(Q), "*", &[("foo", "bar")])
        .await
        .unwrap();
    q.enqueue(Q, "good", EnqueueReason::New).await.unwrap();
    let _: String = c
        .xadd(queue_stream(Q), "*", &[("session_id", "")])
        .await
        .unwrap();

    let ds = q
        .read(&queues(), "w", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(sessions(&ds), ["good"]);
    // Only the good entry is pending; the garbage was acked.
    assert_eq!(q.stats(Q).await.unwrap().pending, 1);
    assert_eq!(q.read_own_pending(&queues(), "w", 10).await.unwrap(), ds);

    // A pending entry whose data was deleted is acked by read_own_pending too.
    let _: i64 = c
        .xdel(queue_stream(Q), &[ds[0].entry_id.clone()])
        .await
        .unwrap();
    assert!(
        q.read_own_pending(&queues(), "w", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(q.stats(Q).await.unwrap().pending, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_redis_restart() {
    let (mut server, q) = setup().await;
    let mut cancels = q.subscribe_signals().await.unwrap();
    q.enqueue(Q, "before", EnqueueReason::New).await.unwrap();
    let ds = q
        .read(&queues(), "w", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(sessions(&ds), ["before"]);
    // Warm the reader pool so a stale reader connection is exercised after the restart.
    q.read(&queues(), "w", 10, Duration::from_millis(600))
        .await
        .unwrap();

    // Down: commands fail, retryably, and do not hang.
    server.kill();
    let t = Instant::now();
    let e = q.ping().await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    let e = q
        .read(&queues(), "w", 10, Duration::from_millis(600))
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    let e = q.enqueue(Q, "x", EnqueueReason::New).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    // Back, empty (no persistence). Same RedisQueue.
    server.restart().unwrap();
    eventually(Duration::from_secs(15), || q.ping()).await;

    // A stream without its group (as a producer that is not us might leave it): the read
    // hits NOGROUP, re-creates the group at 0 and still gets the entry.
    let mut c = raw(&server).await;
    let _: String = c
        .xadd(
            queue_stream(Q),
            "*",
            &[("session_id", "orphan"), ("reason", "new")],
        )
        .await
        .unwrap();
    let qs = queues();
    let ds = eventually(Duration::from_secs(15), || {
        q.read(&qs, "w", 10, Duration::from_millis(200))
    })
    .await;
    assert_eq!(sessions(&ds), ["orphan"]);

    // Enqueue/read work; a queue that vanished entirely gets stream and group back.
    eventually(Duration::from_secs(15), || {
        q.enqueue("other", "after", EnqueueReason::Resume)
    })
    .await;
    let other = vec!["other".to_string()];
    let ds = eventually(Duration::from_secs(15), || {
        q.read(&other, "w", 10, Duration::from_millis(200))
    })
    .await;
    assert_eq!(sessions(&ds), ["after"]);
    assert_eq!(ds[0].reason, EnqueueReason::Resume);

    // touch / reclaim / stats on a lost group heal instead of failing.
    server.restart().unwrap();
    eventually(Duration::from_secs(15), || q.ping()).await;
    let _: String = raw(&server)
        .await
        .xadd(queue_stream(Q), "*", &[("session_id", "s")])
        .await
        .unwrap();
    eventually(Duration::from_secs(15), || {
        q.touch(Q, "w", std::slice::from_ref(&ds[0].entry_id))
    })
    .await;
    assert!(
        q.reclaim(Q, "w", Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let st = q.stats(Q).await.unwrap();
    assert_eq!(st.length, 1);
    assert_eq!(st.lag, Some(1));

    // The cancel subscription reconnected by itself.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let _ = q
            .publish_signal(&WorkerSignal::Cancel("after-restart".into()))
            .await;
        match tokio::time::timeout(Duration::from_millis(300), cancels.next()).await {
            Ok(Some(id)) => {
                assert_eq!(id, WorkerSignal::Cancel("after-restart".into()));
                break;
            }
            Ok(None) => panic!("cancel stream ended"),
            Err(_) => assert!(
                Instant::now() < deadline,
                "cancel subscription did not come back"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_read_fails_when_redis_dies() {
    let (mut server, q) = setup().await;
    q.ensure_queue(Q).await.unwrap();
    let q = std::sync::Arc::new(q);
    let q2 = q.clone();
    let reader =
        tokio::spawn(async move { q2.read(&queues(), "w", 10, Duration::from_secs(30)).await });
    tokio::task::block_in_place(|| server.wait_until_blocked(1, Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    server.kill();
    let r = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("a blocked read must not outlive its server")
        .unwrap();
    let e = r.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));

    server.restart().unwrap();
    eventually(Duration::from_secs(15), || {
        q.enqueue(Q, "s1", EnqueueReason::New)
    })
    .await;
    let qs = queues();
    let ds = eventually(Duration::from_secs(15), || {
        q.read(&qs, "w", 10, Duration::from_secs(1))
    })
    .await;
    assert_eq!(sessions(&ds), ["s1"]);
}

/// Events appended on one server go in script calls of a bounded size: a batch of many
/// sessions, more events than one call takes and more data than one call carries, comes
/// out whole and in each session's order, data byte for byte (a script's arguments are
/// data, never code: quotes, newlines, Lua and a NUL pass through). An append that fails
/// (a stream key of another type) fails the batch's call, and every other event of the
/// batch is appended still, as a pipeline of `XADD`s did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_go_in_bounded_script_calls_each_append_tried() {
    use agentq_queue::EventStreams;
    use agentq_queue::queue::{EventRecord, events_stream};

    let (server, q) = setup().await;
    let record = |session: &str, seq: u64, data: String| EventRecord {
        session_id: session.into(),
        id: String::new(),
        seq,
        epoch: 3,
        data,
    };
    let hostile = "\"end'); redis.call('FLUSHALL') --\n\0]]";
    let big = "x".repeat(100 * 1024);
    let mut batch = Vec::new();
    for seq in 0..150u64 {
        for s in ["a", "b"] {
            batch.push(record(s, seq, format!("{s}{seq}{hostile}")));
        }
    }
    // Six entries of 100 KiB: more than one call's worth of data (256 KiB).
    for seq in 0..6u64 {
        batch.push(record("c", seq, format!("{seq}{big}")));
    }
    q.append_events(&batch).await.unwrap();
    for s in ["a", "b", "c"] {
        let want: Vec<(u64, String)> = batch
            .iter()
            .filter(|e| e.session_id == s)
            .map(|e| (e.seq, e.data.clone()))
            .collect();
        let got: Vec<(u64, String)> = xrange(&server, &events_stream(s))
            .await
            .into_iter()
            .map(|(_, f)| {
                assert_eq!(f["epoch"], "3");
                (f["seq"].parse().unwrap(), f["data"].clone())
            })
            .collect();
        assert_eq!(got, want, "{s}");
    }
    // 300 small events: four calls of 64 and one of the last 44 with the first two big
    // ones (the third would pass the call's data bound), then two calls of two big ones.
    let mut c = raw(&server).await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    let evals = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_eval:calls="))
        .and_then(|rest| rest.split(',').next())
        .unwrap_or("0");
    assert_eq!(evals, "7", "{stats}");

    let _: () = c.set(events_stream("taken"), "not a stream").await.unwrap();
    let mixed = [
        record("d", 1, "before".into()),
        record("taken", 1, "refused".into()),
        record("d", 2, "after".into()),
    ];
    let failed = q.append_events(&mixed).await;
    assert!(failed.is_err(), "{failed:?}");
    let d: Vec<String> = xrange(&server, &events_stream("d"))
        .await
        .into_iter()
        .map(|(_, f)| f["data"].clone())
        .collect();
    assert_eq!(d, ["before", "after"]);
    let kept: String = c.get(events_stream("taken")).await.unwrap();
    assert_eq!(kept, "not a stream");
}
