//! Retention, on every backend: which finished trees a rule takes (old enough by the
//! finish of their last session, not in a batch still running, in the rule's tenant and
//! queue), and what their deletion removes (rows, transcripts, inboxes, approvals,
//! manifests, and the contents no other workspace holds) and keeps (the usage on the
//! costs ledger, the contents another tree shares, every tree it did not take; with
//! `keep = "result"` the rows and answers). "Now" is passed in: a case looks forty days
//! ahead instead of moving the database's clock.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use agentq_agent::schema::Message;
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_store::store::Store;
use agentq_types::config::{RetentionOverride, RetentionSection};
use agentq_types::fork::{ForkResult, NewFork};
use agentq_types::model::{NewSession, SessionStatus};
use agentq_types::protocol::InboxKind;
use agentq_types::report::CostFilter;
use agentq_types::retention::{Keep, RetentionRule, RetentionScope, RuleKind, StoredRetentionRule};
use agentq_types::workspace::sha256_hex;

use crate::common::files::{bytes, input, with_files};
use crate::common::{Backend, TTL, acquire, contract_tests, iterate, steer};

contract_tests!(
    contract_old_finished_trees_go_with_what_they_own,
    contract_keep_result_keeps_rows_and_answers,
    contract_rules_by_tenant_and_queue,
    contract_stored_rules_replace_the_configured,
    contract_a_workspace_fork_keeps_its_files,
    contract_a_session_fork_keeps_the_tree_it_reads,
);

fn ahead(days: i64) -> DateTime<Utc> {
    Utc::now() + TimeDelta::days(days)
}

fn global(days: u32, keep: Keep) -> RetentionRule {
    RetentionRule {
        scope: RetentionScope::default(),
        days,
        keep,
    }
}

/// One step with usage (`iterate`), then the final answer.
async fn run_to_end(store: &dyn Store, id: &str, answer: &str) {
    let (lease, mut state) = acquire(store, id, "w", TTL).await;
    let mut persisted = state.messages.len();
    iterate(store, &lease, &mut state, &mut persisted, 1).await;
    state.push_assistant(Message::assistant(answer));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some(answer.into()),
        error: None,
    });
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    assert_eq!(
        store.get(id).await.unwrap().unwrap().status,
        SessionStatus::Completed
    );
}

/// A child of `root` in its tree, created.
async fn child_of(store: &dyn Store, root: &str, queue: &str) -> String {
    let mut c = NewSession::root(SessionSpec::new("child"), queue);
    c.root_id = root.to_string();
    c.parent_id = Some(root.to_string());
    c.depth = 1;
    store.create_session(&c).await.unwrap().0.id
}

async fn roots(store: &dyn Store, rule: &RetentionRule, now: DateTime<Utc>) -> Vec<String> {
    let mut r: Vec<String> = store
        .retention_candidates(rule, now, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.root_id)
        .collect();
    r.sort();
    r
}

fn sorted<const N: usize>(ids: [&str; N]) -> Vec<String> {
    let mut v: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

fn all_costs() -> CostFilter {
    CostFilter {
        tenant: None,
        since: Utc::now() - TimeDelta::days(2),
        until: Utc::now() + TimeDelta::days(2),
        limit: 100,
    }
}

async fn contract_old_finished_trees_go_with_what_they_own(store: &dyn Backend) {
    // A: a finished tree of two sessions, with files, an inbox item and a decision.
    let shared = b"a content two trees hold";
    let own = b"a content only tree A holds";
    let a = store
        .create_session(&with_files(
            "a",
            "default",
            vec![input("own.txt", own), input("shared.txt", shared)],
        ))
        .await
        .unwrap()
        .0
        .id;
    let a_child = child_of(store, &a, "default").await;
    store
        .deliver(&a, InboxKind::Message, "m1", &steer("hi"), &[])
        .await
        .unwrap();
    store
        .decide_approval(&a, "call_x", true, None, None)
        .await
        .unwrap();
    run_to_end(store, &a_child, "child done").await;
    run_to_end(store, &a, "a done").await;
    // C: running, holding the shared content too.
    let c = store
        .create_session(&with_files("c", "default", vec![input("s.txt", shared)]))
        .await
        .unwrap()
        .0
        .id;
    let _running = acquire(store, &c, "w2", TTL).await;
    // D: its root finished, its sub-agent not.
    let d = store
        .create_session(&NewSession::root(SessionSpec::new("d"), "default"))
        .await
        .unwrap()
        .0
        .id;
    let _d_child = child_of(store, &d, "default").await;
    run_to_end(store, &d, "d done").await;
    // E: finished, in a batch whose other item still waits.
    // A batch's sessions share its partition (its shard), as the API mints them.
    let batch = agentq_types::model::new_session_id();
    let in_batch = |prompt: &str| {
        let mut s = NewSession::root(SessionSpec::new(prompt), "default");
        s.id = agentq_types::shard::id_beside(&batch);
        s.root_id = s.id.clone();
        s.sched.batch_id = Some(batch.clone());
        s
    };
    let e = store.create_session(&in_batch("e")).await.unwrap().0.id;
    let e2 = in_batch("e2");
    let e2 = store.create_session(&e2).await.unwrap().0.id;
    run_to_end(store, &e, "e done").await;

    let rule = global(30, Keep::None);
    // Finished today: nothing is due yet.
    assert!(roots(store, &rule, Utc::now()).await.is_empty());
    assert!(roots(store, &rule, ahead(29)).await.is_empty());
    // Forty days on: only A (C runs, D's sub-agent and E's batch are not finished).
    assert_eq!(roots(store, &rule, ahead(40)).await, sorted([a.as_str()]));
    let found = store
        .retention_candidates(&rule, ahead(40), 10)
        .await
        .unwrap();
    assert_eq!(found[0].sessions, 2);
    assert_eq!(
        (found[0].tenant.as_str(), found[0].queue.as_str()),
        ("default", "default")
    );

    let costs = store.costs(&all_costs()).await.unwrap();
    let before = (store.rows("sessions").await, store.rows("messages").await);
    let retired = store
        .retire_trees(
            &rule,
            ahead(40),
            &[a.clone(), c.clone(), d.clone(), e.clone()],
        )
        .await
        .unwrap();
    // Only what is due is taken, whatever the caller asked for.
    assert_eq!(retired.roots, vec![a.clone()]);
    assert_eq!(retired.sessions, 2);
    assert_eq!(retired.pruned, 0);
    assert!(retired.messages >= 4, "{retired:?}");
    if store.shards() == 1 {
        assert_eq!(retired.blob_bytes, own.len() as u64);
    } else {
        // Blobs are on every shard; the tree's shard also frees those only other
        // shards' trees reference.
        assert!(retired.blob_bytes >= own.len() as u64, "{retired:?}");
    }
    assert!(store.get(&a).await.unwrap().is_none());
    assert!(store.get(&a_child).await.unwrap().is_none());
    assert_eq!(store.rows("sessions").await, before.0 - 2);
    assert_eq!(
        store.rows("messages").await,
        before.1 - i64::try_from(retired.messages).unwrap()
    );
    for table in ["inbox", "approvals"] {
        assert_eq!(store.rows(table).await, 0, "{table}");
    }
    assert!(store.workspace_files(&a).await.unwrap().is_empty());
    assert_eq!(store.rows("retired_usage").await, 2);
    // What the tenant spent is what it was.
    assert_eq!(store.costs(&all_costs()).await.unwrap(), costs);

    // The collector takes A's own content and leaves the one C holds.
    // (Each shard holds its copy of a blob, and collects it.)
    let collected = store.collect_blobs(Duration::ZERO, 100).await.unwrap();
    assert!(
        (1..=store.shards() as u64).contains(&collected),
        "{collected}"
    );
    assert!(store.get_blob(&sha256_hex(own)).await.unwrap().is_none());
    assert_eq!(bytes(store, &c, "s.txt").await.unwrap(), shared.to_vec());
    // The others are untouched, and go once they finish.
    for id in [&c, &d, &e, &e2] {
        assert!(store.get(id).await.unwrap().is_some());
    }
    drop(_running);
    run_to_end(store, &e2, "e2 done").await;
    assert_eq!(
        roots(store, &rule, ahead(40)).await,
        sorted([e.as_str(), e2.as_str()])
    );
    let costs = store.costs(&all_costs()).await.unwrap();
    let retired = store
        .retire_trees(&rule, ahead(40), &[e.clone(), e2.clone()])
        .await
        .unwrap();
    assert_eq!(retired.sessions, 2);
    assert_eq!(store.costs(&all_costs()).await.unwrap(), costs);
}

async fn contract_keep_result_keeps_rows_and_answers(store: &dyn Backend) {
    let a = store
        .create_session(&with_files("a", "default", vec![input("f.txt", b"f")]))
        .await
        .unwrap()
        .0
        .id;
    run_to_end(store, &a, "the answer").await;
    let transcript = store.messages(&a).await.unwrap().len();
    assert!(transcript > 2);
    let rule = global(30, Keep::Result);
    let retired = store
        .retire_trees(&rule, ahead(40), std::slice::from_ref(&a))
        .await
        .unwrap();
    assert_eq!((retired.sessions, retired.pruned), (0, 1));
    let row = store.get(&a).await.unwrap().unwrap();
    assert_eq!(row.result.as_deref(), Some("the answer"));
    assert_eq!(row.status, SessionStatus::Completed);
    // The prompt is part of the spec, kept with the row; the rest of the transcript went.
    assert!(store.messages(&a).await.unwrap().len() <= 1);
    assert!(store.workspace_files(&a).await.unwrap().is_empty());
    // Pruned once: the rule does not take it again, a rule keeping nothing does.
    assert!(roots(store, &rule, ahead(40)).await.is_empty());
    let none = global(30, Keep::None);
    assert_eq!(roots(store, &none, ahead(40)).await, sorted([a.as_str()]));
}

async fn contract_rules_by_tenant_and_queue(store: &dyn Backend) {
    let acme = finished_root(store, "acme", "default").await;
    let acme_scratch = finished_root(store, "acme", "scratch").await;
    let globex_scratch = finished_root(store, "globex", "scratch").await;
    let globex = finished_root(store, "globex", "default").await;
    let cfg = RetentionSection {
        days: Some(30),
        tenants: [(
            "acme".to_string(),
            RetentionOverride {
                days: Some(7),
                keep: Some(Keep::Result),
            },
        )]
        .into(),
        queues: [(
            "scratch".to_string(),
            RetentionOverride {
                days: Some(1),
                keep: None,
            },
        )]
        .into(),
        ..RetentionSection::default()
    };
    let rules = cfg.rules();
    assert_eq!(rules.len(), 3);
    let due = |days: i64| {
        let rules = rules.clone();
        async move {
            let mut all = Vec::new();
            for r in &rules {
                all.extend(roots(store, r, ahead(days)).await);
            }
            all.sort();
            all
        }
    };
    // The queue's day applies to globex only: acme's own rule covers its scratch too.
    assert_eq!(due(2).await, sorted([globex_scratch.as_str()]));
    assert_eq!(
        due(8).await,
        sorted([
            acme.as_str(),
            acme_scratch.as_str(),
            globex_scratch.as_str()
        ])
    );
    assert_eq!(
        due(31).await,
        sorted([
            acme.as_str(),
            acme_scratch.as_str(),
            globex_scratch.as_str(),
            globex.as_str()
        ])
    );
    // acme's rule keeps results.
    assert_eq!(rules[0].keep, Keep::Result);
    assert_eq!(rules[0].scope.tenant.as_deref(), Some("acme"));
}

fn stored(kind: RuleKind, name: &str, days: u32, keep: Keep) -> StoredRetentionRule {
    let at = DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap();
    StoredRetentionRule {
        kind,
        name: name.into(),
        days,
        keep,
        updated_at: at,
    }
}

/// Rules stored through the API: read back as written (tenants first), a second set of
/// one tenant replacing the first, a delete answering whether there was one; over the
/// configuration they change what a pass takes and deletes (a stored tenant's rule over
/// the configured one of that tenant, a stored queue's over the configured global).
async fn contract_stored_rules_replace_the_configured(store: &dyn Backend) {
    assert!(store.retention_rules().await.unwrap().is_empty());
    let first = stored(RuleKind::Tenant, "acme", 3, Keep::None);
    store.set_retention_rule(&first).await.unwrap();
    let acme = stored(RuleKind::Tenant, "acme", 40, Keep::Result);
    store.set_retention_rule(&acme).await.unwrap();
    let scratch = stored(RuleKind::Queue, "scratch", 1, Keep::None);
    store.set_retention_rule(&scratch).await.unwrap();
    let gone = stored(RuleKind::Queue, "gone", 5, Keep::None);
    store.set_retention_rule(&gone).await.unwrap();
    assert!(
        store
            .delete_retention_rule(RuleKind::Queue, "gone")
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete_retention_rule(RuleKind::Queue, "gone")
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete_retention_rule(RuleKind::Queue, "acme")
            .await
            .unwrap()
    );
    let rules = store.retention_rules().await.unwrap();
    assert_eq!(rules, vec![acme.clone(), scratch.clone()]);

    let acme_id = finished_root(store, "acme", "default").await;
    let globex_scratch = finished_root(store, "globex", "scratch").await;
    let globex = finished_root(store, "globex", "default").await;
    // Configured: 30 days, acme 7. Stored: acme 40 keeping results, scratch 1.
    let cfg = RetentionSection {
        days: Some(30),
        tenants: [(
            "acme".to_string(),
            RetentionOverride {
                days: Some(7),
                keep: None,
            },
        )]
        .into(),
        ..RetentionSection::default()
    };
    let effective = cfg.rules_with(&rules);
    let due = |days: i64| {
        let rules = effective.clone();
        async move {
            let mut all = Vec::new();
            for r in &rules {
                all.extend(roots(store, r, ahead(days)).await);
            }
            all.sort();
            all
        }
    };
    assert_eq!(due(2).await, sorted([globex_scratch.as_str()]));
    // Without the stored rules acme's 7 days would take it by now.
    assert_eq!(due(8).await, sorted([globex_scratch.as_str()]));
    assert_eq!(
        due(31).await,
        sorted([globex_scratch.as_str(), globex.as_str()])
    );
    assert_eq!(
        due(41).await,
        sorted([acme_id.as_str(), globex_scratch.as_str(), globex.as_str()])
    );
    // A pass at day 8 deletes the scratch tree only.
    for rule in &effective {
        let found = roots(store, rule, ahead(8)).await;
        store.retire_trees(rule, ahead(8), &found).await.unwrap();
    }
    assert!(store.get(&globex_scratch).await.unwrap().is_none());
    assert!(store.get(&globex).await.unwrap().is_some());
    assert!(store.get(&acme_id).await.unwrap().is_some());
    // The stored tenant rule keeps results when it takes acme's tree.
    let acme_rule = effective
        .iter()
        .find(|r| r.scope.tenant.as_deref() == Some("acme"))
        .unwrap();
    assert_eq!((acme_rule.days, acme_rule.keep), (40, Keep::Result));
}

/// A session started from an old tree's workspace holds a copy of its manifest: the old
/// tree goes, the fork's files (their contents shared) stay readable, before and after the
/// collector runs.
async fn contract_a_workspace_fork_keeps_its_files(store: &dyn Backend) {
    let data = b"the source's file";
    let source = store
        .create_session(&with_files("src", "default", vec![input("f.txt", data)]))
        .await
        .unwrap()
        .0
        .id;
    run_to_end(store, &source, "done").await;
    let mut fork = NewSession::root(SessionSpec::new("fork"), "default");
    fork.workspace_from = Some(source.clone());
    let fork = store.create_session(&fork).await.unwrap().0.id;
    let rule = global(30, Keep::None);
    let retired = store
        .retire_trees(&rule, ahead(40), std::slice::from_ref(&source))
        .await
        .unwrap();
    assert_eq!(retired.roots, vec![source.clone()]);
    // The content is the fork's too: nothing was released.
    assert_eq!(retired.blob_bytes, 0);
    assert!(store.get(&source).await.unwrap().is_none());
    store.collect_blobs(Duration::ZERO, 100).await.unwrap();
    assert_eq!(bytes(store, &fork, "f.txt").await.unwrap(), data.to_vec());
}

/// A fork reads its history up to its step from the tree it was forked from: that tree
/// stays while the fork exists, however old, and goes at a pass after the fork went.
async fn contract_a_session_fork_keeps_the_tree_it_reads(store: &dyn Backend) {
    let origin = store
        .create_session(&NewSession::root(SessionSpec::new("origin"), "default"))
        .await
        .unwrap()
        .0
        .id;
    run_to_end(store, &origin, "done").await;
    let fork = match store
        .fork_session(&NewFork {
            new: NewSession::root(SessionSpec::new("ignored"), "default"),
            origin: origin.clone(),
            at_iteration: 1,
            message: None,
        })
        .await
        .unwrap()
    {
        ForkResult::Forked(row) => row.id,
        other => panic!("expected a fork, got {other:?}"),
    };
    run_to_end(store, &fork, "forked").await;
    let rule = global(30, Keep::None);
    // Both are old and finished; only the fork may go.
    assert_eq!(roots(store, &rule, ahead(40)).await, vec![fork.clone()]);
    let retired = store
        .retire_trees(&rule, ahead(40), std::slice::from_ref(&origin))
        .await
        .unwrap();
    assert!(retired.roots.is_empty(), "{:?}", retired.roots);
    assert!(store.get(&origin).await.unwrap().is_some());
    let retired = store
        .retire_trees(&rule, ahead(40), std::slice::from_ref(&fork))
        .await
        .unwrap();
    assert_eq!(retired.roots, vec![fork.clone()]);
    assert_eq!(roots(store, &rule, ahead(40)).await, vec![origin.clone()]);
}

/// A root of `tenant` on `queue`, run to its end.
async fn finished_root(store: &dyn Backend, tenant: &str, queue: &str) -> String {
    let n = NewSession::root(SessionSpec::new("p"), queue).with_tenant(tenant);
    let id = store.create_session(&n).await.unwrap().0.id;
    run_to_end(store, &id, "done").await;
    id
}
