//! The `BudgetStore` contract, run against Postgres and SQLite like the rest of the
//! contract: a child's allowance drawn from its parent's remaining budget and given back
//! once, the cap on a tree's sessions, both under concurrent spawns, a finished sub-agent
//! started again drawing from its tree, tree usage per model, tenant spend per day and
//! stored tenant budgets, and tenant holds. A property test runs random sequences of
//! spawns, calls, ends, cancels, dead workers, follow-ups, retries and sweeps against the
//! tree ledger's invariants.

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::ExitReason;
use agentq_error::Error;
use agentq_store::Checkpoint;
use agentq_store::RetryResult;
use agentq_store::store::Store;
use agentq_types::budget::{
    Ledger, OnBudget, Period, SpawnBudget, SpawnLimits, Spawned, Spend, TenantBudget, TenantHold,
};
use agentq_types::model::{Claim, SessionStatus, new_session_id};

use crate::common::tree::{
    as_new, child_of, create_root, end_spending, finish_spending, ledger_of, limits, spawn_child,
    spawn_with_sub, spend_on,
};
use crate::common::{Backend, TTL};

macro_rules! budget_contract_tests {
    ($($case:ident),* $(,)?) => {
        mod pg {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = std::sync::Arc::new(crate::common::pg_store().await);
                    super::$case(store).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (_dir, store) = crate::common::sqlite_store().await;
                    let store = std::sync::Arc::new(store);
                    super::$case(store.clone()).await;
                    store.close().await;
                }
            )*
        }
    };
}

budget_contract_tests!(
    budget_child_draws_and_gives_back_once,
    budget_refuses_when_nothing_is_left,
    budget_tree_cap_holds_under_concurrent_spawns,
    budget_last_of_the_budget_goes_to_one_of_two_racing_spawns,
    budget_repeated_spawn_answers_the_same_child,
    budget_sweeper_finds_unreturned_allowances,
    budget_tree_usage_per_model,
    budget_tree_usage_counts_the_model_a_worker_called,
    budget_web_searches_are_stored_and_summed_per_tree,
    budget_tenant_spend_and_stored_budgets,
    budget_tenant_holds_bound_the_calls_in_flight,
    budget_tenant_totals_follow_days_months_retries_and_dead_holds,
    budget_tenant_calls_in_rounds_end_within_the_budget,
    budget_settlement_tried_again_counts_once,
    budget_reopened_child_draws_from_its_tree_and_counts_once,
    budget_reopen_refused_when_the_tree_has_nothing_left,
    budget_reopen_gives_back_first_when_its_worker_died,
    budget_late_grandchild_and_its_reopening_reach_the_root,
    budget_tenant_holds_make_calls_wait_and_spend_refuses,
    budget_spawn_counts_the_spend_its_parent_has_not_checkpointed,
    budget_reopened_child_is_bounded_by_what_its_sub_agents_consumed_too,
);

/// A spawn's grant is drawn from what is left after the parent's spend as its running
/// worker knows it (`parent_spent`: its guardian's reviews are checkpointed only after the
/// round), or the stored spend when that is larger: never from a count the parent has
/// already passed.
async fn budget_spawn_counts_the_spend_its_parent_has_not_checkpointed(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    spend_on(store.as_ref(), &r.id, 100, 0).await;
    let with_spent = |requested, parent_spent| SpawnLimits {
        max_tree_sessions: 10,
        budget: Some(SpawnBudget {
            parent_allowance: 1000,
            requested,
            parent_spent,
        }),
    };
    // 400 spent as the run knows it: everything asked for is what is left after it.
    let (_, a) = spawn_child(store.as_ref(), &r, "a", &with_spent(Some(5000), 400)).await;
    assert_eq!(a.spec.token_budget, Some(600));
    assert_eq!(
        store.ledger(&a.id).await.unwrap().unwrap().allowance,
        Some(600)
    );
    // Nothing is left once the run's count is taken: refused, nothing written.
    match store
        .spawn_session(&child_of(&r, "b"), &with_spent(None, 400))
        .await
        .unwrap()
    {
        Spawned::NoBudget { remaining } => assert_eq!(remaining, 0),
        other => panic!("{other:?}"),
    }
    // A count behind the stored spend is not believed over it.
    finish_spending(store.as_ref(), &a.id, 100, 0).await;
    assert!(store.return_budget(&a.id).await.unwrap());
    let (_, c) = spawn_child(store.as_ref(), &r, "c", &with_spent(Some(5000), 0)).await;
    // 1000 - 100 (stored, the root) - 100 (a spent).
    assert_eq!(c.spec.token_budget, Some(800));
}

/// A sub-agent's `token_budget` bounds it and its own sub-agents over its whole life, as
/// a root's does: one that spent its allowance through a sub-agent of its own cannot be
/// started again for more. It used to count only its own spend, so that each follow-up
/// granted it its budget less that (here 400 more, again and again), up to all its tree
/// had left.
async fn budget_reopened_child_is_bounded_by_what_its_sub_agents_consumed_too(
    store: Arc<dyn Store>,
) {
    let r = create_root(store.as_ref(), Some(10_000)).await;
    let (a, g) = spawn_with_sub(
        store.as_ref(),
        &r,
        ("a", &limits(10, Some(10_000), Some(500))),
        ("g", &limits(10, Some(500), Some(400))),
    )
    .await;
    finish_spending(store.as_ref(), &g.id, 400, 0).await;
    assert!(store.return_budget(&g.id).await.unwrap());
    finish_spending(store.as_ref(), &a.id, 100, 0).await;
    assert!(store.return_budget(&a.id).await.unwrap());
    // `a` and its child consumed all of its 500.
    assert_eq!(
        ledger_of(store.as_ref(), &r.id, 10_000).await,
        (0, 500, 9_500)
    );
    let before = store.get(&a.id).await.unwrap().unwrap();
    match store.follow_up(&a.id, "more", None).await {
        Err(Error::NoBudget(m)) => assert!(m.contains(&a.id), "{m}"),
        other => panic!("a sub-agent re-opened past its own token_budget: {other:?}"),
    }
    assert_eq!(store.get(&a.id).await.unwrap().unwrap(), before);
    assert_eq!(
        ledger_of(store.as_ref(), &r.id, 10_000).await,
        (0, 500, 9_500)
    );

    // One that consumed 300 of its 500 (100 itself, 200 through its child) gets 200 more.
    let (b, h) = spawn_with_sub(
        store.as_ref(),
        &r,
        ("b", &limits(10, Some(10_000), Some(500))),
        ("h", &limits(10, Some(500), Some(300))),
    )
    .await;
    finish_spending(store.as_ref(), &h.id, 200, 0).await;
    assert!(store.return_budget(&h.id).await.unwrap());
    finish_spending(store.as_ref(), &b.id, 100, 0).await;
    assert!(store.return_budget(&b.id).await.unwrap());
    store.follow_up(&b.id, "more", None).await.unwrap().unwrap();
    assert_eq!(
        store.ledger(&b.id).await.unwrap().unwrap().allowance,
        Some(500),
        "its 300 consumed plus the 200 its token_budget still allows"
    );
}

async fn budget_child_draws_and_gives_back_once(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    spend_on(store.as_ref(), &r.id, 150, 50).await;
    // 800 remain: the default grant is half of it.
    let (a, row) = spawn_child(store.as_ref(), &r, "a", &limits(10, Some(1000), None)).await;
    assert_eq!(row.spec.token_budget, Some(400));
    assert_eq!(
        store.get(&a.id).await.unwrap().unwrap().spec.token_budget,
        Some(400)
    );
    let l = store.ledger(&r.id).await.unwrap().unwrap();
    assert_eq!(
        l,
        Ledger {
            allowance: None,
            spent: 200,
            held: 400,
            children_spent: 0
        }
    );
    assert_eq!(l.remaining(1000, 0), 400);
    assert_eq!(
        store.ledger(&a.id).await.unwrap().unwrap().allowance,
        Some(400)
    );
    // A grandchild asks for more than its parent has: it gets all of it.
    let (g, grow) = spawn_child(
        store.as_ref(),
        &a,
        "g",
        &limits(10, Some(400), Some(10_000)),
    )
    .await;
    assert_eq!(grow.spec.token_budget, Some(400));
    // Not finished: nothing goes back.
    assert!(!store.return_budget(&a.id).await.unwrap());
    // The grandchild spends 70 and finishes: its parent holds nothing and counts 70.
    finish_spending(store.as_ref(), &g.id, 60, 10).await;
    assert!(store.return_budget(&g.id).await.unwrap());
    assert!(!store.return_budget(&g.id).await.unwrap(), "once only");
    let la = store.ledger(&a.id).await.unwrap().unwrap();
    assert_eq!((la.held, la.children_spent), (0, 70));
    assert_eq!(la.remaining(400, 0), 330);
    // The child spends 30 itself and finishes: the root gets back all but 100.
    finish_spending(store.as_ref(), &a.id, 20, 10).await;
    assert!(store.return_budget(&a.id).await.unwrap());
    let l = store.ledger(&r.id).await.unwrap().unwrap();
    assert_eq!((l.held, l.children_spent), (0, 100));
    assert_eq!(l.remaining(1000, 0), 700);
    // A root gives nothing back (it has no parent).
    finish_spending(store.as_ref(), &r.id, 0, 0).await;
    assert!(!store.return_budget(&r.id).await.unwrap());
}

async fn budget_refuses_when_nothing_is_left(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(100)).await;
    spend_on(store.as_ref(), &r.id, 90, 10).await;
    let a = child_of(&r, "a");
    assert_eq!(
        store
            .spawn_session(&a, &limits(10, Some(100), None))
            .await
            .unwrap(),
        Spawned::NoBudget { remaining: 0 }
    );
    assert!(store.get(&a.id).await.unwrap().is_none(), "nothing created");
    // Without a budget the same spawn passes (the cap alone applies).
    let (_, row) = spawn_child(store.as_ref(), &r, "b", &limits(10, None, None)).await;
    assert_eq!(row.spec.token_budget, None);
}

async fn budget_tree_cap_holds_under_concurrent_spawns(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), None).await;
    // A cap of 5: the root and four children, however many spawn at once.
    let mut tasks = Vec::new();
    for i in 0..12 {
        let store = store.clone();
        let c = child_of(&r, &format!("c{i}"));
        tasks.push(tokio::spawn(async move {
            store
                .spawn_session(&c, &limits(5, None, None))
                .await
                .unwrap()
        }));
    }
    let mut made = 0;
    let mut full = 0;
    for t in tasks {
        match t.await.unwrap() {
            Spawned::Created(_) => made += 1,
            Spawned::TreeFull { max } => {
                assert_eq!(max, 5);
                full += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((made, full), (4, 8));
    // Grandchildren count against the same root.
    let kids = store
        .list(&agentq_types::model::ListFilter {
            parent_id: Some(r.id.clone()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(kids.len(), 4);
    let gc = child_of(&as_new(&kids[0]), "gc");
    assert_eq!(
        store
            .spawn_session(&gc, &limits(5, None, None))
            .await
            .unwrap(),
        Spawned::TreeFull { max: 5 }
    );
}

async fn budget_last_of_the_budget_goes_to_one_of_two_racing_spawns(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    spend_on(store.as_ref(), &r.id, 900, 0).await;
    // 100 left; each asks for all of it. However they interleave, one gets it.
    for round in 0..3 {
        let a = child_of(&r, &new_session_id());
        let b = child_of(&r, &new_session_id());
        let (sa, sb) = (store.clone(), store.clone());
        let ta = tokio::spawn(async move {
            sa.spawn_session(&a, &limits(100, Some(1000), Some(100)))
                .await
                .unwrap()
        });
        let tb = tokio::spawn(async move {
            sb.spawn_session(&b, &limits(100, Some(1000), Some(100)))
                .await
                .unwrap()
        });
        let outcomes = [ta.await.unwrap(), tb.await.unwrap()];
        let grants: Vec<u64> = outcomes
            .iter()
            .filter_map(|s| match s {
                Spawned::Created(row) => row.spec.token_budget,
                _ => None,
            })
            .collect();
        // The first round: one of the two got the 100, the other nothing; later rounds
        // find nothing left.
        let want: Vec<u64> = if round == 0 { vec![100] } else { vec![] };
        assert_eq!(grants, want, "{outcomes:?}");
        let l = store.ledger(&r.id).await.unwrap().unwrap();
        assert_eq!((l.held, l.remaining(1000, 0)), (100, 0));
    }
}

async fn budget_repeated_spawn_answers_the_same_child(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    let (_, first) = spawn_child(
        store.as_ref(),
        &r,
        "same-call",
        &limits(10, Some(1000), None),
    )
    .await;
    // The call runs again (a resumed parent): another id, the same key.
    let mut again = child_of(&r, "same-call");
    again.id = new_session_id();
    match store
        .spawn_session(&again, &limits(10, Some(1000), None))
        .await
        .unwrap()
    {
        Spawned::Existing(row) => assert_eq!(row.id, first.id),
        other => panic!("{other:?}"),
    }
    let l = store.ledger(&r.id).await.unwrap().unwrap();
    assert_eq!(l.held, 500, "drawn once");
    // Even with the tree full, the repeat is answered.
    match store
        .spawn_session(&again, &limits(1, Some(1000), None))
        .await
        .unwrap()
    {
        Spawned::Existing(row) => assert_eq!(row.id, first.id),
        other => panic!("{other:?}"),
    }
}

async fn budget_sweeper_finds_unreturned_allowances(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    let (a, _) = spawn_child(store.as_ref(), &r, "a", &limits(10, Some(1000), None)).await;
    assert!(store.unreturned_budgets(10).await.unwrap().is_empty());
    // Cancelled while queued: no worker ran it, so nobody gave its budget back.
    store.request_cancel(&a.id).await.unwrap();
    assert_eq!(
        store.unreturned_budgets(10).await.unwrap(),
        vec![a.id.clone()]
    );
    assert!(store.return_budget(&a.id).await.unwrap());
    assert!(store.unreturned_budgets(10).await.unwrap().is_empty());
    let l = store.ledger(&r.id).await.unwrap().unwrap();
    assert_eq!((l.held, l.children_spent), (0, 0));
}

async fn budget_tree_usage_per_model(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), None).await;
    spend_on(store.as_ref(), &r.id, 100, 10).await;
    for k in ["a", "b"] {
        let (c, _) = spawn_child(store.as_ref(), &r, k, &limits(10, None, None)).await;
        spend_on(store.as_ref(), &c.id, 1000, 100).await;
    }
    let usage = store.tree_usage(&r.id).await.unwrap();
    assert_eq!(usage.len(), 2, "{usage:?}");
    let child = usage
        .iter()
        .find(|u| u.model.as_deref() == Some("child-model"))
        .unwrap();
    assert_eq!(child.sessions, 2);
    assert_eq!(
        (child.usage.input_tokens, child.usage.output_tokens),
        (2000, 200)
    );
    let root = usage.iter().find(|u| u.model.is_none()).unwrap();
    assert_eq!((root.sessions, root.usage.input_tokens), (1, 100));
    assert!(store.tree_usage("no-such-root").await.unwrap().is_empty());
}

/// A session that names no model runs on its worker's default: the checkpoint stores it
/// (one without a model keeps it), the row shows it, and the tree's usage counts under it.
async fn budget_tree_usage_counts_the_model_a_worker_called(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), None).await;
    let Claim::Acquired {
        lease, mut state, ..
    } = store.claim(&r.id, "w", TTL, 10).await.unwrap()
    else {
        panic!("claim");
    };
    assert_eq!(store.get(&r.id).await.unwrap().unwrap().model_used, None);
    let mut m = Message::assistant("working");
    m.usage = Some(Usage {
        input_tokens: 40,
        output_tokens: 4,
        ..Default::default()
    });
    state.push_assistant(m);
    let cp = Checkpoint::new(&lease, &state, 0)
        .unwrap()
        .with_model(Some("worker-default".into()));
    store
        .checkpoint_batch(&[&cp])
        .await
        .unwrap()
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(
        store
            .get(&r.id)
            .await
            .unwrap()
            .unwrap()
            .model_used
            .as_deref(),
        Some("worker-default")
    );
    state.messages.push(Message::user("more"));
    let from = state.messages.len() - 1;
    store.checkpoint(&lease, &state, from).await.unwrap();
    let row = store.get(&r.id).await.unwrap().unwrap();
    assert_eq!(row.model_used.as_deref(), Some("worker-default"));
    assert_eq!(row.spec.model, None, "the request stays as it was sent");
    let usage = store.tree_usage(&r.id).await.unwrap();
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert_eq!(usage[0].model.as_deref(), Some("worker-default"));
    assert_eq!(usage[0].usage.input_tokens, 40);
}

/// The web searches a session's provider ran are stored with its tokens (in the finished
/// row a commit hands back too), and its tree's usage sums them.
async fn budget_web_searches_are_stored_and_summed_per_tree(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), None).await;
    let (c, _) = spawn_child(store.as_ref(), &r, "a", &limits(10, None, None)).await;
    for (id, searches, ends) in [(&r.id, 2, false), (&c.id, 3, true)] {
        let Claim::Acquired {
            lease, mut state, ..
        } = store.claim(id, "w", TTL, 10).await.unwrap()
        else {
            panic!("claim");
        };
        let mut m = Message::assistant("searched");
        m.usage = Some(Usage {
            input_tokens: 10,
            output_tokens: 1,
            web_search_requests: searches,
            ..Default::default()
        });
        state.push_assistant(m);
        if ends {
            state.outcome = Some(agentq_agent::state::Outcome::new(ExitReason::Stop));
        }
        let cp = Checkpoint::new(&lease, &state, 0).unwrap();
        let committed = store
            .checkpoint_batch(&[&cp])
            .await
            .unwrap()
            .pop()
            .unwrap()
            .unwrap();
        if let Some(row) = committed {
            assert!(ends);
            assert_eq!(row.usage.web_search_requests, searches);
        }
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!(row.usage.web_search_requests, searches);
        assert_eq!(row.usage.total(), 11, "searches are no tokens");
    }
    let usage = store.tree_usage(&r.id).await.unwrap();
    let searches: u64 = usage.iter().map(|u| u.usage.web_search_requests).sum();
    assert_eq!(searches, 5, "{usage:?}");
}

async fn budget_tenant_spend_and_stored_budgets(store: Arc<dyn Store>) {
    let s = |tokens, cost_nanos| Spend { tokens, cost_nanos };
    store
        .add_tenant_spend("acme", "2026-03-01", s(100, 5))
        .await
        .unwrap();
    store
        .add_tenant_spend("acme", "2026-03-01", s(50, 1))
        .await
        .unwrap();
    store
        .add_tenant_spend("acme", "2026-03-02", s(7, 0))
        .await
        .unwrap();
    store
        .add_tenant_spend("other", "2026-03-02", s(1000, 1000))
        .await
        .unwrap();
    assert_eq!(
        store
            .tenant_spend("acme", "2026-03-01", "2026-03-01")
            .await
            .unwrap(),
        s(150, 6)
    );
    assert_eq!(
        store
            .tenant_spend("acme", "2026-03-01", "2026-03-31")
            .await
            .unwrap(),
        s(157, 6)
    );
    assert_eq!(
        store
            .tenant_spend("nobody", "2026-03-01", "2026-03-31")
            .await
            .unwrap(),
        s(0, 0)
    );
    assert!(store.tenant_budgets().await.unwrap().is_empty());
    let mut b = TenantBudget {
        tenant: "acme".into(),
        period: Period::Day,
        tokens: Some(100),
        usd_nanos: None,
        on_budget: OnBudget::Park,
    };
    store.set_tenant_budget(&b).await.unwrap();
    b.tokens = Some(1000);
    b.period = Period::Month;
    b.usd_nanos = Some(5_000_000_000);
    store.set_tenant_budget(&b).await.unwrap();
    assert_eq!(store.tenant_budgets().await.unwrap(), vec![b]);
}

/// Calls of a tenant with a budget hold their worst case while they run: of twelve calls
/// asking at once (from as many tasks, as from many workers), only those that find the
/// recorded spend plus the holds before them below the budget start, so the tenant cannot
/// pass it by more than one call. A settled hold becomes the call's real spend, which
/// frees the rest; an expired hold (a dead worker's) holds nothing; another tenant and a
/// money budget are held apart.
async fn budget_tenant_holds_bound_the_calls_in_flight(store: Arc<dyn Backend>) {
    let now = chrono::Utc::now();
    let day = agentq_types::budget::day_key(now.date_naive());
    let tokens = |n: u64| TenantBudget {
        tenant: "acme".into(),
        period: Period::Day,
        tokens: Some(n),
        usd_nanos: None,
        on_budget: OnBudget::Fail,
    };
    let hold = |tenant: &str, tokens: u64, ttl: Duration| TenantHold {
        id: new_session_id(),
        tenant: tenant.into(),
        worst: Spend {
            tokens,
            cost_nanos: 0,
        },
        ttl,
    };
    store
        .add_tenant_spend(
            "acme",
            &day,
            Spend {
                tokens: 100,
                cost_nanos: 0,
            },
        )
        .await
        .unwrap();
    let budgets = vec![tokens(1000)];
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let (store, budgets) = (store.clone(), budgets.clone());
        let h = hold("acme", 300, TTL);
        tasks.push(tokio::spawn(async move {
            let refused = store.hold_tenant_spend(&h, &budgets, now).await.unwrap();
            (h.id, refused)
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        let (id, refused) = t.await.unwrap();
        match refused {
            None => held.push(id),
            Some(r) => {
                assert_eq!(r.budget, 0);
                assert!(r.message.contains("1000 tokens"), "{}", r.message);
            }
        }
    }
    // 100 spent: holds start at 100, 400 and 700 (each below 1000); the fourth would
    // start at 1000.
    assert_eq!(held.len(), 3, "{held:?}");
    // Another tenant is not held by these.
    assert!(
        store
            .hold_tenant_spend(
                &hold("other", 300, TTL),
                &[TenantBudget {
                    tenant: "other".into(),
                    ..tokens(1000)
                }],
                now
            )
            .await
            .unwrap()
            .is_none()
    );
    // Two calls end having spent 50 each: their holds become 100 of spend, and a call
    // starts again (100 + 100 + 300 held).
    for id in &held[..2] {
        store
            .settle_tenant_hold(
                id,
                "acme",
                &day,
                Spend {
                    tokens: 50,
                    cost_nanos: 0,
                },
            )
            .await
            .unwrap();
    }
    assert_eq!(
        store.tenant_spend("acme", &day, &day).await.unwrap().tokens,
        200
    );
    assert!(
        store
            .hold_tenant_spend(&hold("acme", 300, TTL), &budgets, now)
            .await
            .unwrap()
            .is_none()
    );
    // 200 + 600 held: one more fits (800 < 1000), then none.
    assert!(
        store
            .hold_tenant_spend(&hold("acme", 300, TTL), &budgets, now)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .hold_tenant_spend(&hold("acme", 1, TTL), &budgets, now)
            .await
            .unwrap()
            .is_some()
    );
    // A hold that expired (its worker died) holds nothing: counted, its 900 would have
    // reached the 800.
    let fresh = hold("late", 900, Duration::from_millis(1));
    let late = |n| TenantBudget {
        tenant: "late".into(),
        ..tokens(n)
    };
    assert!(
        store
            .hold_tenant_spend(&fresh, &[late(800)], now)
            .await
            .unwrap()
            .is_none()
    );
    store.pass(Duration::from_millis(20)).await;
    assert!(
        store
            .hold_tenant_spend(&hold("late", 900, TTL), &[late(800)], now)
            .await
            .unwrap()
            .is_none(),
        "an expired hold still counted"
    );
    // A money budget: the holds' cost counts the same way.
    let usd = TenantBudget {
        tenant: "money".into(),
        period: Period::Month,
        tokens: None,
        usd_nanos: Some(1_000),
        on_budget: OnBudget::Park,
    };
    let costly = |cost_nanos| TenantHold {
        worst: Spend {
            tokens: 1,
            cost_nanos,
        },
        ..hold("money", 1, TTL)
    };
    assert!(
        store
            .hold_tenant_spend(&costly(999), std::slice::from_ref(&usd), now)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .hold_tenant_spend(&costly(1), std::slice::from_ref(&usd), now)
            .await
            .unwrap()
            .is_none(),
        "999 held is below 1000"
    );
    assert!(
        store
            .hold_tenant_spend(&costly(1), &[usd], now)
            .await
            .unwrap()
            .is_some()
    );
}

/// What a hold checks comes from the tenant's running totals (one row), so they must say
/// what `tenant_spend` and the holds say: a spend of an earlier day counts for the month
/// but not the day; a settled call of an earlier day (it ended across midnight) counts for
/// its own day only; a retried hold (same id) is counted once; an expired hold (a dead
/// worker's) stops counting, and its late settlement takes nothing off the others' holds.
async fn budget_tenant_totals_follow_days_months_retries_and_dead_holds(store: Arc<dyn Backend>) {
    use chrono::TimeZone;
    let now = chrono::Utc.with_ymd_and_hms(2031, 5, 20, 12, 0, 0).unwrap();
    let spend = |tokens| Spend {
        tokens,
        cost_nanos: 0,
    };
    let budget = |tenant: &str, period, n| TenantBudget {
        tenant: tenant.into(),
        period,
        tokens: Some(n),
        usd_nanos: None,
        on_budget: OnBudget::Fail,
    };
    let hold = |tenant: &str, tokens: u64, ttl: Duration| TenantHold {
        id: new_session_id(),
        tenant: tenant.into(),
        worst: spend(tokens),
        ttl,
    };
    let admits = |h: TenantHold, budgets: Vec<TenantBudget>| {
        let store = store.clone();
        async move {
            store
                .hold_tenant_spend(&h, &budgets, now)
                .await
                .unwrap()
                .is_none()
        }
    };

    // 100 spent yesterday, 60 today: a day budget of 100 sees 60, a month one of 150
    // sees 160.
    store
        .add_tenant_spend("days", "2031-05-19", spend(100))
        .await
        .unwrap();
    store
        .add_tenant_spend("days", "2031-05-20", spend(60))
        .await
        .unwrap();
    assert!(admits(hold("days", 1, TTL), vec![budget("days", Period::Day, 100)]).await);
    assert!(
        !admits(
            hold("days", 1, TTL),
            vec![budget("days", Period::Month, 150)]
        )
        .await
    );
    // Last month's spend counts for neither.
    store
        .add_tenant_spend("months", "2031-04-30", spend(500))
        .await
        .unwrap();
    let month = vec![budget("months", Period::Month, 400)];
    assert!(admits(hold("months", 1, TTL), month.clone()).await);
    // A call of yesterday settled after today's: in yesterday's spend, not today's.
    store
        .add_tenant_spend("late", "2031-05-20", spend(10))
        .await
        .unwrap();
    store
        .add_tenant_spend("late", "2031-05-19", spend(95))
        .await
        .unwrap();
    assert_eq!(
        store
            .tenant_spend("late", "2031-05-19", "2031-05-19")
            .await
            .unwrap(),
        spend(95)
    );
    assert!(admits(hold("late", 1, TTL), vec![budget("late", Period::Day, 100)]).await);
    assert!(
        !admits(
            hold("late", 1, TTL),
            vec![budget("late", Period::Month, 100)]
        )
        .await
    );

    // A retried hold is counted once: 500 held of 1000 leaves room for one more.
    let retried = hold("retry", 500, TTL);
    let thousand = vec![budget("retry", Period::Day, 1000)];
    assert!(admits(retried.clone(), thousand.clone()).await);
    assert!(
        admits(retried.clone(), thousand.clone()).await,
        "a retry is admitted"
    );
    assert!(
        admits(hold("retry", 500, TTL), thousand.clone()).await,
        "counted once"
    );
    assert!(!admits(hold("retry", 1, TTL), thousand).await);

    // A dead worker's hold of 900 expires; a call then finds the budget of 800 free, and
    // the dead call's settlement (100 spent) takes nothing off that call's hold of 10.
    let dead = hold("dead", 900, Duration::from_millis(1));
    let eight = vec![budget("dead", Period::Day, 800)];
    assert!(admits(dead.clone(), eight.clone()).await);
    store.pass(Duration::from_millis(20)).await;
    assert!(
        admits(hold("dead", 10, TTL), eight.clone()).await,
        "expired, not counted"
    );
    store
        .settle_tenant_hold(&dead.id, "dead", "2031-05-20", spend(100))
        .await
        .unwrap();
    // 100 spent + 10 held + 690 = 800: the next call finds the budget reached.
    assert!(admits(hold("dead", 690, TTL), eight.clone()).await);
    assert!(
        !admits(hold("dead", 1, TTL), eight).await,
        "the dead call's settlement took the live hold off the count"
    );
}

/// A settlement tried again (its first answer lost) counts the call's spend once: it
/// settles only while the hold is there, and the hold goes with the first settlement.
async fn budget_settlement_tried_again_counts_once(store: Arc<dyn Backend>) {
    let now = chrono::Utc::now();
    let day = agentq_types::budget::day_key(now.date_naive());
    let budgets = thousand_a_day("again");
    let hold = |n| held_by("again", n);
    let admits = async |h: &TenantHold| {
        store
            .hold_tenant_spend(h, &budgets, now)
            .await
            .unwrap()
            .is_none()
    };
    let call = hold(600);
    assert!(admits(&call).await);
    for (try_, settles) in [(1, true), (2, false), (3, false)] {
        assert_eq!(
            store
                .settle_tenant_hold_if_held(&call.id, "again", &day, tokens(100))
                .await
                .unwrap(),
            settles,
            "try {try_}"
        );
    }
    assert_eq!(
        store.tenant_spend("again", &day, &day).await.unwrap(),
        tokens(100),
        "counted once"
    );
    // The hold is off the count too: 100 spent leaves 900 to hold, and no more.
    assert!(admits(&hold(900)).await);
    assert!(!admits(&hold(1)).await);
    // No hold, no totals row: nothing counted, and no row made.
    assert!(
        !store
            .settle_tenant_hold_if_held("never-held", "nobody", &day, tokens(5))
            .await
            .unwrap()
    );
    assert_eq!(
        store.tenant_spend("nobody", &day, &day).await.unwrap(),
        tokens(0)
    );
}

/// The settlement tried again while the first, whose answer was lost, is still
/// committing: it waits for the tenant's row, then finds the hold gone and counts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_settlement_tried_again_while_the_first_commits_counts_once() {
    use agentq_store::BudgetStore;
    let store = Arc::new(crate::common::pg_store().await);
    let now = chrono::Utc::now();
    let day = agentq_types::budget::day_key(now.date_naive());
    let budgets = thousand_a_day("inflight");
    let call = held_by("inflight", 600);
    assert!(
        store
            .hold_tenant_spend(&call, &budgets, now)
            .await
            .unwrap()
            .is_none()
    );
    // The first settlement, as far as its transaction has gone when its connection drops
    // after sending the commit: the tenant's row locked, the hold deleted, the spend added.
    let mut first = store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tenant_ledger WHERE tenant = 'inflight' FOR UPDATE")
        .execute(&mut *first)
        .await
        .unwrap();
    sqlx::query("DELETE FROM tenant_holds WHERE id = $1")
        .bind(&call.id)
        .execute(&mut *first)
        .await
        .unwrap();
    sqlx::query("INSERT INTO tenant_spend (tenant, day, tokens, cost_nanos) VALUES ('inflight', $1, 100, 0)")
        .bind(&day)
        .execute(&mut *first)
        .await
        .unwrap();
    let again = {
        let (store, id, day) = (store.clone(), call.id.clone(), day.clone());
        tokio::spawn(async move {
            store
                .settle_tenant_hold_if_held(&id, "inflight", &day, tokens(100))
                .await
        })
    };
    // Wait on the event: the try's backend blocked on a lock the first one holds.
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    first.commit().await.unwrap();
    assert!(!again.await.unwrap().unwrap(), "the hold was gone");
    assert_eq!(
        store.tenant_spend("inflight", &day, &day).await.unwrap(),
        tokens(100)
    );
}

/// `n` tokens, no cost.
fn tokens(n: u64) -> Spend {
    Spend {
        tokens: n,
        cost_nanos: 0,
    }
}

/// A budget of 1,000 tokens a day for `tenant`, failing its sessions when spent.
fn thousand_a_day(tenant: &str) -> Vec<TenantBudget> {
    vec![TenantBudget {
        tenant: tenant.into(),
        period: Period::Day,
        tokens: Some(1000),
        usd_nanos: None,
        on_budget: OnBudget::Fail,
    }]
}

/// A new hold of `n` tokens by a call of `tenant`.
fn held_by(tenant: &str, n: u64) -> TenantHold {
    TenantHold {
        id: new_session_id(),
        tenant: tenant.into(),
        worst: tokens(n),
        ttl: TTL,
    }
}

/// Many calls of one tenant hold and settle at once, as a busy worker's do (Postgres takes
/// the ones that arrive together in one round): every call that started is counted, and
/// the tenant ends within its budget plus one call's spend.
async fn budget_tenant_calls_in_rounds_end_within_the_budget(store: Arc<dyn Backend>) {
    calls_in_rounds(&[store]).await;
}

/// Two processes' calls of one tenant at once: each takes its own rounds, a call alone
/// goes by its single statements, and the two lock the tenant's rows in one order, so no
/// settlement is lost to a deadlock (a lost one left its hold counted for half an hour
/// and the tenant's other calls waiting on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_two_processes_calls_in_rounds_end_within_the_budget() {
    let url = agentq_testkit::shared_postgres()
        .expect("shared postgres")
        .fresh_database()
        .expect("fresh database");
    let a = agentq_store::pg::PgStore::connect(&url, 8)
        .await
        .expect("connect");
    a.migrate().await.expect("migrate");
    let b = agentq_store::pg::PgStore::connect(&url, 8)
        .await
        .expect("connect");
    calls_in_rounds(&[Arc::new(a), Arc::new(b)]).await;
}

/// 32 tasks, over one or two `stores`, hold and settle until the budget is spent.
async fn calls_in_rounds(stores: &[Arc<dyn Backend>]) {
    let now = chrono::Utc::now();
    let day = agentq_types::budget::day_key(now.date_naive());
    let budgets = vec![TenantBudget {
        tenant: "busy".into(),
        period: Period::Day,
        tokens: Some(10_000),
        usd_nanos: None,
        on_budget: OnBudget::Fail,
    }];
    let mut tasks = Vec::new();
    for i in 0..32 {
        // With two stores, the first takes few calls (mostly alone, by the single
        // statements) and the second many (in rounds): the two ways meet on one tenant.
        let store = stores[usize::from(i >= 3) % stores.len()].clone();
        let (budgets, day) = (budgets.clone(), day.clone());
        tasks.push(tokio::spawn(async move {
            let mut started = 0u64;
            for _ in 0..20_000 {
                let h = TenantHold {
                    id: new_session_id(),
                    tenant: "busy".into(),
                    worst: Spend {
                        tokens: 500,
                        cost_nanos: 0,
                    },
                    ttl: TTL,
                };
                match store.hold_tenant_spend(&h, &budgets, now).await.unwrap() {
                    None => {
                        started += 1;
                        let spent = Spend {
                            tokens: 400,
                            cost_nanos: 0,
                        };
                        store
                            .settle_tenant_hold(&h.id, "busy", &day, spent)
                            .await
                            .unwrap();
                    }
                    // Others' holds: they settle soon.
                    Some(r) if r.holds_expire.is_some() => tokio::task::yield_now().await,
                    Some(_) => return started,
                }
            }
            panic!("a call never learned the budget was spent");
        }));
    }
    let mut started = 0;
    for t in tasks {
        started += t.await.unwrap();
    }
    let store = &stores[0];
    let spent = store.tenant_spend("busy", &day, &day).await.unwrap().tokens;
    assert_eq!(spent, started * 400, "every started call counted once");
    assert!(
        spent >= 10_000,
        "calls stopped before the budget was spent: {spent}"
    );
    assert!(
        spent < 10_000 + 400,
        "past the budget by more than one call: {spent}"
    );
}

/// A finished sub-agent started again (a follow-up, a retry) draws a new allowance from
/// its tree in the same transaction, at most what its own token_budget still allows: what
/// it spent before moves from its parent's finished children's spend back to what the
/// parent holds for it, so each of its tokens is counted once, and its next give-back
/// returns only what is new. The root's ledger always says budget minus what the tree
/// spent and holds.
async fn budget_reopened_child_draws_from_its_tree_and_counts_once(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    spend_on(store.as_ref(), &r.id, 100, 0).await;
    let (a, _) = spawn_child(store.as_ref(), &r, "a", &limits(10, Some(1000), Some(500))).await;
    finish_spending(store.as_ref(), &a.id, 200, 0).await;
    assert!(store.return_budget(&a.id).await.unwrap());
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 200, 700));

    // A follow-up: 700 left in the tree, but its own budget of 500 allows 300 more.
    let row = store.follow_up(&a.id, "more", None).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    let la = store.ledger(&a.id).await.unwrap().unwrap();
    assert_eq!(la.allowance, Some(500), "its 200 spent plus a grant of 300");
    assert_eq!(la.remaining(500, 0), 300);
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (500, 0, 400));
    assert!(store.unreturned_budgets(10).await.unwrap().is_empty());
    assert!(
        !store.return_budget(&a.id).await.unwrap(),
        "running again: nothing to give"
    );

    // It spends 250 more and ends: 450 counted once, the rest back.
    finish_spending(store.as_ref(), &a.id, 250, 0).await;
    assert!(store.return_budget(&a.id).await.unwrap());
    assert!(!store.return_budget(&a.id).await.unwrap(), "once only");
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 450, 450));

    // Again: 50 left of its own budget; cancelled before it runs, it gives all back.
    store.follow_up(&a.id, "more", None).await.unwrap().unwrap();
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (500, 0, 400));
    store.request_cancel(&a.id).await.unwrap();
    assert!(store.return_budget(&a.id).await.unwrap());
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 450, 450));

    // A retry of a child that failed with an error draws the same way.
    let (b, _) = spawn_child(store.as_ref(), &r, "b", &limits(10, Some(1000), Some(400))).await;
    end_spending(store.as_ref(), &b.id, 100, ExitReason::Error).await;
    assert!(store.return_budget(&b.id).await.unwrap());
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 550, 350));
    match store.retry(&b.id, false).await.unwrap() {
        RetryResult::Retried(row) => assert_eq!(row.status, SessionStatus::Queued),
        other => panic!("{other:?}"),
    }
    let lb = store.ledger(&b.id).await.unwrap().unwrap();
    assert_eq!(
        lb.allowance,
        Some(400),
        "its 100 spent plus 300 of its own 400"
    );
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (400, 450, 50));
    finish_spending(store.as_ref(), &b.id, 300, 0).await;
    assert!(store.return_budget(&b.id).await.unwrap());
    // 100 (root) + 450 (a) + 400 (b): the ledger says exactly what the tree spent.
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 850, 50));
    let tree: u64 = store
        .tree_usage(&r.id)
        .await
        .unwrap()
        .iter()
        .map(|m| m.usage.input_tokens + m.usage.output_tokens)
        .sum();
    assert_eq!(tree, 950);

    // A root keeps its one budget over its turns: its follow-up finds what is left.
    finish_spending(store.as_ref(), &r.id, 0, 0).await;
    store
        .follow_up(&r.id, "and then", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 850, 50));
}

/// With nothing left in the tree (or in its own budget), a follow-up or a retry is
/// refused and changes nothing: not the session, not its history, not the ledger.
async fn budget_reopen_refused_when_the_tree_has_nothing_left(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    spend_on(store.as_ref(), &r.id, 100, 0).await;
    let (a, _) = spawn_child(store.as_ref(), &r, "a", &limits(10, Some(1000), Some(450))).await;
    let (b, _) = spawn_child(store.as_ref(), &r, "b", &limits(10, Some(1000), Some(450))).await;
    finish_spending(store.as_ref(), &a.id, 450, 0).await;
    end_spending(store.as_ref(), &b.id, 200, ExitReason::Error).await;
    for c in [&a, &b] {
        assert!(store.return_budget(&c.id).await.unwrap());
    }
    // 100 + 450 + 200 spent: 250 left, but `a` spent all of its own 450.
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 650, 250));
    let before = store.get(&a.id).await.unwrap().unwrap();
    let history = store.messages(&a.id).await.unwrap();
    match store.follow_up(&a.id, "more", None).await {
        Err(Error::NoBudget(m)) => assert!(m.contains(&a.id), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get(&a.id).await.unwrap().unwrap(), before);
    assert_eq!(store.messages(&a.id).await.unwrap(), history);
    // The root spends the rest: the tree has nothing left for anyone.
    spend_on(store.as_ref(), &r.id, 250, 0).await;
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 650, 0));
    let before_b = store.get(&b.id).await.unwrap().unwrap();
    match store.retry(&b.id, false).await {
        Err(Error::NoBudget(m)) => assert!(m.contains("0 tokens left"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get(&b.id).await.unwrap().unwrap(), before_b);
    let lb = store.ledger(&b.id).await.unwrap().unwrap();
    assert_eq!(lb.allowance, Some(450));
    finish_spending(store.as_ref(), &r.id, 0, 0).await;
    assert!(matches!(
        store.follow_up(&r.id, "more", None).await,
        Err(Error::NoBudget(_))
    ));
    assert_eq!(
        store.get(&r.id).await.unwrap().unwrap().status,
        SessionStatus::Completed
    );
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 650, 0));
    // A tree without a budget re-opens as before.
    let free = create_root(store.as_ref(), None).await;
    finish_spending(store.as_ref(), &free.id, 10, 0).await;
    assert!(
        store
            .follow_up(&free.id, "more", None)
            .await
            .unwrap()
            .is_some()
    );
}

/// A child whose worker died after it ended, before giving its allowance back, is started
/// again: what it consumed is given back first, then it draws; nothing counted twice.
async fn budget_reopen_gives_back_first_when_its_worker_died(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    let (a, _) = spawn_child(store.as_ref(), &r, "a", &limits(10, Some(1000), Some(600))).await;
    end_spending(store.as_ref(), &a.id, 100, ExitReason::Error).await;
    assert_eq!(
        store.unreturned_budgets(10).await.unwrap(),
        vec![a.id.clone()]
    );
    store.retry(&a.id, false).await.unwrap();
    // Its 100 plus min(600 - 100, 1000 - 100) = 500 more.
    assert_eq!(
        store.ledger(&a.id).await.unwrap().unwrap().allowance,
        Some(600)
    );
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (600, 0, 400));
    assert!(store.unreturned_budgets(10).await.unwrap().is_empty());
    finish_spending(store.as_ref(), &a.id, 0, 50).await;
    assert!(store.return_budget(&a.id).await.unwrap());
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 150, 850));
}

/// A grandchild that ends after its parent gave back changes what that parent consumed:
/// the difference reaches the root. Started again, it draws from the nearest ancestor
/// still holding its own allowance (here the root).
async fn budget_late_grandchild_and_its_reopening_reach_the_root(store: Arc<dyn Store>) {
    let r = create_root(store.as_ref(), Some(1000)).await;
    let (a, g) = spawn_with_sub(
        store.as_ref(),
        &r,
        ("a", &limits(10, Some(1000), Some(600))),
        ("g", &limits(10, Some(600), Some(400))),
    )
    .await;
    // The parent ends (cancelled, say) while its child still runs: the child's whole
    // allowance counts as consumed for now.
    end_spending(store.as_ref(), &a.id, 50, ExitReason::Error).await;
    assert!(store.return_budget(&a.id).await.unwrap());
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 450, 550));
    // The grandchild ends having spent 100: the 300 it did not spend reach the root.
    finish_spending(store.as_ref(), &g.id, 100, 0).await;
    assert!(store.return_budget(&g.id).await.unwrap());
    assert_eq!(ledger_of(store.as_ref(), &a.id, 0).await.0, 0);
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 150, 850));
    // A follow-up on the grandchild: 300 more of its own 400, drawn from the root.
    store.follow_up(&g.id, "more", None).await.unwrap().unwrap();
    assert_eq!(
        store.ledger(&g.id).await.unwrap().unwrap().allowance,
        Some(400)
    );
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 450, 550));
    finish_spending(store.as_ref(), &g.id, 50, 0).await;
    assert!(store.return_budget(&g.id).await.unwrap());
    // 50 (a) + 150 (g): all the tree spent, counted once.
    assert_eq!(ledger_of(store.as_ref(), &r.id, 1000).await, (0, 200, 800));
    let la = store.ledger(&a.id).await.unwrap().unwrap();
    assert_eq!((la.held, la.children_spent), (0, 150));
}

/// A call that finds its tenant's budget reached only with the holds of the calls in
/// flight is told to wait for them (with when the first of them expires); one that finds
/// it reached by the recorded spend is refused for good. Settled holds free the budget.
async fn budget_tenant_holds_make_calls_wait_and_spend_refuses(store: Arc<dyn Store>) {
    let now = chrono::Utc::now();
    let day = agentq_types::budget::day_key(now.date_naive());
    let budgets = [TenantBudget {
        tenant: "acme".into(),
        period: Period::Day,
        tokens: Some(1000),
        usd_nanos: None,
        on_budget: OnBudget::Fail,
    }];
    let hold = |tokens: u64| TenantHold {
        id: new_session_id(),
        tenant: "acme".into(),
        worst: Spend {
            tokens,
            cost_nanos: 0,
        },
        ttl: TTL,
    };
    let (a, b) = (hold(600), hold(600));
    assert!(
        store
            .hold_tenant_spend(&a, &budgets, now)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .hold_tenant_spend(&b, &budgets, now)
            .await
            .unwrap()
            .is_none()
    );
    // 1200 held, nothing spent: wait, until at the latest the first hold expires.
    let refused = store
        .hold_tenant_spend(&hold(10), &budgets, now)
        .await
        .unwrap()
        .unwrap();
    let expire = refused.holds_expire.expect("a wait for the holds");
    assert!(expire > now && expire <= chrono::Utc::now() + chrono::Duration::seconds(31));
    assert!(refused.message.contains("in flight"), "{}", refused.message);
    // They settle having spent 100 each: the budget has room again.
    for h in [&a, &b] {
        store
            .settle_tenant_hold(
                &h.id,
                "acme",
                &day,
                Spend {
                    tokens: 100,
                    cost_nanos: 0,
                },
            )
            .await
            .unwrap();
    }
    let c = hold(900);
    assert!(
        store
            .hold_tenant_spend(&c, &budgets, now)
            .await
            .unwrap()
            .is_none()
    );
    store
        .settle_tenant_hold(
            &c.id,
            "acme",
            &day,
            Spend {
                tokens: 800,
                cost_nanos: 0,
            },
        )
        .await
        .unwrap();
    // 1000 spent: refused for good, holds or not.
    let refused = store
        .hold_tenant_spend(&hold(10), &budgets, now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(refused.holds_expire, None);
    assert!(
        refused.message.contains("(1000 used)"),
        "{}",
        refused.message
    );
}

// The property test over random histories of a tree.
mod ledger_prop;
