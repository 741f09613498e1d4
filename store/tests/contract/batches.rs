//! Batches as objects: created from a source a chunk at a time in one transaction (a
//! refused item or a failing source leaves nothing), read, listed per tenant, tallied from
//! their sessions, read item by item in id order, and cancelled.

use async_trait::async_trait;
use chrono::Utc;
use serde_json::json;

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::{Outcome, SessionState};
use agentq_error::{Error, Result};
use agentq_store::store::Store;
use agentq_store::{BatchSource, Checkpoint};
use agentq_types::batch::{BatchCreate, BatchItem, BatchTotals, ItemRefused, NewBatch};
use agentq_types::model::{Lease, NewSession, SessionStatus};

use crate::common::{TTL, acquire, contract_tests};

contract_tests!(
    contract_a_batch_is_created_from_chunks_and_read_in_id_order,
    contract_a_refused_item_or_a_failing_source_leaves_nothing,
    contract_the_tally_counts_sessions_by_status_reason_and_model,
    contract_batches_are_listed_per_tenant_newest_first,
    contract_cancelling_a_batch_cancels_its_never_started_sessions,
);

/// The chunks a test gives, then the end (or an error, when `fail` is set).
struct Chunks {
    chunks: std::vec::IntoIter<Vec<BatchItem>>,
    fail: bool,
}

#[async_trait]
impl BatchSource for Chunks {
    async fn next_chunk(&mut self) -> Result<Option<Vec<BatchItem>>> {
        match self.chunks.next() {
            Some(c) => Ok(Some(c)),
            None if self.fail => Err(Error::invalid("line 9", "not a session")),
            None => Ok(None),
        }
    }
}

fn chunks(chunks: Vec<Vec<BatchItem>>) -> Chunks {
    Chunks {
        chunks: chunks.into_iter(),
        fail: false,
    }
}

fn new_batch(tenant: &str) -> NewBatch {
    NewBatch {
        id: agentq_types::model::new_session_id(),
        tenant: tenant.into(),
        metadata: json!({"team": "support", "run": 7})
            .as_object()
            .unwrap()
            .clone(),
        max_running: Some(3),
    }
}

/// An item of `batch` named `custom` (if any), as the API builds it.
fn item(batch: &NewBatch, prompt: &str, custom: Option<&str>) -> BatchItem {
    let mut s = NewSession::root(SessionSpec::new(prompt), "default").with_tenant(&batch.tenant);
    // In the batch's partition, as the API mints them: a batch lives on one shard.
    s.id = agentq_types::shard::id_beside(&batch.id);
    s.root_id = s.id.clone();
    s.sched.batch_id = Some(batch.id.clone());
    s.sched.batch_max_running = batch.max_running;
    BatchItem {
        session: s,
        custom_id: custom.map(str::to_string),
    }
}

async fn create(store: &dyn Store, batch: &NewBatch, items: Vec<Vec<BatchItem>>) -> BatchCreate {
    store.create_batch(batch, &mut chunks(items)).await.unwrap()
}

/// The sessions of `batch` (every one: fewer than a page).
async fn session_ids(store: &dyn Store, batch: &str) -> Vec<String> {
    store
        .batch_outcomes(batch, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect()
}

async fn contract_a_batch_is_created_from_chunks_and_read_in_id_order(store: &dyn Store) {
    let b = new_batch("acme");
    let first = vec![
        item(&b, "one", Some("c-1")),
        item(&b, "two", None),
        item(&b, "three", Some("c-3")),
    ];
    let second = vec![item(&b, "four", Some("c-4")), item(&b, "five", Some("c-5"))];
    let mut ids: Vec<String> = first
        .iter()
        .chain(&second)
        .map(|i| i.session.id.clone())
        .collect();
    assert_eq!(
        create(store, &b, vec![first, second]).await,
        BatchCreate::Created { items: 5 }
    );

    let row = store.batch(&b.id).await.unwrap().unwrap();
    assert_eq!(row.id, b.id);
    assert_eq!(row.tenant, "acme");
    assert_eq!(
        serde_json::Value::Object(row.metadata),
        json!({"team": "support", "run": 7})
    );
    assert_eq!(
        (row.max_running, row.items, row.cancelled_at),
        (Some(3), 5, None)
    );
    assert!((Utc::now() - row.created_at).num_seconds().abs() < 60);
    assert!(store.batch("no-such-batch").await.unwrap().is_none());

    // Each session carries the batch, its cap and its custom id, queued.
    for id in &ids {
        let s = store.get(id).await.unwrap().unwrap();
        assert_eq!(s.batch_id.as_deref(), Some(b.id.as_str()));
        assert_eq!(s.status, SessionStatus::Queued);
    }
    // Outcomes in id order, paged by the last id.
    ids.sort();
    let all = store.batch_outcomes(&b.id, None, 100).await.unwrap();
    assert_eq!(all.iter().map(|o| o.id.clone()).collect::<Vec<_>>(), ids);
    assert!(
        all.iter()
            .all(|o| o.status == SessionStatus::Queued && o.result.is_none())
    );
    let customs: Vec<Option<&str>> = all.iter().map(|o| o.custom_id.as_deref()).collect();
    assert_eq!(customs.iter().filter(|c| c.is_none()).count(), 1);
    assert!(customs.contains(&Some("c-4")));
    let page = store.batch_outcomes(&b.id, None, 2).await.unwrap();
    assert_eq!(page.len(), 2);
    let rest = store
        .batch_outcomes(&b.id, Some(&page[1].id), 100)
        .await
        .unwrap();
    assert_eq!(rest.len(), 3);
    assert_eq!(rest[0].id, ids[2]);
    assert!(
        store
            .batch_outcomes(&b.id, Some(&ids[4]), 100)
            .await
            .unwrap()
            .is_empty()
    );

    // A custom id is unique within its batch only: another batch may use it.
    let other = new_batch("acme");
    assert_eq!(
        create(
            store,
            &other,
            vec![vec![item(&other, "again", Some("c-1"))]]
        )
        .await,
        BatchCreate::Created { items: 1 }
    );
    assert_eq!(
        session_ids(store, &b.id).await.len(),
        5,
        "batches do not mix"
    );
}

async fn contract_a_refused_item_or_a_failing_source_leaves_nothing(store: &dyn Store) {
    let sessions_before = crate::common::count_all(store).await;
    // A custom id repeated in a later chunk: refused with the item's place in the batch.
    let b = new_batch("acme");
    let made = create(
        store,
        &b,
        vec![
            vec![item(&b, "a", Some("x")), item(&b, "b", Some("y"))],
            vec![item(&b, "c", Some("z")), item(&b, "d", Some("x"))],
        ],
    )
    .await;
    assert_eq!(
        made,
        BatchCreate::Refused {
            index: 3,
            reason: ItemRefused::CustomIdRepeated
        }
    );
    assert!(store.batch(&b.id).await.unwrap().is_none());
    assert_eq!(crate::common::count_all(store).await, sessions_before);

    // An idempotency key that names a session already (here, one outside any batch).
    let mut alone = NewSession::root(SessionSpec::new("alone"), "default").with_tenant("acme");
    alone.idempotency_key = Some("order-1".into());
    let (existing, _) = store.create_session(&alone).await.unwrap();
    // A batch with keyed items is minted in its first key's partition (as the API does),
    // so that its keys are checked where sessions with them live.
    let mut b = new_batch("acme");
    b.id = agentq_types::shard::id_in(agentq_types::shard::key_partition("acme", "order-1"));
    let mut keyed = item(&b, "keyed", None);
    keyed.session.idempotency_key = Some("order-1".into());
    let made = create(store, &b, vec![vec![item(&b, "fine", None), keyed]]).await;
    assert_eq!(
        made,
        BatchCreate::Refused {
            index: 1,
            reason: ItemRefused::IdempotencyKeyUsed {
                session_id: existing.id.clone()
            }
        }
    );
    assert!(store.batch(&b.id).await.unwrap().is_none());
    // The same key in another tenant is free.
    let b = new_batch("globex");
    let mut keyed = item(&b, "keyed", None);
    keyed.session.idempotency_key = Some("order-1".into());
    assert_eq!(
        create(store, &b, vec![vec![keyed]]).await,
        BatchCreate::Created { items: 1 }
    );
    let after_globex = crate::common::count_all(store).await;

    // Twice within one batch: the second names the first.
    let b = new_batch("acme");
    let mut k1 = item(&b, "k1", None);
    k1.session.idempotency_key = Some("twice".into());
    let first_id = k1.session.id.clone();
    let mut k2 = item(&b, "k2", None);
    k2.session.idempotency_key = Some("twice".into());
    assert_eq!(
        create(store, &b, vec![vec![k1], vec![k2]]).await,
        BatchCreate::Refused {
            index: 1,
            reason: ItemRefused::IdempotencyKeyUsed {
                session_id: first_id
            }
        }
    );

    // The source's own error (a bad line read after two chunks went in).
    let b = new_batch("acme");
    let mut failing = chunks(vec![vec![item(&b, "a", None)], vec![item(&b, "b", None)]]);
    failing.fail = true;
    let e = store.create_batch(&b, &mut failing).await.unwrap_err();
    assert!(
        matches!(e, Error::Invalid { ref field, .. } if field == "line 9"),
        "{e:?}"
    );
    assert!(store.batch(&b.id).await.unwrap().is_none());
    assert_eq!(crate::common::count_all(store).await, after_globex);
    // The store still writes.
    let b = new_batch("acme");
    assert_eq!(
        create(store, &b, vec![vec![item(&b, "later", Some("x"))]]).await,
        BatchCreate::Created { items: 1 }
    );
}

/// Claim `id` and commit a step that used `usage`, started now.
async fn step(store: &dyn Store, id: &str, usage: Usage) -> Lease {
    let (lease, mut state) = acquire(store, id, "w", TTL).await;
    let persisted = state.messages.len();
    state.started_at = Some(Utc::now());
    let mut reply = Message::assistant("working");
    reply.usage = Some(usage);
    reply.model = Some("m-1".into());
    state.push_assistant(reply);
    commit(store, &lease, &state, persisted).await;
    lease
}

/// A checkpoint that records the model the run calls, as a worker's does.
async fn commit(store: &dyn Store, lease: &Lease, state: &SessionState, persisted: usize) {
    let cp = Checkpoint::new(lease, state, persisted)
        .unwrap()
        .with_model(Some("m-1".into()));
    let mut answers = store.checkpoint_batch(&[&cp]).await.unwrap();
    answers.pop().unwrap().unwrap();
}

/// Claim `id`, commit a step that used `usage`, and end it with `reason`.
async fn run_to_end(store: &dyn Store, id: &str, usage: Usage, reason: ExitReason) {
    let (lease, mut state) = acquire(store, id, "w", TTL).await;
    let persisted = state.messages.len();
    state.started_at = Some(Utc::now());
    let mut reply = Message::assistant("done");
    reply.usage = Some(usage);
    reply.model = Some("m-1".into());
    state.push_assistant(reply);
    state.outcome = Some(Outcome {
        reason,
        result: Some("the answer".into()),
        error: (reason == ExitReason::Error).then(|| "it broke".to_string()),
    });
    commit(store, &lease, &state, persisted).await;
}

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Usage::default()
    }
}

async fn contract_the_tally_counts_sessions_by_status_reason_and_model(store: &dyn Store) {
    let b = new_batch("acme");
    let items: Vec<BatchItem> = (0..5)
        .map(|i| item(&b, &format!("p{i}"), Some(&format!("c{i}"))))
        .collect();
    let ids: Vec<String> = items.iter().map(|i| i.session.id.clone()).collect();
    create(store, &b, vec![items]).await;
    run_to_end(store, &ids[0], usage(100, 10), ExitReason::Stop).await;
    run_to_end(store, &ids[1], usage(50, 5), ExitReason::Stop).await;
    run_to_end(store, &ids[2], usage(7, 1), ExitReason::Error).await;
    let _running = step(store, &ids[3], usage(1, 1)).await;
    // ids[4] stays queued. Another batch's sessions are not counted.
    let other = new_batch("acme");
    create(store, &other, vec![vec![item(&other, "x", None)]]).await;

    let tally = store
        .batch_tally(std::slice::from_ref(&b.id))
        .await
        .unwrap();
    assert!(tally.iter().all(|t| t.batch_id == b.id));
    let t = BatchTotals::of(&tally);
    assert_eq!(t.sessions, 5);
    assert_eq!(t.unfinished, 2);
    assert_eq!(t.by_status["completed"], 2);
    assert_eq!(t.by_status["failed"], 1);
    assert_eq!(t.by_status["running"], 1);
    assert_eq!(t.by_status["queued"], 1);
    assert_eq!(t.by_reason["stop"], 2);
    assert_eq!(t.by_reason["error"], 1);
    assert_eq!((t.usage.input_tokens, t.usage.output_tokens), (158, 17));
    let started = t.first_started.unwrap();
    let finished = t.last_finished.unwrap();
    assert!(started <= finished && (Utc::now() - finished).num_seconds().abs() < 60);
    assert_eq!(t.finished_at(), None, "two are not finished");
    // Grouped by model too: the queued one has none yet.
    assert!(tally.iter().any(|g| g.model.as_deref() == Some("m-1")));
    assert!(
        tally
            .iter()
            .any(|g| g.status == SessionStatus::Queued && g.model.is_none())
    );
    // Both batches in one call.
    let both = store
        .batch_tally(&[b.id.clone(), other.id.clone()])
        .await
        .unwrap();
    assert_eq!(BatchTotals::of(&both).sessions, 6);
    assert!(store.batch_tally(&[]).await.unwrap().is_empty());

    // The outcomes carry what each session ended with.
    let out = store.batch_outcomes(&b.id, None, 100).await.unwrap();
    let of = |id: &str| out.iter().find(|o| o.id == id).unwrap();
    let done = of(&ids[0]);
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(done.finish_reason, Some(ExitReason::Stop));
    assert_eq!(done.result.as_deref(), Some("the answer"));
    assert_eq!(done.usage.input_tokens, 100);
    assert_eq!(done.model.as_deref(), Some("m-1"));
    assert_eq!(done.custom_id.as_deref(), Some("c0"));
    assert_eq!(of(&ids[2]).error.as_deref(), Some("it broke"));
    assert_eq!(of(&ids[3]).status, SessionStatus::Running);
}

async fn contract_batches_are_listed_per_tenant_newest_first(store: &dyn Store) {
    let mut acme = Vec::new();
    for i in 0..3 {
        let b = new_batch("acme");
        create(store, &b, vec![vec![item(&b, &format!("a{i}"), None)]]).await;
        acme.push(b.id);
        let g = new_batch("globex");
        create(store, &g, vec![vec![item(&g, &format!("g{i}"), None)]]).await;
    }
    acme.sort();
    acme.reverse();
    let listed = |rows: Vec<agentq_types::batch::BatchRow>| -> Vec<String> {
        rows.into_iter().map(|r| r.id).collect()
    };
    let all = listed(store.list_batches(Some("acme"), None, 10).await.unwrap());
    assert_eq!(all, acme);
    let page = listed(store.list_batches(Some("acme"), None, 2).await.unwrap());
    assert_eq!(page, acme[..2]);
    let rest = listed(
        store
            .list_batches(Some("acme"), Some(&page[1]), 2)
            .await
            .unwrap(),
    );
    assert_eq!(
        rest,
        acme[2..],
        "a cursor never crosses into another tenant"
    );
    assert_eq!(
        store.list_batches(None, None, 100).await.unwrap().len(),
        6,
        "every tenant's without a tenant"
    );
    assert!(
        store
            .list_batches(Some("initech"), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn contract_cancelling_a_batch_cancels_its_never_started_sessions(store: &dyn Store) {
    let b = new_batch("acme");
    let items: Vec<BatchItem> = (0..5).map(|i| item(&b, &format!("p{i}"), None)).collect();
    let ids: Vec<String> = items.iter().map(|i| i.session.id.clone()).collect();
    create(store, &b, vec![items]).await;
    // ids[0] runs; ids[1] ran and was given back (queued, but started); the rest never ran.
    let _running = step(store, &ids[0], usage(1, 1)).await;
    let given_back = step(store, &ids[1], usage(1, 1)).await;
    store.release(&given_back).await.unwrap();
    assert_eq!(
        store.get(&ids[1]).await.unwrap().unwrap().status,
        SessionStatus::Queued
    );

    let first = store.cancel_batch(&b.id, 2).await.unwrap();
    assert_eq!(first.len(), 2, "at most the limit at a time");
    let when = store
        .batch(&b.id)
        .await
        .unwrap()
        .unwrap()
        .cancelled_at
        .unwrap();
    let second = store.cancel_batch(&b.id, 2).await.unwrap();
    assert_eq!(second.len(), 1);
    assert!(store.cancel_batch(&b.id, 2).await.unwrap().is_empty());
    let mut cancelled: Vec<String> = first.iter().chain(&second).map(|r| r.id.clone()).collect();
    cancelled.sort();
    let mut never_started = ids[2..].to_vec();
    never_started.sort();
    assert_eq!(cancelled, never_started);
    for row in first.iter().chain(&second) {
        assert_eq!(row.status, SessionStatus::Cancelled);
        assert_eq!(row.finish_reason, Some(ExitReason::Interrupted));
        assert!(row.cancel_requested && row.finished_at.is_some());
    }
    // The started ones are the caller's to cancel one by one (a run to stop, children).
    assert_eq!(
        store.get(&ids[0]).await.unwrap().unwrap().status,
        SessionStatus::Running
    );
    assert_eq!(
        store.get(&ids[1]).await.unwrap().unwrap().status,
        SessionStatus::Queued
    );
    // The first cancel's time stays.
    assert_eq!(
        store.batch(&b.id).await.unwrap().unwrap().cancelled_at,
        Some(when)
    );
    assert!(
        store
            .cancel_batch("no-such-batch", 10)
            .await
            .unwrap()
            .is_empty()
    );
}
