//! Talking to a session after it started: steering messages and decisions on held tool
//! calls.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentq_types::model::SessionStatus;
use agentq_types::protocol::Strategy;

use crate::de;

/// `POST /v1/sessions/{id}/messages`: a message for a running session, or a follow-up
/// turn for a finished one (which then continues with its full history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PostMessage {
    /// Up to 1,000,000 bytes, not only white space.
    #[serde(deserialize_with = "de::non_blank_string")]
    pub content: String,
    /// How to deliver it while the session has not finished; `inject` when absent.
    #[serde(default, deserialize_with = "de::strategy")]
    pub strategy: Strategy,
}

/// `POST /v1/sessions/{id}/messages` (202): how the message was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PostMessageResponse {
    pub id: String,
    /// The session's status when the message arrived (for a follow-up: after reopening).
    pub status: SessionStatus,
    pub delivery: Delivery,
    /// The message's position in the session's inbox; absent for a follow-up turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

/// How a message was delivered: by its strategy, or as a follow-up turn of a finished
/// session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    FollowUp,
    #[serde(untagged)]
    Steer(Strategy),
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::FollowUp => "follow_up",
            Delivery::Steer(s) => s.as_str(),
        }
    }
}

/// Written by hand: the derive cannot express a plain variant beside an untagged one. On
/// the wire it is one string, `follow_up` or a [`Strategy`].
impl utoipa::PartialSchema for Delivery {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some([Delivery::FollowUp.as_str()])),
            )
            .item(utoipa::openapi::Ref::from_schema_name(Strategy::name()))
            .description(Some(
                "`follow_up` (a new turn of a finished session) or the strategy it was \
                 delivered by",
            ))
            .into()
    }
}

impl ToSchema for Delivery {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        schemas.push((
            Strategy::name().into(),
            <Strategy as utoipa::PartialSchema>::schema(),
        ));
        <Strategy as ToSchema>::schemas(schemas);
    }
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/sessions/{id}/approvals`: a human's decision on a tool call the session is
/// holding (a pending call of its last turn).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    #[serde(deserialize_with = "de::required_string")]
    pub tool_call_id: String,
    #[serde(deserialize_with = "de::required_bool")]
    pub approve: bool,
    /// Shown to the model when the call is denied.
    #[serde(
        default,
        deserialize_with = "de::optional_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub reason: Option<String>,
    /// With `approve: true` only: the call runs with these arguments instead of the
    /// model's (a JSON object of at most 256 KiB as JSON text, 413 past it). They pass every check the model's arguments would (the tool's schema
    /// and path rules, the policy, hooks, the guardian), and the transcript keeps both:
    /// the model's call, and its result's `edited_arguments`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ApprovalRequest {
    /// Hold the strings to their bounds: `tool_call_id` 1 to
    /// [`MAX_TOOL_CALL_ID_LEN`](crate::bounds::MAX_TOOL_CALL_ID_LEN) bytes, `reason` at
    /// most [`MAX_REASON_BYTES`](crate::bounds::MAX_REASON_BYTES).
    pub fn check(&self) -> Result<(), crate::bounds::Violation> {
        use crate::bounds::{MAX_REASON_BYTES, MAX_TOOL_CALL_ID_LEN, Violation};
        if self.tool_call_id.is_empty() || self.tool_call_id.len() > MAX_TOOL_CALL_ID_LEN {
            return Err(Violation {
                field: "tool_call_id".into(),
                message: format!("must be 1 to {MAX_TOOL_CALL_ID_LEN} bytes"),
            });
        }
        if self
            .reason
            .as_ref()
            .is_some_and(|r| r.len() > MAX_REASON_BYTES)
        {
            return Err(Violation {
                field: "reason".into(),
                message: format!("must be at most {MAX_REASON_BYTES} bytes"),
            });
        }
        if self.arguments.is_some() && !self.approve {
            return Err(Violation {
                field: "arguments".into(),
                message: "may only be given with `approve: true`".into(),
            });
        }
        Ok(())
    }
}

/// `POST /v1/sessions/{id}/approvals` (200): the decision was recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalResponse {
    pub id: String,
    pub tool_call_id: String,
    pub approve: bool,
    /// The session was waiting on this decision and is queued again.
    pub resumed: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    use super::*;
    use crate::de::struct_fields;

    fn round_trip<T: Serialize + DeserializeOwned>(wire: Value) -> T {
        let t: T = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(serde_json::to_value(&t).unwrap(), wire);
        t
    }

    #[test]
    fn messages() {
        let m: PostMessage = round_trip(json!({"content": "also check X", "strategy": "enqueue"}));
        assert_eq!(m.strategy, Strategy::Enqueue);
        let m: PostMessage = serde_json::from_value(json!({"content": "one more thing"})).unwrap();
        assert_eq!(m.strategy, Strategy::Inject);
        assert!(
            serde_json::from_value::<PostMessage>(json!({"content": "x", "extra": 1})).is_err()
        );
        assert_eq!(struct_fields::<PostMessage>(), ["content", "strategy"]);

        let r: PostMessageResponse =
            round_trip(json!({"id": "s1", "status": "running", "delivery": "interrupt", "seq": 4}));
        assert_eq!(r.delivery, Delivery::Steer(Strategy::Interrupt));
        let r: PostMessageResponse =
            round_trip(json!({"id": "s1", "status": "queued", "delivery": "follow_up"}));
        assert_eq!((r.delivery, r.seq), (Delivery::FollowUp, None));
        for d in [Delivery::FollowUp, Delivery::Steer(Strategy::Enqueue)] {
            assert_eq!(serde_json::to_value(d).unwrap(), d.as_str());
        }
    }

    #[test]
    fn approvals() {
        let a: ApprovalRequest = round_trip(json!({"tool_call_id": "c1", "approve": true}));
        assert_eq!(a.reason, None);
        let a: ApprovalRequest =
            round_trip(json!({"tool_call_id": "c1", "approve": false, "reason": "not today"}));
        assert_eq!(a.reason.as_deref(), Some("not today"));
        assert_eq!(
            struct_fields::<ApprovalRequest>(),
            ["tool_call_id", "approve", "reason", "arguments"]
        );
        let a: ApprovalRequest = round_trip(
            json!({"tool_call_id": "c1", "approve": true, "arguments": {"path": "a.txt"}}),
        );
        assert_eq!(a.arguments.unwrap()["path"], "a.txt");
        // Edited arguments go with an approval only.
        let denied_with_edit: ApprovalRequest = serde_json::from_value(
            json!({"tool_call_id": "c1", "approve": false, "arguments": {}}),
        )
        .unwrap();
        assert_eq!(denied_with_edit.check().unwrap_err().field, "arguments");
        let long = |id: String, reason: Option<String>| ApprovalRequest {
            tool_call_id: id,
            approve: false,
            reason,
            arguments: None,
        };
        assert_eq!(
            long("c".repeat(1024), Some("r".repeat(65536))).check(),
            Ok(())
        );
        let field = |a: ApprovalRequest| a.check().unwrap_err().field;
        assert_eq!(field(long("c".repeat(1025), None)), "tool_call_id");
        assert_eq!(field(long(String::new(), None)), "tool_call_id");
        assert_eq!(field(long("c".into(), Some("r".repeat(65537)))), "reason");
        let r: ApprovalResponse =
            round_trip(json!({"id": "s1", "tool_call_id": "c1", "approve": true, "resumed": true}));
        assert!(r.resumed);
    }
}
