//! `agentq retention [--dry-run]`: one retention pass on the configured store (Postgres
//! when a database URL is configured, else the embedded SQLite file), as the scheduler
//! runs every `[retention] interval_secs`; with `--dry-run`, what that pass would take,
//! per tenant and queue, taking nothing. `--at` judges ages as of another time (what
//! would be due on a date).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, Utc};
use clap::Args;
use tokio_util::sync::CancellationToken;

use agentq_core::config::Settings;
use agentq_core::retention::{RetentionRule, RuleKind, StoredRetentionRule};
use agentq_scheduler::retention::Retention;
use agentq_scheduler::webhooks::ManualClock;

#[derive(Args, Debug)]
pub struct RetentionArgs {
    /// Say what would be deleted (per tenant and queue), delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Judge the trees' ages as of this RFC 3339 time instead of now.
    #[arg(long)]
    pub at: Option<String>,
    /// Configuration file (default: ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG")]
    pub config: Option<PathBuf>,
}

pub async fn retention(args: RetentionArgs) -> anyhow::Result<ExitCode> {
    let cfg = Settings::resolve(args.config.as_deref(), |k| std::env::var(k).ok(), |_| {})?;
    let now = match &args.at {
        None => Utc::now(),
        Some(v) => DateTime::parse_from_rfc3339(v)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| anyhow!("--at: {v:?} is not an RFC 3339 time ({e})"))?,
    };
    let objects = agentq_core::blob::s3::from_workspace(&cfg.workspace)?;
    let store = crate::keys::open_configured(&cfg, objects).await?;
    let r = Retention::new(
        store,
        cfg.retention.clone(),
        cfg.workspace.clone(),
        std::sync::Arc::new(ManualClock::new(now)),
        agentq_core::metrics::global(),
    )?;
    let stored = r
        .stored()
        .await
        .context("cannot read the stored retention rules")?;
    let rules = cfg.retention.rules_with(&stored);
    if rules.is_empty() {
        eprintln!(
            "agentq retention: off (set [retention] days, AGENTQ_RETENTION_DAYS, a tenant's \
             or queue's override, or a rule through /v1/admin/retention); nothing is deleted"
        );
        return Ok(ExitCode::SUCCESS);
    }
    for rule in &rules {
        eprintln!("agentq retention: rule {}", describe(rule, &stored));
    }
    if args.dry_run {
        let plan = r
            .plan()
            .await
            .context("cannot read what retention would take")?;
        println!("tenant\tqueue\tkeep\tdays\ttrees\tsessions");
        let (mut trees, mut sessions) = (0u64, 0u64);
        for p in &plan {
            println!(
                "{}\t{}\t{}\t{}\t{}\t{}",
                p.tenant, p.queue, p.keep, p.days, p.trees, p.sessions
            );
            trees += p.trees;
            sessions = sessions.saturating_add(p.sessions);
        }
        eprintln!(
            "agentq retention: dry run: {trees} trees ({sessions} sessions) would go; nothing \
             was deleted"
        );
        return Ok(ExitCode::SUCCESS);
    }
    let report = match r.pass(&CancellationToken::new()).await {
        Ok(report) => report,
        Err(e) => bail!("retention pass failed: {e}"),
    };
    println!("{}", serde_json::to_string(&report)?);
    eprintln!(
        "agentq retention: took {} trees ({} sessions deleted, {} kept with their result)",
        report.trees, report.sessions, report.pruned
    );
    Ok(ExitCode::SUCCESS)
}

/// A rule in force as the operator reads it: what it covers, its days and keep, and
/// where it comes from (`stored` through the admin API, else `config`).
fn describe(rule: &RetentionRule, stored: &[StoredRetentionRule]) -> String {
    let (what, kind, name) = match (&rule.scope.tenant, &rule.scope.queue) {
        (Some(t), _) => (format!("tenant {t}"), Some(RuleKind::Tenant), t.as_str()),
        (None, Some(q)) => (format!("queue {q}"), Some(RuleKind::Queue), q.as_str()),
        (None, None) => ("global".to_string(), None, ""),
    };
    let source = match kind {
        Some(k) if stored.iter().any(|s| s.kind == k && s.name == name) => "stored",
        _ => "config",
    };
    format!(
        "{what}: {} days, keep {} ({source})",
        rule.days,
        rule.keep.as_str()
    )
}
