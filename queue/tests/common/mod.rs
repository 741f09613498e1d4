//! What the queue's test files share: the queue they use, the sessions of deliveries and
//! a completion to publish.

#![allow(dead_code)]

use agentq_agent::spec::ExitReason;
use agentq_queue::queue::Delivery;
use agentq_types::model::{Completion, CompletionUsage, SessionStatus};

pub const Q: &str = "default";

/// How long a call that must return by itself may take before the test calls it hung: a
/// guard against a test that never ends, not a measure of speed (a loaded machine may be
/// slow, never this slow).
pub const HANG: std::time::Duration = std::time::Duration::from_secs(60);

pub fn queues() -> Vec<String> {
    vec![Q.to_string()]
}

pub fn sessions(ds: &[Delivery]) -> Vec<&str> {
    ds.iter().map(|d| d.session_id.as_str()).collect()
}

pub fn completion(id: &str) -> Completion {
    Completion {
        session_id: id.to_string(),
        status: SessionStatus::Completed,
        finish_reason: Some(ExitReason::Stop),
        result: Some("42".to_string()),
        error: None,
        iterations: 3,
        usage: CompletionUsage {
            input_tokens: 10,
            output_tokens: 5,
        },
        parent_id: None,
    }
}
