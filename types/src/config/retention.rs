//! `[retention]`: how long finished session trees are kept, per tenant and per queue,
//! what is kept of them, and where they are exported before they go (run by the
//! scheduler); [`RetentionSection::rules`] turns it into the rules a pass applies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::section::section;
use crate::retention::{Keep, RetentionRule, RetentionScope, RuleKind, StoredRetentionRule};

section! {
    /// `[retention]`: finished session trees older than `days` (by the finish of their
    /// last session) are deleted by the scheduler, in bounded batches;
    /// `[retention.tenants.<name>]` and `[retention.queues.<name>]` override `days` and
    /// `keep` for a tenant's trees and a queue's (a tenant's override wins over a
    /// queue's).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct RetentionSection {
        /// Days a finished tree is kept; unset keeps every tree (unless an override
        /// sets it).
        pub days: Option<u32> = None,
        /// What is kept of a tree that goes: `none`, or `result` (its session rows and
        /// final answers, without the transcripts and files).
        pub keep: Keep = Keep::None,
        /// Where each tree is written (JSONL, one line per session with its transcript)
        /// before it is deleted: `dir:/path`, or `s3` (the `[workspace.s3]` bucket, under
        /// `retention/`). Unset: not exported.
        pub export: Option<String> = None,
        /// Trees per transaction.
        pub batch: u32 = 100,
        /// Batches per pass at most; the rest waits for the next pass.
        pub max_batches: u32 = 20,
        /// Pause between two batches of a pass, so the hot path keeps the database.
        pub pause_ms: u64 = 200,
        /// How often the scheduler runs a pass.
        pub interval_secs: u64 = 3600,
        pub tenants: BTreeMap<String, RetentionOverride> = BTreeMap::new(),
        pub queues: BTreeMap<String, RetentionOverride> = BTreeMap::new(),
    }
}

/// `[retention.tenants.<name>]` or `[retention.queues.<name>]`: each field it sets
/// replaces the global one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep: Option<Keep>,
}

/// Where trees are exported before they go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportTarget {
    /// JSONL files in this directory.
    Dir(std::path::PathBuf),
    /// Objects in the `[workspace.s3]` bucket.
    S3,
}

impl RetentionSection {
    /// Where trees are exported; `Err` says why `export` names no target.
    pub fn export_target(&self) -> std::result::Result<Option<ExportTarget>, String> {
        let Some(e) = &self.export else {
            return Ok(None);
        };
        if e == "s3" {
            return Ok(Some(ExportTarget::S3));
        }
        match e.strip_prefix("dir:") {
            Some(p) if !p.trim().is_empty() => Ok(Some(ExportTarget::Dir(p.into()))),
            _ => Err(format!("must be `dir:/path` or `s3`, not {e:?}")),
        }
    }

    /// The rules a pass applies with the rules stored through the API: a stored rule
    /// replaces the configured override of its tenant or queue whole, so the order of
    /// precedence is stored tenant, configured tenant, stored queue, configured queue,
    /// global (a tenant's rule is the more specific: its owner's choice for all its
    /// trees, whatever queue they ran on).
    pub fn rules_with(&self, stored: &[StoredRetentionRule]) -> Vec<RetentionRule> {
        if stored.is_empty() {
            return self.rules();
        }
        let mut merged = self.clone();
        for r in stored {
            let map = match r.kind {
                RuleKind::Tenant => &mut merged.tenants,
                RuleKind::Queue => &mut merged.queues,
            };
            map.insert(
                r.name.clone(),
                RetentionOverride {
                    days: Some(r.days),
                    keep: Some(r.keep),
                },
            );
        }
        merged.rules()
    }

    /// The rules a pass applies, most specific first: one per tenant override, one per
    /// queue override (leaving out the overridden tenants), and the global one (leaving
    /// out both). A rule without days (none set, none inherited) keeps its trees and is
    /// left out.
    pub fn rules(&self) -> Vec<RetentionRule> {
        let tenants: Vec<String> = self.tenants.keys().cloned().collect();
        let queues: Vec<String> = self.queues.keys().cloned().collect();
        let rule = |o: Option<&RetentionOverride>, scope: RetentionScope| {
            let days = o.and_then(|o| o.days).or(self.days)?;
            let keep = o.and_then(|o| o.keep).unwrap_or(self.keep);
            Some(RetentionRule { scope, days, keep })
        };
        let mut out = Vec::new();
        for (t, o) in &self.tenants {
            let scope = RetentionScope {
                tenant: Some(t.clone()),
                ..RetentionScope::default()
            };
            out.extend(rule(Some(o), scope));
        }
        for (q, o) in &self.queues {
            let scope = RetentionScope {
                queue: Some(q.clone()),
                not_tenants: tenants.clone(),
                ..RetentionScope::default()
            };
            out.extend(rule(Some(o), scope));
        }
        let scope = RetentionScope {
            not_tenants: tenants,
            not_queues: queues,
            ..RetentionScope::default()
        };
        out.extend(rule(None, scope));
        out
    }
}
