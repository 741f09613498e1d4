//! `agentq retention` through the real binary, on the embedded file and on Postgres: a
//! dry run lists what would go per tenant and queue and deletes nothing; a pass deletes
//! it; `--at` judges ages as of another time (no test waits forty days); a rule stored
//! through the admin API wins over the configured one and the dry run names it; a
//! retention of 0 days is refused naming the key and its variable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::Output;
use std::time::Duration;

use agentq_agent::schema::Message;
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_core::retention::{Keep, RuleKind, StoredRetentionRule};
use agentq_core::{Claim, NewSession, Store};

use common::{agentq, migrated_db, text};

/// A finished root session of `tenant`; its id.
async fn finished(store: &dyn Store, tenant: &str) -> String {
    let new = NewSession::root(SessionSpec::new("old"), "default").with_tenant(tenant);
    let id = store.create_session(&new).await.unwrap().0.id;
    let Claim::Acquired {
        lease, mut state, ..
    } = store
        .claim(&id, "w", Duration::from_secs(30), 5)
        .await
        .unwrap()
    else {
        panic!("not acquired")
    };
    let from = state.messages.len();
    state.push_assistant(Message::assistant("done"));
    state.outcome = Some(Outcome::new(ExitReason::Stop));
    store.checkpoint(&lease, &state, from).await.unwrap();
    id
}

fn retention(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = agentq();
    c.arg("retention").args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The dry run, then the pass, against the store `env` names, holding `id`.
async fn dry_run_then_pass(env: &[(&str, &str)], store: &dyn Store, id: &str) {
    let later = (chrono::Utc::now() + chrono::TimeDelta::days(40)).to_rfc3339();
    let mut with_days = env.to_vec();
    with_days.push(("AGENTQ_RETENTION_DAYS", "30"));
    // Today nothing is due.
    let out = retention(&with_days, &["--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).lines().count(),
        1,
        "{}",
        text(&out.stdout)
    );
    // Forty days on, the tree would go: listed, not deleted.
    let out = retention(&with_days, &["--dry-run", "--at", &later]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.lines().any(|l| l == "acme\tdefault\tnone\t30\t1\t1"),
        "{stdout}"
    );
    assert!(text(&out.stderr).contains("nothing was deleted"));
    assert!(store.get(id).await.unwrap().is_some());
    // A rule stored through the API over the configured one: acme's trees are kept 50
    // days, so forty days on nothing of acme would go; the dry run names the rule.
    let acme = StoredRetentionRule {
        kind: RuleKind::Tenant,
        name: "acme".into(),
        days: 50,
        keep: Keep::Result,
        updated_at: chrono::Utc::now(),
    };
    store.set_retention_rule(&acme).await.unwrap();
    let out = retention(&with_days, &["--dry-run", "--at", &later]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).lines().count(),
        1,
        "{}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("rule tenant acme: 50 days, keep result (stored)")
            && stderr.contains("rule global: 30 days, keep none (config)"),
        "{stderr}"
    );
    assert!(
        store
            .delete_retention_rule(RuleKind::Tenant, "acme")
            .await
            .unwrap()
    );
    // The pass deletes it.
    let out = retention(&with_days, &["--at", &later]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&report["trees"], &report["sessions"]),
        (&1.into(), &1.into())
    );
    assert!(store.get(id).await.unwrap().is_none());
    // 0 days is a configuration error naming the key and its variable.
    let mut zero = env.to_vec();
    zero.push(("AGENTQ_RETENTION_DAYS", "0"));
    let out = retention(&zero, &["--dry-run"]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("retention.days") && stderr.contains("AGENTQ_RETENTION_DAYS"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_and_pass_on_the_embedded_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentq.db");
    let store = agentq_core::sqlite::SqliteStore::open(&path).await.unwrap();
    store.migrate().await.unwrap();
    let id = finished(&store, "acme").await;
    let path = path.display().to_string();
    dry_run_then_pass(&[("AGENTQ_DB", path.as_str())], &store, &id).await;
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_and_pass_on_postgres() {
    let db = migrated_db();
    let store = agentq_core::pg::PgStore::connect(&db, 2).await.unwrap();
    let id = finished(&store, "acme").await;
    dry_run_then_pass(&[("AGENTQ_DATABASE_URL", db.as_str())], &store, &id).await;
}
