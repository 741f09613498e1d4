//! The one error body of every route.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every 4xx and 5xx answer: `{"error": {"code", "message", "field"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable and machine-readable: `invalid_json`, `invalid_field`, `unknown_field`,
    /// `credential_not_allowed`, `too_large`, `not_found`, `already_finished`,
    /// `session_busy`, `unavailable`, …
    pub code: String,
    /// For people; a server error's message says nothing about its cause.
    pub message: String,
    /// The field to blame, as a path into the body (`prompt`, `[17].mode`,
    /// `metadata.api_key`); `null` when no single field is.
    #[serde(default)]
    pub field: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn round_trips_with_a_null_field() {
        let wire = json!({"error": {"code": "not_found", "message": "session x not found", "field": null}});
        let body: ErrorBody = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(body.error.field, None);
        assert_eq!(serde_json::to_value(&body).unwrap(), wire);
        let wire = json!({"error": {"code": "invalid_field", "message": "m", "field": "[2].mode"}});
        let body: ErrorBody = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(body.error.field.as_deref(), Some("[2].mode"));
        assert_eq!(serde_json::to_value(&body).unwrap(), wire);
    }
}
