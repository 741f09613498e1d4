//! Schedules' statements, rows and writes, shared by both stores (generic over the
//! database): `schedules` and the history of their fires (`schedule_fires`).
//!
//! Every time is bound by the caller (the fire loop's clock is injected). A claim leases a
//! due schedule to one claimer (a fresh token until `lease_until`); what the claimer
//! records is fenced by that token, so a claimer whose lease passed (it stalled, or was
//! killed and another took over) records nothing. The only dialect difference is the
//! claim's row lock (Postgres' `FOR UPDATE SKIP LOCKED`; SQLite has one writer at a time).

use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::error::Result;
use crate::rowconv::{bad_data, to_i64, to_u64};
use crate::schedule::{Advance, FireOutcome, FireRow, NewSchedule, Overlap, ScheduleRow};

use super::record::Stamp;
use super::webhooks::{Affected, At};

const FIELDS: &str = "id, tenant, cron, timezone, every_secs, template, overlap, \
    catchup_window_secs, description, paused, next_fire_at, buffered_fire_at, \
    last_session_id, lease_token, lease_until, claimed_at, created_at";

const FIRE_FIELDS: &str = "schedule_id, fire_time, outcome, session_id, cancelled_session_id, \
    error, manual, recorded_at";

const INSERT: &str = "INSERT INTO schedules (id, tenant, cron, timezone, every_secs, template, \
    overlap, catchup_window_secs, description, paused, next_fire_at, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// Due (`next_fire_at` passed, or a buffered fire waiting) and not leased by anyone else:
/// leased to token `$3` until `$2`. `claimed_at` is the claim's time, but a takeover (a
/// lease left by a claimer that died) keeps the dead claimer's.
const CLAIM: &str = "UPDATE schedules SET lease_token = $3, lease_until = $2, \
    claimed_at = CASE WHEN lease_token IS NULL THEN $1 ELSE claimed_at END \
    WHERE id IN (SELECT id FROM schedules \
        WHERE NOT paused AND (next_fire_at <= $1 OR buffered_fire_at IS NOT NULL) \
          AND (lease_until IS NULL OR lease_until <= $1) \
        ORDER BY next_fire_at LIMIT $4 LOCK) \
    RETURNING ";

/// Schedule `$4` whether due or not (a trigger), unless another claimer holds it.
const CLAIM_ONE: &str = "UPDATE schedules SET lease_token = $3, lease_until = $2, \
    claimed_at = CASE WHEN lease_token IS NULL THEN $1 ELSE claimed_at END \
    WHERE id = $4 AND (lease_until IS NULL OR lease_until <= $1) \
    RETURNING ";

/// The claimer of token `$2` is done: where the schedule stands now, the lease freed.
const ADVANCE: &str = "UPDATE schedules SET next_fire_at = $3, buffered_fire_at = $4, \
    last_session_id = $5, lease_token = NULL, lease_until = NULL \
    WHERE id = $1 AND lease_token = $2";

/// A fire recorded once per (schedule, fire time); a buffered one becomes what it did.
const RECORD_FIRE: &str = "INSERT INTO schedule_fires (schedule_id, fire_time, outcome, \
    session_id, cancelled_session_id, error, manual, recorded_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
    ON CONFLICT (schedule_id, fire_time) DO UPDATE SET outcome = excluded.outcome, \
    session_id = excluded.session_id, cancelled_session_id = excluded.cancelled_session_id, \
    error = excluded.error, recorded_at = excluded.recorded_at";

/// Paused (`$2`) or resumed; a resumed one's next fire is `$3` (fires while paused are
/// not caught up), its waiting buffered fire dropped on pause.
const SET_PAUSED: &str = "UPDATE schedules SET paused = $2, next_fire_at = $3, \
    buffered_fire_at = CASE WHEN $2 THEN NULL ELSE buffered_fire_at END WHERE id = $1";

/// Delete schedule `$1` (its history with it).
pub(crate) const DELETE: &str = "DELETE FROM schedules WHERE id = $1";

/// The statements whose text differs by dialect.
pub(crate) struct ScheduleStatements {
    pub(crate) claim: String,
    pub(crate) claim_one: String,
}

impl ScheduleStatements {
    pub(crate) fn postgres() -> Self {
        ScheduleStatements {
            claim: format!(
                "{}{FIELDS}",
                CLAIM.replace("LOCK", "FOR UPDATE SKIP LOCKED")
            ),
            claim_one: format!("{CLAIM_ONE}{FIELDS}"),
        }
    }

    pub(crate) fn sqlite() -> Self {
        ScheduleStatements {
            claim: format!("{}{FIELDS}", CLAIM.replace(" LOCK", "")),
            claim_one: format!("{CLAIM_ONE}{FIELDS}"),
        }
    }
}

/// A `schedules` row.
#[derive(Debug, FromRow)]
pub(crate) struct ScheduleRecord {
    id: String,
    tenant: String,
    cron: Option<String>,
    timezone: String,
    every_secs: Option<i64>,
    template: String,
    overlap: String,
    catchup_window_secs: i64,
    description: Option<String>,
    paused: bool,
    next_fire_at: Stamp,
    buffered_fire_at: Option<Stamp>,
    last_session_id: Option<String>,
    lease_token: Option<String>,
    lease_until: Option<Stamp>,
    claimed_at: Option<Stamp>,
    created_at: Stamp,
}

impl ScheduleRecord {
    fn into_row(self) -> Result<ScheduleRow> {
        let overlap = Overlap::parse(&self.overlap)
            .ok_or_else(|| bad_data(format!("unknown overlap policy {:?}", self.overlap)))?;
        Ok(ScheduleRow {
            every_secs: self
                .every_secs
                .map(|s| to_u64(s, "every_secs"))
                .transpose()?,
            catchup_window_secs: to_u64(self.catchup_window_secs, "catchup_window_secs")?,
            overlap,
            id: self.id,
            tenant: self.tenant,
            cron: self.cron,
            timezone: self.timezone,
            template: self.template,
            description: self.description,
            paused: self.paused,
            next_fire_at: self.next_fire_at.0,
            buffered_fire_at: self.buffered_fire_at.map(|s| s.0),
            last_session_id: self.last_session_id,
            lease_token: self.lease_token,
            lease_until: self.lease_until.map(|s| s.0),
            claimed_at: self.claimed_at.map(|s| s.0),
            created_at: self.created_at.0,
        })
    }
}

/// A `schedule_fires` row.
#[derive(Debug, FromRow)]
pub(crate) struct FireRecord {
    schedule_id: String,
    fire_time: Stamp,
    outcome: String,
    session_id: Option<String>,
    cancelled_session_id: Option<String>,
    error: Option<String>,
    manual: bool,
    recorded_at: Stamp,
}

impl FireRecord {
    fn into_row(self) -> Result<FireRow> {
        let outcome = FireOutcome::parse(&self.outcome)
            .ok_or_else(|| bad_data(format!("unknown fire outcome {:?}", self.outcome)))?;
        Ok(FireRow {
            schedule_id: self.schedule_id,
            fire_time: self.fire_time.0,
            outcome,
            session_id: self.session_id,
            cancelled_session_id: self.cancelled_session_id,
            error: self.error,
            manual: self.manual,
            recorded_at: self.recorded_at.0,
        })
    }
}

fn rows(recs: Vec<ScheduleRecord>) -> Result<Vec<ScheduleRow>> {
    recs.into_iter().map(ScheduleRecord::into_row).collect()
}

/// Add schedule `new`.
pub(crate) async fn create<DB>(conn: &mut DB::Connection, new: &NewSchedule) -> Result<()>
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let every = new
        .every_secs
        .map(|s| to_i64(s, "every_secs"))
        .transpose()?;
    sqlx::query::<DB>(INSERT)
        .bind(new.id.as_str())
        .bind(new.tenant.as_str())
        .bind(new.cron.as_deref())
        .bind(new.timezone.as_str())
        .bind(every)
        .bind(new.template.as_str())
        .bind(new.overlap.as_str())
        .bind(to_i64(new.catchup_window_secs, "catchup_window_secs")?)
        .bind(new.description.as_deref())
        .bind(new.paused)
        .bind(At(new.next_fire_at))
        .bind(At(new.created_at))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The schedule `id`, of any tenant.
pub(crate) async fn one<DB>(conn: &mut DB::Connection, id: &str) -> Result<Option<ScheduleRow>>
where
    DB: Database,
    for<'r> ScheduleRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let sql = format!("SELECT {FIELDS} FROM schedules WHERE id = $1");
    let rec = sqlx::query_as::<DB, ScheduleRecord>(&sql)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    rec.map(ScheduleRecord::into_row).transpose()
}

/// A tenant's schedules by id, after `after` (an id), at most `limit`.
pub(crate) async fn list<DB>(
    conn: &mut DB::Connection,
    tenant: &str,
    after: Option<&str>,
    limit: u32,
) -> Result<Vec<ScheduleRow>>
where
    DB: Database,
    for<'r> ScheduleRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let sql = format!(
        "SELECT {FIELDS} FROM schedules WHERE tenant = $1 AND id > $2 ORDER BY id LIMIT $3"
    );
    let recs = sqlx::query_as::<DB, ScheduleRecord>(&sql)
        .bind(tenant)
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
    rows(recs)
}

/// Pause (or resume, the next fire at `next_fire_at`) schedule `id`; false when none.
pub(crate) async fn set_paused<DB>(
    conn: &mut DB::Connection,
    id: &str,
    paused: bool,
    next_fire_at: DateTime<Utc>,
) -> Result<bool>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = sqlx::query::<DB>(SET_PAUSED)
        .bind(id)
        .bind(paused)
        .bind(At(next_fire_at))
        .execute(&mut *conn)
        .await?;
    Ok(done.affected() > 0)
}

/// Lease up to `limit` schedules due at `now` (or one, `id`, due or not) to `token`
/// until `until`.
pub(crate) async fn claim<DB>(
    conn: &mut DB::Connection,
    sql: &str,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
    token: &str,
    which: Which<'_>,
) -> Result<Vec<ScheduleRow>>
where
    DB: Database,
    for<'r> ScheduleRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let q = sqlx::query_as::<DB, ScheduleRecord>(sql)
        .bind(At(now))
        .bind(At(until))
        .bind(token);
    let q = match which {
        Which::Due(limit) => q.bind(i64::from(limit)),
        Which::One(id) => q.bind(id),
    };
    rows(q.fetch_all(&mut *conn).await?)
}

/// What a claim takes: up to n due schedules, or one by id.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Which<'a> {
    Due(u32),
    One(&'a str),
}

/// Record `fires` of schedule `id` and where it stands (`advance`), as the holder of
/// lease `token`; false (nothing written) when that lease is no longer held. `conn` is in
/// a transaction.
pub(crate) async fn record<DB>(
    conn: &mut DB::Connection,
    id: &str,
    token: &str,
    fires: &[FireRow],
    advance: &Advance,
) -> Result<bool>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> Option<At>: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let held = sqlx::query::<DB>(ADVANCE)
        .bind(id)
        .bind(token)
        .bind(At(advance.next_fire_at))
        .bind(advance.buffered_fire_at.map(At))
        .bind(advance.last_session_id.as_deref())
        .execute(&mut *conn)
        .await?;
    if held.affected() == 0 {
        return Ok(false);
    }
    for f in fires {
        sqlx::query::<DB>(RECORD_FIRE)
            .bind(id)
            .bind(At(f.fire_time))
            .bind(f.outcome.as_str())
            .bind(f.session_id.as_deref())
            .bind(f.cancelled_session_id.as_deref())
            .bind(f.error.as_deref())
            .bind(f.manual)
            .bind(At(f.recorded_at))
            .execute(&mut *conn)
            .await?;
    }
    Ok(true)
}

/// Schedule `id`'s fires newest first, before `before` (a fire time), at most `limit`.
pub(crate) async fn fires<DB>(
    conn: &mut DB::Connection,
    id: &str,
    before: Option<DateTime<Utc>>,
    limit: u32,
) -> Result<Vec<FireRow>>
where
    DB: Database,
    for<'r> FireRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let sql = format!(
        "SELECT {FIRE_FIELDS} FROM schedule_fires WHERE schedule_id = $1 AND fire_time < $2 \
         ORDER BY fire_time DESC LIMIT $3"
    );
    let recs = sqlx::query_as::<DB, FireRecord>(&sql)
        .bind(id)
        .bind(At(before.unwrap_or(DateTime::<Utc>::MAX_UTC)))
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
    recs.into_iter().map(FireRecord::into_row).collect()
}
