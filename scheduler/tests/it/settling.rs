//! A worker that dies between a session's terminal commit and the end of its settling
//! leaves no redelivery behind (its entry was acked at the claim): the sweeper finds the
//! finished session unannounced and settles it again — its event stream's expiry set, its
//! completion published, its waiting parent told and woken once — and a second pass, or
//! the worker's own settle arriving late, adds nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agentq_agent::schema::Message;
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_core::pg::PgStore;
use agentq_core::protocol::InboxKind;
use agentq_core::queue::{COMPLETIONS_STREAM, EventRecord, WorkQueue};
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    Claim, EventStreams, InboxStore, LeaseStore, NewSession, SessionStatus, SessionStore,
    WaitReason, new_session_id,
};
use agentq_scheduler::sweeper::settle_unannounced;
use agentq_testkit::{RedisServer, pttl, shared_postgres};

/// How long a settled session's event stream is kept.
const TTL: Duration = Duration::from_secs(3600);

fn child_of(root: &NewSession) -> NewSession {
    NewSession {
        id: new_session_id(),
        parent_id: Some(root.id.clone()),
        root_id: root.id.clone(),
        depth: 1,
        idempotency_key: Some("spawn:settle".into()),
        ..NewSession::root(SessionSpec::new("child"), "default")
    }
}

async fn completions(redis: &RedisServer, id: &str) -> usize {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(COMPLETIONS_STREAM)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    entries
        .iter()
        .filter(|(_, fields)| fields.iter().any(|(_, v)| v.contains(id)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_settles_a_session_whose_worker_died_after_its_end() {
    let url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let queue = RedisQueue::connect(&redis.url()).await.unwrap();
    queue.ensure_queue("default").await.unwrap();

    // A parent waiting for its child.
    let root = NewSession::root(SessionSpec::new("parent"), "default");
    store.create_session(&root).await.unwrap();
    let Claim::Acquired { lease, row, .. } = store
        .claim(&root.id, "w1", Duration::from_secs(30), 10)
        .await
        .unwrap()
    else {
        panic!("claim the parent");
    };
    let child = child_of(&root);
    store.create_session(&child).await.unwrap();
    let waiting = store
        .suspend_for(&lease, row.wake_seq, WaitReason::Children, None)
        .await
        .unwrap();
    assert_eq!(waiting.status, SessionStatus::Waiting);

    // The child's worker commits its end, then dies: nothing published, nobody told.
    let Claim::Acquired {
        lease, mut state, ..
    } = store
        .claim(&child.id, "w2", Duration::from_secs(30), 10)
        .await
        .unwrap()
    else {
        panic!("claim the child");
    };
    let from = state.messages.len();
    state.push_assistant(Message::assistant("the child's answer"));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("the child's answer".into()),
        error: None,
    });
    store.checkpoint(&lease, &state, from).await.unwrap();
    assert_eq!(completions(&redis, &child.id).await, 0);
    // Its events were written, their stream's expiry not.
    queue
        .append_events(&[EventRecord {
            session_id: child.id.clone(),
            id: String::new(),
            seq: 1,
            epoch: 1,
            data: r#"{"type":"iteration_started","iteration":1}"#.into(),
        }])
        .await
        .unwrap();
    let stream = agentq_core::queue::events_stream(&child.id);
    let stream_ttl = async || pttl(&redis.url(), &stream).await.unwrap();

    // Within the grace, the worker may still be settling: left alone.
    assert_eq!(
        settle_unannounced(&store, &queue, Duration::from_secs(3600), TTL).await,
        0
    );
    assert_eq!(stream_ttl().await, -1);
    assert_eq!(
        settle_unannounced(&store, &queue, Duration::ZERO, TTL).await,
        1
    );
    assert_eq!(completions(&redis, &child.id).await, 1);
    let left = stream_ttl().await;
    assert!(left > 0, "the stream expires in {left} ms");
    let parent = store.get(&root.id).await.unwrap().unwrap();
    assert_eq!(parent.status, SessionStatus::Queued, "woken: {parent:?}");
    let told = async || {
        store
            .inbox(&root.id, &[InboxKind::ChildResult], 0)
            .await
            .unwrap()
            .len()
    };
    assert_eq!(told().await, 1);

    // Settled: a second pass does nothing; the worker's own settle, arriving late, tells
    // the parent nothing new.
    assert_eq!(
        settle_unannounced(&store, &queue, Duration::ZERO, TTL).await,
        0
    );
    let finished = store.get(&child.id).await.unwrap().unwrap();
    agentq_core::lifecycle::notify_parent(&store, &queue, &finished)
        .await
        .unwrap();
    assert_eq!(told().await, 1);
    assert_eq!(completions(&redis, &child.id).await, 1);
}
