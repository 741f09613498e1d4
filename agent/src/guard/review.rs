//! The guardian's reviews of one model answer. A review is an LLM call like the session's
//! own, so a hostile model must not be able to multiply them for free: identical calls of
//! one answer (same tool, same arguments) share one review, at most
//! [`MAX_REVIEWS_PER_ANSWER`] different calls of an answer are reviewed (the others are
//! denied, and the model is told to make them again later), and the reviews run one at a
//! time. Each one is admitted by the session's gate ([`ReviewGate`]: the budgets and the
//! rate limiter), and what it spent is kept here until the tool round records it on the
//! session, with the next checkpoint.
//!
//! One at a time because the gate admits one call of a session at a time: the tree's
//! budget is checked against each call's worst case before it starts, which only bounds
//! the session's spend if no other call of it is running meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::hook::{HookContext, HookDecision};
use crate::admission::Admission;
use crate::schema::{ToolCall, Usage};

/// An optional reviewer (e.g. an LLM judging the call in context) that can veto a call
/// the static rules allowed.
#[async_trait]
pub trait Guardian: Send + Sync {
    /// Whether calls of `tool` are reviewed at all (a call that is not costs nothing).
    fn reviews(&self, _tool: &str) -> bool {
        true
    }
    /// Review one call. An LLM call made for it is admitted by `gate` (and settled there),
    /// is bounded by its cancellation and deadline, and its usage is returned.
    async fn review(
        &self,
        ctx: &HookContext<'_>,
        call: &ReviewCall<'_>,
        gate: &ReviewGate,
    ) -> Review;
}

/// The most different calls of one model answer the guardian reviews. An answer asking
/// more is most likely a model trying to spend the operator's key (or to drown one call
/// among many); an honest one can make the rest in its next answer.
pub const MAX_REVIEWS_PER_ANSWER: usize = 16;

/// Where a review's LLM call is admitted, and what bounds it besides the guardian's own
/// timeout.
#[derive(Clone)]
pub struct ReviewGate {
    /// The session's gate for calls to the guardian's provider and model.
    pub admission: Arc<dyn Admission>,
    /// The session's cancellation.
    pub cancel: CancellationToken,
    /// The session's deadline.
    pub deadline: Option<Instant>,
}

/// The call put to the guardian.
#[derive(Debug, Clone, Copy)]
pub struct ReviewCall<'a> {
    pub call: &'a ToolCall,
    /// The paths the tool says the call touches ([`crate::tools::Tool::paths`]).
    pub paths: &'a [String],
}

/// What a review decided, and what its LLM call spent (`None`: no call was answered).
#[derive(Debug, Clone, PartialEq)]
pub struct Review {
    pub decision: HookDecision,
    pub usage: Option<Usage>,
}

impl Review {
    /// A decision made without an LLM call.
    pub fn free(decision: HookDecision) -> Review {
        Review {
            decision,
            usage: None,
        }
    }
}

/// The reviews of one answer's calls.
pub struct ReviewRound {
    guardian: Arc<dyn Guardian>,
    gate: ReviewGate,
    /// The review slot of each different call, in call order; calls past the cap have none.
    slots: HashMap<String, usize>,
    decisions: Vec<OnceCell<HookDecision>>,
    one_at_a_time: tokio::sync::Mutex<()>,
    /// What the reviews spent and the session has not recorded yet.
    spent: Mutex<Option<Usage>>,
}

/// Identical calls share this: the tool and its arguments (objects' keys in order).
fn key_of(call: &ToolCall) -> String {
    format!("{}\u{0}{}", call.name, call.arguments)
}

impl ReviewRound {
    /// The reviews of `calls` (an answer's calls still to run, in call order); `reviewed`
    /// says which of them reach the guardian at all.
    pub fn new(
        guardian: Arc<dyn Guardian>,
        calls: &[ToolCall],
        reviewed: impl Fn(&ToolCall) -> bool,
        gate: ReviewGate,
    ) -> ReviewRound {
        let mut slots = HashMap::new();
        for call in calls.iter().filter(|c| reviewed(c)) {
            let next = slots.len();
            if next >= MAX_REVIEWS_PER_ANSWER {
                break;
            }
            slots.entry(key_of(call)).or_insert(next);
        }
        let decisions = (0..slots.len()).map(|_| OnceCell::new()).collect();
        ReviewRound {
            guardian,
            gate,
            slots,
            decisions,
            one_at_a_time: tokio::sync::Mutex::new(()),
            spent: Mutex::new(None),
        }
    }

    /// Whether the guardian reviews calls of `tool`.
    pub fn reviews(&self, tool: &str) -> bool {
        self.guardian.reviews(tool)
    }

    /// What the reviews spent since the last time this was asked.
    pub fn take_spent(&self) -> Option<Usage> {
        self.spent.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The decision about `call`: its review's, shared with identical calls.
    pub async fn review(
        &self,
        ctx: &HookContext<'_>,
        call: &ToolCall,
        paths: &[String],
    ) -> HookDecision {
        let Some(cell) = self
            .slots
            .get(&key_of(call))
            .and_then(|slot| self.decisions.get(*slot))
        else {
            return HookDecision::Deny(format!(
                "the guardian reviews at most {MAX_REVIEWS_PER_ANSWER} different calls of one \
                 answer, and this one was not reviewed; make it again in a later answer"
            ));
        };
        cell.get_or_init(|| async {
            let _one = tokio::select! {
                g = self.one_at_a_time.lock() => g,
                _ = self.gate.cancel.cancelled() => {
                    return HookDecision::Deny("the session was cancelled".into());
                }
            };
            let review = self
                .guardian
                .review(ctx, &ReviewCall { call, paths }, &self.gate)
                .await;
            if let Some(u) = &review.usage {
                self.spent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert_with(Usage::default)
                    .add(u);
            }
            review.decision
        })
        .await
        .clone()
    }
}
