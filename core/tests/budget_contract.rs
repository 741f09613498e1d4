//! The `BudgetStore` contract, run against Postgres and SQLite like `store_contract.rs`:
//! a child's allowance drawn from its parent's remaining budget and given back once, the
//! cap on a tree's sessions, both under concurrent spawns, tree usage per model, tenant
//! spend per day and stored tenant budgets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_core::budget::{
    Ledger, OnBudget, Period, SpawnBudget, SpawnLimits, Spawned, Spend, TenantBudget, TenantHold,
};
use agentq_core::pg::PgStore;
use agentq_core::sqlite::SqliteStore;
use agentq_core::store::Store;
use agentq_core::{Claim, NewSession, SessionStatus, new_session_id};

const TTL: Duration = Duration::from_secs(30);

async fn pg_store() -> PgStore {
    let url = agentq_testkit::shared_postgres()
        .expect("shared postgres")
        .fresh_database()
        .expect("fresh database");
    let store = PgStore::connect(&url, 8).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}

async fn sqlite_store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    (dir, store)
}

macro_rules! contract_tests {
    ($($case:ident),* $(,)?) => {
        mod pg {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = std::sync::Arc::new(super::pg_store().await);
                    super::$case(store).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (_dir, store) = super::sqlite_store().await;
                    let store = std::sync::Arc::new(store);
                    super::$case(store.clone()).await;
                    store.close().await;
                }
            )*
        }
    };
}

contract_tests!(
    budget_child_draws_and_gives_back_once,
    budget_refuses_when_nothing_is_left,
    budget_tree_cap_holds_under_concurrent_spawns,
    budget_last_of_the_budget_goes_to_one_of_two_racing_spawns,
    budget_repeated_spawn_answers_the_same_child,
    budget_sweeper_finds_unreturned_allowances,
    budget_tree_usage_per_model,
    budget_tenant_spend_and_stored_budgets,
    budget_tenant_holds_bound_the_calls_in_flight,
);

fn root(budget: Option<u64>) -> NewSession {
    let mut spec = SessionSpec::new("root");
    spec.token_budget = budget;
    NewSession::root(spec, "default")
}

fn child_of(parent: &NewSession, key: &str) -> NewSession {
    let mut spec = SessionSpec::new("child");
    spec.model = Some("child-model".into());
    let id = new_session_id();
    NewSession {
        id,
        spec,
        queue: "default".into(),
        parent_id: Some(parent.id.clone()),
        root_id: parent.root_id.clone(),
        depth: parent.depth + 1,
        idempotency_key: Some(format!("spawn:{key}")),
        idempotency_hash: None,
        tenant: parent.tenant.clone(),
        sched: Default::default(),
        files: Vec::new(),
        workspace_from: None,
    }
}

fn limits(max: u64, parent_allowance: Option<u64>, requested: Option<u64>) -> SpawnLimits {
    SpawnLimits {
        max_tree_sessions: max,
        budget: parent_allowance.map(|b| SpawnBudget {
            parent_allowance: b,
            requested,
        }),
    }
}

/// Run `id` to a final checkpoint that spent `tokens` (input + output).
async fn finish_spending(store: &dyn Store, id: &str, input: u64, output: u64) {
    let Claim::Acquired {
        lease, mut state, ..
    } = store.claim(id, "w", TTL, 10).await.unwrap()
    else {
        panic!("claim");
    };
    let from = state.messages.len();
    let mut m = Message::assistant("done");
    m.usage = Some(Usage {
        input_tokens: input,
        output_tokens: output,
        ..Default::default()
    });
    state.push_assistant(m);
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("done".into()),
        error: None,
    });
    store.checkpoint(&lease, &state, from).await.unwrap();
    assert_eq!(
        store.get(id).await.unwrap().unwrap().status,
        SessionStatus::Completed
    );
}

/// Spend `input + output` on `id` without finishing it.
async fn spend_on(store: &dyn Store, id: &str, input: u64, output: u64) {
    let Claim::Acquired {
        lease, mut state, ..
    } = store.claim(id, "w", TTL, 10).await.unwrap()
    else {
        panic!("claim");
    };
    let from = state.messages.len();
    let mut m = Message::assistant("working");
    m.usage = Some(Usage {
        input_tokens: input,
        output_tokens: output,
        ..Default::default()
    });
    state.push_assistant(m);
    store.checkpoint(&lease, &state, from).await.unwrap();
    store.release(&lease).await.unwrap();
}

fn created(s: Spawned) -> agentq_core::SessionRow {
    match s {
        Spawned::Created(row) => row,
        other => panic!("expected a new child, got {other:?}"),
    }
}

async fn budget_child_draws_and_gives_back_once(store: Arc<dyn Store>) {
    let r = root(Some(1000));
    store.create_session(&r).await.unwrap();
    spend_on(store.as_ref(), &r.id, 150, 50).await;
    // 800 remain: the default grant is half of it.
    let a = child_of(&r, "a");
    let row = created(
        store
            .spawn_session(&a, &limits(10, Some(1000), None))
            .await
            .unwrap(),
    );
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
    let g = child_of(&a, "g");
    let grow = created(
        store
            .spawn_session(&g, &limits(10, Some(400), Some(10_000)))
            .await
            .unwrap(),
    );
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
    let r = root(Some(100));
    store.create_session(&r).await.unwrap();
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
    let b = child_of(&r, "b");
    let row = created(
        store
            .spawn_session(&b, &limits(10, None, None))
            .await
            .unwrap(),
    );
    assert_eq!(row.spec.token_budget, None);
}

async fn budget_tree_cap_holds_under_concurrent_spawns(store: Arc<dyn Store>) {
    let r = root(None);
    store.create_session(&r).await.unwrap();
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
        .list(&agentq_core::ListFilter {
            parent_id: Some(r.id.clone()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(kids.len(), 4);
    let k = &kids[0];
    let parent = NewSession {
        id: k.id.clone(),
        spec: k.spec.clone(),
        queue: k.queue.clone(),
        parent_id: k.parent_id.clone(),
        root_id: k.root_id.clone(),
        depth: k.depth,
        idempotency_key: None,
        idempotency_hash: None,
        tenant: k.tenant.clone(),
        sched: Default::default(),
        files: Vec::new(),
        workspace_from: None,
    };
    let gc = child_of(&parent, "gc");
    assert_eq!(
        store
            .spawn_session(&gc, &limits(5, None, None))
            .await
            .unwrap(),
        Spawned::TreeFull { max: 5 }
    );
}

async fn budget_last_of_the_budget_goes_to_one_of_two_racing_spawns(store: Arc<dyn Store>) {
    let r = root(Some(1000));
    store.create_session(&r).await.unwrap();
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
    let r = root(Some(1000));
    store.create_session(&r).await.unwrap();
    let a = child_of(&r, "same-call");
    let first = created(
        store
            .spawn_session(&a, &limits(10, Some(1000), None))
            .await
            .unwrap(),
    );
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
    let r = root(Some(1000));
    store.create_session(&r).await.unwrap();
    let a = child_of(&r, "a");
    created(
        store
            .spawn_session(&a, &limits(10, Some(1000), None))
            .await
            .unwrap(),
    );
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
    let r = root(None);
    store.create_session(&r).await.unwrap();
    spend_on(store.as_ref(), &r.id, 100, 10).await;
    for k in ["a", "b"] {
        let c = child_of(&r, k);
        created(
            store
                .spawn_session(&c, &limits(10, None, None))
                .await
                .unwrap(),
        );
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
async fn budget_tenant_holds_bound_the_calls_in_flight(store: Arc<dyn Store>) {
    let now = chrono::Utc::now();
    let day = agentq_core::budget::day_key(now.date_naive());
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
    tokio::time::sleep(Duration::from_millis(20)).await;
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
