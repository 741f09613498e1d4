//! Retention of finished session trees, as the store and the scheduler's pass share it:
//! which trees one rule covers ([`RetentionRule`], built from `[retention]` by
//! [`crate::config::RetentionSection::rules`]), what is kept of them ([`Keep`]), the
//! trees a pass would take ([`RetentionCandidate`]) and what it deleted ([`Retired`]);
//! the rules an admin stores through the API ([`StoredRetentionRule`]), which replace the
//! configured override of their tenant or queue.

use serde::{Deserialize, Serialize};

/// What retention keeps of a tree it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Keep {
    /// Nothing: the rows, transcripts, inboxes, approvals and files are deleted (the
    /// usage stays on the tenant's ledger).
    #[default]
    None,
    /// The session rows with their final answers; the transcripts, inboxes, approvals
    /// and files are deleted.
    Result,
}

impl Keep {
    pub fn as_str(self) -> &'static str {
        match self {
            Keep::None => "none",
            Keep::Result => "result",
        }
    }

    pub fn parse(s: &str) -> Option<Keep> {
        match s {
            "none" => Some(Keep::None),
            "result" => Some(Keep::Result),
            _ => None,
        }
    }
}

/// The most days a rule may keep trees: a century (past it a number is a typo, and a
/// cutoff stays far from the calendar's end). The fewest is 1.
pub const MAX_RETENTION_DAYS: u32 = 36_500;

/// What a stored rule covers: one tenant's trees or one queue's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleKind {
    Tenant,
    Queue,
}

impl RuleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::Tenant => "tenant",
            RuleKind::Queue => "queue",
        }
    }

    pub fn parse(s: &str) -> Option<RuleKind> {
        match s {
            "tenant" => Some(RuleKind::Tenant),
            "queue" => Some(RuleKind::Queue),
            _ => None,
        }
    }
}

/// A rule set through the admin API (`/v1/admin/retention`): the trees of one tenant or
/// one queue go after `days`, keeping `keep`. It replaces the configured override of the
/// same tenant or queue whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRetentionRule {
    pub kind: RuleKind,
    pub name: String,
    /// 1 to [`MAX_RETENTION_DAYS`] (the API's rule).
    pub days: u32,
    pub keep: Keep,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// The trees one rule covers, by their root's tenant and queue: the most specific
/// rule decides (a tenant's over a queue's over the global one), so each rule leaves
/// out what a more specific one covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionScope {
    /// Only this tenant's trees.
    pub tenant: Option<String>,
    /// Only the trees whose root is on this queue.
    pub queue: Option<String>,
    /// Not these tenants' trees.
    pub not_tenants: Vec<String>,
    /// Not the trees whose root is on one of these queues.
    pub not_queues: Vec<String>,
}

/// Trees of `scope` whose every session finished more than `days` ago go, keeping
/// `keep` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionRule {
    pub scope: RetentionScope,
    /// At least 1 (the settings' rule).
    pub days: u32,
    pub keep: Keep,
}

impl RetentionRule {
    /// The finish time before which a tree is due at `now`.
    pub fn cutoff(&self, now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        now.checked_sub_signed(chrono::TimeDelta::days(i64::from(self.days)))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC)
    }
}

/// A tree a rule would take: its root, with the root's tenant and queue, and how many
/// sessions it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetentionCandidate {
    pub root_id: String,
    pub tenant: String,
    pub queue: String,
    pub sessions: u64,
}

/// What one deletion did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retired {
    /// The roots of the trees taken (those of the request still due when it ran).
    pub roots: Vec<String>,
    /// Session rows deleted (none with [`Keep::Result`]).
    pub sessions: u64,
    /// Sessions whose transcript was dropped and whose row was kept.
    pub pruned: u64,
    /// Transcript messages deleted.
    pub messages: u64,
    /// Bytes of the contents only these trees' files held: no workspace references them
    /// any more, and the workspace collector deletes them.
    pub blob_bytes: u64,
}
