//! Budgets end to end in process: real Postgres and Redis, the scheduler (its sweeper and
//! routes), two workers, the scripted provider playing a tree that fans out. A tree under a
//! token budget ends within it; the cap on a tree's sessions holds across workers; tenant
//! budgets end or park sessions, and raising a parked tenant's budget finishes them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_core::budget::{BudgetStore, OnBudget, Period, TenantBudget};
use agentq_core::{
    EnqueueReason, NewSession, SessionRow, SessionStatus, SessionStore, Signals, SweepStore,
    WorkQueue,
};
use agentq_testkit::{FakeLlm, FakeResponse, fixture};

use crate::common;

use common::{Cluster, TENANT, wait_until};

/// What the trees here may use: start sub-agents and work.
const TREE_TOOLS: &[&str] = &["spawn_agent", "list_dir"];

/// Each call of the scripted model costs this many tokens (input, output): about what the
/// call path estimates for these prompts, as with a real model.
const CALL: (u64, u64) = (400, 10);

fn usage() -> Value {
    json!({"input_tokens": CALL.0, "output_tokens": CALL.1})
}

/// A model that answers every NODE task by starting four more NODE sub-agents and then
/// works on forever: unbounded, 1 + 4 + 16 + 64 sessions at the worker's depth of 3, each
/// running to its iteration limit.
fn fan_out_script(wait: bool) -> Value {
    let spawn = |i: usize| {
        json!({"name": "spawn_agent",
               "arguments": {"prompt": format!("NODE part {i}"), "label": format!("n{i}"), "wait": wait}})
    };
    json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "NODE", "turns": [
                {"tool_calls": [spawn(0), spawn(1), spawn(2), spawn(3)], "usage": usage()},
                {"text": "still working",
                 "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}],
                 "usage": usage()}
            ], "repeat_last": true}
        ]
    })
}

/// A fan-out root of the tree budget `budget`, its calls of 10 output tokens at most.
async fn submit_tree(c: &Cluster, budget: u64) -> String {
    c.submit("NODE root", TREE_TOOLS, |s| {
        s.token_budget = Some(budget);
        s.max_tokens = 10;
        // Every node works on with the same call: the budget, not a repeat, must end it.
        s.max_repeated_calls = 0;
    })
    .await
}

/// No session of `tree` holds any of its budget (every allowance went back).
async fn assert_nothing_held(c: &Cluster, tree: &[SessionRow]) {
    for r in tree {
        let l = c.store.ledger(&r.id).await.unwrap().unwrap();
        assert_eq!(l.held, 0, "{r:?} still holds {l:?}");
    }
}

fn spent(tree: &[SessionRow]) -> u64 {
    tree.iter().map(|r| r.usage.total()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_tree_ends_within_its_token_budget() {
    let c = Cluster::start(fan_out_script(true), 2, 8, |_| {}).await;
    const BUDGET: u64 = 20_000;
    let root = submit_tree(&c, BUDGET).await;
    let tree = c.settled_tree(&root, Duration::from_secs(120)).await;
    let total = spent(&tree);
    eprintln!("tree: {} sessions, {total} tokens of {BUDGET}", tree.len());
    // The worst case of one call: its prompt (the estimate is generous: it counts the
    // tool's schema) plus max_tokens. The scripted calls cost CALL each.
    let one_call = CALL.0 + CALL.1;
    assert!(
        total <= BUDGET + one_call,
        "the tree spent {total} of a budget of {BUDGET} over {} sessions",
        tree.len()
    );
    // The tree works until its budget is spent, not until some session's share is.
    assert!(
        total >= BUDGET / 2,
        "the tree spent only {total} of {BUDGET}"
    );
    assert!(
        tree.len() < 85,
        "{} sessions: the budget did not bound the fan-out",
        tree.len()
    );
    // Each child's allowance was drawn from its parent, and every one went back.
    for r in &tree {
        let l = c.store.ledger(&r.id).await.unwrap().unwrap();
        assert_eq!(l.held, 0, "{r:?} still holds {l:?}");
        if r.parent_id.is_some() {
            assert!(r.spec.token_budget.is_some_and(|b| b < BUDGET), "{r:?}");
        }
    }
    let ended: Vec<_> = tree
        .iter()
        .filter(|r| r.finish_reason == Some(ExitReason::BudgetExhausted))
        .collect();
    assert!(!ended.is_empty(), "some session ran out of budget");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_fan_out_on_two_workers_stays_within_the_budget() {
    let c = Cluster::start(fan_out_script(false), 2, 8, |_| {}).await;
    const BUDGET: u64 = 12_000;
    let root = submit_tree(&c, BUDGET).await;
    let tree = c.settled_tree(&root, Duration::from_secs(120)).await;
    let total = spent(&tree);
    eprintln!("tree: {} sessions, {total} tokens of {BUDGET}", tree.len());
    assert!(
        total <= BUDGET + CALL.0 + CALL.1,
        "the tree spent {total} of {BUDGET} over {} sessions",
        tree.len()
    );
    assert!(tree.len() < 85, "{} sessions", tree.len());
    c.shutdown().await;
}

/// Parents whose next call must wait for what their running sub-agents hold give their
/// slot up while they wait: on one worker of two slots, a background fan-out tree ends.
/// Before, each parent waited holding its slot; two of them took both slots and the
/// children they waited for stayed queued for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_waiting_for_their_childrens_budget_leave_them_the_slots() {
    let c = Cluster::start(fan_out_script(false), 1, 2, |_| {}).await;
    const BUDGET: u64 = 12_000;
    let root = submit_tree(&c, BUDGET).await;
    let tree = c.settled_tree(&root, Duration::from_secs(120)).await;
    let total = spent(&tree);
    assert!(
        total <= BUDGET + CALL.0 + CALL.1,
        "the tree spent {total} of {BUDGET} over {} sessions",
        tree.len()
    );
    assert_nothing_held(&c, &tree).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tree_session_cap_holds_across_two_workers() {
    let c = Cluster::start(fan_out_script(false), 2, 8, |cfg| {
        let section = agentq_core::config::PolicySection {
            max_tree_sessions: Some(7),
            ..Default::default()
        };
        cfg.policy = Arc::new(agentq_core::policy::Policy::from_section(&section).unwrap());
    })
    .await;
    // Every node works on with the same call: the cap, not a repeat, must bound the tree.
    let root = c
        .submit("NODE root", TREE_TOOLS, |s| s.max_repeated_calls = 0)
        .await;
    let tree = c.settled_tree(&root, Duration::from_secs(120)).await;
    assert_eq!(tree.len(), 7, "{tree:?}");
    // A refused spawn is a tool error naming the bound.
    let mut named = false;
    for r in &tree {
        for m in c.store.messages(&r.id).await.unwrap() {
            if m.is_error && m.content.contains("policy.max_tree_sessions") {
                named = true;
            }
        }
    }
    assert!(named, "no refusal names policy.max_tree_sessions");
    c.shutdown().await;
}

/// A model that never stops calling: five turns of a no-op tool call, then an answer.
fn long_script() -> Value {
    let turn = json!({"text": "working", "usage": usage(),
                      "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]});
    json!({"turns": [turn.clone(), turn.clone(), turn.clone(), turn.clone(), {"text": "finished", "usage": usage()}]})
}

fn tenant_budget(tokens: u64, on_budget: OnBudget) -> TenantBudget {
    TenantBudget {
        tenant: TENANT.into(),
        period: Period::Day,
        tokens: Some(tokens),
        usd_nanos: None,
        on_budget,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_tenant_budget_fails_its_sessions() {
    let c = Cluster::start(
        json!({"turns": [{"text": "answer", "usage": usage()}]}),
        2,
        8,
        |cfg| cfg.budgets = vec![tenant_budget(1000, OnBudget::Fail)],
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let id = c
            .submit("one call", TREE_TOOLS, |s| s.tools = Some(vec![]))
            .await;
        let row = c.wait_terminal(&[id], Duration::from_secs(60)).await;
        ids.extend(row);
    }
    let completed = ids
        .iter()
        .filter(|r| r.status == SessionStatus::Completed)
        .count();
    // 410 tokens a call: three calls reach 1000 (1230 counted), the rest are refused.
    assert_eq!(completed, 3, "{ids:?}");
    for r in ids.iter().skip(3) {
        assert_eq!(r.finish_reason, Some(ExitReason::BudgetExhausted), "{r:?}");
        assert!(
            r.error
                .as_deref()
                .unwrap_or("")
                .contains("1000 tokens per day")
        );
    }
    let today = agentq_core::budget::day_key(chrono::Utc::now().date_naive());
    let spend = c.store.tenant_spend(TENANT, &today, &today).await.unwrap();
    assert_eq!(spend.tokens, 3 * (CALL.0 + CALL.1));
    c.shutdown().await;
}

/// A call the rate limiter lets through and the tenant's budget then refuses never goes
/// out: its place in the limiter's windows is given back, so a spent tenant does not use
/// up the requests the rest of the fleet shares with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_tenant_budget_refuses_gives_back_its_rate_limit_place() {
    use agentq_core::admission::{Limiter, read_state};
    use agentq_core::config::LimitSettings;
    use agentq_testkit::{Redis, RedisServer};

    let server = RedisServer::start().unwrap();
    let rule = LimitSettings {
        provider: "scripted".into(),
        model: "*".into(),
        tenant: None,
        rpm: Some(1000),
        tpm: None,
        concurrency: None,
        window_secs: 60,
        reservation_ttl_secs: 300,
    };
    let limiter = Limiter::connect(
        &server.url(),
        &[rule],
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let c = Cluster::start_on(
        Redis::Single(server),
        &["default"],
        json!({"turns": [{"text": "answer", "usage": usage()}]}),
        1,
        8,
        |cfg| {
            cfg.budgets = vec![tenant_budget(1000, OnBudget::Fail)];
            cfg.limiter = limiter.clone();
        },
    )
    .await;
    let mut rows = Vec::new();
    for _ in 0..6 {
        let id = c
            .submit("one call", TREE_TOOLS, |s| s.tools = Some(vec![]))
            .await;
        rows.extend(c.wait_terminal(&[id], Duration::from_secs(60)).await);
    }
    let completed = rows
        .iter()
        .filter(|r| r.status == SessionStatus::Completed)
        .count();
    // 410 tokens a call: three calls reach 1000, the other three are refused.
    assert_eq!(completed, 3, "{rows:?}");
    // Six admitted by the limiter, three sent: the refused ones' places come back (with
    // the next round trip, or the settlement writer within its delay).
    wait_until(
        "the refused calls' places to come back",
        Duration::from_secs(30),
        || {
            let mut conn = conn.clone();
            async move {
                let state = read_state(&mut conn).await.unwrap();
                let requests = state.rules.first().map(|r| r.requests);
                if requests == Some(3) {
                    Ok(())
                } else {
                    Err(format!("{requests:?}"))
                }
            }
        },
    )
    .await;
    c.shutdown().await;
}

/// Sessions of one tenant running at once on two workers: each call holds its worst case
/// on the tenant's budget while it runs, so however many start together the tenant ends
/// within its budget plus one call (without the holds, all sixteen calls in flight would
/// have seen nothing spent and started: 6,560 tokens against 2,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_stay_within_their_tenants_budget() {
    let c = Cluster::start(
        json!({"turns": [{"text": "answer", "usage": usage(), "delay_ms": 400}]}),
        2,
        8,
        |cfg| cfg.budgets = vec![tenant_budget(2000, OnBudget::Fail)],
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..16 {
        ids.push(
            c.submit("one call", TREE_TOOLS, |s| {
                s.tools = Some(vec![]);
                // A call's hold (its prompt's estimate and all of max_tokens) covers what
                // the script reports it used, as a real call's does.
                s.max_tokens = (CALL.0 + CALL.1) as u32;
            })
            .await,
        );
    }
    let rows = c.wait_terminal(&ids, Duration::from_secs(60)).await;
    let completed = rows
        .iter()
        .filter(|r| r.status == SessionStatus::Completed)
        .count();
    let refused = rows
        .iter()
        .filter(|r| r.finish_reason == Some(ExitReason::BudgetExhausted))
        .count();
    assert_eq!(completed + refused, 16, "{rows:?}");
    let today = agentq_core::budget::day_key(chrono::Utc::now().date_naive());
    let spend = c.store.tenant_spend(TENANT, &today, &today).await.unwrap();
    let call = CALL.0 + CALL.1;
    assert_eq!(spend.tokens, completed as u64 * call);
    assert!(spend.tokens <= 2000 + call, "{} tokens spent", spend.tokens);
    assert!(
        completed >= 2 && refused >= 1,
        "{completed} completed, {refused} refused"
    );
    // Every hold became spend: nothing is left held for the next calls.
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM tenant_holds")
        .fetch_one(c.store.pool())
        .await
        .unwrap();
    assert_eq!(held, 0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_tenant_resumes_when_its_budget_is_raised() {
    let c = Cluster::start(long_script(), 2, 8, |cfg| {
        cfg.budgets = vec![tenant_budget(100, OnBudget::Park)];
    })
    .await;
    let a = c
        .submit("A", TREE_TOOLS, |s| s.tools = Some(vec!["list_dir".into()]))
        .await;
    let b = c
        .submit("B", TREE_TOOLS, |s| s.tools = Some(vec!["list_dir".into()]))
        .await;
    for id in [&a, &b] {
        let row = c
            .wait_status(id, &[SessionStatus::Waiting], Duration::from_secs(60))
            .await;
        assert_eq!(row.wait_reason, Some(agentq_core::wait::WaitReason::Budget));
        // It wakes by itself when the day turns over.
        let tomorrow = Period::Day.next_start(chrono::Utc::now());
        assert_eq!(row.wake_at, Some(tomorrow), "{row:?}");
    }
    // Parked, not failed: nothing more is spent while it waits.
    let (status, body) = c.get("/v1/admin/budgets").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["budgets"][0]["source"], "config");
    assert!(body["budgets"][0]["spent_tokens"].as_u64().unwrap() >= 100);
    // Raised through the admin API: stored, it overrides the configured budget, and the
    // parked sessions of the tenant are woken.
    let resp = c
        .http
        .put(format!("{}/v1/admin/budgets/{TENANT}", c.api))
        .json(&json!({"period": "day", "tokens": 100_000, "on_budget": "park"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    for row in c
        .wait_terminal(&[a.clone(), b.clone()], Duration::from_secs(60))
        .await
    {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert_eq!(row.result.as_deref(), Some("finished"));
    }
    let (_, body) = c.get("/v1/admin/budgets").await;
    assert_eq!(body["budgets"][0]["source"], "stored");
    assert_eq!(body["budgets"][0]["tokens"], 100_000);
    let (status, spend) = c.get(&format!("/v1/admin/tenants/{TENANT}/spend")).await;
    assert_eq!(status, 200);
    // Five calls per session, all counted.
    assert_eq!(spend["day"]["tokens"], 2 * 5 * (CALL.0 + CALL.1));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_cannot_give_a_sub_agent_more_than_it_has() {
    let spawn = |budget: Value, task: &str| {
        json!({"name": "spawn_agent",
               "arguments": {"prompt": format!("LEAF {task}"), "wait": true, "token_budget": budget}})
    };
    let script = json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "GREEDY", "turns": [
                {"tool_calls": [spawn(json!(-5), "neg"), spawn(json!("all"), "str"),
                                spawn(json!(1.5), "frac"), spawn(json!(u64::MAX), "huge")],
                 "usage": usage()},
                {"text": "done", "usage": usage()}
            ]},
            {"when_prompt_contains": "LEAF", "turns": [{"text": "leaf", "usage": usage()}]}
        ]
    });
    let c = Cluster::start(script, 1, 8, |_| {}).await;
    const BUDGET: u64 = 5_000;
    let root = c
        .submit("GREEDY root", TREE_TOOLS, |s| {
            s.token_budget = Some(BUDGET);
            s.max_tokens = 10;
        })
        .await;
    let tree = c.settled_tree(&root, Duration::from_secs(60)).await;
    // Three bad arguments are tool errors naming the field; the huge ask got what was left.
    let errors: Vec<String> = c
        .store
        .messages(&root)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.is_error)
        .map(|m| m.content)
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors.iter().all(|e| e.contains("token_budget")),
        "{errors:?}"
    );
    let children: Vec<_> = tree.iter().filter(|r| r.parent_id.is_some()).collect();
    assert_eq!(children.len(), 1, "{tree:?}");
    assert_eq!(
        children[0].spec.token_budget,
        Some(BUDGET - CALL.0 - CALL.1),
        "all that was left, no more"
    );
    assert!(spent(&tree) <= BUDGET);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_worker_leaks_no_budget_and_the_tree_stays_within_it() {
    let mut script = fan_out_script(false);
    // Slow calls, so the crash finds calls and spawns in flight.
    for t in script["variants"][0]["turns"].as_array_mut().unwrap() {
        t["delay_ms"] = json!(150);
    }
    let mut c = Cluster::start(script, 1, 8, |_| {}).await;
    const BUDGET: u64 = 12_000;
    let root = submit_tree(&c, BUDGET).await;
    // Let the tree grow, then crash its only worker.
    wait_until("the tree to grow", Duration::from_secs(60), || async {
        let n = c.tree(&root).await.len();
        if n >= 4 { Ok(()) } else { Err(n) }
    })
    .await;
    c.crash_and_replace(0).await;
    let tree = c.settled_tree(&root, Duration::from_secs(180)).await;
    let total = spent(&tree);
    eprintln!(
        "after a crash: {} sessions, {total} tokens of {BUDGET}",
        tree.len()
    );
    // A call the crash cut off is made again, so at most one call per session that was
    // in flight is paid twice; the budget still bounds the tree.
    assert!(
        total <= BUDGET + CALL.0 + CALL.1,
        "the tree spent {total} of {BUDGET}"
    );
    assert_nothing_held(&c, &tree).await;
    c.shutdown().await;
}

/// A root of 6,000 tokens starts three sub-agents one after the other (`wait`), each asking
/// for 5,000; each gives back what it did not spend when it ends, and the root completes.
/// Then the finished sub-agents are started again through the API: a follow-up on each of
/// the two that completed, a retry of the one that failed. Each must draw from what the
/// tree has left, not run again on the allowance it gave back: before, the follow-ups and
/// the retry ran each on its old allowance, and the tree spent about 15,000 tokens of its
/// 6,000 while the root's ledger still showed some left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_sub_agents_started_again_draw_from_their_tree() {
    let spawn = |task: &str| {
        json!({"name": "spawn_agent",
               "arguments": {"prompt": task, "wait": true, "token_budget": 5000}})
    };
    let work = json!({"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}],
                      "usage": usage()});
    let mut failing = work.clone();
    failing["fail"] = json!([{"status": 400, "message": "bad request"}]);
    let script = json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "ROOT", "turns": [
                {"tool_calls": [spawn("CHILD a")], "usage": usage()},
                {"tool_calls": [spawn("CHILD b")], "usage": usage()},
                {"tool_calls": [spawn("FAILER c")], "usage": usage()},
                {"text": "all done", "usage": usage()},
                work.clone()
            ], "repeat_last": true},
            // Answers at once; a later turn works until its budget stops it.
            {"when_prompt_contains": "CHILD", "turns": [
                {"text": "child done", "usage": usage()}, work.clone()
            ], "repeat_last": true},
            // Its first call fails for good (400); run again, it works until stopped.
            {"when_prompt_contains": "FAILER", "turns": [failing, work.clone()],
             "repeat_last": true}
        ]
    });
    // One worker: the scripted failure is played once per worker process.
    let c = Cluster::start(script, 1, 8, |_| {}).await;
    const BUDGET: u64 = 6_000;
    let root = c
        .submit("ROOT", TREE_TOOLS, |s| {
            s.token_budget = Some(BUDGET);
            s.max_tokens = 10;
            s.max_iterations = 100;
            // The tree works on with the same call: the budget, not a repeat, must end it.
            s.max_repeated_calls = 0;
        })
        .await;
    let tree = c.settled_tree(&root, Duration::from_secs(60)).await;
    assert_eq!(c.row(&root).await.status, SessionStatus::Completed);
    let mut children: Vec<SessionRow> =
        tree.into_iter().filter(|r| r.parent_id.is_some()).collect();
    children.sort_by_key(|r| r.created_at);
    assert_eq!(children.len(), 3, "{children:?}");
    assert_eq!(children[2].status, SessionStatus::Failed, "{children:?}");

    let refused_or_started = |(status, body): &(u16, Value)| {
        assert!(
            *status == 202
                || *status == 200
                || (*status == 409 && body["error"]["code"] == "budget_exhausted"),
            "{status} {body}"
        );
    };
    for child in &children[..2] {
        let path = format!("/v1/sessions/{}/messages", child.id);
        let answer = c
            .start_again(
                &child.id,
                c.post(&path, json!({"content": "keep going"})),
                |s| s == 202,
            )
            .await;
        refused_or_started(&answer);
    }
    let failed = &children[2];
    let answer = c
        .start_again(
            &failed.id,
            c.post(&format!("/v1/sessions/{}/retry", failed.id), json!({})),
            |s| s == 200,
        )
        .await;
    refused_or_started(&answer);
    // The root itself, finished: its budget is its own for its whole life.
    let answer = c
        .start_again(
            &root,
            c.post(
                &format!("/v1/sessions/{root}/messages"),
                json!({"content": "more"}),
            ),
            |s| s == 202,
        )
        .await;
    refused_or_started(&answer);

    let tree = c.settled_tree(&root, Duration::from_secs(60)).await;
    let total = spent(&tree);
    eprintln!("after the follow-ups and the retry: {total} tokens of {BUDGET}");
    // The worst case of one call: its prompt's estimate plus max_tokens; these cost CALL.
    assert!(
        total <= BUDGET + CALL.0 + CALL.1,
        "the tree spent {total} of its budget of {BUDGET}: {:?}",
        tree.iter()
            .map(|r| (r.depth, r.status, r.usage.total()))
            .collect::<Vec<_>>()
    );
    // What the API shows agrees with what was spent: the root's ledger counts every token
    // of the tree once, and holds nothing.
    let (status, view) = c.get(&format!("/v1/sessions/{root}")).await;
    assert_eq!(status, 200, "{view}");
    let cost = &view["tree_cost"];
    let tree_tokens =
        cost["input_tokens"].as_u64().unwrap() + cost["output_tokens"].as_u64().unwrap();
    assert_eq!(tree_tokens, total);
    let ledger = &view["budget"];
    assert_eq!(ledger["held"], 0, "{view}");
    assert_eq!(
        ledger["spent"].as_u64().unwrap() + ledger["children_spent"].as_u64().unwrap(),
        tree_tokens,
        "{view}"
    );
    assert_eq!(
        ledger["remaining"].as_u64().unwrap(),
        BUDGET.saturating_sub(tree_tokens),
        "{view}"
    );
    // Once nothing is left, starting a sub-agent again is refused, changing nothing.
    if BUDGET.saturating_sub(tree_tokens) == 0 {
        let (status, body) = c
            .post(
                &format!("/v1/sessions/{}/messages", children[0].id),
                json!({"content": "again"}),
            )
            .await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (409, &json!("budget_exhausted")),
            "{body}"
        );
        assert!(c.row(&children[0].id).await.status.is_terminal());
    }
    c.shutdown().await;
}

/// Many sessions of one tenant at once against its budget, each call holding far more
/// than it spends (all of `max_tokens`). A call that finds the budget taken only by the
/// holds of calls in flight waits for them to settle: a session fails `budget_exhausted`
/// only once the tenant's recorded spend has reached the budget. Before, such calls ended
/// their sessions at once: most of fifty sessions failed having spent nothing while the
/// tenant had spent a fraction of its budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_wait_for_holds_and_fail_only_on_a_spent_tenant_budget() {
    use futures::StreamExt;
    const BUDGET: u64 = 30_000;
    let work = json!({"text": "working", "usage": usage(), "delay_ms": 150,
                      "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]});
    let c = Cluster::start(
        json!({"turns": [work.clone(), work,
                         {"text": "finished", "usage": usage(), "delay_ms": 150}]}),
        2,
        8,
        |cfg| cfg.budgets = vec![tenant_budget(BUDGET, OnBudget::Fail)],
    )
    .await;
    let mut ends = Vec::new();
    for i in 0..50 {
        let mut spec = SessionSpec::new(format!("task {i}"));
        spec.tools = Some(vec!["list_dir".into()]);
        spec.retry_delay_ms = 10;
        // Each call holds its prompt and 2,000 tokens while it runs, and spends 410.
        spec.max_tokens = 2_000;
        let (row, _) = c
            .store
            .create_session(&NewSession::root(spec, "default").with_tenant(TENANT))
            .await
            .unwrap();
        let done = c.queue.subscribe_completion(&row.id).await.unwrap();
        c.queue
            .enqueue("default", &row.id, EnqueueReason::New)
            .await
            .unwrap();
        c.store
            .mark_enqueued(std::slice::from_ref(&row.id))
            .await
            .unwrap();
        ends.push((row.id, done));
    }
    let mut rows = Vec::new();
    for (id, mut done) in ends {
        tokio::time::timeout(Duration::from_secs(120), done.next())
            .await
            .expect("every session ends")
            .expect("a completion");
        rows.push(c.row(&id).await);
    }
    let today = agentq_core::budget::day_key(chrono::Utc::now().date_naive());
    let spend = c.store.tenant_spend(TENANT, &today, &today).await.unwrap();
    let completed = rows
        .iter()
        .filter(|r| r.status == SessionStatus::Completed)
        .count();
    let failed: Vec<&SessionRow> = rows
        .iter()
        .filter(|r| r.status != SessionStatus::Completed)
        .collect();
    eprintln!(
        "{completed} completed, {} failed, {} tokens of {BUDGET}",
        failed.len(),
        spend.tokens
    );
    // The budget is used up before anyone is refused, and passed by less than one call.
    let call = CALL.0 + CALL.1;
    assert_eq!(spend.tokens, spent(&rows));
    assert!(
        spend.tokens >= BUDGET,
        "{} tokens spent, {} sessions failed",
        spend.tokens,
        failed.len()
    );
    assert!(
        spend.tokens <= BUDGET + call,
        "{} tokens spent",
        spend.tokens
    );
    assert!(
        !failed.is_empty(),
        "fifty sessions of 1,230 tokens fit in {BUDGET}?"
    );
    for r in &failed {
        assert_eq!(r.finish_reason, Some(ExitReason::BudgetExhausted), "{r:?}");
        // Refused on the recorded spend: the message says how much, holds not counted.
        let error = r.error.as_deref().unwrap_or("");
        assert!(!error.contains("in flight"), "{error}");
        let used: u64 = error
            .rsplit_once('(')
            .and_then(|(_, tail)| tail.split_once(' '))
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or_else(|| panic!("no spend in {error:?}"));
        assert!(used >= BUDGET, "{r:?}");
    }
    // Every hold became spend or went: nothing is left held.
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM tenant_holds")
        .fetch_one(c.store.pool())
        .await
        .unwrap();
    assert_eq!(held, 0);
    c.shutdown().await;
}

/// A caller cancels or interrupts its session while the LLM call is in flight: the
/// provider has the prompt and bills it, but the call never answers with its usage. Such
/// calls used to count nothing, so a caller repeating that (here with prompts of 5,000
/// tokens against a tenant budget of 12,000) spent without end and the budget never saw
/// it. A call abandoned in flight now counts its prompt's estimate on the session (its
/// stored usage and its tree's budget) and on its tenant: the interrupted session ends
/// `budget_exhausted` once the tenant's spend reaches the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_abandoned_in_flight_count_against_the_budget() {
    let fake = FakeLlm::start().await.unwrap();
    let (arrived, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    fake.set_handler(move |_| {
        let _ = arrived.send(());
        // Headers at once, then nothing for as long as the test runs: in flight.
        Some(
            FakeResponse::sse(fixture("openai_stream_text_usage.sse"), 64)
                .with_delay(Duration::from_secs(600)),
        )
    });
    let url = format!("{}/v1", fake.url);
    let c = Cluster::start(json!({"turns": []}), 1, 8, move |cfg| {
        cfg.budgets = vec![tenant_budget(12_000, OnBudget::Fail)];
        cfg.providers.openai_base_url = Some(url.clone());
        cfg.providers.openai_api_key = Some("sk-abandoned-test".into());
    })
    .await;
    let prompt = "x".repeat(20_000);
    let spec = |s: &mut SessionSpec| {
        s.provider = Some("openai".into());
        s.model = Some("m".into());
        s.tools = Some(vec![]);
        s.max_tokens = 256;
    };
    let terminal = [
        SessionStatus::Completed,
        SessionStatus::Failed,
        SessionStatus::Cancelled,
    ];
    let today = agentq_core::budget::day_key(chrono::Utc::now().date_naive());

    // Cancelled in flight: its prompt is counted on it and on the tenant.
    let cancelled = c.submit(&prompt, TREE_TOOLS, spec).await;
    tokio::time::timeout(Duration::from_secs(60), arrivals.recv())
        .await
        .expect("the call is made")
        .unwrap();
    let (st, body) = c
        .post(&format!("/v1/sessions/{cancelled}/cancel"), json!({}))
        .await;
    assert_eq!(st, 202, "{body}");
    let row = c
        .wait_status(&cancelled, &terminal, Duration::from_secs(60))
        .await;
    assert_eq!(
        row.status,
        SessionStatus::Cancelled,
        "{:?}",
        row.finish_reason
    );
    assert!(row.usage.input_tokens >= 5_000, "{:?}", row.usage);
    let spend = c.store.tenant_spend(TENANT, &today, &today).await.unwrap();
    assert_eq!(spend.tokens, row.usage.total());

    // Interrupted in flight, again and again: the budget ends it.
    let interrupted = c.submit(&prompt, TREE_TOOLS, spec).await;
    let mut calls = 0;
    let row = loop {
        tokio::select! {
            a = tokio::time::timeout(Duration::from_secs(60), arrivals.recv()) => {
                a.expect("a call or the end").unwrap();
            }
            row = c.wait_status(&interrupted, &terminal, Duration::from_secs(60)) => break row,
        }
        calls += 1;
        assert!(
            calls <= 6,
            "{calls} calls abandoned and the session goes on"
        );
        let (st, body) = c
            .post(
                &format!("/v1/sessions/{interrupted}/messages"),
                json!({"content": format!("stop {calls}"), "strategy": "interrupt"}),
            )
            .await;
        assert_eq!(st, 202, "{body}");
    };
    assert_eq!(row.status, SessionStatus::Failed, "{:?}", row.error);
    assert_eq!(
        row.finish_reason,
        Some(ExitReason::BudgetExhausted),
        "{:?}",
        row.error
    );
    assert!(
        row.usage.input_tokens >= calls * 5_000,
        "{calls} calls: {:?}",
        row.usage
    );
    let spend = c.store.tenant_spend(TENANT, &today, &today).await.unwrap();
    assert!(spend.tokens >= 12_000, "{spend:?}");
    c.shutdown().await;
}

/// Settlements the store fails (Postgres raises on the tenant's spend while a fault is
/// on): the sessions still complete, their calls' holds stay while the store fails, and
/// once it answers again the worker's retries count each call's spend exactly once and
/// free the holds, instead of leaving them held for half an hour and the spend uncounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_the_store_fails_are_counted_once_when_it_answers_again() {
    let c = one_call_worker().await;
    let settled_before = retried("settled");
    let (holds, spend) = three_calls_with_failing_settlements(&c).await;
    // Each call's settlement failed: its hold is still there and nothing is counted.
    assert_eq!(holds, 3);
    assert_eq!(spend, 0);

    let pool = c.store.pool();
    let holds = || async { tenant_holds(&c).await };
    let today = agentq_core::budget::day_key(chrono::Utc::now().date_naive());
    let spend = || async { c.store.tenant_spend(TENANT, &today, &today).await.unwrap() };
    sqlx::query("DELETE FROM settle_fault")
        .execute(pool)
        .await
        .unwrap();
    wait_until(
        "the retries to free the holds",
        Duration::from_secs(60),
        || async { holds().await == 0 },
    )
    .await;
    assert_eq!(spend().await.tokens, 3 * (CALL.0 + CALL.1), "counted once");
    assert!(retried("settled") >= settled_before + 3);
    c.shutdown().await;
}

/// A worker that stops while the store still fails its settlements tries each once more
/// and gives it up within its bound (counted as lost), rather than holding up its stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_still_failing_at_stop_are_given_up_within_the_bound() {
    let c = one_call_worker().await;
    let lost_before = retried("lost");
    assert_eq!(three_calls_with_failing_settlements(&c).await, (3, 0));
    tokio::time::timeout(Duration::from_secs(60), c.shutdown())
        .await
        .expect("the worker stops");
    assert!(retried("lost") >= lost_before + 3);
}

/// One worker of 4 slots whose sessions make one call each, for a tenant whose budget
/// they never reach.
async fn one_call_worker() -> Cluster {
    Cluster::start(
        json!({"turns": [{"text": "answer", "usage": usage()}]}),
        1,
        4,
        |cfg| cfg.budgets = vec![tenant_budget(1_000_000, OnBudget::Fail)],
    )
    .await
}

/// The worker's count of settlements tried again with `outcome` (other tests of this
/// process may add to it, never take from it).
fn retried(outcome: &str) -> u64 {
    agentq_core::metrics::global()
        .tenant_settlements_retried
        .with_label_values(&[outcome])
        .get()
}

/// Postgres made to fail every settlement (a trigger raises on the tenant's spend until
/// `settle_fault` is emptied), then three one-call sessions of the tenant run to their
/// end. Returns the tenant's holds and today's spent tokens after they ended.
async fn three_calls_with_failing_settlements(c: &Cluster) -> (i64, u64) {
    for statement in [
        "CREATE TABLE settle_fault (since timestamptz)",
        "INSERT INTO settle_fault VALUES (now())",
        "CREATE FUNCTION settle_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF EXISTS (SELECT 1 FROM settle_fault) THEN \
         RAISE EXCEPTION 'injected: the store fails settlements'; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER settle_fault BEFORE INSERT OR UPDATE ON tenant_spend \
         FOR EACH ROW EXECUTE FUNCTION settle_fault()",
    ] {
        sqlx::query(statement)
            .execute(c.store.pool())
            .await
            .unwrap();
    }
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            c.submit(&format!("call {i}"), TREE_TOOLS, |s| s.tools = Some(vec![]))
                .await,
        );
    }
    let rows = c.wait_terminal(&ids, Duration::from_secs(60)).await;
    assert!(
        rows.iter().all(|r| r.status == SessionStatus::Completed),
        "{rows:?}"
    );
    let today = agentq_core::budget::day_key(chrono::Utc::now().date_naive());
    let spend = c.store.tenant_spend(TENANT, &today, &today).await.unwrap();
    (tenant_holds(c).await, spend.tokens)
}

async fn tenant_holds(c: &Cluster) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tenant_holds WHERE tenant = $1")
        .bind(TENANT)
        .fetch_one(c.store.pool())
        .await
        .unwrap()
}
