//! The steps the budget cases are written in: a root with a token budget, its sub-agents
//! spawned under limits, sessions run to spend tokens (and to end), and a tree's ledger.

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_store::store::Store;
use agentq_types::budget::{SpawnBudget, SpawnLimits, Spawned};
use agentq_types::model::{Claim, NewSession, SessionRow, SessionStatus, new_session_id};

use crate::common::TTL;

pub fn root(budget: Option<u64>) -> NewSession {
    let mut spec = SessionSpec::new("root");
    spec.token_budget = budget;
    NewSession::root(spec, "default")
}

/// A root with `budget`, created.
pub async fn create_root(store: &dyn Store, budget: Option<u64>) -> NewSession {
    let r = root(budget);
    store.create_session(&r).await.unwrap();
    r
}

/// A sub-agent of `parent` as its spawn call `key` asks for it.
pub fn child_of(parent: &NewSession, key: &str) -> NewSession {
    let mut spec = SessionSpec::new("child");
    spec.model = Some("child-model".into());
    NewSession {
        id: new_session_id(),
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

/// Spawn the sub-agent of `parent` for call `key`, which must be created: the child as
/// asked for and its row as created.
pub async fn spawn_child(
    store: &dyn Store,
    parent: &NewSession,
    key: &str,
    limits: &SpawnLimits,
) -> (NewSession, SessionRow) {
    let child = child_of(parent, key);
    let row = created(store.spawn_session(&child, limits).await.unwrap());
    (child, row)
}

/// A sub-agent of `parent` (call `key`, under `limits`) that spawned one of its own (call
/// `sub`, under `sub_limits`): the two as asked for.
pub async fn spawn_with_sub(
    store: &dyn Store,
    parent: &NewSession,
    (key, limits): (&str, &SpawnLimits),
    (sub, sub_limits): (&str, &SpawnLimits),
) -> (NewSession, NewSession) {
    let (child, row) = spawn_child(store, parent, key, limits).await;
    let (grandchild, _) = spawn_child(store, &as_new(&row), sub, sub_limits).await;
    (child, grandchild)
}

pub fn limits(max: u64, parent_allowance: Option<u64>, requested: Option<u64>) -> SpawnLimits {
    SpawnLimits {
        max_tree_sessions: max,
        budget: parent_allowance.map(|b| SpawnBudget {
            parent_allowance: b,
            requested,
            parent_spent: 0,
        }),
    }
}

pub fn created(s: Spawned) -> SessionRow {
    match s {
        Spawned::Created(row) => row,
        other => panic!("expected a new child, got {other:?}"),
    }
}

/// A stored session as the parent of further spawns.
pub fn as_new(row: &SessionRow) -> NewSession {
    NewSession {
        id: row.id.clone(),
        spec: row.spec.clone(),
        queue: row.queue.clone(),
        parent_id: row.parent_id.clone(),
        root_id: row.root_id.clone(),
        depth: row.depth,
        idempotency_key: None,
        idempotency_hash: None,
        tenant: row.tenant.clone(),
        sched: Default::default(),
        files: Vec::new(),
        workspace_from: None,
    }
}

/// Claim `id` and checkpoint one answer `text` that spent `usage`, with `outcome` if the
/// run ends there; released otherwise.
async fn answer_spending(
    store: &dyn Store,
    id: &str,
    text: &str,
    usage: Usage,
    outcome: Option<Outcome>,
) {
    let Claim::Acquired {
        lease, mut state, ..
    } = store.claim(id, "w", TTL, 10).await.unwrap()
    else {
        panic!("claim");
    };
    let from = state.messages.len();
    let mut m = Message::assistant(text);
    m.usage = Some(usage);
    state.push_assistant(m);
    let ends = outcome.is_some();
    if ends {
        state.outcome = outcome;
    }
    store.checkpoint(&lease, &state, from).await.unwrap();
    if !ends {
        store.release(&lease).await.unwrap();
    }
}

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        ..Default::default()
    }
}

/// Run `id` to a final checkpoint that spent `input + output` tokens.
pub async fn finish_spending(store: &dyn Store, id: &str, input: u64, output: u64) {
    let done = Outcome {
        reason: ExitReason::Stop,
        result: Some("done".into()),
        error: None,
    };
    answer_spending(store, id, "done", usage(input, output), Some(done)).await;
    assert_eq!(
        store.get(id).await.unwrap().unwrap().status,
        SessionStatus::Completed
    );
}

/// Run `id` to a final checkpoint for `reason` that spent `tokens`.
pub async fn end_spending(store: &dyn Store, id: &str, tokens: u64, reason: ExitReason) {
    let ended = Outcome {
        reason,
        result: None,
        error: Some("ended".into()),
    };
    answer_spending(store, id, "ended", usage(tokens, 0), Some(ended)).await;
}

/// Spend `input + output` on `id` without finishing it.
pub async fn spend_on(store: &dyn Store, id: &str, input: u64, output: u64) {
    answer_spending(store, id, "working", usage(input, output), None).await;
}

/// (held, children_spent, signed remaining) of `id`'s ledger, `allowance` for a root.
pub async fn ledger_of(store: &dyn Store, id: &str, root_allowance: u64) -> (u64, u64, i128) {
    let l = store.ledger(id).await.unwrap().unwrap();
    let a = l.allowance.unwrap_or(root_allowance);
    let raw =
        i128::from(a) - i128::from(l.spent) - i128::from(l.held) - i128::from(l.children_spent);
    (l.held, l.children_spent, raw)
}
