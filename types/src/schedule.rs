//! Schedules as the store keeps them: a tenant's schedule ([`ScheduleRow`], created from a
//! [`NewSchedule`]), what a fire overlapping an unfinished one does ([`Overlap`]), and the
//! history row of one fire ([`FireRow`], what it did: [`FireOutcome`]). When a claimer
//! is done with a claimed schedule it hands the store an [`Advance`].

use chrono::{DateTime, Utc};

/// What a fire does while the session of the schedule's last started fire is unfinished
/// (Temporal's four overlap policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Overlap {
    /// The fire is recorded as skipped.
    Skip,
    /// At most one fire waits (recorded as buffered) and starts when the running one
    /// ends; a fire while one waits is skipped.
    BufferOne,
    /// The running session is cancelled, then the fire starts.
    CancelOther,
    /// The fire starts anyway.
    AllowAll,
}

impl Overlap {
    pub const ALL: [Overlap; 4] = [
        Overlap::Skip,
        Overlap::BufferOne,
        Overlap::CancelOther,
        Overlap::AllowAll,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
            Overlap::CancelOther => "cancel_other",
            Overlap::AllowAll => "allow_all",
        }
    }

    pub fn parse(s: &str) -> Option<Overlap> {
        Overlap::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// What one fire did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FireOutcome {
    /// A session was created (`session_id`).
    Started,
    /// Not started: the previous fire's session was unfinished (`skip`, or `buffer_one`
    /// with a fire already waiting).
    Skipped,
    /// Waiting for the running session to end (`buffer_one`); becomes `started`.
    Buffered,
    /// Due while no scheduler ran, and older than the catch-up window: not fired.
    Missed,
    /// The template was refused at fire time (the policy of then; `error` says why).
    Failed,
}

impl FireOutcome {
    pub const ALL: [FireOutcome; 5] = [
        FireOutcome::Started,
        FireOutcome::Skipped,
        FireOutcome::Buffered,
        FireOutcome::Missed,
        FireOutcome::Failed,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            FireOutcome::Started => "started",
            FireOutcome::Skipped => "skipped",
            FireOutcome::Buffered => "buffered",
            FireOutcome::Missed => "missed",
            FireOutcome::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<FireOutcome> {
        FireOutcome::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// A schedule to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    pub id: String,
    pub tenant: String,
    /// A cron expression read in `timezone`; `None` with `every_secs`.
    pub cron: Option<String>,
    /// An IANA zone name (`UTC` for an interval).
    pub timezone: String,
    pub every_secs: Option<u64>,
    /// The `POST /v1/sessions` body each fire sends (JSON text).
    pub template: String,
    pub overlap: Overlap,
    pub catchup_window_secs: u64,
    pub description: Option<String>,
    pub paused: bool,
    /// The first fire time.
    pub next_fire_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    pub id: String,
    pub tenant: String,
    pub cron: Option<String>,
    pub timezone: String,
    pub every_secs: Option<u64>,
    pub template: String,
    pub overlap: Overlap,
    pub catchup_window_secs: u64,
    pub description: Option<String>,
    pub paused: bool,
    /// The next fire time not yet handled.
    pub next_fire_at: DateTime<Utc>,
    /// The fire `buffer_one` keeps for when the running session ends.
    pub buffered_fire_at: Option<DateTime<Utc>>,
    /// The session of the last started fire.
    pub last_session_id: Option<String>,
    /// The claim holding the schedule now (the token fences what the claimer records).
    pub lease_token: Option<String>,
    pub lease_until: Option<DateTime<Utc>>,
    /// When the current lease was taken; a takeover from a claimer that died keeps that
    /// claimer's time, so both judge the same fires late.
    pub claimed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// One fire in the history.
#[derive(Debug, Clone, PartialEq)]
pub struct FireRow {
    pub schedule_id: String,
    pub fire_time: DateTime<Utc>,
    pub outcome: FireOutcome,
    pub session_id: Option<String>,
    /// The session `cancel_other` cancelled to make room for this fire.
    pub cancelled_session_id: Option<String>,
    pub error: Option<String>,
    /// Fired by a trigger rather than by the clock.
    pub manual: bool,
    pub recorded_at: DateTime<Utc>,
}

/// Where a claimed schedule stands after its claimer handled it.
#[derive(Debug, Clone, PartialEq)]
pub struct Advance {
    pub next_fire_at: DateTime<Utc>,
    pub buffered_fire_at: Option<DateTime<Utc>>,
    pub last_session_id: Option<String>,
}
