//! The tree ledger under random sequences of what happens to a tree: spawns, calls (each
//! made only when the session's ledger says the call's worst case fits, as the worker's
//! gate does), ends (completed, failed with an error, the parent told or left to the
//! sweeper), cancels, a worker dying mid-run (its lease expires, another claims the
//! session, the dead one's late write is fenced off), follow-ups, retries and sweeps.
//! After every step: the tree spent at most its budget plus one call; `tree_usage` agrees
//! with the sessions' own spend; and every session's ledger says exactly its allowance
//! minus its own spend and what its children take (a child that gave back: what its
//! subtree spent; one that did not: its allowance). Once all is finished, the root's
//! ledger says the budget minus what the tree spent.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::ExitReason;
use agentq_agent::state::{Outcome, SessionState};
use agentq_error::Error;
use agentq_store::RetryResult;
use agentq_store::store::Store;
use agentq_types::model::{CancelResult, Claim, Lease, SessionStatus};

use crate::common::tree::{as_new, child_of, create_root, limits};

/// The worst case of one call (its prompt's estimate and max_tokens).
const WORST: u64 = 300;

#[derive(Debug, Clone)]
enum Op {
    Step { who: usize, spend: u64 },
    Spawn { who: usize, ask: Option<u64> },
    End { who: usize, error: bool, tell: bool },
    Cancel { who: usize },
    Kill { who: usize },
    FollowUp { who: usize },
    Retry { who: usize },
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<usize>(), 1..=WORST).prop_map(|(who, spend)| Op::Step { who, spend }),
        2 => (any::<usize>(), proptest::option::of(1u64..2_000))
            .prop_map(|(who, ask)| Op::Spawn { who, ask }),
        2 => (any::<usize>(), any::<bool>(), any::<bool>())
            .prop_map(|(who, error, tell)| Op::End { who, error, tell }),
        1 => any::<usize>().prop_map(|who| Op::Cancel { who }),
        1 => any::<usize>().prop_map(|who| Op::Kill { who }),
        2 => any::<usize>().prop_map(|who| Op::FollowUp { who }),
        2 => any::<usize>().prop_map(|who| Op::Retry { who }),
        1 => Just(Op::Sweep),
    ]
}

struct Sim {
    id: String,
    parent: Option<usize>,
    /// Its spec's token_budget: its lifetime bound, as the state machine applies it.
    spec_budget: u64,
    /// The run holding its lease (a live worker).
    run: Option<(Lease, Box<SessionState>)>,
    /// The run of a worker that died: its lease expired.
    dead: Option<(Lease, Box<SessionState>)>,
    /// Its allowance went back to its parent (as far as the calls made know).
    returned: bool,
}

struct World {
    store: Arc<dyn Store>,
    budget: u64,
    sims: Vec<Sim>,
    owners: u64,
}

impl World {
    fn owner(&mut self) -> String {
        self.owners += 1;
        format!("w{}", self.owners)
    }

    async fn row(&self, i: usize) -> agentq_types::model::SessionRow {
        self.store.get(&self.sims[i].id).await.unwrap().unwrap()
    }

    /// What a finished session's notice to its parent does to the ledger.
    async fn give_back(&mut self, i: usize) {
        if self.store.return_budget(&self.sims[i].id).await.unwrap() {
            self.sims[i].returned = true;
        }
    }

    async fn end(&mut self, i: usize, reason: ExitReason, tell: bool) {
        let Some((lease, mut state)) = self.sims[i].run.take() else {
            return;
        };
        let from = state.messages.len();
        state.outcome = Some(Outcome {
            reason,
            result: None,
            error: Some("ended".into()),
        });
        self.store.checkpoint(&lease, &state, from).await.unwrap();
        if tell {
            self.give_back(i).await;
        }
    }

    /// One call's checkpoint on `run`, spending `spend`.
    async fn call(
        store: &dyn Store,
        run: &mut (Lease, Box<SessionState>),
        spend: u64,
    ) -> agentq_error::Result<()> {
        let from = run.1.messages.len();
        let mut m = Message::assistant("working");
        m.usage = Some(Usage {
            input_tokens: spend,
            ..Default::default()
        });
        run.1.push_assistant(m);
        store.checkpoint(&run.0, &run.1, from).await
    }

    async fn claim(&mut self, i: usize) {
        let owner = self.owner();
        // A lease of no length: expired at once, so that a worker that dies holding
        // it is replaced by the next claim without waiting.
        match self
            .store
            .claim(&self.sims[i].id, &owner, Duration::ZERO, 1_000)
            .await
            .unwrap()
        {
            Claim::Acquired { lease, state, .. } => {
                self.sims[i].run = Some((lease, state));
                // The dead worker wakes up and writes its call: fenced off.
                if let Some(mut dead) = self.sims[i].dead.take() {
                    match Self::call(self.store.as_ref(), &mut dead, WORST).await {
                        Err(Error::LeaseLost(_)) => {}
                        other => panic!("a dead worker's write went through: {other:?}"),
                    }
                }
            }
            Claim::Busy
            | Claim::Terminal(_)
            | Claim::Settled
            | Claim::NotRunnable(_)
            | Claim::Exhausted(_)
            | Claim::NotFound => {}
        }
    }

    async fn step(&mut self, i: usize, spend: u64) {
        let row = self.row(i).await;
        let live = self.sims[i].run.is_some();
        match row.status {
            SessionStatus::Queued => return self.claim(i).await,
            SessionStatus::Running if !live => return self.claim(i).await,
            SessionStatus::Running => {}
            _ => return,
        }
        if row.cancel_requested {
            return self.end(i, ExitReason::Interrupted, true).await;
        }
        if row.usage.total() >= self.sims[i].spec_budget {
            return self.end(i, ExitReason::BudgetExhausted, true).await;
        }
        let l = self.store.ledger(&self.sims[i].id).await.unwrap().unwrap();
        let left = l.remaining(l.allowance.unwrap_or(self.budget), 0);
        if left >= WORST {
            let run = self.sims[i].run.as_mut().unwrap();
            Self::call(self.store.as_ref(), run, spend).await.unwrap();
        } else if l.held == 0 {
            self.end(i, ExitReason::BudgetExhausted, true).await;
        }
        // Else its running sub-agents hold some: it waits for them.
    }

    async fn spawn(&mut self, i: usize, ask: Option<u64>) {
        let Some((lease, _)) = &self.sims[i].run else {
            return;
        };
        if self.row(i).await.status != SessionStatus::Running {
            return;
        }
        let parent = self.row(i).await;
        let _ = lease;
        let new = child_of(&as_new(&parent), &agentq_types::model::new_session_id());
        let spawned = self
            .store
            .spawn_session(&new, &limits(1_000, Some(self.sims[i].spec_budget), ask))
            .await
            .unwrap();
        if let agentq_types::budget::Spawned::Created(row) = spawned {
            self.sims.push(Sim {
                id: row.id,
                parent: Some(i),
                spec_budget: row.spec.token_budget.unwrap(),
                run: None,
                dead: None,
                returned: false,
            });
        }
    }

    /// The same session and ledger as before a refused re-opening.
    async fn unchanged(&self, i: usize, before: &agentq_types::model::SessionRow, e: Error) {
        assert!(matches!(e, Error::NoBudget(_)), "{e:?}");
        assert_eq!(&self.row(i).await, before);
    }

    /// The `who`th (modulo) session for which `fits` holds, given its row and whether
    /// a live worker runs it; `None` when none does.
    async fn pick(
        &self,
        who: usize,
        fits: impl Fn(&agentq_types::model::SessionRow, bool) -> bool,
    ) -> Option<usize> {
        let mut found = Vec::new();
        for i in 0..self.sims.len() {
            if fits(&self.row(i).await, self.sims[i].run.is_some()) {
                found.push(i);
            }
        }
        (!found.is_empty()).then(|| found[who % found.len()])
    }

    async fn apply(&mut self, op: &Op) {
        let open = |r: &agentq_types::model::SessionRow, _: bool| !r.status.is_terminal();
        let running = |r: &agentq_types::model::SessionRow, live: bool| {
            live && r.status == SessionStatus::Running
        };
        let finished = |r: &agentq_types::model::SessionRow, _: bool| r.status.is_terminal();
        let failed =
            |r: &agentq_types::model::SessionRow, _: bool| r.status == SessionStatus::Failed;
        match *op {
            Op::Step { who, spend } => {
                if let Some(i) = self.pick(who, open).await {
                    self.step(i, spend).await;
                }
            }
            Op::Spawn { who, ask } => {
                if let Some(i) = self.pick(who, running).await {
                    self.spawn(i, ask).await;
                }
            }
            Op::End { who, error, tell } => {
                let reason = if error {
                    ExitReason::Error
                } else {
                    ExitReason::Stop
                };
                if let Some(i) = self.pick(who, running).await {
                    self.end(i, reason, tell).await;
                }
            }
            Op::Cancel { who } => {
                let Some(i) = self.pick(who, open).await else {
                    return;
                };
                if let CancelResult::CancelledNow(_) =
                    self.store.request_cancel(&self.sims[i].id).await.unwrap()
                {
                    self.give_back(i).await;
                }
            }
            Op::Kill { who } => {
                if let Some(i) = self.pick(who, running).await {
                    let s = &mut self.sims[i];
                    s.dead = s.run.take();
                }
            }
            Op::FollowUp { who } => {
                let Some(i) = self.pick(who, finished).await else {
                    return;
                };
                let before = self.row(i).await;
                match self.store.follow_up(&self.sims[i].id, "more", None).await {
                    Ok(Some(row)) => {
                        assert_eq!(row.status, SessionStatus::Queued);
                        self.sims[i].returned = false;
                    }
                    Ok(None) => panic!("a finished session was not started again"),
                    Err(e) => self.unchanged(i, &before, e).await,
                }
            }
            Op::Retry { who } => {
                let Some(i) = self.pick(who, failed).await else {
                    return;
                };
                let before = self.row(i).await;
                match self.store.retry(&self.sims[i].id, false).await {
                    Ok(RetryResult::Retried(_)) => self.sims[i].returned = false,
                    Ok(_) => {}
                    Err(e) => self.unchanged(i, &before, e).await,
                }
            }
            Op::Sweep => self.sweep().await,
        }
    }

    async fn sweep(&mut self) {
        for id in self.store.unreturned_budgets(10_000).await.unwrap() {
            if let Some(i) = self.sims.iter().position(|s| s.id == id) {
                self.give_back(i).await;
            }
        }
    }

    /// Cancel what runs, let every run end and the sweeper give back what is left.
    async fn drain(&mut self) {
        for _ in 0..10 {
            let mut open = false;
            for i in 0..self.sims.len() {
                let row = self.row(i).await;
                if row.status.is_terminal() {
                    continue;
                }
                open = true;
                if let CancelResult::CancelledNow(_) =
                    self.store.request_cancel(&self.sims[i].id).await.unwrap()
                {
                    self.give_back(i).await;
                    continue;
                }
                if self.sims[i].run.is_none() {
                    self.claim(i).await;
                }
                self.end(i, ExitReason::Interrupted, false).await;
            }
            self.sweep().await;
            if !open {
                return;
            }
        }
        panic!("the tree did not finish");
    }

    /// What `i` takes of its parent's budget in the model: a child that gave back, what
    /// its subtree spent (its own and its children's takes); else its allowance.
    fn take(&self, i: usize, own: &[u64], allowance: &[Option<u64>]) -> i128 {
        if self.sims[i].returned {
            i128::from(own[i]) + self.children_take(i, own, allowance)
        } else {
            i128::from(allowance[i].unwrap_or(0))
        }
    }

    fn children_take(&self, i: usize, own: &[u64], allowance: &[Option<u64>]) -> i128 {
        (0..self.sims.len())
            .filter(|&c| self.sims[c].parent == Some(i))
            .map(|c| self.take(c, own, allowance))
            .sum()
    }

    async fn check(&self, ops: &[Op]) -> i128 {
        let mut own = Vec::new();
        let mut ledgers = Vec::new();
        for s in &self.sims {
            let row = self.store.get(&s.id).await.unwrap().unwrap();
            own.push(row.usage.total());
            ledgers.push(self.store.ledger(&s.id).await.unwrap().unwrap());
        }
        let spent: u64 = own.iter().sum();
        let usage: u64 = self
            .store
            .tree_usage(&self.sims[0].id)
            .await
            .unwrap()
            .iter()
            .map(|m| m.usage.total())
            .sum();
        assert_eq!(usage, spent, "tree_usage disagrees: {ops:?}");
        assert!(
            spent <= self.budget + WORST,
            "the tree spent {spent} of {}: {ops:?}",
            self.budget
        );
        let allowance: Vec<Option<u64>> = ledgers.iter().map(|l| l.allowance).collect();
        let mut root_raw = 0;
        for (i, l) in ledgers.iter().enumerate() {
            assert_eq!(l.spent, own[i]);
            let a = match (i, l.allowance) {
                (0, _) => self.budget,
                (_, Some(a)) => a,
                (_, None) => panic!("a child without an allowance: {ops:?}"),
            };
            let raw = i128::from(a)
                - i128::from(l.spent)
                - i128::from(l.held)
                - i128::from(l.children_spent);
            let want = i128::from(a) - i128::from(own[i]) - self.children_take(i, &own, &allowance);
            assert_eq!(raw, want, "ledger of session {i} ({l:?}): {ops:?}");
            if i == 0 {
                root_raw = raw;
            }
        }
        root_raw
    }
}

async fn run(store: Arc<dyn Store>, budget: u64, ops: Vec<Op>) {
    let r = create_root(store.as_ref(), Some(budget)).await;
    let mut w = World {
        store,
        budget,
        sims: vec![Sim {
            id: r.id.clone(),
            parent: None,
            spec_budget: budget,
            run: None,
            dead: None,
            returned: false,
        }],
        owners: 0,
    };
    for (k, op) in ops.iter().enumerate() {
        w.apply(op).await;
        w.check(&ops[..=k]).await;
    }
    w.drain().await;
    let raw = w.check(&ops).await;
    let mut spent = 0;
    for s in &w.sims {
        spent += w.store.get(&s.id).await.unwrap().unwrap().usage.total();
        let l = w.store.ledger(&s.id).await.unwrap().unwrap();
        assert_eq!(l.held, 0, "{ops:?}");
    }
    assert_eq!(raw, i128::from(budget) - i128::from(spent), "{ops:?}");
}

fn check_all(rt: &tokio::runtime::Runtime, store: Arc<dyn Store>) {
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    });
    let strategy = (600u64..3_000, proptest::collection::vec(op(), 1..60));
    let result = runner.run(&strategy, |(budget, ops)| {
        rt.block_on(run(store.clone(), budget, ops));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn pg_ledger_invariants_hold_under_random_histories() {
    let rt = runtime();
    let store: Arc<dyn Store> = Arc::new(rt.block_on(crate::common::pg_store()));
    check_all(&rt, store);
}

#[test]
fn sqlite_ledger_invariants_hold_under_random_histories() {
    let rt = runtime();
    let (dir, store) = rt.block_on(crate::common::sqlite_store());
    let store = Arc::new(store);
    check_all(&rt, store.clone());
    rt.block_on(store.close());
    drop(dir);
}
