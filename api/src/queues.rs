//! `POST /v1/queues` and `GET /v1/queues`: the queues sessions may name. A queue is a
//! Redis stream and a label value of the metrics, so callers do not invent them: each is
//! configured (`[scheduler] queues`) or created by an admin, up to `scheduler.max_queues`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/queues` (admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateQueue {
    /// 1 to 64 of `A-Z a-z 0-9 _ . -`.
    pub name: String,
}

/// The answer of `POST /v1/queues`: 201 when created, 200 when it existed already.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueCreated {
    pub name: String,
    pub created: bool,
}

/// `GET /v1/queues`: every queue the caller may put sessions on (the admin: every queue),
/// configured ones first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueList {
    pub queues: Vec<String>,
    /// `scheduler.max_queues`.
    pub max_queues: usize,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn wire_shapes() {
        let c: CreateQueue = serde_json::from_value(json!({"name": "bulk"})).unwrap();
        assert_eq!(c.name, "bulk");
        assert!(serde_json::from_value::<CreateQueue>(json!({"name": "a", "x": 1})).is_err());
        assert_eq!(
            serde_json::to_value(QueueCreated {
                name: "bulk".into(),
                created: true
            })
            .unwrap(),
            json!({"name": "bulk", "created": true})
        );
        assert_eq!(
            serde_json::to_value(QueueList {
                queues: vec!["default".into()],
                max_queues: 64
            })
            .unwrap(),
            json!({"queues": ["default"], "max_queues": 64})
        );
    }
}
