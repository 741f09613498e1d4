//! The value types settings are written in beside plain numbers and strings: [`Secs`]
//! (a timing in seconds) and [`Secret`] (a credential that never prints).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A timing setting in seconds, fractions allowed (`0.5`), written as a plain number in
/// the file, the environment and flags.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secs(pub f64);

impl Secs {
    /// As a `Duration`; a value [`Settings::validate`](super::Settings::validate) would
    /// refuse saturates instead of panicking (zero below, the largest duration above).
    pub fn duration(self) -> Duration {
        Duration::try_from_secs_f64(self.0).unwrap_or(if self.0 > 0.0 {
            Duration::MAX
        } else {
            Duration::ZERO
        })
    }
}

impl From<u64> for Secs {
    fn from(s: u64) -> Self {
        Secs(s as f64)
    }
}

impl std::fmt::Display for Secs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for Secs {
    type Err = std::num::ParseFloatError;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        s.trim().parse().map(Secs)
    }
}

// Whole seconds from elsewhere (a pod's termination grace period) compare with a timing
// setting directly.
impl PartialEq<Secs> for u64 {
    fn eq(&self, other: &Secs) -> bool {
        (*self as f64) == other.0
    }
}

impl PartialOrd<Secs> for u64 {
    fn partial_cmp(&self, other: &Secs) -> Option<std::cmp::Ordering> {
        (*self as f64).partial_cmp(&other.0)
    }
}

/// A credential: its `Debug` shows `<redacted>`, it has no `Display` and never
/// serialises, so a logged or dumped configuration cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}
