//! The two schemas stay level: a fresh Postgres and a fresh SQLite database, each migrated
//! by its store, hold the same tables with the same columns (name, nullability and a
//! compatible type), and an embedded database file written before the SQLite schema
//! caught up with Postgres upgrades in place with its sessions intact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use agentq_agent::schema::Message;
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_error::Error;
use agentq_store::pg::PgStore;
use agentq_store::sqlite::SqliteStore;
use agentq_store::{InboxStore, LeaseStore, SessionStore, Store};
use agentq_types::model::{Claim, SessionStatus};

/// (table, column) → (storage class, nullable).
type Columns = BTreeMap<(String, String), (&'static str, bool)>;

/// How SQLite stores what a Postgres column type holds (see `migrations_sqlite/0001`):
/// text, ids and JSON as TEXT; integers, booleans and timestamps (unix microseconds) as
/// INTEGER.
fn sqlite_class_of_pg(data_type: &str) -> &'static str {
    match data_type {
        "text" | "uuid" | "json" | "jsonb" => "TEXT",
        "integer" | "bigint" | "boolean" | "timestamp with time zone" => "INTEGER",
        "bytea" => "BLOB",
        other => panic!("no SQLite counterpart for Postgres type {other}"),
    }
}

fn sqlite_class(declared: &str) -> &'static str {
    match declared {
        "TEXT" => "TEXT",
        "INTEGER" => "INTEGER",
        "BLOB" => "BLOB",
        other => panic!("unexpected SQLite column type {other}"),
    }
}

async fn pg_columns() -> Columns {
    let url = agentq_testkit::shared_postgres()
        .expect("shared postgres")
        .fresh_database()
        .expect("fresh database");
    let store = PgStore::connect(&url, 2).await.expect("connect");
    store.migrate().await.expect("migrate");
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text \
         FROM information_schema.columns \
         WHERE table_schema = 'public' AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(t, c, ty, null)| ((t, c), (sqlite_class_of_pg(&ty), null == "YES")))
        .collect()
}

async fn sqlite_columns(store: &SqliteStore) -> Columns {
    let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT m.name, p.name, p.type, p.\"notnull\" \
         FROM sqlite_master m JOIN pragma_table_info(m.name) p \
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' \
           AND m.name <> '_sqlx_migrations'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(t, c, ty, notnull)| ((t, c), (sqlite_class(&ty), notnull == 0)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_sqlite_have_the_same_tables_and_columns() {
    let pg = pg_columns().await;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let sqlite = sqlite_columns(&store).await;
    store.close().await;

    let tables = |c: &Columns| -> Vec<String> {
        let mut t: Vec<String> = c.keys().map(|(t, _)| t.clone()).collect();
        t.dedup();
        t
    };
    assert_eq!(tables(&pg), tables(&sqlite));
    assert_eq!(
        tables(&pg),
        [
            "api_keys",
            "approvals",
            "batches",
            "blobs",
            "inbox",
            "messages",
            "queues",
            "retention_rules",
            "retired_usage",
            "schedule_fires",
            "schedules",
            "session_specs",
            "sessions",
            "shard_generations",
            "tenant_budgets",
            "tenant_holds",
            "tenant_ledger",
            "tenant_spend",
            "unannounced",
            "webhook_batch_checks",
            "webhook_deliveries",
            "webhook_endpoints",
            "workers",
            "workspace_files",
            "workspace_versions",
        ]
    );
    let names = |c: &Columns| c.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&pg), names(&sqlite), "column names differ");
    assert_eq!(pg, sqlite, "column types or nullability differ");
}

/// The SQLite migrations before the schema caught up with Postgres (0001-0003), as a
/// directory a migrator can run.
fn migrations_before_0004() -> tempfile::TempDir {
    let before = tempfile::TempDir::new().unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations_sqlite");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.as_str() < "0004" {
            std::fs::copy(&path, before.path().join(&name)).unwrap();
        }
    }
    before
}

/// A file at migration 0003 with one session as the store wrote it then: the spec in the
/// row, the prompt stored as message 0, each message with its role and time.
async fn file_at_0003(path: &Path, id: &str, spec: &SessionSpec, history: &[Message]) {
    let store = SqliteStore::open(path).await.unwrap();
    let before = migrations_before_0004();
    sqlx::migrate::Migrator::new(before.path())
        .await
        .unwrap()
        .run(store.pool())
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp_micros();
    sqlx::query(
        "INSERT INTO sessions (id, root_id, queue, status, spec, iteration, started_at, \
             created_at, updated_at) \
         VALUES (?1, ?1, 'default', 'queued', ?2, 1, ?3, ?3, ?3)",
    )
    .bind(id)
    .bind(sqlx::types::Json(spec))
    .bind(now)
    .execute(store.pool())
    .await
    .unwrap();
    for (seq, m) in history.iter().enumerate() {
        sqlx::query(
            "INSERT INTO messages (root_id, session_id, seq, role, body, created_at) \
             VALUES (?1, ?1, ?2, 'x', ?3, ?4)",
        )
        .bind(id)
        .bind(seq as i64)
        .bind(serde_json::to_string(m).unwrap())
        .bind(now)
        .execute(store.pool())
        .await
        .unwrap();
    }
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_file_from_before_0004_upgrades_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentq.db");
    let id = uuid::Uuid::now_v7().to_string();
    let spec = SessionSpec::new("from before");
    let history = vec![Message::user("from before"), Message::assistant("step one")];
    file_at_0003(&path, &id, &spec, &history).await;

    // The new binary refuses the old schema until migrated, then reads everything back.
    let store = SqliteStore::open(&path).await.unwrap();
    match store.check_schema().await {
        Err(Error::SchemaBehind { current, required }) => {
            assert_eq!(current, Some(3));
            assert!(required >= 5);
        }
        other => panic!("expected SchemaBehind, got {other:?}"),
    }
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.spec, spec);
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.iteration, 1);
    assert_eq!(store.messages(&id).await.unwrap(), history);

    // It carries on: a claim resumes the stored history, a window from 0 stores only the
    // new message, and a follow-up lands after the history.
    let (lease, mut state) = match store
        .claim(&id, "w", Duration::from_secs(30), 10)
        .await
        .unwrap()
    {
        Claim::Acquired { lease, state, .. } => (lease, *state),
        other => panic!("expected Acquired, got {other:?}"),
    };
    assert_eq!(state.messages, history);
    state.push_assistant(Message::assistant("step two"));
    state.outcome = Some(Outcome::new(ExitReason::Stop));
    store.checkpoint(&lease, &state, 0).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(stored, 3);
    let row = store
        .follow_up(&id, "and then", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    let mut want = state.messages.clone();
    want.push(Message::user("and then"));
    assert_eq!(store.messages(&id).await.unwrap(), want);

    // A session created after the upgrade stores no copy of its prompt.
    let fresh = agentq_types::model::NewSession::root(SessionSpec::new("after"), "default");
    let (row, created) = store.create_session(&fresh).await.unwrap();
    assert!(created);
    assert_eq!(
        store.messages(&row.id).await.unwrap(),
        vec![Message::user("after")]
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM messages WHERE session_id = ?1")
        .bind(&row.id)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(stored, 0);
    store.close().await;
}
