//! Webhooks' statements, rows and writes, shared by both stores (generic over the
//! database): endpoints (`webhook_endpoints`), the outbox of deliveries the triggers of
//! migration 0020 write (`webhook_deliveries`) and the batch checks they leave for
//! `batch.completed` (`webhook_batch_checks`).
//!
//! Every time is bound by the caller ([`At`]): the delivery loop's clock is injected, so
//! backoff, leases and the disabling of an endpoint are tested without waiting. The only
//! dialect difference is the claim's row lock (Postgres' `FOR UPDATE SKIP LOCKED`, so
//! schedulers side by side never take the same row; SQLite has one writer at a time).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, Postgres};
use sqlx::sqlite::{Sqlite, SqliteArgumentValue, SqliteTypeInfo};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, QueryBuilder, Type};

use crate::error::Result;
use crate::rowconv::{bad_data, to_u32};
use crate::webhook::{
    AttemptOutcome, DeliveryCounts, DeliveryRow, DeliveryState, NewWebhook, Recorded, RetryRule,
    WebhookRow, events_column, events_of_column,
};

use super::record::Stamp;

/// A point in time bound into a statement: `timestamptz` on Postgres, unix microseconds on
/// SQLite (as [`Stamp`] reads them back).
#[derive(Debug, Clone, Copy)]
pub(crate) struct At(pub DateTime<Utc>);

impl Type<Postgres> for At {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }
}

impl<'q> Encode<'q, Postgres> for At {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> std::result::Result<IsNull, BoxDynError> {
        <DateTime<Utc> as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}

impl Type<Sqlite> for At {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }
}

impl<'q> Encode<'q, Sqlite> for At {
    fn encode_by_ref(
        &self,
        buf: &mut Vec<SqliteArgumentValue<'q>>,
    ) -> std::result::Result<IsNull, BoxDynError> {
        <i64 as Encode<Sqlite>>::encode_by_ref(&self.0.timestamp_micros(), buf)
    }
}

/// The rows a statement changed, as either database reports it.
pub(crate) trait Affected {
    fn affected(&self) -> u64;
}

impl Affected for sqlx::postgres::PgQueryResult {
    fn affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl Affected for sqlx::sqlite::SqliteQueryResult {
    fn affected(&self) -> u64 {
        self.rows_affected()
    }
}

const ENDPOINT_FIELDS: &str = "id, tenant, url, events, queue, batch_id, description, \
    secret_salt, old_secret_salt, old_expires_at, created_at, disabled_at, disabled_reason, \
    failing_since, last_failure_at, last_failure, last_success_at";

const DELIVERY_FIELDS: &str = "id, endpoint_id, event, session_id, batch_id, queue, status, \
    finish_reason, held, occurred_at, state, attempts, retry_from, next_attempt_at, \
    last_attempt_at, last_status, last_error, delivered_at";

/// Inserted only while the tenant has fewer than `$10` endpoints.
const INSERT_ENDPOINT: &str = "INSERT INTO webhook_endpoints (id, tenant, url, events, queue, \
    batch_id, description, secret_salt, created_at) \
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
    WHERE (SELECT count(*) FROM webhook_endpoints WHERE tenant = $2) < $10";

/// A claim: the due rows, oldest first, each counted as an attempt and pushed past the
/// attempt's lease (`$2`), after which another claimer may take it again.
const CLAIM: &str = "UPDATE webhook_deliveries \
    SET attempts = attempts + 1, last_attempt_at = $1, next_attempt_at = $2 \
    WHERE id IN (SELECT id FROM webhook_deliveries \
        WHERE state = 'pending' AND next_attempt_at <= $1 \
        ORDER BY next_attempt_at LIMIT $3 LOCK) \
    RETURNING ";

const DELIVERED: &str = "UPDATE webhook_deliveries \
    SET state = 'delivered', delivered_at = $3, last_status = $4, last_error = NULL \
    WHERE id = $1 AND attempts = $2 AND state = 'pending'";

/// `$5`: the next attempt; `$6`: out of retries (a dead letter).
const FAILED: &str = "UPDATE webhook_deliveries \
    SET state = CASE WHEN $6 THEN 'dead' ELSE 'pending' END, next_attempt_at = $5, \
        last_status = $3, last_error = $4 \
    WHERE id = $1 AND attempts = $2 AND state = 'pending'";

const ENDPOINT_SUCCESS: &str =
    "UPDATE webhook_endpoints SET failing_since = NULL, last_success_at = $2 WHERE id = $1";

const ENDPOINT_FAILURE: &str = "UPDATE webhook_endpoints \
    SET failing_since = COALESCE(failing_since, $2), last_failure_at = $2, last_failure = $3 \
    WHERE id = $1 AND disabled_at IS NULL RETURNING failing_since";

const DISABLE: &str = "UPDATE webhook_endpoints SET disabled_at = $2, disabled_reason = $3 \
    WHERE id = $1 AND disabled_at IS NULL";

/// A disabled endpoint's deliveries stop: its pending ones become dead letters.
const BURY: &str = "UPDATE webhook_deliveries \
    SET state = 'dead', last_error = COALESCE(last_error, 'endpoint disabled') \
    WHERE endpoint_id = $1 AND state = 'pending'";

/// Deliveries finished before `$1` (delivered, or dead letters), at most `$2` of them.
const PRUNE: &str = "DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM \
    webhook_deliveries WHERE state <> 'pending' AND last_attempt_at < $1 LIMIT $2)";

const BATCH_CHECKS: &str = "SELECT id, batch_id, tenant, queue FROM webhook_batch_checks \
    ORDER BY created_at LIMIT $1";

const UNFINISHED_IN_BATCH: &str = "SELECT count(*) FROM (SELECT 1 FROM sessions \
    WHERE batch_id = $1 AND status IN ('queued', 'running', 'waiting', 'awaiting_approval') \
    LIMIT 1) u";

const BATCH_ENDPOINTS: &str = "SELECT id FROM webhook_endpoints \
    WHERE tenant = $1 AND disabled_at IS NULL AND events LIKE '%,batch.completed,%' \
      AND (queue IS NULL OR queue = $2) AND (batch_id IS NULL OR batch_id = $3)";

/// Once per endpoint and batch (`dedupe`).
const ANNOUNCE_BATCH: &str = "INSERT INTO webhook_deliveries (id, endpoint_id, event, \
    batch_id, queue, dedupe, occurred_at, retry_from, next_attempt_at) \
    VALUES ($1, $2, 'batch.completed', $3, $4, $5, $6, $6, $6) \
    ON CONFLICT (endpoint_id, dedupe) DO NOTHING";

/// The statements whose text differs by dialect.
pub(crate) struct WebhookStatements {
    pub(crate) claim: String,
}

impl WebhookStatements {
    pub(crate) fn postgres() -> Self {
        WebhookStatements {
            claim: format!(
                "{}{DELIVERY_FIELDS}",
                CLAIM.replace("LOCK", "FOR UPDATE SKIP LOCKED")
            ),
        }
    }

    pub(crate) fn sqlite() -> Self {
        WebhookStatements {
            claim: format!("{}{DELIVERY_FIELDS}", CLAIM.replace(" LOCK", "")),
        }
    }
}

/// A `webhook_endpoints` row.
#[derive(Debug, FromRow)]
pub(crate) struct EndpointRecord {
    id: String,
    tenant: String,
    url: String,
    events: String,
    queue: Option<String>,
    batch_id: Option<String>,
    description: Option<String>,
    secret_salt: String,
    old_secret_salt: Option<String>,
    old_expires_at: Option<Stamp>,
    created_at: Stamp,
    disabled_at: Option<Stamp>,
    disabled_reason: Option<String>,
    failing_since: Option<Stamp>,
    last_failure_at: Option<Stamp>,
    last_failure: Option<String>,
    last_success_at: Option<Stamp>,
}

impl EndpointRecord {
    fn into_row(self) -> WebhookRow {
        WebhookRow {
            events: events_of_column(&self.events),
            id: self.id,
            tenant: self.tenant,
            url: self.url,
            queue: self.queue,
            batch_id: self.batch_id,
            description: self.description,
            secret_salt: self.secret_salt,
            old_secret_salt: self.old_secret_salt,
            old_expires_at: self.old_expires_at.map(|s| s.0),
            created_at: self.created_at.0,
            disabled_at: self.disabled_at.map(|s| s.0),
            disabled_reason: self.disabled_reason,
            failing_since: self.failing_since.map(|s| s.0),
            last_failure_at: self.last_failure_at.map(|s| s.0),
            last_failure: self.last_failure,
            last_success_at: self.last_success_at.map(|s| s.0),
        }
    }
}

/// A `webhook_deliveries` row.
#[derive(Debug, FromRow)]
pub(crate) struct DeliveryRecord {
    id: String,
    endpoint_id: String,
    event: String,
    session_id: Option<String>,
    batch_id: Option<String>,
    queue: Option<String>,
    status: Option<String>,
    finish_reason: Option<String>,
    held: Option<String>,
    occurred_at: Stamp,
    state: String,
    attempts: i32,
    retry_from: Stamp,
    next_attempt_at: Stamp,
    last_attempt_at: Option<Stamp>,
    last_status: Option<i32>,
    last_error: Option<String>,
    delivered_at: Option<Stamp>,
}

impl DeliveryRecord {
    fn into_row(self) -> Result<DeliveryRow> {
        let state = DeliveryState::parse(&self.state)
            .ok_or_else(|| bad_data(format!("unknown delivery state {:?}", self.state)))?;
        // The held calls are a JSON array of ids the worker wrote; anything else reads as
        // none (the event still goes out, without its calls).
        let held = self
            .held
            .as_deref()
            .and_then(|h| serde_json::from_str::<Vec<String>>(h).ok())
            .unwrap_or_default();
        Ok(DeliveryRow {
            attempts: to_u32(self.attempts, "attempts")?,
            last_status: self.last_status.and_then(|s| u16::try_from(s).ok()),
            id: self.id,
            endpoint_id: self.endpoint_id,
            event: self.event,
            session_id: self.session_id,
            batch_id: self.batch_id,
            queue: self.queue,
            status: self.status,
            finish_reason: self.finish_reason,
            held,
            occurred_at: self.occurred_at.0,
            state,
            retry_from: self.retry_from.0,
            next_attempt_at: self.next_attempt_at.0,
            last_attempt_at: self.last_attempt_at.map(|s| s.0),
            last_error: self.last_error,
            delivered_at: self.delivered_at.map(|s| s.0),
        })
    }
}

/// Add `new` unless its tenant has `max` endpoints already (false then).
pub(crate) async fn create<DB>(
    conn: &mut DB::Connection,
    new: &NewWebhook,
    max: u32,
) -> Result<bool>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = sqlx::query::<DB>(INSERT_ENDPOINT)
        .bind(new.id.as_str())
        .bind(new.tenant.as_str())
        .bind(new.url.as_str())
        .bind(events_column(&new.events))
        .bind(new.queue.as_deref())
        .bind(new.batch_id.as_deref())
        .bind(new.description.as_deref())
        .bind(new.secret_salt.as_str())
        .bind(At(new.created_at))
        .bind(i64::from(max))
        .execute(&mut *conn)
        .await?;
    Ok(done.affected() > 0)
}

/// The endpoint `id`, of any tenant.
pub(crate) async fn endpoint<DB>(conn: &mut DB::Connection, id: &str) -> Result<Option<WebhookRow>>
where
    DB: Database,
    for<'r> EndpointRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let sql = format!("SELECT {ENDPOINT_FIELDS} FROM webhook_endpoints WHERE id = $1");
    let rec = sqlx::query_as::<DB, EndpointRecord>(&sql)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(rec.map(EndpointRecord::into_row))
}

/// A tenant's endpoints, oldest first.
pub(crate) async fn endpoints<DB>(
    conn: &mut DB::Connection,
    tenant: &str,
) -> Result<Vec<WebhookRow>>
where
    DB: Database,
    for<'r> EndpointRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let sql =
        format!("SELECT {ENDPOINT_FIELDS} FROM webhook_endpoints WHERE tenant = $1 ORDER BY id");
    let recs = sqlx::query_as::<DB, EndpointRecord>(&sql)
        .bind(tenant)
        .fetch_all(&mut *conn)
        .await?;
    Ok(recs.into_iter().map(EndpointRecord::into_row).collect())
}

/// Delete endpoint `$1` (its deliveries with it).
pub(crate) const DELETE_ENDPOINT: &str = "DELETE FROM webhook_endpoints WHERE id = $1";

/// Enabled again, its failure streak forgotten (its history kept).
pub(crate) const ENABLE: &str = "UPDATE webhook_endpoints \
    SET disabled_at = NULL, disabled_reason = NULL, failing_since = NULL WHERE id = $1";

/// A new salt (`$3`); the current one signs too until `$2`.
const ROTATE: &str = "UPDATE webhook_endpoints \
    SET old_secret_salt = secret_salt, old_expires_at = $2, secret_salt = $3 WHERE id = $1";

/// The dead letters of endpoint `$1` queued again, retried for the full time from `$2`.
const REDRIVE: &str = "UPDATE webhook_deliveries \
    SET state = 'pending', retry_from = $2, next_attempt_at = $2, last_error = NULL \
    WHERE endpoint_id = $1 AND state = 'dead'";

/// Run `sql` on the row `id`, answering the rows it changed.
pub(crate) async fn exec<DB>(conn: &mut DB::Connection, sql: &str, id: &str) -> Result<u64>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = sqlx::query::<DB>(sql).bind(id).execute(&mut *conn).await?;
    Ok(done.affected())
}

/// Rotate endpoint `id`'s secret to `salt`, the old one signing until `old_until`.
pub(crate) async fn rotate<DB>(
    conn: &mut DB::Connection,
    id: &str,
    old_until: DateTime<Utc>,
    salt: &str,
) -> Result<bool>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = sqlx::query::<DB>(ROTATE)
        .bind(id)
        .bind(At(old_until))
        .bind(salt)
        .execute(&mut *conn)
        .await?;
    Ok(done.affected() > 0)
}

/// Queue endpoint `id`'s dead letters again at `now`; how many.
pub(crate) async fn redrive<DB>(
    conn: &mut DB::Connection,
    id: &str,
    now: DateTime<Utc>,
) -> Result<u64>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = sqlx::query::<DB>(REDRIVE)
        .bind(id)
        .bind(At(now))
        .execute(&mut *conn)
        .await?;
    Ok(done.affected())
}

/// Endpoint `id`'s deliveries per state.
pub(crate) async fn counts<DB>(conn: &mut DB::Connection, id: &str) -> Result<DeliveryCounts>
where
    DB: Database,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<(String, i64)> = sqlx::query_as::<DB, (String, i64)>(
        "SELECT state, count(*) FROM webhook_deliveries WHERE endpoint_id = $1 GROUP BY state",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let mut counts = DeliveryCounts::default();
    for (state, n) in rows {
        let n = u64::try_from(n).unwrap_or(0);
        match DeliveryState::parse(&state) {
            Some(DeliveryState::Pending) => counts.pending = n,
            Some(DeliveryState::Delivered) => counts.delivered = n,
            Some(DeliveryState::Dead) => counts.dead = n,
            None => {}
        }
    }
    Ok(counts)
}

/// Endpoint `id`'s deliveries newest first, in `state` (any when `None`), after `cursor`
/// (a delivery id of the previous page), at most `limit` ([`DeliveryRecord`]s: see
/// [`delivery_rows`]). Built per shape, so that each uses `webhook_deliveries_endpoint_idx`.
pub(crate) fn deliveries<'a, DB: Database>(
    id: &'a str,
    state: Option<DeliveryState>,
    cursor: Option<&'a str>,
    limit: u32,
) -> QueryBuilder<'a, DB>
where
    DB::Arguments<'a>: Default,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
{
    let mut qb = QueryBuilder::new(format!(
        "SELECT {DELIVERY_FIELDS} FROM webhook_deliveries WHERE endpoint_id = "
    ));
    qb.push_bind(id);
    if let Some(s) = state {
        qb.push(" AND state = ").push_bind(s.as_str());
    }
    if let Some(c) = cursor {
        qb.push(" AND id < ").push_bind(c);
    }
    qb.push(" ORDER BY id DESC LIMIT ")
        .push_bind(i64::from(limit));
    qb
}

/// The deliveries of a listing's records.
pub(crate) fn delivery_rows(recs: Vec<DeliveryRecord>) -> Result<Vec<DeliveryRow>> {
    recs.into_iter().map(DeliveryRecord::into_row).collect()
}

/// Claim up to `limit` due deliveries at `now`, each leased for `lease`.
pub(crate) async fn claim<DB>(
    conn: &mut DB::Connection,
    sql: &WebhookStatements,
    now: DateTime<Utc>,
    lease: Duration,
    limit: u32,
) -> Result<Vec<DeliveryRow>>
where
    DB: Database,
    for<'r> DeliveryRecord: FromRow<'r, DB::Row>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let until = chrono::Duration::from_std(lease)
        .ok()
        .and_then(|l| now.checked_add_signed(l))
        .unwrap_or(now);
    let recs = sqlx::query_as::<DB, DeliveryRecord>(&sql.claim)
        .bind(At(now))
        .bind(At(until))
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
    recs.into_iter().map(DeliveryRecord::into_row).collect()
}

/// Record what the attempt of `d` (as claimed) did, and what it means for its endpoint,
/// in one transaction (`conn` is in it).
pub(crate) async fn record<DB>(
    conn: &mut DB::Connection,
    d: &DeliveryRow,
    now: DateTime<Utc>,
    outcome: &AttemptOutcome,
    rule: &RetryRule,
) -> Result<Recorded>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'r> (Stamp,): FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> Option<At>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i32>: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut rec = Recorded::default();
    match outcome {
        AttemptOutcome::Delivered { status } => {
            let done = sqlx::query::<DB>(DELIVERED)
                .bind(d.id.as_str())
                .bind(i64::from(d.attempts))
                .bind(At(now))
                .bind(Some(i32::from(*status)))
                .execute(&mut *conn)
                .await?;
            rec.recorded = done.affected() > 0;
            sqlx::query::<DB>(ENDPOINT_SUCCESS)
                .bind(d.endpoint_id.as_str())
                .bind(At(now))
                .execute(&mut *conn)
                .await?;
        }
        AttemptOutcome::Failed { status, error } => {
            let dead = rule.next_attempt_at.is_none();
            let done = sqlx::query::<DB>(FAILED)
                .bind(d.id.as_str())
                .bind(i64::from(d.attempts))
                .bind(status.map(i32::from))
                .bind(Some(error.as_str()))
                .bind(At(rule.next_attempt_at.unwrap_or(now)))
                .bind(dead)
                .execute(&mut *conn)
                .await?;
            rec.recorded = done.affected() > 0;
            rec.dead = rec.recorded && dead;
            rec.disabled = fail_endpoint::<DB>(conn, &d.endpoint_id, now, error, rule).await?;
        }
    }
    Ok(rec)
}

/// Note a failure on the endpoint; disable it (and bury its pending deliveries) once it
/// has failed continuously for `rule.disable_after`. Whether this disabled it.
async fn fail_endpoint<DB>(
    conn: &mut DB::Connection,
    id: &str,
    now: DateTime<Utc>,
    error: &str,
    rule: &RetryRule,
) -> Result<bool>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'r> (Stamp,): FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let since = sqlx::query_as::<DB, (Stamp,)>(ENDPOINT_FAILURE)
        .bind(id)
        .bind(At(now))
        .bind(error)
        .fetch_optional(&mut *conn)
        .await?;
    let Some((since,)) = since else {
        return Ok(false);
    };
    let limit = chrono::Duration::from_std(rule.disable_after).unwrap_or(chrono::Duration::MAX);
    if now.signed_duration_since(since.0) < limit {
        return Ok(false);
    }
    let reason = format!(
        "every delivery failed since {} (the last: {error})",
        since.0.to_rfc3339()
    );
    disable::<DB>(conn, id, now, &reason).await
}

/// Disable the endpoint (unless it is) and bury its pending deliveries. Whether this
/// disabled it.
pub(crate) async fn disable<DB>(
    conn: &mut DB::Connection,
    id: &str,
    now: DateTime<Utc>,
    reason: &str,
) -> Result<bool>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let disabled = sqlx::query::<DB>(DISABLE)
        .bind(id)
        .bind(At(now))
        .bind(reason)
        .execute(&mut *conn)
        .await?
        .affected()
        > 0;
    if disabled {
        sqlx::query::<DB>(BURY).bind(id).execute(&mut *conn).await?;
    }
    Ok(disabled)
}

/// Delete up to `limit` deliveries that finished before `before`.
pub(crate) async fn prune<DB>(
    conn: &mut DB::Connection,
    before: DateTime<Utc>,
    limit: u32,
) -> Result<u64>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = sqlx::query::<DB>(PRUNE)
        .bind(At(before))
        .bind(i64::from(limit))
        .execute(&mut *conn)
        .await?;
    Ok(done.affected())
}

/// A batch check the triggers left: (check id, batch id, tenant, queue).
pub(crate) type BatchCheck = (String, String, String, String);

/// Up to `limit` batch checks, oldest first.
pub(crate) async fn batch_checks<DB>(
    conn: &mut DB::Connection,
    limit: u32,
) -> Result<Vec<BatchCheck>>
where
    DB: Database,
    for<'r> BatchCheck: FromRow<'r, DB::Row>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    Ok(sqlx::query_as::<DB, BatchCheck>(BATCH_CHECKS)
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?)
}

/// Settle one batch check: if its batch has no unfinished session left, announce
/// `batch.completed` to each matching endpoint (once per endpoint and batch); then the
/// check is deleted either way (a later finish leaves its own). How many announcements
/// were written.
pub(crate) async fn settle_check<DB>(
    conn: &mut DB::Connection,
    check: &BatchCheck,
    now: DateTime<Utc>,
) -> Result<u64>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'r> (i64,): FromRow<'r, DB::Row>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let (check_id, batch, tenant, queue) = check;
    let (unfinished,) = sqlx::query_as::<DB, (i64,)>(UNFINISHED_IN_BATCH)
        .bind(batch.as_str())
        .fetch_one(&mut *conn)
        .await?;
    let mut announced = 0;
    if unfinished == 0 {
        let endpoints = sqlx::query_as::<DB, (String,)>(BATCH_ENDPOINTS)
            .bind(tenant.as_str())
            .bind(queue.as_str())
            .bind(batch.as_str())
            .fetch_all(&mut *conn)
            .await?;
        for (endpoint,) in endpoints {
            announced += sqlx::query::<DB>(ANNOUNCE_BATCH)
                .bind(message_id(now))
                .bind(endpoint.as_str())
                .bind(batch.as_str())
                .bind(queue.as_str())
                .bind(format!("batch.completed:{batch}"))
                .bind(At(now))
                .execute(&mut *conn)
                .await?
                .affected();
        }
    }
    sqlx::query::<DB>("DELETE FROM webhook_batch_checks WHERE id = $1")
        .bind(check_id.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(announced)
}

/// A delivery id as the triggers make them: `msg_`, the time in hex microseconds (so ids
/// sort by time), and 128 random bits.
fn message_id(now: DateTime<Utc>) -> String {
    format!(
        "msg_{:014x}{}",
        now.timestamp_micros().max(0),
        uuid::Uuid::new_v4().simple()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_locks_on_postgres_only() {
        assert!(
            WebhookStatements::postgres()
                .claim
                .contains("FOR UPDATE SKIP LOCKED")
        );
        let lite = WebhookStatements::sqlite().claim;
        assert!(!lite.contains("LOCK"), "{lite}");
        assert!(lite.contains("LIMIT $3)"), "{lite}");
    }
}
