//! Forking a session from a step (`POST /v1/sessions/{id}/fork`): what a fork asks the
//! store for and what it answers. A step is counted in model responses: iteration `k` is
//! the `k`-th assistant message of the history together with the tool results that answer
//! its calls, and a fork "at iteration k" starts from the history up to and including
//! them (0: the prompt alone). Messages the origin took in after them (a steering message,
//! a follow-up) belong to the next step and are not part of the fork.

use crate::model::{NewSession, SessionRow};

/// A fork chain is at most this long (an original and its forks, each forked past its
/// origin's own fork point): every read of a fork's history walks it in one statement.
/// A fork inside its origin's prefix points at the origin's origin instead and adds no
/// link, so only forks past the previous fork point count.
pub const MAX_FORK_DEPTH: u32 = 16;

/// The fork to create: `new` is its row (a root of its own tree, the origin's spec with the
/// request's overrides, the caller's tenant), made from `origin`'s history up to
/// `at_iteration`, with `message` (a user message) after it.
#[derive(Debug, Clone)]
pub struct NewFork {
    pub new: NewSession,
    pub origin: String,
    pub at_iteration: u32,
    pub message: Option<String>,
}

/// Why a fork cannot start where it was asked to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkRefusal {
    /// The history holds only `iterations` model responses.
    PastEnd { iterations: u32 },
    /// Iteration `at` has tool calls without results yet (they are running, or held for a
    /// decision): the step has not ended.
    Unfinished { at: u32 },
    /// A sub-agent: its history is part of its parent's run; fork the tree's root.
    NotRoot,
    /// The fork would be the `MAX_FORK_DEPTH + 1`-th link of its chain.
    TooDeep,
}

impl ForkRefusal {
    /// The refusal as the API words it.
    pub fn message(&self) -> String {
        match self {
            ForkRefusal::PastEnd { iterations } => {
                format!("past the end: the session has {iterations} iterations")
            }
            ForkRefusal::Unfinished { at } => {
                format!("iteration {at} has not finished (its tool calls have no results yet)")
            }
            ForkRefusal::NotRoot => {
                "a sub-agent cannot be forked; fork its tree's root session".to_string()
            }
            ForkRefusal::TooDeep => format!(
                "a fork chain holds at most {MAX_FORK_DEPTH} forks each past its origin's \
                 fork point; fork an earlier step, or the original session"
            ),
        }
    }
}

/// What a fork request did.
#[derive(Debug, Clone)]
pub enum ForkResult {
    Forked(Box<SessionRow>),
    /// No such origin of the fork's tenant.
    NotFound,
    Refused(ForkRefusal),
}
