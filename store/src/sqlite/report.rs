//! The console's summaries on SQLite (see [`crate::sql::report`]), read from the readers'
//! pool.

use async_trait::async_trait;
use chrono::DateTime;
use sqlx::Sqlite;

use crate::error::Result;
use crate::model::ListFilter;
use crate::report::{CostFilter, CostRow, StatusCount, WorkerLeases};
use crate::sql::budget::count;
use crate::sql::report::{self, CostRecord, WORKERS_SQL};
use crate::sql::statements::Dialect;
use crate::store::ReportStore;

use super::SqliteStore;

#[async_trait]
impl ReportStore for SqliteStore {
    async fn count_sessions(&self, filter: &ListFilter) -> Result<Vec<StatusCount>> {
        let rows: Vec<(String, Option<String>, i64)> =
            report::count_statement::<Sqlite>(filter, Dialect::Sqlite)
                .build_query_as()
                .fetch_all(&self.readers)
                .await?;
        report::status_counts(rows)
    }

    async fn costs(&self, filter: &CostFilter) -> Result<Vec<CostRow>> {
        let rows: Vec<CostRecord> = report::costs::<Sqlite>(filter, Dialect::Sqlite)
            .build_query_as()
            .fetch_all(&self.readers)
            .await?;
        Ok(report::cost_rows(rows))
    }

    async fn workers(&self, limit: u32) -> Result<Vec<WorkerLeases>> {
        // Times are stored as microseconds (see the module docs of `crate::sqlite`).
        let rows: Vec<(String, i64, Option<i64>, Option<i64>)> = sqlx::query_as(&WORKERS_SQL)
            .bind(i64::from(limit))
            .fetch_all(&self.readers)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(worker, n, first, last)| WorkerLeases {
                worker,
                sessions: count(n),
                first_expiry: first.and_then(DateTime::from_timestamp_micros),
                last_expiry: last.and_then(DateTime::from_timestamp_micros),
            })
            .collect())
    }
}
