//! Schedules as objects of the API, scoped by tenant (scopes `sessions:write` to change,
//! `sessions:read` to read): `POST /v1/schedules` ([`CreateSchedule`]: a cron expression
//! in a time zone, or an interval, and a session template) answers a [`ScheduleView`],
//! `GET /v1/schedules` lists them ([`ScheduleList`], paged), `GET`/`DELETE
//! /v1/schedules/{id}`, `POST /v1/schedules/{id}/pause`, `/resume`, `/trigger` (a fire
//! now: its [`FireView`]) and `GET /v1/schedules/{id}/fires` ([`FireList`], newest first,
//! paged).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The query parameters of `GET /v1/schedules` and `GET /v1/schedules/{id}/fires`.
pub const SCHEDULE_LIST_PARAMS: &[&str] = &["limit", "cursor"];
/// Schedules or fires a page holds when `limit` is absent, and at most.
pub const DEFAULT_SCHEDULE_LIST: u32 = 50;
pub const MAX_SCHEDULE_LIST: u32 = 500;
/// The catch-up window when `catchup_window_secs` is absent (a minute), and at most (a
/// week).
pub const DEFAULT_CATCHUP_WINDOW_SECS: u64 = 60;
pub const MAX_CATCHUP_WINDOW_SECS: u64 = 604_800;
/// The shortest and longest interval of `every_secs` (a second; a year).
pub const MIN_EVERY_SECS: u64 = 1;
pub const MAX_EVERY_SECS: u64 = 31_536_000;
/// Longest `cron` expression and `description` (bytes).
pub const MAX_CRON: usize = 256;
pub const MAX_SCHEDULE_DESCRIPTION: usize = 1_024;

/// What a fire does while the session of the schedule's last started fire is unfinished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleOverlap {
    /// The fire is skipped (recorded as `skipped`).
    #[default]
    Skip,
    /// One fire waits (`buffered`) and starts when the running session ends; a fire while
    /// one waits is skipped.
    BufferOne,
    /// The running session is cancelled, then the fire starts.
    CancelOther,
    /// The fire starts anyway.
    AllowAll,
}

/// `POST /v1/schedules`. Any other field is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSchedule {
    /// A cron expression (5 fields, minute to weekday; a sixth leading field for seconds;
    /// `@hourly`, `@daily`… aliases), read in `timezone`. Exactly one of `cron` and
    /// `every_secs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 256)]
    pub cron: Option<String>,
    /// The IANA time zone `cron` is read in (`Europe/Paris`); `UTC` when absent. A
    /// skipped local time (spring forward) fires once, at the first instant after the
    /// gap; a repeated one (fall back) fires once, at its first occurrence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Fire every this many seconds (1 to 31,536,000), the first one after as many
    /// seconds from creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31536000)]
    pub every_secs: Option<u64>,
    /// The session each fire creates: anything `POST /v1/sessions` takes, `files`
    /// included, but `idempotency_key` (each fire's is made of the schedule and the fire
    /// time). Checked as that route checks it now, and again against the tenant's policy
    /// at each fire.
    #[schema(value_type = crate::CreateSession)]
    pub session: Value,
    /// What a fire does while the previous fire's session is unfinished; `skip` when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<ScheduleOverlap>,
    /// Fires missed while no scheduler ran are fired on start when at most this many
    /// seconds late (0 to 604,800; 60 when absent); older ones are recorded as `missed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 604800)]
    pub catchup_window_secs: Option<u64>,
    /// The caller's note, at most 1,024 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub description: Option<String>,
    /// Created paused (no fire until resumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// A schedule: `GET /v1/schedules/{id}`, and the answer of its creation, pause and resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleView {
    pub id: String,
    pub cron: Option<String>,
    pub timezone: String,
    pub every_secs: Option<u64>,
    /// The session template, as sent.
    #[schema(value_type = crate::CreateSession)]
    pub session: Value,
    pub overlap: ScheduleOverlap,
    pub catchup_window_secs: u64,
    pub description: Option<String>,
    pub paused: bool,
    /// The next fire time (while paused: the one it had; resuming fires from then on).
    pub next_fire_at: DateTime<Utc>,
    /// The fire waiting for the running session to end (`buffer_one`).
    pub buffered_fire_at: Option<DateTime<Utc>>,
    /// The session of the last started fire.
    pub last_session_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// `GET /v1/schedules`: the caller's tenant's schedules by id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleView>,
    /// The `cursor` of the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

/// What one fire did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FireOutcomeView {
    /// Its session was created (`session_id`).
    Started,
    /// Not started: the previous fire's session was unfinished.
    Skipped,
    /// Waiting for the running session to end (`buffer_one`).
    Buffered,
    /// Due while no scheduler ran, older than the catch-up window: not fired.
    Missed,
    /// The template was refused at fire time (`error` says why: the tenant's policy of
    /// then, an unknown queue…).
    Failed,
}

/// One fire of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FireView {
    /// The time it was due (a trigger's: when it was asked for).
    pub fire_time: DateTime<Utc>,
    pub outcome: FireOutcomeView,
    pub session_id: Option<String>,
    /// The session `cancel_other` cancelled to make room for this one.
    pub cancelled_session_id: Option<String>,
    pub error: Option<String>,
    /// Fired by `POST /v1/schedules/{id}/trigger`.
    pub manual: bool,
    pub recorded_at: DateTime<Utc>,
}

/// `GET /v1/schedules/{id}/fires`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FireList {
    pub fires: Vec<FireView>,
    /// The `cursor` of the next page; `null` on the last.
    pub next_cursor: Option<String>,
}
