//! Forks on SQLite: the fork's row, its message and its files in one write transaction;
//! the reads, the arithmetic and the writes are `sql::fork`'s.

use crate::error::{Error, Result};
use crate::fork::{ForkResult, NewFork};
use crate::sql::fork::{self, SQLITE as FORK};
use crate::sql::statements::SQLITE as SQL;

use super::SqliteStore;
use super::tx::now_us;

impl SqliteStore {
    pub(super) async fn fork(&self, f: &NewFork) -> Result<ForkResult> {
        // The reads inside the write transaction: the origin's committed steps cannot
        // change under the plan.
        let mut tx = self.write_tx().await?;
        let mut p = match fork::plan::<sqlx::Sqlite>(&mut tx, &SQL.select_session, &FORK, f).await?
        {
            Ok(p) => p,
            Err(answer) => {
                tx.rollback().await?;
                return Ok(answer);
            }
        };
        let mut new = f.new.clone();
        new.spec.prompt = std::mem::take(&mut p.prompt);
        if !super::writes::insert(&mut tx, &new, None, now_us()).await? {
            tx.rollback().await?;
            return Err(Error::Conflict(format!(
                "session {} exists already",
                f.new.id
            )));
        }
        let rec = fork::write::<sqlx::Sqlite>(&mut tx, &FORK, f, &p).await?;
        tx.commit().await?;
        Ok(ForkResult::Forked(Box::new(rec.into_row()?)))
    }
}
