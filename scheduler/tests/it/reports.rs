//! The console's summaries over HTTP, attacker first, on both stores (Postgres with a
//! Redis queue, SQLite with the in-memory queue `agentq dev` uses):
//! `GET /v1/sessions/counts` and the search `q` of the listing, `GET /v1/admin/costs` and
//! `GET /v1/admin/operations`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_core::Claim;
use agentq_core::auth::Scope;
use agentq_core::budget::{PriceEntry, Prices};
use agentq_scheduler::SchedulerSettings;
use agentq_testkit::shared_postgres;

use crate::common::{ADMIN_KEY, Backend, Served};

/// The served scheduler (its prices: `priced-*` at $1 in and $2 out per million), and
/// the calls these tests make of it.
struct Env(Served);

impl std::ops::Deref for Env {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl Env {
    async fn start(backend: Backend) -> Env {
        let settings = SchedulerSettings {
            prices: Arc::new(
                Prices::new(&[PriceEntry {
                    model: "priced-*".into(),
                    input: 1.0,
                    output: 2.0,
                    ..Default::default()
                }])
                .unwrap(),
            ),
            ..SchedulerSettings::default()
        };
        Env(Served::on(backend, settings).await)
    }

    async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        let r = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn create(&self, key: &str, body: Value) -> String {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/sessions", self.base))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        r.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// The ids a listing of `query` answers (one page), as `key`.
    async fn listed(&self, query: &str, key: &str) -> Vec<String> {
        let (s, v) = self
            .get(&format!("/v1/sessions?limit=1000&{query}"), key)
            .await;
        assert_eq!(s, 200, "{query}: {v}");
        let mut ids: Vec<String> = v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// The counts of `query`, as `key`, checked against the listing of the same filter.
    async fn counted(&self, query: &str, key: &str) -> Value {
        let (s, v) = self.get(&format!("/v1/sessions/counts?{query}"), key).await;
        assert_eq!(s, 200, "{query}: {v}");
        let listed = self.listed(query, key).await;
        assert_eq!(
            v["total"].as_u64().unwrap(),
            listed.len() as u64,
            "{query}: {v}"
        );
        let by_status: u64 = v["by_status"]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(by_status, listed.len() as u64);
        v
    }
}

fn refused(status: u16, v: &Value, code: u16, field: &str) {
    assert_eq!(status, code, "{v}");
    assert_eq!(v["error"]["field"], field, "{v}");
}

/// `q` encoded for a query string.
fn enc(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn tenants_and_admin_routes(backend: Backend) {
    let env = Env::start(backend).await;
    let a1 = env.create(&env.acme, json!({"prompt": "acme one"})).await;
    env.create(&env.acme, json!({"prompt": "acme two"})).await;
    let g = env
        .create(&env.globex, json!({"prompt": "globex secret"}))
        .await;

    // A tenant's key never reaches the admin's summaries.
    for path in [
        "/v1/admin/costs",
        "/v1/admin/operations",
        "/v1/admin/costs?tenant=globex",
    ] {
        let (s, v) = env.get(path, &env.acme).await;
        assert_eq!(s, 403, "{path}: {v}");
        assert_eq!(v["error"]["code"], "forbidden");
    }
    // Nor another tenant's sessions, by naming it.
    for path in [
        "/v1/sessions/counts?tenant=globex",
        "/v1/sessions?tenant=globex",
        "/v1/sessions/counts?tenant=globex&q=secret",
    ] {
        let (s, v) = env.get(path, &env.acme).await;
        refused(s, &v, 403, "tenant");
    }
    // Its own tenant named is the same as none.
    let own = env.counted("tenant=acme", &env.acme).await;
    assert_eq!(own["total"], 2);
    assert_eq!(env.counted("", &env.acme).await["total"], 2);
    // The search stays inside the tenant.
    assert!(env.listed("q=secret", &env.acme).await.is_empty());
    assert_eq!(env.counted("q=secret", &env.acme).await["total"], 0);
    assert_eq!(env.listed(&format!("q={g}"), &env.acme).await.len(), 0);
    // The admin sees every tenant, or the one it names.
    assert_eq!(env.counted("", ADMIN_KEY).await["total"], 3);
    assert_eq!(
        env.listed("tenant=globex", ADMIN_KEY).await,
        vec![g.clone()]
    );
    assert_eq!(
        env.counted("tenant=globex", ADMIN_KEY).await["by_status"],
        json!({"queued": 1})
    );
    let (s, v) = env.get("/v1/sessions?tenant=no%20such", ADMIN_KEY).await;
    refused(s, &v, 422, "tenant");
    // Counts equal the listing for the same filter.
    env.counted("status=queued", &env.acme).await;
    env.counted("status=completed", &env.acme).await;
    env.counted(&format!("q={}", &a1[..30]), &env.acme).await;
    env.counted("metadata=team%3Dx", &env.acme).await;
    // Paging is not a filter of the counts.
    let (s, v) = env.get("/v1/sessions/counts?limit=5", &env.acme).await;
    refused(s, &v, 422, "limit");
}

async fn search_is_literal_and_bounded(backend: Backend) {
    let env = Env::start(backend).await;
    let pct = env
        .create(&env.acme, json!({"prompt": "raise the quota by 50% now"}))
        .await;
    let under = env
        .create(&env.acme, json!({"prompt": "rename snake_case keys"}))
        .await;
    let quote = env
        .create(
            &env.acme,
            json!({"prompt": "it's '); DROP TABLE sessions; -- here"}),
        )
        .await;
    env.create(&env.acme, json!({"prompt": "plain words snakeXcase 500"}))
        .await;

    for (q, want) in [
        ("%", vec![pct.clone()]),
        ("50%", vec![pct.clone()]),
        ("_", vec![under.clone()]),
        ("snake_case", vec![under.clone()]),
        ("'); DROP TABLE sessions; --", vec![quote.clone()]),
        ("\\", vec![]),
        ("RENAME", vec![under.clone()]),
    ] {
        let query = format!("q={}", enc(q));
        assert_eq!(env.listed(&query, &env.acme).await, want, "q={q:?}");
        env.counted(&query, &env.acme).await;
    }
    // The store still holds every session.
    assert_eq!(env.counted("", &env.acme).await["total"], 4);
    // Bounded: 200 characters pass, 201 and a 10k string are refused naming `q`; so is a
    // NUL.
    let at_bound = "é".repeat(200);
    env.counted(&format!("q={}", enc(&at_bound)), &env.acme)
        .await;
    for q in ["x".repeat(201), "x".repeat(10_000), "a\0b".to_string()] {
        for route in ["/v1/sessions", "/v1/sessions/counts"] {
            let (s, v) = env.get(&format!("{route}?q={}", enc(&q)), &env.acme).await;
            refused(s, &v, 422, "q");
        }
    }
}

async fn costs_are_bounded_and_priced(backend: Backend) {
    let env = Env::start(backend).await;
    env.create(&env.acme, json!({"prompt": "p", "model": "priced-small"}))
        .await;
    env.create(&env.globex, json!({"prompt": "u", "model": "unpriced"}))
        .await;
    for (query, field) in [
        (
            "since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
            "since",
        ),
        (
            "since=2026-01-01T00:00:00Z&until=2026-01-01T00:00:00Z",
            "since",
        ),
        (
            "since=2024-01-01T00:00:00Z&until=2025-01-02T00:00:00Z",
            "since",
        ),
        ("until=yesterday", "until"),
        ("since=1%27%20OR%201=1", "since"),
        ("tenant=%27%3B--", "tenant"),
        ("limit=3", "limit"),
    ] {
        let (s, v) = env
            .get(&format!("/v1/admin/costs?{query}"), ADMIN_KEY)
            .await;
        refused(s, &v, 422, field);
    }
    // 366 days is the most.
    let (s, v) = env
        .get(
            "/v1/admin/costs?since=2024-01-01T00:00:00Z&until=2025-01-01T00:00:00Z",
            ADMIN_KEY,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["rows"], json!([]));

    let (s, v) = env.get("/v1/admin/costs", ADMIN_KEY).await;
    assert_eq!(s, 200, "{v}");
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    let acme = rows.iter().find(|r| r["tenant"] == "acme").unwrap();
    assert_eq!(
        (&acme["model"], &acme["day"], &acme["sessions"]),
        (&json!("priced-small"), &json!(today), &json!(1))
    );
    assert_eq!(acme["cost_usd"], json!(0.0), "priced, nothing used yet");
    let globex = rows.iter().find(|r| r["tenant"] == "globex").unwrap();
    assert_eq!(globex["cost_usd"], Value::Null, "no price for its model");
    assert_eq!(v["truncated"], false);
    let (_, only) = env.get("/v1/admin/costs?tenant=globex", ADMIN_KEY).await;
    assert_eq!(only["rows"].as_array().unwrap().len(), 1);
}

async fn operations_show_queues_waits_and_workers(backend: Backend) {
    let env = Env::start(backend).await;
    let a = env.create(&env.acme, json!({"prompt": "one"})).await;
    env.create(&env.acme, json!({"prompt": "two"})).await;
    let Claim::Acquired { .. } = env
        .store
        .claim(&a, "worker-7", Duration::from_secs(30), 10)
        .await
        .unwrap()
    else {
        panic!("not claimed")
    };
    let (s, v) = env.get("/v1/admin/operations", ADMIN_KEY).await;
    assert_eq!(s, 200, "{v}");
    let default = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "default")
        .unwrap();
    assert_eq!(default["length"], 2, "both entries wait: {v}");
    assert_eq!(default["pending"], 0);
    assert_eq!(default["held"], 0);
    assert_eq!(
        v["waiting"],
        json!({"approval": 0, "budget": 0, "children": 0, "rate_limit": 0})
    );
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "{v}");
    assert_eq!(workers[0]["worker"], "worker-7");
    assert_eq!(workers[0]["sessions"], 1);
    assert!(workers[0]["first_lease_expiry"].is_string());
}

macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod pg {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Backend::Postgres).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Backend::Sqlite).await;
                }
            )*
        }
    };
}

on_both!(
    tenants_and_admin_routes,
    search_is_literal_and_bounded,
    costs_are_bounded_and_priced,
    operations_show_queues_waits_and_workers,
);

/// The console's reads on a store of 10,000 sessions (Postgres, 3 tenants, 3 models, a
/// prompt each, one transcript of 2,000 messages), each timed over the HTTP API (the
/// median of 7, in ms) beside the plain listing page: the figures of
/// docs/benchmarks.md. A measurement, not a check (nothing is timed-asserted); it checks
/// only that the listing's plan walks an index. `scripts/test --release -p
/// agentq-scheduler --test it reports::ten_thousand -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check: run it with --ignored"]
async fn ten_thousand_sessions() {
    use std::time::Instant;

    use agentq_agent::schema::Message;
    use agentq_agent::spec::SessionSpec;
    use agentq_core::NewSession;

    const SESSIONS: usize = 10_000;
    const TRANSCRIPT: usize = 2_000;
    let served = Served::start(SchedulerSettings::default()).await;
    let (store, base) = (served.store.clone(), served.base.clone());
    let db_url = served.db_url.clone().unwrap();
    let acme_key = served.key("acme", &[Scope::SessionsRead]).await;

    let t0 = Instant::now();
    let tenants = ["acme", "globex", "initech"];
    let models = ["model-a", "model-b", "model-c"];
    let words = [
        "printer",
        "invoice",
        "refund",
        "outage",
        "migration",
        "report",
    ];
    for chunk in (0..SESSIONS).collect::<Vec<_>>().chunks(500) {
        let new: Vec<NewSession> = chunk
            .iter()
            .map(|&i| {
                let mut spec = SessionSpec::new(format!(
                    "Ticket {i}: the {} on floor {} needs a look; summarise the {} and answer \
                     the customer politely, quoting the relevant policy.",
                    words[i % words.len()],
                    i % 11,
                    words[(i / 7) % words.len()],
                ));
                spec.model = Some(models[i % models.len()].into());
                NewSession::root(spec, "default").with_tenant(tenants[i % tenants.len()])
            })
            .collect();
        store.create_sessions(&new).await.unwrap();
    }
    // Finished ones with usage, a few failed: what a console looks at.
    let pg = shared_postgres().unwrap();
    pg.psql(
        &db_url,
        "UPDATE sessions SET status = 'completed', finish_reason = 'stop', \
         input_tokens = 1000 + length(id), output_tokens = 200, finished_at = now() \
         WHERE right(id, 1) < 'c'; \
         UPDATE sessions SET status = 'failed', finish_reason = 'error', error = 'boom' \
         WHERE right(id, 1) = 'c'; ANALYZE sessions; ANALYZE session_specs;",
    )
    .unwrap();
    // One long transcript.
    let long = store
        .list(&agentq_core::ListFilter {
            tenant: Some("acme".into()),
            status: Some(agentq_core::SessionStatus::Queued),
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .remove(0)
        .id;
    let Claim::Acquired { lease, state, .. } = store
        .claim(&long, "filler", Duration::from_secs(600), 10)
        .await
        .unwrap()
    else {
        panic!("not claimed")
    };
    let mut state = *state;
    let mut from = state.messages.len();
    while state.messages.len() < TRANSCRIPT {
        for _ in 0..100 {
            state.push_assistant(Message::assistant(format!(
                "step {}: looking at the printer logs again",
                state.messages.len()
            )));
        }
        store.checkpoint(&lease, &state, from).await.unwrap();
        from = state.messages.len();
    }
    eprintln!(
        "filled {SESSIONS} sessions and a {TRANSCRIPT}-message transcript in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // The listing's plan walks an index (newest first, by tenant).
    let plan = pg
        .psql(
            &db_url,
            "EXPLAIN SELECT id FROM sessions WHERE true AND tenant = 'acme' \
             ORDER BY id DESC LIMIT 51",
        )
        .unwrap();
    eprintln!("list plan:\n{plan}");
    assert!(plan.contains("Index"), "{plan}");
    for (what, sql) in [
        (
            "counts plan",
            "EXPLAIN SELECT status, count(*) FROM sessions WHERE true AND tenant = 'acme' \
             GROUP BY 1",
        ),
        (
            "search plan",
            "EXPLAIN SELECT id FROM sessions WHERE true AND tenant = 'acme' AND (id LIKE \
             'zz%' ESCAPE '\\' OR EXISTS (SELECT 1 FROM session_specs p WHERE p.root_id = \
             sessions.root_id AND p.id = sessions.id AND p.spec->>'prompt' ILIKE '%refund%' \
             ESCAPE '\\')) ORDER BY id DESC LIMIT 51",
        ),
    ] {
        eprintln!("{what}:\n{}", pg.psql(&db_url, sql).unwrap());
    }

    let http = reqwest::Client::new();
    let time = |path: String, key: &str| {
        let http = http.clone();
        let url = format!("{base}{path}");
        let key = key.to_string();
        async move {
            let mut ms = Vec::new();
            for _ in 0..7 {
                let t = Instant::now();
                let r = http.get(&url).bearer_auth(&key).send().await.unwrap();
                assert_eq!(r.status(), 200, "{url}");
                r.bytes().await.unwrap();
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            ms.sort_by(f64::total_cmp);
            ms[ms.len() / 2]
        }
    };
    let acme = acme_key.as_str();
    for (what, path, key) in [
        (
            "list, page of 50 (admin)",
            "/v1/sessions?limit=50".to_string(),
            ADMIN_KEY,
        ),
        (
            "list, page of 50 (a tenant)",
            "/v1/sessions?limit=50".into(),
            acme,
        ),
        (
            "list, status=failed (a tenant)",
            "/v1/sessions?limit=50&status=failed".into(),
            acme,
        ),
        (
            "counts (admin, all)",
            "/v1/sessions/counts".into(),
            ADMIN_KEY,
        ),
        ("counts (a tenant)", "/v1/sessions/counts".into(), acme),
        (
            "search q=refund, page (a tenant)",
            "/v1/sessions?limit=50&q=refund".into(),
            acme,
        ),
        (
            "search q=refund, counts (a tenant)",
            "/v1/sessions/counts?q=refund".into(),
            acme,
        ),
        (
            "search, no match (admin)",
            "/v1/sessions?limit=50&q=nowhere".into(),
            ADMIN_KEY,
        ),
        (
            "costs, 30 days (admin)",
            "/v1/admin/costs".into(),
            ADMIN_KEY,
        ),
        (
            "operations (admin)",
            "/v1/admin/operations".into(),
            ADMIN_KEY,
        ),
        (
            "transcript of 2,000 messages",
            format!("/v1/sessions/{long}/messages"),
            acme,
        ),
        ("one session", format!("/v1/sessions/{long}"), acme),
    ] {
        eprintln!("{what}: {:.1} ms", time(path, key).await);
    }
}
