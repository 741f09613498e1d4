//! What only `PgStore` has, against a real Postgres (the testkit's private server): the row
//! a final commit returns, rows written before migration 0005 or with JSON's NUL escape,
//! WAL per checkpoint, its connection pools and query plans, schema checks on an empty
//! database and surviving a server crash. What every backend does is the contract's
//! (`contract/`). Each test takes a fresh database on the shared server, except those that
//! need a server of their own (WAL measurement, SIGKILL, few connections left).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use agentq_agent::schema::Message;
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_error::Error;
use agentq_store::pg::PgStore;
use agentq_store::store::Store;
use agentq_store::{Checkpoint, InboxStore, LeaseStore, SessionStore};
use agentq_testkit::{PostgresServer, shared_postgres};
use agentq_types::model::SessionStatus;

use common::{TTL, acquire, create, iterate};

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

/// Postgres' final commit brings the finished row back (the contract's
/// `contract_terminal_checkpoint` allows a backend to leave it to a read), exactly as a read
/// after it finds it.
#[tokio::test]
async fn a_final_commit_returns_the_finished_row() {
    let store = store().await;
    let id = create(&store, "answer me").await;
    let (lease, mut state) = acquire(&store, &id, "w", TTL).await;
    let persisted = state.messages.len();
    state.push_assistant(Message::assistant("42"));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("42".into()),
        error: None,
    });
    let cp = Checkpoint::new(&lease, &state, persisted).unwrap();
    let committed = store.checkpoint_batch(&[&cp]).await.unwrap().pop().unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(committed.unwrap().as_deref(), Some(&row));
    assert_eq!(row.status, SessionStatus::Completed);
}

/// A lone checkpoint binds single values where a batch binds arrays (the same statement
/// over a table of one row): twin sessions taking the same steps, one committed alone and
/// one in a batch beside a third, end with the same row and the same history.
#[tokio::test]
async fn a_lone_checkpoint_stores_what_a_batch_stores() {
    let store = store().await;
    let mut runs = Vec::new();
    for prompt in ["twin", "twin", "bystander"] {
        let id = create(&store, prompt).await;
        runs.push(acquire(&store, &id, "w", TTL).await);
    }
    let mut persisted: Vec<usize> = runs.iter().map(|(_, s)| s.messages.len()).collect();
    for step in 0..3 {
        for (_, state) in &mut runs {
            let mut reply = Message::assistant(format!("step {step}"));
            reply.usage = Some(agentq_agent::schema::Usage {
                input_tokens: 100,
                output_tokens: 20,
                reasoning_tokens: 5,
                ..Default::default()
            });
            reply.model = Some("test-model".into());
            state.push_assistant(reply);
            if step == 2 {
                state.outcome = Some(Outcome {
                    reason: ExitReason::Stop,
                    result: Some("done".into()),
                    error: None,
                });
            }
        }
        let cps: Vec<Checkpoint> = runs
            .iter()
            .zip(&persisted)
            .map(|((lease, state), from)| Checkpoint::new(lease, state, *from).unwrap())
            .collect();
        let alone = store.checkpoint_batch(&[&cps[0]]).await.unwrap();
        let batch = store.checkpoint_batch(&[&cps[1], &cps[2]]).await.unwrap();
        assert_eq!((alone.len(), batch.len()), (1, 2));
        let rows: Vec<_> = alone.into_iter().chain(batch).map(Result::unwrap).collect();
        // Only the final step brings the finished rows back, alone as in the batch.
        assert!(rows.iter().all(|r| r.is_some() == (step == 2)), "{rows:?}");
        for (from, (_, state)) in persisted.iter_mut().zip(&runs) {
            *from = state.messages.len();
        }
    }
    let (a, b) = (&runs[0].0.session_id, &runs[1].0.session_id);
    assert_eq!(store.messages(a).await.unwrap(), runs[0].1.messages);
    assert_eq!(
        store.messages(a).await.unwrap(),
        store.messages(b).await.unwrap()
    );
    let comparable = |row: agentq_types::model::SessionRow| {
        let mut v = serde_json::to_value(row).unwrap();
        let o = v.as_object_mut().unwrap();
        for volatile in [
            "id",
            "root_id",
            "created_at",
            "updated_at",
            "finished_at",
            "started_at",
        ] {
            o.remove(volatile);
        }
        v
    };
    let row_a = store.get(a).await.unwrap().unwrap();
    assert_eq!(row_a.status, SessionStatus::Completed);
    assert_eq!(row_a.usage.input_tokens, 300);
    assert_eq!(
        comparable(row_a),
        comparable(store.get(b).await.unwrap().unwrap())
    );
}

/// A claim skips reading `messages` only for a history of the prompt alone (the contract
/// covers fresh and re-opened sessions): a row from before `history_len` (migration 0005)
/// with its first message stored comes back whole.
#[tokio::test]
async fn claims_read_the_stored_history_of_a_row_without_its_length() {
    let store = store().await;
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
        .heartbeat(&lease.owner, std::slice::from_ref(&lease), TTL)
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
        .heartbeat(&lease.owner, std::slice::from_ref(&lease), TTL)
        .await
        .unwrap();
    assert!(hb[0].held);
    drop(store);
    drop(server);
}

#[tokio::test]
async fn a_workers_store_plans_generically_on_both_pools() {
    let url = fresh_url();
    // The plan cache's mode, and whether sequential scans and merge joins are allowed.
    let mode = async |pool: &sqlx::PgPool| -> (String, String, String) {
        sqlx::query_as(
            "SELECT current_setting('plan_cache_mode'), current_setting('enable_seqscan'), \
                 current_setting('enable_mergejoin')",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    };
    let keyed = || ("force_generic_plan".into(), "off".into(), "off".into());
    let worker = PgStore::connect_for_worker(&url, 2, 1).await.unwrap();
    worker.migrate().await.unwrap();
    assert_eq!(mode(worker.pool()).await, keyed());
    assert_eq!(mode(worker.writer_pool()).await, keyed());
    // A store that may serve the API keeps Postgres's choices on its main pool.
    let shared = PgStore::connect_with_writers(&url, 2, 1).await.unwrap();
    assert_eq!(
        mode(shared.pool()).await,
        ("auto".into(), "on".into(), "on".into())
    );
    assert_eq!(mode(shared.writer_pool()).await, keyed());
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

/// A lease renewal and a step's checkpoint (one not finishing the session) can be HOT
/// updates: no index of `sessions` holds, in its key or its predicate, a column either
/// of them writes. Every running session's row takes both many times a minute; an index
/// on one of these columns would make each write a new row version with an entry in
/// every index (a renewal wrote 790 B of WAL with one, 161 B without).
#[tokio::test]
async fn lease_renewals_and_step_checkpoints_touch_no_indexed_column() {
    let store = store().await;
    let defs: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes \
         WHERE schemaname = 'public' AND tablename = 'sessions'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(defs.len() > 5, "the sessions table's indexes: {defs:?}");
    // What the heartbeat and a step's group commit set (see store/src/pg/batch.rs).
    let written = [
        "lease_expires_at",
        "iteration",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
        "web_search_requests",
        "drain_rounds",
        "free_iteration",
        "phase",
        "started_at",
        "turn_base",
        "not_started",
        "bg_cursor",
        "msg_cursor",
        "history_len",
        "attempts",
        "model_used",
        "updated_at",
    ];
    let word = |def: &str, column: &str| {
        def.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| w == column)
    };
    for (name, def) in &defs {
        for column in written {
            assert!(
                !word(def, column),
                "index {name} holds {column}, which every renewal or step writes: {def}"
            );
        }
    }
}

/// A heartbeat writes one row, the worker's, whatever the number of sessions it covers:
/// no session row gets a new version, and the worker's row has no index but its key, so
/// its renewal is a HOT update.
#[tokio::test]
async fn a_heartbeat_writes_the_workers_row_and_no_session_row() {
    let store = store().await;
    let mut leases = Vec::new();
    for i in 0..8 {
        let id = create(&store, &format!("s{i}")).await;
        leases.push(acquire(&store, &id, "w", TTL).await.0);
    }
    let versions = async || -> Vec<String> {
        sqlx::query_scalar("SELECT xmin::text FROM sessions ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap()
    };
    let before = versions().await;
    for _ in 0..3 {
        let hb = store.heartbeat("w", &leases, TTL).await.unwrap();
        assert!(hb.iter().all(|s| s.held && !s.lost), "{hb:?}");
    }
    assert_eq!(versions().await, before);
    // For the record (`--nocapture`), not asserted: WAL per beat, against what renewing
    // each session's lease as before this row wrote.
    let lsn = async || -> i64 {
        sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    let beats = 20;
    let start = lsn().await;
    for _ in 0..beats {
        store.heartbeat("w", &leases, TTL).await.unwrap();
    }
    let per_row = (lsn().await - start) / beats;
    let start = lsn().await;
    for _ in 0..beats {
        sqlx::query(
            "UPDATE sessions SET lease_expires_at = now() + interval '30 seconds' \
             WHERE lease_owner = 'w' AND status = 'running'",
        )
        .execute(store.pool())
        .await
        .unwrap();
    }
    let per_session = (lsn().await - start) / beats;
    eprintln!(
        "WAL per heartbeat of {} sessions: {per_row} B with the worker's row, \
         {per_session} B renewing each session's lease",
        leases.len()
    );
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'workers'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(indexes.len(), 1, "{indexes:?}");
    assert!(indexes[0].contains("workers_pkey"), "{indexes:?}");
}

/// A group claim naming an id Postgres refuses (a NUL byte, which no text value holds)
/// fails as a whole and writes nothing, so the worker can split it and claim the others
/// (`worker/src/group_claim.rs`); the failure is the value's, not an outage.
#[tokio::test]
async fn a_group_claim_with_a_refused_id_fails_whole_and_writes_nothing() {
    let store = store().await;
    let good = create(&store, "good").await;
    let other = create(&store, "other").await;
    let err = store
        .claim_batch(&[good.as_str(), "bad\0id", other.as_str()], "w", TTL, 10)
        .await
        .unwrap_err();
    assert!(err.is_data() && !err.is_retryable(), "{err:?}");
    for id in [&good, &other] {
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!((row.status, row.lease_epoch), (SessionStatus::Queued, 0));
    }
    let answers = store
        .claim_batch(&[good.as_str(), other.as_str()], "w", TTL, 10)
        .await
        .unwrap();
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(agentq_types::model::Claim::Acquired { .. })))
    );
}
