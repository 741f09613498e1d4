//! Retention of finished session trees, run beside the sweeper: every
//! `[retention] interval_secs`, each rule ([`RetentionSection::rules_with`]: per tenant, per
//! queue, global; those stored through the admin API read at each pass, over the
//! configured ones) takes the trees whose every session finished more than its days ago
//! and that nothing still references, `batch` trees per transaction, pausing between
//! batches and stopping after `max_batches`, so a backlog is worked off over passes and
//! never holds the database for long. Each batch is exported first when configured
//! ([`export`]), and deleted only once the export is durable. The contents that only
//! those trees held are then collected by the workspace collector's own statement
//! ([`SweepStore::collect_blobs`], the same as [`crate::workspace_gc`]).
//!
//! Times come from a [`Clock`], so a test runs a pass "forty days later" without waiting.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use agentq_core::Store;
use agentq_core::config::{RetentionSection, WorkspaceSection};
use agentq_core::metrics::Metrics;
use agentq_core::retention::{RetentionCandidate, RetentionRule, StoredRetentionRule};

use crate::webhooks::Clock;

pub mod export;

use export::Exporter;

/// Why a pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error(transparent)]
    Store(#[from] agentq_core::Error),
    /// The export could not be made durable: nothing of its batch was deleted.
    #[error("writing the retention export {path}: {source}")]
    Export {
        path: String,
        source: std::io::Error,
    },
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PassReport {
    /// Trees taken.
    pub trees: u64,
    /// Session rows deleted.
    pub sessions: u64,
    /// Sessions whose transcript was dropped and whose row was kept (`keep = "result"`).
    pub pruned: u64,
    pub messages: u64,
    /// Bytes of contents only the taken trees held.
    pub blob_bytes: u64,
    /// Contents the collector then deleted (these trees' and any others' due).
    pub blobs_collected: u64,
    /// Sessions written to the export.
    pub exported: u64,
}

/// What a pass would take for one rule (the dry run): per tenant and queue of the roots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanRow {
    pub tenant: String,
    pub queue: String,
    /// `none` or `result`.
    pub keep: &'static str,
    pub days: u32,
    pub trees: u64,
    pub sessions: u64,
}

/// The retention task's state: the rules, the export, the clock.
pub struct Retention {
    store: Arc<dyn Store>,
    cfg: RetentionSection,
    workspace: WorkspaceSection,
    exporter: Option<Exporter>,
    clock: Arc<dyn Clock>,
    metrics: &'static Metrics,
}

impl Retention {
    /// `Err` when the export target cannot be built (settings are validated before).
    pub fn new(
        store: Arc<dyn Store>,
        cfg: RetentionSection,
        workspace: WorkspaceSection,
        clock: Arc<dyn Clock>,
        metrics: &'static Metrics,
    ) -> agentq_core::Result<Self> {
        let exporter = Exporter::from_settings(&cfg, &workspace)?;
        Ok(Retention {
            store,
            cfg,
            workspace,
            exporter,
            clock,
            metrics,
        })
    }

    /// Export to `objects` (the bucket `export = "s3"` builds from `[workspace.s3]` and
    /// the credentials' variables, given here by a caller that holds it already).
    pub fn with_export_to(mut self, objects: Arc<agentq_core::blob::s3::S3Blobs>) -> Self {
        self.exporter = Some(Exporter::S3(objects));
        self
    }

    /// The rules in force: the configured ones with those stored through the admin API
    /// (read now, so a rule set there applies from the next pass on).
    pub async fn rules(&self) -> agentq_core::Result<Vec<RetentionRule>> {
        Ok(self.cfg.rules_with(&self.stored().await?))
    }

    /// The rules stored through the admin API.
    pub async fn stored(&self) -> agentq_core::Result<Vec<StoredRetentionRule>> {
        self.store.retention_rules().await
    }

    /// What the next pass would take, per rule and per tenant and queue (at most `batch ×
    /// max_batches` trees per rule, as a pass); deletes nothing.
    pub async fn plan(&self) -> agentq_core::Result<Vec<PlanRow>> {
        let now = self.clock.now();
        let limit = self.cfg.batch.saturating_mul(self.cfg.max_batches);
        let mut out: Vec<PlanRow> = Vec::new();
        for rule in &self.rules().await? {
            let found = self.store.retention_candidates(rule, now, limit).await?;
            for c in found {
                match out.iter_mut().find(|r| {
                    r.tenant == c.tenant && r.queue == c.queue && r.keep == rule.keep.as_str()
                }) {
                    Some(r) => {
                        r.trees += 1;
                        r.sessions = r.sessions.saturating_add(c.sessions);
                    }
                    None => out.push(PlanRow {
                        tenant: c.tenant,
                        queue: c.queue,
                        keep: rule.keep.as_str(),
                        days: rule.days,
                        trees: 1,
                        sessions: c.sessions,
                    }),
                }
            }
        }
        Ok(out)
    }

    /// One pass over every rule, then the collection of what no workspace holds any more.
    /// Stops early when `stop` is cancelled (between batches) or a batch fails (the next
    /// pass takes it again).
    pub async fn pass(&self, stop: &CancellationToken) -> Result<PassReport, RetentionError> {
        let mut report = PassReport::default();
        let now = self.clock.now();
        let pause = Duration::from_millis(self.cfg.pause_ms);
        for rule in &self.rules().await? {
            for _ in 0..self.cfg.max_batches {
                if stop.is_cancelled() {
                    return Ok(report);
                }
                let found = self
                    .store
                    .retention_candidates(rule, now, self.cfg.batch)
                    .await?;
                if found.is_empty() {
                    break;
                }
                self.batch(rule, now, &found, &mut report).await?;
                if found.len() < self.cfg.batch as usize {
                    break;
                }
                if !pause.is_zero() {
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(report),
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
        if report.trees > 0 {
            report.blobs_collected = self.collect(stop).await?;
        }
        Ok(report)
    }

    /// Export, then delete, one batch of trees.
    async fn batch(
        &self,
        rule: &RetentionRule,
        now: chrono::DateTime<chrono::Utc>,
        found: &[RetentionCandidate],
        report: &mut PassReport,
    ) -> Result<(), RetentionError> {
        let roots: Vec<String> = found.iter().map(|c| c.root_id.clone()).collect();
        if let Some(e) = &self.exporter {
            // Durable before anything is deleted; a tree exported and then found alive
            // by the deletion is only exported again by a later pass.
            report.exported += e.export(self.store.as_ref(), &roots, now).await?;
        }
        let retired = self.store.retire_trees(rule, now, &roots).await?;
        let keep = rule.keep.as_str();
        let taken = retired.roots.len() as u64;
        let m = self.metrics;
        m.retention_trees.with_label_values(&[keep]).inc_by(taken);
        m.retention_sessions
            .with_label_values(&[keep])
            .inc_by(retired.sessions + retired.pruned);
        m.retention_messages.inc_by(retired.messages);
        m.retention_blob_bytes.inc_by(retired.blob_bytes);
        if taken > 0 {
            tracing::info!(
                trees = taken,
                sessions = retired.sessions,
                pruned = retired.pruned,
                messages = retired.messages,
                keep,
                "retention took finished trees"
            );
        }
        report.trees += taken;
        report.sessions += retired.sessions;
        report.pruned += retired.pruned;
        report.messages += retired.messages;
        report.blob_bytes += retired.blob_bytes;
        Ok(())
    }

    /// The workspace collector's statement until a batch comes back short.
    async fn collect(&self, stop: &CancellationToken) -> agentq_core::Result<u64> {
        let grace = Duration::from_secs(self.workspace.blob_grace_secs);
        let batch = self.workspace.gc_batch.max(1);
        let mut total = 0;
        for _ in 0..self.cfg.max_batches {
            if stop.is_cancelled() {
                break;
            }
            let n = self.store.collect_blobs(grace, batch).await?;
            total += n;
            if n < u64::from(batch) {
                break;
            }
        }
        Ok(total)
    }

    /// A pass every `interval_secs` until `shutdown` is cancelled. A failed pass is
    /// logged and tried again at the next tick.
    pub async fn run(self, shutdown: CancellationToken) {
        let every = Duration::from_secs(self.cfg.interval_secs.max(1));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = self.pass(&shutdown).await {
                tracing::warn!(error = %e, "retention pass failed; retrying next tick");
            }
        }
    }
}
