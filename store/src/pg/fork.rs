//! Forks on Postgres: the fork's row, its message and its files in one transaction; the
//! reads, the arithmetic and the writes are `sql::fork`'s.

use crate::error::{Error, Result};
use crate::fork::{ForkResult, NewFork};
use crate::sql::fork::{self, POSTGRES as FORK};
use crate::sql::statements::POSTGRES as SQL;

use super::PgStore;

impl PgStore {
    pub(super) async fn fork(&self, f: &NewFork) -> Result<ForkResult> {
        let mut tx = self.pool.begin().await?;
        let mut p =
            match fork::plan::<sqlx::Postgres>(&mut tx, &SQL.select_session, &FORK, f).await? {
                Ok(p) => p,
                Err(answer) => return Ok(answer),
            };
        let mut new = f.new.clone();
        new.spec.prompt = std::mem::take(&mut p.prompt);
        let inserted = super::create::insert(&mut *tx, std::slice::from_ref(&new)).await?;
        if !inserted.contains_key(&f.new.id) {
            return Err(Error::Conflict(format!(
                "session {} exists already",
                f.new.id
            )));
        }
        let rec = fork::write::<sqlx::Postgres>(&mut tx, &FORK, f, &p).await?;
        tx.commit().await?;
        Ok(ForkResult::Forked(Box::new(rec.into_row()?)))
    }
}
