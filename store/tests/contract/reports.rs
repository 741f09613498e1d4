//! The console's summaries: a listing's filter counted per status (equal to what the
//! listing returns), the text search (literal, case-insensitive, hostile input inert),
//! usage per tenant, model and day, and the workers holding leases.

use chrono::{Duration as Days, Utc};

use agentq_store::store::Store;
use agentq_types::model::{ListFilter, SessionStatus};
use agentq_types::report::CostFilter;
use agentq_types::wait::WaitReason;

use crate::common::{TTL, acquire, contract_tests, iterate, new_session, suspended};

contract_tests!(
    contract_text_search_is_literal,
    contract_counts_equal_the_listing,
    contract_costs_per_tenant_model_and_day,
    contract_workers_and_their_leases,
);

async fn make(store: &dyn Store, tenant: &str, prompt: &str) -> String {
    let (row, created) = store
        .create_session(&new_session(prompt).with_tenant(tenant))
        .await
        .unwrap();
    assert!(created);
    row.id
}

async fn search(store: &dyn Store, tenant: Option<&str>, text: &str) -> Vec<String> {
    let mut ids: Vec<String> = store
        .list(&ListFilter {
            tenant: tenant.map(str::to_string),
            text: Some(text.into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

async fn contract_text_search_is_literal(store: &dyn Store) {
    let pct = make(store, "acme", "Fix the 100% bug in Billing").await;
    let under = make(store, "acme", "rename snake_case keys").await;
    let slash = make(store, "acme", r"path C:\temp\x is wrong").await;
    let quote = make(
        store,
        "acme",
        "it's a 'quoted'; DROP TABLE sessions; -- prompt",
    )
    .await;
    let plain = make(store, "acme", "plain words 1000 and snakeXcase").await;
    let other = make(store, "globex", "Fix the 100% bug of another tenant").await;

    // Wildcards are literal: `%` and `_` match only themselves, `\` too.
    assert_eq!(search(store, Some("acme"), "%").await, [pct.as_str()]);
    assert_eq!(search(store, Some("acme"), "100%").await, [pct.as_str()]);
    assert_eq!(
        search(store, Some("acme"), "snake_case").await,
        [under.as_str()]
    );
    assert_eq!(search(store, Some("acme"), "_").await, [under.as_str()]);
    assert_eq!(
        search(store, Some("acme"), r"\temp").await,
        [slash.as_str()]
    );
    assert_eq!(search(store, Some("acme"), r"\").await, [slash.as_str()]);
    // Quotes are data, not SQL.
    assert_eq!(
        search(store, Some("acme"), "'; DROP TABLE sessions; --").await,
        [quote.as_str()]
    );
    assert_eq!(search(store, Some("acme"), "'").await, [quote.as_str()]);
    // Case-insensitive (ASCII letters on both backends).
    assert_eq!(search(store, Some("acme"), "BILLING").await, [pct.as_str()]);
    // An id prefix finds its session; the middle of an id does not.
    assert_eq!(
        search(store, Some("acme"), &plain[..35]).await,
        [plain.as_str()]
    );
    assert!(search(store, Some("acme"), &plain[20..]).await.is_empty());
    // The tenant holds: another tenant's match stays out; the admin's view has both.
    assert_eq!(
        search(store, None, "100%").await,
        sorted(vec![pct.clone(), other.clone()])
    );
    // Nothing matches a long text; the table is still there.
    assert!(search(store, None, &"x".repeat(10_000)).await.is_empty());
    assert_eq!(
        store
            .list(&ListFilter {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .len(),
        6
    );
    // Counted the same way.
    let counts = store
        .count_sessions(&ListFilter {
            tenant: Some("acme".into()),
            text: Some("_".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(counts.iter().map(|c| c.sessions).sum::<u64>(), 1);
}

async fn contract_counts_equal_the_listing(store: &dyn Store) {
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(make(store, "acme", &format!("task {i}")).await);
    }
    make(store, "globex", "elsewhere").await;
    let (_running, _) = acquire(store, &ids[0], "w1", TTL).await;
    suspended(store, &ids[1], "w1", SessionStatus::Waiting).await;
    suspended(store, &ids[2], "w1", SessionStatus::AwaitingApproval).await;

    let acme = |status: Option<SessionStatus>, wait: Option<WaitReason>| ListFilter {
        tenant: Some("acme".into()),
        status,
        wait_reason: wait,
        limit: 100,
        ..Default::default()
    };
    let counts = store.count_sessions(&acme(None, None)).await.unwrap();
    let of = |s: SessionStatus| {
        counts
            .iter()
            .filter(|c| c.status == s)
            .map(|c| c.sessions)
            .sum::<u64>()
    };
    for s in [
        SessionStatus::Queued,
        SessionStatus::Running,
        SessionStatus::Waiting,
        SessionStatus::AwaitingApproval,
        SessionStatus::Completed,
    ] {
        let listed = store.list(&acme(Some(s), None)).await.unwrap().len();
        assert_eq!(of(s), listed as u64, "{s:?}");
    }
    assert_eq!(counts.iter().map(|c| c.sessions).sum::<u64>(), 5);
    // Waiting ones carry the reason the API shows.
    let waiting = counts
        .iter()
        .find(|c| c.status == SessionStatus::Waiting)
        .unwrap();
    assert_eq!(waiting.wait_reason, Some(WaitReason::Children));
    let approval = counts
        .iter()
        .find(|c| c.status == SessionStatus::AwaitingApproval)
        .unwrap();
    assert_eq!(approval.wait_reason, Some(WaitReason::Approval));
    assert!(
        counts
            .iter()
            .filter(|c| c.status == SessionStatus::Queued)
            .all(|c| c.wait_reason.is_none())
    );
    // A filter by reason counts what it lists.
    let by_reason = store
        .count_sessions(&acme(None, Some(WaitReason::Children)))
        .await
        .unwrap();
    assert_eq!(by_reason.iter().map(|c| c.sessions).sum::<u64>(), 1);
    // Every tenant: the admin's view.
    let all = store.count_sessions(&ListFilter::default()).await.unwrap();
    assert_eq!(all.iter().map(|c| c.sessions).sum::<u64>(), 6);
}

/// A session of `tenant` that names `model`.
async fn make_on(store: &dyn Store, tenant: &str, model: &str) -> String {
    let mut new = new_session("priced").with_tenant(tenant);
    new.spec.model = Some(model.into());
    store.create_session(&new).await.unwrap().0.id
}

async fn contract_costs_per_tenant_model_and_day(store: &dyn Store) {
    let a = make_on(store, "acme", "test-model").await;
    let b = make_on(store, "globex", "test-model").await;
    make(store, "globex", "never ran").await;
    for (id, steps) in [(&a, 2), (&b, 1)] {
        let (lease, mut state) = acquire(store, id, "w1", TTL).await;
        let mut persisted = state.messages.len();
        for i in 0..steps {
            iterate(store, &lease, &mut state, &mut persisted, i).await;
        }
    }
    let now = Utc::now();
    let filter = |tenant: Option<&str>| CostFilter {
        tenant: tenant.map(str::to_string),
        since: now - Days::days(1),
        until: now + Days::days(1),
        limit: 100,
    };
    let today = now.format("%Y-%m-%d").to_string();
    let acme = store.costs(&filter(Some("acme"))).await.unwrap();
    assert_eq!(acme.len(), 1, "{acme:?}");
    assert_eq!(
        (acme[0].tenant.as_str(), acme[0].model.as_deref()),
        ("acme", Some("test-model"))
    );
    assert_eq!(acme[0].day, today);
    assert_eq!(acme[0].sessions, 1);
    assert_eq!(acme[0].usage.input_tokens, 200);
    assert_eq!(acme[0].usage.output_tokens, 40);
    assert_eq!(acme[0].usage.cache_read_tokens, 14);
    let all = store.costs(&filter(None)).await.unwrap();
    let globex: Vec<_> = all.iter().filter(|r| r.tenant == "globex").collect();
    // The session that never ran names no model: a row of its own, with nothing used.
    assert_eq!(globex.len(), 2, "{all:?}");
    let ran = globex
        .iter()
        .find(|r| r.model.as_deref() == Some("test-model"))
        .unwrap();
    assert_eq!((ran.sessions, ran.usage.input_tokens), (1, 100));
    // A range before the sessions were created has none.
    let before = store
        .costs(&CostFilter {
            tenant: None,
            since: now - Days::days(3),
            until: now - Days::days(2),
            limit: 100,
        })
        .await
        .unwrap();
    assert!(before.is_empty());
    // The limit holds.
    let one = store
        .costs(&CostFilter {
            limit: 1,
            ..filter(None)
        })
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
}

async fn contract_workers_and_their_leases(store: &dyn Store) {
    assert!(store.workers(10).await.unwrap().is_empty());
    let ids = [
        make(store, "acme", "one").await,
        make(store, "acme", "two").await,
        make(store, "globex", "three").await,
    ];
    let before = Utc::now();
    acquire(store, &ids[0], "worker-a", TTL).await;
    acquire(store, &ids[1], "worker-a", TTL).await;
    acquire(store, &ids[2], "worker-b", TTL).await;
    let workers = store.workers(10).await.unwrap();
    assert_eq!(
        workers
            .iter()
            .map(|w| (w.worker.as_str(), w.sessions))
            .collect::<Vec<_>>(),
        [("worker-a", 2), ("worker-b", 1)]
    );
    for w in &workers {
        let (first, last) = (w.first_expiry.unwrap(), w.last_expiry.unwrap());
        assert!(first <= last);
        assert!(first > before, "a lease expires after it was taken");
    }
    assert_eq!(store.workers(1).await.unwrap().len(), 1);
}
