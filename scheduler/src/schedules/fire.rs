//! The fire loop: every scheduler process runs one. It claims due schedules with a lease
//! in the store (so a fire happens in one process however many run), and for each fire
//! time due creates the template's session through the path of `POST /v1/sessions`
//! (the tenant's policy of now applies), with an idempotency key made of the schedule and
//! the fire time, then records the fire and the schedule's next time under the lease.
//!
//! A claimer killed between creating a session and recording its fire leaves the
//! schedule leased, its next fire time unmoved: once the lease ends the next claimer
//! fires the same time again, and the idempotency key answers the session already made,
//! so that fire has exactly one session, recorded once.
//!
//! Time comes from a [`Clock`], so tests move it instead of waiting; the loop's own
//! pauses between polls are tokio's.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use agentq_core::auth::{Caller, Scope};
use agentq_core::schedule::{Advance, FireOutcome, FireRow, Overlap, ScheduleRow};

use crate::actions::{cancel_session, create_session};
use crate::error::ApiError;
use crate::settings::FireSettings;
use crate::state::Scheduler;
use crate::webhooks::Clock;

use super::timing::Timing;

/// Schedules claimed per pass.
const CLAIM_BATCH: u32 = 50;
/// Fire times handled per schedule and claim; more are left for the next pass.
const FIRES_PER_CLAIM: usize = 100;
/// Missed fire times stepped over one by one before jumping to the catch-up window.
const MAX_STEPS: usize = 1_000;
/// The longest error text kept with a fire.
const MAX_ERROR_CHARS: usize = 500;

/// Called after a fire's session was created and before the fire is recorded (tests:
/// answering true stops the claimer there, as a process killed at that moment would).
pub type FaultHook = Arc<dyn Fn(&str, DateTime<Utc>) -> bool + Send + Sync>;

/// A claimer that stopped where the fault hook said (as if killed).
#[derive(Debug)]
struct Killed;

/// The fire loop of one process. Cheap to clone.
#[derive(Clone)]
pub struct Firer {
    s: Scheduler,
    clock: Arc<dyn Clock>,
    times: FireSettings,
    fault: Option<FaultHook>,
}

impl Firer {
    /// The fire loop of scheduler `s`, polling and leasing as its settings say.
    pub fn new(s: Scheduler, clock: Arc<dyn Clock>) -> Self {
        let times = s.cfg.schedules;
        Firer {
            s,
            clock,
            times,
            fault: None,
        }
    }

    /// With a fault hook (see [`FaultHook`]).
    pub fn with_fault(mut self, hook: FaultHook) -> Self {
        self.fault = Some(hook);
        self
    }

    /// Fire until `cancel`; a pass in progress ends first (each is bounded by the store's
    /// statements; a fire cut short is taken over once its lease ends).
    pub async fn run(self, cancel: CancellationToken) {
        while !cancel.is_cancelled() {
            let claimed = match self.tick().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "schedule fire pass failed; retrying");
                    0
                }
            };
            let pause = if claimed == CLAIM_BATCH as usize {
                Duration::from_millis(10)
            } else {
                self.times.poll
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One pass: claim the due schedules and fire each (tests drive the loop with it).
    /// How many schedules it claimed.
    pub async fn tick(&self) -> agentq_core::Result<usize> {
        let now = self.clock.now();
        let token = uuid::Uuid::now_v7().simple().to_string();
        let until = self.lease_end(now);
        let rows = self
            .s
            .store
            .claim_schedules(now, until, &token, CLAIM_BATCH)
            .await?;
        let n = rows.len();
        for row in rows {
            let id = row.id.clone();
            if let Err(e) = self.handle(row, &token, now).await {
                // The lease stays until it ends; then a pass takes the schedule again.
                tracing::warn!(schedule_id = %id, error = %e, "schedule fire failed; retrying");
            }
        }
        Ok(n)
    }

    /// Fire schedule `row` now, whatever its times (`POST /v1/schedules/{id}/trigger`):
    /// the fire as recorded, or `None` when another claimer holds it at the moment.
    pub(crate) async fn trigger(&self, row: &ScheduleRow) -> Result<Option<FireRow>, ApiError> {
        let now = self.clock.now();
        let token = uuid::Uuid::now_v7().simple().to_string();
        let Some(row) = self
            .s
            .store
            .claim_schedule(&row.id, now, self.lease_end(now), &token)
            .await?
        else {
            return Ok(None);
        };
        let mut adv = advance_of(&row);
        let fire = self
            .fire(&row, now, true, &mut adv)
            .await
            .map_err(|e| e.into_api())?;
        if !self
            .s
            .store
            .record_fires(&row.id, &token, std::slice::from_ref(&fire), &adv)
            .await?
        {
            return Ok(None);
        }
        Ok(Some(fire))
    }

    /// Everything due of one claimed schedule: a buffered fire whose turn came, then the
    /// fire times passed (those older than the catch-up window recorded as missed).
    async fn handle(
        &self,
        row: ScheduleRow,
        token: &str,
        now: DateTime<Utc>,
    ) -> Result<(), Failed> {
        let timing = Timing::parse(
            row.cron.as_deref(),
            row.cron.as_ref().map(|_| row.timezone.as_str()),
            row.every_secs,
        )
        .map_err(|r| Failed::Data(format!("schedule {}: {}: {}", row.id, r.field, r.message)))?;
        let mut adv = advance_of(&row);
        let mut fires = Vec::new();
        if let Some(at) = adv.buffered_fire_at
            && !self.running(adv.last_session_id.as_deref()).await?
        {
            adv.buffered_fire_at = None;
            fires.push(self.start(&row, at, false, None, &mut adv).await?);
        }
        let window = chrono::Duration::seconds(
            i64::try_from(row.catchup_window_secs).unwrap_or(i64::MAX / 1_000_000),
        );
        // Lateness is judged at the claim's time: a claimer taking over from one that died
        // mid-claim judges as that one did (a fire it started is not "missed" for having
        // waited out its lease).
        let since = row.claimed_at.unwrap_or(now).min(now);
        let mut t = row.next_fire_at;
        let mut steps = 0;
        while t <= now && fires.len() < FIRES_PER_CLAIM {
            steps += 1;
            if since.signed_duration_since(t) > window {
                if steps > MAX_STEPS {
                    // Long downtime: step to the window at once.
                    t = timing
                        .next_after(since - window - chrono::Duration::microseconds(1))
                        .unwrap_or(DateTime::<Utc>::MAX_UTC);
                    continue;
                }
                fires.push(fire_row(&row.id, t, FireOutcome::Missed, now, false));
            } else {
                fires.push(self.fire(&row, t, false, &mut adv).await?);
            }
            t = timing.next_after(t).unwrap_or(DateTime::<Utc>::MAX_UTC);
        }
        adv.next_fire_at = t;
        if !self
            .s
            .store
            .record_fires(&row.id, token, &fires, &adv)
            .await?
        {
            tracing::warn!(schedule_id = %row.id, "schedule lease lost before its fires were recorded");
        }
        Ok(())
    }

    /// One fire at `t`, as the schedule's overlap policy says.
    async fn fire(
        &self,
        row: &ScheduleRow,
        t: DateTime<Utc>,
        manual: bool,
        adv: &mut Advance,
    ) -> Result<FireRow, Failed> {
        let now = self.clock.now();
        if row.overlap == Overlap::AllowAll || !self.running(adv.last_session_id.as_deref()).await?
        {
            return self.start(row, t, manual, None, adv).await;
        }
        match row.overlap {
            Overlap::Skip | Overlap::AllowAll => {
                Ok(fire_row(&row.id, t, FireOutcome::Skipped, now, manual))
            }
            Overlap::BufferOne if adv.buffered_fire_at.is_none() => {
                adv.buffered_fire_at = Some(t);
                Ok(fire_row(&row.id, t, FireOutcome::Buffered, now, manual))
            }
            Overlap::BufferOne => Ok(fire_row(&row.id, t, FireOutcome::Skipped, now, manual)),
            Overlap::CancelOther => {
                let other = adv.last_session_id.clone();
                if let Some(id) = &other {
                    cancel_session(&self.s, &owner(row), id)
                        .await
                        .map_err(Failed::Api)?;
                }
                self.start(row, t, manual, other, adv).await
            }
        }
    }

    /// Create the session of the fire at `t`: the template with the fire's idempotency
    /// key, through the path of `POST /v1/sessions` as the schedule's tenant. A refusal
    /// (the policy changed, a queue was removed) is the fire's outcome; an outage is an
    /// error, and the fire is tried again.
    async fn start(
        &self,
        row: &ScheduleRow,
        t: DateTime<Utc>,
        manual: bool,
        cancelled: Option<String>,
        adv: &mut Advance,
    ) -> Result<FireRow, Failed> {
        let mut body: Value = serde_json::from_str(&row.template)
            .map_err(|e| Failed::Data(format!("schedule {}: template: {e}", row.id)))?;
        if let Value::Object(m) = &mut body {
            m.insert(
                "idempotency_key".into(),
                Value::String(fire_key(&row.id, t)),
            );
        }
        let now = self.clock.now();
        let mut fire = fire_row(&row.id, t, FireOutcome::Started, now, manual);
        fire.cancelled_session_id = cancelled;
        match create_session(&self.s, &owner(row), body).await {
            Ok(created) => {
                if let Some(hook) = &self.fault
                    && hook(&row.id, t)
                {
                    return Err(Failed::Killed(Killed));
                }
                adv.last_session_id = Some(created.session.id.clone());
                fire.session_id = Some(created.session.id);
                Ok(fire)
            }
            Err(e) if is_refusal(&e) => {
                fire.outcome = FireOutcome::Failed;
                let mut msg = e.to_string();
                if let Some(field) = refused_field(&e) {
                    msg = format!("{field}: {msg}");
                }
                fire.error = Some(msg.chars().take(MAX_ERROR_CHARS).collect());
                Ok(fire)
            }
            Err(e) => Err(Failed::Api(e)),
        }
    }

    fn lease_end(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        chrono::Duration::from_std(self.times.lease)
            .ok()
            .and_then(|l| now.checked_add_signed(l))
            .unwrap_or(now)
    }

    /// Whether session `id` is unfinished (a missing one is not).
    async fn running(&self, id: Option<&str>) -> Result<bool, Failed> {
        let Some(id) = id else { return Ok(false) };
        Ok(self
            .s
            .store
            .get(id)
            .await?
            .is_some_and(|r| !r.status.is_terminal()))
    }
}

/// Why a schedule's pass stopped (its lease ends, and a later pass goes again).
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("{0}")]
    Store(#[from] agentq_core::Error),
    #[error("{0}")]
    Api(ApiError),
    #[error("{0}")]
    Data(String),
    #[error("stopped by the fault hook")]
    Killed(Killed),
}

impl Failed {
    fn into_api(self) -> ApiError {
        match self {
            Failed::Store(e) => e.into(),
            Failed::Api(e) => e,
            Failed::Data(m) => {
                tracing::error!(error = %m, "unreadable schedule");
                ApiError::Internal
            }
            Failed::Killed(_) => ApiError::Internal,
        }
    }
}

/// The idempotency key of the session of schedule `id`'s fire at `t`.
pub fn fire_key(id: &str, t: DateTime<Utc>) -> String {
    format!("schedule:{id}:{}", t.timestamp_micros())
}

/// The schedule's tenant as the creator of its sessions.
fn owner(row: &ScheduleRow) -> Caller {
    Caller {
        tenant: row.tenant.clone(),
        scopes: vec![Scope::SessionsWrite],
        key_id: None,
    }
}

fn advance_of(row: &ScheduleRow) -> Advance {
    Advance {
        next_fire_at: row.next_fire_at,
        buffered_fire_at: row.buffered_fire_at,
        last_session_id: row.last_session_id.clone(),
    }
}

fn fire_row(
    id: &str,
    t: DateTime<Utc>,
    outcome: FireOutcome,
    now: DateTime<Utc>,
    manual: bool,
) -> FireRow {
    FireRow {
        schedule_id: id.to_string(),
        fire_time: t,
        outcome,
        session_id: None,
        cancelled_session_id: None,
        error: None,
        manual,
        recorded_at: now,
    }
}

/// A refusal of the request itself (4xx but a conflict), not an outage.
fn is_refusal(e: &ApiError) -> bool {
    let status = e.status();
    status.is_client_error() && status != axum::http::StatusCode::CONFLICT
}

fn refused_field(e: &ApiError) -> Option<&str> {
    match e {
        ApiError::Invalid { field, .. } | ApiError::TooLarge { field, .. } => field.as_deref(),
        _ => None,
    }
}
