//! What the routes of `/v1/schedules` do with schedules: check a new one (each refusal
//! names its field; the session template is checked by the code that checks `POST
//! /v1/sessions`, its fields named under `session.`), find one of the caller's (another
//! tenant's is a 404), and show one.

use serde_json::Value;

use agentq_api::{
    CreateSchedule, DEFAULT_CATCHUP_WINDOW_SECS, FireOutcomeView, FireView,
    MAX_CATCHUP_WINDOW_SECS, MAX_SCHEDULE_DESCRIPTION, ScheduleOverlap, ScheduleView,
};
use agentq_core::auth::Caller;
use agentq_core::schedule::{FireOutcome, FireRow, NewSchedule, Overlap, ScheduleRow};

use crate::actions::limits;
use crate::error::ApiError;
use crate::http::ApiResult;
use crate::inputs::Sources;
use crate::request::{check_policy, parse_session};
use crate::state::Scheduler;

use super::timing::Timing;

/// Longest id a schedule may have in a request (bytes).
const MAX_ID: usize = 128;
/// The prefix the template's fields are named under.
pub(crate) const TEMPLATE: &str = "session";

/// Check a creation request and make the schedule, its first fire after `now`.
pub(crate) async fn new_schedule(
    s: &Scheduler,
    caller: &Caller,
    body: CreateSchedule,
    now: chrono::DateTime<chrono::Utc>,
) -> ApiResult<NewSchedule> {
    let CreateSchedule {
        cron,
        timezone,
        every_secs,
        session,
        overlap,
        catchup_window_secs,
        description,
        paused,
    } = body;
    let timing = Timing::parse(cron.as_deref(), timezone.as_deref(), every_secs)
        .map_err(|r| ApiError::invalid(r.field, r.message))?;
    check_template(s, caller, &session).await?;
    let catchup = catchup_window_secs.unwrap_or(DEFAULT_CATCHUP_WINDOW_SECS);
    if catchup > MAX_CATCHUP_WINDOW_SECS {
        return Err(ApiError::invalid(
            "catchup_window_secs",
            format!("must be from 0 to {MAX_CATCHUP_WINDOW_SECS}, not {catchup}"),
        ));
    }
    if let Some(d) = &description
        && (d.len() > MAX_SCHEDULE_DESCRIPTION || d.contains('\0'))
    {
        return Err(ApiError::invalid(
            "description",
            format!("must be at most {MAX_SCHEDULE_DESCRIPTION} bytes, without NUL"),
        ));
    }
    let next_fire_at = timing
        .next_after(now)
        .ok_or_else(|| ApiError::invalid("cron", "the expression never matches a time"))?;
    Ok(NewSchedule {
        id: format!("sch_{}", uuid::Uuid::now_v7().simple()),
        tenant: caller.tenant.clone(),
        cron,
        timezone: timing.zone_name().to_string(),
        every_secs,
        template: session.to_string(),
        overlap: overlap_of(overlap.unwrap_or_default()),
        catchup_window_secs: catchup,
        description,
        paused: paused.unwrap_or(false),
        next_fire_at,
        created_at: now,
    })
}

/// The template is a session request as `POST /v1/sessions` checks it, with the
/// caller's policy of now; each fire checks it again (the policy may change). Its
/// `idempotency_key` is each fire's own.
async fn check_template(s: &Scheduler, caller: &Caller, session: &Value) -> ApiResult<()> {
    if session.is_null() {
        return Err(ApiError::invalid(
            TEMPLATE,
            "is required: the session each fire creates",
        ));
    }
    if session.get("idempotency_key").is_some() {
        return Err(ApiError::invalid(
            format!("{TEMPLATE}.idempotency_key"),
            "is made by each fire (from the schedule and the fire time); leave it out",
        ));
    }
    let mut req = parse_session(session.clone(), &limits(s, caller), TEMPLATE)?;
    check_policy(&mut req, s.cfg.policy.for_tenant(&caller.tenant), TEMPLATE)?;
    s.queues()
        .check_known(s.store.as_ref(), &req.queue, &format!("{TEMPLATE}.queue"))
        .await?;
    Sources::default().check(s, caller, &req, TEMPLATE).await?;
    Ok(())
}

/// The caller's schedule `id` (any tenant's for an admin); a 404 otherwise, the same as
/// for one that does not exist.
pub(crate) async fn schedule_of(
    s: &Scheduler,
    caller: &Caller,
    id: &str,
) -> ApiResult<ScheduleRow> {
    let not_found = || ApiError::NotFound(format!("schedule {id} not found"));
    if id.len() > MAX_ID || id.contains('\0') {
        return Err(not_found());
    }
    match s.store.schedule(id).await? {
        Some(row) if caller.is_admin() || row.tenant == caller.tenant => Ok(row),
        _ => Err(not_found()),
    }
}

pub(crate) fn overlap_of(o: ScheduleOverlap) -> Overlap {
    match o {
        ScheduleOverlap::Skip => Overlap::Skip,
        ScheduleOverlap::BufferOne => Overlap::BufferOne,
        ScheduleOverlap::CancelOther => Overlap::CancelOther,
        ScheduleOverlap::AllowAll => Overlap::AllowAll,
    }
}

fn overlap_view(o: Overlap) -> ScheduleOverlap {
    match o {
        Overlap::Skip => ScheduleOverlap::Skip,
        Overlap::BufferOne => ScheduleOverlap::BufferOne,
        Overlap::CancelOther => ScheduleOverlap::CancelOther,
        Overlap::AllowAll => ScheduleOverlap::AllowAll,
    }
}

/// A schedule as the API shows it.
pub(crate) fn view_of(row: ScheduleRow) -> ScheduleView {
    ScheduleView {
        // Stored from a checked JSON value; an unreadable one shows as null.
        session: serde_json::from_str(&row.template).unwrap_or(Value::Null),
        overlap: overlap_view(row.overlap),
        id: row.id,
        cron: row.cron,
        timezone: row.timezone,
        every_secs: row.every_secs,
        catchup_window_secs: row.catchup_window_secs,
        description: row.description,
        paused: row.paused,
        next_fire_at: row.next_fire_at,
        buffered_fire_at: row.buffered_fire_at,
        last_session_id: row.last_session_id,
        created_at: row.created_at,
    }
}

/// A fire as the API shows it.
pub(crate) fn fire_view(f: FireRow) -> FireView {
    FireView {
        fire_time: f.fire_time,
        outcome: match f.outcome {
            FireOutcome::Started => FireOutcomeView::Started,
            FireOutcome::Skipped => FireOutcomeView::Skipped,
            FireOutcome::Buffered => FireOutcomeView::Buffered,
            FireOutcome::Missed => FireOutcomeView::Missed,
            FireOutcome::Failed => FireOutcomeView::Failed,
        },
        session_id: f.session_id,
        cancelled_session_id: f.cancelled_session_id,
        error: f.error,
        manual: f.manual,
        recorded_at: f.recorded_at,
    }
}
