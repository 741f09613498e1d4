//! Budgets and cost through the API, on a real Postgres and Redis: `cost_usd` of a session
//! and its tree for a known usage and price, the budget ledger on `GET /v1/sessions/{id}`,
//! and the admin budget routes against bad input and callers without the admin scope.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_core::auth::{self, Scope};
use agentq_core::budget::{BudgetStore, PriceEntry, Prices, SpawnBudget, SpawnLimits, Spawned};
use agentq_core::pg::PgStore;
use agentq_core::protocol::InboxKind;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    Claim, InboxStore, KeyStore, LeaseStore, NewSession, SessionStatus, SessionStore, WaitReason,
    new_session_id,
};
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

const ADMIN_KEY: &str = "budgets-api-admin-key";

struct Env {
    base: String,
    store: Arc<PgStore>,
    queue: Arc<RedisQueue>,
    _redis: RedisServer,
}

impl Env {
    async fn start() -> Env {
        let url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        let mut settings = SchedulerSettings::default();
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        settings.prices = Arc::new(
            Prices::new(&[
                PriceEntry {
                    model: "gpt-4o-mini*".into(),
                    input: 0.15,
                    output: 0.60,
                    cache_read: 0.075,
                    cache_write: 0.0,
                    web_search: None,
                },
                PriceEntry {
                    model: "gpt-4o*".into(),
                    input: 2.5,
                    output: 10.0,
                    ..Default::default()
                },
            ])
            .unwrap(),
        );
        let state = Scheduler::new(store.clone(), queue.clone(), settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        Env {
            base: format!("http://{addr}"),
            store,
            queue,
            _redis: redis,
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Run `new` to its end for `reason`, having spent `tokens`, and give its allowance
    /// back as its worker does.
    async fn ended(&self, new: &NewSession, tokens: u64, reason: ExitReason) {
        let Claim::Acquired {
            lease, mut state, ..
        } = self
            .store
            .claim(&new.id, "w", Duration::from_secs(30), 10)
            .await
            .unwrap()
        else {
            panic!("claim");
        };
        let from = state.messages.len();
        let mut m = Message::assistant("ended");
        m.usage = Some(Usage {
            input_tokens: tokens,
            ..Default::default()
        });
        state.push_assistant(m);
        state.outcome = Some(Outcome {
            reason,
            result: Some("ended".into()),
            error: None,
        });
        self.store.checkpoint(&lease, &state, from).await.unwrap();
        self.store.return_budget(&new.id).await.unwrap();
    }

    /// A session of `model` that spent `usage`, left queued.
    async fn spent(&self, new: &NewSession, usage: Usage) {
        let Claim::Acquired {
            lease, mut state, ..
        } = self
            .store
            .claim(&new.id, "w", Duration::from_secs(30), 10)
            .await
            .unwrap()
        else {
            panic!("claim");
        };
        let from = state.messages.len();
        let mut m = Message::assistant("spent");
        m.usage = Some(usage);
        state.push_assistant(m);
        self.store.checkpoint(&lease, &state, from).await.unwrap();
        self.store.release(&lease).await.unwrap();
    }
}

/// A child of `root` (tenant acme) as a spawn with idempotency key `spawn:<key>` makes it.
fn child_of(root: &NewSession, spec: SessionSpec, key: &str) -> NewSession {
    NewSession {
        id: new_session_id(),
        spec,
        queue: "default".into(),
        parent_id: Some(root.id.clone()),
        root_id: root.id.clone(),
        depth: 1,
        idempotency_key: Some(format!("spawn:{key}")),
        idempotency_hash: None,
        tenant: "acme".into(),
        sched: Default::default(),
        files: Vec::new(),
        workspace_from: None,
    }
}

/// Spawn `child` drawing `requested` from a parent allowance of `allowance` (nothing spent).
async fn spawn(env: &Env, child: &NewSession, allowance: u64, requested: u64) {
    let limits = SpawnLimits {
        max_tree_sessions: 10,
        budget: Some(SpawnBudget {
            parent_allowance: allowance,
            requested: Some(requested),
            parent_spent: 0,
        }),
    };
    assert!(matches!(
        env.store.spawn_session(child, &limits).await.unwrap(),
        Spawned::Created(_)
    ));
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_of_a_session_and_its_tree_at_the_configured_prices() {
    let env = Env::start().await;
    let mut spec = SessionSpec::new("root");
    spec.model = Some("gpt-4o-mini-2024-07-18".into());
    spec.token_budget = Some(10_000_000);
    let root = NewSession::root(spec, "default").with_tenant("acme");
    env.store.create_session(&root).await.unwrap();
    // 1M input of which 200k read from the cache, 500k output: 0.12 + 0.015 + 0.30.
    env.spent(
        &root,
        Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cache_read_tokens: 200_000,
            ..Default::default()
        },
    )
    .await;
    let mut cspec = SessionSpec::new("child");
    cspec.model = Some("gpt-4o".into());
    let child = child_of(&root, cspec, "c");
    spawn(&env, &child, 10_000_000, 4_000_000).await;
    // 100k input at 2.5, 10k output at 10: 0.25 + 0.10.
    env.spent(
        &child,
        Usage {
            input_tokens: 100_000,
            output_tokens: 10_000,
            ..Default::default()
        },
    )
    .await;

    let (status, body) = env
        .call(
            reqwest::Method::GET,
            &format!("/v1/sessions/{}", root.id),
            ADMIN_KEY,
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(close(body["cost_usd"].as_f64().unwrap(), 0.435), "{body}");
    let tree = &body["tree_cost"];
    assert_eq!(tree["sessions"], 2);
    assert_eq!(tree["input_tokens"], 1_100_000);
    assert!(
        close(tree["cost_usd"].as_f64().unwrap(), 0.435 + 0.35),
        "{tree}"
    );
    let budget = &body["budget"];
    assert_eq!(budget["allowance"], 10_000_000);
    assert_eq!(budget["spent"], 1_500_000);
    assert_eq!(budget["held"], 4_000_000);
    assert_eq!(budget["remaining"], 10_000_000 - 1_500_000 - 4_000_000);

    let (_, body) = env
        .call(
            reqwest::Method::GET,
            &format!("/v1/sessions/{}", child.id),
            ADMIN_KEY,
            None,
        )
        .await;
    assert!(close(body["cost_usd"].as_f64().unwrap(), 0.35), "{body}");
    assert_eq!(body["tree_cost"]["sessions"], 2);
    assert_eq!(body["budget"]["allowance"], 4_000_000);
    assert_eq!(body["budget"]["remaining"], 4_000_000 - 110_000);

    // A model without a price has no cost (not a made-up 0).
    let mut spec = SessionSpec::new("unpriced");
    spec.model = Some("claude-x".into());
    let other = NewSession::root(spec, "default").with_tenant("acme");
    env.store.create_session(&other).await.unwrap();
    let (_, body) = env
        .call(
            reqwest::Method::GET,
            &format!("/v1/sessions/{}", other.id),
            ADMIN_KEY,
            None,
        )
        .await;
    assert!(body["cost_usd"].is_null(), "{body}");
    assert!(body["budget"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_routes_refuse_bad_input_and_callers_without_admin() {
    let env = Env::start().await;
    let put = |t: &str| format!("/v1/admin/budgets/{t}");
    // Only an admin may set, list or read spend.
    let (new, tenant_key) = auth::generate(
        "acme",
        vec![Scope::SessionsWrite, Scope::SessionsRead],
        None,
        None,
    )
    .unwrap();
    env.store.create_key(&new).await.unwrap();
    let body = json!({"period": "day", "tokens": 1_000_000_000});
    let (status, _) = env
        .call(
            reqwest::Method::PUT,
            &put("acme"),
            &tenant_key,
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, 403, "a tenant raises its own budget");
    for path in ["/v1/admin/budgets", "/v1/admin/tenants/acme/spend"] {
        let (status, _) = env
            .call(reqwest::Method::GET, path, &tenant_key, None)
            .await;
        assert_eq!(status, 403, "{path}");
    }
    assert!(env.store.tenant_budgets().await.unwrap().is_empty());

    // Bad bodies are 4xx naming the field.
    for (body, field) in [
        (json!({"period": "week", "tokens": 5}), "period"),
        (json!({"period": "day"}), "tokens"),
        (json!({"period": "day", "tokens": 0}), "tokens"),
        (json!({"period": "day", "tokens": -5}), "tokens"),
        (json!({"period": "day", "tokens": "many"}), "tokens"),
        (json!({"period": "day", "usd": -1.0}), "usd"),
        (json!({"period": "day", "usd": 1e300}), "usd"),
        (
            json!({"period": "day", "tokens": 5, "on_budget": "explode"}),
            "on_budget",
        ),
        (
            json!({"period": "day", "tokens": 5, "tenant": "other"}),
            "tenant",
        ),
    ] {
        let (status, resp) = env
            .call(
                reqwest::Method::PUT,
                &put("acme"),
                ADMIN_KEY,
                Some(body.clone()),
            )
            .await;
        assert!((400..500).contains(&status), "{body}: {status} {resp}");
        assert_eq!(resp["error"]["field"], field, "{body}: {resp}");
    }
    // A tenant name with a space or a control character.
    for t in ["a%20b", "a%09b"] {
        let (status, resp) = env
            .call(
                reqwest::Method::PUT,
                &put(t),
                ADMIN_KEY,
                Some(json!({"period": "day", "tokens": 5})),
            )
            .await;
        assert!((400..500).contains(&status), "{t}: {status}");
        assert_eq!(resp["error"]["field"], "tenant", "{resp}");
    }
    assert!(env.store.tenant_budgets().await.unwrap().is_empty());

    // The admin sets it; the listing and the spend route show it.
    let (status, resp) = env
        .call(
            reqwest::Method::PUT,
            &put("acme"),
            ADMIN_KEY,
            Some(json!({"period": "month", "usd": 12.5, "on_budget": "park"})),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["budget"]["usd"], 12.5);
    assert_eq!(resp["woken"], 0);
    let (_, list) = env
        .call(reqwest::Method::GET, "/v1/admin/budgets", ADMIN_KEY, None)
        .await;
    assert_eq!(list["budgets"][0]["tenant"], "acme");
    assert_eq!(list["budgets"][0]["period"], "month");
    assert_eq!(list["budgets"][0]["source"], "stored");
    let (status, spend) = env
        .call(
            reqwest::Method::GET,
            "/v1/admin/tenants/acme/spend",
            ADMIN_KEY,
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(spend["day"]["tokens"], 0);
}

/// A finished sub-agent is started again only with a new allowance from its tree: once
/// the tree's budget is spent, a follow-up and a retry are refused with 409
/// `budget_exhausted`, and neither the session nor the ledger changes. While something is
/// left, the follow-up is accepted and the root's ledger holds the new grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_a_sub_agent_again_needs_budget_left_in_its_tree() {
    let env = Env::start().await;
    let mut spec = SessionSpec::new("root");
    spec.token_budget = Some(1_000);
    let root = NewSession::root(spec, "default").with_tenant("acme");
    env.store.create_session(&root).await.unwrap();
    let child = |key: &str| child_of(&root, SessionSpec::new("child"), key);
    let (a, b) = (child("a"), child("b"));
    for c in [&a, &b] {
        spawn(&env, c, 1_000, 500).await;
    }
    env.ended(&a, 200, ExitReason::Stop).await;
    env.ended(&b, 100, ExitReason::Error).await;
    let get = |id: String| {
        let env = &env;
        async move {
            env.call(
                reqwest::Method::GET,
                &format!("/v1/sessions/{id}"),
                ADMIN_KEY,
                None,
            )
            .await
            .1
        }
    };
    assert_eq!(get(root.id.clone()).await["budget"]["remaining"], 700);

    // 700 left: the follow-up draws 300 (what a's own 500 still allows).
    let (status, body) = env
        .call(
            reqwest::Method::POST,
            &format!("/v1/sessions/{}/messages", a.id),
            ADMIN_KEY,
            Some(json!({"content": "more"})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let view = get(root.id.clone()).await;
    assert_eq!(view["budget"]["held"], 500, "{view}");
    assert_eq!(view["budget"]["remaining"], 400, "{view}");
    // a spends all of it; the root the rest: nothing is left.
    env.ended(&a, 300, ExitReason::Stop).await;
    env.spent(
        &root,
        Usage {
            input_tokens: 400,
            ..Default::default()
        },
    )
    .await;
    let view = get(root.id.clone()).await;
    assert_eq!(view["budget"]["remaining"], 0, "{view}");
    assert_eq!(view["budget"]["held"], 0, "{view}");
    assert_eq!(view["tree_cost"]["input_tokens"], 1_000, "{view}");

    let before_b = env.store.get(&b.id).await.unwrap().unwrap();
    let (status, body) = env
        .call(
            reqwest::Method::POST,
            &format!("/v1/sessions/{}/retry", b.id),
            ADMIN_KEY,
            None,
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "budget_exhausted", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(&b.id),
        "{body}"
    );
    assert_eq!(env.store.get(&b.id).await.unwrap().unwrap(), before_b);
    let history = env.store.messages(&a.id).await.unwrap();
    let (status, body) = env
        .call(
            reqwest::Method::POST,
            &format!("/v1/sessions/{}/messages", a.id),
            ADMIN_KEY,
            Some(json!({"content": "and more"})),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "budget_exhausted", "{body}");
    assert_eq!(env.store.messages(&a.id).await.unwrap(), history);
    let view = get(root.id.clone()).await;
    assert_eq!(view["budget"]["remaining"], 0, "{view}");
    assert_eq!(view["budget"]["children_spent"], 600, "{view}");
}

/// A sub-agent that ended without giving its allowance back (cancelled while queued, or
/// its worker died in between): the sweeper gives it back and tells the parent, which
/// waits for what its children hold and is woken by it, once.
#[tokio::test]
async fn the_sweeper_wakes_a_parent_waiting_for_its_childrens_budget() {
    let env = Env::start().await;
    let mut spec = SessionSpec::new("root");
    spec.token_budget = Some(1_000);
    let root = NewSession::root(spec, "default").with_tenant("acme");
    env.store.create_session(&root).await.unwrap();
    let Claim::Acquired { lease, row, .. } = env
        .store
        .claim(&root.id, "w", Duration::from_secs(30), 10)
        .await
        .unwrap()
    else {
        panic!("claim");
    };
    // A background child (no spawn metadata: it was not waited on).
    let child = child_of(&root, SessionSpec::new("child"), "a");
    spawn(&env, &child, 1_000, 600).await;
    // The parent's next call waits for the 600 its child holds: it gives its slot up.
    let waiting = env
        .store
        .suspend_for(&lease, row.wake_seq, WaitReason::Children, None)
        .await
        .unwrap();
    assert_eq!(waiting.status, SessionStatus::Waiting);
    // Cancelled while queued, with nobody to give its allowance back or tell the parent.
    env.store.request_cancel(&child.id).await.unwrap();
    assert_eq!(env.store.ledger(&root.id).await.unwrap().unwrap().held, 600);

    agentq_scheduler::sweeper::return_budgets(env.store.as_ref(), env.queue.as_ref()).await;
    let ledger = env.store.ledger(&root.id).await.unwrap().unwrap();
    assert_eq!(ledger.held, 0, "{ledger:?}");
    let parent = env.store.get(&root.id).await.unwrap().unwrap();
    assert_eq!(parent.status, SessionStatus::Queued, "woken: {parent:?}");
    let inbox = env
        .store
        .inbox(&root.id, &[InboxKind::ChildResult], 0)
        .await
        .unwrap();
    assert_eq!(inbox.len(), 1, "{inbox:?}");

    // Nothing left to sweep: a second pass tells nobody anything.
    agentq_scheduler::sweeper::return_budgets(env.store.as_ref(), env.queue.as_ref()).await;
    assert_eq!(
        env.store
            .inbox(&root.id, &[InboxKind::ChildResult], 0)
            .await
            .unwrap()
            .len(),
        1
    );
}
