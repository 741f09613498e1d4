//! `GET /readyz`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /readyz`: 200 with `{"status": "ready"}`, or 503 while draining or while a
/// backend is down (then with `down` and `checks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    pub status: ReadyStatus,
    /// The backends that failed their check (`postgres`, `redis`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub down: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<ReadyChecks>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReadyStatus {
    Ready,
    /// Shutting down: load balancers should stop sending traffic.
    Draining,
    Unavailable,
}

/// Each backend's check: `ok`, or why it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadyChecks {
    pub postgres: String,
    pub redis: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::{Value, json};

    use super::*;

    fn round_trip(wire: Value) -> Readiness {
        let r: Readiness = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(serde_json::to_value(&r).unwrap(), wire);
        r
    }

    #[test]
    fn shapes() {
        assert_eq!(
            round_trip(json!({"status": "ready"})).status,
            ReadyStatus::Ready
        );
        assert_eq!(
            round_trip(json!({"status": "draining"})).status,
            ReadyStatus::Draining
        );
        let r = round_trip(json!({
            "status": "unavailable",
            "down": ["redis"],
            "checks": {"postgres": "ok", "redis": "no answer within 2s"},
        }));
        assert_eq!(r.down, ["redis"]);
    }
}
