//! The write side of the SQLite file, below the store: the write transaction that tells
//! the store how it ended ([`WriteTx`]), the clock every statement binds (unix
//! microseconds, taken in Rust), and the reads a write transaction makes of its own rows.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use sqlx::{Sqlite, SqliteConnection, Transaction};

use crate::error::Result;
use crate::model::{Lease, SessionStatus};
use crate::sql::outcome;
use crate::sql::record::SessionRecord;
use crate::sql::statements::SQLITE as SQL;

/// A write transaction that tells the store how it ended: one dropped without a commit or
/// a rollback was left by a failed statement, and marks the store suspect.
pub(super) struct WriteTx {
    pub(super) tx: Option<Transaction<'static, Sqlite>>,
    pub(super) suspect: Arc<AtomicBool>,
}

impl WriteTx {
    pub(super) async fn commit(mut self) -> Result<()> {
        let Some(tx) = self.tx.take() else {
            return Ok(());
        };
        let r = tx.commit().await;
        self.suspect.store(r.is_err(), Ordering::Relaxed);
        Ok(r?)
    }

    pub(super) async fn rollback(mut self) -> Result<()> {
        let Some(tx) = self.tx.take() else {
            return Ok(());
        };
        let r = tx.rollback().await;
        if r.is_err() {
            self.suspect.store(true, Ordering::Relaxed);
        }
        Ok(r?)
    }
}

impl Deref for WriteTx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        match &self.tx {
            Some(tx) => tx,
            // Taken only by `commit` and `rollback`, which consume the value.
            None => unreachable!("a settled write transaction is not used"),
        }
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match &mut self.tx {
            Some(tx) => tx,
            None => unreachable!("a settled write transaction is not used"),
        }
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if self.tx.is_some() {
            self.suspect.store(true, Ordering::Relaxed);
        }
    }
}

/// Now, in unix microseconds.
pub(super) fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

pub(super) fn dur_us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Run a `… RETURNING COLS` write on `conn` and read it to the end (see the module docs);
/// at most one row is expected.
pub(super) async fn returning_one<'a>(
    conn: &mut SqliteConnection,
    query: sqlx::query::QueryAs<'a, Sqlite, SessionRecord, sqlx::sqlite::SqliteArguments<'a>>,
) -> Result<Option<SessionRecord>> {
    Ok(query.fetch_all(conn).await?.pop())
}

/// A session's row read inside a write transaction, so that the answer is consistent
/// with what the transaction did.
pub(super) async fn record_in(
    conn: &mut SqliteConnection,
    id: &str,
) -> Result<Option<SessionRecord>> {
    Ok(sqlx::query_as::<_, SessionRecord>(&SQL.select_session)
        .bind(id)
        .fetch_optional(conn)
        .await?)
}

/// After a fenced write matched nothing, inside the same transaction: did an earlier
/// attempt of the same write commit? (See [`outcome::gave_up`].)
pub(super) async fn gave_up_lease(
    conn: &mut SqliteConnection,
    lease: &Lease,
    want: fn(SessionStatus) -> bool,
) -> Result<bool> {
    let row: Option<outcome::LeaseRow> = sqlx::query_as(&SQL.lease_of)
        .bind(&lease.root_id)
        .bind(&lease.session_id)
        .fetch_optional(conn)
        .await?;
    Ok(outcome::gave_up(row, lease, want))
}
