//! `PgStore` against a real Postgres (the testkit's private server): creation and
//! idempotency, the lease protocol (claim, checkpoint, heartbeat, release, fencing),
//! cancellation, the sweeper's queries, listing, schema checks and surviving a server
//! crash. Each test takes a fresh database on the shared server, except those that need a
//! server of their own (WAL measurement, SIGKILL).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use chrono::{SubsecRound, Utc};

use agentq_agent::schema::Message;
use agentq_agent::spec::{ExitReason, Mode, SessionSpec};
use agentq_agent::state::{Outcome, Phase, SessionState};
use agentq_error::Error;
use agentq_store::pg::PgStore;
use agentq_store::store::Store;
use agentq_store::{Checkpoint, InboxStore, LeaseStore, SessionStore, SweepStore};
use agentq_testkit::{PostgresServer, shared_postgres};
use agentq_types::model::{CancelResult, Claim, Lease, ListFilter, NewSession, SessionStatus};

use common::{Clock, SHORT_TTL, TTL, acquire, create, iterate, new_session};

/// A fresh database of the shared server.
fn fresh_url() -> String {
    shared_postgres()
        .expect("shared postgres")
        .fresh_database()
        .expect("fresh database")
}

/// A migrated store with a main pool of `conns` at `url`.
async fn migrated(url: &str, conns: u32) -> PgStore {
    let store = PgStore::connect(url, conns).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}

async fn store_at(url: &str) -> PgStore {
    migrated(url, 8).await
}

/// A migrated store on a fresh database of the shared server.
async fn store() -> PgStore {
    store_with(8).await
}

/// A migrated store with a main pool of `conns` on a fresh database of the shared server.
async fn store_with(conns: u32) -> PgStore {
    migrated(&fresh_url(), conns).await
}

/// Follow a finished `history` up with `text`: it must land right after it. Returns the
/// history with it.
async fn followed_up(store: &PgStore, id: &str, history: &[Message], text: &str) -> Vec<Message> {
    store.follow_up(id, text, None).await.unwrap().unwrap();
    let mut want = history.to_vec();
    want.push(Message::user(text));
    assert_eq!(store.messages(id).await.unwrap(), want);
    want
}

async fn sql_i64(store: &PgStore, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn create_returns_existing_row_for_a_repeated_idempotency_key() {
    let store = store().await;
    let mut first = new_session("summarise the repo");
    first.idempotency_key = Some("req-1".into());
    let (row, created) = store.create_session(&first).await.unwrap();
    assert!(created);
    assert_eq!(row.id, first.id);
    assert_eq!(row.root_id, first.id);
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.spec, first.spec);
    assert_eq!((row.lease_epoch, row.attempts, row.iteration), (0, 0, 0));
    assert_eq!(row.idempotency_key.as_deref(), Some("req-1"));
    assert!(row.lease_owner.is_none() && row.finished_at.is_none());

    // The same request again (a client retry): a new id, the same key.
    let mut again = new_session("summarise the repo");
    again.idempotency_key = Some("req-1".into());
    let (row2, created2) = store.create_session(&again).await.unwrap();
    assert!(!created2);
    assert_eq!(row2, row);
    assert!(store.get(&again.id).await.unwrap().is_none());

    // Re-sending the very same item (same id) is also a repeat.
    let (row3, created3) = store.create_session(&first).await.unwrap();
    assert!(!created3);
    assert_eq!(row3.id, row.id);

    // The history starts with the prompt, as a fresh state does.
    let msgs = store.messages(&row.id).await.unwrap();
    assert_eq!(msgs, vec![Message::user("summarise the repo")]);
    assert!(matches!(
        store.messages("nope").await,
        Err(Error::NotFound(_))
    ));

    // Within one batch, a duplicate key maps to the first item's row.
    let mut a = new_session("a");
    a.idempotency_key = Some("k-a".into());
    let mut b = new_session("b");
    b.idempotency_key = Some("k-a".into());
    let c = new_session("c");
    let out = store
        .create_sessions(&[a.clone(), b, c.clone()])
        .await
        .unwrap();
    assert_eq!(out.len(), 3);
    assert!(out[0].1 && !out[1].1 && out[2].1);
    assert_eq!(out[0].0.id, a.id);
    assert_eq!(out[1].0.id, a.id);
    assert_eq!(out[2].0.id, c.id);
    assert_eq!(sql_i64(&store, "SELECT count(*) FROM sessions").await, 3);
}

#[tokio::test]
async fn batch_of_1000_then_10000() {
    let store = store().await;
    let batch: Vec<NewSession> = (0..1000)
        .map(|i| {
            let mut s = new_session(&format!("task {i}"));
            s.idempotency_key = Some(format!("batch-{i}"));
            s
        })
        .collect();
    let out = store.create_sessions(&batch).await.unwrap();
    assert_eq!(out.len(), 1000);
    for (s, (row, created)) in batch.iter().zip(&out) {
        assert!(created);
        assert_eq!(row.id, s.id);
        assert_eq!(row.spec.prompt, s.spec.prompt);
    }
    assert_eq!(sql_i64(&store, "SELECT count(*) FROM sessions").await, 1000);
    // A fresh history is the prompt alone, which the spec holds: no message row.
    assert_eq!(sql_i64(&store, "SELECT count(*) FROM messages").await, 0);
    for (s, (row, _)) in batch.iter().zip(&out).step_by(97) {
        assert_eq!(
            store.messages(&row.id).await.unwrap(),
            vec![Message::user(s.spec.prompt.clone())]
        );
    }

    // The whole batch again: nothing new, every item answered with its row.
    let again = store.create_sessions(&batch).await.unwrap();
    assert!(again.iter().all(|(_, created)| !created));
    assert!(again.iter().zip(&out).all(|(a, b)| a.0.id == b.0.id));

    let big: Vec<NewSession> = (0..10_000)
        .map(|i| new_session(&format!("big {i}")))
        .collect();
    let t = Instant::now();
    let out = store.create_sessions(&big).await.unwrap();
    let took = t.elapsed();
    eprintln!("create_sessions(10_000) took {took:?}");
    assert_eq!(out.len(), 10_000);
    assert!(out.iter().all(|(_, c)| *c));
    assert!(took < Duration::from_secs(20), "10k batch took {took:?}");
    assert_eq!(
        sql_i64(&store, "SELECT count(*) FROM sessions").await,
        11_000
    );
}

#[tokio::test]
async fn crashed_worker_is_resumed_from_its_checkpoint() {
    let store = store().await;
    let mut spec = SessionSpec::new("plan then act");
    spec.mode = Mode::PlanAct;
    let (row, _) = store
        .create_session(&NewSession::root(spec.clone(), "default"))
        .await
        .unwrap();
    let id = row.id;

    let (lease, mut state) = acquire(&store, &id, "worker-a", SHORT_TTL).await;
    assert_eq!(lease.epoch, 1);
    assert_eq!(state, SessionState::new(id.clone(), spec.clone()));
    assert_eq!(state.phase, Phase::Plan);

    // Postgres keeps microseconds.
    state.started_at = Some(Utc::now().trunc_subsecs(6));
    let mut persisted = state.messages.len();
    for i in 0..3 {
        iterate(&store, &lease, &mut state, &mut persisted, i).await;
    }
    state.phase = Phase::Act;
    state.drain_rounds = 2;
    state.free_iteration = true;
    state
        .messages
        .push(Message::user("The plan above is accepted."));
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    let checkpointed = state.clone();
    // The worker dies here: no release, no further write.
    drop(state);

    // Its lease is still live: nobody else may take the session.
    assert_eq!(
        store.claim(&id, "worker-b", TTL, 10).await.unwrap(),
        Claim::Busy
    );
    store.pass(SHORT_TTL * 2).await;

    let (lease_b, resumed) = acquire(&store, &id, "worker-b", TTL).await;
    assert_eq!(lease_b.epoch, 2);
    assert_eq!(resumed, checkpointed);
    assert_eq!(resumed.iteration, 3);
    assert_eq!(resumed.usage.input_tokens, 300);
    assert_eq!(resumed.usage.reasoning_tokens, 15);
    assert_eq!(resumed.messages.len(), 8);

    let row = store.get(&id).await.unwrap().unwrap();
    // A's checkpoints saved progress, which resets the crash count; B's claim is the
    // first claim since.
    assert_eq!(row.attempts, 1);
    assert_eq!(row.iteration, 3);
    assert_eq!(row.usage, checkpointed.usage);
    assert_eq!(store.messages(&id).await.unwrap(), checkpointed.messages);
}

#[tokio::test]
async fn fenced_attempts_ignore_stale_workers() {
    let store = store().await;
    let id = create(&store, "fence me").await;
    let (lease_a, mut state_a) = acquire(&store, &id, "worker-a", SHORT_TTL).await;
    let mut persisted_a = state_a.messages.len();
    iterate(&store, &lease_a, &mut state_a, &mut persisted_a, 0).await;

    // A stalls past its lease; B takes over.
    store.pass(SHORT_TTL * 2).await;
    let (lease_b, state_b) = acquire(&store, &id, "worker-b", TTL).await;
    assert!(lease_b.epoch > lease_a.epoch);
    assert_eq!(state_b, state_a);
    let row_before = store.get(&id).await.unwrap().unwrap();
    let msgs_before = store.messages(&id).await.unwrap();

    // A wakes up: every write it attempts is refused and changes nothing.
    let mut stale = state_a.clone();
    stale.push_assistant(Message::assistant("stale answer"));
    let err = store
        .checkpoint(&lease_a, &stale, persisted_a)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::LeaseLost(ref s) if s == &id),
        "{err:?}"
    );
    stale.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("stale answer".into()),
        error: None,
    });
    let err = store
        .checkpoint(&lease_a, &stale, persisted_a)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost(_)), "{err:?}");
    let hb = store
        .heartbeat(std::slice::from_ref(&lease_a), TTL)
        .await
        .unwrap();
    assert_eq!(hb.len(), 1);
    assert!(!hb[0].held);
    let err = store.release(&lease_a).await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost(_)), "{err:?}");
    // A lease with the right epoch but another owner is no better.
    let forged = Lease {
        owner: "worker-a".into(),
        ..lease_b.clone()
    };
    assert!(matches!(
        store.checkpoint(&forged, &stale, persisted_a).await,
        Err(Error::LeaseLost(_))
    ));

    assert_eq!(store.get(&id).await.unwrap().unwrap(), row_before);
    assert_eq!(store.messages(&id).await.unwrap(), msgs_before);

    // B still owns it and can write.
    let mut state_b = state_b;
    let mut persisted_b = state_b.messages.len();
    iterate(&store, &lease_b, &mut state_b, &mut persisted_b, 1).await;
    assert_eq!(store.messages(&id).await.unwrap().len(), 5);
}

#[tokio::test]
async fn checkpoint_with_outcome_finishes_the_session_and_retries_are_harmless() {
    let store = store().await;

    // Completed.
    let id = create(&store, "answer me").await;
    let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
    // A step's commit has no row to give back.
    let step = Checkpoint::new(&lease, &state, state.messages.len()).unwrap();
    assert!(matches!(
        store.checkpoint_batch(&[&step]).await.unwrap().as_slice(),
        [Ok(None)]
    ));
    let persisted = state.messages.len();
    state.push_assistant(Message::assistant("42"));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("42".into()),
        error: None,
    });
    // The final commit brings the finished row back, exactly as a read after it finds it.
    let cp = Checkpoint::new(&lease, &state, persisted).unwrap();
    let committed = store.checkpoint_batch(&[&cp]).await.unwrap().pop().unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(committed.unwrap().as_deref(), Some(&row));
    assert_eq!(row.status, SessionStatus::Completed);
    assert_eq!(row.finish_reason, Some(ExitReason::Stop));
    assert_eq!(row.result.as_deref(), Some("42"));
    assert!(row.error.is_none());
    assert!(row.finished_at.is_some());
    assert!(row.lease_owner.is_none() && row.lease_expires_at.is_none());
    assert_eq!(row.iteration, 1);

    // The same final checkpoint again (its answer was lost): harmless.
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().status,
        SessionStatus::Completed
    );

    // A finished session is not run again.
    match store.claim(&id, "w2", TTL, 10).await.unwrap() {
        Claim::Terminal(r) => assert_eq!(r.status, SessionStatus::Completed),
        other => panic!("expected Terminal, got {other:?}"),
    }
    assert!(matches!(
        store.request_cancel(&id).await.unwrap(),
        CancelResult::AlreadyFinished(_)
    ));
    // Nor failed from outside.
    let after_fail = store.fail(&id, "dead letter").await.unwrap().unwrap();
    assert_eq!(after_fail.status, SessionStatus::Completed);

    // Failed with the reason; cancelled by an interrupt.
    for (reason, status) in [
        (ExitReason::MaxIterations, SessionStatus::Failed),
        (ExitReason::Error, SessionStatus::Failed),
        (ExitReason::Interrupted, SessionStatus::Cancelled),
        (ExitReason::Yielded, SessionStatus::Completed),
    ] {
        let id = create(&store, "limit").await;
        let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
        state.outcome = Some(Outcome {
            reason,
            result: None,
            error: Some(format!("ended: {reason}")),
        });
        store
            .checkpoint(&lease, &state, state.messages.len())
            .await
            .unwrap();
        let row = store.get(&id).await.unwrap().unwrap();
        assert_eq!(row.status, status, "{reason}");
        assert_eq!(row.finish_reason, Some(reason));
        assert_eq!(row.error, Some(format!("ended: {reason}")));
    }
}

#[tokio::test]
async fn retried_checkpoint_writes_nothing_twice() {
    let store = store().await;
    let id = create(&store, "retry").await;
    let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
    let persisted = state.messages.len();
    state.push_assistant(Message::assistant("one"));
    state
        .messages
        .push(Message::tool_result("c1", "t", "r", false));
    for _ in 0..3 {
        store.checkpoint(&lease, &state, persisted).await.unwrap();
    }
    // The two new messages, once each (message 0, the prompt, is in the spec).
    assert_eq!(sql_i64(&store, "SELECT count(*) FROM messages").await, 2);
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    // An overlapping window (from an earlier index) is harmless too: nothing is stored
    // twice, and message 0 stays in the spec.
    store.checkpoint(&lease, &state, 0).await.unwrap();
    store.checkpoint(&lease, &state, 1).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    assert_eq!(sql_i64(&store, "SELECT count(*) FROM messages").await, 2);
    // Nothing new: only the row is written.
    store
        .checkpoint(&lease, &state, state.messages.len())
        .await
        .unwrap();
    assert_eq!(sql_i64(&store, "SELECT count(*) FROM messages").await, 2);
}

/// A claim skips reading `messages` only for a history of the prompt alone: a follow-up to
/// a session cancelled before it ever ran, and a row from before `history_len` (migration
/// 0005) with its first message stored, both come back whole.
#[tokio::test]
async fn claims_read_exactly_the_stored_history() {
    let store = store().await;

    // What the store relies on to keep message 0 only in the spec.
    for mode in [Mode::Act, Mode::Think, Mode::Plan, Mode::PlanAct] {
        let mut spec = SessionSpec::new("p");
        spec.mode = mode;
        assert_eq!(
            SessionState::new("x", spec).messages,
            vec![Message::user("p")]
        );
    }
    let fresh = create(&store, "fresh").await;
    let (_, state) = acquire(&store, &fresh, "w", TTL).await;
    assert_eq!(state.messages, vec![Message::user("fresh")]);

    let cancelled = create(&store, "never ran").await;
    assert!(matches!(
        store.request_cancel(&cancelled).await.unwrap(),
        CancelResult::CancelledNow(_)
    ));
    let want = followed_up(
        &store,
        &cancelled,
        &[Message::user("never ran")],
        "and now this",
    )
    .await;
    let (_, state) = acquire(&store, &cancelled, "w", TTL).await;
    assert_eq!(state.messages, want);

    let legacy = create(&store, "legacy").await;
    let (lease, mut state) = acquire(&store, &legacy, "w", TTL).await;
    state.push_assistant(Message::assistant("one"));
    // From 0: message 0 stored as well, as every row before migration 0005 had it.
    store.checkpoint(&lease, &state, 0).await.unwrap();
    store.release(&lease).await.unwrap();
    sqlx::query("UPDATE sessions SET history_len = NULL WHERE id = $1")
        .bind(&legacy)
        .execute(store.pool())
        .await
        .unwrap();
    let (lease, resumed) = acquire(&store, &legacy, "w2", TTL).await;
    assert_eq!(resumed.messages, state.messages);
    // Without `history_len`, a repeated window is checked against the stored seqs.
    store.checkpoint(&lease, &state, 0).await.unwrap();
    assert_eq!(store.messages(&legacy).await.unwrap(), state.messages);
    // Its next follow-up goes after the stored history, and the row knows its length again.
    state.outcome = Some(Outcome::new(ExitReason::Stop));
    store
        .checkpoint(&lease, &state, state.messages.len())
        .await
        .unwrap();
    let want = followed_up(&store, &legacy, &state.messages, "more").await;
    let (_, resumed) = acquire(&store, &legacy, "w3", TTL).await;
    assert_eq!(resumed.messages, want);
}

/// A database written by the store before migration 0005 (message 0 stored, a unique
/// message key, the spec in the row) upgrades in place and its sessions carry on: their
/// histories read back the same, a resumed run stores nothing twice, a follow-up lands
/// after the history.
#[tokio::test]
async fn sessions_written_before_0005_carry_on_after_it() {
    let url = fresh_url();
    let store = PgStore::connect(&url, 4).await.unwrap();
    let before = tempfile::TempDir::new().unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.as_str() < "0005" {
            std::fs::copy(&path, before.path().join(&name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(before.path())
        .await
        .unwrap()
        .run(store.pool())
        .await
        .unwrap();

    // One session as the store wrote it then: created, claimed, one step checkpointed.
    let id = uuid::Uuid::now_v7().to_string();
    let spec = SessionSpec::new("from before");
    let history = vec![Message::user("from before"), Message::assistant("step one")];
    sqlx::query(
        "INSERT INTO sessions (id, root_id, queue, status, spec, iteration, started_at) \
         VALUES ($1, $1, 'default', 'queued', $2, 1, now())",
    )
    .bind(&id)
    .bind(sqlx::types::Json(&spec))
    .execute(store.pool())
    .await
    .unwrap();
    for (seq, m) in history.iter().enumerate() {
        sqlx::query(
            "INSERT INTO messages (root_id, session_id, seq, role, body) \
             VALUES ($1::uuid, $1::uuid, $2, 'x', $3)",
        )
        .bind(&id)
        .bind(seq as i32)
        .bind(sqlx::types::Json(m))
        .execute(store.pool())
        .await
        .unwrap();
    }

    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.spec, spec);
    assert_eq!(store.messages(&id).await.unwrap(), history);
    let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
    assert_eq!(state.messages, history);
    // A window from 0 after the upgrade: only the new message is stored.
    state.push_assistant(Message::assistant("step two"));
    state.outcome = Some(Outcome::new(ExitReason::Stop));
    store.checkpoint(&lease, &state, 0).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    assert_eq!(sql_i64(&store, "SELECT count(*) FROM messages").await, 3);
    followed_up(&store, &id, &state.messages, "and then").await;
}

/// What one checkpoint writes does not depend on the history length: measured as WAL bytes
/// (on a server of its own, so no other test's writes are counted) and as the stored size
/// of the rows it adds.
#[tokio::test]
async fn bytes_per_checkpoint_do_not_grow_with_history() {
    let server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("private postgres");
    let store = store_at(&server.fresh_database().unwrap()).await;

    async fn wal_lsn(store: &PgStore) -> String {
        sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
            .fetch_one(store.pool())
            .await
            .unwrap()
    }
    async fn wal_since(store: &PgStore, lsn: &str) -> i64 {
        sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - $1::pg_lsn)::bigint")
            .bind(lsn)
            .fetch_one(store.pool())
            .await
            .unwrap()
    }

    let mut per_iteration = Vec::new();
    for k in [10usize, 100] {
        let id = create(&store, "long session").await;
        let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
        let mut persisted = state.messages.len();
        // Warm up (first touches of pages and indexes).
        for i in 0..3 {
            iterate(&store, &lease, &mut state, &mut persisted, i).await;
        }
        let size_before = sql_i64(&store, "SELECT pg_total_relation_size('messages')").await;
        let lsn = wal_lsn(&store).await;
        for i in 3..3 + k {
            iterate(&store, &lease, &mut state, &mut persisted, i).await;
        }
        let wal = wal_since(&store, &lsn).await;
        let size_after = sql_i64(&store, "SELECT pg_total_relation_size('messages')").await;
        let rows: i64 = sqlx::query_scalar(
            "SELECT sum(pg_column_size(m.*))::bigint FROM messages m \
             WHERE session_id = $1::uuid AND seq >= $2",
        )
        .bind(&id)
        .bind(1 + 2 * 3)
        .fetch_one(store.pool())
        .await
        .unwrap();
        eprintln!(
            "K={k}: WAL {} B/iteration, rows {} B/iteration, relation growth {} B/iteration",
            wal / k as i64,
            rows / k as i64,
            (size_after - size_before) / k as i64
        );
        per_iteration.push((wal as f64 / k as f64, rows as f64 / k as f64));
    }
    let (wal10, rows10) = per_iteration[0];
    let (wal100, rows100) = per_iteration[1];
    assert!(
        wal100 < wal10 * 1.5 && wal10 < wal100 * 1.5,
        "WAL per iteration: {wal10} at K=10, {wal100} at K=100"
    );
    assert!(
        rows100 < rows10 * 1.5 && rows10 < rows100 * 1.5,
        "row bytes per iteration: {rows10} at K=10, {rows100} at K=100"
    );
    drop(store);
    drop(server);
}

#[tokio::test]
async fn heartbeat_extends_leases_and_reports_cancel_requests() {
    let store = store().await;
    let a = create(&store, "a").await;
    let b = create(&store, "b").await;
    let (lease_a, _) = acquire(&store, &a, "w", Duration::from_secs(5)).await;
    let (lease_b, _) = acquire(&store, &b, "w", Duration::from_secs(5)).await;
    let before = store
        .get(&a)
        .await
        .unwrap()
        .unwrap()
        .lease_expires_at
        .unwrap();

    let hb = store
        .heartbeat(&[lease_a.clone(), lease_b.clone()], TTL)
        .await
        .unwrap();
    assert_eq!(hb.len(), 2);
    assert_eq!(hb[0].session_id, a);
    assert_eq!(hb[1].session_id, b);
    assert!(hb.iter().all(|s| s.held && !s.cancel_requested));
    let after = store
        .get(&a)
        .await
        .unwrap()
        .unwrap()
        .lease_expires_at
        .unwrap();
    assert!(after - before > chrono::Duration::seconds(20));

    match store.request_cancel(&b).await.unwrap() {
        CancelResult::Requested(row) => {
            assert_eq!(row.status, SessionStatus::Running);
            assert!(row.cancel_requested);
        }
        other => panic!("expected Requested, got {other:?}"),
    }
    let stale = Lease {
        epoch: 0,
        ..lease_a.clone()
    };
    let hb = store
        .heartbeat(&[lease_b.clone(), stale, lease_a.clone()], TTL)
        .await
        .unwrap();
    assert_eq!(hb.len(), 3);
    assert!(hb[0].held && hb[0].cancel_requested && hb[0].session_id == b);
    assert!(!hb[1].held && !hb[1].cancel_requested && hb[1].session_id == a);
    assert!(hb[2].held && !hb[2].cancel_requested && hb[2].session_id == a);
    assert!(store.heartbeat(&[], TTL).await.unwrap().is_empty());
}

/// Checkpoints and heartbeats have connections of their own: with every connection of the
/// main pool taken (a burst of claims, say), they still go through — before, they queued
/// behind it and, held long enough, failed on the pool's acquire timeout.
#[tokio::test]
async fn checkpoints_and_heartbeats_do_not_wait_for_the_main_pool() {
    let store = store_with(2).await;
    let id = create(&store, "busy pool").await;
    let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
    let held = [
        store.pool().acquire().await.unwrap(),
        store.pool().acquire().await.unwrap(),
    ];
    // Several steps on the writer connections: each one's generic plan, made once, serves
    // every later checkpoint.
    let mut persisted = state.messages.len();
    for i in 0..8 {
        iterate(&store, &lease, &mut state, &mut persisted, i).await;
    }
    let hb = store
        .heartbeat(std::slice::from_ref(&lease), TTL)
        .await
        .unwrap();
    assert!(hb[0].held);
    drop(held);
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.iteration, 8);
    let stored_len = sql_i64(
        &store,
        &format!("SELECT history_len::bigint FROM sessions WHERE id = '{id}'"),
    )
    .await;
    assert_eq!(stored_len, i64::try_from(state.messages.len()).unwrap());
}

/// `open_all` leaves the main pool holding every connection it may, each ready for work.
#[tokio::test]
async fn open_all_opens_the_whole_pool() {
    let store = store_with(5).await;
    assert!(store.pool().size() < 5);
    store.open_all().await.unwrap();
    assert_eq!(store.pool().size(), 5);
    let id = create(&store, "after warming").await;
    let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
    let mut persisted = state.messages.len();
    iterate(&store, &lease, &mut state, &mut persisted, 0).await;
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
}

/// On a server with few connections left, `open_all` takes at most half of them, so that
/// other workers and the schedulers can still connect.
#[tokio::test]
async fn open_all_leaves_connections_for_others() {
    let server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("private postgres");
    let url = server.fresh_database().unwrap();
    let store = migrated(&url, 64).await;
    let max: i64 = sql_i64(&store, "SELECT current_setting('max_connections')::bigint").await;
    let others = sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(max - 30).unwrap())
        .connect(&url)
        .await
        .unwrap();
    let held = futures::future::try_join_all((0..max - 30).map(|_| others.acquire()))
        .await
        .unwrap();
    store.open_all().await.unwrap();
    // ~26 were left to ordinary roles (the server reserves 3 for superusers): half of them.
    let opened = store.pool().size();
    assert!((1..=14).contains(&opened), "opened {opened}");
    let late = PgStore::connect(&url, 1)
        .await
        .expect("a late client still connects");
    late.ping().await.unwrap();
    drop(held);
}

#[tokio::test]
async fn request_cancel_queued_running_finished_missing() {
    let store = store().await;

    let queued = create(&store, "queued").await;
    match store.request_cancel(&queued).await.unwrap() {
        CancelResult::CancelledNow(row) => {
            assert_eq!(row.status, SessionStatus::Cancelled);
            assert_eq!(row.finish_reason, Some(ExitReason::Interrupted));
            assert!(row.finished_at.is_some());
        }
        other => panic!("expected CancelledNow, got {other:?}"),
    }
    assert!(matches!(
        store.request_cancel(&queued).await.unwrap(),
        CancelResult::AlreadyFinished(_)
    ));
    // Its stream entry, when a worker reads it, is not run.
    assert!(matches!(
        store.claim(&queued, "w", TTL, 10).await.unwrap(),
        Claim::Terminal(_)
    ));

    // Suspended sessions are cancelled at once too.
    let waiting = create(&store, "waiting").await;
    sqlx::query("UPDATE sessions SET status = 'awaiting_approval' WHERE id = $1")
        .bind(&waiting)
        .execute(store.pool())
        .await
        .unwrap();
    assert_eq!(
        store.claim(&waiting, "w", TTL, 10).await.unwrap(),
        Claim::NotRunnable(SessionStatus::AwaitingApproval)
    );
    assert!(matches!(
        store.request_cancel(&waiting).await.unwrap(),
        CancelResult::CancelledNow(_)
    ));

    // Running: the owner is told; if it dies first, the next claimer sees the flag.
    let running = create(&store, "running").await;
    let (_lease, _) = acquire(&store, &running, "w1", SHORT_TTL).await;
    assert!(matches!(
        store.request_cancel(&running).await.unwrap(),
        CancelResult::Requested(_)
    ));
    assert_eq!(
        store.get(&running).await.unwrap().unwrap().status,
        SessionStatus::Running
    );
    store.pass(SHORT_TTL * 2).await;
    match store.claim(&running, "w2", TTL, 10).await.unwrap() {
        Claim::Acquired { row, .. } => assert!(row.cancel_requested),
        other => panic!("expected Acquired, got {other:?}"),
    }

    assert_eq!(
        store.request_cancel("missing").await.unwrap(),
        CancelResult::NotFound
    );
    assert_eq!(
        store.claim("missing", "w", TTL, 10).await.unwrap(),
        Claim::NotFound
    );
}

#[tokio::test]
async fn too_many_claims_exhaust_and_fail_dead_letters() {
    let store = store().await;
    let id = create(&store, "poison").await;
    for attempt in 1..=2 {
        let (lease, _) = acquire(&store, &id, &format!("w{attempt}"), SHORT_TTL).await;
        assert_eq!(lease.epoch, attempt);
        store.pass(SHORT_TTL * 2).await;
    }
    let row = match store.claim(&id, "w3", TTL, 2).await.unwrap() {
        Claim::Exhausted(row) => *row,
        other => panic!("expected Exhausted, got {other:?}"),
    };
    assert_eq!(row.attempts, 3);

    let failed = store
        .fail(&id, "delivered 3 times without finishing")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.status, SessionStatus::Failed);
    assert_eq!(failed.finish_reason, Some(ExitReason::Error));
    assert_eq!(
        failed.error.as_deref(),
        Some("delivered 3 times without finishing")
    );
    assert!(failed.lease_owner.is_none() && failed.finished_at.is_some());
    // Failing again leaves the first reason.
    let again = store.fail(&id, "other").await.unwrap().unwrap();
    assert_eq!(
        again.error.as_deref(),
        Some("delivered 3 times without finishing")
    );
    assert!(store.fail("missing", "x").await.unwrap().is_none());
}

#[tokio::test]
async fn release_hands_over_cleanly() {
    let store = store().await;
    let id = create(&store, "hand over").await;
    let (lease, mut state) = acquire(&store, &id, "w1", TTL).await;
    let mut persisted = state.messages.len();
    iterate(&store, &lease, &mut state, &mut persisted, 0).await;
    store.release(&lease).await.unwrap();
    // A retried release is harmless.
    store.release(&lease).await.unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.attempts, 0);
    assert!(row.lease_owner.is_none() && row.lease_expires_at.is_none());

    // Another worker resumes at once (no ttl to wait for), from the same state.
    let (lease2, state2) = acquire(&store, &id, "w2", TTL).await;
    assert_eq!(state2, state);
    assert_eq!(store.get(&id).await.unwrap().unwrap().attempts, 1);
    // The released lease is dead.
    assert!(matches!(
        store.checkpoint(&lease, &state, persisted).await,
        Err(Error::LeaseLost(_))
    ));
    assert!(matches!(
        store.release(&lease).await,
        Err(Error::LeaseLost(_))
    ));
    store.release(&lease2).await.unwrap();
}

#[tokio::test]
async fn sweeper_sees_only_unenqueued_queued_rows() {
    let store = store().await;
    let ids = [
        create(&store, "1").await,
        create(&store, "2").await,
        create(&store, "3").await,
    ];
    store.pass(Duration::from_millis(20)).await;
    let mut found = store.unenqueued(Duration::ZERO, 100).await.unwrap();
    found.sort();
    let mut want: Vec<(String, String)> = ids
        .iter()
        .map(|i| (i.clone(), "default".to_string()))
        .collect();
    want.sort();
    assert_eq!(found, want);
    assert!(
        store
            .unenqueued(Duration::from_secs(3600), 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.unenqueued(Duration::ZERO, 2).await.unwrap().len(), 2);

    store.mark_enqueued(&ids[..2]).await.unwrap();
    store.mark_enqueued(&[]).await.unwrap();
    let found = store.unenqueued(Duration::ZERO, 100).await.unwrap();
    assert_eq!(found, vec![(ids[2].clone(), "default".to_string())]);

    // A running row without an entry (its queue lost its data) is the sweeper's too;
    // once marked it is left alone.
    let _ = acquire(&store, &ids[2], "w", TTL).await;
    assert_eq!(
        store.unenqueued(Duration::ZERO, 100).await.unwrap(),
        vec![(ids[2].clone(), "default".to_string())]
    );
    store.mark_enqueued(&ids[2..]).await.unwrap();
    assert!(
        store
            .unenqueued(Duration::ZERO, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn list_pages_newest_first_with_filters() {
    let store = store().await;
    let mut all = Vec::new();
    for i in 0..25 {
        all.push(create(&store, &format!("s{i}")).await);
    }
    let root = all[0].clone();
    let mut children = Vec::new();
    for i in 0..3 {
        let mut child = NewSession::root(SessionSpec::new(format!("child {i}")), "default");
        child.parent_id = Some(root.clone());
        child.root_id = root.clone();
        child.depth = 1;
        let (row, _) = store.create_session(&child).await.unwrap();
        assert_eq!((row.root_id.as_str(), row.depth), (root.as_str(), 1));
        children.push(row.id.clone());
        all.push(row.id);
    }
    all.sort();
    all.reverse();

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list(&ListFilter {
                limit: 10,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 10);
        cursor = page.last().map(|r| r.id.clone());
        seen.extend(page.into_iter().map(|r| r.id));
    }
    assert_eq!(seen, all);

    for id in &all[..4] {
        store.request_cancel(id).await.unwrap();
    }
    let cancelled = store
        .list(&ListFilter {
            status: Some(SessionStatus::Cancelled),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        cancelled.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        all[..4].to_vec()
    );
    let queued = store
        .list(&ListFilter {
            status: Some(SessionStatus::Queued),
            cursor: Some(all[10].clone()),
            limit: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        queued.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        all[11..16].to_vec()
    );

    let mut kids: Vec<String> = store
        .list(&ListFilter {
            parent_id: Some(root.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    kids.reverse();
    children.sort();
    assert_eq!(kids, children);
    // limit 0 means the default page, not nothing.
    assert_eq!(
        store.list(&ListFilter::default()).await.unwrap().len(),
        all.len()
    );
}

#[tokio::test]
async fn check_schema_on_empty_and_migrated_databases() {
    let url = shared_postgres().unwrap().fresh_database().unwrap();
    let store = PgStore::connect(&url, 2).await.unwrap();
    match store.check_schema().await {
        Err(Error::SchemaBehind { current, required }) => {
            assert_eq!(current, None);
            assert!(required >= 1);
        }
        other => panic!("expected SchemaBehind, got {other:?}"),
    }
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
    // Migrating twice is a no-op.
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
    store.ping().await.unwrap();
}

#[tokio::test]
async fn store_recovers_after_postgres_is_killed_and_restarted() {
    let mut server = tokio::task::spawn_blocking(PostgresServer::start_crash_safe)
        .await
        .unwrap()
        .expect("private postgres");
    let url = server.fresh_database().unwrap();
    let store = store_at(&url).await;
    let id = create(&store, "survive").await;
    let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
    let mut persisted = state.messages.len();
    iterate(&store, &lease, &mut state, &mut persisted, 0).await;

    let mut server = tokio::task::spawn_blocking(move || {
        server.kill();
        server
    })
    .await
    .unwrap();
    let err = store.ping().await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let mut s2 = state.clone();
    s2.push_assistant(Message::assistant("during the outage"));
    let err = store.checkpoint(&lease, &s2, persisted).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");

    let server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store.ping().await {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                assert!(e.is_retryable(), "{e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("store did not recover: {e:?}"),
        }
    }
    // Committed state survived; the lease still holds; the retried checkpoint goes through.
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    store.checkpoint(&lease, &s2, persisted).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), s2.messages);
    let hb = store
        .heartbeat(std::slice::from_ref(&lease), TTL)
        .await
        .unwrap();
    assert!(hb[0].held);
    drop(store);
    drop(server);
}

#[tokio::test]
async fn a_workers_store_plans_generically_on_both_pools() {
    let url = fresh_url();
    let mode = async |pool: &sqlx::PgPool| -> String {
        sqlx::query_scalar("SHOW plan_cache_mode")
            .fetch_one(pool)
            .await
            .unwrap()
    };
    let worker = PgStore::connect_for_worker(&url, 2, 1).await.unwrap();
    worker.migrate().await.unwrap();
    assert_eq!(mode(worker.pool()).await, "force_generic_plan");
    assert_eq!(mode(worker.writer_pool()).await, "force_generic_plan");
    // A store that may serve the API keeps Postgres's choice on its main pool.
    let shared = PgStore::connect_with_writers(&url, 2, 1).await.unwrap();
    assert_eq!(mode(shared.pool()).await, "auto");
    assert_eq!(mode(shared.writer_pool()).await, "force_generic_plan");
    // And a worker's store runs the worker's statements.
    let id = create(&worker, "generic").await;
    let (lease, mut state) = acquire(&worker, &id, "w", TTL).await;
    let mut persisted = state.messages.len();
    iterate(&worker, &lease, &mut state, &mut persisted, 0).await;
    assert_eq!(
        worker.messages(&id).await.unwrap().len(),
        state.messages.len()
    );
}

/// Rows written before the stores escaped NUL hold it as JSON's `\u0000` (Postgres' `json`
/// takes it as text): the session, its history and its claim still read back, NUL and
/// all, instead of every read failing for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_stored_with_json_nul_before_escaping_read_back() {
    let store = store().await;
    let id = create(&store, "placeholder").await;
    let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
    let from = state.messages.len();
    state.push_assistant(Message::assistant("placeholder answer"));
    store.checkpoint(&lease, &state, from).await.unwrap();
    // What an older release wrote for a prompt and an answer holding NUL.
    let spec = serde_json::to_string(&SessionSpec::new("legacy \0 prompt")).unwrap();
    let body = serde_json::to_string(&Message::assistant("legacy \0 answer")).unwrap();
    assert!(spec.contains("\\u0000") && body.contains("\\u0000"));
    sqlx::query("UPDATE session_specs SET spec = $2::json WHERE id = $1")
        .bind(&id)
        .bind(&spec)
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE messages SET body = $2::json WHERE session_id = $1::uuid AND seq = 1")
        .bind(&id)
        .bind(&body)
        .execute(store.pool())
        .await
        .unwrap();
    let history = store.messages(&id).await.unwrap();
    assert_eq!(
        history,
        vec![
            Message::user("legacy \0 prompt"),
            Message::assistant("legacy \0 answer")
        ]
    );
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().spec.prompt,
        "legacy \0 prompt"
    );
}
