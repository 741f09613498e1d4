//! The value rules of `sessions` and `messages` (migration 0032): held by domains, not by
//! table CHECK constraints, which Postgres would rebuild from their text for every
//! statement that writes a row (a lone checkpoint, a claim) and evaluate whichever
//! columns it writes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use agentq_store::pg::PgStore;

use common::{create, pg_store as store};

/// Run `sql` with `id` as `$1`; it must fail: the SQLSTATE it failed with.
async fn refused(store: &PgStore, sql: &str, id: &str) -> Option<String> {
    let err = sqlx::query(sql)
        .bind(id)
        .execute(store.pool())
        .await
        .expect_err(&format!("stored: {sql}"));
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

/// The row as JSON, to compare before and after.
async fn row(store: &PgStore, id: &str) -> String {
    sqlx::query_scalar("SELECT to_jsonb(s)::text FROM sessions s WHERE id = $1")
        .bind(id)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Neither `sessions` nor `messages` has a table CHECK constraint: a new one would cost
/// every statement that writes a session row or a step's messages its rebuild. A rule on
/// a column goes on the column's domain.
#[tokio::test]
async fn the_step_tables_have_no_table_check_constraint() {
    let store = store().await;
    let checks: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE conrelid IN ('sessions'::regclass, 'messages'::regclass) AND contype = 'c'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(checks.is_empty(), "table constraints: {checks:?}");
}

/// Every rule the table constraints held still refuses its values, on insert and on
/// update, with the SQLSTATE a CHECK constraint gives (23514), and leaves the row as it
/// was.
#[tokio::test]
async fn the_domains_refuse_what_the_table_constraints_refused() {
    let store = store().await;
    let id = create(&store, "rules").await;
    let rules = [
        ("iteration", "-1"),
        ("attempts", "-1"),
        ("turn_base", "-1"),
        ("input_tokens", "-1"),
        ("web_search_requests", "-5"),
        ("budget_allowance", "-1"),
        ("wake_seq", "-1"),
        ("history_len", "0"),
        ("fork_at", "0"),
        ("batch_max_running", "0"),
        ("priority", "10"),
        ("priority", "-1"),
        ("status", "'finished'"),
        ("phase", "'think'"),
    ];
    let before = row(&store, &id).await;
    let mut writes: Vec<String> = rules
        .iter()
        .map(|(column, value)| format!("UPDATE sessions SET {column} = {value} WHERE id = $1"))
        .collect();
    // On insert too: a copy of the row with one bad value, and a message.
    writes.push(
        "INSERT INTO sessions SELECT (jsonb_populate_record(s, \
             jsonb_build_object('id', 'copy', 'root_id', 'copy', 'output_tokens', -1))).* \
         FROM sessions s WHERE id = $1"
            .into(),
    );
    writes.push(
        "INSERT INTO messages (root_id, session_id, seq, body) \
         SELECT gen_random_uuid(), gen_random_uuid(), -1, '{}' WHERE $1 <> ''"
            .into(),
    );
    for sql in &writes {
        let code = refused(&store, sql, &id).await;
        assert_eq!(code.as_deref(), Some("23514"), "{sql}");
    }
    assert_eq!(row(&store, &id).await, before);
    // And the values the rules allow at their edges are stored.
    for (column, value) in [("iteration", "0"), ("history_len", "1"), ("priority", "9")] {
        sqlx::query(&format!(
            "UPDATE sessions SET {column} = {value} WHERE id = $1"
        ))
        .bind(&id)
        .execute(store.pool())
        .await
        .unwrap_or_else(|e| panic!("{column} = {value}: {e}"));
    }
}
