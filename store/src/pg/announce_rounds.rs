//! Marks of finished sessions announced, from this process, taken together in
//! [`super::rounds`]: each is one deletion from `unannounced` and, alone, one commit.
//! Sessions end in bursts (a worker's group commit finishes many at once), so the marks
//! that arrive while one is in flight go in one statement and one commit.

use std::sync::Arc;

use sqlx::postgres::PgPool;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

use super::rounds::Rounds;

const MARK_MANY: &str = "DELETE FROM unannounced WHERE id = ANY($1)";

/// A session to mark, and who waits for the answer.
pub(crate) type Mark = (String, oneshot::Sender<Result<()>>);

/// Mark `id` announced, in the next round (all marks share one key).
pub(crate) async fn mark(rounds: &Arc<Rounds<Mark>>, pool: &PgPool, id: &str) -> Result<()> {
    let (done, answer) = oneshot::channel();
    let pool = pool.clone();
    rounds.submit("", (id.to_string(), done), move |marks| {
        mark_many(pool.clone(), marks)
    });
    answer.await.map_err(|_| Error::Stopped)?
}

async fn mark_many(pool: PgPool, marks: Vec<Mark>) {
    let ids: Vec<&str> = marks.iter().map(|(id, _)| id.as_str()).collect();
    let answer = sqlx::query(MARK_MANY)
        .bind(&ids)
        .execute(&pool)
        .await
        .map(|_| ())
        .map_err(|e| Arc::new(Error::from(e)));
    for (_, done) in marks {
        let _ = done.send(answer.clone().map_err(Error::Shared));
    }
}
