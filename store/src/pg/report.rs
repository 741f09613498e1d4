//! The console's summaries on Postgres (see [`crate::sql::report`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::model::ListFilter;
use crate::report::{CostFilter, CostRow, StatusCount, WorkerLeases};
use crate::sql::budget::count;
use crate::sql::report::{self, CostRecord, WORKERS_SQL};
use crate::sql::statements::Dialect;
use crate::store::ReportStore;

use super::PgStore;

#[async_trait]
impl ReportStore for PgStore {
    async fn count_sessions(&self, filter: &ListFilter) -> Result<Vec<StatusCount>> {
        let rows: Vec<(String, Option<String>, i64)> =
            report::count_statement::<sqlx::Postgres>(filter, Dialect::Postgres)
                .build_query_as()
                .fetch_all(&self.pool)
                .await?;
        report::status_counts(rows)
    }

    async fn costs(&self, filter: &CostFilter) -> Result<Vec<CostRow>> {
        let rows: Vec<CostRecord> = report::costs::<sqlx::Postgres>(filter, Dialect::Postgres)
            .build_query_as()
            .fetch_all(&self.pool)
            .await?;
        Ok(report::cost_rows(rows))
    }

    async fn workers(&self, limit: u32) -> Result<Vec<WorkerLeases>> {
        type Row = (String, i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
        let rows: Vec<Row> = sqlx::query_as(&WORKERS_SQL)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(worker, n, first, last)| WorkerLeases {
                worker,
                sessions: count(n),
                first_expiry: first,
                last_expiry: last,
            })
            .collect())
    }
}
