//! Schedules: when one fires ([`timing`]: cron in a time zone, or an interval), the fire
//! loop every scheduler runs ([`fire`]), and what the routes of `/v1/schedules` do with
//! schedules ([`manage`]). The store holds the lease that makes a fire happen in one
//! process, and the history of fires.

pub mod fire;
pub(crate) mod manage;
pub mod timing;

pub use crate::settings::FireSettings;
pub use fire::{FaultHook, Firer, fire_key};
pub use timing::Timing;
